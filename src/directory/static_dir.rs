//! The directory of a configuration file: explicit placements, then ranges.
//! Everything is in memory, so `cached` always answers. A RELOAD of the file replaces
//! both at once, and bumps the routing version and generation as a catalog change
//! would, so sessions forget what they remembered.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use super::{Directory, DirectoryError, Lookup, Placement, ShardId, TenantId, TenantState, Topology};
use crate::config::Config;

pub struct StaticDirectory {
    layout: RwLock<Layout>,
    /// Reloads applied: the routing version and the generation.
    reloads: AtomicU64,
}

struct Layout {
    explicit: HashMap<TenantId, ShardId>,
    topology: Arc<Topology>,
}

impl Layout {
    fn of(config: &Config) -> Result<Self, String> {
        let kind = config.proxy.tenant_key;
        let explicit = config
            .tenant_map
            .iter()
            .filter_map(|m| Some((TenantId::parse(&m.tenant.to_string(), kind)?, m.shard)))
            .collect();
        Ok(Self { explicit, topology: Arc::new(Topology::from_config(config)?) })
    }
}

impl StaticDirectory {
    pub fn from_config(config: &Config) -> Result<Self, String> {
        Ok(Self { layout: RwLock::new(Layout::of(config)?), reloads: AtomicU64::new(0) })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Layout> {
        self.layout.read().unwrap_or_else(|e| e.into_inner())
    }

    fn resolve(&self, tenant: &TenantId) -> Result<Placement, DirectoryError> {
        let layout = self.read();
        let shard = layout
            .explicit
            .get(tenant)
            .copied()
            .or_else(|| layout.topology.place_by_rules(tenant))
            .ok_or_else(|| DirectoryError::NotPlaced(tenant.clone()))?;
        Ok(Placement { shard, state: TenantState::Active })
    }
}

impl Directory for StaticDirectory {
    fn cached(&self, tenant: &TenantId) -> Option<Result<Placement, DirectoryError>> {
        Some(self.resolve(tenant))
    }

    fn lookup(&self, tenant: &TenantId) -> Lookup<'_> {
        let answer = self.resolve(tenant);
        Box::pin(async move { answer })
    }

    fn topology(&self) -> Arc<Topology> {
        self.read().topology.clone()
    }

    /// The number of reloads that changed the file's layout.
    fn version(&self) -> i64 {
        self.reloads.load(Ordering::Acquire) as i64
    }

    fn generation(&self) -> u64 {
        self.reloads.load(Ordering::Acquire)
    }

    fn reload_from(&self, config: &Config) -> Result<(), String> {
        let layout = Layout::of(config)?;
        *self.layout.write().unwrap_or_else(|e| e.into_inner()) = layout;
        self.reloads.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::directory::TenantKey;

    #[test]
    fn explicit_beats_range_and_ranges_are_inclusive() {
        let d = StaticDirectory::from_config(&crate::config::test_layout()).unwrap();
        let shard = |t: i64| d.cached(&TenantId::Int(t)).unwrap().map(|p| p.shard);
        assert_eq!(shard(42), Ok(2));
        assert_eq!(shard(7), Ok(1));
        assert_eq!(shard(1000), Ok(1));
        assert_eq!(shard(1001), Ok(2));
        assert_eq!(shard(2000), Ok(2));
        assert_eq!(shard(2001), Err(DirectoryError::NotPlaced(TenantId::Int(2001))));
        assert_eq!(shard(0), Err(DirectoryError::NotPlaced(TenantId::Int(0))));
        assert_eq!(TenantId::parse(" '15' ", TenantKey::Bigint), Some(TenantId::Int(15)));
        assert_eq!(TenantId::parse("x", TenantKey::Bigint), None);
        for (text, key) in [("7", Some(7)), ("0042", Some(42)), ("-3", Some(-3)), (" 8", Some(8))] {
            assert_eq!(TenantId::parse(text, TenantKey::Bigint), key.map(TenantId::Int), "{text}");
        }
        for text in ["", "99999999999999999999", "1 2"] {
            assert_eq!(TenantId::parse(text, TenantKey::Bigint), None, "{text}");
            assert_eq!(TenantId::from_text_bytes(text.as_bytes(), TenantKey::Bigint), None, "{text}");
        }
        let max = i64::MAX.to_string();
        for (bytes, key) in
            [(&b"15"[..], Some(15)), (b" 16", Some(16)), (max.as_bytes(), Some(i64::MAX)), (b"\xff", None)]
        {
            assert_eq!(TenantId::from_text_bytes(bytes, TenantKey::Bigint), key.map(TenantId::Int));
        }
        assert_eq!(TenantId::parse("'o''brien'", TenantKey::Text), Some(TenantId::Text("o'brien".into())));
        assert_eq!(TenantId::parse(" acme ", TenantKey::Text), Some(TenantId::Text("acme".into())));
        assert_eq!(TenantId::parse("''", TenantKey::Text), None);
    }

    #[test]
    fn text_keys_from_the_file() {
        let mut config = crate::config::test_layout();
        config.proxy.tenant_key = TenantKey::Text;
        config.tenant_map.push(crate::config::TenantMapping {
            tenant: crate::config::MappedKey::Text("acme".into()),
            shard: 1,
        });
        let d = StaticDirectory::from_config(&config).unwrap();
        let shard = |t: TenantId| d.cached(&t).unwrap().map(|p| p.shard);
        assert_eq!(shard(TenantId::Text("acme".into())), Ok(1));
        assert_eq!(shard(TenantId::Text("42".into())), Ok(2), "numbers in the file are text keys too");
        assert!(shard(TenantId::Text("7".into())).is_err(), "ranges do not apply to text keys");
        config.proxy.tenant_key = TenantKey::Bigint;
        assert!(crate::config::validate(&config).iter().any(|p| p.contains("\"acme\" is text")));
    }
}
