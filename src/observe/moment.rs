//! The time of the event a session is handling: read from the system clock once, by
//! whoever asks first, and shared by everyone who asks while the same poll of the
//! session's task lasts. One client request asks the time four or five times (its
//! SHOW CLIENTS wait and request time, the fair-share gate's planning, its query time
//! for SHOW STATS, the end of a write for read-your-writes), each a read of the clock
//! (about 20 ns in a virtual machine) where PgBouncer reads it once per turn of its
//! event loop. A poll handles what arrived at one wake-up, so the times it shares are
//! as far apart as its handling lasts (microseconds).
//!
//! The poll's time is kept as an `Instant` and as microseconds since the process'
//! epoch (`since_start_us`): the statistics' durations and the millisecond clocks are
//! subtractions of plain integers, where each `Instant` subtraction and conversion cost
//! more than the clock read (callgrind: `coarse_clock::now_ms` about 170 instructions a
//! call, two `Duration`s per answered request). Reading `CLOCK_MONOTONIC` through
//! `rustix`'s own vDSO call instead of `Instant::now` would spare the conversion, but
//! that call crashes under valgrind. The wall-clock time (`unix_ms`) is the same moment
//! plus the wall clock's offset from the epoch, read again by `resync_wall_clock` (the
//! idle-connection sweep, at least once a second), so a step of the system clock
//! shows within one sweep.
//!
//! Outside such a poll (other tasks, other threads, tests) each call reads the clock.
//! Timeouts and deadlines read the clock themselves.

use std::cell::Cell;
use std::future::{Future, poll_fn};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The process' epoch for `since_start_us`.
static EPOCH: LazyLock<Instant> = LazyLock::new(|| {
    let epoch = Instant::now();
    UNIX_AT_EPOCH_US.store(wall_us(), Ordering::Relaxed);
    epoch
});
/// The wall clock's time at `EPOCH`, in microseconds since the Unix epoch.
static UNIX_AT_EPOCH_US: AtomicI64 = AtomicI64::new(0);

/// What the current poll has read so far (`inside`: a poll of a task run `within`).
struct Moment {
    inside: Cell<bool>,
    /// The poll's time, and the same in microseconds since `EPOCH`.
    at: Cell<Option<(Instant, u64)>>,
}

thread_local! {
    static MOMENT: Moment = const { Moment { inside: Cell::new(false), at: Cell::new(None) } };
}

/// Runs `task` with each of its polls one moment: the times read during a poll are
/// read once.
///
/// `task` is boxed, not pinned in an `async fn`'s state: there it was kept twice, as
/// the argument and as the pinned local it was moved to (rustc does not lay the two
/// over each other), and a session's 8 KiB future made a 17 KiB task, written in
/// full by those moves (`-Zprint-type-sizes`; docs/benchmarks.md "Memory").
pub fn within<F: Future>(task: F) -> impl Future<Output = F::Output> {
    let mut task = Box::pin(task);
    poll_fn(move |cx| {
        let _moment = PollMoment::begin();
        task.as_mut().poll(cx)
    })
}

/// One poll's moment; the one before it comes back when it ends (a panic included).
struct PollMoment {
    before: (bool, Option<(Instant, u64)>),
}

impl PollMoment {
    fn begin() -> Self {
        let before = MOMENT.with(|m| (m.inside.replace(true), m.at.take()));
        Self { before }
    }
}

impl Drop for PollMoment {
    fn drop(&mut self) {
        let (inside, at) = self.before;
        MOMENT.with(|m| {
            m.inside.set(inside);
            m.at.set(at);
        });
    }
}

/// This moment: read from the clock the first time a poll asks.
fn moment() -> (Instant, u64) {
    MOMENT.with(|m| {
        if let Some(at) = m.at.get() {
            return at;
        }
        let instant = Instant::now();
        let at = (instant, micros_since_epoch(instant));
        if m.inside.get() {
            m.at.set(Some(at));
        }
        at
    })
}

fn micros_since_epoch(instant: Instant) -> u64 {
    // In u64 (`as_micros` works in u128): seconds since the epoch times a million fit
    // for half a million years.
    let since = instant.saturating_duration_since(*EPOCH);
    since.as_secs().saturating_mul(1_000_000).saturating_add(u64::from(since.subsec_micros()))
}

/// The monotonic time of this moment.
pub fn now() -> Instant {
    moment().0
}

/// This moment in microseconds since the process' epoch: a monotonic clock whose
/// differences are plain subtractions.
pub fn since_start_us() -> u64 {
    moment().1
}

/// The wall-clock time of this moment, in milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    let since_start_us = since_start_us() as i64;
    u64::try_from((UNIX_AT_EPOCH_US.load(Ordering::Relaxed) + since_start_us) / 1000).unwrap_or(0)
}

/// Reads the wall clock's offset from the epoch again: after a step of the system
/// clock, `unix_ms` follows it from here. A difference under a millisecond is the time
/// between the two clock reads, and the offset is left as it is.
pub fn resync_wall_clock() {
    let since_start_us = micros_since_epoch(Instant::now()) as i64;
    let offset = wall_us() - since_start_us;
    if UNIX_AT_EPOCH_US.load(Ordering::Relaxed).abs_diff(offset) >= 1000 {
        UNIX_AT_EPOCH_US.store(offset, Ordering::Relaxed);
    }
}

/// The system's wall clock, in microseconds since the Unix epoch.
fn wall_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_reads_each_clock_once_and_outside_every_call_reads() {
        let outside = now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(now() > outside, "outside a poll the clock is read each time");
        let (first, second, unix_first, unix_second) = block_on(within(async {
            let first = now();
            let unix_first = unix_ms();
            std::thread::sleep(std::time::Duration::from_millis(2));
            (first, now(), unix_first, unix_ms())
        }));
        assert_eq!(first, second, "one poll, one time");
        assert_eq!(unix_first, unix_second);
        assert!(now() > second, "the moment ends with its poll");
    }

    #[test]
    fn the_wall_clock_is_the_monotonic_moment_plus_the_offset_last_read() {
        let wall = || (wall_us() / 1000) as u64;
        let before = wall();
        let ours = unix_ms();
        assert!(ours + 2 >= before && ours <= wall() + 2, "{ours} against {before}");
        resync_wall_clock();
        let ours = unix_ms();
        assert!(ours.abs_diff(wall()) <= 2, "{ours} against {}", wall());
        let (at_us, later_us) = block_on(within(async {
            let at = since_start_us();
            std::thread::sleep(std::time::Duration::from_millis(2));
            (at, since_start_us())
        }));
        assert_eq!(at_us, later_us, "one poll, one time");
        assert!(since_start_us() >= at_us + 2000, "the epoch's clock goes on outside");
    }

    #[test]
    fn each_poll_is_a_moment_of_its_own() {
        let times = block_on(within(async {
            let first = now();
            std::thread::sleep(std::time::Duration::from_millis(2));
            tokio::task::yield_now().await;
            (first, now())
        }));
        assert!(times.1 > times.0, "a later poll reads the clock again");
    }

    #[test]
    fn the_task_is_kept_once() {
        let task = async {
            let room = [7u8; 4096];
            tokio::task::yield_now().await;
            room.iter().map(|b| u32::from(*b)).sum::<u32>()
        };
        assert!(std::mem::size_of_val(&task) >= 4096);
        let wrapped = within(task);
        // Only the box's pointer: the task itself is not copied into the future.
        assert!(std::mem::size_of_val(&wrapped) <= 64, "{} bytes", std::mem::size_of_val(&wrapped));
        assert_eq!(block_on(wrapped), 7 * 4096);
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    }
}
