//! One move's state machine, run by one proxy (the row's `driver`). Each step reads
//! the row again and acts on its phase, so a driver that took over after a crash
//! carries on from what the catalog says:
//!
//! - planned: preflight, publication and subscription (`set_up`) -> copying
//! - copying: the subscription copies the tenant's rows -> catching_up once every
//!   table is copied
//! - catching_up: a marker row measures the lag; under `catch_up_ms`, a cutover
//! - cutover (found at a step's start: its driver stopped mid-way): the epoch is
//!   aborted, the tenant resumes on the source -> catching_up
//! - switched: waits for CLEANUP MOVE (the source's rows deleted -> cleaned)
//! - a requested rollback: before the switch, the copy is undone; after it, the
//!   tenant is paused again, its rows copied back and its routing restored.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use super::catalog::{self, MoveRow, Phase, Request};
use super::{MoveError, MoveService, lock, shard};

const POLL: Duration = Duration::from_millis(250);

/// What a step leaves to do.
enum Next {
    Now,
    After(Duration),
    Done,
}

/// The connections a driver keeps: the catalog's and both shards'.
struct Links {
    catalog: Client,
    source: Client,
    target: Client,
    /// When the subscription's error count was first seen above 0, and that count.
    errors_since: Option<(Instant, i64)>,
}

/// The window in which the subscription's workers failing again means they will not
/// succeed: PostgreSQL retries them, and a race of a restarting worker with its slot's
/// last WAL sender fails once and then succeeds; a duplicate key fails every retry.
const ERRORS_FOR: Duration = Duration::from_secs(30);

impl Links {
    async fn open(svc: &MoveService, mv: &MoveRow) -> Result<Self, MoveError> {
        Ok(Self {
            catalog: svc.catalog_client().await?,
            source: svc.shard_client(mv.source, &mv.dbname).await?,
            target: svc.shard_client(mv.target, &mv.dbname).await?,
            errors_since: None,
        })
    }

    /// Whether the subscription's workers keep failing: two more errors within
    /// `ERRORS_FOR` of one seen (PostgreSQL retries a failed worker every 5 s).
    fn keeps_failing(&mut self, errors: i64) -> bool {
        if errors == 0 {
            return false;
        }
        match self.errors_since {
            None => {
                self.errors_since = Some((Instant::now(), errors));
                false
            }
            // Two more failures within the window: the retries fail too.
            Some((_, first)) if errors >= first + 2 => true,
            Some((since, _)) if since.elapsed() > ERRORS_FOR => {
                self.errors_since = Some((Instant::now(), errors));
                false
            }
            Some(_) => false,
        }
    }

    fn broken(&self) -> bool {
        self.catalog.is_closed() || self.source.is_closed() || self.target.is_closed()
    }
}

/// Drives move `id` until it ends, another proxy takes it over, or this proxy stops.
pub(super) async fn drive(svc: Arc<MoveService>, id: i64) {
    if !lock(&svc.driving).insert(id) {
        return;
    }
    let mut links: Option<Links> = None;
    loop {
        if svc.is_stopping() {
            break;
        }
        match step(&svc, id, &mut links).await {
            Ok(Next::Now) => {}
            Ok(Next::After(wait)) => tokio::time::sleep(wait).await,
            Ok(Next::Done) => break,
            Err(e) => {
                tracing::warn!(move_id = id, error = %e, "tenant move step failed; retrying");
                if let Some(l) = &links
                    && let Ok(mv) = catalog::load(&l.catalog, id).await
                {
                    let _ = catalog::progress(&l.catalog, &mv, None, None, Some(&e.to_string())).await;
                }
                links = None;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    lock(&svc.driving).remove(&id);
}

async fn step(svc: &Arc<MoveService>, id: i64, links: &mut Option<Links>) -> Result<Next, MoveError> {
    if links.as_ref().is_none_or(Links::broken) {
        let catalog = svc.catalog_client().await?;
        let mv = catalog::load(&catalog, id).await?;
        *links = Some(Links::open(svc, &mv).await?);
    }
    let Some(l) = links.as_mut() else { return Ok(Next::After(POLL)) };
    let mv = catalog::load(&l.catalog, id).await?;
    lock(&svc.seen).insert(id, mv.clone());
    if mv.driver.as_deref() != Some(svc.proxy_id.as_str()) || mv.phase.has_ended() {
        return Ok(Next::Done);
    }
    let me = svc.proxy_id.as_str();
    if mv.requested == Request::Rollback {
        rollback(svc, l, &mv).await?;
        return Ok(Next::Now);
    }
    match mv.phase {
        Phase::Planned => {
            set_up(svc, &l.catalog, &mv).await?;
            Ok(Next::Now)
        }
        Phase::Copying => {
            let state = copy_state(svc, l, &mv).await?;
            if l.keeps_failing(state.errors) {
                return fail(
                    l,
                    &mv,
                    me,
                    format!(
                        "shard {} refused the tenant's rows ({} errors; its server log names them, e.g. a duplicate key: the moved rows' keys must not exist on the target)",
                        mv.target, state.errors
                    ),
                )
                .await;
            }
            catalog::progress(&l.catalog, &mv, Some((state.rows, state.bytes)), None, None).await?;
            if state.ready {
                catalog::advance(&l.catalog, &mv, me, Phase::Copying, Phase::CatchingUp, "copied_at = now()")
                    .await?;
                tracing::info!(move_id = id, rows = state.rows, "tenant move copied; catching up");
                return Ok(Next::Now);
            }
            Ok(Next::After(POLL))
        }
        Phase::CatchingUp => {
            let lag = measure_lag(svc, l, &mv).await?;
            let state = copy_state(svc, l, &mv).await?;
            if l.keeps_failing(state.errors) {
                let reason = format!(
                    "shard {} failed to apply the tenant's changes ({} errors; see its server log)",
                    mv.target, state.errors
                );
                return fail(l, &mv, me, reason).await;
            }
            catalog::progress(
                &l.catalog,
                &mv,
                Some((state.rows, state.bytes)),
                lag.map(|d| d.as_millis() as i64),
                None,
            )
            .await?;
            match lag {
                Some(lag) if lag <= Duration::from_millis(svc.moves_config().catch_up_ms) => {
                    if cutover(svc, l, &mv).await? {
                        return Ok(Next::Now);
                    }
                    // An aborted attempt paused the tenant for the whole budget: as
                    // long again unpaused before the next one.
                    Ok(Next::After(Duration::from_millis(svc.moves_config().pause_timeout_ms)))
                }
                _ => Ok(Next::After(POLL)),
            }
        }
        Phase::Cutover => {
            // Its driver stopped during the pause: the flip did not happen (it would
            // have made the move switched), so the tenant goes on on the source.
            let reason = "the cutover's driver stopped during the pause; resumed on the source";
            catalog::abort_pause(&mut l.catalog, &mv, me, mv.epoch, Phase::CatchingUp, reason, 0).await?;
            Ok(Next::Now)
        }
        Phase::Switched => match mv.requested {
            Request::Cleanup => {
                let column = svc.tenant_column();
                // Replication is dropped at the switch; again here in case that failed.
                shard::stop_replication(
                    &l.source,
                    &l.target,
                    (mv.source, mv.target),
                    (id, &mv.replication_name()),
                )
                .await?;
                let deleted =
                    shard::delete_tenant_rows(&mut l.source, mv.source, &mv.tables, column, mv.tenant)
                        .await?;
                catalog::advance(
                    &l.catalog,
                    &mv,
                    me,
                    Phase::Switched,
                    Phase::Cleaned,
                    "requested = 'none', ended_at = now()",
                )
                .await?;
                tracing::info!(
                    move_id = id,
                    tenant = mv.tenant,
                    deleted,
                    "tenant move cleaned up: the source's rows are gone"
                );
                Ok(Next::Done)
            }
            _ => Ok(Next::After(Duration::from_secs(1))),
        },
        Phase::Cleaned | Phase::RolledBack => Ok(Next::Done),
    }
}

/// The preflight (see `shard::preflight`); the tables to move are recorded.
pub(super) async fn check(
    svc: &MoveService,
    catalog_client: &Client,
    mv: &MoveRow,
    source: &Client,
    target: &Client,
) -> Result<Vec<String>, MoveError> {
    // A driver resuming a move whose subscription exists has copied rows already.
    let resumed = shard::is_subscribed(target, mv.target, &mv.replication_name()).await?;
    let column = svc.tenant_column();
    let checked =
        shard::preflight(source, target, (mv.source, mv.target), column, mv.tenant, resumed).await?;
    catalog::set_tables(catalog_client, mv, &checked.tables).await?;
    Ok(checked.tables)
}

/// How the copy stands on the target.
async fn copy_state(svc: &MoveService, l: &Links, mv: &MoveRow) -> Result<shard::CopyState, MoveError> {
    let rows = shard::TenantRows { tables: &mv.tables, column: svc.tenant_column(), tenant: mv.tenant };
    shard::copy_state(&l.target, mv.target, &mv.replication_name(), rows).await
}

/// Preflight, then the publication and subscription; the move is then copying. The
/// subscription's slot waits for the transactions writing on the source to end (as any
/// logical slot does), so this takes as long as the longest of them.
pub(super) async fn set_up(
    svc: &MoveService,
    catalog_client: &Client,
    mv: &MoveRow,
) -> Result<(), MoveError> {
    let source = svc.shard_client(mv.source, &mv.dbname).await?;
    let target = svc.shard_client(mv.target, &mv.dbname).await?;
    let tables = check(svc, catalog_client, mv, &source, &target).await?;
    let conninfo = svc.source_conninfo(mv.source, &mv.dbname)?;
    let shards = (mv.source, mv.target);
    let column = svc.tenant_column();
    let rows = shard::TenantRows { tables: &tables, column, tenant: mv.tenant };
    let name = mv.replication_name();
    shard::start_replication(&source, &target, shards, (mv.id, &name), rows, &conninfo).await?;
    catalog::advance(catalog_client, mv, &svc.proxy_id, Phase::Planned, Phase::Copying, "").await?;
    tracing::info!(move_id = mv.id, ?tables, "tenant move copying");
    Ok(())
}

/// How long a change on the source takes to be applied on the target (a marker row);
/// `None` when it did not arrive within a second.
async fn measure_lag(svc: &MoveService, l: &Links, mv: &MoveRow) -> Result<Option<Duration>, MoveError> {
    // Probe tokens are negative; cutover epochs positive.
    let token = -i64::from(rand::random::<u32>()) - 1;
    let started = Instant::now();
    shard::put_marker(&l.source, mv.source, mv.id, token).await?;
    let within = Duration::from_millis(svc.moves_config().catch_up_ms.max(1000));
    while started.elapsed() < within {
        if shard::has_marker(&l.target, mv.target, mv.id, token).await? {
            let lag = started.elapsed();
            let _ = l
                .source
                .execute(
                    "DELETE FROM pgtenant.move_marker WHERE move_id = $1 AND token = $2",
                    &[&mv.id, &token],
                )
                .await;
            return Ok(Some(lag));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(None)
}

/// Every live proxy holds the tenant and saw its transactions end, within `deadline`;
/// `Err(reason)` names the proxies that did not.
async fn wait_for_acks(
    svc: &MoveService,
    l: &Links,
    mv: &MoveRow,
    epoch: i32,
    deadline: Instant,
) -> Result<Result<(), String>, MoveError> {
    let stale = svc.moves_config().proxy_stale_ms;
    loop {
        let missing = catalog::missing_acks(&l.catalog, mv, epoch, stale).await?;
        if missing.is_empty() {
            return Ok(Ok(()));
        }
        if Instant::now() >= deadline {
            return Ok(Err(format!(
                "proxies {} did not hold tenant {} with its transactions ended within {} ms",
                missing.join(", "),
                mv.tenant,
                svc.moves_config().pause_timeout_ms
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One cutover attempt: pause the tenant at every proxy, wait for the target to apply
/// the source's last change, flip the routing; or abort and resume on the source.
/// Whether it switched.
async fn cutover(svc: &MoveService, l: &mut Links, mv: &MoveRow) -> Result<bool, MoveError> {
    let me = svc.proxy_id.as_str();
    let epoch = mv.epoch + 1;
    let budget = Duration::from_millis(svc.moves_config().pause_timeout_ms);
    if !catalog::begin_pause(&mut l.catalog, mv, me, epoch, Phase::CatchingUp, Phase::Cutover).await? {
        return Ok(false);
    }
    let started = Instant::now();
    let deadline = started + budget;
    let outcome = match wait_for_acks(svc, l, mv, epoch, deadline).await? {
        Err(reason) => Err(reason),
        Ok(()) => {
            shard::put_marker(&l.source, mv.source, mv.id, i64::from(epoch)).await?;
            loop {
                if shard::has_marker(&l.target, mv.target, mv.id, i64::from(epoch)).await? {
                    break Ok(());
                }
                if Instant::now() >= deadline {
                    break Err(format!(
                        "shard {} had not applied the source's last change within {} ms",
                        mv.target,
                        budget.as_millis()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    };
    let pause_ms = started.elapsed().as_millis() as i64;
    match outcome {
        Ok(()) => {
            let version = catalog::switch(&l.catalog, mv, me, epoch, pause_ms).await?;
            tracing::info!(
                move_id = mv.id,
                tenant = mv.tenant,
                target = mv.target,
                version,
                pause_ms,
                "tenant move switched"
            );
            if let Err(e) = shard::stop_replication(
                &l.source,
                &l.target,
                (mv.source, mv.target),
                (mv.id, &mv.replication_name()),
            )
            .await
            {
                tracing::warn!(move_id = mv.id, error = %e, "replication not dropped yet (again at cleanup)");
            }
            Ok(true)
        }
        Err(reason) => {
            tracing::warn!(move_id = mv.id, tenant = mv.tenant, %reason, pause_ms, "tenant move cutover aborted");
            catalog::abort_pause(&mut l.catalog, mv, me, epoch, Phase::CatchingUp, &reason, pause_ms).await?;
            if mv.attempts + 1 >= svc.moves_config().cutover_attempts as i32 {
                let reason = format!("gave up after {} cutover attempts: {reason}", mv.attempts + 1);
                let fresh = catalog::load(&l.catalog, mv.id).await?;
                fail(l, &fresh, me, reason).await?;
            }
            Ok(false)
        }
    }
}

/// The move cannot go on: record why and roll it back.
async fn fail(l: &Links, mv: &MoveRow, driver: &str, reason: String) -> Result<Next, MoveError> {
    tracing::warn!(move_id = mv.id, tenant = mv.tenant, %reason, "tenant move failed; rolling back");
    l.catalog
        .execute(
            "UPDATE pgtenant.tenant_move SET requested = 'rollback', error = $3, updated_at = now()
             WHERE move_id = $1 AND driver = $2",
            &[&mv.id, &driver, &reason],
        )
        .await
        .map_err(|e| MoveError::from_catalog(&e))?;
    Ok(Next::Now)
}

/// Drops the replication and the target's copy of the tenant's rows (routing never
/// left the source).
pub(super) async fn undo_copy(svc: &MoveService, mv: &MoveRow) -> Result<(), MoveError> {
    let source = svc.shard_client(mv.source, &mv.dbname).await?;
    let mut target = svc.shard_client(mv.target, &mv.dbname).await?;
    shard::stop_replication(&source, &target, (mv.source, mv.target), (mv.id, &mv.replication_name()))
        .await?;
    shard::delete_tenant_rows(&mut target, mv.target, &mv.tables, svc.tenant_column(), mv.tenant).await?;
    Ok(())
}

async fn rollback(svc: &MoveService, l: &mut Links, mv: &MoveRow) -> Result<(), MoveError> {
    let me = svc.proxy_id.as_str();
    if mv.phase.before_switch() {
        if mv.paused {
            let reason = mv.error.clone().unwrap_or_else(|| "rolled back during the cutover".into());
            catalog::abort_pause(&mut l.catalog, mv, me, mv.epoch, mv.phase, &reason, 0).await?;
        }
        undo_copy(svc, mv).await?;
        catalog::rolled_back(&l.catalog, mv, me, None).await?;
        tracing::info!(move_id = mv.id, tenant = mv.tenant, "tenant move rolled back before its switch");
        return Ok(());
    }
    // Switched: the target's rows are the tenant's now. Hold the tenant everywhere,
    // copy them back, then route it back, in that order.
    let epoch = mv.epoch + 1;
    if !catalog::begin_pause(&mut l.catalog, mv, me, epoch, Phase::Switched, Phase::Switched).await? {
        return Ok(());
    }
    let started = Instant::now();
    let deadline = started + Duration::from_millis(svc.moves_config().pause_timeout_ms);
    if let Err(reason) = wait_for_acks(svc, l, mv, epoch, deadline).await? {
        let reason = format!("rollback not done: {reason}; the tenant stays on shard {}", mv.target);
        return not_rolled_back(l, mv, me, (epoch, started), &reason).await;
    }
    let column = svc.tenant_column();
    let copied = match shard::copy_back(
        &l.target,
        &mut l.source,
        (mv.source, mv.target),
        &mv.tables,
        column,
        mv.tenant,
    )
    .await
    {
        Ok(n) => n,
        Err(e) => {
            let reason = format!(
                "rollback not done, the copy back failed: {e}; the tenant stays on shard {}",
                mv.target
            );
            return not_rolled_back(l, mv, me, (epoch, started), &reason).await;
        }
    };
    catalog::unswitch(&l.catalog, mv, me, epoch, started.elapsed().as_millis() as i64).await?;
    tracing::info!(
        move_id = mv.id,
        tenant = mv.tenant,
        copied,
        "switched tenant move rolled back: rows copied back, routing restored"
    );
    shard::delete_tenant_rows(&mut l.target, mv.target, &mv.tables, column, mv.tenant).await?;
    Ok(())
}

/// A switched move's rollback did not happen: the tenant resumes on the target, the
/// reason is recorded and the request dropped, so an operator decides whether to ask
/// again.
async fn not_rolled_back(
    l: &mut Links,
    mv: &MoveRow,
    driver: &str,
    (epoch, paused_since): (i32, Instant),
    reason: &str,
) -> Result<(), MoveError> {
    let pause_ms = paused_since.elapsed().as_millis() as i64;
    catalog::abort_pause(&mut l.catalog, mv, driver, epoch, Phase::Switched, reason, pause_ms).await?;
    l.catalog
        .execute("UPDATE pgtenant.tenant_move SET requested = 'none' WHERE move_id = $1", &[&mv.id])
        .await
        .map_err(|e| MoveError::from_catalog(&e))?;
    Ok(())
}
