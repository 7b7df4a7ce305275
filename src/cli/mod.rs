//! Command line: `serve`, `dev`, `check-config`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "pgtenant",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("PGTENANT_GIT_REVISION"), ")"),
    about = "Tenant-aware PostgreSQL connection proxy"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the proxy from a configuration file.
    Serve {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Start local shard clusters with demo tenants and serve them on 127.0.0.1:6432.
    Dev {
        /// State directory (clusters, certificates); reused on the next start.
        #[arg(long, default_value = ".pgtenant-dev")]
        dir: PathBuf,
        /// Port of the proxy.
        #[arg(long, default_value_t = 6432)]
        port: u16,
        /// First port of the shard clusters (shard 1, then shard 2, the catalog, then
        /// the replicas).
        #[arg(long, default_value_t = 6442)]
        shard_port: u16,
        /// Shard clusters; shard i holds tenants (i - 1) * 1000 + 1 ..= i * 1000.
        #[arg(long, default_value_t = 2)]
        shards: u16,
        /// Streaming replicas of each shard (pg_basebackup, physical slots), so that
        /// failover can be tried locally: stop a shard's primary and promote its replica.
        #[arg(long, default_value_t = 1)]
        replicas: u16,
        /// Let the proxy promote a shard's replica itself when the primary is down
        /// (`[health] auto_promote`), instead of leaving it to you.
        #[arg(long)]
        auto_promote: bool,
        /// Port of the HTTP endpoints (`/metrics`, `/healthz`, `/readyz`); 0 turns them off.
        #[arg(long, default_value_t = 9930)]
        http_port: u16,
        /// Tokio worker threads of the proxy; 0 means one per core, 1 a single-threaded runtime.
        #[arg(long, default_value_t = 0)]
        workers: usize,
        /// Serve each client on one of `workers` single-threaded runtimes
        /// (`[proxy] thread_per_core`).
        #[arg(long)]
        thread_per_core: bool,
    },
    /// Validate a configuration file and list every problem.
    CheckConfig { file: PathBuf },
    /// GET an HTTP URL (`http://host:port/path`) and exit 0 on a 2xx answer: a health
    /// check for images without curl (`pgtenant probe http://127.0.0.1:9930/healthz`).
    Probe { url: String },
}
