//! Reading and rewriting the descriptions a server sends (RowDescription,
//! ParameterDescription) and the parameter section of a Bind, for the statements
//! pgtenant runs on several servers at once (scatter-gather).

use bytes::{BufMut, BytesMut};

use super::build::put_message;
use super::messages::{read_i16, read_i32, split_cstr};

/// One column of a RowDescription (T).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescribedColumn {
    pub name: String,
    pub type_oid: u32,
}

/// Bytes of each field of a RowDescription after its name: table oid (4), attnum
/// (2), type oid (4), type size (2), typmod (4), format (2).
const FIELD_TAIL: usize = 18;

/// The columns of a RowDescription body.
pub fn row_description_columns(body: &[u8]) -> Option<Vec<DescribedColumn>> {
    let count = usize::try_from(read_i16(body, 0)?).ok()?;
    let mut rest = body.get(2..)?;
    let mut columns = Vec::with_capacity(count.min(1600));
    for _ in 0..count {
        let (name, tail) = split_cstr(rest)?;
        let type_oid = read_i32(tail, 6)? as u32;
        tail.get(..FIELD_TAIL)?;
        columns.push(DescribedColumn { name: String::from_utf8_lossy(name).into_owned(), type_oid });
        rest = &tail[FIELD_TAIL..];
    }
    Some(columns)
}

/// A RowDescription message (tag included) with the format codes a Bind asked for:
/// none (all text), one for every column, or one per column.
pub fn row_description_with_formats(body: &[u8], formats: &[i16]) -> Option<BytesMut> {
    let count = usize::try_from(read_i16(body, 0)?).ok()?;
    let mut out = BytesMut::with_capacity(body.len() + 5);
    let mut bad = false;
    put_message(&mut out, b'T', |b| {
        b.put_slice(&body[..2]);
        let mut rest = &body[2..];
        for i in 0..count {
            let Some((name, tail)) = split_cstr(rest) else {
                bad = true;
                return;
            };
            let Some(field) = tail.get(..FIELD_TAIL) else {
                bad = true;
                return;
            };
            b.put_slice(name);
            b.put_u8(0);
            // Everything but the format code, which is replaced.
            b.put_slice(&field[..FIELD_TAIL - 2]);
            let format = match formats {
                [] => 0,
                [one] => *one,
                many => many.get(i).copied().unwrap_or(0),
            };
            b.put_i16(format);
            rest = &tail[FIELD_TAIL..];
        }
    });
    (!bad).then_some(out)
}

/// The parameter type OIDs of a ParameterDescription body.
pub fn parameter_types(body: &[u8]) -> Option<Vec<u32>> {
    let count = usize::try_from(read_i16(body, 0)?).ok()?;
    (0..count).map(|i| read_i32(body, 2 + 4 * i).map(|v| v as u32)).collect()
}

/// Bind (F) of `statement` to the unnamed portal with a Bind's parameter part copied
/// (see `bind_parameters`) and the given result formats.
pub fn bind_with(buf: &mut BytesMut, statement: &[u8], parameters: &[u8], result_formats: &[i16]) {
    put_message(buf, b'B', |b| {
        b.put_u8(0);
        b.put_slice(statement);
        b.put_u8(0);
        b.put_slice(parameters);
        b.put_i16(result_formats.len() as i16);
        for f in result_formats {
            b.put_i16(*f);
        }
    });
}

/// Describe (F) of the unnamed portal.
pub fn describe_portal(buf: &mut BytesMut) {
    put_message(buf, b'D', |b| {
        b.put_u8(b'P');
        b.put_u8(0);
    });
}

/// A Bind parameter part with no parameters.
pub const NO_PARAMETERS: &[u8] = &[0, 0, 0, 0];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::bind_parameters;

    fn row_description(columns: &[(&str, u32)]) -> BytesMut {
        let mut b = BytesMut::new();
        b.put_i16(columns.len() as i16);
        for (name, oid) in columns {
            b.put_slice(name.as_bytes());
            b.put_u8(0);
            b.put_i32(0);
            b.put_i16(0);
            b.put_i32(*oid as i32);
            b.put_i16(8);
            b.put_i32(-1);
            b.put_i16(0);
        }
        b
    }

    #[test]
    fn reads_columns_and_rewrites_formats() {
        let body = row_description(&[("shard_id", 23), ("count", 20)]);
        let cols = row_description_columns(&body).unwrap();
        assert_eq!(cols[1], DescribedColumn { name: "count".into(), type_oid: 20 });
        let with = row_description_with_formats(&body, &[1]).unwrap();
        assert_eq!(with[0], b'T');
        let again = &with[5..];
        assert_eq!(row_description_columns(again).unwrap(), cols);
        assert_eq!(&again[again.len() - 2..], &[0, 1]);
        assert!(row_description_columns(&body[..body.len() - 3]).is_none());
        assert!(row_description_with_formats(&body[..body.len() - 3], &[]).is_none());
    }

    #[test]
    fn splits_bind_parameters_from_result_formats() {
        // one text format code, two values (the second NULL), then two result formats
        let rest = [0, 1, 0, 0, 0, 2, 0, 0, 0, 1, b'7', 255, 255, 255, 255, 0, 2, 0, 1, 0, 1];
        assert_eq!(bind_parameters(&rest).unwrap().len(), 15);
        assert!(bind_parameters(&rest[..8]).is_none());
        let mut b = BytesMut::new();
        bind_with(&mut b, b"s", &rest[..15], &[1]);
        assert_eq!(&b[b.len() - 4..], &[0, 1, 0, 1]);
        assert_eq!(parameter_types(&[0, 2, 0, 0, 0, 23, 0, 0, 0, 20]).unwrap(), vec![23, 20]);
    }
}
