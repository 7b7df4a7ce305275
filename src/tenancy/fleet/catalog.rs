//! The fleet batches' rows in the catalog (`fleet_batch`, `fleet_step` in
//! `sql/catalog.sql`): the only state of a batch, so any proxy can show or resume it.

use tokio_postgres::Client;

use super::FleetError;
use super::plan::{ShardLoad, ShardStatus, Step};
pub use super::row::BatchRow;

#[derive(Clone, Debug)]
pub struct StepRow {
    pub batch: i64,
    pub seq: i32,
    pub step: Step,
    pub move_id: Option<i64>,
    pub state: String,
    /// The size of the tenant's rows as a copy budget charges it (measured once).
    pub est_bytes: Option<i64>,
}

fn err(e: tokio_postgres::Error) -> FleetError {
    FleetError::Catalog(e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_string()))
}

const BATCH_COLUMNS: &str = "b.batch_id, b.command, b.dbname, b.state, b.parallel, b.driver, b.error,
    to_char(b.created_at, 'YYYY-MM-DD HH24:MI:SS'), to_char(b.ended_at, 'YYYY-MM-DD HH24:MI:SS'),
    (SELECT count(*) FROM pgtenant.fleet_step s WHERE s.batch_id = b.batch_id),
    (SELECT count(*) FROM pgtenant.fleet_step s WHERE s.batch_id = b.batch_id AND s.state = 'done'),
    (SELECT count(*) FROM pgtenant.fleet_step s WHERE s.batch_id = b.batch_id AND s.state = 'failed'),
    (SELECT max(m.pause_ms) FROM pgtenant.fleet_step s JOIN pgtenant.tenant_move m USING (move_id)
     WHERE s.batch_id = b.batch_id),
    (SELECT coalesce(sum(m.rows_copied), 0)::bigint FROM pgtenant.fleet_step s JOIN pgtenant.tenant_move m USING (move_id)
     WHERE s.batch_id = b.batch_id),
    extract(epoch FROM coalesce(b.ended_at, now()) - b.created_at)::float8,
    (SELECT coalesce(sum(m.bytes_copied), 0)::bigint FROM pgtenant.fleet_step s JOIN pgtenant.tenant_move m USING (move_id)
     WHERE s.batch_id = b.batch_id),
    b.bandwidth";

fn batch_of(row: &tokio_postgres::Row) -> BatchRow {
    BatchRow {
        id: row.get(0),
        command: row.get(1),
        dbname: row.get(2),
        state: row.get(3),
        parallel: row.get(4),
        driver: row.get(5),
        error: row.get(6),
        created_at: row.get(7),
        ended_at: row.get(8),
        steps: row.get(9),
        done: row.get(10),
        failed: row.get(11),
        longest_pause_ms: row.get(12),
        rows_copied: row.get(13),
        seconds: row.get(14),
        bytes_copied: row.get(15),
        bandwidth: row.get(16),
    }
}

pub async fn batches(client: &Client) -> Result<Vec<BatchRow>, FleetError> {
    let sql = format!("SELECT {BATCH_COLUMNS} FROM pgtenant.fleet_batch b ORDER BY b.batch_id");
    Ok(client.query(&sql, &[]).await.map_err(err)?.iter().map(batch_of).collect())
}

pub async fn batch(client: &Client, id: i64) -> Result<BatchRow, FleetError> {
    let sql = format!("SELECT {BATCH_COLUMNS} FROM pgtenant.fleet_batch b WHERE b.batch_id = $1");
    let row = client.query_opt(&sql, &[&id]).await.map_err(err)?;
    row.as_ref().map(batch_of).ok_or(FleetError::UnknownBatch(id))
}

/// The newest batch's id, if any.
pub async fn newest(client: &Client) -> Result<Option<i64>, FleetError> {
    let row = client.query_one("SELECT max(batch_id) FROM pgtenant.fleet_batch", &[]).await.map_err(err)?;
    Ok(row.get(0))
}

pub async fn steps(client: &Client, batch: i64) -> Result<Vec<StepRow>, FleetError> {
    let rows = client
        .query(
            "SELECT batch_id, seq, tenant_id, source_shard, target_shard, load, move_id, state, est_bytes
             FROM pgtenant.fleet_step WHERE batch_id = $1 ORDER BY seq",
            &[&batch],
        )
        .await
        .map_err(err)?;
    Ok(rows
        .iter()
        .map(|r| StepRow {
            batch: r.get(0),
            seq: r.get(1),
            step: Step {
                tenant: r.get(2),
                source: r.get::<_, i16>(3) as u16,
                target: r.get::<_, i16>(4) as u16,
                load: r.get::<_, i64>(5) as u64,
            },
            move_id: r.get(6),
            state: r.get(7),
            est_bytes: r.get(8),
        })
        .collect())
}

/// Records the size a copy budget charges step `seq`.
pub async fn set_step_bytes(client: &Client, batch: i64, seq: i32, bytes: i64) -> Result<(), FleetError> {
    client
        .execute(
            "UPDATE pgtenant.fleet_step SET est_bytes = $3 WHERE batch_id = $1 AND seq = $2",
            &[&batch, &seq, &bytes],
        )
        .await
        .map_err(err)?;
    Ok(())
}

/// What batch `id`'s started steps are charged against its copy budget: each its
/// measured size or the bytes its move copied, whichever is more.
pub async fn charged_bytes(client: &Client, batch: i64) -> Result<i64, FleetError> {
    let row = client
        .query_one(
            "SELECT coalesce(sum(greatest(s.est_bytes, m.bytes_copied, 0)), 0)::bigint
             FROM pgtenant.fleet_step s LEFT JOIN pgtenant.tenant_move m USING (move_id)
             WHERE s.batch_id = $1 AND s.state <> 'pending'",
            &[&batch],
        )
        .await
        .map_err(err)?;
    Ok(row.get(0))
}

/// Records a batch and its steps, driven by `driver`; its id.
pub async fn create(
    client: &mut Client,
    command: &str,
    dbname: &str,
    (parallel, bandwidth): (i32, Option<i64>),
    plan: &[Step],
    driver: &str,
) -> Result<i64, FleetError> {
    let tx = client.transaction().await.map_err(err)?;
    let row = tx
        .query_one(
            "INSERT INTO pgtenant.fleet_batch (command, dbname, parallel, bandwidth, driver) VALUES ($1, $2, $3, $4, $5)
             RETURNING batch_id",
            &[&command, &dbname, &parallel, &bandwidth, &driver],
        )
        .await
        .map_err(err)?;
    let id: i64 = row.get(0);
    for (seq, step) in plan.iter().enumerate() {
        tx.execute(
            "INSERT INTO pgtenant.fleet_step (batch_id, seq, tenant_id, source_shard, target_shard, load)
             VALUES ($1, $2, $3, $4, $5, $6)",
            &[
                &id,
                &(seq as i32),
                &step.tenant,
                &(step.source as i16),
                &(step.target as i16),
                &(step.load as i64),
            ],
        )
        .await
        .map_err(err)?;
    }
    if plan.is_empty() {
        tx.execute(
            "UPDATE pgtenant.fleet_batch SET state = 'done', ended_at = now() WHERE batch_id = $1",
            &[&id],
        )
        .await
        .map_err(err)?;
    }
    tx.commit().await.map_err(err)?;
    Ok(id)
}

/// A step's move started (`move_id`), or the step ended (`state`).
pub async fn set_step(
    client: &Client,
    batch: i64,
    seq: i32,
    state: &str,
    move_id: Option<i64>,
) -> Result<(), FleetError> {
    client
        .execute(
            "UPDATE pgtenant.fleet_step SET state = $3, move_id = coalesce($4, move_id) WHERE batch_id = $1 AND seq = $2",
            &[&batch, &seq, &state, &move_id],
        )
        .await
        .map_err(err)?;
    Ok(())
}

/// Ends a batch `done` or `failed` (with `error`), if `driver` still drives it.
pub async fn finish(
    client: &Client,
    batch: i64,
    driver: &str,
    state: &str,
    error: Option<&str>,
) -> Result<(), FleetError> {
    client
        .execute(
            "UPDATE pgtenant.fleet_batch SET state = $3, error = $4, ended_at = now(), updated_at = now()
             WHERE batch_id = $1 AND driver = $2 AND state IN ('running', 'paused')",
            &[&batch, &driver, &state, &error],
        )
        .await
        .map_err(err)?;
    Ok(())
}

/// PAUSE / RESUME: `running` <-> `paused`; false when the batch was in neither.
pub async fn set_paused(client: &Client, batch: i64, paused: bool) -> Result<bool, FleetError> {
    let (from, to) = if paused { ("running", "paused") } else { ("paused", "running") };
    let n = client
        .execute(
            "UPDATE pgtenant.fleet_batch SET state = $3, updated_at = now() WHERE batch_id = $1 AND state = $2",
            &[&batch, &from, &to],
        )
        .await
        .map_err(err)?;
    Ok(n == 1)
}

/// The shards as the catalog has them, with the tenants its map places on each.
pub async fn shards(client: &Client) -> Result<Vec<ShardLoad>, FleetError> {
    let rows = client
        .query(
            "SELECT s.shard_id, s.status, s.is_active, s.capacity,
                    coalesce(array_agg(m.tenant_id) FILTER (WHERE m.tenant_id IS NOT NULL), '{}')
             FROM pgtenant.shard_config s LEFT JOIN pgtenant.tenant_shard_map m ON m.shard_id = s.shard_id
             GROUP BY s.shard_id ORDER BY s.shard_id",
            &[],
        )
        .await
        .map_err(err)?;
    Ok(rows
        .iter()
        .map(|r| {
            let status = match (r.get::<_, &str>(1), r.get::<_, bool>(2)) {
                ("active", true) => ShardStatus::Active,
                ("draining", true) => ShardStatus::Draining,
                _ => ShardStatus::Disabled,
            };
            let mapped: Vec<i64> = r.get(4);
            ShardLoad {
                id: r.get::<_, i16>(0) as u16,
                status,
                capacity: r.get::<_, i32>(3).max(1) as u64,
                tenants: mapped.into_iter().map(|t| (t, 0)).collect(),
            }
        })
        .collect())
}

/// DRAIN SHARD: the shard takes no new tenants (placement skips it).
pub async fn set_draining(client: &Client, shard: u16) -> Result<(), FleetError> {
    client
        .execute(
            "UPDATE pgtenant.shard_config SET status = 'draining' WHERE shard_id = $1 AND status = 'active'",
            &[&(shard as i16)],
        )
        .await
        .map_err(err)?;
    Ok(())
}
