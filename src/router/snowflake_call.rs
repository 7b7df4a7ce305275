//! Recognises the snowflake calls pgtenant answers itself:
//!
//! - `SELECT pgtenant.next_id()` / `SELECT pgtenant.next_id(<shard>)`
//! - `SELECT pgtenant.next_ids(<n>)` / `SELECT * FROM pgtenant.next_ids(<n>)`
//! - `SELECT * FROM pgtenant.decode_id(<id>)`
//!
//! An argument is an integer literal or a `$n` parameter, optionally cast to an
//! integer type; a result column may be renamed with `AS`. Anything else (other
//! arguments, more clauses, a second statement) is left to the server, where
//! `sql/snowflake.sql` may answer it.

use super::lexer::{Token, TokenKind};
use crate::protocol::{INT2_OID, INT4_OID, INT8_OID};

/// What a recognised call does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnowflakeCall {
    /// One ID, for the shard given or else the tenant's.
    NextId { shard: Option<CallArg> },
    /// `count` IDs of the tenant's shard, one row each.
    NextIds { count: CallArg },
    /// The parts of an ID, as one row.
    DecodeId { id: CallArg },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallArg {
    Literal(i64),
    /// `$n` (`index` zero-based) and the type it was cast to (int8 when not cast), as
    /// a Describe reports it.
    Param {
        index: usize,
        type_oid: i32,
    },
}

/// A recognised call with the name of its result column (for `next_id`, `next_ids`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnowflakeSelect {
    pub call: SnowflakeCall,
    pub column: String,
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
}

/// `tokens`: one statement without comments or semicolons.
pub fn recognise(sql: &str, tokens: &[Token]) -> Option<SnowflakeSelect> {
    let mut c = Cursor { sql, tokens, at: 0 };
    if !c.eat_word("select") {
        return None;
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
        let arg = argument(&mut c)?;
        if !c.eat_punct(")") {
            return None;
        }
        Some(arg)
    };
    let call = match (function.as_str(), arg) {
        ("next_id", shard) => SnowflakeCall::NextId { shard },
        ("next_ids", Some(count)) => SnowflakeCall::NextIds { count },
        ("decode_id", Some(id)) if from_form => SnowflakeCall::DecodeId { id },
        _ => return None,
    };
    let mut column = function;
    let bare_alias =
        matches!(c.kind(), Some(TokenKind::Word | TokenKind::QuotedIdent)) && c.at + 1 == tokens.len();
    if c.eat_word("as") || bare_alias {
        column = match c.kind() {
            Some(TokenKind::Word) => c.text().to_ascii_lowercase(),
            Some(TokenKind::QuotedIdent) => c.text().trim_matches('"').replace("\"\"", "\""),
            _ => return None,
        };
        c.at += 1;
        if matches!(call, SnowflakeCall::DecodeId { .. }) {
            // A table alias: the columns keep their names.
            column = "decode_id".into();
        }
    }
    c.done().then_some(SnowflakeSelect { call, column })
}

/// An integer literal (with a sign) or `$n`, with an optional integer cast.
fn argument(c: &mut Cursor) -> Option<CallArg> {
    let negative = c.eat_punct("-");
    let mut arg = match c.kind()? {
        TokenKind::Number => {
            let v: i64 = c.text().parse().ok()?;
            CallArg::Literal(if negative { -v } else { v })
        }
        TokenKind::Punct if !negative && c.text().len() > 1 && c.text().starts_with('$') => {
            let n: u16 = c.text()[1..].parse().ok()?;
            // $1..$65535, as PostgreSQL allows: a Describe lists that many types.
            CallArg::Param { index: usize::from(n).checked_sub(1)?, type_oid: INT8_OID }
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

    fn call(sql: &str) -> Option<SnowflakeSelect> {
        let tokens = tokenize(sql.as_bytes());
        recognise(sql, &tokens)
    }

    #[test]
    fn recognises_the_calls_and_their_arguments() {
        use CallArg::*;
        let c = call("SELECT pgtenant.next_id()").unwrap();
        assert_eq!(
            c,
            SnowflakeSelect { call: SnowflakeCall::NextId { shard: None }, column: "next_id".into() }
        );
        assert_eq!(
            call("select PGTENANT.NEXT_ID(7)").unwrap().call,
            SnowflakeCall::NextId { shard: Some(Literal(7)) }
        );
        assert_eq!(
            call("select pgtenant.next_id($1::int)").unwrap().call,
            SnowflakeCall::NextId { shard: Some(Param { index: 0, type_oid: 23 }) }
        );
        assert_eq!(
            call("SELECT * FROM pgtenant.next_ids(1000)").unwrap().call,
            SnowflakeCall::NextIds { count: Literal(1000) }
        );
        assert_eq!(
            call("SELECT pgtenant.next_ids(-3)").unwrap().call,
            SnowflakeCall::NextIds { count: Literal(-3) }
        );
        assert_eq!(
            call("SELECT * FROM pgtenant.decode_id($2)").unwrap().call,
            SnowflakeCall::DecodeId { id: Param { index: 1, type_oid: 20 } }
        );
        assert_eq!(call("SELECT pgtenant.next_id() AS id").unwrap().column, "id");
        assert_eq!(call("SELECT pgtenant.next_id() \"Id\"").unwrap().column, "Id");
        assert_eq!(call("SELECT * FROM pgtenant.next_ids(2) AS ids").unwrap().column, "ids");
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
        ] {
            assert_eq!(call(sql), None, "{sql}");
        }
    }
}
