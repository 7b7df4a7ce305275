//! Routing: finds the tenant of a transaction (session tenant, comment hint) and
//! turns it into a `Route` through the directory. The session carries the route out.

mod analyze;
mod cache;
mod lexer;
mod recent;

use std::sync::Arc;

pub use analyze::{Analysis, PinReason, StatementKind};
pub use recent::RecentAnalyses;

/// The analysis with the default tenant parameter, for tests outside this layer.
#[cfg(test)]
pub fn analyze_for_tests(sql: &[u8]) -> Analysis {
    analyze::analyze(sql, "pgtenant.tenant_id")
}

use crate::config::{Config, NoTenantPolicy};
use crate::directory::{Directory, DirectoryError, ShardId, TenantId};

/// Where a transaction runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub tenant: Option<TenantId>,
    pub shard: ShardId,
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum RouteError {
    #[error("no tenant for this statement: set {param} (startup option, SET, or a /* {param}=N */ comment)")]
    NoTenant { param: String },
    #[error(transparent)]
    Directory(#[from] DirectoryError),
    #[error("session is bound to tenant {session}; the statement names tenant {named}")]
    OtherTenant { session: TenantId, named: TenantId },
}

/// Decides routes; shared by all sessions.
pub struct Router {
    directory: Arc<dyn Directory>,
    tenant_param: String,
    default_shard: ShardId,
    no_tenant_policy: NoTenantPolicy,
}

impl Router {
    pub fn new(config: &Config, directory: Arc<dyn Directory>) -> Self {
        Self {
            directory,
            tenant_param: config.proxy.tenant_parameter.clone(),
            default_shard: config.default_shard(),
            no_tenant_policy: config.proxy.no_tenant_policy,
        }
    }

    pub fn tenant_param(&self) -> &str {
        &self.tenant_param
    }

    pub fn default_shard(&self) -> ShardId {
        self.default_shard
    }

    /// The analysis of a query string.
    pub fn analyze(&self, sql: &[u8]) -> Arc<Analysis> {
        Arc::new(analyze::analyze(sql, &self.tenant_param))
    }

    /// Routes a transaction whose first statement is `analysis`.
    pub fn route(&self, session_tenant: Option<TenantId>, analysis: &Analysis) -> Result<Route, RouteError> {
        let tenant = Self::pick_tenant(session_tenant, analysis.hint)?;
        self.route_tenant(tenant, || analysis.needs_tenant())
    }

    /// The tenant of a request: the session's, else the one a statement names.
    /// A bound session tenant never yields to another named tenant.
    pub fn pick_tenant(
        session: Option<TenantId>,
        named: Option<TenantId>,
    ) -> Result<Option<TenantId>, RouteError> {
        match (session, named) {
            (Some(session), Some(named)) if session != named => {
                Err(RouteError::OtherTenant { session, named })
            }
            (Some(t), _) | (None, Some(t)) => Ok(Some(t)),
            (None, None) => Ok(None),
        }
    }

    /// Routes a known tenant, or no tenant when `needs_tenant` says the work needs none.
    pub fn route_tenant(
        &self,
        tenant: Option<TenantId>,
        needs_tenant: impl FnOnce() -> bool,
    ) -> Result<Route, RouteError> {
        if let Some(t) = tenant {
            let shard = self.directory.resolve(t)?;
            return Ok(Route { tenant: Some(t), shard });
        }
        if !needs_tenant() || self.no_tenant_policy == NoTenantPolicy::Default {
            return Ok(Route { tenant: None, shard: self.default_shard });
        }
        Err(RouteError::NoTenant { param: self.tenant_param.clone() })
    }

    /// Resolves a tenant to its shard.
    pub fn resolve(&self, tenant: TenantId) -> Result<ShardId, DirectoryError> {
        self.directory.resolve(tenant)
    }
}
