//! Counters of scatter-gather queries: how many ran, failed or came back partial, how
//! long they took, and how long each shard took to send its part.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

static QUERIES: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);
static PARTIAL: AtomicU64 = AtomicU64::new(0);
static TOTAL_US: AtomicU64 = AtomicU64::new(0);
/// Per shard: parts sent, and their summed time in microseconds.
static SHARDS: Mutex<BTreeMap<u32, (u64, u64)>> = Mutex::new(BTreeMap::new());

/// How one scatter-gather query ended.
pub enum Ended<'a> {
    Failed,
    /// Answered; `missing` shards left out (a partial result), each shard's time in µs.
    Answered {
        missing: usize,
        shard_us: &'a [(u32, u64)],
    },
}

pub fn record(ended: Ended<'_>, took: Duration) {
    QUERIES.fetch_add(1, Ordering::Relaxed);
    TOTAL_US.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    match ended {
        Ended::Failed => {
            FAILED.fetch_add(1, Ordering::Relaxed);
        }
        Ended::Answered { missing, shard_us } => {
            if missing > 0 {
                PARTIAL.fetch_add(1, Ordering::Relaxed);
            }
            let mut shards = SHARDS.lock().unwrap_or_else(|e| e.into_inner());
            for (shard, us) in shard_us {
                let entry = shards.entry(*shard).or_default();
                entry.0 += 1;
                entry.1 += us;
            }
        }
    }
}

/// What the counters hold now.
pub struct ScatterSnapshot {
    pub queries: u64,
    pub failed: u64,
    pub partial: u64,
    pub total_us: u64,
    /// `(shard, parts, summed microseconds)`.
    pub shards: Vec<(u32, u64, u64)>,
}

pub fn snapshot() -> ScatterSnapshot {
    let shards = SHARDS.lock().unwrap_or_else(|e| e.into_inner());
    ScatterSnapshot {
        queries: QUERIES.load(Ordering::Relaxed),
        failed: FAILED.load(Ordering::Relaxed),
        partial: PARTIAL.load(Ordering::Relaxed),
        total_us: TOTAL_US.load(Ordering::Relaxed),
        shards: shards.iter().map(|(s, (n, us))| (*s, *n, *us)).collect(),
    }
}
