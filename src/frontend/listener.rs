//! The accept loop: one task per client, a bound on logged-in clients, and a drain
//! on shutdown (idle sessions leave at once, busy ones when their transaction ends),
//! or, after SHUTDOWN WAIT_FOR_CLIENTS, a wait for every client to leave by itself.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{Semaphore, watch};
use tokio_util::task::TaskTracker;

use super::Shared;
use super::login::serve_connection;
use crate::net::Stream;

/// Where clients connect: TCP, and a Unix socket when configured.
pub struct Listeners {
    pub tcp: TcpListener,
    pub unix: Option<UnixListener>,
    /// The Unix socket's file, removed when the listeners close.
    pub unix_path: Option<std::path::PathBuf>,
}

impl Drop for Listeners {
    fn drop(&mut self) {
        if let Some(path) = &self.unix_path {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Listeners {
    async fn accept(&self) -> std::io::Result<Stream> {
        let unix = async {
            match &self.unix {
                Some(u) => u.accept().await.map(|(s, _)| Stream::Unix(s)),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            tcp = self.tcp.accept() => tcp.map(|(s, peer)| {
                tracing::trace!(%peer, "accepted");
                Stream::Plain(s)
            }),
            unix = unix => unix,
        }
    }
}

impl Listeners {
    /// The connections already waiting in the accept queues. Taken before the sockets
    /// close: with SO_REUSEPORT the kernel would reset them, where the process taking
    /// over the port never saw them.
    fn waiting(&self) -> Vec<Stream> {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let mut out = Vec::new();
        while let std::task::Poll::Ready(Ok((s, _))) = self.tcp.poll_accept(&mut cx) {
            out.push(Stream::Plain(s));
        }
        if let Some(unix) = &self.unix {
            while let std::task::Poll::Ready(Ok((s, _))) = unix.poll_accept(&mut cx) {
                out.push(Stream::Unix(s));
            }
        }
        out
    }
}

/// Accepts clients until `shutdown` turns true, then waits up to `drain` for sessions.
pub async fn run_listener(
    listener: Listeners,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
    drain: Duration,
) {
    let slots = Arc::new(Semaphore::new(shared.config.proxy.max_clients));
    let tasks = TaskTracker::new();
    let mut wait_for_clients = shared.wait_for_clients.subscribe();
    let mut patient = false;
    // Sessions learn of the shutdown only once the listening sockets are closed, so a
    // client that sees its idle session ended cannot then connect and be served.
    let (stop_sessions, sessions_shutdown) = watch::channel(false);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(stream) => {
                    tasks.spawn(serve_connection(stream, shared.clone(), slots.clone(), sessions_shutdown.clone()));
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
            // SHUTDOWN WAIT_FOR_CLIENTS: stop accepting, and wait for every client to
            // leave on its own (a later SHUTDOWN or SIGTERM still ends them).
            Ok(()) = wait_for_clients.changed(), if !patient => {
                if *wait_for_clients.borrow() {
                    patient = true;
                    break;
                }
            }
        }
    }
    for stream in listener.waiting() {
        tasks.spawn(serve_connection(stream, shared.clone(), slots.clone(), sessions_shutdown.clone()));
    }
    drop(listener);
    if !patient {
        let _ = stop_sessions.send(true);
    }
    tasks.close();
    if patient {
        tracing::info!(clients = tasks.len(), "no longer accepting; waiting for every client to leave");
        let stopped = tokio::select! {
            () = tasks.wait() => false,
            stopped = async {
                if shutdown.wait_for(|stop| *stop).await.is_err() {
                    // Nobody can stop it any more: the clients' leaving ends it.
                    std::future::pending::<()>().await;
                }
                let _ = stop_sessions.send(true);
                true
            } => stopped,
        };
        if stopped && tokio::time::timeout(drain, tasks.wait()).await.is_err() {
            tracing::warn!(remaining = tasks.len(), "sessions still busy after the drain timeout");
        }
    } else if tokio::time::timeout(drain, tasks.wait()).await.is_err() {
        tracing::warn!(remaining = tasks.len(), "sessions still busy after the drain timeout");
    }
    shared.pools.close();
}
