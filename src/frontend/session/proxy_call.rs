//! The calls pgtenant answers itself (see `router::ProxyCall`): the snowflake calls
//! (`SELECT pgtenant.next_id()`, `next_ids(n)`, `decode_id(id)`) and those about the
//! client's own backend (`SELECT pg_backend_pid()`, `pg_cancel_backend(pid)`,
//! `pg_terminate_backend(pid)`), in the simple and the extended protocol, inside or
//! outside a transaction, without a server.
//!
//! The pid is the one pgtenant gave the client in its BackendKeyData, which is never a
//! server's (`CancelRegistry`): the signal functions reach the caller itself, as on
//! PostgreSQL, or another client of this proxy with the same login, database and
//! tenant (as a role may signal its own sessions); any other pid gets PostgreSQL's
//! answer for a process that is not a backend, so nothing tells another tenant's
//! sessions apart from no session at all.
//!
//! In the extended protocol such a statement never reaches a server: its Parse,
//! Bind, Describe, Execute and Close are answered here. Their replies go through
//! `Session::reply`, so they take their place after whatever an attached server
//! still owes. A Bind creates a local portal that Execute runs (minting then) and
//! that may be fetched in parts (Execute with a row limit).

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use super::server::inject_sql;
use super::{ClientTx, Session};
use crate::backend::OnError;
use crate::directory::ShardId;
use crate::frontend::error::FrontendError;
use crate::observe::conns::ShownTenant;
use crate::protocol::{
    self, BOOL_OID, Column, Frame, INT4_OID, INT8_OID, Severity, TIMESTAMPTZ_OID, TxStatus, Value, sqlstate,
};
use crate::router::{Analysis, CallArg, PidArg, ProxyCall, ProxySelect, Router, Signal, StatementKind};
use crate::snowflake::SnowflakeError;

/// Open local portals per session at most: each may hold up to 10,000 rows.
const MAX_LOCAL_PORTALS: usize = 64;

/// A portal bound to a statement pgtenant answers.
pub(super) struct LocalPortal {
    select: ProxySelect,
    /// The main argument's value, parameters resolved.
    arg: Option<i64>,
    formats: Vec<i16>,
    /// Rows not fetched yet, once executed.
    rows: Option<VecDeque<Vec<Value>>>,
}

/// What a call answers besides its rows.
struct Answer {
    rows: VecDeque<Vec<Value>>,
    /// A WARNING sent ahead of the rows.
    warning: Option<String>,
}

impl From<VecDeque<Vec<Value>>> for Answer {
    fn from(rows: VecDeque<Vec<Value>>) -> Self {
        Answer { rows, warning: None }
    }
}

/// The call pgtenant answers of a statement, if it is one.
pub(super) fn proxy_select(analysis: &Analysis) -> Option<&ProxySelect> {
    match &analysis.kind {
        StatementKind::ProxyCall(s) if !analysis.is_multi => Some(s),
        _ => None,
    }
}

/// The result columns of a call.
fn columns(select: &ProxySelect) -> Vec<Column> {
    match select.call {
        ProxyCall::NextId { .. } | ProxyCall::NextIds { .. } => {
            vec![Column::new(select.column.clone(), INT8_OID)]
        }
        ProxyCall::DecodeId { .. } => vec![
            Column::new("timestamp", TIMESTAMPTZ_OID),
            Column::new("shard_id", INT4_OID),
            Column::new("instance", INT4_OID),
            Column::new("sequence", INT4_OID),
        ],
        ProxyCall::BackendPid => vec![Column::new(select.column.clone(), INT4_OID)],
        ProxyCall::Signal { .. } => vec![Column::new(select.column.clone(), BOOL_OID)],
    }
}

/// The types of the parameters a call's text uses (`$n`: n of them), as Describe
/// reports them; those the call does not use are int8.
fn parameter_types(select: &ProxySelect) -> Vec<i32> {
    let mut types = Vec::new();
    for (index, type_oid) in select.params() {
        if types.len() <= index {
            types.resize(index + 1, INT8_OID);
        }
        types[index] = type_oid;
    }
    types
}

/// The call's main argument: the shard, the count, the ID, or the pid named.
fn call_arg(select: &ProxySelect) -> Option<CallArg> {
    match select.call {
        ProxyCall::NextId { shard } => shard,
        ProxyCall::NextIds { count } => Some(count),
        ProxyCall::DecodeId { id } => Some(id),
        ProxyCall::BackendPid | ProxyCall::Signal { pid: PidArg::Own, .. } => None,
        ProxyCall::Signal { pid: PidArg::Given(arg), .. } => Some(arg),
    }
}

impl Session {
    /// A Query (F) that is a call pgtenant answers: the whole answer, ReadyForQuery
    /// included.
    pub(super) async fn answer_proxy_query(
        &mut self,
        select: &ProxySelect,
        analysis: &Analysis,
    ) -> Result<(), FrontendError> {
        // Answers follow everything sent before, and carry the final transaction status.
        self.settle().await?;
        if self.client_status() == TxStatus::Failed {
            self.reply_error(&FrontendError::InFailedTransaction, true);
            return Ok(());
        }
        let arg = match call_arg(select) {
            Some(CallArg::Literal(v)) => Some(v),
            Some(CallArg::Param { .. }) => {
                let err = FrontendError::Snowflake(SnowflakeError::ParameterInSimpleQuery);
                self.reply_error(&err, true);
                return Ok(());
            }
            None => None,
        };
        match self.run_call(select, arg, Some(analysis)).await {
            Ok(answer) => {
                let mut b = BytesMut::new();
                if let Some(warning) = &answer.warning {
                    protocol::notice_response(&mut b, Severity::Warning, sqlstate::WARNING, warning);
                }
                protocol::row_description(&mut b, &columns(select), &[]);
                for row in &answer.rows {
                    protocol::data_row(&mut b, row, &[]);
                }
                self.reply(b);
                self.reply_done(&format!("SELECT {}", answer.rows.len()));
            }
            Err(err) if err.is_fatal() => return Err(err),
            Err(err) => self.reply_error(&err, true),
        }
        Ok(())
    }

    /// Mints, decodes or signals: the answer of a call whose main argument is `arg`.
    async fn run_call(
        &mut self,
        select: &ProxySelect,
        arg: Option<i64>,
        analysis: Option<&Analysis>,
    ) -> Result<Answer, FrontendError> {
        let minter = self.shared.minter.clone();
        let own = i64::from(self.cancel.pid);
        let (shard, count) = match select.call {
            ProxyCall::BackendPid => return Ok(VecDeque::from([vec![Value::Int4(own as i32)]]).into()),
            ProxyCall::Signal { signal, pid, .. } => {
                let pid = if pid == PidArg::Own { Some(own) } else { arg };
                return match pid {
                    // Strict functions: NULL in, NULL out.
                    None => Ok(VecDeque::from([vec![Value::Null]]).into()),
                    Some(pid) => self.signal_backend(signal, pid).await,
                };
            }
            ProxyCall::NextId { shard: Some(_) } => (arg.ok_or(SnowflakeError::NullArgument)?, 1),
            ProxyCall::NextId { shard: None } => (self.tenant_shard(analysis).await? as i64, 1),
            ProxyCall::NextIds { .. } => {
                // Checked before the tenant is looked for: bad input is reported first.
                let n = arg.ok_or(SnowflakeError::NullArgument)?;
                crate::snowflake::check_batch(n)?;
                (self.tenant_shard(analysis).await? as i64, n)
            }
            ProxyCall::DecodeId { .. } => {
                let d = minter.layout().decode(arg.ok_or(SnowflakeError::NullArgument)?);
                let row = vec![
                    Value::Timestamptz(d.unix_ms),
                    Value::Int4(d.shard as i32),
                    Value::Int4(d.instance as i32),
                    Value::Int4(d.counter as i32),
                ];
                return Ok(VecDeque::from([row]).into());
            }
        };
        let ids = match minter.mint(shard, count).await {
            Err(
                SnowflakeError::NoneFree | SnowflakeError::NoInstance | SnowflakeError::LeaseExpired { .. },
            ) => self.mint_on_shard(shard, count).await?,
            minted => minted?,
        };
        Ok(ids.into_iter().map(|id| vec![Value::Int8(id)]).collect::<VecDeque<_>>().into())
    }

    /// `count` IDs of `shard` minted by that shard's own `pgtenant.next_id` (instance 0,
    /// `sql/snowflake.sql`), for when this proxy holds no instance number: every number
    /// leased to other proxies, or the catalog out of reach. Unique as the proxy's are,
    /// since a shard mints only its own shard id here; one round trip per call.
    async fn mint_on_shard(&mut self, shard: i64, count: i64) -> Result<Vec<i64>, FrontendError> {
        let refused = |reason: String| FrontendError::from(SnowflakeError::NotOnShard { shard, reason });
        let known =
            ShardId::try_from(shard).ok().filter(|id| self.shared.router.topology().shard(*id).is_some());
        let Some(id) = known else {
            return Err(refused("it is not a shard of this proxy's directory".into()));
        };
        let mut conn = self.scatter_conn(id, false).await?.map_err(refused)?;
        // In a transaction of its own, READ WRITE: the connection may carry a read-only
        // tenant's wall, and minting is no write of the tenant's (as the proxy's is not).
        let sql = format!(
            "BEGIN READ WRITE; SELECT pgtenant.next_id({shard}) FROM generate_series(1, {count}); COMMIT"
        );
        let minted = conn.query_first_column(&sql).await;
        let values = match minted {
            Ok(Ok(values)) => values,
            Ok(Err(error)) => {
                if !matches!(conn.run_sql("ROLLBACK").await, Ok(None)) {
                    conn.discard();
                }
                return Err(refused(error.message));
            }
            Err(e) => {
                conn.discard();
                return Err(refused(e.to_string()));
            }
        };
        let ids: Vec<i64> = values.iter().filter_map(|v| v.parse().ok()).collect();
        if ids.len() as i64 != count {
            return Err(refused(format!("it answered {} IDs of {count}", ids.len())));
        }
        Ok(ids)
    }

    /// `pg_cancel_backend(pid)` / `pg_terminate_backend(pid)`: see the module comment.
    async fn signal_backend(&mut self, signal: Signal, pid: i64) -> Result<Answer, FrontendError> {
        if pid == i64::from(self.cancel.pid) {
            return Err(match signal {
                // The FATAL ends the session; `finish` rolls back what it left open.
                Signal::Terminate => FrontendError::Terminated,
                Signal::Cancel => self.cancel_own_statement().await?,
            });
        }
        let tenant = self.tenant.as_ref().map(ShownTenant::from);
        let sibling = u32::try_from(pid).ok().and_then(|pid| {
            self.shared.clients.find_pid(pid).filter(|row| {
                row.info.user == self.user.name && row.info.database == self.database && row.tenant == tenant
            })
        });
        let Some(sibling) = sibling else {
            let warning = format!("PID {pid} is not a PostgreSQL backend process");
            return Ok(Answer { rows: VecDeque::from([vec![Value::Bool(false)]]), warning: Some(warning) });
        };
        match signal {
            Signal::Terminate => {
                self.shared.clients.terminate(sibling.id);
            }
            Signal::Cancel => {
                let reach = self.shared.cancels.reach_unchecked(sibling.info.pid);
                tokio::spawn(crate::frontend::cancel::forward(reach));
            }
        }
        Ok(VecDeque::from([vec![Value::Bool(true)]]).into())
    }

    /// `pg_cancel_backend` of the caller's own pid: PostgreSQL cancels the very statement
    /// that called it (57014), and with it the transaction block it ran in. A server
    /// transaction open for the client is rolled back, and the client's transaction is
    /// failed until it ends it, as on PostgreSQL.
    async fn cancel_own_statement(&mut self) -> Result<FrontendError, FrontendError> {
        self.settle().await?;
        if let Some(a) = self.server.as_mut()
            && a.conn.status != TxStatus::Idle
        {
            inject_sql(&mut a.conn, "ROLLBACK", OnError::Swallow);
            self.tx = ClientTx::Failed;
        } else {
            self.abort_deferred_begin();
        }
        Ok(FrontendError::CanceledOwn)
    }

    /// The shard whose IDs `next_id()` mints: the open transaction's, else the tenant's
    /// (the session's, or the one the statement's comment names).
    async fn tenant_shard(&mut self, analysis: Option<&Analysis>) -> Result<ShardId, FrontendError> {
        if let Some(a) = &self.server {
            return Ok(a.route.shard);
        }
        let router = &self.shared.router;
        let named = analysis.map(|a| router.named_in_text(a)).unwrap_or_default();
        Router::check_bound(self.tenant.as_ref(), &named)?;
        // Minting always needs a tenant (or the no-tenant policy's default shard).
        let tenant = self.tenant.as_ref().or(named.first());
        Ok(router.route_tenant(tenant, || true).await?.shard)
    }

    /// Handles an extended-protocol message if it concerns a statement pgtenant answers or
    /// a local portal (`true`); see `Session::answer_local_message`.
    pub(super) async fn proxy_call_message(&mut self, frame: &Frame) -> Result<bool, FrontendError> {
        let body = frame.body();
        match frame.tag {
            b'P' => {
                let p = protocol::parse_view(body).ok_or_else(|| FrontendError::malformed("Parse"))?;
                if proxy_select(&self.recent.get_or_analyze(&self.shared.router, p.query)).is_none() {
                    return Ok(false);
                }
                // Answered where every Parse is handled; such a one never reaches a server.
                self.forward_parse(frame)?;
                Ok(true)
            }
            b'B' => {
                let bind = protocol::bind_view(body).ok_or_else(|| FrontendError::malformed("Bind"))?;
                let Some(analysis) = self.bound_analysis(bind.statement) else {
                    self.local_portals.remove(bind.portal);
                    return Ok(false);
                };
                let Some(select) = proxy_select(&analysis) else {
                    // The name now belongs to a server portal.
                    if !self.local_portals.is_empty() {
                        self.local_portals.remove(bind.portal);
                    }
                    return Ok(false);
                };
                let select = select.clone();
                let arg = match call_arg(&select) {
                    None => None,
                    Some(CallArg::Literal(v)) => Some(v),
                    Some(CallArg::Param { index, .. }) => bound_integer(bind.rest, index)?,
                };
                let formats = protocol::bind_result_formats(bind.rest)
                    .ok_or_else(|| FrontendError::malformed("Bind"))?;
                if self.local_portals.len() >= MAX_LOCAL_PORTALS
                    && !self.local_portals.contains_key(bind.portal)
                {
                    return Err(SnowflakeError::TooManyPortals { max: MAX_LOCAL_PORTALS }.into());
                }
                let portal = LocalPortal { select, arg, formats, rows: None };
                self.local_portals.insert(Bytes::copy_from_slice(bind.portal), portal);
                let mut b = BytesMut::new();
                protocol::bind_complete(&mut b);
                self.reply(b);
                Ok(true)
            }
            b'D' => {
                let (kind, name) =
                    protocol::target_view(body).ok_or_else(|| FrontendError::malformed("Describe"))?;
                let mut b = BytesMut::new();
                if kind == b'P' {
                    let Some(portal) = self.local_portals.get(name) else { return Ok(false) };
                    protocol::row_description(&mut b, &columns(&portal.select), &portal.formats);
                } else {
                    let Some(analysis) = self.bound_analysis(name) else { return Ok(false) };
                    let Some(select) = proxy_select(&analysis) else { return Ok(false) };
                    protocol::parameter_description(&mut b, &parameter_types(select));
                    protocol::row_description(&mut b, &columns(select), &[]);
                }
                self.reply(b);
                Ok(true)
            }
            b'E' => {
                let (name, rest) =
                    protocol::split_cstr(body).ok_or_else(|| FrontendError::malformed("Execute"))?;
                let Some(mut portal) = self.local_portals.remove(name) else { return Ok(false) };
                let max_rows =
                    rest.get(..4).map(|x| i32::from_be_bytes([x[0], x[1], x[2], x[3]])).unwrap_or(0);
                if self.client_status() == TxStatus::Failed {
                    return Err(FrontendError::InFailedTransaction);
                }
                let mut b = BytesMut::new();
                let mut rows = match portal.rows.take() {
                    Some(rows) => rows,
                    None => {
                        let answer = self.run_call(&portal.select, portal.arg, None).await?;
                        if let Some(warning) = &answer.warning {
                            protocol::notice_response(&mut b, Severity::Warning, sqlstate::WARNING, warning);
                        }
                        answer.rows
                    }
                };
                let take = if max_rows > 0 { (max_rows as usize).min(rows.len()) } else { rows.len() };
                for row in rows.drain(..take) {
                    protocol::data_row(&mut b, &row, &portal.formats);
                }
                if rows.is_empty() {
                    protocol::command_complete(&mut b, &format!("SELECT {take}"));
                } else {
                    protocol::put_message(&mut b, b's', |_| {});
                }
                portal.rows = Some(rows);
                self.local_portals.insert(Bytes::copy_from_slice(name), portal);
                self.reply(b);
                Ok(true)
            }
            b'C' => {
                let (kind, name) =
                    protocol::target_view(body).ok_or_else(|| FrontendError::malformed("Close"))?;
                if kind != b'P' || self.local_portals.remove(name).is_none() {
                    return Ok(false);
                }
                let mut b = BytesMut::new();
                protocol::close_complete(&mut b);
                self.reply(b);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Whether every message of the held request is answered here (none needs a server).
    pub(super) fn request_is_local(&mut self) -> bool {
        // The Parse messages' statements, analyzed first (that needs `&mut self.recent`).
        let mut parsed: Vec<(Bytes, bool)> = Vec::new();
        for frame in &self.batch {
            if frame.tag == b'P' {
                let Some(p) = protocol::parse_view(frame.body()) else { return false };
                let analysis = self.recent.get_or_analyze(&self.shared.router, p.query);
                let local = proxy_select(&analysis).is_some() || super::scatter::is_scatter(&analysis);
                parsed.push((Bytes::copy_from_slice(p.name), local));
            }
        }
        let mut parsed_so_far = 0;
        let mut bound: Vec<&[u8]> = Vec::new();
        let is_local_statement =
            |parsed: &[(Bytes, bool)], name: &[u8]| match parsed.iter().rev().find(|(n, _)| n == name) {
                Some((_, sf)) => *sf,
                None => self.bound_analysis(name).is_some_and(|a| {
                    proxy_select(&a).is_some() || self.scatter_statements.contains_key(name)
                }),
            };
        let mut any = false;
        for frame in &self.batch {
            let body = frame.body();
            let local = match frame.tag {
                b'P' => {
                    parsed_so_far += 1;
                    parsed[parsed_so_far - 1].1
                }
                b'B' => protocol::bind_view(body).is_some_and(|b| {
                    bound.push(b.portal);
                    is_local_statement(&parsed[..parsed_so_far], b.statement)
                }),
                b'D' | b'C' => match protocol::target_view(body) {
                    Some((b'S', name)) => is_local_statement(&parsed[..parsed_so_far], name),
                    Some((_, name)) => {
                        bound.contains(&name)
                            || self.local_portals.contains_key(name)
                            || self.scatter_portals.contains_key(name)
                    }
                    None => false,
                },
                b'E' => protocol::split_cstr(body).is_some_and(|(name, _)| {
                    bound.contains(&name)
                        || self.local_portals.contains_key(name)
                        || self.scatter_portals.contains_key(name)
                }),
                _ => true,
            };
            if !local {
                return false;
            }
            any |= !matches!(frame.tag, b'S' | b'H');
        }
        any
    }

    /// Answers a held request that `request_is_local` accepted.
    pub(super) async fn answer_local_request(&mut self) -> Result<(), FrontendError> {
        for frame in std::mem::take(&mut self.batch) {
            if frame.tag == b'S' {
                self.skip_until_sync = false;
                let mut b = BytesMut::new();
                protocol::ready_for_query(&mut b, self.client_status());
                self.reply(b);
            } else if !self.skip_until_sync && frame.tag != b'H' {
                self.answer_local_message(frame).await?;
            }
        }
        Ok(())
    }
}

/// Parameter `index` (zero-based) of a Bind as an integer: text, or binary int2/int4/int8.
fn bound_integer(rest: &[u8], index: usize) -> Result<Option<i64>, FrontendError> {
    let n = u16::try_from(index + 1).map_err(|_| FrontendError::malformed("Bind"))?;
    let (binary, value) = protocol::bind_param(rest, n).ok_or_else(|| FrontendError::malformed("Bind"))?;
    let Some(value) = value else { return Ok(None) };
    let parsed = if binary {
        protocol::binary_int(value)
    } else {
        std::str::from_utf8(value).ok().and_then(|s| s.trim().parse().ok())
    };
    parsed
        .map(Some)
        .ok_or_else(|| SnowflakeError::BadArgument { value: String::from_utf8_lossy(value).into() }.into())
}
