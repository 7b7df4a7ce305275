//! Runs one fleet batch: keeps at most its `parallel` moves going, starts the next
//! pending step as one ends, asks each switched move to clean up its source rows (a step
//! is done once they are gone), and ends the batch done, or failed at the first move
//! that could not start or rolled back, with the reason (every tenant stays served: a
//! failed move leaves its tenant on the source). Paused: starts nothing, the running
//! moves finish. Every round reads the batch from the catalog, so a PAUSE from any
//! proxy, or another proxy having taken the batch over, is seen within a round.

use std::sync::Arc;
use std::time::Duration;

use super::FleetError;
use super::catalog::{self, StepRow};
use super::copy_budget;
use crate::tenancy::moves::{MoveService, Phase, Request};

/// Between two rounds of a batch.
const ROUND: Duration = Duration::from_millis(500);

/// Drives batch `id` until it ends, another proxy drives it, or the proxy stops, on
/// one catalog connection (made again when it breaks).
pub(super) async fn drive(svc: Arc<MoveService>, id: i64) {
    let mut client: Option<tokio_postgres::Client> = None;
    loop {
        if client.as_ref().is_none_or(tokio_postgres::Client::is_closed) {
            client = svc.catalog_client().await.inspect_err(|e| tracing::warn!(batch = id, error = %e, "fleet batch: no catalog connection; retrying")).ok();
        }
        let result = match &client {
            Some(client) => round(&svc, client, id).await,
            None => Ok(Round::Going),
        };
        match result {
            Ok(Round::Over) => return,
            Ok(Round::Going) => {}
            // The catalog or a shard did not answer: the next round tries again.
            Err(e) => tracing::warn!(batch = id, error = %e, "fleet batch round failed; retrying"),
        }
        if svc.is_stopping() {
            return;
        }
        tokio::time::sleep(ROUND).await;
    }
}

enum Round {
    Going,
    Over,
}

async fn round(
    svc: &Arc<MoveService>,
    client: &tokio_postgres::Client,
    id: i64,
) -> Result<Round, FleetError> {
    let batch = catalog::batch(client, id).await?;
    let ours = batch.driver.as_deref() == Some(svc.proxy_id.as_str());
    if !ours || !matches!(batch.state.as_str(), "running" | "paused") {
        return Ok(Round::Over);
    }
    svc.saw_batch(&batch);
    let steps = catalog::steps(client, id).await?;
    let mut moving = 0;
    for step in steps.iter().filter(|s| s.state == "moving") {
        let Some(move_id) = step.move_id else { continue };
        let mv = MoveService::move_row_on(client, move_id).await?;
        match mv.phase {
            Phase::Cleaned => catalog::set_step(client, id, step.seq, "done", None).await?,
            Phase::RolledBack => {
                catalog::set_step(client, id, step.seq, "failed", None).await?;
                let reason = format!(
                    "move {move_id} of tenant {} from shard {} to shard {} rolled back: {}",
                    mv.tenant,
                    mv.source,
                    mv.target,
                    mv.error.as_deref().unwrap_or("asked for")
                );
                return fail(svc, client, id, &reason).await;
            }
            Phase::Switched if mv.requested == Request::None => {
                MoveService::request_on(client, move_id, Request::Cleanup).await?;
                moving += 1;
            }
            _ => moving += 1,
        }
    }
    let pending: Vec<&StepRow> = steps.iter().filter(|s| s.state == "pending").collect();
    if pending.is_empty() && moving == 0 {
        catalog::finish(client, id, &svc.proxy_id, "done", None).await?;
        svc.saw_batch(&catalog::batch(client, id).await?);
        tracing::info!(batch = id, moves = steps.len(), "fleet batch done");
        return Ok(Round::Over);
    }
    if batch.state == "paused" {
        return Ok(Round::Going);
    }
    let room = (batch.parallel.max(1) as usize).saturating_sub(moving);
    // A move a driver started but did not record (it stopped in between) is adopted.
    let open: Vec<_> = if room > 0 {
        MoveService::moves_on(client).await?.into_iter().filter(|m| !m.phase.has_ended()).collect()
    } else {
        Vec::new()
    };
    let mut charged = match batch.bandwidth {
        Some(_) => catalog::charged_bytes(client, id).await?,
        None => 0,
    };
    for step in pending.into_iter().take(room) {
        let (tenant, target) = (step.step.tenant, step.step.target);
        if let Some(mv) = open.iter().find(|m| m.tenant == tenant && m.target == target) {
            catalog::set_step(client, id, step.seq, "moving", Some(mv.id)).await?;
            continue;
        }
        if let Some(bytes_a_second) = batch.bandwidth {
            let bytes = match step.est_bytes {
                Some(bytes) => bytes,
                None => {
                    let bytes =
                        copy_budget::tenant_bytes(svc, step.step.source, &batch.dbname, tenant).await?;
                    catalog::set_step_bytes(client, id, step.seq, bytes).await?;
                    bytes
                }
            };
            let allowed = bytes_a_second as f64 * batch.seconds;
            if !copy_budget::may_start(allowed, charged, moving, bytes) {
                break;
            }
            charged += bytes;
            moving += 1;
        }
        match svc.start_move(tenant, target, Some(batch.dbname.clone())).await {
            Ok(mv) => catalog::set_step(client, id, step.seq, "moving", Some(mv.id)).await?,
            Err(e) => {
                catalog::set_step(client, id, step.seq, "failed", None).await?;
                let reason = format!("tenant {tenant} to shard {target}: {e}");
                return fail(svc, client, id, &reason).await;
            }
        }
    }
    Ok(Round::Going)
}

async fn fail(
    svc: &MoveService,
    client: &tokio_postgres::Client,
    id: i64,
    reason: &str,
) -> Result<Round, FleetError> {
    tracing::warn!(batch = id, reason, "fleet batch stopped");
    catalog::finish(client, id, &svc.proxy_id, "failed", Some(reason)).await?;
    svc.saw_batch(&catalog::batch(client, id).await?);
    Ok(Round::Over)
}
