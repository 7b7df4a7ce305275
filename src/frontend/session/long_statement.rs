//! Long statements are analyzed off the runtime's worker threads. Parsing costs about a
//! microsecond per byte: a 2 MB statement of a new shape would hold a worker, and
//! every client it serves, for a second. PostgreSQL parses in the client's own
//! backend, where nobody else waits; so does pgtenant, on a blocking thread, a few at
//! a time (`Shared::parse_threads`), before the message is handled. The handlers then
//! find the analysis ready (`RecentAnalyses::prime`).

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
        match tokio::task::spawn_blocking(move || shared.router.analyze_fully(&sql, always_parse)).await {
            // A request's held messages are analyzed together at its Sync: those of one
            // request are all kept.
            Ok(analysis) => self.recent.prime(analysis, self.batch.is_empty()),
            // A parse that panicked: the handler analyzes again, and answers its error.
            Err(e) => tracing::warn!(error = %e, "analysis of a long statement failed"),
        }
    }
}
