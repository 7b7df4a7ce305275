//! Who may take one of a pool's server connections: a gate of `size` permits shared
//! fairly among tenants.
//!
//! PgBouncer-style pools queue every checkout in one line, so a tenant with many slow
//! clients holds every connection and the shard's other tenants wait behind it. Here
//! each tenant (sessions without one count as one more) has its own line, first come
//! first served within it, and the gate decides between lines:
//!
//! - A tenant's *reserve* is what it has recently needed at once (its peak of held plus
//!   waiting checkouts over the last one or two `EPOCH_MS`), at most its weighted share
//!   of the pool among the tenants active now, at least its configured minimum, at
//!   most its cap. Reserves are recomputed every `PLAN_MS`.
//! - A tenant below its reserve takes any free connection. Above it, it takes one only
//!   while more are free than the other tenants' reserves still lack. So a quiet
//!   tenant's few connections stay within reach while a noisy one uses all the rest,
//!   and a tenant alone (the only active one) may use the whole pool.
//! - A connection given back goes to the waiting tenant that holds the fewest for its
//!   weight (max-min fairness), and it never goes past a tenant's cap.
//!
//! With `fair_share = false` reserves are zero and one line is served in arrival
//! order, as PgBouncer does; caps still hold.
//!
//! A waiting checkout arms no timer of its own: while anyone waits, one task per gate
//! (its ticker) ends the waits whose time is up and gives out places that a lapsed
//! reserve freed, as PgBouncer checks its waiting clients' timeouts from one periodic
//! loop. At 400 clients on a pool of 20 nearly every checkout waits, and a timer armed
//! and disarmed in the runtime's wheel per wait was a twentieth of the proxy's work.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, oneshot};

use super::coarse_clock;
use crate::directory::{TenantId, TenantLimit, TenantLimits};

/// A tenant's line; `None`: sessions without a tenant.
pub type ShareKey = Option<TenantId>;

/// How often reserves are recomputed from the tenants' recent demand.
const PLAN_MS: u64 = 100;
/// A demand peak counts for this long, and up to twice it.
const EPOCH_MS: u64 = 500;
/// How often the ticker looks, while anyone waits, whether a reserve that checkouts
/// wait behind has lapsed.
const WAITER_TICK: Duration = Duration::from_millis(PLAN_MS * 2);

/// Where the gate reads tenants' limits: the file's, overlaid by the catalog's.
pub trait LimitSource: Send + Sync {
    fn limit(&self, tenant: Option<&TenantId>) -> TenantLimit;
}

impl LimitSource for TenantLimits {
    fn limit(&self, tenant: Option<&TenantId>) -> TenantLimit {
        self.get(tenant)
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum GateError {
    Timeout,
    Closed,
}

pub struct ShareGate {
    size: usize,
    fair: bool,
    limits: Arc<dyn Fn() -> Arc<dyn LimitSource> + Send + Sync>,
    state: Mutex<GateState>,
    /// Mirrors of `GateState`'s counts, read without the lock.
    free_now: AtomicUsize,
    waiting_now: AtomicUsize,
    /// Set (under the lock) by `close`, and never unset.
    closed: AtomicBool,
    /// Wakes the ticker before its time: a wait whose deadline comes first joined.
    ticker_nudge: Notify,
}

struct GateState {
    free: usize,
    waiting: usize,
    /// Seeded per process: tenant keys come from clients.
    tenants: foldhash::HashMap<ShareKey, TenantLine>,
    /// What the tenants' reserves lack: the sum of `reserve - held` where positive.
    unmet: usize,
    next_plan_ms: u64,
    next_ticket: u64,
    limits: Arc<dyn LimitSource>,
    ticker: Ticker,
}

/// The gate's ticker (see the module's doc).
#[derive(Clone, Copy)]
enum Ticker {
    /// No task runs: nobody waited when it last looked.
    Stopped,
    /// Task `run` runs and looks next at `wakes_at`.
    Running { run: u64, wakes_at: Instant },
}

struct TenantLine {
    held: usize,
    queue: VecDeque<Waiter>,
    /// Peak demand (held + waiting) in epoch `epoch`, and in the one before it.
    peak_now: usize,
    peak_before: usize,
    epoch: u64,
    reserve: usize,
    limit: TenantLimit,
}

struct Waiter {
    ticket: u64,
    /// Dropped unsent when the wait ends without a place: its time was up (the
    /// ticker) or the gate closed.
    grant: oneshot::Sender<SharePermit>,
    /// When it joined the line.
    since: Instant,
    /// When its time is up. A line's deadlines ascend: its waiters joined in order,
    /// with the pool's one `checkout_timeout_ms` (a reload that shortens it ends the
    /// waits after a longer one's with that one).
    deadline: Instant,
}

/// A checkout's place in its tenant's line while it waits; given up when dropped.
struct PlaceInLine<'a> {
    gate: &'a ShareGate,
    key: &'a ShareKey,
    ticket: u64,
}

impl PlaceInLine<'_> {
    /// The gate took the waiter out of its line already (granted it a place, ended
    /// its wait, or closed), so there is nothing to leave (and no need to look for it:
    /// at saturation the line is hundreds of checkouts long, a scan of it per checkout
    /// was a sixth of the proxy's instructions per transaction at 400 clients).
    fn taken_out(self) {
        std::mem::forget(self);
    }
}

impl Drop for PlaceInLine<'_> {
    fn drop(&mut self) {
        self.gate.leave_line(self.key, self.ticket);
    }
}

/// The ticker's task `run`; marks the ticker stopped however the task ends (its
/// runtime may drop it), so that the next wait starts another.
struct TickerRun {
    gate: Arc<ShareGate>,
    run: u64,
}

impl Drop for TickerRun {
    fn drop(&mut self) {
        let mut state = self.gate.lock();
        if matches!(state.ticker, Ticker::Running { run, .. } if run == self.run) {
            state.ticker = Ticker::Stopped;
        }
    }
}

/// Places given out under the gate's lock, sent once it is let go: one at a time as
/// connections come back, so inline.
type Grants = smallvec::SmallVec<[(oneshot::Sender<SharePermit>, SharePermit); 2]>;

/// One of the gate's places, held by a checked-out connection; dropping it gives the
/// place back (to the next waiting tenant, if any).
pub struct SharePermit {
    gate: Arc<ShareGate>,
    key: ShareKey,
    /// When it began to wait in its tenant's line; `None`: a place was free at once.
    queued_at: Option<Instant>,
}

impl SharePermit {
    /// Whether it was granted after a wait in its tenant's line.
    pub fn waited(&self) -> bool {
        self.queued_at.is_some()
    }

    /// When it began to wait in its tenant's line, if it waited.
    pub fn queued_at(&self) -> Option<Instant> {
        self.queued_at
    }
}

impl Drop for SharePermit {
    fn drop(&mut self) {
        self.gate.release(&self.key);
    }
}

impl TenantLine {
    fn new(limit: TenantLimit) -> Self {
        Self { held: 0, queue: VecDeque::new(), peak_now: 0, peak_before: 0, epoch: 0, reserve: 0, limit }
    }

    fn cap(&self) -> usize {
        self.limit.max_connections.map_or(usize::MAX, |c| c as usize)
    }

    fn unmet(&self) -> usize {
        self.reserve.saturating_sub(self.held)
    }

    /// Moves the demand peaks on to `epoch`.
    fn roll(&mut self, epoch: u64) {
        if epoch != self.epoch {
            self.peak_before = if epoch == self.epoch + 1 { self.peak_now } else { 0 };
            self.peak_now = self.held + self.queue.len();
            self.epoch = epoch;
        }
    }

    fn demand(&self) -> usize {
        self.peak_now.max(self.peak_before).max(self.held + self.queue.len())
    }
}

impl GateState {
    /// Takes the waiters whose deadline is past `now` out of their lines.
    fn end_waits_due(&mut self, now: Instant) -> Vec<Waiter> {
        let mut ended = Vec::new();
        for line in self.tenants.values_mut() {
            while line.queue.front().is_some_and(|w| w.deadline <= now) {
                ended.extend(line.queue.pop_front());
            }
        }
        self.waiting -= ended.len();
        ended
    }

    /// The earliest deadline of a waiting checkout (the first of each line's).
    fn first_deadline(&self) -> Option<Instant> {
        self.tenants.values().filter_map(|line| line.queue.front()).map(|w| w.deadline).min()
    }

    /// Counts a connection taken by (or given back from) `key`'s line.
    fn adjust_held(&mut self, key: &ShareKey, taken: bool) {
        if let Some(line) = self.tenants.get_mut(key) {
            let (free, unmet) = adjust_held(line, self.free, self.unmet, taken);
            (self.free, self.unmet) = (free, unmet);
        }
    }
}

/// Whether `line` may take one of `free` connections while the reserves lack `unmet`.
fn admits(free: usize, unmet: usize, line: &TenantLine) -> bool {
    free > 0 && line.held < line.cap() && (line.held < line.reserve || free > unmet)
}

/// `line` takes (or gives back) a connection: the new free and unmet counts.
fn adjust_held(line: &mut TenantLine, free: usize, unmet: usize, taken: bool) -> (usize, usize) {
    let before = line.unmet();
    let free = if taken {
        line.held += 1;
        free - 1
    } else {
        line.held = line.held.saturating_sub(1);
        free + 1
    };
    (free, unmet.saturating_sub(before) + line.unmet())
}

impl ShareGate {
    pub fn new(
        size: usize,
        fair: bool,
        limits: Arc<dyn Fn() -> Arc<dyn LimitSource> + Send + Sync>,
    ) -> Arc<Self> {
        let current = limits();
        Arc::new(Self {
            size,
            fair,
            limits,
            state: Mutex::new(GateState {
                free: size,
                waiting: 0,
                tenants: foldhash::HashMap::default(),
                unmet: 0,
                next_plan_ms: 0,
                next_ticket: 0,
                limits: current,
                ticker: Ticker::Stopped,
            }),
            free_now: AtomicUsize::new(size),
            waiting_now: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            ticker_nudge: Notify::new(),
        })
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Places free now (without the lock; a hint).
    pub fn free(&self) -> usize {
        self.free_now.load(Ordering::Relaxed)
    }

    /// Checkouts waiting now (without the lock; a hint).
    pub fn waiting(&self) -> usize {
        self.waiting_now.load(Ordering::Relaxed)
    }

    /// Whether it is closed, without the lock (once closed it stays closed). A caller
    /// that closes the gate, then takes another lock, is seen closed by whoever takes
    /// that lock after it (a connection shelved as its pool closes).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Fails every waiting checkout and every later one; held places are given back
    /// as usual.
    pub fn close(&self) {
        let mut state = self.lock();
        self.closed.store(true, Ordering::Relaxed);
        for line in state.tenants.values_mut() {
            line.queue.clear();
        }
        state.waiting = 0;
        self.publish(&state);
    }

    /// A place for `key` if one may be had without waiting.
    pub fn try_acquire(self: &Arc<Self>, key: &ShareKey) -> Result<Option<SharePermit>, GateError> {
        let mut state = self.lock();
        let granted = self.arrive(&mut state, key)?;
        self.publish(&state);
        Ok(granted.then(|| SharePermit { gate: self.clone(), key: key.clone(), queued_at: None }))
    }

    /// A place for `key`, waiting in its tenant's line up to `timeout`.
    pub async fn acquire(
        self: &Arc<Self>,
        key: &ShareKey,
        timeout: Duration,
    ) -> Result<SharePermit, GateError> {
        let (ticket, granted, start_ticker) = {
            let mut state = self.lock();
            if self.arrive(&mut state, key)? {
                self.publish(&state);
                return Ok(SharePermit { gate: self.clone(), key: key.clone(), queued_at: None });
            }
            let (grant, granted) = oneshot::channel();
            let ticket = state.next_ticket;
            state.next_ticket += 1;
            state.waiting += 1;
            // The time of this poll (see `observe::moment`), with no clock read of its own.
            let since = crate::observe::moment::now();
            let deadline = since + timeout;
            if let Some(line) = state.tenants.get_mut(key) {
                line.queue.push_back(Waiter { ticket, grant, since, deadline });
            }
            let start_ticker = match state.ticker {
                Ticker::Stopped => {
                    let wakes_at = deadline.min(since + WAITER_TICK);
                    state.ticker = Ticker::Running { run: ticket, wakes_at };
                    Some(ticket)
                }
                Ticker::Running { run, wakes_at } if deadline < wakes_at => {
                    state.ticker = Ticker::Running { run, wakes_at: deadline };
                    self.ticker_nudge.notify_one();
                    None
                }
                Ticker::Running { .. } => None,
            };
            self.publish(&state);
            (ticket, granted, start_ticker)
        };
        if let Some(run) = start_ticker {
            tokio::spawn(Self::tick(TickerRun { gate: self.clone(), run }));
        }
        // Dropped with this future (its client left): the waiter leaves its line, so
        // it counts as waiting no longer.
        let place = PlaceInLine { gate: self, key, ticket };
        let outcome = granted.await;
        place.taken_out();
        match outcome {
            Ok(permit) => Ok(permit),
            // The grant was dropped unsent, the waiter taken out: by `close`, which
            // marks the gate closed first, or by the ticker.
            Err(_) if self.is_closed() => Err(GateError::Closed),
            Err(_) => Err(GateError::Timeout),
        }
    }

    /// The ticker's task, while anyone waits: ends the waits whose time is up and
    /// gives places a lapsed reserve freed, each time it wakes.
    async fn tick(ticker: TickerRun) {
        let TickerRun { gate, run } = &ticker;
        loop {
            let wakes_at = match gate.lock().ticker {
                Ticker::Running { run: r, wakes_at } if r == *run => wakes_at,
                _ => return,
            };
            tokio::select! {
                () = tokio::time::sleep_until(wakes_at.into()) => {}
                // An earlier deadline joined: look at the state again.
                () = gate.ticker_nudge.notified() => continue,
            }
            let now = Instant::now();
            let (grants, ended) = {
                let mut state = gate.lock();
                gate.plan_if_due(&mut state, coarse_clock::now_ms());
                let grants = gate.dispatch(&mut state);
                let ended = state.end_waits_due(now);
                state.ticker = match state.first_deadline() {
                    Some(deadline) => {
                        Ticker::Running { run: *run, wakes_at: deadline.min(now + WAITER_TICK) }
                    }
                    None => Ticker::Stopped,
                };
                gate.publish(&state);
                (grants, ended)
            };
            Self::send(grants);
            // Their checkouts see the grants dropped: the time is up.
            drop(ended);
        }
    }

    /// Takes waiter `ticket` out of `key`'s line, if it is still there (it may have
    /// been granted, or its time ended, meanwhile).
    fn leave_line(&self, key: &ShareKey, ticket: u64) {
        let mut state = self.lock();
        let removed = state.tenants.get_mut(key).and_then(|line| {
            let at = line.queue.iter().position(|w| w.ticket == ticket)?;
            line.queue.remove(at)
        });
        if removed.is_some() {
            state.waiting -= 1;
            self.publish(&state);
        }
    }

    fn lock(&self) -> MutexGuard<'_, GateState> {
        // Each change of the state is whole before the lock is let go.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, state: &GateState) {
        self.free_now.store(state.free, Ordering::Relaxed);
        self.waiting_now.store(state.waiting, Ordering::Relaxed);
    }

    /// A request of `key` arrives: plans if due, then takes a place for it if it may
    /// have one now (see `admit_arrival`).
    fn arrive(&self, state: &mut GateState, key: &ShareKey) -> Result<bool, GateError> {
        if self.is_closed() {
            return Err(GateError::Closed);
        }
        let now = coarse_clock::now_ms();
        self.plan_if_due(state, now);
        Ok(self.admit_arrival(state, key, now))
    }

    /// Notes `key`'s new request in its demand and takes a place for it if it may
    /// have one now: nobody of its own line waits ahead of it and the rules admit it.
    fn admit_arrival(&self, state: &mut GateState, key: &ShareKey, now: u64) -> bool {
        let GateState { tenants, free, unmet, limits, .. } = state;
        let line = match tenants.get_mut(key) {
            Some(line) => line,
            None => tenants.entry(key.clone()).or_insert_with(|| TenantLine::new(limits.limit(key.as_ref()))),
        };
        line.roll(now / EPOCH_MS);
        line.peak_now = line.peak_now.max(line.held + line.queue.len() + 1);
        let admitted = line.queue.is_empty() && admits(*free, *unmet, line);
        if admitted {
            (*free, *unmet) = adjust_held(line, *free, *unmet, true);
        }
        admitted
    }

    fn release(self: &Arc<Self>, key: &ShareKey) {
        let grants = {
            let mut state = self.lock();
            state.adjust_held(key, false);
            let grants = if state.waiting > 0 { self.dispatch(&mut state) } else { Grants::new() };
            self.publish(&state);
            grants
        };
        Self::send(grants);
    }

    /// Gives free places to waiting checkouts: each to the line that holds the fewest
    /// for its weight among those the rules admit (in arrival order without fair
    /// shares). Sent once the lock is let go.
    fn dispatch(self: &Arc<Self>, state: &mut GateState) -> Grants {
        let mut grants = Grants::new();
        let GateState { tenants, free, unmet, waiting, .. } = state;
        while *free > 0 && *waiting > 0 {
            let next = tenants
                .iter_mut()
                .filter(|(_, line)| !line.queue.is_empty() && admits(*free, *unmet, line))
                .min_by_key(|(_, line)| {
                    let front = line.queue.front().map_or(u64::MAX, |w| w.ticket);
                    // held / weight, compared without division.
                    let rank = if self.fair {
                        (line.held as u64 * 1_000_000) / u64::from(line.limit.weight)
                    } else {
                        0
                    };
                    (rank, front)
                });
            let Some((key, line)) = next else { break };
            let Some(waiter) = line.queue.pop_front() else { break };
            *waiting -= 1;
            (*free, *unmet) = adjust_held(line, *free, *unmet, true);
            let permit = SharePermit { gate: self.clone(), key: key.clone(), queued_at: Some(waiter.since) };
            grants.push((waiter.grant, permit));
        }
        grants
    }

    /// Hands out grants; one whose checkout has gone (timed out meanwhile) is given
    /// back at once by the permit's drop.
    fn send(grants: Grants) {
        for (grant, permit) in grants {
            let _ = grant.send(permit);
        }
    }

    /// Recomputes reserves from recent demand, every `PLAN_MS`, and forgets tenants
    /// that have had no work for two epochs.
    fn plan_if_due(&self, state: &mut GateState, now: u64) {
        if now < state.next_plan_ms {
            return;
        }
        state.next_plan_ms = now + PLAN_MS;
        state.limits = (self.limits)();
        let epoch = now / EPOCH_MS;
        let limits = state.limits.clone();
        state.tenants.retain(|key, line| {
            line.roll(epoch);
            line.limit = limits.limit(key.as_ref());
            line.held > 0 || line.demand() > 0
        });
        let total_weight: u64 = state.tenants.values().map(|l| u64::from(l.limit.weight)).sum();
        let mut unmet = 0;
        for line in state.tenants.values_mut() {
            line.reserve = if self.fair && total_weight > 0 {
                let share = (self.size as u64 * u64::from(line.limit.weight) / total_weight) as usize;
                let minimum = (line.limit.min_connections as usize).min(self.size);
                line.demand().min(share).max(minimum).min(line.cap())
            } else {
                0
            };
            unmet += line.unmet();
        }
        state.unmet = unmet;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(size: usize, fair: bool) -> Arc<ShareGate> {
        ShareGate::new(size, fair, Arc::new(|| Arc::new(TenantLimits::default()) as Arc<dyn LimitSource>))
    }

    fn tenant(n: i64) -> ShareKey {
        Some(TenantId::Int(n))
    }

    fn replan(gate: &ShareGate) {
        let mut state = gate.lock();
        state.next_plan_ms = 0;
        gate.plan_if_due(&mut state, coarse_clock::now_ms());
    }

    /// A checkout dropped while it waits (its client left) leaves its line: it counts
    /// as waiting no more, and the next place given back goes to a live waiter.
    #[tokio::test]
    async fn a_waiting_checkout_that_is_dropped_leaves_its_line() {
        let gate = gate(1, true);
        let held = gate.try_acquire(&tenant(7)).unwrap().unwrap();
        let seven = tenant(7);
        let waiting = gate.acquire(&seven, Duration::from_secs(30));
        let abandoned = tokio::time::timeout(Duration::from_millis(50), waiting).await;
        assert!(abandoned.is_err(), "the pool's one place is held");
        assert_eq!(gate.waiting(), 0, "the dropped checkout left its line");
        assert_eq!(gate.lock().tenants.get(&tenant(7)).map_or(0, |l| l.queue.len()), 0);
        let g = gate.clone();
        let next = tokio::spawn(async move { g.acquire(&tenant(8), Duration::from_secs(5)).await });
        tokio::task::yield_now().await;
        assert_eq!(gate.waiting(), 1);
        drop(held);
        assert!(next.await.unwrap().is_ok(), "the place went to the live waiter");
        assert_eq!(gate.waiting(), 0);
    }

    #[tokio::test]
    async fn a_busy_tenant_leaves_a_quiet_one_its_reserve_and_alone_takes_all() {
        let gate = gate(4, true);
        // Tenant 7 alone takes the whole pool.
        let mut held: Vec<SharePermit> =
            (0..4).map(|_| gate.try_acquire(&tenant(7)).unwrap().unwrap()).collect();
        assert!(gate.try_acquire(&tenant(7)).unwrap().is_none());
        // Tenant 8 arrives and waits: the next place given back goes to it, not to
        // tenant 7's earlier waiter.
        let g = gate.clone();
        let seven =
            tokio::spawn(async move { g.acquire(&tenant(7), Duration::from_secs(5)).await.map(|_| ()) });
        tokio::task::yield_now().await;
        let g = gate.clone();
        let eight = tokio::spawn(async move { g.acquire(&tenant(8), Duration::from_secs(5)).await });
        tokio::task::yield_now().await;
        held.pop();
        let eights = eight.await.unwrap().unwrap();
        assert!(!seven.is_finished(), "tenant 7 holds 3 of 4 and still waits");
        // With reserves planned, tenant 8's place stays within its reach while tenant
        // 7 waits: given back, it is not taken by tenant 7.
        replan(&gate);
        drop(eights);
        tokio::task::yield_now().await;
        assert!(!seven.is_finished(), "tenant 8's reserve is kept for it");
        assert!(gate.try_acquire(&tenant(8)).unwrap().is_some(), "tenant 8 gets its place at once");
        drop(held);
        seven.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn weights_and_minimums_set_the_shares_of_tenants_that_both_wait() {
        let mut limits = TenantLimits::default();
        limits.set(TenantId::Int(7), TenantLimit { weight: 3, max_connections: None, min_connections: 0 });
        limits.set(TenantId::Int(9), TenantLimit { weight: 1, max_connections: None, min_connections: 2 });
        let limits: Arc<dyn LimitSource> = Arc::new(limits);
        let gate = ShareGate::new(4, true, Arc::new(move || limits.clone()));
        let (granted_tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
        let wait_many = |tenant_id: i64, n: usize| {
            for _ in 0..n {
                let (g, tx) = (gate.clone(), granted_tx.clone());
                tokio::spawn(async move {
                    // Those still waiting at the end fail when the gate closes.
                    if let Ok(permit) = g.acquire(&tenant(tenant_id), Duration::from_secs(10)).await {
                        let _ = tx.send((tenant_id, permit));
                    }
                });
            }
        };
        // Tenant 7 holds the whole pool; then tenants 7 and 8 both wait.
        wait_many(7, 4);
        let mut held: Vec<(i64, SharePermit)> = Vec::new();
        for _ in 0..4 {
            held.push(granted.recv().await.unwrap());
        }
        // Enough waiting that neither line runs dry below.
        wait_many(7, 40);
        wait_many(8, 40);
        tokio::time::sleep(Duration::from_millis(20)).await;
        replan(&gate);
        // Each connection given back goes where the weights say: 3 for tenant 7, 1 for 8.
        for _ in 0..12 {
            held.remove(0);
            held.push(granted.recv().await.unwrap());
            replan(&gate);
        }
        let sevens = held.iter().filter(|(t, _)| *t == 7).count();
        assert_eq!((sevens, held.len() - sevens), (3, 1), "weight 3 against 1");
        // A minimum of 2 for tenant 9, once it has work, beats an even share of 1 of 4.
        wait_many(9, 40);
        tokio::time::sleep(Duration::from_millis(20)).await;
        replan(&gate);
        for _ in 0..8 {
            held.remove(0);
            held.push(granted.recv().await.unwrap());
            replan(&gate);
        }
        let nines = held.iter().filter(|(t, _)| *t == 9).count();
        assert_eq!(
            nines,
            2,
            "tenant 9 holds its minimum: {:?}",
            held.iter().map(|h| h.0).collect::<Vec<_>>()
        );
        gate.close();
    }

    #[tokio::test]
    async fn without_fair_shares_the_line_is_one_and_in_order() {
        let gate = gate(1, false);
        let first = gate.try_acquire(&tenant(7)).unwrap().unwrap();
        let g = gate.clone();
        let seven = tokio::spawn(async move { g.acquire(&tenant(7), Duration::from_secs(5)).await });
        tokio::task::yield_now().await;
        let g = gate.clone();
        let eight = tokio::spawn(async move { g.acquire(&tenant(8), Duration::from_secs(5)).await });
        tokio::task::yield_now().await;
        drop(first);
        let second = seven.await.unwrap().unwrap();
        assert!(!eight.is_finished());
        drop(second);
        eight.await.unwrap().unwrap();
    }

    /// The ticker runs on the runtime of the wait that started it; a runtime that goes
    /// drops it. The gate then counts it stopped, and the next wait (here on another
    /// runtime) starts one that ends it when its time is up.
    #[test]
    fn a_ticker_dropped_with_its_runtime_leaves_the_next_wait_its_timeout() {
        let runtime = || tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let gate = gate(1, true);
        let _held = gate.try_acquire(&tenant(7)).unwrap().unwrap();
        let first = runtime();
        let abandoned = first.block_on(async {
            tokio::time::timeout(Duration::from_millis(20), gate.acquire(&tenant(8), Duration::from_secs(30)))
                .await
        });
        assert!(abandoned.is_err(), "the pool's one place is held");
        assert!(matches!(gate.lock().ticker, Ticker::Running { .. }), "started by the wait");
        drop(first);
        assert!(matches!(gate.lock().ticker, Ticker::Stopped), "dropped with its runtime");
        let waited = runtime().block_on(gate.acquire(&tenant(8), Duration::from_millis(50)));
        assert_eq!(waited.err(), Some(GateError::Timeout));
        assert_eq!(gate.waiting(), 0);
    }

    #[tokio::test]
    async fn caps_hold_timeouts_leave_the_line_and_close_fails_waiters() {
        let mut limits = TenantLimits::default();
        limits.set(TenantId::Int(7), TenantLimit { weight: 1, max_connections: Some(1), min_connections: 0 });
        let limits: Arc<dyn LimitSource> = Arc::new(limits);
        let gate = ShareGate::new(3, true, Arc::new(move || limits.clone()));
        let _one = gate.try_acquire(&tenant(7)).unwrap().unwrap();
        assert!(gate.try_acquire(&tenant(7)).unwrap().is_none(), "capped at 1 with 2 free");
        assert_eq!(gate.acquire(&tenant(7), Duration::from_millis(50)).await.err(), Some(GateError::Timeout));
        assert_eq!(gate.waiting(), 0);
        let g = gate.clone();
        let waiter = tokio::spawn(async move { g.acquire(&tenant(7), Duration::from_secs(5)).await.err() });
        tokio::task::yield_now().await;
        gate.close();
        assert_eq!(waiter.await.unwrap(), Some(GateError::Closed));
        assert_eq!(gate.try_acquire(&tenant(8)).err(), Some(GateError::Closed));
    }
}
