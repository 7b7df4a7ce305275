//! The session's timeouts, PgBouncer's and PostgreSQL's: idle inside a transaction
//! (`idle_transaction_timeout_ms`), idle between transactions (`client_idle_timeout_ms`,
//! PostgreSQL's `idle_session_timeout`), a transaction that lasts too long
//! (`transaction_timeout_ms`, PostgreSQL 17's `transaction_timeout`), and a request the
//! server does not answer in time (`query_timeout_ms`). Each starts its clock when its
//! state begins; the session sleeps until the soonest one (`Deadline`), armed again
//! after every event, and ends with that timeout's FATAL when it fires.

use std::pin::Pin;
use std::time::{Duration, Instant};

use tokio::time::Sleep;

use super::Session;
use crate::frontend::error::FrontendError;
use crate::protocol::TxStatus;

/// Which timeout a deadline is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Timeout {
    IdleInTransaction,
    IdleSession,
    Transaction,
    Query,
}

/// The soonest timeout, and the sleep until it.
pub(super) struct Deadline {
    pub timeout: Timeout,
    at: Instant,
    pub sleep: Pin<Box<Sleep>>,
}

/// Since when each timed state has lasted (`None`: not in it).
#[derive(Default)]
pub(super) struct Clocks {
    idle_in_transaction: Option<Instant>,
    idle_session: Option<Instant>,
    transaction: Option<Instant>,
    request: Option<Instant>,
}

impl Clocks {
    /// The client sent something: it is idle no more.
    pub fn client_read(&mut self) {
        self.idle_session = None;
    }

    /// A request ended on the server (ReadyForQuery): a request still outstanding is
    /// timed from now.
    pub fn request_ended(&mut self) {
        self.request = None;
    }
}

/// Starts `clock` at `now` when `on` and not yet started; stops it when not `on`.
fn follow(clock: &mut Option<Instant>, on: bool, now: &mut Option<Instant>) {
    match (on, clock.is_some()) {
        (true, false) => *clock = Some(*now.get_or_insert_with(Instant::now)),
        (false, true) => *clock = None,
        _ => {}
    }
}

impl Session {
    /// Follows which timed states the session is in and arms the soonest deadline.
    /// Costs nothing when every timeout is off (the default).
    pub(super) fn arm_deadline(&mut self) {
        // Read each time: a RELOAD changes them for running sessions, from their next
        // event.
        let ms = self.shared.timeouts.get();
        let limits = [
            (Timeout::IdleInTransaction, ms.idle_transaction_ms),
            (Timeout::IdleSession, ms.client_idle_ms),
            (Timeout::Transaction, ms.transaction_ms),
            (Timeout::Query, ms.query_ms),
        ];
        if limits.iter().all(|(_, ms)| *ms == 0) {
            return;
        }
        let outstanding = self.server.as_ref().is_some_and(|a| !a.conn.queue.is_empty());
        let idle_in_transaction = self.batch.is_empty()
            && self.server.as_ref().is_some_and(|a| {
                a.conn.status != TxStatus::Idle && a.conn.queue.is_empty() && !a.open_request
            });
        let idle = self.is_idle();
        // One clock read for whichever states begin now.
        let mut now = None;
        let clocks = &mut self.clocks;
        follow(&mut clocks.idle_in_transaction, idle_in_transaction, &mut now);
        follow(&mut clocks.idle_session, idle, &mut now);
        follow(&mut clocks.transaction, !idle, &mut now);
        follow(&mut clocks.request, outstanding, &mut now);
        let since = |timeout| match timeout {
            Timeout::IdleInTransaction => clocks.idle_in_transaction,
            Timeout::IdleSession => clocks.idle_session,
            Timeout::Transaction => clocks.transaction,
            Timeout::Query => clocks.request,
        };
        let soonest = limits
            .iter()
            .filter(|(_, ms)| *ms > 0)
            .filter_map(|&(timeout, ms)| Some((timeout, since(timeout)? + Duration::from_millis(ms))))
            .min_by_key(|(_, at)| *at);
        match (soonest, &self.deadline) {
            (Some((timeout, at)), Some(d)) if d.timeout == timeout && d.at == at => {}
            (Some((timeout, at)), _) => {
                let sleep = Box::pin(tokio::time::sleep_until(at.into()));
                self.deadline = Some(Deadline { timeout, at, sleep });
            }
            (None, _) => self.deadline = None,
        }
    }

    /// The FATAL a fired timeout ends the session with. A request still running on the
    /// server is canceled there first: the connection is then closed, not pooled.
    pub(super) fn timed_out(&mut self, timeout: Timeout) -> FrontendError {
        let ms = self.shared.timeouts.get();
        if matches!(timeout, Timeout::Query | Timeout::Transaction)
            && let Some(a) = self.server.as_ref()
            && !a.conn.queue.is_empty()
        {
            tokio::spawn(a.conn.cancel.cancel());
        }
        let shard = self.server.as_ref().map(|a| a.route.shard);
        match timeout {
            Timeout::IdleInTransaction => FrontendError::IdleInTransaction { ms: ms.idle_transaction_ms },
            Timeout::IdleSession => FrontendError::IdleSession { ms: ms.client_idle_ms },
            Timeout::Transaction => FrontendError::TransactionTimeout { ms: ms.transaction_ms },
            Timeout::Query => FrontendError::QueryTimeout { ms: ms.query_ms, shard },
        }
    }
}
