//! The extended-protocol request held at the start of a transaction: its messages are
//! kept until Sync or Flush, so that the whole request is known before a server is
//! checked out (see `extended`); a request that goes on past `HOLD_MESSAGES` or
//! `HOLD_BYTES` (a bulk `executemany` sends one Sync after 100,000 rows) is routed by
//! what it holds then, and the rest streams to its server as it comes.

use super::Session;
use crate::frontend::error::FrontendError;
use crate::protocol::Frame;

/// Messages and bytes a request is held for at most before it is routed by what it
/// holds: the session's memory stays bounded, whatever a client sends before its Sync.
const HOLD_MESSAGES: usize = 1_000;
const HOLD_BYTES: usize = 1 << 20;

impl Session {
    /// Fails the request under way as a server fails one: the error now, then nothing
    /// until the client's Sync, which gets its ReadyForQuery. The session goes on.
    pub(super) fn fail_until_sync(&mut self, err: &FrontendError) {
        self.reply_error(err, false);
        self.skip_until_sync = true;
    }

    /// Fails the held request as `fail_until_sync` does, its held messages skipped.
    pub(super) async fn refuse_held_request(&mut self, err: &FrontendError) -> Result<(), FrontendError> {
        self.fail_until_sync(err);
        for frame in std::mem::take(&mut self.batch) {
            // Through the skip logic, as the messages would have come.
            Box::pin(self.on_extended(frame)).await?;
        }
        Ok(())
    }

    /// Keeps a message of a request that is held (see the module comment) and is not its
    /// end; gives the message back when it needs `on_extended`.
    pub(super) fn hold_extended(&mut self, frame: Frame) -> Result<Option<Frame>, FrontendError> {
        if self.skip_until_sync || matches!(frame.tag, b'S' | b'H') {
            return Ok(Some(frame));
        }
        if self.joins_transaction_under_way() {
            return Ok(Some(frame));
        }
        self.hold(frame);
        if self.holds_enough() {
            // Routed by what it holds (see the module comment), in `on_extended`.
            let last = self.batch.pop().ok_or_else(|| FrontendError::Protocol("nothing held".into()))?;
            self.held_bytes -= last.raw.len();
            return Ok(Some(last));
        }
        Ok(None)
    }

    /// The next message belongs to a transaction already under way on its server:
    /// nothing is held and the transaction has started, so it is not held either, and
    /// goes to the server as it comes (`forward_joining`, else `on_extended`).
    pub(super) fn joins_transaction_under_way(&self) -> bool {
        self.batch.is_empty() && !self.at_transaction_start()
    }

    pub(super) fn hold(&mut self, frame: Frame) {
        if self.batch.is_empty() {
            // Whatever emptied the batch left the count behind.
            self.held_bytes = 0;
        }
        self.held_bytes += frame.raw.len();
        self.batch.push(frame);
    }

    /// The held request is long enough to be routed before its Sync.
    pub(super) fn holds_enough(&self) -> bool {
        self.batch.len() >= HOLD_MESSAGES || self.held_bytes >= HOLD_BYTES
    }
}
