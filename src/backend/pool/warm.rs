//! `min_pool_size`: pools kept at least that full, so that a burst after a quiet spell
//! does not pay the logins. A (login, database) with a pool on one node of a shard gets
//! one, warm, on each of its nodes: a replica's connections stay open through its
//! promotion (PostgreSQL keeps them and they may write from then on), so the burst of
//! held requests after a failover finds them ready instead of paying the logins.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::super::caps::free_slots;
use super::super::conn::ConnectTarget;
use super::super::pooled::Home;
use super::super::share::ShareGate;
use super::{Listing, NodePool, PoolKey, Pools, ServerPool};
use crate::config::NodeConfig;
use crate::directory::ShardId;

impl NodePool {
    /// `min_pool_size`: opens connections until the pool holds `min` (busy or idle; at
    /// most its size), so that a burst after a quiet spell does not pay the logins. One
    /// warm-up at a time per pool; a failed connect ends it until the next round.
    pub(super) async fn keep_warm(self: Arc<Self>, min: usize) {
        if self.warming.swap(true, Ordering::AcqRel) {
            return;
        }
        while self.below(min) {
            let epoch = self.epoch.load(Ordering::Acquire);
            let Ok(slots) = free_slots(&self.caps) else { break };
            match self.open(epoch, slots).await {
                Ok(conn) => Home::shelve(&*self, conn),
                Err(e) => {
                    tracing::debug!(addr = %self.target.addr(), error = %e, "min_pool_size: a connection could not be opened");
                    break;
                }
            }
        }
        self.warming.store(false, Ordering::Release);
    }

    /// Whether the pool holds fewer than `min` connections (busy or idle; at most its
    /// size) and is open.
    pub(super) fn below(&self, min: usize) -> bool {
        let held = self.gate.size().saturating_sub(self.gate.free());
        !self.gate.is_closed() && held + self.lock_shelf().len() < min.min(self.gate.size())
    }
}

impl Pools {
    /// `min_pool_size`: every pool below it opens connections up to it, in a task each,
    /// after each pool was given a like one on every node of its shard (`nodes_of`).
    pub fn keep_warm(&self, nodes_of: impl Fn(ShardId) -> Vec<NodeConfig>) {
        let min = self.config.proxy.min_pool_size;
        if min == 0 {
            return;
        }
        self.spread_to_every_node(nodes_of);
        let pools: Vec<ServerPool> =
            self.pools.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        // A task only for a pool that needs one: most rounds find every pool warm.
        for pool in pools.into_iter().filter(|p| p.0.below(min) && !p.0.warming.load(Ordering::Acquire)) {
            tokio::spawn(pool.0.clone().keep_warm(min));
        }
    }

    /// For each pool, the same pool (login, database, size, server credentials) on
    /// every other node of its shard, unless there is one.
    fn spread_to_every_node(&self, nodes_of: impl Fn(ShardId) -> Vec<NodeConfig>) {
        let pools: Vec<(PoolKey, ServerPool)> = {
            let pools = self.pools.read().unwrap_or_else(|e| e.into_inner());
            pools.iter().filter(|(_, p)| !p.is_closed()).map(|(k, p)| (k.clone(), p.clone())).collect()
        };
        let mut nodes: HashMap<ShardId, Vec<NodeConfig>> = HashMap::new();
        for (key, pool) in pools {
            let shard_nodes = nodes.entry(key.shard).or_insert_with(|| nodes_of(key.shard));
            for node in shard_nodes.iter() {
                self.add_like(&key, &pool, node);
            }
        }
    }

    /// `pool` (at `key`) on `node`, unless there is one.
    fn add_like(&self, key: &PoolKey, pool: &ServerPool, node: &NodeConfig) {
        let there = PoolKey {
            host: node.host.clone(),
            port: node.port,
            node_dbname: node.dbname.clone(),
            ..key.clone()
        };
        if self.pools.read().unwrap_or_else(|e| e.into_inner()).contains_key(&there) {
            return;
        }
        let old = &pool.0;
        let target = ConnectTarget {
            host: node.host.clone(),
            port: node.port,
            database: node.dbname.clone().unwrap_or_else(|| key.database.clone()),
            ..old.target.clone()
        };
        let caps = self.caps.for_pool(key.shard, &target.host, target.port, &target.database, &target.user);
        let gate = ShareGate::new(old.gate.size(), self.config.proxy.fair_share, self.limits.clone());
        let listing = Listing {
            servers: self.servers.clone(),
            shard: key.shard,
            login: old.login.clone(),
            caps: (caps, old.cap_wait),
        };
        let mut all = self.pools.write().unwrap_or_else(|e| e.into_inner());
        all.entry(there).or_insert_with(|| {
            tracing::debug!(shard = key.shard, addr = %target.addr(), user = %key.user, "min_pool_size: a like pool on another node of the shard");
            ServerPool::new(gate, target, self.tls.clone(), old.lifetime_ms, listing)
        });
    }
}
