//! Waits that end when their client leaves or is killed: a checkout queued behind a
//! full pool, a request held through a failover or an admin PAUSE. The client's socket
//! is watched beside the wait, so a client that hangs up gives its place in the line
//! (and in the count of held requests) back at once, not when the wait times out;
//! PgBouncer, too, drops a queued client that closes its connection. An admin's KILL
//! ends the wait as well, and so does the client's cancel (57014): to the client its
//! statement is running, and PostgreSQL cancels a statement wherever it waits.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::Poll;

use super::HIGH_WATER;
use crate::frontend::cancel::CancelKey;
use crate::frontend::error::FrontendError;
use crate::net::{Duplex, IoEvent};
use crate::observe::conns::ConnHandle;

/// The error a session ends with when its client is gone.
pub(super) fn client_left() -> FrontendError {
    std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "the client left").into()
}

/// `wait`'s outcome, or `client_left` once the client hangs up first, `Killed` once
/// an admin KILLs it (the session loop's kill signal wakes this task), or
/// `CanceledWaiting` once the client cancels its request. Meanwhile what the client
/// sends is read into its buffer for its turn, up to `HIGH_WATER` (past that, a
/// hang-up is seen when the wait ends), and what it is owed is written out.
///
/// `wait` is pinned by the caller, in the caller's own state: taken by value, the wait
/// (the checkout's is 800 bytes) was kept twice in every session's task, as the
/// argument and as the pinned local it was moved to (see docs/benchmarks.md "Memory").
pub(super) async fn unless_client_leaves<T>(
    client: &mut Duplex,
    listed: &ConnHandle,
    cancel: &CancelKey,
    mut wait: Pin<&mut impl Future<Output = T>>,
) -> Result<T, FrontendError> {
    // Set up once the wait did not end at once.
    let mut cancelable = None;
    poll_fn(|cx| {
        if listed.is_killed() {
            return Poll::Ready(Err(FrontendError::Killed));
        }
        // A wait that is over at once (a free connection) costs no look at the client.
        if let Poll::Ready(outcome) = wait.as_mut().poll(cx) {
            return Poll::Ready(Ok(outcome));
        }
        let cancelable = cancelable.get_or_insert_with(|| cancel.wait_in_proxy());
        if cancelable.poll_canceled(cx).is_ready() {
            return Poll::Ready(Err(FrontendError::CanceledWaiting));
        }
        loop {
            let read = client.rbuf.len() < HIGH_WATER;
            match client.poll_io(cx, read) {
                Poll::Ready(Ok(IoEvent::Read | IoEvent::Drained)) => {}
                Poll::Ready(Ok(IoEvent::Closed)) => return Poll::Ready(Err(client_left())),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                Poll::Pending => return Poll::Pending,
            }
        }
    })
    .await
}
