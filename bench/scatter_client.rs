//! The client of `bench/scatter.sh`: times a scatter-gather statement through the
//! proxy against the same statement on each shard directly (interleaved, round by
//! round), and streams a large result counting its rows without keeping them.
//!
//!   scatter_client latency ROUNDS PROXY_CONNINFO PROXY_SQL SHARD_SQL SHARD_CONNINFO...
//!   scatter_client stream PROXY_CONNINFO SQL

use std::time::Instant;

use futures_util::StreamExt;
use tokio_postgres::{Client, NoTls};

async fn connect(conninfo: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(conninfo, NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

async fn timed(client: &Client, statement: &tokio_postgres::Statement) -> f64 {
    let started = Instant::now();
    client.query(statement, &[]).await.expect("query");
    started.elapsed().as_secs_f64() * 1000.0
}

async fn latency(args: &[String]) {
    let rounds: usize = args[0].parse().expect("rounds");
    let proxy = connect(&args[1]).await;
    let proxy_statement = proxy.prepare(&args[2]).await.expect("prepare through the proxy");
    let mut shards = Vec::new();
    for conninfo in &args[4..] {
        let client = connect(conninfo).await;
        let statement = client.prepare(&args[3]).await.expect("prepare on a shard");
        shards.push((client, statement));
    }
    let (mut through, mut slowest, mut together) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds + 2 {
        let t = timed(&proxy, &proxy_statement).await;
        let mut alone: f64 = 0.0;
        for (client, statement) in &shards {
            alone = alone.max(timed(client, statement).await);
        }
        // Every shard at once, straight: the fan-out's floor on this machine.
        let started = Instant::now();
        let mut running = futures_util::stream::FuturesUnordered::new();
        for (client, statement) in &shards {
            running.push(client.query(statement, &[]));
        }
        while let Some(r) = running.next().await {
            r.expect("query");
        }
        let parallel = started.elapsed().as_secs_f64() * 1000.0;
        if round >= 2 {
            through.push(t);
            slowest.push(alone);
            together.push(parallel);
        }
    }
    let (t, s, p) = (median(through), median(slowest), median(together));
    println!(
        "through proxy {t:.1} ms | slowest shard alone {s:.1} ms | all shards at once, direct {p:.1} ms | ratio to slowest {:.2}x, to direct fan-out {:.2}x",
        t / s,
        t / p
    );
}

async fn stream(args: &[String]) {
    let client = connect(&args[0]).await;
    let started = Instant::now();
    let rows = client.query_raw(args[1].as_str(), std::iter::empty::<i32>()).await.expect("query");
    let mut rows = std::pin::pin!(rows);
    let mut n: u64 = 0;
    while let Some(row) = rows.next().await {
        row.expect("row");
        n += 1;
    }
    let secs = started.elapsed().as_secs_f64();
    println!("{n} rows in {secs:.2} s: {:.0} rows/s", n as f64 / secs);
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("latency") => latency(&args[1..]).await,
        Some("stream") => stream(&args[1..]).await,
        _ => eprintln!("usage: scatter_client latency|stream ..."),
    }
}
