//! Pipelined lanes: one server connection carrying the autocommit requests of several
//! clients at once, each written behind the previous one without waiting for its
//! answer. A PostgreSQL backend that finds the next request already in its socket
//! runs it without going to sleep and being woken again, and those two context
//! switches are most of what a short statement costs it; a lane also writes and reads
//! several requests per system call. Answers come back in request order, so the
//! lane's driver task hands each client the bytes up to its request's ReadyForQuery.
//!
//! Only requests that leave no state behind ride a lane (the session decides which:
//! one statement, no transaction block, nothing pinned, no setting changed), so the
//! order of requests from different clients changes nothing but timing. A request that
//! sets the tenant GUC does so inside itself; later requests trust the GUC only once
//! every such request ahead of them has answered (one that failed rolled its SET back).
//!
//! While a client's request is the one the server runs, the client's cancel slot holds
//! the connection's cancel target; a cancel while it waits behind another is not sent
//! (the session ends the wait itself, and the answer is dropped when it comes).
//! A cancel lands when the postmaster gets to it, which may be after the statement it
//! was meant for ended: it then stops the next request on the lane, another client's.
//! Such a request (a read that changes nothing) is run again, alone, and its client
//! never sees the stray 57014 (`LanePiece::Stray`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::sync::mpsc;
use tokio_util::sync::PollSender;

use super::cancel::{CancelState, CancelTarget};
use super::conn::ServerConn;
use super::pooled::PooledConn;
use super::relay::{RelayNotes, RelayStop};
use super::settings::TenantGuc;
use crate::directory::TenantId;
use crate::net::IoEvent;
use crate::protocol::TxStatus;

/// A client's cancel target, shared with whoever runs its request.
pub type CancelSlot = Arc<Mutex<Option<CancelTarget>>>;

/// Answers are handed over in pieces of about this size, so that a large result is
/// not held whole: the lane stops reading while its client's piece waits.
const PIECE: usize = 64 * 1024;

/// When a request may join a lane (`proxy.pipeline_depth`, `pipeline_join_window_us`).
#[derive(Clone, Copy, Debug)]
pub struct LaneJoin {
    /// Requests a lane carries at once, at most.
    pub depth: usize,
    /// How long after its oldest request went out a lane still takes more.
    pub window: Duration,
}

/// Where a request that may ride a lane goes (`ServerPool::lane_with_room`).
pub enum LaneRoom {
    /// Onto this lane, behind the requests on it.
    Join(Arc<Lane>),
    /// No lane has room: onto a lane opened on a connection checked out for it.
    Open,
    /// Checkouts wait for a connection: lanes take no riders and none is opened, so the
    /// request waits its turn with the others and runs alone. (A lane opened now
    /// would carry only its first request, at the cost of a driver task and a channel.)
    Queue,
}

/// What a client receives for its request, in order.
#[derive(Debug)]
pub enum LanePiece {
    /// Part of the answer; more follows.
    Part(BytesMut),
    /// The rest of the answer, ReadyForQuery last, how long the server took to answer
    /// the request once the ones ahead of it were answered, and whether it failed.
    Done { rest: BytesMut, served_in: Duration, failed: bool },
    /// The connection failed before the answer was complete; `Part`s already sent and
    /// this partial answer are all there is.
    Lost { partial: BytesMut, reason: String },
    /// A cancel meant for a request ahead of this one stopped it (57014) before any of
    /// its answer was handed over; the answer is dropped, and the request is to be run
    /// again.
    Stray,
}

/// Why a lane ends before its requests were answered.
enum LaneFailure {
    /// The connection failed (closed, unreadable, or the server ended the session).
    ServerLost(String),
    /// The server answered as no request on the lane should have it (a transaction
    /// left open, an answer nobody asked for).
    StateUnknown(&'static str),
}

/// A pipelined connection of one pool, for clients with the same session settings.
pub struct Lane {
    inner: Mutex<LaneInner>,
    /// `Settings::version` of the settings the connection carries.
    pub settings_version: u64,
    /// Whether `default_transaction_read_only` is on there.
    pub read_only: bool,
    /// The client thread its driver runs on (`net::client_threads`): clients of other
    /// threads join only for want of a free connection (`ServerPool::lane_with_room`),
    /// as handing them their answers wakes their thread.
    pub home: Option<usize>,
}

struct LaneInner {
    /// `None` once the lane has ended.
    conn: Option<PooledConn>,
    /// The clients whose requests are on the wire, in order; the first is answered now.
    waiting: VecDeque<Waiter>,
    /// The first waiter's answer, not handed over yet.
    out: BytesMut,
    /// An ErrorResponse was part of the first waiter's answer.
    head_failed: bool,
    /// An ErrorResponse of that answer said its statement was canceled (57014).
    head_canceled: bool,
    /// A `Part` of the first waiter's answer was handed over.
    head_parts_sent: bool,
    /// When the server could start on the first waiter's request: when it was put on
    /// an empty lane, or when the answer ahead of it was complete.
    head_since: Instant,
    /// Waiting requests that set the tenant GUC inside themselves.
    tenant_sets: usize,
    waker: Option<Waker>,
    /// No request may join: the lane is ending, or its connection cannot be trusted.
    closed: bool,
    /// The driver let the requests written since its last write gather once, by
    /// going to the back of its worker's run queue: the clients woken with the one
    /// that wrote add theirs, and one system call sends them all.
    gathered: bool,
}

struct Waiter {
    to: PollSender<LanePiece>,
    /// When its request was put on the lane.
    since: Instant,
    cancel: CancelSlot,
    /// The tenant GUC value the request sets inside itself.
    sets_tenant: Option<Option<TenantId>>,
    /// The connection's `cancels_started` when the request was put on the lane, and
    /// when it became the one the server runs: cancels sent in between were meant for
    /// requests ahead of it.
    cancels_at_submit: u64,
    cancels_at_head: u64,
}

/// A lane entered to add a request: its connection is written to while held.
pub struct LaneEntry<'a> {
    inner: MutexGuard<'a, LaneInner>,
}

impl Lane {
    /// A lane for `conn`, whose driver the caller spawns (`drive`).
    pub fn new(conn: PooledConn) -> Arc<Lane> {
        let settings_version = conn.settings.version;
        let read_only = conn.read_only == crate::backend::ReadOnlyGuc::On;
        Arc::new(Lane {
            inner: Mutex::new(LaneInner {
                conn: Some(conn),
                waiting: VecDeque::new(),
                out: BytesMut::new(),
                head_failed: false,
                head_canceled: false,
                head_parts_sent: false,
                head_since: Instant::now(),
                tenant_sets: 0,
                waker: None,
                closed: false,
                gathered: false,
            }),
            settings_version,
            read_only,
            home: crate::net::client_threads::current(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, LaneInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many requests are on the wire, when another may join now: the lane is
    /// open, and its oldest request went out less than `window` ago (a request that
    /// runs longer is likely a slow one, which nothing should wait behind; short
    /// statements take a fraction of a millisecond on a busy server).
    pub fn depth_for_joining(&self, window: Duration) -> Option<usize> {
        let inner = self.lock();
        let fresh = inner.waiting.front().is_none_or(|w| w.since.elapsed() < window);
        inner.takes_riders().filter(|_| fresh).map(|()| inner.waiting.len())
    }

    /// Enters the lane to add a request, unless it stopped taking them.
    pub fn enter(&self) -> Option<LaneEntry<'_>> {
        let inner = self.lock();
        inner.takes_riders().map(|()| LaneEntry { inner })
    }

    /// Runs the lane until no request is left on it, then gives its connection back
    /// (or closes it when its state is not what pgtenant believes).
    pub async fn drive(self: Arc<Self>) {
        std::future::poll_fn(|cx| self.lock().poll_drive(cx)).await;
    }
}

impl LaneEntry<'_> {
    /// The connection, to write a request to (with what it owes in its queue).
    pub fn conn(&mut self) -> &mut ServerConn {
        self.inner.conn.as_deref_mut().expect("an open lane has its connection")
    }

    /// Whether the server holds tenant GUC value `tenant` for the next request without
    /// that request setting it: no request ahead sets it, and the last setting held.
    pub fn holds_tenant(&self, tenant: Option<&TenantId>) -> bool {
        self.inner.tenant_sets == 0 && self.inner.conn.as_ref().is_some_and(|c| c.tenant.holds(tenant))
    }

    /// Puts the request just written on the lane; its answer comes on the receiver.
    pub fn submit(
        mut self,
        cancel: CancelSlot,
        sets_tenant: Option<Option<TenantId>>,
    ) -> mpsc::Receiver<LanePiece> {
        let (tx, rx) = mpsc::channel(2);
        let inner = &mut *self.inner;
        let now = Instant::now();
        let cancels = inner.conn.as_ref().map_or(0, |c| c.cancel.cancels_started());
        if inner.waiting.is_empty() {
            set_cancel(&cancel, inner.conn.as_ref().map(|c| c.cancel.clone()));
            inner.head_since = now;
        }
        inner.tenant_sets += usize::from(sets_tenant.is_some());
        inner.waiting.push_back(Waiter {
            to: PollSender::new(tx),
            since: now,
            cancel,
            sets_tenant,
            cancels_at_submit: cancels,
            cancels_at_head: cancels,
        });
        if let Some(waker) = &inner.waker {
            waker.wake_by_ref();
        }
        rx
    }
}

fn set_cancel(slot: &CancelSlot, target: Option<CancelTarget>) {
    *slot.lock().unwrap_or_else(|e| e.into_inner()) = target;
}

impl LaneInner {
    /// Open, and no cancel in flight for its connection: a cancel meant for the request
    /// it runs could land on one put behind it (`backend::cancel`).
    fn takes_riders(&self) -> Option<()> {
        let conn = self.conn.as_ref().filter(|_| !self.closed)?;
        (conn.cancel.state() == CancelState::Settled).then_some(())
    }

    fn poll_drive(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            // The first waiter must be able to take a piece before more is read for it.
            if self.poll_head_ready(cx).is_pending() {
                self.register(cx);
                return Poll::Pending;
            }
            match self.relay() {
                Ok(true) => continue,
                Ok(false) => {}
                Err(reason) => {
                    self.fail(reason);
                    return Poll::Ready(());
                }
            }
            let Some(conn) = self.conn.as_deref_mut() else { return Poll::Ready(()) };
            if !conn.io.wbuf.is_empty() {
                if !self.gathered {
                    self.gathered = true;
                    self.register(cx);
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                // This write takes what gathered.
                self.gathered = false;
            }
            let read = !self.waiting.is_empty();
            match conn.io.poll_io(cx, read) {
                Poll::Ready(Ok(IoEvent::Read | IoEvent::Drained)) => {}
                Poll::Ready(Ok(IoEvent::Closed)) => {
                    self.fail(LaneFailure::ServerLost("the server closed the connection".into()));
                    return Poll::Ready(());
                }
                Poll::Ready(Err(e)) => {
                    self.fail(LaneFailure::ServerLost(e.to_string()));
                    return Poll::Ready(());
                }
                Poll::Pending => {
                    if self.waiting.is_empty() && conn.io.wbuf.is_empty() {
                        self.end();
                        return Poll::Ready(());
                    }
                    self.register(cx);
                    return Poll::Pending;
                }
            }
        }
    }

    fn register(&mut self, cx: &mut Context<'_>) {
        if !self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            self.waker = Some(cx.waker().clone());
        }
    }

    /// Ready once the first waiter (if any) can take a piece; one that left takes
    /// nothing, and its answer is read and dropped all the same.
    fn poll_head_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(head) = self.waiting.front_mut() else { return Poll::Ready(()) };
        match head.to.poll_reserve(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(_) => Poll::Ready(()),
        }
    }

    /// Relays what the server sent so far. `Ok(true)` when a piece went to the first
    /// waiter (the next needs room again); `Ok(false)` when more must be read.
    fn relay(&mut self) -> Result<bool, LaneFailure> {
        let Some(conn) = self.conn.as_deref_mut() else { return Ok(false) };
        if conn.io.rbuf.is_empty() {
            return Ok(false);
        }
        let mut notes = RelayNotes::default();
        // Lane requests carry no settings of their own; a refusal means confusion.
        let stop = conn.relay(&mut self.out, false, (0, 0), &mut notes, |conn, _, _| conn.broken = true);
        self.head_failed |= notes.client_error;
        self.head_canceled |= notes.query_canceled;
        match stop {
            RelayStop::NeedMore if self.out.len() >= PIECE => {
                self.head_parts_sent = true;
                self.send_head(LanePiece::Part);
                Ok(true)
            }
            RelayStop::NeedMore => Ok(false),
            RelayStop::Lost(reason) => Err(LaneFailure::ServerLost(reason)),
            RelayStop::Ready { status, .. } => {
                self.finish_head(status).map(|()| true).map_err(LaneFailure::StateUnknown)
            }
        }
    }

    /// Sends the first waiter what `out` holds, as `piece` wraps it.
    fn send_head(&mut self, piece: impl FnOnce(BytesMut) -> LanePiece) {
        let out = std::mem::take(&mut self.out);
        if let Some(head) = self.waiting.front_mut() {
            // Reserved in `poll_head_ready`; a client that left gets nothing.
            let _ = head.to.send_item(piece(out));
        }
    }

    /// The first waiter's answer is complete.
    fn finish_head(&mut self, status: TxStatus) -> Result<(), &'static str> {
        let Some(head) = self.waiting.front() else {
            return Err("the server answered a request nobody sent");
        };
        // Cleared before the answer goes: the client may take a server of its own
        // right after, and set the slot for that one.
        set_cancel(&head.cancel, None);
        let now = Instant::now();
        let served_in = now.saturating_duration_since(self.head_since);
        let failed = std::mem::take(&mut self.head_failed);
        if self.canceled_by_another() {
            tracing::info!("a cancel meant for a request ahead stopped a pipelined request; it runs again");
            self.send_head(|_stray_answer| LanePiece::Stray);
        } else {
            self.send_head(|rest| LanePiece::Done { rest, served_in, failed });
        }
        self.head_since = now;
        let head = self.waiting.pop_front().expect("checked above");
        self.head_canceled = false;
        self.head_parts_sent = false;
        let conn = self.conn.as_deref_mut().expect("a relaying lane has its connection");
        if let Some(tenant) = head.sets_tenant {
            self.tenant_sets -= 1;
            conn.tenant = if failed || status != TxStatus::Idle {
                TenantGuc::Unknown
            } else {
                TenantGuc::Known(tenant)
            };
        }
        if status != TxStatus::Idle {
            // Requests behind it would run inside its transaction: never let them.
            conn.broken = true;
            return Err("a pipelined request left a transaction open");
        }
        if conn.broken {
            self.closed = true;
        }
        if let Some(next) = self.waiting.front_mut() {
            // Counted before its client can reach the server: a cancel of its own is
            // counted after.
            next.cancels_at_head = conn.cancel.cancels_started();
            set_cancel(&next.cancel, Some(conn.cancel.clone()));
        }
        Ok(())
    }

    /// The first waiter's statement was canceled, not by its own client (no cancel was
    /// sent since it became the one the server runs) but by one sent while it waited
    /// behind another, and none of its answer was handed over: it can run again unseen.
    /// A request on a lane is a read that changes nothing, so running it twice is safe.
    fn canceled_by_another(&self) -> bool {
        let (Some(head), Some(conn)) = (self.waiting.front(), self.conn.as_ref()) else { return false };
        self.head_canceled
            && !self.head_parts_sent
            && head.cancels_at_head > head.cancels_at_submit
            && conn.cancel.cancels_started() == head.cancels_at_head
    }

    /// The connection failed: every waiter learns it, and it is closed.
    fn fail(&mut self, failure: LaneFailure) {
        let reason = match &failure {
            LaneFailure::ServerLost(reason) => reason.clone(),
            LaneFailure::StateUnknown(reason) => reason.to_string(),
        };
        tracing::warn!(%reason, waiting = self.waiting.len(), "lost a pipelined server connection");
        self.closed = true;
        let mut partial = std::mem::take(&mut self.out);
        for mut waiter in self.waiting.drain(..) {
            set_cancel(&waiter.cancel, None);
            let piece = LanePiece::Lost { partial: std::mem::take(&mut partial), reason: reason.clone() };
            // The channel may be full of the first waiter's parts: it is told on a fresh
            // try, and otherwise its receiver sees the channel close without a Done.
            if let Some(sender) = waiter.to.get_ref() {
                let _ = sender.try_send(piece);
            }
            waiter.to.close();
        }
        match (self.conn.take(), failure) {
            // The node may be going down: its other connections are retired too.
            (Some(conn), LaneFailure::ServerLost(_)) => conn.lost(),
            // This connection alone is in a state pgtenant does not know.
            (Some(conn), LaneFailure::StateUnknown(_)) => conn.discard(),
            (None, _) => {}
        }
    }

    /// Nothing is on the wire: the connection goes back to its pool.
    fn end(&mut self) {
        self.closed = true;
        if let Some(conn) = self.conn.take() {
            if conn.is_reusable() { drop(conn) } else { conn.discard() }
        }
    }
}
