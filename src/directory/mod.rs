//! Tenant -> shard resolution. The `Directory` trait is what routing asks; the
//! static implementation answers from the configuration (explicit map, then ranges).
//! A catalog-backed directory implements the same trait.

use std::collections::HashMap;
use std::fmt;

use crate::config::Config;

/// A tenant key (bigint).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(pub i64);

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl TenantId {
    /// Parses a tenant from text as clients write it (`42`, ` 42 `, `'42'`).
    pub fn parse(text: &str) -> Option<Self> {
        let t = text.trim();
        let t = t.strip_prefix('\'').and_then(|t| t.strip_suffix('\'')).unwrap_or(t).trim();
        t.parse().ok().map(TenantId)
    }
}

/// A shard id (0..=1023).
pub type ShardId = u16;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DirectoryError {
    #[error("tenant {0} is not placed on any shard")]
    NotPlaced(TenantId),
}

/// Answers which shard holds a tenant.
pub trait Directory: Send + Sync {
    fn resolve(&self, tenant: TenantId) -> Result<ShardId, DirectoryError>;
}

/// The directory from the configuration file.
pub struct StaticDirectory {
    explicit: HashMap<TenantId, ShardId>,
    /// Sorted by `min`, non-overlapping (validated).
    ranges: Vec<(i64, i64, ShardId)>,
}

impl StaticDirectory {
    pub fn from_config(config: &Config) -> Self {
        let explicit = config.tenant_map.iter().map(|m| (TenantId(m.tenant), m.shard)).collect();
        let mut ranges: Vec<_> = config.ranges.iter().map(|r| (r.min, r.max, r.shard)).collect();
        ranges.sort_by_key(|r| r.0);
        Self { explicit, ranges }
    }
}

impl Directory for StaticDirectory {
    fn resolve(&self, tenant: TenantId) -> Result<ShardId, DirectoryError> {
        if let Some(shard) = self.explicit.get(&tenant) {
            return Ok(*shard);
        }
        let idx = self.ranges.partition_point(|r| r.0 <= tenant.0);
        match idx.checked_sub(1).map(|i| self.ranges[i]) {
            Some((_, max, shard)) if tenant.0 <= max => Ok(shard),
            _ => Err(DirectoryError::NotPlaced(tenant)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn explicit_beats_range_and_ranges_are_inclusive() {
        let config = Config::from_toml(
            r#"
            [[ranges]]
            min = 1
            max = 1000
            shard = 1
            [[ranges]]
            min = 1001
            max = 2000
            shard = 2
            [[tenant_map]]
            tenant = 42
            shard = 2
            "#,
            Path::new("t"),
        )
        .unwrap();
        let d = StaticDirectory::from_config(&config);
        assert_eq!(d.resolve(TenantId(42)), Ok(2));
        assert_eq!(d.resolve(TenantId(7)), Ok(1));
        assert_eq!(d.resolve(TenantId(1000)), Ok(1));
        assert_eq!(d.resolve(TenantId(1001)), Ok(2));
        assert_eq!(d.resolve(TenantId(2000)), Ok(2));
        assert_eq!(d.resolve(TenantId(2001)), Err(DirectoryError::NotPlaced(TenantId(2001))));
        assert_eq!(d.resolve(TenantId(0)), Err(DirectoryError::NotPlaced(TenantId(0))));
        assert_eq!(TenantId::parse(" '15' "), Some(TenantId(15)));
        assert_eq!(TenantId::parse("x"), None);
    }
}
