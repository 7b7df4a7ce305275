//! The threads client sessions run on with `thread_per_core`: each a single-threaded
//! tokio runtime, and each accepted client handed to one of them in turn, where its
//! session, the lanes it opens and the server connections it takes stay. A request
//! then goes from client to server and back without a wake-up across threads: on a
//! multi-threaded runtime the workers hand tasks to each other (a futex wake-up, a
//! sleeping thread woken) for most transactions, a sixth to a quarter of the proxy's
//! CPU per transaction (docs/pooling.md, `thread_per_core`; figures in docs/benchmarks.md). The control plane (health checks,
//! the catalog, the HTTP endpoint, the accept loop) stays on the runtime that started
//! the server.
//!
//! A connection registered on one thread may still be used from another (a lane
//! joined by a client of another thread): tokio delivers its readiness through the
//! thread it was registered on, which is correct and only slower. Pools register an
//! idle connection again on the thread that takes it (`Stream::rehome`), and lanes
//! take their own thread's clients first (`current`).

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

thread_local! {
    /// The index of the client thread this is, if it is one.
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Which client thread the caller runs on (`None` off them: the control plane, tests).
pub fn current() -> Option<usize> {
    CURRENT.with(Cell::get)
}

/// The client threads of one server; they stop when this is dropped, once the tasks
/// running on them at that moment are dropped.
pub struct ClientThreads {
    threads: Vec<ClientThread>,
    next: AtomicUsize,
}

struct ClientThread {
    handle: Handle,
    /// Dropped to stop the thread.
    _stop: oneshot::Sender<()>,
}

impl ClientThreads {
    /// Starts `count` threads (at least one).
    pub fn start(count: usize) -> std::io::Result<ClientThreads> {
        let threads = (0..count.max(1)).map(start_thread).collect::<std::io::Result<_>>()?;
        Ok(ClientThreads { threads, next: AtomicUsize::new(0) })
    }

    /// Runs `task` on the next thread in turn.
    pub fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let at = self.next.fetch_add(1, Ordering::Relaxed) % self.threads.len();
        drop(self.threads[at].handle.spawn(task));
    }
}

fn start_thread(index: usize) -> std::io::Result<ClientThread> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let handle = runtime.handle().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    std::thread::Builder::new().name(format!("pgtenant-clients-{index}")).spawn(move || {
        CURRENT.with(|c| c.set(Some(index)));
        // Returns when the sender is dropped; the runtime, dropped here, outside any
        // task, drops the tasks still on it.
        let _ = runtime.block_on(stopped);
    })?;
    Ok(ClientThread { handle, _stop: stop })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tasks_take_the_threads_in_turn_and_know_which_they_are_on() {
        let threads = ClientThreads::start(3).unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for _ in 0..6 {
            let tx = tx.clone();
            threads.spawn(async move {
                let name = std::thread::current().name().map(str::to_owned);
                let _ = tx.send((current(), name));
            });
        }
        let mut seen = Vec::new();
        for _ in 0..6 {
            seen.push(rx.recv().await.unwrap());
        }
        seen.sort();
        let expected: Vec<_> = (0..3)
            .flat_map(|i| std::iter::repeat_n((Some(i), Some(format!("pgtenant-clients-{i}"))), 2))
            .collect();
        assert_eq!(seen, expected);
        assert_eq!(current(), None, "the test's own runtime is not a client thread");
    }

    #[tokio::test]
    async fn dropping_them_stops_their_tasks() {
        let threads = ClientThreads::start(1).unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        threads.spawn(async move {
            let _keep = tx;
            std::future::pending::<()>().await;
        });
        drop(threads);
        // The task (and the sender it held) is dropped with the thread's runtime.
        assert!(tokio::time::timeout(std::time::Duration::from_secs(5), rx).await.unwrap().is_err());
    }
}
