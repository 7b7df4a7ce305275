//! `DEALLOCATE name` of one of the client's protocol-level statements, sent through
//! the extended protocol (psycopg 3 in a pipeline, with a libpq before 17, lets its
//! cached statements go this way). The server knows such a statement by pgtenant's
//! shared name, not the client's, and shares it with other clients: forgetting the
//! client's name is all the DEALLOCATE must do, so it is answered here, in line with
//! whatever else the request carries (`Session::reply` keeps the order). The simple
//! protocol's DEALLOCATE is answered in `simple`; a name pgtenant does not know (an SQL
//! PREPARE on a pinned connection) goes to the server as before.
//!
//! Only the unnamed statement is handled (drivers send it so); its Parse is answered in
//! `Session::forward_parse`, which notes the name in `unnamed_deallocates`.

use bytes::{Bytes, BytesMut};

use super::Session;
use crate::frontend::error::FrontendError;
use crate::protocol::{self, Frame, TxStatus};
use crate::router::{Analysis, StatementKind};

/// Portals bound to a DEALLOCATE per session at most.
const MAX_DEALLOCATE_PORTALS: usize = 64;

impl Session {
    /// The client statement a DEALLOCATE's text names, when pgtenant answers for it
    /// (in either protocol).
    pub(super) fn deallocated_here(&self, analysis: &Analysis) -> Option<Bytes> {
        match &analysis.kind {
            StatementKind::Deallocate(name) if !analysis.is_multi => {
                self.statements.get_key_value(name.as_bytes()).map(|(key, _)| key.clone())
            }
            _ => None,
        }
    }

    /// Handles a Bind, Describe, Execute or Close that concerns a DEALLOCATE answered
    /// here; `false` leaves the message to the other handlers.
    pub(super) fn deallocate_message(&mut self, frame: &Frame) -> Result<bool, FrontendError> {
        let body = frame.body();
        let mut reply = BytesMut::new();
        match frame.tag {
            b'B' => {
                let bind = protocol::bind_view(body).ok_or_else(|| FrontendError::malformed("Bind"))?;
                let name = match &self.unnamed_deallocates {
                    Some(name) if bind.statement.is_empty() => name.clone(),
                    _ => {
                        // The portal now belongs to another statement.
                        if !self.deallocate_portals.is_empty() {
                            self.deallocate_portals.remove(bind.portal);
                        }
                        return Ok(false);
                    }
                };
                if self.deallocate_portals.len() >= MAX_DEALLOCATE_PORTALS
                    && !self.deallocate_portals.contains_key(bind.portal)
                {
                    return Err(FrontendError::TooManyDeallocatePortals { max: MAX_DEALLOCATE_PORTALS });
                }
                self.local_portals.remove(bind.portal);
                self.deallocate_portals.insert(Bytes::copy_from_slice(bind.portal), name);
                protocol::bind_complete(&mut reply);
            }
            b'D' => {
                let (kind, name) =
                    protocol::target_view(body).ok_or_else(|| FrontendError::malformed("Describe"))?;
                match kind {
                    b'P' if self.deallocate_portals.contains_key(name) => {}
                    b'S' if name.is_empty() && self.unnamed_deallocates.is_some() => {
                        protocol::parameter_description(&mut reply, &[]);
                    }
                    _ => return Ok(false),
                }
                protocol::put_message(&mut reply, b'n', |_| {});
            }
            b'E' => {
                let (portal, _) =
                    protocol::split_cstr(body).ok_or_else(|| FrontendError::malformed("Execute"))?;
                let Some(name) = self.deallocate_portals.remove(portal) else { return Ok(false) };
                if self.client_status() == TxStatus::Failed {
                    return Err(FrontendError::InFailedTransaction);
                }
                if self.statements.remove(&name).is_none() {
                    // Let go since the Bind, as a server would report it.
                    return Err(FrontendError::StatementNotFound {
                        name: String::from_utf8_lossy(&name).into_owned(),
                    });
                }
                protocol::command_complete(&mut reply, "DEALLOCATE");
            }
            b'C' => {
                let (kind, name) =
                    protocol::target_view(body).ok_or_else(|| FrontendError::malformed("Close"))?;
                match kind {
                    b'P' if self.deallocate_portals.remove(name).is_some() => {
                        protocol::close_complete(&mut reply)
                    }
                    b'S' if name.is_empty() => {
                        // The server closes its own unnamed statement; this one is gone too.
                        self.unnamed_deallocates = None;
                        return Ok(false);
                    }
                    _ => return Ok(false),
                }
            }
            _ => return Ok(false),
        }
        self.reply(reply);
        Ok(true)
    }
}
