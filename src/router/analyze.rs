//! What a statement means for routing and for session state: its kind (transaction
//! control, SET/RESET of settings or of the tenant), a tenant hint from a comment,
//! whether it pins the server connection, and (lazily, through sqlparser) whether it
//! touches tables and so needs a tenant.

use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use smallvec::SmallVec;

use super::classify::{classify, hint_in_comment, pin_reason, reserved_statement};
use super::effects::Effects;
use super::facts::{SqlFacts, literal_ranges};
use super::kinds::{ALL_SHARDS, BadSetting, PinReason, SessionChange, StatementKind};
use super::lexer::{Token, TokenKind, tokenize};
use super::plain::is_plain_dml;
use super::protected::{ProtectedSet, changed_by};
use super::quick::ShapeTiming;
use super::set_config::{parameter_at, session_config_calls, set_config_calls};
use super::verbs::{Verb, controls_transaction_block};
use super::words::{Words, contains_ignore_case};
use crate::directory::{TenantId, TenantKey};

/// Whether `sql` may name an `all_shards.` table: the word followed by a dot or a
/// quote (a cheap test; `StatementKind::Scatter` is decided on tokens). Every Parse
/// asks: the word is looked for at its underscores, found by a vector search, rather
/// than at every byte.
pub fn mentions_all_shards(sql: &[u8]) -> bool {
    let word = ALL_SHARDS.as_bytes();
    let Some(before) = word.iter().position(|b| *b == b'_') else { return false };
    memchr::memchr_iter(b'_', sql).any(|at| {
        let Some(start) = at.checked_sub(before) else { return false };
        sql.get(start..start + word.len()).is_some_and(|w| w.eq_ignore_ascii_case(word))
            && matches!(sql.get(start + word.len()), Some(b'.' | b'"'))
    })
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
    /// The protected settings its statements change (see `protected`): the tenant GUC
    /// other than by the tenant switch, its signature, the read-only wall.
    pub protected: ProtectedSet,
    /// The `$n` parameters that name the setting of a `set_config` call: whether it is
    /// the tenant parameter shows only at Bind (see `Session::refusal_of_bound`).
    pub set_config_name_params: Box<[u16]>,
    /// The server-wide view or function of other sessions the text names (see
    /// `other_sessions`), outside the calls pgtenant answers itself: refused.
    pub other_sessions: Option<Box<str>>,
    /// Where the text reads `pg_prepared_statements`, which the session answers with
    /// the client's own statements (see `prepared_view`).
    pub prepared_view: Box<[super::prepared_view::ViewRef]>,
    /// A SQL `PREPARE`, `EXECUTE` or `DEALLOCATE` of a name in pgtenant's namespace on
    /// the server (`protocol::RESERVED_PREFIX`): it would reach (or collide with) a
    /// statement pgtenant prepared there for itself or another client. Refused.
    pub reserved_statement: Option<Box<str>>,
    /// Recognised by the plain-DML fast path: nothing in it depends on the values of its
    /// literals, so a text that differs only there may share it (see `template`).
    pub(super) plain: bool,
    pub(super) sql: Box<str>,
    /// What sqlparser says, filled by the router on first need.
    pub(super) facts: OnceLock<Arc<SqlFacts>>,
    /// Byte ranges of the literals of `sql` (see `facts::literal_ranges`).
    pub(super) literals: OnceLock<Literals>,
    pub(super) mentions_column: LazyFlag,
    /// What the text may do (see `effects`), worked out on first need, once.
    pub(super) effects: OnceLock<Effects>,
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

    /// What the statement may do: write, wait on another session, change the session,
    /// control the transaction (see `effects`). Every consumer reads this one value.
    pub fn effects(&self) -> &Effects {
        self.effects.get_or_init(|| Effects::of(&self.sql))
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
            protected: ProtectedSet::default(),
            set_config_name_params: Box::default(),
            other_sessions: None,
            prepared_view: Box::default(),
            reserved_statement: None,
            plain: true,
            sql,
            facts: OnceLock::new(),
            literals: OnceLock::new(),
            mentions_column: LazyFlag::default(),
            effects: OnceLock::new(),
            shape,
        }
    }
}

/// Analyzes a query string; `tenant_param` is the configured parameter name.
pub fn analyze(sql: &[u8], tenant_param: &str, key: TenantKey) -> Analysis {
    if is_plain_dml(sql) && !mentions_all_shards(sql) {
        return Analysis::plain_dml(text_of(sql));
    }
    analyze_tokens(sql, tenant_param, key)
}

/// The analysis from the text's tokens: every text but those of the fast path, which
/// must agree with it (a test checks them on the fuzz corpus).
fn analyze_tokens(sql: &[u8], tenant_param: &str, key: TenantKey) -> Analysis {
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
        unfollowed |= matches!(kind, StatementKind::UnfollowedSet);
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
    let protected = statements.iter().fold(ProtectedSet::default(), |set, stmt| {
        set.union(changed_by(&Words { sql: &text, tokens: stmt }, tenant_param))
    });
    let set_config_name_params = statements
        .iter()
        .flat_map(|stmt| {
            let w = Words { sql: &text, tokens: stmt };
            set_config_calls(&w).filter_map(|i| parameter_at(&w, i + 2)).collect::<Vec<_>>()
        })
        .collect();
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
        sets_tenant_among_many,
        session_changes: session_changes.into(),
        bad_setting,
        protected,
        set_config_name_params,
        other_sessions,
        prepared_view: super::prepared_view::references(&text, &code).into(),
        reserved_statement: statements
            .iter()
            .find_map(|stmt| reserved_statement(&Words { sql: &text, tokens: stmt }))
            .map(String::into_boxed_str),
        plain: false,
        sql: text.into(),
        facts: OnceLock::new(),
        literals: OnceLock::new(),
        mentions_column: LazyFlag::default(),
        effects: OnceLock::new(),
        shape: Arc::default(),
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

/// Statements of these kinds and verbs never need a tenant, whatever sqlparser says.
pub(super) fn needs_no_tenant(analysis: &Analysis) -> bool {
    if !matches!(analysis.kind, StatementKind::Other) {
        return true;
    }
    let first_word = analysis.sql.split_whitespace().next().unwrap_or("");
    Verb::of_word(first_word.as_bytes()).needs_no_tenant()
}

#[cfg(test)]
mod tests;
