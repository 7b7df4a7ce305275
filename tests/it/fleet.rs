//! Fleet commands (issue 53): DRAIN SHARD empties a shard under writes, losing no
//! acknowledged write, and placement skips it; REBALANCE evens the tenants out onto an
//! empty shard under writes, losing none (its DRY RUN plans without moving); a batch whose move fails stops with
//! the reason and every tenant served; a batch whose driver is gone is taken over by
//! another proxy, and PAUSE / RESUME REBALANCE hold and release it; plans weigh what
//! every proxy counted, and a copy-bandwidth budget spaces a batch's moves.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::harness::{
    Catalog, ConsoleRow, Proxy, connect, console_rows, eventually, new_catalog, shard_admin,
};
use crate::moves::{ids_on, seed, start_proxy, tenant_conninfo, tenant_database, writer};

/// Waits until batch `id` has ended; its SHOW BATCHES row.
async fn ended(console: &tokio_postgres::Client, id: &str, within: Duration) -> ConsoleRow {
    let row =
        || async { console_rows(console, "SHOW BATCHES").await.into_iter().find(|r| r["batch_id"] == id) };
    let done = eventually(within, || async {
        row().await.is_some_and(|r| matches!(r["state"].as_str(), "done" | "failed"))
    })
    .await;
    let last = row().await.unwrap_or_default();
    if done.is_none() {
        let moves = console_rows(console, "SHOW MOVES").await;
        panic!("batch {id} did not end: {last:?}\nmoves: {moves:?}");
    }
    last
}

/// The shards that hold rows of `tenant` in `db`'s orders.
async fn holders(db: &str, tenant: i64) -> Vec<usize> {
    let mut on = Vec::new();
    for shard in 1..=2 {
        if !ids_on(db, shard, tenant).await.is_empty() {
            on.push(shard);
        }
    }
    on
}

async fn console_of(proxy: &Proxy) -> tokio_postgres::Client {
    connect(&proxy.admin_conninfo()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn drain_shard_empties_it_under_writes_and_placement_skips_it() {
    let db = "fleet_drain";
    tenant_database(db).await;
    for tenant in [11, 12, 13] {
        seed(db, 1, tenant, 20).await;
    }
    let catalog: Catalog = new_catalog("fleet_drain").await;
    let proxy = start_proxy(&catalog, db, |_| {}).await;
    let stop = Arc::new(AtomicBool::new(false));
    let writing = tokio::spawn(writer(tenant_conninfo(&proxy, db, 12), 12, 1000, stop.clone()));
    let console = console_of(&proxy).await;
    let plan = console_rows(&console, "DRAIN SHARD 1 PARALLEL 2").await;
    let moved: Vec<(&str, &str)> =
        plan.iter().map(|r| (r["tenant_id"].as_str(), r["target"].as_str())).collect();
    assert_eq!(moved.len(), 3, "{plan:?}");
    assert!(moved.iter().all(|(_, target)| *target == "2"), "{plan:?}");
    let batch = plan[0]["batch_id"].clone();
    let row = ended(&console, &batch, Duration::from_secs(120)).await;
    stop.store(true, Ordering::Relaxed);
    let writes = writing.await.unwrap();
    assert_eq!(row["state"], "done", "{row:?}");
    assert_eq!((row["moves"].as_str(), row["done"].as_str()), ("3", "3"));
    assert!(row["rows_copied"].parse::<i64>().unwrap() >= 120, "3 tenants of 40 rows: {row:?}");
    for tenant in [11, 13] {
        assert_eq!(holders(db, tenant).await, vec![2], "tenant {tenant} lives on shard 2 only");
    }
    let on_target = ids_on(db, 2, 12).await;
    let lost: Vec<&i64> = writes.acked.iter().filter(|id| !on_target.contains(id)).collect();
    assert!(lost.is_empty(), "acknowledged writes missing on the target: {lost:?}");
    assert!(ids_on(db, 1, 12).await.is_empty(), "the source was cleaned up");
    assert_eq!(writes.last_shard, 2);
    // Shard 1 takes no new tenants.
    let status: String = catalog
        .admin
        .query_one("SELECT status FROM pgtenant.shard_config WHERE shard_id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "draining");
    let placed: i16 = catalog
        .admin
        .query_one("SELECT shard_id FROM pgtenant.place_tenant(5001)", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(placed, 2);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rebalance_moves_tenants_onto_an_empty_shard_and_its_dry_run_moves_nothing() {
    let db = "fleet_rebalance";
    tenant_database(db).await;
    for tenant in [31, 32, 33, 34] {
        seed(db, 1, tenant, 5).await;
    }
    let catalog = new_catalog("fleet_rebalance").await;
    let proxy = start_proxy(&catalog, db, |_| {}).await;
    // Tenant 31 is the busiest: it is counted, and moved first.
    let busy = connect(&tenant_conninfo(&proxy, db, 31)).await.unwrap();
    for _ in 0..50 {
        busy.query("SELECT count(*) FROM orders", &[]).await.unwrap();
    }
    let console = console_of(&proxy).await;
    // Shard 2 holds the catalog's mapped tenant 42 (no rows here) and nothing else: the
    // busy tenant goes there, and 42 (lighter than the spread then) the other way.
    let dry = console_rows(&console, "REBALANCE DRY RUN").await;
    let steps: Vec<(&str, &str, &str)> =
        dry.iter().map(|r| (r["tenant_id"].as_str(), r["source"].as_str(), r["target"].as_str())).collect();
    assert_eq!(steps, vec![("31", "1", "2"), ("42", "2", "1")], "{dry:?}");
    assert!(dry[0]["load"].parse::<u64>().unwrap() > 50, "31's counted transactions weigh it: {dry:?}");
    assert!(dry.iter().all(|r| r["batch_id"].is_empty() && r["state"] == "planned"), "{dry:?}");
    assert_eq!(console_rows(&console, "SHOW BATCHES").await.len(), 0, "a dry run records nothing");
    // Writers of a tenant that moves and of one that stays, through the batch.
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = [31, 33]
        .into_iter()
        .map(|t| tokio::spawn(writer(tenant_conninfo(&proxy, db, t), t, 1000, stop.clone())))
        .collect();
    let plan = console_rows(&console, "REBALANCE").await;
    let row = ended(&console, &plan[0]["batch_id"], Duration::from_secs(120)).await;
    stop.store(true, Ordering::Relaxed);
    assert_eq!(row["state"], "done", "{row:?}");
    for (tenant, written) in [31, 33].into_iter().zip(writers) {
        let written = written.await.unwrap();
        let shard = if tenant == 31 { 2 } else { 1 };
        let stored = ids_on(db, shard, tenant).await;
        let lost: Vec<&i64> = written.acked.iter().filter(|id| !stored.contains(id)).collect();
        assert!(!written.acked.is_empty() && lost.is_empty(), "tenant {tenant}: lost {lost:?}");
    }
    assert_eq!(holders(db, 31).await, vec![2]);
    for tenant in [32, 33, 34] {
        assert_eq!(holders(db, tenant).await, vec![1], "tenant {tenant} stays");
    }
    let on_one = shard_admin(1, db).await;
    let served: i32 = connect(&tenant_conninfo(&proxy, db, 42))
        .await
        .unwrap()
        .query_one("SELECT shard_id FROM pgtenant_shard", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(served, 1, "tenant 42 is routed to shard 1 now");
    drop(on_one);
    // Even now: another REBALANCE plans nothing.
    assert!(console_rows(&console, "REBALANCE DRY RUN").await.is_empty());
    proxy.shutdown().await;
}

/// A move the shards refuse (a table whose replica identity lacks the tenant column)
/// stops the batch at that step with the reason; the tenants stay served where they were.
#[tokio::test(flavor = "multi_thread")]
async fn a_failing_move_stops_its_batch_with_the_reason_and_leaves_tenants_served() {
    let db = "fleet_fails";
    tenant_database(db).await;
    for tenant in [43, 44] {
        seed(db, 1, tenant, 3).await;
    }
    shard_admin(1, db)
        .await
        .batch_execute("CREATE TABLE notes (tenant_id bigint NOT NULL, id bigint PRIMARY KEY); ALTER TABLE notes OWNER TO app; INSERT INTO notes VALUES (43, 1)")
        .await
        .unwrap();
    shard_admin(2, db)
        .await
        .batch_execute("CREATE TABLE notes (tenant_id bigint NOT NULL, id bigint PRIMARY KEY); ALTER TABLE notes OWNER TO app")
        .await
        .unwrap();
    let catalog = new_catalog("fleet_fails").await;
    let proxy = start_proxy(&catalog, db, |_| {}).await;
    let console = console_of(&proxy).await;
    let plan = console_rows(&console, "DRAIN SHARD 1 PARALLEL 1").await;
    assert_eq!(plan.len(), 2);
    let row = ended(&console, &plan[0]["batch_id"], Duration::from_secs(60)).await;
    assert_eq!(row["state"], "failed", "{row:?}");
    assert!(row["error"].contains("replica identity"), "the reason: {row:?}");
    let steps = console_rows(&console, "SHOW PLAN").await;
    let states: Vec<&str> = steps.iter().map(|s| s["state"].as_str()).collect();
    assert_eq!(states, vec!["failed", "pending"], "stopped at the first failure");
    for tenant in [43, 44] {
        let client = connect(&tenant_conninfo(&proxy, db, tenant)).await.unwrap();
        let shard: i32 = client.query_one("SELECT shard_id FROM pgtenant_shard", &[]).await.unwrap().get(0);
        assert_eq!(shard, 1, "tenant {tenant} is served where it was");
    }
    proxy.shutdown().await;
}

/// A paused batch whose driving proxy stops is taken over by another proxy on the
/// catalog, which RESUME REBALANCE then lets finish.
#[tokio::test(flavor = "multi_thread")]
async fn another_proxy_takes_over_a_batch_whose_driver_is_gone() {
    let db = "fleet_takeover";
    tenant_database(db).await;
    for tenant in [51, 52] {
        seed(db, 1, tenant, 3).await;
    }
    let catalog = new_catalog("fleet_takeover").await;
    let fast = |c: &mut pgtenant::config::Config| c.moves.proxy_stale_ms = 1000;
    let first = start_proxy(&catalog, db, fast).await;
    let second = start_proxy(&catalog, db, fast).await;
    let console = console_of(&first).await;
    // Paused before it starts a second move, then its driver goes away.
    let plan = console_rows(&console, "DRAIN SHARD 1 PARALLEL 1").await;
    let batch = plan[0]["batch_id"].clone();
    console_rows(&console, &format!("PAUSE REBALANCE {batch}")).await;
    let driver_was = console_rows(&console, "SHOW BATCHES").await[0]["driver"].clone();
    drop(console);
    first.shutdown().await;
    let other = console_of(&second).await;
    let taken = eventually(Duration::from_secs(30), || async {
        console_rows(&other, "SHOW BATCHES").await[0]["driver"] != driver_was
    })
    .await;
    assert!(taken.is_some(), "the second proxy takes the batch over");
    let resumed = console_rows(&other, &format!("RESUME REBALANCE {batch}")).await;
    assert_eq!(resumed[0]["state"], "running");
    let row = ended(&other, &batch, Duration::from_secs(120)).await;
    assert_eq!(row["state"], "done", "{row:?}");
    for tenant in [51, 52] {
        let (moves, plan) =
            (console_rows(&other, "SHOW MOVES").await, console_rows(&other, "SHOW PLAN").await);
        assert_eq!(holders(db, tenant).await, vec![2], "tenant {tenant}: {moves:?} {plan:?}");
    }
    second.shutdown().await;
}

/// A plan weighs each tenant by what every proxy on the catalog counted (the traffic
/// here goes through the proxy that does not plan), and a batch with a copy-bandwidth
/// budget starts its next move only once the budget has caught up with the bytes the
/// earlier moves copied; SHOW BATCHES and `/metrics` show the batch's figures.
#[tokio::test(flavor = "multi_thread")]
async fn plans_weigh_every_proxys_counts_and_a_bandwidth_budget_spaces_the_moves() {
    let db = "fleet_budget";
    tenant_database(db).await;
    seed(db, 1, 61, 40).await;
    seed(db, 1, 62, 1).await;
    let catalog = new_catalog("fleet_budget").await;
    let planner =
        start_proxy(&catalog, db, |c| c.observe.listen = Some("127.0.0.1:0".parse().unwrap())).await;
    let serving = start_proxy(&catalog, db, |_| {}).await;
    let busy = connect(&tenant_conninfo(&serving, db, 61)).await.unwrap();
    for _ in 0..60 {
        busy.query("SELECT count(*) FROM orders", &[]).await.unwrap();
    }
    let console = console_of(&planner).await;
    let dry = console_rows(&console, "DRAIN SHARD 1 DRY RUN").await;
    assert_eq!(dry[0]["tenant_id"], "61", "the busiest tenant goes first: {dry:?}");
    let load: u64 = dry[0]["load"].parse().unwrap();
    assert!(load > 60, "61 weighs what the other proxy counted: {dry:?}");
    // 500 bytes a second: the second move waits until the first one's bytes are paid.
    let plan = console_rows(&console, "DRAIN SHARD 1 PARALLEL 2 BANDWIDTH 0.5 KB").await;
    let batch = plan[0]["batch_id"].clone();
    let row = ended(&console, &batch, Duration::from_secs(120)).await;
    assert_eq!(row["state"], "done", "{row:?}");
    assert_eq!(row["bandwidth_mb"], "0.0005", "{row:?}");
    let moves = console_rows(&console, "SHOW MOVES").await;
    assert!(
        moves.len() == 2 && moves.iter().all(|m| m["batch_id"] == batch),
        "SHOW MOVES names the batch: {moves:?}"
    );
    let moves = catalog
        .admin
        .query(
            "SELECT m.bytes_copied, extract(epoch FROM m.created_at - b.created_at)::float8
             FROM pgtenant.fleet_step s JOIN pgtenant.tenant_move m USING (move_id)
             JOIN pgtenant.fleet_batch b USING (batch_id) WHERE s.batch_id = $1 ORDER BY m.move_id",
            &[&batch.parse::<i64>().unwrap()],
        )
        .await
        .unwrap();
    let moves: Vec<(i64, f64)> = moves.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(moves.len(), 2, "{moves:?}");
    let (first_bytes, second_started) = (moves[0].0, moves[1].1);
    assert!(first_bytes > 2_000, "40 orders and 40 events: {moves:?}");
    // The budget charged the first move its rows' size on the source, measured before
    // it started: the bytes it copied, give or take the rows' headers on either side.
    assert!(
        second_started >= 0.9 * first_bytes as f64 / 500.0,
        "the second move started {second_started:.2} s in, before {first_bytes} bytes at 500 a second: {moves:?}"
    );
    let total: i64 = moves.iter().map(|m| m.0).sum();
    assert_eq!(row["bytes_copied"], total.to_string(), "{row:?}");
    let metrics = crate::harness::http_get(planner.http_addr().unwrap(), "/metrics").await.1;
    let missing = crate::harness::dashboard_series_missing("fleet", &metrics);
    assert!(missing.is_empty(), "fleet series the dashboard uses, not on /metrics: {missing:?}");
    let series = format!("pgtenant_fleet_batch_bytes_copied{{batch=\"{batch}\"}} ");
    let reported = metrics.lines().find_map(|l| l.strip_prefix(series.as_str())?.parse::<f64>().ok());
    assert_eq!(reported, Some(total as f64), "{series}in:\n{metrics}");
    serving.shutdown().await;
    planner.shutdown().await;
}
