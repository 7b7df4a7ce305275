//! Scatter-gather statements (`SELECT ... FROM all_shards.<table>`) in a session: who
//! may run them, the shard connections they run on, and their messages in both
//! protocols. In the extended protocol such a statement never reaches a server as
//! written: its Parse is described on one shard (the probe), and its Bind, Describe,
//! Execute and Close are answered here, as for a call pgtenant answers
//! (`proxy_call`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::Session;
use super::admission::Candidate;
use super::client_watch::unless_client_leaves;
use crate::admin::scatter::{self, Link, Policy, Prepared, Request, ScatterError};
use crate::backend::health::{LagBound, PrimaryChoice};
use crate::backend::{PooledConn, ServerPool, Wanted};
use crate::config::NodeConfig;
use crate::directory::{ShardId, ShardStatus};
use crate::frontend::error::FrontendError;
use crate::observe::scatter::Outcome;
use crate::protocol::{self, Frame, TxStatus};
use crate::router::{Analysis, SCATTER_PARAMETER, StatementKind, TargetMode};

/// Open scatter-gather portals per session at most.
const MAX_SCATTER_PORTALS: usize = 64;
/// Scatter-gather statements a session may keep prepared at most.
const MAX_SCATTER_STATEMENTS: usize = 256;

/// A portal bound to a scatter-gather statement.
pub(super) struct ScatterPortal {
    prepared: Arc<Prepared>,
    /// The Bind's parameter part, sent on to every shard and the coordinator.
    parameters: Bytes,
    formats: Vec<i16>,
}

/// Whether a statement is a scatter-gather.
pub(super) fn is_scatter(analysis: &Analysis) -> bool {
    matches!(analysis.kind, StatementKind::Scatter) && !analysis.is_multi
}

/// The parameter types of a Parse (its raw section) as OIDs.
fn declared_types(raw: &[u8]) -> Vec<u32> {
    raw.get(2..)
        .unwrap_or_default()
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Counts how a scatter-gather statement ended (`Ok` with the shards left out), and
/// logs it when it failed: operators find failed statements in the log, not only as a
/// number.
fn scatter_ended(ended: Result<usize, &ScatterError>, sql: &str, started: Instant, shard_us: &[(u32, u64)]) {
    let outcome = match ended {
        Ok(0) => Outcome::Answered,
        Ok(_) => Outcome::Partial,
        Err(e) => e.outcome(),
    };
    if let Err(e) = ended
        && outcome != Outcome::Canceled
    {
        tracing::info!(outcome = outcome.name(), error = %e, statement = sql, "scatter-gather statement failed");
    }
    crate::observe::scatter::record(outcome, started.elapsed(), shard_us);
}

impl Session {
    /// Only admins and `scatter_gather` users, in a session without a tenant, outside
    /// a transaction that already runs on a shard.
    fn check_scatter_allowed(&self) -> Result<(), ScatterError> {
        if !self.user.admin && !self.user.scatter_gather {
            return Err(ScatterError::NotAllowed { user: self.user.name.clone() });
        }
        if let Some(tenant) = &self.tenant {
            return Err(ScatterError::TenantBound { tenant: tenant.to_string() });
        }
        // A server kept between transactions (session pooling, a pin) is no obstacle:
        // a scatter-gather runs on connections of its own.
        if let Some(a) = &self.server
            && a.conn.status != TxStatus::Idle
        {
            return Err(ScatterError::InTransaction { shard: a.route.shard });
        }
        Ok(())
    }

    /// `pgtenant.scatter` as the session's settings have it.
    fn scatter_policy(&self) -> Policy {
        self.settings.value_of(SCATTER_PARAMETER).and_then(Policy::parse).unwrap_or_default()
    }

    /// The shards a scatter-gather covers: all but the disabled ones, in id order.
    fn scatter_shards(&self) -> Vec<ShardId> {
        let topology = self.shared.router.topology();
        topology
            .shard_ids()
            .filter(|id| topology.shard(*id).is_some_and(|s| s.status != ShardStatus::Disabled))
            .collect()
    }

    /// The node a part on `shard` runs on: its primary, or a healthy replica when
    /// `replica` and the session prefers replicas; and whether it is the primary.
    fn scatter_node(&self, shard: ShardId, replica: bool) -> Result<(NodeConfig, bool), String> {
        let topology = self.shared.router.topology();
        let s = topology.shard(shard).ok_or_else(|| format!("shard {shard} is not in the topology"))?;
        let on_replica = replica.then(|| {
            self.shared.health.replica_of(s, LagBound::of(&self.shared.config.health), self.write_to_read())
        });
        match on_replica.flatten() {
            Some(node) => Ok((node, false)),
            None if replica && self.target == TargetMode::Replica => {
                Err("no healthy replica (pgtenant.target = replica)".into())
            }
            None => match self.shared.health.primary_of(s) {
                PrimaryChoice::Node(node) => Ok((node, true)),
                PrimaryChoice::Holding(reason) => Err(format!("no primary: {}", reason.describe())),
            },
        }
    }

    /// A connection to `shard` with this client's settings and no tenant, on
    /// `scatter_node`'s node; the inner error says why that shard gave none. The outer
    /// one ends the session: the client left (or was KILLed) while the checkout waited.
    pub(super) async fn scatter_conn(
        &mut self,
        shard: ShardId,
        replica: bool,
    ) -> Result<Result<PooledConn, String>, FrontendError> {
        let node = match self.scatter_node(shard, replica) {
            Ok((node, _)) => node,
            Err(why) => return Ok(Err(why)),
        };
        let (pool, wanted) = self.scatter_pool(shard, &node);
        let checkout = std::pin::pin!(self.shared.pools.checkout_from(&pool, shard, &None, wanted));
        match unless_client_leaves(&mut self.client, &self.listed, &self.cancel, checkout).await? {
            Ok(conn) => Ok(self.ready_for_scatter(conn).await),
            Err(e) => Ok(Err(e.to_string())),
        }
    }

    /// A second connection of the primary's pool of `shard` (the coordinator's), only
    /// if one is free at once: never waited for while the coordinator is held.
    async fn scatter_conn_at_once(&mut self, shard: ShardId) -> Option<PooledConn> {
        let (node, _) = self.scatter_node(shard, false).ok()?;
        let (pool, wanted) = self.scatter_pool(shard, &node);
        let conn = self.shared.pools.checkout_if_free(&pool, shard, &None, wanted).await.ok()??;
        self.ready_for_scatter(conn).await.ok()
    }

    /// The pool a part on `node` of `shard` draws from, and what its connection must
    /// carry: the client's settings and no tenant.
    fn scatter_pool(&self, shard: ShardId, node: &NodeConfig) -> (ServerPool, Wanted<'static>) {
        let pool = self.shared.pools.pool(shard, node, &self.user, &self.database);
        (pool, Wanted { tenant: Some(None), settings: Some(self.settings.version) })
    }

    /// Gives `conn` the client's settings and no tenant.
    async fn ready_for_scatter(&self, mut conn: PooledConn) -> Result<PooledConn, String> {
        if let Some(server) = &conn.listed {
            server.serve(&self.listed, None);
        }
        let context = crate::frontend::tenant_context(&self.shared.config);
        if let Err(e) = scatter::ready(&mut conn, &self.settings, context).await {
            conn.discard();
            return Err(e.to_string());
        }
        Ok(conn)
    }

    /// The first shard (by id) whose primary gives a connection: where a statement is
    /// described and partial results are merged.
    async fn scatter_coordinator(&mut self) -> Result<(ShardId, PooledConn), FrontendError> {
        let mut reasons = Vec::new();
        for shard in self.scatter_shards() {
            match self.scatter_conn(shard, false).await? {
                Ok(conn) => return Ok((shard, conn)),
                Err(why) => reasons.push(format!("shard {shard}: {why}")),
            }
        }
        Err(ScatterError::NoCoordinator { reason: reasons.join("; ") }.into())
    }

    /// Admits a scatter-gather statement by its text (the admission step's first part,
    /// as every statement), refuses one that may write (what `Effects` says; the
    /// planner's own checks are of what it can merge), then describes and plans it on a
    /// coordinator, which is handed back for the run.
    async fn prepare_scatter(
        &mut self,
        analysis: &Analysis,
        declared: &[u32],
    ) -> Result<(Arc<Prepared>, (ShardId, PooledConn)), FrontendError> {
        self.admit_text(Candidate::text(analysis))?;
        let sql = analysis.text();
        if analysis.effects().writes.shown() {
            let what = analysis.effects().writes.describe().to_string();
            return Err(FrontendError::Scatter(ScatterError::NotReadOnly(what)));
        }
        let started = Instant::now();
        let prepared = self.describe_scatter(sql, declared).await;
        if let Err(FrontendError::Scatter(e)) = &prepared {
            scatter_ended(Err(e), sql, started, &[]);
        }
        prepared
    }

    async fn describe_scatter(
        &mut self,
        sql: &str,
        declared: &[u32],
    ) -> Result<(Arc<Prepared>, (ShardId, PooledConn)), FrontendError> {
        self.check_scatter_allowed()?;
        let Some(mut parsed) = scatter::parse(sql)? else {
            return Err(ScatterError::Unparsed("it names no all_shards. table".into()).into());
        };
        let (shard, mut conn) = self.scatter_coordinator().await?;
        conn.broken = true;
        let prepared = scatter::prepare(&mut parsed, &mut conn, declared).await;
        conn.broken = conn.status != TxStatus::Idle;
        if conn.broken {
            conn.discard();
            return Err(prepared
                .err()
                .unwrap_or(ScatterError::NoCoordinator { reason: "left busy".into() })
                .into());
        }
        Ok((Arc::new(prepared?), (shard, conn)))
    }

    /// Runs a prepared scatter-gather and writes its answer (up to CommandComplete).
    ///
    /// Connections are taken in shard order, the coordinator first, and no statement
    /// waits for a second connection of a pool while it holds one (with `pool_size = 1`
    /// it would wait for itself; with several at once, for each other). The part of the
    /// coordinator's shard, when it would run on the same primary, gets a connection of
    /// its own only if one is free at once; otherwise the coordinator runs it itself
    /// (as an INSERT ... SELECT, which PostgreSQL does not run in parallel).
    async fn run_scatter(
        &mut self,
        prepared: &Prepared,
        coordinator: Option<(ShardId, PooledConn)>,
        parameters: &[u8],
        formats: &[i16],
        describe: bool,
    ) -> Result<(), FrontendError> {
        self.check_scatter_allowed()?;
        let policy = self.scatter_policy();
        let started = Instant::now();
        let replica = self.target != TargetMode::Primary;
        let coordinator = match (prepared.plan.partial_columns(), coordinator) {
            // Given back before any shard's connection is taken.
            (None, _) => None,
            (Some(_), Some(given)) => Some(given),
            (Some(_), None) => Some(self.scatter_coordinator().await?),
        };
        let same_pool = coordinator
            .as_ref()
            .map(|(shard, _)| *shard)
            .filter(|shard| self.scatter_node(*shard, replica).is_ok_and(|(_, primary)| primary));
        let mut links = Vec::new();
        let mut folded = None;
        if let Some(shard) = same_pool {
            match self.scatter_conn_at_once(shard).await {
                Some(conn) => links.push(Link { shard, conn }),
                None => folded = Some(shard),
            }
        }
        let mut missing = Vec::new();
        for shard in self.scatter_shards() {
            if same_pool == Some(shard) {
                continue;
            }
            match self.scatter_conn(shard, replica).await? {
                Ok(conn) => links.push(Link { shard, conn }),
                Err(why) => missing.push((shard, why)),
            }
        }
        let mut coordinator = coordinator.map(|(_, conn)| conn);
        let mut targets: Vec<_> = links.iter().map(|l| l.conn.cancel.clone()).collect();
        targets.extend(coordinator.as_ref().map(|c| c.cancel.clone()));
        self.cancel.set_targets(targets);
        let request = Request {
            parameters,
            result_formats: formats,
            describe,
            policy,
            timeout: Duration::from_millis(self.shared.config.proxy.scatter_timeout_ms),
        };
        let run = scatter::execute(
            prepared,
            &request,
            links,
            missing,
            coordinator.as_deref_mut().map(|conn| (conn, folded)),
            &mut self.client,
        )
        .await;
        self.cancel.set_targets(Vec::new());
        if let Some(conn) = coordinator
            && conn.broken
        {
            conn.discard();
        }
        match &run {
            Ok(outcome) => {
                let shard_us: Vec<(u32, u64)> =
                    outcome.shard_us.iter().map(|(s, us)| (u32::from(*s), *us)).collect();
                scatter_ended(Ok(outcome.missing.len()), &prepared.sql, started, &shard_us);
            }
            Err(e) => scatter_ended(Err(e), &prepared.sql, started, &[]),
        }
        run.map(|_| ()).map_err(FrontendError::from)
    }

    /// A Query (F) that is a scatter-gather: the whole answer, ReadyForQuery included.
    pub(super) async fn answer_scatter_query(&mut self, analysis: &Analysis) -> Result<(), FrontendError> {
        self.settle().await?;
        if self.client_status() == TxStatus::Failed {
            self.reply_error(&FrontendError::InFailedTransaction, true);
            return Ok(());
        }
        let ran = match self.prepare_scatter(analysis, &[]).await {
            Ok((prepared, conn)) => {
                self.run_scatter(&prepared, Some(conn), protocol::NO_PARAMETERS, &[], true).await
            }
            Err(e) => Err(e),
        };
        match ran {
            Ok(()) => {
                let mut b = BytesMut::new();
                protocol::ready_for_query(&mut b, self.client_status());
                self.reply(b);
            }
            Err(e) if e.is_fatal() => return Err(e),
            Err(e) => self.reply_error(&e, true),
        }
        Ok(())
    }

    /// Handles an extended-protocol message if it concerns a scatter-gather statement
    /// or portal (`true`); see `Session::answer_local_message`.
    pub(super) async fn scatter_message(&mut self, frame: &Frame) -> Result<bool, FrontendError> {
        let body = frame.body();
        match frame.tag {
            b'P' => {
                let p = protocol::parse_view(body).ok_or_else(|| FrontendError::malformed("Parse"))?;
                let analysis = self.recent.get_or_analyze(&self.shared.router, p.query);
                if !is_scatter(&analysis) {
                    return Ok(false);
                }
                if self.scatter_statements.len() >= MAX_SCATTER_STATEMENTS
                    && !self.scatter_statements.contains_key(p.name)
                {
                    return Err(FrontendError::StatementBudget {
                        held: MAX_SCATTER_STATEMENTS,
                        budget: MAX_SCATTER_STATEMENTS,
                    });
                }
                if !p.name.is_empty() {
                    // A named one counts against the session's statement budget, as any.
                    self.statement_room(p.name, p.query, p.param_types)?;
                }
                let name = Bytes::copy_from_slice(p.name);
                let (prepared, _conn) =
                    self.prepare_scatter(&analysis, &declared_types(p.param_types)).await?;
                if name.is_empty() {
                    self.unnamed = Some(analysis);
                    self.unnamed_deallocates = None;
                } else {
                    let (query, types) =
                        (Bytes::copy_from_slice(p.query), Bytes::copy_from_slice(p.param_types));
                    self.register_statement(&name, &query, &types);
                }
                self.scatter_statements.insert(name, prepared);
                self.scatter_seen = true;
                let mut b = BytesMut::new();
                protocol::parse_complete(&mut b);
                self.reply(b);
                Ok(true)
            }
            b'B' => {
                let bind = protocol::bind_view(body).ok_or_else(|| FrontendError::malformed("Bind"))?;
                let Some(prepared) = self.scatter_statements.get(bind.statement).cloned() else {
                    self.scatter_portals.remove(bind.portal);
                    return Ok(false);
                };
                let parameters =
                    protocol::bind_parameters(bind.rest).ok_or_else(|| FrontendError::malformed("Bind"))?;
                let formats = protocol::bind_result_formats(bind.rest)
                    .ok_or_else(|| FrontendError::malformed("Bind"))?;
                if self.scatter_portals.len() >= MAX_SCATTER_PORTALS
                    && !self.scatter_portals.contains_key(bind.portal)
                {
                    return Err(ScatterError::TooManyPortals { max: MAX_SCATTER_PORTALS }.into());
                }
                let portal =
                    ScatterPortal { prepared, parameters: Bytes::copy_from_slice(parameters), formats };
                self.scatter_portals.insert(Bytes::copy_from_slice(bind.portal), portal);
                let mut b = BytesMut::new();
                protocol::bind_complete(&mut b);
                self.reply(b);
                Ok(true)
            }
            b'D' => {
                let (kind, name) =
                    protocol::target_view(body).ok_or_else(|| FrontendError::malformed("Describe"))?;
                let mut b = BytesMut::new();
                let (prepared, formats) = if kind == b'P' {
                    let Some(portal) = self.scatter_portals.get(name) else { return Ok(false) };
                    (portal.prepared.clone(), portal.formats.clone())
                } else {
                    let Some(prepared) = self.scatter_statements.get(name) else { return Ok(false) };
                    let types: Vec<i32> = prepared.param_types.iter().map(|t| *t as i32).collect();
                    protocol::parameter_description(&mut b, &types);
                    (prepared.clone(), Vec::new())
                };
                match prepared
                    .row_description
                    .as_ref()
                    .and_then(|d| protocol::row_description_with_formats(d, &formats))
                {
                    Some(description) => b.extend_from_slice(&description),
                    None => protocol::put_message(&mut b, b'n', |_| {}),
                }
                self.reply(b);
                Ok(true)
            }
            b'E' => {
                let (name, rest) =
                    protocol::split_cstr(body).ok_or_else(|| FrontendError::malformed("Execute"))?;
                let Some(portal) = self.scatter_portals.remove(name) else { return Ok(false) };
                let max_rows =
                    rest.get(..4).map(|x| i32::from_be_bytes([x[0], x[1], x[2], x[3]])).unwrap_or(0);
                if self.client_status() == TxStatus::Failed {
                    return Err(FrontendError::InFailedTransaction);
                }
                if max_rows > 0 {
                    return Err(ScatterError::RowLimit.into());
                }
                self.settle().await?;
                self.run_scatter(&portal.prepared, None, &portal.parameters, &portal.formats, false).await?;
                Ok(true)
            }
            b'C' => {
                let (kind, name) =
                    protocol::target_view(body).ok_or_else(|| FrontendError::malformed("Close"))?;
                let closed = if kind == b'P' {
                    self.scatter_portals.remove(name).is_some()
                } else {
                    let was = self.scatter_statements.remove(name).is_some();
                    if was && !name.is_empty() {
                        self.statements.remove(name);
                    }
                    was
                };
                if !closed {
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
}
