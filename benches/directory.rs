//! Tenant resolution through the catalog directory: the latency of a cache miss (a
//! catalog query) and of a hit (memory), the memory the cached tenants take, and how
//! long a change of a cached tenant's placement in the catalog takes to reach
//! resolution (its NOTIFY; the target is under a second).
//!
//!   cargo bench --bench directory -- <catalog port> <catalog dbname> <first tenant> <last tenant> [lookups]
//!
//! `bench/sql_routing.sh` runs it against `pgtenant dev`'s catalog after loading a
//! million tenants into tenant_shard_map.

use std::time::{Duration, Instant};

use pgtenant::dev::demo;
use pgtenant::directory::{CatalogDirectory, Directory, TenantId};

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    if args.len() < 4 {
        eprintln!("usage: directory <catalog port> <dbname> <first tenant> <last tenant> [lookups]");
        std::process::exit(2);
    }
    let port: u16 = args[0].parse().expect("port");
    let (first, last): (i64, i64) = (args[2].parse().expect("first"), args[3].parse().expect("last"));
    let lookups: usize = args.get(4).map(|n| n.parse().expect("lookups")).unwrap_or(200_000);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut catalog = demo::local_catalog(port, &args[1]);
        catalog.lookup_connections = 8;
        let directory = std::sync::Arc::new(
            CatalogDirectory::connect(&catalog, pgtenant::directory::TenantKey::Bigint)
                .await
                .expect("catalog"),
        );
        let rss_before = rss_kib();
        let span = (last - first + 1) as usize;
        let step = (span / lookups).max(1) as i64;
        let tenants: Vec<TenantId> = (0..lookups as i64).map(|i| TenantId::Int(first + i * step)).collect();

        // Misses, one at a time: the latency a client sees for a tenant's first statement.
        let mut misses = Vec::new();
        for t in tenants.iter().take(5_000) {
            let start = Instant::now();
            directory.lookup(t).await.expect("placed");
            misses.push(start.elapsed());
        }
        misses.sort();
        // Fill the cache with the rest, 8 lookups in flight.
        let start = Instant::now();
        let chunks: Vec<Vec<TenantId>> =
            tenants[5_000.min(tenants.len())..].chunks(1_000).map(|c| c.to_vec()).collect();
        for group in chunks.chunks(8) {
            let tasks: Vec<_> = group
                .iter()
                .cloned()
                .map(|chunk| {
                    let d = directory.clone();
                    tokio::spawn(async move {
                        for t in chunk {
                            d.lookup(&t).await.expect("placed");
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
        }
        let fill = start.elapsed();
        let cached = directory.cached_tenants();
        let rss_after = rss_kib();

        // Hits: every tenant again, from memory.
        let rounds = 5;
        let start = Instant::now();
        let mut found = 0usize;
        for _ in 0..rounds {
            for t in &tenants {
                if let Some(Ok(_)) = directory.cached(t) {
                    found += 1;
                }
            }
        }
        let hit_ns = start.elapsed().as_nanos() as f64 / (rounds * tenants.len()) as f64;

        println!("tenants in the catalog: {span} ({first}..={last}); looked up: {}", tenants.len());
        println!(
            "miss (catalog query), one at a time: p50 {:?}  p99 {:?}  max {:?}",
            percentile(&misses, 0.5),
            percentile(&misses, 0.99),
            misses.last().unwrap()
        );
        println!(
            "cache fill, 8 in flight: {} lookups in {:.1?} ({:.0}/s)",
            tenants.len() - misses.len(),
            fill,
            (tenants.len() - misses.len()) as f64 / fill.as_secs_f64()
        );
        println!(
            "hit (memory): {hit_ns:.0} ns per resolution ({found} of {} answered from the cache)",
            rounds * tenants.len()
        );
        println!(
            "memory: {cached} cached tenants, RSS {} MiB -> {} MiB ({:.0} bytes per cached tenant)",
            rss_before / 1024,
            rss_after / 1024,
            (rss_after.saturating_sub(rss_before) * 1024) as f64 / cached.max(1) as f64
        );

        let mut propagation =
            propagation(&catalog, directory.as_ref(), &tenants[..20.min(tenants.len())]).await;
        propagation.sort();
        println!(
            "catalog change -> resolution (NOTIFY), {} moves of a cached tenant: p50 {:?}  max {:?}",
            propagation.len(),
            percentile(&propagation, 0.5),
            propagation.last().unwrap()
        );
    });
}

/// Moves each of `tenants` (cached, explicitly mapped) to the other shard and back,
/// timing from the commit of each change until a lookup resolves the new shard.
async fn propagation(
    catalog: &pgtenant::config::CatalogConfig,
    directory: &CatalogDirectory,
    tenants: &[TenantId],
) -> Vec<Duration> {
    let conninfo = format!(
        "host={} port={} user={} dbname={}",
        catalog.host, catalog.port, catalog.user, catalog.dbname
    );
    let (admin, connection) =
        tokio_postgres::connect(&conninfo, tokio_postgres::NoTls).await.expect("catalog");
    tokio::spawn(connection);
    let move_to = |t: &TenantId, shard: i16| {
        let TenantId::Int(id) = t else { unreachable!("bigint tenants") };
        format!("UPDATE pgtenant.tenant_shard_map SET shard_id = {shard} WHERE tenant_id = {id}")
    };
    let mut took = Vec::new();
    for t in tenants {
        let from = directory.lookup(t).await.expect("placed").shard;
        let to = if from == 1 { 2 } else { 1 };
        for (sql, want) in [(move_to(t, to as i16), to), (move_to(t, from as i16), from)] {
            admin.batch_execute(&sql).await.expect("move");
            let start = Instant::now();
            while directory.lookup(t).await.expect("placed").shard != want {
                assert!(start.elapsed() < Duration::from_secs(30), "tenant {t} never moved");
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            took.push(start.elapsed());
        }
    }
    took
}
