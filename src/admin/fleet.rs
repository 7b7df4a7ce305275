//! The console's fleet commands: DRAIN SHARD, REBALANCE, ISOLATE TENANT (each answers
//! its plan, as SHOW PLAN shows it; DRY RUN only plans), SHOW PLAN, SHOW BATCHES, PAUSE /
//! RESUME REBALANCE. The batches themselves are `tenancy::fleet`'s.

use super::AdminView;
use super::command::{CommandError, FleetRequest};
use super::table::{Kind, Table, int, opt_text, text};
use crate::protocol::values::Value;
use crate::tenancy::fleet::{self, BatchRow, StepRow};
use crate::tenancy::moves::MoveError;

/// The columns of SHOW PLAN and of DRAIN / REBALANCE / ISOLATE's answer.
pub fn plan_table() -> Table {
    Table::new(&[
        ("batch_id", Kind::Int8),
        ("seq", Kind::Int8),
        ("tenant_id", Kind::Int8),
        ("source", Kind::Int8),
        ("target", Kind::Int8),
        ("load", Kind::Int8),
        ("move_id", Kind::Int8),
        ("state", Kind::Text),
    ])
}

/// The columns of SHOW BATCHES and of PAUSE / RESUME REBALANCE's answer.
pub fn batch_table() -> Table {
    Table::new(&[
        ("batch_id", Kind::Int8),
        ("command", Kind::Text),
        ("database", Kind::Text),
        ("state", Kind::Text),
        ("parallel", Kind::Int8),
        ("moves", Kind::Int8),
        ("done", Kind::Int8),
        ("failed", Kind::Int8),
        ("longest_pause_ms", Kind::Int8),
        ("rows_copied", Kind::Int8),
        ("bytes_copied", Kind::Int8),
        ("bandwidth_mb", Kind::Float8),
        ("seconds", Kind::Float8),
        ("driver", Kind::Text),
        ("error", Kind::Text),
        ("created_at", Kind::Text),
        ("ended_at", Kind::Text),
    ])
}

fn plan_rows(steps: &[StepRow]) -> Table {
    let mut t = plan_table();
    for s in steps {
        t.push(vec![
            int(s.batch),
            int(s.seq),
            int(s.step.tenant),
            int(s.step.source),
            int(s.step.target),
            int(s.step.load as i64),
            s.move_id.map_or(Value::Null, int),
            text(s.state.as_str()),
        ]);
    }
    t
}

fn batch_rows(batches: Vec<BatchRow>) -> Table {
    let mut t = batch_table();
    for b in batches {
        t.push(vec![
            int(b.id),
            text(b.command),
            text(b.dbname),
            text(b.state),
            int(b.parallel),
            int(b.steps),
            int(b.done),
            int(b.failed),
            b.longest_pause_ms.map_or(Value::Null, int),
            int(b.rows_copied),
            int(b.bytes_copied),
            b.bandwidth.map_or(Value::Null, |b| Value::Float8(b as f64 / 1e6)),
            Value::Float8(b.seconds),
            opt_text(b.driver),
            opt_text(b.error),
            text(b.created_at),
            opt_text(b.ended_at),
        ]);
    }
    t
}

pub async fn run(view: &AdminView<'_>, request: FleetRequest) -> Result<Table, CommandError> {
    let svc = view.moves.ok_or(CommandError::Move(MoveError::NoCatalog))?;
    match request {
        FleetRequest::Run { command, database, options, dry_run } => {
            let dbname = database
                .or_else(|| view.config.moves.database.clone())
                .ok_or(fleet::FleetError::NoDatabase)?;
            if dry_run {
                let steps = fleet::plan(svc, &command, &dbname).await?;
                let rows: Vec<StepRow> = steps
                    .into_iter()
                    .enumerate()
                    .map(|(seq, step)| StepRow {
                        batch: 0,
                        seq: seq as i32,
                        step,
                        move_id: None,
                        state: "planned".into(),
                        est_bytes: None,
                    })
                    .collect();
                let mut table = plan_rows(&rows);
                table.rows.iter_mut().for_each(|r| r[0] = Value::Null);
                return Ok(table);
            }
            let id = fleet::start(svc, &command, &dbname, &options).await?;
            Ok(plan_rows(&fleet::steps(svc, Some(id)).await?))
        }
        FleetRequest::Plan(batch) => Ok(plan_rows(&fleet::steps(svc, batch).await?)),
        FleetRequest::Batches => Ok(batch_rows(fleet::batches(svc).await?)),
        FleetRequest::Pause { batch, paused } => Ok(batch_rows(fleet::set_paused(svc, batch, paused).await?)),
    }
}

/// The answer's shape, described before a command runs.
pub fn shape(request: &FleetRequest) -> Table {
    match request {
        FleetRequest::Run { .. } | FleetRequest::Plan(_) => plan_table(),
        FleetRequest::Batches | FleetRequest::Pause { .. } => batch_table(),
    }
}
