//! Framing: a typed message is a tag byte, a 4-byte big-endian length that counts
//! itself, and a body. The startup phase uses untagged packets.

use bytes::{Buf, Bytes, BytesMut};

/// One complete message as it arrived: `raw` holds tag, length and body.
#[derive(Clone, Debug)]
pub struct Frame {
    pub tag: u8,
    pub raw: Bytes,
}

impl Frame {
    /// The message body, after tag and length.
    pub fn body(&self) -> &[u8] {
        &self.raw[5..]
    }

    /// The body as a zero-copy `Bytes`.
    pub fn body_bytes(&self) -> Bytes {
        self.raw.slice(5..)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("invalid message length {0}")]
    BadLength(i64),
    #[error("message of {0} bytes exceeds the limit of {1} bytes")]
    TooLarge(usize, usize),
}

/// Reads the header of the message at the front of `buf`: its tag and total length
/// (tag byte included). `Ok(None)` when the whole message is not buffered yet.
///
/// Never trusts a length beyond `max_len`: an oversized declaration is an error at once.
pub fn frame_header(buf: &[u8], max_len: usize) -> Result<Option<(u8, usize)>, FrameError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let len = i32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    if len < 4 {
        return Err(FrameError::BadLength(len as i64));
    }
    let total = len as usize + 1;
    if total > max_len {
        return Err(FrameError::TooLarge(total, max_len));
    }
    Ok((buf.len() >= total).then_some((buf[0], total)))
}

/// Splits one complete message off the front of `buf`.
///
/// Returns `Ok(None)` when more bytes are needed, reserving room for the rest of a
/// message whose header has arrived (bounded by `max_len`).
pub fn try_parse_frame(buf: &mut BytesMut, max_len: usize) -> Result<Option<Frame>, FrameError> {
    match frame_header(buf, max_len)? {
        Some((tag, total)) => Ok(Some(Frame { tag, raw: buf.split_to(total).freeze() })),
        None => {
            if buf.len() >= 5 {
                let total = i32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize + 1;
                buf.reserve(total - buf.len());
            }
            Ok(None)
        }
    }
}

/// The first packet of a connection.
#[derive(Debug, PartialEq, Eq)]
pub enum StartupPacket {
    /// Protocol 3.x startup with its minor version and key/value parameters, in order.
    Startup {
        minor: u16,
        params: Vec<(String, String)>,
    },
    SslRequest,
    GssEncRequest,
    CancelRequest {
        pid: u32,
        key: u32,
    },
    /// A protocol version pgtenant does not speak.
    Unsupported {
        version: u32,
    },
}

const SSL_REQUEST: u32 = 80877103;
const GSSENC_REQUEST: u32 = 80877104;
const CANCEL_REQUEST: u32 = 80877102;
#[cfg(test)]
const PROTOCOL_3: u32 = 196608;

/// Decodes the body of an untagged startup-phase packet (length already removed).
pub fn read_startup_frame(body: &[u8]) -> Result<StartupPacket, FrameError> {
    let mut b = body;
    if b.len() < 4 {
        return Err(FrameError::BadLength(body.len() as i64 + 4));
    }
    let code = b.get_u32();
    match code {
        SSL_REQUEST if b.is_empty() => Ok(StartupPacket::SslRequest),
        GSSENC_REQUEST if b.is_empty() => Ok(StartupPacket::GssEncRequest),
        CANCEL_REQUEST if b.len() == 8 => {
            let pid = b.get_u32();
            let key = b.get_u32();
            Ok(StartupPacket::CancelRequest { pid, key })
        }
        v if v >> 16 == 3 => {
            let mut params = Vec::new();
            let mut fields = b.split(|c| *c == 0);
            loop {
                let Some(name) = fields.next() else {
                    return Err(FrameError::BadLength(body.len() as i64 + 4));
                };
                if name.is_empty() {
                    break;
                }
                let Some(value) = fields.next() else {
                    return Err(FrameError::BadLength(body.len() as i64 + 4));
                };
                params.push((
                    String::from_utf8_lossy(name).into_owned(),
                    String::from_utf8_lossy(value).into_owned(),
                ));
            }
            Ok(StartupPacket::Startup { minor: (v & 0xffff) as u16, params })
        }
        SSL_REQUEST | GSSENC_REQUEST | CANCEL_REQUEST => Err(FrameError::BadLength(body.len() as i64 + 4)),
        version => Ok(StartupPacket::Unsupported { version }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_more_bytes_then_splits() {
        let mut buf = BytesMut::from(&b"Q\0\0\0\x09SEL"[..]);
        assert!(try_parse_frame(&mut buf, 1024).unwrap().is_none());
        buf.extend_from_slice(b"1\0Z");
        let f = try_parse_frame(&mut buf, 1024).unwrap().unwrap();
        assert_eq!(f.tag, b'Q');
        assert_eq!(f.body(), b"SEL1\0");
        assert_eq!(&buf[..], b"Z");
    }

    #[test]
    fn rejects_bad_and_oversized_lengths() {
        let mut buf = BytesMut::from(&b"Q\0\0\0\x02"[..]);
        assert_eq!(try_parse_frame(&mut buf, 1024).unwrap_err(), FrameError::BadLength(2));
        let mut buf = BytesMut::from(&b"Q\x7f\0\0\0"[..]);
        assert!(matches!(try_parse_frame(&mut buf, 1024), Err(FrameError::TooLarge(..))));
    }

    #[test]
    fn decodes_startup_packets() {
        let mut body = Vec::new();
        body.extend_from_slice(&PROTOCOL_3.to_be_bytes());
        body.extend_from_slice(b"user\0app\0database\0db\0\0");
        assert_eq!(
            read_startup_frame(&body).unwrap(),
            StartupPacket::Startup {
                minor: 0,
                params: vec![("user".into(), "app".into()), ("database".into(), "db".into())]
            }
        );
        assert_eq!(read_startup_frame(&SSL_REQUEST.to_be_bytes()).unwrap(), StartupPacket::SslRequest);
        let mut cancel = CANCEL_REQUEST.to_be_bytes().to_vec();
        cancel.extend_from_slice(&7u32.to_be_bytes());
        cancel.extend_from_slice(&9u32.to_be_bytes());
        assert_eq!(read_startup_frame(&cancel).unwrap(), StartupPacket::CancelRequest { pid: 7, key: 9 });
        // Truncated parameter list.
        let mut bad = PROTOCOL_3.to_be_bytes().to_vec();
        bad.extend_from_slice(b"user\0app");
        assert!(read_startup_frame(&bad).is_err());
    }
}
