//! Errors of the client side. `is_fatal` says whether the client connection ends;
//! every other error is answered with an ErrorResponse and the session goes on.

use crate::backend::CheckoutError;
use crate::directory::{ShardId, TenantId};
use crate::protocol::{ErrorFields, FrameError};
use crate::router::RouteError;
use crate::snowflake::SnowflakeError;

#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    // --- the connection ends ---
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("password authentication failed for user \"{user}\"")]
    AuthFailed { user: String },
    /// The database could not say whether the login exists (`[auth] query`).
    #[error("cannot check the password of user \"{user}\": {reason}")]
    AuthSource { user: String, reason: String },
    #[error("too many clients: pgtenant accepts at most {max}")]
    TooManyClients { max: usize },
    #[error("too many clients for user \"{user}\": at most {max} at once (max_user_client_connections)")]
    TooManyUserClients { user: String, max: usize },
    /// An admin's DISABLE: as PostgreSQL answers a database with datallowconn off.
    #[error("database \"{database}\" is not currently accepting connections (admin DISABLE)")]
    DatabaseDisabled { database: String },
    #[error(
        "permission denied for database \"{database}\": the admin console is open to users with admin = true only, not to \"{user}\""
    )]
    NotAdmin { user: String, database: String },
    #[error(transparent)]
    Paused(#[from] crate::tenancy::StillPaused),
    #[error("startup did not complete within {ms} ms")]
    StartupTimeout { ms: u64 },
    #[error("{0}")]
    Unsupported(String),
    #[error("invalid startup parameter: {0}")]
    BadStartupParameter(String),
    #[error("pgtenant is shutting down")]
    ShuttingDown,
    #[error("terminating connection due to administrator command (KILL in the admin console)")]
    Killed,
    /// `pg_terminate_backend` of the client's own pid, or of a sibling's (see
    /// `session::proxy_call`), as PostgreSQL words it.
    #[error("terminating connection due to administrator command")]
    Terminated,
    #[error("terminating connection: idle in transaction for more than {ms} ms")]
    IdleInTransaction { ms: u64 },
    /// `client_idle_timeout_ms`: as PostgreSQL's `idle_session_timeout` words it.
    #[error("terminating connection due to idle-session timeout ({ms} ms)")]
    IdleSession { ms: u64 },
    /// `transaction_timeout_ms`: as PostgreSQL 17's `transaction_timeout` words it.
    #[error("terminating connection due to transaction timeout ({ms} ms)")]
    TransactionTimeout { ms: u64 },
    /// `query_timeout_ms` (PgBouncer's `query_timeout`): a request the server did not
    /// answer in time is canceled there, and the session ends.
    #[error("canceling statement due to query_timeout: no answer from shard {} within {ms} ms; the session ends", .shard.map_or("?".to_string(), |s| s.to_string()))]
    QueryTimeout { ms: u64, shard: Option<ShardId> },
    /// The server refused the login made for this client; its fields go to the client.
    #[error("{}", .0.message)]
    ServerRefused(ErrorFields),
    /// The server connection that held this client's session state (its transaction
    /// block, a pin, session pooling) ended: as on PostgreSQL, so does the session,
    /// with the server's own FATAL when it sent one.
    #[error("lost the server connection of shard {shard}, which held this session's state: {reason}")]
    ServerGone { shard: ShardId, reason: String, fatal: Option<ErrorFields> },
    #[error("client I/O: {0}")]
    Io(#[from] std::io::Error),

    // --- answered, the session goes on ---
    #[error("{0}")]
    Route(#[from] RouteError),
    #[error("{0}")]
    Checkout(#[from] CheckoutError),
    #[error("lost the server connection of shard {shard}: {reason}")]
    ServerLost { shard: ShardId, reason: String },
    /// A cancel came while the request waited in pgtenant, before any server ran it.
    #[error("canceling statement due to user request (it was waiting in pgtenant and reached no server)")]
    CanceledWaiting,
    /// A cancel came while the request was queued on a pipelined lane behind another
    /// client's: it ends at once, and its answer is dropped when it comes.
    #[error(
        "canceling statement due to user request (it was queued behind another client's read on a shared server connection; its answer is dropped)"
    )]
    CanceledQueued,
    /// `pg_cancel_backend` of the client's own pid: its statement is canceled.
    #[error("canceling statement due to user request")]
    CanceledOwn,
    /// A statement that names a server-wide view or function of other sessions.
    #[error(
        "{object} reaches the other sessions of the server, which other tenants share{}: pgtenant refuses it \
         (pg_backend_pid(), pg_cancel_backend() and pg_terminate_backend() of this session's own pid are answered; \
         the admin console's SHOW CLIENTS lists this proxy's sessions)",
        tenant.as_ref().map(|t| format!(" with tenant {t}")).unwrap_or_default()
    )]
    OtherSessions { object: String, tenant: Option<TenantId> },
    #[error(
        "prepared statement name \"{name}\" is reserved: names beginning with \"__pgtenant_\" are pgtenant's own on the server"
    )]
    ReservedStatementName { name: String },
    #[error("current transaction is aborted, commands ignored until end of transaction block")]
    InFailedTransaction,
    #[error("prepared statement \"{name}\" does not exist")]
    StatementNotFound { name: String },
    #[error(
        "out of memory for prepared statements: this session's hold {held} bytes, and the next would pass its limit of {budget} (max_client_statement_bytes); close some (Close, DEALLOCATE) first"
    )]
    StatementBudget { held: usize, budget: usize },
    #[error("at most {max} portals of DEALLOCATE statements may be open at once")]
    TooManyDeallocatePortals { max: usize },
    #[error("cannot change {param} inside a transaction block")]
    TenantChangeInTransaction { param: String },
    #[error("invalid value for {param}: \"{value}\" ({expected})")]
    BadSettingValue { param: String, value: String, expected: &'static str },
    #[error(
        "this transaction runs on shard {current}; tenant {tenant} lives on shard {other} (no cross-shard transactions)"
    )]
    CrossShard { current: ShardId, tenant: TenantId, other: ShardId },
    #[error("{param} is pgtenant's to set: SET LOCAL and set_config() on it are refused; use SET {param}")]
    TenantGucProtected { param: String },
    #[error(
        "{name} is pgtenant's own setting (the tenant's signature, which row-level security checks): SET, RESET and set_config() of it are refused"
    )]
    SettingProtected { name: &'static str },
    #[error(
        "this session is bound to tenant {tenant} at login; {param} cannot be changed (allow_tenant_switch)"
    )]
    TenantFixed { tenant: TenantId, param: String },
    #[error(
        "strict isolation: {table} on shard {shard} has no forced row-level security, and the statement is not confined to tenant {tenant} (one table, its tenant column = {tenant} in a top-level AND of its WHERE)"
    )]
    StrictIsolation { tenant: TenantId, shard: ShardId, table: String },
    #[error("strict isolation: cannot read which tables of shard {shard} hold tenants: {reason}")]
    StrictCatalog { shard: ShardId, reason: String },
    #[error("tenant {tenant} is {state} on shard {shard}: writes are refused, reads are served")]
    TenantReadOnly { tenant: TenantId, shard: ShardId, state: &'static str },
    /// A statement would take down the read-only wall of a tenant that may not write.
    #[error("tenant {tenant} is {state} on shard {shard}: {what} would let it write, and is refused")]
    ReadOnlyWall { tenant: TenantId, shard: ShardId, state: &'static str, what: &'static str },
    #[error("the session is pinned to shard {shard} by {reason}; this request belongs on shard {other}")]
    PinnedElsewhere { shard: ShardId, reason: &'static str, other: ShardId },
    #[error(
        "SET/RESET {param} and SHOW pgtenant.routing_version are answered by pgtenant: send them in a request \
         of their own, not together with other statements"
    )]
    ExtendedTenantSet { param: String },
    #[error("{0}")]
    Snowflake(#[from] SnowflakeError),
    #[error("{0}")]
    Scatter(#[from] crate::admin::scatter::ScatterError),
    #[error("SET/RESET {param} must be sent as a statement of its own, not in a multi-statement string")]
    TenantSetAmongMany { param: String },
}

impl FrontendError {
    /// A client message that does not parse as its type.
    pub fn malformed(what: &str) -> Self {
        FrontendError::Protocol(format!("malformed {what} message"))
    }

    /// A message that needs the attached server, with none attached.
    pub fn no_server() -> Self {
        FrontendError::Protocol("no server attached".into())
    }

    /// Whether the client connection must end after reporting this error.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Self::Protocol(_)
                | Self::Frame(_)
                | Self::AuthFailed { .. }
                | Self::AuthSource { .. }
                | Self::TooManyClients { .. }
                | Self::TooManyUserClients { .. }
                | Self::DatabaseDisabled { .. }
                | Self::NotAdmin { .. }
                | Self::StartupTimeout { .. }
                | Self::Unsupported(_)
                | Self::BadStartupParameter(_)
                | Self::ShuttingDown
                | Self::Killed
                | Self::Terminated
                | Self::IdleInTransaction { .. }
                | Self::IdleSession { .. }
                | Self::TransactionTimeout { .. }
                | Self::QueryTimeout { .. }
                | Self::ServerRefused(_)
                | Self::ServerGone { .. }
                | Self::Io(_)
        )
    }
}

impl From<&crate::router::BadSetting> for FrontendError {
    fn from(bad: &crate::router::BadSetting) -> Self {
        FrontendError::BadSettingValue {
            param: bad.param.clone(),
            value: bad.value.clone(),
            expected: bad.expected,
        }
    }
}
