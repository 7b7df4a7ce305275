//! Which server connection a transaction gets: the primary's or a replica's pool
//! (looked up once per topology, health view and RELOAD), a place in it through the
//! fair-share gate and an idle or new connection, at once when nothing makes it wait,
//! else while an admin's pause holds it, a failover is awaited or its line moves,
//! the client watched meanwhile.

use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Session;
use super::client_watch::unless_client_leaves;
use crate::backend::health::{CheckOutcome, LagBound, NodeKey, PrimaryChoice};
use crate::backend::{BackendError, CheckoutError, PooledConn, ServerPool, Wanted};
use crate::config::NodeConfig;
use crate::directory::ShardId;
use crate::frontend::error::FrontendError;
use crate::observe::conns::ConnState;
use crate::router::{NodeTarget, Route};
use crate::tenancy::tenant_tag_of;

impl Session {
    /// `begin_on`'s checkout when nothing makes it wait, most of them: no pause, the
    /// primary's pool at hand, a place free and a connection idle. Taken without
    /// building the futures of the path that may wait (entering, the pool's lookup, the
    /// checkout and its retries: about 400 instructions per transaction); `None` sends
    /// the caller down that path, which looks at each again. A pool without a free
    /// place (most checkouts of a saturated pool, at 400 clients) is told first, so that
    /// a checkout that waits does little twice.
    pub(super) fn primary_at_once(&mut self, route: &Route) -> Option<PooledConn> {
        if !matches!(route.target, NodeTarget::Primary) {
            return None;
        }
        self.refresh_pool_handles();
        let pool = self.pools.handle(route.shard)?;
        if !pool.has_free_place() {
            return None;
        }
        // Listed as entering before the pauses are read, as `enter_transaction` does: a
        // pause that raises its flag after this reads the client's state (see
        // `ConnHandle::set_state`).
        self.listed.enter(route.shard, route.tenant.as_ref().map_or(0, tenant_tag_of));
        if !self.shared.pauses.is_clear() || self.listed.is_killed() {
            return None;
        }
        let wanted = self.wanted(route);
        let conn = self.shared.pools.checkout_at_once(pool, route.shard, &route.tenant, wanted).ok()??;
        self.count_wait(route, &conn);
        Some(conn)
    }

    /// What a checkout for `route` would like its connection to hold already: one that
    /// holds the tenant and settings spares the server SETs.
    pub(super) fn wanted<'a>(&self, route: &'a Route) -> Wanted<'a> {
        Wanted {
            tenant: self.shared.config.proxy.set_tenant_guc.then_some(route.tenant.as_ref()),
            settings: Some(self.settings.version),
        }
    }

    /// The pool of `shard`'s primary, from this session's handles while the topology
    /// they were taken from and the health view they were chosen by still hold.
    pub(super) async fn pool_of(&mut self, shard: ShardId) -> Result<ServerPool, FrontendError> {
        self.refresh_pool_handles();
        if let Some(pool) = self.pools.handle(shard) {
            return Ok(pool.clone());
        }
        let node = self.primary_or_wait(shard).await?;
        let pool = self.shared.pools.pool(shard, &node, &self.user, &self.database);
        self.pools.handles.push((shard, pool.clone()));
        Ok(pool)
    }

    /// Forgets the pool handles kept when the routing, the nodes' health or the users
    /// (a RELOAD) changed since they were looked up.
    fn refresh_pool_handles(&mut self) {
        let generation = self.shared.router.generation();
        let health = self.shared.health.version();
        let pools = self.shared.pools.generation();
        if generation != self.pools.generation || health != self.pools.health || pools != self.pools.pools {
            let topology = self.shared.router.topology();
            if !Arc::ptr_eq(&self.pools.topology, &topology) {
                self.shared.prune_pools(&topology);
                self.pools.topology = topology;
            }
            if pools != self.pools.pools
                && let Some(reloaded) = self.shared.users().configs.get(&self.user.name)
            {
                // A RELOAD changed the users: this session's pools follow the new pool
                // size and server credentials (its login and pool mode stay).
                self.user = reloaded.clone();
            }
            self.pools.handles.clear();
            (self.pools.generation, self.pools.health, self.pools.pools) = (generation, health, pools);
        }
    }

    /// A connection to a healthy replica of `route`'s shard, when one is within the lag
    /// bound and (read-your-writes) has replayed the session's last write; `None` when
    /// none is (the caller falls back to the primary or refuses).
    pub(super) async fn checkout_replica(
        &mut self,
        route: &Route,
        wanted: Wanted<'_>,
    ) -> Result<Option<PooledConn>, FrontendError> {
        self.refresh_pool_handles();
        let topology = self.shared.router.topology();
        let Some(shard) = topology.shard(route.shard) else { return Ok(None) };
        let Some(node) = self.shared.health.replica_of(
            shard,
            LagBound::of(&self.shared.config.health),
            self.write_to_read(),
        ) else {
            return Ok(None);
        };
        let pool = self.shared.pools.pool(route.shard, &node, &self.user, &self.database);
        match self.checkout_on(&pool, route, wanted).await? {
            Ok(conn) => {
                self.count_wait(route, &conn);
                Ok(Some(conn))
            }
            Err(CheckoutError::Unreachable { source, .. }) if source.server_is_gone() => {
                self.mark_gone(route.shard, &pool, &source);
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// A connection of `pool` for `route`: at once when one is idle and nobody waits
    /// (most checkouts), else after a wait in line, the client watched meanwhile.
    async fn checkout_on(
        &mut self,
        pool: &ServerPool,
        route: &Route,
        wanted: Wanted<'_>,
    ) -> Result<Result<PooledConn, CheckoutError>, FrontendError> {
        if self.listed.is_killed() {
            return Err(FrontendError::Killed);
        }
        match self.shared.pools.checkout_at_once(pool, route.shard, &route.tenant, wanted) {
            Ok(Some(conn)) => return Ok(Ok(conn)),
            Ok(None) => {}
            Err(e) => return Ok(Err(e)),
        }
        let checkout = pin!(self.shared.pools.checkout_from(pool, route.shard, &route.tenant, wanted));
        unless_client_leaves(&mut self.client, &self.listed, &self.cancel, checkout).await
    }

    /// A node that a checkout found gone (`BackendError::server_is_gone`) is down now,
    /// without waiting for its health checks to fail.
    fn mark_gone(&self, shard: ShardId, pool: &ServerPool, error: &BackendError) {
        let (host, port) = pool.host_port();
        tracing::warn!(shard, node = %format!("{host}:{port}"), %error, "shard node gone at checkout");
        let node = NodeKey { shard, host: host.to_string(), port };
        self.shared.health.record(&node, CheckOutcome::Refused);
    }

    /// The client is about to start a transaction on `route`: listed as waiting for a
    /// server, and held while an admin PAUSE covers its shard or tenant (at most
    /// `pause_hold_ms`). A held tenant's route is looked up again once released: the
    /// pause may have been a move's cutover, and then its transaction runs on the
    /// tenant's new shard.
    pub(super) async fn enter_transaction(&mut self, route: &mut Route) -> Result<(), FrontendError> {
        self.listed.enter(route.shard, route.tenant.as_ref().map_or(0, tenant_tag_of));
        if self.shared.pauses.is_clear() {
            return Ok(());
        }
        let listed = &self.listed;
        let hold = Duration::from_millis(self.shared.config.proxy.pause_hold_ms);
        let shard = route.shard;
        let on_hold =
            |held| listed.set_state(if held { ConnState::Paused } else { ConnState::Waiting }, Some(shard));
        let wait =
            pin!(self.shared.pauses.wait_open(shard, route.tenant.as_ref(), &self.database, hold, on_hold));
        let held = unless_client_leaves(&mut self.client, listed, &self.cancel, wait)
            .await?
            .map_err(FrontendError::Paused)?;
        if held && let Some(tenant) = &route.tenant {
            let placement =
                self.shared.router.placement(tenant).await.map_err(|e| FrontendError::Route(e.into()))?;
            if placement.shard != route.shard {
                tracing::info!(%tenant, from = route.shard, to = placement.shard, "held transaction follows its tenant's move");
                route.shard = placement.shard;
                self.listed.enter(route.shard, tenant_tag_of(tenant));
            }
            route.state = placement.state;
        }
        Ok(())
    }

    /// A connection to `route`'s shard's primary, and its pool. A primary found gone at
    /// checkout (nothing listens, or it is shutting down) is marked down at once, so that
    /// this request and the next ones wait for a new primary instead of failing.
    pub(super) async fn checkout_primary(
        &mut self,
        route: &Route,
        wanted: Wanted<'_>,
    ) -> Result<(ServerPool, PooledConn), FrontendError> {
        let mut tries = 0;
        loop {
            let pool = self.pool_of(route.shard).await?;
            match self.checkout_on(&pool, route, wanted).await? {
                Err(CheckoutError::Unreachable { source, .. }) if source.server_is_gone() && tries < 3 => {
                    tries += 1;
                    self.mark_gone(route.shard, &pool, &source);
                }
                other => {
                    let conn = other?;
                    self.count_wait(route, &conn);
                    return Ok((pool, conn));
                }
            }
        }
    }

    /// `shard`'s primary now; while it has none (a failover), waits up to
    /// `failover_hold_ms` for one (or the session's `statement_timeout`, when shorter:
    /// the client asked to wait no longer for any statement), as one of at most
    /// `max_held_requests`.
    async fn primary_or_wait(&mut self, shard: ShardId) -> Result<NodeConfig, FrontendError> {
        let shared = self.shared.clone();
        let configured = shared.config.health.failover_hold_ms;
        let hold_ms = self.settings.statement_timeout_ms().map_or(configured, |t| t.min(configured));
        let hold = Duration::from_millis(hold_ms);
        let started = Instant::now();
        let mut held = None;
        loop {
            let topology = shared.router.topology();
            let s = topology.shard(shard).ok_or(CheckoutError::UnknownShard { shard })?;
            let reason = match shared.health.primary_of(s) {
                PrimaryChoice::Node(node) => {
                    if held.is_some() {
                        self.listed.set_state(ConnState::Waiting, Some(shard));
                    }
                    return Ok(node);
                }
                PrimaryChoice::Holding(reason) => reason,
            };
            let left = hold.saturating_sub(started.elapsed());
            if held.is_none() {
                held = shared.health.hold();
                if held.is_some() {
                    // SHOW CLIENTS says so while it lasts.
                    self.listed.set_state(ConnState::Held, Some(shard));
                    tracing::debug!(shard, reason = %reason.describe(), "request held until the shard has a primary");
                }
            }
            if left.is_zero() || held.is_none() {
                let waited_ms = started.elapsed().as_millis() as u64;
                return Err(CheckoutError::NoPrimary { shard, reason: reason.describe(), waited_ms }.into());
            }
            // Looked at again at least every 100 ms: a change between the look above
            // and this wait is not missed for long.
            let changed = pin!(shared.health.changed_within(left.min(Duration::from_millis(100))));
            unless_client_leaves(&mut self.client, &self.listed, &self.cancel, changed).await?;
        }
    }
}
