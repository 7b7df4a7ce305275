//! PgBouncer's views (POOLS, CLIENTS, SERVERS, STATS, DATABASES, CONFIG, VERSION,
//! LISTS, USERS) with its column names, order and meaning, pgtenant's columns after.

use std::collections::{BTreeMap, BTreeSet};

use super::{CONSOLE_MODE, pool_mode_name};
use crate::admin::AdminView;
use crate::admin::table::{Kind, Table, int, opt_text, text};
use crate::config::{
    CatalogConfig, HealthConfig, MovesConfig, NodeRole, ObserveConfig, ProxyConfig, ServerTlsConfig,
    SnowflakeConfig,
};
use crate::observe::conns::{ConnRow, ConnState, unix_ms};
use crate::observe::stats::{Averages, StatsSnapshot};
use crate::protocol::values::{Value, console_time_text};
use crate::tenancy::PauseScope;

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
            ConnState::Waiting | ConnState::Paused | ConnState::Held => {
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
        let waiting = matches!(c.state, ConnState::Waiting | ConnState::Paused | ConnState::Held);
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
            int(u8::from(c.close_needed)),
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
    // PgBouncer 1.23's columns, in its order; SHOW STATS prefixes them with total_ and
    // avg_ (avg_recv, not avg_received), STATS_TOTALS and STATS_AVERAGES with nothing.
    const NAMES: [&str; 11] = [
        "server_assignment_count",
        "xact_count",
        "query_count",
        "received",
        "sent",
        "xact_time",
        "query_time",
        "wait_time",
        "client_parse_count",
        "server_parse_count",
        "bind_count",
    ];
    let mut names: Vec<String> = vec!["database".into()];
    match columns {
        StatsColumns::Both => {
            names.extend(NAMES.iter().map(|c| format!("total_{c}")));
            names.extend(NAMES.iter().map(|c| format!("avg_{}", if *c == "received" { "recv" } else { c })));
        }
        StatsColumns::Totals | StatsColumns::Averages => {
            names.extend(NAMES.iter().map(|c| match *c {
                "received" | "sent" => format!("bytes_{c}"),
                c => c.to_string(),
            }));
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
            s.checkouts,
            s.xacts,
            s.queries,
            s.to_servers,
            s.from_servers,
            s.xact_us,
            s.query_us,
            s.wait_us,
            s.client_parses,
            s.server_parses,
            s.binds,
        ]
        .map(int);
        let a = view.history.averages(&database, &s);
        let averages = [
            a.server_assignment_count,
            a.xact_count,
            a.query_count,
            a.recv,
            a.sent,
            a.xact_time,
            a.query_time,
            a.wait_time,
            a.client_parse_count,
            a.server_parse_count,
            a.bind_count,
        ]
        .map(int);
        let mut row = vec![text(database)];
        match columns {
            StatsColumns::Both => {
                row.extend(totals);
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
    // One row per database and node, for every node of every shard (replicas and shards
    // no client used yet included): pgtenant's "databases" are the databases clients ask
    // for, on every node. Before any client asked, "*" stands for any database.
    /// (database, shard, host, port) -> (server database, connections).
    type NodeRows = BTreeMap<(String, u16, String, u16), (String, u64)>;
    let mut rows = NodeRows::new();
    let pools = view.pools.snapshot();
    let mut asked: BTreeSet<String> = pools.iter().map(|p| p.database.clone()).collect();
    if asked.is_empty() {
        asked.insert("*".into());
    }
    let topology = view.router.topology();
    for id in topology.shard_ids() {
        let Some(shard) = topology.shard(id) else { continue };
        for node in &shard.nodes {
            for database in &asked {
                let server_database = node.dbname.clone().unwrap_or_else(|| database.clone());
                rows.insert((database.clone(), id, node.host.clone(), node.port), (server_database, 0));
            }
        }
    }
    for pool in &pools {
        let e = rows
            .entry((pool.database.clone(), pool.shard, pool.host.clone(), pool.port))
            .or_insert((pool.server_database.clone(), 0));
        e.1 += (pool.active + pool.idle) as u64;
    }
    // What one user's pool on a node may open (PgBouncer's per-database pool_size).
    let pool_size = view.config.users.iter().map(|u| u.pool_size).max().unwrap_or(0);
    let paused = view.pauses.paused();
    for ((database, shard, host, port), (server_database, current)) in rows {
        let role = topology
            .shard(shard)
            .and_then(|s| s.nodes.iter().find(|n| n.host == host && n.port == port))
            .map_or("gone", |n| if n.role == NodeRole::Primary { "primary" } else { "replica" });
        let is_paused = paused.iter().any(|p| matches!(p, PauseScope::All) || *p == PauseScope::Shard(shard));
        t.push(vec![
            text(format!("{database}@{host}:{port}")),
            text(host),
            int(port),
            text(server_database),
            Value::Null,
            int(pool_size),
            int(0),
            int(0),
            int(view.config.proxy.server_lifetime_ms / 1000),
            text(pool_mode_name(view.config.proxy.pool_mode)),
            int(0),
            int(current),
            int(u8::from(is_paused)),
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
    for (key, value, default) in &aliases {
        t.push(vec![text(*key), text(value), text(default), text("no")]);
    }
    // A catalog's defaults are those of one that names only what it must.
    let catalog_defaults = serde_json::from_value::<CatalogConfig>(
        serde_json::json!({ "host": "", "user": "", "password": null, "dbname": "" }),
    )
    .map(|d| flatten(&d))
    .unwrap_or_default();
    let sections = [
        ("", flatten(&c.proxy), flatten(&ProxyConfig::default())),
        ("tls.", c.tls.as_ref().map(flatten).unwrap_or_default(), BTreeMap::new()),
        ("server_tls.", flatten(&c.server_tls), flatten(&ServerTlsConfig::default())),
        ("catalog.", c.catalog.as_ref().map(flatten).unwrap_or_default(), catalog_defaults),
        ("snowflake.", flatten(&c.snowflake), flatten(&SnowflakeConfig::default())),
        ("health.", flatten(&c.health), flatten(&HealthConfig::default())),
        ("observe.", flatten(&c.observe), flatten(&ObserveConfig::default())),
        ("moves.", flatten(&c.moves), flatten(&MovesConfig::default())),
    ];
    for (prefix, values, defaults) in sections {
        for (key, value) in values {
            // Secrets stay out; PgBouncer's names above already gave these.
            let secret = key.contains("password") || key.contains("secret") || key == "tenant_context_key";
            if secret || (prefix.is_empty() && aliases.iter().any(|(alias, ..)| *alias == key)) {
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
        let current = servers.iter().filter(|s| s.info.user == u.name).count();
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

/// SHOW TOTALS: SHOW STATS over every database, as name/value rows: totals summed,
/// rates summed, mean times weighted by the counts they are means over.
pub(super) fn totals(view: &AdminView<'_>) -> Table {
    let by_database = totals_by_database(view);
    let mut total = StatsSnapshot::default();
    let mut avg = Averages::default();
    let (mut xact_us, mut query_us, mut wait_us) = (0i64, 0i64, 0i64);
    for (database, s) in &by_database {
        total = total + *s;
        let a = view.history.averages(database, s);
        xact_us += a.xact_time * a.xact_count;
        query_us += a.query_time * a.query_count;
        wait_us += a.wait_time * a.server_assignment_count;
        avg.server_assignment_count += a.server_assignment_count;
        avg.xact_count += a.xact_count;
        avg.query_count += a.query_count;
        avg.recv += a.recv;
        avg.sent += a.sent;
        avg.client_parse_count += a.client_parse_count;
        avg.server_parse_count += a.server_parse_count;
        avg.bind_count += a.bind_count;
    }
    let mean = |sum: i64, n: i64| if n > 0 { sum / n } else { 0 };
    let rows: [(&str, i64); 22] = [
        ("total_server_assignment_count", total.checkouts as i64),
        ("total_xact_count", total.xacts as i64),
        ("total_query_count", total.queries as i64),
        ("total_received", total.to_servers as i64),
        ("total_sent", total.from_servers as i64),
        ("total_xact_time", total.xact_us as i64),
        ("total_query_time", total.query_us as i64),
        ("total_wait_time", total.wait_us as i64),
        ("total_client_parse_count", total.client_parses as i64),
        ("total_server_parse_count", total.server_parses as i64),
        ("total_bind_count", total.binds as i64),
        ("avg_server_assignment_count", avg.server_assignment_count),
        ("avg_xact_count", avg.xact_count),
        ("avg_query_count", avg.query_count),
        ("avg_recv", avg.recv),
        ("avg_sent", avg.sent),
        ("avg_xact_time", mean(xact_us, avg.xact_count)),
        ("avg_query_time", mean(query_us, avg.query_count)),
        ("avg_wait_time", mean(wait_us, avg.server_assignment_count)),
        ("avg_client_parse_count", avg.client_parse_count),
        ("avg_server_parse_count", avg.server_parse_count),
        ("avg_bind_count", avg.bind_count),
    ];
    let mut t = Table::new(&[("name", Kind::Text), ("value", Kind::Int8)]);
    for (name, value) in rows {
        t.push(vec![text(name), int(value)]);
    }
    t
}

/// SHOW STATE: PgBouncer's three states. pgtenant pauses by scope: `paused` is yes
/// while a PAUSE of everything is in force, and it never suspends.
pub(super) fn state(view: &AdminView<'_>) -> Table {
    let paused = view.pauses.paused().contains(&PauseScope::All);
    let mut t = Table::new(&[("key", Kind::Text), ("value", Kind::Text)]);
    for (key, yes) in [("active", !paused), ("paused", paused), ("suspended", false)] {
        t.push(vec![text(key), text(if yes { "yes" } else { "no" })]);
    }
    t
}
