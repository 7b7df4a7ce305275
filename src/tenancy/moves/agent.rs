//! Every proxy's part in the moves: a heartbeat row (`proxy_instance`), the tenant
//! pauses a cutover asks for (held, drained, acknowledged in `move_ack`) and lifted
//! when told, and taking over moves whose driver stopped heartbeating. It LISTENs on
//! the proxy's shared catalog connection (`directory::CatalogLink`, the routing
//! watcher's too); after every (re)connect it applies the pauses in force. Its tick,
//! the heartbeat's period, is a fifth of `proxy_stale_ms` (1 s by default): a proxy
//! is stale after missing four.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::Deserialize;
use tokio::sync::{oneshot, watch};
use tokio_postgres::Client;

use super::{Held, MoveError, MoveService, driver, lock};
use crate::directory::TenantId;
use crate::tenancy::{PauseOutcome, PauseScope};

pub const CHANNEL: &str = "pgtenant_move";

/// Lease rounds a connection waiting for a slot asks for, at most one per this.
const DEMAND_EVERY: Duration = Duration::from_millis(20);

/// A move's message to the proxies (sent by the catalog's move functions), or a fleet
/// plan's request for every proxy's per-tenant counts (`report_loads`, with `request`).
#[derive(Debug, Deserialize)]
struct Message {
    #[serde(default)]
    move_id: i64,
    #[serde(default)]
    tenant: i64,
    #[serde(default)]
    epoch: i32,
    action: String,
    #[serde(default)]
    request: i64,
}

pub(super) async fn run(svc: Arc<MoveService>, mut stop: watch::Receiver<bool>, ready: oneshot::Sender<()>) {
    let mut ready = Some(ready);
    let mut backoff = Duration::from_millis(100);
    let stale = Duration::from_millis(svc.moves_config().proxy_stale_ms);
    let mut leases = crate::tenancy::connection_budget::Leases::new(stale);
    'sessions: loop {
        match session(&svc, &mut stop, &mut ready, &mut leases).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(error = %e, "tenant moves: no catalog connection (or a catalog without the moves' tables: re-run sql/catalog.sql); retrying");
                // Starting is not held up longer: the proxy serves, as it would with a
                // catalog that knows no moves.
                if let Some(ready) = ready.take() {
                    let _ = ready.send(());
                }
            }
        }
        // Waiting to reconnect, the connection slices lapse before their leases do.
        let wake = Instant::now() + backoff;
        while Instant::now() < wake {
            leases.lapse_if_stale(&svc.hooks.server_caps);
            let lapse = leases.lapse_at();
            let next = if lapse > Instant::now() { wake.min(lapse) } else { wake };
            tokio::select! {
                _ = tokio::time::sleep_until(next.into()) => {}
                _ = stopped(&mut stop) => break 'sessions,
            }
        }
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
    svc.stopping.store(true, Ordering::Release);
    // Gone at once rather than stale later: another proxy takes over this one's moves.
    if let Ok(client) = svc.catalog_client().await {
        let _ =
            client.execute("DELETE FROM pgtenant.proxy_instance WHERE proxy_id = $1", &[&svc.proxy_id]).await;
    }
}

/// One catalog connection's life; `Ok` when the proxy stops.
async fn session(
    svc: &Arc<MoveService>,
    stop: &mut watch::Receiver<bool>,
    ready: &mut Option<oneshot::Sender<()>>,
    leases: &mut crate::tenancy::connection_budget::Leases,
) -> Result<(), MoveError> {
    let listener =
        svc.hooks.catalog_link.listen(CHANNEL, 1024).await.map_err(|e| MoveError::from_catalog(&e))?;
    let (client, mut rx) = (listener.client, listener.notifications);
    let catalog_error = |e: tokio_postgres::Error| MoveError::from_catalog(&e);
    heartbeat(svc, &client).await?;
    // Pauses in force now (a proxy starting mid-cutover holds the tenant too).
    let rows = client
        .query("SELECT move_id, tenant_id, pause_epoch FROM pgtenant.tenant_move WHERE paused", &[])
        .await
        .map_err(catalog_error)?;
    for row in rows {
        hold(svc, &client, row.get(0), TenantId::Int(row.get(1)), row.get(2));
    }
    let caps = svc.hooks.server_caps.clone();
    // Budgets known before the proxy serves: its pools open under them.
    lease_connections(svc, leases, &client).await;
    if let Some(ready) = ready.take() {
        let _ = ready.send(());
    }
    let mut leased_at = Instant::now();
    let mut tick = tokio::time::interval(tick_of(svc.moves_config().proxy_stale_ms));
    let fleet_every = Duration::from_millis(svc.moves_config().proxy_stale_ms.max(500));
    let mut fleet_checked = std::time::Instant::now();
    loop {
        tokio::select! {
            n = rx.recv() => {
                let Some(n) = n else { return Err(MoveError::Catalog("the connection ended".into())) };
                match serde_json::from_str::<Message>(n.payload()) {
                    Ok(m) if m.action == "pause" => hold(svc, &client, m.move_id, TenantId::Int(m.tenant), m.epoch),
                    Ok(m) if m.action == "report_loads" => report_loads(svc, &client, m.request),
                    Ok(m) => release(svc, m.move_id, &TenantId::Int(m.tenant)),
                    Err(e) => tracing::warn!(payload = n.payload(), error = %e, "unreadable move message"),
                }
            }
            // A connection waits for a slot of a slice: lease more (at most every 20 ms).
            _ = caps.fleet_demand.notified() => {
                let since = leased_at.elapsed();
                if since < DEMAND_EVERY {
                    tokio::time::sleep(DEMAND_EVERY - since).await;
                }
                lease_connections(svc, leases, &client).await;
                leased_at = Instant::now();
            }
            _ = tick.tick() => {
                if client.is_closed() {
                    return Err(MoveError::Catalog("the connection ended".into()));
                }
                heartbeat(svc, &client).await?;
                lease_connections(svc, leases, &client).await;
                leased_at = Instant::now();
                take_over(svc, &client).await?;
                reconcile_pauses(svc, &client).await?;
                if fleet_checked.elapsed() >= fleet_every {
                    fleet_checked = std::time::Instant::now();
                    take_over_batches(svc, &client).await?;
                }
            }
            _ = stopped(stop) => return Ok(()),
        }
    }
}

/// Renews this proxy's slices of the fleet's connection budgets (see `connection_budget`).
async fn lease_connections(
    svc: &MoveService,
    leases: &mut crate::tenancy::connection_budget::Leases,
    client: &Client,
) {
    if let Err(e) = leases.round(&svc.hooks.server_caps, &svc.proxy_id, client).await {
        tracing::warn!(error = %e, "connection budget: the slices were not renewed");
    }
}

/// The agent's period for a fleet whose proxies are stale after `stale_ms`.
fn tick_of(stale_ms: u64) -> Duration {
    Duration::from_millis((stale_ms / 5).clamp(100, 2000))
}

async fn heartbeat(svc: &MoveService, client: &Client) -> Result<(), MoveError> {
    client
        .execute(
            "INSERT INTO pgtenant.proxy_instance AS p (proxy_id) VALUES ($1)
             ON CONFLICT (proxy_id) DO UPDATE SET seen_at = now()",
            &[&svc.proxy_id],
        )
        .await
        .map_err(|e| MoveError::from_catalog(&e))?;
    Ok(())
}

/// Holds `tenant` for move `id`'s epoch; acknowledges once its running transactions
/// here ended. Not within the pause budget: the pause is lifted again, unacknowledged
/// (the driver then aborts the epoch).
fn hold(svc: &Arc<MoveService>, client: &Arc<Client>, id: i64, tenant: TenantId, epoch: i32) {
    {
        let mut held = lock(&svc.held);
        if held.get(&id).is_some_and(|h| h.epoch >= epoch) {
            return;
        }
        held.insert(id, Held { tenant: tenant.clone(), epoch, since: Instant::now() });
    }
    let scope = PauseScope::Tenant(tenant.clone());
    svc.hooks.pauses.pause(scope.clone());
    let (svc, client) = (svc.clone(), client.clone());
    tokio::spawn(async move {
        let budget = Duration::from_millis(svc.moves_config().pause_timeout_ms);
        match svc.hooks.pauses.drain(&scope, &svc.hooks.clients, Some(budget)).await {
            PauseOutcome::Drained => {
                let acked = client
                    .execute(
                        "INSERT INTO pgtenant.move_ack (move_id, epoch, proxy_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                        &[&id, &epoch, &svc.proxy_id],
                    )
                    .await;
                if let Err(e) = acked {
                    tracing::warn!(move_id = id, epoch, error = %e, "tenant move pause not acknowledged");
                }
            }
            PauseOutcome::Resumed => {}
            PauseOutcome::TimedOut { running } => {
                // The drain lifted the pause; the driver will abort this epoch.
                tracing::warn!(move_id = id, %tenant, running, "tenant's transactions outlasted the move's pause");
                lock(&svc.held).remove(&id);
            }
        }
    });
}

/// Answers a fleet plan's request `request` with this proxy's per-tenant transaction
/// counts (one row, off the notification loop).
fn report_loads(svc: &Arc<MoveService>, client: &Arc<Client>, request: i64) {
    let (svc, client) = (svc.clone(), client.clone());
    tokio::spawn(async move {
        let (tenants, counts): (Vec<i64>, Vec<i64>) =
            svc.tenant_loads().into_iter().map(|(t, n)| (t, n.min(i64::MAX as u64) as i64)).unzip();
        let written = client
            .execute(
                "INSERT INTO pgtenant.tenant_load_report (request_id, proxy_id, tenants, transactions)
                 VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                &[&request, &svc.proxy_id, &tenants, &counts],
            )
            .await;
        if let Err(e) = written {
            tracing::warn!(request, error = %e, "could not report this proxy's tenant loads to a fleet plan");
        }
    });
}

/// Lifts move `id`'s pause of `tenant`: its cached placement is forgotten first, so
/// the transactions held until now look it up again (the target after a switch).
fn release(svc: &MoveService, id: i64, tenant: &TenantId) {
    (svc.hooks.forget_tenant)(tenant);
    svc.hooks.pauses.resume(&PauseScope::Tenant(tenant.clone()));
    lock(&svc.held).remove(&id);
}

/// Lifts the pauses this proxy holds that the catalog no longer asks for: a "resume"
/// missed while the connection was down, or a driver that died mid-pause (its move is
/// taken over and that epoch aborted; lifted here after twice the budget, the tenant's
/// routing read again). A pause its live driver still holds stays, however long (a
/// switched move's rollback copies the rows back under it).
async fn reconcile_pauses(svc: &MoveService, client: &Client) -> Result<(), MoveError> {
    let held: Vec<(i64, i32, Duration)> =
        lock(&svc.held).iter().map(|(id, h)| (*id, h.epoch, h.since.elapsed())).collect();
    if held.is_empty() {
        return Ok(());
    }
    let ids: Vec<i64> = held.iter().map(|h| h.0).collect();
    let stale_ms = svc.moves_config().proxy_stale_ms as f64;
    let rows = client
        .query(
            "SELECT m.move_id, m.paused, m.pause_epoch,
                    EXISTS (SELECT 1 FROM pgtenant.proxy_instance p WHERE p.proxy_id = m.driver
                            AND p.seen_at > clock_timestamp() - make_interval(secs => $2::float8 / 1000.0))
             FROM pgtenant.tenant_move m WHERE m.move_id = ANY ($1)",
            &[&ids, &stale_ms],
        )
        .await
        .map_err(|e| MoveError::from_catalog(&e))?;
    let limit = Duration::from_millis(svc.moves_config().pause_timeout_ms * 2 + 1000);
    for (id, epoch, age) in held {
        let row = rows.iter().find(|r| r.get::<_, i64>(0) == id);
        let wanted = row.is_some_and(|r| {
            let (paused, current, driver_alive): (bool, i32, bool) = (r.get(1), r.get(2), r.get(3));
            paused && current == epoch && (driver_alive || age < limit)
        });
        if wanted {
            continue;
        }
        // Its own statement: a guard in an `if let` lives through the block, and
        // `release` takes the same lock (a worker thread blocked for good).
        let tenant = lock(&svc.held).get(&id).map(|h| h.tenant.clone());
        if let Some(tenant) = tenant {
            tracing::warn!(move_id = id, %tenant, "a move's pause the catalog no longer asks for; lifted");
            release(svc, id, &tenant);
        }
    }
    Ok(())
}

/// Drives the moves whose driver stopped heartbeating. Its own moves' rows are left
/// alone (their drivers run here; rewriting them every tick was needless catalog writes).
async fn take_over(svc: &Arc<MoveService>, client: &Client) -> Result<(), MoveError> {
    let stale_ms = svc.moves_config().proxy_stale_ms as f64;
    let rows = client
        .query(
            "UPDATE pgtenant.tenant_move m SET driver = $1, updated_at = now()
             WHERE m.phase NOT IN ('cleaned', 'rolled_back')
               AND (m.driver IS NULL OR (m.driver <> $1 AND NOT EXISTS (
                    SELECT 1 FROM pgtenant.proxy_instance p
                    WHERE p.proxy_id = m.driver AND p.seen_at > clock_timestamp() - make_interval(secs => $2::float8 / 1000.0))))
             RETURNING m.move_id",
            &[&svc.proxy_id, &stale_ms],
        )
        .await
        .map_err(|e| MoveError::from_catalog(&e))?;
    for row in rows {
        let id: i64 = row.get(0);
        if lock(&svc.driving).contains(&id) {
            continue;
        }
        tracing::info!(move_id = id, proxy = %svc.proxy_id, "driving a tenant move whose driver is gone");
        tokio::spawn(driver::drive(svc.clone(), id));
    }
    Ok(())
}

/// Takes over the fleet batches whose driver is gone; `tenancy::fleet` drives them.
async fn take_over_batches(svc: &MoveService, client: &Client) -> Result<(), MoveError> {
    let stale_ms = svc.moves_config().proxy_stale_ms as i64;
    let rows = client
        .query("SELECT pgtenant.take_over_fleet_batches($1, $2)", &[&svc.proxy_id, &stale_ms])
        .await
        .map_err(|e| MoveError::from_catalog(&e))?;
    if !rows.is_empty() {
        lock(&svc.orphaned_batches).extend(rows.iter().map(|r| r.get::<_, i64>(0)));
        svc.batches_orphaned.notify_one();
    }
    Ok(())
}

/// Completes once the proxy stops (never, when nobody can stop it any more).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}
