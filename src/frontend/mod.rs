//! Client side: the listener, the startup phase (TLS, cancel, startup message),
//! client authentication, and the per-client `Session` loop.

pub(crate) mod auth;
mod cancel;
mod error;
mod error_response;
mod listener;
mod live;
mod login;
pub(crate) mod params;
mod reload;
mod session;
mod startup;
mod strict;
mod tls;
mod write_hooks;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

pub use auth::scram::ScramVerifier;
pub use cancel::CancelRegistry;
pub use error::FrontendError;
pub use listener::{Listeners, run_listener};
pub use tls::{ClientTls, client_tls};

use crate::backend::health::{HealthView, PrimaryChoice};
use crate::backend::{CheckoutError, Pools, StatementRegistry, TenantContext};
use crate::config::{Config, NodeConfig};
use crate::directory::{ShardId, Topology};
use crate::router::Router;
use crate::snowflake::Minter;

/// The node that takes a shard's transactions.
pub(crate) fn primary_node(topology: &Topology, shard: ShardId) -> Result<&NodeConfig, CheckoutError> {
    topology.shard(shard).and_then(|s| s.primary()).ok_or(CheckoutError::UnknownShard { shard })
}

/// The node `shard`'s work goes to now (see `backend::health`); while it has none,
/// the configured primary, for what only needs a server's parameters (a login).
pub(crate) fn primary_now(
    health: &HealthView,
    topology: &Topology,
    shard: ShardId,
) -> Result<NodeConfig, CheckoutError> {
    let s = topology.shard(shard).ok_or(CheckoutError::UnknownShard { shard })?;
    match health.primary_of(s) {
        PrimaryChoice::Node(node) => Ok(node),
        PrimaryChoice::Holding(_) => primary_node(topology, shard).cloned(),
    }
}

/// A control-plane connection to `node`'s database `dbname` with `user`'s server
/// credentials, or its `catalog_login` (no TLS), to read the shard's catalog (`strict`);
/// its queries end on the server past `query_limit` (`statement_timeout`).
async fn catalog_reader(
    node: &NodeConfig,
    user: &crate::config::UserConfig,
    dbname: &str,
    purpose: &str,
    query_limit: std::time::Duration,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut pg = tokio_postgres::Config::new();
    let (login, password) = match user.catalog_login.as_deref() {
        Some((login, password)) => (login.as_str(), password.as_deref()),
        None => (user.server_user(), user.server_password()),
    };
    pg.host(&node.host).port(node.port).user(login).dbname(dbname);
    pg.connect_timeout(std::time::Duration::from_secs(5)).application_name(purpose);
    // The server ends a query past the caller's own limit for the read (a wait for a
    // lock on the catalog included), rather than run it for nobody.
    pg.options(format!("-c statement_timeout={}", query_limit.as_millis()));
    if let Some(password) = password {
        pg.password(password);
    }
    let (client, connection) = pg.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// How server connections learn whose tenant they serve: the tenant GUC and the key
/// its value is signed with; `None` when the GUC is not set at all.
pub(crate) fn tenant_context(config: &Config) -> Option<TenantContext<'_>> {
    let proxy = &config.proxy;
    proxy
        .set_tenant_guc
        .then(|| TenantContext { guc: &proxy.tenant_parameter, key: proxy.tenant_context_key.as_deref() })
}

/// What every session shares.
pub struct Shared {
    pub config: Arc<Config>,
    pub router: Router,
    pub pools: Pools,
    /// Where each shard's work goes now (see `backend::health`).
    pub health: Arc<HealthView>,
    pub statements: StatementRegistry,
    pub cancels: Arc<CancelRegistry>,
    /// The TLS offered to new clients (a RELOAD reads its files again).
    tls: std::sync::RwLock<Option<Arc<ClientTls>>>,
    /// The session timeouts in force (a RELOAD changes them).
    pub timeouts: live::LiveTimeouts,
    /// Mints the snowflake IDs the sessions answer for.
    pub minter: Arc<Minter>,
    /// The logins in force (replaced by a RELOAD), the file they came from, and the
    /// configuration as last read from it.
    users: std::sync::RwLock<Arc<reload::Users>>,
    pub config_path: std::sync::OnceLock<std::path::PathBuf>,
    file_config: std::sync::RwLock<Arc<Config>>,
    /// The topology whose departed nodes' pools were last closed (its address).
    pruned_for: AtomicUsize,
    /// Strict isolation's view of the shards' tenant tables.
    strict: strict::StrictCatalog,
    /// Which shards run code of the user's on writes (see `write_hooks`).
    write_hooks: Arc<write_hooks::WriteHooks>,
    /// Threads that may parse long statements at once: half the cores, so
    /// that the runtime's workers keep the rest.
    pub parse_threads: tokio::sync::Semaphore,
    /// The connected clients (the admin console's SHOW CLIENTS).
    pub clients: Arc<crate::observe::conns::ConnRegistry>,
    /// Recent failed logins per name, which slow the next ones (see `auth`).
    pub failed_logins: auth::FailedLogins,
    /// Totals sampled for the console's averages, the console's own requests, and the
    /// Prometheus recorder of `/metrics`.
    pub stats_history: crate::admin::StatsHistory,
    pub console_stats: crate::observe::stats::PoolStats,
    pub exposition: crate::admin::exposition::Exposition,
    /// The heaviest tenants of each shard (see `observe::tenants`).
    pub tenant_stats: Arc<crate::observe::tenants::TenantStats<crate::directory::TenantId>>,
    /// Admin pauses of shards and tenants, checked as transactions start.
    pub pauses: Arc<crate::tenancy::PauseBoard>,
    /// Read-your-writes widened to a login (`read_your_writes = "user"`): when each
    /// login's sessions last wrote (the health view's clock), one mark per login, which
    /// each session looks up once (`login_writes`). Filled only in that mode.
    user_writes: std::sync::Mutex<std::collections::HashMap<String, Arc<std::sync::atomic::AtomicU64>>>,
    /// Online tenant moves (with a catalog; set once the proxy listens).
    pub moves: std::sync::OnceLock<Arc<crate::tenancy::moves::MoveService>>,
    /// Stops the proxy as SIGTERM does (the admin console's SHUTDOWN).
    pub stop: std::sync::OnceLock<tokio::sync::watch::Sender<bool>>,
    /// Turns true on SHUTDOWN WAIT_FOR_CLIENTS: the listener stops accepting and the
    /// proxy ends once every client has left.
    pub wait_for_clients: tokio::sync::watch::Sender<bool>,
    /// The address the listener is bound to (set once it is).
    pub local_addr: std::sync::OnceLock<std::net::SocketAddr>,
}

/// A client's line in the connection registry (SHOW CLIENTS), as it logs in.
pub(crate) fn client_info(
    user: &str,
    database: &str,
    peer: Option<std::net::SocketAddr>,
    tls: bool,
    application_name: String,
    pid: u32,
) -> crate::observe::conns::ConnInfo {
    crate::observe::conns::ConnInfo {
        user: user.to_string(),
        database: database.to_string(),
        addr: peer.map_or_else(|| "unix".into(), |p| p.ip().to_string()),
        port: peer.map_or(0, |p| p.port()),
        tls,
        application_name,
        connect_unix_ms: crate::observe::conns::unix_ms(),
        pid,
    }
}

impl Shared {
    pub fn new(
        config: Arc<Config>,
        router: Router,
        pools: Pools,
        tls: Option<ClientTls>,
        minter: Arc<Minter>,
    ) -> Self {
        let users = std::sync::RwLock::new(Arc::new(reload::Users::of(&config)));
        let file_config = std::sync::RwLock::new(config.clone());
        // Statement texts shared by clients get the parse cache's byte budget.
        let statements = StatementRegistry::new(100_000, config.proxy.parse_cache_bytes);
        let health = Arc::new(HealthView::new(config.health.fail_after, config.health.max_held_requests));
        let timeouts = live::LiveTimeouts::of(&config.proxy);
        let observe = &config.observe;
        let tenant_stats = Arc::new(crate::observe::tenants::TenantStats::new(
            observe.tenant_stats_top_k,
            observe.tenant_stats_window_ms,
        ));
        Self {
            config,
            router,
            pools,
            health,
            statements,
            cancels: Arc::new(CancelRegistry::default()),
            tls: std::sync::RwLock::new(tls.map(Arc::new)),
            timeouts,
            minter,
            users,
            config_path: Default::default(),
            file_config,
            pruned_for: AtomicUsize::new(0),
            strict: strict::StrictCatalog::default(),
            write_hooks: Arc::default(),
            parse_threads: tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)),
            ),
            clients: Arc::default(),
            failed_logins: Default::default(),
            stats_history: Default::default(),
            console_stats: Default::default(),
            exposition: Default::default(),
            local_addr: Default::default(),
            tenant_stats,
            pauses: Default::default(),
            user_writes: Default::default(),
            moves: std::sync::OnceLock::new(),
            stop: Default::default(),
            wait_for_clients: tokio::sync::watch::Sender::new(false),
        }
    }

    /// The write mark all sessions of login `user` share (`read_your_writes = "user"`).
    pub fn login_writes(&self, user: &str) -> Arc<std::sync::atomic::AtomicU64> {
        let mut marks = self.user_writes.lock().unwrap_or_else(|e| e.into_inner());
        marks.entry(user.to_string()).or_default().clone()
    }

    /// The TLS offered to a client that asks now (a RELOAD may replace it; a client
    /// keeps the one its handshake used, for its channel binding too).
    pub fn client_tls(&self) -> Option<Arc<ClientTls>> {
        self.tls.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// What the admin console, `/metrics` and `/readyz` read.
    pub fn admin_view(&self) -> crate::admin::AdminView<'_> {
        crate::admin::AdminView {
            config: self.file_config(),
            router: &self.router,
            pools: &self.pools,
            health: &self.health,
            clients: &self.clients,
            history: &self.stats_history,
            console: &self.console_stats,
            local_addr: self.local_addr.get().copied(),
            pauses: &self.pauses,
            moves: self.moves.get(),
            stop: self.stop.get(),
            wait_for_clients: &self.wait_for_clients,
            minter: &self.minter,
            tenant_stats: &self.tenant_stats,
            reloader: self,
        }
    }

    /// Closes the pools of nodes that are not in `topology`; once per topology, however
    /// many sessions notice the change.
    pub(crate) fn prune_pools(&self, topology: &Arc<Topology>) {
        let address = Arc::as_ptr(topology) as usize;
        if self.pruned_for.swap(address, Ordering::AcqRel) == address {
            return;
        }
        self.pools.retain_nodes(|shard, host, port, dbname| {
            topology.shard(shard).is_some_and(|s| {
                s.nodes.iter().any(|n| n.host == host && n.port == port && n.dbname.as_deref() == dbname)
            })
        });
    }
}
