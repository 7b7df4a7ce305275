//! A move's row in the catalog (`pgtenant.tenant_move`), read and changed only here:
//! every change names the driver, so a proxy that lost a move to another changes nothing.

use tokio_postgres::Client;

use super::MoveError;

/// Where a move is (the catalog's `phase`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Planned,
    Copying,
    CatchingUp,
    Cutover,
    Switched,
    Cleaned,
    RolledBack,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Planned => "planned",
            Phase::Copying => "copying",
            Phase::CatchingUp => "catching_up",
            Phase::Cutover => "cutover",
            Phase::Switched => "switched",
            Phase::Cleaned => "cleaned",
            Phase::RolledBack => "rolled_back",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        [
            Phase::Planned,
            Phase::Copying,
            Phase::CatchingUp,
            Phase::Cutover,
            Phase::Switched,
            Phase::Cleaned,
            Phase::RolledBack,
        ]
        .into_iter()
        .find(|p| p.as_str() == text)
    }

    /// The phase as a number, in the order above (the `pgtenant_move_phase` metric).
    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn has_ended(self) -> bool {
        matches!(self, Phase::Cleaned | Phase::RolledBack)
    }

    /// Before the routing flipped: a rollback only undoes the copy.
    pub fn before_switch(self) -> bool {
        matches!(self, Phase::Planned | Phase::Copying | Phase::CatchingUp | Phase::Cutover)
    }
}

/// What an operator asked of a move's driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    None,
    Cleanup,
    Rollback,
}

impl Request {
    pub fn as_str(self) -> &'static str {
        match self {
            Request::None => "none",
            Request::Cleanup => "cleanup",
            Request::Rollback => "rollback",
        }
    }
}

#[derive(Clone, Debug)]
pub struct MoveRow {
    pub id: i64,
    pub tenant: i64,
    pub source: u16,
    pub target: u16,
    pub dbname: String,
    pub phase: Phase,
    pub requested: Request,
    pub driver: Option<String>,
    pub epoch: i32,
    pub paused: bool,
    /// Quoted `schema.table` names.
    pub tables: Vec<String>,
    pub rows_copied: i64,
    /// The size of those rows (sum of `pg_column_size`), what copy budgets count.
    pub bytes_copied: i64,
    /// The fleet batch it is a step of, if any.
    pub batch: Option<i64>,
    pub lag_ms: Option<i64>,
    pub pause_ms: Option<i64>,
    pub attempts: i32,
    pub error: Option<String>,
    pub created_at: String,
    pub switched_at: Option<String>,
    pub ended_at: Option<String>,
    /// Makes the names of its replication objects unique on the shards' clusters
    /// (slot names are cluster-wide; another catalog may number its moves alike).
    pub token: String,
}

impl MoveRow {
    /// The publication's, subscription's and slot's name.
    pub fn replication_name(&self) -> String {
        format!("pgtenant_move_{}_{}", self.id, self.token)
    }
}

const COLUMNS: &str = "move_id, tenant_id, source_shard, target_shard, dbname, phase, requested, driver, \
     pause_epoch, paused, tables, rows_copied, lag_ms, pause_ms, attempts, error, created_at::text, \
     switched_at::text, ended_at::text, token, bytes_copied, \
     (SELECT s.batch_id FROM pgtenant.fleet_step s WHERE s.move_id = tenant_move.move_id LIMIT 1)";

fn row_of(row: &tokio_postgres::Row) -> Result<MoveRow, MoveError> {
    let phase: String = row.get(5);
    let requested: String = row.get(6);
    Ok(MoveRow {
        id: row.get(0),
        tenant: row.get(1),
        source: row.get::<_, i16>(2) as u16,
        target: row.get::<_, i16>(3) as u16,
        dbname: row.get(4),
        phase: Phase::parse(&phase)
            .ok_or_else(|| MoveError::Catalog(format!("unknown move phase {phase:?}")))?,
        requested: match requested.as_str() {
            "cleanup" => Request::Cleanup,
            "rollback" => Request::Rollback,
            _ => Request::None,
        },
        driver: row.get(7),
        epoch: row.get(8),
        paused: row.get(9),
        tables: row.get(10),
        rows_copied: row.get(11),
        lag_ms: row.get(12),
        pause_ms: row.get(13),
        attempts: row.get(14),
        error: row.get(15),
        created_at: row.get(16),
        switched_at: row.get(17),
        ended_at: row.get(18),
        token: row.get(19),
        bytes_copied: row.get(20),
        batch: row.get(21),
    })
}

fn catalog_error(e: tokio_postgres::Error) -> MoveError {
    MoveError::from_catalog(&e)
}

pub async fn load(client: &Client, id: i64) -> Result<MoveRow, MoveError> {
    let sql = format!("SELECT {COLUMNS} FROM pgtenant.tenant_move WHERE move_id = $1");
    let row = client.query_opt(&sql, &[&id]).await.map_err(catalog_error)?;
    row_of(&row.ok_or(MoveError::UnknownMove(id))?)
}

/// Every move, oldest first.
pub async fn list(client: &Client) -> Result<Vec<MoveRow>, MoveError> {
    let sql = format!("SELECT {COLUMNS} FROM pgtenant.tenant_move ORDER BY move_id");
    client.query(&sql, &[]).await.map_err(catalog_error)?.iter().map(row_of).collect()
}

/// Plans a move (the catalog validates it); its id.
pub async fn plan(
    client: &Client,
    tenant: i64,
    target: u16,
    dbname: &str,
    driver: &str,
) -> Result<i64, MoveError> {
    let target = target as i16;
    let row = client
        .query_one("SELECT pgtenant.plan_move($1, $2, $3, $4)", &[&tenant, &target, &dbname, &driver])
        .await
        .map_err(catalog_error)?;
    Ok(row.get(0))
}

/// Moves `mv` from phase `from` to `to` (and sets `extra`, SQL assignments); false when
/// the move is no longer this driver's or not in `from`.
pub async fn advance(
    client: &Client,
    mv: &MoveRow,
    driver: &str,
    from: Phase,
    to: Phase,
    extra: &str,
) -> Result<bool, MoveError> {
    let sql = format!(
        "UPDATE pgtenant.tenant_move SET phase = $1, updated_at = now(){}{extra}
         WHERE move_id = $2 AND driver = $3 AND phase = $4",
        if extra.is_empty() { "" } else { ", " }
    );
    let n = client
        .execute(&sql, &[&to.as_str(), &mv.id, &driver, &from.as_str()])
        .await
        .map_err(catalog_error)?;
    Ok(n == 1)
}

/// Records progress (rows and bytes copied, lag) and the last problem seen.
pub async fn progress(
    client: &Client,
    mv: &MoveRow,
    copied: Option<(i64, i64)>,
    lag_ms: Option<i64>,
    error: Option<&str>,
) -> Result<(), MoveError> {
    let (rows, bytes) = (copied.map(|c| c.0), copied.map(|c| c.1));
    client
        .execute(
            "UPDATE pgtenant.tenant_move SET rows_copied = coalesce($2, rows_copied), bytes_copied = coalesce($5, bytes_copied),
                 lag_ms = coalesce($3, lag_ms), error = coalesce($4, error), updated_at = now()
             WHERE move_id = $1",
            &[&mv.id, &rows, &lag_ms, &error, &bytes],
        )
        .await
        .map_err(catalog_error)?;
    Ok(())
}

/// Asks the proxies to hold the tenant (a new epoch, counted as a cutover attempt when
/// `phase_to` is the cutover); false when the move is not this driver's in `from`.
pub async fn begin_pause(
    client: &mut Client,
    mv: &MoveRow,
    driver: &str,
    epoch: i32,
    from: Phase,
    phase_to: Phase,
) -> Result<bool, MoveError> {
    let tx = client.transaction().await.map_err(catalog_error)?;
    let attempt = i32::from(phase_to == Phase::Cutover);
    let n = tx
        .execute(
            "UPDATE pgtenant.tenant_move SET phase = $1, pause_epoch = $2, paused = true, attempts = attempts + $3,
                 updated_at = now()
             WHERE move_id = $4 AND driver = $5 AND phase = $6",
            &[&phase_to.as_str(), &epoch, &attempt, &mv.id, &driver, &from.as_str()],
        )
        .await
        .map_err(catalog_error)?;
    if n != 1 {
        return Ok(false);
    }
    notify(&tx, mv, epoch, "pause", false).await?;
    tx.commit().await.map_err(catalog_error)?;
    Ok(true)
}

/// Lifts the pause of `epoch` without a flip: back to `phase_to`, `reason` recorded.
pub async fn abort_pause(
    client: &mut Client,
    mv: &MoveRow,
    driver: &str,
    epoch: i32,
    phase_to: Phase,
    reason: &str,
    pause_ms: i64,
) -> Result<(), MoveError> {
    let tx = client.transaction().await.map_err(catalog_error)?;
    tx.execute(
        "UPDATE pgtenant.tenant_move SET phase = $1, paused = false, error = $2, pause_ms = $3, updated_at = now()
         WHERE move_id = $4 AND driver = $5",
        &[&phase_to.as_str(), &reason, &pause_ms, &mv.id, &driver],
    )
    .await
    .map_err(catalog_error)?;
    notify(&tx, mv, epoch, "resume", false).await?;
    tx.commit().await.map_err(catalog_error)
}

async fn notify(
    tx: &tokio_postgres::Transaction<'_>,
    mv: &MoveRow,
    epoch: i32,
    action: &str,
    switched: bool,
) -> Result<(), MoveError> {
    let payload = serde_json::json!({
        "move_id": mv.id, "tenant": mv.tenant, "epoch": epoch, "action": action, "switched": switched,
    })
    .to_string();
    tx.execute("SELECT pg_notify('pgtenant_move', $1)", &[&payload]).await.map_err(catalog_error)?;
    Ok(())
}

/// The live proxies (heartbeat within `stale_ms`) that have not acknowledged `epoch`.
pub async fn missing_acks(
    client: &Client,
    mv: &MoveRow,
    epoch: i32,
    stale_ms: u64,
) -> Result<Vec<String>, MoveError> {
    let stale_ms = stale_ms as f64;
    let rows = client
        .query(
            "SELECT p.proxy_id FROM pgtenant.proxy_instance p
             WHERE p.seen_at > clock_timestamp() - make_interval(secs => $3::float8 / 1000.0)
               AND NOT EXISTS (SELECT 1 FROM pgtenant.move_ack a
                               WHERE a.move_id = $1 AND a.epoch = $2 AND a.proxy_id = p.proxy_id)
             ORDER BY 1",
            &[&mv.id, &epoch, &stale_ms],
        )
        .await
        .map_err(catalog_error)?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// The flip (see `pgtenant.switch_move`); the routing version it made.
pub async fn switch(
    client: &Client,
    mv: &MoveRow,
    driver: &str,
    epoch: i32,
    pause_ms: i64,
) -> Result<i64, MoveError> {
    let row = client
        .query_one("SELECT pgtenant.switch_move($1, $2, $3, $4)", &[&mv.id, &driver, &epoch, &pause_ms])
        .await
        .map_err(catalog_error)?;
    Ok(row.get(0))
}

/// The flip back of a switched move (see `pgtenant.unswitch_move`).
pub async fn unswitch(
    client: &Client,
    mv: &MoveRow,
    driver: &str,
    epoch: i32,
    pause_ms: i64,
) -> Result<(), MoveError> {
    client
        .execute("SELECT pgtenant.unswitch_move($1, $2, $3, $4)", &[&mv.id, &driver, &epoch, &pause_ms])
        .await
        .map_err(catalog_error)?;
    Ok(())
}

/// Ends a move that never switched: rolled back, `error` kept when given.
pub async fn rolled_back(
    client: &Client,
    mv: &MoveRow,
    driver: &str,
    error: Option<&str>,
) -> Result<(), MoveError> {
    client
        .execute(
            "UPDATE pgtenant.tenant_move SET phase = 'rolled_back', requested = 'none', paused = false,
                 error = coalesce($3, error), ended_at = now(), updated_at = now()
             WHERE move_id = $1 AND driver = $2",
            &[&mv.id, &driver, &error],
        )
        .await
        .map_err(catalog_error)?;
    Ok(())
}

/// Sets what an operator asks of a move; the row as it is then.
pub async fn request(client: &Client, id: i64, request: Request) -> Result<MoveRow, MoveError> {
    let mv = load(client, id).await?;
    let allowed = match request {
        Request::Cleanup => mv.phase == Phase::Switched,
        Request::Rollback => !mv.phase.has_ended(),
        Request::None => true,
    };
    if !allowed {
        return Err(MoveError::Refused(format!(
            "move {id} is {}: {} is not possible now",
            mv.phase.as_str(),
            request.as_str()
        )));
    }
    client
        .execute(
            "UPDATE pgtenant.tenant_move SET requested = $2, updated_at = now() WHERE move_id = $1 AND phase = $3",
            &[&id, &request.as_str(), &mv.phase.as_str()],
        )
        .await
        .map_err(catalog_error)?;
    load(client, id).await
}

/// Records the tables a move copies.
pub async fn set_tables(client: &Client, mv: &MoveRow, tables: &[String]) -> Result<(), MoveError> {
    client
        .execute("UPDATE pgtenant.tenant_move SET tables = $2 WHERE move_id = $1", &[&mv.id, &tables])
        .await
        .map_err(catalog_error)?;
    Ok(())
}
