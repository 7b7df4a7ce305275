//! The parse cache: statement text -> whether sqlparser found tables outside the
//! system catalogs. Parsing costs 5-20 µs; the answer depends only on the text, so a
//! hot statement is parsed once. Bounded by entry count. The cheap lexical analysis
//! is not cached: with unique texts (literals inlined) a cache would only churn.

use std::sync::LazyLock;

use moka::sync::Cache;

static TOUCHES_TABLES: LazyLock<Cache<Box<str>, bool>> = LazyLock::new(|| Cache::new(10_000));

/// Whether `sql` reads or writes tables outside the system catalogs, cached by text.
pub fn touches_tables(sql: &str, parse: impl FnOnce(&str) -> bool) -> bool {
    if let Some(hit) = TOUCHES_TABLES.get(sql) {
        return hit;
    }
    let answer = parse(sql);
    TOUCHES_TABLES.insert(sql.into(), answer);
    answer
}
