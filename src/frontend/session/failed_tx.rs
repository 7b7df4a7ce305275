//! A transaction that failed in pgtenant (`ClientTx::Failed`: the client cancelled its
//! own statement, see `proxy_call`): as in an aborted transaction on PostgreSQL,
//! nothing runs until the client ends it, in either protocol. Above all, nothing may
//! reach a server connection: it would run and commit on its own, outside the
//! transaction the client believes it is in.

use bytes::{Bytes, BytesMut};

use super::Session;
use crate::frontend::error::FrontendError;
use crate::protocol;
use crate::router::StatementKind;

impl Session {
    /// Answers a held extended-protocol request in a failed transaction: one that only
    /// ends it (ROLLBACK or COMMIT, which rolls back) is answered here, any other fails
    /// with 25P02 up to its Sync, as PostgreSQL fails it.
    pub(super) async fn extended_in_failed_transaction(&mut self) -> Result<(), FrontendError> {
        if !self.batch_only_ends_transaction()? {
            return self.refuse_held_request(&FrontendError::InFailedTransaction).await;
        }
        let mut reply = BytesMut::new();
        for frame in std::mem::take(&mut self.batch) {
            match frame.tag {
                b'P' => {
                    let p = protocol::parse_view(frame.body())
                        .ok_or_else(|| FrontendError::malformed("Parse"))?;
                    if p.name.is_empty() {
                        self.unnamed = Some(self.recent.get_or_analyze(&self.shared.router, p.query));
                    } else {
                        self.register_statement(p.name, p.query, p.param_types);
                    }
                    protocol::parse_complete(&mut reply);
                }
                b'B' => protocol::bind_complete(&mut reply),
                b'D' => {
                    if frame.body().first() == Some(&b'S') {
                        protocol::parameter_description(&mut reply, &[]);
                    }
                    protocol::put_message(&mut reply, b'n', |_| {});
                }
                b'E' => {
                    self.end_failed_transaction();
                    protocol::command_complete(&mut reply, "ROLLBACK");
                }
                b'C' => protocol::close_complete(&mut reply),
                b'S' => protocol::ready_for_query(&mut reply, self.client_status()),
                _ => {}
            }
        }
        self.reply(reply);
        Ok(())
    }

    /// Whether every statement the held request parses or executes ends a transaction
    /// (and it names no statement it cannot vouch for).
    fn batch_only_ends_transaction(&mut self) -> Result<bool, FrontendError> {
        let ends = |kind: &StatementKind| matches!(kind, StatementKind::Commit | StatementKind::Rollback);
        // Statements this request parses (each one was checked to end a transaction).
        let mut parsed_unnamed = false;
        let mut parsed_named: Vec<Bytes> = Vec::new();
        for frame in &self.batch {
            match frame.tag {
                b'P' => {
                    let p = protocol::parse_view(frame.body())
                        .ok_or_else(|| FrontendError::malformed("Parse"))?;
                    let analysis = self.recent.get_or_analyze(&self.shared.router, p.query);
                    if !ends(&analysis.kind) || self.statement_room(p.name, p.query, p.param_types).is_err() {
                        return Ok(false);
                    }
                    match p.name {
                        b"" => parsed_unnamed = true,
                        name => parsed_named.push(Bytes::copy_from_slice(name)),
                    }
                }
                b'B' => {
                    let b =
                        protocol::bind_view(frame.body()).ok_or_else(|| FrontendError::malformed("Bind"))?;
                    let ok = match b.statement {
                        b"" => parsed_unnamed || self.unnamed.as_ref().is_some_and(|a| ends(&a.kind)),
                        name => {
                            parsed_named.iter().any(|n| n.as_ref() == name)
                                || self.bound_analysis(name).is_some_and(|a| ends(&a.kind))
                        }
                    };
                    if !ok {
                        return Ok(false);
                    }
                }
                b'D' | b'E' | b'C' | b'S' | b'H' => {}
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    /// The client ended its failed transaction: nothing of it is left anywhere.
    pub(super) fn end_failed_transaction(&mut self) {
        if matches!(self.tx, super::ClientTx::Failed) {
            self.tx = super::ClientTx::Idle;
            self.end_client_transaction(false);
        }
    }
}
