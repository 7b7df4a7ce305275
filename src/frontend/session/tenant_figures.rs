//! What a session tells the per-tenant statistics (`observe::tenants`): each request
//! answered (on its own server or a lane), and each checkout that waited for a place.
//!
//! A transaction's requests, and the wait of the checkout that began it, are added up
//! here and recorded once, when it ends (or the session does, or its next request is
//! another tenant's or shard's): each record takes the shard's locks and two hash
//! lookups, and pgbench's TPC-B transaction has seven requests. SHOW TENANTS thus
//! counts a transaction's requests and wait when it ends.

use super::Session;
use crate::backend::{Answered, PooledConn, coarse_clock};
use crate::directory::{ShardId, TenantId};
use crate::observe::tenants::{Figures, TenantStats};
use crate::router::Route;

/// A request's cost as per-tenant statistics count it.
fn figures(answered: Answered, failed: bool) -> Figures {
    Figures {
        transactions: u64::from(answered.ended_transaction),
        requests: 1,
        server_us: answered.request_us,
        bytes_out: answered.bytes_out,
        errors: u64::from(failed),
        waits: 0,
    }
}

/// The figures of the transaction under way, not yet recorded.
#[derive(Default)]
pub(super) struct HeldFigures(Option<(ShardId, TenantId, Figures)>);

impl HeldFigures {
    /// Adds a request `tenant` had answered on `shard`; records what is held when the
    /// request ended its transaction.
    pub(super) fn answered(
        &mut self,
        stats: &TenantStats<TenantId>,
        shard: ShardId,
        tenant: &TenantId,
        answered: Answered,
        failed: bool,
    ) {
        self.add(stats, shard, tenant, figures(answered, failed));
        if answered.ended_transaction {
            self.record(stats);
        }
    }

    /// Adds `figures` of `tenant` on `shard` to what is held, recording what was held
    /// first when it was another tenant's or shard's.
    fn add(&mut self, stats: &TenantStats<TenantId>, shard: ShardId, tenant: &TenantId, figures: Figures) {
        match &mut self.0 {
            Some((held_shard, held_tenant, held)) if *held_shard == shard && held_tenant == tenant => {
                held.add(&figures)
            }
            _ => {
                self.record(stats);
                self.0 = Some((shard, tenant.clone(), figures));
            }
        }
    }

    /// Records what is held.
    pub(super) fn record(&mut self, stats: &TenantStats<TenantId>) {
        if let Some((shard, tenant, figures)) = self.0.take() {
            stats.record(shard, &tenant, figures, coarse_clock::coarse_ms());
        }
    }
}

impl Session {
    /// Counts a checkout that waited for a place in a full pool for its tenant, with
    /// the transaction it begins (a record of its own per transaction doubled the cost
    /// of these statistics for every transaction of a saturated pool).
    pub(super) fn count_wait(&mut self, route: &Route, conn: &PooledConn) {
        if let (true, Some(tenant)) = (conn.waited(), &route.tenant) {
            let figures = Figures { waits: 1, ..Figures::default() };
            self.held_figures.add(&self.shared.tenant_stats, route.shard, tenant, figures);
        }
    }

    /// Counts a request answered on a lane for its tenant (see `observe::tenants`).
    pub(super) fn count_for_tenant(&mut self, route: &Route, answered: Answered, failed: bool) {
        if let Some(tenant) = &route.tenant {
            self.held_figures.answered(&self.shared.tenant_stats, route.shard, tenant, answered, failed);
        }
    }
}
