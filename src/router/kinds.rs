//! What the session acts on in a statement: its kind (transaction control, SET/RESET
//! of settings or of the tenant, the calls pgtenant answers), the session settings it
//! changes, why it pins a server connection, and pgtenant's own names in SQL.

use super::proxy_call::ProxySelect;
use crate::directory::TenantId;

/// The parameter that says where a session's provably read-only requests may go.
pub const TARGET_PARAMETER: &str = "pgtenant.target";

/// The session setting that says what a scatter-gather does when a shard fails.
pub const SCATTER_PARAMETER: &str = "pgtenant.scatter";

/// The pseudo-schema that names a table on every shard (scatter-gather).
pub const ALL_SHARDS: &str = "all_shards";

/// The setting name under which the proxy reports the routing version it serves.
pub const ROUTING_VERSION: &str = "pgtenant.routing_version";

/// A value a SET gave one of pgtenant's parameters that it cannot take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadSetting {
    pub param: String,
    pub value: String,
    /// What the parameter takes.
    pub expected: &'static str,
}

/// The statement kinds the session acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StatementKind {
    Begin,
    Commit,
    Rollback,
    /// `SET [SESSION] <tenant parameter> = N`.
    SetTenant(TenantId),
    /// `RESET <tenant parameter>` or `SET <tenant parameter> TO DEFAULT`.
    ResetTenant,
    /// `SET [SESSION] name = value`: a session setting to re-apply on other servers.
    Set {
        name: String,
        value: String,
    },
    Reset {
        name: String,
    },
    ResetAll,
    /// `DISCARD ALL` or `DEALLOCATE ALL`: prepared statements are gone on the server.
    DiscardAll,
    /// `DEALLOCATE [PREPARE] name`: answered by pgtenant when `name` is one of the
    /// client's protocol-level statements (their server names are pgtenant's own).
    Deallocate(String),
    /// A session-level SET whose effect pgtenant cannot re-apply on another server
    /// connection (`SET XML OPTION`, `SET SESSION CHARACTERISTICS` with several modes):
    /// it pins the connection rather than leak to other clients.
    UnfollowedSet,
    /// `SHOW pgtenant.routing_version`: answered by the proxy.
    ShowRoutingVersion,
    /// A call pgtenant answers itself (`SELECT pgtenant.next_id()` and kin,
    /// `SELECT pg_backend_pid()`, the signal functions of it; see `proxy_call`).
    ProxyCall(ProxySelect),
    /// A statement naming an `all_shards.` table: the admin scatter-gather runs it.
    Scatter,
    Other,
}

/// Why a statement ties the server connection to the client until the session ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinReason {
    Listen,
    AdvisoryLock,
    TempTable,
    HoldCursor,
    SqlPrepare,
    RoleChange,
    /// A SET pgtenant cannot re-apply elsewhere (see `StatementKind::UnfollowedSet`),
    /// or SETs in a multi-statement query that also controls its transaction.
    UnfollowedSet,
}

/// A change of session settings that the client expects on every server connection it
/// gets from then on, once the statement that made it has taken effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionChange {
    Set {
        name: String,
        value: String,
    },
    /// `set_config(name, value, false)` whose name, value or both are `$n` parameters:
    /// they arrive with the Bind.
    SetFromParameters {
        name: ConfigArg,
        value: ConfigArg,
    },
    Reset {
        name: String,
    },
    /// `RESET ALL` or `DISCARD ALL`: back to the settings of the client's startup.
    ResetAll,
}

/// An argument of `set_config`: text pgtenant read, or the `$n` parameter it comes in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigArg {
    Text(String),
    Parameter(u16),
}

impl SessionChange {
    pub(super) fn of(kind: &StatementKind) -> Option<Self> {
        match kind {
            StatementKind::Set { name, value } => {
                Some(Self::Set { name: name.clone(), value: value.clone() })
            }
            StatementKind::Reset { name } => Some(Self::Reset { name: name.clone() }),
            StatementKind::ResetAll | StatementKind::DiscardAll => Some(Self::ResetAll),
            _ => None,
        }
    }
}

impl PinReason {
    pub fn describe(self) -> &'static str {
        match self {
            Self::Listen => "LISTEN",
            Self::AdvisoryLock => "a session advisory lock",
            Self::TempTable => "a temporary table",
            Self::HoldCursor => "a WITH HOLD cursor",
            Self::SqlPrepare => "an SQL PREPARE",
            Self::RoleChange => "SET ROLE / SESSION AUTHORIZATION",
            Self::UnfollowedSet => "a SET that pgtenant cannot re-apply on other connections",
        }
    }
}
