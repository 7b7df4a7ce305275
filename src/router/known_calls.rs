//! The calls a statement's text makes, as far as pgtenant knows them: every `(` that
//! follows a keyword, a type name, a table's column list or a built-in function known
//! neither to wait on another session nor to change anything. One list of known
//! functions decides what may ride a lane, go to a replica, or leave the server
//! session as it was (see `effects`).

use std::sync::LazyLock;

use super::lexer::TokenKind;
use super::words::Words;

/// Whether every `(` of the statement follows a keyword, a type name, a function known
/// not to wait (`call_cannot_wait`), a name whose column list it opens
/// (`names_columns`), or no word at all.
pub(super) fn calls_only_known(w: &Words) -> bool {
    (0..w.tokens.len()).all(|i| w.text(i + 1) != "(" || names_columns(w, i) || call_cannot_wait(w, i))
}

/// Token `i`, before `(`, names a table or CTE whose column list follows, not a
/// function: `INSERT INTO [schema.]table [AS alias] (` or `WITH [RECURSIVE] name (`. (pgbench's INSERT, and every INSERT with a column
/// list, counted as a call of an unknown function before: the connection's settings
/// and tenant GUC were set again after each.)
fn names_columns(w: &Words, i: usize) -> bool {
    if !matches!(w.tokens.get(i).map(|t| t.kind), Some(TokenKind::Word | TokenKind::QuotedIdent)) {
        return false;
    }
    // The table's name, past an alias and a schema.
    let mut at = i;
    if at >= 2 && w.is(at - 1, "as") {
        at -= 2;
    }
    if at >= 2 && w.text(at - 1) == "." {
        at -= 2;
    }
    let inserts = at >= 1 && w.is(at - 1, "into") && w.is(0, "insert");
    let cte = i >= 1 && (w.is(i - 1, "with") || w.is(i - 1, "recursive"));
    inserts || cte
}

/// Token `i` stands before `(`: a keyword or type name that takes parentheses, or a
/// call of a function known not to wait (unqualified, or qualified by `pg_catalog`,
/// which PostgreSQL searches first unless told otherwise).
fn call_cannot_wait(w: &Words, i: usize) -> bool {
    let Some(token) = w.tokens.get(i) else { return true };
    match token.kind {
        TokenKind::Word => {}
        TokenKind::QuotedIdent => return false,
        // `= (`, `, (`, `((`: grouping, a subquery or a row.
        _ => return true,
    }
    let name = w.text(i).to_ascii_lowercase();
    let qualified = i >= 2 && w.text(i - 1) == ".";
    if qualified {
        return w.is(i - 2, "pg_catalog") && KNOWN.get(name.as_str()) == Some(&Known::Function);
    }
    KNOWN.contains_key(name.as_str())
}

/// What a word before `(` is, when it is one pgtenant knows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Known {
    Keyword,
    Function,
}

/// `PAREN_KEYWORDS` and `NO_WAIT_FUNCTIONS` in one map: a statement may hold many calls,
/// and each is looked up once.
static KNOWN: LazyLock<foldhash::HashMap<&'static str, Known>> = LazyLock::new(|| {
    let keywords = PAREN_KEYWORDS.iter().map(|k| (*k, Known::Keyword));
    // A function of the same name as a keyword stays a function (`left`, `right`).
    keywords.chain(NO_WAIT_FUNCTIONS.iter().map(|f| (*f, Known::Function))).collect()
});

/// Keywords and type names that a `(` may follow in a read without a function call
/// (`COPY (query) TO` among them).
const PAREN_KEYWORDS: &[&str] = &[
    "copy",
    "select",
    "from",
    "where",
    "and",
    "or",
    "not",
    "in",
    "exists",
    "any",
    "some",
    "all",
    "values",
    "as",
    "join",
    "on",
    "using",
    "lateral",
    "by",
    "having",
    "when",
    "then",
    "else",
    "case",
    "between",
    "is",
    "distinct",
    "union",
    "intersect",
    "except",
    "limit",
    "offset",
    "fetch",
    "over",
    "filter",
    "within",
    "partition",
    "with",
    "recursive",
    "materialized",
    "like",
    "ilike",
    "similar",
    "escape",
    "array",
    "row",
    "cast",
    "coalesce",
    "nullif",
    "greatest",
    "least",
    "extract",
    "overlay",
    "position",
    "substring",
    "trim",
    "collate",
    "group",
    "order",
    "window",
    "rows",
    "range",
    "groups",
    "cube",
    "rollup",
    "grouping",
    "sets",
    "numeric",
    "decimal",
    "varchar",
    "char",
    "character",
    "varying",
    "bit",
    "time",
    "timestamp",
    "interval",
    "float",
    "precision",
    "table",
    "only",
    "asc",
    "desc",
    "nulls",
    "first",
    "last",
    "true",
    "false",
    "null",
];

/// Built-in functions that neither wait on another session nor change anything: what
/// reads commonly call. Anything else (pg_sleep, advisory locks, dblink, nextval,
/// set_config, user functions) may.
const NO_WAIT_FUNCTIONS: &[&str] = &[
    // Aggregates and window functions.
    "count",
    "sum",
    "avg",
    "min",
    "max",
    "bool_and",
    "bool_or",
    "every",
    "array_agg",
    "string_agg",
    "json_agg",
    "jsonb_agg",
    "json_object_agg",
    "jsonb_object_agg",
    "stddev",
    "stddev_pop",
    "stddev_samp",
    "variance",
    "var_pop",
    "var_samp",
    "percentile_cont",
    "percentile_disc",
    "mode",
    "row_number",
    "rank",
    "dense_rank",
    "percent_rank",
    "cume_dist",
    "ntile",
    "lag",
    "lead",
    "first_value",
    "last_value",
    "nth_value",
    "bit_and",
    "bit_or",
    // Strings.
    "lower",
    "upper",
    "initcap",
    "length",
    "char_length",
    "character_length",
    "octet_length",
    "bit_length",
    "substr",
    "btrim",
    "ltrim",
    "rtrim",
    "replace",
    "translate",
    "concat",
    "concat_ws",
    "format",
    "left",
    "right",
    "lpad",
    "rpad",
    "repeat",
    "reverse",
    "strpos",
    "split_part",
    "starts_with",
    "md5",
    "ascii",
    "chr",
    "quote_ident",
    "quote_literal",
    "quote_nullable",
    "regexp_replace",
    "regexp_match",
    "regexp_matches",
    "regexp_split_to_array",
    "regexp_split_to_table",
    "string_to_array",
    "array_to_string",
    "to_hex",
    "encode",
    "decode",
    "sha256",
    "sha512",
    // Numbers.
    "abs",
    "ceil",
    "ceiling",
    "floor",
    "round",
    "trunc",
    "mod",
    "power",
    "pow",
    "sqrt",
    "cbrt",
    "exp",
    "ln",
    "log",
    "log10",
    "sign",
    "div",
    "width_bucket",
    "random",
    "pi",
    "to_char",
    "to_number",
    // Dates and times.
    "now",
    "clock_timestamp",
    "statement_timestamp",
    "transaction_timestamp",
    "timeofday",
    "date_trunc",
    "date_part",
    "date_bin",
    "age",
    "to_date",
    "to_timestamp",
    "make_date",
    "make_time",
    "make_timestamp",
    "make_timestamptz",
    "make_interval",
    "justify_days",
    "justify_hours",
    "justify_interval",
    // Arrays, rows and JSON.
    "array_length",
    "array_upper",
    "array_lower",
    "array_position",
    "array_positions",
    "array_append",
    "array_prepend",
    "array_cat",
    "array_remove",
    "array_replace",
    "cardinality",
    "unnest",
    "generate_series",
    "generate_subscripts",
    "to_json",
    "to_jsonb",
    "row_to_json",
    "array_to_json",
    "json_build_object",
    "jsonb_build_object",
    "json_build_array",
    "jsonb_build_array",
    "json_object",
    "jsonb_object",
    "json_array_length",
    "jsonb_array_length",
    "json_extract_path",
    "json_extract_path_text",
    "jsonb_extract_path",
    "jsonb_extract_path_text",
    "json_typeof",
    "jsonb_typeof",
    "jsonb_set",
    "jsonb_insert",
    "jsonb_strip_nulls",
    "jsonb_pretty",
    "json_array_elements",
    "jsonb_array_elements",
    "json_array_elements_text",
    "jsonb_array_elements_text",
    "json_each",
    "jsonb_each",
    "json_each_text",
    "jsonb_each_text",
    "json_object_keys",
    "jsonb_object_keys",
    "jsonb_path_query",
    "jsonb_path_exists",
    "jsonb_path_match",
    // Session and catalog facts.
    "version",
    "current_setting",
    "current_database",
    "current_schema",
    "current_schemas",
    "current_user",
    "session_user",
    "pg_backend_pid",
    "inet_server_addr",
    "inet_server_port",
    "pg_postmaster_start_time",
    "pg_is_in_recovery",
    "txid_current_snapshot",
    "pg_current_snapshot",
    "pg_typeof",
    "format_type",
    "obj_description",
    "col_description",
    "has_table_privilege",
    "has_schema_privilege",
    "has_column_privilege",
    "pg_get_expr",
    "pg_get_indexdef",
    "pg_get_constraintdef",
    "pg_table_is_visible",
    "pg_type_is_visible",
    "pg_relation_size",
    "pg_total_relation_size",
    "pg_size_pretty",
    "pg_encoding_to_char",
    // Other.
    "gen_random_uuid",
    "num_nulls",
    "num_nonnulls",
    "host",
    "family",
    "masklen",
];
