//! A batch's copy-bandwidth budget (`BANDWIDTH n MB`, bytes a second over the batch's
//! run). PostgreSQL's initial copy has no throttle, so the budget decides when the next
//! move may start: each move is charged the size of its tenant's rows (measured on the
//! source before it starts, `pg_column_size` of every row of every tenant table; the
//! bytes it really copied once known, whichever is more), and a move starts only while
//! the batch's charges, its own included, are within the budget times the batch's age.
//! The first move, or one with nothing else running, needs only the earlier charges
//! paid, so a tenant larger than the budget still moves.

use super::{FleetError, tenant_tables};
use crate::directory::ShardId;
use crate::tenancy::moves::{MoveService, TenantRows, tenant_size};

/// The size of `tenant`'s rows on `shard` (what moving it copies).
pub(super) async fn tenant_bytes(
    svc: &MoveService,
    shard: ShardId,
    dbname: &str,
    tenant: i64,
) -> Result<i64, FleetError> {
    let failed = |e: tokio_postgres::Error| FleetError::Shard { shard, reason: e.to_string() };
    let client = svc.shard_client(shard, dbname).await?;
    let column = svc.tenant_column();
    let tables = tenant_tables(&client, column).await.map_err(failed)?;
    let (_, bytes) =
        tenant_size(&client, TenantRows { tables: &tables, column, tenant }).await.map_err(failed)?;
    Ok(bytes)
}

/// Whether a move charged `next` bytes may start now, the batch having charged
/// `charged` so far with `moving` moves running, `allowed` bytes being its budget
/// times its age.
pub(super) fn may_start(allowed: f64, charged: i64, moving: usize, next: i64) -> bool {
    let wanted = if moving == 0 { charged } else { charged.saturating_add(next) };
    wanted as f64 <= allowed
}

#[cfg(test)]
mod tests {
    use super::may_start;

    #[test]
    fn the_next_move_waits_until_the_budget_has_caught_up() {
        // Nothing charged yet: the first move starts, however large.
        assert!(may_start(0.0, 0, 0, 1_000_000));
        // One running, charged 1 MB, 1 MB/s, 0.5 s in: a second waits ...
        assert!(!may_start(500_000.0, 1_000_000, 1, 10));
        // ... and once the first has ended, so does the next until the debt is paid.
        assert!(!may_start(500_000.0, 1_000_000, 0, 10));
        assert!(may_start(1_000_000.0, 1_000_000, 0, 10));
        // Paid, with room for a small one beside a running one.
        assert!(may_start(2_000_000.0, 1_000_000, 1, 500_000));
        assert!(!may_start(2_000_000.0, 1_000_000, 1, 1_500_000));
    }
}
