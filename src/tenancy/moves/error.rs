//! Why a move command was refused or a move failed.

use tokio_postgres::error::SqlState;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MoveError {
    #[error("tenant moves need a catalog ([catalog] in the configuration)")]
    NoCatalog,
    #[error(
        "name the database whose tables move: MOVE TENANT {tenant} TO SHARD {shard} DATABASE <name> (or set [moves] database)"
    )]
    NoDatabase { tenant: i64, shard: u16 },
    #[error(
        "tenant moves log in to the shards as [moves] user, or else as the first admin user: neither is configured"
    )]
    NoLogin,
    /// The move cannot start or go on as things are (preflight, wrong phase).
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    BadArgument(String),
    /// Another move of the tenant is open.
    #[error("{0}")]
    Busy(String),
    #[error("no move has id {0} (SHOW MOVES lists them)")]
    UnknownMove(i64),
    #[error("the catalog: {0}")]
    Catalog(String),
    #[error("shard {shard}: {reason}")]
    Shard { shard: u16, reason: String },
}

impl MoveError {
    /// A catalog error, by the SQLSTATE its functions raise.
    pub(super) fn from_catalog(e: &tokio_postgres::Error) -> Self {
        match e.as_db_error() {
            Some(db) => match db.code() {
                &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE => MoveError::Refused(db.message().to_string()),
                &SqlState::INVALID_PARAMETER_VALUE => MoveError::BadArgument(db.message().to_string()),
                &SqlState::OBJECT_IN_USE | &SqlState::UNIQUE_VIOLATION => {
                    MoveError::Busy(db.message().to_string())
                }
                _ => MoveError::Catalog(db.message().to_string()),
            },
            None => MoveError::Catalog(e.to_string()),
        }
    }

    pub(super) fn shard(shard: u16) -> impl Fn(tokio_postgres::Error) -> Self {
        move |e| MoveError::Shard {
            shard,
            reason: match e.as_db_error() {
                Some(db) => db.message().to_string(),
                None => e.to_string(),
            },
        }
    }
}
