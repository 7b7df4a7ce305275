//! What operators see (issue 51): `/metrics` passes `promtool check metrics` (HELP on
//! every family, base units), scatter-gather outcomes are counted with the right
//! raiser, and the shipped dashboard and alert rules read only series a live proxy
//! exports (`promtool check rules` passes on the rules).

use std::process::{Command, Stdio};

use crate::harness::{Proxy, console_rows, http_get, sqlstate, start_proxy};
use pgtenant::dev::demo;

use crate::harness::ConsoleRow as Row;

async fn start() -> Proxy {
    start_proxy(|c| c.observe.listen = Some("127.0.0.1:0".parse().unwrap())).await
}

async fn scrape(proxy: &Proxy) -> String {
    let (status, body) = http_get(proxy.http_addr().expect("HTTP port"), "/metrics").await;
    assert_eq!(status, 200);
    body
}

/// Runs `promtool` with `args`, `stdin` on its standard input: (success, its output).
fn promtool(args: &[&str], stdin: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; .ci/run installs it)");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// Traffic that makes every family of a proxy without moves appear: tenant requests, a
/// server's error and pgtenant's own, a snowflake ID, and scatter-gather statements that
/// are answered, refused and failed by PostgreSQL.
async fn traffic(proxy: &Proxy) {
    let client = proxy.connect(Some(7)).await;
    client.simple_query("SELECT 1").await.unwrap();
    assert!(client.simple_query("SELECT 1/0").await.is_err());
    client.query_one("SELECT pgtenant.next_id()", &[]).await.unwrap();
    let admin = crate::harness::connect(&format!(
        "host=127.0.0.1 port={} user={} password={} dbname=app sslmode=disable",
        proxy.addr.port(),
        demo::ADMIN_USER,
        demo::ADMIN_PASSWORD
    ))
    .await
    .unwrap();
    admin.simple_query("SELECT count(*) FROM all_shards.pgtenant_shard").await.unwrap();
    let refused = admin
        .simple_query("SELECT shard_id, count(*) FROM all_shards.pgtenant_shard GROUP BY ROLLUP (shard_id)")
        .await;
    assert_eq!(sqlstate(&refused.unwrap_err()), "0A000");
    let failed = admin.query("SELECT nope FROM all_shards.pgtenant_shard", &[]).await;
    assert_eq!(sqlstate(&failed.unwrap_err()), "42703");
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_pass_promtool_and_count_scatter_outcomes_by_raiser() {
    let proxy = start().await;
    traffic(&proxy).await;
    let body = scrape(&proxy).await;
    let (ok, lint) = promtool(&["check", "metrics"], &body);
    assert!(ok && lint.trim().is_empty(), "promtool check metrics:\n{lint}");
    for family in [
        "pgtenant_query_time_seconds_total",
        "pgtenant_transaction_time_seconds_total",
        "pgtenant_scatter_time_seconds_total",
        "pgtenant_scatter_shard_time_seconds_total",
    ] {
        assert!(body.contains(&format!("# TYPE {family} counter")), "{family} in seconds");
    }
    assert!(!body.contains("microseconds"), "no time in microseconds");
    assert!(
        !body.contains("pgtenant_checkout_wait_microseconds_total"),
        "checkout wait once, as a histogram"
    );
    // Counted process-wide (other tests add to them): at least this test's own.
    let value = |series: &str| {
        body.lines().find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok()).unwrap_or(0.0)
    };
    for outcome in ["answered", "refused", "failed_by_statement"] {
        let n = value(&format!("pgtenant_scatter_statements_total{{outcome=\"{outcome}\"}}"));
        assert!(n >= 1.0, "{outcome}: {n}\n{body}");
    }
    // PostgreSQL raised the scatter statement's 42703, not pgtenant.
    assert!(value("pgtenant_errors_total{raised_by=\"server\",class=\"42\"}") >= 1.0, "{body}");
    // The dashboard and the alert rules read only what is there.
    let missing = crate::harness::dashboard_series_missing("proxy", &body);
    assert!(missing.is_empty(), "series the dashboard or rules use, not on /metrics: {missing:?}");
    proxy.shutdown().await;
}

#[test]
fn the_shipped_alert_rules_pass_promtool_and_every_series_used_has_a_live_check() {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus/pgtenant-alerts.yml");
    let (ok, out) = promtool(&["check", "rules", rules], "");
    assert!(ok && out.contains("SUCCESS"), "promtool check rules:\n{out}");
    // Each area is checked live by the test that brings it about (operators, moves,
    // fleet batches, admin's catalog readiness, replica reads): none is left out.
    let areas: Vec<&str> = crate::harness::dashboard_series().keys().copied().collect();
    assert_eq!(areas, ["catalog", "fleet", "moves", "proxy", "replica"]);
}

/// The console's row of `view` whose `column` is `value`, as text by column name.
async fn console_row(console: &tokio_postgres::Client, view: &str, column: &str, value: &str) -> Option<Row> {
    console_rows(console, view).await.into_iter().find(|r| r.get(column).is_some_and(|v| v == value))
}

#[tokio::test(flavor = "multi_thread")]
async fn show_servers_and_clients_move_with_real_traffic() {
    let proxy = start().await;
    let console = crate::harness::connect(&proxy.admin_conninfo()).await.unwrap();
    let client = proxy.connect(Some(7)).await;
    let statement = client.prepare("SELECT $1::int + 1").await.unwrap();
    client.query_one(&statement, &[&1i32]).await.unwrap();
    let pid: i32 = client.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let me = console_row(&console, "SHOW CLIENTS", "remote_pid", &pid.to_string()).await.expect("listed");
    assert!(me["prepared_statements"].parse::<u32>().unwrap() >= 1, "{me:?}");
    assert_eq!(me["link"], "", "no server between transactions");
    // Its server, between transactions: the tenant it last ran, the statement it holds.
    let servers = shard_1_servers(&console).await;
    assert!(servers.iter().any(|(tenant, _, _, prepared)| tenant == "7" && *prepared >= 1), "{servers:?}");
    let connected = servers.iter().map(|s| s.1.clone()).max().unwrap();
    assert!(connected.ends_with(" UTC") && connected.len() == 23, "PgBouncer's text form: {connected}");
    // A transaction held open: client and server name each other, and the server's
    // request time is this request's, past its connect time once a second has gone by.
    let connected_secs = epoch_secs(&connected);
    let passed = crate::harness::eventually(std::time::Duration::from_secs(3), || async {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() > connected_secs
    })
    .await;
    assert!(passed.is_some());
    client.batch_execute("BEGIN; SELECT 1").await.unwrap();
    let me = console_row(&console, "SHOW CLIENTS", "remote_pid", &pid.to_string()).await.unwrap();
    let server =
        console_row(&console, "SHOW SERVERS", "link", &me["ptr"]).await.expect("its server links to it");
    assert_eq!(me["link"], server["ptr"], "and it to its server");
    assert_eq!((server["tenant"].as_str(), server["state"].as_str()), ("7", "active"));
    assert!(server["request_time"] > server["connect_time"], "{server:?}");
    assert_eq!(server["request_time"], me["request_time"]);
    client.batch_execute("COMMIT").await.unwrap();
    let me = console_row(&console, "SHOW CLIENTS", "remote_pid", &pid.to_string()).await.unwrap();
    assert_eq!(me["link"], "", "given back");
    proxy.shutdown().await;
}

/// SHOW SERVERS' rows on shard 1: tenant, connect time, request time, prepared statements.
async fn shard_1_servers(console: &tokio_postgres::Client) -> Vec<(String, String, String, u32)> {
    let rows = console_rows(console, "SHOW SERVERS").await;
    rows.into_iter()
        .filter(|r| r["shard"] == "1")
        .map(|r| {
            let prepared = r["prepared_statements"].parse().unwrap();
            (r["tenant"].clone(), r["connect_time"].clone(), r["request_time"].clone(), prepared)
        })
        .collect()
}

/// Seconds since the epoch of a console time (`2026-11-28 15:47:03 UTC`).
fn epoch_secs(text: &str) -> u64 {
    let civil = |y: i64, m: i64, d: i64| {
        // Days since 1970-01-01 (Hinnant's days_from_civil).
        let y = if m <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    };
    let n: Vec<i64> =
        text.trim_end_matches(" UTC").split(['-', ' ', ':']).map(|p| p.parse().unwrap()).collect();
    (civil(n[0], n[1], n[2]) * 86_400 + n[3] * 3600 + n[4] * 60 + n[5]) as u64
}

fn admin_app_conninfo(proxy: &Proxy) -> String {
    format!(
        "host=127.0.0.1 port={} user={} password={} dbname=app sslmode=disable",
        proxy.addr.port(),
        demo::ADMIN_USER,
        demo::ADMIN_PASSWORD
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn console_columns_mean_what_pgbouncer_s_mean() {
    let proxy = start().await;
    let console = crate::harness::connect(&proxy.admin_conninfo()).await.unwrap();
    // Before any client: every node of every shard is a database row ("*": any database).
    let databases = console_rows(&console, "SHOW DATABASES").await;
    let nodes = databases.iter().filter(|r| r["name"].starts_with("*@")).count();
    assert_eq!(nodes, 2, "both shards' primaries, though no pool exists yet: {databases:?}");
    // The admin logs in to the server as postgres: its servers are listed under its login.
    let admin = crate::harness::connect(&admin_app_conninfo(&proxy)).await.unwrap();
    let statement = admin.prepare("SELECT $1::int").await.unwrap();
    for i in 0..3 {
        admin.query_one(&statement, &[&i]).await.unwrap();
    }
    let pools: Vec<String> =
        console_rows(&console, "SHOW POOLS").await.iter().map(|r| r["user"].clone()).collect();
    let servers = console_rows(&console, "SHOW SERVERS").await;
    assert!(!servers.is_empty());
    for s in &servers {
        assert!(pools.contains(&s["user"]), "SHOW SERVERS' user {} joins SHOW POOLS' {pools:?}", s["user"]);
        assert_eq!(s["database"], "app", "the database the client asked for");
    }
    // The database rows now name it on both shards.
    let databases = console_rows(&console, "SHOW DATABASES").await;
    assert_eq!(databases.iter().filter(|r| r["name"].starts_with("app@")).count(), 2, "{databases:?}");
    // PgBouncer 1.23's prepared-statement counters move.
    let stats = console_rows(&console, "SHOW STATS").await;
    let app = stats.iter().find(|r| r["database"] == "app").expect("app's row");
    let n = |column: &str| app[column].parse::<i64>().unwrap_or_else(|_| panic!("{column}: {app:?}"));
    assert!(n("total_client_parse_count") >= 1 && n("total_server_parse_count") >= 1, "{app:?}");
    assert!(n("total_bind_count") >= 3 && n("total_server_assignment_count") >= 3, "{app:?}");
    assert!(app.contains_key("avg_server_assignment_count") && app.contains_key("avg_bind_count"));
    let totals = console_rows(&console, "SHOW TOTALS").await;
    let total =
        |name: &str| totals.iter().find(|r| r["name"] == name).map(|r| r["value"].parse::<i64>().unwrap());
    assert!(total("total_xact_count").unwrap() >= n("total_xact_count"), "{totals:?}");
    assert!(total("total_bind_count").unwrap() >= 3);
    // SHOW CONFIG: every key once, every section, no secret.
    let config = console_rows(&console, "SHOW CONFIG").await;
    let keys: Vec<&str> = config.iter().map(|r| r["key"].as_str()).collect();
    let unique: std::collections::BTreeSet<&str> = keys.iter().copied().collect();
    assert_eq!(unique.len(), keys.len(), "a key twice: {keys:?}");
    for key in [
        "pool_mode",
        "snowflake.instance_bits",
        "health.max_replica_lag_ms",
        "moves.database",
        "server_tls.mode",
    ] {
        assert!(unique.contains(key), "{key} in {keys:?}");
    }
    assert!(!keys.iter().any(|k| k.contains("password") || k.contains("context_key")), "{keys:?}");
    // SHOW SHARDS writes ranges as PostgreSQL writes an inclusive range.
    let shards = console_rows(&console, "SHOW SHARDS").await;
    assert_eq!(shards[0]["ranges"], "[1,1000]");
    assert_eq!((shards[0]["status"].as_str(), shards[0]["primary"].is_empty()), ("active", false));
    // SHOW STATE follows a PAUSE of everything.
    let state = |rows: Vec<Row>| {
        rows.iter().map(|r| format!("{}={}", r["key"], r["value"])).collect::<Vec<_>>().join(",")
    };
    assert_eq!(state(console_rows(&console, "SHOW STATE").await), "active=yes,paused=no,suspended=no");
    console.simple_query("PAUSE").await.unwrap();
    assert_eq!(state(console_rows(&console, "SHOW STATE").await), "active=no,paused=yes,suspended=no");
    console.simple_query("RESUME").await.unwrap();
    // Clear errors for what is not a command, and PgBouncer's commands pgtenant has no use for.
    let err = console.simple_query("SHOW").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42601");
    assert!(err.as_db_error().unwrap().message().contains("needs a view name"), "{err:?}");
    let err = console.simple_query("FROB").await.unwrap_err();
    assert!(err.as_db_error().unwrap().message().contains("not an admin console command"), "{err:?}");
    for command in ["SUSPEND", "SHOW MEM", "SHOW FDS", "SHOW SOCKETS", "SHOW ACTIVE_SOCKETS"] {
        let err = console.simple_query(command).await.unwrap_err();
        assert_eq!(sqlstate(&err), "0A000", "{command}");
        assert!(
            err.as_db_error().unwrap().message().contains("no counterpart in pgtenant"),
            "{command}: {err:?}"
        );
    }
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_disable_and_wait_close_work_per_database() {
    let proxy = start().await;
    let console = crate::harness::connect(&proxy.admin_conninfo()).await.unwrap();
    let client = proxy.connect(Some(7)).await;
    // PAUSE app waits for app's running transaction: with a timeout it gives up on it.
    client.batch_execute("BEGIN; SELECT 1").await.unwrap();
    let err = console.simple_query("PAUSE app TIMEOUT 0.2").await.unwrap_err();
    assert_eq!(sqlstate(&err), "57014", "{err:?}");
    // RECONNECT retires the busy server: SHOW SERVERS says it must close, WAIT_CLOSE
    // answers only once its client gave it back.
    console.simple_query("RECONNECT").await.unwrap();
    let marked =
        console_rows(&console, "SHOW SERVERS").await.iter().filter(|r| r["close_needed"] == "1").count();
    assert!(marked >= 1, "the busy server is to be closed");
    let console_conninfo = proxy.admin_conninfo();
    let wait_close = tokio::spawn(async move {
        let c = crate::harness::connect(&console_conninfo).await.unwrap();
        c.simple_query("WAIT_CLOSE app").await.map(|_| ())
    });
    client.batch_execute("COMMIT").await.unwrap();
    let closed = tokio::time::timeout(std::time::Duration::from_secs(10), wait_close).await;
    assert!(matches!(closed, Ok(Ok(Ok(())))), "WAIT_CLOSE answered once it closed: {closed:?}");
    let left =
        console_rows(&console, "SHOW SERVERS").await.iter().filter(|r| r["close_needed"] == "1").count();
    assert_eq!(left, 0);
    // With nothing running, PAUSE app answers; app's next transaction is held until RESUME app.
    console.simple_query("PAUSE app").await.unwrap();
    let held =
        tokio::spawn(async move { client.query_one("SELECT 2", &[]).await.map(|r| r.get::<_, i32>(0)) });
    let paused = crate::harness::eventually(std::time::Duration::from_secs(5), || async {
        crate::harness::client_states(&console).await.contains(&"paused".to_string())
    })
    .await;
    assert!(paused.is_some(), "the client of app is held");
    console.simple_query("RESUME app").await.unwrap();
    assert_eq!(held.await.unwrap().unwrap(), 2, "and runs once resumed");
    // DISABLE app: a new client of app is refused as PostgreSQL refuses a database that
    // does not allow connections; connected ones go on; ENABLE takes them again.
    let connected = proxy.connect(Some(7)).await;
    console.simple_query("DISABLE app").await.unwrap();
    let err = proxy.try_connect(Some(7)).await.unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "{err:?}");
    assert_eq!(connected.query_one("SELECT 3", &[]).await.unwrap().get::<_, i32>(0), 3);
    console.simple_query("ENABLE app").await.unwrap();
    assert!(proxy.try_connect(Some(7)).await.is_ok());
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn show_shards_says_when_a_shard_has_no_primary() {
    let cluster = tokio::task::spawn_blocking(|| crate::harness::private_cluster("operators_no_primary", 2))
        .await
        .unwrap();
    let port = cluster.port;
    let proxy = start_proxy(move |c| c.shards[1].nodes[0].port = port).await;
    let console = crate::harness::connect(&proxy.admin_conninfo()).await.unwrap();
    let shard_2 = |rows: Vec<Row>| {
        let row = rows.into_iter().find(|r| r["shard"] == "2").expect("shard 2");
        (row["status"].clone(), row["pool_use_level"].clone())
    };
    let up = crate::harness::eventually(std::time::Duration::from_secs(10), || async {
        shard_2(console_rows(&console, "SHOW SHARDS").await).0 == "active"
    })
    .await;
    assert!(up.is_some(), "active while its primary is up");
    let stopped = cluster.clone();
    tokio::task::spawn_blocking(move || stopped.stop()).await.unwrap().unwrap();
    let down = crate::harness::eventually(std::time::Duration::from_secs(10), || async {
        shard_2(console_rows(&console, "SHOW SHARDS").await) == ("no_primary".into(), "critical".into())
    })
    .await;
    assert!(down.is_some(), "{:?}", shard_2(console_rows(&console, "SHOW SHARDS").await));
    proxy.shutdown().await;
}
