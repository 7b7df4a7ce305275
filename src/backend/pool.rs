//! One deadpool pool per (shard node, user, database). `create` connects and logs
//! in; `recycle` refuses a connection that is not idle or that the server closed
//! while it sat in the pool.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use deadpool::managed::{self, Metrics, Object, Pool, PoolError, RecycleError, RecycleResult, Timeouts};

use super::conn::{ConnectTarget, ServerConn};
use super::error::{BackendError, CheckoutError};
use super::tls::ServerTls;
use crate::config::{Config, NodeConfig, UserConfig};
use crate::directory::ShardId;

pub struct ServerManager {
    target: ConnectTarget,
    tls: Option<Arc<ServerTls>>,
    /// ParameterStatus values of the first connection, before any client setting.
    startup_params: OnceLock<Arc<Vec<(String, String)>>>,
}

impl managed::Manager for ServerManager {
    // Boxed: deadpool moves the object by value between its queue, the checkout
    // future and the guard, several times per checkout; a pointer moves cheaply.
    type Type = Box<ServerConn>;
    type Error = BackendError;

    async fn create(&self) -> Result<Box<ServerConn>, BackendError> {
        // Boxed: the login future is large, and every checkout future would carry its size.
        let conn = Box::pin(ServerConn::connect(&self.target, self.tls.as_deref())).await?;
        let _ = self.startup_params.set(Arc::new(conn.params.clone()));
        Ok(Box::new(conn))
    }

    async fn recycle(&self, conn: &mut Box<ServerConn>, _: &Metrics) -> RecycleResult<BackendError> {
        if !conn.is_reusable() {
            return Err(RecycleError::message("server connection was not left idle"));
        }
        if conn.io.is_disturbed() {
            return Err(RecycleError::message("server closed the idle connection"));
        }
        if conn.needs_reset {
            Box::pin(conn.reset()).await.map_err(RecycleError::Backend)?;
        }
        Ok(())
    }
}

/// A checked-out server connection; dropping it returns it to its pool.
pub type PooledConn = Object<ServerManager>;

/// A pool of server connections to one node for one user and database.
pub type ServerPool = Pool<ServerManager>;

#[derive(Clone, PartialEq, Eq, Hash)]
struct PoolKey {
    shard: ShardId,
    host: String,
    port: u16,
    node_dbname: Option<String>,
    user: String,
    database: String,
}

/// All pools of the proxy, created on first use.
pub struct Pools {
    config: Arc<Config>,
    tls: Option<Arc<ServerTls>>,
    pools: RwLock<HashMap<PoolKey, Pool<ServerManager>>>,
}

impl Pools {
    pub fn new(config: Arc<Config>, tls: Option<ServerTls>) -> Self {
        Self { config, tls: tls.map(Arc::new), pools: RwLock::new(HashMap::new()) }
    }

    /// Checks out a connection to `node` of `shard` for `user` and `database`.
    pub async fn checkout(
        &self,
        shard: ShardId,
        node: &NodeConfig,
        user: &UserConfig,
        database: &str,
    ) -> Result<PooledConn, CheckoutError> {
        let pool = self.pool(shard, node, user, database);
        self.checkout_from(&pool, shard).await
    }

    /// Checks out a connection from a pool handle kept by the caller (see `pool`).
    pub async fn checkout_from(
        &self,
        pool: &ServerPool,
        shard: ShardId,
    ) -> Result<PooledConn, CheckoutError> {
        // Fast path without timers: an idle connection or a free slot, right now.
        let immediate = Timeouts {
            wait: Some(Duration::ZERO),
            create: Some(self.config.proxy.connect_timeout()),
            recycle: None,
        };
        let result = match pool.timeout_get(&immediate).await {
            Err(PoolError::Timeout(managed::TimeoutType::Wait)) => {
                let patient = Timeouts { wait: Some(self.config.proxy.checkout_timeout()), ..immediate };
                pool.timeout_get(&patient).await
            }
            other => other,
        };
        result.map_err(|e| match e {
            PoolError::Timeout(managed::TimeoutType::Wait) => CheckoutError::Exhausted {
                shard,
                size: pool.status().max_size,
                waited_ms: self.config.proxy.checkout_timeout_ms,
            },
            PoolError::Timeout(_) => CheckoutError::Unreachable {
                shard,
                source: BackendError::ConnectTimeout { addr: pool.manager().target.addr() },
            },
            PoolError::Backend(source) => CheckoutError::Unreachable { shard, source },
            PoolError::Closed | PoolError::NoRuntimeSpecified | PoolError::PostCreateHook(_) => {
                CheckoutError::Closed { shard }
            }
        })
    }

    /// The pool of (`node` of `shard`, `user`, `database`), created on first use. The
    /// handle is cheap to clone; sessions keep theirs to skip this lookup per checkout.
    pub fn pool(&self, shard: ShardId, node: &NodeConfig, user: &UserConfig, database: &str) -> ServerPool {
        let key = PoolKey {
            shard,
            host: node.host.clone(),
            port: node.port,
            node_dbname: node.dbname.clone(),
            user: user.name.clone(),
            database: database.to_string(),
        };
        if let Some(p) = self.pools.read().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return p.clone();
        }
        let target = ConnectTarget {
            host: node.host.clone(),
            port: node.port,
            user: user.server_user().to_string(),
            password: user.server_password().map(str::to_string),
            database: node.dbname.clone().unwrap_or_else(|| database.to_string()),
            connect_timeout: self.config.proxy.connect_timeout(),
        };
        let manager = ServerManager { target, tls: self.tls.clone(), startup_params: OnceLock::new() };
        let pool = Pool::builder(manager)
            .max_size(user.pool_size)
            // The most recently used server first, as PgBouncer does: its backend process
            // is warm in the CPU caches and the scheduler's view.
            .queue_mode(deadpool::managed::QueueMode::Lifo)
            .runtime(deadpool::Runtime::Tokio1)
            .build()
            .expect("a runtime is given, and no hooks can fail the build");
        let mut pools = self.pools.write().unwrap_or_else(|e| e.into_inner());
        pools.entry(key).or_insert(pool).clone()
    }

    /// The server's own parameters (as reported at login) for this pool, once known.
    pub fn server_params(
        &self,
        shard: ShardId,
        node: &NodeConfig,
        user: &UserConfig,
        database: &str,
    ) -> Option<Arc<Vec<(String, String)>>> {
        self.pool(shard, node, user, database).manager().startup_params.get().cloned()
    }

    /// Closes the pools of nodes for which `keep(shard, host, port, dbname)` says no
    /// (they left the topology); idle connections close now, busy ones when given back.
    pub fn retain_nodes(&self, keep: impl Fn(ShardId, &str, u16, Option<&str>) -> bool) {
        let mut pools = self.pools.write().unwrap_or_else(|e| e.into_inner());
        pools.retain(|key, pool| {
            let kept = keep(key.shard, &key.host, key.port, key.node_dbname.as_deref());
            if !kept {
                tracing::info!(shard = key.shard, node = %format!("{}:{}", key.host, key.port), "pool closed: the node left the topology");
                pool.close();
            }
            kept
        });
    }

    /// Closes every pool (shutdown).
    pub fn close(&self) {
        for pool in self.pools.read().unwrap_or_else(|e| e.into_inner()).values() {
            pool.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pools_of_departed_nodes_are_closed() {
        let config = Arc::new(crate::config::test_layout());
        let pools = Pools::new(config.clone(), None);
        let user = UserConfig {
            name: "app".into(),
            password: Some("app".into()),
            scram_secret: None,
            auth: Default::default(),
            server_user: None,
            server_password: None,
            pool_size: 2,
            pool_mode: None,
        };
        let node = |port| NodeConfig {
            host: "127.0.0.1".into(),
            port,
            role: crate::config::NodeRole::Primary,
            priority: 0,
            dbname: None,
        };
        let stays = pools.pool(1, &node(5001), &user, "app");
        let leaves = pools.pool(2, &node(5002), &user, "app");
        pools.retain_nodes(|shard, _, port, _| shard == 1 && port == 5001);
        assert!(!stays.is_closed());
        assert!(leaves.is_closed());
        let again = pools.pool(2, &node(5002), &user, "app");
        assert!(!again.is_closed(), "a node that comes back gets a new pool");
    }
}
