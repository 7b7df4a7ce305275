//! `set_config(name, value, is_local)` calls in a statement's text: which setting each
//! changes (a literal pgtenant reads, the one `pg_settings` row a statement reads, or
//! a `$n` parameter read at Bind), whether one may touch the tenant GUC, and the
//! session changes pgtenant follows.

use std::ops::Range;

use super::kinds::{ConfigArg, SessionChange};
use super::lexer::TokenKind;
use super::words::{Words, is_plain_setting};

/// The token indexes of the `set_config` calls of a statement.
pub(super) fn set_config_calls<'a>(w: &'a Words) -> impl Iterator<Item = usize> + 'a {
    (0..w.tokens.len()).filter(|&i| w.is(i, "set_config") && w.text(i + 1) == "(")
}

/// The number `n` of a `$n` token at `i`.
pub(super) fn parameter_at(w: &Words, i: usize) -> Option<u16> {
    let token = w.tokens.get(i)?;
    let text = w.text(i);
    (token.kind == TokenKind::Punct && text.len() > 1 && text.starts_with('$'))
        .then(|| text[1..].parse().ok())?
}

/// The setting name of the `set_config` call at token `i`, when pgtenant can read it:
/// a plain literal, or the column `name` of the one `pg_settings` row the statement
/// reads (`... FROM pg_settings WHERE name = '<setting>'`, as pg_dump sends).
pub(super) fn set_config_name(w: &Words, i: usize) -> Option<String> {
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
pub(super) fn pg_settings_row(w: &Words) -> Option<String> {
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
pub(super) fn session_config_calls(w: &Words) -> Option<Vec<SessionChange>> {
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
pub(super) fn literal_text(literal: &str) -> String {
    literal.trim_matches('\'').replace("''", "'")
}

/// A string literal token without escapes, as written (quotes included).
pub(super) fn plain_string((kind, text): (TokenKind, &str)) -> Option<&str> {
    (kind == TokenKind::String && text.starts_with('\'') && !text.contains('\\')).then_some(text)
}
