//! Values pgtenant produces itself (the results of the calls it answers), typed as a
//! server would type them and encoded in the text or binary format a client asked for.

use bytes::{BufMut, BytesMut};

use super::build::put_message;

pub const TEXT_OID: i32 = 25;
pub const INT2_OID: i32 = 21;
pub const INT4_OID: i32 = 23;
pub const INT8_OID: i32 = 20;
pub const TIMESTAMPTZ_OID: i32 = 1184;
pub const BOOL_OID: i32 = 16;
pub const FLOAT8_OID: i32 = 701;
pub const FLOAT4_OID: i32 = 700;
pub const NUMERIC_OID: i32 = 1700;
pub const INTERVAL_OID: i32 = 1186;
pub const MONEY_OID: i32 = 790;
/// `record` and `record[]`: the pseudo-types of a row value (`(a, b)`, `ROW(...)`).
pub const RECORD_OID: i32 = 2249;
pub const RECORD_ARRAY_OID: i32 = 2287;

/// A result value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int4(i32),
    Int8(i64),
    /// Unix milliseconds, shown in UTC.
    Timestamptz(i64),
    Text(String),
    Bool(bool),
    Float8(f64),
    Null,
}

/// A result column: its name and type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub type_oid: i32,
}

impl Column {
    pub fn new(name: impl Into<String>, type_oid: i32) -> Self {
        Self { name: name.into(), type_oid }
    }

    fn type_len(&self) -> i16 {
        match self.type_oid {
            INT2_OID => 2,
            INT4_OID => 4,
            INT8_OID | TIMESTAMPTZ_OID | FLOAT8_OID => 8,
            BOOL_OID => 1,
            _ => -1, // variable size
        }
    }
}

/// Whether column `i` is sent in binary, by a Bind's result format codes.
pub fn is_binary(formats: &[i16], i: usize) -> bool {
    match formats {
        [] => false,
        [one] => *one == 1,
        many => many.get(i) == Some(&1),
    }
}

/// RowDescription (B) of `columns` in `formats`.
pub fn row_description(buf: &mut BytesMut, columns: &[Column], formats: &[i16]) {
    put_message(buf, b'T', |b| {
        b.put_i16(columns.len() as i16);
        for (i, c) in columns.iter().enumerate() {
            b.put_slice(c.name.as_bytes());
            b.put_u8(0);
            b.put_i32(0); // table oid
            b.put_i16(0); // column number
            b.put_i32(c.type_oid);
            b.put_i16(c.type_len());
            b.put_i32(-1); // no type modifier
            b.put_i16(is_binary(formats, i) as i16);
        }
    });
}

/// RowDescription (B) of text columns, as a server describes `SHOW` results.
pub fn text_row_description(buf: &mut BytesMut, columns: &[&str]) {
    let columns: Vec<Column> = columns.iter().map(|name| Column::new(*name, TEXT_OID)).collect();
    row_description(buf, &columns, &[]);
}

/// ParameterDescription (B) of parameters of the types `oids`.
pub fn parameter_description(buf: &mut BytesMut, oids: &[i32]) {
    put_message(buf, b't', |b| {
        b.put_i16(oids.len() as i16);
        for oid in oids {
            b.put_i32(*oid);
        }
    });
}

/// DataRow (B) of `values` in `formats`.
pub fn data_row(buf: &mut BytesMut, values: &[Value], formats: &[i16]) {
    put_message(buf, b'D', |b| {
        b.put_i16(values.len() as i16);
        for (i, v) in values.iter().enumerate() {
            if *v == Value::Null {
                b.put_i32(-1);
                continue;
            }
            let at = b.len();
            b.put_i32(0);
            encode(b, v, is_binary(formats, i));
            let len = (b.len() - at - 4) as i32;
            b[at..at + 4].copy_from_slice(&len.to_be_bytes());
        }
    });
}

fn encode(b: &mut BytesMut, v: &Value, binary: bool) {
    match (v, binary) {
        (Value::Int4(x), true) => b.put_i32(*x),
        (Value::Int8(x), true) => b.put_i64(*x),
        (Value::Timestamptz(ms), true) => b.put_i64(unix_ms_to_pg_micros(*ms)),
        (Value::Bool(x), true) => b.put_u8(*x as u8),
        (Value::Float8(x), true) => b.put_f64(*x),
        (Value::Int4(x), false) => b.put_slice(itoa::Buffer::new().format(*x).as_bytes()),
        (Value::Int8(x), false) => b.put_slice(itoa::Buffer::new().format(*x).as_bytes()),
        (Value::Timestamptz(ms), false) => b.put_slice(timestamptz_text(*ms).as_bytes()),
        (Value::Bool(x), false) => b.put_slice(if *x { b"t" } else { b"f" }),
        // PostgreSQL's shortest exact form; Rust's Display is the same for finite values.
        (Value::Float8(x), false) => b.put_slice(float8_text(*x).as_bytes()),
        // Text is the same in both formats.
        (Value::Text(t), _) => b.put_slice(t.as_bytes()),
        (Value::Null, _) => {}
    }
}

fn float8_text(x: f64) -> String {
    if x.is_nan() {
        "NaN".into()
    } else if x.is_infinite() {
        if x > 0.0 { "Infinity".into() } else { "-Infinity".into() }
    } else {
        x.to_string()
    }
}

/// Microseconds since 2000-01-01 00:00:00 UTC, the binary timestamptz.
fn unix_ms_to_pg_micros(unix_ms: i64) -> i64 {
    const PG_EPOCH_UNIX_MS: i64 = 946_684_800_000;
    (unix_ms - PG_EPOCH_UNIX_MS) * 1000
}

/// `2026-11-22 19:06:45.927+00`, as PostgreSQL prints a timestamptz in UTC (ISO
/// DateStyle), trailing zeros of the fraction dropped.
/// A time as PgBouncer's console writes one (text, to the second, in UTC):
/// `2026-11-28 15:47:03 UTC`.
pub fn console_time_text(unix_ms: i64) -> String {
    let text = timestamptz_text(unix_ms - unix_ms.rem_euclid(1000));
    format!("{} UTC", text.trim_end_matches("+00"))
}

pub fn timestamptz_text(unix_ms: i64) -> String {
    let days = unix_ms.div_euclid(86_400_000);
    let ms_of_day = unix_ms.rem_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    let (h, min, s, ms) =
        (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60, ms_of_day / 1000 % 60, ms_of_day % 1000);
    let mut out = format!("{y:04}-{m:02}-{d:02} {h:02}:{min:02}:{s:02}");
    if ms != 0 {
        let frac = format!("{ms:03}");
        out.push('.');
        out.push_str(frac.trim_end_matches('0'));
    }
    out.push_str("+00");
    out
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_print_as_postgres_prints_them_in_utc() {
        assert_eq!(timestamptz_text(1_704_067_200_000), "2024-01-01 00:00:00+00");
        assert_eq!(timestamptz_text(1_704_067_200_120), "2024-01-01 00:00:00.12+00");
        assert_eq!(timestamptz_text(1_709_210_096_007), "2024-02-29 12:34:56.007+00");
        assert_eq!(timestamptz_text(0), "1970-01-01 00:00:00+00");
        assert_eq!(unix_ms_to_pg_micros(946_684_800_001), 1000);
    }

    #[test]
    fn formats_pick_text_or_binary_per_column() {
        assert!(!is_binary(&[], 3));
        assert!(is_binary(&[1], 3));
        assert!(is_binary(&[0, 1], 1) && !is_binary(&[0, 1], 0));
        let mut b = BytesMut::new();
        data_row(&mut b, &[Value::Int8(-42), Value::Int4(7)], &[0, 1]);
        assert_eq!(&b[..], b"D\0\0\0\x15\0\x02\0\0\0\x03-42\0\0\0\x04\0\0\0\x07");
    }
}
