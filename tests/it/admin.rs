//! The admin console and the HTTP endpoints (issue 24): SHOW commands through psql
//! (simple protocol) and tokio-postgres (extended protocol, binary results) return
//! typed rows that match what the test did; a non-admin is refused; `/metrics` parses
//! as Prometheus text and moves with traffic; a real PgBouncer exporter (PyPI's
//! prometheus-pgbouncer-exporter) scrapes the console and reports it up.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::clusters::free_port;
use crate::harness::{self, Proxy, connect, eventually, http_get, sqlstate, start_proxy, stdout};

async fn start() -> Proxy {
    start_proxy(|c| c.observe.listen = Some("127.0.0.1:0".parse().unwrap())).await
}

#[tokio::test(flavor = "multi_thread")]
async fn show_commands_answer_typed_rows_that_match_the_traffic() {
    let proxy = start().await;
    // Three application clients: two of tenant 7 (shard 1), one of tenant 1001 (shard 2).
    let a = proxy.connect(Some(7)).await;
    let b = proxy.connect(Some(7)).await;
    let c = proxy.connect(Some(1001)).await;
    for client in [&a, &b, &c] {
        client.simple_query("SELECT 1").await.unwrap();
    }
    for _ in 0..10 {
        a.query_one("SELECT $1::int8", &[&1i64]).await.unwrap();
    }

    let admin = connect(&proxy.admin_conninfo()).await.expect("an admin reaches the console");
    // Extended protocol, binary results: typed columns.
    let clients = admin.query("SHOW CLIENTS", &[]).await.unwrap();
    let apps: Vec<_> = clients.iter().filter(|r| r.get::<_, String>("database") == "app").collect();
    assert_eq!(apps.len(), 3, "three application clients");
    let tenant_7: Vec<_> =
        apps.iter().filter(|r| r.get::<_, Option<String>>("tenant").as_deref() == Some("7")).collect();
    assert_eq!(tenant_7.len(), 2);
    assert!(apps.iter().all(|r| r.get::<_, i64>("port") > 0 && r.get::<_, String>("user") == "app"));
    assert!(apps.iter().all(|r| r.get::<_, String>("state") == "idle"), "between transactions");
    let consoles = clients.iter().filter(|r| r.get::<_, String>("database") == "pgtenant").count();
    assert_eq!(consoles, 1, "the console client lists itself");

    let stats = admin.query("SHOW STATS", &[]).await.unwrap();
    let app = stats.iter().find(|r| r.get::<_, String>("database") == "app").expect("a row for app");
    assert!(app.get::<_, i64>("total_query_count") >= 13, "13 requests at least");
    assert!(app.get::<_, i64>("total_xact_count") >= 13);
    assert!(app.get::<_, i64>("total_received") > 0 && app.get::<_, i64>("total_sent") > 0);
    assert!(app.get::<_, i64>("total_query_time") > 0);

    let tenant = admin.query_one("SHOW TENANT 1001", &[]).await.unwrap();
    assert_eq!(tenant.get::<_, i64>("shard"), 2);
    assert_eq!(tenant.get::<_, String>("source"), "range [1001,2000]");
    assert!(tenant.get::<_, bool>("placed"));
    assert_eq!(tenant.get::<_, i64>("clients"), 1);
    let mapped = admin.query_one("SHOW TENANT 42", &[]).await.unwrap();
    assert_eq!((mapped.get::<_, i64>("shard"), mapped.get::<_, String>("source")), (2, "map".to_string()));
    let unplaced = admin.query_one("SHOW TENANT 999999", &[]).await.unwrap();
    assert!(!unplaced.get::<_, bool>("placed"));
    assert!(unplaced.get::<_, String>("error").contains("not placed"));

    let shards = admin.query("SHOW SHARDS", &[]).await.unwrap();
    assert_eq!(shards.iter().map(|r| r.get::<_, i64>("shard")).collect::<Vec<_>>(), vec![1, 2]);
    assert!(shards.iter().all(|r| r.get::<_, String>("status") == "active"));
    let nodes = admin.query("SHOW NODES", &[]).await.unwrap();
    assert_eq!(nodes.len(), 2);
    assert!(nodes.iter().all(|r| r.get::<_, String>("serves") == "writes"));

    let pools = admin.query("SHOW POOLS", &[]).await.unwrap();
    let app_pool = pools.iter().find(|r| r.get::<_, String>("database") == "app").expect("the app pool");
    assert_eq!(app_pool.get::<_, i64>("cl_idle"), 3);
    assert!(app_pool.get::<_, i64>("sv_idle") >= 2, "a connection per shard at least");
    assert_eq!(app_pool.get::<_, String>("pool_mode"), "transaction");

    let config = admin.query("SHOW CONFIG", &[]).await.unwrap();
    let max_client_conn = config.iter().find(|r| r.get::<_, String>("key") == "max_client_conn").unwrap();
    assert_eq!(max_client_conn.get::<_, String>("value"), proxy.config.proxy.max_clients.to_string());
    assert!(!config.iter().any(|r| r.get::<_, String>("key").contains("password")), "no secrets");
    let version: String = admin.query_one("SHOW VERSION", &[]).await.unwrap().get(0);
    assert!(version.starts_with("pgtenant ") && version.contains("PgBouncer 1."), "{version}");

    // Simple protocol through psql, an unknown command and a not-yet command.
    let out = Command::new("psql")
        .args(["-X", "-A", "-t", "-d", &proxy.admin_conninfo(), "-c", "SHOW LISTS", "-c", "show databases;"])
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(text.contains("used_clients|5"), "three applications, this console and psql's: {text}");
    assert!(text.contains("pgtenant||"), "the console's own database row: {text}");
    let e = admin.simple_query("SHOW NOTHING").await.unwrap_err();
    assert_eq!(sqlstate(&e), "42704");
    let e = admin.simple_query("SET x = 1").await.unwrap_err();
    assert_eq!(sqlstate(&e), "0A000");
    let e = admin.simple_query("RELOAD").await.unwrap_err();
    assert_eq!(sqlstate(&e), "F0000", "not started from a file: nothing to read again");
    admin.simple_query("PAUSE").await.expect("nothing runs: paused at once");
    admin.simple_query("RESUME").await.unwrap();
    assert_eq!(
        admin.query("SHOW LANES", &[]).await.unwrap().len(),
        pools_on_app(&admin).await,
        "a row per pool"
    );
    proxy.shutdown().await;
}

async fn pools_on_app(admin: &tokio_postgres::Client) -> usize {
    admin.query("SHOW DATABASES", &[]).await.unwrap().len() - 1
}

#[tokio::test(flavor = "multi_thread")]
async fn only_admin_users_reach_the_console() {
    let proxy = start().await;
    let conninfo = format!("host=127.0.0.1 port={} user=app password=app dbname=pgtenant", proxy.addr.port());
    let e = connect(&conninfo).await.unwrap_err();
    assert_eq!(sqlstate(&e), "42501");
    let wrong = proxy.admin_conninfo().replace("password=admin", "password=nope");
    assert_eq!(sqlstate(&connect(&wrong).await.unwrap_err()), "28P01");
    // PgBouncer's name for the console works too.
    let alias =
        connect(&proxy.admin_conninfo().replace("dbname=pgtenant", "dbname=pgbouncer")).await.unwrap();
    let rows = alias.simple_query("SHOW VERSION").await.unwrap();
    let rows = rows.iter().filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_))).count();
    assert_eq!(rows, 1);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_parse_as_prometheus_text_and_move_with_traffic() {
    let proxy = start().await;
    let http = proxy.http_addr().expect("the HTTP port is on");
    assert_eq!(http_get(http, "/healthz").await.0, 200);
    let ready =
        eventually(Duration::from_secs(5), || async { http_get(http, "/readyz").await.0 == 200 }).await;
    assert!(ready.is_some(), "ready once the shards' primaries are checked");
    assert_eq!(http_get(http, "/nothing").await.0, 404);
    let client = proxy.connect(Some(7)).await;
    client.simple_query("SELECT 1").await.unwrap();
    let before = queries_on_shard_1(&http_get(http, "/metrics").await.1);
    for _ in 0..5 {
        client.simple_query("SELECT 1").await.unwrap();
    }
    let (status, body) = http_get(http, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(queries_on_shard_1(&body) - before, 5.0, "five more queries on shard 1");
    // Errors by class and raiser: a server's 22012, pgtenant's own 42501.
    let errors = |body: &str, labels: &str| metric(body, &format!("pgtenant_errors_total{{{labels}}}"));
    let (server_22, proxy_42) = (
        errors(&body, "raised_by=\"server\",class=\"22\""),
        errors(&body, "raised_by=\"pgtenant\",class=\"42\""),
    );
    assert!(client.simple_query("SELECT 1/0").await.is_err());
    assert!(client.simple_query("SELECT * FROM accounts WHERE tenant_id = 8").await.is_err());
    let body = http_get(http, "/metrics").await.1;
    // Counted process-wide: other tests' errors may add to them.
    assert!(errors(&body, "raised_by=\"server\",class=\"22\"") - server_22 >= 1.0, "{body}");
    assert!(errors(&body, "raised_by=\"pgtenant\",class=\"42\"") - proxy_42 >= 1.0);
    assert!(metric(&body, "pgtenant_routes_total{source=\"session\"}") >= 7.0);
    assert!(body.contains("pgtenant_request_seconds_bucket{"), "the request-time histogram");
    assert!(
        metric(&body, "pgtenant_parse_cache_hits_total") + metric(&body, "pgtenant_parse_cache_misses_total")
            > 0.0
    );
    let minted = metric(&body, "pgtenant_snowflake_ids_minted_total");
    client.query_one("SELECT pgtenant.next_id()", &[]).await.unwrap();
    let body = http_get(http, "/metrics").await.1;
    assert_eq!(metric(&body, "pgtenant_snowflake_ids_minted_total") - minted, 1.0, "one ID minted");
    // A real Prometheus text parser reads all of it.
    let parsed = python(
        "import sys\nfrom prometheus_client.parser import text_string_to_metric_families as p\n\
         names = {f.name for f in p(sys.stdin.read())}\nprint(len(names))\n\
         assert 'pgtenant_checkout_wait_seconds' in names, names\nassert 'pgtenant_node_up' in names",
        &body,
    );
    assert!(parsed.trim().parse::<u32>().unwrap_or(0) > 10, "{parsed}");
    proxy.shutdown().await;
}

/// The value of the series written exactly `series` (0 when absent).
fn metric(body: &str, series: &str) -> f64 {
    body.lines().find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok()).unwrap_or(0.0)
}

/// `pgtenant_queries_total` summed over shard 1's series.
fn queries_on_shard_1(body: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with("pgtenant_queries_total{") && l.contains("shard=\"1\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn python(script: &str, stdin: &str) -> String {
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child.stdin.take().unwrap().write_all_sync(stdin.as_bytes());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

trait WriteAllSync {
    fn write_all_sync(self, bytes: &[u8]);
}

impl WriteAllSync for std::process::ChildStdin {
    fn write_all_sync(mut self, bytes: &[u8]) {
        use std::io::Write;
        self.write_all(bytes).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pgbouncer_exporter_scrapes_the_console() {
    let proxy = start().await;
    let client = proxy.connect(Some(7)).await;
    client.simple_query("SELECT 1").await.unwrap();
    let port = free_port();
    let dir = tempdir();
    let config = dir.join("exporter.yml");
    std::fs::write(
        &config,
        format!(
            "exporter_host: 127.0.0.1\nexporter_port: {port}\npgbouncers:\n  - dsn: postgresql://admin:admin@127.0.0.1:{}/pgtenant\n",
            proxy.addr.port()
        ),
    )
    .unwrap();
    let mut exporter = Command::new("pgbouncer-exporter")
        .args(["--config", config.to_str().unwrap(), "--log-level", "ERROR"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("pgbouncer-exporter (PyPI prometheus-pgbouncer-exporter)");
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let scraped = eventually(Duration::from_secs(20), || async move {
        tokio::net::TcpStream::connect(addr).await.is_ok()
            && http_get(addr, "/metrics").await.1.contains("pgbouncer_up")
    })
    .await;
    let body = if scraped.is_some() { http_get(addr, "/metrics").await.1 } else { String::new() };
    let _ = exporter.kill();
    let _ = exporter.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(scraped.is_some(), "the exporter serves its metrics");
    assert!(body.lines().any(|l| l.starts_with("pgbouncer_up") && l.ends_with(" 1.0")), "up: {body}");
    let line = |prefix: &str| body.lines().find(|l| l.starts_with(prefix)).map(str::to_string);
    let idle = line("pgbouncer_pools_client_active_connections{database=\"pgtenant\"");
    assert!(idle.is_some(), "the console's own pool row: {body}");
    let queries = line("pgbouncer_stats_queries_total{database=\"app\"}").expect("app's query count");
    assert!(queries.rsplit(' ').next().unwrap().parse::<f64>().unwrap() >= 1.0, "{queries}");
    assert!(body.contains("pgbouncer_config_max_client_conn"), "{body}");
    proxy.shutdown().await;
}

fn tempdir() -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("pgtenant-exporter-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_waits_for_running_transactions_and_holds_only_its_scope() {
    let proxy = start().await;
    let console = connect(&proxy.admin_conninfo()).await.unwrap();
    let running = proxy.connect(Some(7)).await;
    running.batch_execute("BEGIN; SELECT 1").await.unwrap();

    // PAUSE TENANT 7 waits for tenant 7's open transaction.
    let pausing = {
        let conninfo = proxy.admin_conninfo();
        tokio::spawn(async move {
            let c = connect(&conninfo).await.unwrap();
            c.simple_query("PAUSE TENANT 7").await.map(|_| ()).map_err(|e| sqlstate(&e))
        })
    };
    let paused = eventually(Duration::from_secs(10), || async {
        !console.query("SHOW PAUSES", &[]).await.unwrap().is_empty()
    })
    .await;
    assert!(paused.is_some(), "the PAUSE is in force");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!pausing.is_finished(), "the PAUSE waits while tenant 7's transaction runs");
    let other = proxy.connect(Some(1001)).await;
    other.simple_query("SELECT 1").await.expect("another tenant is not held");
    let same_shard = proxy.connect(Some(8)).await;
    same_shard.simple_query("SELECT 1").await.expect("tenant 8, on tenant 7's shard, is not held");
    running.batch_execute("COMMIT").await.unwrap();
    assert_eq!(pausing.await.unwrap(), Ok(()), "answered once drained");

    // New work of tenant 7 is held, listed as paused, and runs once resumed.
    let held = {
        let conninfo = proxy.conninfo("options='-c pgtenant.tenant_id=7'");
        tokio::spawn(async move {
            let c = connect(&conninfo).await.unwrap();
            c.query_one("SELECT 41 + 1", &[]).await.map(|r| r.get::<_, i32>(0)).map_err(|e| sqlstate(&e))
        })
    };
    let listed = eventually(Duration::from_secs(5), || async {
        console
            .query("SHOW CLIENTS", &[])
            .await
            .unwrap()
            .iter()
            .any(|r| r.get::<_, String>("state") == "paused")
    })
    .await;
    assert!(listed.is_some(), "the held client shows as paused");
    assert!(!held.is_finished());
    let pauses = console.query("SHOW PAUSES", &[]).await.unwrap();
    assert_eq!(
        pauses.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>(),
        vec!["tenant 7".to_string()]
    );
    console.simple_query("RESUME TENANT 7").await.unwrap();
    assert_eq!(held.await.unwrap(), Ok(42), "runs once resumed");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pause_that_times_out_or_meets_a_resume_lifts_itself() {
    let proxy = start().await;
    let console = connect(&proxy.admin_conninfo()).await.unwrap();
    let running = proxy.connect(Some(7)).await;
    running.batch_execute("BEGIN; SELECT 1").await.unwrap();
    let started = std::time::Instant::now();
    let e = console.simple_query("PAUSE 1 TIMEOUT 0.3").await.unwrap_err();
    assert_eq!(sqlstate(&e), "57014");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(console.query("SHOW PAUSES", &[]).await.unwrap().is_empty(), "lifted by its timeout");
    proxy.connect(Some(8)).await.simple_query("SELECT 1").await.expect("shard 1 takes work again");

    // A RESUME while a PAUSE waits ends the PAUSE: nothing stays held.
    let pausing = {
        let conninfo = proxy.admin_conninfo();
        tokio::spawn(async move {
            let c = connect(&conninfo).await.unwrap();
            c.simple_query("PAUSE").await.map(|_| ()).map_err(|e| sqlstate(&e))
        })
    };
    // Once the PAUSE is in force (its connection and login may take a while).
    let paused = eventually(Duration::from_secs(10), || async {
        !console.query("SHOW PAUSES", &[]).await.unwrap().is_empty()
    })
    .await;
    assert!(paused.is_some());
    console.simple_query("RESUME").await.unwrap();
    assert_eq!(pausing.await.unwrap(), Err("57014".into()));
    running.batch_execute("COMMIT").await.unwrap();
    proxy.connect(Some(1001)).await.simple_query("SELECT 1").await.expect("nothing held");
    let e = console.simple_query("PAUSE 99").await.unwrap_err();
    assert_eq!(sqlstate(&e), "42704", "no such shard");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_reconnect_and_shutdown_act_on_the_proxy() {
    let proxy = start().await;
    let console = connect(&proxy.admin_conninfo()).await.unwrap();
    let victim = proxy.connect(Some(7)).await;
    victim.batch_execute("BEGIN; SELECT 1").await.unwrap();
    let first_bystander = proxy.connect(Some(8)).await;
    first_bystander.simple_query("SELECT 1").await.unwrap();
    let id: i64 = console
        .query("SHOW CLIENTS", &[])
        .await
        .unwrap()
        .iter()
        .find(|r| r.get::<_, String>("state") == "active" && r.get::<_, String>("database") == "app")
        .map(|r| r.get("id"))
        .expect("the client in a transaction");
    console.simple_query(&format!("KILL CLIENT {id}")).await.unwrap();
    let e = victim.simple_query("SELECT 1").await.unwrap_err();
    assert!(victim.is_closed() || sqlstate(&e) == "57P01", "{e}");
    assert!(first_bystander.simple_query("SELECT 1").await.is_ok(), "the others go on");
    let e = console.simple_query("KILL CLIENT 999999").await.unwrap_err();
    assert_eq!(sqlstate(&e), "42704");

    // KILL of a database ends each of its clients.
    let other = proxy.connect(Some(9)).await;
    console.simple_query("KILL app").await.unwrap();
    let ended =
        eventually(Duration::from_secs(5), || async { other.simple_query("SELECT 1").await.is_err() }).await;
    assert!(ended.is_some(), "KILL app ended app's clients");
    let bystander = proxy.connect(Some(8)).await;
    bystander.simple_query("SELECT 1").await.expect("new clients are taken");

    // RECONNECT: the idle server connections are replaced (new backend pids).
    let pid_before: i32 = harness::server_pid(&bystander).await;
    console.simple_query("RECONNECT 1").await.unwrap();
    let pid_after: i32 = harness::server_pid(&bystander).await;
    assert_ne!(pid_before, pid_after, "a new server connection after RECONNECT");

    // SHUTDOWN stops the proxy as SIGTERM would: new connections are refused.
    console.simple_query("SHUTDOWN").await.unwrap();
    let refused =
        eventually(Duration::from_secs(10), || async { proxy.try_connect(Some(7)).await.is_err() }).await;
    assert!(refused.is_some(), "no longer accepting");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_client_sends_none_of_the_requests_it_queued() {
    let proxy = start().await;
    let shard = crate::harness::shard_admin(1, "app").await;
    shard
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS kill_queued (tenant_id bigint, note text);
             GRANT ALL ON kill_queued TO app; DELETE FROM kill_queued",
        )
        .await
        .unwrap();
    let console = connect(&proxy.admin_conninfo()).await.unwrap();
    // No session tenant: the INSERT (tenant 7's) waits for the answer ahead of it
    // before pgtenant routes it.
    let mut victim = crate::harness::raw::RawClient::login(proxy.addr, &[]).await;
    let mut pipelined = bytes::BytesMut::new();
    postgres_protocol::message::frontend::query("SELECT pg_sleep(1)", &mut pipelined).unwrap();
    postgres_protocol::message::frontend::query(
        "INSERT INTO kill_queued (tenant_id, note) VALUES (7, 'sent after the KILL')",
        &mut pipelined,
    )
    .unwrap();
    victim.send(&pipelined).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let id: i64 = console
        .query("SHOW CLIENTS", &[])
        .await
        .unwrap()
        .iter()
        .find(|r| r.get::<_, String>("database") == "app")
        .map(|r| r.get("id"))
        .expect("the victim is listed");
    console.simple_query(&format!("KILL CLIENT {id}")).await.unwrap();
    let mut seen = Vec::new();
    while let Some(m) = victim.recv().await {
        seen.push(m);
    }
    assert_eq!(crate::harness::raw::sqlstate(&seen).as_deref(), Some("57P01"), "ended by the KILL");
    // The sleep ends on the server; the INSERT must never reach it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let rows: i64 = shard.query_one("SELECT count(*) FROM kill_queued", &[]).await.unwrap().get(0);
    assert_eq!(rows, 0, "the request queued behind the KILL was not sent");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn readiness_follows_the_catalog() {
    let cluster =
        tokio::task::spawn_blocking(|| crate::harness::private_cluster("ready_catalog", 9)).await.unwrap();
    let catalog = crate::harness::demo_catalog_on(cluster.port, "catalog_ready").await;
    let proxy = crate::harness::start_catalog_proxy(catalog, |c| {
        c.observe.listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let http = proxy.http_addr().unwrap();
    let ready =
        eventually(Duration::from_secs(10), || async { http_get(http, "/readyz").await.0 == 200 }).await;
    assert!(ready.is_some(), "ready with the catalog up");
    let body = http_get(http, "/metrics").await.1;
    assert!(!body.contains("pgtenant_catalog_change_lag_seconds "), "no change yet, no lag");
    // A routing change reaches the proxy, which reports how long it took to arrive.
    let catalog_admin =
        connect(&format!("host=127.0.0.1 port={} user=postgres dbname=catalog_ready", cluster.port))
            .await
            .unwrap();
    catalog_admin
        .batch_execute("UPDATE pgtenant.tenant_shard_map SET shard_id = 1 WHERE tenant_id = 42")
        .await
        .unwrap();
    let console = connect(&proxy.admin_conninfo()).await.unwrap();
    let moved = eventually(Duration::from_secs(5), || async {
        console.query_one("SHOW TENANT 42", &[]).await.unwrap().get::<_, i64>("shard") == 1
    })
    .await;
    assert!(moved.is_some(), "the change is applied");
    let body = http_get(http, "/metrics").await.1;
    assert!(body.contains("pgtenant_catalog_change_lag_seconds "), "exported once a change came");
    let lag = metric(&body, "pgtenant_catalog_change_lag_seconds");
    assert!((0.0..5.0).contains(&lag), "lag {lag} s");
    let routing = console.query_one("SHOW ROUTING", &[]).await.unwrap();
    assert_eq!(
        routing.get::<_, String>("source"),
        format!("catalog 127.0.0.1:{}/catalog_ready", cluster.port),
        "the catalog's database named once"
    );
    let missing = harness::dashboard_series_missing("catalog", &body);
    assert!(missing.is_empty(), "catalog series the dashboard or rules use, not on /metrics: {missing:?}");

    let stopped = cluster.clone();
    tokio::task::spawn_blocking(move || stopped.stop()).await.unwrap().unwrap();
    let not_ready =
        eventually(Duration::from_secs(10), || async { http_get(http, "/readyz").await.0 == 503 }).await;
    assert!(not_ready.is_some(), "not ready once the catalog is gone");
    let reasons = http_get(http, "/readyz").await.1;
    assert!(reasons.contains("catalog"), "{reasons}");
    assert_eq!(http_get(http, "/healthz").await.0, 200, "alive all the same");

    let started = cluster.clone();
    tokio::task::spawn_blocking(move || started.start()).await.unwrap().unwrap();
    let back =
        eventually(Duration::from_secs(20), || async { http_get(http, "/readyz").await.0 == 200 }).await;
    assert!(back.is_some(), "ready again once the catalog is back");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reload_applies_a_good_file_and_keeps_serving_on_a_bad_one() {
    let (proxy, file) = crate::harness::start_proxy_from_file("reload", |_| {}).await;
    let console = connect(&proxy.admin_conninfo()).await.unwrap();
    let shard_of_42 = |proxy: &Proxy| {
        let conninfo = proxy.conninfo("options='-c pgtenant.tenant_id=42'");
        async move {
            let c = connect(&conninfo).await.unwrap();
            c.query_one("SELECT shard_id FROM pgtenant_shard", &[]).await.unwrap().get::<_, i32>(0)
        }
    };
    assert_eq!(shard_of_42(&proxy).await, 2, "mapped to shard 2 at start");
    console.simple_query("RELOAD").await.expect("the same file reloads");

    // A broken file: refused with its problems, the proxy goes on as it was.
    let good = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, good.replace("shard = 2", "shard = 9")).unwrap();
    let e = console.simple_query("RELOAD").await.unwrap_err();
    assert_eq!(sqlstate(&e), "F0000");
    let message = e.as_db_error().unwrap().message().to_string();
    assert!(message.contains("shard 9"), "{message}");
    assert_eq!(shard_of_42(&proxy).await, 2, "still served by the running configuration");

    // A setting fixed for the process: refused, named.
    let mut config = proxy.config.clone();
    config.proxy.max_clients += 1;
    std::fs::write(&file, toml::to_string_pretty(&config).unwrap()).unwrap();
    let e = console.simple_query("RELOAD").await.unwrap_err();
    assert!(e.as_db_error().unwrap().message().contains("proxy.max_clients"), "{e}");

    // Live changes: a new login, tenant 42 moved to shard 1.
    let mut config = proxy.config.clone();
    let mut newbie = config.users[0].clone();
    newbie.name = "newbie".into();
    newbie.password = Some("fresh".into());
    newbie.server_user = Some("app".into());
    newbie.server_password = Some("app".into());
    config.users.push(newbie);
    config.tenant_map.iter_mut().for_each(|m| m.shard = 1);
    config.users[0].pool_size = 3;
    std::fs::write(&file, toml::to_string_pretty(&config).unwrap()).unwrap();
    let connected_before = proxy.connect(Some(7)).await;
    connected_before.simple_query("SELECT 1").await.unwrap();
    let before: i64 = console.query_one("SHOW ROUTING", &[]).await.unwrap().get("routing_version");
    console.simple_query("RELOAD").await.expect("a good file applies");
    let after: i64 = console.query_one("SHOW ROUTING", &[]).await.unwrap().get("routing_version");
    assert!(after > before, "a new routing version");
    assert_eq!(shard_of_42(&proxy).await, 1, "tenant 42 follows the new map");
    let conninfo = format!(
        "host=127.0.0.1 port={} user=newbie password=fresh dbname=app options='-c pgtenant.tenant_id=7'",
        proxy.addr.port()
    );
    let newbie = connect(&conninfo).await.expect("the new login works");
    newbie.simple_query("SELECT 1").await.unwrap();
    // app's pools now have 3 connections; a session connected before follows them.
    connected_before.simple_query("SELECT 1").await.expect("a session from before goes on");
    let pools = console.query("SHOW POOLS", &[]).await.unwrap();
    let app = pools
        .iter()
        .find(|r| r.get::<_, String>("user") == "app" && r.get::<_, String>("database") == "app")
        .unwrap();
    let size = app.get::<_, i64>("sv_size");
    assert!(size > 0 && size % 3 == 0, "pools of 3 per node: {size}");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_wait_for_clients_stops_accepting_and_lets_clients_finish() {
    let proxy = start().await;
    let console = connect(&proxy.admin_conninfo()).await.unwrap();
    let staying = proxy.connect(Some(7)).await;
    console.simple_query("SHUTDOWN WAIT_FOR_CLIENTS").await.unwrap();
    let refused =
        eventually(Duration::from_secs(10), || async { proxy.try_connect(Some(7)).await.is_err() }).await;
    assert!(refused.is_some(), "no longer accepting");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rows = staying.simple_query("SELECT 1").await.expect("a connected client is not ended");
    assert_eq!(rows.iter().filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_))).count(), 1);
    assert!(console.simple_query("SHOW VERSION").await.is_ok(), "nor is the console");
    proxy.shutdown().await;
}
