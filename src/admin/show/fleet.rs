//! pgtenant's own views: SHARDS, NODES, TENANT, ROUTING, LANES, PAUSES, HELP.

use std::collections::BTreeSet;

use super::{POOL_USE_CRITICAL, POOL_USE_WARNING};
use crate::admin::AdminView;
use crate::admin::command::HELP;
use crate::admin::table::{Kind, Table, int, opt_text, text};
use crate::backend::PoolView;
use crate::backend::health::{NodeKey, NodeState, ObservedRole, PrimaryChoice};
use crate::config::NodeRole;
use crate::directory::{PlacementRule, Shard, TenantId};
use crate::observe::conns::ConnRow;
use crate::protocol::values::Value;

/// Pool use of a shard's primary pools: connections held over the pool sizes.
pub(super) fn use_level(ratio: f64) -> &'static str {
    if ratio > POOL_USE_CRITICAL {
        "critical"
    } else if ratio > POOL_USE_WARNING {
        "warning"
    } else {
        "ok"
    }
}

pub(super) fn shards(view: &AdminView<'_>) -> Table {
    let mut t = Table::new(&[
        ("shard", Kind::Int8),
        ("status", Kind::Text),
        ("nodes", Kind::Int8),
        ("healthy_nodes", Kind::Int8),
        ("primary", Kind::Text),
        ("replicas", Kind::Int8),
        ("pool_size", Kind::Int8),
        ("sv_active", Kind::Int8),
        ("sv_idle", Kind::Int8),
        ("cl_waiting", Kind::Int8),
        ("pool_use", Kind::Float8),
        ("pool_use_level", Kind::Text),
        ("clients", Kind::Int8),
        ("active_tenants", Kind::Int8),
        ("ranges", Kind::Text),
    ]);
    let topology = view.router.topology();
    let pools = view.pools.snapshot();
    let clients = view.clients.rows();
    for id in topology.shard_ids() {
        let Some(shard) = topology.shard(id) else { continue };
        let healthy = shard
            .nodes
            .iter()
            .filter(|n| matches!(view.health.state(&NodeKey::of(id, n)), NodeState::Up { failing: 0, .. }))
            .count();
        let primary_node = match view.health.primary_of(shard) {
            PrimaryChoice::Node(n) => Some(n),
            PrimaryChoice::Holding(_) => None,
        };
        let primary = writes_to(view, shard);
        // The primary's pools (every user's and database's): what the shard's writes and
        // transactions draw on. Replica pools are in SHOW POOLS and SHOW DATABASES.
        let mine: Vec<&PoolView> = pools
            .iter()
            .filter(|p| {
                p.shard == id && primary_node.as_ref().is_some_and(|n| n.host == p.host && n.port == p.port)
            })
            .collect();
        let size: usize = mine.iter().map(|p| p.size).sum();
        let active: usize = mine.iter().map(|p| p.active).sum();
        let ratio = if size > 0 { active as f64 / size as f64 } else { 0.0 };
        // A shard that cannot write is not "active" and its use not "ok", whatever its pools say.
        let (status, level) = match (&primary_node, shard.status.describe()) {
            (None, "active") => ("no_primary", "critical"),
            (_, status) => (status, use_level(ratio)),
        };
        let on_shard: Vec<&ConnRow> = clients.iter().filter(|c| c.shard == Some(u32::from(id))).collect();
        let tenants: BTreeSet<String> =
            on_shard.iter().filter_map(|c| c.tenant.as_ref().map(ToString::to_string)).collect();
        let ranges: Vec<String> = topology
            .ranges()
            .iter()
            .filter(|r| r.2 == id)
            // As PostgreSQL writes an inclusive range.
            .map(|(min, max, _)| format!("[{min},{max}]"))
            .collect();
        t.push(vec![
            int(id),
            text(status),
            int(shard.nodes.len()),
            int(healthy),
            text(primary),
            int(shard.nodes.iter().filter(|n| n.role == NodeRole::Replica).count()),
            int(size),
            int(active),
            int(mine.iter().map(|p| p.idle).sum::<usize>()),
            int(mine.iter().map(|p| p.waiting).sum::<usize>()),
            Value::Float8(ratio),
            text(level),
            int(on_shard.len()),
            int(tenants.len()),
            text(ranges.join(", ")),
        ]);
    }
    t
}

/// The node `shard`'s writes go to now (`host:port`), or why none.
pub(super) fn writes_to(view: &AdminView<'_>, shard: &Shard) -> String {
    match view.health.primary_of(shard) {
        PrimaryChoice::Node(n) => format!("{}:{}", n.host, n.port),
        PrimaryChoice::Holding(reason) => format!("none: {}", reason.describe()),
    }
}

pub(super) fn nodes(view: &AdminView<'_>) -> Table {
    let mut t = Table::new(&[
        ("shard", Kind::Int8),
        ("host", Kind::Text),
        ("port", Kind::Int8),
        ("role", Kind::Text),
        ("priority", Kind::Int8),
        ("state", Kind::Text),
        ("observed_role", Kind::Text),
        ("timeline", Kind::Int8),
        ("lsn", Kind::Text),
        ("lag_bytes", Kind::Int8),
        ("lag_ms", Kind::Int8),
        ("serves", Kind::Text),
    ]);
    let topology = view.router.topology();
    for id in topology.shard_ids() {
        let Some(shard) = topology.shard(id) else { continue };
        let writer = match view.health.primary_of(shard) {
            PrimaryChoice::Node(n) => Some((n.host, n.port)),
            PrimaryChoice::Holding(_) => None,
        };
        for node in &shard.nodes {
            let state = view.health.state(&NodeKey::of(id, node));
            let (state_name, observed, timeline, lsn) = match state {
                NodeState::Unchecked => ("unchecked", Value::Null, Value::Null, Value::Null),
                NodeState::Down => ("down", Value::Null, Value::Null, Value::Null),
                NodeState::Up { role, timeline, lsn, failing } => (
                    if failing > 0 { "failing" } else { "up" },
                    text(if role == ObservedRole::Primary { "primary" } else { "replica" }),
                    int(timeline),
                    text(format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)),
                ),
            };
            let lag = view.health.lag_of(shard, node);
            let serves = if writer.as_ref().is_some_and(|(h, p)| *h == node.host && *p == node.port) {
                "writes"
            } else if matches!(state, NodeState::Up { role: ObservedRole::Replica, failing: 0, .. }) {
                "reads"
            } else {
                "nothing"
            };
            t.push(vec![
                int(id),
                text(&node.host),
                int(node.port),
                text(if node.role == NodeRole::Primary { "primary" } else { "replica" }),
                int(node.priority),
                text(state_name),
                observed,
                timeline,
                lsn,
                lag.map_or(Value::Null, |(bytes, _)| int(bytes)),
                lag.map_or(Value::Null, |(_, ms)| int(ms)),
                text(serves),
            ]);
        }
    }
    t
}

pub(super) async fn tenant(view: &AdminView<'_>, id: &str) -> Table {
    let mut t = Table::new(&[
        ("tenant", Kind::Text),
        ("placed", Kind::Bool),
        ("source", Kind::Text),
        ("shard", Kind::Int8),
        ("state", Kind::Text),
        ("node", Kind::Text),
        ("routing_version", Kind::Int8),
        ("cached", Kind::Bool),
        ("clients", Kind::Int8),
        ("error", Kind::Text),
        ("transactions", Kind::Int8),
        ("server_time_ms", Kind::Float8),
        ("errors", Kind::Int8),
    ]);
    let version = int(view.router.routing_version());
    let Some(tenant) = TenantId::parse(id, view.config.proxy.tenant_key) else {
        let error = format!("\"{id}\" is not a tenant id of this proxy's key type");
        t.push(vec![
            text(id),
            Value::Bool(false),
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
            version,
            Value::Bool(false),
            int(0),
            text(error),
            Value::Null,
            Value::Null,
            Value::Null,
        ]);
        return t;
    };
    // Its figures, where the per-tenant statistics keep it (SHOW TENANTS).
    let kept = view.tenant_stats.rows(None, crate::backend::coarse_clock::coarse_ms());
    let kept = kept.iter().find(|r| r.tenant == tenant);
    let figures = [
        kept.map_or(Value::Null, |r| int(r.total.transactions)),
        kept.map_or(Value::Null, |r| Value::Float8(r.total.server_us as f64 / 1000.0)),
        kept.map_or(Value::Null, |r| int(r.total.errors)),
    ];
    let cached = view.router.is_cached(&tenant);
    let clients =
        view.clients.rows().iter().filter(|c| c.tenant.as_ref().is_some_and(|t| t.to_string() == id)).count();
    let topology = view.router.topology();
    match view.router.placement(&tenant).await {
        Ok(placement) => {
            let source = match topology.rule_for(&tenant) {
                Some((PlacementRule::Range { min, max }, shard)) if shard == placement.shard => {
                    format!("range [{min},{max}]")
                }
                Some((PlacementRule::HashGroup(group), shard)) if shard == placement.shard => {
                    format!("hash group {group}")
                }
                _ => "map".to_string(),
            };
            let node = topology.shard(placement.shard).map(|s| writes_to(view, s));
            t.push(vec![
                text(id),
                Value::Bool(true),
                text(source),
                int(placement.shard),
                text(placement.state.describe()),
                opt_text(node),
                version,
                Value::Bool(cached),
                int(clients),
                Value::Null,
                figures[0].clone(),
                figures[1].clone(),
                figures[2].clone(),
            ]);
        }
        Err(e) => t.push(vec![
            text(id),
            Value::Bool(false),
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
            version,
            Value::Bool(cached),
            int(clients),
            text(e.to_string()),
            figures[0].clone(),
            figures[1].clone(),
            figures[2].clone(),
        ]),
    }
    t
}

pub(super) fn routing(view: &AdminView<'_>) -> Table {
    let mut t = Table::new(&[
        ("routing_version", Kind::Int8),
        ("source", Kind::Text),
        ("catalog_listening", Kind::Bool),
        ("cached_tenants", Kind::Int8),
        ("cache_hits", Kind::Int8),
        ("cache_misses", Kind::Int8),
        ("cache_hit_rate", Kind::Float8),
        ("shards", Kind::Int8),
    ]);
    let status = view.router.directory_status();
    let asked = status.cache_hits + status.cache_misses;
    let rate = if asked > 0 { Value::Float8(status.cache_hits as f64 / asked as f64) } else { Value::Null };
    t.push(vec![
        int(view.router.routing_version()),
        text(status.source),
        status.listening.map_or(Value::Null, Value::Bool),
        status.cached_tenants.map_or(Value::Null, int),
        int(status.cache_hits),
        int(status.cache_misses),
        rate,
        int(view.router.topology().shard_ids().count()),
    ]);
    t
}

pub(super) fn lanes(view: &AdminView<'_>) -> Table {
    let mut t = Table::new(&[
        ("shard", Kind::Int8),
        ("host", Kind::Text),
        ("port", Kind::Int8),
        ("user", Kind::Text),
        ("database", Kind::Text),
        ("lanes", Kind::Int8),
        ("pipeline_depth", Kind::Int8),
    ]);
    for pool in view.pools.snapshot() {
        t.push(vec![
            int(pool.shard),
            text(&pool.host),
            int(pool.port),
            text(&pool.user),
            text(&pool.database),
            int(pool.lanes),
            int(view.config.proxy.pipeline_depth),
        ]);
    }
    t
}

pub(super) fn pauses(view: &AdminView<'_>) -> Table {
    let mut t = Table::new(&[("scope", Kind::Text)]);
    for scope in view.pauses.paused() {
        t.push(vec![text(scope.describe())]);
    }
    t
}

pub(super) fn help() -> Table {
    let mut t = Table::new(&[("command", Kind::Text), ("shows", Kind::Text)]);
    for (command, shows) in HELP {
        t.push(vec![text(*command), text(*shows)]);
    }
    t
}
