//! The fast path of statement analysis: one DML statement with nothing in it that
//! could pin a connection, touch the tenant GUC or name a built-in pgtenant answers or
//! refuses, recognised in one pass over its bytes without tokenizing.

use super::verbs::Verb;

/// One DML statement with no comment, no second statement and nothing that could
/// pin a connection: the common case, recognised without tokenizing.
pub(super) fn is_plain_dml(sql: &[u8]) -> bool {
    let start = sql.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(sql.len());
    let rest = &sql[start..];
    // The first word as PostgreSQL's lexer reads it: `select1` or `select` followed by a
    // byte above 0x7f is one identifier, not the keyword.
    let word_len = rest
        .iter()
        .position(|&b| !(b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80))
        .unwrap_or(rest.len());
    if !Verb::of_word(&rest[..word_len]).is_dml() {
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
