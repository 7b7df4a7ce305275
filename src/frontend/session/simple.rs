//! Simple-protocol requests: Query (F) and FunctionCall (F), with the statements
//! pgtenant answers itself (tenant SET/RESET, a deferred BEGIN, a failed transaction).

use bytes::BytesMut;

use super::admission::{Candidate, Stage};
use super::lane::LaneRequest;
use super::{ClientTx, Session};
use crate::backend::{Pending, Reply};
use crate::directory::TenantId;
use crate::frontend::error::FrontendError;
use crate::observe::conns::ShownTenant;
use crate::protocol::{self, Frame, TxStatus};
use crate::router::{Analysis, ROUTING_VERSION, StatementKind};

impl Session {
    pub(super) async fn on_query(&mut self, frame: Frame) -> Result<(), FrontendError> {
        let body = frame.body_bytes();
        let sql_len = protocol::query_text(&body)
            .ok_or_else(|| FrontendError::Protocol("Query without terminator".into()))?
            .len();
        let analysis = self.recent.get_or_analyze(&self.shared.router, &body[..sql_len]);

        if !analysis.is_multi {
            match &analysis.kind {
                StatementKind::SetTenant(t) => return self.set_tenant(Some(t.clone()), "SET").await,
                StatementKind::ResetTenant => {
                    return self.set_tenant(self.startup_tenant.clone(), "RESET").await;
                }
                // Boxed, as the proxy call below: its state is large, and every
                // session's future would carry it.
                StatementKind::Scatter => return Box::pin(self.answer_scatter_query(&analysis)).await,
                StatementKind::ProxyCall(select) => {
                    let select = select.clone();
                    return Box::pin(self.answer_proxy_query(&select, &analysis)).await;
                }
                StatementKind::Deallocate(_) => {
                    if let Some(name) = self.deallocated_here(&analysis) {
                        // The server knows it by pgtenant's name, shared with other clients:
                        // forgetting the client's name is all a DEALLOCATE must do.
                        self.statements.remove(&name);
                        self.reply_done("DEALLOCATE");
                        return Ok(());
                    }
                }
                StatementKind::ShowRoutingVersion => {
                    let version = self.shared.router.routing_version().to_string();
                    let mut b = BytesMut::new();
                    protocol::text_row_description(&mut b, &[ROUTING_VERSION]);
                    protocol::text_data_row(&mut b, &[&version]);
                    self.reply(b);
                    self.reply_done("SHOW");
                    return Ok(());
                }
                _ => {}
            }
        }
        if let Err(err) = self.admit_text(Candidate::text(&analysis)) {
            self.reply_error(&err, true);
            return Ok(());
        }
        if analysis.sets_tenant_among_many {
            // The server must never change the tenant GUC behind pgtenant's back.
            let err = FrontendError::TenantSetAmongMany { param: self.shared.router.tenant_param().into() };
            self.reply_error(&err, true);
            return Ok(());
        }
        let ends_tx = matches!(analysis.kind, StatementKind::Commit | StatementKind::Rollback);
        match &self.tx {
            ClientTx::Failed if ends_tx => {
                self.end_failed_transaction();
                self.reply_done("ROLLBACK");
                return Ok(());
            }
            ClientTx::Failed => {
                self.reply_error(&FrontendError::InFailedTransaction, true);
                return Ok(());
            }
            ClientTx::DeferredBegin(_) if ends_tx && self.server.is_none() => {
                // An empty transaction: nothing ever reached a server.
                self.tx = ClientTx::Idle;
                let committed = matches!(analysis.kind, StatementKind::Commit);
                self.end_client_transaction(committed);
                self.reply_done(if committed { "COMMIT" } else { "ROLLBACK" });
                return Ok(());
            }
            _ => {}
        }

        let named = self.shared.router.named_in_text(&analysis);
        let lane_candidate = self.lane_candidate(&analysis);
        if self.at_transaction_start() {
            if self.defers_begin(&analysis) {
                self.tx = ClientTx::DeferredBegin(body.slice(..sql_len));
                self.reply_done("BEGIN");
                return Ok(());
            }
            // Refused before a server is attached: the tenant GUC may go out with the query.
            let reach = self.reach();
            let route = self
                .shared
                .router
                .route(
                    self.tenant.as_ref(),
                    &named,
                    std::slice::from_ref(&analysis),
                    &mut self.placement,
                    reach,
                )
                .await
                .map_err(FrontendError::from);
            let mut route = match route {
                Ok(route) => {
                    let opening = Stage::Opening { route: &route, after_unknown_code: false };
                    self.admit(Candidate::text(&analysis), opening).await.map(|()| route)
                }
                Err(err) => Err(err),
            };
            if let Ok(r) = &mut route
                && lane_candidate
                && analysis.shape().is_quick()
            {
                match self.request_on_lane(r, &analysis, LaneRequest::Query(&frame.raw)).await {
                    Ok(true) => return Ok(()),
                    Ok(false) => {}
                    Err(err) => {
                        self.reply_error(&err, true);
                        return Ok(());
                    }
                }
            }
            if !self.begin_or_reply(route, analysis.effects().shares_implicit_transaction()).await {
                return Ok(());
            }
        } else {
            if let Err(err) = self.admit(Candidate::text(&analysis), Stage::Joining { named: &named }).await {
                self.reply_error(&err, true);
                return Ok(());
            }
        }

        let Some(a) = self.server.as_mut() else {
            return Err(FrontendError::Protocol("no server attached".into()));
        };
        if let Some(pin) = analysis.pin {
            a.pin.get_or_insert(pin);
        }
        if matches!(analysis.kind, StatementKind::DiscardAll) {
            a.conn.prepared.clear();
            self.statements.clear();
        }
        let changes = analysis.session_changes.len();
        let rewritten = self.text_for_server(&analysis);
        let Some(a) = self.server.as_mut() else {
            return Err(FrontendError::Protocol("no server attached".into()));
        };
        a.conn.queue.push(Pending::Client { reply: Reply::Query, statement: None, changes });
        match rewritten {
            Some(sql) => protocol::query(&mut a.conn.io.wbuf, &sql),
            None => a.conn.io.wbuf.extend_from_slice(&frame.raw),
        }
        self.setting_changes.extend(analysis.session_changes.iter().cloned());
        self.note_session_risk(Some(&analysis));
        if lane_candidate {
            self.time_alone(&analysis);
        }
        Ok(())
    }

    /// FunctionCall (F): runs on the session tenant's shard like a query.
    pub(super) async fn on_function_call(&mut self, frame: Frame) -> Result<(), FrontendError> {
        if matches!(self.tx, ClientTx::Failed) {
            // As in an aborted transaction on PostgreSQL (see `failed_tx`).
            self.reply_error(&FrontendError::InFailedTransaction, true);
            return Ok(());
        }
        if self.at_transaction_start() {
            let route = self.shared.router.route_tenant(self.tenant.as_ref(), || true).await;
            if !self.begin_or_reply(route.map_err(FrontendError::from), false).await {
                return Ok(());
            }
        }
        if let Some(a) = self.server.as_mut() {
            a.conn.queue.push(Pending::client(Reply::Query));
            a.conn.io.wbuf.extend_from_slice(&frame.raw);
        }
        // A function of any kind, called by its OID.
        self.note_session_risk(None);
        Ok(())
    }

    /// `SET`/`RESET` of the tenant parameter, answered by pgtenant between transactions.
    async fn set_tenant(&mut self, tenant: Option<TenantId>, tag: &str) -> Result<(), FrontendError> {
        match self.change_tenant(tenant).await {
            Ok(()) => self.reply_done(tag),
            // The client left while earlier answers were awaited.
            Err(err) if err.is_fatal() => return Err(err),
            Err(err) => self.reply_error(&err, true),
        }
        Ok(())
    }

    /// Whether `analysis` is a plain BEGIN (naming no tenant) that starts a transaction
    /// with no server attached: answered here and deferred until a statement shows
    /// where the transaction runs (a tenant SET may still come first); it then goes
    /// out ahead of that statement. In either protocol (the extended one's in
    /// `in_place`). The tenants named are looked for last, in a BEGIN only.
    pub(super) fn defers_begin(&self, analysis: &Analysis) -> bool {
        matches!(analysis.kind, StatementKind::Begin)
            && !analysis.is_multi
            && self.server.is_none()
            && matches!(self.tx, ClientTx::Idle)
            && self.shared.router.named_in_text(analysis).is_empty()
    }

    /// Changes the session tenant; refused for an unplaced tenant, and inside a
    /// transaction once any of it reached a server. At the start of a transaction
    /// (psycopg and pgJDBC begin one before every statement unless in autocommit), it
    /// holds for the session if the transaction commits, as a SET on a server would.
    pub(super) async fn change_tenant(&mut self, tenant: Option<TenantId>) -> Result<(), FrontendError> {
        self.settle().await?;
        let untouched_tx = matches!(self.tx, ClientTx::DeferredBegin(_)) && self.server.is_none();
        let in_tx = (self.client_status() != TxStatus::Idle && !untouched_tx)
            || self.server.as_ref().is_some_and(|a| !a.conn.queue.is_empty());
        if in_tx {
            return Err(FrontendError::TenantChangeInTransaction {
                param: self.shared.router.tenant_param().into(),
            });
        }
        if let Some(fixed) = &self.startup_tenant
            && tenant.as_ref() != Some(fixed)
            && !self.user.allow_tenant_switch.unwrap_or(self.shared.config.proxy.allow_tenant_switch)
        {
            return Err(FrontendError::TenantFixed {
                tenant: fixed.clone(),
                param: self.shared.router.tenant_param().into(),
            });
        }
        if let Some(t) = &tenant {
            self.shared.router.placement(t).await.map_err(|e| FrontendError::Route(e.into()))?;
        }
        tracing::debug!(?tenant, "session tenant set");
        self.listed.set_tenant(tenant.as_ref().map(ShownTenant::from));
        let before = std::mem::replace(&mut self.tenant, tenant);
        if untouched_tx {
            self.tenant_before_tx.get_or_insert(before);
        }
        Ok(())
    }

    /// The client's transaction ended; `committed`: by a COMMIT that took. A tenant SET
    /// inside it lasts only if it committed.
    pub(super) fn end_client_transaction(&mut self, committed: bool) {
        if let Some(before) = self.tenant_before_tx.take()
            && !committed
        {
            tracing::debug!(tenant = ?before, "session tenant restored: its transaction did not commit");
            self.listed.set_tenant(before.as_ref().map(ShownTenant::from));
            self.tenant = before;
        }
    }
}
