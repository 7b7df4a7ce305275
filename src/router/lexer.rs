//! A minimal PostgreSQL lexer: enough to find the words, punctuation and comments
//! of a statement with their byte offsets, respecting quotes, dollar quoting and
//! nested block comments. It never fails; unterminated constructs run to the end.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKind {
    /// Unquoted identifier or keyword.
    Word,
    /// `"quoted identifier"`.
    QuotedIdent,
    /// `'string'`, `E'string'` or `$tag$string$tag$`.
    String,
    Number,
    /// `/* ... */`; the token spans the delimiters.
    BlockComment,
    Semicolon,
    /// Any other punctuation or operator character.
    Punct,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Token {
    pub kind: TokenKind,
    pub start: usize,
    pub end: usize,
}

/// Tokenizes `sql`. Line comments are dropped; block comments are kept (they carry hints).
pub fn tokenize(sql: &[u8]) -> Vec<Token> {
    Tokens::new(sql).collect()
}

/// The tokens of `sql` that carry meaning: all but comments.
pub fn code_tokens(sql: &str) -> Vec<Token> {
    Tokens::new(sql.as_bytes()).filter(|t| t.kind != TokenKind::BlockComment).collect()
}

/// The tokens of a text one at a time, for callers that need no list of them.
pub struct Tokens<'a> {
    sql: &'a [u8],
    i: usize,
}

impl<'a> Tokens<'a> {
    pub fn new(sql: &'a [u8]) -> Self {
        Self { sql, i: 0 }
    }
}

impl Iterator for Tokens<'_> {
    type Item = Token;

    fn next(&mut self) -> Option<Token> {
        let sql = self.sql;
        let n = sql.len();
        let mut i = self.i;
        let token = loop {
            if i >= n {
                break None;
            }
            let c = sql[i];
            let start = i;
            let kind = match c {
                b' ' | b'\t' | b'\n' | b'\r' | b'\x0c' => {
                    i += 1;
                    continue;
                }
                b'-' if sql.get(i + 1) == Some(&b'-') => {
                    while i < n && sql[i] != b'\n' {
                        i += 1;
                    }
                    continue;
                }
                b'/' if sql.get(i + 1) == Some(&b'*') => {
                    i = skip_block_comment(sql, i);
                    TokenKind::BlockComment
                }
                b'\'' => {
                    i = skip_quoted(sql, i + 1, b'\'');
                    TokenKind::String
                }
                b'"' => {
                    i = skip_quoted(sql, i + 1, b'"');
                    TokenKind::QuotedIdent
                }
                b'e' | b'E' if sql.get(i + 1) == Some(&b'\'') => {
                    i = skip_escape_string(sql, i + 2);
                    TokenKind::String
                }
                b'$' => match dollar_tag_end(sql, i) {
                    Some(tag_end) => {
                        let tag = &sql[i..tag_end];
                        i = find(sql, tag_end, tag).map(|p| p + tag.len()).unwrap_or(n);
                        TokenKind::String
                    }
                    None => {
                        i += 1;
                        while i < n && sql[i].is_ascii_digit() {
                            i += 1;
                        }
                        TokenKind::Punct
                    }
                },
                b';' => {
                    i += 1;
                    TokenKind::Semicolon
                }
                c if c.is_ascii_digit() => {
                    while i < n && (sql[i].is_ascii_alphanumeric() || sql[i] == b'.') {
                        i += 1;
                    }
                    TokenKind::Number
                }
                c if is_ident_start(c) => {
                    while i < n && is_ident_char(sql[i]) {
                        i += 1;
                    }
                    TokenKind::Word
                }
                _ => {
                    i += 1;
                    TokenKind::Punct
                }
            };
            break Some(Token { kind, start, end: i });
        };
        self.i = i;
        token
    }
}

fn is_ident_start(c: u8) -> bool {
    CLASS[usize::from(c)] & IDENT_START != 0
}

fn is_ident_char(c: u8) -> bool {
    CLASS[usize::from(c)] & IDENT_CHAR != 0
}

// Byte classes by table: identifiers are most of a statement's bytes.
const IDENT_START: u8 = 1;
const IDENT_CHAR: u8 = 2;
const CLASS: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        if b.is_ascii_alphabetic() || b == b'_' || b >= 0x80 {
            table[c] = IDENT_START | IDENT_CHAR;
        } else if b.is_ascii_digit() || b == b'$' {
            table[c] = IDENT_CHAR;
        }
        c += 1;
    }
    table
};

fn skip_block_comment(sql: &[u8], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < sql.len() {
        if sql[i..].starts_with(b"/*") {
            depth += 1;
            i += 2;
        } else if sql[i..].starts_with(b"*/") {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    sql.len()
}

/// Skips to after the closing `quote`; a doubled quote is an escaped one.
fn skip_quoted(sql: &[u8], mut i: usize, quote: u8) -> usize {
    while i < sql.len() {
        if sql[i] == quote {
            if sql.get(i + 1) == Some(&quote) {
                i += 2;
                continue;
            }
            return i + 1;
        }
        i += 1;
    }
    sql.len()
}

fn skip_escape_string(sql: &[u8], mut i: usize) -> usize {
    while i < sql.len() {
        match sql[i] {
            b'\\' => i += 2,
            b'\'' if sql.get(i + 1) == Some(&b'\'') => i += 2,
            b'\'' => return i + 1,
            _ => i += 1,
        }
    }
    sql.len()
}

/// If a dollar-quote tag (`$$` or `$tag$`) starts at `i`, returns the index after it.
fn dollar_tag_end(sql: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    while j < sql.len() && sql[j] != b'$' {
        if !is_ident_char(sql[j]) || (j == i + 1 && sql[j].is_ascii_digit()) {
            return None;
        }
        j += 1;
    }
    (j < sql.len()).then_some(j + 1)
}

fn find(hay: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    hay.get(from..)?.windows(needle.len()).position(|w| w == needle).map(|p| p + from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(sql: &str) -> Vec<(TokenKind, &str)> {
        tokenize(sql.as_bytes()).into_iter().map(|t| (t.kind, &sql[t.start..t.end])).collect()
    }

    #[test]
    fn splits_words_strings_and_comments() {
        use TokenKind::*;
        assert_eq!(
            kinds("SELECT 'a;''b', $x$ ; $x$ /* c /* d */ */ -- e\n; \"Q\"\"t\""),
            vec![
                (Word, "SELECT"),
                (String, "'a;''b'"),
                (Punct, ","),
                (String, "$x$ ; $x$"),
                (BlockComment, "/* c /* d */ */"),
                (Semicolon, ";"),
                (QuotedIdent, "\"Q\"\"t\""),
            ]
        );
        assert_eq!(
            kinds("select $1, E'\\''"),
            vec![(Word, "select"), (Punct, "$1"), (Punct, ","), (String, "E'\\''")]
        );
        // Unterminated input runs to the end without panicking.
        assert_eq!(kinds("'abc").len(), 1);
        assert_eq!(kinds("/* abc").len(), 1);
    }
}
