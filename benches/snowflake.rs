//! Snowflake minting in process: IDs per second for one minter and one shard, in
//! batches like `next_ids(n)`, against the layout's ceiling (256,000 per second with
//! the default 4 + 8 split), and for several shards at once.
//!
//!   cargo bench --bench snowflake [-- <seconds per run> <batch>]
//!
//! `bench/snowflake.sh` measures the same through the proxy with pgbench.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pgtenant::snowflake::{Grant, Layout, Minter, SystemClock};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let seconds: f64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let batch: i64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let layout = Layout::default();
    let ceiling = layout.ids_per_ms() as f64 * 1000.0;
    let minter = Arc::new(Minter::new(layout, Arc::new(SystemClock), 1000));
    minter.grant(Grant { instance: 1, valid_until: None, floor_unix_ms: 0 });
    let (minted, elapsed) = runtime.block_on(async {
        let start = Instant::now();
        let mut minted = 0u64;
        let mut last = 0i64;
        while start.elapsed() < Duration::from_secs_f64(seconds) {
            let ids = minter.mint(1, batch).await.expect("mint");
            assert!(ids[0] > last, "ascending");
            last = *ids.last().unwrap();
            minted += ids.len() as u64;
        }
        (minted, start.elapsed())
    });
    let rate = minted as f64 / elapsed.as_secs_f64();
    println!(
        "in process, one minter, one shard, batches of {batch}: {rate:.0} IDs/s = {:.1} % of the layout's {ceiling:.0}",
        100.0 * rate / ceiling
    );
    // The work per ID without waiting for the clock: a millisecond's worth on each of
    // 1024 shards in turn.
    let start = Instant::now();
    let mut minted = 0u64;
    let per_ms = layout.ids_per_ms() as usize;
    let mut ids = Vec::with_capacity(per_ms);
    while start.elapsed() < Duration::from_secs_f64(seconds / 3.0) {
        for shard in 0..1024 {
            ids.clear();
            let _ = minter.try_mint(shard, per_ms, &mut ids).expect("mint");
            minted += ids.len() as u64;
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / minted as f64;
    println!("cost per ID without waiting (1024 shards in turn): {ns:.1} ns");
}
