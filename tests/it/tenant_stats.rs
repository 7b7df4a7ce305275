//! Per-tenant statistics (issue 53): what each tenant's clients did, as SHOW TENANTS,
//! SHOW TENANT and /metrics report it: exact for the tenants kept, within the stated
//! bound for one that took another's slot, and never more tenants per shard than
//! `tenant_stats_top_k`.

use std::collections::HashMap;

use crate::harness::{ConsoleRow as Row, Proxy, console_rows, http_get, start_proxy};

fn n(row: &Row, column: &str) -> u64 {
    row[column].parse().unwrap_or_else(|_| panic!("{column} = {:?}", row[column]))
}

/// `count` autocommit reads of `tenant` in the extended protocol (lanes may carry them).
async fn reads(proxy: &Proxy, tenant: i64, count: usize) {
    let client = proxy.connect(Some(tenant)).await;
    for _ in 0..count {
        client.query_one("SELECT 1", &[]).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn show_tenants_counts_what_each_tenant_did() {
    let proxy = start_proxy(|c| {
        c.observe.listen = Some("127.0.0.1:0".parse().unwrap());
        c.observe.tenant_stats_top_k = 2;
    })
    .await;
    // Tenant 9 first and light, then 7 heavy, then 8: where the three share a shard, 8
    // takes 9's slot and inherits its count as its error.
    reads(&proxy, 9, 3).await;
    let seven = proxy.connect(Some(7)).await;
    for _ in 0..20 {
        seven.query_one("SELECT 1", &[]).await.unwrap();
    }
    for _ in 0..5 {
        seven.batch_execute("BEGIN; SELECT 1; COMMIT").await.unwrap();
    }
    for _ in 0..5 {
        for sql in ["BEGIN", "SELECT 1", "COMMIT"] {
            seven.batch_execute(sql).await.unwrap();
        }
    }
    assert!(seven.batch_execute("SELECT 1/0").await.is_err());
    reads(&proxy, 8, 10).await;

    let console = crate::harness::connect(&proxy.admin_conninfo()).await.unwrap();
    let rows = console_rows(&console, "SHOW TENANTS").await;
    let row = |t: &str| rows.iter().find(|r| r["tenant"] == t).cloned();
    let seven_row = row("7").expect("the heaviest tenant is kept");
    // 20 reads, each a prepare and an execute (two requests, each a transaction on the
    // server, as PgBouncer counts them too), 5 one-query transactions, 5 three-statement
    // ones (the BEGIN answered by pgtenant: two requests), one that failed.
    assert_eq!(n(&seven_row, "transactions"), 40 + 5 + 5 + 1, "{seven_row:?}");
    assert_eq!(n(&seven_row, "transactions_error"), 0);
    assert_eq!(n(&seven_row, "requests"), 40 + 5 + 10 + 1, "{seven_row:?}");
    assert_eq!(n(&seven_row, "errors"), 1);
    assert!(seven_row["server_time_ms"].parse::<f64>().unwrap() > 0.0);
    assert!(n(&seven_row, "bytes_out") > 0);
    let eight = row("8").expect("8 is kept: heavier than 9");
    let (tx, error) = (n(&eight, "transactions"), n(&eight, "transactions_error"));
    assert!(tx >= 20 && tx - error <= 20, "within its bound: {eight:?}");
    // At most K per shard; the heaviest first.
    let mut per_shard: HashMap<String, usize> = HashMap::new();
    for r in &rows {
        *per_shard.entry(r["shard"].clone()).or_default() += 1;
    }
    assert!(per_shard.values().all(|&k| k <= 2), "{rows:?}");
    assert_eq!(rows[0]["tenant"], "7");
    // ORDER BY and LIMIT, SHARD.
    let by_errors = console_rows(&console, "SHOW TENANTS ORDER BY errors LIMIT 1").await;
    assert_eq!((by_errors.len(), by_errors[0]["tenant"].as_str()), (1, "7"));
    let shard = &seven_row["shard"];
    let on_shard = console_rows(&console, &format!("SHOW TENANTS SHARD {shard}")).await;
    assert!(on_shard.iter().all(|r| &r["shard"] == shard) && on_shard.iter().any(|r| r["tenant"] == "7"));
    let bad = console.simple_query("SHOW TENANTS ORDER BY nonsense").await.unwrap_err();
    assert_eq!(crate::harness::sqlstate(&bad), "42601");
    // SHOW TENANT gains the figures.
    let one = console_rows(&console, "SHOW TENANT 7").await;
    assert_eq!(n(&one[0], "transactions"), 51);
    assert_eq!(n(&one[0], "errors"), 1);
    // /metrics carries the kept tenants only.
    let metrics = http_get(proxy.http_addr().unwrap(), "/metrics").await.1;
    let line = format!("pgtenant_tenant_transactions_total{{shard=\"{shard}\",tenant=\"7\"}} 51");
    assert!(metrics.lines().any(|l| l == line), "{line} not in /metrics");
    let waits = format!("pgtenant_tenant_waits_total{{shard=\"{shard}\",tenant=\"7\"}} 0");
    assert!(metrics.lines().any(|l| l == waits), "{waits} not in /metrics");
    let kept: usize =
        metrics.lines().filter(|l| l.starts_with("pgtenant_tenant_transactions_total{")).count();
    assert_eq!(kept, rows.len());
    proxy.shutdown().await;
}

/// A tenant whose checkout waits for a place in a full pool has the wait counted.
#[tokio::test(flavor = "multi_thread")]
async fn a_checkout_that_waits_is_counted_for_its_tenant() {
    let proxy = start_proxy(|c| c.users[0].pool_size = 1).await;
    let holder = proxy.connect(Some(8)).await;
    // Tenant 8's own first checkout may wait for the connection its client's login had
    // just used; a wait is counted with the transaction it begins, so that one is
    // counted once this one ends. What counts is that 7's wait is not counted for 8.
    holder.batch_execute("SELECT 1").await.unwrap();
    let console = crate::harness::connect(&proxy.admin_conninfo()).await.unwrap();
    let eight_before = console_rows(&console, "SHOW TENANTS").await;
    let eight_before = eight_before.iter().find(|r| r["tenant"] == "8").map_or(0, |r| n(r, "waits"));
    holder.batch_execute("BEGIN; SELECT 1").await.unwrap();
    let waiter = proxy.connect(Some(7)).await;
    let asked = tokio::spawn(async move { waiter.simple_query("SELECT 7").await.map(|_| ()) });
    let waiting = crate::harness::eventually(std::time::Duration::from_secs(10), || async {
        console_rows(&console, "SHOW POOLS").await.iter().any(|r| r["cl_waiting"] != "0")
    });
    assert!(waiting.await.is_some(), "the second client waits for the only connection");
    holder.batch_execute("COMMIT").await.unwrap();
    asked.await.unwrap().unwrap();
    let rows = console_rows(&console, "SHOW TENANTS").await;
    let seven = rows.iter().find(|r| r["tenant"] == "7").expect("tenant 7 is kept");
    assert_eq!(n(seven, "waits"), 1, "{seven:?}");
    let eight = rows.iter().find(|r| r["tenant"] == "8").expect("tenant 8 is kept");
    assert_eq!(n(eight, "waits"), eight_before, "{eight:?}");
    proxy.shutdown().await;
}

/// A transaction's requests are counted together once it ends, and those of a client
/// that left in the middle of one once its session has ended.
#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_s_requests_are_counted_when_it_ends() {
    let proxy = start_proxy(|_| {}).await;
    let console = crate::harness::connect(&proxy.admin_conninfo()).await.unwrap();
    let five = || async {
        let rows = console_rows(&console, "SHOW TENANTS").await;
        rows.into_iter().find(|r| r["tenant"] == "5").map(|r| (n(&r, "transactions"), n(&r, "requests")))
    };
    let client = proxy.connect(Some(5)).await;
    for sql in ["BEGIN", "SELECT 1", "SELECT 2"] {
        client.batch_execute(sql).await.unwrap();
    }
    assert_eq!(five().await, None, "nothing of the open transaction counted yet");
    client.batch_execute("COMMIT").await.unwrap();
    // The BEGIN went with the first SELECT: three requests.
    assert_eq!(five().await, Some((1, 3)));
    let leaver = proxy.connect(Some(5)).await;
    leaver.batch_execute("BEGIN").await.unwrap();
    leaver.batch_execute("SELECT 1").await.unwrap();
    drop(leaver);
    let counted = crate::harness::eventually(std::time::Duration::from_secs(10), || async {
        five().await == Some((1, 4))
    });
    assert!(counted.await.is_some(), "the left transaction's request counted: {:?}", five().await);
    proxy.shutdown().await;
}

/// The recent window rolls with every expiry of server connections off, and when it is
/// shorter than the expiries' rounds: the task that closes expired connections also
/// moves on the clock these figures read. It was not started without an expiry (before
/// 004f489), and with the shipped expiries it ran every 15 s, so a shorter window's
/// clock jumped past whole windows and every one of them looked skipped (empty).
#[tokio::test(flavor = "multi_thread")]
async fn the_recent_window_rolls_with_every_connection_expiry_off_or_longer() {
    for expiries_off in [true, false] {
        let proxy = start_proxy(|c| {
            if expiries_off {
                c.proxy.server_idle_timeout_ms = 0;
                c.proxy.server_lifetime_ms = 0;
                c.proxy.min_pool_size = 0;
            }
            c.observe.tenant_stats_window_ms = 300;
        })
        .await;
        let client = proxy.connect(Some(6)).await;
        let console = crate::harness::connect(&proxy.admin_conninfo()).await.unwrap();
        let recent = || async {
            let rows = console_rows(&console, "SHOW TENANTS").await;
            rows.into_iter().find(|r| r["tenant"] == "6").map(|r| n(&r, "recent_transactions"))
        };
        // Keeps asking, so that a window with its transactions ends and becomes the recent one.
        let rolled = crate::harness::eventually(std::time::Duration::from_secs(20), || async {
            client.batch_execute("SELECT 1").await.unwrap();
            recent().await.is_some_and(|t| t > 0)
        });
        assert!(rolled.await.is_some(), "expiries off: {expiries_off}; recent: {:?}", recent().await);
        proxy.shutdown().await;
    }
}
