//! The coordinator of a merge: one shard's primary whose temporary table the shards'
//! partial rows are copied into (binary COPY), and which then runs the final
//! statement over it. With `OwnPart`, it first runs its own shard's part into that
//! table itself, so that a statement holds one connection of each pool.

use bytes::{BufMut, Bytes, BytesMut};

use super::ScatterError;
use super::plan::{PARTIAL_TABLE, column_name};
use super::request::{Policy, Prepared, Request, timeout_reason};
use super::wire::{FLUSH_BYTES, io_error, read_until_ready, type_section};
use crate::backend::{BackendError, MAX_SERVER_MESSAGE, ServerConn};
use crate::directory::ShardId;
use crate::net::Duplex;
use crate::protocol::{self, ErrorFields, Frame, TxStatus};

/// The coordinator's side of a merge: its table filled by COPY, then the final statement.
pub(super) struct Coordinator<'a> {
    conn: &'a mut ServerConn,
}

/// The part of the coordinator's own shard, which it runs into its table itself.
pub(super) struct OwnPart {
    pub(super) shard: ShardId,
    /// The statement's `scatter_timeout_ms`, which that part must keep too.
    pub(super) deadline: tokio::time::Instant,
}

/// How the coordinator's own part ended, when the statement goes on.
pub(super) enum OwnEnd {
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
    pub(super) async fn start(
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
    pub(super) async fn end_own_part(
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
    pub(super) async fn own_part(
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

    pub(super) async fn copy_rows(&mut self, shard: ShardId, rows: &[Bytes]) -> Result<(), ScatterError> {
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

    pub(super) async fn fail(self) {
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
    pub(super) async fn finish(
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
