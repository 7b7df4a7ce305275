//! One pool per (shard node, user, database): a deadpool (unmanaged) pool of
//! `pool_size` slots, each empty or holding an idle server connection. A checkout
//! takes a slot, most recently returned first (its server process is warm), and fills
//! it when it is empty, when its connection was closed by the server while it sat in
//! the pool, or when that connection cannot be trusted. Dropping a `PooledConn` puts its
//! slot back with the connection in it; `release_after_reset` does so once a session
//! pin's leftovers are gone; `discard` puts it back empty, so a waiting client then
//! opens a new connection.
//!
//! Why slots rather than a managed pool: the checkout and return of a connection happen
//! once per transaction, and deadpool's managed pool (hooks, metrics, recycle futures)
//! cost about 1,000 instructions per transaction there, against ~400 for this.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, OnceLock, RwLock};

use deadpool::unmanaged::{self, Object, PoolConfig, PoolError};

use super::conn::{ConnectTarget, ServerConn};
use super::error::{BackendError, CheckoutError};
use super::tls::ServerTls;
use crate::config::{Config, NodeConfig, UserConfig};
use crate::directory::ShardId;

/// A place in a pool: empty, or an idle connection (while in the pool) or the
/// connection in use (while checked out).
type Slot = Option<Box<ServerConn>>;

/// The pool of one node for one user and database; cheap to clone.
#[derive(Clone)]
pub struct ServerPool(Arc<NodePool>);

struct NodePool {
    slots: unmanaged::Pool<Slot>,
    size: usize,
    target: ConnectTarget,
    tls: Option<Arc<ServerTls>>,
    /// ParameterStatus values of the first connection, before any client setting.
    startup_params: OnceLock<Arc<Vec<(String, String)>>>,
}

impl ServerPool {
    fn new(size: usize, target: ConnectTarget, tls: Option<Arc<ServerTls>>) -> Self {
        let config = PoolConfig { max_size: size, timeout: None, runtime: Some(deadpool::Runtime::Tokio1) };
        let slots = unmanaged::Pool::from_config(&config);
        for _ in 0..size {
            // Cannot fail: the pool is new, open, and holds fewer than `size` slots.
            let _ = slots.try_add(None);
        }
        Self(Arc::new(NodePool { slots, size, target, tls, startup_params: OnceLock::new() }))
    }

    pub fn is_closed(&self) -> bool {
        self.0.slots.is_closed()
    }

    fn close(&self) {
        self.0.slots.close();
    }
}

/// A checked-out server connection; dropping it returns it to its pool.
pub struct PooledConn(Object<Slot>);

impl PooledConn {
    /// Closes the connection instead of returning it (its state is not trusted); its
    /// slot goes back empty.
    pub fn discard(mut self) {
        self.0.take();
    }

    /// Returns the connection once its session state is reset (DISCARD ALL), in a task of
    /// its own so that no client waits for the reset; it stays checked out until then.
    pub fn release_after_reset(mut self) {
        tokio::spawn(async move {
            // Untrusted until the reset completes: if the task is dropped midway (at
            // shutdown), the connection is closed instead of handed out.
            self.broken = true;
            let reset = Box::pin(self.reset()).await;
            match reset {
                Ok(()) => self.broken = false,
                Err(_) => self.discard(),
            }
        });
    }
}

impl Deref for PooledConn {
    type Target = ServerConn;
    fn deref(&self) -> &ServerConn {
        self.0.as_deref().expect("a checked-out slot holds its connection")
    }
}

impl DerefMut for PooledConn {
    fn deref_mut(&mut self) -> &mut ServerConn {
        self.0.as_deref_mut().expect("a checked-out slot holds its connection")
    }
}

impl NodePool {
    /// Makes a taken slot hold a connection that is ready for a client.
    async fn fill(&self, mut slot: Object<Slot>) -> Result<PooledConn, BackendError> {
        if let Some(conn) = &mut *slot
            && (!conn.is_reusable() || conn.io.is_disturbed())
        {
            *slot = None;
        }
        if slot.is_none() {
            // Boxed: the login future is large, and every checkout future would carry its size.
            let conn = Box::pin(ServerConn::connect(&self.target, self.tls.as_deref())).await?;
            let _ = self.startup_params.set(Arc::new(conn.params.clone()));
            *slot = Some(Box::new(conn));
        }
        Ok(PooledConn(slot))
    }
}

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
    pools: RwLock<HashMap<PoolKey, ServerPool>>,
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
        let pool = &pool.0;
        let waited_ms = self.config.proxy.checkout_timeout_ms;
        let taken = match pool.slots.try_get() {
            Err(PoolError::Timeout) => {
                pool.slots.timeout_get(Some(self.config.proxy.checkout_timeout())).await
            }
            other => other,
        };
        let slot = taken.map_err(|e| match e {
            PoolError::Timeout => CheckoutError::Exhausted { shard, size: pool.size, waited_ms },
            PoolError::Closed | PoolError::NoRuntimeSpecified => CheckoutError::Closed { shard },
        })?;
        pool.fill(slot).await.map_err(|source| CheckoutError::Unreachable { shard, source })
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
        let pool = ServerPool::new(user.pool_size, target, self.tls.clone());
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
        self.pool(shard, node, user, database).0.startup_params.get().cloned()
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
