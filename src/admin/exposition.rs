//! `/metrics`: every scrape reads the same snapshots as the console and writes them
//! into this proxy's Prometheus recorder (`metrics` with `metrics-exporter-prometheus`,
//! a recorder per proxy, used only here), so the data path keeps its plain atomic
//! counters and never pays for a metrics call. Series are per shard, node, database
//! and user; never per tenant. The checkout-wait and request-time histograms come from
//! the pools' fixed buckets, written out after the recorder's text.

use std::fmt::Write;

use metrics::{counter, describe_counter, describe_gauge, gauge, with_local_recorder};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};

use super::AdminView;
use super::show::{POOL_USE_CRITICAL, POOL_USE_WARNING, clients_by_state};
use crate::backend::PoolView;
use crate::backend::health::{NodeKey, NodeState, ObservedRole, PrimaryChoice};
use crate::observe::conns::ConnState;
use crate::observe::stats::{StatsSnapshot, WAIT_BUCKETS_US};

pub struct Exposition {
    recorder: PrometheusRecorder,
}

impl Default for Exposition {
    fn default() -> Self {
        let recorder = PrometheusBuilder::new().build_recorder();
        with_local_recorder(&recorder, describe);
        Self { recorder }
    }
}

/// The HELP text of every family the recorder writes (`promtool check metrics` wants
/// one each). The families written by hand below carry theirs where they are written.
fn describe() {
    for (name, help) in COUNTERS {
        describe_counter!(*name, *help);
    }
    for (name, help) in GAUGES {
        describe_gauge!(*name, *help);
    }
}

const COUNTERS: &[(&str, &str)] = &[
    (
        "pgtenant_queries_total",
        "Requests (statements or extended-protocol syncs) servers answered, per pool.",
    ),
    ("pgtenant_transactions_total", "Transactions servers completed, per pool."),
    ("pgtenant_query_errors_total", "Requests a server answered with an error, per pool."),
    (
        "pgtenant_bytes_to_servers_total",
        "Bytes pgtenant sent to servers, per pool (its own setup statements included).",
    ),
    ("pgtenant_bytes_from_servers_total", "Bytes servers sent to pgtenant, per pool."),
    ("pgtenant_checkouts_total", "Server connections handed to a request, per pool."),
    ("pgtenant_directory_cache_hits_total", "Tenant lookups answered by the directory cache."),
    ("pgtenant_directory_cache_misses_total", "Tenant lookups that went to the catalog."),
    ("pgtenant_parse_cache_hits_total", "Statements whose routing analysis came from the parse cache."),
    ("pgtenant_parse_cache_misses_total", "Statements analyzed afresh."),
    ("pgtenant_snowflake_ids_minted_total", "Snowflake IDs this proxy minted."),
    ("pgtenant_routes_total", "Requests routed, by where their tenant came from (source)."),
    (
        "pgtenant_errors_total",
        "ErrorResponses clients received, by SQLSTATE class and by who raised them (server or pgtenant).",
    ),
    (
        "pgtenant_scatter_statements_total",
        "Scatter-gather (all_shards.) statements, by how they ended (outcome).",
    ),
    ("pgtenant_scatter_shard_parts_total", "Scatter-gather parts a shard answered."),
];

const GAUGES: &[(&str, &str)] = &[
    ("pgtenant_clients", "Client connections now, by state."),
    ("pgtenant_pool_size", "Server connections a pool may open (pool_size)."),
    ("pgtenant_pool_waiting", "Requests waiting for a server connection of the pool now."),
    ("pgtenant_pool_use_ratio", "Share of the pool's connections in use now (active / pool_size)."),
    ("pgtenant_server_connections", "Server connections now, by state (active, idle)."),
    ("pgtenant_pool_use_warning_ratio", "pgtenant_pool_use_ratio above which SHOW POOLS says warning."),
    ("pgtenant_pool_use_critical_ratio", "pgtenant_pool_use_ratio above which SHOW POOLS says critical."),
    ("pgtenant_shard_has_primary", "1 while the shard has a primary requests can be sent to, else 0."),
    ("pgtenant_node_up", "1 while the node answers health checks, else 0."),
    ("pgtenant_node_is_primary", "1 while the node is up and reports itself a primary, else 0."),
    ("pgtenant_replica_lag_bytes", "WAL bytes the replica has not replayed yet."),
    ("pgtenant_replica_lag_seconds", "How far behind its primary the replica's replay is."),
    (
        "pgtenant_replica_lag_bound_seconds",
        "Replica lag past which reads leave a replica (max_replica_lag_ms).",
    ),
    (
        "pgtenant_replica_lag_bound_bytes",
        "Replica lag past which reads leave a replica (max_replica_lag_bytes).",
    ),
    ("pgtenant_routing_version", "The catalog's routing version this proxy has applied."),
    (
        "pgtenant_held_requests",
        "Requests waiting now for a shard without primary to get one (failover_hold_ms).",
    ),
    (
        "pgtenant_catalog_change_lag_seconds",
        "Time from a catalog change to this proxy applying it, last seen.",
    ),
    ("pgtenant_catalog_listening", "1 while this proxy's LISTEN connection to the catalog is up, else 0."),
    ("pgtenant_ready", "1 while /ready would answer 200, else 0."),
    (
        "pgtenant_move_phase",
        "A tenant move's phase: 0 planned, 1 copying, 2 catching_up, 3 cutover, 4 switched, 5 cleaned, 6 rolled_back.",
    ),
    (
        "pgtenant_connection_slice",
        "This proxy's slice of a shard's connection budget for a role (the catalog's connection_budget): size, held, waiting (new connections waiting for a slot).",
    ),
    ("pgtenant_move_rows_copied", "Rows a tenant move has copied."),
    ("pgtenant_move_bytes_copied", "Size of the rows a tenant move has copied (sum of pg_column_size)."),
    ("pgtenant_move_cutover_attempts", "Cutover attempts of a tenant move."),
    ("pgtenant_move_lag_seconds", "How far the move's catch-up trails the source."),
    ("pgtenant_move_pause_seconds", "How long the move's cutover paused the tenant's writes."),
    (
        "pgtenant_fleet_batch_state",
        "A fleet batch this proxy drives or drove: 1 running, 2 paused, 3 done, 4 failed.",
    ),
    ("pgtenant_fleet_batch_moves", "A fleet batch's moves: planned in all, done, failed (outcome)."),
    ("pgtenant_fleet_batch_rows_copied", "Rows a fleet batch's moves have copied."),
    ("pgtenant_fleet_batch_bytes_copied", "Size of the rows a fleet batch's moves have copied."),
    ("pgtenant_fleet_batch_seconds", "How long a fleet batch has run (to its end once ended)."),
    (
        "pgtenant_fleet_batch_longest_pause_seconds",
        "The longest cutover pause a tenant of a fleet batch had.",
    ),
    (
        "pgtenant_fleet_batch_bandwidth_bytes",
        "A fleet batch's copy-bandwidth budget, bytes a second (absent: none).",
    ),
];

impl Exposition {
    /// The Prometheus text of everything now.
    pub fn render(&self, view: &AdminView<'_>) -> String {
        let pools = view.pools.snapshot();
        with_local_recorder(&self.recorder, || record(view, &pools));
        let mut text = self.recorder.handle().render();
        histogram(
            &mut text,
            "pgtenant_checkout_wait_seconds",
            "Time from asking for a server connection to holding one.",
            &pools,
            |s| (s.wait_buckets, s.wait_us),
        );
        histogram(
            &mut text,
            "pgtenant_request_seconds",
            "Time a server took over a request (to its ReadyForQuery): the seed's p99 thresholds are 0.1 s (warning) and 0.5 s (critical).",
            &pools,
            |s| (s.query_buckets, s.query_us),
        );
        seconds_counters(&mut text, &pools);
        tenant_counters(&mut text, view);
        text
    }
}

fn record(view: &AdminView<'_>, pools: &[PoolView]) {
    for (state, n) in clients_by_state(view) {
        gauge!("pgtenant_clients", "state" => state).set(n as f64);
    }
    let servers = view.pools.servers.rows();
    for pool in pools {
        let node = format!("{}:{}", pool.host, pool.port);
        let labels = [
            ("shard", pool.shard.to_string()),
            ("node", node.clone()),
            ("database", pool.database.clone()),
            ("user", pool.user.clone()),
        ];
        let s = pool.stats;
        counter!("pgtenant_queries_total", &labels).absolute(s.queries);
        counter!("pgtenant_transactions_total", &labels).absolute(s.xacts);
        counter!("pgtenant_query_errors_total", &labels).absolute(s.errors);
        counter!("pgtenant_bytes_to_servers_total", &labels).absolute(s.to_servers);
        counter!("pgtenant_bytes_from_servers_total", &labels).absolute(s.from_servers);
        counter!("pgtenant_checkouts_total", &labels).absolute(s.checkouts);
        gauge!("pgtenant_pool_size", &labels).set(pool.size as f64);
        gauge!("pgtenant_pool_waiting", &labels).set(pool.waiting as f64);
        let ratio = if pool.size > 0 { pool.active as f64 / pool.size as f64 } else { 0.0 };
        gauge!("pgtenant_pool_use_ratio", &labels).set(ratio);
        for state in [ConnState::Active, ConnState::Idle] {
            let n = servers
                .iter()
                .filter(|c| {
                    c.state == state
                        && c.info.addr == pool.host
                        && c.info.port == pool.port
                        && c.info.user == pool.user
                })
                .count();
            gauge!("pgtenant_server_connections", "shard" => pool.shard.to_string(), "node" => node.clone(), "user" => pool.user.clone(), "state" => state.name()).set(n as f64);
        }
    }
    let bound = &view.config.health;
    gauge!("pgtenant_replica_lag_bound_seconds").set(bound.max_replica_lag_ms as f64 / 1000.0);
    gauge!("pgtenant_replica_lag_bound_bytes").set(bound.max_replica_lag_bytes as f64);
    gauge!("pgtenant_pool_use_warning_ratio").set(POOL_USE_WARNING);
    gauge!("pgtenant_pool_use_critical_ratio").set(POOL_USE_CRITICAL);
    let topology = view.router.topology();
    for id in topology.shard_ids() {
        let Some(shard) = topology.shard(id) else { continue };
        let has_primary = matches!(view.health.primary_of(shard), PrimaryChoice::Node(_));
        gauge!("pgtenant_shard_has_primary", "shard" => id.to_string()).set(f64::from(u8::from(has_primary)));
        for node in &shard.nodes {
            let labels = [("shard", id.to_string()), ("node", format!("{}:{}", node.host, node.port))];
            let (up, primary) = match view.health.state(&NodeKey::of(id, node)) {
                NodeState::Up { role, .. } => (1.0, f64::from(u8::from(role == ObservedRole::Primary))),
                _ => (0.0, 0.0),
            };
            gauge!("pgtenant_node_up", &labels).set(up);
            gauge!("pgtenant_node_is_primary", &labels).set(primary);
            if let Some((bytes, ms)) = view.health.lag_of(shard, node) {
                gauge!("pgtenant_replica_lag_bytes", &labels).set(bytes as f64);
                gauge!("pgtenant_replica_lag_seconds", &labels).set(ms as f64 / 1000.0);
            }
        }
    }
    gauge!("pgtenant_held_requests").set(view.health.held_requests() as f64);
    gauge!("pgtenant_routing_version").set(view.router.routing_version() as f64);
    let status = view.router.directory_status();
    counter!("pgtenant_directory_cache_hits_total").absolute(status.cache_hits);
    counter!("pgtenant_directory_cache_misses_total").absolute(status.cache_misses);
    if let Some(ms) = status.change_lag_ms {
        gauge!("pgtenant_catalog_change_lag_seconds").set(ms as f64 / 1000.0);
    }
    if let Some(listening) = status.listening {
        gauge!("pgtenant_catalog_listening").set(f64::from(u8::from(listening)));
    }
    gauge!("pgtenant_ready").set(f64::from(u8::from(super::not_ready(view).is_empty())));
    let (hits, misses) = view.router.parse_cache_hits_and_misses();
    counter!("pgtenant_parse_cache_hits_total").absolute(hits);
    counter!("pgtenant_parse_cache_misses_total").absolute(misses);
    counter!("pgtenant_snowflake_ids_minted_total").absolute(view.minter.minted());
    for (source, n) in view.router.routes_by_source() {
        counter!("pgtenant_routes_total", "source" => source).absolute(n);
    }
    for (raiser, class, n) in crate::observe::errors::snapshot() {
        counter!("pgtenant_errors_total", "raised_by" => raiser.name(), "class" => class).absolute(n);
    }
    for m in view.moves.map(|moves| moves.driven()).unwrap_or_default() {
        let labels = [
            ("move_id", m.id.to_string()),
            ("tenant", m.tenant.to_string()),
            ("source", m.source.to_string()),
            ("target", m.target.to_string()),
        ];
        gauge!("pgtenant_move_phase", &labels).set(f64::from(m.phase.code()));
        gauge!("pgtenant_move_rows_copied", &labels).set(m.rows_copied as f64);
        gauge!("pgtenant_move_bytes_copied", &labels).set(m.bytes_copied as f64);
        gauge!("pgtenant_move_cutover_attempts", &labels).set(f64::from(m.attempts));
        if let Some(ms) = m.lag_ms {
            gauge!("pgtenant_move_lag_seconds", &labels).set(ms as f64 / 1000.0);
        }
        if let Some(ms) = m.pause_ms {
            gauge!("pgtenant_move_pause_seconds", &labels).set(ms as f64 / 1000.0);
        }
    }
    for slice in view.pools.caps().slices() {
        for (state, n) in [("size", slice.size), ("held", slice.held), ("waiting", slice.waiting)] {
            let labels = [
                ("shard", slice.shard.to_string()),
                ("role", slice.role.clone()),
                ("state", state.to_string()),
            ];
            gauge!("pgtenant_connection_slice", &labels).set(n as f64);
        }
    }
    for b in view.moves.map(|moves| moves.batches_driven()).unwrap_or_default() {
        record_batch(&b);
    }
    let scatter = crate::observe::scatter::snapshot();
    for (outcome, n) in scatter.outcomes {
        counter!("pgtenant_scatter_statements_total", "outcome" => outcome.name()).absolute(n);
    }
    for (shard, parts, _) in scatter.shards {
        counter!("pgtenant_scatter_shard_parts_total", "shard" => shard.to_string()).absolute(parts);
    }
}

/// One fleet batch's series, labelled with its id and command.
fn record_batch(b: &crate::tenancy::fleet::BatchRow) {
    let labels = [("batch", b.id.to_string()), ("command", b.command.clone())];
    let state = match b.state.as_str() {
        "running" => 1.0,
        "paused" => 2.0,
        "done" => 3.0,
        _ => 4.0,
    };
    gauge!("pgtenant_fleet_batch_state", &labels).set(state);
    for (outcome, n) in [("planned", b.steps), ("done", b.done), ("failed", b.failed)] {
        let labels = [("batch", b.id.to_string()), ("outcome", outcome.to_string())];
        gauge!("pgtenant_fleet_batch_moves", &labels).set(n as f64);
    }
    let labels = [("batch", b.id.to_string())];
    gauge!("pgtenant_fleet_batch_rows_copied", &labels).set(b.rows_copied as f64);
    gauge!("pgtenant_fleet_batch_bytes_copied", &labels).set(b.bytes_copied as f64);
    gauge!("pgtenant_fleet_batch_seconds", &labels).set(b.seconds);
    if let Some(ms) = b.longest_pause_ms {
        gauge!("pgtenant_fleet_batch_longest_pause_seconds", &labels).set(ms as f64 / 1000.0);
    }
    if let Some(bytes) = b.bandwidth {
        gauge!("pgtenant_fleet_batch_bandwidth_bytes", &labels).set(bytes as f64);
    }
}

/// The time counters, in seconds (Prometheus' base unit) and so fractional, which the
/// recorder's integer counters cannot hold: written here, HELP and TYPE included.
fn seconds_counters(out: &mut String, pools: &[PoolView]) {
    let per_pool = |f: fn(&StatsSnapshot) -> u64| -> Vec<(String, u64)> {
        pools.iter().map(|p| (pool_labels(p), f(&p.stats))).collect()
    };
    seconds_counter(
        out,
        "pgtenant_query_time_seconds_total",
        "Time servers spent on requests (to their ReadyForQuery), per pool.",
        &per_pool(|s| s.query_us),
    );
    seconds_counter(
        out,
        "pgtenant_transaction_time_seconds_total",
        "Time from a transaction's first request to its end, per pool.",
        &per_pool(|s| s.xact_us),
    );
    let scatter = crate::observe::scatter::snapshot();
    seconds_counter(
        out,
        "pgtenant_scatter_time_seconds_total",
        "Time scatter-gather statements took, from planning to their last row.",
        &[(String::new(), scatter.total_us)],
    );
    let shards: Vec<(String, u64)> =
        scatter.shards.iter().map(|(shard, _, us)| (format!("shard=\"{shard}\""), *us)).collect();
    seconds_counter(
        out,
        "pgtenant_scatter_shard_time_seconds_total",
        "Time a shard took to send its scatter-gather parts.",
        &shards,
    );
}

/// The per-tenant statistics' kept tenants (`[observe] tenant_stats_top_k` per shard at
/// most: the label set is bounded whatever the number of tenants). A tenant that loses
/// its slot leaves the series; one that takes a slot starts from its inherited count.
fn tenant_counters(out: &mut String, view: &AdminView<'_>) {
    let rows = view.tenant_stats.rows(None, crate::backend::coarse_clock::coarse_ms());
    let labels = |r: &crate::observe::tenants::TenantRow<crate::directory::TenantId>| {
        format!("shard=\"{}\",tenant=\"{}\"", r.shard, escape(&r.tenant.to_string()))
    };
    let series = |f: fn(&crate::observe::tenants::Figures) -> u64| -> Vec<(String, u64)> {
        rows.iter().map(|r| (labels(r), f(&r.total))).collect()
    };
    let counts = [
        (
            "pgtenant_tenant_transactions_total",
            "Transactions of the heaviest tenants of each shard (the top tenant_stats_top_k); up to pgtenant_tenant_transactions_error of them may be other tenants'.",
            series(|f| f.transactions),
        ),
        (
            "pgtenant_tenant_requests_total",
            "Requests of the heaviest tenants of each shard.",
            series(|f| f.requests),
        ),
        (
            "pgtenant_tenant_errors_total",
            "Requests of the heaviest tenants that failed.",
            series(|f| f.errors),
        ),
        (
            "pgtenant_tenant_sent_bytes_total",
            "Bytes servers sent the heaviest tenants.",
            series(|f| f.bytes_out),
        ),
        (
            "pgtenant_tenant_waits_total",
            "Checkouts of the heaviest tenants that waited for a place in a full pool.",
            series(|f| f.waits),
        ),
    ];
    for (name, help, series) in counts {
        family(out, name, help, "counter", &series);
    }
    let errors: Vec<(String, u64)> = rows.iter().map(|r| (labels(r), r.error)).collect();
    family(
        out,
        "pgtenant_tenant_transactions_error",
        "The bound of pgtenant_tenant_transactions_total's error: transactions counted to the tenant that may be others'.",
        "gauge",
        &errors,
    );
    seconds_counter(
        out,
        "pgtenant_tenant_server_time_seconds_total",
        "Time servers spent on the heaviest tenants' requests.",
        &series(|f| f.server_us),
    );
}

/// A family of hand-written series: its HELP and TYPE, then each series (labels, value).
fn family<V: std::fmt::Display>(
    out: &mut String,
    name: &str,
    help: &str,
    kind: &str,
    series: &[(String, V)],
) {
    if series.is_empty() {
        return;
    }
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in series {
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {value}");
        } else {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    }
}

/// A counter family of microsecond sums, exported in seconds.
fn seconds_counter(out: &mut String, name: &str, help: &str, series: &[(String, u64)]) {
    let seconds: Vec<(String, f64)> =
        series.iter().map(|(labels, us)| (labels.clone(), *us as f64 / 1e6)).collect();
    family(out, name, help, "counter", &seconds);
}

/// A pool's labels as the hand-written families print them.
fn pool_labels(pool: &PoolView) -> String {
    format!(
        "shard=\"{}\",node=\"{}:{}\",database=\"{}\",user=\"{}\"",
        pool.shard,
        pool.host,
        pool.port,
        escape(&pool.database),
        escape(&pool.user)
    )
}

/// A histogram per pool from its fixed buckets (`bucket_counts_and_sum` of its stats).
fn histogram(
    out: &mut String,
    name: &str,
    help: &str,
    pools: &[PoolView],
    bucket_counts_and_sum: impl Fn(&StatsSnapshot) -> ([u64; WAIT_BUCKETS_US.len() + 1], u64),
) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    for pool in pools {
        let labels = pool_labels(pool);
        let (buckets, sum_us) = bucket_counts_and_sum(&pool.stats);
        let mut cumulative = 0;
        for (i, bound) in WAIT_BUCKETS_US.iter().enumerate() {
            cumulative += buckets[i];
            let le = *bound as f64 / 1e6;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        cumulative += buckets[WAIT_BUCKETS_US.len()];
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", sum_us as f64 / 1e6);
        let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
    }
}

fn escape(label: &str) -> String {
    label.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
