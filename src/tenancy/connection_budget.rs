//! This proxy's slices of the connection budgets the fleet shares (issue 56): a
//! shard's server connections for one role, `connection_budget` in the catalog, leased
//! a slice per proxy (`pgtenant.lease_connections`, see `sql/catalog.sql`) by the
//! moves' agent on its tick and whenever a connection waits for a slot. The slices
//! themselves are caps over the pools (`backend::ServerCaps`): a request over the
//! slice waits for a slot, as for a full pool, and never makes the server refuse a
//! connection. A proxy that cannot renew its leases shrinks its slices to nothing
//! before they expire in the catalog, where another proxy may be given them.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::backend::ServerCaps;
use crate::directory::ShardId;

/// A slice's size once its budget is gone: as large as the pools make it (a semaphore
/// takes at most `usize::MAX >> 3` permits).
const NO_BUDGET: usize = usize::MAX >> 4;

/// What the lease rounds keep between them.
pub struct Leases {
    ttl: Duration,
    renewed: Instant,
}

impl Leases {
    /// Leases lasting `ttl` (the fleet's `proxy_stale_ms`).
    pub fn new(ttl: Duration) -> Self {
        Self { ttl, renewed: Instant::now() }
    }

    /// Reads the budgets and renews every slice this proxy has; on a catalog error,
    /// shrinks every slice to nothing once its lease may have run out (80 % of it).
    pub async fn round(
        &mut self,
        caps: &ServerCaps,
        proxy: &str,
        client: &Client,
    ) -> Result<(), tokio_postgres::Error> {
        match renew(caps, proxy, client, self.ttl).await {
            Ok(()) => {
                self.renewed = Instant::now();
                Ok(())
            }
            Err(e) => {
                self.lapse_if_stale(caps);
                Err(e)
            }
        }
    }

    /// When the slices must be given up if not renewed by then: 80 % of the lease,
    /// before the catalog may give them to another proxy.
    pub fn lapse_at(&self) -> Instant {
        self.renewed + self.ttl.mul_f64(0.8)
    }

    /// Shrinks every slice to nothing once its lease may have run out.
    pub fn lapse_if_stale(&self, caps: &ServerCaps) {
        if Instant::now() < self.lapse_at() {
            return;
        }
        for slice in caps.slices().into_iter().filter(|s| s.size > 0) {
            tracing::warn!(shard = slice.shard, role = %slice.role, "connection budget: lease not renewed; this proxy's slice lapses");
            caps.resize_slice(slice.shard, &slice.role, 0);
        }
    }
}

async fn renew(
    caps: &ServerCaps,
    proxy: &str,
    client: &Client,
    ttl: Duration,
) -> Result<(), tokio_postgres::Error> {
    let budgeted: HashSet<(ShardId, String)> = client
        .query("SELECT shard_id, username FROM pgtenant.connection_budget", &[])
        .await?
        .iter()
        .map(|r| (r.get::<_, i16>(0) as ShardId, r.get::<_, String>(1)))
        .collect();
    caps.set_budgeted(budgeted);
    let ttl_ms = ttl.as_millis() as i64;
    for slice in caps.slices() {
        let count = |n: usize| n.min(i32::MAX as usize) as i32;
        let wanted = count(slice.held + slice.waiting);
        let busy = count(slice.held.saturating_sub(slice.idle) + slice.waiting);
        let granted: Option<i32> = client
            .query_one(
                "SELECT pgtenant.lease_connections($1, $2, $3, $4, $5, $6, $7)",
                &[&proxy, &(slice.shard as i16), &slice.role, &wanted, &busy, &count(slice.held), &ttl_ms],
            )
            .await?
            .get(0);
        let size = granted.map_or(NO_BUDGET, |g| g.max(0) as usize);
        if size != slice.size {
            tracing::debug!(shard = slice.shard, role = %slice.role, from = slice.size, to = size, "connection slice resized");
        }
        caps.resize_slice(slice.shard, &slice.role, size);
    }
    Ok(())
}
