//! Cancel requests to servers: sending one, and knowing which connections have one
//! in flight.
//!
//! A CancelRequest goes to the postmaster on a connection of its own; the postmaster
//! signals the backend and then closes that connection. A signal that arrives after the
//! statement it was meant for has ended hits whatever the backend runs next: another
//! client's statement once the connection went back to the pool, the next statement of
//! a pipelined lane, or the next part of a scatter-gather. So every cancel is waited
//! for until the server closes its connection, and a server connection with a cancel
//! still in flight is not given to anybody (PgBouncer's `sv_being_canceled`): the pool
//! shelves it once the cancel is confirmed, and closes it when it never is.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::Notify;

use super::addr::ServerAddr;

/// How long a postmaster may take to take a cancel request and close its connection;
/// a cancel not confirmed by then counts as lost, and its server connection is closed.
const CANCEL_CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// What a CancelRequest for a server connection needs; clones share what is in flight.
/// One allocation: a session takes a clone at each checkout (its client's cancel goes
/// there) and drops it at the return, one reference count each way.
#[derive(Clone, Debug)]
pub struct CancelTarget(Arc<BackendKeyAt>);

/// A backend's key (BackendKeyData) and where its postmaster listens.
#[derive(Debug)]
pub struct BackendKeyAt {
    pub addr: ServerAddr,
    pub pid: u32,
    pub key: u32,
    in_flight: InFlight,
}

impl std::ops::Deref for CancelTarget {
    type Target = BackendKeyAt;

    fn deref(&self) -> &BackendKeyAt {
        &self.0
    }
}

#[derive(Debug, Default)]
struct InFlight {
    count: AtomicUsize,
    /// Cancels ever sent: a pipelined lane tells from it whether one was sent while a
    /// request waited behind another (`backend::lane`).
    started: AtomicU64,
    /// A cancel failed or was not confirmed in time: it may still land at any moment.
    unconfirmed: AtomicBool,
    settled: Notify,
}

/// Where a server connection stands with the cancels sent to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelState {
    /// None in flight, and every one sent was confirmed.
    Settled,
    /// At least one sent and not yet confirmed.
    InFlight,
    /// One may land at any moment: the connection must not run anything again.
    Unconfirmed,
}

impl CancelTarget {
    pub fn new(addr: ServerAddr, pid: u32, key: u32) -> Self {
        CancelTarget(Arc::new(BackendKeyAt { addr, pid, key, in_flight: InFlight::default() }))
    }

    /// Sends a CancelRequest on a fresh connection and waits until the server closes
    /// it, which it does once it has signalled the backend. The connection counts as
    /// being canceled from this call on (before the future is first polled) until the
    /// future ends; dropped before that, or failed, the cancel counts as unconfirmed.
    pub fn cancel(&self) -> impl Future<Output = std::io::Result<()>> + Send + 'static {
        let pending = Pending::new(self.clone());
        let target = self.clone();
        async move {
            // Moved in whole (a field alone would be captured otherwise, and the count
            // would drop with this call).
            let mut pending = pending;
            let sent = tokio::time::timeout(CANCEL_CONFIRM_TIMEOUT, send_and_wait(&target)).await;
            let (result, landed) = match sent {
                Ok(Ok(())) => (Ok(()), Landed::Confirmed),
                // No connection, no request: nothing can land.
                Ok(Err(Failed::Connect(e))) => (Err(e), Landed::Never),
                Ok(Err(Failed::AfterConnect(e))) => (Err(e), Landed::Maybe),
                Err(_) => (
                    Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the server did not confirm a cancel request",
                    )),
                    Landed::Maybe,
                ),
            };
            pending.landed = landed;
            result
        }
    }

    /// How many cancels were sent to this connection so far.
    pub fn cancels_started(&self) -> u64 {
        self.in_flight.started.load(Ordering::Acquire)
    }

    pub fn state(&self) -> CancelState {
        if self.in_flight.unconfirmed.load(Ordering::Acquire) {
            CancelState::Unconfirmed
        } else if self.in_flight.count.load(Ordering::Acquire) > 0 {
            CancelState::InFlight
        } else {
            CancelState::Settled
        }
    }

    /// Waits until no cancel is in flight; the state it ended in.
    pub async fn settled(&self) -> CancelState {
        loop {
            let notified = self.in_flight.settled.notified();
            tokio::pin!(notified);
            // Registered before the check: a cancel that ends in between still wakes it.
            notified.as_mut().enable();
            match self.state() {
                CancelState::InFlight => notified.await,
                state => return state,
            }
        }
    }
}

/// One cancel in flight: counted from creation, and settled when dropped.
struct Pending {
    target: CancelTarget,
    landed: Landed,
}

/// Whether a cancel's signal reached the backend.
enum Landed {
    Confirmed,
    Never,
    /// Sent and not confirmed (or the future was dropped midway).
    Maybe,
}

impl Pending {
    fn new(target: CancelTarget) -> Self {
        target.in_flight.count.fetch_add(1, Ordering::AcqRel);
        target.in_flight.started.fetch_add(1, Ordering::AcqRel);
        Pending { target, landed: Landed::Maybe }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let in_flight = &self.target.in_flight;
        if matches!(self.landed, Landed::Maybe) {
            in_flight.unconfirmed.store(true, Ordering::Release);
        }
        if in_flight.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            in_flight.settled.notify_waiters();
        }
    }
}

enum Failed {
    Connect(std::io::Error),
    AfterConnect(std::io::Error),
}

async fn send_and_wait(target: &CancelTarget) -> Result<(), Failed> {
    async fn on(mut stream: impl AsyncRead + AsyncWrite + Unpin, request: &[u8]) -> Result<(), Failed> {
        stream.write_all(request).await.map_err(Failed::AfterConnect)?;
        // The server sends nothing back: it closes the connection once it signalled.
        let mut rest = [0u8; 64];
        while stream.read(&mut rest).await.map_err(Failed::AfterConnect)? > 0 {}
        Ok(())
    }
    let mut request = BytesMut::new();
    frontend::cancel_request(target.pid as i32, target.key as i32, &mut request);
    match &target.addr {
        ServerAddr::Tcp(addr) => on(TcpStream::connect(addr).await.map_err(Failed::Connect)?, &request).await,
        ServerAddr::Unix(path) => {
            on(UnixStream::connect(path).await.map_err(Failed::Connect)?, &request).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_cancel_is_in_flight_until_confirmed_and_untrusted_only_if_it_may_have_landed() {
        // A server that takes the request, waits, then closes: what a postmaster does.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 16];
            socket.read_exact(&mut request).await.unwrap();
            let _ = released.await;
            request
        });
        let target = CancelTarget::new(ServerAddr::Tcp(addr), 41, 42);
        assert_eq!(target.state(), CancelState::Settled);
        let sent = tokio::spawn(target.cancel());
        assert_eq!(target.state(), CancelState::InFlight, "counted before it runs");
        let waiter = tokio::spawn({
            let target = target.clone();
            async move { target.settled().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "in flight until the server closes the connection");
        release.send(()).unwrap();
        let request = server.await.unwrap();
        assert_eq!(&request[8..], &[0, 0, 0, 41, 0, 0, 0, 42], "pid and key");
        sent.await.unwrap().unwrap();
        assert_eq!(waiter.await.unwrap(), CancelState::Settled);

        // Nobody listens any more: the cancel fails, and as nothing was sent, nothing
        // can land.
        target.cancel().await.unwrap_err();
        assert_eq!(target.settled().await, CancelState::Settled);

        // Taken and never answered (dropped midway here): it may land at any moment.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = CancelTarget::new(ServerAddr::Tcp(silent.local_addr().unwrap()), 41, 42);
        let sent = target.cancel();
        let _ = tokio::time::timeout(Duration::from_millis(100), sent).await;
        assert_eq!(target.state(), CancelState::Unconfirmed);
    }
}
