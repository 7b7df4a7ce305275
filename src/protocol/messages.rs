//! Zero-copy views of the messages pgtenant looks inside. Each accessor returns
//! `None` on a malformed body instead of panicking; the caller turns that into a
//! protocol-violation error.

/// Splits a NUL-terminated string off the front of `b`.
pub fn split_cstr(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let nul = memchr(b)?;
    Some((&b[..nul], &b[nul + 1..]))
}

/// Query texts are scanned for their end on every Parse: a word-at-a-time search.
/// Names are most often empty (the unnamed statement and portal of every Bind of
/// pgbench's, psycopg's, JDBC's extended protocol): that NUL is looked at first, as the
/// vector search costs tens of instructions to set up.
#[inline]
fn memchr(b: &[u8]) -> Option<usize> {
    if b.first() == Some(&0) {
        return Some(0);
    }
    memchr::memchr(0, b)
}

/// Transaction status carried by ReadyForQuery (B).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxStatus {
    Idle,
    InTransaction,
    Failed,
}

impl TxStatus {
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            b'I' => Some(Self::Idle),
            b'T' => Some(Self::InTransaction),
            b'E' => Some(Self::Failed),
            _ => None,
        }
    }

    pub fn as_byte(self) -> u8 {
        match self {
            Self::Idle => b'I',
            Self::InTransaction => b'T',
            Self::Failed => b'E',
        }
    }
}

/// Query (F): the SQL text, without its terminating NUL.
pub fn query_text(body: &[u8]) -> Option<&[u8]> {
    split_cstr(body).map(|(q, _)| q)
}

/// Parse (F): statement name, query text and the raw parameter-type section.
#[derive(Debug, PartialEq, Eq)]
pub struct ParseView<'a> {
    pub name: &'a [u8],
    pub query: &'a [u8],
    pub param_types: &'a [u8],
}

pub fn parse_view(body: &[u8]) -> Option<ParseView<'_>> {
    let (name, rest) = split_cstr(body)?;
    let (query, param_types) = split_cstr(rest)?;
    if param_types.len() < 2 {
        return None;
    }
    Some(ParseView { name, query, param_types })
}

/// Bind (F): portal and statement names, and everything after them.
#[derive(Debug, PartialEq, Eq)]
pub struct BindView<'a> {
    pub portal: &'a [u8],
    pub statement: &'a [u8],
    pub rest: &'a [u8],
}

pub fn bind_view(body: &[u8]) -> Option<BindView<'_>> {
    let (portal, rest) = split_cstr(body)?;
    let (statement, rest) = split_cstr(rest)?;
    Some(BindView { portal, statement, rest })
}

/// Parameter `n` (1-based) of a Bind's remainder (`BindView::rest`): whether it is
/// binary, and its bytes (`None` for NULL). `None` when the message has no such
/// parameter or is malformed.
pub fn bind_param(rest: &[u8], n: u16) -> Option<(bool, Option<&[u8]>)> {
    let format_count = usize::try_from(read_i16(rest, 0)?).ok()?;
    let formats_end = 2 + 2 * format_count;
    let index = usize::from(n).checked_sub(1)?;
    let binary = match format_count {
        0 => false,
        1 => read_i16(rest, 2)? == 1,
        _ if index < format_count => read_i16(rest, 2 + 2 * index)? == 1,
        _ => return None,
    };
    let value_count = usize::try_from(read_i16(rest, formats_end)?).ok()?;
    if index >= value_count {
        return None;
    }
    let mut at = formats_end + 2;
    for i in 0..=index {
        let len = read_i32(rest, at)?;
        at += 4;
        let value = if len < 0 {
            None
        } else {
            let end = at.checked_add(len as usize)?;
            let v = rest.get(at..end)?;
            at = end;
            Some(v)
        };
        if i == index {
            return Some((binary, value));
        }
    }
    None
}

pub(super) fn read_i16(b: &[u8], at: usize) -> Option<i16> {
    b.get(at..at + 2).map(|x| i16::from_be_bytes([x[0], x[1]]))
}

pub(super) fn read_i32(b: &[u8], at: usize) -> Option<i32> {
    b.get(at..at + 4).map(|x| i32::from_be_bytes([x[0], x[1], x[2], x[3]]))
}

/// A binary int2, int4 or int8 parameter value (chosen by its length).
pub fn binary_int(bytes: &[u8]) -> Option<i64> {
    match bytes.len() {
        2 => Some(i64::from(i16::from_be_bytes(bytes.try_into().ok()?))),
        4 => Some(i64::from(i32::from_be_bytes(bytes.try_into().ok()?))),
        8 => Some(i64::from_be_bytes(bytes.try_into().ok()?)),
        _ => None,
    }
}

/// The parameter part of a Bind's remainder (formats and values), without its
/// result format codes; `None` when malformed.
pub fn bind_parameters(rest: &[u8]) -> Option<&[u8]> {
    let format_count = usize::try_from(read_i16(rest, 0)?).ok()?;
    let mut at = 2 + 2 * format_count;
    let value_count = usize::try_from(read_i16(rest, at)?).ok()?;
    at += 2;
    for _ in 0..value_count {
        let len = read_i32(rest, at)?;
        at = at.checked_add(4 + usize::try_from(len).unwrap_or(0))?;
    }
    rest.get(..at)
}

/// The result format codes at the end of a Bind's remainder (`BindView::rest`).
pub fn bind_result_formats(rest: &[u8]) -> Option<Vec<i16>> {
    let at = bind_parameters(rest)?.len();
    let result_count = usize::try_from(read_i16(rest, at)?).ok()?;
    (0..result_count).map(|i| read_i16(rest, at + 2 + 2 * i)).collect()
}

/// Describe (F) and Close (F): `S` for a statement or `P` for a portal, and its name.
pub fn target_view(body: &[u8]) -> Option<(u8, &[u8])> {
    let (&kind, rest) = body.split_first()?;
    let (name, _) = split_cstr(rest)?;
    match kind {
        b'S' | b'P' => Some((kind, name)),
        _ => None,
    }
}

/// CommandComplete (B): the command tag, e.g. `SELECT 1` or `COMMIT`.
pub fn command_tag(body: &[u8]) -> &[u8] {
    split_cstr(body).map(|(t, _)| t).unwrap_or(body)
}

/// ParameterStatus (B): name and value.
pub fn parameter_status(body: &[u8]) -> Option<(String, String)> {
    let (name, rest) = split_cstr(body)?;
    let (value, _) = split_cstr(rest)?;
    Some((String::from_utf8_lossy(name).into_owned(), String::from_utf8_lossy(value).into_owned()))
}

/// ErrorResponse / NoticeResponse (B): the typed fields.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ErrorFields {
    pub severity: String,
    pub code: String,
    pub message: String,
}

pub fn error_fields(body: &[u8]) -> ErrorFields {
    let text =
        |kind| error_field(body, kind).map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_default();
    ErrorFields { severity: text(b'S'), code: text(b'C'), message: text(b'M') }
}

/// ErrorResponse / NoticeResponse (B): the raw value of the field of type `kind`.
pub fn error_field(body: &[u8], kind: u8) -> Option<&[u8]> {
    let mut b = body;
    while let Some((&this, rest)) = b.split_first() {
        if this == 0 {
            return None;
        }
        let (value, rest) = split_cstr(rest)?;
        if this == kind {
            return Some(value);
        }
        b = rest;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_params_in_text_and_binary() {
        // Formats: text, binary; values: "42", 8-byte 7, NULL.
        let mut rest = vec![0, 2, 0, 0, 0, 1, 0, 3];
        rest.extend_from_slice(&2i32.to_be_bytes());
        rest.extend_from_slice(b"42");
        rest.extend_from_slice(&8i32.to_be_bytes());
        rest.extend_from_slice(&7i64.to_be_bytes());
        rest.extend_from_slice(&(-1i32).to_be_bytes());
        rest.extend_from_slice(&[0, 0]);
        assert_eq!(bind_param(&rest, 1), Some((false, Some(&b"42"[..]))));
        assert_eq!(bind_param(&rest, 2), Some((true, Some(&7i64.to_be_bytes()[..]))));
        assert_eq!(bind_param(&rest, 3), None, "two formats for three values is malformed");
        assert_eq!(bind_param(&rest, 0), None);
        assert_eq!(bind_param(&rest[..9], 2), None, "truncated");
        // One format for all.
        let mut one = vec![0, 1, 0, 1, 0, 1];
        one.extend_from_slice(&4i32.to_be_bytes());
        one.extend_from_slice(&9i32.to_be_bytes());
        assert_eq!(bind_param(&one, 1), Some((true, Some(&9i32.to_be_bytes()[..]))));
        assert_eq!(bind_param(&one, 2), None);
    }

    #[test]
    fn views_read_fields() {
        let p = parse_view(b"s1\0SELECT $1\0\0\x01\0\0\0\x17").unwrap();
        assert_eq!(p.name, b"s1");
        assert_eq!(p.query, b"SELECT $1");
        assert_eq!(p.param_types, b"\0\x01\0\0\0\x17");
        assert!(parse_view(b"s1\0SELECT").is_none());

        let b = bind_view(b"\0s1\0\0\0").unwrap();
        assert_eq!((b.portal, b.statement, b.rest), (&b""[..], &b"s1"[..], &b"\0\0"[..]));
        assert_eq!(target_view(b"Sabc\0"), Some((b'S', &b"abc"[..])));
        assert_eq!(target_view(b"Xabc\0"), None);
        assert_eq!(command_tag(b"SELECT 1\0"), b"SELECT 1");
        let e = error_fields(b"SERROR\0C42P01\0Mno table\0\0");
        assert_eq!(
            (e.severity.as_str(), e.code.as_str(), e.message.as_str()),
            ("ERROR", "42P01", "no table")
        );
    }
}
