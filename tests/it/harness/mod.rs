//! Test harness: throwaway PostgreSQL clusters shared by every test of this binary
//! (two demo shards), a proxy per test on a free port, and clients: tokio-postgres,
//! psql, pgbench and a raw-protocol client.

pub mod clusters;
pub mod raw;
pub mod slow_cancels;

use std::net::SocketAddr;
use std::process::{Command, Output};

use pgtenant::config::Config;
use pgtenant::dev::demo;
use tokio::sync::oneshot;

pub use clusters::{private_cluster, private_cluster_with_replica, private_tls_cluster, shards};

/// A proxy serving the shared shards (or whatever the test changed in its config).
pub struct Proxy {
    pub addr: SocketAddr,
    pub config: Config,
    http_addr: Option<SocketAddr>,
    /// Tells its thread to shut it down (dropped: the same).
    stop: oneshot::Sender<()>,
    stopped: oneshot::Receiver<()>,
}

/// Runs a proxy on a thread of its own, on a single-threaded runtime: what the shipped
/// `workers = 0` runs on a 2-core machine (the tests' own runtimes have several
/// threads, and a proxy task that blocked its thread would go unseen on them).
async fn start_on_own_thread(config: Config, file: Option<std::path::PathBuf>) -> Proxy {
    let (started, on_start) = oneshot::channel();
    let (stop, on_stop) = oneshot::channel::<()>();
    let (done, stopped) = oneshot::channel();
    let serving = config.clone();
    std::thread::Builder::new()
        .name("pgtenant-under-test".into())
        .spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            runtime.block_on(async move {
                match pgtenant::server::start_with_file(serving, file).await {
                    Ok(running) => {
                        let _ = started.send(Ok((running.addr, running.http_addr)));
                        let _ = on_stop.await;
                        running.shutdown().await;
                    }
                    Err(e) => drop(started.send(Err(e.to_string()))),
                }
            });
            let _ = done.send(());
        })
        .expect("a thread for the proxy");
    let (addr, http_addr) = on_start.await.expect("the proxy's thread").expect("proxy starts");
    Proxy { addr, config, http_addr, stop, stopped }
}

/// Starts a proxy over the shared demo shards; `tweak` may change its configuration.
pub async fn start_proxy(tweak: impl FnOnce(&mut Config)) -> Proxy {
    pgtenant::observe::init_logging("warn");
    let s = shards();
    let mut config = demo::demo_config("127.0.0.1:0".parse().unwrap(), s.ports, Some(&s.tls_dir));
    tweak(&mut config);
    start_on_own_thread(config, None).await
}

/// Starts a proxy in pool mode `mode` whose user has `pool_size` server connections per
/// node (1: the next transaction gets the connection the last one used).
pub async fn start_pooled_proxy(mode: pgtenant::config::PoolMode, pool_size: usize) -> Proxy {
    start_proxy(move |c| {
        c.proxy.pool_mode = mode;
        c.users[0].pool_size = pool_size;
    })
    .await
}

/// Starts a proxy over the shared demo shards from a configuration file it writes
/// (`tweak` may change it first), which RELOAD reads again; returns the file too.
pub async fn start_proxy_from_file(
    name: &str,
    tweak: impl FnOnce(&mut Config),
) -> (Proxy, std::path::PathBuf) {
    pgtenant::observe::init_logging("warn");
    let s = shards();
    let mut config = demo::demo_config("127.0.0.1:0".parse().unwrap(), s.ports, Some(&s.tls_dir));
    tweak(&mut config);
    let file = clusters::base_dir().join(format!("{name}.toml"));
    std::fs::write(&file, toml::to_string_pretty(&config).unwrap()).unwrap();
    (start_on_own_thread(config, Some(file.clone())).await, file)
}

impl Proxy {
    /// Stops the proxy: idle sessions are told 57P01, busy ones finish first.
    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        let _ = self.stopped.await;
    }

    /// Where the proxy serves `/metrics`, `/healthz`, `/readyz` (`[observe] listen`).
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// A libpq connection string to the admin console as the demo's admin user.
    pub fn admin_conninfo(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user={} password={} dbname=pgtenant sslmode=disable",
            self.addr.port(),
            demo::ADMIN_USER,
            demo::ADMIN_PASSWORD
        )
    }

    /// A libpq connection string; `extra` is appended.
    pub fn conninfo(&self, extra: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=app password=app dbname=app sslmode=disable {extra}",
            self.addr.port()
        )
    }

    /// A tokio-postgres client, with a session tenant when given.
    pub async fn connect(&self, tenant: Option<i64>) -> tokio_postgres::Client {
        self.try_connect(tenant).await.expect("connect through the proxy")
    }

    pub async fn try_connect(
        &self,
        tenant: Option<i64>,
    ) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        let options = tenant.map(|t| format!("options='-c pgtenant.tenant_id={t}'")).unwrap_or_default();
        connect(&self.conninfo(&options)).await
    }

    /// Runs psql with `args` against the proxy, feeding `stdin`.
    pub fn psql(&self, tenant: Option<i64>, args: &[&str], stdin: &str) -> Output {
        let options = tenant.map(|t| format!("options='-c pgtenant.tenant_id={t}'")).unwrap_or_default();
        let conninfo = self.conninfo(&options);
        run_with_stdin(
            Command::new("psql").args(["-X", "-q", "-v", "ON_ERROR_STOP=0", "-d", &conninfo]).args(args),
            stdin,
        )
    }
}

pub async fn connect(conninfo: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// Runs a command, writing `stdin` to it, and returns its output.
/// `psql -X -At -d conninfo -c sql`, as a user runs it.
pub fn psql_at(conninfo: &str, sql: &str) -> Output {
    run_with_stdin(Command::new("psql").args(["-X", "-At", "-d", conninfo, "-c", sql]), "")
}

pub fn run_with_stdin(cmd: &mut Command, stdin: &str) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child =
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("write stdin");
    child.wait_with_output().expect("wait")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Which shard answered, asked of the server itself.
pub async fn shard_of(client: &tokio_postgres::Client) -> i32 {
    client.query_one("SELECT shard_id FROM pgtenant_shard", &[]).await.expect("pgtenant_shard").get(0)
}

/// The SQLSTATE of an error from tokio-postgres.
pub fn sqlstate(e: &tokio_postgres::Error) -> String {
    e.code().map(|c| c.code().to_string()).unwrap_or_else(|| format!("no SQLSTATE: {e}"))
}

/// A catalog database of a test's own on the first shared cluster, holding the demo
/// layout, and a superuser client to change it.
pub struct Catalog {
    pub config: pgtenant::config::CatalogConfig,
    pub admin: tokio_postgres::Client,
}

/// Creates a fresh catalog database with the demo layout.
pub async fn new_catalog(name: &str) -> Catalog {
    let s = shards();
    let dbname = format!("catalog_{name}");
    let config = demo_catalog_on(s.ports[0], &dbname).await;
    let admin = connect(&format!("host=127.0.0.1 port={} user=postgres dbname={dbname}", s.ports[0]))
        .await
        .expect("catalog admin connection");
    Catalog { config, admin }
}

/// Database `dbname` on the cluster at `port` made a catalog of the demo layout, with
/// the shared shards over TCP (as the tests' file configurations reach them); how a
/// proxy reaches it.
pub async fn demo_catalog_on(port: u16, dbname: &str) -> pgtenant::config::CatalogConfig {
    demo::setup_catalog(port, dbname, &demo::loopback_nodes(&shards().ports)).await.expect("catalog setup");
    demo::local_catalog(port, dbname)
}

impl Catalog {
    /// The routing version in the catalog.
    pub async fn version(&self) -> i64 {
        self.admin.query_one("SELECT version FROM pgtenant.routing_state", &[]).await.unwrap().get(0)
    }
}

/// Starts a proxy that serves from `catalog`; `tweak` may change its configuration.
pub async fn start_catalog_proxy(
    catalog: pgtenant::config::CatalogConfig,
    tweak: impl FnOnce(&mut Config),
) -> Proxy {
    pgtenant::observe::init_logging("warn");
    let s = shards();
    let mut config = demo::demo_catalog_config("127.0.0.1:0".parse().unwrap(), catalog, Some(&s.tls_dir));
    tweak(&mut config);
    start_on_own_thread(config, None).await
}

/// Starts a proxy whose shard 1 is the cluster on `primary` with a replica on
/// `replica`, every node checked each 200 ms; `tweak` may change the rest.
pub async fn start_proxy_on_pair(primary: u16, replica: u16, tweak: impl FnOnce(&mut Config)) -> Proxy {
    start_proxy(move |c| {
        let node = |port, role| pgtenant::config::NodeConfig {
            host: "127.0.0.1".into(),
            port,
            role,
            priority: 0,
            dbname: None,
        };
        c.shards[0].nodes = vec![
            node(primary, pgtenant::config::NodeRole::Primary),
            node(replica, pgtenant::config::NodeRole::Replica),
        ];
        c.health.interval_ms = 200;
        tweak(c);
    })
    .await
}

/// Polls `probe` until it returns true or `within` passes; returns the time it took.
pub async fn eventually<F, Fut>(within: std::time::Duration, mut probe: F) -> Option<std::time::Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    while start.elapsed() < within {
        if probe().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    None
}

/// The states SHOW CLIENTS lists for the application's clients (database `app`),
/// sorted; `console` is an admin connection to the console.
pub async fn client_states(console: &tokio_postgres::Client) -> Vec<String> {
    let rows = console.query("SHOW CLIENTS", &[]).await.unwrap();
    let mut states: Vec<String> = rows
        .iter()
        .filter(|r| r.get::<_, String>("database") == "app")
        .map(|r| r.get::<_, String>("state"))
        .collect();
    states.sort();
    states
}

/// Whether the count that `count_sql` (a `SELECT count(*) ...`) returns falls to 0
/// within `within`: something pgtenant should let go of was let go.
pub async fn eventually_none(
    client: &tokio_postgres::Client,
    within: std::time::Duration,
    count_sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> bool {
    eventually(within, || async {
        let n: i64 = client.query_one(count_sql, params).await.unwrap().get(0);
        n == 0
    })
    .await
    .is_some()
}

/// Whether server process `pid` of shared shard 1 has ended, or does `within` (it
/// exits a moment after its connection is closed).
pub async fn backend_ends(pid: i32, within: std::time::Duration) -> bool {
    let admin = shard_admin(1, "postgres").await;
    eventually_none(&admin, within, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", &[&pid]).await
}

/// Asks the server backend that serves the client now for its pid: `pg_backend_pid()`
/// inside a larger statement runs on the server (the statement `SELECT
/// pg_backend_pid()` alone pgtenant answers with the pid it gave the client).
pub const SERVER_PID_SQL: &str = "SELECT pg_backend_pid() AS server_pid WHERE true";

/// The pid of the server backend that serves `client` now (see `SERVER_PID_SQL`).
pub async fn server_pid(client: &tokio_postgres::Client) -> i32 {
    client.query_one(SERVER_PID_SQL, &[]).await.expect("the server's pid").get(0)
}

/// A superuser connection to shared shard `shard` (1 or 2), database `dbname`.
pub async fn shard_admin(shard: usize, dbname: &str) -> tokio_postgres::Client {
    let port = shards().ports[shard - 1];
    connect(&format!("host=127.0.0.1 port={port} user=postgres dbname={dbname}"))
        .await
        .expect("superuser connection")
}

/// `GET path` on the proxy's HTTP port: status code and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("HTTP port");
    stream.write_all(format!("GET {path} HTTP/1.1\r\nhost: test\r\n\r\n").as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

/// The series the shipped Grafana dashboard and Prometheus alert rules read (every
/// `pgtenant_...` name in their expressions), by area: each test that brings an area
/// to life (moves, a catalog, a replica) checks its own on a live `/metrics`, and the
/// plain proxy checks the rest (`tests/it/operators.rs`).
pub fn dashboard_series() -> std::collections::BTreeMap<&'static str, std::collections::BTreeSet<String>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let dashboard = std::fs::read_to_string(root.join("grafana/pgtenant-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    let rules = std::fs::read_to_string(root.join("prometheus/pgtenant-alerts.yml")).unwrap();
    exprs.extend(rules.lines().filter_map(|l| l.trim().strip_prefix("expr:")).map(str::to_string));
    let mut by_area: std::collections::BTreeMap<&'static str, std::collections::BTreeSet<String>> =
        Default::default();
    for expr in &exprs {
        for (at, _) in expr.match_indices("pgtenant_") {
            let name: String = expr[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            by_area.entry(series_area(&name)).or_default().insert(name);
        }
    }
    by_area
}

/// Which test brings a series to life: "moves", "fleet", "catalog", "replica" or "proxy".
fn series_area(name: &str) -> &'static str {
    if name.starts_with("pgtenant_move_") {
        "moves"
    } else if name.starts_with("pgtenant_fleet_") {
        "fleet"
    } else if name.starts_with("pgtenant_catalog_") {
        "catalog"
    } else if name.starts_with("pgtenant_replica_lag_") && !name.contains("_bound_") {
        "replica"
    } else {
        "proxy"
    }
}

fn collect_exprs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// The series of `area` the dashboard or rules read that `metrics` (a live scrape) lacks.
pub fn dashboard_series_missing(area: &str, metrics: &str) -> Vec<String> {
    let series = dashboard_series().remove(area).unwrap_or_default();
    assert!(!series.is_empty(), "the dashboard reads series of {area}");
    series
        .into_iter()
        .filter(|name| {
            !metrics.lines().any(|l| {
                l.strip_prefix(name.as_str())
                    .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            })
        })
        .collect()
}

// `pgtenant dev` as a user runs it (tests/it/cli.rs, the README's tour in docs.rs).

/// The first of `n` consecutive free ports, all taken from `free_port`, so that no
/// other test of this process is handed one of them later.
pub fn free_port_run(n: u16) -> u16 {
    loop {
        let first = clusters::free_port();
        if (1..n).all(|i| clusters::free_port() == first.wrapping_add(i)) {
            return first;
        }
    }
}

/// The clusters `pgtenant dev` starts by default, on consecutive ports from
/// `--shard-port`: 2 shards, the catalog, a replica of each shard.
pub const DEV_CLUSTERS: u16 = 5;

pub async fn wait_serving(port: u16, started: std::time::Instant) -> std::time::Duration {
    let conninfo = format!(
        "host=127.0.0.1 port={port} user=app password=app dbname=app options='-c pgtenant.tenant_id=42'"
    );
    loop {
        if let Ok(c) = connect(&conninfo).await
            && let Ok(row) = c.query_one("SELECT shard_id FROM pgtenant_shard", &[]).await
        {
            assert_eq!(row.get::<_, i32>(0), 2, "tenant 42 is mapped to shard 2");
            return started.elapsed();
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(120),
            "pgtenant dev did not start serving"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A `pgtenant dev` child process, stopped (SIGTERM) when dropped, so that a test
/// that fails midway leaves no proxy and clusters running.
pub struct DevProcess(pub std::process::Child);

impl Drop for DevProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
            let _ = self.0.wait();
        }
    }
}

pub fn stop_dev(child: &mut std::process::Child) {
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "pgtenant dev exits cleanly on SIGTERM: {status}");
}

/// A private primary with a streaming replica (shard 1), `sql` run on the primary's
/// `app` database as its superuser first (a table the test writes, its grants); that
/// superuser connection is handed back too.
pub async fn pair_with(
    name: &'static str,
    sql: &str,
) -> (pgtenant::dev::cluster::Cluster, pgtenant::dev::cluster::Cluster, tokio_postgres::Client) {
    let (primary, replica) =
        tokio::task::spawn_blocking(move || private_cluster_with_replica(name, 1)).await.unwrap();
    let admin =
        connect(&format!("host=127.0.0.1 port={} user=postgres dbname=app", primary.port)).await.unwrap();
    admin.batch_execute(sql).await.unwrap();
    (primary, replica, admin)
}

/// A console row: column name -> value as text.
pub type ConsoleRow = std::collections::HashMap<String, String>;

/// Every row of a console view as column name -> text.
pub async fn console_rows(console: &tokio_postgres::Client, view: &str) -> Vec<ConsoleRow> {
    console
        .simple_query(view)
        .await
        .unwrap_or_else(|e| panic!("{view}: {e:?}"))
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some(
                row.columns()
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (c.name().to_string(), row.get(i).unwrap_or_default().to_string()))
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}
