//! Tenant -> shard resolution. The `Directory` trait is what routing asks: an
//! explicit placement first, then the topology's rules (ranges, hash groups).
//! `StaticDirectory` answers from the configuration file; `CatalogDirectory` from a
//! PostgreSQL catalog shared by many proxies, through a cache that the catalog's
//! NOTIFY messages keep exact.

mod catalog;
mod static_dir;
mod topology;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use catalog::{CatalogDirectory, CatalogError};
pub use static_dir::StaticDirectory;
pub use topology::{Shard, ShardStatus, Topology, hash_group};

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

/// What a tenant may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TenantState {
    #[default]
    Active,
    /// Reads are served, writes refused.
    ReadOnly,
    /// Being moved to another shard: reads are served, writes refused.
    Moving,
}

impl TenantState {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "active" => Some(Self::Active),
            "read_only" => Some(Self::ReadOnly),
            "moving" => Some(Self::Moving),
            _ => None,
        }
    }

    pub fn allows_writes(self) -> bool {
        self == Self::Active
    }

    pub fn describe(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::ReadOnly => "read_only",
            Self::Moving => "moving",
        }
    }
}

/// Where a tenant lives and what it may do there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub shard: ShardId,
    pub state: TenantState,
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DirectoryError {
    #[error("tenant {0} is not placed on any shard")]
    NotPlaced(TenantId),
    #[error("shard {shard}{} is disabled", for_tenant(*.tenant))]
    ShardDisabled { tenant: Option<TenantId>, shard: ShardId },
    #[error("shard {shard}{} is not in the directory", for_tenant(*.tenant))]
    UnknownShard { tenant: Option<TenantId>, shard: ShardId },
    #[error(
        "cannot look up tenant {tenant}: the catalog is unreachable ({reason}); cached tenants still route"
    )]
    CatalogUnavailable { tenant: TenantId, reason: String },
}

fn for_tenant(tenant: Option<TenantId>) -> String {
    tenant.map(|t| format!(" (tenant {t})")).unwrap_or_default()
}

/// A lookup that has to ask the source.
pub type Lookup<'a> = Pin<Box<dyn Future<Output = Result<Placement, DirectoryError>> + Send + 'a>>;

/// Answers where tenants live.
pub trait Directory: Send + Sync {
    /// The placement when it is known without asking the source (`None`: call `lookup`).
    fn cached(&self, tenant: TenantId) -> Option<Result<Placement, DirectoryError>>;

    /// Asks the source and remembers the answer.
    fn lookup(&self, tenant: TenantId) -> Lookup<'_>;

    /// The shards and placement rules in force.
    fn topology(&self) -> Arc<Topology>;

    /// The routing version served: it changes with every change of the source.
    fn version(&self) -> i64;
}
