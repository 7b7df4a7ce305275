//! PAUSE and RESUME (admin console; tenant moves later): a pause of everything, of a
//! shard or of one tenant stops new transactions in its scope from getting a server,
//! while those already running finish; the PAUSE answers once none is left.
//!
//! The handshake without a lock on the data path: a client about to start a
//! transaction first marks itself waiting in the connection registry (a sequentially
//! consistent store), then reads the board's pause count. A PAUSE raises the count,
//! then reads the registry. Either the client sees the count (and checks its scope
//! under the lock, where it finds the pause), or the PAUSE sees the client waiting
//! (and waits for it to finish). Resumes, timeouts and a RESUME racing a PAUSE only
//! ever remove the pause and wake whoever waits: nothing can stay held.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::directory::{ShardId, TenantId};
use crate::observe::conns::{ConnRegistry, ConnState};

/// What a pause covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PauseScope {
    All,
    Shard(ShardId),
    Tenant(TenantId),
    /// The database clients asked for (PgBouncer's `PAUSE db`), on every shard.
    Database(String),
}

impl PauseScope {
    fn covers(&self, shard: ShardId, tenant: Option<&TenantId>, database: &str) -> bool {
        match self {
            PauseScope::All => true,
            PauseScope::Shard(s) => *s == shard,
            PauseScope::Tenant(t) => tenant == Some(t),
            PauseScope::Database(d) => d == database,
        }
    }

    /// Whether a client listed with `shard` and `tenant_tag` may be running work of
    /// this scope (a tag shared by two tenants counts for both: a PAUSE waits longer,
    /// never less).
    fn may_cover(&self, shard: Option<u32>, tenant_tag: u64, database: &str) -> bool {
        match self {
            // Work without a shard is the admin console's own.
            PauseScope::All => shard.is_some(),
            PauseScope::Shard(s) => shard == Some(u32::from(*s)),
            PauseScope::Tenant(t) => tenant_tag == tenant_tag_of(t),
            PauseScope::Database(d) => shard.is_some() && d == database,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            PauseScope::All => "every shard".into(),
            PauseScope::Shard(s) => format!("shard {s}"),
            PauseScope::Tenant(t) => format!("tenant {t}"),
            PauseScope::Database(d) => format!("database \"{d}\""),
        }
    }
}

/// A tenant's tag in the connection registry (never 0, which means none). Equal
/// tenants have equal tags; a bigint key is mixed as a number (each transaction's
/// checkout computes it: writing the number out as text to hash it cost more).
pub fn tenant_tag_of(tenant: &TenantId) -> u64 {
    let hash = match tenant {
        // An odd multiplier after the xor: distinct keys, distinct products (the `| 1`
        // below may pair two of them, as it did the hashes of texts).
        TenantId::Int(n) => (*n as u64 ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(0xbf58_476d_1ce4_e5b9),
        TenantId::Text(s) => s
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)),
    };
    hash | 1
}

/// How a PAUSE ended.
#[derive(Debug, PartialEq, Eq)]
pub enum PauseOutcome {
    /// No transaction of the scope is running; the scope stays paused.
    Drained,
    /// A RESUME came first.
    Resumed,
    /// Still running after the timeout: the pause was lifted again.
    TimedOut { running: usize },
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("{scope} is paused (admin PAUSE) and was not resumed within {waited_ms} ms")]
pub struct StillPaused {
    pub scope: String,
    pub waited_ms: u64,
}

pub struct PauseBoard {
    /// How many pauses are in force: 0 lets every client through without a lock.
    count: AtomicUsize,
    pauses: Mutex<Vec<PauseScope>>,
    /// Databases new clients may not log in to (PgBouncer's DISABLE db); their
    /// connected clients go on.
    disabled: Mutex<std::collections::BTreeSet<String>>,
    /// Bumped at every change, to wake held clients and waiting PAUSEs.
    changes: watch::Sender<u64>,
}

impl Default for PauseBoard {
    fn default() -> Self {
        Self {
            count: AtomicUsize::new(0),
            pauses: Mutex::new(Vec::new()),
            disabled: Mutex::new(Default::default()),
            changes: watch::Sender::new(0),
        }
    }
}

impl PauseBoard {
    /// Nothing is paused (checked by every transaction; one atomic load).
    #[inline]
    pub fn is_clear(&self) -> bool {
        self.count.load(Ordering::SeqCst) == 0
    }

    pub fn paused(&self) -> Vec<PauseScope> {
        self.lock().clone()
    }

    /// Pauses `scope` (again: nothing changes). The caller then waits in `drain`.
    pub fn pause(&self, scope: PauseScope) {
        let mut pauses = self.lock();
        if !pauses.contains(&scope) {
            pauses.push(scope);
            self.count.store(pauses.len(), Ordering::SeqCst);
        }
        drop(pauses);
        self.changes.send_modify(|v| *v += 1);
    }

    /// Lifts the pause of `scope` (`All`: every pause); false when none was in force.
    pub fn resume(&self, scope: &PauseScope) -> bool {
        let mut pauses = self.lock();
        let before = pauses.len();
        if *scope == PauseScope::All {
            pauses.clear();
        } else {
            pauses.retain(|p| p != scope);
        }
        let lifted = pauses.len() != before;
        self.count.store(pauses.len(), Ordering::SeqCst);
        drop(pauses);
        self.changes.send_modify(|v| *v += 1);
        lifted
    }

    /// Waits until no client of `scope` is running or about to run a transaction
    /// (`clients` as listed), the scope is resumed, or `timeout` passes (then the
    /// pause is lifted: a PAUSE with a timeout never leaves its scope held).
    pub async fn drain(
        &self,
        scope: &PauseScope,
        clients: &ConnRegistry,
        timeout: Option<Duration>,
    ) -> PauseOutcome {
        let started = Instant::now();
        let mut changes = self.changes.subscribe();
        loop {
            if !self.lock().contains(scope) {
                return PauseOutcome::Resumed;
            }
            let running = clients.count(|state, shard, tenant_tag, database| {
                // A request held for a failover runs once the shard has a primary.
                matches!(state, ConnState::Active | ConnState::Waiting | ConnState::Held)
                    && scope.may_cover(shard, tenant_tag, database)
            });
            if running == 0 {
                return PauseOutcome::Drained;
            }
            if timeout.is_some_and(|t| started.elapsed() >= t) {
                self.resume(scope);
                return PauseOutcome::TimedOut { running };
            }
            // Transactions end without telling the board: look again soon, or at once
            // when a RESUME comes.
            let _ = tokio::time::timeout(Duration::from_millis(10), changes.changed()).await;
        }
    }

    /// Holds a client whose transaction on `shard` for `tenant` a pause covers, until
    /// it is lifted or `within` passes; `Ok(true)` when it was held (its route may have
    /// changed meanwhile: a tenant move's cutover). Called only when `is_clear` said no.
    pub async fn wait_open(
        &self,
        shard: ShardId,
        tenant: Option<&TenantId>,
        database: &str,
        within: Duration,
        on_hold: impl Fn(bool),
    ) -> Result<bool, StillPaused> {
        let started = Instant::now();
        let mut changes = self.changes.subscribe();
        let mut held = false;
        loop {
            let covering = self.lock().iter().find(|p| p.covers(shard, tenant, database)).cloned();
            let Some(scope) = covering else {
                if held {
                    on_hold(false);
                }
                return Ok(held);
            };
            if !held {
                held = true;
                on_hold(true);
            }
            let left = within.saturating_sub(started.elapsed());
            if left.is_zero() || tokio::time::timeout(left, changes.changed()).await.is_err() {
                on_hold(false);
                return Err(StillPaused { scope: scope.describe(), waited_ms: within.as_millis() as u64 });
            }
        }
    }

    /// DISABLE (`true`) or ENABLE (`false`) logins to `database`; whether that changed it.
    pub fn set_disabled(&self, database: &str, disabled: bool) -> bool {
        let mut set = self.disabled.lock().unwrap_or_else(|p| p.into_inner());
        if disabled { set.insert(database.to_string()) } else { set.remove(database) }
    }

    /// Whether new clients of `database` are refused (checked once per login).
    pub fn is_disabled(&self, database: &str) -> bool {
        self.disabled.lock().unwrap_or_else(|p| p.into_inner()).contains(database)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<PauseScope>> {
        self.pauses.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::observe::conns::ConnInfo;

    fn info() -> ConnInfo {
        ConnInfo {
            user: "app".into(),
            database: "app".into(),
            addr: "127.0.0.1".into(),
            port: 1,
            tls: false,
            application_name: String::new(),
            connect_unix_ms: 0,
            pid: 1,
        }
    }

    #[test]
    fn distinct_tenants_have_distinct_nonzero_tags() {
        let ints = (-500..500).chain([i64::MIN, i64::MAX]).map(|n| tenant_tag_of(&TenantId::Int(n)));
        let texts = ["acme", "7", ""].map(|t| tenant_tag_of(&TenantId::Text(t.into())));
        let mut tags: Vec<u64> = ints.chain(texts).collect();
        assert!(tags.iter().all(|&t| t != 0));
        let count = tags.len();
        tags.sort_unstable();
        tags.dedup();
        assert_eq!(tags.len(), count);
    }

    #[tokio::test]
    async fn a_pause_waits_for_running_work_of_its_scope_only_and_a_resume_releases_held_clients() {
        let board = Arc::new(PauseBoard::default());
        let clients = Arc::new(ConnRegistry::default());
        let seven = TenantId::Int(7);
        let running_7 = clients.register(info(), None);
        running_7.enter(1, tenant_tag_of(&seven));
        running_7.set_state(ConnState::Active, Some(1));
        let running_8 = clients.register(info(), None);
        running_8.enter(1, tenant_tag_of(&TenantId::Int(8)));
        running_8.set_state(ConnState::Active, Some(1));

        let scope = PauseScope::Tenant(seven.clone());
        board.pause(scope.clone());
        assert!(!board.is_clear());
        let timed = board.drain(&scope, &clients, Some(Duration::from_millis(50))).await;
        assert_eq!(
            timed,
            PauseOutcome::TimedOut { running: 1 },
            "tenant 7 still runs; tenant 8 does not count"
        );
        assert!(board.is_clear(), "a timed-out pause is lifted");

        board.pause(scope.clone());
        running_7.set_state(ConnState::Idle, None);
        assert_eq!(board.drain(&scope, &clients, None).await, PauseOutcome::Drained);
        // A new transaction of tenant 7 is held; tenant 8's goes through.
        assert!(
            board
                .wait_open(1, Some(&TenantId::Int(8)), "app", Duration::from_millis(10), |_| {})
                .await
                .is_ok()
        );
        let held = {
            let board = board.clone();
            tokio::spawn(async move {
                board.wait_open(1, Some(&TenantId::Int(7)), "app", Duration::from_secs(5), |_| {}).await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!held.is_finished(), "held while paused");
        assert!(board.resume(&scope));
        assert_eq!(held.await.unwrap(), Ok(true), "released by the RESUME");
        assert!(!board.resume(&scope), "resuming twice is harmless");
    }

    #[tokio::test]
    async fn a_resume_racing_a_pause_ends_it_and_a_hold_is_bounded() {
        let board = Arc::new(PauseBoard::default());
        let clients = Arc::new(ConnRegistry::default());
        let busy = clients.register(info(), None);
        busy.enter(2, 0);
        board.pause(PauseScope::Shard(2));
        let pausing = {
            let (board, clients) = (board.clone(), clients.clone());
            tokio::spawn(async move { board.drain(&PauseScope::Shard(2), &clients, None).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        board.resume(&PauseScope::All);
        assert_eq!(pausing.await.unwrap(), PauseOutcome::Resumed);
        board.pause(PauseScope::All);
        let held = board.wait_open(1, None, "app", Duration::from_millis(30), |_| {}).await;
        assert!(held.is_err(), "held no longer than asked");
    }
}
