//! Failover (issue 23): a shard whose primary is killed under a write load, and whose
//! replica is then promoted, by an outside orchestrator (`pg_ctl promote`) or by
//! pgtenant itself (`auto_promote`), goes on writing through pgtenant: requests that arrive meanwhile are held, not failed, and
//! run on the new primary; each client sees at most the error of the statement that
//! was in flight on the dead primary; every acknowledged insert is on the new primary;
//! the old primary, started again as a primary on its old timeline, gets no writes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::harness::{connect, private_cluster_with_replica, start_proxy_on_pair};

/// What one writing client saw: the ids it was told were committed, its errors.
struct Writer {
    acknowledged: Vec<i64>,
    errors: Vec<String>,
}

async fn write_until(conninfo: String, client_no: i64, stop: Arc<AtomicBool>) -> Writer {
    let client = connect(&conninfo).await.expect("connect through the proxy");
    let mut seen = Writer { acknowledged: Vec::new(), errors: Vec::new() };
    let mut client = Some(client);
    let mut next = client_no * 1_000_000;
    while !stop.load(Ordering::Relaxed) {
        let Some(c) = client.as_ref() else { break };
        next += 1;
        // The simple protocol: PostgreSQL commits a lone statement before its
        // CommandComplete. Through the extended protocol it commits at Sync, after
        // CommandComplete, and tokio-postgres's `execute` returns on CommandComplete: a
        // primary killed while that commit waited for the synchronous replica left an
        // "acknowledged" insert that was never acknowledged (no ReadyForQuery), the
        // same through pgtenant as directly.
        let insert = format!("INSERT INTO failover_writes (id, tenant_id) VALUES ({next}, 7)");
        let inserted = c.simple_query(&insert).await.map(|messages| {
            messages.iter().find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::CommandComplete(n) => Some(*n),
                _ => None,
            })
        });
        match inserted {
            Ok(Some(1)) => seen.acknowledged.push(next),
            Ok(n) => seen.errors.push(format!("inserted {n:?} rows")),
            Err(e) => {
                seen.errors.push(match e.as_db_error() {
                    Some(db) => format!("{} {}", db.code().code(), db.message()),
                    None => e.to_string(),
                });
                if c.is_closed() {
                    // As a pooler's client would: connect again and go on.
                    client = connect(&conninfo).await.ok();
                }
            }
        }
    }
    seen
}

/// Who promotes the replica once the primary is killed.
#[derive(Clone, Copy, PartialEq)]
enum Promoter {
    /// The test, as Patroni or an operator would (`pg_ctl promote`).
    Outside,
    /// pgtenant (`auto_promote = true`).
    Proxy,
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_survive_a_killed_primary_and_an_outside_promotion() {
    writes_survive_a_killed_primary("failover", Promoter::Outside).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_survive_a_killed_primary_that_pgtenant_replaces_itself() {
    writes_survive_a_killed_primary("autopromote", Promoter::Proxy).await;
}

async fn writes_survive_a_killed_primary(name: &'static str, promoter: Promoter) {
    let (primary, replica, _admin) = crate::harness::pair_with(
        name,
        "CREATE TABLE failover_writes (id bigint PRIMARY KEY, tenant_id bigint NOT NULL);
             GRANT SELECT, INSERT ON failover_writes TO app;",
    )
    .await;
    let (primary_port, replica_port) = (primary.port, replica.port);
    let proxy = start_proxy_on_pair(primary_port, replica_port, |c| {
        c.health.fail_after = 2;
        c.health.failover_hold_ms = 20_000;
        c.health.auto_promote = promoter == Promoter::Proxy;
        // pg_promote() and pg_stat_replication's positions are a superuser's.
        c.health.user = Some("postgres".into());
    })
    .await;
    let probe = proxy.connect(Some(7)).await;
    let port: i32 = probe.query_one("SELECT inet_server_port()", &[]).await.unwrap().get(0);
    assert_eq!(port, i32::from(primary_port), "writes go to the configured primary");

    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (1..=4)
        .map(|n| {
            let (conninfo, stop) = (proxy.conninfo("options='-c pgtenant.tenant_id=7'"), stop.clone());
            tokio::spawn(async move { write_until(conninfo, n, stop).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let killed = primary.clone();
    tokio::task::spawn_blocking(move || killed.kill()).await.unwrap().expect("kill the primary");
    if promoter == Promoter::Outside {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let promoted = replica.clone();
        tokio::task::spawn_blocking(move || promoted.promote()).await.unwrap().expect("promote the replica");
    }
    // Writes resume on the new primary.
    let after = proxy.connect(Some(7)).await;
    let port: i32 = after.query_one("SELECT inet_server_port()", &[]).await.unwrap().get(0);
    assert_eq!(port, i32::from(replica_port), "the promoted replica serves the shard");
    tokio::time::sleep(Duration::from_millis(800)).await;
    stop.store(true, Ordering::Relaxed);
    let mut acknowledged = Vec::new();
    let mut errors_seen = Vec::new();
    for writer in writers {
        let seen = writer.await.unwrap();
        assert!(
            seen.errors.len() <= 1,
            "a client saw more than the error of its one in-flight insert: {:?}",
            seen.errors
        );
        acknowledged.extend(seen.acknowledged);
        errors_seen.extend(seen.errors);
    }
    let new_primary =
        connect(&format!("host=127.0.0.1 port={replica_port} user=postgres dbname=app")).await.unwrap();
    let stored: Vec<i64> = new_primary
        .query("SELECT id FROM failover_writes", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let stored: std::collections::HashSet<i64> = stored.into_iter().collect();
    let lost: Vec<i64> = acknowledged.iter().copied().filter(|id| !stored.contains(id)).collect();
    if !lost.is_empty() {
        panic!(
            "acknowledged inserts missing on the new primary: {lost:?} ({})\n--- old primary's log:\n{}\n--- promoted replica's log:\n{}",
            where_the_lost_are(&primary, &lost, &errors_seen).await,
            log_tail(&primary),
            log_tail(&replica)
        );
    }
    let written_after =
        new_primary.query_one("SELECT count(*) FROM failover_writes", &[]).await.unwrap().get::<_, i64>(0);
    assert!(
        written_after as usize >= acknowledged.len() && acknowledged.len() > 20,
        "{written_after} rows, {} acknowledged",
        acknowledged.len()
    );
    // The old primary started again as it was: a primary on the old timeline (a split
    // brain). No write reaches it.
    let restarted = primary.clone();
    tokio::task::spawn_blocking(move || restarted.start()).await.unwrap().expect("restart the old primary");
    let old_primary =
        connect(&format!("host=127.0.0.1 port={primary_port} user=postgres dbname=app")).await.unwrap();
    let in_recovery: bool = old_primary.query_one("SELECT pg_is_in_recovery()", &[]).await.unwrap().get(0);
    assert!(!in_recovery, "the old primary is back as a primary");
    let old_rows = rows_in(&old_primary).await;
    // Twice the check interval: the checks have seen it by now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let writer = proxy.connect(Some(7)).await;
    for id in 0..10i64 {
        writer
            .execute("INSERT INTO failover_writes (id, tenant_id) VALUES ($1, 7)", &[&(-1 - id)])
            .await
            .unwrap();
    }
    let port: i32 = writer.query_one("SELECT inet_server_port()", &[]).await.unwrap().get(0);
    assert_eq!(port, i32::from(replica_port), "the newest timeline keeps the writes");
    assert_eq!(rows_in(&old_primary).await, old_rows, "no write reached the old primary");
    proxy.shutdown().await;
}

/// For a failure message: whether the old primary (started again) holds the lost
/// inserts (acknowledged there without reaching the standby) or not (acknowledged by
/// no server at all), with the errors the writers saw.
async fn where_the_lost_are(
    old: &pgtenant::dev::cluster::Cluster,
    lost: &[i64],
    errors: &[String],
) -> String {
    let restarted = old.clone();
    if let Err(e) = tokio::task::spawn_blocking(move || restarted.start()).await.unwrap() {
        return format!("the old primary did not start again: {e}; writers' errors {errors:?}");
    }
    let Ok(client) = connect(&format!("host=127.0.0.1 port={} user=postgres dbname=app", old.port)).await
    else {
        return format!("the old primary does not answer; writers' errors {errors:?}");
    };
    let on_old: Vec<i64> = client
        .query("SELECT id FROM failover_writes WHERE id = ANY($1) ORDER BY id", &[&lost])
        .await
        .map(|rows| rows.iter().map(|r| r.get(0)).collect())
        .unwrap_or_default();
    format!("on the old primary: {on_old:?}; writers' errors {errors:?}")
}

/// The last lines of a cluster's server log (where each ended its WAL: "redo done
/// at", the promotion, a record it could not read).
fn log_tail(cluster: &pgtenant::dev::cluster::Cluster) -> String {
    let log = std::fs::read_to_string(cluster.data_dir.join("server.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

async fn rows_in(client: &tokio_postgres::Client) -> i64 {
    client.query_one("SELECT count(*) FROM failover_writes", &[]).await.unwrap().get(0)
}

/// With a catalog, a proxy promotes only while it holds the catalog's promotion lock
/// for the shard: here the test holds it (as another proxy that is promoting would),
/// and the replica stays a replica until the test lets go.
#[tokio::test(flavor = "multi_thread")]
async fn auto_promote_waits_for_the_catalog_promotion_lock() {
    let (primary, replica) =
        tokio::task::spawn_blocking(|| private_cluster_with_replica("promote_lock", 1)).await.unwrap();
    let s = crate::harness::shards();
    let catalog_db = "catalog_promote_lock";
    pgtenant::dev::demo::setup_catalog(
        s.ports[0],
        catalog_db,
        &pgtenant::dev::demo::loopback_nodes(&[primary.port, s.ports[1]]),
    )
    .await
    .unwrap();
    pgtenant::dev::demo::add_replicas(
        s.ports[0],
        catalog_db,
        &[(1, "promote_lock_replica".into(), "127.0.0.1".into(), replica.port, 1)],
    )
    .await
    .unwrap();
    let catalog = pgtenant::dev::demo::local_catalog(s.ports[0], catalog_db);
    let proxy = crate::harness::start_catalog_proxy(catalog, |c| {
        c.health.interval_ms = 200;
        c.health.fail_after = 2;
        c.health.failover_hold_ms = 20_000;
        c.health.auto_promote = true;
        c.health.user = Some("postgres".into());
    })
    .await;
    let writer = proxy.connect(Some(7)).await;
    let port: i32 = writer.query_one("SELECT inet_server_port()", &[]).await.unwrap().get(0);
    assert_eq!(port, i32::from(primary.port));

    // "Another proxy" holds the lock of shard 1 ('pgtp' = 0x70677470).
    let holder = connect(&format!("host=127.0.0.1 port={} user=postgres dbname={catalog_db}", s.ports[0]))
        .await
        .unwrap();
    holder.execute("SELECT pg_advisory_lock(1885828208, 1)", &[]).await.unwrap();
    let killed = primary.clone();
    tokio::task::spawn_blocking(move || killed.kill()).await.unwrap().expect("kill the primary");
    let on_replica =
        connect(&format!("host=127.0.0.1 port={} user=postgres dbname=app", replica.port)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let in_recovery: bool = on_replica.query_one("SELECT pg_is_in_recovery()", &[]).await.unwrap().get(0);
    assert!(in_recovery, "no promotion while another holds the lock");

    holder.execute("SELECT pg_advisory_unlock(1885828208, 1)", &[]).await.unwrap();
    let promoted = crate::harness::eventually(Duration::from_secs(15), || async {
        !on_replica.query_one("SELECT pg_is_in_recovery()", &[]).await.unwrap().get::<_, bool>(0)
    })
    .await;
    assert!(promoted.is_some(), "promoted once the lock is free");
    let after = proxy.connect(Some(7)).await;
    let port: i32 = after.query_one("SELECT inet_server_port()", &[]).await.unwrap().get(0);
    assert_eq!(port, i32::from(replica.port), "writes go to the promoted replica");
    proxy.shutdown().await;
}

/// A held request ends at the session's `statement_timeout` when that is shorter than
/// `failover_hold_ms`; once the hold ran out, the shard's nodes are still checked at the
/// short interval, so a later promotion is served within about 100 ms (a checker that
/// went back to its own pace, here 5 s, took up to that long).
#[tokio::test(flavor = "multi_thread")]
async fn a_hold_ends_at_statement_timeout_and_a_later_promotion_is_seen_at_once() {
    let (primary, replica, _admin) = crate::harness::pair_with("hold_bounds", "CREATE TABLE hold_writes (id bigint, tenant_id bigint NOT NULL); GRANT SELECT, INSERT ON hold_writes TO app;").await;
    let proxy = start_proxy_on_pair(primary.port, replica.port, |c| {
        c.health.fail_after = 1;
        c.health.failover_hold_ms = 60_000;
        // A long pace between checks, so that one that would sleep through a
        // promotion shows it: the short one must take over whenever it matters.
        c.health.interval_ms = 5_000;
    })
    .await;
    let client = proxy.connect(Some(7)).await;
    client.batch_execute("INSERT INTO hold_writes VALUES (1, 7)").await.unwrap();
    client.batch_execute("SET statement_timeout = '400ms'").await.unwrap();
    let killed = primary.clone();
    tokio::task::spawn_blocking(move || killed.kill()).await.unwrap().expect("kill the primary");
    // Held, and let go at the session's 400 ms, not at failover_hold_ms (60 s). The
    // first attempt may meet the dying connection (08006); the next is held.
    let started = std::time::Instant::now();
    let err = loop {
        let err = client.batch_execute("INSERT INTO hold_writes VALUES (2, 7)").await.unwrap_err();
        if crate::harness::sqlstate(&err) == "57P03" || started.elapsed() > Duration::from_secs(20) {
            break err;
        }
    };
    assert_eq!(crate::harness::sqlstate(&err), "57P03", "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "bounded by statement_timeout: {:?}",
        started.elapsed()
    );
    // A session without a statement_timeout is held, and SHOW CLIENTS says so.
    let patient = proxy.connect(Some(7)).await;
    let console = connect(&proxy.admin_conninfo()).await.unwrap();
    let waiting =
        tokio::spawn(async move { patient.batch_execute("INSERT INTO hold_writes VALUES (4, 7)").await });
    let shown = crate::harness::eventually(Duration::from_secs(5), || async {
        crate::harness::client_states(&console).await.contains(&"held".to_string())
    })
    .await;
    assert!(
        shown.is_some(),
        "SHOW CLIENTS lists the held client: {:?}",
        crate::harness::client_states(&console).await
    );
    // The replica is promoted: writes are served within a few short checks of it
    // answering as primary, the held one among them.
    let promoted = replica.clone();
    tokio::task::spawn_blocking(move || promoted.promote()).await.unwrap().expect("promote the replica");
    let promoted_at = std::time::Instant::now();
    client.batch_execute("SET statement_timeout = 0").await.unwrap();
    let served = crate::harness::eventually(Duration::from_secs(5), || async {
        client.batch_execute("INSERT INTO hold_writes VALUES (3, 7)").await.is_ok()
    })
    .await;
    let took = promoted_at.elapsed();
    assert!(served.is_some(), "writes resume on the promoted replica");
    assert!(took < Duration::from_millis(700), "promotion noticed at the short interval: {took:?}");
    waiting.await.unwrap().expect("the held write ran on the new primary");
    proxy.shutdown().await;
}

/// Requests that never reached a server are not failed by a crash: with one server
/// connection per pool, one client's statement runs on the primary while two others
/// queue behind it in pgtenant; the primary is killed and its replica promoted. The
/// running statement gets 08006 (its outcome is unknown, as on PostgreSQL); the queued
/// ones wait for the new primary and run there.
#[tokio::test(flavor = "multi_thread")]
async fn requests_queued_behind_a_full_pool_run_on_the_new_primary() {
    let (primary, replica, _admin) = crate::harness::pair_with("queued_crash", "CREATE TABLE queued_writes (id bigint, tenant_id bigint NOT NULL); GRANT SELECT, INSERT ON queued_writes TO app;").await;
    let proxy = start_proxy_on_pair(primary.port, replica.port, |c| {
        c.health.fail_after = 1;
        c.users.iter_mut().for_each(|u| u.pool_size = 1);
        c.proxy.checkout_timeout_ms = 30_000;
    })
    .await;
    let running = proxy.connect(Some(7)).await;
    let queued: Vec<_> = [proxy.connect(Some(7)).await, proxy.connect(Some(7)).await].into_iter().collect();
    let console = connect(&proxy.admin_conninfo()).await.unwrap();
    let slow = tokio::spawn(async move { running.batch_execute("SELECT pg_sleep(30)").await });
    // The slow statement holds the pool's one connection; the two writes queue.
    let held = crate::harness::eventually(Duration::from_secs(10), || async {
        crate::harness::client_states(&console).await.contains(&"active".to_string())
    })
    .await;
    assert!(held.is_some());
    let writes: Vec<_> = queued
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            tokio::spawn(async move {
                c.batch_execute(&format!("INSERT INTO queued_writes VALUES ({i}, 7)")).await.map(|_| c)
            })
        })
        .collect();
    let waiting = crate::harness::eventually(Duration::from_secs(10), || async {
        crate::harness::client_states(&console).await.iter().filter(|s| *s == "waiting").count() == 2
    })
    .await;
    assert!(waiting.is_some(), "both writes queue behind the full pool");
    let killed = primary.clone();
    tokio::task::spawn_blocking(move || killed.kill()).await.unwrap().expect("kill the primary");
    let promoted = replica.clone();
    tokio::task::spawn_blocking(move || promoted.promote()).await.unwrap().expect("promote the replica");
    let err = slow.await.unwrap().expect_err("the running statement's connection died");
    assert!(
        matches!(crate::harness::sqlstate(&err).as_str(), "08006" | "57P01" | "57P02"),
        "the statement in flight fails as on PostgreSQL: {err:?}"
    );
    for write in writes {
        let client = write.await.unwrap().expect("a queued write runs on the new primary");
        let port: i32 = client.query_one("SELECT inet_server_port()", &[]).await.unwrap().get(0);
        assert_eq!(port, i32::from(replica.port));
    }
    let on_new: i64 = connect(&format!("host=127.0.0.1 port={} user=postgres dbname=app", replica.port))
        .await
        .unwrap()
        .query_one("SELECT count(*) FROM queued_writes", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(on_new, 2, "both queued writes are on the new primary");
    proxy.shutdown().await;
}

/// A request handed a pooled connection whose server died while it sat idle never ran:
/// it is not failed with 08006 but waits for the new primary and runs there.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_on_a_connection_that_died_idle_runs_on_the_new_primary() {
    let (primary, replica, _admin) = crate::harness::pair_with("idle_died", "CREATE TABLE idle_writes (id bigint, tenant_id bigint NOT NULL); GRANT SELECT, INSERT ON idle_writes TO app;").await;
    let proxy = start_proxy_on_pair(primary.port, replica.port, |c| {
        // Slow checks: the request meets the dead connection before the checks see the crash.
        c.health.interval_ms = 5_000;
    })
    .await;
    let client = proxy.connect(Some(7)).await;
    client.batch_execute("INSERT INTO idle_writes VALUES (1, 7)").await.unwrap();
    let killed = primary.clone();
    tokio::task::spawn_blocking(move || killed.kill()).await.unwrap().expect("kill the primary");
    let promoted = replica.clone();
    tokio::task::spawn_blocking(move || promoted.promote()).await.unwrap().expect("promote the replica");
    // The pooled connection to the old primary is dead; this write never reached it.
    client.batch_execute("INSERT INTO idle_writes VALUES (2, 7)").await.expect("runs on the new primary");
    let port: i32 = client.query_one("SELECT inet_server_port()", &[]).await.unwrap().get(0);
    assert_eq!(port, i32::from(replica.port));
    proxy.shutdown().await;
}

/// `min_pool_size` warms a (login, database)'s pool on every node of the shard, its
/// replica too; a standby's connections survive its promotion, so the first request
/// after the failover runs on a connection opened before it: no login paid.
#[tokio::test(flavor = "multi_thread")]
async fn min_pool_size_warms_the_replica_and_the_request_after_a_failover_pays_no_login() {
    let (primary, replica, _admin) = crate::harness::pair_with("warm_failover", "SELECT 1").await;
    let proxy = start_proxy_on_pair(primary.port, replica.port, |c| {
        c.proxy.min_pool_size = 3;
        c.health.fail_after = 1;
    })
    .await;
    let app_backends = |port: u16| async move {
        let sql = "SELECT pid FROM pg_stat_activity WHERE usename = 'app' AND application_name NOT LIKE 'pgtenant%'";
        let admin = connect(&format!("host=127.0.0.1 port={port} user=postgres dbname=app")).await.unwrap();
        admin.query(sql, &[]).await.unwrap().iter().map(|r| r.get::<_, i32>(0)).collect::<Vec<_>>()
    };
    let client = proxy.connect(Some(7)).await;
    client.batch_execute("SELECT 1").await.unwrap();
    let warm = crate::harness::eventually(Duration::from_secs(10), || async {
        app_backends(primary.port).await.len() >= 3 && app_backends(replica.port).await.len() >= 3
    });
    assert!(warm.await.is_some(), "the pool is warmed to min_pool_size on the primary and its replica");
    let standby_pids = app_backends(replica.port).await;
    let killed = primary.clone();
    tokio::task::spawn_blocking(move || killed.kill()).await.unwrap().expect("kill the primary");
    let promoted = replica.clone();
    tokio::task::spawn_blocking(move || promoted.promote()).await.unwrap().expect("promote the replica");
    let pid = crate::harness::server_pid(&client).await;
    assert!(
        standby_pids.contains(&pid),
        "the request ran on a connection opened before the promotion: {pid} of {standby_pids:?}"
    );
    client
        .batch_execute("CREATE TEMP TABLE written_after (x int); INSERT INTO written_after VALUES (1)")
        .await
        .expect("it may write");
    proxy.shutdown().await;
}
