//! Talking to a shard's connection directly, outside the session's relay: the scatter
//! run's reads up to ReadyForQuery, its parameter-type sections, its I/O errors.

use crate::backend::{BackendError, MAX_SERVER_MESSAGE, ServerConn};
use crate::protocol::{self, ErrorFields, Frame, TxStatus};

/// Written out once this much is buffered.
pub(super) const FLUSH_BYTES: usize = 64 * 1024;

pub(super) fn io_error(conn: &ServerConn) -> impl Fn(std::io::Error) -> BackendError + '_ {
    move |source| BackendError::Io { addr: conn.addr.clone(), source }
}

pub(super) fn type_section(types: &[u32]) -> Vec<u8> {
    let mut b = Vec::with_capacity(2 + 4 * types.len());
    b.extend_from_slice(&(types.len() as i16).to_be_bytes());
    for t in types {
        b.extend_from_slice(&t.to_be_bytes());
    }
    b
}

/// Reads until ReadyForQuery, handing every other message to `each`; the first error's fields.
pub(super) async fn read_until_ready(
    conn: &mut ServerConn,
    mut each: impl FnMut(&Frame),
) -> Result<Option<ErrorFields>, BackendError> {
    let mut error = None;
    loop {
        let frame = conn.io.read_frame(MAX_SERVER_MESSAGE).await.map_err(io_error(conn))?;
        let Some(frame) = frame else {
            return Err(BackendError::Protocol {
                addr: conn.addr.clone(),
                message: "server closed the connection".into(),
            });
        };
        match frame.tag {
            b'Z' => {
                conn.status =
                    frame.body().first().copied().and_then(TxStatus::from_byte).unwrap_or(TxStatus::Failed);
                return Ok(error);
            }
            b'E' => {
                error.get_or_insert_with(|| protocol::error_fields(frame.body()));
            }
            b'S' => {
                if let Some((name, value)) = protocol::parameter_status(frame.body()) {
                    conn.set_param(name, value);
                }
            }
            _ => each(&frame),
        }
    }
}
