//! The console's tenant-move commands: MOVE TENANT, SHOW MOVES, CLEANUP / ROLLBACK /
//! CANCEL MOVE, each answered with the moves' rows (the moves themselves are
//! `tenancy::moves`').

use super::AdminView;
use super::command::{CommandError, MoveStep};
use super::table::{Kind, Table, int, opt_text, text};
use crate::protocol::values::Value;
use crate::tenancy::moves::{MoveError, MoveRow, Request};

/// The columns of SHOW MOVES and of every move command's answer.
pub fn table() -> Table {
    Table::new(&[
        ("move_id", Kind::Int8),
        ("tenant_id", Kind::Int8),
        ("source", Kind::Int8),
        ("target", Kind::Int8),
        ("phase", Kind::Text),
        ("requested", Kind::Text),
        ("rows_copied", Kind::Int8),
        ("bytes_copied", Kind::Int8),
        ("lag_ms", Kind::Int8),
        ("pause_ms", Kind::Int8),
        ("attempts", Kind::Int8),
        ("driver", Kind::Text),
        ("error", Kind::Text),
        ("created_at", Kind::Text),
        ("switched_at", Kind::Text),
        ("ended_at", Kind::Text),
        ("batch_id", Kind::Int8),
    ])
}

fn opt_int(v: Option<i64>) -> Value {
    v.map_or(Value::Null, int)
}

fn rows(moves: impl IntoIterator<Item = MoveRow>) -> Table {
    let mut t = table();
    for m in moves {
        t.push(vec![
            int(m.id),
            int(m.tenant),
            int(m.source),
            int(m.target),
            text(m.phase.as_str()),
            text(m.requested.as_str()),
            int(m.rows_copied),
            int(m.bytes_copied),
            opt_int(m.lag_ms),
            opt_int(m.pause_ms),
            int(m.attempts),
            opt_text(m.driver),
            opt_text(m.error),
            text(m.created_at),
            opt_text(m.switched_at),
            opt_text(m.ended_at),
            opt_int(m.batch),
        ]);
    }
    t
}

fn service<'a>(
    view: &AdminView<'a>,
) -> Result<&'a std::sync::Arc<crate::tenancy::moves::MoveService>, CommandError> {
    view.moves.ok_or(CommandError::Move(MoveError::NoCatalog))
}

pub async fn show(view: &AdminView<'_>) -> Result<Table, CommandError> {
    Ok(rows(service(view)?.list().await?))
}

pub async fn start(
    view: &AdminView<'_>,
    tenant: i64,
    shard: u16,
    database: Option<String>,
) -> Result<Table, CommandError> {
    if view.router.topology().shard(shard).is_none() {
        return Err(CommandError::UnknownShard(shard));
    }
    Ok(rows([service(view)?.start_move(tenant, shard, database).await?]))
}

pub async fn request(view: &AdminView<'_>, id: i64, step: MoveStep) -> Result<Table, CommandError> {
    let moves = service(view)?;
    let request = match step {
        MoveStep::Cleanup => Request::Cleanup,
        MoveStep::Rollback => Request::Rollback,
        MoveStep::Cancel => {
            let current =
                moves.list().await?.into_iter().find(|m| m.id == id).ok_or(MoveError::UnknownMove(id))?;
            if !current.phase.before_switch() {
                return Err(MoveError::Refused(format!(
                    "move {id} is {}: CANCEL MOVE stops a move before its switch; ROLLBACK MOVE {id} routes the tenant back",
                    current.phase.as_str()
                ))
                .into());
            }
            Request::Rollback
        }
    };
    Ok(rows([moves.request(id, request).await?]))
}
