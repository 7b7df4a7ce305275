//! The operators' side of the proxy: the admin console (a virtual database for admin
//! users, PgBouncer's SHOW commands and pgtenant's own), the Prometheus exposition and
//! readiness. Everything here reads snapshots the layers below expose (`AdminView`);
//! nothing reaches into a session.

mod averages;
mod command;
mod console;
pub mod exposition;
mod fleet;
mod fleet_request;
mod moves;
pub mod scatter;
mod show;
mod table;

use std::net::SocketAddr;

pub use averages::{SAMPLE_EVERY, StatsHistory};
pub use console::serve_console;
pub use show::{totals_by_database, version_text};

use crate::backend::Pools;
use crate::backend::health::{HealthView, NodeKey, NodeState, PrimaryChoice};
use crate::config::Config;
use crate::observe::conns::ConnRegistry;
use crate::observe::stats::PoolStats;
use crate::router::Router;
use crate::tenancy::PauseBoard;

/// The console's database name; `pgbouncer` is accepted too, so that tools written
/// for PgBouncer find it where they look.
pub const CONSOLE_DATABASE: &str = "pgtenant";
const CONSOLE_ALIASES: [&str; 2] = [CONSOLE_DATABASE, "pgbouncer"];

pub fn is_console(database: &str) -> bool {
    CONSOLE_ALIASES.contains(&database)
}

/// Reads the configuration file again (RELOAD); `Err` lists every problem, and then
/// nothing changed.
pub trait Reloader: Send + Sync {
    fn reload(&self) -> Result<(), Vec<String>>;
}

/// What the console and the metrics read.
pub struct AdminView<'a> {
    /// The configuration as last read from its file.
    pub config: std::sync::Arc<Config>,
    pub router: &'a Router,
    pub pools: &'a Pools,
    pub health: &'a HealthView,
    pub clients: &'a ConnRegistry,
    pub history: &'a StatsHistory,
    /// The console's own requests (its row in SHOW STATS).
    pub console: &'a PoolStats,
    /// The proxy's listen address.
    pub local_addr: Option<SocketAddr>,
    pub pauses: &'a PauseBoard,
    /// Online tenant moves (`None` without a catalog).
    pub moves: Option<&'a std::sync::Arc<crate::tenancy::moves::MoveService>>,
    /// Stops the proxy as SIGTERM does (SHUTDOWN), or once every client has left
    /// (SHUTDOWN WAIT_FOR_CLIENTS).
    pub stop: Option<&'a tokio::sync::watch::Sender<bool>>,
    pub wait_for_clients: &'a tokio::sync::watch::Sender<bool>,
    pub minter: &'a crate::snowflake::Minter,
    /// The heaviest tenants of each shard.
    pub tenant_stats: &'a crate::observe::tenants::TenantStats<crate::directory::TenantId>,
    pub reloader: &'a dyn Reloader,
}

/// Why the proxy should not take traffic now (empty: ready): the catalog's change
/// feed is down, or a shard has no primary it can reach.
pub fn not_ready(view: &AdminView<'_>) -> Vec<String> {
    let mut reasons = Vec::new();
    let status = view.router.directory_status();
    if status.listening == Some(false) {
        reasons.push(format!(
            "the catalog ({}) is not reachable: routing changes would be missed",
            status.source
        ));
    }
    let topology = view.router.topology();
    for id in topology.shard_ids() {
        let Some(shard) = topology.shard(id) else { continue };
        match view.health.primary_of(shard) {
            PrimaryChoice::Node(node) => {
                if view.health.state(&NodeKey::of(id, &node)) == NodeState::Down {
                    reasons.push(format!("shard {id}: its primary {}:{} is down", node.host, node.port));
                }
            }
            PrimaryChoice::Holding(reason) => reasons.push(format!("shard {id}: {}", reason.describe())),
        }
    }
    reasons
}
