//! A statement's code tokens read as words: the tests every classifier of `router`
//! shares (a keyword at a place, a word anywhere, the text from a token on), and the
//! names a setting may have.

use super::lexer::{Token, TokenKind};

/// Words that end a FROM list (a JOIN's ON and USING do not).
pub(super) const FROM_LIST_ENDS: [&str; 12] = [
    "where",
    "group",
    "having",
    "window",
    "order",
    "limit",
    "offset",
    "fetch",
    "for",
    "union",
    "except",
    "intersect",
];

/// Whether `word` may follow a table in FROM without being its alias: an end of the
/// list, a join, or a clause of the table's own.
pub(super) fn follows_table_unaliased(word: &str) -> bool {
    const JOINS_AND_TABLE_CLAUSES: [&str; 12] = [
        "join",
        "left",
        "right",
        "full",
        "inner",
        "cross",
        "natural",
        "on",
        "using",
        "returning",
        "tablesample",
        "into",
    ];
    FROM_LIST_ENDS.iter().chain(&JOINS_AND_TABLE_CLAUSES).any(|k| word.eq_ignore_ascii_case(k))
}

pub(super) struct Words<'a> {
    pub(super) sql: &'a str,
    pub(super) tokens: &'a [Token],
}

impl Words<'_> {
    pub(super) fn text(&self, i: usize) -> &str {
        self.tokens.get(i).map(|t| &self.sql[t.start..t.end]).unwrap_or("")
    }
    /// Whether token `i` is a bare word (a keyword or an unquoted name).
    pub(super) fn is_word(&self, i: usize) -> bool {
        self.tokens.get(i).is_some_and(|t| t.kind == TokenKind::Word)
    }
    pub(super) fn is(&self, i: usize, word: &str) -> bool {
        self.tokens.get(i).is_some_and(|t| t.kind == TokenKind::Word)
            && self.text(i).eq_ignore_ascii_case(word)
    }
    pub(super) fn rest_from(&self, i: usize) -> &str {
        match (self.tokens.get(i), self.tokens.last()) {
            (Some(a), Some(b)) => self.sql[a.start..b.end].trim(),
            _ => "",
        }
    }
    pub(super) fn contains_word(&self, word: &str) -> bool {
        (0..self.tokens.len()).any(|i| self.is(i, word))
    }
}

/// Whether `needle` (non-empty) occurs in `hay`, ASCII case ignored.
pub(super) fn contains_ignore_case(hay: &[u8], needle: &[u8]) -> bool {
    // Run on every statement text a session sends: jump between the places where the
    // first byte occurs (either case) instead of comparing at every position.
    let Some((&first, rest)) = needle.split_first() else { return false };
    let Some(last_start) = hay.len().checked_sub(needle.len()) else { return false };
    memchr::memchr2_iter(first.to_ascii_lowercase(), first.to_ascii_uppercase(), &hay[..=last_start])
        .any(|i| hay[i + 1..i + needle.len()].eq_ignore_ascii_case(rest))
}

/// Whether `name` can be a setting's name as pgtenant follows them (letters, digits,
/// `_` and `.`).
pub fn is_plain_setting(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
}
