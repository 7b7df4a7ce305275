//! Planning a scatter-gather SELECT (I/O-free): what every shard runs, and how the
//! shards' rows are merged so that the answer is the one PostgreSQL would give from
//! one database holding every shard's rows.
//!
//! Plain rows without ORDER BY, DISTINCT or LIMIT stream straight through. Everything
//! else is merged by PostgreSQL itself: each shard computes a partial result (its own
//! groups and partial aggregates, or its first LIMIT + OFFSET ordered rows), the rows
//! are copied into a temporary table on one shard's primary (the coordinator), and the
//! statement's remaining clauses run there over that table. Comparisons, collations,
//! NaN and NULL ordering, result types, numeric scale and overflow are then
//! PostgreSQL's own, which no merge written here could promise.
//!
//! Planning has three steps: `parse` reads the statement and says what the probe must
//! learn (which other functions are aggregates, which GROUP BY names are input
//! columns); `Scatter::plan` writes the shards' SQL and the final SQL's template; and
//! `Plan::final_sql` fills the template in once the partial columns' types are known.

use std::collections::HashSet;
use std::ops::ControlFlow;

use sqlparser::ast::{
    Distinct, Expr, GroupByExpr, Ident, LimitClause, ObjectName, ObjectNamePart, OrderByKind, Query, Select,
    SelectItem, SetExpr, Statement, TableFactor, Value, ValueWithSpan, Visit, VisitMut, Visitor, VisitorMut,
};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use super::ScatterError;
pub use super::aggregates::FinalAgg;
pub use super::aggregates::column_name;
use super::aggregates::{
    AggCollector, AggKind, contains_aggregate, function_name, leftover_column, normalized, unmergeable,
};
use crate::protocol::RESERVED_PREFIX;

pub use crate::router::{ALL_SHARDS, mentions_all_shards};
/// The virtual column holding the shard a row comes from (`integer`), there only where
/// the table has no column of that name: a table's own `shard_id` wins.
pub const SHARD_COLUMN: &str = "shard_id";
/// The coordinator's table of partial rows (dropped at the end of its transaction).
pub const PARTIAL_TABLE: &str = "__pgtenant_scatter";
/// Names pgtenant writes into the SQL it generates; refused in a client's text.
const SHARD_PLACEHOLDER: &str = "__pgtenant_shard__";

/// A statement that names `all_shards.` tables, read and checked.
#[derive(Debug)]
pub struct Scatter {
    /// The statement as the client wrote it.
    text: String,
    select: Select,
    order_by: Vec<sqlparser::ast::OrderByExpr>,
    limit: Option<LimitClause>,
    fetch: Option<sqlparser::ast::Fetch>,
    /// The table as the shards name it (`all_shards.` taken off).
    table: ObjectName,
    /// The name the statement refers to the table by (its alias, else its last part).
    alias: Ident,
    /// Whether the statement names `shard_id` (the table's own, or the virtual one).
    names_shard_id: bool,
    /// Whether the table has a `shard_id` column of its own (`table_has_shard_column`'s
    /// answer): then no virtual one is added.
    own_shard_column: bool,
    /// What the probe must answer: which of these functions are aggregates or window
    /// functions (only the merged aggregates may be).
    pub other_functions: Vec<String>,
    /// Bare GROUP BY names that are also output aliases: PostgreSQL groups by the input
    /// column of that name when there is one; the probe says which are.
    pub ambiguous_group_names: Vec<String>,
}

/// What the probe learned on a shard.
#[derive(Debug, Default)]
pub struct ProbeFacts {
    /// Output column names of the statement, as PostgreSQL names them.
    pub output_names: Vec<String>,
    /// Of `other_functions`, those that are aggregate or window functions.
    pub aggregates: HashSet<String>,
    /// Of `ambiguous_group_names`, those that are input columns.
    pub input_columns: HashSet<String>,
}

/// How shard rows become the answer.
#[derive(Clone, Debug)]
pub enum Merge {
    /// The shards' rows, as they come.
    Stream,
    /// Through the coordinator's table: `final_template` once filled in.
    Coordinated { final_template: String, aggs: Vec<FinalAgg>, columns: usize },
}

/// What runs where.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The statement each shard runs, split around its shard id.
    shard_parts: Vec<String>,
    pub merge: Merge,
}

impl Plan {
    /// The statement shard `shard` runs.
    pub fn shard_sql(&self, shard: i64) -> String {
        self.shard_parts.join(&shard.to_string())
    }

    /// The final statement over the coordinator's table, given the partial columns'
    /// type OIDs (from a shard's RowDescription). `None` when rows stream.
    pub fn final_sql(&self, partial_types: &[u32]) -> Result<Option<String>, ScatterError> {
        let Merge::Coordinated { final_template, aggs, .. } = &self.merge else { return Ok(None) };
        let mut sql = final_template.clone();
        for (i, agg) in aggs.iter().enumerate().rev() {
            let text = agg.final_text(partial_types)?;
            sql = sql.replace(&format!("{RESERVED_PREFIX}agg_{i}__"), &text);
        }
        Ok(Some(sql))
    }

    /// Partial columns the coordinator's table has (`CREATE TEMP TABLE ... (c0, ...)`).
    pub fn partial_columns(&self) -> Option<usize> {
        match &self.merge {
            Merge::Coordinated { columns, .. } => Some(*columns),
            Merge::Stream => None,
        }
    }
}

/// Reads `sql`: `Ok(None)` when it names no `all_shards.` table after all.
pub fn parse(sql: &str) -> Result<Option<Scatter>, ScatterError> {
    if sql.to_ascii_lowercase().contains(RESERVED_PREFIX) {
        return Err(unmergeable(format!(
            "a statement containing \"{RESERVED_PREFIX}\" (names pgtenant uses)"
        )));
    }
    let mut statements =
        Parser::parse_sql(&PostgreSqlDialect {}, sql).map_err(|e| ScatterError::Unparsed(e.to_string()))?;
    if statements.len() != 1 {
        return Err(unmergeable("several statements in one query string"));
    }
    let mut statement = statements.remove(0);
    if !names_all_shards(&statement) {
        return Ok(None);
    }
    let Statement::Query(query) = &mut statement else {
        return Err(ScatterError::NotReadOnly("only SELECT may name all_shards. tables".into()));
    };
    let Query { with, body, order_by, limit_clause, fetch, locks, for_clause, .. } = &mut **query;
    if with.is_some() {
        return Err(unmergeable("WITH"));
    }
    if !locks.is_empty() {
        return Err(ScatterError::NotReadOnly("a locking clause (FOR UPDATE/SHARE)".into()));
    }
    if for_clause.is_some() {
        return Err(unmergeable("a FOR clause"));
    }
    let select = match &mut **body {
        SetExpr::Select(select) => (**select).clone(),
        SetExpr::SetOperation { op, .. } => return Err(unmergeable(format!("{op}"))),
        _ => return Err(unmergeable("this statement form (only SELECT ... FROM all_shards.t)")),
    };
    let order_by = match order_by.take().map(|o| o.kind) {
        None => Vec::new(),
        Some(OrderByKind::Expressions(list)) => list,
        Some(OrderByKind::All(_)) => return Err(unmergeable("ORDER BY ALL")),
    };
    let mut scatter = Scatter::read(sql, select, order_by, limit_clause.take(), fetch.take())?;
    scatter.find_probe_questions();
    Ok(Some(scatter))
}

fn names_all_shards(statement: &Statement) -> bool {
    struct Find(bool);
    impl Visitor for Find {
        type Break = ();
        fn pre_visit_relation(&mut self, relation: &ObjectName) -> ControlFlow<()> {
            if is_all_shards(relation) {
                self.0 = true;
            }
            ControlFlow::Continue(())
        }
    }
    let mut find = Find(false);
    let _ = statement.visit(&mut find);
    find.0
}

fn is_all_shards(name: &ObjectName) -> bool {
    name.0.len() >= 2
        && matches!(&name.0[0], ObjectNamePart::Identifier(i) if normalized(i).value == ALL_SHARDS)
}

impl Scatter {
    fn read(
        text: &str,
        select: Select,
        order_by: Vec<sqlparser::ast::OrderByExpr>,
        limit: Option<LimitClause>,
        fetch: Option<sqlparser::ast::Fetch>,
    ) -> Result<Self, ScatterError> {
        if select.into.is_some() {
            return Err(ScatterError::NotReadOnly("SELECT INTO".into()));
        }
        if !select.named_window.is_empty() || select.qualify.is_some() {
            return Err(unmergeable("a window"));
        }
        if matches!(select.distinct, Some(Distinct::On(_))) {
            return Err(unmergeable("DISTINCT ON"));
        }
        if select.from.len() != 1 || !select.from[0].joins.is_empty() {
            return Err(unmergeable("a join or a second table (one all_shards. table per statement)"));
        }
        let (table, alias) = match &select.from[0].relation {
            TableFactor::Table { name, alias, args: None, sample: None, with_ordinality: false, .. }
                if is_all_shards(name) =>
            {
                let alias = match alias {
                    Some(a) if a.columns.is_empty() => normalized(&a.name),
                    Some(_) => return Err(unmergeable("a table alias with column names")),
                    None => match name.0.last() {
                        Some(ObjectNamePart::Identifier(i)) => normalized(i),
                        _ => return Err(unmergeable("this table name")),
                    },
                };
                (ObjectName(name.0[1..].to_vec()), alias)
            }
            _ => return Err(unmergeable("a FROM item other than one all_shards. table")),
        };
        let mut scatter = Scatter {
            text: text.to_string(),
            select,
            order_by,
            limit,
            fetch,
            table,
            alias,
            names_shard_id: false,
            own_shard_column: false,
            other_functions: Vec::new(),
            ambiguous_group_names: Vec::new(),
        };
        scatter.normalize()?;
        Ok(scatter)
    }

    /// Folds names, drops the table qualifier from column references (one table), and
    /// refuses subqueries and windows anywhere.
    fn normalize(&mut self) -> Result<(), ScatterError> {
        struct Norm<'a> {
            alias: &'a Ident,
            names_shard_id: bool,
            error: Option<ScatterError>,
        }
        impl VisitorMut for Norm<'_> {
            type Break = ();
            fn pre_visit_query(&mut self, _: &mut Query) -> ControlFlow<()> {
                self.error = Some(unmergeable("a subquery"));
                ControlFlow::Break(())
            }
            fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
                match expr {
                    Expr::Identifier(i) => *i = normalized(i),
                    Expr::CompoundIdentifier(parts) => {
                        let parts_n: Vec<Ident> = parts.iter().map(normalized).collect();
                        if parts_n.len() == 2 && parts_n[0] == *self.alias {
                            *expr = Expr::Identifier(parts_n[1].clone());
                        } else {
                            *parts = parts_n;
                        }
                    }
                    Expr::Function(f) if f.over.is_some() => {
                        self.error = Some(unmergeable(format!("the window function {}", f.name)));
                        return ControlFlow::Break(());
                    }
                    Expr::Subquery(_) | Expr::Exists { .. } | Expr::InSubquery { .. } => {
                        self.error = Some(unmergeable("a subquery"));
                        return ControlFlow::Break(());
                    }
                    _ => {}
                }
                if let Expr::Identifier(i) = expr
                    && i.value == SHARD_COLUMN
                {
                    self.names_shard_id = true;
                }
                ControlFlow::Continue(())
            }
        }
        let mut norm = Norm { alias: &self.alias, names_shard_id: false, error: None };
        let s = &mut self.select;
        let _ = VisitMut::visit(&mut s.projection, &mut norm);
        let _ = VisitMut::visit(&mut s.selection, &mut norm);
        let _ = VisitMut::visit(&mut s.group_by, &mut norm);
        let _ = VisitMut::visit(&mut s.having, &mut norm);
        let _ = VisitMut::visit(&mut self.order_by, &mut norm);
        let _ = VisitMut::visit(&mut self.limit, &mut norm);
        let _ = VisitMut::visit(&mut self.fetch, &mut norm);
        if let Some(e) = norm.error {
            return Err(e);
        }
        self.names_shard_id = norm.names_shard_id;
        Ok(())
    }

    fn find_probe_questions(&mut self) {
        struct Names(Vec<String>);
        impl Visitor for Names {
            type Break = ();
            fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
                if let Expr::Function(f) = expr {
                    let name = function_name(&f.name);
                    if AggKind::of(&name).is_none() && !self.0.contains(&name) {
                        self.0.push(name);
                    }
                }
                ControlFlow::Continue(())
            }
        }
        let mut names = Names(Vec::new());
        let _ = self.select.visit(&mut names);
        let _ = self.order_by.visit(&mut names);
        self.other_functions = names.0;
        if let GroupByExpr::Expressions(keys, _) = &self.select.group_by {
            for key in keys {
                if let Expr::Identifier(i) = key
                    && self.output_alias(&i.value).is_some_and(|e| e != key)
                {
                    self.ambiguous_group_names.push(i.value.clone());
                }
            }
        }
    }

    /// The expression of the select item with output alias `name`.
    fn output_alias(&self, name: &str) -> Option<&Expr> {
        self.select.projection.iter().find_map(|item| match item {
            SelectItem::ExprWithAlias { expr, alias } if normalized(alias).value == name => Some(expr),
            _ => None,
        })
    }

    /// The statement as the client wrote it.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// When the statement names `shard_id`: a statement that succeeds on a shard when
    /// the table has a column of that name itself. Asked before the probe, which needs
    /// the answer (`set_own_shard_column`).
    pub fn shard_column_question(&self) -> Option<String> {
        self.names_shard_id.then(|| format!("SELECT {SHARD_COLUMN} FROM {} LIMIT 0", self.table))
    }

    /// Records `shard_column_question`'s answer.
    pub fn set_own_shard_column(&mut self, own: bool) {
        self.own_shard_column = own;
    }

    /// The FROM item a shard runs, with the virtual `shard_id` column when the statement
    /// names it and the table has none of its own.
    fn shard_from(&self) -> String {
        let alias = &self.alias;
        if self.names_shard_id && !self.own_shard_column {
            format!(
                "(SELECT {RESERVED_PREFIX}t.*, CAST({SHARD_PLACEHOLDER} AS integer) AS {SHARD_COLUMN} \
                 FROM {} AS {RESERVED_PREFIX}t) AS {alias}",
                self.table
            )
        } else {
            format!("{} AS {alias}", self.table)
        }
    }

    fn where_sql(&self) -> String {
        self.select.selection.as_ref().map(|w| format!(" WHERE {w}")).unwrap_or_default()
    }

    fn limit_sql(&self) -> String {
        let mut sql = String::new();
        if let Some(l) = &self.limit {
            sql.push_str(&l.to_string());
        }
        if let Some(f) = &self.fetch {
            sql.push_str(&format!(" {f}"));
        }
        sql
    }

    fn order_sql(order: &[sqlparser::ast::OrderByExpr]) -> String {
        if order.is_empty() {
            return String::new();
        }
        let list: Vec<String> = order.iter().map(ToString::to_string).collect();
        format!(" ORDER BY {}", list.join(", "))
    }

    fn projection_sql(&self) -> String {
        let list: Vec<String> = self.select.projection.iter().map(ToString::to_string).collect();
        list.join(", ")
    }

    /// The statement as one shard (shard 0) would run it alone: what a Describe reports.
    pub fn probe_sql(&self) -> String {
        let distinct =
            if matches!(self.select.distinct, Some(Distinct::Distinct)) { "DISTINCT " } else { "" };
        let group = match &self.select.group_by {
            GroupByExpr::Expressions(keys, _) if !keys.is_empty() => {
                let list: Vec<String> = keys.iter().map(ToString::to_string).collect();
                format!(" GROUP BY {}", list.join(", "))
            }
            _ => String::new(),
        };
        let having = self.select.having.as_ref().map(|h| format!(" HAVING {h}")).unwrap_or_default();
        format!(
            "SELECT {distinct}{} FROM {}{}{group}{having}{}{}",
            self.projection_sql(),
            self.shard_from(),
            self.where_sql(),
            Self::order_sql(&self.order_by),
            self.limit_sql()
        )
        .replace(SHARD_PLACEHOLDER, "0")
    }

    /// A statement that succeeds on a shard when `name` is one of the table's columns.
    pub fn input_column_probe(&self, name: &str) -> String {
        format!("SELECT {} FROM {} LIMIT 0", Ident::with_quote('"', name), self.shard_from())
            .replace(SHARD_PLACEHOLDER, "0")
    }

    fn is_grouped(&self, facts: &ProbeFacts) -> Result<bool, ScatterError> {
        let mut found = None;
        let mut check = |expr: &Expr| {
            if let Expr::Function(f) = expr {
                let name = function_name(&f.name);
                if AggKind::of(&name).is_some() {
                    found.get_or_insert(Ok(()));
                } else if facts.aggregates.contains(&name) {
                    found = Some(Err(unmergeable(format!("the aggregate {name}()"))));
                }
            }
            ControlFlow::<()>::Continue(())
        };
        let _ = sqlparser::ast::visit_expressions(&self.select.projection, &mut check);
        let _ = sqlparser::ast::visit_expressions(&self.select.having, &mut check);
        let _ = sqlparser::ast::visit_expressions(&self.order_by, &mut check);
        let _ = sqlparser::ast::visit_expressions(&self.select.selection, &mut check);
        let has_agg = match found {
            Some(Err(e)) => return Err(e),
            Some(Ok(())) => true,
            None => false,
        };
        let grouped = match &self.select.group_by {
            GroupByExpr::All(_) => return Err(unmergeable("GROUP BY ALL")),
            GroupByExpr::Expressions(keys, modifiers) => {
                if !modifiers.is_empty() {
                    return Err(unmergeable("GROUP BY modifiers (WITH ROLLUP, WITH CUBE, WITH TOTALS)"));
                }
                if let Some(set) = keys.iter().find_map(grouping_set_name) {
                    return Err(unmergeable(format!("{set} in GROUP BY")));
                }
                !keys.is_empty()
            }
        };
        Ok(has_agg || grouped || self.select.having.is_some())
    }

    /// Writes what the shards and the coordinator run.
    pub fn plan(&self, facts: &ProbeFacts) -> Result<Plan, ScatterError> {
        let grouped = self.is_grouped(facts)?;
        let from = self.shard_from();
        let distinct = matches!(self.select.distinct, Some(Distinct::Distinct));
        if !grouped && !distinct && self.order_by.is_empty() && self.limit.is_none() && self.fetch.is_none() {
            let sql = format!("SELECT {} FROM {from}{}", self.projection_sql(), self.where_sql());
            return Ok(Plan { shard_parts: split_shard(&sql), merge: Merge::Stream });
        }
        if grouped { self.plan_grouped(facts, &from) } else { self.plan_ordered(facts, &from, distinct) }
    }

    fn final_items(&self, facts: &ProbeFacts, items: Vec<String>) -> Result<String, ScatterError> {
        if items.len() != facts.output_names.len() {
            return Err(unmergeable("this select list (its columns could not be counted)"));
        }
        let list: Vec<String> = items
            .into_iter()
            .zip(&facts.output_names)
            .map(|(e, name)| format!("{e} AS {}", Ident::with_quote('"', name.as_str())))
            .collect();
        Ok(list.join(", "))
    }

    /// Plain rows that are ordered, DISTINCT or limited: each shard sends its first
    /// LIMIT + OFFSET rows in order (no DISTINCT), the coordinator orders them all.
    fn plan_ordered(&self, facts: &ProbeFacts, from: &str, distinct: bool) -> Result<Plan, ScatterError> {
        let outputs = facts.output_names.len();
        let mut hidden: Vec<String> = Vec::new();
        let mut final_order = Vec::new();
        for item in &self.order_by {
            let key = match self.output_position(&item.expr) {
                Some(p) => p.to_string(),
                None => {
                    if distinct {
                        return Err(unmergeable("ORDER BY an expression not in the SELECT DISTINCT list"));
                    }
                    hidden.push(item.expr.to_string());
                    column_name(outputs + hidden.len() - 1)
                }
            };
            final_order.push(format!("{key}{}", item.options));
        }
        let mut partial = format!("SELECT {}", self.projection_sql());
        for h in &hidden {
            partial.push_str(&format!(", {h}"));
        }
        partial.push_str(&format!(" FROM {from}{}", self.where_sql()));
        // Rows past LIMIT + OFFSET of one shard can never be among the first LIMIT +
        // OFFSET of all; OFFSET itself is applied once, at the end.
        if !distinct && self.fetch.is_none() {
            partial.push_str(&Self::order_sql(&self.order_by));
            if let Some(pushed) = self.pushed_limit() {
                partial.push_str(&pushed);
            }
        }
        let items: Vec<String> = (0..outputs).map(column_name).collect();
        let order = if final_order.is_empty() {
            String::new()
        } else {
            format!(" ORDER BY {}", final_order.join(", "))
        };
        let final_template = format!(
            "SELECT {}{} FROM pg_temp.{PARTIAL_TABLE}{order}{}",
            if distinct { "DISTINCT " } else { "" },
            self.final_items(facts, items)?,
            self.limit_sql()
        );
        Ok(Plan {
            shard_parts: split_shard(&partial),
            merge: Merge::Coordinated { final_template, aggs: Vec::new(), columns: outputs + hidden.len() },
        })
    }

    /// `LIMIT l + OFFSET` for a shard, when the statement has a LIMIT.
    fn pushed_limit(&self) -> Option<String> {
        let LimitClause::LimitOffset { limit: Some(limit), offset, limit_by } = self.limit.as_ref()? else {
            return None;
        };
        if !limit_by.is_empty() {
            return None;
        }
        Some(match offset {
            // LIMIT NULL means no limit, and NULL + anything is NULL; OFFSET NULL means 0.
            Some(o) => format!(" LIMIT ({limit}) + COALESCE(({}), 0)", o.value),
            None => format!(" LIMIT {limit}"),
        })
    }

    /// The 1-based output column an ORDER BY expression names: a position, an output
    /// alias (which PostgreSQL prefers to an input column), or a select item's expression.
    fn output_position(&self, expr: &Expr) -> Option<usize> {
        if let Expr::Value(ValueWithSpan { value: Value::Number(n, _), .. }) = expr {
            return n.parse().ok();
        }
        if let Expr::Identifier(i) = expr {
            let by_alias = self.select.projection.iter().position(
                |item| matches!(item, SelectItem::ExprWithAlias { alias, .. } if normalized(alias) == *i),
            );
            if let Some(p) = by_alias {
                return self.wildcard_free(p);
            }
        }
        let p = self.select.projection.iter().position(|item| match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => e == expr,
            _ => false,
        })?;
        self.wildcard_free(p)
    }

    /// Position `p` + 1 when no wildcard precedes it (a wildcard's width is unknown here).
    fn wildcard_free(&self, p: usize) -> Option<usize> {
        let before = &self.select.projection[..p];
        before
            .iter()
            .all(|i| matches!(i, SelectItem::UnnamedExpr(_) | SelectItem::ExprWithAlias { .. }))
            .then_some(p + 1)
    }

    /// Groups and aggregates: each shard groups by the keys (and the value of a
    /// DISTINCT aggregate) and computes partial aggregates; the coordinator groups the
    /// partial rows by the keys again and combines them.
    fn plan_grouped(&self, facts: &ProbeFacts, from: &str) -> Result<Plan, ScatterError> {
        let keys = self.group_keys(facts)?;
        let mut collector = AggCollector { keys: &keys, aggs: Vec::new(), error: None };
        let mut projection: Vec<Expr> = Vec::new();
        for item in &self.select.projection {
            match item {
                SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                    projection.push(e.clone())
                }
                _ => return Err(unmergeable("SELECT * with GROUP BY or aggregates")),
            }
        }
        for e in &mut projection {
            let _ = VisitMut::visit(e, &mut collector);
        }
        let mut having = self.select.having.clone();
        let _ = VisitMut::visit(&mut having, &mut collector);
        let mut order = Vec::new();
        for item in &self.order_by {
            let mut e = item.expr.clone();
            let key = match self.output_position(&e) {
                Some(p) => p.to_string(),
                None => {
                    let _ = VisitMut::visit(&mut e, &mut collector);
                    e.to_string()
                }
            };
            order.push(format!("{key}{}", item.options));
        }
        if let Some(e) = collector.error {
            return Err(e);
        }
        let aggs = collector.aggs;
        for e in projection.iter().chain(having.iter()) {
            leftover_column(e)?;
        }
        let distinct_args: Vec<&Expr> =
            aggs.iter().filter(|a| a.distinct).filter_map(|a| a.arg.as_ref()).collect();
        if distinct_args.windows(2).any(|w| w[0] != w[1]) {
            return Err(unmergeable("DISTINCT aggregates over different expressions"));
        }
        if aggs.iter().any(|a| a.distinct && a.filter.is_some()) {
            return Err(unmergeable("a DISTINCT aggregate with FILTER"));
        }
        let distinct_arg = distinct_args.first().copied();

        // Partial columns: the keys, the DISTINCT value, then each aggregate's partials.
        let mut partial_items: Vec<String> = keys.iter().map(ToString::to_string).collect();
        let distinct_column = distinct_arg.map(|d| {
            partial_items.push(d.to_string());
            partial_items.len() - 1
        });
        let group_width = partial_items.len();
        let mut finals = Vec::new();
        for agg in &aggs {
            let filter = agg.filter.as_ref().map(|f| format!(" FILTER (WHERE {f})")).unwrap_or_default();
            let arg = agg.arg.as_ref().map(ToString::to_string).unwrap_or_else(|| "*".into());
            let column = partial_items.len();
            if agg.distinct {
                finals.push(FinalAgg {
                    kind: agg.kind,
                    distinct: true,
                    column: distinct_column.unwrap_or(column),
                });
                continue;
            }
            // Each aggregate's partial columns, in the order its final expression reads them.
            let partials: &[&str] = match agg.kind {
                AggKind::Avg => &["sum", "count"],
                kind => &[kind.name()],
            };
            for function in partials {
                partial_items.push(format!("{function}({arg}){filter}"));
            }
            finals.push(FinalAgg { kind: agg.kind, distinct: false, column });
        }
        if partial_items.is_empty() {
            // `SELECT 1 FROM all_shards.t HAVING true`: one row per shard stands for its input.
            partial_items.push("count(*)".into());
        }
        let mut partial = format!("SELECT {} FROM {from}{}", partial_items.join(", "), self.where_sql());
        if group_width > 0 {
            let positions: Vec<String> = (1..=group_width).map(|p| p.to_string()).collect();
            partial.push_str(&format!(" GROUP BY {}", positions.join(", ")));
        }

        let items: Vec<String> = projection.iter().map(ToString::to_string).collect();
        let distinct =
            if matches!(self.select.distinct, Some(Distinct::Distinct)) { "DISTINCT " } else { "" };
        let mut final_template =
            format!("SELECT {distinct}{} FROM pg_temp.{PARTIAL_TABLE}", self.final_items(facts, items)?);
        if !keys.is_empty() {
            let list: Vec<String> = (0..keys.len()).map(column_name).collect();
            final_template.push_str(&format!(" GROUP BY {}", list.join(", ")));
        }
        if let Some(h) = &having {
            final_template.push_str(&format!(" HAVING {h}"));
        }
        if !order.is_empty() {
            final_template.push_str(&format!(" ORDER BY {}", order.join(", ")));
        }
        final_template.push_str(&self.limit_sql());
        Ok(Plan {
            shard_parts: split_shard(&partial),
            merge: Merge::Coordinated { final_template, aggs: finals, columns: partial_items.len() },
        })
    }

    /// The GROUP BY keys as expressions: positions and output aliases resolved the way
    /// PostgreSQL does (an input column of the name wins over an output alias).
    fn group_keys(&self, facts: &ProbeFacts) -> Result<Vec<Expr>, ScatterError> {
        let GroupByExpr::Expressions(keys, _) = &self.select.group_by else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        for key in keys {
            let resolved = match key {
                Expr::Value(ValueWithSpan { value: Value::Number(n, _), .. }) => {
                    let p: usize = n.parse().map_err(|_| unmergeable(format!("GROUP BY {n}")))?;
                    match p.checked_sub(1).and_then(|i| self.select.projection.get(i)) {
                        Some(SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. }) => {
                            e.clone()
                        }
                        _ => return Err(unmergeable(format!("GROUP BY position {p}"))),
                    }
                }
                Expr::Identifier(i) if !facts.input_columns.contains(&i.value) => {
                    self.output_alias(&i.value).cloned().unwrap_or_else(|| key.clone())
                }
                _ => key.clone(),
            };
            if contains_aggregate(&resolved) {
                return Err(unmergeable("an aggregate in GROUP BY"));
            }
            out.push(resolved);
        }
        Ok(out)
    }
}

/// The name of a grouping-set construct (whose groups pgtenant does not merge).
fn grouping_set_name(key: &Expr) -> Option<&'static str> {
    match key {
        Expr::GroupingSets(_) => Some("GROUPING SETS"),
        Expr::Rollup(_) => Some("ROLLUP"),
        Expr::Cube(_) => Some("CUBE"),
        _ => None,
    }
}

fn split_shard(sql: &str) -> Vec<String> {
    sql.split(SHARD_PLACEHOLDER).map(str::to_string).collect()
}

#[cfg(test)]
mod tests;
