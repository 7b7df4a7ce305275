//! Minting: per shard, a (millisecond, counter) pair that only moves forward. A
//! millisecond's counters exhausted means waiting for the next millisecond; a clock
//! that went back means waiting for it to catch up (up to a bound, then an error);
//! no timestamp is ever reused. Minting needs a valid instance grant (see `lease`):
//! with a catalog, the first call asks the lease keeper for one (`demand`) and waits
//! for it a little; when none can be had (every number leased, or no catalog), the
//! call fails at once with `NoneFree`, and the session mints on the shard instead.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::clock::Clock;
use super::error::SnowflakeError;
use super::layout::{EPOCH_UNIX_MS, Layout, MAX_SHARD, MAX_TIMESTAMP_MS};

/// The most IDs one call may ask for.
pub const MAX_BATCH: i64 = 10_000;

/// The instance number this proxy may mint with, and until when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub instance: i64,
    /// `None`: forever (an instance number from the configuration).
    pub valid_until: Option<Instant>,
    /// Never mint at or before this Unix millisecond: the previous holder of the
    /// number may have minted up to it.
    pub floor_unix_ms: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GrantState {
    /// No number held: none asked for yet, or the last one given back (idle).
    Pending,
    Held(Grant),
    Lost {
        instance: i64,
    },
    /// The keeper's last try found no free number or no catalog; it tries again while
    /// minting is asked for, and calls meanwhile fail at once.
    Unavailable,
}

/// How long a call waits for the keeper's first lease (a catalog round trip, or a
/// connection to the catalog first).
const LEASE_WAIT: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Sequence {
    /// The millisecond (since the epoch) last minted at, and its next free counter.
    ms: i64,
    next_counter: i64,
}

pub struct Minter {
    layout: Layout,
    clock: Arc<dyn Clock>,
    max_clock_backwards_ms: i64,
    grant: RwLock<GrantState>,
    shards: Box<[Mutex<Sequence>]>,
    /// IDs minted so far (the metrics).
    minted: std::sync::atomic::AtomicU64,
    /// Told when a call wants a number and holds none; `granted`, when one is given.
    pub(super) demand: tokio::sync::Notify,
    granted: tokio::sync::Notify,
    /// When minting was last asked for, in ms since `born` (how the keeper tells an
    /// idle proxy, whose number it gives back).
    born: Instant,
    last_asked_ms: std::sync::atomic::AtomicU64,
}

/// What one attempt produced besides IDs.
#[derive(Debug, PartialEq, Eq)]
pub enum Attempt {
    /// Every asked-for ID was appended.
    Done,
    /// Some are still owed: the clock must first reach this Unix millisecond.
    WaitUntil(i64),
}

impl Minter {
    pub fn new(layout: Layout, clock: Arc<dyn Clock>, max_clock_backwards_ms: u64) -> Self {
        Self {
            layout,
            clock,
            max_clock_backwards_ms: max_clock_backwards_ms as i64,
            grant: RwLock::new(GrantState::Pending),
            shards: (0..=MAX_SHARD).map(|_| Mutex::new(Sequence::default())).collect(),
            minted: std::sync::atomic::AtomicU64::new(0),
            demand: tokio::sync::Notify::new(),
            granted: tokio::sync::Notify::new(),
            born: Instant::now(),
            last_asked_ms: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// How long since minting was last asked for (forever: never).
    pub fn idle_for(&self) -> Duration {
        let last = self.last_asked_ms.load(std::sync::atomic::Ordering::Relaxed);
        if last == 0 {
            return Duration::MAX;
        }
        self.born.elapsed().saturating_sub(Duration::from_millis(last))
    }

    /// The number held was given back (idle): the next call asks for one again.
    pub fn release(&self) {
        *self.grant.write().unwrap_or_else(|e| e.into_inner()) = GrantState::Pending;
    }

    /// No number could be had: calls fail at once until the keeper finds one.
    pub fn unavailable(&self) {
        let mut state = self.grant.write().unwrap_or_else(|e| e.into_inner());
        if !matches!(*state, GrantState::Held(_)) {
            *state = GrantState::Unavailable;
        }
    }

    /// IDs minted so far.
    pub fn minted(&self) -> u64 {
        self.minted.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// A new or renewed grant.
    pub fn grant(&self, grant: Grant) {
        *self.grant.write().unwrap_or_else(|e| e.into_inner()) = GrantState::Held(grant);
        self.granted.notify_waiters();
    }

    /// The lease is gone: minting stops until the next grant.
    pub fn revoke(&self) {
        let mut state = self.grant.write().unwrap_or_else(|e| e.into_inner());
        if let GrantState::Held(g) = *state {
            *state = GrantState::Lost { instance: g.instance };
        }
    }

    /// The instance number minting uses now, if any.
    pub fn instance(&self) -> Option<i64> {
        match self.current_grant() {
            Ok(g) => Some(g.instance),
            Err(_) => None,
        }
    }

    fn current_grant(&self) -> Result<Grant, SnowflakeError> {
        match *self.grant.read().unwrap_or_else(|e| e.into_inner()) {
            GrantState::Held(g) if g.valid_until.is_none_or(|t| Instant::now() < t) => Ok(g),
            GrantState::Held(g) => Err(SnowflakeError::LeaseExpired { instance: g.instance }),
            GrantState::Lost { instance } => Err(SnowflakeError::LeaseExpired { instance }),
            GrantState::Pending => Err(SnowflakeError::NoInstance),
            GrantState::Unavailable => Err(SnowflakeError::NoneFree),
        }
    }

    /// Appends up to `n - out.len()` IDs for `shard` minted now, without waiting.
    pub fn try_mint(&self, shard: i64, n: usize, out: &mut Vec<i64>) -> Result<Attempt, SnowflakeError> {
        if !(0..=MAX_SHARD).contains(&shard) {
            return Err(SnowflakeError::ShardOutOfRange { shard });
        }
        let grant = self.current_grant()?;
        let now_ms = self.clock.now_unix_ms() - EPOCH_UNIX_MS;
        if !(0..=MAX_TIMESTAMP_MS).contains(&now_ms) {
            return Err(SnowflakeError::ClockOutOfRange { unix_ms: now_ms + EPOCH_UNIX_MS });
        }
        let floor_ms = grant.floor_unix_ms - EPOCH_UNIX_MS;
        let mut seq = self.shards[shard as usize].lock().unwrap_or_else(|e| e.into_inner());
        // The earliest millisecond still free for this shard.
        let (earliest, counter) = if seq.next_counter >= self.layout.ids_per_ms() {
            (seq.ms + 1, 0)
        } else {
            (seq.ms, seq.next_counter)
        };
        let (earliest, counter) = if earliest <= floor_ms { (floor_ms + 1, 0) } else { (earliest, counter) };
        if now_ms < earliest {
            let behind = earliest - now_ms;
            // A millisecond's exhaustion (behind = 1) is ordinary; more is the clock going back.
            if behind > 1 && behind > self.max_clock_backwards_ms {
                return Err(SnowflakeError::ClockBackwards {
                    behind_ms: behind,
                    bound_ms: self.max_clock_backwards_ms,
                });
            }
            return Ok(Attempt::WaitUntil(earliest + EPOCH_UNIX_MS));
        }
        let counter = if now_ms > earliest { 0 } else { counter };
        let take = (self.layout.ids_per_ms() - counter).min((n - out.len()) as i64);
        out.extend((counter..counter + take).map(|c| self.layout.compose(now_ms, shard, grant.instance, c)));
        self.minted.fetch_add(take.max(0) as u64, std::sync::atomic::Ordering::Relaxed);
        seq.ms = now_ms;
        seq.next_counter = counter + take;
        Ok(if out.len() == n { Attempt::Done } else { Attempt::WaitUntil(now_ms + 1 + EPOCH_UNIX_MS) })
    }

    /// Mints `n` IDs for `shard`, waiting for the clock where needed. A wait for the
    /// next millisecond sleeps on a blocking-pool thread: tokio's timer rounds up to
    /// whole milliseconds, which would cost a third of the rate, and spinning would
    /// cost a core. Longer waits (a clock gone back) use the timer.
    pub async fn mint(&self, shard: i64, n: i64) -> Result<Vec<i64>, SnowflakeError> {
        let n = check_batch(n)?;
        let mut out = Vec::with_capacity(n);
        let asked = self.born.elapsed().as_millis().max(1) as u64;
        self.last_asked_ms.store(asked, std::sync::atomic::Ordering::Relaxed);
        let mut waited = false;
        loop {
            let attempt = match self.try_mint(shard, n, &mut out) {
                Err(SnowflakeError::NoInstance | SnowflakeError::LeaseExpired { .. }) if !waited => {
                    waited = true;
                    self.wait_for_grant().await;
                    continue;
                }
                Err(SnowflakeError::NoneFree) => {
                    self.demand.notify_one();
                    return Err(SnowflakeError::NoneFree);
                }
                attempt => attempt?,
            };
            match attempt {
                Attempt::Done => return Ok(out),
                Attempt::WaitUntil(unix_ms) => {
                    let wait_ms = unix_ms - self.clock.now_unix_ms();
                    if wait_ms > 2 {
                        tokio::time::sleep(Duration::from_millis(wait_ms as u64 - 1)).await;
                    } else if wait_ms > 0 {
                        let _ =
                            tokio::task::spawn_blocking(move || std::thread::sleep(until_unix_ms(unix_ms)))
                                .await;
                    } else {
                        tokio::task::yield_now().await;
                    }
                }
            }
        }
    }

    /// Asks the keeper for a number and waits `LEASE_WAIT` at most for it.
    async fn wait_for_grant(&self) {
        let granted = self.granted.notified();
        tokio::pin!(granted);
        granted.as_mut().enable();
        if self.current_grant().is_ok() {
            return;
        }
        self.demand.notify_one();
        let _ = tokio::time::timeout(LEASE_WAIT, granted).await;
    }
}

/// `n` as a batch size, if one call may ask for that many IDs (1..=MAX_BATCH).
pub fn check_batch(n: i64) -> Result<usize, SnowflakeError> {
    if !(1..=MAX_BATCH).contains(&n) {
        return Err(SnowflakeError::CountOutOfRange { n, max: MAX_BATCH });
    }
    Ok(n as usize)
}

/// How long until the system clock reaches `unix_ms` (zero if it has).
fn until_unix_ms(unix_ms: i64) -> Duration {
    let target = std::time::UNIX_EPOCH + Duration::from_millis(unix_ms.max(0) as u64);
    target.duration_since(std::time::SystemTime::now()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::snowflake::clock::{ManualClock, SystemClock};

    const T0: i64 = EPOCH_UNIX_MS + 1_000_000;

    fn minter(clock: Arc<ManualClock>, instance: i64) -> Minter {
        let m = Minter::new(Layout::default(), clock, 50);
        m.grant(Grant { instance, valid_until: None, floor_unix_ms: 0 });
        m
    }

    #[test]
    fn a_millisecond_holds_256_ids_then_waits_for_the_next() {
        let clock = Arc::new(ManualClock::new(T0));
        let m = minter(clock.clone(), 3);
        let mut out = Vec::new();
        assert_eq!(m.try_mint(7, 300, &mut out).unwrap(), Attempt::WaitUntil(T0 + 1));
        assert_eq!(out.len(), 256);
        assert_eq!(m.try_mint(7, 300, &mut out).unwrap(), Attempt::WaitUntil(T0 + 1), "still the same ms");
        clock.set(T0 + 1);
        assert_eq!(m.try_mint(7, 300, &mut out).unwrap(), Attempt::Done);
        assert!(out.windows(2).all(|w| w[0] < w[1]), "monotonic");
        let d = m.layout().decode(out[299]);
        assert_eq!((d.unix_ms, d.shard, d.instance, d.counter), (T0 + 1, 7, 3, 43));
        // Another shard has its own counters.
        let mut other = Vec::new();
        assert_eq!(m.try_mint(8, 1, &mut other).unwrap(), Attempt::Done);
        assert_eq!(m.layout().decode(other[0]).counter, 0);
    }

    #[test]
    fn a_clock_going_back_is_waited_out_within_the_bound_and_refused_beyond_it() {
        let clock = Arc::new(ManualClock::new(T0));
        let m = minter(clock.clone(), 1);
        let mut out = Vec::new();
        m.try_mint(1, 1, &mut out).unwrap();
        clock.set(T0 - 20);
        assert_eq!(m.try_mint(1, 2, &mut out).unwrap(), Attempt::WaitUntil(T0), "20 ms back: wait");
        clock.set(T0 - 500);
        let err = m.try_mint(1, 2, &mut out).unwrap_err();
        assert!(matches!(err, SnowflakeError::ClockBackwards { behind_ms: 500, bound_ms: 50 }), "{err:?}");
        clock.set(T0);
        assert_eq!(m.try_mint(1, 2, &mut out).unwrap(), Attempt::Done);
        assert_eq!(out.len(), 2);
        assert_eq!(m.layout().decode(out[1]).unix_ms, T0, "the same ms, the next counter: nothing reused");
        assert!(out[0] < out[1]);
    }

    #[test]
    fn no_grant_no_ids_and_a_new_holder_starts_after_the_floor() {
        let clock = Arc::new(ManualClock::new(T0));
        let m = Minter::new(Layout::default(), clock.clone(), 50);
        let mut out = Vec::new();
        assert!(matches!(m.try_mint(1, 1, &mut out), Err(SnowflakeError::NoInstance)));
        m.grant(Grant { instance: 2, valid_until: None, floor_unix_ms: T0 + 5 });
        assert_eq!(m.try_mint(1, 1, &mut out).unwrap(), Attempt::WaitUntil(T0 + 6));
        clock.set(T0 + 6);
        assert_eq!(m.try_mint(1, 1, &mut out).unwrap(), Attempt::Done);
        m.revoke();
        assert!(matches!(m.try_mint(1, 1, &mut out), Err(SnowflakeError::LeaseExpired { instance: 2 })));
        m.grant(Grant { instance: 2, valid_until: Some(Instant::now()), floor_unix_ms: 0 });
        assert!(matches!(m.try_mint(1, 1, &mut out), Err(SnowflakeError::LeaseExpired { instance: 2 })));
    }

    #[test]
    fn bad_input_is_refused() {
        let m = minter(Arc::new(ManualClock::new(T0)), 1);
        let mut out = Vec::new();
        assert!(matches!(
            m.try_mint(1024, 1, &mut out),
            Err(SnowflakeError::ShardOutOfRange { shard: 1024 })
        ));
        assert!(matches!(m.try_mint(-1, 1, &mut out), Err(SnowflakeError::ShardOutOfRange { .. })));
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        for n in [0, -5, MAX_BATCH + 1] {
            assert!(matches!(rt.block_on(m.mint(1, n)), Err(SnowflakeError::CountOutOfRange { .. })));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_minters_of_one_shard_never_repeat_an_id() {
        let m = Arc::new(Minter::new(Layout::default(), Arc::new(SystemClock), 1000));
        m.grant(Grant { instance: 5, valid_until: None, floor_unix_ms: 0 });
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                tokio::spawn(async move {
                    let mut ids = Vec::new();
                    for _ in 0..25 {
                        ids.extend(m.mint(9, 1000).await.unwrap());
                    }
                    ids
                })
            })
            .collect();
        let mut all = HashSet::new();
        for t in tasks {
            let ids = t.await.unwrap();
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "each caller's IDs ascend");
            for id in ids {
                assert!(all.insert(id), "duplicate {id}");
            }
        }
        assert_eq!(all.len(), 100_000);
    }
}
