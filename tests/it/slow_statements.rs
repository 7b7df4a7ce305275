//! Slow statements under load (issue 21): a statement that waits for a row lock, sleeps,
//! or reads through a view that sleeps never makes an unrelated client's request wait
//! for it, while short statements still share pipelined connections.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::harness::{self, eventually, shard_admin, start_proxy};

/// Clients that loop on `SELECT 1` and keep their count and worst latency.
struct FastClients {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<(usize, Duration)>>,
}

impl FastClients {
    /// `n` clients of tenant 7 (shard 1), looping on a statement that already proved
    /// quick, so that it rides lanes whenever the pool is busy.
    async fn start(proxy: &harness::Proxy, n: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        // Every client logs in before any loop starts: a login's key stretching runs on
        // the test's runtime, which the proxy shares, and in a debug build on a busy
        // machine it holds a worker thread long enough to delay the looping clients.
        let mut clients = Vec::new();
        for _ in 0..n {
            let client = proxy.connect(Some(7)).await;
            for _ in 0..3 {
                client.simple_query("SELECT 1").await.expect("a warm-up run");
            }
            clients.push(client);
        }
        let mut tasks = Vec::new();
        for client in clients {
            let stop = stop.clone();
            tasks.push(tokio::spawn(async move {
                let (mut count, mut worst) = (0, Duration::ZERO);
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let answer = client.simple_query("SELECT 1").await.expect("SELECT 1");
                    assert_eq!(first_value(&answer), "1");
                    worst = worst.max(started.elapsed());
                    count += 1;
                }
                (count, worst)
            }));
        }
        FastClients { stop, tasks }
    }

    /// Stops the clients; each one's number of answers and worst latency.
    async fn stop(self) -> Vec<(usize, Duration)> {
        self.stop.store(true, Ordering::Relaxed);
        let mut results = Vec::new();
        for task in self.tasks {
            results.push(task.await.expect("a fast client"));
        }
        results
    }
}

fn first_value(messages: &[tokio_postgres::SimpleQueryMessage]) -> String {
    messages
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .expect("a row")
}

/// A proxy whose shard pools have eight connections: the slow statements below take
/// four (tenant 8's fair share beside tenant 7), and eight fast clients of tenant 7
/// share what is left, on lanes.
async fn busy_proxy() -> harness::Proxy {
    start_proxy(|c| c.users[0].pool_size = 8).await
}

/// Starts four clients of tenant 8 (shard 1) that each send `sql` once, while eight fast
/// clients loop; once all four run on the server (`running` counts them there), keeps
/// the fast clients going for `hold`, then returns what the fast clients saw and the
/// four answers to come (the rows each statement returned or changed).
async fn slow_beside_fast(
    proxy: &harness::Proxy,
    sql: &'static str,
    running: &'static str,
    hold: Duration,
) -> (Vec<(usize, Duration)>, Vec<tokio::task::JoinHandle<Result<u64, tokio_postgres::Error>>>) {
    // Logged in first, for the reason given in `FastClients::start`.
    let mut slow_clients = Vec::new();
    for _ in 0..4 {
        slow_clients.push(proxy.connect(Some(8)).await);
    }
    let watcher = shard_admin(1, "app").await;
    let fast = FastClients::start(proxy, 8).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut slow = Vec::new();
    for client in slow_clients {
        slow.push(tokio::spawn(async move {
            let answer = client.simple_query(sql).await?;
            Ok(answer
                .iter()
                .find_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::CommandComplete(rows) => Some(*rows),
                    _ => None,
                })
                .expect("a CommandComplete"))
        }));
    }
    let all_running = eventually(Duration::from_secs(10), || {
        let watcher = &watcher;
        async move {
            let row = watcher.query_one(running, &[]).await.unwrap();
            row.get::<_, i64>(0) >= 4
        }
    })
    .await;
    if all_running.is_none() {
        let rows = watcher
            .query(
                "SELECT coalesce(wait_event_type, ''), coalesce(state, ''), query FROM pg_stat_activity",
                &[],
            )
            .await
            .unwrap();
        let seen: Vec<(String, String, String)> =
            rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
        let mut ended = Vec::new();
        for task in slow.into_iter().filter(|t| t.is_finished()) {
            ended.push(task.await.unwrap());
        }
        panic!("the four slow statements never ran together: {seen:?}, ended: {ended:?}");
    }
    tokio::time::sleep(hold).await;
    (fast.stop().await, slow)
}

/// Every fast client kept being answered, none waiting anywhere near `hold`.
fn assert_fast_clients_went_on(seen: &[(usize, Duration)], hold: Duration) {
    for (n, (count, worst)) in seen.iter().enumerate() {
        assert!(*count >= 20, "fast client {n} was answered only {count} times: {seen:?}");
        assert!(*worst < hold / 2, "fast client {n} waited {worst:?} for one answer: {seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_never_wait_behind_an_update_waiting_for_a_row_lock() {
    let admin = shard_admin(1, "app").await;
    admin
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS hol_rows (id int PRIMARY KEY, tenant_id bigint, v int);
             GRANT SELECT, UPDATE ON hol_rows TO app;
             INSERT INTO hol_rows VALUES (1, 8, 0) ON CONFLICT (id) DO UPDATE SET v = 0;",
        )
        .await
        .unwrap();
    admin.batch_execute("BEGIN; SELECT v FROM hol_rows WHERE id = 1 FOR UPDATE").await.unwrap();
    let proxy = busy_proxy().await;
    let hold = Duration::from_secs(2);
    let running = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                   AND query LIKE 'UPDATE hol_rows%'";
    let (seen, updates) =
        slow_beside_fast(&proxy, "UPDATE hol_rows SET v = v + 1 WHERE id = 1", running, hold).await;
    assert_fast_clients_went_on(&seen, hold);

    admin.batch_execute("COMMIT").await.unwrap();
    for update in updates {
        assert_eq!(update.await.unwrap().expect("the UPDATE, once the lock is gone"), 1);
    }
    let v: i32 = admin.query_one("SELECT v FROM hol_rows WHERE id = 1", &[]).await.unwrap().get(0);
    assert_eq!(v, 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_never_wait_behind_a_sleeping_statement() {
    let proxy = busy_proxy().await;
    let hold = Duration::from_secs(2);
    let running = "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(4)'";
    let (seen, sleeps) = slow_beside_fast(&proxy, "SELECT pg_sleep(4)", running, hold).await;
    assert_fast_clients_went_on(&seen, hold);
    for sleep in sleeps {
        assert_eq!(sleep.await.unwrap().expect("pg_sleep"), 1);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_never_wait_behind_a_read_whose_view_sleeps() {
    // Nothing in the text shows the sleep: a new shape runs alone until it proved
    // quick, and this one never does.
    let admin = shard_admin(1, "app").await;
    admin
        .batch_execute(
            "CREATE OR REPLACE VIEW hol_sleepy AS SELECT 1 AS x FROM pg_sleep(4);
             GRANT SELECT ON hol_sleepy TO app;",
        )
        .await
        .unwrap();
    let proxy = busy_proxy().await;
    let hold = Duration::from_secs(2);
    let running = "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT x FROM hol_sleepy'";
    let (seen, reads) = slow_beside_fast(&proxy, "SELECT x FROM hol_sleepy", running, hold).await;
    assert_fast_clients_went_on(&seen, hold);
    for read in reads {
        assert_eq!(read.await.unwrap().expect("the sleepy read"), 1);
    }
}
