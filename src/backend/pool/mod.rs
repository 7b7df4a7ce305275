//! One pool per (shard node, user, database): at most `pool_size` server connections.
//! Its `ShareGate` hands out the places, one per connection, shared fairly among the
//! tenants that wait (see `share`); the idle connections wait on a shelf beside it, in
//! the order they came back.
//!
//! Checkouts are tenant-aware. A server connection remembers the tenant its GUC holds
//! and the client settings it carries, and switching either costs the server a
//! statement (the tenant's about a fifth of its work for a short transaction). So a
//! checkout takes the newest idle connection that holds both already, failing that
//! one that carries its settings, then one that holds its tenant, then the newest idle
//! one (its server process is warm); a new connection is opened only when none is
//! idle. Opening connections to keep one per tenant instead was tried and lost:
//! spreading the work over more server processes cost PostgreSQL more CPU (cache
//! misses) than the saved switches. A connection the server closed while it sat idle,
//! or one that cannot be trusted, is dropped at checkout and the next one taken.
//!
//! Why not deadpool's managed pool: the checkout and return of a connection happen once
//! per transaction, and its hooks, metrics and recycle futures cost about 1,000
//! instructions per transaction there, against a few hundred for this.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::Instant;

use super::caps::{Cap, CapSlots, IdleCloser, ServerCaps, free_slots, take_slots};
use super::coarse_clock;
use super::conn::{ConnectTarget, ServerConn};
use super::error::BackendError;
use super::lane::{Lane, LaneJoin, LaneRoom};
use super::pick::{Shelf, Wanted, pick};
use super::pooled::Home;
pub use super::pooled::PooledConn;
use super::settings::Settings;
use super::share::{LimitSource, ShareGate, SharePermit};
use super::tls::ServerTls;
use crate::config::{Config, NodeConfig, UserConfig};
use crate::directory::{Directory, ShardId, TenantId, TenantLimit, TenantLimits};
use crate::observe::conns::{ConnInfo, ConnRegistry, ConnState, unix_ms};
use crate::observe::stats::{PoolStats, StatsSnapshot};
use checkout::Taken;

/// The pool of one node for one user and database; cheap to clone.
#[derive(Clone)]
pub struct ServerPool(Arc<NodePool>);

struct NodePool {
    gate: Arc<ShareGate>,
    /// The connections not checked out, oldest first. A checkout holds a place, and
    /// a connection goes on the shelf before its place is given back, so there is
    /// room for a new connection whenever the shelf is empty.
    shelf: Mutex<Shelf>,
    target: ConnectTarget,
    tls: Option<Arc<ServerTls>>,
    /// ParameterStatus values of the first connection, before any client setting.
    startup_params: OnceLock<Arc<Vec<(String, String)>>>,
    /// `Settings::version`s of client start-up settings this node has accepted; a login
    /// with others is checked by a server first, as PostgreSQL checks them at login.
    accepted_settings: Mutex<HashSet<u64>>,
    /// Pipelined lanes open on this node (see `lane`).
    lanes: Mutex<Vec<Arc<Lane>>>,
    /// Connections older than this (ms) are closed as they come back
    /// (`server_lifetime_ms`; 0: never).
    lifetime_ms: u64,
    /// Traffic of its connections and checkouts (the admin console's SHOW STATS).
    stats: Arc<PoolStats>,
    /// Where its connections are listed (SHOW SERVERS), and the shard it serves.
    servers: Arc<ConnRegistry>,
    shard: ShardId,
    /// The login and database its connections are listed under: the pool's (SHOW
    /// POOLS'), not the role and database they log in to the server as, so that the
    /// console's views join.
    login: (String, String),
    /// An admin's RECONNECT moves it on: connections that began to open in an earlier
    /// epoch close as they come back (a count, not a time: a connection opened in the
    /// same millisecond as the RECONNECT is retired too). `RETIRED` retires them all.
    epoch: std::sync::atomic::AtomicU64,
    /// Connections given back and held until a cancel sent to them is confirmed.
    being_canceled: AtomicUsize,
    /// A `min_pool_size` warm-up is opening connections.
    warming: std::sync::atomic::AtomicBool,
    /// The `max_db_connections` / `max_user_connections` it is under (see `caps`).
    caps: Vec<Arc<Cap>>,
    cap_wait: std::time::Duration,
    /// Told when a connection is shelved while caps apply: a checkout waiting for a
    /// cap's slot takes it instead.
    came_back: tokio::sync::Notify,
}

/// A pool's epoch once it was replaced or dropped: none of its connections is reused.
const RETIRED: u64 = u64::MAX;

/// How many accepted start-up settings a pool remembers; past that, a login with new
/// ones is checked by a server each time (a cost, not an error).
const MAX_ACCEPTED_SETTINGS: usize = 1024;

/// Where a pool's connections are listed, and as whose.
struct Listing {
    servers: Arc<ConnRegistry>,
    shard: ShardId,
    /// (login, database) as the client gave them.
    login: (String, String),
    caps: (Vec<Arc<Cap>>, std::time::Duration),
}

impl ServerPool {
    fn new(
        gate: Arc<ShareGate>,
        target: ConnectTarget,
        tls: Option<Arc<ServerTls>>,
        lifetime_ms: u64,
        listing: Listing,
    ) -> Self {
        let Listing { servers, shard, login, caps: (caps, cap_wait) } = listing;
        let pool = Self(Arc::new(NodePool {
            shelf: Mutex::new(Vec::with_capacity(gate.size())),
            gate,
            target,
            tls,
            startup_params: OnceLock::new(),
            accepted_settings: Mutex::new(HashSet::new()),
            lanes: Mutex::new(Vec::new()),
            lifetime_ms,
            stats: Arc::default(),
            servers,
            shard,
            login,
            epoch: std::sync::atomic::AtomicU64::new(0),
            being_canceled: AtomicUsize::new(0),
            warming: std::sync::atomic::AtomicBool::new(false),
            caps,
            cap_wait,
            came_back: tokio::sync::Notify::new(),
        }));
        for cap in &pool.0.caps {
            cap.join(Arc::downgrade(&pool.0) as std::sync::Weak<dyn IdleCloser>);
        }
        pool
    }

    pub fn is_closed(&self) -> bool {
        self.0.gate.is_closed()
    }

    /// Whether a checkout now would find a place without waiting in line (read without
    /// the gate's lock: a hint, which a checkout that comes after may find taken).
    pub fn has_free_place(&self) -> bool {
        self.0.gate.waiting() == 0 && self.0.gate.free() > 0
    }

    /// A connection to the pool's node as its login, made as the pool makes one (the
    /// SCRAM keys it keeps: no key stretching of its own) but not the pool's: not
    /// counted against its size, not listed, closed when dropped; `application_name`
    /// says what it is for on the server. It holds a slot of each cap the pool is
    /// under (`max_db_connections`, `max_user_connections`, the fleet's budget of the
    /// shard) while it lives, taken only if one is free now: else none is made
    /// (`CappedNow`). For the proxy's own short catalog reads while the pool is full.
    pub fn connect_apart(
        &self,
        application_name: &'static str,
    ) -> impl Future<Output = Result<ServerConn, BackendError>> + Send + 'static {
        let pool = self.0.clone();
        async move {
            let slots = free_slots(&pool.caps)?;
            let mut conn =
                ServerConn::connect(&pool.target, pool.tls.as_deref(), Some(application_name)).await?;
            conn.cap_slots = slots;
            Ok(conn)
        }
    }

    /// The server this pool connects to.
    pub fn host_port(&self) -> (&str, u16) {
        (&self.0.target.host, self.0.target.port)
    }

    /// The node's own parameters, as its first connection reported them at login.
    pub fn server_params(&self) -> Option<Arc<Vec<(String, String)>>> {
        self.0.startup_params.get().cloned()
    }

    /// Whether the node accepted start-up settings `settings` before (`accept_settings`).
    pub fn accepts(&self, settings: &Settings) -> bool {
        settings.list.is_empty()
            || self.0.accepted_settings.lock().unwrap_or_else(|e| e.into_inner()).contains(&settings.version)
    }

    /// Notes that the node accepted start-up settings `settings`.
    pub fn accept_settings(&self, settings: &Settings) {
        let mut accepted = self.0.accepted_settings.lock().unwrap_or_else(|e| e.into_inner());
        if accepted.len() < MAX_ACCEPTED_SETTINGS {
            accepted.insert(settings.version);
        }
    }

    /// Where a request of clients with settings `settings_version` and read-only mode
    /// `read_only` rides: the least deep open lane of theirs that has fewer than
    /// `join.depth` requests on the wire, the oldest sent less than `join.window` ago;
    /// failing that, a lane opened for it. `Queue` while a checkout waits for a
    /// connection: lanes then take no more riders, so that they drain and give their
    /// connections to the waiting checkouts in turn (a lane that busy clients keep
    /// joining would otherwise never end, and a request that may not ride one, such
    /// as an UPDATE, would wait for ever), and the request waits in line as well.
    /// One of the caller's client thread first.
    pub fn lane_with_room(&self, settings_version: u64, read_only: bool, join: LaneJoin) -> LaneRoom {
        if !self.lanes_take_riders() {
            return LaneRoom::Queue;
        }
        // With client threads, another thread's lane wakes that thread for every
        // answer: joined only when the alternative is waiting for a connection. (Lanes
        // of all threads would keep pipelines deep, but gave back what the threads
        // saved: `thread_per_core` in config/pgtenant.toml.)
        let home = crate::net::client_threads::current();
        let any_thread = self.0.gate.free() == 0;
        let lanes = self.0.lock_lanes();
        lanes
            .iter()
            .filter(|l| l.settings_version == settings_version && l.read_only == read_only)
            .filter(|l| any_thread || l.home == home)
            .filter_map(|l| l.depth_for_joining(join.window).filter(|d| *d < join.depth).map(|d| (d, l)))
            .min_by_key(|(d, l)| (l.home != home, *d))
            .map_or(LaneRoom::Open, |(_, l)| LaneRoom::Join(l.clone()))
    }

    /// Whether lanes take riders now: no checkout waits for a connection.
    pub fn lanes_take_riders(&self) -> bool {
        self.0.gate.waiting() == 0
    }

    /// Whether the caller's checkout is the only one out of this pool while others are
    /// still free: a lone request then runs on a server of its own, cheaper than a lane
    /// (no driver task, no channel), and one that comes while it runs opens a lane.
    pub fn only_checkout_with_room(&self) -> bool {
        let free = self.0.gate.free();
        free > 0 && free + 1 == self.0.gate.size()
    }

    /// Starts `lane`'s driver (after its first request was submitted) and lists it
    /// for others to join until it ends.
    pub fn start_lane(&self, lane: Arc<Lane>) {
        self.0.lock_lanes().push(lane.clone());
        let pool = self.0.clone();
        tokio::spawn(async move {
            lane.clone().drive().await;
            pool.lock_lanes().retain(|l| !Arc::ptr_eq(l, &lane));
        });
    }

    /// Closes the pool: waiting checkouts fail, idle connections close now, busy ones
    /// when they come back.
    fn close(&self) {
        self.0.gate.close();
        self.close_idle();
    }

    fn close_idle(&self) {
        self.0.close_idle();
    }

    /// Replaced or dropped (a RELOAD): none of its connections is reused; idle ones
    /// close now, busy ones when they come back.
    fn retire_all(&self) {
        self.0.epoch.store(RETIRED, std::sync::atomic::Ordering::Release);
        self.0.mark_close_needed();
        self.close_idle();
    }

    /// RECONNECT: the connections open or opening now are not reused (idle ones close
    /// now, busy ones when they come back); later ones are.
    fn retire_open(&self) {
        self.0.retire_open();
    }

    /// Whether it was made for `user`'s pool size and server credentials.
    fn serves(&self, user: &UserConfig) -> bool {
        let target = &self.0.target;
        self.0.gate.size() == user.pool_size
            && target.user == user.server_user()
            && target.password.as_deref() == user.server_password()
            && target.passthrough == user.passthrough
    }
}

/// Where its checked-out connections come back (see `pooled`).
impl Home for NodePool {
    fn reusable(&self, conn: &ServerConn) -> bool {
        let age = coarse_clock::coarse_ms().saturating_sub(conn.opened_ms);
        !self.retires(conn.pool_epoch) && (self.lifetime_ms == 0 || age < self.lifetime_ms)
    }

    fn shelve(&self, mut conn: Box<ServerConn>) {
        conn.idle_since_ms = coarse_clock::coarse_ms();
        if let Some(listed) = &conn.listed {
            listed.set_server_state(ConnState::Idle, self.shard);
            listed.set_prepared(conn.prepared.len());
        }
        // Checked under the lock: `close` closes the gate before it empties the shelf.
        let mut shelf = self.lock_shelf();
        if !self.gate.is_closed() {
            shelf.push(conn);
        }
        drop(shelf);
        if !self.caps.is_empty() {
            self.came_back.notify_one();
        }
    }

    fn retire_open(&self) {
        NodePool::retire_open(self);
    }

    fn being_canceled(&self) -> &AtomicUsize {
        &self.being_canceled
    }
}

/// A cap it is under asks it for room (see `caps`).
impl IdleCloser for NodePool {
    fn close_one_idle(&self) -> bool {
        let mut shelf = self.lock_shelf();
        let oldest = (!shelf.is_empty()).then(|| shelf.remove(0));
        drop(shelf);
        oldest.is_some()
    }

    fn idle_count(&self) -> usize {
        self.lock_shelf().len()
    }
}

impl NodePool {
    fn lock_lanes(&self) -> MutexGuard<'_, Vec<Arc<Lane>>> {
        self.lanes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Closes the idle connections (once the shelf's lock is let go).
    fn close_idle(&self) {
        let idle = std::mem::take(&mut *self.lock_shelf());
        drop(idle);
    }

    /// The connections open or opening now are not reused: idle ones close now, busy
    /// ones when they come back.
    fn retire_open(&self) {
        let _ = self.epoch.fetch_update(
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
            |epoch| Some(epoch.saturating_add(1)),
        );
        self.mark_close_needed();
        self.close_idle();
    }

    /// Lists its open connections as to be closed (SHOW SERVERS' close_needed, what
    /// WAIT_CLOSE waits for).
    fn mark_close_needed(&self) {
        let (host, port) = (&self.target.host, self.target.port);
        self.servers.mark_close_needed(|info, shard| {
            shard == Some(u32::from(self.shard))
                && info.addr == *host
                && info.port == port
                && (&info.user, &info.database) == (&self.login.0, &self.login.1)
        });
    }

    /// Whether a connection that began to open in `epoch` is to be closed, not reused.
    fn retires(&self, epoch: u64) -> bool {
        let current = self.epoch.load(std::sync::atomic::Ordering::Acquire);
        epoch < current || current == RETIRED
    }

    fn lock_shelf(&self) -> MutexGuard<'_, Shelf> {
        // The shelf stays consistent across a panic elsewhere: each change is one step.
        self.shelf.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new connection, logged in and listed (SHOW SERVERS), begun in `epoch`.
    async fn open(&self, epoch: u64, slots: CapSlots) -> Result<Box<ServerConn>, BackendError> {
        // Boxed: the login future is large, and every checkout future would carry its size.
        let mut conn = Box::pin(ServerConn::connect(&self.target, self.tls.as_deref(), None)).await?;
        conn.pool_epoch = epoch;
        conn.cap_slots = slots;
        let _ = self.startup_params.set(Arc::new(conn.params.clone()));
        conn.stats = self.stats.clone();
        conn.listed = Some(self.servers.register(
            ConnInfo {
                user: self.login.0.clone(),
                database: self.login.1.clone(),
                addr: self.target.host.clone(),
                port: self.target.port,
                tls: conn.io.stream.is_tls(),
                application_name: String::new(),
                connect_unix_ms: unix_ms(),
                pid: conn.cancel.pid,
            },
            None,
        ));
        Ok(Box::new(conn))
    }

    /// The idle connection that holds the most of `wanted`, if one is idle.
    fn take_idle(&self, wanted: Wanted<'_>) -> Option<Box<ServerConn>> {
        // One that came back while a RECONNECT ran may have been shelved after it.
        pick(&mut self.lock_shelf(), wanted).filter(|conn| !self.retires(conn.pool_epoch))
    }

    /// With a permit held: the idle connection that holds the most of `wanted`, or a
    /// new one.
    async fn take(self: &Arc<Self>, permit: SharePermit, wanted: Wanted<'_>) -> Result<Taken, BackendError> {
        let epoch = self.epoch.load(std::sync::atomic::Ordering::Acquire);
        // When it began to open a connection: read only then, not per checkout.
        let mut opening_since = None;
        let conn = loop {
            if let Some(conn) = self.take_idle(wanted) {
                break conn;
            }
            let asking = std::ptr::from_ref(&**self) as usize;
            // `None`: one of ours came back idle while a cap was full; take that.
            let deadline = *opening_since.get_or_insert_with(Instant::now) + self.cap_wait;
            if let Some(slots) = take_slots(&self.caps, asking, deadline, &self.came_back).await? {
                break self.open(epoch, slots).await?;
            }
        };
        // What the checkout waited for: a place in the line, then the connection opened.
        let since = permit.queued_at().or(opening_since);
        Ok(Taken { conn: self.hand_out(conn, permit), since })
    }

    /// `conn`, taken off the shelf or opened under `permit`, checked out.
    fn hand_out(self: &Arc<Self>, mut conn: Box<ServerConn>, permit: SharePermit) -> PooledConn {
        let home = crate::net::client_threads::current();
        if conn.home != home && conn.io.stream.rehome().is_ok() {
            conn.home = home;
        }
        if let Some(listed) = &conn.listed {
            listed.set_server_state(ConnState::Active, self.shard);
            listed.set_prepared(conn.prepared.len());
        }
        PooledConn::new(conn, self.clone(), permit)
    }
}

/// One pool as the admin console shows it.
#[derive(Clone, Debug)]
pub struct PoolView {
    pub shard: ShardId,
    pub host: String,
    pub port: u16,
    pub user: String,
    /// The database clients asked for, and the one its connections log in to.
    pub database: String,
    pub server_database: String,
    pub size: usize,
    /// Connections held by clients (checked out), on the shelf, and held back until
    /// a cancel sent to them is confirmed.
    pub active: usize,
    pub idle: usize,
    pub being_canceled: usize,
    /// Checkouts waiting for a place.
    pub waiting: usize,
    pub lanes: usize,
    pub stats: StatsSnapshot,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct PoolKey {
    shard: ShardId,
    host: String,
    port: u16,
    node_dbname: Option<String>,
    user: String,
    database: String,
}

/// All pools of the proxy, created on first use.
pub struct Pools {
    config: Arc<Config>,
    tls: Option<Arc<ServerTls>>,
    pools: RwLock<HashMap<PoolKey, ServerPool>>,
    limits: Arc<dyn Fn() -> Arc<dyn LimitSource> + Send + Sync>,
    /// The file's `[[tenant_limits]]` (replaced by a RELOAD).
    file_limits: Arc<RwLock<Arc<TenantLimits>>>,
    /// Bumped when users change (see `generation`).
    generation: std::sync::atomic::AtomicU64,
    /// Every open server connection (the admin console's SHOW SERVERS).
    pub servers: Arc<ConnRegistry>,
    caps: Arc<ServerCaps>,
}

/// The tenant limits in force: the catalog's where it names the tenant, else the file's.
struct LimitsInForce {
    file: Arc<TenantLimits>,
    catalog: Arc<TenantLimits>,
}

impl LimitSource for LimitsInForce {
    fn limit(&self, tenant: Option<&TenantId>) -> TenantLimit {
        self.catalog.named(tenant).or_else(|| self.file.named(tenant)).unwrap_or_default()
    }
}

impl Pools {
    /// Pools whose tenant limits are the file's and those of `directory`'s topology.
    pub fn new(config: Arc<Config>, tls: Option<ServerTls>, directory: Arc<dyn Directory>) -> Self {
        let file = Arc::new(TenantLimits::from_config(&config.tenant_limits, config.proxy.tenant_key));
        let file_limits = Arc::new(RwLock::new(file));
        let in_file = file_limits.clone();
        let limits = Arc::new(move || {
            let catalog = directory.topology().limits().clone();
            let file = in_file.read().unwrap_or_else(|e| e.into_inner()).clone();
            Arc::new(LimitsInForce { file, catalog }) as Arc<dyn LimitSource>
        });
        let proxy = &config.proxy;
        let caps =
            ServerCaps::new(proxy.max_db_connections, proxy.max_user_connections, proxy.checkout_timeout());
        Self {
            caps: Arc::new(caps),
            config,
            tls: tls.map(Arc::new),
            pools: RwLock::new(HashMap::new()),
            limits,
            file_limits,
            generation: Default::default(),
            servers: Arc::default(),
        }
    }

    /// Closes the idle connections that have sat in their pools past
    /// `server_idle_timeout_ms`, or lived past `server_lifetime_ms`.
    pub fn close_expired(&self) {
        let pools: Vec<ServerPool> =
            self.pools.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        let now = coarse_clock::advance();
        let idle_ms = self.config.proxy.server_idle_timeout_ms;
        let past = |since: u64, limit: u64| limit > 0 && now.saturating_sub(since) >= limit;
        for pool in pools {
            // Closed once the shelf's lock is let go.
            let expired: Vec<Box<ServerConn>> = pool
                .0
                .lock_shelf()
                .extract_if(.., |c| past(c.idle_since_ms, idle_ms) || past(c.opened_ms, pool.0.lifetime_ms))
                .collect();
            if !expired.is_empty() {
                tracing::debug!(closed = expired.len(), addr = %pool.0.target.addr(), "closed expired idle server connections");
            }
        }
    }

    /// The caps over every pool, fleet slices included (`tenancy::connection_budget` sizes those).
    pub fn caps(&self) -> Arc<ServerCaps> {
        self.caps.clone()
    }

    /// The pool of (`node` of `shard`, `user`, `database`), created on first use. The
    /// handle is cheap to clone; sessions keep theirs to skip this lookup per checkout.
    pub fn pool(&self, shard: ShardId, node: &NodeConfig, user: &UserConfig, database: &str) -> ServerPool {
        let key = PoolKey {
            shard,
            host: node.host.clone(),
            port: node.port,
            node_dbname: node.dbname.clone(),
            user: user.name.clone(),
            database: database.to_string(),
        };
        if let Some(p) = self.pools.read().unwrap_or_else(|e| e.into_inner()).get(&key)
            && p.serves(user)
        {
            return p.clone();
        }
        let target = ConnectTarget {
            host: node.host.clone(),
            port: node.port,
            user: user.server_user().to_string(),
            password: user.server_password().map(str::to_string),
            passthrough: user.passthrough.clone(),
            password_keys: Default::default(),
            database: node.dbname.clone().unwrap_or_else(|| database.to_string()),
            connect_timeout: self.config.proxy.connect_timeout(),
            max_prepared: self.config.proxy.max_prepared_statements,
        };
        let gate = ShareGate::new(user.pool_size, self.config.proxy.fair_share, self.limits.clone());
        let listed = Listing {
            servers: self.servers.clone(),
            shard,
            login: (user.name.clone(), database.to_string()),
            caps: (
                self.caps.for_pool(shard, &node.host, node.port, &target.database, &target.user),
                self.caps.wait(),
            ),
        };
        let pool =
            ServerPool::new(gate, target, self.tls.clone(), self.config.proxy.server_lifetime_ms, listed);
        let mut pools = self.pools.write().unwrap_or_else(|e| e.into_inner());
        match pools.entry(key) {
            std::collections::hash_map::Entry::Occupied(mut held) if !held.get().serves(user) => {
                // The user's pool size or server credentials changed (a RELOAD): the new
                // pool takes over; the old one's connections close as they come back.
                let old = held.insert(pool.clone());
                old.retire_all();
                tracing::info!(shard, user = %user.name, size = user.pool_size, "pool replaced after a configuration change");
                pool
            }
            std::collections::hash_map::Entry::Vacant(vacant) => {
                // `min_pool_size`: warmed from its first login on, not a round later.
                let min = self.config.proxy.min_pool_size;
                if min > 0 {
                    tokio::spawn(pool.0.clone().keep_warm(min));
                }
                vacant.insert(pool).clone()
            }
            std::collections::hash_map::Entry::Occupied(held) => held.get().clone(),
        }
    }

    /// Changes whenever pools may have been replaced (a RELOAD changed users): sessions
    /// then look their pool handles up again.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The users are now `users` (a RELOAD): pools whose size or server credentials no
    /// longer match their user's are dropped (new ones open as sessions look them up
    /// again; the old ones' connections close as they come back), and sessions are
    /// told to look again.
    pub fn users_changed(&self, users: &[UserConfig]) {
        let mut pools = self.pools.write().unwrap_or_else(|e| e.into_inner());
        pools.retain(|key, pool| {
            let keep = users.iter().find(|u| u.name == key.user).is_none_or(|u| pool.serves(u));
            if !keep {
                pool.retire_all();
            }
            keep
        });
        drop(pools);
        self.generation.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Takes a reloaded file's `[[tenant_limits]]`: the gates plan with them from their
    /// next round.
    pub fn reload_limits(&self, config: &Config) {
        let limits = Arc::new(TenantLimits::from_config(&config.tenant_limits, config.proxy.tenant_key));
        *self.file_limits.write().unwrap_or_else(|e| e.into_inner()) = limits;
    }

    /// Replaces the connections of `shard`'s pools (every pool's: `None`): idle ones
    /// close now, busy ones when given back; new ones are opened as needed. Returns the
    /// number of pools.
    pub fn reconnect(&self, shard: Option<ShardId>) -> usize {
        self.reconnect_where(|s, _| shard.is_none_or(|wanted| wanted == s))
    }

    /// The same for the pools for which `pick(shard, database)` says yes.
    pub fn reconnect_where(&self, pick: impl Fn(ShardId, &str) -> bool) -> usize {
        let pools: Vec<ServerPool> = self
            .pools
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(key, _)| pick(key.shard, &key.database))
            .map(|(_, pool)| pool.clone())
            .collect();
        for pool in &pools {
            pool.retire_open();
        }
        pools.len()
    }

    /// Every pool as it is now, for the admin console and the metrics.
    pub fn snapshot(&self) -> Vec<PoolView> {
        let pools = self.pools.read().unwrap_or_else(|e| e.into_inner());
        let mut views: Vec<PoolView> = pools
            .iter()
            .map(|(key, pool)| {
                let p = &pool.0;
                let idle = p.lock_shelf().len();
                let held = p.gate.size().saturating_sub(p.gate.free());
                let being_canceled = p.being_canceled.load(Ordering::Relaxed).min(held);
                PoolView {
                    shard: key.shard,
                    host: key.host.clone(),
                    port: key.port,
                    user: key.user.clone(),
                    database: key.database.clone(),
                    server_database: p.target.database.clone(),
                    size: p.gate.size(),
                    active: held - being_canceled,
                    idle,
                    being_canceled,
                    waiting: p.gate.waiting(),
                    lanes: p.lock_lanes().len(),
                    stats: p.stats.snapshot(),
                }
            })
            .collect();
        views.sort_by(|a, b| {
            (a.shard, &a.host, a.port, &a.user, &a.database).cmp(&(
                b.shard,
                &b.host,
                b.port,
                &b.user,
                &b.database,
            ))
        });
        views
    }

    /// Closes the pools of nodes for which `keep(shard, host, port, dbname)` says no
    /// (they left the topology); idle connections close now, busy ones when given back.
    pub fn retain_nodes(&self, keep: impl Fn(ShardId, &str, u16, Option<&str>) -> bool) {
        let mut pools = self.pools.write().unwrap_or_else(|e| e.into_inner());
        pools.retain(|key, pool| {
            let kept = keep(key.shard, &key.host, key.port, key.node_dbname.as_deref());
            if !kept {
                tracing::info!(shard = key.shard, node = %format!("{}:{}", key.host, key.port), "pool closed: the node left the topology");
                pool.close();
            }
            kept
        });
    }

    /// Closes the idle connections to the node at `host:port` (it went down); busy ones
    /// fail on their own.
    pub fn close_idle_of_node(&self, host: &str, port: u16) {
        let pools: Vec<ServerPool> = self
            .pools
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(key, _)| key.host == host && key.port == port)
            .map(|(_, pool)| pool.clone())
            .collect();
        for pool in pools {
            pool.close_idle();
        }
    }

    /// Closes every pool (shutdown).
    pub fn close(&self) {
        for pool in self.pools.read().unwrap_or_else(|e| e.into_inner()).values() {
            pool.close();
        }
    }
}

mod checkout;
#[cfg(test)]
mod tests;
mod warm;
