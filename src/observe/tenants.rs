//! Per-tenant statistics, bounded whatever the number of tenants: for each shard, the
//! tenants with the most transactions, kept by the space-saving algorithm (Metwally,
//! Agrawal, El Abbadi 2005) in `top_k` slots. A tenant not among them takes the slot of
//! the one with the fewest transactions and inherits its count as its error bound, so a
//! kept tenant's transactions lie within `[transactions - error, transactions]`, and
//! every tenant with more than 1/K of the shard's transactions is kept. The other
//! figures (requests, server time, bytes, errors, waits for a connection) are exact from when the tenant took
//! its slot. Each slot also holds the figures of the last complete window
//! (`window_ms`) and of the one under way.
//!
//! Sessions record a transaction's requests added up, once it ends, under one shard's
//! lock; a slot is found by a hash lookup, and nothing allocates once the K slots exist.

use std::sync::{Mutex, RwLock};

use std::hash::Hash;

/// A shard's number (`directory::ShardId`; this layer imports no other).
pub type ShardId = u16;

/// What a tenant did, added up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    pub transactions: u64,
    pub requests: u64,
    /// Time servers took over its requests.
    pub server_us: u64,
    /// Bytes its servers sent it.
    pub bytes_out: u64,
    /// Requests that got an ErrorResponse.
    pub errors: u64,
    /// Checkouts that waited for a place in a full pool.
    pub waits: u64,
}

impl Figures {
    pub fn add(&mut self, o: &Figures) {
        self.transactions += o.transactions;
        self.requests += o.requests;
        self.server_us += o.server_us;
        self.bytes_out += o.bytes_out;
        self.errors += o.errors;
        self.waits += o.waits;
    }
}

/// One kept tenant of a shard.
#[derive(Clone, Debug)]
pub struct TenantRow<T> {
    pub shard: ShardId,
    pub tenant: T,
    /// Since it took its slot (its transactions include `error`).
    pub total: Figures,
    /// How many of `total.transactions` may be another tenant's (space-saving's bound).
    pub error: u64,
    /// The last complete window.
    pub recent: Figures,
}

struct Slot<T> {
    tenant: T,
    error: u64,
    total: Figures,
    current: Figures,
    previous: Figures,
}

struct Sketch<T> {
    slots: Vec<Slot<T>>,
    index: foldhash::HashMap<T, usize>,
    /// When the window under way ends (on the callers' clock, in ms).
    window_end_ms: u64,
}

/// Every shard's sketch, of tenants `T` (`directory::TenantId`).
pub struct TenantStats<T> {
    top_k: usize,
    window_ms: u64,
    shards: RwLock<foldhash::HashMap<ShardId, Mutex<Sketch<T>>>>,
}

impl<T: Clone + Eq + Hash> TenantStats<T> {
    /// `top_k` tenants per shard (0: none kept), windows of `window_ms`.
    pub fn new(top_k: usize, window_ms: u64) -> Self {
        TenantStats { top_k, window_ms: window_ms.max(1), shards: RwLock::default() }
    }

    /// Adds what `tenant` did on `shard`; `now_ms`: a coarse clock the callers share
    /// (`backend::coarse_clock::coarse_ms`).
    pub fn record(&self, shard: ShardId, tenant: &T, figures: Figures, now_ms: u64) {
        if self.top_k == 0 {
            return;
        }
        let add = |sketch: &Mutex<Sketch<T>>| {
            let mut sketch = sketch.lock().unwrap_or_else(|e| e.into_inner());
            sketch.roll_window(self.window_ms, now_ms);
            sketch.add(tenant, &figures, self.top_k);
        };
        if let Some(sketch) = self.shards.read().unwrap_or_else(|e| e.into_inner()).get(&shard) {
            return add(sketch);
        }
        let mut shards = self.shards.write().unwrap_or_else(|e| e.into_inner());
        let fresh = || {
            let (slots, index) = (Vec::with_capacity(self.top_k), foldhash::HashMap::default());
            Mutex::new(Sketch { slots, index, window_end_ms: now_ms + self.window_ms })
        };
        add(shards.entry(shard).or_insert_with(fresh));
    }

    /// The kept tenants of `shard` (every shard's when `None`).
    pub fn rows(&self, shard: Option<ShardId>, now_ms: u64) -> Vec<TenantRow<T>> {
        let shards = self.shards.read().unwrap_or_else(|e| e.into_inner());
        let mut rows = Vec::new();
        for (&id, sketch) in shards.iter().filter(|(s, _)| shard.is_none_or(|want| want == **s)) {
            let mut sketch = sketch.lock().unwrap_or_else(|e| e.into_inner());
            sketch.roll_window(self.window_ms, now_ms);
            rows.extend(sketch.slots.iter().map(|s| TenantRow {
                shard: id,
                tenant: s.tenant.clone(),
                total: s.total,
                error: s.error,
                recent: s.previous,
            }));
        }
        rows
    }

    /// How many tenants each shard keeps.
    pub fn top_k(&self) -> usize {
        self.top_k
    }
}

impl<T: Clone + Eq + Hash> Sketch<T> {
    /// Ends the window under way once its time is up (and a window without any record
    /// in between: the last complete one was then empty).
    fn roll_window(&mut self, window_ms: u64, now: u64) {
        if now < self.window_end_ms {
            return;
        }
        let skipped = now - self.window_end_ms >= window_ms;
        for slot in &mut self.slots {
            slot.previous = if skipped { Figures::default() } else { slot.current };
            slot.current = Figures::default();
        }
        self.window_end_ms = now + window_ms - (now - self.window_end_ms) % window_ms;
    }

    fn add(&mut self, tenant: &T, figures: &Figures, top_k: usize) {
        if let Some(&i) = self.index.get(tenant) {
            let slot = &mut self.slots[i];
            slot.total.add(figures);
            slot.current.add(figures);
            return;
        }
        if self.slots.len() < top_k {
            self.index.insert(tenant.clone(), self.slots.len());
            self.slots.push(Slot {
                tenant: tenant.clone(),
                error: 0,
                total: *figures,
                current: *figures,
                previous: Figures::default(),
            });
            return;
        }
        // Space-saving: only a transaction takes a slot, that of the fewest transactions.
        if figures.transactions == 0 {
            return;
        }
        let Some((i, least)) = self
            .slots
            .iter()
            .enumerate()
            .min_by_key(|(_, s)| s.total.transactions)
            .map(|(i, s)| (i, s.total.transactions))
        else {
            return;
        };
        let mut total = *figures;
        total.transactions += least;
        let slot = Slot {
            tenant: tenant.clone(),
            error: least,
            total,
            current: *figures,
            previous: Figures::default(),
        };
        let old = std::mem::replace(&mut self.slots[i], slot);
        self.index.remove(&old.tenant);
        self.index.insert(tenant.clone(), i);
    }
}

#[cfg(test)]
mod tests {
    use super::{Figures, TenantStats};

    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    enum TenantId {
        Int(i64),
    }

    fn tx(n: u64) -> Figures {
        Figures { transactions: n, requests: n, server_us: 10 * n, bytes_out: 100 * n, ..Figures::default() }
    }

    /// Tenants 1 and 2 do 200 transactions each, 3 does 100, and 50 others one each,
    /// in the order `light_first` says.
    fn run(top_k: usize) -> Vec<super::TenantRow<TenantId>> {
        let stats = TenantStats::new(top_k, 60_000);
        for _ in 0..100 {
            for t in [1, 2, 3] {
                stats.record(1, &TenantId::Int(t), tx(1), 0);
            }
        }
        for t in 100..150 {
            stats.record(1, &TenantId::Int(t), tx(1), 0);
        }
        for _ in 0..100 {
            for t in [1, 2] {
                stats.record(1, &TenantId::Int(t), tx(1), 0);
            }
        }
        stats.rows(Some(1), 0)
    }

    #[test]
    fn keeps_the_heaviest_tenants_exactly_when_the_light_ones_share_a_slot() {
        let rows = run(4);
        assert_eq!(rows.len(), 4, "bounded by K");
        for (t, n) in [(1, 200), (2, 200), (3, 100)] {
            let row = rows.iter().find(|r| r.tenant == TenantId::Int(t)).expect("a heavy tenant is kept");
            assert_eq!((row.total.transactions, row.error, row.total.server_us), (n, 0, 10 * n), "exact");
        }
        let light = rows.iter().find(|r| r.tenant == TenantId::Int(149)).expect("the last light one");
        assert_eq!((light.total.transactions, light.error), (50, 49), "its one transaction within the bound");
    }

    #[test]
    fn every_tenant_above_one_kth_is_kept_within_its_bound() {
        // 550 transactions, K = 3: tenants 1 and 2 (200 each) are above 550 / 3.
        let rows = run(3);
        for t in [1, 2] {
            let row = rows.iter().find(|r| r.tenant == TenantId::Int(t)).expect("kept");
            assert!(row.total.transactions >= 200 && row.total.transactions - row.error <= 200, "{row:?}");
        }
        let stats = TenantStats::new(3, 60_000);
        // Another shard is counted apart; with room, a request alone takes a slot.
        stats.record(2, &TenantId::Int(9), Figures { requests: 1, ..Figures::default() }, 0);
        assert_eq!(stats.rows(Some(2), 0).len(), 1);
        assert_eq!(stats.rows(Some(1), 0).len(), 0);
    }

    #[test]
    fn off_keeps_nothing() {
        let stats = TenantStats::new(0, 60_000);
        stats.record(1, &TenantId::Int(1), tx(1), 0);
        assert!(stats.rows(None, 0).is_empty());
    }
}

#[cfg(test)]
mod window_tests {
    use super::{Figures, TenantStats};

    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    enum TenantId {
        Int(i64),
    }

    #[test]
    fn the_recent_window_is_the_last_complete_one() {
        let stats = TenantStats::new(2, 1_000);
        let one = Figures { transactions: 1, ..Figures::default() };
        stats.record(1, &TenantId::Int(7), one, 0);
        stats.record(1, &TenantId::Int(7), one, 500);
        assert_eq!(stats.rows(None, 900)[0].recent.transactions, 0, "the first window is under way");
        stats.record(1, &TenantId::Int(7), one, 1_100);
        let row = &stats.rows(None, 1_200)[0];
        assert_eq!((row.recent.transactions, row.total.transactions), (2, 3));
        assert_eq!(stats.rows(None, 5_000)[0].recent.transactions, 0, "quiet windows since");
    }
}
