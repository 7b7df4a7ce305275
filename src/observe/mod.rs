//! Observability: structured logs (metrics and HTTP endpoints come later).

/// Installs the tracing subscriber; `RUST_LOG` overrides the default level.
pub fn init_logging(default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_target(false).try_init();
}
