//! Recognises the calls pgtenant answers itself, each a whole statement:
//!
//! - snowflake IDs: `SELECT pgtenant.next_id()` / `SELECT pgtenant.next_id(<shard>)`,
//!   `SELECT pgtenant.next_ids(<n>)` / `SELECT * FROM pgtenant.next_ids(<n>)`,
//!   `SELECT * FROM pgtenant.decode_id(<id>)`;
//! - the client's own backend: `SELECT pg_backend_pid()`, `SELECT
//!   pg_cancel_backend(<pid>)`, `SELECT pg_terminate_backend(<pid>[, <timeout>])`, whose
//!   pid is the one pgtenant gave the client (its BackendKeyData's), never a server's.
//!
//! An argument is an integer literal or a `$n` parameter, optionally cast to an
//! integer type (a pid may also be `pg_backend_pid()`); a result column may be renamed
//! with `AS`. Anything else (other arguments, more clauses, a second statement) is
//! left to the server, where `sql/snowflake.sql` may answer the snowflake calls, and
//! the signal functions are refused (`other_sessions`).

use super::lexer::{Token, TokenKind};
use crate::protocol::{INT2_OID, INT4_OID, INT8_OID};

/// What a recognised call does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProxyCall {
    /// One ID, for the shard given or else the tenant's.
    NextId { shard: Option<CallArg> },
    /// `count` IDs of the tenant's shard, one row each.
    NextIds { count: CallArg },
    /// The parts of an ID, as one row.
    DecodeId { id: CallArg },
    /// `pg_backend_pid()`: the client's pid as pgtenant gave it.
    BackendPid,
    /// `pg_cancel_backend(pid)` or `pg_terminate_backend(pid[, timeout])`.
    Signal { signal: Signal, pid: PidArg, timeout: Option<CallArg> },
}

/// What a signal function asks of the backend it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// Cancel its running statement.
    Cancel,
    /// End its session.
    Terminate,
}

impl Signal {
    pub fn function(self) -> &'static str {
        match self {
            Signal::Cancel => "pg_cancel_backend",
            Signal::Terminate => "pg_terminate_backend",
        }
    }
}

/// The pid a signal function names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PidArg {
    /// `pg_backend_pid()`: the caller itself.
    Own,
    Given(CallArg),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallArg {
    Literal(i64),
    /// `$n` (`index` zero-based) and the type it was cast to (the function's own
    /// argument type when not cast), as a Describe reports it.
    Param {
        index: usize,
        type_oid: i32,
    },
}

/// A recognised call with the name of its result column (for calls of one column).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxySelect {
    pub call: ProxyCall,
    pub column: String,
}

impl ProxySelect {
    /// The `$n` arguments of the call.
    pub fn params(&self) -> impl Iterator<Item = (usize, i32)> {
        let args = match self.call {
            ProxyCall::NextId { shard } => [shard, None],
            ProxyCall::NextIds { count } => [Some(count), None],
            ProxyCall::DecodeId { id } => [Some(id), None],
            ProxyCall::BackendPid => [None, None],
            ProxyCall::Signal { pid, timeout, .. } => [
                match pid {
                    PidArg::Given(arg) => Some(arg),
                    PidArg::Own => None,
                },
                timeout,
            ],
        };
        args.into_iter().flatten().filter_map(|arg| match arg {
            CallArg::Param { index, type_oid } => Some((index, type_oid)),
            CallArg::Literal(_) => None,
        })
    }
}

struct Cursor<'a> {
    sql: &'a str,
    tokens: &'a [Token],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn text(&self) -> &'a str {
        self.tokens.get(self.at).map(|t| &self.sql[t.start..t.end]).unwrap_or("")
    }
    fn kind(&self) -> Option<TokenKind> {
        self.tokens.get(self.at).map(|t| t.kind)
    }
    fn eat_word(&mut self, word: &str) -> bool {
        let hit = self.kind() == Some(TokenKind::Word) && self.text().eq_ignore_ascii_case(word);
        self.at += hit as usize;
        hit
    }
    fn eat_punct(&mut self, p: &str) -> bool {
        let hit = self.kind() == Some(TokenKind::Punct) && self.text() == p;
        self.at += hit as usize;
        hit
    }
    fn done(&self) -> bool {
        self.at == self.tokens.len()
    }
    /// `[pg_catalog.]name(`: a call of the built-in `name`.
    fn eat_builtin_call(&mut self, name: &str) -> bool {
        let start = self.at;
        if self.eat_word("pg_catalog") && !self.eat_punct(".") {
            self.at = start;
            return false;
        }
        if self.eat_word(name) && self.eat_punct("(") {
            return true;
        }
        self.at = start;
        false
    }
}

/// `tokens`: one statement without comments or semicolons.
pub fn recognise(sql: &str, tokens: &[Token]) -> Option<ProxySelect> {
    let mut c = Cursor { sql, tokens, at: 0 };
    if !c.eat_word("select") {
        return None;
    }
    if let Some(call) = backend_call(&mut c) {
        let column = result_column(&mut c, call.0)?;
        return c.done().then_some(ProxySelect { call: call.1, column });
    }
    let from_form = c.eat_punct("*");
    if from_form && !c.eat_word("from") {
        return None;
    }
    if !(c.eat_word("pgtenant") && c.eat_punct(".")) {
        return None;
    }
    let function = c.text().to_ascii_lowercase();
    c.at += 1;
    if !c.eat_punct("(") {
        return None;
    }
    let arg = if c.eat_punct(")") {
        None
    } else {
        let arg = argument(&mut c, INT8_OID)?;
        if !c.eat_punct(")") {
            return None;
        }
        Some(arg)
    };
    let call = match (function.as_str(), arg) {
        ("next_id", shard) => ProxyCall::NextId { shard },
        ("next_ids", Some(count)) => ProxyCall::NextIds { count },
        ("decode_id", Some(id)) if from_form => ProxyCall::DecodeId { id },
        _ => return None,
    };
    let mut column = result_column(&mut c, &function)?;
    if matches!(call, ProxyCall::DecodeId { .. }) {
        // A table alias: the columns keep their names.
        column = "decode_id".into();
    }
    c.done().then_some(ProxySelect { call, column })
}

/// `pg_backend_pid()`, `pg_cancel_backend(pid)`, `pg_terminate_backend(pid[, timeout])`
/// after the SELECT, with the function's name.
fn backend_call(c: &mut Cursor) -> Option<(&'static str, ProxyCall)> {
    let start = c.at;
    if c.eat_builtin_call("pg_backend_pid") {
        if c.eat_punct(")") {
            return Some(("pg_backend_pid", ProxyCall::BackendPid));
        }
    } else {
        for signal in [Signal::Cancel, Signal::Terminate] {
            if !c.eat_builtin_call(signal.function()) {
                continue;
            }
            let pid = if c.eat_builtin_call("pg_backend_pid") {
                c.eat_punct(")").then_some(PidArg::Own)
            } else {
                argument(c, INT4_OID).map(PidArg::Given)
            };
            let timeout = match signal {
                Signal::Terminate if c.eat_punct(",") => Some(argument(c, INT8_OID)),
                _ => None,
            };
            if let (Some(pid), true, false) = (pid, c.eat_punct(")"), timeout == Some(None)) {
                return Some((
                    signal.function(),
                    ProxyCall::Signal { signal, pid, timeout: timeout.flatten() },
                ));
            }
            break;
        }
    }
    c.at = start;
    None
}

/// The result column's name: `function`, or the alias that follows (`AS name`, `name`).
fn result_column(c: &mut Cursor, function: &str) -> Option<String> {
    let bare_alias =
        matches!(c.kind(), Some(TokenKind::Word | TokenKind::QuotedIdent)) && c.at + 1 == c.tokens.len();
    if !(c.eat_word("as") || bare_alias) {
        return Some(function.into());
    }
    let column = match c.kind() {
        Some(TokenKind::Word) => c.text().to_ascii_lowercase(),
        Some(TokenKind::QuotedIdent) => c.text().trim_matches('"').replace("\"\"", "\""),
        _ => return None,
    };
    c.at += 1;
    Some(column)
}

/// An integer literal (with a sign) or `$n`, with an optional integer cast; an
/// uncast `$n` is of `default_type`.
fn argument(c: &mut Cursor, default_type: i32) -> Option<CallArg> {
    let negative = c.eat_punct("-");
    let mut arg = match c.kind()? {
        TokenKind::Number => {
            let v: i64 = c.text().parse().ok()?;
            CallArg::Literal(if negative { -v } else { v })
        }
        TokenKind::Punct if !negative && c.text().len() > 1 && c.text().starts_with('$') => {
            let n: u16 = c.text()[1..].parse().ok()?;
            // $1..$65535, as PostgreSQL allows: a Describe lists that many types.
            CallArg::Param { index: usize::from(n).checked_sub(1)?, type_oid: default_type }
        }
        _ => return None,
    };
    c.at += 1;
    if c.eat_punct(":") {
        if !c.eat_punct(":") {
            return None;
        }
        const INTEGER_TYPES: [(&str, i32); 7] = [
            ("bigint", INT8_OID),
            ("int8", INT8_OID),
            ("int", INT4_OID),
            ("integer", INT4_OID),
            ("int4", INT4_OID),
            ("smallint", INT2_OID),
            ("int2", INT2_OID),
        ];
        let (_, oid) = INTEGER_TYPES.iter().find(|(name, _)| c.eat_word(name))?;
        if let CallArg::Param { type_oid, .. } = &mut arg {
            *type_oid = *oid;
        }
    }
    Some(arg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::lexer::tokenize;

    fn call(sql: &str) -> Option<ProxySelect> {
        let tokens = tokenize(sql.as_bytes());
        recognise(sql, &tokens)
    }

    #[test]
    fn recognises_the_calls_and_their_arguments() {
        use CallArg::*;
        let c = call("SELECT pgtenant.next_id()").unwrap();
        assert_eq!(c, ProxySelect { call: ProxyCall::NextId { shard: None }, column: "next_id".into() });
        assert_eq!(
            call("select PGTENANT.NEXT_ID(7)").unwrap().call,
            ProxyCall::NextId { shard: Some(Literal(7)) }
        );
        assert_eq!(
            call("select pgtenant.next_id($1::int)").unwrap().call,
            ProxyCall::NextId { shard: Some(Param { index: 0, type_oid: 23 }) }
        );
        assert_eq!(
            call("SELECT * FROM pgtenant.next_ids(1000)").unwrap().call,
            ProxyCall::NextIds { count: Literal(1000) }
        );
        assert_eq!(
            call("SELECT pgtenant.next_ids(-3)").unwrap().call,
            ProxyCall::NextIds { count: Literal(-3) }
        );
        assert_eq!(
            call("SELECT * FROM pgtenant.decode_id($2)").unwrap().call,
            ProxyCall::DecodeId { id: Param { index: 1, type_oid: 20 } }
        );
        assert_eq!(call("SELECT pgtenant.next_id() AS id").unwrap().column, "id");
        assert_eq!(call("SELECT pgtenant.next_id() \"Id\"").unwrap().column, "Id");
        assert_eq!(call("SELECT * FROM pgtenant.next_ids(2) AS ids").unwrap().column, "ids");
    }

    #[test]
    fn recognises_the_backend_calls_of_the_clients_own_pid() {
        use CallArg::*;
        let c = call("SELECT pg_backend_pid()").unwrap();
        assert_eq!(c, ProxySelect { call: ProxyCall::BackendPid, column: "pg_backend_pid".into() });
        assert_eq!(call("select pg_catalog.PG_BACKEND_PID() AS me").unwrap().column, "me");
        let own = call("SELECT pg_terminate_backend(pg_backend_pid())").unwrap();
        assert_eq!(
            own.call,
            ProxyCall::Signal { signal: Signal::Terminate, pid: PidArg::Own, timeout: None }
        );
        assert_eq!(own.column, "pg_terminate_backend");
        assert_eq!(
            call("select pg_cancel_backend($1)").unwrap().call,
            ProxyCall::Signal {
                signal: Signal::Cancel,
                pid: PidArg::Given(Param { index: 0, type_oid: INT4_OID }),
                timeout: None
            }
        );
        let with_timeout = call("SELECT pg_catalog.pg_terminate_backend(12345, $2)").unwrap();
        assert_eq!(
            with_timeout.call,
            ProxyCall::Signal {
                signal: Signal::Terminate,
                pid: PidArg::Given(Literal(12345)),
                timeout: Some(Param { index: 1, type_oid: INT8_OID })
            }
        );
        assert_eq!(with_timeout.params().collect::<Vec<_>>(), [(1, INT8_OID)]);
    }

    #[test]
    fn leaves_everything_else_to_the_server() {
        for sql in [
            "SELECT pgtenant.next_id(), 1",
            "SELECT pgtenant.next_id() FROM t",
            "SELECT pgtenant.next_ids()",
            "SELECT pgtenant.decode_id(5)",
            "SELECT pgtenant.next_id(1.5)",
            "SELECT pgtenant.next_id('5')",
            "SELECT pgtenant.next_id(a)",
            "SELECT pgtenant.next_id($0)",
            "SELECT pgtenant.next_id($65536)",
            "SELECT pgtenant.next_id($4000000000)",
            "SELECT pgtenant.next_id(5::text)",
            "SELECT other.next_id()",
            "SELECT pgtenant.current_tenant()",
            "SELECT * FROM pgtenant.next_ids(3) WHERE true",
            "SELECT pg_backend_pid(), 1",
            "SELECT pg_backend_pid() FROM t",
            "SELECT public.pg_backend_pid()",
            "SELECT pg_cancel_backend(1, 2)",
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity",
            "SELECT pg_terminate_backend(1,)",
            "SELECT pg_cancel_backend(pg_backend_pid() + 1)",
            "SELECT count(pg_cancel_backend(1))",
        ] {
            assert_eq!(call(sql), None, "{sql}");
        }
    }
}
