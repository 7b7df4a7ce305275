//! A console result: typed columns and rows, written as RowDescription and DataRows in
//! the formats a client asked for (text for a simple query, a Bind's codes otherwise).

use bytes::BytesMut;

use crate::protocol::values::{
    BOOL_OID, Column, FLOAT8_OID, INT8_OID, TEXT_OID, Value, data_row, row_description,
};

/// A column's type, as PostgreSQL names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Int8,
    Text,
    Bool,
    Float8,
}

impl Kind {
    fn oid(self) -> i32 {
        match self {
            Kind::Int8 => INT8_OID,
            Kind::Text => TEXT_OID,
            Kind::Bool => BOOL_OID,
            Kind::Float8 => FLOAT8_OID,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Table {
    pub columns: Vec<Column>,
    pub rows: Vec<Vec<Value>>,
}

impl Table {
    pub fn new(columns: &[(&str, Kind)]) -> Self {
        Self {
            columns: columns.iter().map(|(name, kind)| Column::new(*name, kind.oid())).collect(),
            rows: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Vec<Value>) {
        debug_assert_eq!(row.len(), self.columns.len(), "a row of every column");
        self.rows.push(row);
    }

    pub fn describe(&self, buf: &mut BytesMut, formats: &[i16]) {
        row_description(buf, &self.columns, formats);
    }

    pub fn write_rows(&self, buf: &mut BytesMut, formats: &[i16]) {
        for row in &self.rows {
            data_row(buf, row, formats);
        }
    }

    /// The CommandComplete tag of a SHOW, as PgBouncer and PostgreSQL write it.
    pub fn tag(&self) -> &'static str {
        "SHOW"
    }
}

pub fn int(n: impl TryInto<i64>) -> Value {
    Value::Int8(n.try_into().unwrap_or(i64::MAX))
}

pub fn text(s: impl Into<String>) -> Value {
    Value::Text(s.into())
}

pub fn opt_text(s: Option<impl Into<String>>) -> Value {
    s.map_or(Value::Null, |s| Value::Text(s.into()))
}
