//! Relaying a server's answers: complete messages from its read buffer go to the
//! client's output in place (no per-message allocation), matched against what the
//! connection owes (`ResponseQueue`), up to the ReadyForQuery that ends a client
//! request. Shared by a session's attached server and by a pipelined lane.

use bytes::{Buf, BytesMut};

use super::conn::{MAX_SERVER_MESSAGE, ServerConn, record_param};
use crate::protocol::{self, ErrorFields, TxStatus};

/// What relaying stopped at.
#[derive(Debug)]
pub enum RelayStop {
    /// The read buffer holds no further complete message.
    NeedMore,
    /// A ReadyForQuery ended a client request.
    Ready {
        status: TxStatus,
        /// The session setting changes the request carried.
        changes: usize,
    },
    Lost(String),
}

/// What the relayed messages said about the client's request.
#[derive(Debug, Default)]
pub struct RelayNotes {
    /// An ErrorResponse reached the client.
    pub client_error: bool,
    /// One of them said the statement was canceled (57014).
    pub query_canceled: bool,
    /// A COMMIT completed (looked for only when asked to track commits).
    pub saw_commit: bool,
    /// When the request ended (its ReadyForQuery): what it cost, for per-tenant
    /// statistics (`observe::tenants`).
    pub answered: Option<Answered>,
}

/// What a request that ended cost.
#[derive(Clone, Copy, Debug, Default)]
pub struct Answered {
    /// Server time, from the request's first message to its ReadyForQuery.
    pub request_us: u64,
    /// It ended a transaction (or was one).
    pub ended_transaction: bool,
    /// Bytes the server sent for it.
    pub bytes_out: u64,
}

impl ServerConn {
    /// Relays complete messages into `out` up to the first that ends a client request.
    /// `on_refused` hears of the client's session settings refused by the server
    /// (`OnError::Report`), at their place in the stream. `shard` and `client` only
    /// label log lines.
    pub fn relay(
        &mut self,
        out: &mut BytesMut,
        track_commit: bool,
        labels: (u16, u32),
        notes: &mut RelayNotes,
        mut on_refused: impl FnMut(&mut ServerConn, &ErrorFields, &mut BytesMut),
    ) -> RelayStop {
        let (shard, client) = labels;
        let mut at = 0;
        // Answers for the client, not yet copied: `rbuf[rows_from..at]`, one copy per run.
        let mut rows_from = 0;
        let result = loop {
            let (tag, total) = match protocol::frame_header(&self.io.rbuf[at..], MAX_SERVER_MESSAGE) {
                Ok(Some(header)) => header,
                Ok(None) => break RelayStop::NeedMore,
                Err(e) => break RelayStop::Lost(format!("bad message from server: {e}")),
            };
            // CommandComplete is looked at when a commit is tracked, or statements wait
            // to be settled (`ServerConn::unsettled`): rarely.
            let look_at_tag = tag == b'C' && (track_commit || !self.unsettled.is_empty());
            if !look_at_tag && let Some(drain) = self.queue.pass_answer(tag) {
                // Passed as it is, copied with the run it belongs to.
                at += total;
                if drain {
                    out.extend_from_slice(&self.io.rbuf[rows_from..at]);
                    rows_from = at;
                    self.queue.drain_synthetic(out);
                }
                continue;
            }
            if rows_from < at {
                out.extend_from_slice(&self.io.rbuf[rows_from..at]);
            }
            let raw = &self.io.rbuf[at..at + total];
            at += total;
            rows_from = at;
            // Whether the message may undo statements prepared in this transaction.
            let mut doubt = false;
            match tag {
                b'S' => {
                    if let Some((name, value)) = protocol::parameter_status(&raw[5..]) {
                        record_param(&mut self.params, name, value);
                    }
                }
                b'C' => match protocol::command_tag(&raw[5..]) {
                    b"COMMIT" => notes.saw_commit |= track_commit,
                    b"ROLLBACK" | b"PREPARE TRANSACTION" => doubt = true,
                    _ => {}
                },
                b'E' => doubt = true,
                _ => {}
            }
            let fx = self.queue.on_server_message(tag, raw, out);
            tracing::trace!(client, tag = %(tag as char), ?fx, "server message");
            if fx.server_fatal {
                let fields = protocol::error_fields(&raw[5..]);
                tracing::debug!(shard, client, code = %fields.code, message = %fields.message, "the server ended the session");
                self.broken = true;
                let reason = fields.message.clone();
                self.fatal = Some(fields);
                break RelayStop::Lost(reason);
            }
            for id in &fx.unprepared {
                self.prepared.remove(*id);
            }
            if fx.client_error {
                notes.client_error = true;
                notes.query_canceled |= tag == b'E'
                    && protocol::error_field(&raw[5..], b'C')
                        == Some(protocol::sqlstate::QUERY_CANCELED.as_bytes());
            }
            if doubt {
                self.note_doubt();
            }
            if let Some(id) = fx.broken_statement {
                self.forget_statement(id);
            }
            if fx.send_sync {
                protocol::sync(&mut self.io.wbuf);
            }
            if let Some(status) = fx.status {
                self.status = status;
                self.after_ready(status);
            }
            if fx.desync {
                // What the server still owes can no longer be matched to what was asked:
                // the connection is given up like a lost one, and whatever the client is
                // owed answered with an error (waiting on would never end).
                tracing::warn!(shard, tag = %(tag as char), "unexpected server message; the connection is closed");
                self.broken = true;
                break RelayStop::Lost(format!(
                    "unexpected message '{}' from the server",
                    tag.escape_ascii()
                ));
            }
            if fx.injected_failed {
                // Never handed to another client with state it does not expect.
                self.broken = true;
            }
            if let Some(refused) = fx.settings_failed {
                on_refused(self, &refused, out);
            }
            if let Some(status) = fx.ready {
                let bytes_out = self.count_request(fx.request_us, fx.xact_us, notes.client_error);
                notes.answered = Some(Answered {
                    request_us: fx.request_us,
                    ended_transaction: fx.xact_us.is_some(),
                    bytes_out,
                });
                break RelayStop::Ready { status, changes: fx.changes_done };
            }
        };
        if rows_from < at {
            out.extend_from_slice(&self.io.rbuf[rows_from..at]);
        }
        self.io.rbuf.advance(at);
        result
    }
}
