//! `auto_promote`: when a shard's primary is down and one of its replicas is up, the
//! proxy promotes the best replica itself (`pg_promote()`). Two promoter ticks in a
//! row must see the shard so before it acts, so a primary that restarts at once is
//! left alone. With a catalog, an advisory lock there makes one proxy of many act; the
//! one that takes it checks every node afresh first (another proxy, or Patroni, may
//! have promoted one meanwhile) and holds it until its promotion is over.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::task::JoinHandle;

use super::checker::{CheckSettings, check, connect};
use super::view::{CheckOutcome, HealthView, Observation, ObservedRole};
use crate::config::{CatalogConfig, Config, NodeConfig};
use crate::directory::{Shard, ShardId, Topology};

/// The advisory lock class of promotions ("pgtp"); the second key is the shard.
const PROMOTION_LOCK_CLASS: i32 = 0x7067_7470;

/// What a fresh look at a shard's nodes says to do.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// A node answers as primary on the newest timeline: nothing to do.
    HasPrimary,
    Promote(NodeConfig),
    /// No replica may be promoted (named why).
    NoCandidate(&'static str),
}

/// The replica to promote among `nodes` (each with how its fresh check went): none
/// while a node is primary on a timeline at least `floor_timeline`; else the replica
/// that received the most WAL, the lowest `priority` first among equals, and never one
/// behind `sync_confirmed` (a write a synchronous standby confirmed was acknowledged to
/// its client, and promoting a replica without it would lose it).
pub fn decide(nodes: &[(NodeConfig, CheckOutcome)], floor_timeline: u32, sync_confirmed: u64) -> Decision {
    let answered = || {
        nodes.iter().filter_map(|(node, outcome)| match outcome {
            CheckOutcome::Answered(o) => Some((node, o)),
            _ => None,
        })
    };
    if answered().any(|(_, o)| o.role == ObservedRole::Primary && o.timeline >= floor_timeline) {
        return Decision::HasPrimary;
    }
    let replicas: Vec<(&NodeConfig, &Observation)> =
        answered().filter(|(_, o)| o.role == ObservedRole::Replica).collect();
    let Some(furthest) = replicas.iter().map(|(_, o)| o.received).max() else {
        return Decision::NoCandidate("no replica answers");
    };
    if furthest < sync_confirmed {
        return Decision::NoCandidate(
            "every replica is behind what a synchronous standby confirmed: promoting one would lose acknowledged writes",
        );
    }
    replicas
        .iter()
        .filter(|(_, o)| o.received == furthest)
        .min_by_key(|(node, _)| node.priority)
        .map_or(Decision::NoCandidate("no replica answers"), |(node, _)| Decision::Promote((*node).clone()))
}

/// Who may promote: the holder of a lock in the catalog, or this proxy alone.
enum PromotionGuard {
    Catalog { pg: Box<tokio_postgres::Config>, client: Option<tokio_postgres::Client> },
    ThisProxyOnly,
}

impl PromotionGuard {
    /// Takes the shard's promotion lock: `Ok(false)` when another proxy holds it.
    async fn lock(&mut self, shard: ShardId) -> Result<bool, tokio_postgres::Error> {
        let PromotionGuard::Catalog { pg, client } = self else { return Ok(true) };
        if client.as_ref().is_none_or(|c| c.is_closed()) {
            let (c, connection) = pg.connect(tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            *client = Some(c);
        }
        let Some(c) = client.as_ref() else { return Ok(false) };
        let row = c
            .query_one("SELECT pg_try_advisory_lock($1, $2)", &[&PROMOTION_LOCK_CLASS, &i32::from(shard)])
            .await?;
        Ok(row.get(0))
    }

    async fn unlock(&mut self, shard: ShardId) {
        if let PromotionGuard::Catalog { client: Some(c), .. } = self
            && c.execute("SELECT pg_advisory_unlock($1, $2)", &[&PROMOTION_LOCK_CLASS, &i32::from(shard)])
                .await
                .is_err()
        {
            // The lock ends with the session.
            self.drop_connection();
        }
    }

    fn drop_connection(&mut self) {
        if let PromotionGuard::Catalog { client, .. } = self {
            *client = None;
        }
    }
}

/// Runs the promoter for as long as `topology` answers.
pub fn spawn(
    view: Arc<HealthView>,
    config: &Config,
    topology: impl Fn() -> Option<Arc<Topology>> + Send + 'static,
) -> JoinHandle<()> {
    let settings = CheckSettings::from(config);
    let mut guard = match &config.catalog {
        Some(catalog) => {
            PromotionGuard::Catalog { pg: Box::new(CatalogConfig::pg_config(catalog)), client: None }
        }
        None => PromotionGuard::ThisProxyOnly,
    };
    tokio::spawn(async move {
        // How many ticks in a row each shard has wanted a promotion.
        let mut wanting: HashMap<ShardId, u32> = HashMap::new();
        let mut every = tokio::time::interval(settings.interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let Some(topology) = topology() else { break };
            for id in topology.shard_ids() {
                let Some(shard) = topology.shard(id) else { continue };
                if !view.wants_promotion(shard) {
                    wanting.remove(&id);
                    continue;
                }
                let ticks = wanting.entry(id).or_default();
                *ticks += 1;
                if *ticks >= 2 {
                    wanting.remove(&id);
                    promote_if_still_needed(&view, shard, &settings, &mut guard).await;
                }
            }
        }
    })
}

async fn promote_if_still_needed(
    view: &HealthView,
    shard: &Shard,
    settings: &CheckSettings,
    guard: &mut PromotionGuard,
) {
    match guard.lock(shard.id).await {
        Ok(true) => {}
        Ok(false) => {
            tracing::info!(shard = shard.id, "another proxy is promoting a replica of this shard");
            return;
        }
        Err(e) => {
            tracing::warn!(shard = shard.id, error = %e, "cannot take the promotion lock in the catalog: no promotion");
            guard.drop_connection();
            return;
        }
    }
    let mut fresh = Vec::with_capacity(shard.nodes.len());
    for node in &shard.nodes {
        let outcome = tokio::time::timeout(settings.timeout, check(&mut None, node, settings))
            .await
            .unwrap_or(CheckOutcome::Failed);
        fresh.push((node.clone(), outcome));
    }
    let (floor_timeline, sync_confirmed) = view.wal_floor(shard.id);
    match decide(&fresh, floor_timeline, sync_confirmed) {
        Decision::HasPrimary => {}
        Decision::NoCandidate(why) => {
            tracing::error!(shard = shard.id, why, "the shard has no primary and no replica can be promoted")
        }
        Decision::Promote(node) => promote(shard.id, &node, settings).await,
    }
    guard.unlock(shard.id).await;
}

async fn promote(shard: ShardId, node: &NodeConfig, settings: &CheckSettings) {
    let at = format!("{}:{}", node.host, node.port);
    tracing::warn!(shard, node = %at, "the shard's primary is down: promoting a replica");
    let result = match connect(node, settings, "pgtenant promotion").await {
        // Waits for the promotion to end (at most 60 s), so the lock is held until then.
        Ok(client) => {
            client.query_one("SELECT pg_promote(true, 60)", &[]).await.map(|row| row.get::<_, bool>(0))
        }
        Err(e) => Err(e),
    };
    match result {
        Ok(true) => tracing::warn!(shard, node = %at, "replica promoted"),
        Ok(false) => tracing::error!(shard, node = %at, "the promotion did not end within 60 s"),
        Err(e) => {
            let error = e.as_db_error().map_or_else(|| e.to_string(), |db| db.message().to_string());
            tracing::error!(shard, node = %at, error, "the promotion failed (the health check user needs superuser or EXECUTE on pg_promote)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NodeRole;

    fn node(port: u16, priority: u32) -> NodeConfig {
        NodeConfig { host: "127.0.0.1".into(), port, role: NodeRole::Replica, priority, dbname: None }
    }

    fn seen(role: ObservedRole, timeline: u32, received: u64) -> CheckOutcome {
        CheckOutcome::Answered(Observation { role, timeline, lsn: received, received, sync_confirmed: None })
    }

    #[test]
    fn the_replica_with_the_most_wal_goes_first_then_priority() {
        let nodes = vec![
            (node(1, 0), CheckOutcome::Refused),
            (node(2, 2), seen(ObservedRole::Replica, 1, 500)),
            (node(3, 1), seen(ObservedRole::Replica, 1, 500)),
            (node(4, 0), seen(ObservedRole::Replica, 1, 400)),
        ];
        assert_eq!(decide(&nodes, 1, 0), Decision::Promote(node(3, 1)), "caught up, then by priority");
        assert!(matches!(decide(&nodes, 1, 600), Decision::NoCandidate(_)), "all behind the sync standby");
        assert_eq!(decide(&nodes, 1, 500), Decision::Promote(node(3, 1)));
    }

    #[test]
    fn a_primary_on_the_newest_timeline_means_nothing_to_do_but_an_old_one_does_not() {
        let mut nodes = vec![
            (node(1, 0), seen(ObservedRole::Primary, 1, 900)),
            (node(2, 0), seen(ObservedRole::Replica, 2, 500)),
        ];
        assert_eq!(decide(&nodes, 2, 0), Decision::Promote(node(2, 0)), "an old primary on timeline 1");
        assert_eq!(decide(&nodes, 1, 0), Decision::HasPrimary);
        nodes[1].1 = CheckOutcome::Failed;
        assert!(matches!(decide(&nodes, 2, 0), Decision::NoCandidate(_)));
    }
}
