//! Builds the shared state from a validated `Config`, binds the listener, and runs
//! the proxy until its shutdown signal.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backend::{Pools, ServerTls};
use crate::config::{self, Config};
use crate::directory::{CatalogDirectory, CatalogError, Directory, StaticDirectory};
use crate::frontend::{self, Shared};
use crate::net::client_threads::ClientThreads;
use crate::router::Router;
use crate::snowflake::{self, lease::LeaseKeeper};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{} problem(s) in the configuration:\n  - {}", .0.len(), .0.join("\n  - "))]
    Invalid(Vec<String>),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error("cannot start the client threads: {0}")]
    Threads(std::io::Error),
}

/// A proxy serving in the background.
pub struct RunningProxy {
    pub addr: SocketAddr,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (`[observe] listen`).
    pub http_addr: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
    shared: std::sync::Weak<Shared>,
}

impl RunningProxy {
    /// Stops accepting, lets busy sessions finish (up to the drain time) and waits.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
    }

    /// Waits until the proxy stops by itself (it does not, unless shut down).
    pub async fn wait(self) {
        let _ = self.task.await;
    }

    /// Serves until SIGINT or SIGTERM, then shuts down (draining busy sessions).
    pub async fn serve_until_signal(self) {
        let stop = self.shutdown.clone();
        tokio::spawn(async move {
            termination_signal().await;
            tracing::info!(
                "shutting down: running transactions may finish (shutdown_timeout_ms); a second signal exits at once"
            );
            let _ = stop.send(true);
            termination_signal().await;
            tracing::warn!("second signal: exiting at once");
            std::process::exit(0);
        });
        let shared = self.shared.clone();
        tokio::spawn(reload_on_sighup(shared));
        self.wait().await;
    }

    /// Reads the configuration file again, as RELOAD and SIGHUP do.
    pub fn reload(&self) -> Result<(), Vec<String>> {
        match self.shared.upgrade() {
            Some(shared) => shared.reload(),
            None => Err(vec!["the proxy has stopped".into()]),
        }
    }
}

/// Validates `config`, binds its listen address and starts serving.
pub async fn start(config: Config) -> Result<RunningProxy, StartError> {
    start_with_file(config, None).await
}

/// As `start`, for a configuration read from `file`, which RELOAD and SIGHUP read again.
pub async fn start_with_file(
    config: Config,
    file: Option<std::path::PathBuf>,
) -> Result<RunningProxy, StartError> {
    let problems = config::validate(&config);
    if !problems.is_empty() {
        return Err(StartError::Invalid(problems));
    }
    let config = Arc::new(config);
    let tls = match &config.tls {
        Some(t) => Some(frontend::client_tls(&t.cert, &t.key).map_err(StartError::Tls)?),
        None => None,
    };
    let server_tls = ServerTls::from_config(&config.server_tls).map_err(StartError::Tls)?;
    // The catalog connection the routing watcher and the moves' agent share.
    let mut catalog_link = None;
    let directory: Arc<dyn Directory> = match &config.catalog {
        Some(catalog) => {
            let directory = CatalogDirectory::connect(catalog, config.proxy.tenant_key).await?;
            catalog_link = Some(directory.link());
            Arc::new(directory)
        }
        None => Arc::new(StaticDirectory::from_config(&config).map_err(|e| StartError::Invalid(vec![e]))?),
    };
    let pools = Pools::new(config.clone(), server_tls, directory.clone());
    let clients = match config.proxy.thread_per_core {
        true => Some(
            ClientThreads::start(crate::config::resolve_workers(config.proxy.workers))
                .map_err(StartError::Threads)?,
        ),
        false => None,
    };
    let router = Router::new(&config, directory);
    let bind_error = |source| StartError::Bind { addr: config.proxy.listen, source };
    let listener = bind_tcp(config.proxy.listen, config.proxy.reuse_port).map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    let (unix, unix_path) = match &config.proxy.unix_socket_dir {
        Some(dir) => {
            let path = dir.join(format!(".s.PGSQL.{}", addr.port()));
            let unix = bind_unix(&path).await.map_err(bind_error)?;
            (Some(unix), Some(path))
        }
        None => (None, None),
    };
    let listener = frontend::Listeners { tcp: listener, unix, unix_path };
    let (shutdown, rx) = watch::channel(false);
    let minter = snowflake::minter_for(&config);
    // The lease outlives the sessions: it is given back once the last one has ended.
    let (lease_stop, lease_rx) = watch::channel(false);
    let lease = match &config.catalog {
        Some(catalog) => {
            let holder = format!("{addr} pid {} #{:08x}", std::process::id(), rand::random::<u32>());
            Some(LeaseKeeper::new(catalog, &config.snowflake, holder, minter.clone()).start(lease_rx).await)
        }
        None => None,
    };
    let shared = Arc::new(Shared::new(config.clone(), router, pools, tls, minter));
    let _ = shared.local_addr.set(addr);
    let _ = shared.stop.set(shutdown.clone());
    if let Some(file) = file {
        let _ = shared.config_path.set(file);
    }
    tokio::spawn(sample_stats(Arc::downgrade(&shared)));
    if let Some(moves) = catalog_link.and_then(|link| move_service(&shared, addr, link)) {
        moves.start(rx.clone()).await;
        tokio::spawn(crate::tenancy::fleet::watch(moves.clone(), rx.clone()));
        let _ = shared.moves.set(moves);
    }
    let http = match config.observe.listen {
        Some(listen) => Some(serve_http(listen, &shared, rx.clone()).await?),
        None => None,
    };
    let (for_topology, for_down) = (Arc::downgrade(&shared), Arc::downgrade(&shared));
    crate::backend::health::spawn(
        shared.health.clone(),
        &config,
        move || for_topology.upgrade().map(|s| s.router.topology()),
        move |node| {
            if let Some(shared) = for_down.upgrade() {
                shared.pools.close_idle_of_node(&node.host, node.port);
            }
        },
    );
    if config.health.auto_promote {
        let for_promoter = Arc::downgrade(&shared);
        crate::backend::health::spawn_promoter(shared.health.clone(), &config, move || {
            for_promoter.upgrade().map(|s| s.router.topology())
        });
    }
    let expiries = config.proxy.server_idle_timeout().into_iter().chain(config.proxy.server_lifetime());
    // min_pool_size is kept on the same rounds, every second. The rounds also move the
    // coarse clock and the wall clock's offset on (`backend::coarse_clock::advance`), so
    // they run without any expiry too, and a few times per window of the per-tenant
    // statistics: a clock that jumped by more than a window made every window look
    // skipped, and the recent figures stayed empty.
    let warm = (config.proxy.min_pool_size > 0).then_some(Duration::from_secs(4));
    let window = Duration::from_millis(config.observe.tenant_stats_window_ms);
    let shortest = expiries.chain(warm).chain([window]).min().unwrap_or(Duration::from_secs(4));
    tokio::spawn(close_expired_server_connections(Arc::downgrade(&shared), shortest));
    let shared_weak = Arc::downgrade(&shared);
    let drain = Duration::from_millis(config.proxy.shutdown_timeout_ms);
    let listening = tokio::spawn(frontend::run_listener(listener, shared, clients, rx, drain));
    let http_addr = http.as_ref().map(|(addr, _)| *addr);
    let task = tokio::spawn(async move {
        let _ = listening.await;
        if let Some((_, server)) = http {
            server.abort();
        }
        let _ = lease_stop.send(true);
        if let Some(lease) = lease {
            let _ = lease.await;
        }
    });
    tracing::info!(%addr, "pgtenant is serving");
    Ok(RunningProxy { addr, http_addr, shutdown, task, shared: shared_weak })
}

/// Tenant moves, when the proxy has a catalog: they reach the shards' primaries through
/// the health view, and the sessions through the pause board and the router.
fn move_service(
    shared: &Arc<Shared>,
    addr: SocketAddr,
    link: Arc<crate::directory::CatalogLink>,
) -> Option<Arc<crate::tenancy::moves::MoveService>> {
    use crate::backend::health::PrimaryChoice;
    let (for_primary, for_forget, for_loads) =
        (Arc::downgrade(shared), Arc::downgrade(shared), Arc::downgrade(shared));
    let hooks = crate::tenancy::moves::MoveHooks {
        primary_of: Box::new(move |id| {
            let shared = for_primary.upgrade()?;
            let topology = shared.router.topology();
            match shared.health.primary_of(topology.shard(id)?) {
                PrimaryChoice::Node(node) => Some(node),
                PrimaryChoice::Holding(_) => None,
            }
        }),
        forget_tenant: Box::new(move |tenant| {
            if let Some(shared) = for_forget.upgrade() {
                shared.router.forget_tenant(tenant);
            }
        }),
        pauses: shared.pauses.clone(),
        clients: shared.clients.clone(),
        catalog_link: link,
        server_caps: shared.pools.caps(),
        tenant_loads: Box::new(move || {
            let Some(shared) = for_loads.upgrade() else { return Vec::new() };
            let rows = shared.tenant_stats.rows(None, crate::backend::coarse_clock::coarse_ms());
            rows.into_iter()
                .filter_map(|r| match r.tenant {
                    crate::directory::TenantId::Int(t) => Some((t, r.total.transactions)),
                    crate::directory::TenantId::Text(_) => None,
                })
                .collect()
        }),
    };
    crate::tenancy::moves::MoveService::new(shared.config.clone(), addr, hooks)
}

/// The listen socket: SO_REUSEADDR (a restart need not wait for TIME_WAIT), and
/// SO_REUSEPORT when asked (a new process may bind it while this one drains).
fn bind_tcp(addr: SocketAddr, reuse_port: bool) -> std::io::Result<TcpListener> {
    let socket =
        if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    if reuse_port {
        socket.set_reuseport(true)?;
    }
    socket.bind(addr)?;
    socket.listen(1024)
}

/// The Unix socket at `path`: a file left by a process that is gone is replaced; one
/// that still answers is another server's, and refused.
async fn bind_unix(path: &std::path::Path) -> std::io::Result<tokio::net::UnixListener> {
    if path.exists() {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("{} is in use by another server", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let listener = tokio::net::UnixListener::bind(path)?;
    // As PostgreSQL's default unix_socket_permissions: who may connect is the
    // password's (or the directory's) business.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777))?;
    Ok(listener)
}

/// SIGHUP reads the configuration file again (as the console's RELOAD); a refused
/// file is logged with every problem and the running configuration kept.
async fn reload_on_sighup(shared: std::sync::Weak<Shared>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else { return };
        while hangups.recv().await.is_some() {
            let Some(shared) = shared.upgrade() else { return };
            if let Err(problems) = shared.reload() {
                tracing::error!(problems = %problems.join("; "), "SIGHUP: configuration not reloaded; the running one is kept");
            }
        }
    }
    #[cfg(not(unix))]
    let _ = shared;
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listen`; not ready once draining.
async fn serve_http(
    listen: SocketAddr,
    shared: &Arc<Shared>,
    draining: watch::Receiver<bool>,
) -> Result<(SocketAddr, JoinHandle<()>), StartError> {
    let (for_metrics, for_ready) = (Arc::downgrade(shared), Arc::downgrade(shared));
    let endpoints = crate::observe::http::Endpoints {
        metrics: Box::new(move || {
            for_metrics.upgrade().map(|s| s.exposition.render(&s.admin_view())).unwrap_or_default()
        }),
        ready: Box::new(move || {
            let Some(shared) = for_ready.upgrade() else { return Err(vec!["stopped".into()]) };
            let mut reasons = crate::admin::not_ready(&shared.admin_view());
            if *draining.borrow() {
                reasons.insert(0, "draining: shutting down".into());
            }
            if reasons.is_empty() { Ok(()) } else { Err(reasons) }
        }),
    };
    crate::observe::http::serve(listen, endpoints)
        .await
        .map_err(|source| StartError::Bind { addr: listen, source })
}

/// Samples the totals per database for the console's averages, while the proxy lives.
async fn sample_stats(shared: std::sync::Weak<Shared>) {
    let mut every = tokio::time::interval(crate::admin::SAMPLE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(shared) = shared.upgrade() else { return };
        let totals = crate::admin::totals_by_database(&shared.admin_view()).into_iter().collect();
        shared.stats_history.sample(totals);
    }
}

/// Closes idle server connections past `server_idle_timeout_ms` or `server_lifetime_ms`,
/// and opens those `min_pool_size` asks for, for as long as the proxy's sessions and
/// listener hold `shared`, looking a few times per the `shortest` of those periods and
/// the per-tenant statistics' window, at least once a second. Each round also moves
/// the coarse clock on (`Pools::close_expired`), which is why it runs with every expiry
/// off too; the clock lags by at most one round.
async fn close_expired_server_connections(shared: std::sync::Weak<Shared>, shortest: Duration) {
    let period = (shortest / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut every = tokio::time::interval(period);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(shared) = shared.upgrade() else { return };
        shared.pools.close_expired();
        let topology = shared.router.topology();
        shared.pools.keep_warm(|shard| topology.shard(shard).map(|s| s.nodes.clone()).unwrap_or_default());
    }
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM.
pub async fn termination_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
