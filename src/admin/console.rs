//! The admin console's protocol loop, once an admin has logged in to the virtual
//! database: simple queries, and the extended protocol as drivers use it (Parse, Bind,
//! Describe, Execute, Close, Sync, Flush), every answer built by the proxy. The
//! statements and portals a client may keep are bounded.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::BytesMut;

use super::AdminView;
use super::command::{Command, CommandError, Scope, Show, parse};
use super::moves;
use super::show::show;
use super::table::{Kind, Table, int, opt_text, text};
use crate::directory::TenantId;
use crate::net::Duplex;
use crate::protocol::{self, Frame, Severity, TxStatus, sqlstate};
use crate::tenancy::{PauseOutcome, PauseScope};

/// Named statements and portals a console client may keep at once.
const MAX_KEPT: usize = 64;

/// A Bind's portal: its statement's text, the result formats asked for, and the
/// result once a Describe or Execute computed it.
struct Portal {
    sql: String,
    formats: Vec<i16>,
    result: Option<Result<Answer, CommandError>>,
}

#[derive(Default)]
struct ConsoleState {
    statements: HashMap<Vec<u8>, String>,
    portals: HashMap<Vec<u8>, Portal>,
    /// An extended-protocol message failed: the rest up to Sync is skipped.
    skipping: bool,
}

/// Serves the console until the client leaves (or breaks the protocol), the proxy
/// shuts down (`shutdown` turns true) or an admin KILLs it (`killed` completes), which
/// end it as PostgreSQL ends an idle session.
pub async fn serve_console(
    client: &mut Duplex,
    view: &AdminView<'_>,
    max_message: usize,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    killed: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let mut state = ConsoleState::default();
    tokio::pin!(killed);
    loop {
        client.flush().await?;
        let frame = tokio::select! {
            frame = client.read_frame(max_message) => frame?,
            _ = async {
                if shutdown.wait_for(|stop| *stop).await.is_err() {
                    // No one can stop the proxy any more: serve on.
                    std::future::pending::<()>().await;
                }
            } => {
                let message = "terminating connection due to administrator command";
                protocol::error_response(&mut client.wbuf, Severity::Fatal, sqlstate::ADMIN_SHUTDOWN, message);
                return client.flush().await;
            }
            _ = &mut killed => {
                let message = "terminating connection due to administrator command";
                protocol::error_response(&mut client.wbuf, Severity::Fatal, sqlstate::ADMIN_SHUTDOWN, message);
                return client.flush().await;
            }
        };
        let Some(frame) = frame else { return Ok(()) };
        if frame.tag == b'X' {
            return Ok(());
        }
        let mut out = BytesMut::new();
        if let Err(message) = on_message(&mut state, view, &frame, &mut out).await {
            protocol::error_response(&mut out, Severity::Fatal, sqlstate::PROTOCOL_VIOLATION, &message);
            client.wbuf.extend_from_slice(&out);
            return client.flush().await;
        }
        client.wbuf.extend_from_slice(&out);
    }
}

/// What a statement answers: rows, a command tag alone, or nothing (empty).
enum Answer {
    Rows(Table),
    Done(&'static str),
    Empty,
}

/// Runs one statement.
async fn run(view: &AdminView<'_>, sql: &str) -> Result<Answer, CommandError> {
    let started = Instant::now();
    let result = match parse(sql)? {
        Command::Empty => Ok(Answer::Empty),
        Command::Show(Show::Moves) => moves::show(view).await.map(Answer::Rows),
        Command::Show(what) => Ok(Answer::Rows(show(view, &what).await)),
        Command::Move { tenant, shard, database } => {
            moves::start(view, tenant, shard, database).await.map(Answer::Rows)
        }
        Command::MoveRequest { id, step } => moves::request(view, id, step).await.map(Answer::Rows),
        Command::Fleet(request) => super::fleet::run(view, request).await.map(Answer::Rows),
        Command::Pause { scope, timeout_secs } => {
            pause(view, scope, timeout_secs).await.map(|()| Answer::Done("PAUSE"))
        }
        Command::Disable(database) | Command::Enable(database) if super::is_console(&database) => {
            Err(CommandError::BadScope("DISABLE or ENABLE of the admin console itself".into()))
        }
        Command::Disable(database) => {
            view.pauses.set_disabled(&database, true);
            tracing::warn!(database, "admin DISABLE: new clients of the database are refused");
            Ok(Answer::Done("DISABLE"))
        }
        Command::Enable(database) => {
            view.pauses.set_disabled(&database, false);
            tracing::info!(database, "admin ENABLE");
            Ok(Answer::Done("ENABLE"))
        }
        Command::WaitClose(database) => {
            // Retired connections close as their clients give them back: look again soon.
            while view.pools.servers.close_needed(database.as_deref()) > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(Answer::Done("WAIT_CLOSE"))
        }
        Command::Resume(scope) => {
            view.pauses.resume(&pause_scope(view, scope)?);
            Ok(Answer::Done("RESUME"))
        }
        Command::KillClient(id) => {
            if view.clients.kill(id) {
                Ok(Answer::Done("KILL"))
            } else {
                Err(CommandError::UnknownClient(id))
            }
        }
        Command::KillDatabase(database) => {
            if super::is_console(&database) {
                return Err(CommandError::BadScope("KILL of the admin console itself".into()));
            }
            let clients = view.clients.kill_database(&database);
            let pools = view.pools.reconnect_where(|_, db| db == database);
            tracing::warn!(database, clients, pools, "admin KILL of a database");
            Ok(Answer::Done("KILL"))
        }
        Command::Reconnect(shard) => {
            if let Some(id) = shard
                && view.router.topology().shard(id).is_none()
            {
                return Err(CommandError::UnknownShard(id));
            }
            let pools = view.pools.reconnect(shard);
            tracing::info!(?shard, pools, "admin RECONNECT: server connections are being replaced");
            Ok(Answer::Done("RECONNECT"))
        }
        Command::Placement { tenant, step } => {
            let placed = crate::tenancy::placement(view.config.catalog.as_ref(), tenant, step).await?;
            tracing::info!(tenant, shard = placed.shard, status = %placed.status, "admin placement");
            let mut table = placement_table();
            table.push(vec![
                int(placed.tenant),
                int(placed.shard),
                text(placed.status),
                opt_text(placed.lease_expires_at),
            ]);
            Ok(Answer::Rows(table))
        }
        Command::Reload => match view.reloader.reload() {
            Ok(()) => Ok(Answer::Done("RELOAD")),
            Err(problems) => Err(CommandError::ReloadRefused(problems)),
        },
        Command::Shutdown { wait_for_clients: true } => {
            tracing::warn!("admin SHUTDOWN WAIT_FOR_CLIENTS: no longer accepting");
            view.wait_for_clients.send_replace(true);
            Ok(Answer::Done("SHUTDOWN"))
        }
        Command::Shutdown { wait_for_clients: false } => {
            tracing::warn!("admin SHUTDOWN: stopping");
            if let Some(stop) = view.stop {
                let _ = stop.send(true);
            }
            Ok(Answer::Done("SHUTDOWN"))
        }
    };
    let us = started.elapsed().as_micros() as u64;
    view.console.request_done(us, Some(us));
    result
}

/// The board's scope for a command's; a tenant id read as the proxy's key type.
fn pause_scope(view: &AdminView<'_>, scope: Scope) -> Result<PauseScope, CommandError> {
    Ok(match scope {
        Scope::All => PauseScope::All,
        Scope::Shard(id) => {
            if view.router.topology().shard(id).is_none() {
                return Err(CommandError::UnknownShard(id));
            }
            PauseScope::Shard(id)
        }
        Scope::Tenant(text) => match TenantId::parse(&text, view.config.proxy.tenant_key) {
            Some(t) => PauseScope::Tenant(t),
            None => return Err(CommandError::BadTenant(text)),
        },
        Scope::Database(database) if super::is_console(&database) => {
            return Err(CommandError::BadScope("a PAUSE of the admin console itself".into()));
        }
        Scope::Database(database) => PauseScope::Database(database),
    })
}

/// PAUSE: holds new transactions of the scope and answers once running ones ended.
async fn pause(view: &AdminView<'_>, scope: Scope, timeout_secs: Option<f64>) -> Result<(), CommandError> {
    let scope = pause_scope(view, scope)?;
    view.pauses.pause(scope.clone());
    let timeout = timeout_secs.map(Duration::from_secs_f64);
    match view.pauses.drain(&scope, view.clients, timeout).await {
        PauseOutcome::Drained => Ok(()),
        PauseOutcome::Resumed => Err(CommandError::PauseEnded(format!(
            "the pause of {} was lifted by a RESUME before its transactions ended",
            scope.describe()
        ))),
        PauseOutcome::TimedOut { running } => Err(CommandError::PauseEnded(format!(
            "{running} transaction(s) of {} still ran after {} s: the pause was lifted",
            scope.describe(),
            timeout_secs.unwrap_or_default()
        ))),
    }
}

/// The rows a placement command answers (described before it runs).
fn placement_table() -> Table {
    Table::new(&[
        ("tenant_id", Kind::Int8),
        ("shard", Kind::Int8),
        ("status", Kind::Text),
        ("lease_expires_at", Kind::Text),
    ])
}

/// The result shape of a command that changes something: described without running it.
fn shape_of(command: &Command) -> Option<Table> {
    match command {
        Command::Placement { .. } => Some(placement_table()),
        Command::Move { .. } | Command::MoveRequest { .. } => Some(moves::table()),
        Command::Fleet(request) => Some(super::fleet::shape(request)),
        _ => None,
    }
}

fn write_error(out: &mut BytesMut, e: &CommandError) {
    protocol::error_response(out, Severity::Error, e.sqlstate(), &format!("pgtenant admin console: {e}"));
}

/// Handles one message; `Err` ends the session (a malformed message).
async fn on_message(
    state: &mut ConsoleState,
    view: &AdminView<'_>,
    frame: &Frame,
    out: &mut BytesMut,
) -> Result<(), String> {
    let body = frame.body();
    match frame.tag {
        b'S' => {
            state.skipping = false;
            state.portals.remove(&b""[..]);
            protocol::ready_for_query(out, TxStatus::Idle);
        }
        b'H' => {}
        _ if state.skipping => {}
        b'Q' => {
            let sql = protocol::query_text(body).ok_or("Query without terminator")?;
            let sql = String::from_utf8_lossy(sql);
            match run(view, &sql).await {
                Ok(Answer::Rows(table)) => {
                    table.describe(out, &[]);
                    table.write_rows(out, &[]);
                    protocol::command_complete(out, table.tag());
                }
                Ok(Answer::Done(tag)) => protocol::command_complete(out, tag),
                Ok(Answer::Empty) => protocol::put_message(out, b'I', |_| {}),
                Err(e) => write_error(out, &e),
            }
            protocol::ready_for_query(out, TxStatus::Idle);
        }
        b'P' => {
            let p = protocol::parse_view(body).ok_or("malformed Parse")?;
            if !p.name.is_empty()
                && state.statements.len() >= MAX_KEPT
                && !state.statements.contains_key(p.name)
            {
                fail(
                    state,
                    out,
                    sqlstate::PROGRAM_LIMIT_EXCEEDED,
                    "too many prepared statements (64 at most)",
                );
                return Ok(());
            }
            state.statements.insert(p.name.to_vec(), String::from_utf8_lossy(p.query).into_owned());
            protocol::parse_complete(out);
        }
        b'B' => {
            let b = protocol::bind_view(body).ok_or("malformed Bind")?;
            let Some(sql) = state.statements.get(b.statement).cloned() else {
                let name = String::from_utf8_lossy(b.statement).into_owned();
                fail(
                    state,
                    out,
                    sqlstate::INVALID_SQL_STATEMENT_NAME,
                    &format!("prepared statement \"{name}\" does not exist"),
                );
                return Ok(());
            };
            if !b.portal.is_empty()
                && state.portals.len() >= MAX_KEPT
                && !state.portals.contains_key(b.portal)
            {
                fail(state, out, sqlstate::PROGRAM_LIMIT_EXCEEDED, "too many portals (64 at most)");
                return Ok(());
            }
            let formats = protocol::bind_result_formats(b.rest).ok_or("malformed Bind")?;
            state.portals.insert(b.portal.to_vec(), Portal { sql, formats, result: None });
            protocol::bind_complete(out);
        }
        b'D' => {
            let (kind, name) = protocol::target_view(body).ok_or("malformed Describe")?;
            if kind == b'S' {
                let Some(sql) = state.statements.get(name).cloned() else {
                    fail(
                        state,
                        out,
                        sqlstate::INVALID_SQL_STATEMENT_NAME,
                        "prepared statement does not exist",
                    );
                    return Ok(());
                };
                protocol::parameter_description(out, &[]);
                // Only SHOW has rows; anything else is described without running it.
                let parsed = parse(&sql);
                let shows = matches!(parsed, Ok(Command::Show(_)));
                let described = match parsed {
                    _ if shows => run(view, &sql).await,
                    Ok(command) => Ok(shape_of(&command).map_or(Answer::Empty, Answer::Rows)),
                    Err(e) => Err(e),
                };
                match described {
                    Ok(Answer::Rows(table)) => table.describe(out, &[]),
                    Ok(_) => protocol::put_message(out, b'n', |_| {}),
                    Err(e) => {
                        write_error(out, &e);
                        state.skipping = true;
                    }
                }
            } else {
                let Some(portal) = state.portals.get_mut(name) else {
                    fail(state, out, sqlstate::INVALID_SQL_STATEMENT_NAME, "portal does not exist");
                    return Ok(());
                };
                let shows = matches!(parse(&portal.sql), Ok(Command::Show(_)));
                if portal.result.is_none() && shows {
                    portal.result = Some(run(view, &portal.sql).await);
                }
                let shape = parse(&portal.sql).ok().as_ref().and_then(shape_of);
                match (&portal.result, shape) {
                    (Some(Ok(Answer::Rows(table))), _) => table.describe(out, &portal.formats),
                    (None, Some(table)) => table.describe(out, &portal.formats),
                    (Some(Ok(_)) | None, _) => protocol::put_message(out, b'n', |_| {}),
                    (Some(Err(e)), _) => {
                        write_error(out, e);
                        state.skipping = true;
                    }
                }
            }
        }
        b'E' => {
            let (portal_name, _) = protocol::split_cstr(body).ok_or("malformed Execute")?;
            let Some(portal) = state.portals.get_mut(portal_name) else {
                fail(state, out, sqlstate::INVALID_SQL_STATEMENT_NAME, "portal does not exist");
                return Ok(());
            };
            let result = match portal.result.take() {
                Some(result) => result,
                None => run(view, &portal.sql).await,
            };
            match result {
                Ok(Answer::Rows(table)) => {
                    table.write_rows(out, &portal.formats);
                    protocol::command_complete(out, table.tag());
                }
                Ok(Answer::Done(tag)) => protocol::command_complete(out, tag),
                Ok(Answer::Empty) => protocol::put_message(out, b'I', |_| {}),
                Err(e) => {
                    write_error(out, &e);
                    state.skipping = true;
                }
            }
        }
        b'C' => {
            let (kind, name) = protocol::target_view(body).ok_or("malformed Close")?;
            if kind == b'S' {
                state.statements.remove(name);
            } else {
                state.portals.remove(name);
            }
            protocol::close_complete(out);
        }
        tag => return Err(format!("unexpected message type '{}' in the admin console", tag as char)),
    }
    Ok(())
}

fn fail(state: &mut ConsoleState, out: &mut BytesMut, code: &str, message: &str) {
    protocol::error_response(out, Severity::Error, code, &format!("pgtenant admin console: {message}"));
    state.skipping = true;
}
