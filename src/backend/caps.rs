//! PgBouncer's `max_db_connections` and `max_user_connections`: server connections
//! per (node, database) and per (node, server role), whatever pool they belong to. A
//! pool opening a connection takes a slot of each cap that applies, held by the
//! connection until it closes. With none free, it closes one idle connection of
//! another pool under the same cap (as PgBouncer does, so that idle connections of one
//! user cannot starve another) and waits up to `checkout_timeout_ms` for a slot, or for
//! one of its own connections to come back idle, which it then takes instead.
//!
//! A third kind, per (shard, server role), is this proxy's slice of a budget the whole
//! fleet shares (`tenancy::connection_budget` leases it from the catalog): its size changes as
//! the lease does. It starts at 0; a connection that finds it full tells the lease
//! keeper (`demand`), and waits. Shrunk, it forgets free slots at once, closes idle
//! connections, and forgets each slot a busy connection gives back until it is down
//! to size.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::error::BackendError;
use crate::directory::ShardId;

/// What a cap asks of the pools under it: give up an idle connection.
pub trait IdleCloser: Send + Sync {
    /// Closes its oldest idle connection; whether it had one.
    fn close_one_idle(&self) -> bool;
    /// Its idle connections now.
    fn idle_count(&self) -> usize;
}

/// One cap: its slots and the pools under it.
pub struct Cap {
    /// "database app on 10.0.0.1:5432", for the error.
    name: String,
    /// Its size, and the slots it has now (more than its size while busy connections
    /// of a shrunk cap still hold theirs).
    size: Mutex<Size>,
    slots: Arc<Semaphore>,
    members: Mutex<Vec<Weak<dyn IdleCloser>>>,
    /// Slots held by connections, and new connections waiting for one.
    held: AtomicUsize,
    waiting: AtomicUsize,
    /// A fleet slice's: told when a connection waits for a slot.
    demand: Option<Arc<Notify>>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Size {
    wanted: usize,
    slots: usize,
}

impl Cap {
    fn new(name: String, size: usize, demand: Option<Arc<Notify>>) -> Arc<Self> {
        Arc::new(Cap {
            name,
            size: Mutex::new(Size { wanted: size, slots: size }),
            slots: Arc::new(Semaphore::new(size)),
            members: Mutex::default(),
            held: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            demand,
        })
    }

    fn lock_size(&self) -> std::sync::MutexGuard<'_, Size> {
        self.size.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Slots held by connections now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Idle connections of the pools under it.
    fn idle(&self) -> usize {
        let members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        members.iter().filter_map(Weak::upgrade).map(|m| m.idle_count()).sum()
    }

    /// New connections waiting for a slot now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// The size it is to have.
    pub fn size(&self) -> usize {
        self.lock_size().wanted
    }

    /// Gives it `wanted` slots: more at once; fewer by forgetting free slots, closing
    /// idle connections under it, and forgetting the slots busy ones give back.
    pub fn resize(&self, wanted: usize) {
        let mut size = self.lock_size();
        size.wanted = wanted;
        if wanted > size.slots {
            self.slots.add_permits(wanted - size.slots);
            size.slots = wanted;
            return;
        }
        size.slots -= self.slots.forget_permits(size.slots - wanted);
        let excess = size.slots - wanted;
        drop(size);
        for _ in 0..excess {
            if !self.make_room(0) {
                break;
            }
        }
    }

    /// A connection's slot given back: forgotten while the cap is above its size.
    fn give_back(&self, permit: OwnedSemaphorePermit) {
        self.held.fetch_sub(1, Ordering::AcqRel);
        let mut size = self.lock_size();
        if size.slots > size.wanted {
            size.slots -= 1;
            permit.forget();
        }
    }

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
        // Counted while it waits, also when the wait is given up (the client left).
        let _waiting = Waiting::count(&self.waiting);
        if let Some(demand) = &self.demand {
            demand.notify_one();
        }
        tokio::select! {
            permit = self.slots.clone().acquire_owned() => Ok(permit.ok()),
            _ = came_back.notified() => Ok(None),
            _ = tokio::time::sleep_until(deadline.into()) => Err(BackendError::Capped {
                what: self.name.clone(),
                max: self.size(),
            }),
        }
    }
}

/// One new connection waiting for a slot, counted for as long as it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn count(waiting: &'a AtomicUsize) -> Self {
        waiting.fetch_add(1, Ordering::AcqRel);
        Waiting(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A slot a server connection holds of one cap.
struct Slot {
    cap: Arc<Cap>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Slot {
    fn of(cap: &Arc<Cap>, permit: OwnedSemaphorePermit) -> Self {
        cap.held.fetch_add(1, Ordering::AcqRel);
        Slot { cap: cap.clone(), permit: Some(permit) }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            self.cap.give_back(permit);
        }
    }
}

/// The slots a server connection holds (given back when it closes).
#[derive(Default)]
pub struct CapSlots(#[allow(dead_code)] Vec<Slot>);

/// The caps of the proxy, by (node, database), (node, role), and its fleet slices by
/// (shard, role).
pub struct ServerCaps {
    max_db: usize,
    max_user: usize,
    wait: Duration,
    by_db: Mutex<HashMap<(String, u16, String), Arc<Cap>>>,
    by_user: Mutex<HashMap<(String, u16, String), Arc<Cap>>>,
    /// The (shard, role) pairs the fleet shares a budget of (from the catalog), and
    /// this proxy's slice of each.
    budgeted: Mutex<std::collections::HashSet<(ShardId, String)>>,
    by_fleet: Mutex<HashMap<(ShardId, String), Arc<Cap>>>,
    /// Told when a connection waits for a fleet slice's slot.
    pub fleet_demand: Arc<Notify>,
}

/// A fleet slice as the lease keeper sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceUse {
    pub shard: ShardId,
    pub role: String,
    /// Its size now, the connections holding a slot (idle ones among them), and the
    /// new connections waiting for one.
    pub size: usize,
    pub held: usize,
    pub idle: usize,
    pub waiting: usize,
}

impl ServerCaps {
    /// 0 = no cap of that kind.
    pub fn new(max_db: usize, max_user: usize, wait: Duration) -> Self {
        Self {
            max_db,
            max_user,
            wait,
            by_db: Mutex::default(),
            by_user: Mutex::default(),
            budgeted: Mutex::default(),
            by_fleet: Mutex::default(),
            fleet_demand: Arc::new(Notify::new()),
        }
    }

    /// The (shard, role) pairs whose connections the fleet shares a budget of: pools
    /// opened from now on take a slot of this proxy's slice of it.
    pub fn set_budgeted(&self, pairs: std::collections::HashSet<(ShardId, String)>) {
        *self.budgeted.lock().unwrap_or_else(|e| e.into_inner()) = pairs;
    }

    /// This proxy's fleet slices.
    pub fn slices(&self) -> Vec<SliceUse> {
        let by_fleet = self.by_fleet.lock().unwrap_or_else(|e| e.into_inner());
        by_fleet
            .iter()
            .map(|((shard, role), cap)| SliceUse {
                shard: *shard,
                role: role.clone(),
                size: cap.size(),
                held: cap.held(),
                idle: cap.idle(),
                waiting: cap.waiting(),
            })
            .collect()
    }

    /// Resizes this proxy's slice of (shard, role) to what its lease granted.
    pub fn resize_slice(&self, shard: ShardId, role: &str, size: usize) {
        let cap =
            self.by_fleet.lock().unwrap_or_else(|e| e.into_inner()).get(&(shard, role.to_string())).cloned();
        if let Some(cap) = cap {
            cap.resize(size);
        }
    }

    /// The fleet slice a pool of `role` on `shard` takes slots of, if the fleet
    /// shares a budget of that pair.
    fn fleet_cap(&self, shard: ShardId, role: &str) -> Option<Arc<Cap>> {
        let key = (shard, role.to_string());
        if !self.budgeted.lock().unwrap_or_else(|e| e.into_inner()).contains(&key) {
            return None;
        }
        let mut by_fleet = self.by_fleet.lock().unwrap_or_else(|e| e.into_inner());
        let cap = by_fleet.entry(key).or_insert_with(|| {
            let name = format!("this proxy's share of role {role}'s connection budget on shard {shard}");
            Cap::new(name, 0, Some(self.fleet_demand.clone()))
        });
        Some(cap.clone())
    }

    /// How long a new connection waits for a slot.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// The caps a pool of `user` on `database` at `host:port` of `shard` is under.
    pub fn for_pool(
        &self,
        shard: ShardId,
        host: &str,
        port: u16,
        database: &str,
        user: &str,
    ) -> Vec<Arc<Cap>> {
        let mut caps: Vec<Arc<Cap>> = self.fleet_cap(shard, user).into_iter().collect();
        for (max, map, kind, name) in
            [(self.max_db, &self.by_db, "database", database), (self.max_user, &self.by_user, "role", user)]
        {
            if max == 0 {
                continue;
            }
            let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
            let cap = map
                .entry((host.to_string(), port, name.to_string()))
                .or_insert_with(|| Cap::new(format!("{kind} {name} on {host}:{port}"), max, None));
            caps.push(cap.clone());
        }
        caps
    }
}

/// A slot of each of `caps` if all have one free now (a warm-up, a catalog read beside
/// a full pool: neither takes room from another pool); else the first that has none.
pub fn free_slots(caps: &[Arc<Cap>]) -> Result<CapSlots, BackendError> {
    caps.iter()
        .map(|cap| match cap.slots.clone().try_acquire_owned() {
            Ok(permit) => Ok(Slot::of(cap, permit)),
            Err(_) => Err(BackendError::CappedNow { what: cap.name.clone(), max: cap.size() }),
        })
        .collect::<Result<Vec<_>, _>>()
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
            Some(permit) => slots.push(Slot::of(cap, permit)),
            None => return Ok(None),
        }
    }
    Ok(Some(CapSlots(slots)))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Idle(AtomicUsize);
    impl IdleCloser for Idle {
        fn close_one_idle(&self) -> bool {
            self.0.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok()
        }
        fn idle_count(&self) -> usize {
            self.0.load(Ordering::Acquire)
        }
    }

    #[tokio::test]
    async fn a_full_cap_closes_another_pool_s_idle_connection_and_times_out_without_one() {
        let caps = ServerCaps::new(2, 0, Duration::from_millis(50));
        let cap = caps.for_pool(1, "h", 1, "app", "alice");
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
        let same = caps.for_pool(1, "h", 1, "app", "bob");
        assert!(Arc::ptr_eq(&same[0], &cap[0]), "one cap per (node, database)");
    }
}
