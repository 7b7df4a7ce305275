//! The time of the event a session is handling: read from the system clock once, by
//! whoever asks first, and shared by everyone who asks while the same poll of the
//! session's task lasts. One client request asks the time four or five times (its
//! SHOW CLIENTS wait and request time, the fair-share gate's planning, its query time
//! for SHOW STATS, the end of a write for read-your-writes), each a read of the clock
//! (about 20 ns in a virtual machine) where PgBouncer reads it once per turn of its
//! event loop. A poll handles what arrived at one wake-up, so the times it shares are
//! as far apart as its handling lasts (microseconds).
//!
//! Outside such a poll (other tasks, other threads, tests) each call reads the clock.
//! Timeouts and deadlines read the clock themselves.

use std::cell::Cell;
use std::future::{Future, poll_fn};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// What the current poll has read so far (`inside`: a poll of a task run `within`).
#[derive(Clone, Copy, Default)]
struct Moment {
    inside: bool,
    instant: Option<Instant>,
    unix_ms: Option<u64>,
}

thread_local! {
    static MOMENT: Cell<Moment> = const { Cell::new(Moment { inside: false, instant: None, unix_ms: None }) };
}

/// Runs `task` with each of its polls one moment: the times read during a poll are
/// read once.
pub async fn within<F: Future>(task: F) -> F::Output {
    let mut task = std::pin::pin!(task);
    poll_fn(|cx| {
        let _moment = PollMoment::begin();
        task.as_mut().poll(cx)
    })
    .await
}

/// One poll's moment; the one before it comes back when it ends (a panic included).
struct PollMoment {
    before: Moment,
}

impl PollMoment {
    fn begin() -> Self {
        let before = MOMENT.replace(Moment { inside: true, ..Moment::default() });
        Self { before }
    }
}

impl Drop for PollMoment {
    fn drop(&mut self) {
        MOMENT.set(self.before);
    }
}

/// The monotonic time of this moment.
pub fn now() -> Instant {
    let mut moment = MOMENT.get();
    if let Some(at) = moment.instant {
        return at;
    }
    let at = Instant::now();
    if moment.inside {
        moment.instant = Some(at);
        MOMENT.set(moment);
    }
    at
}

/// The wall-clock time of this moment, in milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    let mut moment = MOMENT.get();
    if let Some(ms) = moment.unix_ms {
        return ms;
    }
    let ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    if moment.inside {
        moment.unix_ms = Some(ms);
        MOMENT.set(moment);
    }
    ms
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
    fn each_poll_is_a_moment_of_its_own() {
        let times = block_on(within(async {
            let first = now();
            std::thread::sleep(std::time::Duration::from_millis(2));
            tokio::task::yield_now().await;
            (first, now())
        }));
        assert!(times.1 > times.0, "a later poll reads the clock again");
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    }
}
