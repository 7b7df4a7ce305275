//! The shards and the placement rules that cover many tenants at once: ranges and
//! hash groups. Small and read on every miss of the tenant map, so it is kept whole
//! in memory and swapped as one value when the source changes.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{DirectoryError, ShardId, TenantId, TenantLimits};
use crate::config::{Config, NodeConfig, NodeRole};

/// Whether a shard takes traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardStatus {
    Active,
    /// Routed as usual; placement puts no new tenants here.
    Draining,
    /// Refused: its tenants get an error instead of a connection.
    Disabled,
}

impl ShardStatus {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "active" => Some(Self::Active),
            "draining" => Some(Self::Draining),
            "disabled" => Some(Self::Disabled),
            _ => None,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Draining => "draining",
            Self::Disabled => "disabled",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Shard {
    pub id: ShardId,
    pub status: ShardStatus,
    /// The primary first, then replicas in failover priority order.
    pub nodes: Vec<NodeConfig>,
}

impl Shard {
    pub fn primary(&self) -> Option<&NodeConfig> {
        self.nodes.iter().find(|n| n.role == NodeRole::Primary)
    }
}

/// A placement rule of the topology.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacementRule {
    Range { min: i64, max: i64 },
    HashGroup(u32),
}

/// Tenant ranges and hash groups, plus the shards they point to.
#[derive(Clone, Debug, Default)]
pub struct Topology {
    shards: BTreeMap<ShardId, Shard>,
    /// `(min, max, shard)`, inclusive, sorted by `min`, disjoint.
    ranges: Vec<(i64, i64, ShardId)>,
    /// Shard of each hash group; `None` for an unassigned group. Empty: no hashing.
    hash_groups: Vec<Option<ShardId>>,
    /// The catalog's `tenant_limits` (empty for a configuration file, whose limits
    /// the pools hold themselves).
    limits: Arc<TenantLimits>,
}

impl Topology {
    /// Builds a topology, refusing what routing could not work with.
    pub fn new(
        shards: Vec<Shard>,
        mut ranges: Vec<(i64, i64, ShardId)>,
        hash_groups: Vec<Option<ShardId>>,
    ) -> Result<Self, String> {
        let mut by_id = BTreeMap::new();
        for mut shard in shards {
            if shard.id > 1023 {
                return Err(format!("shard id {} is outside 0..=1023", shard.id));
            }
            if shard.primary().is_none() {
                return Err(format!("shard {} has no primary node", shard.id));
            }
            shard.nodes.sort_by_key(|n| (n.role != NodeRole::Primary, n.priority));
            by_id.insert(shard.id, shard);
        }
        ranges.sort_by_key(|r| r.0);
        for pair in ranges.windows(2) {
            if pair[1].0 <= pair[0].1 {
                return Err(format!(
                    "tenant ranges [{},{}] and [{},{}] overlap",
                    pair[0].0, pair[0].1, pair[1].0, pair[1].1
                ));
            }
        }
        let targets = ranges.iter().map(|r| r.2).chain(hash_groups.iter().flatten().copied());
        for shard in targets {
            if !by_id.contains_key(&shard) {
                return Err(format!("a placement rule names shard {shard}, which does not exist"));
            }
        }
        Ok(Self { shards: by_id, ranges, hash_groups, limits: Arc::default() })
    }

    /// The topology of a configuration file (validated before).
    pub fn from_config(config: &Config) -> Result<Self, String> {
        let shards = config
            .shards
            .iter()
            .map(|s| Shard { id: s.id, status: ShardStatus::Active, nodes: s.nodes.clone() })
            .collect();
        let ranges = config.ranges.iter().map(|r| (r.min, r.max, r.shard)).collect();
        Self::new(shards, ranges, Vec::new())
    }

    /// With the catalog's tenant limits.
    pub fn with_limits(mut self, limits: TenantLimits) -> Self {
        self.limits = Arc::new(limits);
        self
    }

    pub fn limits(&self) -> &Arc<TenantLimits> {
        &self.limits
    }

    pub fn shard(&self, id: ShardId) -> Option<&Shard> {
        self.shards.get(&id)
    }

    pub fn shard_ids(&self) -> impl Iterator<Item = ShardId> + '_ {
        self.shards.keys().copied()
    }

    /// The tenant ranges `(min, max, shard)`, inclusive, sorted.
    pub fn ranges(&self) -> &[(i64, i64, ShardId)] {
        &self.ranges
    }

    /// Which rule places `tenant` (and where), if one does.
    pub fn rule_for(&self, tenant: &TenantId) -> Option<(PlacementRule, ShardId)> {
        if let TenantId::Int(key) = *tenant {
            let idx = self.ranges.partition_point(|r| r.0 <= key);
            if let Some(&(min, max, shard)) = idx.checked_sub(1).map(|i| &self.ranges[i])
                && key <= max
            {
                return Some((PlacementRule::Range { min, max }, shard));
            }
        }
        if self.hash_groups.is_empty() {
            return None;
        }
        let group = hash_group(tenant, self.hash_groups.len() as u32);
        self.hash_groups[group as usize].map(|shard| (PlacementRule::HashGroup(group), shard))
    }

    /// Where the rules put a tenant that has no explicit placement.
    pub fn place_by_rules(&self, tenant: &TenantId) -> Option<ShardId> {
        self.rule_for(tenant).map(|(_, shard)| shard)
    }

    /// A shard that routing may use: it exists and is not disabled.
    pub fn usable(&self, tenant: Option<&TenantId>, shard: ShardId) -> Result<ShardId, DirectoryError> {
        match self.shards.get(&shard) {
            Some(s) if s.status == ShardStatus::Disabled => {
                Err(DirectoryError::ShardDisabled { tenant: tenant.cloned(), shard })
            }
            Some(_) => Ok(shard),
            None => Err(DirectoryError::UnknownShard { tenant: tenant.cloned(), shard }),
        }
    }
}

/// The hash group of a tenant: FNV-1a (32 bit) of the key's text (decimal for
/// bigint keys), modulo the group count. Applications can compute the same in any language.
pub fn hash_group(tenant: &TenantId, group_count: u32) -> u32 {
    fnv1a_32(tenant.key_text().as_bytes()) % group_count.max(1)
}

fn fnv1a_32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash: u32, &b| (hash ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(id: ShardId) -> Shard {
        let node =
            NodeConfig { host: "h".into(), port: 1, role: NodeRole::Primary, priority: 0, dbname: None };
        Shard { id, status: ShardStatus::Active, nodes: vec![node] }
    }

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        assert_eq!(fnv1a_32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a_32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a_32(b"foobar"), 0xbf9c_f968);
        assert_eq!(hash_group(&TenantId::Int(42), 1000), fnv1a_32(b"42") % 1000);
        assert_eq!(hash_group(&TenantId::Text("acme".into()), 1000), fnv1a_32(b"acme") % 1000);
    }

    #[test]
    fn ranges_then_hash_groups() {
        let t = Topology::new(vec![shard(1), shard(2)], vec![(1, 100, 1)], vec![Some(2), None]).unwrap();
        assert_eq!(t.place_by_rules(&TenantId::Int(100)), Some(1));
        let hashed = (101..200).map(TenantId::Int).find(|t| hash_group(t, 2) == 0).unwrap();
        let unassigned = (101..200).map(TenantId::Int).find(|t| hash_group(t, 2) == 1).unwrap();
        assert_eq!(t.place_by_rules(&hashed), Some(2));
        assert_eq!(t.place_by_rules(&unassigned), None);
    }

    #[test]
    fn refuses_overlaps_unknown_shards_and_missing_primaries() {
        assert!(Topology::new(vec![shard(1)], vec![(1, 10, 1), (10, 20, 1)], vec![]).is_err());
        assert!(Topology::new(vec![shard(1)], vec![(1, 10, 3)], vec![]).is_err());
        let mut headless = shard(1);
        headless.nodes[0].role = NodeRole::Replica;
        assert!(Topology::new(vec![headless], vec![], vec![]).is_err());
    }
}
