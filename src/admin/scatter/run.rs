//! Running a scatter-gather statement: the probe that describes it on one shard, the
//! shards' parts in parallel, and either the rows streamed straight to the client or
//! the partial rows copied (binary COPY, copy-free: a DataRow's body is a COPY tuple)
//! into the coordinator's table (`coordinator`) and the final statement's rows streamed
//! back. When no second connection of its pool is free at once, the coordinator runs
//! its own shard's part itself (INSERT ... SELECT into its table), so that a statement
//! never waits for a second connection of a pool it holds one of.
//!
//! Memory stays flat: rows move in batches through a bounded channel, and the client
//! (or the coordinator) is written to before more is read.

use std::sync::Arc;
use std::time::Instant;

use bytes::{BufMut, Bytes};
use tokio::sync::{mpsc, watch};

use super::ScatterError;
use super::coordinator::{Coordinator, OwnEnd, OwnPart};
use super::plan::{Merge, ProbeFacts, Scatter};
use super::request::{Link, Outcome, Policy, Prepared, Request, timeout_reason};
use super::wire::{FLUSH_BYTES, io_error, read_until_ready, type_section};
use crate::backend::{
    BackendError, MAX_SERVER_MESSAGE, ServerConn, Settings, TenantContext, TenantGuc, first_text_value,
    settings_sql, tenant_sql,
};
use crate::directory::ShardId;
use crate::net::Duplex;
use crate::protocol::values::{RECORD_ARRAY_OID, RECORD_OID};
use crate::protocol::{self, ErrorFields, TxStatus};

/// Gives `conn` the client's settings and no tenant (a scatter reads every tenant's rows).
pub async fn ready(
    conn: &mut ServerConn,
    settings: &Arc<Settings>,
    context: Option<TenantContext<'_>>,
) -> Result<(), BackendError> {
    let refused = |conn: &ServerConn, fields| BackendError::Refused { addr: conn.addr.clone(), fields };
    if std::mem::take(&mut conn.settings_unknown) {
        if let Some(fields) = conn.run_sql("RESET ALL").await? {
            return Err(refused(conn, fields));
        }
        conn.settings = Settings::empty();
        conn.tenant = TenantGuc::Unknown;
        conn.read_only = crate::backend::ReadOnlyGuc::Off;
    }
    if let Some(sql) = settings_sql(&conn.settings, settings) {
        if let Some(fields) = conn.run_sql(&sql).await? {
            return Err(refused(conn, fields));
        }
        conn.settings = settings.clone();
    }
    if let Some(sql) = tenant_sql(&conn.tenant, None, context, conn.cancel.pid) {
        if let Some(fields) = conn.run_sql(&sql).await? {
            return Err(refused(conn, fields));
        }
        conn.tenant = TenantGuc::Known(None);
    }
    Ok(())
}

/// Describes `scatter` on `conn` (a shard's primary) and plans it: the statement's own
/// errors (a missing column, a type mismatch) come back as PostgreSQL wrote them.
pub async fn prepare(
    scatter: &mut Scatter,
    conn: &mut ServerConn,
    declared_types: &[u32],
) -> Result<Prepared, ScatterError> {
    let shard_error = |e: BackendError| ScatterError::NoCoordinator { reason: e.to_string() };
    if let Some(question) = scatter.shard_column_question() {
        // One more round trip, only for statements that name shard_id: the probe's
        // text depends on the answer.
        let w = &mut conn.io.wbuf;
        protocol::parse(w, b"", question.as_bytes(), &[0, 0]);
        protocol::sync(w);
        conn.io.flush().await.map_err(io_error(conn)).map_err(shard_error)?;
        let refused = read_until_ready(conn, |_| {}).await.map_err(shard_error)?;
        scatter.set_own_shard_column(refused.is_none());
    }
    let w = &mut conn.io.wbuf;
    protocol::parse(w, b"", scatter.probe_sql().as_bytes(), &type_section(declared_types));
    protocol::describe_statement(w, b"");
    protocol::sync(w);
    for name in &scatter.ambiguous_group_names {
        protocol::parse(w, b"", scatter.input_column_probe(name).as_bytes(), &[0, 0]);
        protocol::sync(w);
    }
    if !scatter.other_functions.is_empty() {
        let names: Vec<String> =
            scatter.other_functions.iter().map(|n| crate::backend::quote_literal(n)).collect();
        protocol::query(
            w,
            &format!(
                "SELECT DISTINCT proname::text FROM pg_catalog.pg_proc WHERE prokind IN ('a', 'w') AND proname IN ({})",
                names.join(", ")
            ),
        );
    }
    conn.io.flush().await.map_err(io_error(conn)).map_err(shard_error)?;

    let mut param_types = Vec::new();
    let mut row_description = None;
    let described = read_until_ready(conn, |f| match f.tag {
        b't' => param_types = protocol::parameter_types(f.body()).unwrap_or_default(),
        b'T' => row_description = Some(f.body_bytes()),
        _ => {}
    })
    .await
    .map_err(shard_error)?;
    let mut facts = ProbeFacts::default();
    for name in &scatter.ambiguous_group_names {
        if read_until_ready(conn, |_| {}).await.map_err(shard_error)?.is_none() {
            facts.input_columns.insert(name.clone());
        }
    }
    if !scatter.other_functions.is_empty() {
        let mut found = Vec::new();
        read_until_ready(conn, |f| {
            if f.tag == b'D'
                && let Some(v) = first_text_value(f.body())
            {
                found.push(v);
            }
        })
        .await
        .map_err(shard_error)?;
        facts.aggregates.extend(found);
    }
    if let Some(fields) = described {
        return Err(ScatterError::Statement(fields));
    }
    let Some(description) = row_description.clone() else {
        return Err(ScatterError::Unmergeable("a statement that returns no rows".into()));
    };
    let columns = protocol::row_description_columns(&description)
        .ok_or_else(|| ScatterError::NoCoordinator { reason: "malformed RowDescription".into() })?;
    facts.output_names = columns.into_iter().map(|c| c.name).collect();
    let plan = scatter.plan(&facts)?;

    let final_sql = match plan.merge {
        Merge::Stream => None,
        Merge::Coordinated { .. } => {
            let w = &mut conn.io.wbuf;
            protocol::parse(w, b"", plan.shard_sql(0).as_bytes(), &type_section(&param_types));
            protocol::describe_statement(w, b"");
            protocol::sync(w);
            conn.io.flush().await.map_err(io_error(conn)).map_err(shard_error)?;
            let mut partial = None;
            let error = read_until_ready(conn, |f| {
                if f.tag == b'T' {
                    partial = protocol::row_description_columns(f.body());
                }
            })
            .await
            .map_err(shard_error)?;
            if let Some(fields) = error {
                // The partial statement is pgtenant's: its error is a planning defect
                // to report, not the client's.
                return Err(ScatterError::Unmergeable(format!("this statement ({})", fields.message)));
            }
            let types: Vec<u32> = partial.unwrap_or_default().iter().map(|c| c.type_oid).collect();
            let row_value =
                |t: &u32| i32::try_from(*t).is_ok_and(|t| t == RECORD_OID || t == RECORD_ARRAY_OID);
            if types.iter().any(row_value) {
                // No table column can have such a type, so the coordinator could not hold it.
                return Err(ScatterError::Unmergeable(
                    "a row value such as (a, b) or ROW(...) as a key, DISTINCT value or ordered column"
                        .into(),
                ));
            }
            plan.final_sql(&types)?
        }
    };
    Ok(Prepared { sql: scatter.text().to_string(), plan, param_types, row_description, final_sql })
}

/// What a shard's task reports.
enum Event {
    Rows(ShardId, Vec<Bytes>),
    Done(ShardId),
    Failed(ShardId, ScatterError),
}

/// Rows per batch sent from a shard's task, at most, and bytes (past one row).
const BATCH_ROWS: usize = 256;
const BATCH_BYTES: usize = 256 * 1024;
/// Batches in flight per statement: with the batch size, what bounds its memory.
const CHANNEL_BATCHES: usize = 16;
struct ShardPart {
    sql: String,
    types: Arc<[u8]>,
    parameters: Bytes,
    formats: Vec<i16>,
}

/// Runs a shard's part and reports its rows; the connection goes back to its pool
/// only when the part ended at an idle ReadyForQuery.
async fn run_shard(
    mut link: Link,
    part: Arc<ShardPart>,
    tx: mpsc::Sender<Event>,
    stop: watch::Receiver<bool>,
) {
    let shard = link.shard;
    link.conn.broken = true;
    let result = shard_part(&mut link, &part, &tx, stop).await;
    match result {
        Ok(Part::Answered) => {
            link.conn.broken = link.conn.status != TxStatus::Idle;
            let _ = tx.send(Event::Done(shard)).await;
        }
        Ok(Part::Failed(fields)) => {
            link.conn.broken = link.conn.status != TxStatus::Idle;
            let _ = tx.send(Event::Failed(shard, ScatterError::Shard { shard, fields })).await;
        }
        Ok(Part::Abandoned) => {
            // A cancel went to this server while it ran the part: one that arrived
            // late would stop the next client's statement, so the connection closes.
            link.conn.broken = true;
        }
        Err(e) => {
            let reason = e.to_string();
            let _ = tx.send(Event::Failed(shard, ScatterError::Unavailable { shard, reason })).await;
        }
    }
    if link.conn.broken {
        link.conn.discard();
    }
}

/// How a shard's part ended.
enum Part {
    Answered,
    Failed(ErrorFields),
    /// The statement gave up on it (another shard failed, a timeout, the client left).
    Abandoned,
}

async fn shard_part(
    link: &mut Link,
    part: &ShardPart,
    tx: &mpsc::Sender<Event>,
    mut stop: watch::Receiver<bool>,
) -> Result<Part, BackendError> {
    let shard = link.shard;
    let conn = &mut *link.conn;
    let w = &mut conn.io.wbuf;
    // A read-only transaction: nothing a shard runs for a scatter can write.
    protocol::query(w, "BEGIN READ ONLY");
    protocol::parse(w, b"", part.sql.as_bytes(), &part.types);
    protocol::bind_with(w, b"", &part.parameters, &part.formats);
    protocol::execute(w);
    protocol::sync(w);
    protocol::query(w, "COMMIT");
    conn.io.flush().await.map_err(io_error(conn))?;
    let mut error = None;
    let mut abandoned = false;
    for _ in 0..3 {
        let mut batch = Vec::new();
        let mut batch_bytes = 0;
        let mut failed = None;
        loop {
            let frame = tokio::select! {
                frame = conn.io.read_frame(MAX_SERVER_MESSAGE) => frame.map_err(io_error(conn))?,
                _ = stop.changed(), if !abandoned => {
                    abandoned = true;
                    // Not reused before the server confirms it (backend::cancel).
                    tokio::spawn(conn.cancel.cancel());
                    continue;
                }
            };
            let Some(frame) = frame else {
                return Err(BackendError::Protocol {
                    addr: conn.addr.clone(),
                    message: "server closed the connection".into(),
                });
            };
            match frame.tag {
                b'D' => {
                    batch_bytes += frame.body().len();
                    batch.push(frame.body_bytes());
                    if (batch.len() >= BATCH_ROWS || batch_bytes >= BATCH_BYTES) && !abandoned {
                        batch_bytes = 0;
                        let rows = Event::Rows(shard, std::mem::take(&mut batch));
                        if tx.send(rows).await.is_err() {
                            // The statement gave up (the client left): the shard stops
                            // too, and what it still sends is read and dropped.
                            abandoned = true;
                            tokio::spawn(conn.cancel.cancel());
                        }
                    } else if abandoned {
                        batch.clear();
                    }
                }
                b'E' => {
                    failed.get_or_insert_with(|| protocol::error_fields(frame.body()));
                }
                b'Z' => {
                    conn.status = frame
                        .body()
                        .first()
                        .copied()
                        .and_then(TxStatus::from_byte)
                        .unwrap_or(TxStatus::Failed);
                    break;
                }
                _ => {}
            }
        }
        if !batch.is_empty() && !abandoned {
            let _ = tx.send(Event::Rows(shard, batch)).await;
        }
        if error.is_none() {
            error = failed;
        }
    }
    Ok(match error {
        _ if abandoned => Part::Abandoned,
        Some(fields) => Part::Failed(fields),
        None => Part::Answered,
    })
}

/// Runs `prepared`: the shards in `links`, merged on `coordinator` when the plan says
/// so, the answer written to `client` up to and including CommandComplete (and the
/// WARNINGs of a partial result). `missing`: shards that could not even be reached.
/// The coordinator comes with the shard whose part it runs itself, if any (that
/// shard then has no link: see `Coordinator::start`).
pub async fn execute(
    prepared: &Prepared,
    request: &Request<'_>,
    links: Vec<Link>,
    mut missing: Vec<(ShardId, String)>,
    coordinator: Option<(&mut ServerConn, Option<ShardId>)>,
    client: &mut Duplex,
) -> Result<Outcome, ScatterError> {
    if request.policy == Policy::Strict
        && let Some((shard, reason)) = missing.first()
    {
        return Err(ScatterError::Unavailable { shard: *shard, reason: reason.clone() });
    }
    let coordinated = prepared.final_sql.is_some();
    let formats = if coordinated { vec![1] } else { request.result_formats.to_vec() };
    let types: Arc<[u8]> = type_section(&prepared.param_types).into();
    let parameters = Bytes::copy_from_slice(request.parameters);
    let (tx, mut rx) = mpsc::channel(CHANNEL_BATCHES);
    // Tells the shards' tasks that the statement gave up: each still running cancels
    // its own part (so no cancel can reach a connection already given back).
    let (stop, stopped) = watch::channel(false);
    let started = Instant::now();
    let mut pending: Vec<ShardId> = Vec::new();
    for link in links {
        let part = Arc::new(ShardPart {
            sql: prepared.plan.shard_sql(link.shard as i64),
            types: types.clone(),
            parameters: parameters.clone(),
            formats: formats.clone(),
        });
        pending.push(link.shard);
        tokio::spawn(run_shard(link, part, tx.clone(), stopped.clone()));
    }
    drop(tx);

    let mut outcome = Outcome::default();
    if request.describe
        && let Some(description) = &prepared.row_description
    {
        let with_formats = protocol::row_description_with_formats(description, request.result_formats);
        client.wbuf.extend_from_slice(&with_formats.unwrap_or_default());
    }
    let deadline = tokio::time::Instant::now() + request.timeout;
    let mut merge = match (coordinated, coordinator) {
        (true, Some((conn, own))) => {
            let own = own.map(|shard| OwnPart { shard, deadline });
            let (merge, own_end) = Coordinator::start(conn, prepared, request, own).await?;
            match own_end {
                Some((shard, OwnEnd::Answered)) => {
                    outcome.shard_us.push((shard, started.elapsed().as_micros() as u64));
                }
                Some((shard, OwnEnd::Missing(why))) => missing.push((shard, why)),
                None => {}
            }
            Some(merge)
        }
        (true, None) => return Err(ScatterError::NoCoordinator { reason: "none was given".into() }),
        (false, _) => None,
    };
    let mut failed: Vec<ShardId> = Vec::new();
    while !pending.is_empty() {
        let event = match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(event)) => event,
            Ok(None) => break,
            Err(_) => {
                let ms = request.timeout.as_millis() as u64;
                let _ = stop.send(true);
                if request.policy == Policy::Strict {
                    return Err(abandon(merge, ScatterError::Timeout { shard: pending[0], ms }).await);
                }
                for shard in pending.drain(..) {
                    failed.push(shard);
                    missing.push((shard, timeout_reason(ms)));
                }
                break;
            }
        };
        match event {
            Event::Rows(shard, rows) => {
                if failed.contains(&shard) {
                    continue;
                }
                match &mut merge {
                    Some(m) => m.copy_rows(shard, &rows).await?,
                    None => {
                        outcome.rows += rows.len() as u64;
                        for row in rows {
                            protocol::put_message(&mut client.wbuf, b'D', |b| b.put_slice(&row));
                        }
                        if client.wbuf.len() >= FLUSH_BYTES {
                            client.flush().await.map_err(|_| ScatterError::Canceled)?;
                        }
                    }
                }
            }
            Event::Done(shard) => {
                pending.retain(|s| *s != shard);
                outcome.shard_us.push((shard, started.elapsed().as_micros() as u64));
            }
            Event::Failed(shard, error) => {
                pending.retain(|s| *s != shard);
                if request.policy == Policy::Strict {
                    let _ = stop.send(true);
                    return Err(abandon(merge, error).await);
                }
                failed.push(shard);
                missing.push((shard, error.to_string()));
            }
        }
    }
    if let Some(m) = merge {
        outcome.rows = m.finish(prepared, request, &failed, client).await?;
    } else {
        protocol::command_complete(&mut client.wbuf, &format!("SELECT {}", outcome.rows));
    }
    for (shard, why) in &missing {
        protocol::notice_response(
            &mut client.wbuf,
            protocol::Severity::Warning,
            protocol::sqlstate::WARNING,
            &format!("pgtenant: scatter-gather result is partial: shard {shard} is missing ({why})"),
        );
    }
    outcome.missing = missing;
    Ok(outcome)
}

/// Ends a merge that will not finish (its transaction rolls back), returning `error`.
async fn abandon(merge: Option<Coordinator<'_>>, error: ScatterError) -> ScatterError {
    if let Some(m) = merge {
        m.fail().await;
    }
    error
}
