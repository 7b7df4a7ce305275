//! How long a statement shape took lately: whether it may wait behind others on a
//! pipelined lane, and whether others may wait behind it. A shape is the analysis of
//! one text, shared by the texts that differ from it only in literal values.
//!
//! A new shape runs on a server of its own until it has answered within the bound
//! `QUICK_RUNS` times in a row; one slow answer (a report, a plan gone bad, a read
//! waiting for DDL's lock) sends it back to running alone, where it is timed again.
//! The proof that a statement cannot wait on another session (`effects`) comes first;
//! this catches what the text does not show (views, slow plans).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Answers within the bound in a row before a shape rides a lane.
const QUICK_RUNS: u32 = 3;

/// The recent timing of a statement shape.
#[derive(Debug, Default)]
pub struct ShapeTiming {
    /// Answers within the bound since the last one past it (saturating at `QUICK_RUNS`).
    quick_in_a_row: AtomicU32,
}

impl ShapeTiming {
    /// Whether the shape answered within the bound often enough lately to share a lane.
    pub fn is_quick(&self) -> bool {
        self.quick_in_a_row.load(Ordering::Relaxed) >= QUICK_RUNS
    }

    /// Notes one run: the time the server took to answer it, against the bound.
    pub fn record(&self, took: Duration, bound: Duration) {
        if took > bound {
            self.quick_in_a_row.store(0, Ordering::Relaxed);
        } else if self.quick_in_a_row.load(Ordering::Relaxed) < QUICK_RUNS {
            // Racing runs may count one twice: harmless for a count that only gates.
            self.quick_in_a_row.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shape_is_quick_after_runs_within_the_bound_and_not_after_one_past_it() {
        let shape = ShapeTiming::default();
        let bound = Duration::from_millis(5);
        assert!(!shape.is_quick());
        for _ in 0..QUICK_RUNS {
            shape.record(Duration::from_millis(1), bound);
        }
        assert!(shape.is_quick());
        shape.record(Duration::from_millis(6), bound);
        assert!(!shape.is_quick());
        shape.record(Duration::from_millis(1), bound);
        assert!(!shape.is_quick());
    }
}
