//! I/O-free PostgreSQL wire protocol: framing of raw messages, lazy views of the few
//! messages that routing and state tracking inspect, and builders for the replies that
//! pgtenant answers itself.
//!
//! Invariant: a forwarded message is always the client's or server's original bytes;
//! views only read from a copy-free `Bytes` slice and never re-encode.

/// The prefix of every name pgtenant gives things on a server (prepared statements,
/// the scatter planner's aliases and tables): a client's SQL may not use it where the
/// server would share the name with pgtenant's.
pub const RESERVED_PREFIX: &str = "__pgtenant_";

mod build;
mod describe;
mod frame;
mod messages;
pub mod scram;
pub mod sqlstate;
pub mod values;

pub use build::*;
pub use describe::*;
pub use frame::{Frame, FrameError, StartupPacket, frame_header, read_startup_frame, try_parse_frame};
pub use messages::*;
pub use values::{
    BOOL_OID, Column, INT2_OID, INT4_OID, INT8_OID, TIMESTAMPTZ_OID, Value, data_row, parameter_description,
    row_description, text_row_description,
};
