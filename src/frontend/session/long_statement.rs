//! Long statements are analyzed off the runtime's worker threads. Parsing costs about a
//! microsecond per byte: a 2 MB statement of a new shape would hold a worker, and
//! every client it serves, for a second. PostgreSQL parses in the client's own
//! backend, where nobody else waits; so does pgtenant, on a thread of its own, a few
//! at a time (`Shared::parse_threads`), before the message is handled. The handlers then
//! find the analysis ready (`RecentAnalyses::prime`).
//!
//! That thread runs at a lower CPU priority than the workers: on a machine whose cores
//! are busy, a second of parsing at equal priority takes its share from the workers
//! and stalls other clients' short requests (`bench/big_statements.sh` with every
//! statement parsed: the median of three rounds' worst latency 55 ms at nice +10,
//! against 74 ms); the statement's own client is the one that should wait.

use bytes::Bytes;

use super::Session;
use crate::config::IsolationMode;
use crate::protocol::{self, Frame};

/// Texts at least this long are analyzed off the workers; shorter ones cost less than
/// the trip to another thread is worth.
pub(super) const OFF_RUNTIME_BYTES: usize = 8 * 1024;

impl Session {
    /// Analyzes the text of a long Query or Parse on a blocking thread, unless its
    /// analysis is at hand already.
    pub(super) async fn analyze_long_statement(&mut self, frame: &Frame) {
        let body = frame.body_bytes();
        let sql: Bytes = match frame.tag {
            b'Q' => match protocol::query_text(&body) {
                Some(text) => body.slice_ref(text),
                None => return,
            },
            b'P' => match protocol::parse_view(&body) {
                Some(p) => body.slice_ref(p.query),
                None => return,
            },
            _ => return,
        };
        if sql.len() < OFF_RUNTIME_BYTES || self.recent.holds(&sql) {
            return;
        }
        // Waits for a thread when others are parsing: only clients sending long
        // statements wait here.
        let Ok(_thread) = self.shared.parse_threads.acquire().await else { return };
        let shared = self.shared.clone();
        let always_parse = self.tenant.is_none() || shared.config.proxy.isolation == IsolationMode::Strict;
        match on_low_priority_thread(move || shared.router.analyze_fully(&sql, always_parse)).await {
            // A request's held messages are analyzed together at its Sync: those of one
            // request are all kept.
            Some(analysis) => self.recent.prime(analysis, self.batch.is_empty()),
            // A parse that panicked, or no thread for it: the handler analyzes again, and
            // answers any error.
            None => tracing::warn!("analysis of a long statement failed"),
        }
    }
}

/// Nice value of the threads that analyze long statements: a tenth of a worker's CPU
/// weight when both want a core, all of an idle one.
const PARSE_THREAD_NICE: i32 = 10;

/// Runs `job` on a thread of its own at `PARSE_THREAD_NICE`; `None` if it panicked.
/// A thread per job rather than the runtime's blocking pool: a thread's priority can be
/// lowered but not raised again without privilege, and the pool's threads also do work
/// (SCRAM logins) that must not be slowed. `Shared::parse_threads` bounds how many run.
async fn on_low_priority_thread<T: Send + 'static>(job: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (done, result) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new().name("pgtenant-parse".into()).spawn(move || {
        lower_this_threads_priority();
        let _ = done.send(job());
    });
    match spawned {
        Ok(_) => result.await.ok(),
        Err(e) => {
            tracing::warn!(error = %e, "no thread for a long statement's analysis");
            None
        }
    }
}

#[cfg(target_os = "linux")]
fn lower_this_threads_priority() {
    // On Linux the nice value belongs to the thread, and nice(2) changes the caller's.
    if let Err(e) = rustix::process::nice(PARSE_THREAD_NICE) {
        tracing::debug!(error = %e, "could not lower the parse thread's priority");
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_this_threads_priority() {}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use rustix::process::getpriority_process;

    #[tokio::test]
    async fn long_statements_are_analyzed_on_a_thread_of_lower_priority() {
        let parse_thread = on_low_priority_thread(|| getpriority_process(None).unwrap()).await;
        let own = getpriority_process(None).unwrap();
        assert_eq!(parse_thread, Some((own + PARSE_THREAD_NICE).min(19)));
        assert_eq!(on_low_priority_thread(|| -> u8 { panic!("a parse that panics") }).await, None);
    }
}
