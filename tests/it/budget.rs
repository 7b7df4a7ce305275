//! A shard's connection budget shared by every proxy on the catalog (issue 56): three
//! proxy processes' worth of clients never make more server connections than the
//! budget (counted in the shard's `pg_stat_activity`) and every request is answered;
//! an idle proxy's slice goes to a busy one; a proxy gone gives its lease back once it
//! expires.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use crate::harness::{Catalog, Proxy, connect, eventually, new_catalog, shard_admin, start_catalog_proxy};

const DB: &str = "budget_db";
const BUDGET: i64 = 4;

/// The proxies' server connections to `DB` on shard 2 now.
async fn on_shard_two(admin: &tokio_postgres::Client) -> i64 {
    admin
        .query_one("SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND usename = 'app'", &[&DB])
        .await
        .unwrap()
        .get(0)
}

/// `clients` clients of tenant 42 (shard 2) through `proxy`, each running `times`
/// `pg_sleep(seconds)`; the errors they met.
async fn load(proxy: &Proxy, clients: usize, times: usize, seconds: f64) -> Vec<String> {
    let conninfo = format!(
        "host=127.0.0.1 port={} user=app password=app dbname={DB} sslmode=disable options='-c pgtenant.tenant_id=42'",
        proxy.addr.port()
    );
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let conninfo = conninfo.clone();
        tasks.push(tokio::spawn(async move {
            let client = match connect(&conninfo).await {
                Ok(c) => c,
                Err(e) => return vec![e.to_string()],
            };
            let mut errors = Vec::new();
            for _ in 0..times {
                if let Err(e) = client.query("SELECT pg_sleep($1)", &[&seconds]).await {
                    errors.push(e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_string()));
                }
            }
            errors
        }));
    }
    let mut errors = Vec::new();
    for t in tasks {
        errors.extend(t.await.unwrap());
    }
    errors
}

async fn leases(catalog: &Catalog) -> Vec<(String, i32)> {
    catalog
        .admin
        .query(
            "SELECT proxy_id, granted FROM pgtenant.connection_lease WHERE expires_at > now() ORDER BY proxy_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn proxies_share_a_shards_connection_budget_and_never_exceed_it() {
    for shard in 1..=2 {
        let admin = shard_admin(shard, "postgres").await;
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {DB} WITH (FORCE)")).await.unwrap();
        admin.batch_execute(&format!("CREATE DATABASE {DB} OWNER app")).await.unwrap();
    }
    let catalog = new_catalog("budget").await;
    catalog
        .admin
        .execute("INSERT INTO pgtenant.connection_budget VALUES (2, 'app', $1)", &[&(BUDGET as i32)])
        .await
        .unwrap();
    let mut proxies = Vec::new();
    for _ in 0..3 {
        proxies.push(
            start_catalog_proxy(catalog.config.clone(), |c| {
                c.moves.proxy_stale_ms = 1000;
                c.proxy.checkout_timeout_ms = 30_000;
            })
            .await,
        );
    }
    // Counted all along, every 10 ms, on the shard itself.
    let admin = shard_admin(2, "postgres").await;
    let (most, stop) = (Arc::new(AtomicI64::new(0)), Arc::new(AtomicBool::new(false)));
    let sampler = {
        let (most, stop) = (most.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                most.fetch_max(on_shard_two(&admin).await, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            admin
        })
    };
    // Four clients through each proxy at once, each asking for a connection 4 times.
    let all = futures_util::future::join_all(proxies.iter().map(|p| load(p, 4, 4, 0.1))).await;
    for (i, errors) in all.iter().enumerate() {
        assert!(errors.is_empty(), "proxy {i}'s clients: {errors:?}");
    }
    assert!(most.load(Ordering::Relaxed) >= 2, "the load used the budget");
    assert!(
        most.load(Ordering::Relaxed) <= BUDGET,
        "{} server connections, over the budget of {BUDGET}",
        most.load(Ordering::Relaxed)
    );
    // Only the first proxy busy now: the others' slices (idle connections) go to it.
    let busy = tokio::spawn({
        let proxy_port = proxies[0].addr.port();
        async move {
            let conninfo = format!(
                "host=127.0.0.1 port={proxy_port} user=app password=app dbname={DB} sslmode=disable options='-c pgtenant.tenant_id=42'"
            );
            let clients: Vec<_> = (0..4).map(|_| connect(&conninfo)).collect();
            let clients = futures_util::future::try_join_all(clients).await.unwrap();
            let runs = clients.iter().map(|c| async move {
                for _ in 0..20 {
                    c.query("SELECT pg_sleep(0.1)", &[]).await.unwrap();
                }
            });
            futures_util::future::join_all(runs).await;
        }
    });
    let all_to_one = eventually(Duration::from_secs(10), || async {
        let granted: Vec<i32> = leases(&catalog).await.into_iter().map(|(_, g)| g).collect();
        granted.iter().max() == Some(&(BUDGET as i32)) && granted.iter().sum::<i32>() == BUDGET as i32
    })
    .await;
    assert!(all_to_one.is_some(), "the busy proxy got the whole budget: {:?}", leases(&catalog).await);
    busy.await.unwrap();
    stop.store(true, Ordering::Relaxed);
    let admin = sampler.await.unwrap();
    assert!(most.load(Ordering::Relaxed) <= BUDGET, "{} connections", most.load(Ordering::Relaxed));
    // A proxy gone: its lease runs out and is dropped (proxy_stale_ms, 1 s here).
    assert_eq!(leases(&catalog).await.len(), 3);
    proxies.pop().unwrap().shutdown().await;
    let given_back =
        eventually(Duration::from_secs(10), || async { leases(&catalog).await.len() == 2 }).await;
    assert!(given_back.is_some(), "{:?}", leases(&catalog).await);
    assert!(on_shard_two(&admin).await <= BUDGET);
    for p in proxies {
        p.shutdown().await;
    }
}
