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
    Dev(crate::dev::DevOptions),
    /// Validate a configuration file and list every problem.
    CheckConfig { file: PathBuf },
    /// GET an HTTP URL (`http://host:port/path`) and exit 0 on a 2xx answer: a health
    /// check for images without curl (`pgtenant probe http://127.0.0.1:9930/healthz`).
    Probe { url: String },
}
