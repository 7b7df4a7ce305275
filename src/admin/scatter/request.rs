//! What a scatter-gather run is given and gives back: the shards' connections, the
//! policy for a shard that cannot answer, the statement as described and planned, one
//! run's parameters, and how it ended.

use std::time::Duration;

use bytes::Bytes;

use super::plan::Plan;
use crate::backend::PooledConn;
use crate::directory::ShardId;

/// A shard's checked-out connection.
pub struct Link {
    pub shard: ShardId,
    pub conn: PooledConn,
}

/// What happens when a shard cannot answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Policy {
    /// The statement fails, naming the shard.
    #[default]
    Strict,
    /// The other shards' rows, with a WARNING naming each missing shard.
    Partial,
}

impl Policy {
    pub fn parse(value: &str) -> Option<Self> {
        match value.trim().trim_matches('\'').to_ascii_lowercase().as_str() {
            "strict" => Some(Self::Strict),
            "partial" => Some(Self::Partial),
            _ => None,
        }
    }
}

/// A statement described and planned, ready to run with parameters.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// The client's statement, for the log.
    pub sql: String,
    pub plan: Plan,
    /// The statement's parameter types (ParameterDescription), as the probe found them.
    pub param_types: Vec<u32>,
    /// The statement's RowDescription body (all text formats); `None` for NoData.
    pub row_description: Option<Bytes>,
    pub(super) final_sql: Option<String>,
}

/// One run of a prepared statement.
pub struct Request<'a> {
    /// The Bind's parameter part (`protocol::bind_parameters`).
    pub parameters: &'a [u8],
    pub result_formats: &'a [i16],
    /// Send the RowDescription (a simple query; an Execute does not).
    pub describe: bool,
    pub policy: Policy,
    pub timeout: Duration,
}

/// How a run ended, for the caller's counters.
#[derive(Debug, Default)]
pub struct Outcome {
    pub rows: u64,
    pub missing: Vec<(ShardId, String)>,
    /// How long each shard took to send its part, in microseconds.
    pub shard_us: Vec<(ShardId, u64)>,
}

/// Why a partial result lacks a shard that did not answer in time.
pub(super) fn timeout_reason(ms: u64) -> String {
    format!("no answer within {ms} ms (scatter_timeout_ms)")
}
