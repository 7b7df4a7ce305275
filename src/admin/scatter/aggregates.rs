//! The aggregates a scatter-gather statement may use, read from its text: which calls
//! pgtenant merges and how (`AggKind`), each call of the statement (`Agg`), and the
//! names the plan gives partial columns and merged aggregates in the final statement,
//! and how each merged aggregate is computed over its partials (`FinalAgg`).

use std::ops::ControlFlow;

use sqlparser::ast::{
    DuplicateTreatment, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Ident, ObjectName,
    ObjectNamePart, VisitorMut,
};

use super::ScatterError;
use crate::protocol::RESERVED_PREFIX;
use crate::protocol::values::{
    FLOAT4_OID, FLOAT8_OID, INT2_OID, INT4_OID, INT8_OID, INTERVAL_OID, MONEY_OID, NUMERIC_OID,
};

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

/// A name as PostgreSQL reads it, in one spelling: unquoted names fold to lower case,
/// quoted ones stay exact, and the result is quoted only where it must be. So
/// `"status"`, `status` and `STATUS` are one name (and compare equal everywhere the
/// planner compares expressions), `"Status"` another.
pub(super) fn normalized(ident: &Ident) -> Ident {
    let value = match ident.quote_style {
        None => ident.value.to_lowercase(),
        Some(_) => ident.value.clone(),
    };
    if needs_quotes(&value) { Ident::with_quote('"', value) } else { Ident::new(value) }
}

/// Whether `name` must be quoted to be read back as itself: anything but lower-case
/// letters, digits, `_` and `$` (not first), or one of PostgreSQL's keywords that
/// cannot stand alone as a column name (reserved, type and function, and column-name
/// keywords, as `quote_ident` treats them).
fn needs_quotes(name: &str) -> bool {
    let mut chars = name.chars();
    let plain_start = chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let plain_rest = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '$');
    !(plain_start && plain_rest) || NON_COLUMN_KEYWORDS.binary_search(&name).is_ok()
}

/// PostgreSQL's reserved, type/function-name and column-name keywords (`pg_get_keywords()`
/// categories R, T and C), sorted.
const NON_COLUMN_KEYWORDS: &[&str] = &[
    "all",
    "analyse",
    "analyze",
    "and",
    "any",
    "array",
    "as",
    "asc",
    "asymmetric",
    "authorization",
    "between",
    "bigint",
    "binary",
    "bit",
    "boolean",
    "both",
    "case",
    "cast",
    "char",
    "character",
    "check",
    "coalesce",
    "collate",
    "collation",
    "column",
    "concurrently",
    "constraint",
    "create",
    "cross",
    "current_catalog",
    "current_date",
    "current_role",
    "current_schema",
    "current_time",
    "current_timestamp",
    "current_user",
    "dec",
    "decimal",
    "default",
    "deferrable",
    "desc",
    "distinct",
    "do",
    "else",
    "end",
    "except",
    "exists",
    "extract",
    "false",
    "fetch",
    "float",
    "for",
    "foreign",
    "freeze",
    "from",
    "full",
    "grant",
    "greatest",
    "group",
    "grouping",
    "having",
    "ilike",
    "in",
    "initially",
    "inner",
    "inout",
    "int",
    "integer",
    "intersect",
    "interval",
    "into",
    "is",
    "isnull",
    "join",
    "json",
    "json_array",
    "json_arrayagg",
    "json_exists",
    "json_object",
    "json_objectagg",
    "json_query",
    "json_scalar",
    "json_serialize",
    "json_table",
    "json_value",
    "lateral",
    "leading",
    "least",
    "left",
    "like",
    "limit",
    "localtime",
    "localtimestamp",
    "merge_action",
    "national",
    "natural",
    "nchar",
    "none",
    "normalize",
    "not",
    "notnull",
    "null",
    "nullif",
    "numeric",
    "offset",
    "on",
    "only",
    "or",
    "order",
    "out",
    "outer",
    "overlaps",
    "overlay",
    "placing",
    "position",
    "precision",
    "primary",
    "real",
    "references",
    "returning",
    "right",
    "row",
    "select",
    "session_user",
    "setof",
    "similar",
    "smallint",
    "some",
    "substring",
    "symmetric",
    "system_user",
    "table",
    "tablesample",
    "then",
    "time",
    "timestamp",
    "to",
    "trailing",
    "treat",
    "trim",
    "true",
    "union",
    "unique",
    "user",
    "using",
    "values",
    "varchar",
    "variadic",
    "verbose",
    "when",
    "where",
    "window",
    "with",
    "xmlattributes",
    "xmlconcat",
    "xmlelement",
    "xmlexists",
    "xmlforest",
    "xmlnamespaces",
    "xmlparse",
    "xmlpi",
    "xmlroot",
    "xmlserialize",
    "xmltable",
];

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

/// The final expression of an aggregate over its partial column(s).
#[derive(Clone, Debug)]
pub struct FinalAgg {
    pub(super) kind: AggKind,
    /// Over the distinct values, which were shipped as a group key (`column`).
    pub(super) distinct: bool,
    /// First partial column (`avg` has a second, its count, right after).
    pub(super) column: usize,
}

impl FinalAgg {
    pub(super) fn final_text(&self, types: &[u32]) -> Result<String, ScatterError> {
        let c = column_name(self.column);
        let ty = types.get(self.column).and_then(|t| i32::try_from(*t).ok()).unwrap_or(0);
        if self.distinct {
            return Ok(format!("{}(DISTINCT {c})", self.kind.name()));
        }
        Ok(match self.kind {
            AggKind::Count => format!("CAST(COALESCE(sum({c}), 0) AS bigint)"),
            AggKind::Sum => match type_name(ty) {
                // The partial sum already has the type of the whole sum (sum(int4) is int8):
                // summing int8 partials gives numeric, which the cast brings back, failing
                // as the one database would when the total does not fit.
                Some(name) => format!("CAST(sum({c}) AS {name})"),
                None => format!("sum({c})"),
            },
            AggKind::Avg => {
                let n = column_name(self.column + 1);
                match ty {
                    INT8_OID | NUMERIC_OID => format!("(CAST(sum({c}) AS numeric) / sum({n}))"),
                    FLOAT4_OID | FLOAT8_OID | INTERVAL_OID => {
                        format!("(sum({c}) / CAST(sum({n}) AS double precision))")
                    }
                    _ => return Err(ScatterError::Unmergeable(format!("avg over type oid {ty}"))),
                }
            }
            // min, max, bool_and, bool_or of the partials are those of the whole.
            AggKind::Min | AggKind::Max | AggKind::BoolAnd | AggKind::BoolOr => {
                format!("{}({c})", self.kind.name())
            }
        })
    }
}

/// The SQL name of a numeric type a sum keeps (`protocol::values`' OIDs).
fn type_name(oid: i32) -> Option<&'static str> {
    Some(match oid {
        INT2_OID => "smallint",
        INT4_OID => "integer",
        INT8_OID => "bigint",
        FLOAT4_OID => "real",
        FLOAT8_OID => "double precision",
        NUMERIC_OID => "numeric",
        INTERVAL_OID => "interval",
        MONEY_OID => "money",
        _ => return None,
    })
}
