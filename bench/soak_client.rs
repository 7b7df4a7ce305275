//! The idle side of `bench/soak.sh`: holds N connections through the proxy (each ran
//! one statement), and every 10 s drops CHURN of them at random and opens them again
//! (a client going away without a Terminate, as a killed process does, then a new
//! one), and runs a statement on PINGS others picked at random (idle clients do wake
//! up: each must still be answered after the shards' restarts and terminated server
//! connections). Once a minute it prints one line: the clients held, what it did, and
//! every error it saw, by SQLSTATE (or the driver's message when there was none).
//!
//!   soak_client N CONNINFO SECONDS [CHURN=100] [PINGS=200]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls};

/// One held connection: the client, and its connection task (aborted to drop it the
/// way a killed process does, with no Terminate).
struct Held {
    client: Arc<Client>,
    task: tokio::task::JoinHandle<()>,
}

async fn open(conninfo: &str) -> Result<Held, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(conninfo, NoTls).await?;
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    client.simple_query("SELECT 1").await?;
    Ok(Held { client: Arc::new(client), task })
}

fn describe(e: &tokio_postgres::Error) -> String {
    match e.code() {
        Some(code) => format!("{} {}", code.code(), e.as_db_error().map_or("", |d| d.message())),
        None => e.to_string(),
    }
}

#[derive(Default)]
struct Minute {
    reconnected: u64,
    pinged: u64,
    errors: BTreeMap<String, u64>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        return eprintln!("usage: soak_client N CONNINFO SECONDS [CHURN] [PINGS]");
    }
    let n: usize = args[0].parse().expect("N");
    let conninfo = args[1].clone();
    let seconds: u64 = args[2].parse().expect("SECONDS");
    let churn: usize = args.get(3).map_or(100, |c| c.parse().expect("CHURN"));
    let pings: usize = args.get(4).map_or(200, |p| p.parse().expect("PINGS"));

    let started = Instant::now();
    let mut held: Vec<Option<Held>> = Vec::with_capacity(n);
    for i in 0..n {
        match open(&conninfo).await {
            Ok(h) => held.push(Some(h)),
            Err(e) => return eprintln!("connection {i}: {}", describe(&e)),
        }
    }
    println!("{n} clients connected in {:.1} s", started.elapsed().as_secs_f64());

    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    tick.tick().await;
    let mut minute = Minute::default();
    let mut ticks = 0u64;
    while Instant::now() < until {
        tick.tick().await;
        ticks += 1;
        for _ in 0..churn {
            let i = rand::random::<u64>() as usize % n;
            if let Some(h) = held[i].take() {
                h.task.abort();
            }
            match open(&conninfo).await {
                Ok(h) => held[i] = Some(h),
                Err(e) => *minute.errors.entry(format!("connect: {}", describe(&e))).or_default() += 1,
            }
            minute.reconnected += 1;
        }
        let mut asked = Vec::with_capacity(pings);
        for _ in 0..pings {
            let i = rand::random::<u64>() as usize % n;
            if let Some(h) = &held[i] {
                let client = h.client.clone();
                let ask = tokio::time::timeout(Duration::from_secs(10), async move {
                    client.simple_query("SELECT 1").await
                });
                asked.push((i, tokio::spawn(ask)));
            }
        }
        for (i, ask) in asked {
            minute.pinged += 1;
            let failure = match ask.await {
                Ok(Ok(Ok(_))) | Err(_) => continue,
                Ok(Ok(Err(e))) => describe(&e),
                Ok(Err(_)) => "no answer within 10 s".to_string(),
            };
            *minute.errors.entry(format!("ping: {failure}")).or_default() += 1;
            // A closed connection: the application opens another.
            if held[i].as_ref().is_some_and(|h| h.client.is_closed()) {
                held[i] = open(&conninfo).await.ok();
            }
        }
        if ticks.is_multiple_of(6) {
            let connected = held.iter().flatten().filter(|h| !h.client.is_closed()).count();
            let errors: Vec<String> = minute.errors.iter().map(|(k, v)| format!("{v} x {k}")).collect();
            println!(
                "minute {}: {connected} held, {} reconnected, {} pinged, errors: [{}]",
                ticks / 6,
                minute.reconnected,
                minute.pinged,
                errors.join("; ")
            );
            minute = Minute::default();
        }
    }
}
