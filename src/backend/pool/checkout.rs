//! How a connection is checked out of a pool: at once when a place is free and a
//! connection idle (most checkouts), else after a wait in the tenant's line and, when
//! none is idle, the opening of a new one.

use std::time::Instant;

use super::{NodePool, PooledConn, Pools, ServerPool};
use crate::backend::error::CheckoutError;
use crate::backend::pick::Wanted;
use crate::backend::share::{GateError, ShareKey, SharePermit};
use crate::directory::ShardId;
use crate::observe::stats::PoolStats;

impl Pools {
    /// Checks out a connection for `tenant`'s work from a pool handle kept by the
    /// caller (see `pool`), waiting in the tenant's line when the pool is busy.
    pub async fn checkout_from(
        &self,
        pool: &ServerPool,
        shard: ShardId,
        tenant: &ShareKey,
        wanted: Wanted<'_>,
    ) -> Result<PooledConn, CheckoutError> {
        let pool = &pool.0;
        let waited_ms = self.config.proxy.checkout_timeout_ms;
        let taken = pool.gate.acquire(tenant, self.config.proxy.checkout_timeout()).await;
        let permit = taken.map_err(|e| match e {
            GateError::Timeout => CheckoutError::Exhausted { shard, size: pool.gate.size(), waited_ms },
            GateError::Closed => CheckoutError::Closed { shard },
        })?;
        let taken =
            pool.take(permit, wanted).await.map_err(|source| CheckoutError::Unreachable { shard, source })?;
        Ok(taken.counted(&pool.stats))
    }

    /// An idle connection of `pool` if one can be had now, without waiting in line or
    /// opening one: the common checkout, made without the futures (and their state,
    /// moved into each wait) of `checkout_from`, which the caller falls back on when
    /// this gives `None`. Not tried while the gate has no free place or others wait
    /// (read without its lock): that checkout most likely waits, and would otherwise
    /// be looked at under the lock twice.
    pub fn checkout_at_once(
        &self,
        pool: &ServerPool,
        shard: ShardId,
        tenant: &ShareKey,
        wanted: Wanted<'_>,
    ) -> Result<Option<PooledConn>, CheckoutError> {
        if !pool.has_free_place() {
            return Ok(None);
        }
        let pool = &pool.0;
        let Some(permit) = place_now(pool, shard, tenant)? else { return Ok(None) };
        // Without an idle connection the place goes back with the permit, and the
        // caller's checkout asks again and opens one.
        let Some(conn) = pool.take_idle(wanted) else { return Ok(None) };
        Ok(Some(Taken { conn: pool.hand_out(conn, permit), since: None }.counted(&pool.stats)))
    }

    /// A connection from `pool` if one can be had without waiting (an idle one, or room
    /// for a new one); `None` when all are busy.
    pub async fn checkout_if_free(
        &self,
        pool: &ServerPool,
        shard: ShardId,
        tenant: &ShareKey,
        wanted: Wanted<'_>,
    ) -> Result<Option<PooledConn>, CheckoutError> {
        let pool = &pool.0;
        let Some(permit) = place_now(pool, shard, tenant)? else { return Ok(None) };
        let taken =
            pool.take(permit, wanted).await.map_err(|source| CheckoutError::Unreachable { shard, source })?;
        Ok(Some(taken.counted(&pool.stats)))
    }
}

/// A place in `pool` for `tenant` if one is free now for it.
fn place_now(
    pool: &NodePool,
    shard: ShardId,
    tenant: &ShareKey,
) -> Result<Option<SharePermit>, CheckoutError> {
    pool.gate.try_acquire(tenant).map_err(|_| CheckoutError::Closed { shard })
}

/// A checked-out connection, and since when its checkout waited (`None`: a place was
/// free and an idle connection at hand, so the clock was not read).
pub(super) struct Taken {
    pub(super) conn: PooledConn,
    pub(super) since: Option<Instant>,
}

impl Taken {
    /// The connection, its checkout's wait counted in `stats`.
    fn counted(self, stats: &PoolStats) -> PooledConn {
        stats.checkout(self.since.map_or(0, |since| since.elapsed().as_micros() as u64));
        self.conn
    }
}
