//! The attached server: a transaction's start on it (the checkout is `checkout`'s) and
//! settings synchronisation, relaying its responses, and giving it back (or closing it).

use std::sync::Arc;

use bytes::BytesMut;

use super::tenant_figures::HeldFigures;
use super::{Attached, ClientTx, Session};
use crate::backend::CheckoutError;
use crate::backend::health::HealthView;
use crate::backend::{
    OnError, Pending, PooledConn, ReadOnlyGuc, RelayNotes, RelayStop, Reply, SET_TENANT_STATEMENT_ID,
    ServerConn, SettingValue, Settings, TENANT_SIGNATURE_GUC, TenantContext, TenantGuc, Wanted, settings_sql,
    tenant_sql,
};
use crate::config::{PoolMode, ReadYourWrites};
use crate::directory::{ShardId, TenantId};
use crate::frontend::error::FrontendError;
use crate::frontend::write_hooks::HooksReader;
use crate::observe::conns::{ConnState, ShownTenant};
use crate::observe::tenants::TenantStats;
use crate::protocol::{self, ErrorFields, TxStatus};
use crate::router::{
    Analysis, NodeTarget, READ_ONLY_SETTINGS, Reach, Route, SessionChange, SessionRisk, TARGET_PARAMETER,
    TargetMode, target_of,
};

impl Session {
    /// No transaction is open and nothing is owed: the next request starts a transaction.
    pub(super) fn at_transaction_start(&self) -> bool {
        match &self.server {
            None => true,
            Some(a) => a.conn.status == TxStatus::Idle && a.conn.queue.is_empty() && !a.open_request,
        }
    }

    /// Attaches a server of `route`'s shard (checking one out if needed) and queues the
    /// SETs that give it this client's settings and tenant. `dml_only`: the request runs
    /// single DML statements only, which may share an implicit transaction with the SET.
    pub(super) async fn begin_on(&mut self, mut route: Route, dml_only: bool) -> Result<(), FrontendError> {
        self.admit_deferred_begin(&route)?;
        if let Some(a) = &self.server
            && a.route.shard != route.shard
        {
            if let Some(pin) = a.pin {
                return Err(FrontendError::PinnedElsewhere {
                    shard: a.route.shard,
                    reason: pin.describe(),
                    other: route.shard,
                });
            }
            self.release_server();
        }
        if self.server.is_none() {
            if let Some(conn) = self.primary_at_once(&route) {
                self.attach(conn, &route);
                return self.prepare_attached(route, dml_only);
            }
            self.enter_transaction(&mut route).await?;
            let wanted = self.wanted(&route);
            let replica = match route.target {
                NodeTarget::Replica { fallback } => match self.checkout_replica(&route, wanted).await? {
                    Some(conn) => Some(conn),
                    None if fallback => None,
                    None => return Err(CheckoutError::NoReplica { shard: route.shard }.into()),
                },
                NodeTarget::Primary => None,
            };
            let conn = match replica {
                Some(conn) => conn,
                None => self.checkout_primary(&route, wanted).await?.1,
            };
            self.attach(conn, &route);
        }
        self.prepare_attached(route, dml_only)
    }

    /// Readies the attached server for the transaction on `route`: the SETs that give it
    /// this client's settings and tenant.
    fn prepare_attached(&mut self, route: Route, dml_only: bool) -> Result<(), FrontendError> {
        let context = crate::frontend::tenant_context(&self.shared.config);
        let Some(a) = self.server.as_mut() else {
            return Ok(());
        };
        a.conn.flush_closes();
        a.route = route.clone();
        tracing::debug!(tenant = ?route.tenant, shard = route.shard, "transaction routed");
        if std::mem::take(&mut a.conn.settings_unknown) {
            // What the last client's SQL may have changed is undone first; what follows
            // then sends this client's settings and tenant afresh.
            inject_sql(&mut a.conn, "RESET ALL", OnError::Swallow);
            a.conn.settings = Settings::empty();
            a.conn.tenant = TenantGuc::Unknown;
            a.conn.read_only = ReadOnlyGuc::Off;
        }
        let settings = settings_sql(&a.conn.settings, &self.settings);
        let read_only = !route.state.allows_writes();
        if dml_only
            && !a.conn.tenant.holds(route.tenant.as_ref())
            && settings.is_none()
            && a.conn.read_only.holds(read_only)
            && matches!(self.tx, ClientTx::Idle)
            && let Some(context) = context
        {
            // The common switch of tenant: set the GUC inside the client's own request (no
            // Sync in between, before a Query too), which saves the server a transaction and
            // the proxy a wakeup. It is undone with that request if it fails or rolls back:
            // `on_ready` then forgets what the connection holds. If the SET itself fails,
            // the server skips the request (the queue sends a Sync after a simple query).
            inject_tenant_in_request(&mut a.conn, context, route.tenant.as_ref());
            a.conn.tenant = TenantGuc::Known(route.tenant.clone());
            a.tenant_in_request = true;
            return Ok(());
        }
        if let Some(sql) = settings {
            inject_sql(&mut a.conn, &sql, OnError::Report);
            a.settings_before = Some(std::mem::replace(&mut a.conn.settings, self.settings.clone()));
        }
        // The tenant GUC and read-only mode go in a query of their own: a client setting the
        // server rejects rolls back its whole query, and must not take the tenant with it.
        let mut guard =
            tenant_sql(&a.conn.tenant, route.tenant.as_ref(), context, a.conn.cancel.pid).unwrap_or_default();
        if !a.conn.read_only.holds(read_only) {
            // The server's own wall behind pgtenant's check of each statement: it also
            // stops writes that hide in functions.
            // Taken down for one that may write: to the client's own value, if it set one.
            match (read_only, self.settings.value_of(READ_ONLY_SETTINGS[0])) {
                (true, _) => guard.push_str("SET default_transaction_read_only = on;"),
                (false, Some(own)) => guard.push_str(&format!(
                    "SET default_transaction_read_only = {};",
                    crate::backend::quote_literal(own)
                )),
                (false, None) => guard.push_str("RESET default_transaction_read_only;"),
            }
        }
        if !guard.is_empty() {
            inject_sql(&mut a.conn, &guard, OnError::Swallow);
            a.conn.tenant = TenantGuc::Known(route.tenant.clone());
            a.conn.read_only = if read_only { ReadOnlyGuc::On } else { ReadOnlyGuc::Off };
        }
        // Only a deferred BEGIN is taken: a failed transaction never gets here (see
        // `failed_tx`), and must not be turned into an idle one on the way.
        if matches!(self.tx, ClientTx::DeferredBegin(_))
            && let ClientTx::DeferredBegin(begin) = std::mem::replace(&mut self.tx, ClientTx::Idle)
        {
            // The client's own BEGIN text (isolation level and all), now that the shard is known.
            protocol::put_message(&mut a.conn.io.wbuf, b'Q', |b| {
                b.extend_from_slice(&begin);
                b.extend_from_slice(b"\0");
            });
            a.conn.queue.push(Pending::Injected {
                reply: Reply::Query,
                on_error: OnError::Forward,
                statement: None,
            });
            a.block_begun = true;
        }
        Ok(())
    }

    /// A statement that may do `risk` goes to the attached server: what it may change behind
    /// pgtenant's back is not trusted afterwards. The tenant GUC is set again before
    /// the connection's next transaction (inside its request where it can); settings,
    /// which a pooled connection carries to other clients, are reset before its next
    /// transaction in transaction pooling (a session-pooled or pinned connection keeps
    /// its client's own changes, as PostgreSQL does, and is reset when given back).
    /// `analysis`: the statement's (`None`: one pgtenant did not see parsed, or a
    /// FunctionCall). A write counts as nothing when the shard is known to run no code of
    /// the user's on writes (`frontend::write_hooks`); DDL makes that read again.
    pub(super) fn note_session_risk(&mut self, analysis: Option<&Analysis>) {
        let risk = analysis.map_or(SessionRisk::Anything, |a| a.effects().session);
        if risk == SessionRisk::Nothing {
            return;
        }
        let Some(shard) = self.server.as_ref().map(|a| a.route.shard) else { return };
        let hooks = &self.shared.write_hooks;
        if analysis.is_some_and(|a| a.effects().changes_schema) {
            hooks.forget(shard, &self.database);
            if let Some(a) = self.server.as_mut() {
                a.ddl_in_transaction = true;
            }
        }
        if risk == SessionRisk::ThroughTriggers {
            // Through this session's pool: one of its connections while it has a place
            // free, else one made beside it (see `write_hooks`). Without the pool's
            // handle (the routing changed since the checkout), the next write asks.
            let reader = || {
                let pool = self.pools.handle(shard)?;
                Some(if pool.has_free_place() {
                    let (shared, pool) = (self.shared.clone(), pool.clone());
                    HooksReader::Pooled(Box::pin(async move {
                        shared.pools.checkout_from(&pool, shard, &None, Wanted::default()).await
                    }))
                } else {
                    HooksReader::Apart(Box::pin(pool.connect_apart(crate::frontend::write_hooks::APART_NAME)))
                })
            };
            if self.hooks_memo.none_known(hooks, shard, &self.database, reader) {
                return;
            }
        }
        let shared = self.pool_mode == PoolMode::Transaction;
        if let Some(a) = self.server.as_mut() {
            a.conn.tenant = TenantGuc::Unknown;
            if risk == SessionRisk::Anything {
                // A protected setting as much as the tenant GUC, in either pool mode: the
                // wall pgtenant put up may be down. (Where it put none, the setting is
                // the client's own business.)
                if a.conn.read_only != ReadOnlyGuc::Off {
                    a.conn.read_only = ReadOnlyGuc::Unknown;
                }
                a.unknown_code_in_request = true;
                a.conn.settings_unknown |= shared && a.pin.is_none();
            }
        }
    }

    /// Makes `conn` this client's server for a transaction on `route`.
    pub(super) fn attach(&mut self, conn: PooledConn, route: &Route) {
        self.listed.set_state(ConnState::Active, Some(route.shard));
        if let Some(server) = &conn.listed {
            server.serve(&self.listed, route.tenant.as_ref().map(ShownTenant::from).as_ref());
        }
        self.cancel.set_target(Some(conn.cancel.clone()));
        self.server = Some(Attached {
            conn,
            route: route.clone(),
            pin: None,
            request_failed: false,
            saw_commit: false,
            open_request: false,
            tenant_in_request: false,
            settings_before: None,
            timing: None,
            block_begun: false,
            unknown_code_in_request: false,
            ddl_in_transaction: false,
        });
    }

    /// What this session says of its next request's node (see `Router::route`).
    pub(super) fn reach(&self) -> Reach {
        let autocommit = self.at_transaction_start() && matches!(self.tx, ClientTx::Idle);
        Reach { mode: self.target, autocommit }
    }

    /// A transaction (or autocommit request) just ended on the attached server: when a
    /// statement that may write ran in it (the admission step marked it), its end is
    /// when the session last wrote (whatever its target now: a later SET may send its
    /// reads to replicas).
    fn note_write_end(&mut self) {
        if !self.may_have_written.swap(false, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        if self.shared.config.proxy.read_your_writes == ReadYourWrites::Off {
            return;
        }
        let now = HealthView::clock_ms();
        self.wrote_ms = Some(now);
        if let Some(login) = &self.login_writes {
            login.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The write a `prefer-replica` read must find on its replica (read-your-writes):
    /// the session's last, or under `read_your_writes = "user"` its login's. A `replica`
    /// session asked for replicas only, and never reads the primary for it.
    pub(super) fn write_to_read(&self) -> Option<u64> {
        if self.target != TargetMode::PreferReplica {
            return None;
        }
        let login = self.login_writes.as_ref().map(|m| m.load(std::sync::atomic::Ordering::Relaxed));
        login.filter(|ms| *ms > 0).max(self.wrote_ms)
    }

    /// Starts a simple-protocol request's transaction on `route` (see `begin_on` for
    /// `dml_only`); when routing or checkout fails, answers the error with its
    /// ReadyForQuery and returns false.
    pub(super) async fn begin_or_reply(
        &mut self,
        route: Result<Route, FrontendError>,
        dml_only: bool,
    ) -> bool {
        let attached = match route {
            Ok(route) => self.begin_on(route, dml_only).await,
            Err(e) => Err(e),
        };
        match attached {
            Ok(()) => true,
            Err(err) => {
                self.reply_error(&err, true);
                false
            }
        }
    }

    /// Relays every complete server message and acts on ReadyForQuery.
    pub(super) fn on_server_bytes(&mut self) -> Result<(), FrontendError> {
        loop {
            let Some(a) = self.server.as_mut() else { return Ok(()) };
            let track_commit = !self.tx_setting_changes.is_empty() || self.tenant_before_tx.is_some();
            let (held, stats) = (&mut self.held_figures, &self.shared.tenant_stats);
            match relay(a, &mut self.client.wbuf, track_commit, self.cancel.pid, held, stats) {
                RelayStop::NeedMore => break,
                RelayStop::Ready { status, changes } => self.on_ready(status, changes),
                RelayStop::Lost(reason) => return self.on_server_lost(reason),
            }
        }
        self.release_if_done();
        Ok(())
    }

    /// A ReadyForQuery ended a client request that carried `changes` setting changes:
    /// settle them.
    fn on_ready(&mut self, status: TxStatus, changes: usize) {
        self.clocks.request_ended();
        let Some(a) = self.server.as_mut() else {
            return;
        };
        let failed = std::mem::take(&mut a.request_failed);
        a.unknown_code_in_request = false;
        if status == TxStatus::Idle {
            a.block_begun = false;
            if std::mem::take(&mut a.ddl_in_transaction) {
                // Committed (or not) now: a read since the DDL went out saw it uncommitted.
                self.shared.write_hooks.forget(a.route.shard, &self.database);
            }
        }
        if let Some((since, analysis)) = a.timing.take() {
            analysis.shape().record(
                crate::observe::moment::now().saturating_duration_since(since),
                self.shared.config.proxy.pipeline_quick(),
            );
        }
        if std::mem::take(&mut a.tenant_in_request) && (failed || status != TxStatus::Idle) {
            // Rolled back with the request, or inside a transaction that may still roll
            // back: the connection's tenant GUC is not known any more.
            a.conn.tenant = TenantGuc::Unknown;
        }
        for _ in 0..changes {
            let Some(change) = self.setting_changes.pop_front() else { break };
            match (failed, status) {
                // The request's implicit transaction rolled back, or the client's is
                // aborted: either way the SET does not outlive it.
                (true, _) => {}
                (false, TxStatus::Idle) => self.apply_change(change),
                (false, _) => self.tx_setting_changes.push(change),
            }
        }
        if status == TxStatus::Idle {
            self.note_write_end();
            let committed = self.server.as_mut().map(|a| std::mem::take(&mut a.saw_commit)).unwrap_or(false);
            let changes = std::mem::take(&mut self.tx_setting_changes);
            if committed {
                for change in changes {
                    self.apply_change(change);
                }
            }
            self.end_client_transaction(committed);
        }
    }

    /// Records a setting change that took effect on the attached server.
    fn apply_change(&mut self, change: SessionChange) {
        let Some(a) = self.server.as_mut() else {
            return;
        };
        match change {
            SessionChange::Set { name, value } => {
                self.settings = self.settings.with(&name, SettingValue::Sql(value));
                a.conn.settings = self.settings.clone();
            }
            SessionChange::Reset { name } => {
                // On a server, RESET goes back to the startup value; here that value is re-applied.
                self.settings =
                    match self.startup_settings.list.iter().find(|(n, _)| n.eq_ignore_ascii_case(&name)) {
                        Some((n, v)) => self.settings.with(n, v.clone()),
                        None => self.settings.without(&name),
                    };
                a.conn.settings = a.conn.settings.without(&name);
            }
            // Resolved at Bind; a simple query has no parameters: the server refused it.
            SessionChange::SetFromParameters { .. } => {}
            SessionChange::ResetAll => {
                self.settings = self.startup_settings.clone();
                a.conn.settings = Settings::empty();
                a.conn.tenant = TenantGuc::Unknown;
                // The server's default again: a wall is put up again before the next
                // transaction of a tenant that may not write.
                a.conn.read_only = ReadOnlyGuc::Off;
            }
        }
        self.follow_target();
    }

    /// `pgtenant.target` as the session's settings now have it (a SET of it runs on
    /// the server like any setting, which keeps it for SHOW and re-applies it on other
    /// connections); its login value when they have none.
    fn follow_target(&mut self) {
        let set = self.settings.list.iter().find(|(name, _)| name.eq_ignore_ascii_case(TARGET_PARAMETER));
        self.target = set
            .and_then(|(_, value)| match value {
                SettingValue::Sql(sql) => target_of(sql),
                SettingValue::Config(text) => TargetMode::parse(text),
            })
            .unwrap_or(self.login_target);
    }

    /// The server holds session state of this client's (a pin, or session pooling): it is
    /// not given back between transactions, and is reset when it is given back.
    fn keeps_session_state(&self, a: &Attached) -> bool {
        a.pin.is_some() || self.pool_mode == PoolMode::Session
    }

    /// In transaction pooling, gives the server back once it is idle and owes nothing.
    fn release_if_done(&mut self) {
        let done = self.server.as_ref().is_some_and(|a| {
            a.conn.queue.is_empty()
                && a.conn.status == TxStatus::Idle
                && !a.open_request
                && (a.conn.broken || !self.keeps_session_state(a))
        });
        if done && self.batch.is_empty() {
            self.release_server();
        }
    }

    /// Returns the server to its pool (or closes it when its state is not trusted).
    pub(super) fn release_server(&mut self) {
        let Some(a) = self.server.take() else {
            return;
        };
        self.listed_idle();
        self.cancel.set_target(None);
        if a.conn.broken || !a.conn.is_reusable() {
            a.conn.discard();
        } else {
            let reset = self.keeps_session_state(&a);
            a.conn.release(reset);
        }
    }

    /// The server connection failed under this client. If it held state of the
    /// client's session (a transaction block, a pin, session pooling), the session ends
    /// as on PostgreSQL: with the server's FATAL, else 08006, and the connection closes.
    /// Otherwise (transaction pooling, between transactions or in an autocommit
    /// request) the session goes on: what the server owed is answered with one error
    /// each (08006, naming the server's reason), and the next request gets another
    /// connection.
    pub(super) fn on_server_lost(&mut self, reason: String) -> Result<(), FrontendError> {
        let Some(mut a) = self.server.take() else { return Ok(()) };
        self.cancel.set_target(None);
        let shard = a.route.shard;
        tracing::warn!(shard, %reason, "lost a server connection");
        let fatal = a.conn.fatal.take();
        let held_state = self.pool_mode == PoolMode::Session
            || a.pin.is_some()
            || a.block_begun
            || a.conn.status != TxStatus::Idle
            || !matches!(self.tx, ClientTx::Idle);
        if held_state {
            a.conn.lost();
            return Err(FrontendError::ServerGone { shard, reason, fatal });
        }
        self.setting_changes.clear();
        self.tx_setting_changes.clear();
        self.request_changes = 0;
        let mut error = BytesMut::new();
        crate::frontend::error_response::write_error(
            &mut error,
            &FrontendError::ServerLost { shard, reason },
        );
        let status = self.client_status();
        if a.conn.queue.answer_lost(&mut self.client.wbuf, &error, status) {
            self.skip_until_sync = true;
        }
        a.conn.lost();
        Ok(())
    }

    /// The client is gone: roll back what it left open, then give the server back.
    pub(super) fn finish(&mut self) {
        let Some(a) = self.server.take() else {
            return;
        };
        self.cancel.set_target(None);
        if a.conn.broken || !a.conn.queue.is_empty() || a.open_request {
            // Mid-request: closing is the only safe reset; the server rolls back.
            a.conn.discard();
            return;
        }
        let reset = self.keeps_session_state(&a);
        if a.conn.status == TxStatus::Idle {
            a.conn.release(reset);
            return;
        }
        tokio::spawn(async move {
            let mut conn = a.conn;
            match conn.run_sql("ROLLBACK").await {
                // Statements it prepared may rest on what the rollback took away (see
                // `ServerConn::unsettled`): closing is the reset then.
                Ok(None) if conn.status == TxStatus::Idle && conn.unsettled.is_empty() => conn.release(reset),
                _ => {
                    conn.rolled_back_unsettled();
                    conn.discard()
                }
            }
        });
    }
}

/// Relays complete messages from the server's read buffer up to the first that ends
/// a client request, noting on `a` what they said about the request.
fn relay(
    a: &mut Attached,
    out: &mut BytesMut,
    track_commit: bool,
    client: u32,
    held: &mut HeldFigures,
    stats: &TenantStats<TenantId>,
) -> RelayStop {
    let shard = a.route.shard;
    let before = &mut a.settings_before;
    let mut notes = RelayNotes::default();
    let stop = a.conn.relay(out, track_commit, (shard, client), &mut notes, |conn, refused, out| {
        settings_refused(conn, before.take(), shard, refused, out)
    });
    a.request_failed |= notes.client_error;
    a.saw_commit |= notes.saw_commit;
    if let (Some(answered), Some(tenant)) = (notes.answered, &a.route.tenant) {
        // `request_failed`, not this call's notes: the error may have come in an earlier
        // read than the ReadyForQuery.
        held.answered(stats, shard, tenant, answered, a.request_failed);
    }
    stop
}

/// The server refused the SETs that bring the client's session settings to its
/// connection (a setting this shard does not accept, where the one the client logged in
/// to did). They ran as one query, so the connection still holds what it held before;
/// the client's statement runs without them, and the client is told so.
fn settings_refused(
    conn: &mut ServerConn,
    before: Option<Arc<Settings>>,
    shard: ShardId,
    refused: &ErrorFields,
    out: &mut BytesMut,
) {
    tracing::warn!(shard, code = %refused.code, message = %refused.message, "the server refused a client's session settings");
    match before {
        Some(before) => conn.settings = before,
        None => conn.broken = true,
    }
    let message = format!(
        "pgtenant: shard {shard} refused this session's settings ({}); the statement runs without them",
        refused.message
    );
    protocol::notice_response(out, protocol::Severity::Warning, &refused.code, &message);
}

/// The statement that sets the tenant GUC inside a client's extended request (its id
/// in `ServerConn::prepared` is `SET_TENANT_STATEMENT_ID`).
const SET_TENANT_STATEMENT: &[u8] = b"__pgtenant_set_tenant";

/// Sets the tenant GUC ahead of the client's extended messages, without a Sync: it runs
/// in the client's implicit transaction. Its answers are swallowed; an error (none is
/// expected) reaches the client, and the server then skips the request as it should.
pub(super) fn inject_tenant_in_request(
    conn: &mut ServerConn,
    context: TenantContext,
    tenant: Option<&TenantId>,
) {
    if !conn.prepared.touch(SET_TENANT_STATEMENT_ID) {
        conn.prepared.record(SET_TENANT_STATEMENT_ID);
        // No row comes back (concat never returns NULL): one message less to swallow.
        // concat takes both set_configs, where AND or OR might stop after the first.
        protocol::parse(
            &mut conn.io.wbuf,
            SET_TENANT_STATEMENT,
            b"SELECT WHERE pg_catalog.concat(pg_catalog.set_config($1, $2, false), \
              pg_catalog.set_config($3, $4, false)) IS NULL",
            b"\0\0",
        );
        conn.queue.push(Pending::Injected {
            reply: Reply::Parse,
            on_error: OnError::Forward,
            statement: None,
        });
    }
    let value = tenant.map(|t| t.key_text()).unwrap_or_default();
    let signature = context.signature(&value, conn.cancel.pid);
    // The unnamed portal: the client's own Bind, which follows, replaces it.
    protocol::bind_text(
        &mut conn.io.wbuf,
        SET_TENANT_STATEMENT,
        &[context.guc.as_bytes(), value.as_bytes(), TENANT_SIGNATURE_GUC.as_bytes(), signature.as_bytes()],
    );
    conn.queue.push(Pending::Injected { reply: Reply::Bind, on_error: OnError::Forward, statement: None });
    protocol::execute(&mut conn.io.wbuf);
    conn.queue.push(Pending::Injected { reply: Reply::Execute, on_error: OnError::Forward, statement: None });
}

/// Sends `sql` ahead of the client's messages; its answer is swallowed, its error as
/// `on_error` says.
pub(super) fn inject_sql(conn: &mut ServerConn, sql: &str, on_error: OnError) {
    protocol::query(&mut conn.io.wbuf, sql);
    conn.queue.push(Pending::Injected { reply: Reply::Query, on_error, statement: None });
}
