//! The common extended-protocol request, handled in place: `[Parse] Bind [Describe]
//! Execute Sync` for one statement of the client's, whole in the read buffer (pgbench,
//! pgJDBC, asyncpg and psycopg send these all the time). At the start of a transaction
//! it is routed and copied to the server straight from the read buffer; inside one (a
//! transaction under way on the attached server) it is admitted as the transaction's
//! next statement and copied the same way. Either way it is not split into messages
//! that are held, looked at again and forwarded one by one (see `extended`). A plain
//! BEGIN at the start of a transaction is answered here and deferred, as a simple
//! query's is. Anything else takes that general path, which answers the same: a
//! statement pgtenant answers itself, a named Parse, a Close, a Flush, a request that
//! has not fully arrived, and every refusal that the general path words.

use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use futures_util::FutureExt;
use smallvec::SmallVec;

use super::admission::{Candidate, Stage};
use super::extended::{add_new, local_kind};
use super::lane::LaneRequest;
use super::layout::{Layout, body, layout, write_from_bind};
use super::{ClientTx, Session};
use crate::backend::{Pending, Reply};
use crate::frontend::error::FrontendError;
use crate::protocol;
use crate::router::{Analysis, StatementKind};

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

/// Which in-place path the request at the front of the read buffer may take.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum InPlace {
    /// It starts a transaction (or an autocommit request): routed, admitted at the
    /// Opening stage, a server attached (`request_in_place`).
    Opening,
    /// It joins the transaction under way on the attached server (or rides behind
    /// the previous request on it, as `next_request_must_wait` allows): admitted at the
    /// Joining stage and copied as it is (`join_in_place`).
    Joining,
}

/// The statement a request's Bind executes, for the in-place paths.
struct BoundInPlace {
    analysis: Arc<Analysis>,
    /// The client's name of a named statement, for the renamed Bind (inline: no
    /// allocation for the usual short names).
    statement: Option<SmallVec<[u8; 32]>>,
}

impl Session {
    /// The in-place path the next request may take, if any: a Parse or Bind with
    /// nothing held and nothing pgtenant answers itself under way, at the start of a
    /// transaction, or inside one whose messages go to the server as they are (as
    /// `forward_joining` takes them one by one).
    pub(super) fn in_place_path(&self) -> Option<InPlace> {
        if !matches!(self.client.rbuf.first(), Some(b'P' | b'B'))
            || !self.batch.is_empty()
            || self.skip_until_sync
            || self.has_local_statements()
            || !matches!(self.tx, ClientTx::Idle | ClientTx::DeferredBegin(_))
        {
            return None;
        }
        if self.at_transaction_start() {
            return Some(InPlace::Opening);
        }
        // What the general path does for such a request beyond forwarding it: wait for
        // the answers before it, end a COPY, carry settings a portal changes.
        let plain = self.server.as_ref().is_some_and(|a| !a.conn.queue.awaits_copy_data())
            && self.bound_changes.is_none()
            && self.request_changes == 0
            && !self.next_request_must_wait();
        plain.then_some(InPlace::Joining)
    }

    /// The statement the request laid out in `layout` executes, unless the general path
    /// must take the request: a named Parse, a statement not known, a long text not
    /// analyzed yet, a statement that path answers or follows (`needs_general_path`).
    fn bound_in_place(&mut self, layout: &Layout) -> Option<BoundInPlace> {
        let rbuf = &self.client.rbuf;
        let b = protocol::bind_view(body(rbuf, &layout.bind))?;
        let analysis = match &layout.parse {
            Some(parse) => {
                let p = protocol::parse_view(body(rbuf, parse))?;
                if !p.name.is_empty() || !b.statement.is_empty() {
                    return None;
                }
                if p.query.len() >= super::long_statement::OFF_RUNTIME_BYTES && !self.recent.holds(p.query) {
                    // Analyzed off the workers on the general path first.
                    return None;
                }
                self.recent.get_or_analyze(&self.shared.router, p.query)
            }
            None if b.statement.is_empty() => self.unnamed.clone()?,
            None => self.statements.get(b.statement)?.analysis.clone(),
        };
        if needs_general_path(&analysis) {
            return None;
        }
        let statement = (!b.statement.is_empty()).then(|| SmallVec::from_slice(b.statement));
        Some(BoundInPlace { analysis, statement })
    }

    /// Handles the request at the front of the client's read buffer if it is of the
    /// shape described in the module comment; `false` leaves it to the general path.
    /// Called where `in_place_path` is `Opening`.
    pub(super) async fn request_in_place(&mut self) -> Result<bool, FrontendError> {
        let Some(layout) = layout(&self.client.rbuf, self.max_message) else { return Ok(false) };
        let Some(BoundInPlace { analysis: bound, statement }) = self.bound_in_place(&layout) else {
            return Ok(false);
        };
        // Not for a Bind of the unnamed statement without its Parse: the server would
        // not have it when the BEGIN goes out.
        if (layout.parse.is_some() || statement.is_some()) && self.defers_begin(&bound) {
            self.answer_deferred_begin(layout, bound);
            return Ok(true);
        }
        let router = &self.shared.router;
        let rbuf = &self.client.rbuf;
        let Some(b) = protocol::bind_view(body(rbuf, &layout.bind)) else { return Ok(false) };
        let mut named = SmallVec::<[_; 2]>::new();
        if layout.parse.is_some() {
            add_new(&mut named, router.named_in_text(&bound));
        }
        add_new(&mut named, router.named_in_bind(&bound, b.rest));

        let lane_candidate = self.lane_candidate(&bound);
        let reach = self.reach();
        let route = router
            .route(self.tenant.as_ref(), &named, std::slice::from_ref(&bound), &mut self.placement, reach)
            .await;
        let route = match route {
            Ok(route) => {
                let opening = Stage::Opening { route: &route, after_unknown_code: false };
                self.admit(Candidate::bound(&bound, b.rest), opening).await.map(|()| route)
            }
            Err(err) => Err(err.into()),
        };
        let routed = match route {
            Ok(mut route) if lane_candidate && bound.shape().is_quick() => {
                let request = LaneRequest::Extended { layout: &layout, statement: statement.as_deref() };
                match self.request_on_lane(&mut route, &bound, request).await {
                    Ok(true) => return Ok(true),
                    Ok(false) => self.begin_on(route, bound.effects().shares_implicit_transaction()).await,
                    Err(err) => Err(err),
                }
            }
            Ok(route) => self.begin_on(route, bound.effects().shares_implicit_transaction()).await,
            Err(err) => Err(err),
        };
        if let Err(err) = routed {
            // As the general path does: the error, then its messages are skipped up to
            // the Sync, which gets its ReadyForQuery.
            self.fail_until_sync(&err);
            return Ok(true);
        }
        if lane_candidate {
            self.time_alone(&bound);
        }
        self.note_session_risk(Some(&bound));
        self.forward_in_place(layout, bound, statement.as_deref())?;
        Ok(true)
    }

    /// Handles the request at the front of the client's read buffer, inside the
    /// transaction under way, if it is of the module comment's shape: its Bind admitted
    /// at the Joining stage as `forward_joining` admits one, then copied as it is,
    /// without splitting it into messages. `false` leaves it to the general path, also
    /// when the admission must wait (a tenant's placement to look up: rare, and the
    /// general path waits for it). Called where `in_place_path` is `Joining`; nothing
    /// here waits, so no future is built for it.
    pub(super) fn join_in_place(&mut self) -> Result<bool, FrontendError> {
        let Some(layout) = layout(&self.client.rbuf, self.max_message) else { return Ok(false) };
        let Some(BoundInPlace { analysis: bound, statement }) = self.bound_in_place(&layout) else {
            return Ok(false);
        };
        let Some(b) = protocol::bind_view(body(&self.client.rbuf, &layout.bind)) else { return Ok(false) };
        let admitted = self.admit_joining_bind(&bound, b.rest).now_or_never();
        match admitted {
            None => return Ok(false),
            Some(Ok(())) => {}
            Some(Err(err)) => {
                // As the general path: the Parse went to the server before the Bind was
                // refused; the rest is skipped up to the Sync, which the server answers.
                if let Some(parse) = &layout.parse {
                    self.forward_parse_in_place(parse.end, &bound)?;
                }
                self.fail_until_sync(&err);
                self.client.rbuf.advance(layout.bind.end);
                return Ok(true);
            }
        }
        self.note_session_risk(Some(&bound));
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
            self.forward_parse_in_place(parse.end, &bound)?;
            copied = parse.end;
        }
        let server_statement = statement.and_then(|name| self.server_statement(name));
        let a = self.server.as_mut().ok_or_else(FrontendError::no_server)?;
        if let Some(pin) = bound.pin {
            a.pin.get_or_insert(pin);
        }
        write_from_bind(&mut a.conn, &self.client.rbuf, &layout, copied, server_statement)?;
        a.open_request = false;
        a.conn.queue.drain_synthetic(&mut self.client.wbuf);
        self.client.rbuf.advance(layout.total);
        Ok(())
    }

    /// Answers a deferred BEGIN's request (see `defers_begin`) as a server would, the
    /// transaction open: it goes out with the transaction's first statement, one round
    /// trip to the server less.
    fn answer_deferred_begin(&mut self, layout: Layout, bound: Arc<Analysis>) {
        let mut reply = BytesMut::new();
        if layout.parse.is_some() {
            protocol::parse_complete(&mut reply);
        }
        protocol::bind_complete(&mut reply);
        if layout.has_describe() {
            if layout.describes_statement {
                protocol::parameter_description(&mut reply, &[]);
            }
            protocol::put_message(&mut reply, b'n', |_| {});
        }
        protocol::command_complete(&mut reply, "BEGIN");
        self.tx = ClientTx::DeferredBegin(Bytes::copy_from_slice(bound.text().as_bytes()));
        protocol::ready_for_query(&mut reply, self.client_status());
        if layout.parse.is_some() {
            self.unnamed = Some(bound);
        }
        self.client.rbuf.advance(layout.total);
        self.reply(reply);
    }

    /// Copies the request's unnamed Parse (the read buffer up to `end`) to the attached
    /// server; `analysis` is what it parses.
    fn forward_parse_in_place(&mut self, end: usize, analysis: &Arc<Analysis>) -> Result<(), FrontendError> {
        self.unnamed = Some(analysis.clone());
        let a = self.server.as_mut().ok_or_else(FrontendError::no_server)?;
        a.conn.io.wbuf.extend_from_slice(&self.client.rbuf[..end]);
        a.conn.queue.push(Pending::client(Reply::Parse));
        a.open_request = true;
        Ok(())
    }
}
