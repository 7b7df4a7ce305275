//! What operators see (issue 51): `/metrics` passes `promtool check metrics` (HELP on
//! every family, base units), scatter-gather outcomes are counted with the right
//! raiser, and the shipped dashboard and alert rules read only series a live proxy
//! exports (`promtool check rules` passes on the rules).

use std::process::{Command, Stdio};

use crate::harness::{Proxy, http_get, sqlstate, start_proxy};
use pgtenant::dev::demo;

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
    // admin's catalog readiness, replica reads): none is left out.
    let areas: Vec<&str> = crate::harness::dashboard_series().keys().copied().collect();
    assert_eq!(areas, ["catalog", "moves", "proxy", "replica"]);
}

/// The console's row of `view` whose `column` is `value`, as text by column name.
async fn console_row(
    console: &tokio_postgres::Client,
    view: &str,
    column: &str,
    value: &str,
) -> Option<std::collections::HashMap<String, String>> {
    let messages = console.simple_query(view).await.unwrap();
    messages.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) if row.get(column) == Some(value) => Some(
            row.columns()
                .iter()
                .enumerate()
                .map(|(i, c)| (c.name().to_string(), row.get(i).unwrap_or_default().to_string()))
                .collect(),
        ),
        _ => None,
    })
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
    let messages = console.simple_query("SHOW SERVERS").await.unwrap();
    messages
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) if r.get("shard") == Some("1") => Some((
                r.get("tenant").unwrap_or_default().to_string(),
                r.get("connect_time").unwrap_or_default().to_string(),
                r.get("request_time").unwrap_or_default().to_string(),
                r.get("prepared_statements").unwrap_or_default().parse::<u32>().unwrap(),
            )),
            _ => None,
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
