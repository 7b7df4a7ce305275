//! Errors of the server side: connecting and logging in to a server, and checking
//! a connection out of a pool. All happen before any client byte reached a server.

use crate::directory::ShardId;
use crate::protocol::ErrorFields;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: String, source: std::io::Error },
    #[error("timed out connecting to {addr}")]
    ConnectTimeout { addr: String },
    /// The server answered the login with an ErrorResponse (bad database, bad password, ...).
    #[error("server {addr} refused the login: {} ({})", .fields.message, .fields.code)]
    Refused { addr: String, fields: ErrorFields },
    #[error("server {addr} asked for {method} authentication, which pgtenant does not support")]
    UnsupportedAuth { addr: String, method: String },
    #[error("server {addr} asked for a password but none is configured for user {user}")]
    NoPassword { addr: String, user: String },
    /// A role logging in as itself (SCRAM passthrough) that this server does not let in
    /// that way.
    #[error("server {addr} cannot take role {user} passed through: {reason}")]
    Passthrough { addr: String, user: String, reason: crate::protocol::scram::PassthroughError },
    /// `max_db_connections` / `max_user_connections`: no slot came free in time.
    #[error(
        "too many server connections for {what}: at most {max} (max_db_connections / max_user_connections), none came free in time"
    )]
    Capped { what: String, max: usize },
    #[error(
        "no server connection free now under {what}: at most {max} (max_db_connections / max_user_connections)"
    )]
    CappedNow { what: String, max: usize },
    #[error("TLS to server {addr}: {message}")]
    Tls { addr: String, message: String },
    #[error("protocol error from server {addr}: {message}")]
    Protocol { addr: String, message: String },
    #[error("I/O error with server {addr}: {source}")]
    Io { addr: String, source: std::io::Error },
}

impl BackendError {
    /// Whether the server is gone rather than unwilling: nothing listens, the
    /// connection broke, or it is shutting down or not yet up. A failover is then
    /// likely under way.
    pub fn server_is_gone(&self) -> bool {
        match self {
            BackendError::Connect { .. } | BackendError::ConnectTimeout { .. } | BackendError::Io { .. } => {
                true
            }
            BackendError::Refused { fields, .. } => {
                use crate::protocol::sqlstate::{ADMIN_SHUTDOWN, CANNOT_CONNECT_NOW, CRASH_SHUTDOWN};
                [ADMIN_SHUTDOWN, CRASH_SHUTDOWN, CANNOT_CONNECT_NOW].contains(&fields.code.as_str())
            }
            _ => false,
        }
    }
}

/// Why no server connection could be checked out.
#[derive(Debug, thiserror::Error)]
pub enum CheckoutError {
    #[error("all {size} server connections of shard {shard} are busy (waited {waited_ms} ms)")]
    Exhausted { shard: ShardId, size: usize, waited_ms: u64 },
    #[error("shard {shard} is unreachable: {source}")]
    Unreachable { shard: ShardId, source: BackendError },
    #[error("shard {shard} is not configured")]
    UnknownShard { shard: ShardId },
    #[error("the pool of shard {shard} is closed")]
    Closed { shard: ShardId },
    #[error("shard {shard} has no healthy replica within the lag limit (pgtenant.target = replica)")]
    NoReplica { shard: ShardId },
    #[error("shard {shard} has no primary to serve this: {reason} (waited {waited_ms} ms)")]
    NoPrimary { shard: ShardId, reason: String, waited_ms: u64 },
}
