//! Statement texts that differ from an analyzed one only in the values of their
//! literals (`... WHERE aid = 17` after `... WHERE aid = 4711`): the simple protocol's
//! common case, where pgbench, psql scripts and many drivers inline values. Such a
//! text shares the other's analysis and sqlparser facts; only its literal ranges are
//! its own, found by walking both texts side by side instead of lexing and hashing.
//!
//! Only analyses of plain DML take part (`Analysis::plain`): nothing in them depends
//! on a literal's value, where a SET, a snowflake call or a `set_config` does.

use std::ops::Range;
use std::sync::OnceLock;

use super::Analysis;
use super::analyze::Literals;

/// The literal ranges of `sql` when it is `template`'s text with other literal values:
/// numbers of digits and dots, and quoted strings without quotes or backslashes inside.
///
/// `sql` is then valid UTF-8 as a whole: the bytes between its literals are the
/// template's, cut where the template has an ASCII digit or quote, and a quoted literal
/// is checked here.
pub fn literal_change(template: &Analysis, sql: &[u8]) -> Option<Literals> {
    let mut literals = Literals::new();
    walk_literals(template, sql, |range| literals.push(range))?;
    Some(literals)
}

/// Whether `sql` is `template`'s text with other literal values (`literal_change`
/// without collecting the ranges: a template that reads no value needs none).
pub fn is_literal_change(template: &Analysis, sql: &[u8]) -> bool {
    walk_literals(template, sql, |_| ()).is_some()
}

/// Walks `template`'s text and `sql` side by side, handing `each` the range of every
/// literal of `sql`, in order; `None` as soon as they differ outside a literal value.
fn walk_literals(template: &Analysis, sql: &[u8], mut each: impl FnMut(Range<usize>)) -> Option<()> {
    let old = template.sql.as_bytes();
    // Once the template's literals are known, walking them rejects another text at its
    // first differing byte as cheaply as the first test would (a session's scripts
    // are tried against each of its recent texts); that test spares the lexer pass
    // that finds them the first time.
    if !template.plain || (template.literals.get().is_none() && !looks_like_a_literal_change(old, sql)) {
        return None;
    }
    let literals = template.literals();
    let (mut old_at, mut new_at, mut next) = (0, 0, 0);
    loop {
        // The texts agree from here up to `agree_to` (in the template's bytes): compared
        // eight bytes at a time rather than literal by literal, for most values of a
        // script's statement are the same each time (pgbench's INSERT changes one of
        // four). A literal that ends inside that stretch, with the byte after it, is the
        // same token in both.
        let agree_to = old_at + common_prefix(&old[old_at..], &sql[new_at..]);
        let to_new = |at: usize| new_at + (at - old_at);
        while let Some(same) = literals.get(next).filter(|literal| literal.end < agree_to) {
            each(to_new(same.start)..to_new(same.end));
            next += 1;
        }
        let Some(literal) = literals.get(next) else {
            // No literal left: the rest must be the same text.
            return (agree_to == old.len() && to_new(agree_to) == sql.len()).then_some(());
        };
        if literal.start > agree_to {
            return None;
        }
        new_at = to_new(literal.start);
        let len = literal_len(old[literal.start], &sql[new_at..])?;
        each(new_at..new_at + len);
        new_at += len;
        old_at = literal.end;
        next += 1;
    }
}

/// The analysis of `sql`, a literal change of `template`'s text with these `literals`
/// (see `literal_change`): all of the template's but its own text and literal ranges.
pub fn rebased(template: &Analysis, sql: &[u8], literals: Literals) -> Option<Analysis> {
    let text = std::str::from_utf8(sql).ok()?;
    Some(Analysis {
        sql: text.into(),
        literals: OnceLock::from(literals),
        facts: match template.facts.get() {
            Some(facts) if !facts.per_text => OnceLock::from(facts.clone()),
            _ => OnceLock::new(),
        },
        // Both read words only, and literals are no words.
        mentions_column: template.mentions_column.clone(),
        effects: template.effects.clone(),
        ..Analysis::plain_dml_of_shape(Box::default(), template.shape.clone())
    })
}

/// `literal_change`, then `rebased`.
#[cfg(test)]
pub fn rebase(template: &Analysis, sql: &[u8]) -> Option<Analysis> {
    rebased(template, sql, literal_change(template, sql)?)
}

/// A cheap first test before the template's literals are looked for (a lexer pass the
/// first time): the texts first differ at a digit, or just after one (a number at the
/// end of one text that goes on in the other), or inside a quoted string.
fn looks_like_a_literal_change(old: &[u8], new: &[u8]) -> bool {
    let at = common_prefix(old, new);
    let digit_at = |i: usize| old.get(i).is_some_and(u8::is_ascii_digit);
    let inside_quotes = || memchr::memchr_iter(b'\'', &old[..at]).count() % 2 == 1;
    digit_at(at) || (at > 0 && digit_at(at - 1)) || inside_quotes()
}

/// The length of the literal at the start of `rest`, of the kind that starts with `first`
/// (the template's literal's first byte), when the lexer would read it as one token.
fn literal_len(first: u8, rest: &[u8]) -> Option<usize> {
    match first {
        b'0'..=b'9' => {
            let len = rest.iter().position(|b| !(b.is_ascii_digit() || *b == b'.')).unwrap_or(rest.len());
            // A letter right after would continue the token (`1e5`, `0x1F`): not this template.
            let ends_here = !rest.get(len).is_some_and(u8::is_ascii_alphanumeric);
            (rest.first().is_some_and(u8::is_ascii_digit) && ends_here).then_some(len)
        }
        b'\'' if rest.first() == Some(&b'\'') => {
            let close = 1 + memchr::memchr(b'\'', &rest[1..])?;
            let plain = rest.get(close + 1) != Some(&b'\'')
                && !rest[..close].contains(&b'\\')
                && std::str::from_utf8(&rest[1..close]).is_ok();
            plain.then_some(close + 1)
        }
        _ => None,
    }
}

/// How many leading bytes `a` and `b` share, compared eight at a time.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        let x = u64::from_le_bytes(a[i..i + 8].try_into().unwrap_or_default());
        let y = u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
        if x != y {
            return i + ((x ^ y).trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    i + a[i..n].iter().zip(&b[i..n]).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::router::analyze_for_tests as analyze;
    use crate::router::facts::SqlFacts;

    fn ranges(a: &Analysis) -> Vec<std::ops::Range<usize>> {
        a.literals().to_vec()
    }

    fn rebased(template: &str, sql: &str) -> Option<Analysis> {
        rebase(&analyze(template.as_bytes()), sql.as_bytes())
    }

    #[test]
    fn a_text_with_other_numbers_and_strings_shares_the_analysis() {
        let sql = "SELECT * FROM t WHERE tenant_id = 17 AND name = 'bob' AND x > 2.5";
        let a = rebased("SELECT * FROM t WHERE tenant_id = 4711 AND name = 'alice' AND x > 10", sql).unwrap();
        assert_eq!(&*a.sql, sql);
        let texts: Vec<&str> = ranges(&a).into_iter().map(|r| &sql[r]).collect();
        assert_eq!(texts, ["17", "'bob'", "2.5"]);
        assert!(a.plain && a.effects().single_dml);
        // The ranges are those the lexer finds.
        assert_eq!(ranges(&a), analyze(sql.as_bytes()).literals());
        assert!(rebased("select 1", "select 2").is_some());
        // A number at the very end, longer or shorter than the template's.
        assert!(rebased("select * from t where id = 5", "select * from t where id = 57").is_some());
        assert!(rebased("select * from t where id = 57", "select * from t where id = 5").is_some());
        assert!(rebased("select 5", "select 5 union select 6").is_none());
    }

    #[test]
    fn the_ranges_are_the_lexers_wherever_the_values_differ() {
        let template = "SELECT 1, 'é', x FROM t WHERE a = 10 AND b = 'zz' AND c IN (3, 4) LIMIT 5";
        for sql in [
            "SELECT 1, 'é', x FROM t WHERE a = 10 AND b = 'zz' AND c IN (3, 4) LIMIT 5",
            "SELECT 2, 'é', x FROM t WHERE a = 10 AND b = 'zz' AND c IN (3, 4) LIMIT 5",
            "SELECT 1, 'è', x FROM t WHERE a = 10 AND b = 'zz' AND c IN (3, 4) LIMIT 5",
            "SELECT 1, 'é', x FROM t WHERE a = 1 AND b = 'zz' AND c IN (3, 4) LIMIT 50",
            "SELECT 1, 'é', x FROM t WHERE a = 100 AND b = '' AND c IN (3, 44) LIMIT 5",
            "SELECT 17, 'éé', x FROM t WHERE a = 10 AND b = 'zz' AND c IN (3.5, 4) LIMIT 6",
        ] {
            let a = rebased(template, sql).unwrap_or_else(|| panic!("{sql}"));
            assert_eq!(ranges(&a), analyze(sql.as_bytes()).literals(), "{sql}");
        }
        for sql in [
            "SELECT 1, 'é', y FROM t WHERE a = 10 AND b = 'zz' AND c IN (3, 4) LIMIT 5",
            "SELECT 1, 'é', x FROM t WHERE a = 10 AND b = 'zz' AND c IN (3, 4) LIMIT 5 ",
            "SELECT 1, 'é', x FROM t WHERE a = 10 AND b = 'zz' AND c IN (3, -4) LIMIT 5",
            "SELECT 1, 'é', x FROM t WHERE a = 10 AND b = 'zz' AND c IN (3, 4) LIMIT",
            "SELECT 1, 'é', x FROM t1 WHERE a = 10 AND b = 'zz' AND c IN (3, 4) LIMIT 5",
        ] {
            assert!(rebased(template, sql).is_none(), "{sql}");
        }
    }

    #[test]
    fn anything_but_literal_values_differing_is_no_match() {
        let t = "SELECT * FROM t WHERE id = 5 AND name = 'x'";
        for sql in [
            "SELECT * FROM u WHERE id = 5 AND name = 'x'",
            "SELECT * FROM t WHERE id = 5 AND name = 'x' ",
            "SELECT * FROM t WHERE id = 5e3 AND name = 'x'",
            "SELECT * FROM t WHERE id = 5x AND name = 'x'",
            "SELECT * FROM t WHERE id = 6 AND name = 'x''y'",
            "SELECT * FROM t WHERE id = 6 AND name = 'x\\'",
            "SELECT * FROM t WHERE id = 6 AND name = 'x' ; DROP TABLE t",
            "SELECT * FROM t WHERE id = $1 AND name = 'x'",
            "SELECT * FROM t WHERE id = 6 AND name = 'x",
            "SELECT * FROM t WHERE id = 6",
        ] {
            assert!(rebased(t, sql).is_none(), "{sql}");
            // The same once the template's literals are known (no first test then).
            let template = analyze(t.as_bytes());
            assert_eq!(template.literals().len(), 2);
            assert!(rebase(&template, sql.as_bytes()).is_none(), "{sql}");
        }
        assert!(rebase(&analyze(t.as_bytes()), b"SELECT * FROM t WHERE id = 5 AND name = '\xff'").is_none());
        // Not plain DML: the value of a literal may matter.
        assert!(rebased("SET pgtenant.tenant_id = 5", "SET pgtenant.tenant_id = 6").is_none());
        assert!(
            rebased("SELECT set_config('a', 'b', false)", "SELECT set_config('c', 'b', false)").is_none()
        );
        assert!(rebased("SELECT pgtenant.next_id(1)", "SELECT pgtenant.next_id(2)").is_none());
    }

    #[test]
    fn the_walk_that_skips_equal_values_finds_the_lexers_ranges() {
        // Values equal to the template's are skipped in stretches of agreeing bytes,
        // together with the byte after them: where that byte differs, the value is
        // read as the lexer would.
        let template = "INSERT INTO h (a, b, c, d) VALUES (1, 1, 4711, 'x') RETURNING c";
        for (sql, same) in [
            ("INSERT INTO h (a, b, c, d) VALUES (1, 1, 4711, 'x') RETURNING c", true),
            ("INSERT INTO h (a, b, c, d) VALUES (1, 1, 17, 'x') RETURNING c", true),
            ("INSERT INTO h (a, b, c, d) VALUES (1, 12, 4711, 'x') RETURNING c", true),
            ("INSERT INTO h (a, b, c, d) VALUES (1, 1, 4711, 'xy') RETURNING c", true),
            ("INSERT INTO h (a, b, c, d) VALUES (1, 1, 4711, '') RETURNING c", true),
            ("INSERT INTO h (a, b, c, d) VALUES (1, 1, 47110, 'x') RETURNING c", true),
            ("INSERT INTO h (a, b, c, d) VALUES (1, 1, 4711, 'x''') RETURNING c", false),
            ("INSERT INTO h (a, b, c, d) VALUES (1, 1e3, 4711, 'x') RETURNING c", false),
            ("INSERT INTO h (a, b, c, d) VALUES (1, 1, 4711, 'x') RETURNING d", false),
            ("INSERT INTO h (a, b, c, d) VALUES (1, 1, 4711, 'x') RETURNING c, d", false),
            ("INSERT INTO h (a, b, c, d) VALUES (1, 1, 4711, 'x')", false),
        ] {
            // Its literals known, as a kept template's are after its first match.
            let template = analyze(template.as_bytes());
            assert_eq!(template.literals().len(), 4);
            let found = rebase(&template, sql.as_bytes());
            assert_eq!(found.is_some(), same, "{sql}");
            assert_eq!(is_literal_change(&template, sql.as_bytes()), same, "{sql}");
            if let Some(a) = found {
                assert_eq!(ranges(&a), analyze(sql.as_bytes()).literals(), "{sql}");
            }
        }
    }

    #[test]
    fn facts_that_hold_a_texts_own_values_are_not_shared() {
        let template = analyze(b"select * from t where tenant_id = 5");
        let facts = SqlFacts { per_text: true, ..SqlFacts::default() };
        template.facts.set(Arc::new(facts)).unwrap();
        let a = rebase(&template, b"select * from t where tenant_id = 6").unwrap();
        assert!(a.facts.get().is_none(), "parsed again for its own values");
        let template = analyze(b"select * from t where tenant_id = 5");
        template.facts.set(Arc::new(SqlFacts::default())).unwrap();
        let a = rebase(&template, b"select * from t where tenant_id = 6").unwrap();
        assert!(Arc::ptr_eq(a.facts.get().unwrap(), template.facts.get().unwrap()));
    }

    #[test]
    fn common_prefix_counts_bytes_across_words() {
        assert_eq!(common_prefix(b"abcdefghijklmnop", b"abcdefghijkXmnop"), 11);
        assert_eq!(common_prefix(b"abc", b"abcdef"), 3);
        assert_eq!(common_prefix(b"", b"x"), 0);
        assert_eq!(common_prefix(b"abcdefgh", b"abcdefgh"), 8);
    }
}
