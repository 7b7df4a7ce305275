//! A stand-in for a PostgreSQL server, for the session fuzz target only: it speaks the
//! protocol's states as PostgreSQL does (transaction status, skip-until-Sync after an
//! extended-protocol error, COPY in both directions and the copy messages it ignores
//! outside COPY, named statements and portals), answers every statement with one text
//! row, and takes orders from markers in the SQL (`fuzz_error`, `fuzz_close`,
//! `fuzz_fatal`, `fuzz_slow`, `fuzz_notice`) so generated sequences can make a server
//! fail, die or lag at any point. The point is to reach the proxy's session states fast
//! and in bulk; what a real server does is the integration tests' job.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::protocol::values::TEXT_OID;
use crate::protocol::*;

/// Larger messages than any the generated sessions send: a connection that declares
/// one is dropped.
const MAX_MESSAGE: usize = 1 << 22;

/// Listens on a loopback port and serves each connection in its own task, until the
/// returned task is aborted (connections already open end as their clients leave).
pub(crate) async fn start() -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let mut next_pid = 1000u32;
        loop {
            if let Ok((stream, _)) = listener.accept().await {
                next_pid = next_pid.wrapping_add(1);
                let _ = stream.set_nodelay(true);
                tokio::spawn(Conn::new(stream, next_pid).serve());
            }
        }
    });
    Ok((addr, task))
}

/// What a statement is, as far as the fake's answers go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Empty,
    Begin,
    Commit,
    Rollback,
    RollbackTo,
    Savepoint,
    CopyIn,
    CopyOut,
    /// Answers with a command tag and no rows.
    Utility,
    Select,
}

fn classify(sql: &str) -> Kind {
    let s = sql.trim_start().to_ascii_lowercase();
    let first = s.split(|c: char| !c.is_ascii_alphabetic()).next().unwrap_or("");
    match first {
        "" if s.trim().is_empty() => Kind::Empty,
        "begin" | "start" => Kind::Begin,
        "commit" | "end" => Kind::Commit,
        "abort" => Kind::Rollback,
        "rollback" if s.contains(" to ") => Kind::RollbackTo,
        "rollback" => Kind::Rollback,
        "savepoint" | "release" => Kind::Savepoint,
        "copy" if s.contains("stdin") => Kind::CopyIn,
        "copy" if s.contains("stdout") => Kind::CopyOut,
        "select" | "with" | "values" | "table" | "show" | "fetch" | "execute" | "insert" | "update"
        | "delete" => Kind::Select,
        _ => Kind::Utility,
    }
}

/// How a statement ended, for the protocol around it.
enum Outcome {
    Done,
    Failed,
    /// The fake hung up (a crash, or `pg_terminate_backend`).
    Gone,
}

struct Portal {
    sql: String,
    formats: Vec<i16>,
}

struct Conn {
    stream: TcpStream,
    input: BytesMut,
    out: BytesMut,
    pid: u32,
    status: TxStatus,
    /// After an extended-protocol error: every message up to Sync is ignored.
    skipping: bool,
    statements: HashMap<Vec<u8>, String>,
    portals: HashMap<Vec<u8>, Portal>,
}

impl Conn {
    fn new(stream: TcpStream, pid: u32) -> Self {
        Self {
            stream,
            input: BytesMut::with_capacity(8192),
            out: BytesMut::with_capacity(8192),
            pid,
            status: TxStatus::Idle,
            skipping: false,
            statements: HashMap::new(),
            portals: HashMap::new(),
        }
    }

    async fn serve(mut self) {
        if self.startup().await.is_some() {
            while self.step().await.is_some() {}
        }
    }

    async fn flush(&mut self) -> Option<()> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out).await.ok()?;
            self.out.clear();
        }
        Some(())
    }

    async fn read_frame(&mut self) -> Option<Frame> {
        loop {
            if let Some(frame) = try_parse_frame(&mut self.input, MAX_MESSAGE).ok()? {
                return Some(frame);
            }
            if self.stream.read_buf(&mut self.input).await.ok()? == 0 {
                return None;
            }
        }
    }

    /// SSLRequest and GSSENCRequest refused, any login accepted.
    async fn startup(&mut self) -> Option<()> {
        loop {
            let len = self.stream.read_u32().await.ok()? as usize;
            if !(8..=10_000).contains(&len) {
                return None;
            }
            let mut body = vec![0; len - 4];
            self.stream.read_exact(&mut body).await.ok()?;
            match read_startup_frame(&body).ok()? {
                StartupPacket::SslRequest | StartupPacket::GssEncRequest => {
                    self.stream.write_all(b"N").await.ok()?
                }
                StartupPacket::Startup { .. } => break,
                _ => return None,
            }
        }
        authentication(&mut self.out, 0, &[]);
        for (name, value) in [
            ("server_version", "15.4"),
            ("server_encoding", "UTF8"),
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO, MDY"),
            ("TimeZone", "UTC"),
            ("integer_datetimes", "on"),
            ("standard_conforming_strings", "on"),
            ("is_superuser", "off"),
            ("application_name", ""),
        ] {
            parameter_status_msg(&mut self.out, name, value);
        }
        backend_key_data(&mut self.out, self.pid, self.pid.wrapping_mul(7919));
        ready_for_query(&mut self.out, self.status);
        self.flush().await
    }

    /// One message from the client, answered.
    async fn step(&mut self) -> Option<()> {
        let frame = self.read_frame().await?;
        let body = frame.body();
        if self.skipping && !matches!(frame.tag, b'S' | b'X') {
            return Some(());
        }
        match frame.tag {
            b'Q' => {
                let sql = String::from_utf8_lossy(query_text(body)?).into_owned();
                self.simple_query(&sql).await?;
            }
            b'P' => {
                let parse = parse_view(body)?;
                let name = parse.name.to_vec();
                if !name.is_empty() && self.statements.contains_key(&name) {
                    self.fail(sqlstate::DUPLICATE_PSTATEMENT, "prepared statement already exists");
                } else {
                    self.statements.insert(name, String::from_utf8_lossy(parse.query).into_owned());
                    parse_complete(&mut self.out);
                }
            }
            b'B' => self.bind(body)?,
            b'D' => self.describe(body)?,
            b'E' => self.execute(body).await?,
            b'C' => {
                let (kind, name) = target_view(body)?;
                match kind {
                    b'S' => self.statements.remove(name),
                    _ => self.portals.remove(name).map(|p| p.sql),
                };
                close_complete(&mut self.out);
            }
            b'S' => {
                self.skipping = false;
                self.portals.remove(&b""[..]);
                ready_for_query(&mut self.out, self.status);
            }
            b'H' => {}
            b'F' => {
                put_message(&mut self.out, b'V', |b| b.put_i32(-1));
                ready_for_query(&mut self.out, self.status);
            }
            // Outside COPY, PostgreSQL ignores the copy messages of a COPY it ended.
            b'd' | b'c' | b'f' => {}
            b'X' => return None,
            _ => {
                error_response(
                    &mut self.out,
                    Severity::Fatal,
                    sqlstate::PROTOCOL_VIOLATION,
                    "invalid frontend message type",
                );
                self.flush().await;
                return None;
            }
        }
        self.flush().await
    }

    /// An error in the current transaction; in the extended protocol, skip to Sync.
    fn fail(&mut self, code: &str, message: &str) {
        error_response(&mut self.out, Severity::Error, code, message);
        if self.status == TxStatus::InTransaction {
            self.status = TxStatus::Failed;
        }
        self.skipping = true;
    }

    async fn simple_query(&mut self, sql: &str) -> Option<()> {
        let pieces: Vec<&str> = sql.split(';').filter(|p| !p.trim().is_empty()).collect();
        if pieces.is_empty() {
            put_message(&mut self.out, b'I', |_| {});
        }
        for piece in pieces {
            match self.run(piece, &[], true).await {
                Outcome::Done => {}
                Outcome::Failed => break,
                Outcome::Gone => return None,
            }
        }
        // The simple protocol never skips to a Sync.
        self.skipping = false;
        ready_for_query(&mut self.out, self.status);
        Some(())
    }

    fn bind(&mut self, body: &[u8]) -> Option<()> {
        let bind = bind_view(body)?;
        let Some(sql) = self.statements.get(bind.statement).cloned() else {
            self.fail(sqlstate::INVALID_SQL_STATEMENT_NAME, "prepared statement does not exist");
            return Some(());
        };
        if !bind.portal.is_empty() && self.portals.contains_key(bind.portal) {
            self.fail(sqlstate::DUPLICATE_CURSOR, "portal already exists");
            return Some(());
        }
        let formats = bind_result_formats(bind.rest).unwrap_or_default();
        self.portals.insert(bind.portal.to_vec(), Portal { sql, formats });
        bind_complete(&mut self.out);
        Some(())
    }

    fn describe(&mut self, body: &[u8]) -> Option<()> {
        let (kind, name) = target_view(body)?;
        let (sql, formats) = match kind {
            b'S' => match self.statements.get(name) {
                Some(sql) => {
                    let params = (1..=9).take_while(|n| sql.contains(&format!("${n}"))).count();
                    parameter_description(&mut self.out, &vec![TEXT_OID; params]);
                    (sql.clone(), Vec::new())
                }
                None => {
                    self.fail(sqlstate::INVALID_SQL_STATEMENT_NAME, "prepared statement does not exist");
                    return Some(());
                }
            },
            _ => match self.portals.get(name) {
                Some(portal) => (portal.sql.clone(), portal.formats.clone()),
                None => {
                    self.fail(sqlstate::INVALID_CURSOR_NAME, "portal does not exist");
                    return Some(());
                }
            },
        };
        if classify(&sql) == Kind::Select {
            row_description(&mut self.out, &[Column::new("?column?", TEXT_OID)], &formats);
        } else {
            put_message(&mut self.out, b'n', |_| {});
        }
        Some(())
    }

    async fn execute(&mut self, body: &[u8]) -> Option<()> {
        let (name, _) = split_cstr(body)?;
        let Some(portal) = self.portals.get(name) else {
            self.fail(sqlstate::INVALID_CURSOR_NAME, "portal does not exist");
            return Some(());
        };
        let (sql, formats) = (portal.sql.clone(), portal.formats.clone());
        match self.run(&sql, &formats, false).await {
            Outcome::Gone => None,
            Outcome::Done | Outcome::Failed => Some(()),
        }
    }

    /// One statement: its rows (and RowDescription in the simple protocol), its
    /// command tag, its effect on the transaction status.
    async fn run(&mut self, sql: &str, formats: &[i16], simple: bool) -> Outcome {
        if sql.contains("fuzz_slow") {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if sql.contains("fuzz_notice") {
            notice_response(&mut self.out, Severity::Warning, sqlstate::WARNING, "fuzz notice");
            parameter_status_msg(&mut self.out, "application_name", "fuzz");
        }
        if sql.contains("fuzz_close") {
            let _ = self.flush().await;
            return Outcome::Gone;
        }
        if sql.contains("fuzz_fatal") {
            error_response(
                &mut self.out,
                Severity::Fatal,
                sqlstate::ADMIN_SHUTDOWN,
                "terminating connection due to administrator command",
            );
            let _ = self.flush().await;
            return Outcome::Gone;
        }
        // Permission refused to the health checker: its node stays unchecked.
        if sql.contains("pg_is_in_recovery()") {
            self.fail(sqlstate::INSUFFICIENT_PRIVILEGE, "permission denied");
            return Outcome::Failed;
        }
        let kind = classify(sql);
        if self.status == TxStatus::Failed
            && !matches!(kind, Kind::Commit | Kind::Rollback | Kind::RollbackTo)
        {
            self.fail(
                sqlstate::IN_FAILED_SQL_TRANSACTION,
                "current transaction is aborted, commands ignored until end of transaction block",
            );
            return Outcome::Failed;
        }
        if sql.contains("fuzz_error") {
            if kind == Kind::CopyIn {
                // As PostgreSQL refusing `COPY ... FREEZE`: CopyInResponse, then the error at once.
                copy_response(&mut self.out, b'G');
            }
            self.fail(sqlstate::INTERNAL_ERROR, "fuzz error");
            return Outcome::Failed;
        }
        match kind {
            Kind::Empty => put_message(&mut self.out, b'I', |_| {}),
            Kind::Begin => {
                self.status = TxStatus::InTransaction;
                command_complete(&mut self.out, "BEGIN");
            }
            Kind::Commit => {
                let tag = if self.status == TxStatus::Failed { "ROLLBACK" } else { "COMMIT" };
                self.status = TxStatus::Idle;
                command_complete(&mut self.out, tag);
            }
            Kind::Rollback => {
                self.status = TxStatus::Idle;
                command_complete(&mut self.out, "ROLLBACK");
            }
            Kind::RollbackTo | Kind::Savepoint if self.status == TxStatus::Idle => {
                self.fail(
                    sqlstate::NO_ACTIVE_SQL_TRANSACTION,
                    "savepoints can only be used in transaction blocks",
                );
                return Outcome::Failed;
            }
            Kind::RollbackTo => {
                self.status = TxStatus::InTransaction;
                command_complete(&mut self.out, "ROLLBACK");
            }
            Kind::Savepoint => command_complete(&mut self.out, "SAVEPOINT"),
            Kind::CopyIn => return self.copy_in().await,
            Kind::CopyOut => {
                copy_response(&mut self.out, b'H');
                for row in ["7\tone\n", "7\ttwo\n"] {
                    put_message(&mut self.out, b'd', |b| b.put_slice(row.as_bytes()));
                }
                put_message(&mut self.out, b'c', |_| {});
                command_complete(&mut self.out, "COPY 2");
            }
            Kind::Utility => {
                let tag = sql.split_whitespace().next().unwrap_or("").to_ascii_uppercase();
                command_complete(&mut self.out, &tag);
            }
            Kind::Select => {
                if simple {
                    row_description(&mut self.out, &[Column::new("?column?", TEXT_OID)], formats);
                }
                let value = if sql.contains("fuzz-end") { "fuzz-end" } else { "1" };
                data_row(&mut self.out, &[Value::Text(value.into())], formats);
                command_complete(&mut self.out, "SELECT 1");
            }
        }
        Outcome::Done
    }

    /// COPY FROM STDIN: rows until CopyDone, CopyFail or another message, which ends
    /// the connection (Flush and Sync are ignored here, as PostgreSQL does).
    async fn copy_in(&mut self) -> Outcome {
        copy_response(&mut self.out, b'G');
        if self.flush().await.is_none() {
            return Outcome::Gone;
        }
        let mut rows = 0u64;
        loop {
            let Some(frame) = self.read_frame().await else { return Outcome::Gone };
            match frame.tag {
                b'd' => rows += 1,
                b'c' => {
                    command_complete(&mut self.out, &format!("COPY {rows}"));
                    return Outcome::Done;
                }
                b'f' => {
                    self.fail(sqlstate::QUERY_CANCELED, "COPY from stdin failed");
                    return Outcome::Failed;
                }
                b'H' | b'S' => {}
                b'X' => return Outcome::Gone,
                other => {
                    // As PostgreSQL: the copy fails, and the connection with it.
                    let message = format!("unexpected message type 0x{other:02X} during COPY from stdin");
                    self.fail(sqlstate::PROTOCOL_VIOLATION, &message);
                    let lost = "terminating connection because protocol synchronization was lost";
                    error_response(&mut self.out, Severity::Fatal, sqlstate::PROTOCOL_VIOLATION, lost);
                    let _ = self.flush().await;
                    return Outcome::Gone;
                }
            }
        }
    }
}

/// CopyInResponse (`G`) or CopyOutResponse (`H`): text, one column.
fn copy_response(buf: &mut BytesMut, tag: u8) {
    put_message(buf, tag, |b| {
        b.put_u8(0);
        b.put_i16(1);
        b.put_i16(0);
    });
}
