//! Routing: finds the tenant of a transaction (session tenant, comment hint) and
//! turns it into a `Route` through the directory. The session carries the route out.

mod analyze;
mod cache;
mod lexer;
mod recent;

use std::sync::Arc;

pub use analyze::{Analysis, PinReason, ROUTING_VERSION, StatementKind};
pub use recent::RecentAnalyses;

/// The analysis with the default tenant parameter, for tests outside this layer.
#[cfg(test)]
pub fn analyze_for_tests(sql: &[u8]) -> Analysis {
    analyze::analyze(sql, "pgtenant.tenant_id")
}

use crate::config::{Config, NoTenantPolicy};
use crate::directory::{Directory, DirectoryError, Placement, ShardId, TenantId, TenantState, Topology};

/// Where a transaction runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub tenant: Option<TenantId>,
    pub shard: ShardId,
    /// What the tenant may do (always active without a tenant).
    pub state: TenantState,
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum RouteError {
    #[error("no tenant for this statement: set {param} (startup option, SET, or a /* {param}=N */ comment)")]
    NoTenant { param: String },
    #[error(transparent)]
    Directory(#[from] DirectoryError),
    #[error("session is bound to tenant {session}; the statement names tenant {named}")]
    OtherTenant { session: TenantId, named: TenantId },
    #[error("no shard for statements without a tenant: the directory holds no shards")]
    NoDefaultShard,
}

/// Decides routes; shared by all sessions.
pub struct Router {
    directory: Arc<dyn Directory>,
    tenant_param: String,
    /// From the configuration; else the directory's lowest shard.
    default_shard: Option<ShardId>,
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

    /// The shard for work that needs no tenant.
    pub fn default_shard(&self) -> Result<ShardId, RouteError> {
        self.default_shard
            .or_else(|| self.directory.topology().shard_ids().next())
            .ok_or(RouteError::NoDefaultShard)
    }

    /// The analysis of a query string.
    pub fn analyze(&self, sql: &[u8]) -> Arc<Analysis> {
        Arc::new(analyze::analyze(sql, &self.tenant_param))
    }

    /// Routes a transaction whose first statement is `analysis`.
    pub async fn route(
        &self,
        session_tenant: Option<TenantId>,
        analysis: &Analysis,
    ) -> Result<Route, RouteError> {
        let tenant = Self::pick_tenant(session_tenant, analysis.hint)?;
        self.route_tenant(tenant, || analysis.needs_tenant()).await
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
    pub async fn route_tenant(
        &self,
        tenant: Option<TenantId>,
        needs_tenant: impl FnOnce() -> bool,
    ) -> Result<Route, RouteError> {
        if let Some(t) = tenant {
            let placement = self.placement(t).await?;
            return Ok(Route { tenant: Some(t), shard: placement.shard, state: placement.state });
        }
        if !needs_tenant() || self.no_tenant_policy == NoTenantPolicy::Default {
            return Ok(Route { tenant: None, shard: self.default_shard()?, state: TenantState::Active });
        }
        Err(RouteError::NoTenant { param: self.tenant_param.clone() })
    }

    /// Where a tenant lives: from memory when the directory knows, else from its source.
    pub async fn placement(&self, tenant: TenantId) -> Result<Placement, DirectoryError> {
        match self.directory.cached(tenant) {
            Some(answer) => answer,
            None => self.directory.lookup(tenant).await,
        }
    }

    /// The shards and placement rules in force.
    pub fn topology(&self) -> Arc<Topology> {
        self.directory.topology()
    }

    /// The routing version this proxy serves.
    pub fn routing_version(&self) -> i64 {
        self.directory.version()
    }
}
