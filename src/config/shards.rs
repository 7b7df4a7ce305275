//! `[[shards]]`, `[[ranges]]`, `[[tenant_map]]` and `[[tenant_limits]]`: the layout a
//! file gives when no catalog holds it, and per-tenant shares of the pools.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum NodeRole {
    Primary,
    Replica,
}

/// One PostgreSQL server of a shard.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    pub host: String,
    pub port: u16,
    pub role: NodeRole,
    /// Failover priority among replicas: lower goes first.
    #[serde(default)]
    pub priority: u32,
    /// Database name on this server, when it differs from the client's.
    pub dbname: Option<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ShardConfig {
    pub id: u16,
    #[serde(default)]
    pub nodes: Vec<NodeConfig>,
}

impl ShardConfig {
    pub fn primary(&self) -> Option<&NodeConfig> {
        self.nodes.iter().find(|n| n.role == NodeRole::Primary)
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RangeConfig {
    pub min: i64,
    pub max: i64,
    pub shard: u16,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantMapping {
    pub tenant: MappedKey,
    pub shard: u16,
}

/// One tenant's share of each pool it uses (see `proxy.fair_share`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLimitConfig {
    pub tenant: MappedKey,
    /// Its weight against the other tenants waiting for the same pool (default 1).
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// At most this many of a pool's connections at once; unset: no cap of its own.
    #[serde(default)]
    pub max_connections: Option<u32>,
    /// While it has work, at least this many of a pool's connections are kept for it.
    #[serde(default)]
    pub min_connections: u32,
}

fn default_weight() -> u32 {
    1
}

/// A tenant key in the file: a number, or a string for text keys.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, Hash)]
#[serde(untagged)]
pub enum MappedKey {
    Int(i64),
    Text(String),
}

impl std::fmt::Display for MappedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MappedKey::Int(n) => n.fmt(f),
            MappedKey::Text(s) => s.fmt(f),
        }
    }
}
