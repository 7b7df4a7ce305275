//! What a statement may do besides reading rows and returning them, worked out from
//! its tokens. Lanes ask it which requests may wait behind another client's (issue
//! 21), and the session bookkeeping which requests may have changed a setting behind
//! pgtenant's back (issue 22): one list of known functions decides both.
//!
//! Conservative by construction: a statement counts as one that cannot wait only when
//! every part of it is recognised. Anything else (a call to a function not known here,
//! a quoted or schema-qualified function name, a locking clause, a write, a second
//! statement) counts as one that may wait on another session.
//!
//! What the text cannot show stays possible: a view or a row-level security policy
//! that calls a function that waits, a user-defined operator, a `search_path` that puts
//! a schema before `pg_catalog`, and a read that waits for the ACCESS EXCLUSIVE lock of
//! DDL or `LOCK TABLE`. Lanes bound those by timing each statement shape (`quick`).

use std::sync::LazyLock;

use super::lexer::{TokenKind, code_tokens};
use super::words::Words;

/// Whether `sql` is one statement that only reads and can wait on no other session:
/// a SELECT, VALUES, TABLE or WITH without a locking clause, `INTO`, a data-modifying
/// CTE, or a call of a function outside `NO_WAIT_FUNCTIONS`.
pub(super) fn cannot_wait(sql: &str) -> bool {
    let tokens = code_tokens(sql);
    let mut statements = tokens.split(|t| t.kind == TokenKind::Semicolon).filter(|s| !s.is_empty());
    let (Some(statement), None) = (statements.next(), statements.next()) else { return false };
    let w = Words { sql, tokens: statement };
    if !READ_STARTS.iter().any(|k| w.is(0, k)) {
        return false;
    }
    // `FOR UPDATE/SHARE/...` waits for row locks; `INTO` creates a table; the others
    // are writes inside a WITH. (`substring(x FOR n)` is refused too: rare enough.)
    if ["for", "into", "insert", "update", "delete", "merge"].iter().any(|k| w.contains_word(k)) {
        return false;
    }
    calls_only_known(&w)
}

/// What a statement text may do to the server session's state (settings, the tenant
/// GUC) behind pgtenant's back, beyond the SET/RESET statements it follows itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SessionRisk {
    /// Nothing: reads of known functions only, and the session and transaction
    /// statements pgtenant follows or that end with the transaction.
    Nothing,
    /// Writes with known functions only: a trigger on the table could still call
    /// `set_config`.
    ThroughTriggers,
    /// Anything: DO, CALL, EXECUTE, a function pgtenant does not know, a statement it
    /// does not recognise.
    Anything,
}

/// The worst that any statement of `sql` may do to the session's state.
pub(super) fn session_risk(sql: &str) -> SessionRisk {
    let tokens = code_tokens(sql);
    tokens
        .split(|t| t.kind == TokenKind::Semicolon)
        .filter(|s| !s.is_empty())
        .map(|statement| statement_risk(&Words { sql, tokens: statement }))
        .max()
        .unwrap_or(SessionRisk::Nothing)
}

fn statement_risk(w: &Words) -> SessionRisk {
    if !calls_only_known(w) {
        return SessionRisk::Anything;
    }
    // Followed by pgtenant (SET, RESET, DISCARD), over with the transaction, or no
    // more than reading a setting.
    const SESSION_STATEMENTS: [&str; 13] = [
        "set",
        "reset",
        "show",
        "discard",
        "begin",
        "start",
        "commit",
        "end",
        "rollback",
        "abort",
        "savepoint",
        "release",
        "deallocate",
    ];
    if SESSION_STATEMENTS.iter().any(|k| w.is(0, k)) {
        return SessionRisk::Nothing;
    }
    let reads = READ_STARTS.iter().any(|k| w.is(0, k));
    let writes = ["insert", "update", "delete", "merge"].iter().any(|k| w.contains_word(k));
    if writes && w.contains_word("pg_settings") {
        // pg_settings' own rule turns an UPDATE of it into set_config().
        return SessionRisk::Anything;
    }
    match (reads, writes) {
        (true, false) => SessionRisk::Nothing,
        _ if ["insert", "update", "delete", "merge", "with"].iter().any(|k| w.is(0, k)) => {
            SessionRisk::ThroughTriggers
        }
        // SELECT with a writable CTE is a WITH; anything else (DO, CALL, EXECUTE, COPY,
        // utility statements) may run code pgtenant does not see.
        _ => SessionRisk::Anything,
    }
}

/// The first words of statements that read (a WITH may also write).
const READ_STARTS: [&str; 4] = ["select", "values", "table", "with"];

/// Whether every `(` of the statement follows a keyword, a type name, a function known
/// not to wait (`call_cannot_wait`), a name whose column list it opens
/// (`names_columns`), or no word at all.
fn calls_only_known(w: &Words) -> bool {
    (0..w.tokens.len()).all(|i| w.text(i + 1) != "(" || names_columns(w, i) || call_cannot_wait(w, i))
}

/// Token `i`, before `(`, names a table or CTE whose column list follows, not a
/// function: `INSERT INTO [schema.]table [AS alias] (` or `WITH [RECURSIVE] name (`. (pgbench's INSERT, and every INSERT with a column
/// list, counted as a call of an unknown function before: the connection's settings
/// and tenant GUC were set again after each.)
fn names_columns(w: &Words, i: usize) -> bool {
    if !matches!(w.tokens.get(i).map(|t| t.kind), Some(TokenKind::Word | TokenKind::QuotedIdent)) {
        return false;
    }
    // The table's name, past an alias and a schema.
    let mut at = i;
    if at >= 2 && w.is(at - 1, "as") {
        at -= 2;
    }
    if at >= 2 && w.text(at - 1) == "." {
        at -= 2;
    }
    let inserts = at >= 1 && w.is(at - 1, "into") && w.is(0, "insert");
    let cte = i >= 1 && (w.is(i - 1, "with") || w.is(i - 1, "recursive"));
    inserts || cte
}

/// Token `i` stands before `(`: a keyword or type name that takes parentheses, or a
/// call of a function known not to wait (unqualified, or qualified by `pg_catalog`,
/// which PostgreSQL searches first unless told otherwise).
fn call_cannot_wait(w: &Words, i: usize) -> bool {
    let Some(token) = w.tokens.get(i) else { return true };
    match token.kind {
        TokenKind::Word => {}
        TokenKind::QuotedIdent => return false,
        // `= (`, `, (`, `((`: grouping, a subquery or a row.
        _ => return true,
    }
    let name = w.text(i).to_ascii_lowercase();
    let qualified = i >= 2 && w.text(i - 1) == ".";
    if qualified {
        return w.is(i - 2, "pg_catalog") && KNOWN.get(name.as_str()) == Some(&Known::Function);
    }
    KNOWN.contains_key(name.as_str())
}

/// What a word before `(` is, when it is one pgtenant knows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Known {
    Keyword,
    Function,
}

/// `PAREN_KEYWORDS` and `NO_WAIT_FUNCTIONS` in one map: a statement may hold many calls,
/// and each is looked up once.
static KNOWN: LazyLock<foldhash::HashMap<&'static str, Known>> = LazyLock::new(|| {
    let keywords = PAREN_KEYWORDS.iter().map(|k| (*k, Known::Keyword));
    // A function of the same name as a keyword stays a function (`left`, `right`).
    keywords.chain(NO_WAIT_FUNCTIONS.iter().map(|f| (*f, Known::Function))).collect()
});

/// Keywords and type names that a `(` may follow in a read without a function call.
const PAREN_KEYWORDS: &[&str] = &[
    "select",
    "from",
    "where",
    "and",
    "or",
    "not",
    "in",
    "exists",
    "any",
    "some",
    "all",
    "values",
    "as",
    "join",
    "on",
    "using",
    "lateral",
    "by",
    "having",
    "when",
    "then",
    "else",
    "case",
    "between",
    "is",
    "distinct",
    "union",
    "intersect",
    "except",
    "limit",
    "offset",
    "fetch",
    "over",
    "filter",
    "within",
    "partition",
    "with",
    "recursive",
    "materialized",
    "like",
    "ilike",
    "similar",
    "escape",
    "array",
    "row",
    "cast",
    "coalesce",
    "nullif",
    "greatest",
    "least",
    "extract",
    "overlay",
    "position",
    "substring",
    "trim",
    "collate",
    "group",
    "order",
    "window",
    "rows",
    "range",
    "groups",
    "cube",
    "rollup",
    "grouping",
    "sets",
    "numeric",
    "decimal",
    "varchar",
    "char",
    "character",
    "varying",
    "bit",
    "time",
    "timestamp",
    "interval",
    "float",
    "precision",
    "table",
    "only",
    "asc",
    "desc",
    "nulls",
    "first",
    "last",
    "true",
    "false",
    "null",
];

/// Built-in functions that neither wait on another session nor change anything: what
/// reads commonly call. Anything else (pg_sleep, advisory locks, dblink, nextval,
/// set_config, user functions) may.
const NO_WAIT_FUNCTIONS: &[&str] = &[
    // Aggregates and window functions.
    "count",
    "sum",
    "avg",
    "min",
    "max",
    "bool_and",
    "bool_or",
    "every",
    "array_agg",
    "string_agg",
    "json_agg",
    "jsonb_agg",
    "json_object_agg",
    "jsonb_object_agg",
    "stddev",
    "stddev_pop",
    "stddev_samp",
    "variance",
    "var_pop",
    "var_samp",
    "percentile_cont",
    "percentile_disc",
    "mode",
    "row_number",
    "rank",
    "dense_rank",
    "percent_rank",
    "cume_dist",
    "ntile",
    "lag",
    "lead",
    "first_value",
    "last_value",
    "nth_value",
    "bit_and",
    "bit_or",
    // Strings.
    "lower",
    "upper",
    "initcap",
    "length",
    "char_length",
    "character_length",
    "octet_length",
    "bit_length",
    "substr",
    "btrim",
    "ltrim",
    "rtrim",
    "replace",
    "translate",
    "concat",
    "concat_ws",
    "format",
    "left",
    "right",
    "lpad",
    "rpad",
    "repeat",
    "reverse",
    "strpos",
    "split_part",
    "starts_with",
    "md5",
    "ascii",
    "chr",
    "quote_ident",
    "quote_literal",
    "quote_nullable",
    "regexp_replace",
    "regexp_match",
    "regexp_matches",
    "regexp_split_to_array",
    "regexp_split_to_table",
    "string_to_array",
    "array_to_string",
    "to_hex",
    "encode",
    "decode",
    "sha256",
    "sha512",
    // Numbers.
    "abs",
    "ceil",
    "ceiling",
    "floor",
    "round",
    "trunc",
    "mod",
    "power",
    "pow",
    "sqrt",
    "cbrt",
    "exp",
    "ln",
    "log",
    "log10",
    "sign",
    "div",
    "width_bucket",
    "random",
    "pi",
    "to_char",
    "to_number",
    // Dates and times.
    "now",
    "clock_timestamp",
    "statement_timestamp",
    "transaction_timestamp",
    "timeofday",
    "date_trunc",
    "date_part",
    "date_bin",
    "age",
    "to_date",
    "to_timestamp",
    "make_date",
    "make_time",
    "make_timestamp",
    "make_timestamptz",
    "make_interval",
    "justify_days",
    "justify_hours",
    "justify_interval",
    // Arrays, rows and JSON.
    "array_length",
    "array_upper",
    "array_lower",
    "array_position",
    "array_positions",
    "array_append",
    "array_prepend",
    "array_cat",
    "array_remove",
    "array_replace",
    "cardinality",
    "unnest",
    "generate_series",
    "generate_subscripts",
    "to_json",
    "to_jsonb",
    "row_to_json",
    "array_to_json",
    "json_build_object",
    "jsonb_build_object",
    "json_build_array",
    "jsonb_build_array",
    "json_object",
    "jsonb_object",
    "json_array_length",
    "jsonb_array_length",
    "json_extract_path",
    "json_extract_path_text",
    "jsonb_extract_path",
    "jsonb_extract_path_text",
    "json_typeof",
    "jsonb_typeof",
    "jsonb_set",
    "jsonb_insert",
    "jsonb_strip_nulls",
    "jsonb_pretty",
    "json_array_elements",
    "jsonb_array_elements",
    "json_array_elements_text",
    "jsonb_array_elements_text",
    "json_each",
    "jsonb_each",
    "json_each_text",
    "jsonb_each_text",
    "json_object_keys",
    "jsonb_object_keys",
    "jsonb_path_query",
    "jsonb_path_exists",
    "jsonb_path_match",
    // Session and catalog facts.
    "version",
    "current_setting",
    "current_database",
    "current_schema",
    "current_schemas",
    "current_user",
    "session_user",
    "pg_backend_pid",
    "inet_server_addr",
    "inet_server_port",
    "pg_postmaster_start_time",
    "pg_is_in_recovery",
    "txid_current_snapshot",
    "pg_current_snapshot",
    "pg_typeof",
    "format_type",
    "obj_description",
    "col_description",
    "has_table_privilege",
    "has_schema_privilege",
    "has_column_privilege",
    "pg_get_expr",
    "pg_get_indexdef",
    "pg_get_constraintdef",
    "pg_table_is_visible",
    "pg_type_is_visible",
    "pg_relation_size",
    "pg_total_relation_size",
    "pg_size_pretty",
    "pg_encoding_to_char",
    // Other.
    "gen_random_uuid",
    "num_nulls",
    "num_nonnulls",
    "host",
    "family",
    "masklen",
];

#[cfg(test)]
mod tests {
    use super::{SessionRisk, cannot_wait, session_risk};

    #[test]
    fn what_may_change_the_session_behind_pgtenants_back() {
        for (sql, risk) in [
            ("SELECT secret FROM iso WHERE tenant_id = 7", SessionRisk::Nothing),
            ("SET search_path = a; SHOW search_path; BEGIN; COMMIT", SessionRisk::Nothing),
            ("select current_setting('pgtenant.tenant_id')", SessionRisk::Nothing),
            ("UPDATE t SET a = 1 WHERE id = $1", SessionRisk::ThroughTriggers),
            ("INSERT INTO t VALUES (1, now())", SessionRisk::ThroughTriggers),
            (
                "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (1, 2, 3, 4, CURRENT_TIMESTAMP)",
                SessionRisk::ThroughTriggers,
            ),
            ("insert into s.t as x (a) values (1) returning a", SessionRisk::ThroughTriggers),
            ("INSERT INTO t (a) SELECT f(1)", SessionRisk::Anything),
            ("INSERT INTO t (a) VALUES (my_default())", SessionRisk::Anything),
            ("UPDATE pg_settings SET setting = '8' WHERE name = 'pgtenant.tenant_id'", SessionRisk::Anything),
            ("WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", SessionRisk::ThroughTriggers),
            (
                "DO $$ BEGIN PERFORM set_config('pgtenant.tenant_id', '8', false); END $$",
                SessionRisk::Anything,
            ),
            ("SELECT my_function()", SessionRisk::Anything),
            ("SELECT 1; SELECT f(2)", SessionRisk::Anything),
            ("UPDATE t SET a = f(1)", SessionRisk::Anything),
            ("CALL p()", SessionRisk::Anything),
            ("EXECUTE s", SessionRisk::Anything),
            ("VACUUM t", SessionRisk::Anything),
        ] {
            assert_eq!(session_risk(sql), risk, "{sql}");
        }
    }

    #[test]
    fn reads_of_known_functions_cannot_wait() {
        for sql in [
            "SELECT 1",
            "select abalance from pgbench_accounts where aid = $1;",
            "SELECT count(*), max(a) FROM t WHERE tenant_id = 7 GROUP BY b ORDER BY 1 LIMIT 3",
            "with x as (select * from t) select * from x where a in (1, 2)",
            "SELECT pg_catalog.now(), '1.5'::numeric(10,2), coalesce(a, 0) FROM t /* hint */",
            "WITH x (a, b) AS (SELECT 1, 2) SELECT * FROM x",
            "VALUES (1), (2)",
            "TABLE t",
            "select exists (select 1 from t where a = any($1))",
        ] {
            assert!(cannot_wait(sql), "{sql}");
        }
    }

    #[test]
    fn anything_that_may_wait_or_is_not_recognised_may_wait() {
        for sql in [
            "SELECT pg_sleep(3)",
            "select pg_catalog.pg_sleep(1)",
            "SELECT * FROM t WHERE id = 1 FOR UPDATE",
            "select * from t for no key update",
            "SELECT pg_advisory_lock(1)",
            "select * from dblink('x', 'y') as t(a int)",
            "SELECT my_function(1)",
            "SELECT public.count(1)",
            "SELECT \"count\"(1)",
            "SELECT nextval('s')",
            "SELECT set_config('a.b', '1', false)",
            "WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d",
            "SELECT * INTO t2 FROM t",
            "UPDATE t SET a = 1",
            "INSERT INTO t VALUES (1)",
            "SELECT 1; SELECT 2",
            "LOCK TABLE t",
            "EXPLAIN ANALYZE SELECT 1",
            "DO $$ BEGIN PERFORM pg_sleep(1); END $$",
        ] {
            assert!(!cannot_wait(sql), "{sql}");
        }
    }
}
