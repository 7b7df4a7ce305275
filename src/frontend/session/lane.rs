//! Autocommit requests on a pipelined lane (see `backend::lane`): which requests may
//! share a server connection with other clients' at once, and handing one over and
//! relaying its answer. A request that may not, or that finds no lane, takes a
//! server of its own as usual.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};

use super::layout::{Layout, write_from_bind};
use super::server::inject_tenant_in_request;
use super::{ClientTx, HIGH_WATER, Session};
use crate::backend::{Answered, Lane, LaneJoin, LanePiece, LaneRoom, Pending, Reply, ServerConn};
use crate::config::PoolMode;
use crate::frontend::error::FrontendError;
use crate::observe::conns::ShownTenant;
use crate::protocol::{self, TxStatus};
use crate::router::{Analysis, Route, StatementKind};

/// A request as the client sent it, whole.
pub(super) enum LaneRequest<'a> {
    /// `[Parse] Bind [Describe] Execute Sync`, at the front of the read buffer; the Bind
    /// names `statement` (a client's name) when not the unnamed one.
    Extended { layout: &'a Layout, statement: Option<&'a [u8]> },
    /// A Query message.
    Query(&'a [u8]),
}

/// A statement whose request leaves nothing behind on the server connection once it
/// is answered: no transaction block, no setting, nothing that pins the connection.
fn leaves_no_state(analysis: &Analysis) -> bool {
    analysis.effects().shares_implicit_transaction()
        && !analysis.is_multi
        && matches!(analysis.kind, StatementKind::Other)
        && analysis.pin.is_none()
        && analysis.session_changes.is_empty()
        && !super::admission::is_refused(analysis)
        && analysis.prepared_view.is_empty()
}

impl Session {
    /// Whether this request is of the kind that may ride a lane: it leaves no state
    /// behind and can wait on no other session (`Analysis::cannot_wait`), the session
    /// holds no server and is outside any transaction. It rides one only once its
    /// shape has proved quick (`ShapeTiming::is_quick`), so that whoever waits behind it
    /// waits little; until then it runs alone and is timed.
    pub(super) fn lane_candidate(&self, analysis: &Analysis) -> bool {
        // The cheap tests first: a write (it may wait on a row lock) is told apart by
        // one flag before `leaves_no_state` looks at the rest of its analysis.
        self.shared.config.proxy.pipeline_depth > 1
            && analysis.effects().cannot_wait
            && self.pool_mode == PoolMode::Transaction
            && self.server.is_none()
            && matches!(self.tx, ClientTx::Idle)
            && self.batch.is_empty()
            && !self.skip_until_sync
            && leaves_no_state(analysis)
    }

    /// Times a candidate request that runs on the attached server: its shape's timing
    /// is updated when it is answered (see `on_ready`).
    pub(super) fn time_alone(&mut self, analysis: &Arc<Analysis>) {
        if let Some(a) = self.server.as_mut() {
            a.timing = Some((crate::observe::moment::now(), analysis.clone()));
        }
    }

    /// Sends the request on a lane of `route`'s shard and relays its answer; `false`
    /// when it must take the usual path (a server for itself is then attached when one
    /// was checked out here), also after a cancel meant for another client's request
    /// stopped it on the lane (`LanePiece::Stray`): the client's read buffer still holds
    /// it then. A checkout error is the caller's to answer.
    pub(super) async fn request_on_lane(
        &mut self,
        route: &mut Route,
        analysis: &Arc<Analysis>,
        request: LaneRequest<'_>,
    ) -> Result<bool, FrontendError> {
        if route.target != crate::router::NodeTarget::Primary {
            // Lanes run on primaries; a read for a replica takes the usual path there.
            // (The request was admitted on its route before it came here.)
            return Ok(false);
        }
        self.enter_transaction(route).await?;
        let pool = self.pool_of(route.shard).await?;
        let read_only = !route.state.allows_writes();
        let proxy = &self.shared.config.proxy;
        let join = LaneJoin {
            depth: proxy.pipeline_depth,
            window: Duration::from_micros(proxy.pipeline_join_window_us),
        };
        let version = self.settings.version;
        let (lane, new) = match pool.lane_with_room(version, read_only, join) {
            LaneRoom::Join(lane) => (lane, false),
            LaneRoom::Queue => return Ok(false),
            LaneRoom::Open => {
                let (pool, conn) = self.checkout_primary(route, self.wanted(route)).await?;
                if conn.settings.version != version
                    || !conn.read_only.holds(read_only)
                    || pool.only_checkout_with_room()
                    || !pool.lanes_take_riders()
                {
                    // It needs SETs first, it is alone on the node, or others wait for
                    // a connection (the lane would take no riders): the usual path
                    // sends the SETs, and serves a lone request for less.
                    self.attach(conn, route);
                    return Ok(false);
                }
                (Lane::new(conn), true)
            }
        };
        // Written and submitted in a block: the lane stays locked only for that.
        let mut consumed = 0;
        let submitted = {
            let Some(mut entry) = lane.enter() else { return Ok(false) };
            if let Some(server) = &entry.conn().listed {
                server.serve(&self.listed, route.tenant.as_ref().map(ShownTenant::from).as_ref());
            }
            let mut sets_tenant = None;
            if let Some(context) = crate::frontend::tenant_context(&self.shared.config)
                && !entry.holds_tenant(route.tenant.as_ref())
            {
                inject_tenant_in_request(entry.conn(), context, route.tenant.as_ref());
                sets_tenant = Some(route.tenant.clone());
            }
            let written = match request {
                LaneRequest::Extended { layout, statement } => {
                    let stmt = statement.and_then(|name| self.statements.get(name)).map(|s| s.stmt.clone());
                    let conn = entry.conn();
                    if let Some(stmt) = &stmt {
                        super::extended::prepare_on(conn, stmt);
                    }
                    if layout.parse.is_some() {
                        conn.queue.push(Pending::client(Reply::Parse));
                        self.unnamed = Some(analysis.clone());
                    }
                    let written = write_from_bind(conn, &self.client.rbuf, layout, 0, stmt);
                    if written.is_ok() {
                        // Taken from the read buffer once answered: it may run again.
                        consumed = layout.total;
                    } else {
                        // What went ahead of it is answered to nobody: the connection
                        // is closed once the lane ends.
                        conn.broken = true;
                    }
                    written
                }
                LaneRequest::Query(raw) => {
                    write_query(entry.conn(), raw);
                    Ok(())
                }
            };
            written.map(|()| entry.submit(self.cancel.slot(), sets_tenant))
        };
        // Started even without a request on it: its driver sends what was written
        // and gives the connection back, or closes it.
        if new {
            pool.start_lane(lane);
        }
        let mut answer = submitted?;
        // While it waits behind another client's request, a cancel ends it at once, as
        // PostgreSQL would end a statement it runs: dropping the answer of a read that
        // changes nothing is the same as stopping it. Once it runs, the server gets the
        // cancel (the lane gave its slot the connection's target).
        let queued = self.cancel.wait_in_proxy();
        let mut canceled = std::pin::pin!(queued.canceled());
        let mut bytes_out = 0;
        loop {
            let piece = tokio::select! {
                biased;
                piece = answer.recv() => piece,
                () = &mut canceled => return Err(FrontendError::CanceledQueued),
            };
            match piece {
                Some(LanePiece::Part(bytes)) => {
                    bytes_out += bytes.len() as u64;
                    self.client.wbuf.extend_from_slice(&bytes);
                    if self.client.wbuf.len() >= HIGH_WATER {
                        self.client.flush().await?;
                    }
                }
                Some(LanePiece::Done { rest, served_in, failed }) => {
                    self.client.wbuf.extend_from_slice(&rest);
                    analysis.shape().record(served_in, self.shared.config.proxy.pipeline_quick());
                    let request_us = served_in.as_micros().try_into().unwrap_or(u64::MAX);
                    let bytes_out = bytes_out + rest.len() as u64;
                    let answered = Answered { request_us, ended_transaction: true, bytes_out };
                    self.count_for_tenant(route, answered, failed);
                    break;
                }
                // Runs again on a server of its own, where no cancel but its client's
                // can reach it.
                Some(LanePiece::Stray) => return Ok(false),
                Some(LanePiece::Lost { partial, reason }) => {
                    self.client.wbuf.extend_from_slice(&partial);
                    self.lane_lost(route, reason);
                    break;
                }
                None => {
                    self.lane_lost(route, "the connection ended before its answer".into());
                    break;
                }
            }
        }
        self.client.rbuf.advance(consumed);
        self.listed_idle();
        Ok(true)
    }

    /// The lane's connection failed before the request was answered: as when a
    /// server of the client's own is lost, an error and ReadyForQuery.
    fn lane_lost(&mut self, route: &Route, reason: String) {
        tracing::warn!(shard = route.shard, %reason, "lost a server connection");
        let err = FrontendError::ServerLost { shard: route.shard, reason };
        let mut b = BytesMut::new();
        crate::frontend::error_response::write_error(&mut b, &err);
        protocol::ready_for_query(&mut b, TxStatus::Idle);
        self.client.wbuf.extend_from_slice(&b);
    }
}

fn write_query(conn: &mut ServerConn, raw: &[u8]) {
    conn.queue.push(Pending::client(Reply::Query));
    conn.io.wbuf.extend_from_slice(raw);
}
