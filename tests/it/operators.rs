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
    proxy.shutdown().await;
}
