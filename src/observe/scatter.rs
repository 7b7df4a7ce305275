//! Counters of scatter-gather statements: how each ended (answered, partial, refused,
//! failed by the statement or by a shard, canceled), how long they took, and how long
//! each shard took to send its part.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How one scatter-gather statement ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every shard answered.
    Answered,
    /// Answered without some shards (`pgtenant.scatter = partial`).
    Partial,
    /// Refused by pgtenant before anything ran (not mergeable, not allowed, not read-only).
    Refused,
    /// PostgreSQL raised an error on the statement itself (a missing column, a bad cast).
    StatementFailed,
    /// A shard failed, timed out or had no primary.
    ShardFailed,
    /// Canceled by its client.
    Canceled,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Outcome::Answered,
        Outcome::Partial,
        Outcome::Refused,
        Outcome::StatementFailed,
        Outcome::ShardFailed,
        Outcome::Canceled,
    ];

    /// The `outcome` label of `pgtenant_scatter_statements_total`.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Answered => "answered",
            Outcome::Partial => "partial",
            Outcome::Refused => "refused",
            Outcome::StatementFailed => "failed_by_statement",
            Outcome::ShardFailed => "failed_by_shard",
            Outcome::Canceled => "canceled",
        }
    }
}

static OUTCOMES: [AtomicU64; Outcome::ALL.len()] = [const { AtomicU64::new(0) }; Outcome::ALL.len()];
static TOTAL_US: AtomicU64 = AtomicU64::new(0);
/// Per shard: parts sent, and their summed time in microseconds.
static SHARDS: Mutex<BTreeMap<u32, (u64, u64)>> = Mutex::new(BTreeMap::new());

/// Counts a statement that ended as `outcome` after `took`, each shard's part taking
/// `shard_us` (shard, µs).
pub fn record(outcome: Outcome, took: Duration, shard_us: &[(u32, u64)]) {
    OUTCOMES[outcome as usize].fetch_add(1, Ordering::Relaxed);
    TOTAL_US.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    if shard_us.is_empty() {
        return;
    }
    let mut shards = SHARDS.lock().unwrap_or_else(|e| e.into_inner());
    for (shard, us) in shard_us {
        let entry = shards.entry(*shard).or_default();
        entry.0 += 1;
        entry.1 += us;
    }
}

/// What the counters hold now.
pub struct ScatterSnapshot {
    /// Statements per outcome, in `Outcome::ALL` order.
    pub outcomes: Vec<(Outcome, u64)>,
    pub total_us: u64,
    /// `(shard, parts, summed microseconds)`.
    pub shards: Vec<(u32, u64, u64)>,
}

pub fn snapshot() -> ScatterSnapshot {
    let shards = SHARDS.lock().unwrap_or_else(|e| e.into_inner());
    ScatterSnapshot {
        outcomes: Outcome::ALL.iter().map(|o| (*o, OUTCOMES[*o as usize].load(Ordering::Relaxed))).collect(),
        total_us: TOTAL_US.load(Ordering::Relaxed),
        shards: shards.iter().map(|(s, (n, us))| (*s, *n, *us)).collect(),
    }
}
