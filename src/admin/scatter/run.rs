//! Running a scatter-gather statement: the probe that describes it on one shard, the
//! shards' parts in parallel, and either the rows streamed straight to the client or
//! the partial rows copied (binary COPY, copy-free: a DataRow's body is a COPY tuple)
//! into the coordinator's table and the final statement's rows streamed back. When no
//! second connection of its pool is free at once, the coordinator runs its own shard's
//! part itself (INSERT ... SELECT into its table), so that a statement never waits for
//! a second connection of a pool it holds one of.
//!
//! Memory stays flat: rows move in batches through a bounded channel, and the client
//! (or the coordinator) is written to before more is read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use tokio::sync::{mpsc, watch};

use super::ScatterError;
use super::plan::{Merge, PARTIAL_TABLE, Plan, ProbeFacts, Scatter, column_name};
use crate::backend::{
    BackendError, MAX_SERVER_MESSAGE, PooledConn, ServerConn, Settings, TenantContext, TenantGuc,
    settings_sql, tenant_sql,
};
use crate::directory::ShardId;
use crate::net::Duplex;
use crate::protocol::{self, ErrorFields, Frame, TxStatus};

/// A shard's checked-out connection.
pub struct Link {
    pub shard: ShardId,
    pub conn: PooledConn,
}

/// What happens when a shard cannot answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Policy {
    /// The statement fails, naming the shard.
    #[default]
    Strict,
    /// The other shards' rows, with a WARNING naming each missing shard.
    Partial,
}

impl Policy {
    pub fn parse(value: &str) -> Option<Self> {
        match value.trim().trim_matches('\'').to_ascii_lowercase().as_str() {
            "strict" => Some(Self::Strict),
            "partial" => Some(Self::Partial),
            _ => None,
        }
    }
}

/// A statement described and planned, ready to run with parameters.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub plan: Plan,
    /// The statement's parameter types (ParameterDescription), as the probe found them.
    pub param_types: Vec<u32>,
    /// The statement's RowDescription body (all text formats); `None` for NoData.
    pub row_description: Option<Bytes>,
    final_sql: Option<String>,
}

/// One run of a prepared statement.
pub struct Request<'a> {
    /// The Bind's parameter part (`protocol::bind_parameters`).
    pub parameters: &'a [u8],
    pub result_formats: &'a [i16],
    /// Send the RowDescription (a simple query; an Execute does not).
    pub describe: bool,
    pub policy: Policy,
    pub timeout: Duration,
}

/// How a run ended, for the caller's counters.
#[derive(Debug, Default)]
pub struct Outcome {
    pub rows: u64,
    pub missing: Vec<(ShardId, String)>,
    /// How long each shard took to send its part, in microseconds.
    pub shard_us: Vec<(ShardId, u64)>,
}

fn io_error(conn: &ServerConn) -> impl Fn(std::io::Error) -> BackendError + '_ {
    move |source| BackendError::Io { addr: conn.addr.clone(), source }
}

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

fn type_section(types: &[u32]) -> Vec<u8> {
    let mut b = Vec::with_capacity(2 + 4 * types.len());
    b.extend_from_slice(&(types.len() as i16).to_be_bytes());
    for t in types {
        b.extend_from_slice(&t.to_be_bytes());
    }
    b
}

/// Reads until ReadyForQuery, handing every other message to `each`; the first error's fields.
async fn read_until_ready(
    conn: &mut ServerConn,
    mut each: impl FnMut(&Frame),
) -> Result<Option<ErrorFields>, BackendError> {
    let mut error = None;
    loop {
        let frame = conn.io.read_frame(MAX_SERVER_MESSAGE).await.map_err(io_error(conn))?;
        let Some(frame) = frame else {
            return Err(BackendError::Protocol {
                addr: conn.addr.clone(),
                message: "server closed the connection".into(),
            });
        };
        match frame.tag {
            b'Z' => {
                conn.status =
                    frame.body().first().copied().and_then(TxStatus::from_byte).unwrap_or(TxStatus::Failed);
                return Ok(error);
            }
            b'E' => {
                error.get_or_insert_with(|| protocol::error_fields(frame.body()));
            }
            b'S' => {
                if let Some((name, value)) = protocol::parameter_status(frame.body()) {
                    conn.set_param(name, value);
                }
            }
            _ => each(&frame),
        }
    }
}

/// Describes `scatter` on `conn` (a shard's primary) and plans it: the statement's own
/// errors (a missing column, a type mismatch) come back as PostgreSQL wrote them.
pub async fn prepare(
    scatter: &Scatter,
    conn: &mut ServerConn,
    declared_types: &[u32],
) -> Result<Prepared, ScatterError> {
    let shard_error = |e: BackendError| ScatterError::NoCoordinator { reason: e.to_string() };
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
            plan.final_sql(&types)?
        }
    };
    Ok(Prepared { plan, param_types, row_description, final_sql })
}

fn first_text_value(body: &[u8]) -> Option<String> {
    let len = i32::from_be_bytes(body.get(2..6)?.try_into().ok()?);
    let len = usize::try_from(len).ok()?;
    String::from_utf8(body.get(6..6 + len)?.to_vec()).ok()
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
/// Written out once this much is buffered.
const FLUSH_BYTES: usize = 64 * 1024;

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

/// Why a partial result lacks a shard that did not answer in time.
fn timeout_reason(ms: u64) -> String {
    format!("no answer within {ms} ms (scatter_timeout_ms)")
}

/// Ends a merge that will not finish (its transaction rolls back), returning `error`.
async fn abandon(merge: Option<Coordinator<'_>>, error: ScatterError) -> ScatterError {
    if let Some(m) = merge {
        m.fail().await;
    }
    error
}

/// The coordinator's side of a merge: its table filled by COPY, then the final statement.
struct Coordinator<'a> {
    conn: &'a mut ServerConn,
}

/// The part of the coordinator's own shard, which it runs into its table itself.
struct OwnPart {
    shard: ShardId,
    /// The statement's `scatter_timeout_ms`, which that part must keep too.
    deadline: tokio::time::Instant,
}

/// How the coordinator's own part ended, when the statement goes on.
enum OwnEnd {
    Answered,
    /// Left out of a partial result, and why.
    Missing(String),
}

/// The savepoint that a failed own part of a partial result is rolled back to.
const OWN_SAVEPOINT: &str = "__pgtenant_own";

/// The binary COPY header: signature, flags, header extension length.
const COPY_HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";

impl<'a> Coordinator<'a> {
    /// Creates the table and starts the COPY into it; with `own`, first runs that
    /// shard's part into it (so that a statement holds one connection of each pool).
    async fn start(
        conn: &'a mut ServerConn,
        prepared: &Prepared,
        request: &Request<'_>,
        own: Option<OwnPart>,
    ) -> Result<(Coordinator<'a>, Option<(ShardId, OwnEnd)>), ScatterError> {
        let columns = prepared.plan.partial_columns().unwrap_or(0);
        let names: Vec<String> = (0..columns).map(column_name).collect();
        let nulls = vec!["NULL"; prepared.param_types.len()];
        let args = if nulls.is_empty() { String::new() } else { format!("({})", nulls.join(", ")) };
        conn.broken = true;
        let w = &mut conn.io.wbuf;
        protocol::query(w, "BEGIN READ WRITE");
        protocol::parse(
            w,
            b"__pgtenant_partial",
            prepared.plan.shard_sql(0).as_bytes(),
            &type_section(&prepared.param_types),
        );
        protocol::sync(w);
        // The table takes the partial statement's column types and collations exactly.
        protocol::query(
            w,
            &format!(
                "CREATE TEMP TABLE {PARTIAL_TABLE} ({}) ON COMMIT DROP AS EXECUTE __pgtenant_partial{args} WITH NO DATA",
                names.join(", ")
            ),
        );
        // Read-only from here on, as on the shards (a temporary table stays writable):
        // what the own part runs may write no more than the others' parts.
        protocol::query(
            w,
            &format!(
                "DEALLOCATE __pgtenant_partial; ALTER TABLE pg_temp.{PARTIAL_TABLE} ADD COLUMN {FROM_COLUMN} integer; \
                 SET TRANSACTION READ ONLY"
            ),
        );
        if let Some(own) = &own {
            protocol::query(w, &format!("SAVEPOINT {OWN_SAVEPOINT}"));
            let insert = format!(
                "INSERT INTO pg_temp.{PARTIAL_TABLE} SELECT __pgtenant_own.*, {} FROM ({}) __pgtenant_own",
                own.shard,
                prepared.plan.shard_sql(i64::from(own.shard))
            );
            protocol::parse(w, b"", insert.as_bytes(), &type_section(&prepared.param_types));
            protocol::bind_with(w, b"", request.parameters, &[]);
            protocol::execute(w);
            protocol::sync(w);
        } else {
            start_copy(w);
        }
        let coordinator_error = |e: BackendError| ScatterError::NoCoordinator { reason: e.to_string() };
        conn.io.flush().await.map_err(io_error(conn)).map_err(coordinator_error)?;
        let mut error = None;
        for _ in 0..4 {
            if let Some(fields) = read_until_ready(conn, |_| {}).await.map_err(coordinator_error)? {
                error.get_or_insert(fields);
            }
        }
        let own_end = match own {
            Some(own) => Some((own.shard, Self::end_own_part(conn, &own, request, &mut error).await?)),
            None => None,
        };
        // The COPY answers CopyInResponse, or an error and ReadyForQuery.
        loop {
            let frame = coordinator_frame(conn).await?;
            match frame.tag {
                b'G' => break,
                b'E' => {
                    error.get_or_insert(protocol::error_fields(frame.body()));
                }
                b'Z' => {
                    let _ = conn.run_sql("ROLLBACK").await;
                    let fields = error.unwrap_or_default();
                    return Err(ScatterError::Unmergeable(format!("this statement ({})", fields.message)));
                }
                _ => {}
            }
        }
        put_copy_data(&mut conn.io.wbuf, |b| b.put_slice(COPY_HEADER));
        Ok((Coordinator { conn }, own_end))
    }

    /// Reads how the own part ended and starts the COPY after it: a failed part fails
    /// a strict statement, and is rolled back to its savepoint and reported missing in
    /// a partial one. A failure to make the table (`error`, already read) is left for
    /// the COPY's answer to report, as without an own part.
    async fn end_own_part(
        conn: &mut ServerConn,
        own: &OwnPart,
        request: &Request<'_>,
        error: &mut Option<ErrorFields>,
    ) -> Result<OwnEnd, ScatterError> {
        let coordinator_error = |e: BackendError| ScatterError::NoCoordinator { reason: e.to_string() };
        let ended = match Self::own_part(conn, own, request).await.map_err(coordinator_error)? {
            _ if error.is_some() => OwnEnd::Answered,
            Ok(()) => OwnEnd::Answered,
            Err(part_error) if request.policy == Policy::Strict => {
                let _ = conn.run_sql("ROLLBACK").await;
                return Err(part_error);
            }
            Err(part_error) => {
                protocol::query(&mut conn.io.wbuf, &format!("ROLLBACK TO SAVEPOINT {OWN_SAVEPOINT}"));
                OwnEnd::Missing(match part_error {
                    // Worded as for a shard of its own (see `execute`).
                    ScatterError::Timeout { ms, .. } => timeout_reason(ms),
                    other => other.to_string(),
                })
            }
        };
        start_copy(&mut conn.io.wbuf);
        conn.io.flush().await.map_err(io_error(conn)).map_err(coordinator_error)?;
        if matches!(ended, OwnEnd::Missing(_))
            && let Some(fields) = read_until_ready(conn, |_| {}).await.map_err(coordinator_error)?
        {
            error.get_or_insert(fields);
        }
        Ok(ended)
    }

    /// Reads the answers to the own part's SAVEPOINT and INSERT (within the
    /// statement's timeout): `Err` is how the part failed, as a shard's would.
    async fn own_part(
        conn: &mut ServerConn,
        own: &OwnPart,
        request: &Request<'_>,
    ) -> Result<Result<(), ScatterError>, BackendError> {
        let shard = own.shard;
        if let Some(fields) = read_until_ready(conn, |_| {}).await? {
            return read_until_ready(conn, |_| {}).await.map(|_| Err(ScatterError::Shard { shard, fields }));
        }
        match tokio::time::timeout_at(own.deadline, read_until_ready(conn, |_| {})).await {
            Ok(Ok(None)) => Ok(Ok(())),
            Ok(Ok(Some(fields))) => Ok(Err(ScatterError::Shard { shard, fields })),
            Ok(Err(e)) => Err(e),
            Err(_) => {
                // Canceled, then read to its end (what was read before stays buffered).
                // The cancel can stop only this INSERT: the server has signalled the
                // backend when the call returns, the next statement is sent after the
                // INSERT's ReadyForQuery, and a backend drops a cancel that finds it idle.
                if conn.cancel.cancel().await.is_err() {
                    conn.broken = true;
                    return Err(BackendError::Protocol {
                        addr: conn.addr.clone(),
                        message: "the cancel of a timed-out part was not confirmed".into(),
                    });
                }
                read_until_ready(conn, |_| {}).await?;
                let ms = request.timeout.as_millis() as u64;
                Ok(Err(ScatterError::Timeout { shard, ms }))
            }
        }
    }

    async fn copy_rows(&mut self, shard: ShardId, rows: &[Bytes]) -> Result<(), ScatterError> {
        put_copy_data(&mut self.conn.io.wbuf, |b| {
            for row in rows.iter().filter(|r| r.len() >= 2) {
                let fields = i16::from_be_bytes([row[0], row[1]]);
                b.put_i16(fields + 1);
                b.put_slice(&row[2..]);
                b.put_i32(4);
                b.put_i32(shard as i32);
            }
        });
        if self.conn.io.wbuf.len() >= FLUSH_BYTES {
            let conn = &mut *self.conn;
            conn.io.flush().await.map_err(|e| ScatterError::NoCoordinator { reason: e.to_string() })?;
        }
        Ok(())
    }

    async fn fail(self) {
        let w = &mut self.conn.io.wbuf;
        protocol::put_message(w, b'f', |b| b.put_slice(b"scatter-gather abandoned\0"));
        protocol::query(w, "ROLLBACK");
        if self.conn.io.flush().await.is_ok() {
            let conn = &mut *self.conn;
            let ok =
                read_until_ready(conn, |_| {}).await.is_ok() && read_until_ready(conn, |_| {}).await.is_ok();
            conn.broken = !ok || conn.status != TxStatus::Idle;
        }
    }

    /// Ends the COPY, runs the final statement and relays its rows: their count.
    async fn finish(
        self,
        prepared: &Prepared,
        request: &Request<'_>,
        failed: &[ShardId],
        client: &mut Duplex,
    ) -> Result<u64, ScatterError> {
        let conn = self.conn;
        let final_sql = prepared.final_sql.as_deref().unwrap_or_default();
        let w = &mut conn.io.wbuf;
        put_copy_data(w, |b| b.put_i16(-1));
        protocol::put_message(w, b'c', |_| {});
        if !failed.is_empty() {
            let list: Vec<String> = failed.iter().map(ToString::to_string).collect();
            protocol::query(
                w,
                &format!("DELETE FROM pg_temp.{PARTIAL_TABLE} WHERE {FROM_COLUMN} IN ({})", list.join(", ")),
            );
        }
        protocol::parse(w, b"", final_sql.as_bytes(), &type_section(&prepared.param_types));
        protocol::bind_with(w, b"", request.parameters, request.result_formats);
        protocol::execute(w);
        protocol::sync(w);
        protocol::query(w, "COMMIT");
        let coordinator_error = |e: BackendError| ScatterError::NoCoordinator { reason: e.to_string() };
        conn.io.flush().await.map_err(io_error(conn)).map_err(coordinator_error)?;
        let mut error = None;
        // The COPY's answer, then the DELETE's.
        for _ in 0..(1 + usize::from(!failed.is_empty())) {
            if let Some(fields) = read_until_ready(conn, |_| {}).await.map_err(coordinator_error)? {
                error.get_or_insert(fields);
            }
        }
        let mut rows = 0u64;
        let mut final_error = None;
        loop {
            let frame = coordinator_frame(conn).await?;
            match frame.tag {
                b'C' | b'N' => {
                    protocol::put_message(&mut client.wbuf, frame.tag, |b| b.put_slice(frame.body()));
                }
                b'D' => {
                    rows += 1;
                    protocol::put_message(&mut client.wbuf, b'D', |b| b.put_slice(frame.body()));
                    if client.wbuf.len() >= FLUSH_BYTES {
                        client.flush().await.map_err(|_| ScatterError::Canceled)?;
                    }
                }
                b'E' => {
                    final_error.get_or_insert(protocol::error_fields(frame.body()));
                }
                b'Z' => break,
                _ => {}
            }
        }
        let committed = read_until_ready(conn, |_| {}).await.map_err(coordinator_error)?;
        conn.broken = committed.is_some() || conn.status != TxStatus::Idle;
        if let Some(fields) = error {
            return Err(ScatterError::Unmergeable(format!("this statement ({})", fields.message)));
        }
        if let Some(fields) = final_error {
            // The final statement's own error (an overflow of the merged sum, a division
            // by zero in HAVING): what PostgreSQL would have said over all the rows.
            return Err(ScatterError::Statement(fields));
        }
        Ok(rows)
    }
}

/// The coordinator's next message; its loss is the merge's.
async fn coordinator_frame(conn: &mut ServerConn) -> Result<Frame, ScatterError> {
    match conn.io.read_frame(MAX_SERVER_MESSAGE).await {
        Ok(Some(frame)) => Ok(frame),
        Ok(None) => {
            Err(ScatterError::NoCoordinator { reason: "the coordinator closed the connection".into() })
        }
        Err(e) => Err(ScatterError::NoCoordinator { reason: format!("{}: {e}", conn.addr) }),
    }
}

/// Which shard a partial row came from, so a partial result can leave a shard out.
const FROM_COLUMN: &str = "__pgtenant_from";

/// The COPY that fills the coordinator's table with the shards' rows.
fn start_copy(w: &mut BytesMut) {
    protocol::query(w, &format!("COPY pg_temp.{PARTIAL_TABLE} FROM STDIN (FORMAT binary)"));
}

fn put_copy_data(buf: &mut BytesMut, body: impl FnOnce(&mut BytesMut)) {
    protocol::put_message(buf, b'd', body);
}
