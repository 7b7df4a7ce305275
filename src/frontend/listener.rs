//! The accept loop: one task per client, a bound on logged-in clients, and a drain
//! on shutdown (idle sessions leave at once, busy ones when their transaction ends).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_util::task::TaskTracker;

use super::Shared;
use super::login::serve_connection;

/// Accepts clients until `shutdown` turns true, then waits up to `drain` for sessions.
pub async fn run_listener(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
    drain: Duration,
) {
    let slots = Arc::new(Semaphore::new(shared.config.proxy.max_clients));
    let tasks = TaskTracker::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    tracing::trace!(%peer, "accepted");
                    tasks.spawn(serve_connection(tcp, shared.clone(), slots.clone(), shutdown.clone()));
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    break;
                }
            }
        }
    }
    drop(listener);
    tasks.close();
    if tokio::time::timeout(drain, tasks.wait()).await.is_err() {
        tracing::warn!(remaining = tasks.len(), "sessions still busy after the drain timeout");
    }
    shared.pools.close();
}
