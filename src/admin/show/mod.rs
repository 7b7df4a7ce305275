//! The console's views, built from snapshots the layers expose (pools, connections,
//! health, directory), never from their internals. Where PgBouncer has the same
//! command, the columns keep its names, order and meaning, so that its exporters and
//! dashboards read them; pgtenant's own columns come after PgBouncer's. PgBouncer's
//! views are in `pgbouncer`, pgtenant's own (shards, nodes, tenants) in `fleet`.

mod fleet;
mod pgbouncer;
pub mod tenants;

use std::collections::HashMap;

use super::AdminView;
use super::command::Show;
use super::table::Table;
use crate::config::PoolMode;
use fleet::*;
use pgbouncer::*;
pub use pgbouncer::{totals_by_database, version_text};

/// The seed's pool-use thresholds (`seeds/003_…`): warning above 70 %, critical above 90 %.
pub const POOL_USE_WARNING: f64 = 0.7;

pub const POOL_USE_CRITICAL: f64 = 0.9;

pub async fn show(view: &AdminView<'_>, what: &Show) -> Table {
    match what {
        Show::Pools => pools(view),
        Show::Clients => connections(view, &view.clients.rows(), "C"),
        Show::Servers => connections(view, &view.pools.servers.rows(), "S"),
        Show::Stats => stats(view, StatsColumns::Both),
        Show::StatsTotals => stats(view, StatsColumns::Totals),
        Show::StatsAverages => stats(view, StatsColumns::Averages),
        Show::Databases => databases(view),
        Show::Config => config(view),
        Show::Version => version(),
        Show::Lists => lists(view),
        Show::Users => users(view),
        Show::Shards => shards(view),
        Show::Nodes => nodes(view),
        Show::Tenant(id) => tenant(view, id).await,
        Show::Tenants { shard, order_by, limit } => tenants::table(view, *shard, order_by.as_deref(), *limit),
        Show::Routing => routing(view),
        Show::Lanes => lanes(view),
        Show::Pauses => pauses(view),
        // Answered by the console, which reads the catalog and may fail: the shape only.
        Show::Moves => crate::admin::moves::table(),
        Show::Help => help(),
        Show::Totals => totals(view),
        Show::State => state(view),
    }
}

pub(super) fn pool_mode_name(mode: PoolMode) -> &'static str {
    match mode {
        PoolMode::Transaction => "transaction",
        PoolMode::Session => "session",
    }
}

/// The console's own "pool", as PgBouncer lists its admin database among the others.
pub(super) const CONSOLE_MODE: &str = "statement";

/// Client counts per state, for the metrics.
pub fn clients_by_state(view: &AdminView<'_>) -> HashMap<&'static str, u64> {
    let mut counts = HashMap::from([("active", 0), ("idle", 0), ("waiting", 0), ("paused", 0), ("held", 0)]);
    for c in view.clients.rows() {
        *counts.entry(c.state.name()).or_default() += 1;
    }
    counts
}
