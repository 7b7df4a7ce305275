//! The client side of `bench/move.sh`: writes through the proxy for the moving tenant
//! and for others, moves the tenant through the admin console, and reports what the
//! clients saw.
//!
//!   move_client PROXY_PORT TARGET_SHARD_CONNINFO TENANT TARGET OTHER_TENANT...

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const WRITERS: usize = 4;
const OTHER_WRITERS: usize = 2;
const BASELINE: Duration = Duration::from_secs(5);
const AFTER: Duration = Duration::from_secs(3);

async fn connect(conninfo: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls).await.expect(conninfo);
    tokio::spawn(conn);
    client
}

/// One writer's record: when each acknowledged write ended, how long it took, its id.
#[derive(Default)]
struct Record {
    writes: Vec<(Instant, Duration, i64)>,
    errors: Vec<String>,
}

async fn write(conninfo: String, tenant: i64, first_id: i64, stop: Arc<AtomicBool>) -> Record {
    let client = connect(&conninfo).await;
    let insert =
        client.prepare("INSERT INTO move_a (tenant_id, id, payload) VALUES ($1, $2, 'live')").await.unwrap();
    let mut record = Record::default();
    let mut id = first_id;
    while !stop.load(Ordering::Relaxed) {
        id += 1;
        let started = Instant::now();
        match client.execute(&insert, &[&tenant, &id]).await {
            Ok(_) => record.writes.push((Instant::now(), started.elapsed(), id)),
            Err(e) => record.errors.push(e.to_string()),
        }
    }
    record
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, port, target_conninfo, tenant, target, others @ ..] = args.as_slice() else {
        eprintln!("usage: move_client PROXY_PORT TARGET_SHARD_CONNINFO TENANT TARGET OTHER_TENANT...");
        std::process::exit(2);
    };
    let tenant: i64 = tenant.parse().unwrap();
    let others: Vec<i64> = others.iter().map(|t| t.parse().unwrap()).collect();
    let conninfo = |t: i64| {
        format!(
            "host=127.0.0.1 port={port} user=app password=app dbname=app sslmode=disable options='-c pgtenant.tenant_id={t}'"
        )
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mut movers = Vec::new();
    for w in 0..WRITERS {
        movers.push(tokio::spawn(write(
            conninfo(tenant),
            tenant,
            (w as i64 + 1) * 100_000_000,
            stop.clone(),
        )));
    }
    let mut bystanders = Vec::new();
    for (i, &t) in others.iter().enumerate() {
        for w in 0..OTHER_WRITERS {
            let first = ((i * OTHER_WRITERS + w) as i64 + 1) * 100_000_000;
            bystanders.push(tokio::spawn(write(conninfo(t), t, first, stop.clone())));
        }
    }
    tokio::time::sleep(BASELINE).await;

    let console = connect(&format!(
        "host=127.0.0.1 port={port} user=admin password=admin dbname=pgtenant sslmode=disable"
    ))
    .await;
    let move_started = Instant::now();
    let row = console.query_one(&format!("MOVE TENANT {tenant} TO SHARD {target}"), &[]).await.unwrap();
    let id: i64 = row.get("move_id");
    // Polled every 20 ms: when the copy ended (catching_up) and when the move switched.
    let mut copied_at = None;
    let (switched_at, final_row) = loop {
        let rows = console.query("SHOW MOVES", &[]).await.unwrap();
        let row = rows.into_iter().find(|r| r.get::<_, i64>("move_id") == id).unwrap();
        let phase: String = row.get("phase");
        match phase.as_str() {
            "rolled_back" => panic!("the move rolled back: {:?}", row.get::<_, Option<String>>("error")),
            "switched" => break (Instant::now(), row),
            "catching_up" | "cutover" => {
                copied_at.get_or_insert_with(Instant::now);
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(AFTER).await;
    stop.store(true, Ordering::Relaxed);

    let mut acked = BTreeSet::new();
    let mut longest_gap = Duration::ZERO;
    let mut errors = Vec::new();
    let mut mover_writes = 0;
    for m in movers {
        let r = m.await.unwrap();
        errors.extend(r.errors);
        mover_writes += r.writes.len();
        for pair in r.writes.windows(2) {
            longest_gap = longest_gap.max(pair[1].0 - pair[0].0);
        }
        acked.extend(r.writes.iter().map(|w| w.2));
    }
    let (mut before, mut during) = (Vec::new(), Vec::new());
    for b in bystanders {
        let r = b.await.unwrap();
        errors.extend(r.errors);
        for (at, took, _) in r.writes {
            if at < move_started {
                before.push(took);
            } else if at <= switched_at {
                during.push(took);
            }
        }
    }
    before.sort();
    during.sort();
    let target_ids: BTreeSet<i64> = connect(target_conninfo)
        .await
        .query("SELECT id FROM move_a WHERE tenant_id = $1", &[&tenant])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let lost = acked.difference(&target_ids).count();

    let copied = copied_at.unwrap_or(switched_at) - move_started;
    println!(
        "move {id}: {} rows copied in {:.1} s (MOVE to catching_up, as SHOW MOVES polled every 20 ms); switched {:.1} s after MOVE",
        final_row.get::<_, i64>("rows_copied"),
        copied.as_secs_f64(),
        (switched_at - move_started).as_secs_f64()
    );
    println!(
        "catch-up lag before the cutover: {} ms; cutover pause (driver): {} ms in {} attempt(s)",
        final_row.get::<_, Option<i64>>("lag_ms").unwrap_or(-1),
        final_row.get::<_, Option<i64>>("pause_ms").unwrap_or(-1),
        final_row.get::<_, i64>("attempts"),
    );
    println!(
        "tenant {tenant}: {mover_writes} writes by {WRITERS} clients, longest gap between two acknowledged writes of one client {:.0} ms",
        ms(longest_gap)
    );
    println!(
        "other tenants ({} clients): insert p50 {:.2} ms, p99 {:.2} ms before the move ({} writes); p50 {:.2} ms, p99 {:.2} ms during it ({} writes)",
        bystanders_count(others.len()),
        ms(percentile(&before, 0.5)),
        ms(percentile(&before, 0.99)),
        before.len(),
        ms(percentile(&during, 0.5)),
        ms(percentile(&during, 0.99)),
        during.len()
    );
    println!("acknowledged writes of tenant {tenant} missing on the target: {lost} of {}", acked.len());
    println!("client errors: {}", errors.len());
    for e in errors.iter().take(5) {
        println!("  {e}");
    }
    let cleanup = Instant::now();
    console.query_one(&format!("CLEANUP MOVE {id}"), &[]).await.unwrap();
    loop {
        let rows = console.query("SHOW MOVES", &[]).await.unwrap();
        let row = rows.into_iter().find(|r| r.get::<_, i64>("move_id") == id).unwrap();
        if row.get::<_, String>("phase") == "cleaned" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("CLEANUP MOVE (the source's rows deleted): {:.1} s", cleanup.elapsed().as_secs_f64());
}

fn bystanders_count(tenants: usize) -> usize {
    tenants * OTHER_WRITERS
}
