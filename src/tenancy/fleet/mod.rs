//! Fleet commands (issue 53): DRAIN SHARD, REBALANCE and ISOLATE TENANT, each a plan of
//! tenant moves (`plan`) worked out from the shards in the catalog, the tenants each
//! holds (its map rows, and the tenants its tables hold that route to it) and the load
//! every proxy counted for each (`loads`, from each one's `observe::tenants`), then run
//! as a batch (`driver`): at most `parallel` online moves at a time within a copy
//! budget, through the moves' own machinery, its state in the catalog (`catalog`),
//! taken over by another proxy if its driver dies.
//!
//! - `plan`: who moves where, a pure function; `loads`: the fleet's counts it weighs.
//! - `catalog`: the batch and its steps; `row`, a batch as read from there.
//! - `driver`: runs one batch; `watch` takes over batches whose driver is gone;
//!   `copy_budget`: when its next move may start under a copy-bandwidth budget.

pub mod catalog;
mod copy_budget;
mod driver;
mod loads;
pub mod plan;
pub mod row;

use std::sync::Arc;

pub use catalog::{BatchRow, StepRow};
pub use plan::{PlanError, Step};

use crate::directory::ShardId;
use crate::tenancy::moves::{MoveError, MoveService};

/// Tenants read from one shard's tables at most (a plan of more is refused).
const MAX_TENANTS_PER_SHARD: i64 = 100_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FleetCommand {
    Drain { shard: ShardId },
    Rebalance { shards: Option<Vec<ShardId>> },
    Isolate { tenant: i64, to: Option<ShardId> },
}

impl std::fmt::Display for FleetCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FleetCommand::Drain { shard } => write!(f, "DRAIN SHARD {shard}"),
            FleetCommand::Rebalance { shards: None } => write!(f, "REBALANCE"),
            FleetCommand::Rebalance { shards: Some(ids) } => {
                let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
                write!(f, "REBALANCE SHARDS {}", ids.join(", "))
            }
            FleetCommand::Isolate { tenant, to: None } => write!(f, "ISOLATE TENANT {tenant}"),
            FleetCommand::Isolate { tenant, to: Some(shard) } => {
                write!(f, "ISOLATE TENANT {tenant} TO SHARD {shard}")
            }
        }
    }
}

/// How a batch runs: at most `parallel` moves at once, and, with a copy-bandwidth
/// budget (bytes a second), the next move starts only while the batch has copied at
/// most `bandwidth` times its age (PostgreSQL's copy has no throttle of its own, so
/// the budget spaces the moves out: an average over the batch, not a cap per second).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunOptions {
    pub parallel: u32,
    pub bandwidth: Option<u64>,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self { parallel: 2, bandwidth: None }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FleetError {
    #[error("{0}")]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Move(#[from] MoveError),
    #[error("catalog: {0}")]
    Catalog(String),
    #[error("shard {shard}: {reason}")]
    Shard { shard: ShardId, reason: String },
    #[error("shard {shard} holds more than {MAX_TENANTS_PER_SHARD} tenants: plan in parts")]
    TooManyTenants { shard: ShardId },
    #[error("name the database whose tables move: ... DATABASE <name> (or set [moves] database)")]
    NoDatabase,
    #[error("batch {0} does not exist")]
    UnknownBatch(i64),
    #[error("batch {id} is {state}: nothing to {what}")]
    NotPausable { id: i64, state: String, what: &'static str },
}

/// Works out `command`'s plan for the tenant tables of `dbname`.
pub async fn plan(svc: &MoveService, command: &FleetCommand, dbname: &str) -> Result<Vec<Step>, FleetError> {
    let catalog = svc.catalog_client().await?;
    let mut shards = catalog::shards(&catalog).await?;
    let counted = loads::gather(svc, &catalog).await?.transactions;
    for shard in &mut shards {
        if shard.status == plan::ShardStatus::Disabled {
            continue;
        }
        let found = tenants_in_tables(svc, shard.id, dbname).await?;
        // Rows of a tenant routed elsewhere (left by a move not cleaned up) are not its.
        let routed: Vec<i64> = catalog
            .query(
                "SELECT t FROM unnest($1::bigint[]) t WHERE pgtenant.shard_of(t) = $2",
                &[&found, &(shard.id as i16)],
            )
            .await
            .map_err(|e| FleetError::Catalog(e.to_string()))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut tenants: Vec<i64> = shard.tenants.iter().map(|(t, _)| *t).chain(routed).collect();
        tenants.sort_unstable();
        tenants.dedup();
        shard.tenants = tenants.into_iter().map(|t| (t, 1 + counted.get(&t).copied().unwrap_or(0))).collect();
    }
    Ok(match command {
        FleetCommand::Drain { shard } => plan::drain(&shards, *shard)?,
        FleetCommand::Rebalance { shards: among } => plan::rebalance(&shards, among.as_deref())?,
        FleetCommand::Isolate { tenant, to } => plan::isolate(&shards, *tenant, *to)?,
    })
}

/// The distinct tenants the tables of `dbname` on `shard` hold (every table with the
/// tenant column outside the system schemas, partitions through their parents).
async fn tenants_in_tables(svc: &MoveService, shard: ShardId, dbname: &str) -> Result<Vec<i64>, FleetError> {
    let failed = |e: tokio_postgres::Error| FleetError::Shard { shard, reason: e.to_string() };
    let client = svc.shard_client(shard, dbname).await?;
    let tables = tenant_tables(&client, svc.tenant_column()).await.map_err(failed)?;
    if tables.is_empty() {
        return Ok(Vec::new());
    }
    let column = crate::tenancy::moves::quote_ident(svc.tenant_column());
    let union: Vec<String> =
        tables.iter().map(|t| format!("SELECT {column}::bigint AS t FROM {t}")).collect();
    let sql = format!(
        "SELECT DISTINCT t FROM ({}) x WHERE t IS NOT NULL LIMIT {}",
        union.join(" UNION "),
        MAX_TENANTS_PER_SHARD + 1
    );
    let found: Vec<i64> = client.query(&sql, &[]).await.map_err(failed)?.iter().map(|r| r.get(0)).collect();
    if found.len() as i64 > MAX_TENANTS_PER_SHARD {
        return Err(FleetError::TooManyTenants { shard });
    }
    Ok(found)
}

/// The tables of the connected database with the tenant column `column` (quoted
/// `schema.table`, partitions through their parents).
async fn tenant_tables(
    client: &tokio_postgres::Client,
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

/// Plans `command` and runs it as a batch driven by this proxy (DRAIN SHARD first marks
/// the shard draining, so that placement skips it); the batch's id.
pub async fn start(
    svc: &Arc<MoveService>,
    command: &FleetCommand,
    dbname: &str,
    options: &RunOptions,
) -> Result<i64, FleetError> {
    let mut catalog = svc.catalog_client().await?;
    if let FleetCommand::Drain { shard } = command {
        catalog::set_draining(&catalog, *shard).await?;
    }
    let steps = plan(svc, command, dbname).await?;
    let parallel = options.parallel.clamp(1, 64) as i32;
    let bandwidth = options.bandwidth.map(|b| b.min(i64::MAX as u64) as i64);
    let how = (parallel, bandwidth);
    let id = catalog::create(&mut catalog, &command.to_string(), dbname, how, &steps, &svc.proxy_id).await?;
    tracing::info!(batch = id, command = %command, moves = steps.len(), "fleet batch planned");
    tokio::spawn(driver::drive(svc.clone(), id));
    Ok(id)
}

pub async fn batches(svc: &MoveService) -> Result<Vec<BatchRow>, FleetError> {
    catalog::batches(&svc.catalog_client().await?).await
}

/// The steps of batch `id`, or of the newest one.
pub async fn steps(svc: &MoveService, id: Option<i64>) -> Result<Vec<StepRow>, FleetError> {
    let client = svc.catalog_client().await?;
    let Some(id) = (match id {
        Some(id) => Some(id),
        None => catalog::newest(&client).await?,
    }) else {
        return Ok(Vec::new());
    };
    catalog::batch(&client, id).await?;
    catalog::steps(&client, id).await
}

/// PAUSE REBALANCE / RESUME REBALANCE of batch `id`, or of every batch not ended.
pub async fn set_paused(
    svc: &MoveService,
    id: Option<i64>,
    paused: bool,
) -> Result<Vec<BatchRow>, FleetError> {
    let client = svc.catalog_client().await?;
    let (want, what) = if paused { ("paused", "pause") } else { ("running", "resume") };
    let ids: Vec<i64> = match id {
        Some(id) => vec![id],
        None => catalog::batches(&client)
            .await?
            .into_iter()
            .filter(|b| b.state == "running" || b.state == "paused")
            .map(|b| b.id)
            .collect(),
    };
    let mut changed = Vec::with_capacity(ids.len());
    for id in ids {
        catalog::set_paused(&client, id, paused).await?;
        let batch = catalog::batch(&client, id).await?;
        if batch.state != want {
            return Err(FleetError::NotPausable { id, state: batch.state, what });
        }
        changed.push(batch);
    }
    Ok(changed)
}

/// Every proxy with a catalog: drives the batches its move agent took over from a
/// driver that is gone (the agent asks the catalog on its own connection, every
/// `[moves] proxy_stale_ms`), until `stop`.
pub async fn watch(svc: Arc<MoveService>, mut stop: tokio::sync::watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = svc.batches_orphaned.notified() => {}
            _ = stop.changed() => return,
        }
        let ids: Vec<i64> = std::mem::take(&mut *crate::tenancy::moves::lock(&svc.orphaned_batches));
        for id in ids {
            tracing::warn!(batch = id, "fleet batch taken over: its driver is gone");
            tokio::spawn(driver::drive(svc.clone(), id));
        }
    }
}
