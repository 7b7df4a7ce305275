//! What can go wrong with a scatter-gather query, one variant per cause; the frontend
//! maps each to its SQLSTATE in `frontend::error_response`.

use crate::directory::ShardId;
use crate::observe::scatter::Outcome;
use crate::protocol::ErrorFields;

#[derive(Debug, thiserror::Error)]
pub enum ScatterError {
    /// A construct whose merged answer would not be what one database holding every
    /// shard's rows returns: refused before anything runs (0A000).
    #[error("scatter-gather (all_shards.) cannot merge {0} exactly across shards")]
    Unmergeable(String),
    #[error("scatter-gather (all_shards.) could not parse the statement: {0}")]
    Unparsed(String),
    #[error(
        "scatter-gather (all_shards.) is open to users with admin = true or scatter_gather = true, not to \"{user}\""
    )]
    NotAllowed { user: String },
    #[error(
        "scatter-gather (all_shards.) reads every tenant: a session bound to tenant {tenant} cannot run it"
    )]
    TenantBound { tenant: String },
    #[error("scatter-gather (all_shards.) runs read-only SELECTs: {0}")]
    NotReadOnly(String),
    #[error("scatter-gather (all_shards.) cannot run in a transaction that already ran on shard {shard}")]
    InTransaction { shard: ShardId },
    /// The statement's own error as PostgreSQL reported it (while describing it, or
    /// from the final statement over all rows): relayed unchanged.
    #[error("{}", .0.message)]
    Statement(ErrorFields),
    /// A shard's own ErrorResponse; its SQLSTATE goes to the client.
    #[error("shard {shard}: {}", .fields.message)]
    Shard { shard: ShardId, fields: ErrorFields },
    #[error("shard {shard} did not answer within {ms} ms (scatter_timeout_ms)")]
    Timeout { shard: ShardId, ms: u64 },
    #[error("shard {shard} is unavailable: {reason}")]
    Unavailable { shard: ShardId, reason: String },
    #[error("no shard has a primary to merge on: {reason}")]
    NoCoordinator { reason: String },
    #[error("canceling statement due to user request")]
    Canceled,
    #[error("fetching a scatter-gather result in parts (Execute with a row limit) is not supported")]
    RowLimit,
    #[error("at most {max} scatter-gather portals may be open at once")]
    TooManyPortals { max: usize },
}

impl ScatterError {
    /// How a statement that ended with this error counts (`observe::scatter`).
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Unmergeable(_)
            | Self::Unparsed(_)
            | Self::NotAllowed { .. }
            | Self::TenantBound { .. }
            | Self::NotReadOnly(_)
            | Self::InTransaction { .. }
            | Self::RowLimit
            | Self::TooManyPortals { .. } => Outcome::Refused,
            Self::Statement(_) => Outcome::StatementFailed,
            // A shard's own error is the statement's (division by zero on its rows) unless
            // it says the shard itself is in trouble (connection, resources, shutdown).
            Self::Shard { fields, .. }
                if !matches!(fields.code.get(..2), Some("08" | "53" | "57" | "58")) =>
            {
                Outcome::StatementFailed
            }
            Self::Shard { .. }
            | Self::Timeout { .. }
            | Self::Unavailable { .. }
            | Self::NoCoordinator { .. } => Outcome::ShardFailed,
            Self::Canceled => Outcome::Canceled,
        }
    }

    /// Whether PostgreSQL raised it (relayed), rather than pgtenant.
    pub fn raised_by_server(&self) -> bool {
        matches!(self, Self::Statement(_) | Self::Shard { .. })
    }
}
