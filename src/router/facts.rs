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
    AssignmentTarget, BinaryOperator, Expr, ObjectName, Query, SetExpr, Statement, UnaryOperator, Value,
    Visit, Visitor, visit_expressions, visit_relations, visit_statements,
};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use super::lexer::{Token, TokenKind, Tokens, code_tokens};
use super::words::FROM_LIST_ENDS;

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
    /// The tables and views it names outside the system catalogs, lowercased as
    /// written (`accounts`, `public.accounts`); empty when not parsed.
    pub relations: Vec<Box<str>>,
    /// Where the tenant values come from that confine it as a whole: the tenant column
    /// compared by `=` in a top-level AND of the WHERE of a one-table SELECT, UPDATE or
    /// DELETE, or every row of an INSERT ... VALUES. With one relation, rows outside
    /// those tenants are out of its reach (strict isolation's proof).
    pub confining: Vec<TenantSource>,
}

/// The parse results of statement shapes, bounded by entries and by the bytes of the
/// shapes' texts (`parse_cache_size`, `parse_cache_bytes`): full, it starts over.
pub struct FactsCache {
    shapes: RwLock<Shapes>,
    capacity: usize,
    byte_budget: usize,
    /// Longer shapes are read by the lexer alone (`unparsed_facts`), as a statement
    /// sqlparser cannot parse is: parsing costs about a microsecond per byte.
    parse_limit: usize,
    tenant_column: String,
    /// Shapes found in the cache, and looked for in vain (then parsed).
    hits: std::sync::atomic::AtomicU64,
    misses: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct Shapes {
    facts: foldhash::HashMap<Box<str>, Arc<SqlFacts>>,
    /// The bytes of the keys of `facts`.
    bytes: usize,
}

/// A shape longer than this share of the byte budget is parsed every time, not kept:
/// a few huge statements must not push out every common one.
const LARGEST_SHARE: usize = 64;

impl FactsCache {
    /// A cache bounded by entries only.
    #[cfg(test)]
    pub fn new(capacity: u64, tenant_column: &str) -> Self {
        Self::with_budget(capacity, usize::MAX, tenant_column)
    }

    /// A cache of at most `capacity` shapes and `byte_budget` bytes of their texts.
    pub fn with_budget(capacity: u64, byte_budget: usize, tenant_column: &str) -> Self {
        Self {
            shapes: RwLock::new(Shapes::default()),
            capacity: usize::try_from(capacity).unwrap_or(usize::MAX).max(1),
            byte_budget: byte_budget.max(1),
            parse_limit: usize::MAX,
            tenant_column: tenant_column.to_ascii_lowercase(),
            hits: Default::default(),
            misses: Default::default(),
        }
    }

    /// Shapes longer than `parse_limit` bytes are not given to sqlparser.
    pub fn with_parse_limit(mut self, parse_limit: usize) -> Self {
        self.parse_limit = parse_limit;
        self
    }

    /// The bytes of shape text the cache holds.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.shapes.read().unwrap_or_else(|e| e.into_inner()).bytes
    }

    /// Shapes found in the cache and not, so far.
    pub fn hits_and_misses(&self) -> (u64, u64) {
        let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        (get(&self.hits), get(&self.misses))
    }

    pub fn tenant_column(&self) -> &str {
        &self.tenant_column
    }

    /// The facts of `sql`, from the cache when its shape was seen before, and the
    /// byte ranges of its literals (what `TenantSource::Literal` indexes).
    pub fn facts(&self, sql: &str) -> (Arc<SqlFacts>, Vec<Range<usize>>) {
        let (shape, literals) = shape_of(sql);
        if let Some(facts) = self.shapes.read().unwrap_or_else(|e| e.into_inner()).facts.get(shape.as_str()) {
            self.hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return (facts.clone(), literals);
        }
        self.misses.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if shape.len() > self.parse_limit {
            let facts = unparsed_facts(sql, &self.tenant_column);
            return (Arc::new(SqlFacts { per_text: true, ..facts }), literals);
        }
        let facts = match Parser::parse_sql(&PostgreSqlDialect {}, &shape) {
            Ok(statements) => Arc::new(facts_of(&statements, &self.tenant_column)),
            Err(_) => {
                // The shape may not parse where the text does (typed literals): parse the
                // text, whose facts then only name parameters and cannot be shared.
                let facts = match Parser::parse_sql(&PostgreSqlDialect {}, sql) {
                    Ok(statements) => facts_of(&statements, &self.tenant_column),
                    Err(_) => unparsed_facts(sql, &self.tenant_column),
                };
                return (Arc::new(SqlFacts { per_text: true, ..facts }), literals);
            }
        };
        if shape.len() > self.byte_budget / LARGEST_SHARE {
            return (facts, literals);
        }
        let mut shapes = self.shapes.write().unwrap_or_else(|e| e.into_inner());
        if shapes.facts.len() >= self.capacity || shapes.bytes + shape.len() > self.byte_budget {
            *shapes = Shapes::default();
        }
        // Another thread may have parsed the same shape meanwhile: counted once.
        if !shapes.facts.contains_key(shape.as_str()) {
            shapes.bytes += shape.len();
            shapes.facts.insert(shape.into(), facts.clone());
        }
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

/// What the lexer tells of a text sqlparser cannot parse (valid PostgreSQL it does not
/// know: `FOR NO KEY UPDATE`, record operators, `pg_catalog.session_user()`): the tenant
/// column compared by `=` with a literal or `$n`, or listed `IN (...)` (never skipped:
/// a statement pgtenant cannot parse is checked all the same), and whether it may touch
/// tables at all.
fn unparsed_facts(sql: &str, column: &str) -> SqlFacts {
    let tokens = code_tokens(sql);
    let text = |i: usize| tokens.get(i).map_or("", |t| &sql[t.start..t.end]);
    let is_word = |i: usize, word: &str| {
        tokens.get(i).is_some_and(|t| t.kind == TokenKind::Word) && text(i).eq_ignore_ascii_case(word)
    };
    // Each token's number among the literals, in text order as `literal_ranges` counts
    // them: worked out in one pass, so a long text costs no more than its length.
    let mut literal_numbers = Vec::with_capacity(tokens.len());
    let mut literals_seen = 0;
    for t in &tokens {
        let is_literal = match t.kind {
            TokenKind::Number => true,
            TokenKind::String => !sql[t.start..].starts_with('$'),
            _ => false,
        };
        literal_numbers.push(is_literal.then_some(literals_seen));
        literals_seen += usize::from(is_literal);
    }
    let literal_index = |i: usize| literal_numbers.get(i).copied().flatten();
    // The value at token `i`: a literal (after a minus sign), or `$n`.
    let value_at = |i: usize| -> Option<TenantSource> {
        let negative = text(i) == "-";
        let at = if negative { i + 1 } else { i };
        if tokens.get(at)?.kind == TokenKind::Punct {
            let n: u16 = text(at).strip_prefix('$')?.parse().ok()?;
            return (!negative).then_some(TenantSource::Param(n));
        }
        Some(TenantSource::Literal { index: literal_index(at)?, negative })
    };
    let mut sources = Vec::new();
    for i in (0..tokens.len()).filter(|&i| is_word(i, column)) {
        let mut found = Vec::new();
        // Where the column's name starts: `a.tenant_id` at `a`.
        let start = if i >= 2 && text(i - 1) == "." { i - 2 } else { i };
        if text(i + 1) == "=" {
            found.extend(value_at(i + 2));
        } else if start >= 2 && text(start - 1) == "=" {
            let v = start - 2;
            found.extend(if v >= 1 && text(v - 1) == "-" { value_at(v - 1) } else { value_at(v) });
        } else if is_word(i + 1, "in") && text(i + 2) == "(" {
            let mut k = i + 3;
            while let Some(v) = value_at(k) {
                found.push(v);
                k += if text(k) == "-" { 2 } else { 1 };
                if text(k) != "," {
                    break;
                }
                k += 1;
            }
        }
        for source in found {
            if !sources.contains(&source) {
                sources.push(source);
            }
        }
    }
    let touches_tables = !reads_only_system_relations(sql, &tokens);
    SqlFacts {
        parsed: false,
        touches_tables,
        tenant_sources: sources,
        per_text: true,
        relations: Vec::new(),
        confining: Vec::new(),
    }
}

/// Whether a text sqlparser cannot parse is a read whose every relation is a system
/// catalog's (`pg_catalog.x`, `information_schema.x`, a bare `pg_x`), as psql's `\d`
/// queries are: it needs no tenant. Anything the lexer cannot read so (a write, a
/// relation of the user's, a FROM item it does not know) counts as touching tables.
fn reads_only_system_relations(sql: &str, tokens: &[Token]) -> bool {
    const READS: [&str; 3] = ["select", "values", "show"];
    const WRITES: [&str; 6] = ["update", "delete", "insert", "merge", "copy", "lock"];
    const RELATION_WORDS: [&str; 4] = ["from", "join", "into", "table"];
    let text = |i: usize| tokens.get(i).map_or("", |t| &sql[t.start..t.end]);
    let kind = |i: usize| tokens.get(i).map(|t| t.kind);
    let is_word =
        |i: usize, word: &str| kind(i) == Some(TokenKind::Word) && text(i).eq_ignore_ascii_case(word);
    let is_any = |i: usize, words: &[&str]| words.iter().any(|w| is_word(i, w));
    // Every statement of the text a read, and no write anywhere (a CTE's); the UPDATE
    // of a locking clause (FOR [NO KEY] UPDATE) locks rows of the FROM items read below.
    let reads = |i: usize| i >= tokens.len() || is_any(i, &READS);
    let locks = |i: usize| i > 0 && is_word(i, "update") && (is_word(i - 1, "for") || is_word(i - 1, "key"));
    let writes = |i: usize| is_any(i, &WRITES) && !locks(i);
    if !reads(0) || (0..tokens.len()).any(|i| writes(i) || (text(i) == ";" && !reads(i + 1))) {
        return false;
    }
    let ident = |i: usize| match kind(i) {
        Some(TokenKind::Word) => Some(text(i).to_ascii_lowercase()),
        Some(TokenKind::QuotedIdent) => Some(text(i).trim_matches('"').to_string()),
        _ => None,
    };
    // The FROM item at token `i` is fine when it is a system relation, a subquery (its
    // own FROM is read in turn) or a function call (as a parsed statement's are).
    let fine_item = |mut i: usize| {
        if is_word(i, "only") || is_word(i, "lateral") {
            i += 1;
        }
        if text(i) == "(" || text(i + 1) == "(" {
            return true;
        }
        let Some(first) = ident(i) else { return false };
        match text(i + 1) == "." {
            true => SYSTEM_SCHEMAS.contains(&first.as_str()) && ident(i + 2).is_some() && text(i + 3) != ".",
            false => first.starts_with("pg_"),
        }
    };
    // One pass, so that a text of many FROMs costs no more than its length: per
    // parenthesis depth, whether a FROM list is open there (every item after a comma at
    // that depth is read; a subquery's own FROM opens a list at its depth).
    let mut from_open = vec![false];
    for i in 0..tokens.len() {
        match text(i) {
            "(" => {
                from_open.push(false);
                continue;
            }
            ")" => {
                if from_open.len() > 1 {
                    from_open.pop();
                }
                continue;
            }
            _ => {}
        }
        let open = from_open.last_mut().expect("depth 0 stays");
        if is_any(i, &RELATION_WORDS) {
            // `INTO` a table of one's own, or `TABLE t`, as any FROM item.
            if !fine_item(i + 1) {
                return false;
            }
            *open |= is_word(i, "from");
        } else if is_any(i, &FROM_LIST_ENDS) {
            *open = false;
        } else if *open && text(i) == "," && !fine_item(i + 1) {
            return false;
        }
    }
    true
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
        let _ = statement.visit(&mut Predicates { column, add: &mut add });
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
    let relations = relations_of(statements);
    SqlFacts {
        parsed: true,
        touches_tables: !relations.is_empty(),
        tenant_sources: sources,
        per_text: false,
        relations,
        confining: confining_sources(statements, column),
    }
}

/// See `SqlFacts::confining`.
fn confining_sources(statements: &[Statement], column: &str) -> Vec<TenantSource> {
    let [statement] = statements else { return Vec::new() };
    let mut sources = Vec::new();
    match statement {
        Statement::Query(query) => {
            if let SetExpr::Select(select) = query.body.as_ref()
                && let [from] = select.from.as_slice()
                && from.joins.is_empty()
                && let Some(selection) = &select.selection
            {
                conjunct_sources(selection, column, &mut sources);
            }
        }
        Statement::Update(update) if update.table.joins.is_empty() && update.from.is_none() => {
            if let Some(selection) = &update.selection {
                conjunct_sources(selection, column, &mut sources);
            }
        }
        Statement::Delete(delete) if delete.using.is_none() => {
            if let Some(selection) = &delete.selection {
                conjunct_sources(selection, column, &mut sources);
            }
        }
        Statement::Insert(insert) => {
            let position = insert.columns.iter().position(|c| names_column(c, column));
            if let (Some(i), Some(source)) = (position, &insert.source)
                && let SetExpr::Values(values) = source.body.as_ref()
            {
                for row in &values.rows {
                    // A row without a readable tenant confines nothing.
                    match row.get(i).and_then(value_source) {
                        Some(s) => sources.push(s),
                        None => return Vec::new(),
                    }
                }
            }
        }
        _ => {}
    }
    sources
}

/// The tenant values `tenant column = value` conjuncts of `expr` (through AND and
/// parentheses only) compare with.
fn conjunct_sources(expr: &Expr, column: &str, sources: &mut Vec<TenantSource>) {
    match expr {
        Expr::BinaryOp { left, op: BinaryOperator::And, right } => {
            conjunct_sources(left, column, sources);
            conjunct_sources(right, column, sources);
        }
        Expr::Nested(inner) => conjunct_sources(inner, column, sources),
        Expr::BinaryOp { left, op: BinaryOperator::Eq, right } => {
            let value = if is_tenant_column(left, column) {
                value_source(right)
            } else if is_tenant_column(right, column) {
                value_source(left)
            } else {
                None
            };
            sources.extend(value);
        }
        _ => {}
    }
}

/// Finds the tenant values a statement's predicates compare the tenant column with:
/// WHERE, HAVING and JOIN ... ON of every query in it (subqueries included), WHERE,
/// FROM and USING of UPDATE and DELETE, and MERGE's ON. A comparison elsewhere (a CASE in the select list, say)
/// filters no rows and names no tenant: PostgreSQL runs such a statement for anyone.
struct Predicates<'a, F: FnMut(Option<TenantSource>)> {
    column: &'a str,
    add: &'a mut F,
}

impl<F: FnMut(Option<TenantSource>)> Predicates<'_, F> {
    /// Every tenant comparison inside `root`.
    fn collect(&mut self, root: &impl Visit) {
        let column = self.column;
        let add = &mut *self.add;
        let _ = visit_expressions(root, |expr| {
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

    fn set_expr(&mut self, body: &SetExpr) {
        match body {
            SetExpr::Select(select) => {
                if let Some(selection) = &select.selection {
                    self.collect(selection);
                }
                if let Some(having) = &select.having {
                    self.collect(having);
                }
                // The joins' ON conditions (and whatever else FROM holds).
                for from in &select.from {
                    self.collect(from);
                }
            }
            SetExpr::SetOperation { left, right, .. } => {
                self.set_expr(left);
                self.set_expr(right);
            }
            // Nested queries come to `pre_visit_query` themselves.
            _ => {}
        }
    }
}

impl<F: FnMut(Option<TenantSource>)> Visitor for Predicates<'_, F> {
    type Break = ();

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
        self.set_expr(&query.body);
        ControlFlow::Continue(())
    }

    fn pre_visit_statement(&mut self, statement: &Statement) -> ControlFlow<()> {
        match statement {
            Statement::Update(update) => {
                self.collect(&update.table);
                self.collect(&update.from);
                self.collect(&update.selection);
            }
            Statement::Delete(delete) => {
                self.collect(&delete.using);
                self.collect(&delete.selection);
            }
            Statement::Merge(merge) => self.collect(&merge.on),
            _ => {}
        }
        ControlFlow::Continue(())
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

/// The relations `statements` name outside the system catalogs (`SqlFacts::relations`).
fn relations_of(statements: &[Statement]) -> Vec<Box<str>> {
    let mut relations: Vec<Box<str>> = Vec::new();
    for statement in statements {
        let _ = visit_relations(statement, |name| {
            let parts: Vec<String> =
                name.0.iter().map(|p| p.to_string().trim_matches('"').to_ascii_lowercase()).collect();
            let system = match parts.as_slice() {
                [schema, _] | [_, schema, _] => SYSTEM_SCHEMAS.contains(&schema.as_str()),
                [table] => table.starts_with("pg_"),
                _ => false,
            };
            let joined: Box<str> = parts.join(".").into();
            if !system && !relations.contains(&joined) {
                relations.push(joined);
            }
            ControlFlow::<()>::Continue(())
        });
    }
    relations
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
    fn a_comparison_outside_the_predicates_names_no_tenant() {
        // A CASE in the select list filters nothing: PostgreSQL runs it for anyone.
        assert_eq!(
            sources("select case when tenant_id = 8 then 'x' end from a where tenant_id = 7"),
            vec![lit(2)]
        );
        assert_eq!(sources("select tenant_id = 8 as is_eight from a"), vec![]);
        // Inside a predicate, in any form, it does.
        assert_eq!(sources("select * from a where x = 1 or tenant_id = 8"), vec![lit(1)]);
        assert_eq!(sources("select * from a where case when tenant_id = 8 then true end"), vec![lit(0)]);
        assert_eq!(sources("select count(*) from a group by b having tenant_id = $1"), vec![Param(1)]);
        assert_eq!(sources("select (select s from b where tenant_id = 8) from a"), vec![lit(0)]);
        assert_eq!(sources("select 1 union select 2 from a where tenant_id = 9"), vec![lit(2)]);
        assert_eq!(sources("update a set x = 1 from b where b.tenant_id = 8"), vec![lit(1)]);
        assert_eq!(sources("delete from a using b where b.tenant_id = 3"), vec![lit(0)]);
    }

    #[test]
    fn a_text_sqlparser_cannot_parse_is_read_by_the_lexer() {
        let facts = |sql: &str| FactsCache::new(100, "tenant_id").facts(sql).0;
        let f = facts("select * from iso where tenant_id = 500 for no key update");
        assert!(!f.parsed && f.touches_tables);
        assert_eq!(f.tenant_sources, vec![lit(0)]);
        let f = facts("select * from iso where 8 = iso.tenant_id and a *<> b for key share");
        assert_eq!(f.tenant_sources, vec![lit(0)]);
        let f = facts("select * from iso where tenant_id in (7, -8, $2) for no key update");
        assert_eq!(f.tenant_sources, vec![lit(0), Literal { index: 1, negative: true }, Param(2)]);
        // Naming no relation, it needs no tenant.
        let f = facts("select pg_catalog.session_user()");
        assert!(!f.parsed && !f.touches_tables, "{f:?}");
        // Reading only system catalogs, neither (FOR NO KEY UPDATE: sqlparser fails).
        let catalog_only = [
            "SELECT c.oid, n.nspname, c.relname FROM pg_catalog.pg_class c \
             LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relname OPERATOR(pg_catalog.~) '^(t)$' COLLATE pg_catalog.default \
             AND pg_catalog.pg_table_is_visible(c.oid) ORDER BY 2, 3",
            "select relname from pg_class, pg_namespace n",
            "select x from pg_class c, lateral (select 1 from information_schema.tables) t",
        ];
        for sql in catalog_only {
            let f = facts(&format!("{sql} for no key update"));
            assert!(!f.parsed && !f.touches_tables, "{sql}: {f:?}");
        }
        // Read in one pass: a text of many FROM lists costs its length, not its square.
        let many =
            format!("select 1 from {} for no key update", "pg_class from ".repeat(20_000) + "pg_class");
        assert!(!facts(&many).touches_tables);
        for sql in [
            "select * from pg_class, accounts",
            "select * from pg_class c join accounts a on true",
            "select * into mine from pg_class",
            "select * from public.pg_class",
            "select * from pg_catalog.pg_class, (select 1) s, t",
            "select * from pg_class c join pg_namespace n on true, t",
            "select 1; create table t ()",
            "with w as (delete from t returning 1) select * from pg_class",
            "select * from \"PG_CLASS\"",
        ] {
            let f = facts(&format!("{sql} for no key update"));
            assert!(!f.parsed && f.touches_tables, "{sql}: {f:?}");
        }
    }

    #[test]
    fn the_cache_holds_at_most_its_byte_budget_and_no_huge_shape() {
        let cache = FactsCache::with_budget(1_000_000, 64 * 200, "tenant_id");
        // Longer than a 64th of the budget: analysed all the same, not kept.
        // (Literals do not count: the shape holds placeholders for them.)
        let columns: Vec<String> = (0..60).map(|i| format!("c{i}")).collect();
        let huge = format!("select {} from a where tenant_id = 7", columns.join(", "));
        let (facts, _) = cache.facts(&huge);
        assert_eq!(facts.tenant_sources, vec![lit(0)]);
        assert_eq!(cache.bytes(), 0);
        for n in 0..2000 {
            let sql = format!("select * from t{n} where tenant_id = $1 and c{n} = 1");
            assert_eq!(cache.facts(&sql).0.tenant_sources, vec![Param(1)]);
            assert!(cache.bytes() <= 64 * 200, "{} bytes after {n} shapes", cache.bytes());
        }
        assert!(cache.bytes() > 0);
    }

    #[test]
    fn shapes_past_the_parse_limit_are_read_by_the_lexer() {
        let cache = FactsCache::new(100, "tenant_id").with_parse_limit(200);
        let ids: Vec<String> = (0..100).map(|i| i.to_string()).collect();
        let long = format!("select * from a where tenant_id = 8 and id in ({})", ids.join(", "));
        let (facts, literals) = cache.facts(&long);
        assert!(!facts.parsed && facts.per_text && facts.touches_tables);
        assert_eq!(&long[literals[0].clone()], "8");
        assert_eq!(facts.tenant_sources.len(), 1, "the tenant comparison is still seen");
        assert_eq!(cache.bytes(), 0);
        let (short, _) = cache.facts("select * from a where tenant_id = 8");
        assert!(short.parsed);
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
