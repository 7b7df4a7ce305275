//! Configuration: the TOML file's types with their defaults, loading, and
//! validation that reports every problem at once.
//!
//! A `Config` that passed `validate` is what every other layer reads; they never
//! re-check it.

mod env;
mod reload;
mod shards;
mod users;
mod validate;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use env::expand as expand_env;
pub use reload::needs_restart;
pub use shards::{
    MappedKey, NodeConfig, NodeRole, RangeConfig, ShardConfig, TenantLimitConfig, TenantMapping,
};
pub use users::{AuthConfig, AuthMethod, ReadTarget, UserConfig};
pub use validate::validate;

/// The whole configuration file.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub proxy: ProxyConfig,
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    #[serde(default)]
    pub server_tls: ServerTlsConfig,
    #[serde(default)]
    pub users: Vec<UserConfig>,
    /// Logins looked up in the database (as PgBouncer's `auth_query`).
    #[serde(default)]
    pub auth: AuthConfig,
    #[serde(default)]
    pub shards: Vec<ShardConfig>,
    /// Tenant ranges, inclusive at both ends.
    #[serde(default)]
    pub ranges: Vec<RangeConfig>,
    /// Explicit tenant placements; they win over ranges.
    #[serde(default)]
    pub tenant_map: Vec<TenantMapping>,
    /// Per-tenant shares of each pool's server connections (weight, cap, minimum);
    /// a catalog's `tenant_limits` table adds to them.
    #[serde(default)]
    pub tenant_limits: Vec<TenantLimitConfig>,
    /// A catalog database that holds shards and placements instead of this file.
    #[serde(default)]
    pub catalog: Option<CatalogConfig>,
    #[serde(default)]
    pub snowflake: SnowflakeConfig,
    #[serde(default)]
    pub health: HealthConfig,
    #[serde(default)]
    pub observe: ObserveConfig,
    #[serde(default)]
    pub moves: MovesConfig,
}

/// Online tenant moves (`MOVE TENANT` in the admin console; needs a catalog).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MovesConfig {
    /// The database whose tenant tables move, on both shards, when the move does not
    /// name one (`MOVE TENANT 7 TO SHARD 2 DATABASE app`) and the shard's nodes do not
    /// fix one.
    pub database: Option<String>,
    /// Who the move logs in to the shards as (it creates publications and
    /// subscriptions: a superuser, or a role allowed both). By default the first admin
    /// user's server credentials.
    pub user: Option<String>,
    pub password: Option<String>,
    /// The longest the tenant is paused in one cutover attempt: every proxy must have
    /// held it and seen its running transactions end, and the target must have applied
    /// the source's last change, within this time, or the attempt is aborted and the
    /// tenant goes on on the source.
    pub pause_timeout_ms: u64,
    /// A cutover is attempted once a change on the source reaches the target within
    /// this time (the replication's lag, measured with a marker row).
    pub catch_up_ms: u64,
    /// Cutover attempts before the move gives up and rolls back.
    pub cutover_attempts: u32,
    /// A proxy whose heartbeat in the catalog is older than this is gone: the cutover
    /// does not wait for it, and another proxy takes over the moves it drove.
    pub proxy_stale_ms: u64,
}

impl Default for MovesConfig {
    fn default() -> Self {
        Self {
            database: None,
            user: None,
            password: None,
            pause_timeout_ms: 2_000,
            catch_up_ms: 500,
            cutover_attempts: 5,
            proxy_stale_ms: 5_000,
        }
    }
}

/// What operators see besides the admin console.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ObserveConfig {
    /// The HTTP port for `/metrics`, `/healthz` and `/readyz` (off unless set).
    pub listen: Option<SocketAddr>,
    /// Log lines as text (the default) or as JSON objects, one per line.
    pub log_format: LogFormat,
    /// Tenants kept per shard by the per-tenant statistics (SHOW TENANTS, the
    /// `pgtenant_tenant_*` series of /metrics): the heaviest by transactions, counted
    /// exactly, the rest within a stated bound (see `observe::tenants`). /metrics then
    /// carries at most this many tenants per shard. 0 = off.
    pub tenant_stats_top_k: usize,
    /// The window of the per-tenant statistics' recent figures.
    pub tenant_stats_window_ms: u64,
}

impl Default for ObserveConfig {
    fn default() -> Self {
        ObserveConfig {
            listen: None,
            log_format: LogFormat::default(),
            tenant_stats_top_k: 20,
            tenant_stats_window_ms: 60_000,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Health checks of every shard node, and what a shard does while it has no primary.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// Each node is asked its role, WAL position and timeline this often.
    pub interval_ms: u64,
    /// A check that takes longer fails.
    pub timeout_ms: u64,
    /// A node failing this many checks in a row is down (one that refuses connections
    /// is down at once).
    pub fail_after: u32,
    /// While a shard has no primary it can use, a request that needs one waits this
    /// long for one to appear (a promotion) before it fails with 57P03; 0 = fail at
    /// once. A session's own `statement_timeout`, when shorter, bounds it. The default
    /// outlasts a crash under Patroni's defaults (the leader key's `ttl`, 30 s, runs out;
    /// the next `loop_wait`, up to 10 s, promotes) and CloudNativePG's (about 30 s);
    /// set it to your orchestrator's `ttl` + `loop_wait` + a few seconds (RDS Multi-AZ
    /// takes 60-120 s).
    pub failover_hold_ms: u64,
    /// Requests that may wait so at once, over all shards; more fail at once.
    pub max_held_requests: usize,
    /// A replica further behind its primary than this takes no reads (sessions with
    /// `pgtenant.target` = prefer-replica or replica) until it catches up: how long ago
    /// the primary first wrote past what the replica has replayed (the seed's warning
    /// level), so an idle primary never makes it look behind.
    pub max_replica_lag_ms: u64,
    /// The same in WAL bytes.
    pub max_replica_lag_bytes: u64,
    /// When a shard's primary is down, promote its best replica (`pg_promote()`): the
    /// one that received the most WAL, by `priority` among equals, never one behind
    /// what a synchronous standby confirmed. With a catalog, an advisory lock there
    /// lets one proxy of many promote; without one, run a single proxy with it. Off by
    /// default: most deployments leave promotion to their orchestrator (Patroni).
    pub auto_promote: bool,
    /// Who checks: by default the first `[[users]]` entry's server credentials.
    pub user: Option<String>,
    pub password: Option<String>,
    /// The database the checks connect to.
    pub dbname: String,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            interval_ms: 1000,
            timeout_ms: 1000,
            fail_after: 3,
            failover_hold_ms: 45_000,
            max_held_requests: 1000,
            max_replica_lag_ms: 1000,
            max_replica_lag_bytes: 16 << 20,
            auto_promote: false,
            user: None,
            password: None,
            dbname: "postgres".into(),
        }
    }
}

/// Snowflake IDs minted by the proxy (`SELECT pgtenant.next_id()`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SnowflakeConfig {
    /// Of the 12 sequence bits, those that number the minters; the rest count IDs
    /// within a millisecond. Every proxy and `sql/snowflake.sql` must agree.
    #[serde(default = "default_instance_bits")]
    pub instance_bits: u32,
    /// This proxy's instance number when there is no catalog to lease one from
    /// (1..2^instance_bits - 1; 0 belongs to the servers' SQL function).
    #[serde(default = "default_instance")]
    pub instance: i64,
    /// How long a leased instance number lasts without renewal (renewed every third).
    #[serde(default = "default_lease_ttl_ms")]
    pub lease_ttl_ms: u64,
    /// A leased number is given back after this long without minting (taken again at
    /// the next call), so that only proxies that mint hold one.
    #[serde(default = "default_lease_idle_ms")]
    pub lease_idle_ms: u64,
    /// How far back the clock may jump and be waited out; further is an error.
    #[serde(default = "default_max_clock_backwards_ms")]
    pub max_clock_backwards_ms: u64,
}

impl Default for SnowflakeConfig {
    fn default() -> Self {
        Self {
            instance_bits: default_instance_bits(),
            instance: default_instance(),
            lease_ttl_ms: default_lease_ttl_ms(),
            lease_idle_ms: default_lease_idle_ms(),
            max_clock_backwards_ms: default_max_clock_backwards_ms(),
        }
    }
}

fn default_instance_bits() -> u32 {
    4
}
fn default_instance() -> i64 {
    1
}
fn default_lease_ttl_ms() -> u64 {
    30_000
}
fn default_lease_idle_ms() -> u64 {
    300_000
}
fn default_max_clock_backwards_ms() -> u64 {
    1_000
}

/// The catalog database (schema in `sql/catalog.sql`) and its tenant cache.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogConfig {
    /// A host name or address, or a Unix socket directory (starting with `/`).
    pub host: String,
    #[serde(default = "default_pg_port")]
    pub port: u16,
    pub user: String,
    pub password: Option<String>,
    pub dbname: String,
    /// Tenants kept in the cache at most.
    #[serde(default = "default_cache_capacity")]
    pub cache_capacity: u64,
    /// How long a cached placement is trusted without a NOTIFY.
    #[serde(default = "default_cache_ttl_ms")]
    pub cache_ttl_ms: u64,
    /// How long "not placed" is remembered.
    #[serde(default = "default_miss_ttl_ms")]
    pub miss_ttl_ms: u64,
    /// Connections for cache-miss lookups.
    #[serde(default = "default_lookup_connections")]
    pub lookup_connections: usize,
    #[serde(default = "default_catalog_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
}

fn default_pg_port() -> u16 {
    5432
}
fn default_cache_capacity() -> u64 {
    1_000_000
}
fn default_cache_ttl_ms() -> u64 {
    300_000
}
fn default_miss_ttl_ms() -> u64 {
    1_000
}
fn default_lookup_connections() -> usize {
    4
}
fn default_catalog_connect_timeout_ms() -> u64 {
    3_000
}

impl CatalogConfig {
    pub fn addr(&self) -> String {
        format!("{}:{}/{}", self.host, self.port, self.dbname)
    }

    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    pub fn pg_config(&self) -> tokio_postgres::Config {
        let mut pg = tokio_postgres::Config::new();
        pg.host(&self.host)
            .port(self.port)
            .user(&self.user)
            .dbname(&self.dbname)
            .application_name("pgtenant-catalog")
            .connect_timeout(self.connect_timeout())
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10));
        if let Some(password) = &self.password {
            pg.password(password);
        }
        pg
    }
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum PoolMode {
    /// A server connection is held from a transaction's first statement to its end.
    #[default]
    Transaction,
    /// A server connection is held for the whole client session.
    Session,
}

/// The type of tenant keys.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum TenantKey {
    /// bigint keys: ranges, explicit map and hash groups apply.
    #[default]
    Bigint,
    /// text keys: the explicit map (`tenant_shard_map_text`) and hash groups apply.
    Text,
}

impl TenantKey {
    /// What a valid key looks like, for error messages.
    pub fn describe(self) -> &'static str {
        match self {
            TenantKey::Bigint => "a bigint",
            TenantKey::Text => "text of 1 to 256 bytes",
        }
    }
}

/// How far pgtenant goes to keep a bound session to its tenant.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum IsolationMode {
    /// Statements that name another tenant are refused; row-level security does the rest.
    #[default]
    Standard,
    /// Also refused: a statement of a session with a tenant that touches a table with
    /// the tenant column and no forced row-level security, unless it is confined to
    /// the session's tenant (one table, its tenant column compared with the session's
    /// tenant in a top-level AND of its WHERE, or INSERT ... VALUES of that tenant).
    Strict,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum NoTenantPolicy {
    /// A statement that needs a tenant and has none is refused.
    #[default]
    Reject,
    /// It runs on `default_shard`.
    Default,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    pub listen: SocketAddr,
    pub pool_mode: PoolMode,
    pub max_clients: usize,
    pub startup_timeout_ms: u64,
    pub max_message_size: usize,
    pub checkout_timeout_ms: u64,
    /// How long a transaction waits while an admin PAUSE covers its shard or tenant
    /// before it fails (57014).
    pub pause_hold_ms: u64,
    /// How long a scatter-gather waits for each shard's part (57014, or a missing
    /// shard in a partial result).
    pub scatter_timeout_ms: u64,
    /// On SIGTERM/SIGINT (or SHUTDOWN), how long running transactions may take to
    /// finish before the process exits anyway.
    pub shutdown_timeout_ms: u64,
    /// Bind the listen address with SO_REUSEPORT, so that a new process can take over
    /// the port while this one drains (a zero-downtime restart). Off by default: two
    /// processes started on one port by mistake would then share its clients silently.
    pub reuse_port: bool,
    /// Also listen on a Unix socket, `<dir>/.s.PGSQL.<port>` (libpq's `host=<dir>`), as
    /// a sidecar's application may prefer.
    pub unix_socket_dir: Option<PathBuf>,
    pub connect_timeout_ms: u64,
    /// Name of the session parameter / GUC that carries the tenant.
    pub tenant_parameter: String,
    /// The column that holds the tenant in every sharded table (SQL routing).
    pub tenant_column: String,
    /// bigint (default) or text tenant keys.
    pub tenant_key: TenantKey,
    /// Statement shapes whose parse results are kept.
    pub parse_cache_size: u64,
    /// Bytes of statement text those shapes may hold (default 64 MiB); a shape longer
    /// than a 64th of it is parsed every time instead of kept.
    pub parse_cache_bytes: usize,
    /// Whether a contended pool shares its connections fairly among the tenants that
    /// have work (default true): each gets up to its weighted share, what one leaves
    /// unused goes to the others, and a tenant alone may use the whole pool.
    pub fair_share: bool,
    /// Bytes of named prepared statements (texts and a fixed cost each) one client may
    /// hold (default 16 MiB; 0 = no limit): a Parse past it gets 53200 and the session
    /// goes on. With `max_clients` it bounds what clients' statements take of the proxy.
    pub max_client_statement_bytes: usize,
    /// Statement shapes (text with literals replaced) longer than this are not given to
    /// the SQL parser, whose cost grows with the text (about 1 s for 2 MB); the lexer
    /// reads their tenant comparisons, as for statements the parser cannot read
    /// (default 1 MiB). Statements over 8 KiB are parsed on a thread of their own either
    /// way, so that other clients never wait for them.
    pub max_parsed_statement_bytes: usize,
    /// Whether `SET <tenant_parameter>` may rebind a session whose tenant was given at
    /// login; sessions that logged in without one may always set it. Default false: a
    /// tenant given at login is bound. A user's own `allow_tenant_switch` overrides it.
    pub allow_tenant_switch: bool,
    pub no_tenant_policy: NoTenantPolicy,
    /// `standard` (default) or `strict` (see `IsolationMode`).
    pub isolation: IsolationMode,
    /// Shard for statements that need no tenant; the lowest shard id when unset.
    pub default_shard: Option<u16>,
    /// Set the tenant GUC on every server connection handed to a tenant.
    pub set_tenant_guc: bool,
    /// The key pgtenant signs the tenant GUC's value with (HMAC-SHA-256, in the GUC
    /// `pgtenant.tenant_sig`), installed on the shards with
    /// `SELECT pgtenant.set_context_key('...')` (`sql/rls.sql`): row-level security then
    /// trusts only the tenant pgtenant set, not one the tenant's SQL set itself.
    pub tenant_context_key: Option<String>,
    /// Threads serving clients (tokio workers, or with `thread_per_core` single-threaded
    /// runtimes); 0 means one per two cores, at least one (`resolve_workers`).
    pub workers: usize,
    /// Serve each client, with the lanes it opens and the server connections it takes,
    /// on one of `workers` single-threaded runtimes (`net::client_threads`) instead of
    /// a multi-threaded runtime: less proxy CPU per transaction, shallower pipelines.
    pub thread_per_core: bool,
    /// A client idle inside a transaction this long is disconnected (25P03) and its
    /// transaction rolled back, so it cannot hold a server connection forever; 0 = never.
    pub idle_transaction_timeout_ms: u64,
    /// A client idle between transactions this long is disconnected (57P05, as
    /// PostgreSQL's `idle_session_timeout`; PgBouncer's `client_idle_timeout`). A
    /// request pgtenant answers itself counts as activity; 0 = never.
    pub client_idle_timeout_ms: u64,
    /// A transaction (or autocommit request) that lasts longer ends its session with
    /// FATAL 25P04, as PostgreSQL 17's `transaction_timeout` (and PgBouncer's); a
    /// statement still running is canceled on the server first. 0 = off.
    pub transaction_timeout_ms: u64,
    /// A request the server has not answered after this long is canceled there and the
    /// session ends (FATAL 57014), as PgBouncer's `query_timeout`: a guard against an
    /// unresponsive server or network, meant to sit above the servers' own
    /// `statement_timeout`. Requests on a pipelined lane are not timed. 0 = off.
    pub query_timeout_ms: u64,
    /// Server connections each pool keeps open, busy or idle, once it exists
    /// (PgBouncer's `min_pool_size`; at most the pool's size): a burst after a quiet
    /// spell then does not wait for logins; on every node of the shard (see
    /// `backend::pool::warm`). Checked every second; 0 = none.
    pub min_pool_size: usize,
    /// Server connections per (node, database) at most, over every user's pool
    /// (PgBouncer's `max_db_connections`); a pool at the cap closes another pool's idle
    /// connection or waits up to `checkout_timeout_ms` (then 53300). 0 = no cap.
    pub max_db_connections: usize,
    /// Server connections per (node, server role) at most, over every database's pool
    /// (PgBouncer's `max_user_connections`). 0 = no cap.
    pub max_user_connections: usize,
    /// Read-your-writes for sessions whose reads go to replicas: `"session"` (after a
    /// session's transaction that may have written ends on the primary, its reads go
    /// only to replicas that replayed what the primary had committed by then, else to
    /// the primary; other sessions keep reading replicas), `"user"` (the same for every
    /// session of the login that wrote) or `"off"`.
    pub read_your_writes: ReadYourWrites,
    /// Clients one login may have connected at once (PgBouncer's
    /// `max_user_client_connections`); one more gets FATAL 53300. A user's
    /// `max_client_connections` overrides it; 0 = no limit but `max_clients`.
    pub max_user_client_connections: usize,
    /// Statements each server connection keeps prepared; past that, the least recently
    /// used is closed. 0 = no limit.
    pub max_prepared_statements: usize,
    /// A server connection this old is closed when it comes back to its pool; 0 = never.
    pub server_lifetime_ms: u64,
    /// A server connection idle in its pool this long is closed; 0 = never.
    pub server_idle_timeout_ms: u64,
    /// Autocommit requests of different clients that one server connection may carry
    /// at once, each sent without waiting for the answer to the one before (see
    /// `backend::lane`); 0 or 1 = never pipelined. Default 8.
    pub pipeline_depth: usize,
    /// A request joins such a connection only while the oldest request on it went out
    /// less than this long ago (µs), so that little waits behind a slow statement.
    pub pipeline_join_window_us: u64,
    /// A statement shape rides a lane only while its recent runs were answered within
    /// this long (µs); a new shape runs alone until they were (see `router::quick`).
    pub pipeline_quick_us: u64,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:6432".parse().expect("static address"),
            pool_mode: PoolMode::Transaction,
            max_clients: 1000,
            startup_timeout_ms: 10_000,
            max_message_size: 64 << 20,
            checkout_timeout_ms: 5_000,
            pause_hold_ms: 60_000,
            scatter_timeout_ms: 30_000,
            shutdown_timeout_ms: 30_000,
            reuse_port: false,
            unix_socket_dir: None,
            connect_timeout_ms: 3_000,
            tenant_parameter: "pgtenant.tenant_id".into(),
            tenant_column: "tenant_id".into(),
            tenant_key: TenantKey::Bigint,
            parse_cache_size: 10_000,
            parse_cache_bytes: 64 << 20,
            fair_share: true,
            max_client_statement_bytes: 16 << 20,
            max_parsed_statement_bytes: 1 << 20,
            allow_tenant_switch: false,
            no_tenant_policy: NoTenantPolicy::Reject,
            isolation: IsolationMode::Standard,
            default_shard: None,
            set_tenant_guc: true,
            tenant_context_key: None,
            workers: 0,
            thread_per_core: false,
            idle_transaction_timeout_ms: 0,
            client_idle_timeout_ms: 0,
            transaction_timeout_ms: 0,
            query_timeout_ms: 0,
            min_pool_size: 0,
            max_db_connections: 0,
            max_user_connections: 0,
            read_your_writes: ReadYourWrites::Session,
            max_user_client_connections: 0,
            max_prepared_statements: 1000,
            server_lifetime_ms: 3_600_000,
            server_idle_timeout_ms: 600_000,
            pipeline_depth: 8,
            pipeline_join_window_us: 1000,
            pipeline_quick_us: 2000,
        }
    }
}

/// `workers` as configured, or for 0 the automatic count (`auto_workers`).
pub fn resolve_workers(configured: usize) -> usize {
    match configured {
        0 => auto_workers(std::thread::available_parallelism().map_or(1, |n| n.get())),
        n => n,
    }
}

/// One thread serving clients per two cores, at least one (which is a single-threaded
/// runtime). Most of a relayed transaction's cost is the kernel's network stack in the
/// proxy's own calls (83-85 % of its CPU here), and a core the proxy's threads take is
/// one that its clients, PostgreSQL or that network work, usually on the same host,
/// cannot use; a second worker there brings little and costs hand-offs: on the 2-core
/// benchmark machine one thread spent 17-19 µs of CPU per transaction where two spent
/// 22-27, and served 8 pgbench clients 9-18 % more transactions (docs/benchmarks.md, "Threads").
fn auto_workers(cores: usize) -> usize {
    (cores / 2).max(1)
}

impl ProxyConfig {
    /// See `pipeline_quick_us`.
    pub fn pipeline_quick(&self) -> Duration {
        Duration::from_micros(self.pipeline_quick_us)
    }

    pub fn startup_timeout(&self) -> Duration {
        Duration::from_millis(self.startup_timeout_ms)
    }
    pub fn checkout_timeout(&self) -> Duration {
        Duration::from_millis(self.checkout_timeout_ms)
    }
    pub fn server_lifetime(&self) -> Option<Duration> {
        (self.server_lifetime_ms > 0).then(|| Duration::from_millis(self.server_lifetime_ms))
    }
    pub fn server_idle_timeout(&self) -> Option<Duration> {
        (self.server_idle_timeout_ms > 0).then(|| Duration::from_millis(self.server_idle_timeout_ms))
    }
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
}

/// TLS offered to clients.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum ServerTlsMode {
    #[default]
    Disable,
    /// TLS when the server offers it, plain otherwise; certificates are not verified.
    Prefer,
    /// TLS or fail; certificates are verified against `ca` when given.
    Require,
}

/// TLS from pgtenant to the servers.
#[derive(Clone, Debug, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ServerTlsConfig {
    pub mode: ServerTlsMode,
    pub ca: Option<PathBuf>,
}

/// Whether a session reads its own writes when its reads go to replicas: its own
/// (`session`), every session of its login's (`user`), or none.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum ReadYourWrites {
    Off,
    #[default]
    Session,
    User,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {source}")]
    Parse { path: PathBuf, source: Box<toml::de::Error> },
    #[error("{} problem(s) in the configuration:\n  - {}", .0.len(), .0.join("\n  - "))]
    Invalid(Vec<String>),
}

impl Config {
    /// Parses TOML text without validating it.
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse { path: path.into(), source: Box::new(e) })
    }

    /// Reads, parses and validates a file, the `${NAME}`s of its values filled in from
    /// the environment.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| ConfigError::Read { path: path.into(), source: e })?;
        // Parsed as it is first, for errors with their line: filling in variables
        // changes only what strings hold.
        Self::from_toml(&text, path)?;
        let parse_error = |e| ConfigError::Parse { path: path.into(), source: Box::new(e) };
        let mut value: toml::Value = toml::from_str(&text).map_err(parse_error)?;
        env::expand_values(&mut value, &|name| std::env::var(name).ok()).map_err(ConfigError::Invalid)?;
        let config: Self = value.try_into().map_err(parse_error)?;
        let problems = validate(&config);
        if problems.is_empty() { Ok(config) } else { Err(ConfigError::Invalid(problems)) }
    }

    pub fn user(&self, name: &str) -> Option<&UserConfig> {
        self.users.iter().find(|u| u.name == name)
    }

    /// The shard for statements that need no tenant, when the configuration names
    /// one (or its lowest shard); a catalog's lowest shard otherwise.
    pub fn default_shard(&self) -> Option<u16> {
        self.proxy.default_shard.or_else(|| self.shards.iter().map(|s| s.id).min())
    }
}

/// Two shards (1 and 2), ranges 1..=1000 and 1001..=2000, tenant 42 mapped to shard 2:
/// the demo layout, for unit tests of the layers above.
#[cfg(test)]
pub(crate) fn test_layout() -> Config {
    Config::from_toml(
        r#"
        [[shards]]
        id = 1
        nodes = [{ host = "a", port = 1, role = "primary" }]
        [[shards]]
        id = 2
        nodes = [{ host = "b", port = 1, role = "primary" }]
        [[ranges]]
        min = 1
        max = 1000
        shard = 1
        [[ranges]]
        min = 1001
        max = 2000
        shard = 2
        [[tenant_map]]
        tenant = 42
        shard = 2
        "#,
        Path::new("test"),
    )
    .expect("test layout")
}

#[cfg(test)]
mod tests {
    use super::{auto_workers, resolve_workers};

    #[test]
    fn automatic_workers_take_one_thread_per_two_cores_and_at_least_one() {
        let by_cores: Vec<usize> = [1, 2, 3, 4, 16].into_iter().map(auto_workers).collect();
        assert_eq!(by_cores, [1, 1, 1, 2, 8]);
        assert_eq!(resolve_workers(3), 3, "a configured count is kept");
        assert!(resolve_workers(0) >= 1);
    }
}
