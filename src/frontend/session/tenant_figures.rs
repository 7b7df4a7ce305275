//! What a session tells the per-tenant statistics (`observe::tenants`): each request
//! answered (on its own server or a lane), and each checkout that waited for a place.

use super::Session;
use crate::backend::{Answered, PooledConn, coarse_clock};
use crate::observe::tenants::Figures;
use crate::router::Route;

/// A request's cost as per-tenant statistics count it.
pub(super) fn figures(answered: Answered, failed: bool) -> Figures {
    Figures {
        transactions: u64::from(answered.ended_transaction),
        requests: 1,
        server_us: answered.request_us,
        bytes_out: answered.bytes_out,
        errors: u64::from(failed),
        waits: 0,
    }
}

impl Session {
    /// Counts a checkout that waited for a place in a full pool for its tenant.
    pub(super) fn count_wait(&self, route: &Route, conn: &PooledConn) {
        if let (true, Some(tenant)) = (conn.waited(), &route.tenant) {
            let figures = Figures { waits: 1, ..Figures::default() };
            self.shared.tenant_stats.record(route.shard, tenant, figures, coarse_clock::coarse_ms());
        }
    }

    /// Counts a request answered on a lane for its tenant (see `observe::tenants`).
    pub(super) fn count_for_tenant(&self, route: &Route, answered: Answered, failed: bool) {
        if let Some(tenant) = &route.tenant {
            let figures = figures(answered, failed);
            self.shared.tenant_stats.record(route.shard, tenant, figures, coarse_clock::coarse_ms());
        }
    }
}
