//! The watcher: LISTENs for routing changes on the proxy's shared catalog link
//! (pooled connections would drop notifications) and applies them in version order. It
//! reconnects with backoff; after every (re)connect it reloads the topology and,
//! when the version moved meanwhile, empties the tenant cache.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::Deserialize;

use super::Inner;
use super::listen::CatalogLink;
use super::load::{self, LoadError};
use crate::directory::TenantId;

pub const CHANNEL: &str = "pgtenant_routing";

/// The payload the catalog's triggers send.
#[derive(Debug, Deserialize)]
struct Change {
    version: i64,
    table: String,
    /// The tenants whose rows changed (tenant_shard_map, up to 256).
    #[serde(default)]
    tenants: Vec<String>,
    /// Too many tenants changed to list: forget every cached tenant.
    #[serde(default)]
    all_tenants: bool,
    /// When the catalog sent it (unix ms; absent from catalogs set up by older SQL).
    #[serde(default)]
    at_ms: Option<f64>,
}

/// Runs until the directory is dropped.
pub async fn run(inner: Weak<Inner>, link: Arc<CatalogLink>, addr: String) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match listen(&inner, &link).await {
            Ok(Ended::DirectoryDropped) => return,
            Ok(Ended::ConnectionLost) => {
                tracing::warn!(catalog = %addr, "catalog connection lost; cached tenants keep routing");
                backoff = Duration::from_millis(100);
            }
            Err(e) => tracing::warn!(catalog = %addr, error = %e, "cannot listen to the catalog"),
        }
        match inner.upgrade() {
            Some(inner) => inner.listening.store(false, Ordering::Release),
            None => return,
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

enum Ended {
    DirectoryDropped,
    ConnectionLost,
}

async fn listen(inner: &Weak<Inner>, link: &CatalogLink) -> Result<Ended, LoadError> {
    // Bounded: the catalog cannot make this proxy hold more than this many changes.
    let listener = link.listen(CHANNEL, 4096).await?;
    let mut rx = listener.notifications;
    // Subscribed first, then read: a change committed in between is both in the
    // snapshot and notified, and the notification is then skipped by its version.
    let Some(strong) = inner.upgrade() else { return Ok(Ended::DirectoryDropped) };
    resync(&strong).await?;
    strong.listening.store(true, Ordering::Release);
    drop(strong);
    loop {
        let message = tokio::time::timeout(Duration::from_secs(1), rx.recv()).await;
        let Some(strong) = inner.upgrade() else { return Ok(Ended::DirectoryDropped) };
        match message {
            Ok(Some(n)) => apply(&strong, n.payload()).await?,
            Ok(None) => return Ok(Ended::ConnectionLost),
            Err(_idle) => strong.close_idle_lookups(),
        }
    }
}

/// The topology now, read on a lookup connection: the snapshot's transaction must
/// not take in the queries others send on the shared LISTEN connection.
async fn snapshot(inner: &Inner) -> Result<load::Snapshot, LoadError> {
    let client =
        inner.lookups.get().await.map_err(|e| LoadError::Unavailable(super::describe_pool_error(&e)))?;
    load::snapshot(&client, inner.kind).await
}

/// Reloads the topology; when the version is not the one served, empties the cache too.
async fn resync(inner: &Inner) -> Result<(), LoadError> {
    let snapshot = snapshot(inner).await?;
    let served = inner.version.load(Ordering::Acquire);
    if snapshot.version != served {
        tracing::info!(from = served, to = snapshot.version, "routing resynchronised from the catalog");
        inner.replace_all(snapshot.topology, snapshot.version);
    } else {
        inner.replace_topology(snapshot.topology);
    }
    Ok(())
}

async fn apply(inner: &Inner, payload: &str) -> Result<(), LoadError> {
    let Ok(change) = serde_json::from_str::<Change>(payload) else {
        tracing::warn!(payload, "unreadable routing change; resynchronising");
        return resync(inner).await;
    };
    if let Some(at_ms) = change.at_ms {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_millis() as f64);
        // Clocks of two hosts may disagree: a change "from the future" counts as 0.
        inner.change_lag_ms.store((now_ms - at_ms).max(0.0) as u64, Ordering::Relaxed);
    }
    let served = inner.version.load(Ordering::Acquire);
    if change.version <= served {
        return Ok(());
    }
    if change.version != served + 1 {
        tracing::warn!(served, got = change.version, "routing changes were missed; resynchronising");
        return resync(inner).await;
    }
    match change.table.as_str() {
        "tenant_shard_map" | "tenant_shard_map_text" if change.all_tenants => {
            inner.forget_tenants(change.version)
        }
        "tenant_shard_map" | "tenant_shard_map_text" => {
            for key in &change.tenants {
                // A key of the other kind cannot be cached here: nothing to forget.
                if let Some(tenant) = TenantId::from_text_bytes(key.as_bytes(), inner.kind) {
                    inner.invalidate_tenant(&tenant);
                }
            }
            inner.version.store(change.version, Ordering::Release);
        }
        _ => {
            let snapshot = snapshot(inner).await?;
            inner.replace_topology(snapshot.topology);
            // Not the snapshot's version: later tenant changes still need their invalidations.
            inner.version.store(change.version, Ordering::Release);
        }
    }
    tracing::debug!(version = change.version, table = %change.table, tenants = ?change.tenants, "routing change applied");
    Ok(())
}
