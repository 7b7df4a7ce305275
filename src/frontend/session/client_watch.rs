//! Waits that end when their client leaves or is killed: a checkout queued behind a
//! full pool, a request held through a failover or an admin PAUSE. The client's socket
//! is watched beside the wait, so a client that hangs up gives its place in the line
//! (and in the count of held requests) back at once, not when the wait times out;
//! PgBouncer, too, drops a queued client that closes its connection. An admin's KILL
//! ends the wait as well.

use std::future::{Future, poll_fn};
use std::task::Poll;

use super::HIGH_WATER;
use crate::frontend::error::FrontendError;
use crate::net::{Duplex, IoEvent};
use crate::observe::conns::ConnHandle;

/// The error a session ends with when its client is gone.
pub(super) fn client_left() -> FrontendError {
    std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "the client left").into()
}

/// `wait`'s outcome, or `client_left` once the client hangs up first, or `Killed` once
/// an admin KILLs it (the session loop's kill signal wakes this task). Meanwhile what
/// the client sends is read into its buffer for its turn, up to `HIGH_WATER` (past
/// that, a hang-up is seen when the wait ends), and what it is owed is written out.
pub(super) async fn unless_client_leaves<T>(
    client: &mut Duplex,
    listed: &ConnHandle,
    wait: impl Future<Output = T>,
) -> Result<T, FrontendError> {
    let mut wait = std::pin::pin!(wait);
    poll_fn(|cx| {
        if listed.is_killed() {
            return Poll::Ready(Err(FrontendError::Killed));
        }
        // A wait that is over at once (a free connection) costs no look at the client.
        if let Poll::Ready(outcome) = wait.as_mut().poll(cx) {
            return Poll::Ready(Ok(outcome));
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
