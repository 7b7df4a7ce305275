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
use crate::net::client_threads::ClientThreads;

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
                Some(u) => u
                    .accept()
                    .await
                    .and_then(|(s, _)| crate::net::LocalSocket::from_tokio(s))
                    .map(Stream::Unix),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            tcp = self.tcp.accept() => tcp.and_then(|(s, peer)| {
                tracing::trace!(%peer, "accepted");
                crate::net::TcpSocket::from_tokio(s).map(Stream::Plain)
            }),
            unix = unix => unix,
        }
    }
}

impl Listeners {
    /// The connections already waiting in the accept queues. Taken before the sockets
    /// close: with SO_REUSEPORT the kernel would reset them, where the process taking
    /// over the port never saw them. Accepted with the system call itself, until the
    /// queue is empty: the runtime's `accept` answers from the readiness it last saw,
    /// and a connection that arrived since would be left behind.
    fn waiting(&self) -> Vec<Stream> {
        let mut out = Vec::new();
        take_queued(&self.tcp, &mut out, |fd| crate::net::TcpSocket::new(fd.into()).map(Stream::Plain));
        if let Some(unix) = &self.unix {
            take_queued(unix, &mut out, |fd| crate::net::LocalSocket::new(fd.into()).map(Stream::Unix));
        }
        out
    }
}

/// What an accepted connection's session is given besides its socket.
struct Handover {
    shared: Arc<Shared>,
    slots: Arc<Semaphore>,
    shutdown: watch::Receiver<bool>,
}

impl Handover {
    async fn serve(self, stream: Stream) {
        // Each wake-up of the session reads the clock once (see `observe::moment`).
        crate::observe::moment::within(serve_connection(stream, self.shared, self.slots, self.shutdown)).await
    }

    /// Serves `stream` on the next client thread, registered there (so that its
    /// readiness wakes that thread, not the accepting one).
    fn hand_over(self, stream: Stream, clients: &ClientThreads, tasks: &TaskTracker) {
        let stream = match stream.unregister() {
            Ok(s) => s,
            Err(e) => return tracing::warn!(error = %e, "could not hand an accepted connection over"),
        };
        clients.spawn(tasks.track_future(async move {
            match stream.register() {
                Ok(stream) => self.serve(stream).await,
                Err(e) => tracing::warn!(error = %e, "could not register an accepted connection"),
            }
        }));
    }
}

/// Accepts from `listener`'s queue without waiting (non-blocking, as the runtime wants
/// its sockets) until it is empty, and adds each connection to `out` as `stream` makes
/// it into the runtime's.
fn take_queued(
    listener: &impl std::os::fd::AsFd,
    out: &mut Vec<Stream>,
    stream: impl Fn(std::os::fd::OwnedFd) -> std::io::Result<Stream>,
) {
    use rustix::io::Errno;
    use rustix::net::{SocketFlags, accept_with};
    loop {
        match accept_with(listener, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC).map(&stream) {
            Ok(Ok(s)) => out.push(s),
            Ok(Err(e)) => tracing::warn!(error = %e, "a waiting connection could not be taken"),
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => return,
            Err(e) => {
                tracing::warn!(error = %e, "accept of a waiting connection failed");
                return;
            }
        }
    }
}

/// Accepts clients until `shutdown` turns true, then waits up to `drain` for sessions.
/// Each client is served on one of `clients`' threads, in turn, when there are client
/// threads (they stop when this returns), or else on this runtime.
pub async fn run_listener(
    listener: Listeners,
    shared: Arc<Shared>,
    clients: Option<ClientThreads>,
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
    let serve = |stream| {
        let handover =
            Handover { shared: shared.clone(), slots: slots.clone(), shutdown: sessions_shutdown.clone() };
        match &clients {
            Some(clients) => handover.hand_over(stream, clients, &tasks),
            None => drop(tasks.spawn(handover.serve(stream))),
        }
    };
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(stream) => serve(stream),
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
    // Closed right after the last accept: a connection the kernel queues in between is
    // reset (unless net.ipv4.tcp_migrate_req hands it to the process taking over).
    let waiting = listener.waiting();
    drop(listener);
    waiting.into_iter().for_each(serve);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connections_the_runtime_has_not_seen_yet_are_taken_before_the_close() {
        let dir = std::env::temp_dir().join(format!("pgtenant-waiting-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(".s.PGSQL.1");
        let _ = std::fs::remove_file(&path);
        let listeners = Listeners {
            tcp: TcpListener::bind("127.0.0.1:0").await.unwrap(),
            unix: Some(UnixListener::bind(&path).unwrap()),
            unix_path: Some(path.clone()),
        };
        let addr = listeners.tcp.local_addr().unwrap();
        // Connected in the kernel (the handshake is done), never polled by the runtime.
        let _tcp: Vec<_> = (0..3).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        let _unix: Vec<_> = (0..2).map(|_| std::os::unix::net::UnixStream::connect(&path).unwrap()).collect();
        let taken = listeners.waiting();
        let plain = taken.iter().filter(|s| matches!(s, Stream::Plain(_))).count();
        let unix = taken.iter().filter(|s| matches!(s, Stream::Unix(_))).count();
        assert_eq!((plain, unix), (3, 2), "every queued connection is taken");
        assert!(listeners.waiting().is_empty(), "and the queues are then empty");
        drop(listeners);
        assert!(!path.exists(), "the socket file goes with the listeners");
        let _ = std::fs::remove_dir(&dir);
    }
}
