//! Builders for the messages pgtenant writes itself. Each appends one complete
//! message to a `BytesMut`.

use bytes::{BufMut, BytesMut};

use super::TxStatus;

/// Appends a message with `tag`, letting `body` write the payload, and fixes up the length.
pub fn put_message(buf: &mut BytesMut, tag: u8, body: impl FnOnce(&mut BytesMut)) {
    buf.put_u8(tag);
    let at = buf.len();
    buf.put_i32(0);
    body(buf);
    let len = (buf.len() - at) as i32;
    buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

fn put_cstr(buf: &mut BytesMut, s: &[u8]) {
    buf.put_slice(s);
    buf.put_u8(0);
}

/// Severity of an error pgtenant raises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Warning,
    Error,
    Fatal,
}

impl Severity {
    fn as_str(self) -> &'static str {
        match self {
            Self::Warning => "WARNING",
            Self::Error => "ERROR",
            Self::Fatal => "FATAL",
        }
    }
}

/// ErrorResponse (B).
pub fn error_response(buf: &mut BytesMut, severity: Severity, code: &str, message: &str) {
    put_fields(buf, b'E', severity, code, message);
}

/// NoticeResponse (B).
pub fn notice_response(buf: &mut BytesMut, severity: Severity, code: &str, message: &str) {
    put_fields(buf, b'N', severity, code, message);
}

fn put_fields(buf: &mut BytesMut, tag: u8, severity: Severity, code: &str, message: &str) {
    put_message(buf, tag, |b| {
        b.put_u8(b'S');
        put_cstr(b, severity.as_str().as_bytes());
        b.put_u8(b'V');
        put_cstr(b, severity.as_str().as_bytes());
        b.put_u8(b'C');
        put_cstr(b, code.as_bytes());
        b.put_u8(b'M');
        put_cstr(b, message.as_bytes());
        b.put_u8(0);
    });
}

/// ReadyForQuery (B).
pub fn ready_for_query(buf: &mut BytesMut, status: TxStatus) {
    put_message(buf, b'Z', |b| b.put_u8(status.as_byte()));
}

/// CommandComplete (B).
pub fn command_complete(buf: &mut BytesMut, tag: &str) {
    put_message(buf, b'C', |b| put_cstr(b, tag.as_bytes()));
}

/// ParameterStatus (B).
pub fn parameter_status_msg(buf: &mut BytesMut, name: &str, value: &str) {
    put_message(buf, b'S', |b| {
        put_cstr(b, name.as_bytes());
        put_cstr(b, value.as_bytes());
    });
}

/// BackendKeyData (B).
pub fn backend_key_data(buf: &mut BytesMut, pid: u32, key: u32) {
    put_message(buf, b'K', |b| {
        b.put_u32(pid);
        b.put_u32(key);
    });
}

/// Authentication request (B): `code` 0 ok, 3 cleartext, 5 md5 (with salt), 10 SASL,
/// 11 SASL continue, 12 SASL final; `data` follows the code.
pub fn authentication(buf: &mut BytesMut, code: i32, data: &[u8]) {
    put_message(buf, b'R', |b| {
        b.put_i32(code);
        b.put_slice(data);
    });
}

/// DataRow (D) of text values.
pub fn text_data_row(buf: &mut BytesMut, values: &[&str]) {
    put_message(buf, b'D', |b| {
        b.extend_from_slice(&(values.len() as i16).to_be_bytes());
        for value in values {
            b.extend_from_slice(&(value.len() as i32).to_be_bytes());
            b.extend_from_slice(value.as_bytes());
        }
    });
}

/// BindComplete (B).
pub fn bind_complete(buf: &mut BytesMut) {
    put_message(buf, b'2', |_| {});
}

/// ParseComplete (B).
pub fn parse_complete(buf: &mut BytesMut) {
    put_message(buf, b'1', |_| {});
}

/// CloseComplete (B).
pub fn close_complete(buf: &mut BytesMut) {
    put_message(buf, b'3', |_| {});
}

/// Query (F).
pub fn query(buf: &mut BytesMut, sql: &str) {
    put_message(buf, b'Q', |b| put_cstr(b, sql.as_bytes()));
}

/// Parse (F) with a raw parameter-type section copied from the client's Parse.
pub fn parse(buf: &mut BytesMut, name: &[u8], query: &[u8], param_types: &[u8]) {
    put_message(buf, b'P', |b| {
        put_cstr(b, name);
        put_cstr(b, query);
        b.put_slice(param_types);
    });
}

/// Bind (F) rebuilt with another statement name, the rest copied.
pub fn bind_renamed(buf: &mut BytesMut, portal: &[u8], statement: &[u8], rest: &[u8]) {
    put_message(buf, b'B', |b| {
        put_cstr(b, portal);
        put_cstr(b, statement);
        b.put_slice(rest);
    });
}

/// Bind (F) of `statement` to the unnamed portal, with text parameters and text results.
pub fn bind_text(buf: &mut BytesMut, statement: &[u8], params: &[&[u8]]) {
    put_message(buf, b'B', |b| {
        put_cstr(b, b"");
        put_cstr(b, statement);
        b.put_i16(0); // every parameter in text
        b.put_i16(params.len() as i16);
        for p in params {
            b.put_i32(p.len() as i32);
            b.put_slice(p);
        }
        b.put_i16(0); // every result column in text
    });
}

/// Execute (F) of the unnamed portal, all rows.
pub fn execute(buf: &mut BytesMut) {
    put_message(buf, b'E', |b| {
        put_cstr(b, b"");
        b.put_i32(0);
    });
}

/// Sync (F).
pub fn sync(buf: &mut BytesMut) {
    put_message(buf, b'S', |_| {});
}

/// Describe (F) of a statement under another name.
pub fn describe_statement(buf: &mut BytesMut, statement: &[u8]) {
    put_message(buf, b'D', |b| {
        b.put_u8(b'S');
        put_cstr(b, statement);
    });
}

/// Close (F) of a named prepared statement.
pub fn close_statement(buf: &mut BytesMut, statement: &[u8]) {
    put_message(buf, b'C', |b| {
        b.put_u8(b'S');
        put_cstr(b, statement);
    });
}

/// Terminate (F).
pub fn terminate(buf: &mut BytesMut) {
    put_message(buf, b'X', |_| {});
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{error_fields, try_parse_frame};

    #[test]
    fn error_response_round_trips() {
        let mut buf = BytesMut::new();
        error_response(&mut buf, Severity::Error, "42501", "tenant 7 refused");
        let f = try_parse_frame(&mut buf, 1 << 20).unwrap().unwrap();
        assert_eq!(f.tag, b'E');
        let e = error_fields(f.body());
        assert_eq!((e.severity.as_str(), e.code.as_str()), ("ERROR", "42501"));
        assert_eq!(e.message, "tenant 7 refused");
        assert!(buf.is_empty());
    }

    #[test]
    fn ready_for_query_is_six_bytes() {
        let mut buf = BytesMut::new();
        ready_for_query(&mut buf, TxStatus::InTransaction);
        assert_eq!(&buf[..], b"Z\0\0\0\x05T");
    }
}
