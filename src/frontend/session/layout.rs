//! The common extended-protocol request (`[Parse] Bind [Describe] Execute Sync` of one
//! statement) whole in the client's read buffer: where its messages lie, and how its
//! Bind and what follows are written to a server. The in-place path and lanes both
//! copy such requests straight from the buffer.

use std::ops::Range;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::backend::{Pending, PreparedStatement, Reply, ServerConn};
use crate::frontend::error::FrontendError;
use crate::protocol;

/// Where the messages of such a request lie in the read buffer (whole messages, tag
/// and length included).
pub(super) struct Layout {
    pub(super) parse: Option<Range<usize>>,
    pub(super) bind: Range<usize>,
    /// Describe and Execute, then Sync at `total`'s end: copied as they are.
    pub(super) total: usize,
    /// The Reply of each message after the Bind, in order.
    after_bind: SmallVec<[Reply; 3]>,
    /// The Describe (if any) is of the unnamed statement, not of the portal.
    pub(super) describes_statement: bool,
}

impl Layout {
    /// Whether the request describes its statement or portal.
    pub(super) fn has_describe(&self) -> bool {
        self.after_bind.first() == Some(&Reply::Describe)
    }
}

/// The layout of the request at the front of `buf`, when it is of the handled shape.
pub(super) fn layout(buf: &[u8], max_message: usize) -> Option<Layout> {
    let mut at = 0;
    let mut parse = None;
    let mut bind = None;
    let mut after_bind = SmallVec::new();
    let mut describes_statement = false;
    loop {
        let (tag, len) = protocol::frame_header(buf.get(at..)?, max_message).ok()??;
        let range = at..at + len;
        at += len;
        match (tag, bind.is_some()) {
            (b'P', false) if parse.is_none() => parse = Some(range),
            (b'B', false) => bind = Some(range),
            // Of the portal, or of the unnamed statement: a named one would be renamed.
            (b'D', true)
                if after_bind.is_empty()
                    && matches!(&buf[range.start + 5..range.end], [b'P', ..] | b"S\0") =>
            {
                describes_statement = buf[range.start + 5] == b'S';
                after_bind.push(Reply::Describe)
            }
            (b'E', true) if !after_bind.contains(&Reply::Execute) => after_bind.push(Reply::Execute),
            (b'S', true) if after_bind.last() == Some(&Reply::Execute) => {
                after_bind.push(Reply::Sync);
                return Some(Layout { parse, bind: bind?, total: at, after_bind, describes_statement });
            }
            _ => return None,
        }
    }
}

pub(super) fn body<'a>(buf: &'a [u8], message: &Range<usize>) -> &'a [u8] {
    &buf[message.start + 5..message.end]
}

/// Writes the request from its Bind on (from `from` when that is before it: the
/// Parse too) to `conn`, its Bind renamed to `server_statement` when it binds a named
/// statement, and queues what each message answers.
pub(super) fn write_from_bind(
    conn: &mut ServerConn,
    rbuf: &[u8],
    layout: &Layout,
    from: usize,
    server_statement: Option<Arc<PreparedStatement>>,
) -> Result<(), FrontendError> {
    match &server_statement {
        Some(stmt) => {
            let b = protocol::bind_view(body(rbuf, &layout.bind))
                .ok_or_else(|| FrontendError::malformed("Bind"))?;
            protocol::bind_renamed(&mut conn.io.wbuf, b.portal, &stmt.server_name, b.rest);
            conn.io.wbuf.extend_from_slice(&rbuf[layout.bind.end..layout.total]);
        }
        None => conn.io.wbuf.extend_from_slice(&rbuf[from..layout.total]),
    }
    conn.queue.push(Pending::Client { reply: Reply::Bind, statement: server_statement, changes: 0 });
    for reply in &layout.after_bind {
        conn.queue.push(Pending::client(*reply));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    fn message(out: &mut BytesMut, tag: u8, body: &[u8]) {
        protocol::put_message(out, tag, |b| b.extend_from_slice(body));
    }

    fn request(tags: &[u8]) -> BytesMut {
        let mut out = BytesMut::new();
        for &tag in tags {
            match tag {
                b'P' => message(&mut out, tag, b"\0select 1\0\0\0"),
                b'B' => message(&mut out, tag, b"\0\0\0\0\0\0\0\0"),
                b'D' => message(&mut out, tag, b"P\0"),
                b'E' => message(&mut out, tag, b"\0\0\0\0\0"),
                _ => message(&mut out, tag, b""),
            }
        }
        out
    }

    #[test]
    fn only_one_statement_executed_once_and_synced_is_handled() {
        for tags in [&b"PBDES"[..], b"PBES", b"BDES", b"BES"] {
            let buf = request(tags);
            let l = layout(&buf, 1 << 20).unwrap_or_else(|| panic!("{}", String::from_utf8_lossy(tags)));
            assert_eq!(l.total, buf.len());
            assert!(!l.describes_statement, "the portal's");
            assert_eq!(l.parse.is_some(), tags[0] == b'P');
            assert_eq!(l.after_bind.last(), Some(&Reply::Sync));
        }
        for tags in [
            &b"PBDE"[..], // no Sync yet
            b"PBDEH",     // Flush
            b"PS",        // nothing executed
            b"PBDEBES",   // two statements
            b"PPBES",
            b"BDDES",
            b"BEES",
            b"BDS",
            b"CBES",
            b"QBES",
        ] {
            assert!(layout(&request(tags), 1 << 20).is_none(), "{}", String::from_utf8_lossy(tags));
        }
        // Cut anywhere before its last byte, the request is not handled yet.
        let buf = request(b"PBDES");
        for cut in 0..buf.len() {
            assert!(layout(&buf[..cut], 1 << 20).is_none(), "cut at {cut}");
        }
        // A message over the size limit is left to the general path, which refuses it.
        assert!(layout(&buf, 8).is_none());
        // A Describe of a named statement is renamed by the general path.
        let mut buf = request(b"PB");
        message(&mut buf, b'D', b"Sname\0");
        buf.extend_from_slice(&request(b"ES"));
        assert!(layout(&buf, 1 << 20).is_none());
        let mut buf = request(b"PB");
        message(&mut buf, b'D', b"S\0");
        buf.extend_from_slice(&request(b"ES"));
        assert!(layout(&buf, 1 << 20).is_some_and(|l| l.describes_statement));
    }
}
