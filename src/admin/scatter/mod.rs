//! Scatter-gather: one read-only SELECT over `all_shards.<table>` runs on every shard
//! in parallel, and its answer is the one PostgreSQL would give from one database
//! holding every shard's rows (see `plan` for how, `run` for the I/O).

mod aggregates;
mod coordinator;
mod error;
pub mod plan;
pub mod request;
pub mod run;
mod wire;

pub use error::ScatterError;
pub use plan::{Plan, Scatter, mentions_all_shards, parse};
pub use request::{Link, Outcome, Policy, Prepared, Request};
pub use run::{execute, prepare, ready};
