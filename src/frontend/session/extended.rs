//! Extended-protocol requests. While no transaction is open, messages are held
//! until Sync or Flush, so the whole request is known before a server is checked
//! out; a long request is routed by its first part instead (see `held`). Named statements are renamed to their shared server name and re-prepared
//! on a server that lacks them; a Parse the server already has is answered by
//! pgtenant, and so is a Close of a named statement (the server keeps it for others).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;

use super::admission::{Candidate, Stage};
use super::proxy_call::proxy_select;
use super::{BoundChanges, ClientStatement, ClientTx, Session};
use crate::backend::{OnError, Pending, PreparedStatement, Reply, ServerConn, quote_literal};
use crate::directory::TenantId;
use crate::frontend::error::FrontendError;
use crate::protocol::{self, Frame};
use crate::router::{
    Analysis, ConfigArg, Named, PinReason, ROUTING_VERSION, Route, SessionChange, StatementKind,
};

impl Session {
    pub(super) async fn on_extended(&mut self, frame: Frame) -> Result<(), FrontendError> {
        if self.skip_until_sync {
            if frame.tag == b'S' {
                self.skip_until_sync = false;
                // A failed transaction's status is pgtenant's to tell, not the server's.
                if self.server.is_some() && !matches!(self.tx, ClientTx::Failed) {
                    self.forward_extended(frame)?;
                } else {
                    self.abort_deferred_begin();
                    let mut b = BytesMut::new();
                    protocol::ready_for_query(&mut b, self.client_status());
                    self.reply(b);
                }
            }
            return Ok(());
        }
        if self.joins_transaction_under_way() {
            let frame = if self.may_concern_local(&frame) {
                // Boxed (here and below): its state is large, and every session's
                // future would carry it for requests that never concern it.
                let Some(frame) = Box::pin(self.answer_local_message(frame)).await? else { return Ok(()) };
                frame
            } else {
                frame
            };
            if frame.tag == b'B'
                && let Err(err) = self.check_bind(&frame).await
            {
                self.fail_until_sync(&err);
                return Ok(());
            }
            return self.forward_extended(frame);
        }
        let ends_request = matches!(frame.tag, b'S' | b'H');
        self.hold(frame);
        if !ends_request && !self.holds_enough() {
            return Ok(());
        }
        if matches!(self.tx, ClientTx::Failed) {
            return self.extended_in_failed_transaction().await;
        }
        if self.server.is_none() && self.answer_without_server()? {
            return Ok(());
        }
        // A request refused here (a tenant SET among other statements, say) fails as a
        // server fails one: its error, then nothing until the client's Sync.
        let route = match self.batch_statements() {
            Ok(statements) => match self.answer_locally(&statements).await {
                Ok(true) => return Ok(()),
                Ok(false) => self.route_batch(&statements, ends_request).await,
                Err(err) if err.is_fatal() => return Err(err),
                Err(err) => Err(err),
            },
            Err(err) => Err(err),
        };
        if let Err(err) = route {
            return self.refuse_held_request(&err).await;
        }
        let mut batch = std::mem::take(&mut self.batch);
        for frame in batch.drain(..) {
            if self.skip_until_sync {
                Box::pin(self.on_extended(frame)).await?;
            } else if !self.may_concern_local(&frame) {
                self.forward_extended(frame)?;
            } else if let Some(frame) = Box::pin(self.answer_local_message(frame)).await? {
                self.forward_extended(frame)?;
            }
        }
        // Keep the allocation for the next request.
        if self.batch.is_empty() {
            self.batch = batch;
        }
        Ok(())
    }

    /// A message of a transaction under way that goes to its server as it is, the usual
    /// case inside a transaction (see `on_extended`): forwarded here, without building
    /// `on_extended`'s future, which carries the state of every wait the start of a
    /// request may need and would be copied in for each message. A Bind's check is
    /// taken when it decides at once (no tenant's placement to look up, no strict
    /// check); the frame is given back for `on_extended` otherwise.
    pub(super) fn forward_joining(&mut self, frame: Frame) -> Result<Option<Frame>, FrontendError> {
        if self.skip_until_sync || !self.joins_transaction_under_way() || self.may_concern_local(&frame) {
            return Ok(Some(frame));
        }
        if frame.tag == b'B' {
            match futures_util::FutureExt::now_or_never(self.check_bind(&frame)) {
                None => return Ok(Some(frame)),
                Some(Err(err)) => {
                    self.fail_until_sync(&err);
                    return Ok(None);
                }
                Some(Ok(())) => {}
            }
        }
        self.forward_extended(frame)?;
        Ok(None)
    }

    /// Answers a held request that only prepares statements a server already accepted,
    /// closes statements, and syncs: no server is needed for it. This keeps a client
    /// that prepares synchronously (libpq's PQprepare) from waiting for a server while
    /// its own thread's other connections hold all of them.
    fn answer_without_server(&mut self) -> Result<bool, FrontendError> {
        // Most requests execute something: tell by the tags alone, before any lookup.
        if !self.batch.iter().all(|f| matches!(f.tag, b'P' | b'C' | b'S' | b'H')) {
            return Ok(false);
        }
        let mut parsed = Vec::new();
        for frame in &self.batch {
            match frame.tag {
                b'P' => {
                    let p = protocol::parse_view(frame.body())
                        .ok_or_else(|| FrontendError::malformed("Parse"))?;
                    if p.name.is_empty()
                        || self.statements.check_room(p.name, p.query, p.param_types).is_err()
                    {
                        return Ok(false);
                    }
                    let stmt = self.shared.statements.intern(p.query, p.param_types);
                    if !stmt.is_validated() {
                        return Ok(false);
                    }
                    let analysis = self.recent.get_or_analyze(&self.shared.router, p.query);
                    parsed.push((Bytes::copy_from_slice(p.name), stmt, analysis));
                }
                b'C' => match protocol::target_view(frame.body()) {
                    Some((b'S', name)) if !name.is_empty() => {}
                    _ => return Ok(false),
                },
                b'S' | b'H' => {}
                _ => return Ok(false),
            }
        }
        let mut reply = BytesMut::new();
        let mut parsed = parsed.into_iter();
        for frame in std::mem::take(&mut self.batch) {
            match frame.tag {
                b'P' => {
                    if let Some((name, stmt, analysis)) = parsed.next() {
                        self.statements.insert(name, ClientStatement { stmt, analysis });
                    }
                    protocol::parse_complete(&mut reply);
                }
                b'C' => {
                    if let Some((_, name)) = protocol::target_view(frame.body()) {
                        self.statements.remove(name);
                    }
                    protocol::close_complete(&mut reply);
                }
                b'S' => protocol::ready_for_query(&mut reply, self.client_status()),
                _ => {}
            }
        }
        self.reply(reply);
        Ok(true)
    }

    /// Answers a held request whose statements pgtenant carries out itself, as a server
    /// would: a SET/RESET of the tenant parameter (drivers such as psycopg 3 and pgJDBC
    /// send SET through the extended protocol), or `SHOW pgtenant.routing_version`.
    /// Such a statement mixed with others (or with the other kind) in one request is
    /// refused, but for a BEGIN ahead of a tenant SET at the start of a transaction
    /// (pgJDBC outside autocommit sends them together), which is deferred as in a simple query.
    async fn answer_locally(&mut self, statements: &BatchStatements) -> Result<bool, FrontendError> {
        let all = || statements.parsed.iter().chain(&statements.executed);
        let Some(last) = all().rev().find(|a| local_kind(a).is_some()) else { return Ok(false) };
        let kind = local_kind(last);
        let others_local =
            all().any(|a| matches!(local_kind(a), Some(LocalKind::TenantSet | LocalKind::RoutingVersion)));
        if matches!(kind, Some(LocalKind::ProxyCall | LocalKind::Scatter)) && !others_local {
            if self.request_is_local() {
                Box::pin(self.answer_local_request()).await?;
                return Ok(true);
            }
            // Mixed with statements for a server: routed by those, answered in line.
            return Ok(false);
        }
        let begin_deferrable = kind == Some(LocalKind::TenantSet)
            && self.server.is_none()
            && matches!(self.tx, ClientTx::Idle | ClientTx::DeferredBegin(_));
        if !all()
            .all(|a| local_kind(a) == kind || (begin_deferrable && matches!(a.kind, StatementKind::Begin)))
        {
            return Err(FrontendError::ExtendedTenantSet { param: self.shared.router.tenant_param().into() });
        }
        let answer = match &last.kind {
            StatementKind::SetTenant(t) => LocalAnswer::TenantSet { tenant: Some(t.clone()), tag: "SET" },
            StatementKind::ShowRoutingVersion => LocalAnswer::RoutingVersion,
            _ => LocalAnswer::TenantSet { tenant: self.startup_tenant.clone(), tag: "RESET" },
        };
        let mut reply = BytesMut::new();
        let mut failed = false;
        // The statement of the last Bind, and that of the last unnamed Parse.
        let (mut bound, mut unnamed) = (None, None);
        for frame in std::mem::take(&mut self.batch) {
            if failed && frame.tag != b'S' {
                continue;
            }
            match frame.tag {
                b'P' => {
                    let p = protocol::parse_view(frame.body())
                        .ok_or_else(|| FrontendError::malformed("Parse"))?;
                    if p.name.is_empty() {
                        unnamed = Some(self.recent.get_or_analyze(&self.shared.router, p.query));
                    } else if let Err(err) = self.statement_room(p.name, p.query, p.param_types) {
                        crate::frontend::error_response::write_error(&mut reply, &err);
                        failed = true;
                        continue;
                    } else {
                        self.register_statement(p.name, p.query, p.param_types);
                    }
                    protocol::parse_complete(&mut reply);
                }
                b'B' => {
                    let b =
                        protocol::bind_view(frame.body()).ok_or_else(|| FrontendError::malformed("Bind"))?;
                    bound = match b.statement {
                        b"" => unnamed.clone().or_else(|| self.unnamed.clone()),
                        name => self.bound_analysis(name),
                    };
                    protocol::bind_complete(&mut reply);
                }
                b'D' => {
                    if frame.body().first() == Some(&b'S') {
                        protocol::parameter_description(&mut reply, &[]);
                    }
                    match answer {
                        LocalAnswer::TenantSet { .. } => protocol::put_message(&mut reply, b'n', |_| {}),
                        LocalAnswer::RoutingVersion => {
                            protocol::text_row_description(&mut reply, &[ROUTING_VERSION])
                        }
                    }
                }
                b'E' if bound.as_ref().is_some_and(|a| matches!(a.kind, StatementKind::Begin)) => {
                    if matches!(self.tx, ClientTx::Idle) {
                        let text = bound.as_ref().map(|a| a.text()).unwrap_or("BEGIN");
                        self.tx = ClientTx::DeferredBegin(Bytes::copy_from_slice(text.as_bytes()));
                    }
                    protocol::command_complete(&mut reply, "BEGIN");
                }
                b'E' => match &answer {
                    LocalAnswer::TenantSet { tenant, tag } => {
                        match self.change_tenant(tenant.clone()).await {
                            Ok(()) => protocol::command_complete(&mut reply, tag),
                            Err(err) if err.is_fatal() => return Err(err),
                            Err(err) => {
                                crate::frontend::error_response::write_error(&mut reply, &err);
                                failed = true;
                            }
                        }
                    }
                    LocalAnswer::RoutingVersion => {
                        let version = self.shared.router.routing_version().to_string();
                        protocol::text_data_row(&mut reply, &[&version]);
                        protocol::command_complete(&mut reply, "SHOW");
                    }
                },
                b'C' => protocol::close_complete(&mut reply),
                b'S' => {
                    if failed {
                        self.abort_deferred_begin();
                    }
                    protocol::ready_for_query(&mut reply, self.client_status())
                }
                _ => {}
            }
        }
        self.reply(reply);
        Ok(true)
    }

    /// The analyses of the statements the held Bind messages execute, and the tenants
    /// the held Parse and Bind messages name (a Bind's parameters included). A Bind
    /// refers to the statement a Parse of the same request gave its name, if any. A
    /// request that only prepares needs no tenant: any shard can prepare it.
    fn batch_statements(&mut self) -> Result<BatchStatements, FrontendError> {
        let mut analyses = SmallVec::new();
        let mut parsed = SmallVec::new();
        let mut named = SmallVec::new();
        let mut binds = SmallVec::new();
        let mut parsed_here: SmallVec<[(&[u8], Arc<Analysis>); 2]> = SmallVec::new();
        let router = &self.shared.router;
        for frame in &self.batch {
            let (analysis, tenants) = match frame.tag {
                b'P' => {
                    let p = protocol::parse_view(frame.body())
                        .ok_or_else(|| FrontendError::malformed("Parse"))?;
                    let analysis = self.recent.get_or_analyze(router, p.query);
                    parsed_here.push((p.name, analysis.clone()));
                    parsed.push(analysis.clone());
                    self.admit_text(Candidate::text(&analysis))?;
                    add_new(&mut named, router.named_in_text(&analysis));
                    continue;
                }
                b'B' => {
                    let b =
                        protocol::bind_view(frame.body()).ok_or_else(|| FrontendError::malformed("Bind"))?;
                    let here = parsed_here.iter().rev().find(|(name, _)| *name == b.statement);
                    let Some(analysis) =
                        here.map(|(_, a)| a.clone()).or_else(|| self.bound_analysis(b.statement))
                    else {
                        continue;
                    };
                    self.admit_text(Candidate::bound(&analysis, b.rest))?;
                    let tenants = router.named_in_bind(&analysis, b.rest);
                    binds.push(frame.body_bytes());
                    (analysis, tenants)
                }
                _ => continue,
            };
            add_new(&mut named, tenants);
            analyses.push(analysis);
        }
        Ok(BatchStatements { executed: analyses, binds, parsed, named })
    }

    /// Routes a held request by its statements and attaches a server for it. `whole`:
    /// the request ended (Sync, Flush); else it is routed by its first part, and what
    /// follows is checked as the rest of a transaction is (`check_bind`): it goes to the
    /// primary, and the tenant GUC is set ahead of it rather than inside it.
    async fn route_batch(&mut self, statements: &BatchStatements, whole: bool) -> Result<(), FrontendError> {
        let analyses = &statements.executed;
        // A request routed by its first part goes to the primary.
        let mut reach = self.reach();
        reach.autocommit &= whole;
        let route: Route = self
            .shared
            .router
            .route(self.tenant.as_ref(), &statements.named, analyses, &mut self.placement, reach)
            .await?;
        // A statement after one that may run code pgtenant cannot follow, in this request.
        let mut after_unknown_code = false;
        for (analysis, bind) in analyses.iter().zip(&statements.binds) {
            let b = protocol::bind_view(bind).ok_or_else(|| FrontendError::malformed("Bind"))?;
            let opening = Stage::Opening { route: &route, after_unknown_code };
            self.admit(Candidate::bound(analysis, b.rest), opening).await?;
            after_unknown_code |= analysis.effects().session == crate::router::SessionRisk::Anything;
        }
        self.begin_on(route, whole && analyses.iter().all(|a| a.effects().shares_implicit_transaction()))
            .await
    }

    /// Inside a transaction: the tenants a Bind names (text and parameters) must be the
    /// session's and live on the transaction's shard.
    async fn check_bind(&self, frame: &Frame) -> Result<(), FrontendError> {
        let b = protocol::bind_view(frame.body()).ok_or_else(|| FrontendError::malformed("Bind"))?;
        let Some(analysis) = self.bound_analysis(b.statement) else { return Ok(()) };
        self.admit_joining_bind(&analysis, b.rest).await
    }

    /// The admission of a Bind of `analysis` with the parameters `bind_rest` inside
    /// the transaction under way.
    pub(super) async fn admit_joining_bind(
        &self,
        analysis: &Analysis,
        bind_rest: &[u8],
    ) -> Result<(), FrontendError> {
        let named = self.shared.router.named_in_bind(analysis, bind_rest);
        self.admit(Candidate::bound(analysis, bind_rest), Stage::Joining { named: &named }).await
    }

    /// The analysis of the statement a Bind names (`""` is the last unnamed Parse).
    pub(super) fn bound_analysis(&self, name: &[u8]) -> Option<Arc<Analysis>> {
        if name.is_empty() {
            self.unnamed.clone()
        } else {
            self.statements.get(name).map(|s| s.analysis.clone())
        }
    }

    /// Whether the client may define statement `name` within its byte budget.
    pub(super) fn statement_room(
        &self,
        name: &[u8],
        query: &[u8],
        param_types: &[u8],
    ) -> Result<(), FrontendError> {
        self.statements
            .check_room(name, query, param_types)
            .map_err(|over| FrontendError::StatementBudget { held: over.held, budget: over.budget })
    }

    /// Remembers a client's named statement under its shared server-side identity (of
    /// the text the server gets: see `text_for_server`).
    pub(super) fn register_statement(
        &mut self,
        name: &[u8],
        query: &[u8],
        param_types: &[u8],
    ) -> (Arc<PreparedStatement>, Arc<Analysis>) {
        let analysis = self.recent.get_or_analyze(&self.shared.router, query);
        let server_query = self.text_for_server(&analysis);
        let stmt =
            self.shared.statements.intern(server_query.as_ref().map_or(query, |q| q.as_bytes()), param_types);
        let statement = ClientStatement { stmt: stmt.clone(), analysis: analysis.clone() };
        self.statements.insert(Bytes::copy_from_slice(name), statement);
        (stmt, analysis)
    }

    /// Sends one extended-protocol message to the attached server, translated.
    fn forward_extended(&mut self, frame: Frame) -> Result<(), FrontendError> {
        if let Some(a) = self.server.as_mut()
            && frame.tag != b'H'
        {
            // Until Sync, the server holds request state (unnamed statement, portals). A
            // Flush opens nothing: psycopg sends one after each Sync of a pipeline.
            a.open_request = frame.tag != b'S';
        }
        match frame.tag {
            b'P' => self.forward_parse(&frame)?,
            b'B' => {
                let b = protocol::bind_view(frame.body()).ok_or_else(|| FrontendError::malformed("Bind"))?;
                // What a statement does is decided where it runs: here, not at Parse.
                let analysis = self.bound_analysis(b.statement);
                if analysis.as_ref().is_some_and(|a| a.sets_tenant()) {
                    // Inside a transaction: the server must never see a change of the tenant GUC.
                    let err = FrontendError::TenantChangeInTransaction {
                        param: self.shared.router.tenant_param().into(),
                    };
                    self.fail_until_sync(&err);
                    return Ok(());
                }
                if let (Some(pin), Some(a)) = (analysis.as_ref().and_then(|a| a.pin), self.server.as_mut()) {
                    a.pin.get_or_insert(pin);
                }
                // A statement pgtenant never saw parsed may do anything.
                self.note_session_risk(analysis.as_deref());
                self.note_bound_changes(b.portal, analysis, b.rest);
                let stmt = self.server_statement(b.statement);
                let a = self.server.as_mut().ok_or_else(FrontendError::no_server)?;
                match &stmt {
                    Some(stmt) => {
                        protocol::bind_renamed(&mut a.conn.io.wbuf, b.portal, &stmt.server_name, b.rest)
                    }
                    None => a.conn.io.wbuf.extend_from_slice(&frame.raw),
                }
                a.conn.queue.push(Pending::Client { reply: Reply::Bind, statement: stmt, changes: 0 });
            }
            b'D' => {
                let (kind, name) = protocol::target_view(frame.body())
                    .ok_or_else(|| FrontendError::malformed("Describe"))?;
                let stmt = if kind == b'S' { self.server_statement(name) } else { None };
                let a = self.server.as_mut().ok_or_else(FrontendError::no_server)?;
                match &stmt {
                    Some(stmt) => protocol::describe_statement(&mut a.conn.io.wbuf, &stmt.server_name),
                    None => a.conn.io.wbuf.extend_from_slice(&frame.raw),
                }
                a.conn.queue.push(Pending::Client { reply: Reply::Describe, statement: stmt, changes: 0 });
            }
            b'C' => {
                let (kind, name) =
                    protocol::target_view(frame.body()).ok_or_else(|| FrontendError::malformed("Close"))?;
                if kind == b'S' && !name.is_empty() {
                    self.statements.remove(name);
                    let mut b = BytesMut::new();
                    protocol::close_complete(&mut b);
                    let a = self.server.as_mut().ok_or_else(FrontendError::no_server)?;
                    a.conn.queue.push(Pending::Synthetic(b.freeze()));
                } else {
                    let a = self.server.as_mut().ok_or_else(FrontendError::no_server)?;
                    a.conn.io.wbuf.extend_from_slice(&frame.raw);
                    a.conn.queue.push(Pending::client(Reply::Close));
                }
            }
            b'E' => {
                let (portal, _) =
                    protocol::split_cstr(frame.body()).ok_or_else(|| FrontendError::malformed("Execute"))?;
                self.note_executed_changes(portal);
                let a = self.server.as_mut().ok_or_else(FrontendError::no_server)?;
                a.conn.io.wbuf.extend_from_slice(&frame.raw);
                a.conn.queue.push(Pending::client(Reply::Execute));
            }
            b'S' => {
                let changes = std::mem::take(&mut self.request_changes);
                let a = self.server.as_mut().ok_or_else(FrontendError::no_server)?;
                a.conn.io.wbuf.extend_from_slice(&frame.raw);
                a.conn.queue.push(Pending::Client { reply: Reply::Sync, statement: None, changes });
            }
            b'H' => {
                let a = self.server.as_mut().ok_or_else(FrontendError::no_server)?;
                a.conn.io.wbuf.extend_from_slice(&frame.raw);
            }
            _ => {
                return Err(FrontendError::Protocol("not an extended-protocol message".into()));
            }
        }
        if let Some(a) = self.server.as_mut() {
            a.conn.queue.drain_synthetic(&mut self.client.wbuf);
        }
        Ok(())
    }

    /// A Bind to `portal` replaces what the portal held: remembers whether it now holds
    /// a statement that changes session settings, with parameter values filled in. One
    /// whose value cannot be read (NULL, not UTF-8) pins the server connection instead.
    fn note_bound_changes(&mut self, portal: &[u8], analysis: Option<Arc<Analysis>>, bind_rest: &[u8]) {
        self.bound_changes.take_if(|b| b.portal[..] == *portal);
        let Some(analysis) = analysis.filter(|a| !a.session_changes.is_empty()) else { return };
        let changes: Option<Vec<_>> =
            analysis.session_changes.iter().map(|c| with_parameter_values(c, bind_rest)).collect();
        match changes {
            Some(changes) => {
                self.bound_changes = Some(BoundChanges {
                    portal: Bytes::copy_from_slice(portal),
                    changes,
                    discards_statements: matches!(analysis.kind, StatementKind::DiscardAll),
                })
            }
            None => {
                if let Some(a) = self.server.as_mut() {
                    a.pin.get_or_insert(PinReason::UnfollowedSet);
                }
            }
        }
    }

    /// An Execute of `portal` goes to the server: if the portal holds a statement that
    /// changes settings, its changes wait for the request's answer (`on_ready`).
    fn note_executed_changes(&mut self, portal: &[u8]) {
        let Some(bound) = self.bound_changes.take_if(|b| b.portal[..] == *portal) else { return };
        self.request_changes += bound.changes.len();
        self.setting_changes.extend(bound.changes);
        if bound.discards_statements
            && let Some(a) = self.server.as_mut()
        {
            // As in a simple query: the server forgets every prepared statement.
            a.conn.prepared.clear();
            self.statements.clear();
        }
    }

    pub(super) fn forward_parse(&mut self, frame: &Frame) -> Result<(), FrontendError> {
        let p = protocol::parse_view(frame.body()).ok_or_else(|| FrontendError::malformed("Parse"))?;
        if crate::router::mentions_all_shards(p.query)
            && super::scatter::is_scatter(&self.recent.get_or_analyze(&self.shared.router, p.query))
        {
            // Reached only with a server attached (an open transaction): a scatter-gather
            // runs on other connections, outside it.
            let shard = self.server.as_ref().map_or(0, |a| a.route.shard);
            let err = FrontendError::Scatter(crate::admin::scatter::ScatterError::InTransaction { shard });
            self.fail_until_sync(&err);
            return Ok(());
        }
        if self.scatter_seen && p.name.is_empty() {
            self.scatter_statements.remove(&b""[..]);
        }
        if p.name.is_empty() {
            let analysis = self.recent.get_or_analyze(&self.shared.router, p.query);
            let answered_here = proxy_select(&analysis).is_some();
            self.unnamed_deallocates = self.deallocated_here(&analysis);
            self.unnamed = Some(analysis);
            if answered_here {
                self.parsed_proxy_call();
                return Ok(());
            }
            if self.unnamed_deallocates.is_some() {
                self.parsed_locally();
                return Ok(());
            }
            let rewritten = self.unnamed.clone().and_then(|analysis| self.text_for_server(&analysis));
            let a = self.server.as_mut().ok_or_else(FrontendError::no_server)?;
            match rewritten {
                Some(sql) => protocol::parse(&mut a.conn.io.wbuf, b"", sql.as_bytes(), p.param_types),
                None => a.conn.io.wbuf.extend_from_slice(&frame.raw),
            }
            a.conn.queue.push(Pending::client(Reply::Parse));
            return Ok(());
        }
        if let Err(err) = self.statement_room(p.name, p.query, p.param_types) {
            // As a server that runs out of memory: this Parse fails, the rest of the
            // request is skipped, the session goes on.
            self.fail_until_sync(&err);
            return Ok(());
        }
        let (stmt, analysis) = self.register_statement(p.name, p.query, p.param_types);
        if proxy_select(&analysis).is_some() {
            self.parsed_proxy_call();
            return Ok(());
        }
        let a = self.server.as_mut().ok_or_else(FrontendError::no_server)?;
        if a.conn.prepared.touch(stmt.id) {
            let mut b = BytesMut::new();
            protocol::parse_complete(&mut b);
            a.conn.queue.push(Pending::Synthetic(b.freeze()));
        } else {
            a.conn.note_prepared(&stmt);
            protocol::parse(&mut a.conn.io.wbuf, &stmt.server_name, &stmt.query, &stmt.param_types);
            a.conn.queue.push(Pending::Client {
                reply: Reply::Parse,
                statement: Some(stmt.clone()),
                changes: 0,
            });
        }
        Ok(())
    }

    /// A statement pgtenant answers itself was prepared: the server never sees it.
    pub(super) fn parsed_proxy_call(&mut self) {
        self.proxy_calls_seen = true;
        self.parsed_locally();
    }

    /// A statement pgtenant runs itself was prepared: its ParseComplete, in line.
    fn parsed_locally(&mut self) {
        let mut b = BytesMut::new();
        protocol::parse_complete(&mut b);
        self.reply(b);
    }

    /// Whether a message to forward may be about a statement or portal pgtenant runs
    /// itself (a snowflake or backend call, a DEALLOCATE). Parse is checked where it is forwarded;
    /// the rest only while this session has such statements. Checked before awaiting
    /// anything: the common path stays synchronous.
    fn may_concern_local(&self, frame: &Frame) -> bool {
        self.has_local_statements() && frame.tag != b'P'
    }

    /// This session prepared a statement pgtenant answers (a call, a DEALLOCATE).
    pub(super) fn has_local_statements(&self) -> bool {
        self.proxy_calls_seen
            || self.scatter_seen
            || self.unnamed_deallocates.is_some()
            || !self.deallocate_portals.is_empty()
    }

    /// Handles an extended-protocol message if it concerns a statement or portal pgtenant
    /// runs itself; gives the frame back otherwise. Errors are reported here, as a server
    /// would: the rest of the request up to Sync is skipped.
    pub(super) async fn answer_local_message(
        &mut self,
        frame: Frame,
    ) -> Result<Option<Frame>, FrontendError> {
        let handled = match self.deallocate_message(&frame) {
            Ok(false) => match self.proxy_call_message(&frame).await {
                // Boxed: its state is large, and every session's future would carry it.
                Ok(false) if self.scatter_seen || frame.tag == b'P' => {
                    Box::pin(self.scatter_message(&frame)).await
                }
                other => other,
            },
            other => other,
        };
        match handled {
            Ok(true) => Ok(None),
            Ok(false) => Ok(Some(frame)),
            Err(err) if err.is_fatal() => Err(err),
            Err(err) => {
                self.fail_until_sync(&err);
                Ok(None)
            }
        }
    }

    /// The server-side statement for a client statement name, prepared on the
    /// attached server first if it lacks it. `None` for the unnamed or an unknown name
    /// (the server then reports the error itself).
    pub(super) fn server_statement(&mut self, name: &[u8]) -> Option<Arc<PreparedStatement>> {
        if name.is_empty() {
            return None;
        }
        let stmt = self.statements.get(name)?.stmt.clone();
        let a = self.server.as_mut()?;
        prepare_on(&mut a.conn, &stmt);
        Some(stmt)
    }
}

/// Prepares `stmt` on `conn` ahead of what comes next, unless it is there already.
pub(super) fn prepare_on(conn: &mut ServerConn, stmt: &Arc<PreparedStatement>) {
    if !conn.prepared.touch(stmt.id) {
        conn.note_prepared(stmt);
        protocol::parse(&mut conn.io.wbuf, &stmt.server_name, &stmt.query, &stmt.param_types);
        conn.queue.push(Pending::Injected {
            reply: Reply::Parse,
            on_error: OnError::Forward,
            statement: Some(stmt.clone()),
        });
    }
}

/// The statements of a held request.
/// Inline for the common request of one statement: no allocation per request.
struct BatchStatements {
    /// Those its Bind messages execute.
    executed: SmallVec<[Arc<Analysis>; 2]>,
    /// The bodies of those Bind messages, in the same order (their parameters).
    binds: SmallVec<[Bytes; 2]>,
    /// Those its Parse messages prepare.
    parsed: SmallVec<[Arc<Analysis>; 2]>,
    /// The tenants they name, Bind parameters included.
    named: Named,
}

/// The statements pgtenant answers itself, by kind.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum LocalKind {
    TenantSet,
    RoutingVersion,
    ProxyCall,
    Scatter,
}

pub(super) fn local_kind(analysis: &Analysis) -> Option<LocalKind> {
    if analysis.sets_tenant() {
        Some(LocalKind::TenantSet)
    } else if matches!(analysis.kind, StatementKind::ShowRoutingVersion) {
        Some(LocalKind::RoutingVersion)
    } else if proxy_select(analysis).is_some() {
        Some(LocalKind::ProxyCall)
    } else if super::scatter::is_scatter(analysis) {
        Some(LocalKind::Scatter)
    } else {
        None
    }
}

/// What a request pgtenant answers itself does.
#[derive(Clone)]
enum LocalAnswer {
    TenantSet { tenant: Option<TenantId>, tag: &'static str },
    RoutingVersion,
}

/// `change` with the values of its `$n` parameters read from a Bind's remainder;
/// `None` when one cannot be read (NULL, not UTF-8) or names no plain setting.
fn with_parameter_values(change: &SessionChange, bind_rest: &[u8]) -> Option<SessionChange> {
    match change {
        SessionChange::SetFromParameters { name, value } => {
            let name = match name {
                ConfigArg::Text(name) => name.clone(),
                ConfigArg::Parameter(n) => text_parameter(bind_rest, *n)?.to_string(),
            };
            if !crate::router::is_plain_setting(&name) {
                return None;
            }
            let value = match value {
                ConfigArg::Text(sql) => sql.clone(),
                ConfigArg::Parameter(n) => quote_literal(text_parameter(bind_rest, *n)?),
            };
            Some(SessionChange::Set { name, value })
        }
        other => Some(other.clone()),
    }
}

/// Parameter `$n` of a Bind as text: set_config's arguments are text, whose binary
/// form is its text too. `None` for NULL, or bytes that are not UTF-8.
pub(super) fn text_parameter(bind_rest: &[u8], n: u16) -> Option<&str> {
    let (_, value) = protocol::bind_param(bind_rest, n)?;
    std::str::from_utf8(value?).ok()
}

pub(super) fn add_new(named: &mut Named, tenants: Named) {
    for t in tenants {
        if !named.contains(&t) {
            named.push(t);
        }
    }
}
