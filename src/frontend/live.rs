//! The settings a RELOAD changes for sessions already running, read where they act
//! instead of from the configuration each session started with: the session timeouts,
//! and the certificate offered to new TLS clients (`Shared::client_tls`).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::ProxyConfig;

/// The session timeouts in force, in ms (0: off); see `session::deadline`.
#[derive(Default)]
pub struct LiveTimeouts {
    idle_transaction: AtomicU64,
    client_idle: AtomicU64,
    transaction: AtomicU64,
    query: AtomicU64,
}

/// One reading of `LiveTimeouts`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timeouts {
    pub idle_transaction_ms: u64,
    pub client_idle_ms: u64,
    pub transaction_ms: u64,
    pub query_ms: u64,
}

impl LiveTimeouts {
    pub fn of(proxy: &ProxyConfig) -> Self {
        let live = LiveTimeouts::default();
        live.set(proxy);
        live
    }

    /// Takes the values of `proxy` (a RELOAD's file; `config::LIVE_KEYS` names them).
    pub fn set(&self, proxy: &ProxyConfig) {
        self.idle_transaction.store(proxy.idle_transaction_timeout_ms, Ordering::Relaxed);
        self.client_idle.store(proxy.client_idle_timeout_ms, Ordering::Relaxed);
        self.transaction.store(proxy.transaction_timeout_ms, Ordering::Relaxed);
        self.query.store(proxy.query_timeout_ms, Ordering::Relaxed);
    }

    pub fn get(&self) -> Timeouts {
        Timeouts {
            idle_transaction_ms: self.idle_transaction.load(Ordering::Relaxed),
            client_idle_ms: self.client_idle.load(Ordering::Relaxed),
            transaction_ms: self.transaction.load(Ordering::Relaxed),
            query_ms: self.query.load(Ordering::Relaxed),
        }
    }
}
