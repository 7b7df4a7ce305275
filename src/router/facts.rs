//! What sqlparser tells about a statement: whether it touches tables outside the
//! system catalogs, and where it names tenants (comparisons with the tenant column in
//! any WHERE, JOIN or subquery, INSERT values, UPDATE assignments).
//!
//! Parsing costs 5-20 µs, so facts are cached by the statement's *shape*: its text
//! with every literal replaced by a numbered placeholder. `WHERE tenant_id = 7` and
//! `WHERE tenant_id = 8` share one entry, whose facts say "the tenant is literal 0";
//! the value is read from each text's own literals. A shape sqlparser cannot parse
//! (a typed literal such as `DATE '...'`) falls back to the text itself.
//!
//! Facts never go stale (they depend on the text alone), so the cache is a plain map
//! behind a read lock rather than moka: a hit costs a hash and a lookup, which matters
//! in the simple protocol, where every statement text is new. A map that reaches its
//! capacity starts over.

use std::ops::{ControlFlow, Range};
use std::sync::{Arc, RwLock};

use sqlparser::ast::{
    AssignmentTarget, BinaryOperator, Expr, ObjectName, SetExpr, Statement, UnaryOperator, Value,
    visit_expressions, visit_relations, visit_statements,
};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use super::lexer::{TokenKind, Tokens};

/// Placeholders standing for literals are numbered from here, above any real `$n`.
const LITERAL_BASE: u32 = 100_000;
const SYSTEM_SCHEMAS: [&str; 2] = ["pg_catalog", "information_schema"];

/// Where a statement takes a tenant value from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TenantSource {
    /// The statement's literal number `n` (0-based, in text order), with its sign.
    Literal { index: usize, negative: bool },
    /// Bind parameter `$n` (1-based).
    Param(u16),
    /// A value written in a text that was parsed as is (see `FactsCache::facts`).
    Constant(Box<str>),
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct SqlFacts {
    /// sqlparser understood the text.
    pub parsed: bool,
    /// It reads or writes tables outside the system catalogs (true when not parsed).
    pub touches_tables: bool,
    /// Every place a tenant value comes from, each once.
    pub tenant_sources: Vec<TenantSource>,
    /// Parsed from the text itself rather than its shape: the sources may hold that
    /// text's values (`TenantSource::Constant`), so no other text may share them.
    pub per_text: bool,
}

pub struct FactsCache {
    shapes: RwLock<foldhash::HashMap<Box<str>, Arc<SqlFacts>>>,
    capacity: usize,
    tenant_column: String,
}

impl FactsCache {
    pub fn new(capacity: u64, tenant_column: &str) -> Self {
        Self {
            shapes: RwLock::new(foldhash::HashMap::default()),
            capacity: usize::try_from(capacity).unwrap_or(usize::MAX).max(1),
            tenant_column: tenant_column.to_ascii_lowercase(),
        }
    }

    pub fn tenant_column(&self) -> &str {
        &self.tenant_column
    }

    /// The facts of `sql`, from the cache when its shape was seen before, and the
    /// byte ranges of its literals (what `TenantSource::Literal` indexes).
    pub fn facts(&self, sql: &str) -> (Arc<SqlFacts>, Vec<Range<usize>>) {
        let (shape, literals) = shape_of(sql);
        if let Some(facts) = self.shapes.read().unwrap_or_else(|e| e.into_inner()).get(shape.as_str()) {
            return (facts.clone(), literals);
        }
        let facts = match Parser::parse_sql(&PostgreSqlDialect {}, &shape) {
            Ok(statements) => Arc::new(facts_of(&statements, &self.tenant_column)),
            Err(_) => {
                // The shape may not parse where the text does (typed literals): parse the
                // text, whose facts then only name parameters and cannot be shared.
                let facts = match Parser::parse_sql(&PostgreSqlDialect {}, sql) {
                    Ok(statements) => facts_of(&statements, &self.tenant_column),
                    Err(_) => SqlFacts { touches_tables: true, ..SqlFacts::default() },
                };
                return (Arc::new(SqlFacts { per_text: true, ..facts }), literals);
            }
        };
        let mut shapes = self.shapes.write().unwrap_or_else(|e| e.into_inner());
        if shapes.len() >= self.capacity {
            shapes.clear();
        }
        shapes.insert(shape.into(), facts.clone());
        (facts, literals)
    }
}

/// The byte ranges of the literals of `sql` that its shape replaces, in text order.
pub fn literal_ranges(sql: &str) -> impl Iterator<Item = Range<usize>> + '_ {
    Tokens::new(sql.as_bytes())
        .filter(|token| match token.kind {
            TokenKind::Number => true,
            // Quoted strings only: dollar-quoted ones are function bodies more often than values.
            TokenKind::String => !sql[token.start..].starts_with('$'),
            _ => false,
        })
        .map(|token| token.start..token.end)
}

/// The text with literals replaced by `$100000`, `$100001`, ... and their ranges.
fn shape_of(sql: &str) -> (String, Vec<Range<usize>>) {
    let mut shape = String::with_capacity(sql.len() + 16);
    let mut literals = Vec::new();
    let mut copied = 0;
    for literal in literal_ranges(sql) {
        shape.push_str(&sql[copied..literal.start]);
        // itoa, not fmt: this runs for every literal of every text.
        shape.push('$');
        shape.push_str(itoa::Buffer::new().format(LITERAL_BASE as usize + literals.len()));
        copied = literal.end;
        literals.push(literal);
    }
    shape.push_str(&sql[copied..]);
    (shape, literals)
}

fn facts_of(statements: &[Statement], column: &str) -> SqlFacts {
    let mut sources = Vec::new();
    let mut add = |source: Option<TenantSource>| {
        if let Some(s) = source
            && !sources.contains(&s)
        {
            sources.push(s);
        }
    };
    for statement in statements {
        let _ = visit_expressions(statement, |expr| {
            match expr {
                Expr::BinaryOp { left, op: BinaryOperator::Eq, right } => {
                    if is_tenant_column(left, column) {
                        add(value_source(right));
                    } else if is_tenant_column(right, column) {
                        add(value_source(left));
                    }
                }
                Expr::InList { expr, list, negated: false } if is_tenant_column(expr, column) => {
                    list.iter().for_each(|v| add(value_source(v)));
                }
                _ => {}
            }
            ControlFlow::<()>::Continue(())
        });
    }
    for statement in statements {
        let _ = visit_statements(statement, |statement| {
            match statement {
                Statement::Insert(insert) => {
                    let position = insert.columns.iter().position(|c| names_column(c, column));
                    if let (Some(i), Some(source)) = (position, &insert.source)
                        && let SetExpr::Values(values) = source.body.as_ref()
                    {
                        values.rows.iter().filter_map(|row| row.get(i)).for_each(|v| add(value_source(v)));
                    }
                }
                Statement::Update(update) => {
                    for assignment in &update.assignments {
                        if let AssignmentTarget::ColumnName(name) = &assignment.target
                            && names_column(name, column)
                        {
                            add(value_source(&assignment.value));
                        }
                    }
                }
                _ => {}
            }
            ControlFlow::<()>::Continue(())
        });
    }
    SqlFacts {
        parsed: true,
        touches_tables: touches_tables(statements),
        tenant_sources: sources,
        per_text: false,
    }
}

fn is_tenant_column(expr: &Expr, column: &str) -> bool {
    match expr {
        Expr::Identifier(ident) => ident.value.eq_ignore_ascii_case(column),
        Expr::CompoundIdentifier(parts) => parts.last().is_some_and(|p| p.value.eq_ignore_ascii_case(column)),
        Expr::Nested(inner) => is_tenant_column(inner, column),
        _ => false,
    }
}

fn names_column(name: &ObjectName, column: &str) -> bool {
    name.0.last().is_some_and(|p| p.to_string().trim_matches('"').eq_ignore_ascii_case(column))
}

/// The literal or parameter an expression stands for, through casts and parentheses.
fn value_source(expr: &Expr) -> Option<TenantSource> {
    match expr {
        Expr::Value(v) => placeholder_source(&v.value, false),
        Expr::UnaryOp { op: UnaryOperator::Minus, expr } => match expr.as_ref() {
            Expr::Value(v) => placeholder_source(&v.value, true),
            _ => None,
        },
        Expr::Cast { expr, .. } | Expr::Nested(expr) => value_source(expr),
        _ => None,
    }
}

fn placeholder_source(value: &Value, negative: bool) -> Option<TenantSource> {
    let sign = if negative { "-" } else { "" };
    let p = match value {
        Value::Placeholder(p) => p,
        Value::Number(n, _) => return Some(TenantSource::Constant(format!("{sign}{n}").into())),
        Value::SingleQuotedString(s) if !negative => return Some(TenantSource::Constant(s.as_str().into())),
        _ => return None,
    };
    let n: u32 = p.strip_prefix('$')?.parse().ok()?;
    if n >= LITERAL_BASE {
        Some(TenantSource::Literal { index: (n - LITERAL_BASE) as usize, negative })
    } else {
        u16::try_from(n).ok().filter(|&n| n > 0 && !negative).map(TenantSource::Param)
    }
}

fn touches_tables(statements: &[Statement]) -> bool {
    let mut touches = false;
    for statement in statements {
        let _ = visit_relations(statement, |name| {
            let parts: Vec<String> =
                name.0.iter().map(|p| p.to_string().trim_matches('"').to_ascii_lowercase()).collect();
            let system = match parts.as_slice() {
                [schema, _] | [_, schema, _] => SYSTEM_SCHEMAS.contains(&schema.as_str()),
                [table] => table.starts_with("pg_"),
                _ => false,
            };
            touches |= !system;
            ControlFlow::<()>::Continue(())
        });
    }
    touches
}

#[cfg(test)]
mod tests {
    use super::*;
    use TenantSource::*;

    fn sources(sql: &str) -> Vec<TenantSource> {
        FactsCache::new(100, "tenant_id").facts(sql).0.tenant_sources.clone()
    }

    fn lit(index: usize) -> TenantSource {
        Literal { index, negative: false }
    }

    #[test]
    fn finds_tenants_in_where_join_subquery_insert_and_update() {
        assert_eq!(sources("select * from accounts where tenant_id = 42"), vec![lit(0)]);
        assert_eq!(sources("select * from a where name = 'x' and a.tenant_id = $1"), vec![Param(1)]);
        assert_eq!(sources("select * from a where 7 = tenant_id"), vec![lit(0)]);
        assert_eq!(sources("select * from a where tenant_id in ($2)"), vec![Param(2)]);
        assert_eq!(sources("select * from a where tenant_id = '42'::bigint"), vec![lit(0)]);
        assert_eq!(
            sources("select * from a where tenant_id = -5"),
            vec![Literal { index: 0, negative: true }]
        );
        assert_eq!(
            sources("select * from a join b on b.tenant_id = a.tenant_id and b.tenant_id = 3 where a.x = 1"),
            vec![lit(0)]
        );
        assert_eq!(
            sources("select * from a where id in (select id from b where tenant_id = $1) limit 10"),
            vec![Param(1)]
        );
        assert_eq!(
            sources("insert into a (name, tenant_id) values ('x', 5), ('y', $1)"),
            vec![lit(1), Param(1)]
        );
        assert_eq!(sources("update a set tenant_id = 9 where tenant_id = 8"), vec![lit(1), lit(0)]);
        assert_eq!(sources("delete from a where tenant_id = 1 or tenant_id = 2"), vec![lit(0), lit(1)]);
        assert_eq!(sources("select * from a where tenant_id > 5"), vec![]);
        assert_eq!(sources("select * from a where tenant_id not in (5)"), vec![]);
    }

    #[test]
    fn shapes_share_one_parse_and_read_their_own_literals() {
        let cache = FactsCache::new(100, "tenant_id");
        let a = cache.facts("select * from a where tenant_id = 7 and name = 'it''s'");
        let b = cache.facts("select * from a where tenant_id = 1234 and name = 'other'");
        assert!(Arc::ptr_eq(&a.0, &b.0));
        assert_eq!(b.1.len(), 2);
        assert_eq!(&"select * from a where tenant_id = 1234 and name = 'other'"[b.1[0].clone()], "1234");
        assert!(a.0.touches_tables && a.0.parsed);
    }

    #[test]
    fn typed_literals_keep_their_place_and_garbage_is_unparsed() {
        let cache = FactsCache::new(100, "tenant_id");
        let f = cache.facts("select * from a where d > date '2024-01-01' and tenant_id = $1");
        assert!(f.0.parsed);
        assert_eq!(f.0.tenant_sources, vec![Param(1)]);
        let f = cache.facts("select * from a where d > date '2024-01-01' and tenant_id = 12");
        assert_eq!(f.0.tenant_sources, vec![lit(1)]);
        // Texts parsed as they are (when their shape does not parse) carry values.
        assert_eq!(
            placeholder_source(&Value::Number("12".into(), false), true),
            Some(Constant("-12".into()))
        );
        assert_eq!(
            placeholder_source(&Value::SingleQuotedString("acme".into()), false),
            Some(Constant("acme".into()))
        );
        let f = cache.facts("select * from a where tenant_id = 3 for no key update of a nowait skip");
        assert!(!f.0.parsed || f.0.tenant_sources == vec![lit(0)]);
        let f = cache.facts("this is not sql");
        assert!(!f.0.parsed && f.0.touches_tables);
    }

    #[test]
    fn catalog_queries_touch_no_tables() {
        let cache = FactsCache::new(100, "tenant_id");
        assert!(!cache.facts("select oid from pg_catalog.pg_type where typname = 'x'").0.touches_tables);
        assert!(!cache.facts("select 1").0.touches_tables);
        assert!(cache.facts("select * from accounts").0.touches_tables);
    }
}
