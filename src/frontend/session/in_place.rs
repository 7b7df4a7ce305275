//! The common extended-protocol request, handled in place: `[Parse] Bind [Describe]
//! Execute Sync` for one statement of the client's, whole in the read buffer at the
//! start of a transaction (pgbench, pgJDBC, asyncpg and psycopg send these all the
//! time). It is routed and copied to the server straight from the read buffer instead
//! of being split into messages that are held, looked at again and forwarded one by one
//! (see `extended`). Anything else takes that general path, which answers the same: a
//! statement pgtenant answers itself, a named Parse, a Close, a Flush, a request that
//! has not fully arrived, and every refusal that the general path words.

use std::ops::Range;
use std::sync::Arc;

use bytes::Buf;
use smallvec::SmallVec;

use super::extended::{add_new, local_kind, malformed, no_server};
use super::lane::LaneRequest;
use super::{ClientTx, Session};
use crate::backend::{Pending, PreparedStatement, Reply, ServerConn};
use crate::frontend::error::FrontendError;
use crate::protocol;
use crate::router::{Analysis, StatementKind};

/// Where the messages of such a request lie in the read buffer (whole messages, tag
/// and length included).
pub(super) struct Layout {
    pub(super) parse: Option<Range<usize>>,
    bind: Range<usize>,
    /// Describe and Execute, then Sync at `total`'s end: copied as they are.
    pub(super) total: usize,
    /// The Reply of each message after the Bind, in order.
    after_bind: SmallVec<[Reply; 3]>,
}

/// The layout of the request at the front of `buf`, when it is of the handled shape.
fn layout(buf: &[u8], max_message: usize) -> Option<Layout> {
    let mut at = 0;
    let mut parse = None;
    let mut bind = None;
    let mut after_bind = SmallVec::new();
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
                after_bind.push(Reply::Describe)
            }
            (b'E', true) if !after_bind.contains(&Reply::Execute) => after_bind.push(Reply::Execute),
            (b'S', true) if after_bind.last() == Some(&Reply::Execute) => {
                after_bind.push(Reply::Sync);
                return Some(Layout { parse, bind: bind?, total: at, after_bind });
            }
            _ => return None,
        }
    }
}

fn body<'a>(buf: &'a [u8], message: &Range<usize>) -> &'a [u8] {
    &buf[message.start + 5..message.end]
}

/// A statement the general path would answer or refuse itself (a DEALLOCATE may be
/// one, a `set_config` whose name its Bind gives), or one that changes session
/// settings, which the general path follows.
fn needs_general_path(analysis: &Analysis) -> bool {
    super::admission::is_refused(analysis)
        || !analysis.set_config_name_params.is_empty()
        || !analysis.prepared_view.is_empty()
        || local_kind(analysis).is_some()
        || !analysis.session_changes.is_empty()
        || matches!(analysis.kind, StatementKind::Deallocate(_))
}

impl Session {
    /// Handles the request at the front of the client's read buffer if it is of the
    /// shape described in the module comment; `false` leaves it to the general path.
    pub(super) async fn request_in_place(&mut self) -> Result<bool, FrontendError> {
        if !self.batch.is_empty()
            || self.skip_until_sync
            || self.has_local_statements()
            || !matches!(self.tx, ClientTx::Idle)
            || !self.at_transaction_start()
        {
            return Ok(false);
        }
        let Some(layout) = layout(&self.client.rbuf, self.max_message) else { return Ok(false) };
        let router = &self.shared.router;
        let rbuf = &self.client.rbuf;
        let Some(b) = protocol::bind_view(body(rbuf, &layout.bind)) else { return Ok(false) };
        let mut named = SmallVec::<[_; 2]>::new();
        let bound = match &layout.parse {
            Some(parse) => {
                let Some(p) = protocol::parse_view(body(rbuf, parse)) else { return Ok(false) };
                if !p.name.is_empty() || !b.statement.is_empty() {
                    return Ok(false);
                }
                if p.query.len() >= super::long_statement::OFF_RUNTIME_BYTES && !self.recent.holds(p.query) {
                    // Analyzed off the workers on the general path first.
                    return Ok(false);
                }
                let analysis = self.recent.get_or_analyze(router, p.query);
                add_new(&mut named, router.named_in_text(&analysis));
                analysis
            }
            None => {
                let analysis = if b.statement.is_empty() {
                    self.unnamed.clone()
                } else {
                    self.statements.get(b.statement).map(|s| s.analysis.clone())
                };
                let Some(analysis) = analysis else { return Ok(false) };
                analysis
            }
        };
        if needs_general_path(&bound) {
            return Ok(false);
        }
        add_new(&mut named, router.named_in_bind(&bound, b.rest));
        // The client's name of a named statement, for the renamed Bind (inline: no
        // allocation for the usual short names).
        let statement = (!b.statement.is_empty()).then(|| SmallVec::<[u8; 32]>::from_slice(b.statement));

        let lane_candidate = self.lane_candidate(&bound);
        let route = router
            .route(self.tenant.as_ref(), &named, std::slice::from_ref(&bound), &mut self.placement)
            .await;
        let route = match route {
            Ok(mut route) => {
                self.aim(&mut route, std::slice::from_ref(&bound));
                self.check_strict(route.shard, &bound, Some(b.rest)).await.map(|()| route)
            }
            Err(err) => Err(err.into()),
        };
        let routed = match route {
            Ok(mut route) if lane_candidate && bound.shape().is_quick() => {
                let request = LaneRequest::Extended { layout: &layout, statement: statement.as_deref() };
                match self.request_on_lane(&mut route, &bound, request).await {
                    Ok(true) => return Ok(true),
                    Ok(false) => self.begin_on(route, bound.single_dml).await,
                    Err(err) => Err(err),
                }
            }
            Ok(route) => self.begin_on(route, bound.single_dml).await,
            Err(err) => Err(err),
        };
        if let Err(err) = routed {
            // As the general path does: the error, then its messages are skipped up to
            // the Sync, which gets its ReadyForQuery.
            self.reply_error(&err, false);
            self.skip_until_sync = true;
            return Ok(true);
        }
        if lane_candidate {
            self.time_alone(&bound);
        }
        self.note_session_risk(bound.session_risk());
        self.forward_in_place(layout, bound, statement.as_deref())?;
        Ok(true)
    }

    /// Copies a routed request to the attached server and queues what it answers.
    fn forward_in_place(
        &mut self,
        layout: Layout,
        bound: Arc<Analysis>,
        statement: Option<&[u8]>,
    ) -> Result<(), FrontendError> {
        let mut copied = 0;
        if let Some(parse) = &layout.parse {
            self.unnamed = Some(bound.clone());
            let a = self.server.as_mut().ok_or_else(no_server)?;
            a.conn.io.wbuf.extend_from_slice(&self.client.rbuf[..parse.end]);
            a.conn.queue.push(Pending::client(Reply::Parse));
            a.open_request = true;
            copied = parse.end;
        }
        if let Err(err) = self.check_writable(&bound, None) {
            // As the general path does: the Parse went, the rest is skipped up to the Sync.
            self.reply_error(&err, false);
            self.skip_until_sync = true;
            self.client.rbuf.advance(copied);
            return Ok(());
        }
        let server_statement = statement.and_then(|name| self.server_statement(name));
        let a = self.server.as_mut().ok_or_else(no_server)?;
        if let Some(pin) = bound.pin {
            a.pin.get_or_insert(pin);
        }
        write_from_bind(&mut a.conn, &self.client.rbuf, &layout, copied, server_statement)?;
        a.open_request = false;
        a.conn.queue.drain_synthetic(&mut self.client.wbuf);
        self.client.rbuf.advance(layout.total);
        Ok(())
    }
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
            let b = protocol::bind_view(body(rbuf, &layout.bind)).ok_or_else(|| malformed("Bind"))?;
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
        assert!(layout(&buf, 1 << 20).is_some());
    }
}
