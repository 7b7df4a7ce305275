//! The directory of a configuration file: explicit placements, then ranges.
//! Everything is in memory, so `cached` always answers.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Directory, DirectoryError, Lookup, Placement, ShardId, TenantId, TenantState, Topology};
use crate::config::Config;

pub struct StaticDirectory {
    explicit: HashMap<TenantId, ShardId>,
    topology: Arc<Topology>,
}

impl StaticDirectory {
    pub fn from_config(config: &Config) -> Result<Self, String> {
        let explicit = config.tenant_map.iter().map(|m| (TenantId(m.tenant), m.shard)).collect();
        Ok(Self { explicit, topology: Arc::new(Topology::from_config(config)?) })
    }

    fn resolve(&self, tenant: TenantId) -> Result<Placement, DirectoryError> {
        let shard = self
            .explicit
            .get(&tenant)
            .copied()
            .or_else(|| self.topology.place_by_rules(tenant))
            .ok_or(DirectoryError::NotPlaced(tenant))?;
        Ok(Placement { shard, state: TenantState::Active })
    }
}

impl Directory for StaticDirectory {
    fn cached(&self, tenant: TenantId) -> Option<Result<Placement, DirectoryError>> {
        Some(self.resolve(tenant))
    }

    fn lookup(&self, tenant: TenantId) -> Lookup<'_> {
        let answer = self.resolve(tenant);
        Box::pin(async move { answer })
    }

    fn topology(&self) -> Arc<Topology> {
        self.topology.clone()
    }

    /// A configuration file does not change under a running proxy.
    fn version(&self) -> i64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_beats_range_and_ranges_are_inclusive() {
        let d = StaticDirectory::from_config(&crate::config::test_layout()).unwrap();
        let shard = |t| d.cached(TenantId(t)).unwrap().map(|p| p.shard);
        assert_eq!(shard(42), Ok(2));
        assert_eq!(shard(7), Ok(1));
        assert_eq!(shard(1000), Ok(1));
        assert_eq!(shard(1001), Ok(2));
        assert_eq!(shard(2000), Ok(2));
        assert_eq!(shard(2001), Err(DirectoryError::NotPlaced(TenantId(2001))));
        assert_eq!(shard(0), Err(DirectoryError::NotPlaced(TenantId(0))));
        assert_eq!(TenantId::parse(" '15' "), Some(TenantId(15)));
        assert_eq!(TenantId::parse("x"), None);
    }
}
