//! `pg_prepared_statements` as the client should see it. On a pooled server
//! connection the view lists what pgtenant prepared there: other clients' statements
//! (other tenants' texts among them) under pgtenant's names (`__pgtenant_<id>`), pgtenant's
//! own, and statements a client let go that the server keeps for others. A statement
//! that reads the view reads a subquery in its place: the rows of the client's own
//! statements, under the client's names, and those it prepared with SQL `PREPARE`
//! (which pin the connection to it, so they are its own).

use std::ops::Range;

use super::lexer::{Token, TokenKind};
use super::words::follows_table_unaliased;

/// Where a statement names the view: the bytes to replace (`pg_catalog.` included),
/// and whether an alias follows (else the subquery takes the view's name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewRef {
    pub range: Range<usize>,
    pub aliased: bool,
}

const VIEW: &str = "pg_prepared_statements";

/// The places `tokens` (comments left out) name the view.
pub(super) fn references(sql: &str, tokens: &[Token]) -> Vec<ViewRef> {
    let text = |i: usize| tokens.get(i).map_or("", |t| &sql[t.start..t.end]);
    let names_view = |i: usize| match tokens.get(i).map(|t| t.kind) {
        Some(TokenKind::Word) => text(i).eq_ignore_ascii_case(VIEW),
        Some(TokenKind::QuotedIdent) => text(i) == "\"pg_prepared_statements\"",
        _ => false,
    };
    let mut refs = Vec::new();
    for i in (0..tokens.len()).filter(|&i| names_view(i)) {
        let qualified = i >= 2 && text(i - 1) == "." && {
            let schema = text(i - 2);
            schema.eq_ignore_ascii_case("pg_catalog") || schema == "\"pg_catalog\""
        };
        let start = if qualified { tokens[i - 2].start } else { tokens[i].start };
        let aliased = match tokens.get(i + 1) {
            Some(t) if t.kind == TokenKind::QuotedIdent => true,
            Some(t) if t.kind == TokenKind::Word => !follows_table_unaliased(text(i + 1)),
            _ => false,
        };
        refs.push(ViewRef { range: start..tokens[i].end, aliased });
    }
    refs
}

/// `sql` with every reference in `refs` replaced by the client's view: `own` pairs
/// each of the client's statement names with the name it has on the server.
pub fn rewrite(sql: &str, refs: &[ViewRef], own: &[(String, String)]) -> String {
    let list = |pick: fn(&(String, String)) -> &String| {
        let items: Vec<String> = own.iter().map(|pair| quote(pick(pair))).collect();
        format!("ARRAY[{}]::text[]", items.join(", "))
    };
    // Every column of the server's view, whatever its version, with the name replaced.
    let subquery = format!(
        "(SELECT (pg_catalog.jsonb_populate_record(NULL::pg_catalog.pg_prepared_statements, \
         pg_catalog.to_jsonb(p) || pg_catalog.jsonb_build_object('name', m.client))).* \
         FROM pg_catalog.pg_prepared_statements p \
         JOIN ROWS FROM (pg_catalog.unnest({}), pg_catalog.unnest({})) AS m(server, client) \
         ON p.name = m.server \
         UNION ALL SELECT * FROM pg_catalog.pg_prepared_statements WHERE from_sql)",
        list(|(server, _)| server),
        list(|(_, client)| client),
    );
    let mut out = String::with_capacity(sql.len() + subquery.len() * refs.len());
    let mut at = 0;
    for r in refs {
        out.push_str(&sql[at..r.range.start]);
        out.push_str(&subquery);
        if !r.aliased {
            out.push_str(" AS pg_prepared_statements");
        }
        at = r.range.end;
    }
    out.push_str(&sql[at..]);
    out
}

/// A SQL string literal of `text`.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::lexer::code_tokens;

    fn refs(sql: &str) -> Vec<ViewRef> {
        references(sql, &code_tokens(sql))
    }

    #[test]
    fn finds_the_view_and_whether_it_is_aliased() {
        let sql = "SELECT name FROM pg_catalog.pg_prepared_statements p WHERE NOT from_sql";
        assert_eq!(refs(sql), [ViewRef { range: 17..50, aliased: true }]);
        assert!(!refs("select * from PG_PREPARED_STATEMENTS order by 1")[0].aliased);
        assert!(!refs("select count(*) from \"pg_prepared_statements\"")[0].aliased);
        assert!(refs("select * from pg_prepared_statements as s")[0].aliased);
        assert!(refs("select 'pg_prepared_statements', pg_prepared_statement_x from t").is_empty());
    }

    #[test]
    fn the_view_is_replaced_by_the_clients_own_statements() {
        let sql = "SELECT name FROM pg_prepared_statements ORDER BY name";
        let own = [("pgt_7".to_string(), "s1".to_string()), ("pgt_9".to_string(), "it's".to_string())];
        let out = rewrite(sql, &refs(sql), &own);
        assert!(out.starts_with("SELECT name FROM (SELECT "), "{out}");
        let pairs = "ROWS FROM (pg_catalog.unnest(ARRAY['pgt_7', 'pgt_9']::text[]), \
                     pg_catalog.unnest(ARRAY['s1', 'it''s']::text[]))";
        assert!(out.contains(pairs), "{out}");
        assert!(out.ends_with(") AS pg_prepared_statements ORDER BY name"), "{out}");
        let none = rewrite(sql, &refs(sql), &[]);
        assert!(none.contains("unnest(ARRAY[]::text[]), pg_catalog.unnest(ARRAY[]::text[])"), "{none}");
    }
}
