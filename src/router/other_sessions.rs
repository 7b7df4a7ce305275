//! The server-wide views and functions through which one session sees or signals the
//! others: statement texts and their literals (`pg_stat_activity`), locks and who holds
//! them, queued statements' progress, `pg_stat_statements`, and the signal functions.
//! PostgreSQL shows a role all of its own sessions, and every tenant's sessions share
//! the pool's server role: through them, one tenant would read another's statements
//! and could end its backend. pgtenant refuses a statement that names any of them
//! (`Analysis::other_sessions`), but for the calls it answers itself about the
//! client's own backend (`proxy_call`).
//!
//! What the text does not name (a DO block or function that builds the name at run
//! time) the server must refuse: `sql/session_privacy.sql` revokes these functions
//! from PUBLIC on a shard, and a test keeps its list and `FUNCTIONS` the same.

use super::lexer::{Token, TokenKind};

/// Views over other sessions (each reads one of `FUNCTIONS`).
const VIEWS: &[&str] = &[
    "pg_stat_activity",
    "pg_stat_ssl",
    "pg_stat_gssapi",
    "pg_stat_replication",
    "pg_stat_wal_receiver",
    "pg_stat_subscription",
    "pg_locks",
    "pg_prepared_xacts",
    "pg_stat_statements",
    "pg_stat_statements_info",
];

/// The function behind `pg_prepared_statements`: on a pooled server connection it lists
/// the statements other clients prepared there. pgtenant answers the view for the
/// client (`prepared_view`) and refuses the function; shards keep it (the view needs it).
const REFUSED_ONLY: &[&str] = &["pg_prepared_statement"];

/// Functions over other sessions, and the signal functions.
pub const FUNCTIONS: &[&str] = &[
    "pg_stat_get_activity",
    "pg_stat_get_progress_info",
    "pg_stat_get_wal_senders",
    "pg_stat_get_wal_receiver",
    "pg_stat_get_subscription",
    "pg_lock_status",
    "pg_blocking_pids",
    "pg_safe_snapshot_blocking_pids",
    "pg_isolation_test_session_is_blocked",
    "pg_prepared_xact",
    "pg_cancel_backend",
    "pg_terminate_backend",
    "pg_log_backend_memory_contexts",
];

/// Functions named by prefix: every `pg_stat_get_backend_*` one (one backend's query,
/// start times, client address, wait event).
pub const FUNCTION_PREFIXES: &[&str] = &["pg_stat_get_backend_"];

/// Views named by prefix: every `pg_stat_progress_*` one.
const VIEW_PREFIXES: &[&str] = &["pg_stat_progress_"];

/// The first view or function of other sessions that `tokens` (one or more
/// statements of `sql`, comments left out) names, bare, qualified or quoted.
pub(super) fn named(sql: &str, tokens: &[Token]) -> Option<String> {
    tokens.iter().find_map(|t| {
        let text = &sql[t.start..t.end];
        let name = match t.kind {
            // Every such name starts with `pg_`: one cheap look rules out most words.
            TokenKind::Word if text.len() > 3 && text.as_bytes()[..3].eq_ignore_ascii_case(b"pg_") => {
                text.to_ascii_lowercase()
            }
            TokenKind::QuotedIdent => quoted_name(text)?,
            _ => return None,
        };
        is_other_sessions(&name).then_some(name)
    })
}

/// The name a quoted identifier `"x"` stands for.
fn quoted_name(text: &str) -> Option<String> {
    let inner = text.strip_prefix('"')?.strip_suffix('"').unwrap_or(&text[1..]);
    Some(inner.replace("\"\"", "\""))
}

fn is_other_sessions(name: &str) -> bool {
    VIEWS.contains(&name)
        || FUNCTIONS.contains(&name)
        || REFUSED_ONLY.contains(&name)
        || FUNCTION_PREFIXES.iter().chain(VIEW_PREFIXES).any(|p| name.starts_with(p))
}

/// Whether the tokens hold a `U&"..."` identifier (the lexer reads `U`, `&` and a
/// quoted identifier) that spells a name of other sessions, with PostgreSQL's escapes
/// (`\XXXX`, `\+XXXXXX`, the escape doubled; another escape character by `UESCAPE
/// 'c'`). One whose escapes pgtenant does not read counts as one: refused rather than
/// guessed.
pub(super) fn unicode_escaped_name(sql: &str, tokens: &[Token]) -> bool {
    (0..tokens.len().saturating_sub(2)).any(|i| {
        let (u, amp, quoted) = (&tokens[i], &tokens[i + 1], &tokens[i + 2]);
        let escaped = u.kind == TokenKind::Word
            && sql[u.start..u.end].eq_ignore_ascii_case("u")
            && u.end == amp.start
            && &sql[amp.start..amp.end] == "&"
            && amp.end == quoted.start
            && quoted.kind == TokenKind::QuotedIdent;
        if !escaped {
            return false;
        }
        let text = |k: usize| tokens.get(k).map_or("", |t| &sql[t.start..t.end]);
        let escape = match text(i + 3).eq_ignore_ascii_case("uescape") {
            true => match text(i + 4).strip_prefix('\'').and_then(|t| t.strip_suffix('\'')) {
                Some(c) if c.chars().count() == 1 => c.chars().next(),
                _ => None,
            },
            false => Some('\\'),
        };
        escape
            .and_then(|escape| unicode_name(&sql[quoted.start..quoted.end], escape))
            .is_none_or(|name| is_other_sessions(&name))
    })
}

/// The name `"..."` of a `U&"..."` identifier stands for, its escapes (by `escape`)
/// read; `None` for one it does not read (a surrogate pair, a bad code point).
fn unicode_name(quoted: &str, escape: char) -> Option<String> {
    let inner = quoted_name(quoted)?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != escape {
            out.push(c);
            continue;
        }
        let digits = match chars.clone().next() {
            Some(next) if next == escape => {
                chars.next();
                out.push(escape);
                continue;
            }
            Some('+') => {
                chars.next();
                6
            }
            _ => 4,
        };
        let hex: String = chars.by_ref().take(digits).collect();
        if hex.len() != digits || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
    }
    Some(out.to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::lexer::code_tokens;

    fn names(sql: &str) -> Option<String> {
        let tokens = code_tokens(sql);
        named(sql, &tokens).or_else(|| unicode_escaped_name(sql, &tokens).then(|| "U&".into()))
    }

    #[test]
    fn finds_every_spelling_of_a_view_or_function_of_other_sessions() {
        for (sql, name) in [
            ("SELECT pid, query FROM pg_stat_activity", "pg_stat_activity"),
            ("select * from PG_CATALOG.PG_STAT_ACTIVITY", "pg_stat_activity"),
            ("SELECT * FROM \"pg_stat_activity\"", "pg_stat_activity"),
            ("SELECT * FROM pg_catalog.\"pg_locks\" l", "pg_locks"),
            ("SELECT pg_terminate_backend(pid) FROM t", "pg_terminate_backend"),
            ("SELECT pg_cancel_backend(42)", "pg_cancel_backend"),
            ("SELECT query FROM pg_stat_get_activity(NULL)", "pg_stat_get_activity"),
            (
                "SELECT pg_stat_get_backend_activity(s) FROM pg_stat_get_backend_idset() s",
                "pg_stat_get_backend_activity",
            ),
            ("SELECT * FROM pg_stat_progress_copy", "pg_stat_progress_copy"),
            ("SELECT query FROM pg_stat_statements", "pg_stat_statements"),
            ("SELECT 1; SELECT * FROM pg_locks", "pg_locks"),
            ("SELECT pg_blocking_pids(1)", "pg_blocking_pids"),
            ("SELECT * FROM U&\"pg\\005fstat_activity\"", "U&"),
            ("SELECT * FROM u&\"pg_stat_activity\"", "pg_stat_activity"),
            ("SELECT * FROM U&\"!0070g_locks\" UESCAPE '!'", "U&"),
            ("SELECT * FROM U&\"\\+000070g_locks\"", "U&"),
            ("SELECT * FROM U&\"pg_lock\\D800s\"", "U&"),
            ("SELECT * FROM U&\"x!0063ks\" UESCAPE '!!'", "U&"),
        ] {
            assert_eq!(names(sql).as_deref(), Some(name), "{sql}");
        }
    }

    #[test]
    fn the_shards_privacy_script_revokes_every_function_named_here() {
        let sql = include_str!("../../sql/session_privacy.sql");
        let listed_between = |begin: &str, end: &str| -> Vec<String> {
            let from = sql.find(begin).expect(begin) + begin.len();
            let to = from + sql[from..].find(end).expect(end);
            sql[from..to].split('\'').skip(1).step_by(2).map(str::to_string).collect()
        };
        let mut script = listed_between("-- functions: begin", "-- functions: end");
        script.extend(listed_between("-- signal functions: begin", "-- signal functions: end"));
        script.sort();
        let mut here: Vec<String> = FUNCTIONS.iter().map(|f| f.to_string()).collect();
        here.sort();
        assert_eq!(script, here, "sql/session_privacy.sql and FUNCTIONS differ");
        for prefix in FUNCTION_PREFIXES {
            let like = format!("LIKE '{}%'", prefix.replace('_', "\\_"));
            assert!(sql.contains(&like), "sql/session_privacy.sql lacks {like}");
        }
    }

    #[test]
    fn leaves_the_rest_alone() {
        for sql in [
            "SELECT * FROM pgbench_accounts WHERE aid = 1",
            "SELECT 'pg_stat_activity'",
            "SELECT $$ pg_terminate_backend(1) $$",
            "/* pg_stat_activity */ SELECT 1",
            "SELECT * FROM pg_class WHERE relname = 'pg_locks'",
            "SELECT pg_backend_pid(), pg_sleep(0), pg_advisory_lock(1)",
            "SELECT * FROM my_pg_stat_activity",
            "SELECT * FROM U&\"d\\0061t\\0061\"",
            "SELECT U&'d\\0061t\\+000061' AS U&\"d\\0061t\\+000061\"",
            "SELECT U&'d!0061t\\+000061' UESCAPE '!' AS U&\"d*0061t\\+000061\" UESCAPE '*'",
            "SELECT 1 AS U&\"a\\\\b\"",
            "SELECT * FROM pg_stat_user_tables",
        ] {
            assert_eq!(names(sql), None, "{sql}");
        }
    }
}
