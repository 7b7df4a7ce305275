//! What a server connection still owes: one entry per message sent to it (or per
//! reply pgtenant gives in its place), in order. Server messages are matched to the
//! front entry to decide whether they reach the client, and where pgtenant's own
//! replies (ParseComplete for a statement the server already has, CloseComplete for
//! a statement kept for others) go in the stream.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::prepared::PreparedStatement;
use crate::observe::stats::StatementCounts;
use crate::protocol::{self, ErrorFields, TxStatus, sqlstate};

/// The message whose responses an entry waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    Parse,
    Bind,
    Describe,
    Execute,
    Close,
    Sync,
    /// Simple Query or FunctionCall: ends with ReadyForQuery.
    Query,
}

impl Reply {
    /// Extended-protocol messages are skipped by the server after an error until Sync.
    fn is_extended(self) -> bool {
        !matches!(self, Reply::Sync | Reply::Query)
    }
}

/// An injected message's error: shown to the client or kept from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnError {
    Forward,
    Swallow,
    /// The SETs of the client's own session settings: kept from the client as an error
    /// (the client's request still runs) and reported in `Effects::settings_failed`.
    /// They ran as one query, whose failure undid all of them.
    Report,
}

#[derive(Clone, Debug)]
pub enum Pending {
    /// A client message: its responses pass through. `statement` is the statement of
    /// pgtenant's that a Parse creates on the server (so a failed Parse can be forgotten)
    /// or that a Bind or Describe uses (so a stale one can be retired); `changes`, on the
    /// Sync or Query that ends a request, counts the session setting changes (SETs it
    /// re-applies elsewhere) that the request's success settles.
    Client { reply: Reply, statement: Option<Arc<PreparedStatement>>, changes: usize },
    /// A message pgtenant added: its responses are swallowed.
    Injected { reply: Reply, on_error: OnError, statement: Option<Arc<PreparedStatement>> },
    /// Complete messages pgtenant sends itself once everything before them has been answered.
    Synthetic(Bytes),
    /// The client ended a COPY FROM STDIN (CopyDone/CopyFail); no reply of its own.
    CopyEnd,
}

impl Pending {
    pub fn client(reply: Reply) -> Self {
        Pending::Client { reply, statement: None, changes: 0 }
    }

    /// The statement this message creates on the server: a Parse's.
    fn prepares(&self) -> Option<&Arc<PreparedStatement>> {
        match self {
            Pending::Client { reply: Reply::Parse, statement, .. }
            | Pending::Injected { reply: Reply::Parse, statement, .. } => statement.as_ref(),
            _ => None,
        }
    }
}

/// What the session must learn from one server message.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// A ReadyForQuery that ended a client request arrived with this status.
    pub ready: Option<TxStatus>,
    /// The number of session setting changes that request carried.
    pub changes_done: usize,
    /// Any ReadyForQuery (client's or injected) arrived with this status.
    pub status: Option<TxStatus>,
    /// An ErrorResponse reached the client.
    pub client_error: bool,
    /// Statements that did not get prepared after all.
    pub unprepared: Vec<u64>,
    /// The server sent something no pending message explains.
    pub desync: bool,
    /// A statement pgtenant added (SETs of settings, of the tenant) failed: the
    /// server's session state is not what pgtenant believes.
    pub injected_failed: bool,
    /// The session settings pgtenant applied (`OnError::Report`) were refused: the
    /// server still holds the settings it held before.
    pub settings_failed: Option<ErrorFields>,
    /// The server now skips messages until a Sync that nobody else will send: pgtenant
    /// must send one (see `on_error`).
    pub send_sync: bool,
    /// The ErrorResponse was FATAL (or PANIC): the server ends the session, and the
    /// error was not passed on (see `ServerConn::fatal`).
    pub server_fatal: bool,
    /// A statement of pgtenant's that this server cannot use any more (it lost it, or
    /// its plan points at what no longer exists): to close and prepare afresh.
    pub broken_statement: Option<u64>,
    /// With `ready`: how long the server took over the request (µs), and over the
    /// transaction it ended, when it ended one.
    pub request_us: u64,
    pub xact_us: Option<u64>,
}

#[derive(Debug, Default)]
pub struct ResponseQueue {
    pending: VecDeque<Pending>,
    /// An extended request failed before its Sync was sent: the server answers nothing
    /// until that Sync, so nothing sent before it is waited for (psycopg's pipelines
    /// send on after an error they have not read yet).
    skipping_until_sync: bool,
    /// Statements whose Parse went out while the server was skipping: never prepared.
    skipped_prepares: Vec<u64>,
    /// Whether a COPY FROM STDIN is open on the server.
    copy_in: CopyIn,
    /// Since when the server has had a request to answer, and since when the
    /// transaction it is in began (for the pool's statistics), in microseconds
    /// (`observe::moment::since_start_us`).
    request_since_us: Option<u64>,
    xact_since_us: Option<u64>,
    /// Parses and Binds answered since the connection last counted a request.
    counts: StatementCounts,
}

/// A COPY FROM STDIN on the server, from its CopyInResponse (either protocol) until
/// it completes, fails or the server is ready again.
#[derive(Debug, Default)]
enum CopyIn {
    #[default]
    Closed,
    Open {
        /// The client has not ended the copy: the server reads nothing but copy data.
        awaits_data: bool,
        /// Copy data (or its end) went to the server since the CopyInResponse.
        data_sent: bool,
        /// For an Execute's COPY: a server in COPY reads and ignores the Syncs sent
        /// behind the Execute (libpq sends one at once, and another after CopyDone), so
        /// they were taken off the queue; they are kept here in case the COPY fails
        /// before the server read them. `None` for a Query's.
        ignored_syncs: Option<Vec<Pending>>,
    },
}

impl ResponseQueue {
    #[inline]
    pub fn push(&mut self, p: Pending) {
        if self.request_since_us.is_none() {
            let now = crate::observe::moment::since_start_us();
            self.request_since_us = Some(now);
            self.xact_since_us.get_or_insert(now);
        }
        if self.skipping_until_sync {
            self.push_while_skipping(p);
        } else {
            self.pending.push_back(p);
        }
    }

    /// The server skips `p`'s message: only a Sync is answered (and ends the skipping).
    #[cold]
    fn push_while_skipping(&mut self, p: Pending) {
        match &p {
            Pending::Client { reply: Reply::Sync, .. } | Pending::Injected { reply: Reply::Sync, .. } => {
                self.skipping_until_sync = false;
                self.pending.push_back(p);
            }
            _ => self.skipped_prepares.extend(p.prepares().map(|s| s.id)),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Whether the server still owes an answer to something sent to it. When it owes
    /// none, it is not in COPY FROM STDIN mode: a COPY it refused or failed has been
    /// answered up to its ReadyForQuery.
    pub fn awaits_server(&self) -> bool {
        self.pending.iter().any(|p| !matches!(p, Pending::Synthetic(_) | Pending::CopyEnd))
    }

    /// Whether the server skips everything up to the client's next Sync.
    pub fn is_skipping(&self) -> bool {
        self.skipping_until_sync
    }

    /// What `on_server_message` does with a plain answer (`1 2 3 T n t D C I s`) to the
    /// client's own message at the front, without the rest of its cases: the answer passes
    /// to the client as it is (the caller copies it), and one that completes the entry
    /// pops it. `None` for anything else, which needs `on_server_message`; else whether
    /// the caller must drain synthetic replies that reached the front (`drain_synthetic`).
    #[inline]
    pub fn pass_answer(&mut self, tag: u8) -> Option<bool> {
        let Some(&Pending::Client { reply, .. }) = self.pending.front() else { return None };
        if !matches!(tag, b'1' | b'2' | b'3' | b'T' | b'n' | b't' | b'D' | b'C' | b'I' | b's') {
            return None;
        }
        if !self.pop_if_completed(reply, tag) {
            return Some(false);
        }
        Some(matches!(self.pending.front(), Some(Pending::Synthetic(_) | Pending::CopyEnd)))
    }

    /// Pops the front entry, whose message is `reply`, when `tag` completes it; a Parse
    /// that completes has prepared its statement on the server.
    fn pop_if_completed(&mut self, reply: Reply, tag: u8) -> bool {
        if !completes(reply, tag) {
            return false;
        }
        let popped = self.pending.pop_front();
        match (reply, &popped) {
            (Reply::Parse, Some(Pending::Client { .. })) => {
                self.counts.client_parses += 1;
                self.counts.server_parses += 1;
            }
            (Reply::Parse, _) => self.counts.server_parses += 1,
            (Reply::Bind, _) => self.counts.binds += 1,
            _ => {}
        }
        if let Some(s) = popped.as_ref().and_then(Pending::prepares) {
            s.mark_validated();
        }
        true
    }

    /// The statement counts since the last call (`PoolStats::statements`).
    #[inline]
    pub fn take_counts(&mut self) -> StatementCounts {
        std::mem::take(&mut self.counts)
    }

    /// The server connection died with this queue unanswered: writes to `out` what the
    /// client is still owed, request by request, as PostgreSQL answers failed
    /// requests: a simple one (Query, FunctionCall) gets `error` and a ReadyForQuery
    /// with `status`; an extended one gets `error` once, then a ReadyForQuery for its
    /// Sync; pgtenant's own replies pass unless an error precedes them in their request
    /// (then only their ReadyForQuery does). Every request the client pipelined behind
    /// the one that was running is answered, none is left waiting. Returns whether the
    /// last request is still open: the client has yet to send its Sync, and what it
    /// sends until then is skipped.
    pub fn answer_lost(&self, out: &mut BytesMut, error: &[u8], status: TxStatus) -> bool {
        let mut failed = false;
        for p in &self.pending {
            match p {
                Pending::Client { reply: Reply::Query, .. } => {
                    out.extend_from_slice(error);
                    protocol::ready_for_query(out, status);
                    failed = false;
                }
                Pending::Client { reply: Reply::Sync, .. } => {
                    protocol::ready_for_query(out, status);
                    failed = false;
                }
                Pending::Client { .. } if !failed => {
                    out.extend_from_slice(error);
                    failed = true;
                }
                Pending::Synthetic(bytes) if !failed => out.extend_from_slice(bytes),
                Pending::Synthetic(bytes) => {
                    let mut replies = BytesMut::from(&bytes[..]);
                    while let Ok(Some(reply)) = protocol::try_parse_frame(&mut replies, usize::MAX) {
                        if reply.tag == b'Z' {
                            protocol::ready_for_query(out, status);
                            failed = false;
                        }
                    }
                }
                Pending::Client { .. } | Pending::Injected { .. } | Pending::CopyEnd => {}
            }
        }
        failed
    }

    /// Emits pgtenant's own replies that have reached the front.
    #[inline]
    pub fn drain_synthetic(&mut self, out: &mut BytesMut) {
        // Called after every message both ways; rarely has anything to do.
        if matches!(self.pending.front(), Some(Pending::Synthetic(_) | Pending::CopyEnd)) {
            self.drain_synthetic_front(out);
        }
    }

    fn drain_synthetic_front(&mut self, out: &mut BytesMut) {
        loop {
            match self.pending.front() {
                Some(Pending::Synthetic(bytes)) => {
                    // A client's Parse of a statement the server already holds.
                    if bytes.first() == Some(&b'1') {
                        self.counts.client_parses += 1;
                    }
                    out.extend_from_slice(bytes);
                }
                Some(Pending::CopyEnd) => {}
                _ => return,
            }
            self.pending.pop_front();
        }
    }

    /// CopyInResponse to an Execute: the server ignores Sync until the copy ends, so
    /// the Syncs the client sent in between (before its CopyDone) get no reply.
    fn on_copy_in(&mut self) {
        let end =
            self.pending.iter().position(|p| matches!(p, Pending::CopyEnd)).unwrap_or(self.pending.len());
        let mut ignored_syncs = Vec::new();
        let mut i = 1;
        let mut end = end;
        while i < end {
            if matches!(self.pending[i], Pending::Client { reply: Reply::Sync, .. }) {
                ignored_syncs.extend(self.pending.remove(i));
                end -= 1;
            } else {
                i += 1;
            }
        }
        self.copy_in =
            CopyIn::Open { awaits_data: true, data_sent: false, ignored_syncs: Some(ignored_syncs) };
    }

    /// The server no longer reads copy data (it answered the copy, or failed it).
    fn copy_data_ended(&mut self) {
        if let CopyIn::Open { awaits_data, .. } = &mut self.copy_in {
            *awaits_data = false;
        }
    }

    /// The client's copy data, CopyDone or CopyFail went to the server (`ends`: the
    /// copy ends with it, or with another message that fails it).
    pub fn note_copy_data(&mut self, ends: bool) {
        if let CopyIn::Open { data_sent, awaits_data, .. } = &mut self.copy_in {
            *data_sent = true;
            *awaits_data &= !ends;
        }
    }

    /// Whether the server is in COPY FROM STDIN waiting for the client's data: a client
    /// message other than copy data then fails the copy on the server (which consumes
    /// it), and must not wait for the server, which waits for the client.
    pub fn awaits_copy_data(&self) -> bool {
        matches!(self.copy_in, CopyIn::Open { awaits_data: true, .. })
    }

    /// An extended COPY failed. One that failed before any copy data went out failed as
    /// it began (COPY FREEZE refused, say), before the server read the Syncs behind its
    /// Execute: those are answered after all, and go back on the queue. Once data went,
    /// the server read them in COPY (they precede the data) and ignored them. (Data
    /// sent just as the server failed is the one case this reads wrong: the server
    /// and client then see one ReadyForQuery less than each Sync would give.)
    fn on_copy_error(&mut self) {
        if let CopyIn::Open { ignored_syncs: Some(ignored_syncs), data_sent: false, .. } =
            std::mem::take(&mut self.copy_in)
        {
            for (k, sync) in ignored_syncs.into_iter().enumerate() {
                self.pending.insert((1 + k).min(self.pending.len()), sync);
            }
        }
    }

    /// Notes how long the request just answered took, and its transaction if it ended.
    fn time_request(&mut self, status: Option<TxStatus>, fx: &mut Effects) {
        let now = crate::observe::moment::since_start_us();
        let micros = |since: Option<u64>| since.map_or(0, |s| now.saturating_sub(s));
        fx.request_us = micros(self.request_since_us);
        if status == Some(TxStatus::Idle) {
            fx.xact_us = Some(micros(self.xact_since_us.take()));
        }
        // A request sent behind it (pipelined) is in the server's hands from now on.
        self.request_since_us = self.awaits_server().then_some(now);
    }

    /// Handles one server message (`raw`: tag, length and body): appends what the
    /// client should see to `out`.
    pub fn on_server_message(&mut self, tag: u8, raw: &[u8], out: &mut BytesMut) -> Effects {
        let mut fx = Effects::default();
        let forward_front = !matches!(self.pending.front(), Some(Pending::Injected { .. }));
        match tag {
            // Asynchronous messages may come at any time.
            b'A' => out.extend_from_slice(raw),
            b'N' | b'S' => {
                if forward_front {
                    out.extend_from_slice(raw);
                }
            }
            b'E' => {
                self.copy_data_ended();
                self.on_error(raw, out, &mut fx);
            }
            b'Z' => {
                self.copy_in = CopyIn::Closed;
                let status = raw.get(5).copied().and_then(TxStatus::from_byte);
                fx.status = status;
                fx.unprepared.append(&mut self.skipped_prepares);
                match self.pending.pop_front() {
                    Some(Pending::Client { reply: Reply::Sync | Reply::Query, changes, .. }) => {
                        out.extend_from_slice(raw);
                        fx.ready = status;
                        fx.changes_done = changes;
                        self.time_request(status, &mut fx);
                    }
                    Some(Pending::Injected { reply: Reply::Sync | Reply::Query, .. }) => {}
                    _ => fx.desync = true,
                }
                if status.is_none() {
                    fx.desync = true;
                }
            }
            tag => {
                let Some(front) = self.pending.front() else {
                    fx.desync = true;
                    out.extend_from_slice(raw);
                    return fx;
                };
                let (reply, forward) = match front {
                    Pending::Client { reply, .. } => (*reply, true),
                    Pending::Injected { reply, .. } => (*reply, false),
                    Pending::Synthetic(_) | Pending::CopyEnd => {
                        fx.desync = true;
                        return fx;
                    }
                };
                if forward {
                    out.extend_from_slice(raw);
                }
                match tag {
                    b'G' if reply == Reply::Execute => self.on_copy_in(),
                    b'G' => {
                        self.copy_in =
                            CopyIn::Open { awaits_data: true, data_sent: false, ignored_syncs: None }
                    }
                    b'C' => self.copy_in = CopyIn::Closed,
                    _ => self.copy_data_ended(),
                }
                self.pop_if_completed(reply, tag);
            }
        }
        self.drain_synthetic(out);
        fx
    }

    fn on_error(&mut self, raw: &[u8], out: &mut BytesMut, fx: &mut Effects) {
        if is_fatal(raw) {
            // The session is over: what the client sees of it is its session's to decide.
            fx.server_fatal = true;
            let code = protocol::error_field(raw.get(5..).unwrap_or_default(), b'C').unwrap_or_default();
            crate::observe::errors::count(crate::observe::errors::Raiser::Server, code);
            return;
        }
        let injected_failed = matches!(self.pending.front(), Some(Pending::Injected { .. }));
        let front = match self.pending.front() {
            Some(Pending::Client { reply, .. }) => Some((*reply, OnError::Forward)),
            Some(Pending::Injected { reply, on_error, .. }) => Some((*reply, *on_error)),
            Some(Pending::Synthetic(_) | Pending::CopyEnd) | None => None,
        };
        let forward = match front {
            Some((_, OnError::Swallow)) => {
                // The client did not send it, so it must not see the error; an operator should.
                let fields = protocol::error_fields(raw.get(5..).unwrap_or_default());
                tracing::warn!(code = %fields.code, message = %fields.message, "a statement pgtenant added failed; the connection will be closed");
                fx.injected_failed = true;
                false
            }
            Some((_, OnError::Report)) => {
                fx.settings_failed = Some(protocol::error_fields(raw.get(5..).unwrap_or_default()));
                false
            }
            None => {
                // A FATAL from an idle server (e.g. it shuts down): the client should see it.
                fx.desync = true;
                true
            }
            _ => true,
        };
        if forward {
            out.extend_from_slice(raw);
            fx.client_error = true;
            let code = protocol::error_field(raw.get(5..).unwrap_or_default(), b'C').unwrap_or_default();
            crate::observe::errors::count(crate::observe::errors::Raiser::Server, code);
        }
        if let Some(Pending::Client { reply: Reply::Bind | Reply::Describe, statement: Some(stmt), .. }) =
            self.pending.front()
            && is_stale_plan(raw)
        {
            // The server's statement predates a schema change that altered its result
            // (0A000 "cached plan must not change result type"): every server holding
            // it would refuse it too, so a client that prepares the text again, as
            // asyncpg and pgJDBC do on this error, must get a statement of its own.
            tracing::debug!(statement = stmt.id, "a prepared statement outlived a schema change; retired");
            stmt.retire();
        } else if let Some(Pending::Client {
            reply: Reply::Bind | Reply::Describe,
            statement: Some(stmt),
            ..
        }) = self.pending.front()
            && is_broken_on_server(raw)
        {
            // The server lost the statement (26000), or its plan points at an object that
            // is gone (XX000 "cache lookup failed", as after a type created in a
            // transaction that rolled back): this server prepares it afresh next time.
            tracing::debug!(statement = stmt.id, "a prepared statement is unusable on its server; closed");
            fx.broken_statement = Some(stmt.id);
        }
        let Some((reply, _)) = front else { return };
        if reply == Reply::Execute {
            self.on_copy_error();
        }
        if !reply.is_extended() {
            // Simple query: the entry ends at ReadyForQuery.
            return;
        }
        // The server now skips every message up to the next Sync.
        while let Some(p) = self.pending.front_mut() {
            match p {
                Pending::Client { reply: Reply::Sync, .. } | Pending::Injected { reply: Reply::Sync, .. } => {
                    break;
                }
                Pending::Client { reply: reply @ Reply::Query, .. } if injected_failed => {
                    // A simple query that followed injected extended messages (the tenant
                    // GUC set in its request) is skipped too, and no Sync is coming: the
                    // one pgtenant sends gives the query its ReadyForQuery.
                    *reply = Reply::Sync;
                    fx.send_sync = true;
                    break;
                }
                // A simple query the client sent behind its own extended request, before
                // that request's Sync: the server skips it, and answers it nothing.
                Pending::Client { reply: Reply::Query, .. } => {}
                _ => fx.unprepared.extend(p.prepares().map(|s| s.id)),
            }
            self.pending.pop_front();
        }
        self.skipping_until_sync = self.pending.is_empty();
    }
}

/// Whether ErrorResponse `raw` ends the server session: severity FATAL or PANIC (the
/// untranslated `V` field where the server sends it, else `S`).
fn is_fatal(raw: &[u8]) -> bool {
    let body = raw.get(5..).unwrap_or_default();
    let severity = protocol::error_field(body, b'V').or_else(|| protocol::error_field(body, b'S'));
    matches!(severity, Some(b"FATAL" | b"PANIC"))
}

/// Whether ErrorResponse `raw` says that a prepared statement's result changed under it:
/// 0A000 from the plan cache's revalidation (its routine, which is not translated, or
/// else its English message).
fn is_stale_plan(raw: &[u8]) -> bool {
    let body = raw.get(5..).unwrap_or_default();
    let field = |kind| protocol::error_field(body, kind).unwrap_or_default();
    field(b'C') == sqlstate::FEATURE_NOT_SUPPORTED.as_bytes()
        && (field(b'R') == b"RevalidateCachedQuery"
            || field(b'M') == b"cached plan must not change result type")
}

/// Whether ErrorResponse `raw` says that the server cannot use the named statement a
/// Bind or Describe named: it does not have it (26000), or an internal error (XX000,
/// "cache lookup failed for type ..." when its plan points at a type that is gone).
fn is_broken_on_server(raw: &[u8]) -> bool {
    let code = protocol::error_field(raw.get(5..).unwrap_or_default(), b'C').unwrap_or_default();
    code == sqlstate::INVALID_SQL_STATEMENT_NAME.as_bytes() || code == sqlstate::INTERNAL_ERROR.as_bytes()
}

/// Whether a message with `tag` is the last response to `reply`.
fn completes(reply: Reply, tag: u8) -> bool {
    match reply {
        Reply::Parse => tag == b'1',
        Reply::Bind => tag == b'2',
        Reply::Close => tag == b'3',
        Reply::Describe => matches!(tag, b'T' | b'n'),
        Reply::Execute => matches!(tag, b'C' | b'I' | b's'),
        Reply::Sync | Reply::Query => false,
    }
}

#[cfg(test)]
mod tests;
