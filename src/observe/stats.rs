//! Traffic counters of one pool (a node, user and database), as PgBouncer keeps them
//! per database: requests ("queries"), transactions, bytes each way, the time servers
//! spent on them and the time clients waited for a connection. The data path adds to
//! relaxed atomics, once per request; readers take snapshots and sum them.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default, Debug)]
pub struct PoolStats {
    queries: AtomicU64,
    xacts: AtomicU64,
    /// Bytes pgtenant sent to the servers (what clients sent, and its own SETs).
    to_servers: AtomicU64,
    /// Bytes the servers sent (what clients received, but for pgtenant's own answers).
    from_servers: AtomicU64,
    query_us: AtomicU64,
    xact_us: AtomicU64,
    checkouts: AtomicU64,
    /// Time from asking for a connection to holding one (a place, a new connection).
    wait_us: AtomicU64,
    /// Checkouts by how long they took (`WAIT_BUCKETS_US`, then the rest).
    wait_buckets: [AtomicU64; WAIT_BUCKETS_US.len() + 1],
    /// Requests by how long the server took (the same buckets).
    query_buckets: [AtomicU64; WAIT_BUCKETS_US.len() + 1],
    /// Requests answered with an ErrorResponse.
    errors: AtomicU64,
    /// PgBouncer 1.23's prepared-statement counters: clients' Parses answered (by a
    /// server or from a statement the server already held), Parses servers answered
    /// (pgtenant's own included), and Binds servers answered.
    client_parses: AtomicU64,
    server_parses: AtomicU64,
    binds: AtomicU64,
}

/// Prepared-statement messages a server connection saw answered, kept plainly on the
/// connection and added to its pool's counters once per request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatementCounts {
    pub client_parses: u64,
    pub server_parses: u64,
    pub binds: u64,
}

/// Upper bounds (µs) of the checkout-wait and request-time histograms' buckets.
pub const WAIT_BUCKETS_US: [u64; 9] =
    [100, 1_000, 5_000, 10_000, 50_000, 100_000, 500_000, 1_000_000, 5_000_000];

/// The counters at one moment, summed over pools as needed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub queries: u64,
    pub xacts: u64,
    pub to_servers: u64,
    pub from_servers: u64,
    pub query_us: u64,
    pub xact_us: u64,
    pub checkouts: u64,
    pub wait_us: u64,
    /// Checkouts per bucket of `WAIT_BUCKETS_US` (not cumulative), the last unbounded.
    pub wait_buckets: [u64; WAIT_BUCKETS_US.len() + 1],
    /// Requests per bucket, the same way.
    pub query_buckets: [u64; WAIT_BUCKETS_US.len() + 1],
    pub errors: u64,
    pub client_parses: u64,
    pub server_parses: u64,
    pub binds: u64,
}

impl PoolStats {
    /// Adds a connection's statement counts (`StatementCounts`).
    #[inline]
    pub fn statements(&self, c: StatementCounts) {
        for (counter, n) in [
            (&self.client_parses, c.client_parses),
            (&self.server_parses, c.server_parses),
            (&self.binds, c.binds),
        ] {
            if n > 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// A client request answered (its ReadyForQuery relayed) after `query_us` of
    /// server time; `xact_us` when it ended a transaction that took that long.
    #[inline]
    pub fn request_done(&self, query_us: u64, xact_us: Option<u64>) {
        self.queries.fetch_add(1, Ordering::Relaxed);
        self.query_us.fetch_add(query_us, Ordering::Relaxed);
        self.query_buckets[bucket_of(query_us)].fetch_add(1, Ordering::Relaxed);
        if let Some(us) = xact_us {
            self.xacts.fetch_add(1, Ordering::Relaxed);
            self.xact_us.fetch_add(us, Ordering::Relaxed);
        }
    }

    #[inline]
    pub fn bytes(&self, to_servers: u64, from_servers: u64) {
        if to_servers > 0 {
            self.to_servers.fetch_add(to_servers, Ordering::Relaxed);
        }
        if from_servers > 0 {
            self.from_servers.fetch_add(from_servers, Ordering::Relaxed);
        }
    }

    /// A checkout that took `wait_us`.
    #[inline]
    pub fn checkout(&self, wait_us: u64) {
        self.checkouts.fetch_add(1, Ordering::Relaxed);
        self.wait_us.fetch_add(wait_us, Ordering::Relaxed);
        let bucket =
            WAIT_BUCKETS_US.iter().position(|&bound| wait_us <= bound).unwrap_or(WAIT_BUCKETS_US.len());
        self.wait_buckets[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// A request answered with an ErrorResponse.
    #[inline]
    pub fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            queries: get(&self.queries),
            xacts: get(&self.xacts),
            to_servers: get(&self.to_servers),
            from_servers: get(&self.from_servers),
            query_us: get(&self.query_us),
            xact_us: get(&self.xact_us),
            checkouts: get(&self.checkouts),
            wait_us: get(&self.wait_us),
            wait_buckets: std::array::from_fn(|i| get(&self.wait_buckets[i])),
            query_buckets: std::array::from_fn(|i| get(&self.query_buckets[i])),
            errors: get(&self.errors),
            client_parses: get(&self.client_parses),
            server_parses: get(&self.server_parses),
            binds: get(&self.binds),
        }
    }
}

fn bucket_of(us: u64) -> usize {
    WAIT_BUCKETS_US.iter().position(|&bound| us <= bound).unwrap_or(WAIT_BUCKETS_US.len())
}

impl std::ops::Add for StatsSnapshot {
    type Output = StatsSnapshot;
    fn add(self, o: StatsSnapshot) -> StatsSnapshot {
        StatsSnapshot {
            queries: self.queries + o.queries,
            xacts: self.xacts + o.xacts,
            to_servers: self.to_servers + o.to_servers,
            from_servers: self.from_servers + o.from_servers,
            query_us: self.query_us + o.query_us,
            xact_us: self.xact_us + o.xact_us,
            checkouts: self.checkouts + o.checkouts,
            wait_us: self.wait_us + o.wait_us,
            wait_buckets: std::array::from_fn(|i| self.wait_buckets[i] + o.wait_buckets[i]),
            query_buckets: std::array::from_fn(|i| self.query_buckets[i] + o.query_buckets[i]),
            errors: self.errors + o.errors,
            client_parses: self.client_parses + o.client_parses,
            server_parses: self.server_parses + o.server_parses,
            binds: self.binds + o.binds,
        }
    }
}

impl StatsSnapshot {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &StatsSnapshot) -> StatsSnapshot {
        StatsSnapshot {
            queries: self.queries.saturating_sub(earlier.queries),
            xacts: self.xacts.saturating_sub(earlier.xacts),
            to_servers: self.to_servers.saturating_sub(earlier.to_servers),
            from_servers: self.from_servers.saturating_sub(earlier.from_servers),
            query_us: self.query_us.saturating_sub(earlier.query_us),
            xact_us: self.xact_us.saturating_sub(earlier.xact_us),
            checkouts: self.checkouts.saturating_sub(earlier.checkouts),
            wait_us: self.wait_us.saturating_sub(earlier.wait_us),
            wait_buckets: std::array::from_fn(|i| {
                self.wait_buckets[i].saturating_sub(earlier.wait_buckets[i])
            }),
            query_buckets: std::array::from_fn(|i| {
                self.query_buckets[i].saturating_sub(earlier.query_buckets[i])
            }),
            errors: self.errors.saturating_sub(earlier.errors),
            client_parses: self.client_parses.saturating_sub(earlier.client_parses),
            server_parses: self.server_parses.saturating_sub(earlier.server_parses),
            binds: self.binds.saturating_sub(earlier.binds),
        }
    }

    /// PgBouncer's averages over a period of `secs`: rates per second for counts and
    /// bytes, mean µs per transaction, per query and per checkout.
    pub fn averages(&self, secs: f64) -> Averages {
        let per_sec = |n: u64| if secs > 0.0 { (n as f64 / secs).round() as i64 } else { 0 };
        let mean = |total: u64, n: u64| total.checked_div(n).map_or(0, |m| m as i64);
        Averages {
            xact_count: per_sec(self.xacts),
            query_count: per_sec(self.queries),
            recv: per_sec(self.to_servers),
            sent: per_sec(self.from_servers),
            xact_time: mean(self.xact_us, self.xacts),
            query_time: mean(self.query_us, self.queries),
            wait_time: mean(self.wait_us, self.checkouts),
            server_assignment_count: per_sec(self.checkouts),
            client_parse_count: per_sec(self.client_parses),
            server_parse_count: per_sec(self.server_parses),
            bind_count: per_sec(self.binds),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Averages {
    pub xact_count: i64,
    pub query_count: i64,
    pub recv: i64,
    pub sent: i64,
    pub xact_time: i64,
    pub query_time: i64,
    pub wait_time: i64,
    pub server_assignment_count: i64,
    pub client_parse_count: i64,
    pub server_parse_count: i64,
    pub bind_count: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_and_average_per_second_and_per_event() {
        let s = PoolStats::default();
        s.request_done(100, None);
        s.request_done(300, Some(1000));
        s.checkout(0);
        s.checkout(50);
        s.bytes(10, 2000);
        let now = s.snapshot();
        assert_eq!((now.queries, now.xacts, now.query_us, now.xact_us), (2, 1, 400, 1000));
        assert_eq!((now.checkouts, now.wait_us), (2, 50));
        assert_eq!(now.wait_buckets[0], 2, "both within 100 µs");
        let avg = now.since(&StatsSnapshot::default()).averages(2.0);
        assert_eq!(
            (avg.query_count, avg.query_time, avg.xact_time, avg.sent, avg.wait_time),
            (1, 200, 1000, 1000, 25)
        );
    }
}
