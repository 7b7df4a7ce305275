//! Online tenant moves (seeds 001 and 003): one tenant's rows go from its shard to
//! another while the tenant keeps working, and its routing flips once.
//!
//! - `catalog`: the move's row, the only state (every proxy sees it; any resumes it).
//! - `shard`: preflight, row-filtered logical replication, markers, cleanup.
//! - `driver`: the state machine one proxy runs per move (copy, catch up, cutover,
//!   cleanup, rollback).
//! - `agent`: every proxy's part: its heartbeat, the tenant pauses it is asked for and
//!   acknowledges, taking over moves and fleet batches whose driver is gone, and
//!   answering a fleet plan's request for this proxy's per-tenant counts.
//!
//! The service below ties them to the proxy: the console starts moves and asks for
//! cleanups and rollbacks through it.

mod agent;
mod catalog;
mod driver;
mod error;
mod shard;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use agent::CHANNEL;
pub use catalog::{MoveRow, Phase, Request};
pub use error::MoveError;
pub use shard::{TenantRows, quote_ident, tenant_size};

use crate::config::{CatalogConfig, Config, NodeConfig};
use crate::directory::{ShardId, TenantId};
use crate::observe::conns::ConnRegistry;
use crate::tenancy::PauseBoard;
use crate::tenancy::fleet::row::BatchRow;

/// Fleet batches whose figures `/metrics` shows (the newest ones this proxy drove).
const BATCHES_KEPT: usize = 8;

/// What a move needs of the rest of the proxy.
pub struct MoveHooks {
    /// A shard's primary now (after failovers too).
    pub primary_of: Box<dyn Fn(ShardId) -> Option<NodeConfig> + Send + Sync>,
    /// Forgets a tenant's cached placement (the catalog has a new one).
    pub forget_tenant: Box<dyn Fn(&TenantId) + Send + Sync>,
    pub pauses: Arc<PauseBoard>,
    pub clients: Arc<ConnRegistry>,
    /// The catalog connection the agent LISTENs on, shared with the routing watcher.
    pub catalog_link: Arc<crate::directory::CatalogLink>,
    /// The pools' caps: the agent sizes this proxy's slices of the fleet's budgets.
    pub server_caps: Arc<crate::backend::ServerCaps>,
    /// The transactions pgtenant counted for each tenant it keeps figures of, a row per
    /// shard it was counted on (what fleet plans weigh tenants by).
    pub tenant_loads: Box<dyn Fn() -> Vec<(i64, u64)> + Send + Sync>,
}

/// A pause this proxy holds for a move.
struct Held {
    tenant: TenantId,
    epoch: i32,
    since: Instant,
}

pub struct MoveService {
    config: Arc<Config>,
    catalog: CatalogConfig,
    /// This proxy, as the catalog knows it (`proxy_instance`).
    pub proxy_id: String,
    hooks: MoveHooks,
    /// The moves this proxy drives.
    driving: Mutex<HashSet<i64>>,
    held: Mutex<HashMap<i64, Held>>,
    /// The last row each move driven here had, for the metrics (ended ones too: their
    /// final phase; a handful per process).
    seen: Mutex<HashMap<i64, MoveRow>>,
    stopping: AtomicBool,
    /// Fleet batches the agent took over from a driver that is gone, for
    /// `tenancy::fleet::watch` to drive; told through `batches_orphaned`.
    pub(in crate::tenancy) orphaned_batches: Mutex<Vec<i64>>,
    /// The fleet batches this proxy drives or drove, as its driver last read them, for
    /// the metrics (the newest `BATCHES_KEPT`).
    batches_seen: Mutex<std::collections::BTreeMap<i64, BatchRow>>,
    pub(in crate::tenancy) batches_orphaned: tokio::sync::Notify,
}

impl MoveService {
    /// The service of a proxy with a catalog (moves need one).
    pub fn new(config: Arc<Config>, listen: std::net::SocketAddr, hooks: MoveHooks) -> Option<Arc<Self>> {
        let catalog = config.catalog.clone()?;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into());
        let proxy_id =
            format!("{host}:{} pid {} #{:04x}", listen.port(), std::process::id(), rand::random::<u16>());
        Some(Arc::new(Self {
            config,
            catalog,
            proxy_id,
            hooks,
            driving: Mutex::default(),
            held: Mutex::default(),
            seen: Mutex::default(),
            stopping: AtomicBool::new(false),
            orphaned_batches: Mutex::default(),
            batches_seen: Mutex::default(),
            batches_orphaned: tokio::sync::Notify::new(),
        }))
    }

    /// Starts the agent; returns once this proxy is registered and holds the pauses
    /// in force (or after `connect_timeout`, when the catalog does not answer), so a
    /// proxy starting during a cutover serves nothing of the moving tenant first.
    pub async fn start(self: &Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        let (ready, registered) = tokio::sync::oneshot::channel();
        tokio::spawn(agent::run(self.clone(), stop, ready));
        let _ = tokio::time::timeout(self.catalog.connect_timeout(), registered).await;
    }

    pub(in crate::tenancy) fn moves_config(&self) -> &crate::config::MovesConfig {
        &self.config.moves
    }

    pub(in crate::tenancy) fn tenant_column(&self) -> &str {
        &self.config.proxy.tenant_column
    }

    pub(in crate::tenancy) async fn catalog_client(&self) -> Result<tokio_postgres::Client, MoveError> {
        let mut pg = self.catalog.pg_config();
        pg.application_name("pgtenant move");
        let (client, conn) =
            tokio::time::timeout(self.catalog.connect_timeout(), pg.connect(tokio_postgres::NoTls))
                .await
                .map_err(|_| {
                    MoveError::Catalog(format!("no connection within {:?}", self.catalog.connect_timeout()))
                })?
                .map_err(|e| MoveError::from_catalog(&e))?;
        tokio::spawn(conn);
        Ok(client)
    }

    /// Who a move logs in to the shards as.
    fn shard_login(&self) -> Result<(String, Option<String>), MoveError> {
        let moves = self.moves_config();
        if let Some(user) = &moves.user {
            return Ok((user.clone(), moves.password.clone()));
        }
        let admin = self.config.users.iter().find(|u| u.admin).ok_or(MoveError::NoLogin)?;
        Ok((admin.server_user().to_string(), admin.server_password().map(str::to_string)))
    }

    fn primary(&self, shard: u16) -> Result<NodeConfig, MoveError> {
        (self.hooks.primary_of)(shard)
            .ok_or_else(|| MoveError::Shard { shard, reason: "no primary is known now".into() })
    }

    /// A connection to `shard`'s primary, database `dbname` (unless the node fixes one).
    pub(in crate::tenancy) async fn shard_client(
        &self,
        shard: u16,
        dbname: &str,
    ) -> Result<tokio_postgres::Client, MoveError> {
        let node = self.primary(shard)?;
        let (user, password) = self.shard_login()?;
        let mut pg = tokio_postgres::Config::new();
        pg.host(&node.host)
            .port(node.port)
            .user(&user)
            .dbname(node.dbname.as_deref().unwrap_or(dbname))
            .application_name("pgtenant move")
            .connect_timeout(Duration::from_secs(5));
        if let Some(password) = &password {
            pg.password(password);
        }
        let (client, conn) = pg.connect(tokio_postgres::NoTls).await.map_err(MoveError::shard(shard))?;
        tokio::spawn(conn);
        Ok(client)
    }

    /// How the target's subscription reaches the source (libpq connection string).
    fn source_conninfo(&self, shard: u16, dbname: &str) -> Result<String, MoveError> {
        let node = self.primary(shard)?;
        let (user, password) = self.shard_login()?;
        let v = shard::conninfo_value;
        let mut conninfo = format!(
            "host={} port={} dbname={} user={} application_name={}",
            v(&node.host),
            node.port,
            v(node.dbname.as_deref().unwrap_or(dbname)),
            v(&user),
            v("pgtenant move"),
        );
        if let Some(password) = password {
            conninfo.push_str(&format!(" password={}", v(&password)));
        }
        Ok(conninfo)
    }

    /// `MOVE TENANT tenant TO SHARD target [DATABASE dbname]`: plans the move and checks
    /// it on both shards; a refusal leaves nothing behind (the move is recorded rolled
    /// back, with the reason). The driver then starts the copy in the background (its
    /// slot may wait for long transactions on the source).
    pub async fn start_move(
        self: &Arc<Self>,
        tenant: i64,
        target: u16,
        dbname: Option<String>,
    ) -> Result<MoveRow, MoveError> {
        if self.config.proxy.tenant_key != crate::config::TenantKey::Bigint {
            return Err(MoveError::Refused(
                "moves need bigint tenant keys (tenant_shard_map); this proxy's are text".into(),
            ));
        }
        let dbname = dbname
            .or_else(|| self.moves_config().database.clone())
            .ok_or(MoveError::NoDatabase { tenant, shard: target })?;
        let client = self.catalog_client().await?;
        let id = catalog::plan(&client, tenant, target, &dbname, &self.proxy_id).await?;
        let mv = catalog::load(&client, id).await?;
        tracing::info!(move_id = id, tenant, source = mv.source, target, "tenant move planned");
        let checked = async {
            let source = self.shard_client(mv.source, &dbname).await?;
            let target = self.shard_client(mv.target, &dbname).await?;
            driver::check(self, &client, &mv, &source, &target).await
        };
        if let Err(e) = checked.await {
            tracing::warn!(move_id = id, tenant, error = %e, "tenant move refused");
            let _ = driver::undo_copy(self, &mv).await;
            let _ = catalog::rolled_back(&client, &mv, &self.proxy_id, Some(&e.to_string())).await;
            return Err(e);
        }
        tokio::spawn(driver::drive(self.clone(), id));
        catalog::load(&client, id).await
    }

    /// Move `id`'s row, read on `client` (a catalog connection the caller keeps).
    pub(in crate::tenancy) async fn move_row_on(
        client: &tokio_postgres::Client,
        id: i64,
    ) -> Result<MoveRow, MoveError> {
        catalog::load(client, id).await
    }

    /// Every move, read on `client`.
    pub(in crate::tenancy) async fn moves_on(
        client: &tokio_postgres::Client,
    ) -> Result<Vec<MoveRow>, MoveError> {
        catalog::list(client).await
    }

    /// A cleanup or rollback request, made on `client`.
    pub(in crate::tenancy) async fn request_on(
        client: &tokio_postgres::Client,
        id: i64,
        request: Request,
    ) -> Result<MoveRow, MoveError> {
        catalog::request(client, id, request).await
    }

    /// The load pgtenant counted for each tenant it keeps figures of, over every shard
    /// it was counted on (a tenant moved takes its load along).
    pub(in crate::tenancy) fn tenant_loads(&self) -> std::collections::HashMap<i64, u64> {
        let mut loads = std::collections::HashMap::new();
        for (tenant, n) in (self.hooks.tenant_loads)() {
            *loads.entry(tenant).or_insert(0) += n;
        }
        loads
    }

    /// Every move the catalog knows.
    pub async fn list(&self) -> Result<Vec<MoveRow>, MoveError> {
        catalog::list(&self.catalog_client().await?).await
    }

    /// Asks a move's driver for a cleanup or a rollback; the row then.
    pub async fn request(&self, id: i64, request: Request) -> Result<MoveRow, MoveError> {
        catalog::request(&self.catalog_client().await?, id, request).await
    }

    /// The moves this proxy drives or drove, as last seen (for `/metrics`).
    pub fn driven(&self) -> Vec<MoveRow> {
        let mut rows: Vec<MoveRow> = lock(&self.seen).values().cloned().collect();
        rows.sort_by_key(|m| m.id);
        rows
    }

    /// The fleet batches this proxy drives or drove, as last seen (for `/metrics`).
    pub fn batches_driven(&self) -> Vec<BatchRow> {
        lock(&self.batches_seen).values().cloned().collect()
    }

    /// A batch as its driver here just read it.
    pub(in crate::tenancy) fn saw_batch(&self, batch: &BatchRow) {
        let mut seen = lock(&self.batches_seen);
        seen.insert(batch.id, batch.clone());
        while seen.len() > BATCHES_KEPT {
            seen.pop_first();
        }
    }

    pub(in crate::tenancy) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }
}

pub(in crate::tenancy) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
