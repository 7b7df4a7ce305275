//! Observability: structured logs, the counters layers keep for operators (`stats`,
//! `clients`, per tenant `tenants`), and the HTTP port that serves metrics and health (`http`). It depends
//! on no other layer: layers feed it, and `admin` reads it.

pub mod conns;
pub mod errors;
pub mod http;
pub mod moment;
pub mod scatter;
pub mod stats;
pub mod tenants;

/// Installs the tracing subscriber (text lines); `RUST_LOG` overrides the default level.
pub fn init_logging(default_level: &str) {
    init_logging_as(default_level, false);
}

/// The same, with one JSON object per line when `json` is set (`[observe] log_format`).
pub fn init_logging_as(default_level: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false);
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}
