//! What a statement may not do through pgtenant, decided in one place for every request
//! path (simple, extended, in place, lanes): a statement refused here never reaches a
//! server. First what its text does, whatever its route (`refusal_of`); then, once it is
//! routed, what its tenant may do there: write (`check_writable_on`), touch tables that
//! strict isolation cannot prove confined (`check_strict`), join the open transaction
//! (`check_fits_transaction`).

use super::Session;
use crate::backend::TENANT_SIGNATURE_GUC;
use crate::config::IsolationMode;
use crate::directory::{ShardId, TenantId};
use crate::frontend::error::FrontendError;
use crate::frontend::primary_now;
use crate::router::{Analysis, READ_ONLY_SETTINGS, Route, Router, SessionRisk};

impl Session {
    /// The refusal of a statement for what its text does, before any routing: it
    /// would change the tenant GUC behind pgtenant's back, give one of pgtenant's
    /// settings a value it cannot take, name a prepared statement of pgtenant's on the
    /// server, or reach the server's other sessions.
    pub(super) fn refusal_of(&self, analysis: &Analysis) -> Option<FrontendError> {
        text_refusal(analysis, self.shared.router.tenant_param(), &self.tenant)
    }
}

/// `Session::refusal_of` for a session whose tenant parameter is `tenant_param` and
/// whose tenant is `tenant` (they only word the error).
fn text_refusal(analysis: &Analysis, tenant_param: &str, tenant: &Option<TenantId>) -> Option<FrontendError> {
    if analysis.tampers_tenant_guc {
        return Some(FrontendError::TenantGucProtected { param: tenant_param.into() });
    }
    if analysis.tampers_signature {
        return Some(FrontendError::SettingProtected { name: TENANT_SIGNATURE_GUC });
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

impl Session {
    /// `refusal_of`, and what the Bind's parameters show: a `set_config` whose name
    /// comes as a parameter is refused when that name is the tenant signature or the
    /// tenant parameter (or cannot be read).
    pub(super) fn refusal_of_bound(&self, analysis: &Analysis, bind_rest: &[u8]) -> Option<FrontendError> {
        if let Some(refused) = self.refusal_of(analysis) {
            return Some(refused);
        }
        let tenant_param = self.shared.router.tenant_param();
        let named = |bound: &str| {
            analysis.set_config_name_params.iter().any(|&n| {
                super::extended::text_parameter(bind_rest, n)
                    .is_none_or(|name| name.eq_ignore_ascii_case(bound))
            })
        };
        if named(TENANT_SIGNATURE_GUC) {
            return Some(FrontendError::SettingProtected { name: TENANT_SIGNATURE_GUC });
        }
        named(tenant_param).then(|| FrontendError::TenantGucProtected { param: tenant_param.into() })
    }
}

/// Whether the text of `analysis` is refused whoever sends it (see `refusal_of`):
/// such a request takes the general path, which words the refusal.
pub(super) fn is_refused(analysis: &Analysis) -> bool {
    text_refusal(analysis, "", &None).is_some()
}

impl Session {
    /// Strict isolation (`proxy.isolation = "strict"`): a session with a tenant may not
    /// run `analysis` on `shard` if it touches a table holding tenants without forced
    /// row-level security and is not confined to the session's tenant (see
    /// `frontend::strict`). `bind_rest`: the Bind's parameters, for `$n` values.
    pub(super) async fn check_strict(
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
    pub(super) async fn check_fits_transaction(&self, named: &[TenantId]) -> Result<(), FrontendError> {
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

    /// A tenant that may not write (read_only, moving) gets its writes refused here,
    /// before they reach the server (see `check_writable_on`); `bound`: the Bind's
    /// parameters. Within one request, a statement pgtenant cannot follow may have turned
    /// the wall off for the next transactions (`default_transaction_read_only` in a
    /// function): no transaction boundary may follow it before pgtenant sets it again,
    /// as it does before the next request's transaction.
    ///
    /// A statement admitted here that may write marks its transaction as one that may
    /// have written (read-your-writes: `Session::note_write_end`).
    pub(super) fn check_writable(
        &mut self,
        analysis: &Analysis,
        bound: Option<&[u8]>,
    ) -> Result<(), FrontendError> {
        let Some(a) = self.server.as_mut() else { return Ok(()) };
        check_writable_on(&a.route, analysis, bound)?;
        a.may_have_written |= analysis.effects().may_have_written();
        match (&a.route.tenant, a.route.state.allows_writes()) {
            (Some(tenant), false) if a.unknown_code_in_request && analysis.effects().controls_transaction => {
                let what = "a transaction boundary after SQL pgtenant cannot follow, in one request";
                Err(read_only_wall(tenant, &a.route, what))
            }
            _ => Ok(()),
        }
    }
}

/// Refuses, for a tenant of `route` that may not write, a statement that may write, and
/// one that would take down the server's wall (`default_transaction_read_only`, which
/// pgtenant sets for it): `READ WRITE`, a change of the read-only settings (by name, or
/// by a `set_config` name among the Bind's parameters `bound`), or a transaction boundary
/// behind SQL pgtenant cannot follow in one query (a function could have turned it off
/// for the transactions after it).
pub(super) fn check_writable_on(
    route: &Route,
    analysis: &Analysis,
    bound: Option<&[u8]>,
) -> Result<(), FrontendError> {
    let (Some(tenant), false) = (route.tenant.clone(), route.state.allows_writes()) else {
        return Ok(());
    };
    let names_wall = |rest: &[u8]| {
        analysis.set_config_name_params.iter().any(|&n| {
            super::extended::text_parameter(rest, n)
                .is_none_or(|name| READ_ONLY_SETTINGS.iter().any(|s| name.eq_ignore_ascii_case(s)))
        })
    };
    if analysis.lifts_read_only || bound.is_some_and(names_wall) {
        let what = "READ WRITE, or a change of default_transaction_read_only or transaction_read_only,";
        return Err(read_only_wall(&tenant, route, what));
    }
    if analysis.is_multi
        && analysis.effects().controls_transaction
        && analysis.effects().session == SessionRisk::Anything
    {
        let what = "a transaction boundary after SQL pgtenant cannot follow, in one query,";
        return Err(read_only_wall(&tenant, route, what));
    }
    if !analysis.effects().writes.shown() {
        return Ok(());
    }
    Err(FrontendError::TenantReadOnly { tenant, shard: route.shard, state: route.state.describe() })
}

/// The refusal of a statement that would take down `tenant`'s read-only wall.
fn read_only_wall(tenant: &TenantId, route: &Route, what: &'static str) -> FrontendError {
    FrontendError::ReadOnlyWall {
        tenant: tenant.clone(),
        shard: route.shard,
        state: route.state.describe(),
        what,
    }
}
