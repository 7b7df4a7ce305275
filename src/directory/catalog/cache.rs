//! The tenant cache of a catalog directory: moka, bounded, entries expiring after
//! a TTL; tenants the catalog does not place expire sooner, so that a placement
//! whose NOTIFY was lost is still picked up quickly.

use std::time::{Duration, Instant};

use moka::Expiry;
use moka::sync::Cache;

use crate::directory::{Placement, TenantId};

/// What the catalog said about a tenant's explicit placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The `tenant_shard_map` row; `None` when the tenant has none.
    pub explicit: Option<Placement>,
    /// Whether the tenant was placed at all (by its row or by the rules) when cached.
    pub placed: bool,
}

struct ByOutcome {
    ttl: Duration,
    miss_ttl: Duration,
}

impl ByOutcome {
    fn ttl_of(&self, entry: &Entry) -> Duration {
        if entry.placed { self.ttl } else { self.miss_ttl }
    }
}

impl Expiry<TenantId, Entry> for ByOutcome {
    fn expire_after_create(&self, _: &TenantId, entry: &Entry, _: Instant) -> Option<Duration> {
        Some(self.ttl_of(entry))
    }

    fn expire_after_update(
        &self,
        _: &TenantId,
        entry: &Entry,
        _: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some(self.ttl_of(entry))
    }
}

pub struct TenantCache {
    // foldhash (randomly seeded per cache) instead of SipHash: a third of a hit's cost.
    entries: Cache<TenantId, Entry, foldhash::fast::RandomState>,
}

impl TenantCache {
    pub fn new(capacity: u64, ttl: Duration, miss_ttl: Duration) -> Self {
        let entries = Cache::builder()
            .max_capacity(capacity)
            .expire_after(ByOutcome { ttl, miss_ttl })
            .build_with_hasher(foldhash::fast::RandomState::default());
        Self { entries }
    }

    pub fn get(&self, tenant: &TenantId) -> Option<Entry> {
        self.entries.get(tenant)
    }

    pub fn insert(&self, tenant: TenantId, entry: Entry) {
        self.entries.insert(tenant, entry);
    }

    pub fn invalidate(&self, tenant: &TenantId) {
        self.entries.invalidate(tenant);
    }

    pub fn clear(&self) {
        self.entries.invalidate_all();
    }

    /// Entries held (approximate, as moka counts them).
    pub fn len(&self) -> u64 {
        self.entries.run_pending_tasks();
        self.entries.entry_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::directory::TenantState;

    #[test]
    fn unplaced_tenants_expire_sooner() {
        let cache = TenantCache::new(100, Duration::from_secs(60), Duration::from_millis(50));
        let placed =
            Entry { explicit: Some(Placement { shard: 1, state: TenantState::Active }), placed: true };
        let unplaced = Entry { explicit: None, placed: false };
        let (one, two) = (TenantId::Int(1), TenantId::Text("two".into()));
        cache.insert(one.clone(), placed);
        cache.insert(two.clone(), unplaced);
        assert_eq!(cache.get(&two), Some(unplaced));
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(cache.get(&one), Some(placed));
        assert_eq!(cache.get(&two), None);
        cache.invalidate(&one);
        assert_eq!(cache.get(&one), None);
    }
}
