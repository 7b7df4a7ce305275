//! The admission step: what a statement may do through pgtenant, decided in one place
//! for every request path (simple, extended, in place, lanes). `Session::admit` takes a
//! statement and where it stands (`Stage`) and refuses it, with the error the client
//! gets, or admits it and does the bookkeeping admission implies (a transaction that
//! may have written is marked for read-your-writes). A statement refused here never
//! reaches a server; the request paths keep only how bytes move.
//!
//! First what its text does, whoever sends it (`refusal_of_text`: the protected
//! settings nobody may change, pgtenant's own settings and statement names, other
//! sessions); then, once routed, what its tenant may do there: write, or change the
//! read-only wall (`writes_refusal`), touch tables strict isolation cannot prove
//! confined, join the open transaction.

use super::Session;
use crate::config::IsolationMode;
use crate::directory::{ShardId, TenantId};
use crate::frontend::error::FrontendError;
use crate::frontend::primary_now;
use crate::router::{Analysis, Protected, ProtectedSet, Route, Router, SessionRisk};

/// A statement at the admission step: its analysis and, for a Bind, its parameters.
#[derive(Clone, Copy)]
pub(super) struct Candidate<'a> {
    pub analysis: &'a Analysis,
    pub bound: Option<&'a [u8]>,
}

impl<'a> Candidate<'a> {
    /// A statement sent as text (a Query, or a Parse not yet bound).
    pub fn text(analysis: &'a Analysis) -> Self {
        Candidate { analysis, bound: None }
    }

    /// A statement bound with the Bind parameters `bound`.
    pub fn bound(analysis: &'a Analysis, bound: &'a [u8]) -> Self {
        Candidate { analysis, bound: Some(bound) }
    }
}

/// Where a routed statement stands when it is admitted (before it is routed, a Parse or
/// a text pgtenant may answer itself is admitted by its text alone: `admit_text`).
pub(super) enum Stage<'a> {
    /// It starts a transaction, or an autocommit request, on `route`.
    /// `after_unknown_code`: a statement before it in the same request may run code
    /// pgtenant cannot follow (which may have taken down the read-only wall).
    Opening { route: &'a Route, after_unknown_code: bool },
    /// It runs in the transaction open on the attached server, and names `named`.
    Joining { named: &'a [TenantId] },
}

impl Session {
    /// The admission step for `statement` at `stage` (see the module comment).
    /// (It borrows the session shared, so that a Bind's parameters may stay in the
    /// client's read buffer: its one mark is an atomic.)
    pub(super) async fn admit(
        &self,
        statement: Candidate<'_>,
        stage: Stage<'_>,
    ) -> Result<(), FrontendError> {
        let changed = self.protected_changed_by(statement);
        self.refuse_text(statement.analysis, changed)?;
        let (route, after_unknown_code) = match stage {
            Stage::Opening { route, after_unknown_code } => (route, after_unknown_code),
            Stage::Joining { named } => {
                self.check_fits_transaction(named).await?;
                let Some(a) = self.server.as_ref() else { return Ok(()) };
                (&a.route, a.unknown_code_in_request)
            }
        };
        if let Some(refused) = writes_refusal(route, statement.analysis, changed, after_unknown_code) {
            return Err(refused);
        }
        self.check_strict(route.shard, statement.analysis, statement.bound).await?;
        if statement.analysis.effects().may_have_written() {
            self.may_have_written.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    /// The first part of `admit`, for a statement that has no route yet: what its text
    /// does, and the Bind's parameters show, whoever sends it.
    pub(super) fn admit_text(&self, statement: Candidate<'_>) -> Result<(), FrontendError> {
        self.refuse_text(statement.analysis, self.protected_changed_by(statement))
    }

    /// `admit_text` for a statement whose protected settings (`changed`) are known.
    fn refuse_text(&self, analysis: &Analysis, changed: ProtectedSet) -> Result<(), FrontendError> {
        let tenant_param = self.shared.router.tenant_param();
        match refusal_of_text(analysis, changed, tenant_param, &self.tenant) {
            Some(FrontendError::OtherSessions { .. }) if self.user.see_other_sessions => Ok(()),
            Some(refused) => Err(refused),
            None => Ok(()),
        }
    }

    /// The protected settings `statement` changes, by its text or through its Bind's
    /// parameters (a `set_config` name given as `$n`; one pgtenant cannot read counts
    /// as every protected setting).
    fn protected_changed_by(&self, statement: Candidate<'_>) -> ProtectedSet {
        let analysis = statement.analysis;
        let Some(rest) = statement.bound else { return analysis.protected };
        let tenant_param = self.shared.router.tenant_param();
        analysis.set_config_name_params.iter().fold(analysis.protected, |set, &n| {
            let name = super::extended::text_parameter(rest, n);
            set.union(ProtectedSet::of_bound_name(name, tenant_param))
        })
    }

    /// A deferred BEGIN (answered when it came) is admitted once its tenant is known:
    /// a `BEGIN READ WRITE` of a tenant that may not write is refused now. Asked where
    /// every path attaches a server for a transaction (`begin_on`), since a request may
    /// open it with no statement to admit (a Parse alone).
    pub(super) fn admit_deferred_begin(&self, route: &Route) -> Result<(), FrontendError> {
        let super::ClientTx::DeferredBegin(begin) = &self.tx else { return Ok(()) };
        if route.state.allows_writes() {
            return Ok(());
        }
        let begin = self.shared.router.analyze(begin);
        writes_refusal(route, &begin, begin.protected, false).map_or(Ok(()), Err)
    }
}

/// What a statement's text may not do whoever sends it (`changed`: the protected
/// settings it changes, its Bind's included): change a protected setting nobody may,
/// give one of pgtenant's settings a value it cannot take, name a prepared statement of
/// pgtenant's on the server, or reach the server's other sessions. `tenant_param` and
/// `tenant` only word the error.
fn refusal_of_text(
    analysis: &Analysis,
    changed: ProtectedSet,
    tenant_param: &str,
    tenant: &Option<TenantId>,
) -> Option<FrontendError> {
    match changed.refused_to_all() {
        Some(Protected::TenantGuc) => {
            return Some(FrontendError::TenantGucProtected { param: tenant_param.into() });
        }
        Some(_) => {
            let name = crate::backend::TENANT_SIGNATURE_GUC;
            return Some(FrontendError::SettingProtected { name });
        }
        None => {}
    }
    if let Some(bad) = &analysis.bad_setting {
        return Some(FrontendError::from(bad));
    }
    if let Some(name) = &analysis.reserved_statement {
        return Some(FrontendError::ReservedStatementName { name: name.to_string() });
    }
    let object = analysis.other_sessions.as_deref()?;
    Some(FrontendError::OtherSessions { object: object.into(), tenant: tenant.clone() })
}

/// Whether the text of `analysis` is refused whoever sends it: such a request takes
/// the general path, which words the refusal (the in-place and lane paths ask).
pub(super) fn is_refused(analysis: &Analysis) -> bool {
    refusal_of_text(analysis, analysis.protected, "", &None).is_some()
}

/// For a tenant of `route` that may not write: the refusal of a statement that may
/// write (`changed`: the protected settings it changes), or that would take down the server's wall (`default_transaction_read_only`,
/// which pgtenant sets for it): `READ WRITE`, a change of the read-only settings, or a
/// transaction boundary behind SQL pgtenant cannot follow in one request
/// (`after_unknown_code`, or earlier in the same query), since a function could have
/// turned the wall off for the transactions after it. What the text shows it writes is
/// refused here; what code it calls may write is refused by the wall.
fn writes_refusal(
    route: &Route,
    analysis: &Analysis,
    changed: ProtectedSet,
    after_unknown_code: bool,
) -> Option<FrontendError> {
    if route.state.allows_writes() {
        return None;
    }
    let tenant = route.tenant.clone()?;
    let effects = analysis.effects();
    let state = route.state.describe();
    let wall = |what| FrontendError::ReadOnlyWall { tenant: tenant.clone(), shard: route.shard, state, what };
    if changed.contains(Protected::ReadOnlyWall) {
        return Some(wall(
            "READ WRITE, or a change of default_transaction_read_only or transaction_read_only,",
        ));
    }
    if effects.controls_transaction && after_unknown_code {
        return Some(wall("a transaction boundary after SQL pgtenant cannot follow, in one request"));
    }
    if analysis.is_multi && effects.controls_transaction && effects.session == SessionRisk::Anything {
        return Some(wall("a transaction boundary after SQL pgtenant cannot follow, in one query,"));
    }
    effects.writes.shown().then_some(FrontendError::TenantReadOnly { tenant, shard: route.shard, state })
}

impl Session {
    /// Strict isolation (`proxy.isolation = "strict"`): a session with a tenant may not
    /// run `analysis` on `shard` if it touches a table holding tenants without forced
    /// row-level security and is not confined to the session's tenant (see
    /// `frontend::strict`). `bind_rest`: the Bind's parameters, for `$n` values.
    async fn check_strict(
        &self,
        shard: ShardId,
        analysis: &Analysis,
        bind_rest: Option<&[u8]>,
    ) -> Result<(), FrontendError> {
        let config = &self.shared.config;
        let Some(tenant) = &self.tenant else { return Ok(()) };
        if config.proxy.isolation != IsolationMode::Strict || !self.shared.router.needs_tenant(analysis) {
            return Ok(());
        }
        let node = primary_now(&self.shared.health, &self.pools.topology, shard)?;
        let check = crate::frontend::strict::StrictCheck {
            config,
            catalog: &self.shared.strict,
            shard,
            node: &node,
            user: &self.user,
            database: &self.database,
            tenant,
        };
        let ddl = analysis.effects().changes_schema;
        // Boxed: it reads the catalog of the shard, a large state that every session's
        // future would otherwise carry (strict isolation is off by default).
        Box::pin(check.check(self.shared.router.confinement(analysis, bind_rest), ddl)).await
    }

    /// Inside a transaction, every tenant a statement names must be the session's
    /// (when bound) and live on the transaction's shard.
    async fn check_fits_transaction(&self, named: &[TenantId]) -> Result<(), FrontendError> {
        let Some(current) = self.server.as_ref().map(|a| a.route.shard) else {
            return Ok(());
        };
        Router::check_bound(self.tenant.as_ref(), named)?;
        for t in named {
            let placement =
                self.shared.router.placement(t).await.map_err(|e| FrontendError::Route(e.into()))?;
            if placement.shard != current {
                return Err(FrontendError::CrossShard { current, tenant: t.clone(), other: placement.shard });
            }
        }
        Ok(())
    }
}
