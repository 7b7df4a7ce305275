//! What a statement may not do at all through pgtenant, decided in one place for every
//! request path (simple, extended, in place, lanes): a statement refused here never
//! reaches a server, whatever its shard, its transaction or its pool mode.

use super::Session;
use crate::frontend::error::FrontendError;
use crate::router::Analysis;

impl Session {
    /// The refusal of a statement for what its text does, before any routing: it
    /// would change the tenant GUC behind pgtenant's back, give one of pgtenant's
    /// settings a value it cannot take, name a prepared statement of pgtenant's on the
    /// server, or reach the server's other sessions.
    pub(super) fn refusal_of(&self, analysis: &Analysis) -> Option<FrontendError> {
        if analysis.tampers_tenant_guc {
            return Some(FrontendError::TenantGucProtected {
                param: self.shared.router.tenant_param().into(),
            });
        }
        if let Some(bad) = &analysis.bad_setting {
            return Some(FrontendError::from(bad));
        }
        if let Some(name) = &analysis.reserved_statement {
            return Some(FrontendError::ReservedStatementName { name: name.to_string() });
        }
        let object = analysis.other_sessions.as_deref()?;
        Some(FrontendError::OtherSessions { object: object.into(), tenant: self.tenant.clone() })
    }
}

impl Session {
    /// `refusal_of`, and what the Bind's parameters show: a `set_config` whose name
    /// comes as a parameter is refused when that name is the tenant parameter (or
    /// cannot be read).
    pub(super) fn refusal_of_bound(&self, analysis: &Analysis, bind_rest: &[u8]) -> Option<FrontendError> {
        if let Some(refused) = self.refusal_of(analysis) {
            return Some(refused);
        }
        let tenant_param = self.shared.router.tenant_param();
        let names_tenant = analysis.set_config_name_params.iter().any(|&n| {
            super::extended::text_parameter(bind_rest, n)
                .is_none_or(|name| name.eq_ignore_ascii_case(tenant_param))
        });
        names_tenant.then(|| FrontendError::TenantGucProtected { param: tenant_param.into() })
    }
}

/// Whether the text of `analysis` is refused whoever sends it (see `refusal_of`):
/// such a request takes the general path, which words the refusal.
pub(super) fn is_refused(analysis: &Analysis) -> bool {
    analysis.tampers_tenant_guc
        || analysis.bad_setting.is_some()
        || analysis.other_sessions.is_some()
        || analysis.reserved_statement.is_some()
}
