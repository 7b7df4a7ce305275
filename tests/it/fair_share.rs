//! Fair shares of a shard's pool among tenants (issue 30): a tenant alone uses the whole
//! pool; beside a tenant flooding it with slow statements, another tenant's requests
//! are still served without queueing behind the flood (and with fair shares off, they
//! do queue, which shows the test can see the difference); a tenant's cap set in the
//! catalog applies once its NOTIFY arrives.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::harness::{self, eventually, new_catalog, shard_admin, start_catalog_proxy, start_proxy};

/// Statements of `sql`'s text running on shard 1 now.
async fn running(admin: &tokio_postgres::Client, sql: &str) -> i64 {
    admin
        .query_one("SELECT count(*) FROM pg_stat_activity WHERE query = $1 AND state = 'active'", &[&sql])
        .await
        .unwrap()
        .get(0)
}

/// `clients` sessions of `tenant` looping on `sql` until stopped; `done` counts answers.
struct Flood {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Flood {
    async fn start(proxy: &harness::Proxy, tenant: i64, clients: usize, sql: &'static str) -> Self {
        let (stop, done) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        // All log in first, then start together: a login can take longer than a
        // statement on a loaded machine, and the first ones would be done before the
        // last began.
        let mut connected = Vec::new();
        for _ in 0..clients {
            connected.push(proxy.connect(Some(tenant)).await);
        }
        let mut tasks = Vec::new();
        for client in connected {
            let (stop, done) = (stop.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    client.simple_query(sql).await.expect("a flood statement");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        Flood { stop, done, tasks }
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.expect("a flood client");
        }
    }
}

/// Runs `queries` requests of tenant 8 beside six clients of tenant 7 sleeping 0.25 s
/// each on a pool of three; returns how many of tenant 7's statements ended meanwhile.
async fn quiet_beside_flood(fair_share: bool, sleep_sql: &'static str, queries: usize) -> usize {
    let proxy = start_proxy(|c| {
        c.users[0].pool_size = 3;
        c.proxy.fair_share = fair_share;
    })
    .await;
    let admin = shard_admin(1, "app").await;
    let flood = Flood::start(&proxy, 7, 6, sleep_sql).await;
    let whole_pool = eventually(Duration::from_secs(10), || {
        let admin = &admin;
        async move { running(admin, sleep_sql).await == 3 }
    })
    .await;
    assert!(whole_pool.is_some(), "tenant 7 alone uses the whole pool of three");
    let quiet = proxy.connect(Some(8)).await;
    let before = flood.done.load(Ordering::Relaxed);
    for _ in 0..queries {
        let row = quiet.query_one("SELECT current_setting('pgtenant.tenant_id')", &[]).await.unwrap();
        assert_eq!(row.get::<_, String>(0), "8", "tenant 8's statement ran as tenant 8");
    }
    let ended_meanwhile = flood.done.load(Ordering::Relaxed) - before;
    assert!(running(&admin, sleep_sql).await >= 1, "the flood still runs");
    flood.stop().await;
    proxy.shutdown().await;
    ended_meanwhile
}

#[tokio::test(flavor = "multi_thread")]
async fn a_quiet_tenant_does_not_queue_behind_a_flooding_one() {
    // Each of tenant 8's requests gets a connection without waiting for tenant 7's
    // statements to end: at most the first waits for one to be given back.
    let ended = quiet_beside_flood(true, "SELECT pg_sleep(0.2501)", 20).await;
    assert!(ended < 10, "tenant 8's 20 requests waited behind {ended} of tenant 7's statements");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_fair_shares_the_quiet_tenant_queues_behind_the_flood() {
    let ended = quiet_beside_flood(false, "SELECT pg_sleep(0.2502)", 10).await;
    assert!(ended >= 10, "in one line, each of tenant 8's requests waits for the flood: {ended}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_cap_set_in_the_catalog_applies_after_its_notify() {
    const SLEEP: &str = "SELECT pg_sleep(0.3003)";
    let catalog = new_catalog("limits").await;
    let proxy = start_catalog_proxy(catalog.config.clone(), |c| c.users[0].pool_size = 4).await;
    let admin = shard_admin(1, "app").await;
    // Most statements of tenant 7 that run at once, while three clients each send one.
    let most_at_once = || async {
        let flood = Flood::start(&proxy, 7, 3, SLEEP).await;
        let mut most = 0;
        while flood.done.load(Ordering::Relaxed) < 3 {
            most = most.max(running(&admin, SLEEP).await);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        flood.stop().await;
        most
    };
    assert_eq!(most_at_once().await, 3, "no cap: all three run together");
    catalog
        .admin
        .batch_execute("INSERT INTO pgtenant.tenant_limits (tenant_key, max_connections) VALUES ('7', 1)")
        .await
        .unwrap();
    let version = catalog.version().await;
    let applied = eventually(Duration::from_secs(10), || {
        let proxy = &proxy;
        async move {
            let client = proxy.connect(None).await;
            let rows = client.simple_query("SHOW pgtenant.routing_version").await.unwrap();
            rows.iter().any(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0) == Some(&version.to_string()),
                _ => false,
            })
        }
    })
    .await;
    assert!(applied.is_some(), "the proxy follows the catalog's routing version");
    // Reserves and caps are re-read every 100 ms.
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(most_at_once().await, 1, "capped at one connection");
    let eight = proxy.connect(Some(8)).await;
    let row = eight.query_one("SELECT current_setting('pgtenant.tenant_id')", &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "8", "other tenants are not capped");
    proxy.shutdown().await;
}
