//! PgBouncer's averages (`SHOW STATS_AVERAGES`, the `avg_` columns of `SHOW STATS`):
//! per-second rates and mean times over about the last minute. The totals per database
//! are sampled every `SAMPLE_EVERY`; averages run from the oldest sample kept (at most
//! `KEPT` periods back) to now.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::observe::stats::{Averages, StatsSnapshot};

pub const SAMPLE_EVERY: Duration = Duration::from_secs(15);
const KEPT: usize = 4;

pub struct StatsHistory {
    started: Instant,
    samples: Mutex<VecDeque<(Instant, HashMap<String, StatsSnapshot>)>>,
}

impl Default for StatsHistory {
    fn default() -> Self {
        Self { started: Instant::now(), samples: Mutex::new(VecDeque::new()) }
    }
}

impl StatsHistory {
    /// Keeps `totals` (per database) as they are now.
    pub fn sample(&self, totals: HashMap<String, StatsSnapshot>) {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if samples.len() == KEPT {
            samples.pop_front();
        }
        samples.push_back((Instant::now(), totals));
    }

    /// `database`'s averages from the oldest sample to `now_totals` (from the start,
    /// before the first sample).
    pub fn averages(&self, database: &str, now_totals: &StatsSnapshot) -> Averages {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let (since, earlier) = match samples.front() {
            Some((at, totals)) => (*at, totals.get(database).copied().unwrap_or_default()),
            None => (self.started, StatsSnapshot::default()),
        };
        now_totals.since(&earlier).averages(since.elapsed().as_secs_f64())
    }
}
