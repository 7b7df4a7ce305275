//! PgBouncer's views (POOLS, CLIENTS, SERVERS, STATS, DATABASES, CONFIG, VERSION,
//! LISTS, USERS) with its column names, order and meaning, pgtenant's columns after.

use std::collections::{BTreeMap, BTreeSet};

use super::{CONSOLE_MODE, pool_mode_name};
use crate::admin::AdminView;
use crate::admin::table::{Kind, Table, int, opt_text, text};
use crate::config::{HealthConfig, NodeRole, ObserveConfig, ProxyConfig};
use crate::observe::conns::{ConnRow, ConnState, unix_ms};
use crate::observe::stats::StatsSnapshot;
use crate::protocol::values::{Value, console_time_text};

pub(super) fn pools(view: &AdminView<'_>) -> Table {
    let mut t = Table::new(&[
        ("database", Kind::Text),
        ("user", Kind::Text),
        ("cl_active", Kind::Int8),
        ("cl_waiting", Kind::Int8),
        ("cl_active_cancel_req", Kind::Int8),
        ("cl_waiting_cancel_req", Kind::Int8),
        ("sv_active", Kind::Int8),
        ("sv_active_cancel", Kind::Int8),
        ("sv_being_canceled", Kind::Int8),
        ("sv_idle", Kind::Int8),
        ("sv_used", Kind::Int8),
        ("sv_tested", Kind::Int8),
        ("sv_login", Kind::Int8),
        ("maxwait", Kind::Int8),
        ("maxwait_us", Kind::Int8),
        ("pool_mode", Kind::Text),
        ("cl_idle", Kind::Int8),
        ("sv_size", Kind::Int8),
    ]);
    #[derive(Default)]
    struct Pool {
        cl_active: u64,
        cl_waiting: u64,
        cl_idle: u64,
        sv_active: u64,
        sv_idle: u64,
        sv_being_canceled: u64,
        size: u64,
        oldest_wait_ms: Option<u64>,
    }
    let mut by_key: BTreeMap<(String, String), Pool> = BTreeMap::new();
    let now = unix_ms();
    for c in view.clients.rows() {
        let p = by_key.entry((c.info.database.clone(), c.info.user.clone())).or_default();
        match c.state {
            ConnState::Active => p.cl_active += 1,
            ConnState::Idle => p.cl_idle += 1,
            ConnState::Waiting | ConnState::Paused => {
                p.cl_waiting += 1;
                let waited = now.saturating_sub(c.since_unix_ms);
                p.oldest_wait_ms = Some(p.oldest_wait_ms.map_or(waited, |w| w.max(waited)));
            }
        }
    }
    for pool in view.pools.snapshot() {
        let p = by_key.entry((pool.database.clone(), pool.user.clone())).or_default();
        p.sv_active += pool.active as u64;
        p.sv_idle += pool.idle as u64;
        p.sv_being_canceled += pool.being_canceled as u64;
        p.size += pool.size as u64;
    }
    for ((database, user), p) in by_key {
        let mode = if crate::admin::is_console(&database) {
            CONSOLE_MODE
        } else {
            let user_mode = view.config.user(&user).and_then(|u| u.pool_mode);
            pool_mode_name(user_mode.unwrap_or(view.config.proxy.pool_mode))
        };
        let wait_ms = p.oldest_wait_ms.unwrap_or(0);
        t.push(vec![
            text(database),
            text(user),
            int(p.cl_active),
            int(p.cl_waiting),
            int(0),
            int(0),
            int(p.sv_active),
            int(0),
            int(p.sv_being_canceled),
            int(p.sv_idle),
            int(0),
            int(0),
            int(0),
            int(wait_ms / 1000),
            int((wait_ms % 1000) * 1000),
            text(mode),
            int(p.cl_idle),
            int(p.size),
        ]);
    }
    t
}

/// SHOW CLIENTS (`kind` "C") and SHOW SERVERS ("S").
pub(super) fn connections(view: &AdminView<'_>, rows: &[ConnRow], kind: &str) -> Table {
    let mut t = Table::new(&[
        ("type", Kind::Text),
        ("user", Kind::Text),
        ("database", Kind::Text),
        ("state", Kind::Text),
        ("addr", Kind::Text),
        ("port", Kind::Int8),
        ("local_addr", Kind::Text),
        ("local_port", Kind::Int8),
        // Text, as PgBouncer sends them (its exporters read them so).
        ("connect_time", Kind::Text),
        ("request_time", Kind::Text),
        ("wait", Kind::Int8),
        ("wait_us", Kind::Int8),
        ("close_needed", Kind::Int8),
        ("ptr", Kind::Text),
        ("link", Kind::Text),
        ("remote_pid", Kind::Int8),
        ("tls", Kind::Text),
        ("application_name", Kind::Text),
        ("prepared_statements", Kind::Int8),
        ("id", Kind::Int8),
        ("tenant", Kind::Text),
        ("shard", Kind::Int8),
    ]);
    let now = unix_ms();
    let (local_addr, local_port) =
        view.local_addr.map_or((Value::Null, Value::Null), |a| (text(a.ip().to_string()), int(a.port())));
    for c in rows {
        let waiting = matches!(c.state, ConnState::Waiting | ConnState::Paused);
        let waited_ms = if waiting { now.saturating_sub(c.since_unix_ms) } else { 0 };
        t.push(vec![
            text(kind),
            text(&c.info.user),
            text(&c.info.database),
            text(c.state.name()),
            text(&c.info.addr),
            int(c.info.port),
            if kind == "C" { local_addr.clone() } else { Value::Null },
            if kind == "C" { local_port.clone() } else { Value::Null },
            text(console_time_text(c.info.connect_unix_ms as i64)),
            text(console_time_text(c.request_unix_ms as i64)),
            int(waited_ms / 1000),
            int((waited_ms % 1000) * 1000),
            int(0),
            text(format!("{:x}", c.id)),
            text(c.link.map(|l| format!("{l:x}")).unwrap_or_default()),
            int(c.info.pid),
            text(if c.info.tls { "TLS" } else { "" }),
            text(&c.info.application_name),
            int(c.prepared),
            int(c.id),
            opt_text(c.tenant.as_ref().map(ToString::to_string)),
            c.shard.map_or(Value::Null, int),
        ]);
    }
    t
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum StatsColumns {
    Both,
    Totals,
    Averages,
}

/// Totals per database (the console's own included, as PgBouncer lists its own).
pub fn totals_by_database(view: &AdminView<'_>) -> BTreeMap<String, StatsSnapshot> {
    let mut by_db: BTreeMap<String, StatsSnapshot> = BTreeMap::new();
    by_db.insert(crate::admin::CONSOLE_DATABASE.to_string(), view.console.snapshot());
    for pool in view.pools.snapshot() {
        let entry = by_db.entry(pool.database.clone()).or_default();
        *entry = *entry + pool.stats;
    }
    by_db
}

pub(super) fn stats(view: &AdminView<'_>, columns: StatsColumns) -> Table {
    const TOTALS: [&str; 8] = [
        "xact_count",
        "query_count",
        "received",
        "sent",
        "xact_time",
        "query_time",
        "wait_time",
        "server_assignment_count",
    ];
    const AVERAGES: [&str; 7] =
        ["xact_count", "query_count", "recv", "sent", "xact_time", "query_time", "wait_time"];
    let mut names: Vec<String> = vec!["database".into()];
    match columns {
        StatsColumns::Both => {
            names.extend(TOTALS.iter().map(|c| format!("total_{c}")));
            names.extend(AVERAGES.iter().map(|c| format!("avg_{c}")));
        }
        // PgBouncer names these without a prefix, and bytes_received / bytes_sent.
        StatsColumns::Totals | StatsColumns::Averages => {
            names.extend(
                [
                    "xact_count",
                    "query_count",
                    "bytes_received",
                    "bytes_sent",
                    "xact_time",
                    "query_time",
                    "wait_time",
                ]
                .map(String::from),
            );
        }
    }
    let cols: Vec<(&str, Kind)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), if i == 0 { Kind::Text } else { Kind::Int8 }))
        .collect();
    let mut t = Table::new(&cols);
    for (database, s) in totals_by_database(view) {
        let totals = [
            int(s.xacts),
            int(s.queries),
            int(s.to_servers),
            int(s.from_servers),
            int(s.xact_us),
            int(s.query_us),
            int(s.wait_us),
        ];
        let a = view.history.averages(&database, &s);
        let averages = [
            int(a.xact_count),
            int(a.query_count),
            int(a.recv),
            int(a.sent),
            int(a.xact_time),
            int(a.query_time),
            int(a.wait_time),
        ];
        let mut row = vec![text(database)];
        match columns {
            StatsColumns::Both => {
                row.extend(totals);
                row.push(int(s.checkouts));
                row.extend(averages);
            }
            StatsColumns::Totals => row.extend(totals),
            StatsColumns::Averages => row.extend(averages),
        }
        t.push(row);
    }
    t
}

pub(super) fn databases(view: &AdminView<'_>) -> Table {
    let mut t = Table::new(&[
        ("name", Kind::Text),
        ("host", Kind::Text),
        ("port", Kind::Int8),
        ("database", Kind::Text),
        ("force_user", Kind::Text),
        ("pool_size", Kind::Int8),
        ("min_pool_size", Kind::Int8),
        ("reserve_pool", Kind::Int8),
        ("server_lifetime", Kind::Int8),
        ("pool_mode", Kind::Text),
        ("max_connections", Kind::Int8),
        ("current_connections", Kind::Int8),
        ("paused", Kind::Int8),
        ("disabled", Kind::Int8),
        ("shard", Kind::Int8),
        ("role", Kind::Text),
    ]);
    let console_port = view.local_addr.map_or(Value::Null, |a| int(a.port()));
    t.push(vec![
        text(crate::admin::CONSOLE_DATABASE),
        Value::Null,
        console_port,
        text(crate::admin::CONSOLE_DATABASE),
        Value::Null,
        int(0),
        int(0),
        int(0),
        int(0),
        text(CONSOLE_MODE),
        int(0),
        int(0),
        int(0),
        int(0),
        Value::Null,
        Value::Null,
    ]);
    // One row per database and node: pgtenant's "databases" are the client's database
    // on every node of every shard.
    /// (database, shard, host, port) -> (server database, pool sizes, connections).
    type NodeRows = BTreeMap<(String, u16, String, u16), (String, u64, u64)>;
    let mut rows = NodeRows::new();
    let topology = view.router.topology();
    for pool in view.pools.snapshot() {
        let e = rows.entry((pool.database.clone(), pool.shard, pool.host.clone(), pool.port)).or_insert((
            pool.server_database.clone(),
            0,
            0,
        ));
        e.1 += pool.size as u64;
        e.2 += (pool.active + pool.idle) as u64;
    }
    for ((database, shard, host, port), (server_database, size, current)) in rows {
        let role = topology
            .shard(shard)
            .and_then(|s| s.nodes.iter().find(|n| n.host == host && n.port == port))
            .map_or("gone", |n| if n.role == NodeRole::Primary { "primary" } else { "replica" });
        t.push(vec![
            text(format!("{database}@{host}:{port}")),
            text(host),
            int(port),
            text(server_database),
            Value::Null,
            int(size),
            int(0),
            int(0),
            int(view.config.proxy.server_lifetime_ms / 1000),
            text(pool_mode_name(view.config.proxy.pool_mode)),
            int(0),
            int(current),
            int(0),
            int(0),
            int(shard),
            text(role),
        ]);
    }
    t
}

/// Every setting of `[proxy]`, `[health]` and `[observe]`, flattened to text, with
/// PgBouncer's names for the ones its exporters read.
pub(super) fn config(view: &AdminView<'_>) -> Table {
    let mut t = Table::new(&[
        ("key", Kind::Text),
        ("value", Kind::Text),
        ("default", Kind::Text),
        ("changeable", Kind::Text),
    ]);
    let c = &view.config;
    let pool_size = c.users.iter().map(|u| u.pool_size).max().unwrap_or(0);
    let aliases = [
        ("max_client_conn", c.proxy.max_clients.to_string(), ProxyConfig::default().max_clients.to_string()),
        ("max_user_connections", "0".into(), "0".into()),
        ("default_pool_size", pool_size.to_string(), "20".into()),
        ("pool_mode", pool_mode_name(c.proxy.pool_mode).into(), "transaction".into()),
    ];
    for (key, value, default) in aliases {
        t.push(vec![text(key), text(value), text(default), text("no")]);
    }
    let sections = [
        ("", flatten(&c.proxy), flatten(&ProxyConfig::default())),
        ("health.", flatten(&c.health), flatten(&HealthConfig::default())),
        ("observe.", flatten(&c.observe), flatten(&ObserveConfig::default())),
    ];
    for (prefix, values, defaults) in sections {
        for (key, value) in values {
            if key.contains("password") || key.contains("secret") || key.contains("key") {
                continue;
            }
            let default = defaults.get(&key).cloned().unwrap_or_default();
            t.push(vec![text(format!("{prefix}{key}")), text(value), text(default), text("no")]);
        }
    }
    t
}

pub(super) fn flatten(section: &impl serde::Serialize) -> BTreeMap<String, String> {
    let Ok(serde_json::Value::Object(map)) = serde_json::to_value(section) else { return BTreeMap::new() };
    map.into_iter()
        .map(|(k, v)| {
            let v = match v {
                serde_json::Value::String(s) => s,
                serde_json::Value::Null => String::new(),
                other => other.to_string(),
            };
            (k, v)
        })
        .collect()
}

pub fn version_text() -> String {
    // PgBouncer's exporters look for "PgBouncer x.y.z" in this text.
    format!("pgtenant {} (PgBouncer 1.23.0 console compatible)", env!("CARGO_PKG_VERSION"))
}

pub(super) fn version() -> Table {
    let mut t = Table::new(&[("version", Kind::Text)]);
    t.push(vec![text(version_text())]);
    t
}

pub(super) fn lists(view: &AdminView<'_>) -> Table {
    let mut t = Table::new(&[("list", Kind::Text), ("items", Kind::Int8)]);
    let pools = view.pools.snapshot();
    let clients = view.clients.rows();
    let servers = view.pools.servers.rows();
    let databases: BTreeSet<&str> = pools.iter().map(|p| p.database.as_str()).collect();
    let used_servers = servers.iter().filter(|s| s.state == ConnState::Active).count();
    let counts = [
        ("databases", databases.len() + 1),
        ("users", view.config.users.len()),
        ("pools", pools.len() + 1),
        ("free_clients", 0),
        ("used_clients", clients.len()),
        ("login_clients", 0),
        ("free_servers", 0),
        ("used_servers", servers.len()),
        ("dns_names", 0),
        ("dns_zones", 0),
        ("dns_queries", 0),
        ("dns_pending", 0),
        ("active_servers", used_servers),
    ];
    for (list, items) in counts {
        t.push(vec![text(list), int(items)]);
    }
    t
}

pub(super) fn users(view: &AdminView<'_>) -> Table {
    let mut t = Table::new(&[
        ("name", Kind::Text),
        ("pool_size", Kind::Int8),
        ("pool_mode", Kind::Text),
        ("max_user_connections", Kind::Int8),
        ("current_connections", Kind::Int8),
        ("admin", Kind::Bool),
        ("target", Kind::Text),
    ]);
    let servers = view.pools.servers.rows();
    for u in &view.config.users {
        let current = servers.iter().filter(|s| s.info.user == u.server_user()).count();
        let target = match u.target.unwrap_or_default() {
            crate::config::ReadTarget::Primary => "primary",
            crate::config::ReadTarget::PreferReplica => "prefer-replica",
            crate::config::ReadTarget::Replica => "replica",
        };
        t.push(vec![
            text(&u.name),
            int(u.pool_size),
            text(pool_mode_name(u.pool_mode.unwrap_or(view.config.proxy.pool_mode))),
            int(0),
            int(current),
            Value::Bool(u.admin),
            text(target),
        ]);
    }
    t
}
