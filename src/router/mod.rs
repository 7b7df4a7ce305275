//! Routing: finds the tenant of a transaction (session tenant, comment hint) and
//! turns it into a `Route` through the directory. The session carries the route out.

mod analyze;
mod classify;
mod effects;
mod facts;
mod kinds;
mod known_calls;
pub(crate) mod lexer;
mod other_sessions;
mod plain;
mod prepared_view;
mod protected;
mod proxy_call;
mod quick;
mod recent;
mod set_config;
mod template;
mod verbs;
mod words;

use std::sync::Arc;

/// The tenants a statement names, inline for the usual one or two (one per statement,
/// so no allocation for it).
pub type Named = smallvec::SmallVec<[TenantId; 2]>;

/// A statement's relations and the tenants confining it (see `Router::confinement`).
#[derive(Debug)]
pub struct Confinement {
    /// `None` when sqlparser could not tell.
    pub relations: Option<Vec<Box<str>>>,
    /// One per confining source; `None` for a source that gives no tenant.
    pub tenants: Vec<Option<TenantId>>,
}

pub use analyze::{Analysis, mentions_all_shards};
pub use classify::target_of;
pub use effects::{Effects, SessionRisk, Writes};
pub use kinds::{
    ALL_SHARDS, BadSetting, ConfigArg, PinReason, ROUTING_VERSION, SCATTER_PARAMETER, SessionChange,
    StatementKind, TARGET_PARAMETER,
};
pub use prepared_view::{ViewRef, rewrite as rewrite_prepared_view};
pub use protected::{Protected, ProtectedSet, READ_ONLY_SETTINGS};
pub use proxy_call::{CallArg, PidArg, ProxyCall, ProxySelect, Signal};
pub use quick::ShapeTiming;
pub use recent::RecentAnalyses;
pub use verbs::Verb;
pub use words::is_plain_setting;

/// The analysis with the default tenant parameter, for tests outside this layer.
#[cfg(test)]
pub fn analyze_for_tests(sql: &[u8]) -> Analysis {
    analyze::analyze(sql, "pgtenant.tenant_id", TenantKey::Bigint)
}

/// A statement's analysis, uncached: for the fuzz targets, and for the test that holds
/// it against PostgreSQL (`tests/it/classifier.rs`).
pub fn analyze_statement(sql: &[u8], tenant_param: &str, key: TenantKey) -> Analysis {
    analyze::analyze(sql, tenant_param, key)
}

use facts::{FactsCache, SqlFacts, TenantSource};

use crate::config::{Config, NoTenantPolicy};
use crate::directory::{
    Directory, DirectoryError, Placement, ShardId, TenantId, TenantKey, TenantState, Topology,
};
use crate::protocol;

/// Where a transaction runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub tenant: Option<TenantId>,
    pub shard: ShardId,
    /// What the tenant may do (always active without a tenant).
    pub state: TenantState,
    /// The shard's primary, or one of its replicas.
    pub target: NodeTarget,
}

/// Which node of a shard serves a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum NodeTarget {
    #[default]
    Primary,
    /// A healthy replica; with no replica healthy, the primary (`fallback`) or an error.
    Replica { fallback: bool },
}

/// Where a session's reads may go (`pgtenant.target`; see `config::ReadTarget`).
pub use crate::config::ReadTarget as TargetMode;

/// What the session says of a request's node, for `Router::route` to decide it: the
/// session's target mode, and whether the request runs in autocommit (no transaction
/// block open or begun, and the request whole: one routed by its first part goes to
/// the primary).
#[derive(Clone, Copy, Debug)]
pub struct Reach {
    pub mode: TargetMode,
    pub autocommit: bool,
}

impl Reach {
    /// The primary, whatever the statements.
    pub const PRIMARY: Reach = Reach { mode: TargetMode::Primary, autocommit: false };
}

impl TargetMode {
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "primary" | "read-write" => Some(Self::Primary),
            "prefer-replica" | "prefer-standby" => Some(Self::PreferReplica),
            "replica" | "standby" => Some(Self::Replica),
            _ => None,
        }
    }

    /// The node a request of `statements` goes to: a replica only for an autocommit
    /// request (`autocommit`: no transaction block is open or begun) whose every
    /// statement provably only reads and waits on nobody (`Analysis::cannot_wait`: one
    /// SELECT/VALUES/TABLE/WITH, no locking clause, no data-modifying CTE, no function
    /// outside the known built-ins). Everything else goes to the primary.
    pub fn target_for(self, statements: &[Arc<Analysis>], autocommit: bool) -> NodeTarget {
        let reads_only = || !statements.is_empty() && statements.iter().all(|a| a.effects().cannot_wait);
        match self {
            TargetMode::Primary => NodeTarget::Primary,
            _ if !autocommit || !reads_only() => NodeTarget::Primary,
            TargetMode::PreferReplica => NodeTarget::Replica { fallback: true },
            TargetMode::Replica => NodeTarget::Replica { fallback: false },
        }
    }
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
    #[error(
        "the statement names tenant {first} (shard {first_shard}) and tenant {second} (shard {second_shard}); \
         {}", if *.write { "a write cannot span shards" } else { "a read across shards belongs to the admin scatter-gather (all_shards)" }
    )]
    CrossShard { first: TenantId, first_shard: ShardId, second: TenantId, second_shard: ShardId, write: bool },
}

/// One session's last placement, so a session tenant is not looked up per transaction.
#[derive(Default)]
pub struct PlacementMemo(Option<(TenantId, u64, Placement, u32)>);

impl PlacementMemo {
    const MAX_USES: u32 = 1000;
}

/// Why a transaction went where it went (the debug log, the routing counters).
#[derive(Clone, Copy, Debug)]
enum Why {
    SessionTenant,
    NamedByStatement,
    NamedTenantsShareShard,
    NoTenantNeeded,
    NoTenantPolicyDefault,
}

impl Why {
    /// The source a route's tenant came from, as the metrics name it.
    const SOURCES: [&'static str; 4] = ["session", "statement", "no_tenant", "default"];

    fn source(self) -> usize {
        match self {
            Why::SessionTenant => 0,
            Why::NamedByStatement | Why::NamedTenantsShareShard => 1,
            Why::NoTenantNeeded => 2,
            Why::NoTenantPolicyDefault => 3,
        }
    }
}

/// Decides routes; shared by all sessions.
pub struct Router {
    directory: Arc<dyn Directory>,
    tenant_param: String,
    /// From the configuration; else the directory's lowest shard.
    default_shard: Option<ShardId>,
    no_tenant_policy: NoTenantPolicy,
    tenant_key: TenantKey,
    facts: FactsCache,
    /// Routes decided, by where their tenant came from (`Why::SOURCES`).
    routes: [std::sync::atomic::AtomicU64; 4],
}

impl Router {
    pub fn new(config: &Config, directory: Arc<dyn Directory>) -> Self {
        Self {
            directory,
            tenant_param: config.proxy.tenant_parameter.clone(),
            default_shard: config.default_shard(),
            no_tenant_policy: config.proxy.no_tenant_policy,
            tenant_key: config.proxy.tenant_key,
            facts: FactsCache::with_budget(
                config.proxy.parse_cache_size,
                config.proxy.parse_cache_bytes,
                &config.proxy.tenant_column,
            )
            .with_parse_limit(config.proxy.max_parsed_statement_bytes),
            routes: Default::default(),
        }
    }

    /// Routes decided so far, by the source of their tenant: session (the session's
    /// tenant), statement (a hint, the SQL or a parameter), no_tenant (work that needs
    /// none), default (the no-tenant policy's shard).
    pub fn routes_by_source(&self) -> [(&'static str, u64); 4] {
        std::array::from_fn(|i| (Why::SOURCES[i], self.routes[i].load(std::sync::atomic::Ordering::Relaxed)))
    }

    /// Statement shapes whose parse the cache spared, and those it did not have.
    pub fn parse_cache_hits_and_misses(&self) -> (u64, u64) {
        self.facts.hits_and_misses()
    }

    fn log_route(&self, route: &Route, why: Why) {
        self.routes[why.source()].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(tenant = ?route.tenant, shard = route.shard, state = ?route.state, ?why, "routed");
    }

    /// The tenant column's name, lowercase.
    pub(super) fn tenant_column(&self) -> &str {
        self.facts.tenant_column()
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
        Arc::new(analyze::analyze(sql, &self.tenant_param, self.tenant_key))
    }

    /// The analysis of a query string with what routing will ask of it worked out now
    /// (the parse above all), for a thread that may take its time. Routing parses a
    /// text that names the tenant column; `always_parse` when it may parse others too
    /// (a session without a tenant asks whether it touches tables; strict isolation
    /// asks which).
    pub fn analyze_fully(&self, sql: &[u8], always_parse: bool) -> Arc<Analysis> {
        let analysis = self.analyze(sql);
        if always_parse || analysis.mentions(self.tenant_column()) {
            self.facts_of(&analysis);
        }
        analysis.effects();
        analysis
    }

    /// Routes a transaction whose first request names `named` (hints, SQL literals,
    /// parameters) and consists of `statements`. A bound session tenant admits no
    /// other tenant; without one, the named tenants decide, and they must share a shard.
    /// The node: a replica only where `reach` allows one for `statements` (see
    /// `TargetMode::target_for`).
    pub async fn route(
        &self,
        session: Option<&TenantId>,
        named: &[TenantId],
        statements: &[Arc<Analysis>],
        memo: &mut PlacementMemo,
        reach: Reach,
    ) -> Result<Route, RouteError> {
        let mut route = self.route_shard(session, named, statements, memo).await?;
        route.target = reach.mode.target_for(statements, reach.autocommit);
        Ok(route)
    }

    /// `route`'s shard and tenant (the primary as its node).
    async fn route_shard(
        &self,
        session: Option<&TenantId>,
        named: &[TenantId],
        statements: &[Arc<Analysis>],
        memo: &mut PlacementMemo,
    ) -> Result<Route, RouteError> {
        Self::check_bound(session, named)?;
        if let Some(s) = session {
            let placement = self.placement_remembered(s, memo).await?;
            let route = Route {
                tenant: Some(s.clone()),
                shard: placement.shard,
                state: placement.state,
                target: NodeTarget::Primary,
            };
            self.log_route(&route, Why::SessionTenant);
            return Ok(route);
        }
        let Some(first) = named.first() else {
            let needs = || statements.iter().any(|a| self.needs_tenant(a));
            return self.route_tenant(None, needs).await;
        };
        let placement = self.placement(first).await?;
        let mut route = Route {
            tenant: Some(first.clone()),
            shard: placement.shard,
            state: placement.state,
            target: NodeTarget::Primary,
        };
        for other in named.iter().filter(|&t| t != first) {
            let p = self.placement(other).await?;
            if p.shard != route.shard {
                return Err(RouteError::CrossShard {
                    first: first.clone(),
                    first_shard: route.shard,
                    second: other.clone(),
                    second_shard: p.shard,
                    write: statements.iter().any(|a| a.effects().writes.shown()),
                });
            }
            // Several tenants: no single tenant GUC fits; the strictest state does.
            route.tenant = None;
            if !p.state.allows_writes() {
                route.state = p.state;
            }
        }
        let why = if route.tenant.is_some() { Why::NamedByStatement } else { Why::NamedTenantsShareShard };
        self.log_route(&route, why);
        Ok(route)
    }

    /// A bound session tenant admits no other tenant in what a statement names.
    pub fn check_bound(session: Option<&TenantId>, named: &[TenantId]) -> Result<(), RouteError> {
        match (session, named.iter().find(|&t| Some(t) != session)) {
            (Some(session), Some(other)) => {
                Err(RouteError::OtherTenant { session: session.clone(), named: other.clone() })
            }
            _ => Ok(()),
        }
    }

    /// Routes a known tenant, or no tenant when `needs_tenant` says the work needs none.
    pub async fn route_tenant(
        &self,
        tenant: Option<&TenantId>,
        needs_tenant: impl FnOnce() -> bool,
    ) -> Result<Route, RouteError> {
        if let Some(t) = tenant {
            let placement = self.placement(t).await?;
            return Ok(Route {
                tenant: Some(t.clone()),
                shard: placement.shard,
                state: placement.state,
                target: NodeTarget::Primary,
            });
        }
        let why = if !needs_tenant() {
            Why::NoTenantNeeded
        } else if self.no_tenant_policy == NoTenantPolicy::Default {
            Why::NoTenantPolicyDefault
        } else {
            return Err(RouteError::NoTenant { param: self.tenant_param.clone() });
        };
        let route = Route {
            tenant: None,
            shard: self.default_shard()?,
            state: TenantState::Active,
            target: NodeTarget::Primary,
        };
        self.log_route(&route, why);
        Ok(route)
    }

    /// Whether a statement reads or writes tables outside the system catalogs (and so
    /// needs a tenant). Statements sqlparser cannot parse count as needing one.
    pub fn needs_tenant(&self, analysis: &Analysis) -> bool {
        !analyze::needs_no_tenant(analysis) && self.facts_of(analysis).touches_tables
    }

    /// The tenants a statement's text names: its comment hint and the literals compared
    /// with (or inserted into) the tenant column.
    pub fn named_in_text(&self, analysis: &Analysis) -> Named {
        self.named(analysis, None)
    }

    /// The tenants a bound statement names: those of its text, and the parameters of the
    /// Bind (`bind_rest`, see `protocol::bind_param`) that meet the tenant column.
    pub fn named_in_bind(&self, analysis: &Analysis, bind_rest: &[u8]) -> Named {
        self.named(analysis, Some(bind_rest))
    }

    fn named(&self, analysis: &Analysis, bind_rest: Option<&[u8]>) -> Named {
        let mut named: Named = analysis.hint.iter().cloned().collect();
        if !analysis.mentions(self.facts.tenant_column()) {
            return named;
        }
        let facts = self.facts_of(analysis);
        for source in &facts.tenant_sources {
            if let Some(t) = self.resolve(source, analysis, bind_rest)
                && !named.contains(&t)
            {
                named.push(t);
            }
        }
        named
    }

    /// The tenant a source of `analysis`'s text (and Bind) gives, when it gives one.
    fn resolve(
        &self,
        source: &TenantSource,
        analysis: &Analysis,
        bind_rest: Option<&[u8]>,
    ) -> Option<TenantId> {
        let key = self.tenant_key;
        match source {
            TenantSource::Constant(text) => TenantId::parse(text, key),
            TenantSource::Literal { index, negative } => analysis
                .literals()
                .get(*index)
                .and_then(|r| analysis.sql.get(r.clone()))
                .and_then(|text| TenantId::parse(text, key))
                .map(|t| match t {
                    TenantId::Int(n) if *negative => TenantId::Int(-n),
                    other => other,
                }),
            TenantSource::Param(n) => bind_rest.and_then(|rest| param_value(rest, *n, key)),
        }
    }

    /// What strict isolation needs of a statement: the relations it names (`None` when
    /// sqlparser could not tell), and the tenants that confine it as a whole, each
    /// source resolved (`None` for a source that gives no tenant).
    pub fn confinement(&self, analysis: &Analysis, bind_rest: Option<&[u8]>) -> Confinement {
        let facts = self.facts_of(analysis);
        Confinement {
            relations: facts.parsed.then(|| facts.relations.clone()),
            tenants: facts.confining.iter().map(|s| self.resolve(s, analysis, bind_rest)).collect(),
        }
    }

    fn facts_of<'a>(&self, analysis: &'a Analysis) -> &'a SqlFacts {
        analysis.facts.get_or_init(|| {
            let (facts, literals) = self.facts.facts(&analysis.sql);
            // Already there when a template gave them: the same ranges.
            let _ = analysis.literals.set(literals.into());
            facts
        })
    }

    /// The placement of a session's tenant, remembered by the session while the
    /// directory's generation stays the same (and for a bounded number of uses, so the
    /// cache's TTL still has its say).
    pub async fn placement_remembered(
        &self,
        tenant: &TenantId,
        memo: &mut PlacementMemo,
    ) -> Result<Placement, DirectoryError> {
        let generation = self.directory.generation();
        if let Some((t, g, placement, uses)) = &mut memo.0
            && t == tenant
            && *g == generation
            && *uses < PlacementMemo::MAX_USES
        {
            *uses += 1;
            return Ok(*placement);
        }
        let placement = self.placement(tenant).await?;
        memo.0 = Some((tenant.clone(), generation, placement, 0));
        Ok(placement)
    }

    /// See `Directory::forget`.
    pub fn forget_tenant(&self, tenant: &TenantId) {
        self.directory.forget(tenant);
    }

    /// See `Directory::generation`.
    pub fn generation(&self) -> u64 {
        self.directory.generation()
    }

    /// Where a tenant lives: from memory when the directory knows, else from its source.
    pub async fn placement(&self, tenant: &TenantId) -> Result<Placement, DirectoryError> {
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

    /// Takes a reloaded file's shards, ranges and tenant map (a file directory).
    pub fn reload_layout(&self, config: &Config) -> Result<(), String> {
        self.directory.reload_from(config)
    }

    /// The directory's source and cache, for operators.
    pub fn directory_status(&self) -> crate::directory::DirectoryStatus {
        self.directory.status()
    }

    /// Whether `tenant`'s placement is answered from the directory's cache now.
    pub fn is_cached(&self, tenant: &TenantId) -> bool {
        self.directory.cached(tenant).is_some()
    }
}

/// A tenant key from a Bind parameter: text, binary int2/int4/int8 for bigint keys,
/// and binary text (its UTF-8 bytes) for text keys.
fn param_value(bind_rest: &[u8], n: u16, key: TenantKey) -> Option<TenantId> {
    match (protocol::bind_param(bind_rest, n)?, key) {
        ((false, Some(text)), _) | ((true, Some(text)), TenantKey::Text) => {
            TenantId::from_text_bytes(text, key)
        }
        ((true, Some(bytes)), TenantKey::Bigint) => protocol::binary_int(bytes).map(TenantId::Int),
        ((_, None), _) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::directory::StaticDirectory;

    fn router() -> Router {
        let config = crate::config::test_layout();
        let directory = Arc::new(StaticDirectory::from_config(&config).unwrap());
        Router::new(&config, directory)
    }

    #[test]
    fn every_statement_of_pgbench_s_tpcb_script_is_recognised_once_seen() {
        let r = router();
        let mut recent = RecentAnalyses::default();
        // Its delta's sign changes the tokens: eleven shapes with BEGIN, SELECT and END.
        let script = |delta: i64, id: u64| {
            [
                "BEGIN;".to_string(),
                format!("UPDATE pgbench_accounts SET abalance = abalance + {delta} WHERE aid = {id};"),
                format!("SELECT abalance FROM pgbench_accounts WHERE aid = {id};"),
                format!("UPDATE pgbench_tellers SET tbalance = tbalance + {delta} WHERE tid = {id};"),
                format!("UPDATE pgbench_branches SET bbalance = bbalance + {delta} WHERE bid = {id};"),
                format!(
                    "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES ({id}, {id}, {id}, {delta}, CURRENT_TIMESTAMP);"
                ),
                "END;".to_string(),
            ]
        };
        let mut seen = Vec::new();
        for (delta, id) in [(5, 1), (-5, 2)] {
            seen.extend(script(delta, id).map(|sql| recent.get_or_analyze(&r, sql.as_bytes())));
        }
        for (n, (delta, id)) in [(17, 3), (-4, 4), (-300, 5), (2, 6)].into_iter().enumerate() {
            let first = if delta > 0 { 0 } else { 7 };
            for (k, sql) in script(delta, id).iter().enumerate() {
                let analysis = recent.get_or_analyze(&r, sql.as_bytes());
                assert!(Arc::ptr_eq(&analysis, &seen[first + k]), "round {n}: {sql} analyzed again");
            }
        }
    }

    #[test]
    fn a_session_keeps_sixteen_short_texts_and_at_most_eight_of_the_longest() {
        let r = router();
        let mut recent = RecentAnalyses::default();
        let short = |n: usize| format!("select {n} from t{n}");
        for n in 0..17 {
            recent.get_or_analyze(&r, short(n).as_bytes());
        }
        assert!(!recent.holds(short(0).as_bytes()));
        assert!((1..17).all(|n| recent.holds(short(n).as_bytes())));
        // Texts of 4,096 bytes (the longest kept): eight of them, 32 KiB.
        let long = |n: usize| format!("select 1 from t{n} where note <> '{}'", "x".repeat(4096 - 33));
        for n in 0..10 {
            assert_eq!(long(n).len(), 4096);
            recent.get_or_analyze(&r, long(n).as_bytes());
        }
        assert!((2..10).all(|n| recent.holds(long(n).as_bytes())));
        assert!(!recent.holds(long(1).as_bytes()) && !recent.holds(short(16).as_bytes()));
    }

    #[test]
    fn long_texts_primed_for_a_request_are_all_found_until_it_is_handled() {
        let r = router();
        let mut recent = RecentAnalyses::default();
        let long =
            |n: usize| format!("select {n} from t where tenant_id = 7 and name <> '{}'", "x".repeat(5000));
        let (a, b) = (r.analyze_fully(long(1).as_bytes(), true), r.analyze_fully(long(2).as_bytes(), true));
        recent.prime(a.clone(), true);
        recent.prime(b.clone(), false);
        assert!(
            Arc::ptr_eq(&recent.get_or_analyze(&r, long(1).as_bytes()), &a),
            "both Parses of one request"
        );
        assert!(Arc::ptr_eq(&recent.get_or_analyze(&r, long(2).as_bytes()), &b));
        recent.prime(a.clone(), true);
        assert!(!recent.holds(long(2).as_bytes()), "a new request forgets the earlier ones");
        recent.forget_primed();
        assert!(!recent.holds(long(1).as_bytes()));
    }

    #[test]
    fn knows_which_statements_need_a_tenant() {
        let r = router();
        let needs = |sql: &str| r.needs_tenant(&r.analyze(sql.as_bytes()));
        assert!(!needs("SELECT 1"));
        assert!(!needs("select version(), current_setting('server_version')"));
        assert!(!needs("SELECT oid, typname FROM pg_type"));
        assert!(!needs("select * from pg_catalog.pg_class c join information_schema.tables t on true"));
        assert!(!needs("SHOW TimeZone"));
        assert!(!needs("SET extra_float_digits = 3"));
        assert!(needs("SELECT * FROM accounts WHERE id = 1"));
        assert!(needs("INSERT INTO public.accounts VALUES (1)"));
        assert!(needs("this is not sql"));
    }

    #[test]
    fn names_tenants_from_hints_literals_and_bind_parameters() {
        let r = router();
        let a =
            r.analyze(b"/* pgtenant.tenant_id=5 */ select * from t where tenant_id = '6' or tenant_id = -7");
        assert_eq!(r.named_in_text(&a).to_vec(), vec![TenantId::Int(5), TenantId::Int(6), TenantId::Int(-7)]);
        let a = r.analyze(b"select * from t where TENANT_ID = $2 and id = $1");
        assert!(r.named_in_text(&a).is_empty());
        // Bind remainder: one format (binary) for both values: int4 1, int2 1500.
        let mut rest = vec![0, 1, 0, 1, 0, 2];
        rest.extend_from_slice(&4i32.to_be_bytes());
        rest.extend_from_slice(&1i32.to_be_bytes());
        rest.extend_from_slice(&2i32.to_be_bytes());
        rest.extend_from_slice(&1500i16.to_be_bytes());
        rest.extend_from_slice(&[0, 0]);
        assert_eq!(r.named_in_bind(&a, &rest).to_vec(), vec![TenantId::Int(1500)]);
        let unrelated = r.analyze(b"select abalance from pgbench_accounts where aid = $1");
        assert!(r.named_in_bind(&unrelated, &rest).is_empty());
    }

    #[test]
    fn a_text_differing_only_in_literals_shares_facts_and_names_its_own_tenant() {
        let r = router();
        let mut recent = RecentAnalyses::default();
        let a = recent.get_or_analyze(&r, b"select * from t where tenant_id = 5 and name = 'x'");
        assert_eq!(r.named_in_text(&a).to_vec(), vec![TenantId::Int(5)]);
        let b = recent.get_or_analyze(&r, b"select * from t where tenant_id = 1500 and name = 'y'");
        assert_eq!(r.named_in_text(&b).to_vec(), vec![TenantId::Int(1500)]);
        assert!(Arc::ptr_eq(a.facts.get().unwrap(), b.facts.get().unwrap()), "one parse for both");
    }

    #[test]
    fn a_script_looked_up_in_its_order_names_each_rounds_own_tenant() {
        let r = router();
        let mut recent = RecentAnalyses::default();
        let script = |tenant: i64, id: u64| {
            [
                format!("select * from t where tenant_id = {tenant} and id = {id}"),
                format!("select abalance from accounts where aid = {id}"),
                "END".to_string(),
            ]
        };
        let first = script(5, 1).map(|sql| recent.get_or_analyze(&r, sql.as_bytes()));
        for (tenant, id) in [(1500, 2), (7, 3), (-2, 4), (5, 5)] {
            let [with_tenant, without, end] =
                script(tenant, id).map(|sql| recent.get_or_analyze(&r, sql.as_bytes()));
            // The entry tried first (the template of the round before) names another
            // tenant: the analysis is the text's own.
            assert_eq!(r.named_in_text(&with_tenant).to_vec(), vec![TenantId::Int(tenant)]);
            assert!(Arc::ptr_eq(&without, &first[1]) && Arc::ptr_eq(&end, &first[2]), "round of {tenant}");
        }
    }

    #[test]
    fn a_script_longer_than_the_kept_texts_is_answered_by_its_own_shapes() {
        let r = router();
        let mut recent = RecentAnalyses::default();
        // Twenty shapes in turn, more than are kept: a lookup hinted at an entry that has
        // gone since, or at another shape's, still answers with the text's own shape.
        for round in 0..3u64 {
            for k in 0..20 {
                let sql = format!("select x from t{k} where id = {}", round * 100 + k);
                let analysis = recent.get_or_analyze(&r, sql.as_bytes());
                assert!(
                    analysis.sql.starts_with(&format!("select x from t{k} where")),
                    "{sql}: {}",
                    analysis.sql
                );
            }
        }
    }

    #[test]
    fn a_text_differing_only_in_literals_without_the_tenant_column_is_its_templates_analysis() {
        let r = router();
        let mut recent = RecentAnalyses::default();
        let a = recent.get_or_analyze(&r, b"select abalance from accounts where aid = 5");
        let b = recent.get_or_analyze(&r, b"select abalance from accounts where aid = 4711");
        assert!(Arc::ptr_eq(&a, &b), "nothing of it depends on the values");
        assert!(r.named_in_text(&b).is_empty());
        // A string with bytes that are not UTF-8 is no literal change; analyzed on its own.
        let c = recent.get_or_analyze(&r, b"select abalance from accounts where name = 'x'");
        let d = recent.get_or_analyze(&r, b"select abalance from accounts where name = '\xff'");
        assert!(!Arc::ptr_eq(&c, &d));
        let e = recent.get_or_analyze(&r, b"select abalance from accounts where name = 'y'");
        assert!(Arc::ptr_eq(&c, &e) || Arc::ptr_eq(&d, &e));
    }

    #[tokio::test]
    async fn named_tenants_route_and_must_share_a_shard() {
        let r = router();
        let read = r.analyze(b"select 1 from t");
        let write = r.analyze(b"delete from t");
        let mut memo = PlacementMemo::default();
        let route = r
            .route(None, &[TenantId::Int(1500)], std::slice::from_ref(&read), &mut memo, Reach::PRIMARY)
            .await
            .unwrap();
        assert_eq!((route.tenant, route.shard), (Some(TenantId::Int(1500)), 2));
        let route = r
            .route(
                None,
                &[TenantId::Int(3), TenantId::Int(4)],
                std::slice::from_ref(&read),
                &mut memo,
                Reach::PRIMARY,
            )
            .await
            .unwrap();
        assert_eq!((route.tenant, route.shard), (None, 1), "two tenants of one shard: no single tenant GUC");
        let cross = r
            .route(
                None,
                &[TenantId::Int(3), TenantId::Int(1500)],
                std::slice::from_ref(&read),
                &mut memo,
                Reach::PRIMARY,
            )
            .await
            .unwrap_err();
        assert!(matches!(cross, RouteError::CrossShard { write: false, .. }));
        assert!(cross.to_string().contains("scatter-gather"), "{cross}");
        let cross = r
            .route(
                None,
                &[TenantId::Int(3), TenantId::Int(1500)],
                std::slice::from_ref(&write),
                &mut memo,
                Reach::PRIMARY,
            )
            .await
            .unwrap_err();
        assert!(matches!(cross, RouteError::CrossShard { write: true, .. }));
        let other = r
            .route(
                Some(&TenantId::Int(3)),
                &[TenantId::Int(4)],
                std::slice::from_ref(&read),
                &mut memo,
                Reach::PRIMARY,
            )
            .await
            .unwrap_err();
        assert_eq!(other, RouteError::OtherTenant { session: TenantId::Int(3), named: TenantId::Int(4) });
    }
}
