//! `Session`: one authenticated client. `run` is the one loop: it selects on the
//! client socket, the attached server socket, shutdown and the soonest timeout
//! (`deadline`), and each event is handled by a named step (`on_query`, `on_extended`,
//! `on_server_bytes`, ...). What a statement may do is decided by the admission step
//! (`admission`); what each request cost its tenant is told to the per-tenant
//! statistics (`tenant_figures`).
//!
//! Invariants:
//! - a server is attached only for a transaction (transaction pooling), or for the
//!   whole session (session pooling, or once something pins it);
//! - everything owed to the client by the attached server is in its `ResponseQueue`;
//!   pgtenant's own replies go through that queue whenever it is not empty, so the
//!   client sees them in order.

mod admission;
mod checkout;
mod client_watch;
mod deadline;
mod deallocate;
mod extended;
mod failed_tx;
mod held;
mod in_place;
mod lane;
mod layout;
mod long_statement;
mod named;
mod prepared_view;
mod proxy_call;
mod scatter;
mod server;
mod simple;
mod tenant_figures;

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::sync::watch;
use tokio::time::Sleep;

use super::Shared;
use super::cancel::CancelKey;
use super::error::FrontendError;
use super::error_response::write_error;
use super::write_hooks::HooksMemo;
use crate::backend::{Pending, PooledConn, PreparedStatement, ReadOnlyGuc, ServerPool, Settings};
use crate::config::{PoolMode, UserConfig};
use crate::directory::{ShardId, TenantId, Topology};
use crate::net::{Duplex, IoEvent};
use crate::observe::conns::{ConnHandle, ConnState, ShownTenant};
use crate::protocol::{self, Frame, TxStatus};
use crate::router::{Analysis, PinReason, PlacementMemo, RecentAnalyses, Route, SessionChange, TargetMode};
use deadline::{Clocks, Deadline, Timeout};
use in_place::InPlace;
use named::NamedStatements;

/// Maps keyed by what a client names (statements, portals): looked up on every Bind,
/// so a fast hasher (seeded per process) instead of SipHash.
type FastMap<K, V> = foldhash::HashMap<K, V>;

/// Stop reading from one side while this much is waiting to be written to the other.
const HIGH_WATER: usize = 1 << 20;

/// The client's transaction, as far as pgtenant answers for it without a server.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ClientTx {
    /// Nothing pending here; an attached server's status is the truth.
    Idle,
    /// BEGIN was answered by pgtenant and is sent once the shard is known.
    DeferredBegin(Bytes),
    /// The transaction failed in pgtenant (the client cancelled its own statement,
    /// and the server's transaction was rolled back): only ROLLBACK/COMMIT end it.
    Failed,
}

/// A named prepared statement of this client.
struct ClientStatement {
    stmt: Arc<PreparedStatement>,
    analysis: Arc<Analysis>,
}

/// A portal whose statement changes session settings (see `Session::bound_changes`).
struct BoundChanges {
    portal: Bytes,
    /// With the values of parameters filled in.
    changes: Vec<SessionChange>,
    /// DISCARD ALL / DEALLOCATE ALL: prepared statements go with it.
    discards_statements: bool,
}

/// The server working for this client.
struct Attached {
    conn: PooledConn,
    route: Route,
    pin: Option<PinReason>,
    /// An ErrorResponse was relayed since the last ReadyForQuery.
    request_failed: bool,
    /// A COMMIT completed in the current transaction.
    saw_commit: bool,
    /// Extended-protocol messages were sent without their Sync yet.
    open_request: bool,
    /// The tenant GUC was set inside the client's request (see `begin_on`): it holds
    /// only if that request commits without an error.
    tenant_in_request: bool,
    /// What the connection held before pgtenant last sent it the client's settings: it
    /// holds that again if the server refuses them (`Effects::settings_failed`).
    settings_before: Option<Arc<Settings>>,
    /// A lane candidate's request runs here, written then (see `Session::time_alone`).
    timing: Option<(std::time::Instant, Arc<Analysis>)>,
    /// The client's deferred BEGIN went out here, and no ReadyForQuery has ended the
    /// transaction block since (before the first one, the server's status says nothing
    /// of it yet).
    block_begun: bool,
    /// A statement that may run code pgtenant cannot follow went out in the request
    /// under way (see `admission::Stage::Opening`).
    unknown_code_in_request: bool,
    /// DDL went out here since the transaction began: when it ends, what the shard's
    /// catalog says of write hooks is read again (see `frontend::write_hooks`).
    ddl_in_transaction: bool,
}

pub struct Session {
    client: Duplex,
    shared: Arc<Shared>,
    user: Arc<UserConfig>,
    database: String,
    pool_mode: PoolMode,
    startup_tenant: Option<TenantId>,
    tenant: Option<TenantId>,
    /// Where provably read-only requests may go (`pgtenant.target`): as set in the
    /// session, else as at login.
    target: TargetMode,
    /// Read-your-writes: when this session's last transaction that may have written
    /// ended on a primary (`coarse_clock::now_ms`); its reads then go only to replicas
    /// that replayed what the primary had committed by then.
    wrote_ms: Option<u64>,
    /// A statement that may have written (`Effects::may_have_written`) was admitted
    /// since the last transaction ended (`Session::admit`): its end is a write's.
    may_have_written: std::sync::atomic::AtomicBool,
    /// Under `read_your_writes = "user"`: the mark every session of this login shares.
    login_writes: Option<Arc<std::sync::atomic::AtomicU64>>,
    login_target: TargetMode,
    /// This client's line in the admin console's `SHOW CLIENTS`.
    listed: ConnHandle,
    /// The session tenant before a SET of it at the start of the open transaction,
    /// restored if the transaction does not commit (as a server undoes a SET).
    tenant_before_tx: Option<Option<TenantId>>,
    startup_settings: Arc<Settings>,
    settings: Arc<Settings>,
    statements: NamedStatements,
    /// The last "no write hooks" answer for its shard (see `frontend::write_hooks`).
    hooks_memo: HooksMemo,
    /// Analyses of the statement texts this session sent last.
    recent: RecentAnalyses,
    /// The analysis of the last unnamed Parse, for Binds to the unnamed statement.
    unnamed: Option<Arc<Analysis>>,
    server: Option<Attached>,
    /// Pool handles of the shards this session used, so a checkout skips the pool
    /// lookup; valid for the topology (and directory generation) they were taken from.
    pools: SessionPools,
    /// The session tenant's placement, while the directory does not change.
    placement: PlacementMemo,
    tx: ClientTx,
    /// Extended-protocol messages held until Sync/Flush while no server is attached.
    batch: Vec<Frame>,
    /// Their bytes (valid while `batch` is not empty; see `hold`).
    held_bytes: usize,
    /// After an error pgtenant raised in an extended batch: drop messages until Sync.
    skip_until_sync: bool,
    /// A statement pgtenant answers itself (`proxy_call`) was prepared in this
    /// session: extended messages may concern it (until then, none is checked).
    proxy_calls_seen: bool,
    /// Portals bound to statements pgtenant answers itself.
    local_portals: FastMap<Bytes, proxy_call::LocalPortal>,
    /// A scatter-gather statement was prepared in this session (see `proxy_calls_seen`).
    scatter_seen: bool,
    /// Scatter-gather statements by client name (`""`: the unnamed one), described.
    scatter_statements: FastMap<Bytes, Arc<crate::admin::scatter::Prepared>>,
    /// Portals bound to them.
    scatter_portals: FastMap<Bytes, scatter::ScatterPortal>,
    /// The last unnamed Parse was a DEALLOCATE of this client statement, answered by
    /// pgtenant (see `deallocate`).
    unnamed_deallocates: Option<Bytes>,
    /// Portals bound to such a DEALLOCATE: the client statement each lets go.
    deallocate_portals: FastMap<Bytes, Bytes>,
    /// Setting changes of forwarded statements, oldest first, waiting for the
    /// ReadyForQuery of their request to tell whether they took effect.
    setting_changes: VecDeque<SessionChange>,
    /// Changes made inside the current transaction; kept only if it commits.
    tx_setting_changes: Vec<SessionChange>,
    /// A portal bound to a statement that changes settings: its changes count once an
    /// Execute of that portal goes to the server.
    bound_changes: Option<BoundChanges>,
    /// Setting changes executed since the last Sync, which that Sync's answer settles.
    request_changes: usize,
    cancel: CancelKey,
    max_message: usize,
    /// The soonest timeout the session is timed for, and since when each timed state
    /// lasts (see `deadline`).
    deadline: Option<Deadline>,
    clocks: Clocks,
    /// Complete client messages wait in the read buffer until the client has read
    /// enough of its answers.
    client_backlog: bool,
    /// The client sent something since it logged in (see the drain in `run_loop`).
    asked_anything: bool,
    /// The per-tenant figures of the transaction under way (see `tenant_figures`).
    held_figures: tenant_figures::HeldFigures,
}

/// How long a drain waits for the first request of a client that has just logged in.
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(1);

/// `poll_io` of one side; with `watch_drain`, also ready (`Drained`) once its write
/// buffer has fallen below `HIGH_WATER`, so that the other side is read again.
fn poll_side(
    io: &mut Duplex,
    cx: &mut std::task::Context<'_>,
    read: bool,
    watch_drain: bool,
) -> Poll<std::io::Result<IoEvent>> {
    match io.poll_io(cx, read) {
        Poll::Pending if watch_drain && io.wbuf.len() < HIGH_WATER => Poll::Ready(Ok(IoEvent::Drained)),
        r => r,
    }
}

/// The pools a session used, per shard, for the topology they belong to.
struct SessionPools {
    generation: u64,
    /// The health view's version the handles were chosen by.
    health: u64,
    /// The pools' generation (users reloaded) they were looked up in.
    pools: u64,
    topology: Arc<Topology>,
    handles: Vec<(ShardId, ServerPool)>,
}

impl SessionPools {
    /// The kept handle of `shard`'s pool, if one is kept.
    #[inline]
    fn handle(&self, shard: ShardId) -> Option<&ServerPool> {
        self.handles.iter().find(|(s, _)| *s == shard).map(|(_, pool)| pool)
    }
}

/// Everything a session starts with, from the login.
pub struct SessionStart {
    pub user: Arc<UserConfig>,
    pub database: String,
    pub tenant: Option<TenantId>,
    pub target: TargetMode,
    pub settings: Arc<Settings>,
    pub cancel: CancelKey,
    /// The client's address, for the admin console.
    pub peer: Option<std::net::SocketAddr>,
}

enum Event {
    Client(std::io::Result<IoEvent>),
    Server(std::io::Result<IoEvent>),
    Shutdown,
    TimedOut(Timeout),
    Killed,
    /// A just-logged-in client's wait for its first request ran out during a drain.
    GraceOver,
}

impl Session {
    pub fn new(shared: Arc<Shared>, client: Duplex, start: SessionStart) -> Self {
        let statement_budget = shared.config.proxy.max_client_statement_bytes;
        let pool_mode = start.user.pool_mode.unwrap_or(shared.config.proxy.pool_mode);
        let max_message = shared.config.proxy.max_message_size;
        let topology = shared.router.topology();
        let generation = shared.router.generation();
        let info = crate::frontend::client_info(
            &start.user.name,
            &start.database,
            start.peer,
            client.stream.is_tls(),
            crate::frontend::params::application_name(&start.settings.list),
            start.cancel.pid,
        );
        let listed = shared.clients.register(info, start.tenant.as_ref().map(ShownTenant::from));
        let login_writes = (shared.config.proxy.read_your_writes == crate::config::ReadYourWrites::User)
            .then(|| shared.login_writes(&start.user.name));
        Self {
            client,
            shared,
            user: start.user,
            database: start.database,
            pool_mode,
            startup_tenant: start.tenant.clone(),
            tenant: start.tenant,
            target: start.target,
            wrote_ms: None,
            may_have_written: std::sync::atomic::AtomicBool::new(false),
            login_writes,
            login_target: start.target,
            listed,
            tenant_before_tx: None,
            startup_settings: start.settings.clone(),
            settings: start.settings,
            statements: NamedStatements::new(statement_budget),
            recent: RecentAnalyses::default(),
            hooks_memo: HooksMemo::default(),
            unnamed: None,
            server: None,
            pools: SessionPools { generation, health: 0, pools: 0, topology, handles: Vec::new() },
            placement: PlacementMemo::default(),
            tx: ClientTx::Idle,
            batch: Vec::new(),
            held_bytes: 0,
            skip_until_sync: false,
            proxy_calls_seen: false,
            local_portals: FastMap::default(),
            scatter_seen: false,
            scatter_statements: FastMap::default(),
            scatter_portals: FastMap::default(),
            unnamed_deallocates: None,
            deallocate_portals: FastMap::default(),
            setting_changes: VecDeque::new(),
            tx_setting_changes: Vec::new(),
            bound_changes: None,
            request_changes: 0,
            cancel: start.cancel,
            max_message,
            deadline: None,
            clocks: Clocks::default(),
            client_backlog: false,
            asked_anything: false,
            held_figures: Default::default(),
        }
    }

    /// Serves the client until it leaves, breaks the protocol, or shutdown finds it idle.
    /// By reference: the session stays where its caller keeps it (taken by value, an
    /// `async fn` keeps its argument and the local it moves it to side by side, and the
    /// task held the 1,376-byte `Session` twice).
    pub async fn run(&mut self, mut shutdown: watch::Receiver<bool>) {
        let result = self.run_loop(&mut shutdown).await;
        if let Err(err) = &result {
            tracing::debug!(error = %err, "session ends");
            if !matches!(err, FrontendError::Io(_)) {
                write_error(&mut self.client.wbuf, err);
                let _ = tokio::time::timeout(std::time::Duration::from_secs(1), self.client.flush()).await;
            }
        }
        self.finish();
        self.held_figures.record(&self.shared.tenant_stats);
    }

    /// Listed as idle between transactions, with the prepared statements it holds now.
    pub(super) fn listed_idle(&self) {
        self.listed.set_state(ConnState::Idle, None);
        self.listed.set_prepared(self.statements.len() + self.scatter_statements.len());
    }

    async fn run_loop(&mut self, shutdown: &mut watch::Receiver<bool>) -> Result<(), FrontendError> {
        let mut stopping = *shutdown.borrow();
        // One shutdown future for the whole session, polled once: it keeps this task's
        // waker, and `probe` (a version check, no lock) tells afterwards whether it fired.
        // Polling the future on every event would cost far more.
        let probe = shutdown.clone();
        let stop_signal = shutdown.changed();
        tokio::pin!(stop_signal);
        let mut stop_armed = false;
        // The same for an admin's KILL of this client.
        let kill_signal = self.listed.killed();
        tokio::pin!(kill_signal);
        let mut kill_armed = false;
        // A client that logged in but has not asked anything yet when the drain starts
        // (one that connects per transaction, accepted just before the listener
        // closed) gets a moment for its request: ending it at once would fail it.
        let mut first_request_grace: Option<Pin<Box<Sleep>>> = None;
        let mut grace_over = false;
        loop {
            if stopping && self.is_idle() {
                if self.asked_anything || grace_over {
                    return Err(FrontendError::ShuttingDown);
                }
                first_request_grace.get_or_insert_with(|| Box::pin(tokio::time::sleep(FIRST_REQUEST_GRACE)));
            }
            self.arm_deadline();
            if self.client_backlog && self.client.wbuf.len() < HIGH_WATER {
                // The client read enough of its answers: go on with the messages it sent.
                self.client_backlog = false;
                if !self.on_client_bytes().await? {
                    return Ok(());
                }
                continue;
            }
            let server_read = self.client.wbuf.len() < HIGH_WATER;
            let client_read = !self.client_backlog
                && self.server.as_ref().is_none_or(|a| a.conn.io.wbuf.len() < HIGH_WATER);
            // A side that stopped reading because the other's output piled up must start
            // again once that output is written: watch for it. (A client backlog with the
            // buffer below the mark was taken up above, so `!server_read` covers it.)
            let watch_client_drain = !server_read;
            let watch_server_drain = self.server.as_ref().is_some_and(|a| a.conn.io.wbuf.len() >= HIGH_WATER);
            let client = &mut self.client;
            let server = &mut self.server;
            let deadline = &mut self.deadline;
            let listed = &self.listed;
            // Fixed order: an admin's KILL first (a request that arrives with it is not
            // sent, as a terminated PostgreSQL backend runs nothing more), then the
            // server's answers (they free a connection).
            let event = poll_fn(|cx| {
                let killed = if kill_armed {
                    listed.is_killed()
                } else {
                    kill_armed = true;
                    kill_signal.as_mut().poll(cx).is_ready()
                };
                if killed {
                    return Poll::Ready(Event::Killed);
                }
                if let Some(a) = server.as_mut()
                    && let Poll::Ready(r) = poll_side(&mut a.conn.io, cx, server_read, watch_server_drain)
                {
                    return Poll::Ready(Event::Server(r));
                }
                if let Poll::Ready(r) = poll_side(client, cx, client_read, watch_client_drain) {
                    return Poll::Ready(Event::Client(r));
                }
                if !stopping {
                    let fired = if stop_armed {
                        probe.has_changed().unwrap_or(true)
                    } else {
                        stop_armed = true;
                        stop_signal.as_mut().poll(cx).is_ready()
                    };
                    if fired {
                        return Poll::Ready(Event::Shutdown);
                    }
                }
                if let Some(deadline) = deadline.as_mut()
                    && deadline.sleep.as_mut().poll(cx).is_ready()
                {
                    return Poll::Ready(Event::TimedOut(deadline.timeout));
                }
                if let Some(grace) = first_request_grace.as_mut()
                    && grace.as_mut().poll(cx).is_ready()
                {
                    return Poll::Ready(Event::GraceOver);
                }
                Poll::Pending
            })
            .await;
            match event {
                Event::Client(Ok(IoEvent::Read)) => {
                    // Whatever the client sent (even a request pgtenant answers itself)
                    // restarts its idle-session clock.
                    self.clocks.client_read();
                    if !self.on_client_bytes().await? {
                        return Ok(());
                    }
                }
                Event::Client(Ok(IoEvent::Closed)) => return Ok(()),
                Event::Client(Ok(IoEvent::Drained)) | Event::Server(Ok(IoEvent::Drained)) => {}
                Event::Client(Err(e)) => return Err(e.into()),
                Event::Server(Ok(IoEvent::Read)) => self.on_server_bytes()?,
                Event::Server(Ok(IoEvent::Closed)) => {
                    self.on_server_lost("the server closed the connection".into())?
                }
                Event::Server(Err(e)) => self.on_server_lost(e.to_string())?,
                Event::Shutdown => stopping = true,
                Event::GraceOver => {
                    grace_over = true;
                    first_request_grace = None;
                }
                Event::Killed => return Err(self.kill_error()),
                Event::TimedOut(timeout) => return Err(self.timed_out(timeout)),
            }
        }
    }

    /// Nothing in flight: shutdown may end the session here.
    fn is_idle(&self) -> bool {
        matches!(self.tx, ClientTx::Idle)
            && self.batch.is_empty()
            && self.server.as_ref().is_none_or(|a| a.conn.queue.is_empty() && a.conn.status == TxStatus::Idle)
    }

    /// Handles every complete client message; `false` when the client sent Terminate.
    async fn on_client_bytes(&mut self) -> Result<bool, FrontendError> {
        self.asked_anything = true;
        loop {
            // Requests queued behind the one that ran when the KILL came are not sent.
            self.fail_if_killed()?;
            if self.client.wbuf.len() >= HIGH_WATER {
                // Answers pgtenant gives itself (snowflake IDs) can be far larger than the
                // requests: a client that does not read them must not grow this buffer.
                self.client_backlog = true;
                return Ok(true);
            }
            // Looked at before the handler's future is built (it is copied in each time).
            let taken = match self.in_place_path() {
                Some(InPlace::Opening) => self.request_in_place().await?,
                Some(InPlace::Joining) => self.join_in_place()?,
                None => false,
            };
            if taken {
                continue;
            }
            let Some(frame) = self.client.next_frame(self.max_message)? else { break };
            tracing::trace!(client = self.cancel.pid, tag = %(frame.tag as char), "client message");
            // Sync, Flush and the copy messages belong to a request already under way.
            let starts_request = !matches!(frame.tag, b'S' | b'H' | b'd' | b'c' | b'f');
            if starts_request && self.next_request_must_wait() {
                // A request pipelined behind one the server has not answered yet: wait for
                // that answer, so that this one is routed (and its tenant GUC set) afresh.
                self.settle().await?;
                self.fail_if_killed()?;
            }
            if starts_request
                && frame.tag != b'X'
                && let Some(a) = self.server.as_mut().filter(|a| a.conn.queue.awaits_copy_data())
            {
                // PostgreSQL in COPY FROM STDIN takes any other message as the copy's end:
                // it fails the COPY (08P01) and the message is consumed, unanswered. (The
                // wait above stops there: the server waits for the client.)
                a.conn.io.wbuf.extend_from_slice(&frame.raw);
                a.conn.queue.note_copy_data(true);
                continue;
            }
            let tag = frame.tag;
            if matches!(tag, b'Q' | b'P') && frame.body().len() >= long_statement::OFF_RUNTIME_BYTES {
                self.analyze_long_statement(&frame).await;
            }
            match tag {
                b'Q' => self.on_query(frame).await?,
                b'P' | b'B' | b'D' | b'E' | b'C' | b'H' | b'S' => {
                    // Held until Sync or Flush without entering the async handler: most
                    // messages of a request only need to be kept, and inside a
                    // transaction most go to the server as they are.
                    let frame = match tag {
                        b'H' | b'S' => Some(frame),
                        _ => self.hold_extended(frame)?,
                    };
                    if let Some(frame) = frame
                        && let Some(frame) = self.forward_joining(frame)?
                    {
                        self.on_extended(frame).await?
                    }
                }
                b'F' => self.on_function_call(frame).await?,
                b'd' | b'c' | b'f' => {
                    // Copy data goes to the server in COPY FROM STDIN; outside COPY it is
                    // dropped, as PostgreSQL drops it. A server that owes nothing is not in
                    // COPY: it refused or failed the COPY and answered up to its
                    // ReadyForQuery, and the client's data was on its way. Forwarded, the
                    // data's CopyEnd would wait at the front of the queue for a server
                    // message that never comes, and hold up the client's next request.
                    if let Some(a) = self.server.as_mut().filter(|a| a.conn.queue.awaits_server()) {
                        a.conn.io.wbuf.extend_from_slice(&frame.raw);
                        a.conn.queue.note_copy_data(frame.tag != b'd');
                        if frame.tag != b'd' {
                            a.conn.queue.push(Pending::CopyEnd);
                        }
                    }
                }
                b'X' => return Ok(false),
                tag => {
                    return Err(FrontendError::Protocol(format!(
                        "unexpected message type '{}'",
                        tag as char
                    )));
                }
            }
            if matches!(tag, b'S' | b'Q') && self.batch.is_empty() {
                // Its request is handled: the long texts analyzed for it are not needed.
                self.recent.forget_primed();
            }
        }
        Ok(true)
    }

    /// Whether a new request must wait until the server has answered the previous one
    /// (which ended with its Sync or Query). It may ride on the same server only when
    /// the session tenant binds it to that server's tenant, and the tenant GUC there is
    /// certain: one set inside the previous request rolls back if that request fails.
    /// For a tenant that may not write, its read-only wall must be certain too: code
    /// pgtenant could not follow may have turned it off for the transactions after it,
    /// and once the server has answered, pgtenant sets it again before the next one.
    fn next_request_must_wait(&self) -> bool {
        self.server.as_ref().is_some_and(|a| {
            !a.open_request
                && !a.conn.queue.is_empty()
                && (a.tenant_in_request
                    || self.tenant.is_none()
                    || self.tenant != a.route.tenant
                    || (a.conn.read_only == ReadOnlyGuc::Unknown && !a.route.state.allows_writes()))
        })
    }

    /// An admin's KILL (or a sibling's `pg_terminate_backend`) came: the session ends
    /// before it sends anything more.
    fn fail_if_killed(&self) -> Result<(), FrontendError> {
        if self.listed.is_killed() { Err(self.kill_error()) } else { Ok(()) }
    }

    /// The FATAL error of a session ended by `ConnRegistry::kill` or `terminate`.
    fn kill_error(&self) -> FrontendError {
        if self.listed.is_terminated() { FrontendError::Terminated } else { FrontendError::Killed }
    }

    /// Waits until the attached server has answered everything sent to it, relaying
    /// as usual, so that a decision pgtenant takes itself sees the final status. The
    /// answers are written to the client as they come (the server is read only while
    /// less than `HIGH_WATER` of them wait), and a client that leaves meanwhile ends
    /// the wait with an error: an answer of any size, or one that takes an hour, never
    /// piles up here or outlives its client.
    async fn settle(&mut self) -> Result<(), FrontendError> {
        while let Some(a) = self.server.as_mut() {
            // A server in COPY FROM STDIN answers nothing more until the client's data.
            if a.conn.queue.is_empty() || a.conn.queue.awaits_copy_data() {
                break;
            }
            let server_read = self.client.wbuf.len() < HIGH_WATER;
            // More of the client's messages wait in its buffer for their turn; reading a
            // bounded amount lets a client that hangs up be seen.
            let client_read = self.client.rbuf.len() < HIGH_WATER;
            let client = &mut self.client;
            let event = poll_fn(|cx| {
                if let Poll::Ready(r) = poll_side(&mut a.conn.io, cx, server_read, false) {
                    return Poll::Ready(Event::Server(r));
                }
                if let Poll::Ready(r) = poll_side(client, cx, client_read, !server_read) {
                    return Poll::Ready(Event::Client(r));
                }
                Poll::Pending
            })
            .await;
            match event {
                Event::Server(Ok(IoEvent::Read)) => self.on_server_bytes()?,
                Event::Server(Ok(IoEvent::Closed)) => {
                    self.on_server_lost("the server closed the connection".into())?
                }
                Event::Server(Err(e)) => self.on_server_lost(e.to_string())?,
                Event::Client(Ok(IoEvent::Closed)) => return Err(client_watch::client_left()),
                Event::Client(Err(e)) => return Err(e.into()),
                _ => {}
            }
        }
        Ok(())
    }

    /// The transaction status the client should see now.
    fn client_status(&self) -> TxStatus {
        match (&self.tx, &self.server) {
            (ClientTx::Failed, _) => TxStatus::Failed,
            (ClientTx::DeferredBegin(_), _) => TxStatus::InTransaction,
            (ClientTx::Idle, Some(a)) => a.conn.status,
            (ClientTx::Idle, None) => TxStatus::Idle,
        }
    }

    /// Sends complete messages of pgtenant's own, after whatever the server still owes.
    fn reply(&mut self, bytes: BytesMut) {
        match self.server.as_mut() {
            Some(a) if !a.conn.queue.is_empty() => a.conn.queue.push(Pending::Synthetic(bytes.freeze())),
            _ => self.client.wbuf.extend_from_slice(&bytes),
        }
    }

    /// Answers a simple-protocol request with a CommandComplete and ReadyForQuery.
    fn reply_done(&mut self, tag: &str) {
        let mut b = BytesMut::new();
        protocol::command_complete(&mut b, tag);
        protocol::ready_for_query(&mut b, self.client_status());
        self.reply(b);
    }

    /// Answers a request with an error; `ready` adds the ReadyForQuery a simple query owes.
    fn reply_error(&mut self, err: &FrontendError, ready: bool) {
        if matches!(err, FrontendError::Killed | FrontendError::Terminated) {
            // A KILL that ended a wait: the session ends at its next look at the kill
            // flag (before any other request), with the FATAL a KILL sends.
            return;
        }
        if matches!(err, FrontendError::Route(_)) {
            let tenant = self.tenant.as_ref().map(ToString::to_string);
            tracing::info!(client = self.cancel.pid, tenant, error = %err, "routing error");
        } else {
            tracing::debug!(error = %err, "request refused");
        }
        if self.server.is_none() {
            // A checkout that failed left it listed as waiting.
            self.listed.set_state(ConnState::Idle, None);
        }
        let mut b = BytesMut::new();
        write_error(&mut b, err);
        if ready {
            self.abort_deferred_begin();
            protocol::ready_for_query(&mut b, self.client_status());
        }
        self.reply(b);
    }

    /// An error before a deferred BEGIN's transaction reached a server aborts it, as
    /// an error inside a transaction block does on a server.
    pub(super) fn abort_deferred_begin(&mut self) {
        if let ClientTx::DeferredBegin(_) = self.tx {
            self.tx = ClientTx::Failed;
        }
    }
}
