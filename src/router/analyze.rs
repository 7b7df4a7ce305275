//! What a statement means for routing and for session state: its kind (transaction
//! control, SET/RESET of settings or of the tenant), a tenant hint from a comment,
//! whether it pins the server connection, and (lazily, through sqlparser) whether it
//! touches tables and so needs a tenant.

use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use smallvec::SmallVec;

use super::effects::SessionRisk;
use super::facts::{SqlFacts, literal_ranges};
use super::lexer::{Token, TokenKind, code_tokens, tokenize};
use super::proxy_call::ProxySelect;
use super::quick::ShapeTiming;
use crate::directory::{TenantId, TenantKey};

/// The parameter that says where a session's provably read-only requests may go.
pub const TARGET_PARAMETER: &str = "pgtenant.target";
/// The session setting that says what a scatter-gather does when a shard fails.
pub const SCATTER_PARAMETER: &str = "pgtenant.scatter";
/// The pseudo-schema that names a table on every shard (scatter-gather).
pub const ALL_SHARDS: &str = "all_shards";

/// Whether `sql` may name an `all_shards.` table: the word followed by a dot or a
/// quote (a cheap test; `StatementKind::Scatter` is decided on tokens).
pub fn mentions_all_shards(sql: &[u8]) -> bool {
    let n = ALL_SHARDS.len();
    sql.windows(n + 1).any(|w| {
        w[0] | 0x20 == b'a'
            && w[..n].eq_ignore_ascii_case(ALL_SHARDS.as_bytes())
            && matches!(w[n], b'.' | b'"')
    })
}

/// A value a SET gave one of pgtenant's parameters that it cannot take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadSetting {
    pub param: String,
    pub value: String,
    /// What the parameter takes.
    pub expected: &'static str,
}

/// The statement kinds the session acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StatementKind {
    Begin,
    Commit,
    Rollback,
    /// `SET [SESSION] <tenant parameter> = N`.
    SetTenant(TenantId),
    /// `RESET <tenant parameter>` or `SET <tenant parameter> TO DEFAULT`.
    ResetTenant,
    /// `SET [SESSION] name = value`: a session setting to re-apply on other servers.
    Set {
        name: String,
        value: String,
    },
    Reset {
        name: String,
    },
    ResetAll,
    /// `DISCARD ALL` or `DEALLOCATE ALL`: prepared statements are gone on the server.
    DiscardAll,
    /// `DEALLOCATE [PREPARE] name`: answered by pgtenant when `name` is one of the
    /// client's protocol-level statements (their server names are pgtenant's own).
    Deallocate(String),
    /// A session-level SET whose effect pgtenant cannot re-apply on another server
    /// connection (`SET XML OPTION`, `SET SESSION CHARACTERISTICS` with several modes):
    /// it pins the connection rather than leak to other clients.
    UnfollowedSet,
    /// `SHOW pgtenant.routing_version`: answered by the proxy.
    ShowRoutingVersion,
    /// A call pgtenant answers itself (`SELECT pgtenant.next_id()` and kin,
    /// `SELECT pg_backend_pid()`, the signal functions of it; see `proxy_call`).
    ProxyCall(ProxySelect),
    /// A statement naming an `all_shards.` table: the admin scatter-gather runs it.
    Scatter,
    Other,
}

/// Why a statement ties the server connection to the client until the session ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinReason {
    Listen,
    AdvisoryLock,
    TempTable,
    HoldCursor,
    SqlPrepare,
    RoleChange,
    /// A SET pgtenant cannot re-apply elsewhere (see `StatementKind::UnfollowedSet`),
    /// or SETs in a multi-statement query that also controls its transaction.
    UnfollowedSet,
}

/// A change of session settings that the client expects on every server connection it
/// gets from then on, once the statement that made it has taken effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionChange {
    Set {
        name: String,
        value: String,
    },
    /// `set_config(name, value, false)` whose name, value or both are `$n` parameters:
    /// they arrive with the Bind.
    SetFromParameters {
        name: ConfigArg,
        value: ConfigArg,
    },
    Reset {
        name: String,
    },
    /// `RESET ALL` or `DISCARD ALL`: back to the settings of the client's startup.
    ResetAll,
}

/// An argument of `set_config`: text pgtenant read, or the `$n` parameter it comes in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigArg {
    Text(String),
    Parameter(u16),
}

impl SessionChange {
    fn of(kind: &StatementKind) -> Option<Self> {
        match kind {
            StatementKind::Set { name, value } => {
                Some(Self::Set { name: name.clone(), value: value.clone() })
            }
            StatementKind::Reset { name } => Some(Self::Reset { name: name.clone() }),
            StatementKind::ResetAll | StatementKind::DiscardAll => Some(Self::ResetAll),
            _ => None,
        }
    }
}

impl PinReason {
    pub fn describe(self) -> &'static str {
        match self {
            Self::Listen => "LISTEN",
            Self::AdvisoryLock => "a session advisory lock",
            Self::TempTable => "a temporary table",
            Self::HoldCursor => "a WITH HOLD cursor",
            Self::SqlPrepare => "an SQL PREPARE",
            Self::RoleChange => "SET ROLE / SESSION AUTHORIZATION",
            Self::UnfollowedSet => "a SET that pgtenant cannot re-apply on other connections",
        }
    }
}

/// A yes/no about a text worked out on first need. Cheaper to make and copy than a
/// `OnceLock<bool>` (an analysis is made per new simple-protocol text); threads that
/// race work out the same answer.
#[derive(Default)]
pub(super) struct LazyFlag(AtomicU8);

impl LazyFlag {
    const NO: u8 = 1;
    const YES: u8 = 2;

    fn get_or_init(&self, work_out: impl FnOnce() -> bool) -> bool {
        match self.0.load(Ordering::Relaxed) {
            Self::NO => false,
            Self::YES => true,
            _ => {
                let answer = work_out();
                self.0.store(if answer { Self::YES } else { Self::NO }, Ordering::Relaxed);
                answer
            }
        }
    }
}

impl Clone for LazyFlag {
    fn clone(&self) -> Self {
        Self(AtomicU8::new(self.0.load(Ordering::Relaxed)))
    }
}

/// The literal ranges of a text, inline for the usual handful.
pub type Literals = SmallVec<[Range<usize>; 4]>;

/// The analysis of one query string, shared through the parse cache.
pub struct Analysis {
    pub kind: StatementKind,
    pub hint: Option<TenantId>,
    pub pin: Option<PinReason>,
    /// More than one statement in the string.
    pub is_multi: bool,
    /// A statement of a multi-statement string sets or resets the tenant parameter.
    pub sets_tenant_among_many: bool,
    /// The session settings the string changes, in order, when it succeeds as a whole.
    pub session_changes: Box<[SessionChange]>,
    /// A SET of one of pgtenant's parameters (the tenant, `pgtenant.target`) to a
    /// value it cannot take: refused before it reaches a server.
    pub bad_setting: Option<BadSetting>,
    /// `SET LOCAL` of the tenant parameter or `set_config` on it: the server's tenant
    /// GUC would change behind pgtenant's back.
    pub tampers_tenant_guc: bool,
    /// A statement takes down the read-only wall a tenant that may not write has (see
    /// `lifts_read_only`): refused for such a tenant.
    pub lifts_read_only: bool,
    /// A statement controls the transaction block (BEGIN, COMMIT, SAVEPOINT, ...).
    pub controls_transaction: bool,
    /// The `$n` parameters that name the setting of a `set_config` call: whether it is
    /// the tenant parameter shows only at Bind (see `Session::refusal_of_bound`).
    pub set_config_name_params: Box<[u16]>,
    /// The server-wide view or function of other sessions the text names (see
    /// `other_sessions`), outside the calls pgtenant answers itself: refused.
    pub other_sessions: Option<Box<str>>,
    /// Where the text reads `pg_prepared_statements`, which the session answers with
    /// the client's own statements (see `prepared_view`).
    pub prepared_view: Box<[super::prepared_view::ViewRef]>,
    /// One SELECT/INSERT/UPDATE/DELETE/MERGE/WITH/VALUES/TABLE statement: it may share
    /// an implicit transaction with a message sent before it. (PostgreSQL refuses
    /// VACUUM, CREATE INDEX CONCURRENTLY and the like after an unsynced message.)
    pub single_dml: bool,
    /// Recognised by the plain-DML fast path: nothing in it depends on the values of its
    /// literals, so a text that differs only there may share it (see `template`).
    pub(super) plain: bool,
    pub(super) sql: Box<str>,
    /// What sqlparser says, filled by the router on first need.
    pub(super) facts: OnceLock<Arc<SqlFacts>>,
    /// Byte ranges of the literals of `sql` (see `facts::literal_ranges`).
    pub(super) literals: OnceLock<Literals>,
    pub(super) may_write: LazyFlag,
    pub(super) mentions_column: LazyFlag,
    /// See `effects::cannot_wait`.
    pub(super) cannot_wait: LazyFlag,
    /// See `effects::session_risk`.
    pub(super) session_risk: OnceLock<SessionRisk>,
    /// How long the shape took lately, shared with the texts that differ only in literals.
    pub(super) shape: Arc<ShapeTiming>,
}

impl std::fmt::Debug for Analysis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Analysis")
            .field("kind", &self.kind)
            .field("hint", &self.hint)
            .field("sql", &self.sql)
            .finish()
    }
}

impl Analysis {
    /// A `SET`/`RESET` of the tenant parameter, which only pgtenant may carry out.
    pub fn sets_tenant(&self) -> bool {
        is_tenant_set(&self.kind)
    }

    /// The statement text.
    pub fn text(&self) -> &str {
        &self.sql
    }

    /// Whether the text contains the tenant column's name at all: when not, it names
    /// no tenant and needs no parse for that. `column` is lowercase and the same for
    /// every call (the router's).
    pub(super) fn mentions(&self, column: &str) -> bool {
        self.mentions_column.get_or_init(|| contains_ignore_case(self.sql.as_bytes(), column.as_bytes()))
    }

    /// Whether the statement may change data or schema (refused for read-only tenants).
    pub fn may_write(&self) -> bool {
        self.may_write.get_or_init(|| may_write(&self.sql))
    }

    /// Whether the statement only reads and can wait on no other session (see
    /// `effects::cannot_wait`).
    pub fn cannot_wait(&self) -> bool {
        self.cannot_wait.get_or_init(|| super::effects::cannot_wait(&self.sql))
    }

    /// What the statement may do to the server session's state behind pgtenant's back
    /// (see `effects::session_risk`).
    pub fn session_risk(&self) -> SessionRisk {
        *self.session_risk.get_or_init(|| super::effects::session_risk(&self.sql))
    }

    /// The recent timing of the statement's shape.
    pub fn shape(&self) -> &ShapeTiming {
        &self.shape
    }

    /// The byte ranges of the text's literals, in text order.
    pub(super) fn literals(&self) -> &[Range<usize>] {
        self.literals.get_or_init(|| literal_ranges(&self.sql).collect())
    }

    /// The analysis of a plain DML text (see `is_plain_dml`).
    pub(super) fn plain_dml(sql: Box<str>) -> Self {
        Self::plain_dml_of_shape(sql, Arc::default())
    }

    /// The analysis of a plain DML text whose shape is `shape`'s.
    pub(super) fn plain_dml_of_shape(sql: Box<str>, shape: Arc<ShapeTiming>) -> Self {
        Analysis {
            kind: StatementKind::Other,
            hint: None,
            pin: None,
            is_multi: false,
            sets_tenant_among_many: false,
            session_changes: Box::default(),
            bad_setting: None,
            tampers_tenant_guc: false,
            lifts_read_only: false,
            controls_transaction: false,
            set_config_name_params: Box::default(),
            other_sessions: None,
            prepared_view: Box::default(),
            single_dml: true,
            plain: true,
            sql,
            facts: OnceLock::new(),
            literals: OnceLock::new(),
            may_write: LazyFlag::default(),
            mentions_column: LazyFlag::default(),
            cannot_wait: LazyFlag::default(),
            session_risk: OnceLock::new(),
            shape,
        }
    }
}

/// Analyzes a query string; `tenant_param` is the configured parameter name.
pub fn analyze(sql: &[u8], tenant_param: &str, key: TenantKey) -> Analysis {
    if is_plain_dml(sql) && !mentions_all_shards(sql) {
        return Analysis::plain_dml(text_of(sql));
    }
    let text = String::from_utf8_lossy(sql);
    // Token offsets index `text`: lossy decoding can change lengths (invalid bytes).
    let tokens = tokenize(text.as_bytes());
    let hint = tokens
        .iter()
        .filter(|t| t.kind == TokenKind::BlockComment)
        .find_map(|t| hint_in_comment(&text[t.start..t.end], tenant_param, key));
    let code: Vec<Token> = tokens.into_iter().filter(|t| t.kind != TokenKind::BlockComment).collect();
    let statements: Vec<&[Token]> =
        code.split(|t| t.kind == TokenKind::Semicolon).filter(|s| !s.is_empty()).collect();
    let first_end = code.iter().position(|t| t.kind == TokenKind::Semicolon).unwrap_or(code.len());
    let words = Words { sql: &text, tokens: &code[..first_end] };
    let mut bad_setting = None;
    let kind = classify(&words, tenant_param, key, &mut bad_setting);
    let mut sets_tenant_among_many = false;
    let mut session_changes = Vec::new();
    let mut controls_transaction = false;
    let mut unfollowed = false;
    for stmt in &statements {
        let w = Words { sql: &text, tokens: stmt };
        let mut bad_value = None;
        let kind = match statements.len() {
            1 => kind.clone(),
            _ => classify(&w, tenant_param, key, &mut bad_value),
        };
        sets_tenant_among_many |= statements.len() > 1 && (is_tenant_set(&kind) || bad_value.is_some());
        controls_transaction |= controls_transaction_block(&w);
        unfollowed |= kind == StatementKind::UnfollowedSet;
        session_changes.extend(SessionChange::of(&kind));
        match session_config_calls(&w) {
            Some(changes) => session_changes.extend(changes),
            None => unfollowed = true,
        }
    }
    if controls_transaction && !session_changes.is_empty() {
        // Whether each SET outlives the string depends on which transaction it fell in
        // (`BEGIN; SET ...; ROLLBACK`): too much to follow for what clients do.
        session_changes.clear();
        unfollowed = true;
    }
    let pin = statements
        .iter()
        .find_map(|stmt| pin_reason(&Words { sql: &text, tokens: stmt }))
        .or(unfollowed.then_some(PinReason::UnfollowedSet));
    let tampers_tenant_guc = statements.iter().any(|stmt| {
        let w = Words { sql: &text, tokens: stmt };
        let set_local =
            w.is(0, "set") && w.is(1, "local") && setting_name(&w, 2).0.eq_ignore_ascii_case(tenant_param);
        set_local || calls_set_config_on(&w, tenant_param) || alters_tenant_default(&w, tenant_param)
    });
    let set_config_name_params = statements
        .iter()
        .flat_map(|stmt| {
            let w = Words { sql: &text, tokens: stmt };
            set_config_calls(&w).filter_map(|i| parameter_at(&w, i + 2)).collect::<Vec<_>>()
        })
        .collect();
    let single_dml = statements.len() == 1 && DML_STARTS.iter().any(|k| words.is(0, k));
    let answered_here = statements.len() == 1 && matches!(kind, StatementKind::ProxyCall(_));
    let other_sessions = match answered_here {
        true => None,
        false => super::other_sessions::named(&text, &code).map(String::into_boxed_str).or_else(|| {
            super::other_sessions::unicode_escaped_name(&text, &code).then(|| "a U&\"...\" identifier".into())
        }),
    };
    Analysis {
        kind,
        hint,
        pin,
        is_multi: statements.len() > 1,
        single_dml,
        sets_tenant_among_many,
        session_changes: session_changes.into(),
        bad_setting,
        tampers_tenant_guc,
        lifts_read_only: statements.iter().any(|stmt| lifts_read_only(&Words { sql: &text, tokens: stmt })),
        controls_transaction,
        set_config_name_params,
        other_sessions,
        prepared_view: super::prepared_view::references(&text, &code).into(),
        plain: false,
        sql: text.into(),
        facts: OnceLock::new(),
        literals: OnceLock::new(),
        may_write: LazyFlag::default(),
        mentions_column: LazyFlag::default(),
        cannot_wait: LazyFlag::default(),
        session_risk: OnceLock::new(),
        shape: Arc::default(),
    }
}

/// A `set_config` call that may set the tenant parameter: its name argument is the
/// parameter, or anything pgtenant cannot read as a plain literal (an expression, an
/// escaped string), which could spell it. A `$n` parameter is read at Bind instead
/// (`SessionChange::name_parameter`).
fn calls_set_config_on(w: &Words, tenant_param: &str) -> bool {
    set_config_calls(w).any(|i| match set_config_name(w, i) {
        Some(name) => name.eq_ignore_ascii_case(tenant_param),
        None => parameter_at(w, i + 2).is_none() || w.text(i + 3) != ",",
    })
}

/// The token indexes of the `set_config` calls of a statement.
fn set_config_calls<'a>(w: &'a Words) -> impl Iterator<Item = usize> + 'a {
    (0..w.tokens.len()).filter(|&i| w.is(i, "set_config") && w.text(i + 1) == "(")
}

/// The number `n` of a `$n` token at `i`.
fn parameter_at(w: &Words, i: usize) -> Option<u16> {
    let token = w.tokens.get(i)?;
    let text = w.text(i);
    (token.kind == TokenKind::Punct && text.len() > 1 && text.starts_with('$'))
        .then(|| text[1..].parse().ok())?
}

/// The setting name of the `set_config` call at token `i`, when pgtenant can read it:
/// a plain literal, or the column `name` of the one `pg_settings` row the statement
/// reads (`... FROM pg_settings WHERE name = '<setting>'`, as pg_dump sends).
fn set_config_name(w: &Words, i: usize) -> Option<String> {
    if w.text(i + 3) != "," {
        return None;
    }
    let token = w.tokens.get(i + 2)?;
    if token.kind == TokenKind::Word && w.is(i + 2, "name") {
        return pg_settings_row(w);
    }
    plain_string((token.kind, w.text(i + 2))).map(literal_text)
}

/// `<setting>` when the statement ends in `FROM [pg_catalog.]pg_settings WHERE name =
/// '<setting>'`.
fn pg_settings_row(w: &Words) -> Option<String> {
    let n = w.tokens.len();
    if n < 7 {
        return None;
    }
    let literal = plain_string((w.tokens[n - 1].kind, w.text(n - 1)))?;
    let tail = [(n - 5, "pg_settings"), (n - 4, "where"), (n - 3, "name")];
    if !tail.iter().all(|&(k, word)| w.is(k, word)) || w.text(n - 2) != "=" {
        return None;
    }
    let from = if w.text(n - 6) == "." && w.is(n - 7, "pg_catalog") { n.checked_sub(8)? } else { n - 6 };
    w.is(from, "from").then(|| literal_text(literal))
}

/// What the `set_config(name, value, is_local)` calls of a statement do to the session:
/// the settings they change when `is_local` is false (read from literals, or from a
/// `$n` parameter for the value), or `None` when pgtenant cannot tell.
fn session_config_calls(w: &Words) -> Option<Vec<SessionChange>> {
    let mut changes = Vec::new();
    for i in set_config_calls(w) {
        // The arguments' token ranges, split at the commas between them.
        let mut arguments = Vec::new();
        let (mut depth, mut from) = (0, i + 2);
        for k in i + 1..w.tokens.len() {
            match w.text(k) {
                "(" => depth += 1,
                "," if depth == 1 => {
                    arguments.push(from..k);
                    from = k + 1;
                }
                ")" if depth == 1 => {
                    arguments.push(from..k);
                    break;
                }
                ")" => depth -= 1,
                _ => {}
            }
        }
        // The name is read by `set_config_name`, which also makes sure it is one token.
        let [_, value, is_local] = arguments.as_slice() else { return None };
        let single = |range: &Range<usize>| {
            (range.len() == 1).then(|| (w.tokens[range.start].kind, w.text(range.start)))
        };
        let truth = |(kind, text): (TokenKind, &str)| match kind {
            TokenKind::Word => Some(text.to_ascii_lowercase()),
            _ => plain_string((kind, text)).map(|t| t.trim_matches('\'').to_ascii_lowercase()),
        };
        match truth(single(is_local)?)?.as_str() {
            "true" | "t" | "on" | "yes" | "1" => continue,
            "false" | "f" | "off" | "no" | "0" => {}
            _ => return None,
        }
        let name = match set_config_name(w, i) {
            Some(name) if is_plain_setting(&name) => ConfigArg::Text(name),
            Some(_) => return None,
            None if w.text(i + 3) == "," => ConfigArg::Parameter(parameter_at(w, i + 2)?),
            None => return None,
        };
        let value = match single(value)? {
            (TokenKind::Punct, p) if p.len() > 1 && p.starts_with('$') => {
                ConfigArg::Parameter(p[1..].parse().ok()?)
            }
            (TokenKind::Number, n) => ConfigArg::Text(n.to_string()),
            other => ConfigArg::Text(plain_string(other)?.to_string()),
        };
        changes.push(match (name, value) {
            (ConfigArg::Text(name), ConfigArg::Text(value)) => SessionChange::Set { name, value },
            (name, value) => SessionChange::SetFromParameters { name, value },
        });
    }
    Some(changes)
}

/// The text a plain string literal stands for.
fn literal_text(literal: &str) -> String {
    literal.trim_matches('\'').replace("''", "'")
}

/// A string literal token without escapes, as written (quotes included).
fn plain_string((kind, text): (TokenKind, &str)) -> Option<&str> {
    (kind == TokenKind::String && text.starts_with('\'') && !text.contains('\\')).then_some(text)
}

/// `ALTER ROLE/DATABASE ... SET <tenant parameter>`: a default that server connections
/// would start with, behind pgtenant's back.
fn alters_tenant_default(w: &Words, tenant_param: &str) -> bool {
    w.is(0, "alter") && contains_ignore_case(w.rest_from(0).as_bytes(), tenant_param.as_bytes())
}

/// Whether `needle` (non-empty) occurs in `hay`, ASCII case ignored.
fn contains_ignore_case(hay: &[u8], needle: &[u8]) -> bool {
    // Run on every statement text a session sends: jump between the places where the
    // first byte occurs (either case) instead of comparing at every position.
    let Some((&first, rest)) = needle.split_first() else { return false };
    let Some(last_start) = hay.len().checked_sub(needle.len()) else { return false };
    memchr::memchr2_iter(first.to_ascii_lowercase(), first.to_ascii_uppercase(), &hay[..=last_start])
        .any(|i| hay[i + 1..i + needle.len()].eq_ignore_ascii_case(rest))
}

/// The first words of DML statements (see `Analysis::single_dml`).
const DML_STARTS: [&str; 8] = ["select", "insert", "update", "delete", "merge", "with", "values", "table"];

/// The setting name under which the proxy reports the routing version it serves.
pub const ROUTING_VERSION: &str = "pgtenant.routing_version";

/// Statements that only read (or only manage the session): what a read-only tenant may run.
const READ_ONLY_STARTS: [&str; 23] = [
    "select",
    "show",
    "values",
    "table",
    "explain",
    "begin",
    "start",
    "commit",
    "end",
    "rollback",
    "abort",
    "set",
    "reset",
    "declare",
    "fetch",
    "move",
    "close",
    "discard",
    "deallocate",
    "listen",
    "unlisten",
    "savepoint",
    "release",
];

/// Whether any statement of `sql` may change data or schema. Conservative: what it
/// does not recognise as reading counts as writing.
fn may_write(sql: &str) -> bool {
    let tokens = code_tokens(sql);
    tokens.split(|t| t.kind == TokenKind::Semicolon).filter(|s| !s.is_empty()).any(|stmt| {
        let w = Words { sql, tokens: stmt };
        if w.is(0, "with") {
            return ["insert", "update", "delete", "merge"].iter().any(|k| w.contains_word(k));
        }
        if w.is(0, "copy") {
            // COPY ... TO writes no table: unless its query writes, or it writes a file.
            let copies_out = w.contains_word("to") && !w.contains_word("from") && !w.contains_word("program");
            return !copies_out || ["insert", "update", "delete", "merge"].iter().any(|k| w.contains_word(k));
        }
        let reads = READ_ONLY_STARTS.iter().any(|k| w.is(0, k));
        let select_into = w.is(0, "select") && w.contains_word("into");
        let explain_analyze = w.is(0, "explain") && w.contains_word("analyze");
        let locks = w.is(0, "select") && w.contains_word("for") && w.contains_word("update");
        !reads || select_into || explain_analyze || locks
    })
}

/// One DML statement with no comment, no second statement and nothing that could
/// pin a connection: the common case, recognised without tokenizing.
fn is_plain_dml(sql: &[u8]) -> bool {
    let start = sql.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(sql.len());
    let rest = &sql[start..];
    let word_len = rest.iter().position(|b| !b.is_ascii_alphabetic()).unwrap_or(rest.len());
    if !DML_STARTS.iter().any(|w| rest[..word_len].eq_ignore_ascii_case(w.as_bytes())) {
        return false;
    }
    let body = rest.trim_ascii_end();
    let body = body.strip_suffix(b";").unwrap_or(body);
    // One pass with a table lookup per byte (this runs on every statement text a
    // session sends): a second statement, a backslash, a comment, a dollar-quoted
    // string, or a word that may pin a connection or touch the tenant GUC.
    let mut i = 0;
    while i < body.len() {
        let class = SCAN_CLASS[usize::from(body[i])];
        if class != PLAIN && breaks_plainness(body, i, class) {
            return false;
        }
        i += 1;
    }
    true
}

// `is_plain_dml`'s byte classes: what a byte can begin.
const PLAIN: u8 = 0;
/// `;` or `\`: a second statement or an escape.
const STOP: u8 = 1;
const DOLLAR: u8 = 2;
const SLASH: u8 = 3;
const DASH: u8 = 4;
/// `WORD + k`: the first letter (either case) of `SUSPICIOUS_WORDS[k]`.
const WORD: u8 = 5;
/// Words that may pin a connection or touch the tenant GUC, matched anywhere
/// (`pg_temp.t` counts as `temp`). Their first letters differ. `pg` stands for
/// `pgtenant.` and for every `pg_` name (the built-ins pgtenant answers itself or
/// refuses, see `other_sessions`): `pgbench_accounts` stays plain.
const SUSPICIOUS_WORDS: [&[u8]; 4] = [b"advisory", b"temp", b"set_config", b"pg"];

const SCAN_CLASS: [u8; 256] = {
    let mut table = [PLAIN; 256];
    table[b';' as usize] = STOP;
    table[b'\\' as usize] = STOP;
    table[b'$' as usize] = DOLLAR;
    table[b'/' as usize] = SLASH;
    table[b'-' as usize] = DASH;
    let mut k = 0;
    while k < SUSPICIOUS_WORDS.len() {
        let first = SUSPICIOUS_WORDS[k][0];
        table[first as usize] = WORD + k as u8;
        table[first.to_ascii_uppercase() as usize] = WORD + k as u8;
        k += 1;
    }
    table
};

/// Whether the byte at `i`, of class `class` (not plain), makes `body` more than plain DML.
fn breaks_plainness(body: &[u8], i: usize, class: u8) -> bool {
    let next = body.get(i + 1).copied();
    match class {
        STOP => true,
        // `$1` is a parameter; `$$` or `$tag$` opens a dollar-quoted string.
        DOLLAR => !next.is_some_and(|b| b.is_ascii_digit()),
        SLASH => next == Some(b'*'),
        DASH => next == Some(b'-'),
        _ => {
            let word = SUSPICIOUS_WORDS[usize::from(class - WORD)];
            // Most letters that start no such word are told apart by the next byte.
            if next.is_none_or(|b| b | 0x20 != word[1])
                || !body.get(i..i + word.len()).is_some_and(|here| here.eq_ignore_ascii_case(word))
            {
                return false;
            }
            let after = &body[i + word.len()..];
            word != b"pg"
                || after.first() == Some(&b'_')
                || after.get(..7).is_some_and(|w| w.eq_ignore_ascii_case(b"tenant."))
        }
    }
}

/// The statement as text; invalid UTF-8 (which the server will refuse) replaced.
fn text_of(sql: &[u8]) -> Box<str> {
    match std::str::from_utf8(sql) {
        Ok(text) => text.into(),
        Err(_) => String::from_utf8_lossy(sql).into(),
    }
}

fn is_tenant_set(kind: &StatementKind) -> bool {
    matches!(kind, StatementKind::SetTenant(_) | StatementKind::ResetTenant)
}

pub(super) struct Words<'a> {
    pub(super) sql: &'a str,
    pub(super) tokens: &'a [Token],
}

impl Words<'_> {
    pub(super) fn text(&self, i: usize) -> &str {
        self.tokens.get(i).map(|t| &self.sql[t.start..t.end]).unwrap_or("")
    }
    pub(super) fn is(&self, i: usize, word: &str) -> bool {
        self.tokens.get(i).is_some_and(|t| t.kind == TokenKind::Word)
            && self.text(i).eq_ignore_ascii_case(word)
    }
    fn rest_from(&self, i: usize) -> &str {
        match (self.tokens.get(i), self.tokens.last()) {
            (Some(a), Some(b)) => self.sql[a.start..b.end].trim(),
            _ => "",
        }
    }
    pub(super) fn contains_word(&self, word: &str) -> bool {
        (0..self.tokens.len()).any(|i| self.is(i, word))
    }
}

/// The word `all_shards` (bare or quoted) followed by a dot: a table on every shard.
fn names_all_shards(w: &Words) -> bool {
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

fn classify(
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
        let name = match w.tokens.get(at).map(|t| t.kind) {
            Some(TokenKind::Word) => w.text(at).to_ascii_lowercase(),
            Some(TokenKind::QuotedIdent) => w.text(at).trim_matches('"').replace("\"\"", "\""),
            _ => return StatementKind::Other,
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

fn classify_set(
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
fn session_characteristics(w: &Words, i: usize) -> StatementKind {
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
fn setting_name(w: &Words, mut i: usize) -> (String, usize) {
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

/// Whether `name` can be a setting's name as pgtenant follows them (letters, digits,
/// `_` and `.`).
pub fn is_plain_setting(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
}

/// The settings that make a transaction read-only: pgtenant turns the first on for a
/// tenant that may not write, and the tenant may change neither.
pub const READ_ONLY_SETTINGS: [&str; 2] = ["default_transaction_read_only", "transaction_read_only"];

/// Whether a statement would let its transaction, or the session's next ones, write
/// although pgtenant made them read-only: `BEGIN`/`START TRANSACTION`/`SET TRANSACTION`/
/// `SET SESSION CHARACTERISTICS AS TRANSACTION` with `READ WRITE`, a SET or RESET of
/// `READ_ONLY_SETTINGS`, or `set_config` of one of them by name.
fn lifts_read_only(w: &Words) -> bool {
    let read_write = (1..w.tokens.len()).any(|i| w.is(i - 1, "read") && w.is(i, "write"));
    let begins = w.is(0, "begin") || (w.is(0, "start") && w.is(1, "transaction"));
    let sets_mode =
        w.is(0, "set") && (w.is(1, "transaction") || (w.is(1, "session") && w.is(2, "characteristics")));
    if read_write && (begins || sets_mode) {
        return true;
    }
    let protected = |name: &str| READ_ONLY_SETTINGS.iter().any(|s| name.eq_ignore_ascii_case(s));
    if w.is(0, "set") || w.is(0, "reset") {
        let at = if w.is(1, "session") || w.is(1, "local") { 2 } else { 1 };
        if protected(&setting_name(w, at).0) {
            return true;
        }
    }
    set_config_calls(w).any(|i| set_config_name(w, i).is_some_and(|name| protected(&name)))
}

/// Transaction control of any kind, savepoints included.
fn controls_transaction_block(w: &Words) -> bool {
    ["begin", "start", "commit", "end", "rollback", "abort", "savepoint", "release"]
        .iter()
        .any(|k| w.is(0, k))
        || (w.is(0, "prepare") && w.is(1, "transaction"))
}

fn pin_reason(w: &Words) -> Option<PinReason> {
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
fn hint_in_comment(comment: &str, tenant_param: &str, key: TenantKey) -> Option<TenantId> {
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

/// Statements of these kinds never need a tenant, whatever sqlparser says.
pub(super) fn needs_no_tenant(analysis: &Analysis) -> bool {
    if analysis.kind != StatementKind::Other {
        return true;
    }
    let first_word = analysis.sql.split_whitespace().next().unwrap_or("").to_ascii_lowercase();
    matches!(
        first_word.as_str(),
        "show" | "listen" | "unlisten" | "notify" | "discard" | "deallocate" | "savepoint" | "release"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "pgtenant.tenant_id";

    fn kind(sql: &str) -> StatementKind {
        analyze(sql.as_bytes(), P, TenantKey::Bigint).kind
    }

    #[test]
    fn tells_reads_from_writes() {
        let writes = |sql: &str| analyze(sql.as_bytes(), P, TenantKey::Bigint).may_write();
        assert!(!writes("select * from accounts where tenant_id = 1"));
        assert!(!writes("/* c */ SHOW TimeZone; BEGIN; select 1; COMMIT"));
        assert!(!writes("with a as (select 1) select * from a"));
        assert!(writes("insert into accounts values (1)"));
        assert!(writes("select 1; delete from accounts"));
        assert!(writes("with d as (delete from accounts returning *) select * from d"));
        assert!(writes("select * into copy_of from accounts"));
        assert!(writes("select * from accounts for update"));
        assert!(writes("explain analyze update accounts set x = 1"));
        assert!(writes("create table t (a int)"));
        assert!(writes("copy accounts from stdin"));
        assert!(!writes("COPY (SELECT 1) TO STDOUT"));
        assert!(!writes("copy accounts to stdout with (format csv)"));
        assert!(writes("copy (delete from accounts returning *) to stdout"));
        assert!(writes("copy accounts to program 'cat'"));
        assert!(!writes("BEGIN; SAVEPOINT a; RELEASE a; ROLLBACK TO SAVEPOINT a; COMMIT"));
    }

    #[test]
    fn sees_every_way_to_lift_the_read_only_wall() {
        let lifts = |sql: &str| analyze(sql.as_bytes(), P, TenantKey::Bigint).lifts_read_only;
        for sql in [
            "BEGIN READ WRITE",
            "begin isolation level serializable, read write",
            "START TRANSACTION READ WRITE",
            "BEGIN; SET TRANSACTION READ WRITE; SELECT 1; COMMIT",
            "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
            "SET default_transaction_read_only = off",
            "set session DEFAULT_TRANSACTION_READ_ONLY to false",
            "SET LOCAL transaction_read_only = off",
            "RESET default_transaction_read_only",
            "SELECT set_config('default_transaction_read_only', 'off', false)",
            "SELECT 1; SELECT pg_catalog.set_config('transaction_read_only', 'off', true)",
        ] {
            assert!(lifts(sql), "{sql}");
        }
        for sql in [
            "BEGIN",
            "BEGIN READ ONLY",
            "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
            "SELECT 1",
            "RESET ALL",
        ] {
            assert!(!lifts(sql), "{sql}");
        }
    }

    #[test]
    fn sees_every_way_to_change_the_tenant_guc() {
        let tampers = |sql: &str| analyze(sql.as_bytes(), P, TenantKey::Bigint).tampers_tenant_guc;
        assert!(tampers("SELECT set_config('pgtenant.tenant_id', '5', false)"));
        assert!(tampers("select pg_catalog.set_config('PGTENANT.TENANT_ID', '5', true)"));
        let bound = analyze(b"SELECT set_config($2, $1, true)", P, TenantKey::Bigint);
        assert!(!bound.tampers_tenant_guc, "the name is read from the Bind");
        assert_eq!(&bound.set_config_name_params[..], [2], "and checked there");
        assert!(tampers("SELECT set_config(lower('PGTENANT.TENANT_ID'), '5', false)"));
        assert!(tampers("SELECT set_config(E'pgtenant\\x2etenant_id', '5', false)"));
        assert!(tampers("BEGIN; SET LOCAL pgtenant.tenant_id = 5; COMMIT"));
        assert!(tampers("ALTER ROLE app SET pgtenant.tenant_id = '5'"));
        assert!(tampers("alter database app set PGTENANT.tenant_id to 5"));
        assert!(!tampers("SELECT set_config('application_name', 'x', false)"));
        // pg_dump's way: the name of the one pg_settings row read.
        let dump = "SELECT set_config(name, 'view, foreign-table', false) FROM pg_settings WHERE name = 'restrict_nonsystem_relation_kind'";
        assert!(!tampers(dump));
        assert!(tampers(
            "SELECT set_config(name, '5', false) FROM pg_settings WHERE name = 'pgtenant.tenant_id'"
        ));
        assert!(tampers("SELECT set_config(name, '5', false) FROM pg_settings WHERE name LIKE 'pgtenant%'"));
        assert!(tampers("SELECT set_config(name, '5', false) FROM pg_settings"));
        assert!(tampers("SELECT set_config(name, 'x', false)"));
        assert!(!tampers(
            "select set_config(name, 'x', false) from pg_catalog.pg_settings where name = 'work_mem'"
        ));
        let changes = analyze(dump.as_bytes(), P, TenantKey::Bigint).session_changes;
        assert_eq!(
            changes[..],
            [SessionChange::Set {
                name: "restrict_nonsystem_relation_kind".into(),
                value: "'view, foreign-table'".into()
            }]
        );
        assert!(!tampers("SET LOCAL statement_timeout = 5"));
        assert!(!tampers("ALTER TABLE accounts ADD COLUMN note text"));
    }

    #[test]
    fn classifies_transaction_control_and_settings() {
        assert_eq!(kind("BEGIN"), StatementKind::Begin);
        assert_eq!(kind("start transaction isolation level serializable"), StatementKind::Begin);
        assert_eq!(kind("commit;"), StatementKind::Commit);
        assert_eq!(kind("ROLLBACK"), StatementKind::Rollback);
        assert_eq!(kind("ROLLBACK TO SAVEPOINT a"), StatementKind::Other);
        assert_eq!(kind("SET pgtenant.tenant_id = 42"), StatementKind::SetTenant(TenantId::Int(42)));
        assert_eq!(
            kind("set session pgtenant.tenant_id to '7';"),
            StatementKind::SetTenant(TenantId::Int(7))
        );
        assert_eq!(kind("RESET pgtenant.tenant_id"), StatementKind::ResetTenant);
        assert_eq!(kind("show pgtenant.routing_version;"), StatementKind::ShowRoutingVersion);
        assert_eq!(kind("show pgtenant.routing_version_x"), StatementKind::Other);
        assert_eq!(kind("SET pgtenant.tenant_id TO DEFAULT"), StatementKind::ResetTenant);
        assert_eq!(
            kind("SET application_name = 'x y'"),
            StatementKind::Set { name: "application_name".into(), value: "'x y'".into() }
        );
        assert_eq!(
            kind("SET TIME ZONE 'UTC'"),
            StatementKind::Set { name: "TimeZone".into(), value: "'UTC'".into() }
        );
        assert_eq!(kind("SET LOCAL search_path = a"), StatementKind::Other);
        assert_eq!(kind("RESET ALL"), StatementKind::ResetAll);
        assert_eq!(kind("reset search_path"), StatementKind::Reset { name: "search_path".into() });
        assert_eq!(kind("DISCARD ALL"), StatementKind::DiscardAll);
        assert_eq!(kind("DEALLOCATE ALL"), StatementKind::DiscardAll);
        assert_eq!(kind("deallocate prepare ALL"), StatementKind::DiscardAll);
        assert_eq!(kind("DEALLOCATE a1"), StatementKind::Deallocate("a1".into()));
        assert_eq!(kind("DEALLOCATE PREPARE \"S_1\""), StatementKind::Deallocate("S_1".into()));
        let a = analyze(b"SET pgtenant.tenant_id = abc", P, TenantKey::Bigint);
        assert_eq!(a.bad_setting.map(|b| b.value).as_deref(), Some("abc"));
        let a = analyze(b"SET pgtenant.target = 'anywhere'", P, TenantKey::Bigint);
        assert_eq!(a.bad_setting.map(|b| b.value).as_deref(), Some("'anywhere'"));
        assert_eq!(
            kind("set pgtenant.target to 'prefer-replica'"),
            StatementKind::Set { name: "pgtenant.target".into(), value: "'prefer-replica'".into() }
        );
        assert_eq!(target_of("'prefer-replica'"), Some(super::super::TargetMode::PreferReplica));
        assert_eq!(target_of("replica"), Some(super::super::TargetMode::Replica));
    }

    #[test]
    fn follows_session_settings_or_pins_what_it_cannot_follow() {
        let changes = |sql: &str| analyze(sql.as_bytes(), P, TenantKey::Bigint).session_changes.to_vec();
        let pin = |sql: &str| analyze(sql.as_bytes(), P, TenantKey::Bigint).pin;
        let set = |name: &str, value: &str| SessionChange::Set { name: name.into(), value: value.into() };
        assert_eq!(
            kind("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ"),
            StatementKind::Set {
                name: "default_transaction_isolation".into(),
                value: "'repeatable read'".into()
            }
        );
        assert_eq!(
            changes("set session characteristics as transaction read only"),
            [set("default_transaction_read_only", "on")]
        );
        let reset = |name: &str| StatementKind::Reset { name: name.into() };
        assert_eq!(kind("SET TIME ZONE LOCAL"), reset("TimeZone"));
        // The SQL-standard spellings and DEFAULT are the RESETs they stand for.
        assert_eq!(kind("RESET TIME ZONE"), reset("TimeZone"));
        assert_eq!(kind("set time zone default"), reset("TimeZone"));
        assert_eq!(kind("SET statement_timeout TO DEFAULT"), reset("statement_timeout"));
        assert_eq!(kind("SET SESSION search_path = default"), reset("search_path"));
        assert_eq!(kind("SET NAMES DEFAULT"), reset("client_encoding"));
        assert_eq!(
            kind("SET SCHEMA 'x'"),
            StatementKind::Set { name: "search_path".into(), value: "'x'".into() }
        );
        assert_eq!(changes("DISCARD ALL"), [SessionChange::ResetAll]);
        // Several statements: every change, in order, when nothing else decides their fate.
        assert_eq!(
            changes("SET search_path = a; SELECT 1; RESET TimeZone"),
            [set("search_path", "a"), SessionChange::Reset { name: "TimeZone".into() }]
        );
        for sql in [
            "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY, DEFERRABLE",
            "SET XML OPTION DOCUMENT",
            "SET TIME ZONE INTERVAL '+02:00' HOUR TO MINUTE",
            "SET SEED TO 0.5",
            "set seed = 0",
            "BEGIN; SET search_path = a; ROLLBACK",
            "SELECT 1; SET XML OPTION CONTENT",
        ] {
            assert_eq!(pin(sql), Some(PinReason::UnfollowedSet), "{sql}");
            assert!(changes(sql).is_empty(), "{sql}");
        }
        // Over with the transaction: nothing to follow, nothing to pin.
        for sql in [
            "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
            "SET LOCAL search_path = a",
            "SET CONSTRAINTS ALL DEFERRED",
        ] {
            assert_eq!(pin(sql), None, "{sql}");
            assert!(changes(sql).is_empty(), "{sql}");
        }
        // set_config for the session, as asyncpg calls it around its type introspection.
        assert_eq!(
            changes("SELECT current_setting('jit') AS cur, set_config('jit', 'off', false) AS new"),
            [set("jit", "'off'")]
        );
        assert_eq!(
            changes("select pg_catalog.set_config('jit', $1, 'f'), set_config('x.y', 5, false)"),
            [
                SessionChange::SetFromParameters {
                    name: ConfigArg::Text("jit".into()),
                    value: ConfigArg::Parameter(1)
                },
                set("x.y", "5")
            ]
        );
        for sql in [
            "select 1, set_config('x.y', f(1, 2), false)",
            "SELECT set_config(name, 'v', false) FROM t",
            "SELECT set_config('x.y', 'v', $1)",
            "SELECT set_config('x.y', E'\\n', false)",
        ] {
            assert_eq!(pin(sql), Some(PinReason::UnfollowedSet), "{sql}");
        }
        // Local to the transaction: nothing to follow.
        for sql in [
            "SELECT set_config('request.claims', concat('a', $1), true)",
            "SELECT set_config('x.y', 'v', 'on')",
        ] {
            assert_eq!(pin(sql), None, "{sql}");
            assert!(changes(sql).is_empty(), "{sql}");
        }
        assert_eq!(pin("SET SESSION AUTHORIZATION other"), Some(PinReason::RoleChange));
        assert_eq!(pin("SET ROLE other"), Some(PinReason::RoleChange));
    }

    #[test]
    fn every_prefix_of_a_settings_statement_is_analysed_without_panic() {
        for sql in [
            "SELECT set_config(name, 'x', false) FROM pg_catalog.pg_settings WHERE name = 'work_mem'",
            "select pg_catalog.set_config('a.b', $12, 'off'), set_config(('x'), f(1, (2)), true)",
            "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED, READ ONLY",
            "DEALLOCATE PREPARE \"a\"\"b\"; BEGIN; SET TIME ZONE INTERVAL '1' HOUR; COMMIT",
        ] {
            for end in 0..=sql.len() {
                let _ = analyze(&sql.as_bytes()[..end], P, TenantKey::Bigint);
            }
        }
    }

    #[test]
    fn finds_hints_pins_and_multi_statements() {
        assert_eq!(
            analyze(b"SELECT 1 /* pgtenant.tenant_id=42 */", P, TenantKey::Bigint).hint,
            Some(TenantId::Int(42))
        );
        assert_eq!(
            analyze(b"SELECT * FROM t /*controller='x',tenant_id='1500'*/", P, TenantKey::Bigint).hint,
            Some(TenantId::Int(1500))
        );
        assert_eq!(analyze(b"SELECT '/* tenant_id=5 */'", P, TenantKey::Bigint).hint, None);
        assert_eq!(analyze(b"LISTEN chan", P, TenantKey::Bigint).pin, Some(PinReason::Listen));
        assert_eq!(
            analyze(b"select pg_advisory_lock(1)", P, TenantKey::Bigint).pin,
            Some(PinReason::AdvisoryLock)
        );
        assert_eq!(analyze(b"select pg_advisory_xact_lock(1)", P, TenantKey::Bigint).pin, None);
        assert_eq!(
            analyze(b"CREATE TEMP TABLE t (a int)", P, TenantKey::Bigint).pin,
            Some(PinReason::TempTable)
        );
        for sql in [
            "SELECT 1 AS a INTO TEMP t",
            "select * into local temporary table t from x",
            "CREATE TABLE pg_temp.t (a int)",
        ] {
            assert_eq!(
                analyze(sql.as_bytes(), P, TenantKey::Bigint).pin,
                Some(PinReason::TempTable),
                "{sql}"
            );
        }
        assert_eq!(analyze(b"SELECT 1 INTO t", P, TenantKey::Bigint).pin, None);
        assert_eq!(
            analyze(b"DECLARE c CURSOR WITH HOLD FOR SELECT 1", P, TenantKey::Bigint).pin,
            Some(PinReason::HoldCursor)
        );
        assert!(analyze(b"SELECT 1; SELECT 2;", P, TenantKey::Bigint).is_multi);
        assert!(
            analyze(b"SELECT 1; SET pgtenant.tenant_id = 5", P, TenantKey::Bigint).sets_tenant_among_many
        );
        assert!(analyze(b"RESET pgtenant.tenant_id; SELECT 1", P, TenantKey::Bigint).sets_tenant_among_many);
        assert!(!analyze(b"SET pgtenant.tenant_id = 5", P, TenantKey::Bigint).sets_tenant_among_many);
        assert!(
            analyze(b"SELECT 1; SET pgtenant.tenant_id = abc", P, TenantKey::Bigint).sets_tenant_among_many
        );
        assert!(!analyze(b"SELECT ';' ; ", P, TenantKey::Bigint).is_multi);
    }

    #[test]
    fn plain_dml_takes_the_fast_path_and_anything_unusual_does_not() {
        assert!(is_plain_dml(b"SELECT abalance FROM pgbench_accounts WHERE aid = $1"));
        assert!(!is_plain_dml(b"select $$;$$"));
        assert!(is_plain_dml(b" select * from t where id = 5;"));
        assert!(is_plain_dml(b"UPDATE t SET v = v + 1 WHERE id = 2"));
        assert!(!is_plain_dml(b"select 1; select 2"));
        assert!(!is_plain_dml(b"select 1 /* pgtenant.tenant_id=4 */"));
        assert!(!is_plain_dml(b"select pg_advisory_lock(1)"));
        assert!(!is_plain_dml(b"select * into temp t from x"));
        assert!(!is_plain_dml(b"SET x = 1"));
        assert!(!is_plain_dml(b"select 1 -- note"));
        assert!(!is_plain_dml(b"select $tag$x$tag$"));
        assert!(!is_plain_dml(b"select $"));
        assert!(!is_plain_dml(b"select E'a\\b'"));
        assert!(!is_plain_dml(b"SELECT SET_CONFIG('a', 'b', false)"));
        assert!(!is_plain_dml(b"SELECT PGTENANT.next_id()"));
        assert!(!is_plain_dml(b"create temp table t (a int)"));
        assert!(is_plain_dml(b"select a - b, c / d from t where x = $12"));
        assert!(
            is_plain_dml(b"TABLE t")
                && is_plain_dml(b"MERGE INTO t USING u ON true WHEN MATCHED THEN DELETE")
        );
        // Case-insensitive search by first byte, at the end and past it.
        assert!(contains_ignore_case(b"xx TENANT_id", b"tenant_id"));
        assert!(!contains_ignore_case(b"tenant_i", b"tenant_id"));
        assert!(!contains_ignore_case(b"", b"a") && !contains_ignore_case(b"abc", b""));
        // Both paths agree on what they share.
        for sql in [
            "select * from t where id = 5",
            "insert into t values (1)",
            "TABLE t",
            "merge into t using u on true when matched then delete",
        ] {
            let a = analyze(sql.as_bytes(), P, TenantKey::Bigint);
            assert_eq!((a.kind, a.hint, a.pin, a.is_multi), (StatementKind::Other, None, None, false));
        }
    }

    #[test]
    fn invalid_utf8_and_multibyte_text_never_panic() {
        let a = analyze(b"SELECT \xff\xfe /* pgtenant.tenant_id=5 */ FROM t", P, TenantKey::Bigint);
        assert_eq!(a.hint, Some(TenantId::Int(5)));
        let a = analyze("SELECT 'é' /* café=1 */ , \"ü\" FROM t; SET é = ü".as_bytes(), P, TenantKey::Bigint);
        assert!(a.is_multi);
        for junk in [&b"\xc3"[..], b"E'\\\xc3", b"/*\xe2\x82", b"$\xf0$ x", b"SET \xff = 1"] {
            let _ = analyze(junk, P, TenantKey::Bigint);
        }
    }
}
