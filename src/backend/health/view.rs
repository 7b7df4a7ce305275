//! What the checkers last saw of every shard node, and which node each shard's work
//! goes to now. Sessions read it once per checkout through `primary_of` (a read lock
//! and a few comparisons); its version changes only when a node's state, role or
//! timeline does, so sessions keep their pool handles until then.

use std::collections::{HashMap, VecDeque};
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use crate::config::{HealthConfig, NodeConfig};
use crate::directory::{Shard, ShardId};

/// A node of a shard, as the checks know it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NodeKey {
    pub shard: ShardId,
    pub host: String,
    pub port: u16,
}

impl NodeKey {
    pub fn of(shard: ShardId, node: &NodeConfig) -> Self {
        Self { shard, host: node.host.clone(), port: node.port }
    }
}

/// What a node said it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObservedRole {
    Primary,
    Replica,
}

/// A node's state, as its checks have gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeState {
    /// Not checked yet, or its checks fail for a reason other than reaching it (the
    /// checker's credentials): its configured role stands.
    Unchecked,
    /// It answered its last check (`failing` checks have failed since, fewer than
    /// `fail_after`).
    Up { role: ObservedRole, timeline: u32, lsn: u64, failing: u32 },
    /// It refused connections, or failed `fail_after` checks in a row.
    Down,
}

/// Where a shard's work goes now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrimaryChoice {
    Node(NodeConfig),
    /// No node can take writes now (the primary is down and nothing was promoted, or
    /// two nodes claim the same newest timeline): requests wait for a change.
    Holding(HoldReason),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldReason {
    NoPrimary,
    TwoPrimaries { timeline: u32 },
}

impl HoldReason {
    pub fn describe(self) -> String {
        match self {
            HoldReason::NoPrimary => "its primary is down and no replica has been promoted".into(),
            HoldReason::TwoPrimaries { timeline } => {
                format!("two nodes claim to be its primary on timeline {timeline}")
            }
        }
    }
}

/// Whether a node's change of state matters to routing: its state, role or timeline
/// (not its WAL position or a failed check or two).
pub fn is_notable(before: NodeState, after: NodeState) -> bool {
    match (before, after) {
        (NodeState::Up { role: r1, timeline: t1, .. }, NodeState::Up { role: r2, timeline: t2, .. }) => {
            r1 != r2 || t1 != t2
        }
        (a, b) => a != b,
    }
}

/// A checked node's last observation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    pub role: ObservedRole,
    pub timeline: u32,
    /// Replayed (a replica) or written (a primary) WAL.
    pub lsn: u64,
    /// WAL received (a replica; what it would replay once promoted), else `lsn`.
    pub received: u64,
    /// On a primary: the newest WAL position a synchronous standby confirmed, when the
    /// checker may see it (`pg_stat_replication`).
    pub sync_confirmed: Option<u64>,
}

impl Observation {
    pub fn new(role: ObservedRole, timeline: u32, lsn: u64) -> Self {
        Self { role, timeline, lsn, received: lsn, sync_confirmed: None }
    }
}

/// How a check went.
pub enum CheckOutcome {
    Answered(Observation),
    /// Connection refused: down at once.
    Refused,
    /// Timed out, or the connection broke: down after `fail_after` in a row.
    Failed,
    /// Reached but not checked (authentication, permissions).
    Unchecked,
}

#[derive(Default)]
struct Nodes {
    states: HashMap<NodeKey, NodeState>,
    /// When each node last answered (ms).
    answered_ms: HashMap<NodeKey, u64>,
    shards: HashMap<ShardId, ShardWal>,
}

/// What the checks know of a shard's WAL as a whole.
#[derive(Default)]
struct ShardWal {
    /// The newest timeline its primary was seen on: a node that claims to be primary
    /// on an older one (an old primary started again after a failover) is never
    /// written to.
    newest_timeline: u32,
    /// When the primary on that timeline was seen to have written past each position
    /// (oldest first): a replica's lag in time is how long ago the primary first went
    /// past what the replica has replayed, so an idle primary leaves its replicas at 0.
    advances: VecDeque<(u64, u64)>,
    /// The primary's last check, advanced or not: (when it began, its position).
    last_seen: (u64, u64),
    /// The newest position a synchronous standby confirmed on that timeline.
    sync_confirmed: u64,
}

/// Positions of the primary kept for replica lag: a minute of checks at the default
/// interval, more than any sensible lag bound.
const MAX_ADVANCES: usize = 64;

impl ShardWal {
    fn primary_seen(&mut self, at_ms: u64, o: &Observation) {
        if o.timeline > self.newest_timeline {
            *self = ShardWal { newest_timeline: o.timeline, ..ShardWal::default() };
        }
        if o.timeline < self.newest_timeline {
            return;
        }
        if self.advances.back().is_none_or(|&(_, lsn)| o.lsn > lsn) {
            if self.advances.len() == MAX_ADVANCES {
                self.advances.pop_front();
            }
            self.advances.push_back((at_ms, o.lsn));
        }
        self.last_seen = (at_ms, o.lsn);
        self.sync_confirmed = self.sync_confirmed.max(o.sync_confirmed.unwrap_or(0));
    }

    /// Whether a replica that has replayed `replayed` holds everything the primary had
    /// committed by `since_ms`: the primary's position as a check that began at or
    /// after `since_ms` read it (the first such), which that commit cannot be past.
    /// `false` until the primary was checked after `since_ms`.
    fn replayed_since(&self, replayed: u64, since_ms: u64) -> bool {
        let first_after = self.advances.iter().find(|&&(at, _)| at >= since_ms).copied();
        let position = first_after.or((self.last_seen.0 >= since_ms).then_some(self.last_seen));
        position.is_some_and(|(_, lsn)| replayed >= lsn)
    }

    /// How far behind a replica that had replayed `replayed` when it was checked at
    /// `seen_ms` was then.
    fn lag_ms(&self, replayed: u64, seen_ms: u64) -> u64 {
        match self.advances.iter().find(|&&(_, lsn)| lsn > replayed) {
            Some(&(at_ms, _)) => seen_ms.saturating_sub(at_ms),
            None => 0,
        }
    }
}

/// How far a replica may be behind and still take reads.
#[derive(Clone, Copy, Debug)]
pub struct LagBound {
    pub bytes: u64,
    pub ms: u64,
}

impl LagBound {
    pub fn of(health: &HealthConfig) -> Self {
        Self { bytes: health.max_replica_lag_bytes, ms: health.max_replica_lag_ms }
    }
}

pub struct HealthView {
    nodes: RwLock<Nodes>,
    /// Read on every checkout (an atomic, not the channel's lock); `changes` wakes
    /// requests waiting for a primary.
    version: AtomicU64,
    changes: watch::Sender<u64>,
    fail_after: u32,
    held: AtomicUsize,
    max_held: usize,
    /// Wakes the checkers when the first request starts to wait for a primary, so that
    /// they poll at the short interval from then on, not after their current pause.
    hold_began: tokio::sync::Notify,
    /// Spreads reads over a shard's healthy replicas in turn.
    next_replica: AtomicUsize,
    /// When two primaries were last logged (ms), so that every held request does not.
    split_logged_ms: AtomicU64,
}

/// A request waiting for a shard to get a primary; counted while it lives.
pub struct HeldRequest<'a>(&'a HealthView);

impl Drop for HeldRequest<'_> {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::Relaxed);
    }
}

impl HealthView {
    pub fn new(fail_after: u32, max_held: usize) -> Self {
        Self {
            nodes: RwLock::default(),
            version: AtomicU64::new(0),
            changes: watch::Sender::new(0),
            fail_after: fail_after.max(1),
            held: AtomicUsize::new(0),
            max_held,
            hold_began: tokio::sync::Notify::new(),
            next_replica: AtomicUsize::new(0),
            split_logged_ms: AtomicU64::new(0),
        }
    }

    /// Changes whenever a node's state, role or timeline changes.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    pub fn state(&self, key: &NodeKey) -> NodeState {
        self.read().states.get(key).copied().unwrap_or(NodeState::Unchecked)
    }

    /// Now, on the clock the checks stamp positions with: a session's write mark for
    /// `replica_of`'s read-your-writes.
    pub fn clock_ms() -> u64 {
        crate::backend::coarse_clock::now_ms()
    }

    /// Notes how a node's check went; returns its state before and after.
    pub fn record(&self, key: &NodeKey, outcome: CheckOutcome) -> (NodeState, NodeState) {
        self.record_at(key, outcome, crate::backend::coarse_clock::now_ms())
    }

    /// The same for a check that began at `began_ms` (`coarse_clock::now_ms`).
    pub fn record_checked(
        &self,
        key: &NodeKey,
        outcome: CheckOutcome,
        began_ms: u64,
    ) -> (NodeState, NodeState) {
        self.record_at(key, outcome, began_ms)
    }

    fn record_at(&self, key: &NodeKey, outcome: CheckOutcome, now_ms: u64) -> (NodeState, NodeState) {
        let mut nodes = self.nodes.write().unwrap_or_else(|e| e.into_inner());
        let before = nodes.states.get(key).copied().unwrap_or(NodeState::Unchecked);
        let after = match (outcome, before) {
            (CheckOutcome::Answered(o), _) => {
                if o.role == ObservedRole::Primary {
                    nodes.shards.entry(key.shard).or_default().primary_seen(now_ms, &o);
                }
                nodes.answered_ms.insert(key.clone(), now_ms);
                NodeState::Up { role: o.role, timeline: o.timeline, lsn: o.lsn, failing: 0 }
            }
            (CheckOutcome::Refused, _) => NodeState::Down,
            (CheckOutcome::Failed, NodeState::Up { role, timeline, lsn, failing }) => {
                if failing + 1 >= self.fail_after {
                    NodeState::Down
                } else {
                    NodeState::Up { role, timeline, lsn, failing: failing + 1 }
                }
            }
            (CheckOutcome::Failed, NodeState::Unchecked) if self.fail_after <= 1 => NodeState::Down,
            (CheckOutcome::Failed, state) => state,
            (CheckOutcome::Unchecked, _) => NodeState::Unchecked,
        };
        nodes.states.insert(key.clone(), after);
        drop(nodes);
        if is_notable(before, after) {
            let version = self.version.fetch_add(1, Ordering::AcqRel) + 1;
            self.changes.send_replace(version);
        }
        (before, after)
    }

    /// Forgets nodes that left the topology.
    pub fn retain(&self, keep: impl Fn(&NodeKey) -> bool) {
        let mut nodes = self.nodes.write().unwrap_or_else(|e| e.into_inner());
        nodes.states.retain(|k, _| keep(k));
        nodes.answered_ms.retain(|k, _| keep(k));
    }

    /// The node `shard`'s work goes to now: the node answering as primary on the
    /// newest timeline; before any check says otherwise, the configured primary.
    pub fn primary_of(&self, shard: &Shard) -> PrimaryChoice {
        let nodes = self.read();
        let floor = nodes.shards.get(&shard.id).map_or(0, |w| w.newest_timeline);
        let mut best: Option<(u32, &NodeConfig)> = None;
        let mut tied = false;
        for node in &shard.nodes {
            let key = NodeKey::of(shard.id, node);
            if let Some(NodeState::Up { role: ObservedRole::Primary, timeline, .. }) = nodes.states.get(&key)
            {
                if *timeline < floor {
                    continue;
                }
                match best {
                    Some((t, _)) if t > *timeline => {}
                    Some((t, _)) if t == *timeline => tied = true,
                    _ => {
                        best = Some((*timeline, node));
                        tied = false;
                    }
                }
            }
        }
        match best {
            Some((timeline, _)) if tied => {
                let now = crate::backend::coarse_clock::now_ms();
                let last = self.split_logged_ms.load(Ordering::Relaxed);
                if now.saturating_sub(last) >= 1000
                    && self.split_logged_ms.swap(now, Ordering::Relaxed) == last
                {
                    tracing::error!(
                        shard = shard.id,
                        timeline,
                        "two nodes claim to be the primary: writes are held"
                    );
                }
                PrimaryChoice::Holding(HoldReason::TwoPrimaries { timeline })
            }
            Some((_, node)) => PrimaryChoice::Node(node.clone()),
            None => match shard.primary() {
                Some(node)
                    if nodes
                        .states
                        .get(&NodeKey::of(shard.id, node))
                        .is_none_or(|s| *s == NodeState::Unchecked) =>
                {
                    PrimaryChoice::Node(node.clone())
                }
                _ => PrimaryChoice::Holding(HoldReason::NoPrimary),
            },
        }
    }

    /// A replica of `shard` to read from: answering as a replica, at most `bound.bytes`
    /// of WAL behind the most advanced node of the shard (its primary while that is
    /// up) and at most `bound.ms` behind its primary in time, taken in turn. The time
    /// is how long ago the primary first went past what the replica had replayed when
    /// last checked, so an idle primary leaves its replicas caught up. With `wrote_ms`
    /// (read-your-writes: the session's last write committed then), only a replica that
    /// has replayed everything the primary had committed by then.
    pub fn replica_of(&self, shard: &Shard, bound: LagBound, wrote_ms: Option<u64>) -> Option<NodeConfig> {
        let nodes = self.read();
        let up: Vec<(&NodeConfig, ObservedRole, u64, Option<u64>)> = shard
            .nodes
            .iter()
            .filter_map(|node| {
                let key = NodeKey::of(shard.id, node);
                match nodes.states.get(&key) {
                    Some(NodeState::Up { role, lsn, failing: 0, .. }) => {
                        Some((node, *role, *lsn, nodes.answered_ms.get(&key).copied()))
                    }
                    _ => None,
                }
            })
            .collect();
        let newest = up.iter().map(|(_, _, lsn, _)| *lsn).max()?;
        let wal = nodes.shards.get(&shard.id);
        let fresh: Vec<&NodeConfig> = up
            .iter()
            .filter(|(_, role, lsn, answered_ms)| {
                let lag_ms = match (wal, answered_ms) {
                    (Some(wal), Some(at)) => wal.lag_ms(*lsn, *at),
                    _ => 0,
                };
                *role == ObservedRole::Replica
                    && newest.saturating_sub(*lsn) <= bound.bytes
                    && lag_ms <= bound.ms
                    && wrote_ms.is_none_or(|since| wal.is_some_and(|w| w.replayed_since(*lsn, since)))
            })
            .map(|(node, ..)| *node)
            .collect();
        if fresh.is_empty() {
            return None;
        }
        let turn = self.next_replica.fetch_add(1, Ordering::Relaxed);
        Some(fresh[turn % fresh.len()].clone())
    }

    /// How far `node` (a replica that answers) is behind: WAL bytes behind the most
    /// advanced node of its shard, and time as `replica_of` counts it.
    pub fn lag_of(&self, shard: &Shard, node: &NodeConfig) -> Option<(u64, u64)> {
        let nodes = self.read();
        let key = NodeKey::of(shard.id, node);
        let Some(NodeState::Up { role: ObservedRole::Replica, lsn, .. }) = nodes.states.get(&key) else {
            return None;
        };
        let newest = shard
            .nodes
            .iter()
            .filter_map(|n| match nodes.states.get(&NodeKey::of(shard.id, n)) {
                Some(NodeState::Up { lsn, .. }) => Some(*lsn),
                _ => None,
            })
            .max()
            .unwrap_or(*lsn);
        let ms = match (nodes.shards.get(&shard.id), nodes.answered_ms.get(&key)) {
            (Some(wal), Some(at)) => wal.lag_ms(*lsn, *at),
            _ => 0,
        };
        Some((newest.saturating_sub(*lsn), ms))
    }

    /// Whether `shard` has lost its primary and has a replica up that could replace it
    /// (what auto_promote acts on): no node answers as primary on the newest timeline,
    /// the configured primary has been checked (and is not answering), a replica is up.
    pub fn wants_promotion(&self, shard: &Shard) -> bool {
        if self.primary_of(shard) != PrimaryChoice::Holding(HoldReason::NoPrimary) {
            return false;
        }
        let nodes = self.read();
        shard.nodes.iter().any(|node| {
            matches!(
                nodes.states.get(&NodeKey::of(shard.id, node)),
                Some(NodeState::Up { role: ObservedRole::Replica, failing: 0, .. })
            )
        })
    }

    /// The newest timeline and the newest position a synchronous standby confirmed on
    /// it, for `shard`.
    pub fn wal_floor(&self, shard: ShardId) -> (u32, u64) {
        self.read().shards.get(&shard).map_or((0, 0), |w| (w.newest_timeline, w.sync_confirmed))
    }

    /// Whether requests are waiting for a shard to get a primary.
    pub fn holding(&self) -> bool {
        self.held.load(Ordering::Relaxed) > 0
    }

    /// A place among the requests waiting for a primary, if one is left.
    pub fn hold(&self) -> Option<HeldRequest<'_>> {
        let held = self.held.fetch_add(1, Ordering::Relaxed);
        if held == 0 {
            self.hold_began.notify_waiters();
        }
        let request = HeldRequest(self);
        (held < self.max_held).then_some(request)
    }

    /// Requests waiting for a primary now (the metrics).
    pub fn held_requests(&self) -> usize {
        self.held.load(Ordering::Relaxed).min(self.max_held)
    }

    /// Completes when a request starts to wait for a primary where none waited; armed
    /// when called, so that a hold between this call and the await is not missed.
    pub fn hold_began(&self) -> std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>> {
        let mut notified = Box::pin(self.hold_began.notified());
        notified.as_mut().enable();
        notified
    }

    /// Whether some node of `shard` is up and says it is a primary (a cheap look for
    /// the checkers' pace, not a routing decision: that is `primary_of`'s).
    pub fn shard_has_primary_up(&self, shard: ShardId) -> bool {
        self.read().states.iter().any(|(key, state)| {
            key.shard == shard && matches!(state, NodeState::Up { role: ObservedRole::Primary, .. })
        })
    }

    /// Waits until the view changes or `within` passes; false when it passed.
    pub async fn changed_within(&self, within: Duration) -> bool {
        let mut rx = self.changes.subscribe();
        tokio::time::timeout(within, rx.changed()).await.is_ok()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Nodes> {
        self.nodes.read().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NodeRole;
    use crate::directory::ShardStatus;

    fn node(port: u16, role: NodeRole) -> NodeConfig {
        NodeConfig { host: "127.0.0.1".into(), port, role, priority: 0, dbname: None }
    }

    fn shard() -> Shard {
        Shard {
            id: 1,
            status: ShardStatus::Active,
            nodes: vec![node(1, NodeRole::Primary), node(2, NodeRole::Replica), node(3, NodeRole::Replica)],
        }
    }

    fn answered(role: ObservedRole, timeline: u32) -> CheckOutcome {
        CheckOutcome::Answered(Observation::new(role, timeline, 0))
    }

    fn key(port: u16) -> NodeKey {
        NodeKey { shard: 1, host: "127.0.0.1".into(), port }
    }

    #[test]
    fn a_promoted_replica_takes_over_and_the_old_primary_never_comes_back() {
        let view = HealthView::new(3, 10);
        let shard = shard();
        assert_eq!(
            view.primary_of(&shard),
            PrimaryChoice::Node(node(1, NodeRole::Primary)),
            "unchecked: as configured"
        );
        view.record(&key(1), answered(ObservedRole::Primary, 1));
        view.record(&key(2), answered(ObservedRole::Replica, 1));
        let version = view.version();
        view.record(&key(1), CheckOutcome::Failed);
        assert_eq!(view.version(), version, "one failed check changes nothing");
        view.record(&key(1), CheckOutcome::Refused);
        assert_eq!(view.primary_of(&shard), PrimaryChoice::Holding(HoldReason::NoPrimary));
        view.record(&key(2), answered(ObservedRole::Primary, 2));
        assert_eq!(view.primary_of(&shard), PrimaryChoice::Node(node(2, NodeRole::Replica)));
        // The old primary is started again as a primary, on its old timeline.
        view.record(&key(1), answered(ObservedRole::Primary, 1));
        assert_eq!(view.primary_of(&shard), PrimaryChoice::Node(node(2, NodeRole::Replica)));
        view.record(&key(2), CheckOutcome::Refused);
        assert_eq!(
            view.primary_of(&shard),
            PrimaryChoice::Holding(HoldReason::NoPrimary),
            "a primary on an older timeline is never written to"
        );
        view.record(&key(3), answered(ObservedRole::Primary, 3));
        view.record(&key(1), answered(ObservedRole::Primary, 3));
        assert_eq!(view.primary_of(&shard), PrimaryChoice::Holding(HoldReason::TwoPrimaries { timeline: 3 }));
    }

    #[test]
    fn reads_go_to_replicas_within_the_lag_bound_in_turn() {
        let view = HealthView::new(3, 10);
        let shard = shard();
        let at = |role, lsn| CheckOutcome::Answered(Observation::new(role, 1, lsn));
        let bound = LagBound { bytes: 100, ms: u64::MAX };
        assert_eq!(view.replica_of(&shard, bound, None), None, "nothing checked yet");
        view.record(&key(1), at(ObservedRole::Primary, 1000));
        view.record(&key(2), at(ObservedRole::Replica, 950));
        view.record(&key(3), at(ObservedRole::Replica, 500));
        assert_eq!(
            view.replica_of(&shard, bound, None),
            Some(node(2, NodeRole::Replica)),
            "replica 3 is 500 bytes behind"
        );
        assert_eq!(view.replica_of(&shard, bound, None), Some(node(2, NodeRole::Replica)));
        view.record(&key(3), at(ObservedRole::Replica, 1000));
        let both: std::collections::HashSet<u16> =
            (0..4).filter_map(|_| view.replica_of(&shard, bound, None)).map(|n| n.port).collect();
        assert_eq!(both, [2, 3].into_iter().collect(), "taken in turn");
        view.record(&key(2), CheckOutcome::Refused);
        view.record(&key(3), CheckOutcome::Refused);
        assert_eq!(view.replica_of(&shard, bound, None), None, "no replica up");
    }

    #[test]
    fn a_session_reads_its_writes_only_from_replicas_that_replayed_them() {
        let view = HealthView::new(3, 10);
        let shard = shard();
        let bound = LagBound { bytes: u64::MAX, ms: u64::MAX };
        let at = |role, lsn| CheckOutcome::Answered(Observation::new(role, 1, lsn));
        view.record_at(&key(1), at(ObservedRole::Primary, 100), 1_000);
        view.record_at(&key(2), at(ObservedRole::Replica, 100), 1_010);
        // The session's write ended at 1_500: no check of the primary began since.
        assert_eq!(view.replica_of(&shard, bound, Some(1_500)), None, "not known to hold it yet");
        assert_eq!(view.replica_of(&shard, bound, None), Some(node(2, NodeRole::Replica)), "others read it");
        // The primary, checked after the write, is at 180; the replica at 150, then 180.
        view.record_at(&key(1), at(ObservedRole::Primary, 180), 2_000);
        view.record_at(&key(2), at(ObservedRole::Replica, 150), 2_010);
        assert_eq!(view.replica_of(&shard, bound, Some(1_500)), None, "behind the write");
        view.record_at(&key(2), at(ObservedRole::Replica, 180), 3_010);
        assert_eq!(view.replica_of(&shard, bound, Some(1_500)), Some(node(2, NodeRole::Replica)));
        // An idle primary (no advance) checked after a later write still vouches for it.
        view.record_at(&key(1), at(ObservedRole::Primary, 180), 4_000);
        assert_eq!(view.replica_of(&shard, bound, Some(3_500)), Some(node(2, NodeRole::Replica)));
    }

    #[test]
    fn a_replica_behind_in_time_takes_no_reads_and_an_idle_primary_leaves_it_fresh() {
        let view = HealthView::new(3, 10);
        let shard = shard();
        let bound = LagBound { bytes: u64::MAX, ms: 1000 };
        let at = |role, lsn| CheckOutcome::Answered(Observation::new(role, 1, lsn));
        view.record_at(&key(1), at(ObservedRole::Primary, 100), 0);
        view.record_at(&key(2), at(ObservedRole::Replica, 100), 10);
        // The primary stays idle for a minute: its replica is not behind.
        view.record_at(&key(1), at(ObservedRole::Primary, 100), 60_000);
        view.record_at(&key(2), at(ObservedRole::Replica, 100), 60_010);
        assert_eq!(view.replica_of(&shard, bound, None), Some(node(2, NodeRole::Replica)));
        // Writes go on; the replica stops replaying at 150.
        view.record_at(&key(1), at(ObservedRole::Primary, 200), 61_000);
        view.record_at(&key(2), at(ObservedRole::Replica, 150), 61_010);
        assert_eq!(view.replica_of(&shard, bound, None), Some(node(2, NodeRole::Replica)), "10 ms behind");
        view.record_at(&key(1), at(ObservedRole::Primary, 300), 62_000);
        view.record_at(&key(2), at(ObservedRole::Replica, 150), 62_010);
        assert_eq!(
            view.replica_of(&shard, bound, None),
            None,
            "still at 150, which the primary passed 1010 ms ago"
        );
        view.record_at(&key(2), at(ObservedRole::Replica, 300), 63_010);
        assert_eq!(view.replica_of(&shard, bound, None), Some(node(2, NodeRole::Replica)), "caught up");
    }

    #[test]
    fn promotion_is_wanted_once_the_primary_is_down_and_a_replica_is_up() {
        let view = HealthView::new(1, 10);
        let shard = shard();
        assert!(!view.wants_promotion(&shard), "nothing checked");
        view.record(&key(1), answered(ObservedRole::Primary, 1));
        view.record(&key(2), answered(ObservedRole::Replica, 1));
        assert!(!view.wants_promotion(&shard));
        view.record(&key(1), CheckOutcome::Refused);
        assert!(view.wants_promotion(&shard));
        view.record(&key(2), answered(ObservedRole::Primary, 2));
        assert!(!view.wants_promotion(&shard), "promoted");
        assert_eq!(view.wal_floor(1).0, 2);
    }

    #[test]
    fn checks_that_cannot_run_leave_the_configured_role_and_holds_are_bounded() {
        let view = HealthView::new(2, 1);
        let shard = shard();
        view.record(&key(1), CheckOutcome::Unchecked);
        assert_eq!(view.primary_of(&shard), PrimaryChoice::Node(node(1, NodeRole::Primary)));
        view.record(&key(1), answered(ObservedRole::Primary, 1));
        view.record(&key(1), CheckOutcome::Failed);
        view.record(&key(1), CheckOutcome::Failed);
        assert_eq!(view.state(&key(1)), NodeState::Down, "down after fail_after failed checks");
        let first = view.hold();
        assert!(first.is_some());
        assert!(view.hold().is_none(), "at most max_held wait");
        drop(first);
        assert!(view.hold().is_some());
    }
}
