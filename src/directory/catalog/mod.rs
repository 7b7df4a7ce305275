//! The catalog-backed directory. Explicit placements are looked up one tenant at a
//! time and cached; the topology (shards, nodes, ranges, hash groups) is loaded
//! whole. A watcher task LISTENs on the catalog and applies each change as its
//! NOTIFY arrives; a gap in the routing versions, or a lost connection, makes it
//! reload everything and empty the cache, so nothing missed can route stale.

mod cache;
pub mod listen;
mod load;
mod watch;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use cache::{Entry, TenantCache};
use load::LoadError;

use super::{Directory, DirectoryError, DirectoryStatus, Lookup, Placement, TenantId, TenantKey, Topology};
use crate::config::CatalogConfig;

pub struct CatalogDirectory {
    inner: Arc<Inner>,
}

struct Inner {
    cache: TenantCache,
    topology: RwLock<Arc<Topology>>,
    /// The routing version whose changes are all applied.
    version: AtomicI64,
    /// Bumped by every invalidation: a lookup that overlapped one does not cache
    /// its answer, which may predate the change.
    generation: AtomicU64,
    /// The watcher holds a live LISTEN connection.
    listening: AtomicBool,
    lookups: deadpool_postgres::Pool,
    /// The LISTEN connection the watcher and the moves' agent share.
    link: Arc<listen::CatalogLink>,
    /// bigint or text keys: which map table is read, and how NOTIFY payloads parse.
    kind: TenantKey,
    /// Where the catalog is (`host:port/dbname`), for operators.
    source: String,
    /// Placements answered from the cache, and asked of the catalog.
    hits: AtomicU64,
    misses: AtomicU64,
    /// How long after the catalog sent it the last change was received (ms;
    /// `u64::MAX` until one came with its time).
    change_lag_ms: AtomicU64,
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("catalog {addr}: {source}")]
    Load { addr: String, source: LoadError },
    #[error("catalog {addr}: {reason}")]
    Connect { addr: String, reason: String },
}

impl CatalogDirectory {
    /// Connects, loads the topology and starts the watcher; fails when the catalog
    /// cannot be read, since a proxy without any routing cannot serve.
    pub async fn connect(config: &CatalogConfig, kind: TenantKey) -> Result<Self, CatalogError> {
        let addr = config.addr();
        let pg = config.pg_config();
        let manager = deadpool_postgres::Manager::new(pg.clone(), tokio_postgres::NoTls);
        let lookups = deadpool_postgres::Pool::builder(manager)
            .max_size(config.lookup_connections)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(config.connect_timeout()))
            .create_timeout(Some(config.connect_timeout()))
            .build()
            .map_err(|e| CatalogError::Connect { addr: addr.clone(), reason: e.to_string() })?;
        let client = lookups
            .get()
            .await
            .map_err(|e| CatalogError::Connect { addr: addr.clone(), reason: describe_pool_error(&e) })?;
        let snapshot = load::snapshot(&client, kind)
            .await
            .map_err(|source| CatalogError::Load { addr: addr.clone(), source })?;
        drop(client);
        let inner = Arc::new(Inner {
            cache: TenantCache::new(
                config.cache_capacity,
                Duration::from_millis(config.cache_ttl_ms),
                Duration::from_millis(config.miss_ttl_ms),
            ),
            topology: RwLock::new(Arc::new(snapshot.topology)),
            version: AtomicI64::new(snapshot.version),
            generation: AtomicU64::new(0),
            listening: AtomicBool::new(false),
            lookups,
            link: listen::CatalogLink::new(pg),
            kind,
            // `addr` names the database already (host:port/dbname).
            source: addr.clone(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            change_lag_ms: AtomicU64::new(u64::MAX),
        });
        tokio::spawn(watch::run(Arc::downgrade(&inner), inner.link.clone(), addr));
        Ok(Self { inner })
    }

    /// The catalog connection this proxy LISTENs on, for the other listeners to share.
    pub fn link(&self) -> Arc<listen::CatalogLink> {
        self.inner.link.clone()
    }

    /// Whether changes in the catalog are reaching this proxy right now.
    pub fn is_listening(&self) -> bool {
        self.inner.listening.load(Ordering::Acquire)
    }

    /// Tenants held in the cache.
    pub fn cached_tenants(&self) -> u64 {
        self.inner.cache.len()
    }
}

fn describe_pool_error(e: &deadpool_postgres::PoolError) -> String {
    match e {
        deadpool_postgres::PoolError::Backend(e) => load::describe(e),
        other => other.to_string(),
    }
}

/// A lookup connection unused this long is closed: after a burst of cache misses,
/// the proxy goes back to its one shared catalog connection.
const LOOKUP_IDLE: Duration = Duration::from_secs(60);

impl Inner {
    /// Closes the lookup connections idle for `LOOKUP_IDLE`.
    fn close_idle_lookups(&self) {
        self.lookups.retain(|_, metrics| metrics.last_used() < LOOKUP_IDLE);
    }

    fn topology(&self) -> Arc<Topology> {
        self.topology.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn answer(&self, tenant: &TenantId, entry: Entry) -> Result<Placement, DirectoryError> {
        let topology = self.topology();
        let placement = match entry.explicit {
            Some(p) => p,
            None => {
                let shard = topology
                    .place_by_rules(tenant)
                    .ok_or_else(|| DirectoryError::NotPlaced(tenant.clone()))?;
                Placement { shard, state: Default::default() }
            }
        };
        topology.usable(Some(tenant), placement.shard)?;
        Ok(placement)
    }

    async fn lookup(&self, tenant: TenantId) -> Result<Placement, DirectoryError> {
        let generation = self.generation.load(Ordering::Acquire);
        let unavailable =
            |reason: String| DirectoryError::CatalogUnavailable { tenant: tenant.clone(), reason };
        let client = self.lookups.get().await.map_err(|e| unavailable(describe_pool_error(&e)))?;
        let explicit =
            load::explicit_placement(&client, &tenant).await.map_err(|e| unavailable(e.to_string()))?;
        let placed = explicit.is_some() || self.topology().place_by_rules(&tenant).is_some();
        let entry = Entry { explicit, placed };
        if self.generation.load(Ordering::Acquire) == generation {
            self.cache.insert(tenant.clone(), entry);
        }
        tracing::debug!(%tenant, ?explicit, placed, "tenant looked up in the catalog");
        self.answer(&tenant, entry)
    }

    /// A change of one tenant's row.
    fn invalidate_tenant(&self, tenant: &TenantId) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.cache.invalidate(tenant);
    }

    /// Everything may have changed: new topology, empty cache.
    fn replace_all(&self, topology: Topology, version: i64) {
        self.replace_topology(topology);
        self.forget_tenants(version);
    }

    /// Many tenants changed at once: empty the cache.
    fn forget_tenants(&self, version: i64) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.cache.clear();
        self.version.store(version, Ordering::Release);
    }

    fn replace_topology(&self, topology: Topology) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        *self.topology.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(topology);
    }
}

impl Directory for CatalogDirectory {
    fn cached(&self, tenant: &TenantId) -> Option<Result<Placement, DirectoryError>> {
        let Some(entry) = self.inner.cache.get(tenant) else {
            self.inner.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        self.inner.hits.fetch_add(1, Ordering::Relaxed);
        Some(self.inner.answer(tenant, entry))
    }

    fn status(&self) -> DirectoryStatus {
        DirectoryStatus {
            source: format!("catalog {}", self.inner.source),
            listening: Some(self.is_listening()),
            cached_tenants: Some(self.cached_tenants()),
            cache_hits: self.inner.hits.load(Ordering::Relaxed),
            cache_misses: self.inner.misses.load(Ordering::Relaxed),
            change_lag_ms: Some(self.inner.change_lag_ms.load(Ordering::Relaxed))
                .filter(|ms| *ms != u64::MAX),
        }
    }

    fn lookup(&self, tenant: &TenantId) -> Lookup<'_> {
        Box::pin(self.inner.lookup(tenant.clone()))
    }

    fn topology(&self) -> Arc<Topology> {
        self.inner.topology()
    }

    fn version(&self) -> i64 {
        self.inner.version.load(Ordering::Acquire)
    }

    fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    fn forget(&self, tenant: &TenantId) {
        self.inner.invalidate_tenant(tenant);
    }
}
