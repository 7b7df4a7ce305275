//! The aggregates a scatter-gather statement may use, read from its text: which calls
//! pgtenant merges and how (`AggKind`), each call of the statement (`Agg`), and the
//! names the plan gives partial columns and merged aggregates in the final statement.

use std::ops::ControlFlow;

use sqlparser::ast::{
    DuplicateTreatment, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Ident, ObjectName,
    ObjectNamePart, VisitorMut,
};

use super::ScatterError;
use crate::protocol::RESERVED_PREFIX;

/// The aggregates pgtenant merges, by how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AggKind {
    Count,
    Sum,
    Avg,
    Min,
    Max,
    BoolAnd,
    BoolOr,
}

impl AggKind {
    /// The function's name in SQL (`every` is written `bool_and`).
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Count => "count",
            Self::Sum => "sum",
            Self::Avg => "avg",
            Self::Min => "min",
            Self::Max => "max",
            Self::BoolAnd => "bool_and",
            Self::BoolOr => "bool_or",
        }
    }

    pub(super) fn of(name: &str) -> Option<Self> {
        Some(match name {
            "count" => Self::Count,
            "sum" => Self::Sum,
            "avg" => Self::Avg,
            "min" => Self::Min,
            "max" => Self::Max,
            "bool_and" | "every" => Self::BoolAnd,
            "bool_or" => Self::BoolOr,
            _ => return None,
        })
    }
}

/// One aggregate call of the statement.
#[derive(Clone, Debug)]
pub(super) struct Agg {
    pub(super) kind: AggKind,
    /// `None` for `count(*)`.
    pub(super) arg: Option<Expr>,
    pub(super) distinct: bool,
    pub(super) filter: Option<Expr>,
}

/// The name of partial column `i` in the coordinator's table.
pub fn column_name(i: usize) -> String {
    format!("{RESERVED_PREFIX}c{i}")
}

pub(super) fn column(i: usize) -> Expr {
    Expr::Identifier(Ident::new(column_name(i)))
}

pub(super) fn unmergeable(what: impl Into<String>) -> ScatterError {
    ScatterError::Unmergeable(what.into())
}

/// PostgreSQL folds unquoted names to lower case.
pub(super) fn normalized(ident: &Ident) -> Ident {
    match ident.quote_style {
        None => Ident::new(ident.value.to_lowercase()),
        Some(_) => Ident::with_quote('"', ident.value.clone()),
    }
}

/// Replaces group keys by their partial columns and merged aggregates by placeholders.
pub(super) struct AggCollector<'a> {
    pub(super) keys: &'a [Expr],
    pub(super) aggs: Vec<Agg>,
    pub(super) error: Option<ScatterError>,
}

impl VisitorMut for AggCollector<'_> {
    type Break = ();
    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if let Some(i) = self.keys.iter().position(|k| k == expr) {
            *expr = column(i);
            return ControlFlow::Continue(());
        }
        let Expr::Function(f) = expr else { return ControlFlow::Continue(()) };
        let name = function_name(&f.name);
        let Some(kind) = AggKind::of(&name) else { return ControlFlow::Continue(()) };
        match read_agg(kind, f) {
            Ok(agg) => {
                let i = self.aggs.len();
                self.aggs.push(agg);
                *expr = Expr::Identifier(Ident::new(format!("{RESERVED_PREFIX}agg_{i}__")));
                ControlFlow::Continue(())
            }
            Err(e) => {
                self.error = Some(e);
                ControlFlow::Break(())
            }
        }
    }
}

pub(super) fn read_agg(kind: AggKind, f: &sqlparser::ast::Function) -> Result<Agg, ScatterError> {
    let text = f.to_string();
    if !f.within_group.is_empty() || f.null_treatment.is_some() {
        return Err(unmergeable(format!("the aggregate call {text}")));
    }
    let FunctionArguments::List(list) = &f.args else {
        return Err(unmergeable(format!("the aggregate call {text}")));
    };
    if !list.clauses.is_empty() {
        return Err(unmergeable(format!("the aggregate call {text} (ORDER BY or options inside it)")));
    }
    let distinct = matches!(list.duplicate_treatment, Some(DuplicateTreatment::Distinct));
    let arg = match list.args.as_slice() {
        [FunctionArg::Unnamed(FunctionArgExpr::Wildcard)] if kind == AggKind::Count && !distinct => None,
        [FunctionArg::Unnamed(FunctionArgExpr::Expr(e))] => {
            if contains_aggregate(e) {
                return Err(unmergeable(format!("the nested aggregate {text}")));
            }
            Some(e.clone())
        }
        _ => return Err(unmergeable(format!("the aggregate call {text}"))),
    };
    Ok(Agg { kind, arg, distinct, filter: f.filter.as_deref().cloned() })
}

pub(super) fn contains_aggregate(expr: &Expr) -> bool {
    let found = sqlparser::ast::visit_expressions(expr, |e| match e {
        Expr::Function(f) if AggKind::of(&function_name(&f.name)).is_some() => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    });
    found.is_break()
}

/// A column reference left after the keys and aggregates were replaced: PostgreSQL
/// would accept it only when functionally dependent on a key, which pgtenant cannot see.
pub(super) fn leftover_column(expr: &Expr) -> Result<(), ScatterError> {
    let mut found = None;
    let _ = sqlparser::ast::visit_expressions(expr, |e| {
        match e {
            Expr::Identifier(i) if !i.value.starts_with(RESERVED_PREFIX) => found = Some(i.value.clone()),
            Expr::CompoundIdentifier(parts) => found = Some(format!("{}", ObjectName::from(parts.clone()))),
            _ => return ControlFlow::Continue(()),
        }
        ControlFlow::Break(())
    });
    match found {
        Some(name) => Err(unmergeable(format!(
            "column \"{name}\" outside GROUP BY and outside count/sum/avg/min/max/bool_and/bool_or"
        ))),
        None => Ok(()),
    }
}

pub(super) fn function_name(name: &ObjectName) -> String {
    match name.0.last() {
        Some(ObjectNamePart::Identifier(i)) => normalized(i).value,
        _ => name.to_string().to_lowercase(),
    }
}
