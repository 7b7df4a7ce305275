//! PgBouncer's `max_db_connections` and `max_user_connections`: server connections
//! per (node, database) and per (node, server role), whatever pool they belong to. A
//! pool opening a connection takes a slot of each cap that applies, held by the
//! connection until it closes. With none free, it closes one idle connection of
//! another pool under the same cap (as PgBouncer does, so that idle connections of one
//! user cannot starve another) and waits up to `checkout_timeout_ms` for a slot, or for
//! one of its own connections to come back idle, which it then takes instead.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::error::BackendError;

/// What a cap asks of the pools under it: give up an idle connection.
pub trait IdleCloser: Send + Sync {
    /// Closes its oldest idle connection; whether it had one.
    fn close_one_idle(&self) -> bool;
}

/// One cap: its slots and the pools under it.
pub struct Cap {
    /// "database app on 10.0.0.1:5432", for the error.
    name: String,
    max: usize,
    slots: Arc<Semaphore>,
    members: Mutex<Vec<Weak<dyn IdleCloser>>>,
}

impl Cap {
    /// Puts `pool` under this cap (pools gone since are forgotten).
    pub fn join(&self, pool: Weak<dyn IdleCloser>) {
        let mut members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        members.retain(|m| m.strong_count() > 0);
        members.push(pool);
    }

    /// Closes an idle connection of a pool under this cap other than `asking`.
    fn make_room(&self, asking: usize) -> bool {
        let members: Vec<Arc<dyn IdleCloser>> = {
            let members = self.members.lock().unwrap_or_else(|e| e.into_inner());
            members.iter().filter_map(Weak::upgrade).collect()
        };
        members.iter().filter(|m| Arc::as_ptr(m).cast::<()>() as usize != asking).any(|m| m.close_one_idle())
    }

    /// A slot, else (after asking another pool for room) the first of: a slot, an
    /// idle connection back in the asking pool (`came_back`: `None`), `deadline`.
    async fn slot(
        &self,
        asking: usize,
        deadline: Instant,
        came_back: &Notify,
    ) -> Result<Option<OwnedSemaphorePermit>, BackendError> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Ok(Some(permit));
        }
        self.make_room(asking);
        tokio::select! {
            permit = self.slots.clone().acquire_owned() => Ok(permit.ok()),
            _ = came_back.notified() => Ok(None),
            _ = tokio::time::sleep_until(deadline.into()) => Err(BackendError::Capped {
                what: self.name.clone(),
                max: self.max,
            }),
        }
    }
}

/// The slots a server connection holds (given back when it closes).
#[derive(Default)]
pub struct CapSlots(#[allow(dead_code)] Vec<OwnedSemaphorePermit>);

/// The caps of the proxy, by (node, database) and (node, role).
pub struct ServerCaps {
    max_db: usize,
    max_user: usize,
    wait: Duration,
    by_db: Mutex<HashMap<(String, u16, String), Arc<Cap>>>,
    by_user: Mutex<HashMap<(String, u16, String), Arc<Cap>>>,
}

impl ServerCaps {
    /// 0 = no cap of that kind.
    pub fn new(max_db: usize, max_user: usize, wait: Duration) -> Self {
        Self { max_db, max_user, wait, by_db: Mutex::default(), by_user: Mutex::default() }
    }

    /// How long a new connection waits for a slot.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// The caps a pool of `user` on `database` at `host:port` is under.
    pub fn for_pool(&self, host: &str, port: u16, database: &str, user: &str) -> Vec<Arc<Cap>> {
        let mut caps = Vec::new();
        for (max, map, kind, name) in
            [(self.max_db, &self.by_db, "database", database), (self.max_user, &self.by_user, "role", user)]
        {
            if max == 0 {
                continue;
            }
            let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
            let cap = map.entry((host.to_string(), port, name.to_string())).or_insert_with(|| {
                Arc::new(Cap {
                    name: format!("{kind} {name} on {host}:{port}"),
                    max,
                    slots: Arc::new(Semaphore::new(max)),
                    members: Mutex::default(),
                })
            });
            caps.push(cap.clone());
        }
        caps
    }
}

/// A slot of each of `caps` if all have one free now (a warm-up takes no room).
pub fn free_slots(caps: &[Arc<Cap>]) -> Option<CapSlots> {
    caps.iter()
        .map(|cap| cap.slots.clone().try_acquire_owned().ok())
        .collect::<Option<Vec<_>>>()
        .map(CapSlots)
}

/// A slot of each of `caps` for a new connection of the pool at address `asking`, or
/// `None` when an idle connection came back to that pool meanwhile (take it instead).
pub async fn take_slots(
    caps: &[Arc<Cap>],
    asking: usize,
    deadline: Instant,
    came_back: &Notify,
) -> Result<Option<CapSlots>, BackendError> {
    let mut slots = Vec::with_capacity(caps.len());
    for cap in caps {
        match cap.slot(asking, deadline, came_back).await? {
            Some(slot) => slots.push(slot),
            None => return Ok(None),
        }
    }
    Ok(Some(CapSlots(slots)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Idle(AtomicUsize);
    impl IdleCloser for Idle {
        fn close_one_idle(&self) -> bool {
            self.0.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok()
        }
    }

    #[tokio::test]
    async fn a_full_cap_closes_another_pool_s_idle_connection_and_times_out_without_one() {
        let caps = ServerCaps::new(2, 0, Duration::from_millis(50));
        let cap = caps.for_pool("h", 1, "app", "alice");
        assert_eq!(cap.len(), 1, "only the database cap is set");
        let other: Arc<Idle> = Arc::new(Idle(AtomicUsize::new(1)));
        let asking: Arc<Idle> = Arc::new(Idle(AtomicUsize::new(5)));
        cap[0].join(Arc::downgrade(&other) as Weak<dyn IdleCloser>);
        cap[0].join(Arc::downgrade(&asking) as Weak<dyn IdleCloser>);
        let me = Arc::as_ptr(&asking) as usize;
        let came_back = Notify::new();
        let take = || take_slots(&cap, me, Instant::now() + caps.wait(), &came_back);
        let held = [take().await.unwrap().unwrap(), take().await.unwrap().unwrap()];
        let third = take().await;
        assert!(matches!(third, Err(BackendError::Capped { max: 2, .. })), "{:?}", third.err());
        assert_eq!(other.0.load(Ordering::Acquire), 0, "the other pool's idle connection was asked to close");
        assert_eq!(asking.0.load(Ordering::Acquire), 5, "never the asking pool's own");
        came_back.notify_one();
        assert!(matches!(take().await, Ok(None)), "an idle connection of its own came back: take that");
        drop(held);
        assert!(take().await.unwrap().is_some(), "closed connections give their slots back");
        let same = caps.for_pool("h", 1, "app", "bob");
        assert!(Arc::ptr_eq(&same[0], &cap[0]), "one cap per (node, database)");
    }
}
