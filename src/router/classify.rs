//! A statement's kind and what its words say it does: reads or writes, lifts a
//! read-only tenant's wall, controls the transaction, pins the connection, names a
//! tenant in a comment. Each is worked out from tokens, for every text the session
//! does not take on the plain-DML fast path.

use super::kinds::{
    ALL_SHARDS, BadSetting, PinReason, ROUTING_VERSION, SCATTER_PARAMETER, StatementKind, TARGET_PARAMETER,
};
use super::lexer::TokenKind;
use super::words::{Words, is_plain_setting};
use crate::directory::{TenantId, TenantKey};

/// The setting a SET or RESET (of any scope) names.
pub(super) fn set_or_reset_name(w: &Words) -> Option<String> {
    if !(w.is(0, "set") || w.is(0, "reset")) {
        return None;
    }
    let at = if w.is(1, "session") || w.is(1, "local") { 2 } else { 1 };
    Some(setting_name(w, at).0)
}

/// The word `all_shards` (bare or quoted) followed by a dot: a table on every shard.
pub(super) fn names_all_shards(w: &Words) -> bool {
    w.tokens.windows(2).any(|pair| {
        let word = &w.sql[pair[0].start..pair[0].end];
        let named = match pair[0].kind {
            TokenKind::Word => word.eq_ignore_ascii_case(ALL_SHARDS),
            TokenKind::QuotedIdent => word == "\"all_shards\"",
            _ => false,
        };
        named && pair[1].kind == TokenKind::Punct && &w.sql[pair[1].start..pair[1].end] == "."
    })
}

pub(super) fn classify(
    w: &Words,
    tenant_param: &str,
    key: TenantKey,
    bad_setting: &mut Option<BadSetting>,
) -> StatementKind {
    if w.is(0, "begin") || (w.is(0, "start") && w.is(1, "transaction")) {
        return StatementKind::Begin;
    }
    if names_all_shards(w) {
        return StatementKind::Scatter;
    }
    if (w.is(0, "commit") || w.is(0, "end")) && !w.is(1, "prepared") {
        return StatementKind::Commit;
    }
    if (w.is(0, "rollback") || w.is(0, "abort"))
        && !w.is(1, "to")
        && !w.is(1, "prepared")
        && !w.contains_word("to")
    {
        return StatementKind::Rollback;
    }
    if w.is(0, "discard") && w.is(1, "all") {
        return StatementKind::DiscardAll;
    }
    if w.is(0, "deallocate") {
        let at = if w.is(1, "prepare") { 2 } else { 1 };
        if w.is(at, "all") {
            return StatementKind::DiscardAll;
        }
        let Some(name) = identifier_at(w, at) else {
            return StatementKind::Other;
        };
        if at + 1 == w.tokens.len() {
            return StatementKind::Deallocate(name);
        }
    }
    if w.is(0, "select")
        && let Some(call) = super::proxy_call::recognise(w.sql, w.tokens)
    {
        return StatementKind::ProxyCall(call);
    }
    if w.is(0, "show") {
        let (name, next) = setting_name(w, 1);
        if name.eq_ignore_ascii_case(ROUTING_VERSION) && next == w.tokens.len() {
            return StatementKind::ShowRoutingVersion;
        }
    }
    if w.is(0, "reset") {
        if w.is(1, "all") {
            return StatementKind::ResetAll;
        }
        if w.is(1, "time") && w.is(2, "zone") && w.tokens.len() == 3 {
            return StatementKind::Reset { name: "TimeZone".into() };
        }
        let (name, next) = setting_name(w, 1);
        if name.eq_ignore_ascii_case(tenant_param) && next == w.tokens.len() {
            return StatementKind::ResetTenant;
        }
        if is_plain_setting(&name) && next == w.tokens.len() {
            return StatementKind::Reset { name };
        }
        return StatementKind::Other;
    }
    if w.is(0, "set") {
        return classify_set(w, tenant_param, key, bad_setting);
    }
    StatementKind::Other
}

/// The target a SET of `pgtenant.target` names (`value` as SQL: a word or a literal).
pub fn target_of(value: &str) -> Option<super::TargetMode> {
    let value = value.trim();
    let unquoted = value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')).unwrap_or(value);
    super::TargetMode::parse(unquoted)
}

pub(super) fn classify_set(
    w: &Words,
    tenant_param: &str,
    key: TenantKey,
    bad_setting: &mut Option<BadSetting>,
) -> StatementKind {
    let mut i = 1;
    if w.is(i, "session") {
        i += 1;
    }
    // Over with the transaction, or pinned for a reason of their own (`pin_reason`).
    if ["local", "transaction", "constraints", "role", "authorization"].iter().any(|k| w.is(i, k)) {
        return StatementKind::Other;
    }
    if w.is(i, "characteristics") && w.is(i + 1, "as") && w.is(i + 2, "transaction") {
        return session_characteristics(w, i + 3);
    }
    let (name, value_at) = if w.is(i, "time") && w.is(i + 1, "zone") {
        if w.is(i + 2, "local") || w.is(i + 2, "default") {
            return StatementKind::Reset { name: "TimeZone".into() };
        }
        if w.is(i + 2, "interval") {
            return StatementKind::UnfollowedSet;
        }
        ("TimeZone".to_string(), i + 2)
    } else if w.is(i, "schema") {
        ("search_path".to_string(), i + 1)
    } else if w.is(i, "names") {
        ("client_encoding".to_string(), i + 1)
    } else {
        let (name, next) = setting_name(w, i);
        if !(w.is(next, "to") || w.text(next) == "=") {
            return StatementKind::UnfollowedSet;
        }
        (name, next + 1)
    };
    let value = w.rest_from(value_at).to_string();
    if value.is_empty() || !is_plain_setting(&name) || name.eq_ignore_ascii_case("seed") {
        // SET SEED starts the session's random() sequence once: set again on another
        // server connection, it would start it over.
        return StatementKind::UnfollowedSet;
    }
    if value.eq_ignore_ascii_case("default") && !name.eq_ignore_ascii_case(tenant_param) {
        // Back to the session's default, which is its login value: a RESET.
        return StatementKind::Reset { name };
    }
    if name.eq_ignore_ascii_case(tenant_param) {
        if value.eq_ignore_ascii_case("default") {
            return StatementKind::ResetTenant;
        }
        return match TenantId::parse(&value, key) {
            Some(t) => StatementKind::SetTenant(t),
            None => {
                *bad_setting = Some(BadSetting { param: name, value, expected: "a tenant id is a bigint" });
                StatementKind::Other
            }
        };
    }
    if name.eq_ignore_ascii_case(SCATTER_PARAMETER)
        && !matches!(value.trim_matches('\'').to_ascii_lowercase().as_str(), "strict" | "partial")
    {
        *bad_setting = Some(BadSetting { param: name, value, expected: "one of strict, partial" });
        return StatementKind::Other;
    }
    if name.eq_ignore_ascii_case(TARGET_PARAMETER) && target_of(&value).is_none() {
        *bad_setting =
            Some(BadSetting { param: name, value, expected: "one of primary, prefer-replica, replica" });
        return StatementKind::Other;
    }
    StatementKind::Set { name, value }
}

/// `SET SESSION CHARACTERISTICS AS TRANSACTION <mode>` from the mode at token `i`: the
/// setting it stands for. Several modes at once are left unfollowed (one change each).
pub(super) fn session_characteristics(w: &Words, i: usize) -> StatementKind {
    let words: Vec<String> = (i..w.tokens.len()).map(|k| w.text(k).to_ascii_lowercase()).collect();
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let (name, value) = match words.as_slice() {
        ["isolation", "level", level @ ..] if !level.is_empty() && !level.contains(&",") => {
            ("default_transaction_isolation", format!("'{}'", level.join(" ")))
        }
        ["read", "only"] => ("default_transaction_read_only", "on".into()),
        ["read", "write"] => ("default_transaction_read_only", "off".into()),
        ["deferrable"] => ("default_transaction_deferrable", "on".into()),
        ["not", "deferrable"] => ("default_transaction_deferrable", "off".into()),
        _ => return StatementKind::UnfollowedSet,
    };
    StatementKind::Set { name: name.into(), value }
}

/// Reads a possibly dotted setting name starting at token `i`; returns it and the next index.
pub(super) fn setting_name(w: &Words, mut i: usize) -> (String, usize) {
    let mut name = String::new();
    loop {
        match w.tokens.get(i).map(|t| t.kind) {
            Some(TokenKind::Word) => name.push_str(w.text(i)),
            Some(TokenKind::QuotedIdent) => name.push_str(w.text(i).trim_matches('"')),
            _ => return (name, i),
        }
        i += 1;
        if w.text(i) == "." {
            name.push('.');
            i += 1;
        } else {
            return (name, i);
        }
    }
}

/// The identifier at token `i`, as the server reads it (folded unless quoted).
fn identifier_at(w: &Words, i: usize) -> Option<String> {
    match w.tokens.get(i).map(|t| t.kind) {
        Some(TokenKind::Word) => Some(w.text(i).to_ascii_lowercase()),
        Some(TokenKind::QuotedIdent) => Some(w.text(i).trim_matches('"').replace("\"\"", "\"")),
        _ => None,
    }
}

/// The prepared statement name of a SQL `PREPARE`, `EXECUTE` or `DEALLOCATE`, when it
/// is in pgtenant's namespace on the server (see `Analysis::reserved_statement`).
pub(super) fn reserved_statement(w: &Words) -> Option<String> {
    let at = if w.is(0, "prepare") && !w.is(1, "transaction") || w.is(0, "execute") {
        1
    } else if w.is(0, "deallocate") {
        if w.is(1, "prepare") { 2 } else { 1 }
    } else {
        return None;
    };
    // (A U&"..." name is refused with every U&"..." identifier: `other_sessions`.)
    let name = identifier_at(w, at)?;
    name.starts_with(crate::protocol::RESERVED_PREFIX).then_some(name)
}

pub(super) fn pin_reason(w: &Words) -> Option<PinReason> {
    if w.is(0, "listen") {
        return Some(PinReason::Listen);
    }
    if w.is(0, "prepare") && !w.is(1, "transaction") {
        return Some(PinReason::SqlPrepare);
    }
    let temp = |i| w.is(i, "temp") || w.is(i, "temporary");
    let temp_after = |i| temp(i) || ((w.is(i, "local") || w.is(i, "global")) && temp(i + 1));
    if w.is(0, "create") && (temp_after(1) || w.contains_word("pg_temp")) {
        return Some(PinReason::TempTable);
    }
    // SELECT ... INTO TEMP t, CREATE TABLE pg_temp.t: temporary tables all the same.
    if (1..w.tokens.len()).any(|i| w.is(i, "into") && temp_after(i + 1)) {
        return Some(PinReason::TempTable);
    }
    if w.is(0, "declare") && (1..w.tokens.len()).any(|i| w.is(i, "with") && w.is(i + 1, "hold")) {
        return Some(PinReason::HoldCursor);
    }
    if w.is(0, "set") && (w.is(1, "role") || w.is(1, "session") && w.is(2, "authorization")) {
        return Some(PinReason::RoleChange);
    }
    if w.is(0, "set") && w.is(1, "session") && w.is(2, "role") {
        return Some(PinReason::RoleChange);
    }
    let session_lock = (0..w.tokens.len()).any(|i| {
        let t = w.text(i).to_ascii_lowercase();
        t.starts_with("pg_advisory_lock") || t.starts_with("pg_try_advisory_lock")
    });
    session_lock.then_some(PinReason::AdvisoryLock)
}

/// `/* pgtenant.tenant_id=42 */` or the sqlcommenter form `/*tenant_id='42'*/`.
pub(super) fn hint_in_comment(comment: &str, tenant_param: &str, key: TenantKey) -> Option<TenantId> {
    let inner = comment.trim_start_matches("/*").trim_end_matches("*/");
    let short = tenant_param.rsplit('.').next().unwrap_or(tenant_param);
    inner.split([',', ' ', '\n', '\t']).find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        let name = name.trim();
        (name.eq_ignore_ascii_case(tenant_param) || name.eq_ignore_ascii_case(short))
            .then(|| TenantId::parse(value, key))
            .flatten()
    })
}
