//! A batch's copy-bandwidth budget (`BANDWIDTH n MB`, bytes a second over the batch's
//! run). PostgreSQL's initial copy has no throttle, so the budget decides when the next
//! move may start: each move is charged the size of its tenant's rows (measured on the
//! source before it starts, `pg_column_size` of every row of every tenant table; the
//! bytes it really copied once known, whichever is more), and a move starts only while
//! the batch's charges, its own included, are within the budget times the batch's age.
//! The first move, or one with nothing else running, needs only the earlier charges
//! paid, so a tenant larger than the budget still moves.

use tokio_postgres::Client;

use super::FleetError;
use crate::directory::ShardId;
use crate::tenancy::moves::{MoveService, quote_ident};

/// The tables of the connected database with the tenant column `column` (quoted
/// `schema.table`, partitions through their parents).
pub(super) async fn tenant_tables(
    client: &Client,
    column: &str,
) -> Result<Vec<String>, tokio_postgres::Error> {
    Ok(client
        .query(
            "SELECT format('%I.%I', n.nspname, c.relname)
             FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE a.attname = $1 AND a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'p')
               AND NOT c.relispartition AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'pgtenant')",
            &[&column],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

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
    let mut bytes = 0;
    for table in tenant_tables(&client, column).await.map_err(failed)? {
        let sql = format!(
            "SELECT coalesce(sum(pg_column_size(t.*)), 0)::bigint FROM {table} t WHERE {} = $1",
            quote_ident(column)
        );
        bytes += client.query_one(&sql, &[&tenant]).await.map_err(failed)?.get::<_, i64>(0);
    }
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
