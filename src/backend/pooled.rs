//! A server connection checked out of its pool: the client's (or a lane's) until it is
//! dropped, which gives it back to where it came from (`Home`, its pool): shelved when
//! it can serve another client, closed when not. Apart from the pool, so that what
//! holds a connection (a lane, a session) needs nothing of how pools are kept.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::cancel::CancelState;
use super::conn::ServerConn;
use super::share::SharePermit;

/// Where a checked-out connection comes back to.
pub(super) trait Home: Send + Sync {
    /// Whether `conn` may serve another client (its pool did not retire it, and it is
    /// not past its lifetime).
    fn reusable(&self, conn: &ServerConn) -> bool;
    /// Puts `conn` on the shelf of idle connections (or closes it, when the pool closed).
    fn shelve(&self, conn: Box<ServerConn>);
    /// The connections open or opening now are not reused (see `PooledConn::lost`).
    fn retire_open(&self);
    /// The count of connections held back until a cancel sent to them is confirmed.
    fn being_canceled(&self) -> &AtomicUsize;
}

/// A checked-out server connection; dropping it puts it back on its pool's shelf.
pub struct PooledConn {
    conn: Option<Box<ServerConn>>,
    home: Arc<dyn Home>,
    /// Given back after the connection is on the shelf (fields drop after `drop`);
    /// taken along while a cancel is waited for.
    permit: Option<SharePermit>,
}

impl PooledConn {
    pub(super) fn new(conn: Box<ServerConn>, home: Arc<dyn Home>, permit: SharePermit) -> Self {
        PooledConn { conn: Some(conn), home, permit: Some(permit) }
    }

    /// Whether its checkout waited for a place in the pool (per-tenant statistics).
    pub fn waited(&self) -> bool {
        self.permit.as_ref().is_some_and(SharePermit::waited)
    }

    /// Closes the connection instead of returning it (its state is not trusted); a
    /// waiting client then opens a new one.
    pub fn discard(mut self) {
        self.conn = None;
    }

    /// The connection failed under its client (closed or reset by the server, or
    /// unreadable): closed, and so are its pool's other ones, the idle ones now and the
    /// busy ones as they come back. A node being stopped ends its backends one by one;
    /// a connection whose backend has not ended yet still looks alive, and a request put
    /// on it next would fail the same way, a second error for a client whose request was
    /// already lost. The next checkouts open fresh connections instead, which find out
    /// whether the node still takes them (and, when not, hold their requests for the
    /// failover).
    pub fn lost(mut self) {
        self.conn = None;
        self.home.retire_open();
    }

    /// Returns the connection to its pool: at once, or with `reset` once its session
    /// state is reset (DISCARD ALL), in a task of its own so that no client waits for the
    /// reset; it stays checked out until then.
    #[inline]
    pub fn release(self, reset: bool) {
        if reset {
            self.release_after_reset();
        }
    }

    fn release_after_reset(mut self) {
        tokio::spawn(async move {
            // Untrusted until the reset completes: if the task is dropped midway (at
            // shutdown), the connection is closed instead of handed out.
            self.broken = true;
            let reset = Box::pin(self.reset()).await;
            match reset {
                Ok(()) => self.broken = false,
                Err(_) => self.discard(),
            }
        });
    }

    /// A cancel sent to `conn` is not confirmed yet: its signal could still hit the
    /// next client's statement, so the connection stays checked out (its permit held,
    /// as PgBouncer's `sv_being_canceled`) until it is, and is shelved then.
    fn shelve_once_canceled(&mut self, mut conn: Box<ServerConn>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        // Untrusted while it waits: if the task is dropped midway (at shutdown), the
        // connection is closed instead of shelved.
        conn.broken = true;
        let mut waiting =
            PooledConn { conn: Some(conn), home: self.home.clone(), permit: self.permit.take() };
        let counted = BeingCanceled::new(self.home.clone());
        runtime.spawn(async move {
            waiting.cancel.settled().await;
            drop(counted);
            // Dropped now: shelved if the cancel was confirmed, closed if not.
            waiting.broken = false;
        });
    }
}

impl Drop for PooledConn {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // A connection left mid-request (a task dropped before its answer ended) is
            // never handed to another client.
            if conn.broken || !self.home.reusable(&conn) {
                return;
            }
            match conn.cancel.state() {
                CancelState::Settled => {}
                // It may still cancel whatever runs next on it.
                CancelState::Unconfirmed => return,
                CancelState::InFlight => return self.shelve_once_canceled(conn),
            }
            self.home.shelve(conn);
        }
    }
}

/// Counts a connection in its pool's `being_canceled` while it lives.
struct BeingCanceled(Arc<dyn Home>);

impl BeingCanceled {
    fn new(home: Arc<dyn Home>) -> Self {
        home.being_canceled().fetch_add(1, Ordering::Relaxed);
        BeingCanceled(home)
    }
}

impl Drop for BeingCanceled {
    fn drop(&mut self) {
        self.0.being_canceled().fetch_sub(1, Ordering::Relaxed);
    }
}

impl Deref for PooledConn {
    type Target = ServerConn;
    fn deref(&self) -> &ServerConn {
        self.conn.as_deref().expect("a checked-out connection is present until dropped")
    }
}

impl DerefMut for PooledConn {
    fn deref_mut(&mut self) -> &mut ServerConn {
        self.conn.as_deref_mut().expect("a checked-out connection is present until dropped")
    }
}
