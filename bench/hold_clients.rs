//! The client of `bench/idle_clients.sh`: opens N connections through the proxy,
//! each running one statement first, then holds them (idle), or keeps each busy
//! with a statement after another (active), until stdin closes or SECONDS pass.
//!
//!   hold_clients idle N CONNINFO SECONDS
//!   hold_clients fresh N CONNINFO SECONDS   (idle, never having run a statement)
//!   hold_clients active N CONNINFO SECONDS

use std::time::{Duration, Instant};

use tokio_postgres::NoTls;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, n, conninfo, seconds) = match args.as_slice() {
        [mode, n, conninfo, seconds] => (
            mode.clone(),
            n.parse::<usize>().expect("N"),
            conninfo.clone(),
            seconds.parse::<u64>().expect("SECONDS"),
        ),
        _ => return eprintln!("usage: hold_clients idle|fresh|active N CONNINFO SECONDS"),
    };
    let started = Instant::now();
    let mut clients = Vec::with_capacity(n);
    for i in 0..n {
        let (client, conn) = match tokio_postgres::connect(&conninfo, NoTls).await {
            Ok(c) => c,
            Err(e) => return eprintln!("connection {i}: {e}"),
        };
        tokio::spawn(conn);
        if mode != "fresh" {
            client.simple_query("SELECT 1").await.expect("first statement");
        }
        clients.push(client);
    }
    println!("{n} clients connected in {:.1} s", started.elapsed().as_secs_f64());
    let until = Instant::now() + Duration::from_secs(seconds);
    if mode == "active" {
        let mut tasks = Vec::new();
        for client in clients.drain(..) {
            tasks.push(tokio::spawn(async move {
                let mut done = 0u64;
                while Instant::now() < until {
                    client.simple_query("SELECT 1").await.expect("statement");
                    done += 1;
                }
                done
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        println!("{total} statements");
    } else {
        tokio::time::sleep_until(until.into()).await;
    }
}
