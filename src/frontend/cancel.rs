//! Cancel keys: every client gets a BackendKeyData of pgtenant's own; while a
//! server connection works for it, its slot holds that server's cancel target (and
//! while a scatter-gather runs, every shard's). While its request waits in pgtenant
//! instead (for a connection of a full pool, through a PAUSE or a failover), a cancel
//! ends that wait: to the client the statement runs, and PostgreSQL cancels a running
//! statement wherever it waits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;

use crate::backend::{CancelSlot as Slot, CancelTarget};

/// The pids pgtenant gives clients lie above every pid a server can have (Linux's
/// PID_MAX_LIMIT is 2^22), within the positive `int4` drivers read them as: a pid a
/// client was given never names a server backend, whatever reaches a server.
pub const FIRST_PID: u32 = (1 << 22) + 1;
const LAST_PID: u32 = i32::MAX as u32;

#[derive(Default)]
pub struct CancelRegistry {
    clients: Mutex<HashMap<u32, Client>>,
    next_pid: AtomicU32,
}

struct Client {
    key: u32,
    slot: Slot,
    many: ManySlot,
    wait: Arc<WaitInProxy>,
}

/// The servers of a scatter-gather that a cancel reaches all at once.
type ManySlot = Arc<Mutex<Vec<CancelTarget>>>;

/// A request waiting in pgtenant, and a cancel for it.
#[derive(Default)]
struct WaitInProxy {
    waiting: AtomicBool,
    canceled: AtomicBool,
    /// The session's task while it waits. One task waits per client at a time, so one
    /// registered waker does: no lock and no list of waiters, unlike a `Notify`, for a
    /// wait set up for every request a lane carries and every checkout that waits.
    wake: AtomicWaker,
}

/// What a CancelRequest reaches.
pub enum CancelReach {
    /// The servers running the client's request.
    Servers(Vec<CancelTarget>),
    /// Its request waited in pgtenant: that wait ends with 57014.
    Wait,
    /// Nothing runs: the request is dropped, as a backend drops one that finds it idle.
    Nothing,
}

/// A client's key; unregisters itself when dropped.
pub struct CancelKey {
    pub pid: u32,
    pub key: u32,
    slot: Slot,
    many: ManySlot,
    wait: Arc<WaitInProxy>,
    registry: Arc<CancelRegistry>,
}

/// A wait in pgtenant that a cancel may end (`CancelKey::wait_in_proxy`).
pub struct CancelableWait {
    wait: Arc<WaitInProxy>,
}

impl CancelRegistry {
    pub fn register(self: &Arc<Self>) -> CancelKey {
        let slot: Slot = Arc::new(Mutex::new(None));
        let many: ManySlot = Arc::default();
        let wait: Arc<WaitInProxy> = Arc::default();
        let key = rand::random::<u32>();
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        let pid = loop {
            let n = self.next_pid.fetch_add(1, Ordering::Relaxed);
            let pid = FIRST_PID + n % (LAST_PID - FIRST_PID + 1);
            if !clients.contains_key(&pid) {
                break pid;
            }
        };
        clients.insert(pid, Client { key, slot: slot.clone(), many: many.clone(), wait: wait.clone() });
        CancelKey { pid, key, slot, many, wait, registry: self.clone() }
    }

    /// What a CancelRequest for (`pid`, `key`) reaches; a request waiting in pgtenant
    /// is told at once.
    pub fn reach(&self, pid: u32, key: u32) -> CancelReach {
        self.reach_client(pid, Some(key))
    }

    /// What a cancel of client `pid` reaches, its key unchecked: for a
    /// `pg_cancel_backend` of a client the caller may signal (`session::proxy_call`).
    pub fn reach_unchecked(&self, pid: u32) -> CancelReach {
        self.reach_client(pid, None)
    }

    fn reach_client(&self, pid: u32, key: Option<u32>) -> CancelReach {
        let clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        let Some(client) = clients.get(&pid).filter(|c| key.is_none_or(|key| c.key == key)) else {
            return CancelReach::Nothing;
        };
        let mut targets = client.many.lock().unwrap_or_else(|e| e.into_inner()).clone();
        targets.extend(client.slot.lock().unwrap_or_else(|e| e.into_inner()).clone());
        if !targets.is_empty() {
            return CancelReach::Servers(targets);
        }
        if client.wait.waiting.load(Ordering::SeqCst) {
            client.wait.canceled.store(true, Ordering::SeqCst);
            client.wait.wake.wake();
            return CancelReach::Wait;
        }
        CancelReach::Nothing
    }
}

/// Carries out a cancel: forwards it to the servers it reaches, all at once, and
/// returns once every server has signalled its backend (PostgreSQL closes a cancel
/// connection only then: a client that waits for that close, as libpq's PQcancel
/// does, knows its next statement cannot be hit).
pub async fn forward(reach: CancelReach) {
    let targets = match reach {
        CancelReach::Servers(targets) => targets,
        CancelReach::Wait => return tracing::debug!("a cancel ended a wait in pgtenant"),
        CancelReach::Nothing => return tracing::debug!("a cancel for no running query"),
    };
    let sent = futures_util::future::join_all(targets.iter().map(|t| t.cancel())).await;
    for e in sent.into_iter().filter_map(Result::err) {
        tracing::warn!(error = %e, "could not forward a cancel request");
    }
}

impl CancelKey {
    /// The slot a pipelined lane fills while it runs this client's request.
    pub fn slot(&self) -> Slot {
        self.slot.clone()
    }

    pub fn set_target(&self, target: Option<CancelTarget>) {
        *self.slot.lock().unwrap_or_else(|e| e.into_inner()) = target;
    }

    /// The servers a scatter-gather runs on (empty when it ends).
    pub fn set_targets(&self, targets: Vec<CancelTarget>) {
        *self.many.lock().unwrap_or_else(|e| e.into_inner()) = targets;
    }

    /// The client's request starts waiting in pgtenant; a cancel sent from now until
    /// the returned wait is dropped ends it (`CancelableWait::canceled`).
    pub fn wait_in_proxy(&self) -> CancelableWait {
        self.wait.canceled.store(false, Ordering::SeqCst);
        self.wait.waiting.store(true, Ordering::SeqCst);
        CancelableWait { wait: self.wait.clone() }
    }
}

impl CancelableWait {
    /// Ready once a cancel came for this wait (at once if one did already); the
    /// caller's task is woken by it.
    pub fn poll_canceled(&self, cx: &mut Context<'_>) -> Poll<()> {
        // Registered before the look: a cancel in between still wakes it.
        self.wait.wake.register(cx.waker());
        if self.wait.canceled.load(Ordering::SeqCst) { Poll::Ready(()) } else { Poll::Pending }
    }

    /// `poll_canceled` as a future.
    pub fn canceled(&self) -> impl std::future::Future<Output = ()> + '_ {
        std::future::poll_fn(|cx| self.poll_canceled(cx))
    }
}

impl Drop for CancelableWait {
    fn drop(&mut self) {
        self.wait.waiting.store(false, Ordering::SeqCst);
    }
}

impl Drop for CancelKey {
    fn drop(&mut self) {
        self.registry.clients.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ServerAddr;

    impl CancelRegistry {
        fn lookup(&self, pid: u32, key: u32) -> Vec<CancelTarget> {
            match self.reach(pid, key) {
                CancelReach::Servers(targets) => targets,
                CancelReach::Wait | CancelReach::Nothing => Vec::new(),
            }
        }
    }

    #[test]
    fn lookup_needs_the_right_key_and_a_target() {
        let reg = Arc::new(CancelRegistry::default());
        let k = reg.register();
        assert!(reg.lookup(k.pid, k.key).is_empty());
        let addr = ServerAddr::Tcp("127.0.0.1:5432".parse().unwrap());
        let target = CancelTarget::new(addr.clone(), 5, 6);
        k.set_target(Some(target.clone()));
        assert_eq!(reg.lookup(k.pid, k.key).iter().map(|t| t.pid).collect::<Vec<_>>(), vec![5]);
        assert!(reg.lookup(k.pid, k.key.wrapping_add(1)).is_empty());
        k.set_target(None);
        k.set_targets(vec![target.clone(), CancelTarget::new(addr, 7, 6)]);
        assert_eq!(reg.lookup(k.pid, k.key).iter().map(|t| t.pid).collect::<Vec<_>>(), vec![5, 7]);
        let pid = k.pid;
        drop(k);
        assert!(reg.lookup(pid, 0).is_empty());
    }

    #[test]
    fn the_pids_given_to_clients_are_above_every_server_pid_and_wrap_within_int4() {
        let reg = Arc::new(CancelRegistry::default());
        let first = reg.register();
        assert_eq!(first.pid, FIRST_PID);
        reg.next_pid.store(LAST_PID - FIRST_PID, Ordering::Relaxed);
        let last = reg.register();
        assert_eq!(last.pid, LAST_PID);
        let wrapped = reg.register();
        assert_eq!(wrapped.pid, FIRST_PID + 1, "past the end, the first free pid from the start");
        assert!(i32::try_from(last.pid).is_ok());
    }

    #[tokio::test]
    async fn a_cancel_ends_a_wait_in_the_proxy_and_only_while_it_lasts() {
        let reg = Arc::new(CancelRegistry::default());
        let k = reg.register();
        assert!(matches!(reg.reach(k.pid, k.key), CancelReach::Nothing), "nothing runs");
        let wait = k.wait_in_proxy();
        // The wait comes back once canceled, and ends when dropped.
        let canceled = tokio::spawn(async move {
            wait.canceled().await;
            wait
        });
        tokio::task::yield_now().await;
        assert!(!canceled.is_finished());
        assert!(matches!(reg.reach(k.pid, k.key.wrapping_add(1)), CancelReach::Nothing), "wrong key");
        assert!(matches!(reg.reach(k.pid, k.key), CancelReach::Wait));
        let wait = tokio::time::timeout(std::time::Duration::from_secs(5), canceled).await.unwrap().unwrap();
        drop(wait);
        assert!(matches!(reg.reach(k.pid, k.key), CancelReach::Nothing), "the wait is over");
        // A cancel of an earlier wait does not end the next one.
        let next = k.wait_in_proxy();
        let pending = tokio::time::timeout(std::time::Duration::from_millis(50), next.canceled()).await;
        assert!(pending.is_err());
    }
}
