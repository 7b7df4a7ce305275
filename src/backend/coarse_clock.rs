//! Milliseconds since the process started, read cheaply: a server connection notes the
//! time each time it goes back to its pool (once per transaction), where a clock read
//! would cost more than the rest of the return. The task that closes expired idle
//! connections moves the clock on, so it lags by at most that task's period.

use std::sync::atomic::{AtomicU64, Ordering};

static COARSE_MS: AtomicU64 = AtomicU64::new(0);

/// The exact time (as of the event being handled, see `observe::moment`), in
/// milliseconds since the process' epoch.
pub fn now_ms() -> u64 {
    crate::observe::moment::since_start_us() / 1000
}

/// The time as last moved on by `advance` (never ahead of `now_ms`).
pub fn coarse_ms() -> u64 {
    COARSE_MS.load(Ordering::Relaxed)
}

/// Moves the coarse clock to now, and the wall clock's offset with it
/// (`observe::moment::resync_wall_clock`); returns now.
pub fn advance() -> u64 {
    crate::observe::moment::resync_wall_clock();
    let now = now_ms();
    COARSE_MS.fetch_max(now, Ordering::Relaxed);
    now
}
