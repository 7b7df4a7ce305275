//! The common extended-protocol request, handled in place: `[Parse] Bind [Describe]
//! Execute Sync` for one statement of the client's, whole in the read buffer at the
//! start of a transaction (pgbench, pgJDBC, asyncpg and psycopg send these all the
//! time). It is routed and copied to the server straight from the read buffer instead
//! of being split into messages that are held, looked at again and forwarded one by one
//! (see `extended`). Anything else takes that general path, which answers the same: a
//! statement pgtenant answers itself, a named Parse, a Close, a Flush, a request that
//! has not fully arrived, and every refusal that the general path words.

use std::sync::Arc;

use bytes::Buf;
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

impl Session {
    /// Whether the next request may be one `request_in_place` takes: a Parse or Bind
    /// that starts a transaction, with nothing held and nothing pgtenant answers itself
    /// under way.
    pub(super) fn may_take_in_place(&self) -> bool {
        matches!(self.client.rbuf.first(), Some(b'P' | b'B'))
            && self.batch.is_empty()
            && !self.skip_until_sync
            && !self.has_local_statements()
            && matches!(self.tx, ClientTx::Idle)
            && self.at_transaction_start()
    }

    /// Handles the request at the front of the client's read buffer if it is of the
    /// shape described in the module comment; `false` leaves it to the general path.
    /// Called where `may_take_in_place`.
    pub(super) async fn request_in_place(&mut self) -> Result<bool, FrontendError> {
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
            self.reply_error(&err, false);
            self.skip_until_sync = true;
            return Ok(true);
        }
        if lane_candidate {
            self.time_alone(&bound);
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
            self.unnamed = Some(bound.clone());
            let a = self.server.as_mut().ok_or_else(FrontendError::no_server)?;
            a.conn.io.wbuf.extend_from_slice(&self.client.rbuf[..parse.end]);
            a.conn.queue.push(Pending::client(Reply::Parse));
            a.open_request = true;
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
}
