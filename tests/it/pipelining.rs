//! Pipelined autocommit requests: several clients' requests on one server connection
//! at once, each client getting exactly its own answers.

use std::sync::Arc;
use std::time::Duration;

use pgtenant::config::Config;

use crate::harness::{self, eventually, shard_admin, start_proxy};

/// A proxy with one server connection per pool, a checkout timeout of 500 ms, and a
/// pipelining join window of `window_us`.
async fn proxy_with_one_connection(window_us: u64) -> harness::Proxy {
    proxy_with_one_connection_and(window_us, |_| {}).await
}

async fn proxy_with_one_connection_and(window_us: u64, tweak: impl FnOnce(&mut Config)) -> harness::Proxy {
    start_proxy(|c| {
        c.users[0].pool_size = 1;
        c.proxy.checkout_timeout_ms = 500;
        c.proxy.pipeline_join_window_us = window_us;
        c.proxy.pipeline_quick_us = GENEROUS_QUICK_US;
        tweak(c);
    })
    .await
}

/// What counts as quick in these tests, which are about lanes, not timing: a warm-up run
/// on a machine busy with other tests may take more than the default 2 ms.
const GENEROUS_QUICK_US: u64 = 1_000_000;

/// Runs a statement often enough, through `client`'s simple protocol, that its shape
/// counts as quick and may ride a lane (a new shape runs alone until it proved quick).
async fn warm_up_simple(client: &tokio_postgres::Client, sql: &str) {
    for _ in 0..QUICK_RUNS {
        client.simple_query(sql).await.expect("a warm-up run");
    }
}

/// As `warm_up_simple`, through the extended protocol's unnamed statement.
async fn warm_up_extended(client: &tokio_postgres::Client, sql: &str) {
    for _ in 0..QUICK_RUNS {
        client.query_typed(sql, &[]).await.expect("a warm-up run");
    }
}

/// Runs a new statement shape needs, answered quickly, before it may ride a lane.
const QUICK_RUNS: usize = 3;

/// Holds an exclusive lock on a table of its own on shard 1 (created if needed) until
/// dropped with a COMMIT; returns the admin client holding it.
async fn lock_table(table: &str) -> tokio_postgres::Client {
    let admin = shard_admin(1, "app").await;
    admin
        .batch_execute(&format!("CREATE TABLE IF NOT EXISTS {table} (x int); GRANT SELECT ON {table} TO app"))
        .await
        .expect("create the table");
    admin
        .batch_execute(&format!("BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
        .await
        .expect("lock the table");
    admin
}

/// Waits until a query naming `table` waits for its lock on shard 1.
async fn wait_until_blocked(table: &str) {
    let watcher = shard_admin(1, "app").await;
    let pattern = format!("%FROM {table}%");
    let blocked = eventually(Duration::from_secs(10), || {
        let (watcher, pattern) = (&watcher, &pattern);
        async move {
            let row = watcher
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
                    &[pattern],
                )
                .await
                .unwrap();
            row.get::<_, i64>(0) > 0
        }
    })
    .await;
    if blocked.is_none() {
        let rows = watcher
            .query("SELECT coalesce(wait_event_type, ''), state, query FROM pg_stat_activity WHERE datname = 'app'", &[])
            .await
            .unwrap();
        let seen: Vec<(String, String, String)> =
            rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
        panic!("the query on {table} never waited for the lock: {seen:?}");
    }
}

/// The first row of a query, as text, once it is answered.
type FirstRow = tokio::task::JoinHandle<Result<Vec<String>, tokio_postgres::Error>>;

/// Has a client of tenant 7 run `SELECT {columns} FROM {table}` through `proxy` until it
/// waits for the lock `lock_table` takes on shard 1; returns the lock's holder, that
/// query's first row to come, and a client of tenant 8 (shard 1 too).
/// Both statements were run before the lock, so that their shapes count as quick: a
/// read that proved quick and then waits for DDL's lock is what a lane still waits for.
async fn a_request_waiting_for_a_lock(
    proxy: &harness::Proxy,
    table: &str,
    columns: &str,
    second_sql: &str,
) -> (tokio_postgres::Client, FirstRow, tokio_postgres::Client) {
    let gate = lock_table(table).await;
    gate.batch_execute("ROLLBACK").await.unwrap();
    let first = proxy.connect(Some(7)).await;
    let second = proxy.connect(Some(8)).await;
    let sql = format!("SELECT {columns} FROM {table}");
    warm_up_simple(&first, &sql).await;
    warm_up_extended(&second, second_sql).await;
    let gate = lock_table(table).await;
    let blocked = tokio::spawn(async move { first_row(&first.simple_query(&sql).await?) });
    wait_until_blocked(table).await;
    (gate, blocked, second)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_joins_a_busy_connection_instead_of_waiting_for_a_free_one() {
    let proxy = proxy_with_one_connection(60_000_000).await;
    joins_a_busy_connection(&proxy, "pipelining_gate_join").await;
}

/// The same with client threads: the two clients are served on different threads, and
/// the second joins the first's lane, of another thread, as no connection is free.
#[tokio::test(flavor = "multi_thread")]
async fn with_client_threads_a_request_joins_another_threads_lane_instead_of_waiting() {
    let proxy = proxy_with_one_connection_and(60_000_000, |c| {
        c.proxy.thread_per_core = true;
        c.proxy.workers = 2;
    })
    .await;
    joins_a_busy_connection(&proxy, "pipelining_gate_join_threads").await;
}

async fn joins_a_busy_connection(proxy: &harness::Proxy, table: &str) {
    // Tenants 7 and 8 both live on shard 1, whose pool has one connection. A simple
    // query and a one-message-batch extended one (an unnamed statement): both are
    // autocommit requests that may ride a lane.
    let columns = "count(*), pg_backend_pid(), current_setting('pgtenant.tenant_id')";
    let sql = "SELECT pg_backend_pid(), current_setting('pgtenant.tenant_id')";
    let (gate, blocked, second) = a_request_waiting_for_a_lock(proxy, table, columns, sql).await;
    let behind = tokio::spawn(async move {
        second.query_typed(sql, &[]).await.map(|rows| (rows[0].get::<_, i32>(0), rows[0].get::<_, String>(1)))
    });
    // Past the checkout timeout: a request waiting for a connection of its own would
    // have failed with 53300 by now.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(!behind.is_finished(), "the second request was answered before the first: {:?}", behind.await);

    gate.batch_execute("COMMIT").await.unwrap();
    let first_row = blocked.await.unwrap().expect("the blocked query");
    assert_eq!((first_row[0].as_str(), first_row[2].as_str()), ("0", "7"));
    let (second_pid, second_tenant) = behind.await.unwrap().expect("the pipelined query");
    assert_eq!(second_pid.to_string(), first_row[1], "both ran on the one server connection");
    assert_eq!(second_tenant, "8", "the pipelined request carried its own tenant");
}

/// The values of the first row of a simple query's answer, as text.
fn first_row(messages: &[tokio_postgres::SimpleQueryMessage]) -> Result<Vec<String>, tokio_postgres::Error> {
    let row = messages
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        })
        .expect("a row");
    Ok((0..row.len()).map(|i| row.get(i).unwrap_or_default().to_string()).collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_does_not_join_behind_one_that_runs_long() {
    let table = "pipelining_gate_window";
    // The default window: one millisecond.
    let proxy = proxy_with_one_connection(1_000).await;
    let (gate, blocked, second) = a_request_waiting_for_a_lock(&proxy, table, "count(*)", "SELECT 1").await;
    // The only connection runs a request older than the window: this one waits for a
    // connection of its own, and the pool has none to give within its timeout.
    let err = second.query_typed("SELECT 1", &[]).await.expect_err("no connection is free");
    assert_eq!(harness::sqlstate(&err), "53300");
    assert!(!blocked.is_finished());

    gate.batch_execute("COMMIT").await.unwrap();
    assert_eq!(blocked.await.unwrap().expect("the blocked query"), ["0"]);
    assert_eq!(second.query_one("SELECT 2", &[]).await.unwrap().get::<_, i32>(0), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_alone_on_its_pool_takes_a_connection_nobody_joins() {
    let table = "pipelining_gate_alone";
    // Two connections, and a window that would let any request join a lane.
    let proxy = start_proxy(|c| {
        c.users[0].pool_size = 2;
        c.proxy.pipeline_join_window_us = 60_000_000;
        c.proxy.pipeline_quick_us = GENEROUS_QUICK_US;
    })
    .await;
    let sql = "SELECT pg_backend_pid(), current_setting('pgtenant.tenant_id')";
    let (gate, blocked, second) =
        a_request_waiting_for_a_lock(&proxy, table, "count(*), pg_backend_pid()", sql).await;
    // The first request found its pool idle and took a connection of its own: this
    // one does not wait behind it, but runs on the pool's other connection.
    let row = tokio::time::timeout(Duration::from_secs(5), second.query_one(sql, &[]))
        .await
        .expect("answered while the first request waits for its lock")
        .expect("the second request");
    assert_eq!(row.get::<_, String>(1), "8");
    assert!(!blocked.is_finished());

    gate.batch_execute("COMMIT").await.unwrap();
    let first_row = blocked.await.unwrap().expect("the blocked query");
    assert_eq!(first_row[0], "0");
    assert_ne!(
        row.get::<_, i32>(0).to_string(),
        first_row[1],
        "the two requests ran on different connections"
    );
}

/// While a checkout waits for a connection, lanes take no riders, and a read that gets
/// a connection then runs on it alone: a lane opened for it would carry it only, and
/// cost a task and a channel per request (what 400 pgbench clients on 20 connections
/// paid for every statement). A read that comes meanwhile waits in line.
#[tokio::test(flavor = "multi_thread")]
async fn while_others_wait_for_a_connection_a_read_opens_no_lane() {
    let table = "pipelining_queue_alone";
    let proxy = proxy_with_one_connection_and(60_000_000, |c| c.proxy.checkout_timeout_ms = 30_000).await;
    let console = harness::connect(&proxy.admin_conninfo()).await.unwrap();
    let lanes = || async {
        let rows = console.query("SHOW LANES", &[]).await.unwrap();
        rows.iter().filter(|r| r.get::<_, i64>("shard") == 1).map(|r| r.get::<_, i64>("lanes")).sum::<i64>()
    };
    let gate = lock_table(table).await;
    gate.batch_execute("ROLLBACK").await.unwrap();
    let holder = proxy.connect(Some(7)).await;
    let first = proxy.connect(Some(7)).await;
    // One tenant's line, so that the first to wait is the first served.
    let second = proxy.connect(Some(7)).await;
    let sql = format!("SELECT count(*), pg_backend_pid() FROM {table}");
    warm_up_simple(&first, &sql).await;
    // (`SELECT pg_backend_pid()` alone the proxy answers itself.)
    let second_sql = "SELECT pg_backend_pid(), current_setting('pgtenant.tenant_id')";
    warm_up_simple(&second, second_sql).await;
    // The pool's one connection is held by a transaction; the table's lock by another
    // session.
    holder.batch_execute("BEGIN; SELECT 1").await.unwrap();
    let gate = lock_table(table).await;
    let blocked = tokio::spawn(async move { first_row(&first.simple_query(&sql).await?) });
    let waiting = |n: usize| {
        let console = &console;
        move || async move {
            harness::client_states(console).await.iter().filter(|s| *s == "waiting").count() == n
        }
    };
    assert!(eventually(Duration::from_secs(10), waiting(1)).await.is_some(), "the first read waits");
    let behind = tokio::spawn(async move { first_row(&second.simple_query(second_sql).await?) });
    assert!(
        eventually(Duration::from_secs(10), waiting(2)).await.is_some(),
        "the second read waits in line: {:?}",
        harness::client_states(&console).await
    );

    // The connection goes to the first read, which finds the second waiting: no lane.
    holder.batch_execute("COMMIT").await.unwrap();
    wait_until_blocked(table).await;
    assert_eq!(lanes().await, 0, "a lane was opened while a read waited for a connection");
    assert!(!behind.is_finished(), "the second read did not join the first: {:?}", behind.await);

    gate.batch_execute("COMMIT").await.unwrap();
    let first_row = blocked.await.unwrap().expect("the blocked read");
    let second_row = behind.await.unwrap().expect("the read that waited in line");
    assert_eq!(first_row[0], "0");
    assert_eq!(second_row[0], first_row[1], "the one connection served both, one after the other");
}

#[tokio::test(flavor = "multi_thread")]
async fn many_clients_on_few_connections_each_get_their_own_answers() {
    // Two connections per pool for twelve busy clients, and a window that lets every
    // request join: most requests ride behind others.
    let proxy = start_proxy(|c| {
        c.users[0].pool_size = 2;
        c.proxy.pipeline_join_window_us = 60_000_000;
        c.proxy.pipeline_quick_us = GENEROUS_QUICK_US;
    })
    .await;
    // Shard 1: tenants 7, 8, 9; shard 2: tenants 42 (mapped) and 1500, 1600.
    let tenants = [7i64, 8, 9, 42, 1500, 1600, 7, 8, 9, 42, 1500, 1600];
    let mut tasks = Vec::new();
    for (n, tenant) in tenants.into_iter().enumerate() {
        let client = proxy.connect(Some(tenant)).await;
        tasks.push(tokio::spawn(async move {
            let expected_shard = if tenant >= 1000 || tenant == 42 { 2 } else { 1 };
            for i in 0..150i32 {
                let value = i * 100 + n as i32;
                if i % 25 == 24 {
                    // An error ends only this client's request.
                    let err = client.query_one("SELECT 1 / $1::int", &[&0i32]).await.expect_err("division by zero");
                    assert_eq!(harness::sqlstate(&err), "22012");
                    continue;
                }
                let (got, guc, shard): (i32, String, i32) = if i % 2 == 0 {
                    let row = client
                        .query_one(
                            "SELECT $1::int, current_setting('pgtenant.tenant_id'), shard_id FROM pgtenant_shard",
                            &[&value],
                        )
                        .await
                        .expect("extended query");
                    (row.get(0), row.get(1), row.get(2))
                } else {
                    let sql = format!(
                        "SELECT {value}, current_setting('pgtenant.tenant_id'), shard_id FROM pgtenant_shard"
                    );
                    let row = first_row(&client.simple_query(&sql).await.expect("simple query")).unwrap();
                    (row[0].parse().unwrap(), row[1].clone(), row[2].parse().unwrap())
                };
                assert_eq!(got, value, "client {n} got another request's answer");
                assert_eq!(guc, tenant.to_string(), "client {n} ran under another tenant");
                assert_eq!(shard, expected_shard, "client {n} of tenant {tenant} on the wrong shard");
            }
        }));
    }
    for task in tasks {
        task.await.expect("a client's requests");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_pipelined_connection_fails_every_request_on_it_and_the_sessions_go_on() {
    let table = "pipelining_gate_lost";
    let proxy = proxy_with_one_connection(60_000_000).await;
    let first = Arc::new(proxy.connect(Some(7)).await);
    let second = Arc::new(proxy.connect(Some(8)).await);
    let sql = format!("SELECT count(*) FROM {table}");
    lock_table(table).await.batch_execute("ROLLBACK").await.unwrap();
    warm_up_simple(&first, &sql).await;
    warm_up_extended(&second, "SELECT 1").await;
    let gate = lock_table(table).await;
    let blocked = {
        let first = first.clone();
        tokio::spawn(async move { first.simple_query(&sql).await })
    };
    wait_until_blocked(table).await;
    let behind = {
        let second = second.clone();
        tokio::spawn(async move { second.query_typed("SELECT 1", &[]).await })
    };
    // Past the checkout timeout: had it not joined the lane, it would fail with 53300.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(!behind.is_finished(), "the second request was answered early: {:?}", behind.await);

    let terminated = gate
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE wait_event_type = 'Lock' AND query LIKE $1",
            &[&format!("%FROM {table}%")],
        )
        .await
        .unwrap();
    assert_eq!(terminated.get::<_, i64>(0), 1, "the lane's server connection");

    // The request that ran gets the server's own FATAL or pgtenant's 08006; the one
    // behind it never ran and gets 08006 naming the shard.
    let err = blocked.await.unwrap().expect_err("its server was terminated");
    assert!(["57P01", "08006"].contains(&harness::sqlstate(&err).as_str()), "{err:?}");
    let err = behind.await.unwrap().expect_err("its server was terminated");
    assert_eq!(harness::sqlstate(&err), "08006", "{err:?}");
    assert!(format!("{err:?}").contains("shard 1"), "{err:?}");

    // Both sessions go on, on a new server connection.
    gate.batch_execute("COMMIT").await.unwrap();
    let row = first.query_one(&format!("SELECT count(*) FROM {table}"), &[]).await.unwrap();
    assert_eq!(row.get::<_, i64>(0), 0);
    let row = second.query_one("SELECT current_setting('pgtenant.tenant_id')", &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "8");
}

/// How the rider of `a_late_cancel_never_stops_another_clients_pipelined_request` asks.
#[derive(Clone, Copy, Debug)]
enum Asked {
    Simple,
    UnnamedStatement,
    NamedStatement,
}

/// Runs `sql`, a count, through `client` as `asked` (`prepared` is its named statement).
async fn count_as(
    client: &tokio_postgres::Client,
    asked: Asked,
    sql: &str,
    prepared: &tokio_postgres::Statement,
) -> Result<i64, tokio_postgres::Error> {
    Ok(match asked {
        Asked::Simple => first_row(&client.simple_query(sql).await?)?[0].parse().unwrap(),
        Asked::UnnamedStatement => client.query_typed(sql, &[]).await?[0].get(0),
        Asked::NamedStatement => client.query(prepared, &[]).await?[0].get(0),
    })
}

/// A cancel reaches the server when the postmaster gets to it, here held back by a
/// relay: sent while a client's read ran, it lands after that read ended, while the
/// lane runs the request queued behind it, another client's. That request is run
/// again, alone, and its client gets its answer, not the stray 57014; the canceled
/// client's read, which ended on its own, gets its answer too. In both protocols.
#[tokio::test(flavor = "multi_thread")]
async fn a_late_cancel_never_stops_another_clients_pipelined_request() {
    let hold = Duration::from_millis(2500);
    let shard = std::net::SocketAddr::from(([127, 0, 0, 1], harness::shards().ports[0]));
    let (relay, cancels_received) = harness::slow_cancels::relay_holding_cancels(shard, hold).await;
    let proxy = proxy_with_one_connection_and(60_000_000, |c| {
        c.shards[0].nodes[0].port = relay.port();
        c.proxy.checkout_timeout_ms = 20_000;
    })
    .await;
    let watcher = shard_admin(1, "app").await;
    for (round, asked) in
        [Asked::Simple, Asked::UnnamedStatement, Asked::NamedStatement].into_iter().enumerate()
    {
        let (ahead, behind) =
            (format!("pipelining_stray_ahead_{round}"), format!("pipelining_stray_behind_{round}"));
        lock_table(&ahead).await.batch_execute("ROLLBACK").await.unwrap();
        lock_table(&behind).await.batch_execute("ROLLBACK").await.unwrap();
        let first = proxy.connect(Some(7)).await;
        let second = Arc::new(proxy.connect(Some(8)).await);
        let ahead_sql = format!("SELECT count(*) FROM {ahead}");
        let behind_sql = format!("SELECT count(*) FROM {behind}");
        warm_up_simple(&first, &ahead_sql).await;
        let prepared = second.prepare(&behind_sql).await.unwrap();
        for _ in 0..QUICK_RUNS {
            count_as(&second, asked, &behind_sql, &prepared).await.expect("a warm-up run");
        }

        // The first client's read waits for a lock, then the second's joins its lane
        // and will wait for another, held longer.
        let (gate_ahead, gate_behind) = (lock_table(&ahead).await, lock_table(&behind).await);
        let token = first.cancel_token();
        let ran_ahead = tokio::spawn(async move { first_row(&first.simple_query(&ahead_sql).await?) });
        wait_until_blocked(&ahead).await;
        let ran_behind = {
            let (second, sql, prepared) = (second.clone(), behind_sql.clone(), prepared.clone());
            tokio::spawn(async move { count_as(&second, asked, &sql, &prepared).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let canceller = tokio::spawn(async move { token.cancel_query(tokio_postgres::NoTls).await });
        let forwarded = harness::eventually(Duration::from_secs(2), || async {
            cancels_received.load(std::sync::atomic::Ordering::SeqCst) == round + 1
        })
        .await;
        assert!(forwarded.is_some(), "{asked:?}: pgtenant passed the cancel on");

        // The first read ends on its own before its cancel lands.
        gate_ahead.batch_execute("COMMIT").await.unwrap();
        let row =
            ran_ahead.await.unwrap().expect("the canceled client's read, ended before the cancel landed");
        assert_eq!(row[0], "0");
        wait_until_blocked(&behind).await;
        let started_at = |pattern: String| {
            let watcher = &watcher;
            async move {
                let sql = "SELECT query_start::text FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1";
                watcher.query(sql, &[&pattern]).await.unwrap().first().map(|r| r.get::<_, String>(0))
            }
        };
        let first_run = started_at(format!("%FROM {behind}%")).await.expect("the second read waits");
        canceller.await.unwrap().expect("the cancel, confirmed once it landed");

        // It landed on the second client's read, which runs again and waits again.
        let ran_again = harness::eventually(Duration::from_secs(10), || {
            let (started_at, pattern, first_run) = (&started_at, format!("%FROM {behind}%"), &first_run);
            async move { started_at(pattern).await.is_some_and(|again| &again != first_run) }
        })
        .await;
        if ran_again.is_none() {
            gate_behind.batch_execute("COMMIT").await.unwrap();
            panic!("{asked:?}: the second read did not run again: {:?}", ran_behind.await.unwrap());
        }
        assert!(!ran_behind.is_finished(), "{asked:?}: answered early: {:?}", ran_behind.await);
        gate_behind.batch_execute("COMMIT").await.unwrap();
        let count = ran_behind
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{asked:?}: the stray cancel reached the client: {e:?}"));
        assert_eq!(count, 0, "{asked:?}");
    }
}

/// A cancel for a request queued on a lane behind another client's, which waits for a
/// lock, ends it at once with 57014, as PostgreSQL ends a statement it runs (the
/// server gets no signal: the request ahead is another client's). The one ahead is
/// not touched, and both sessions go on. In both protocols.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_ends_a_request_queued_behind_another_clients_at_once() {
    let proxy = proxy_with_one_connection(60_000_000).await;
    for (round, asked) in [Asked::Simple, Asked::UnnamedStatement].into_iter().enumerate() {
        let table = format!("pipelining_queued_cancel_{round}");
        let sql = "SELECT current_setting('pgtenant.tenant_id')";
        let (gate, blocked, second) = a_request_waiting_for_a_lock(&proxy, &table, "count(*)", sql).await;
        // Warmed up through the extended protocol: a shape is the same in both.
        let second = Arc::new(second);
        let token = second.cancel_token();
        let behind = {
            let second = second.clone();
            tokio::spawn(async move {
                match asked {
                    Asked::Simple => second.simple_query(sql).await.map(drop),
                    _ => second.query_typed(sql, &[]).await.map(drop),
                }
            })
        };
        // Past the checkout timeout: had it not joined the lane, it would fail with 53300.
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert!(!behind.is_finished(), "{asked:?}: answered early: {:?}", behind.await);

        token.cancel_query(tokio_postgres::NoTls).await.expect("the cancel request");
        let ended = tokio::time::timeout(Duration::from_secs(5), behind).await;
        let err = ended.expect("the queued request ended at its cancel").unwrap().expect_err("canceled");
        assert_eq!(harness::sqlstate(&err), "57014", "{asked:?}: {err:?}");
        assert!(!blocked.is_finished(), "{asked:?}: the request ahead still waits for its lock");

        gate.batch_execute("COMMIT").await.unwrap();
        let row = blocked.await.unwrap().expect("the request ahead, not canceled");
        assert_eq!(row[0], "0");
        let row = second.query_one(sql, &[]).await.expect("the canceled session goes on");
        assert_eq!(row.get::<_, String>(0), "8");
    }
}
