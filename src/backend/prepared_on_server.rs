//! The statements prepared on one server connection, by id, with the least recently
//! used one evicted past a limit: clients that invent statements without end (IN
//! lists of every length, literals in the text) would otherwise grow every server
//! process's memory until it is closed.

/// The id of pgtenant's own statement that sets the tenant GUC: never evicted.
pub const SET_TENANT_STATEMENT_ID: u64 = u64::MAX;

#[derive(Debug, Default)]
pub struct PreparedOnServer {
    /// Statement id -> the tick of its last use.
    last_used: foldhash::HashMap<u64, u64>,
    tick: u64,
    /// 0: no limit.
    limit: usize,
}

impl PreparedOnServer {
    pub fn new(limit: usize) -> Self {
        Self { limit, ..Self::default() }
    }

    pub fn contains(&self, id: u64) -> bool {
        self.last_used.contains_key(&id)
    }

    /// Whether the server has `id`; if so, it counts as just used.
    pub fn touch(&mut self, id: u64) -> bool {
        match self.last_used.get_mut(&id) {
            Some(used) => {
                self.tick += 1;
                *used = self.tick;
                true
            }
            None => false,
        }
    }

    /// Records `id` as prepared (or used, if it was already); returns the statement to
    /// close when that puts the connection over its limit. Whether it is new is
    /// `contains` before.
    pub fn insert(&mut self, id: u64) -> Option<u64> {
        self.record(id);
        if self.limit == 0 || self.last_used.len() <= self.limit {
            return None;
        }
        // A scan, once per statement prepared past the limit: the cost of the Parse
        // it comes with is far larger.
        let (&oldest, _) = self
            .last_used
            .iter()
            .filter(|&(&other, _)| other != id && other != SET_TENANT_STATEMENT_ID)
            .min_by_key(|&(_, used)| *used)?;
        self.last_used.remove(&oldest);
        Some(oldest)
    }

    /// Records `id` as prepared, over the limit if need be.
    pub fn record(&mut self, id: u64) {
        self.tick += 1;
        self.last_used.insert(id, self.tick);
    }

    pub fn remove(&mut self, id: u64) {
        self.last_used.remove(&id);
    }

    pub fn clear(&mut self) {
        self.last_used.clear();
    }

    pub fn len(&self) -> usize {
        self.last_used.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last_used.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used_past_the_limit() {
        let mut p = PreparedOnServer::new(3);
        assert_eq!(p.insert(SET_TENANT_STATEMENT_ID), None);
        assert_eq!(p.insert(1), None);
        assert_eq!(p.insert(2), None);
        assert!(p.touch(1));
        assert_eq!(p.insert(3), Some(2), "2 is the least recently used; the tenant statement stays");
        assert!(!p.contains(2) && p.contains(1) && p.contains(3));
        assert_eq!(p.insert(4), Some(1));
        assert_eq!(p.len(), 3);
        assert!(!p.touch(2));
        let mut unlimited = PreparedOnServer::new(0);
        for id in 0..10_000 {
            assert_eq!(unlimited.insert(id), None);
        }
    }
}
