//! Cancel keys: every client gets a BackendKeyData of pgtenant's own; while a
//! server connection works for it, its slot holds that server's cancel target (and
//! while a scatter-gather runs, every shard's).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crate::backend::{CancelSlot as Slot, CancelTarget};

#[derive(Default)]
pub struct CancelRegistry {
    clients: Mutex<HashMap<u32, (u32, Slot, ManySlot)>>,
    next_pid: AtomicU32,
}

/// The servers of a scatter-gather that a cancel reaches all at once.
type ManySlot = Arc<Mutex<Vec<CancelTarget>>>;

/// A client's key; unregisters itself when dropped.
pub struct CancelKey {
    pub pid: u32,
    pub key: u32,
    slot: Slot,
    many: ManySlot,
    registry: Arc<CancelRegistry>,
}

impl CancelRegistry {
    pub fn register(self: &Arc<Self>) -> CancelKey {
        let slot: Slot = Arc::new(Mutex::new(None));
        let many: ManySlot = Arc::default();
        let key = rand::random::<u32>();
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        let pid = loop {
            let pid = self.next_pid.fetch_add(1, Ordering::Relaxed).wrapping_add(1) & 0x7fff_ffff;
            if pid != 0 && !clients.contains_key(&pid) {
                break pid;
            }
        };
        clients.insert(pid, (key, slot.clone(), many.clone()));
        CancelKey { pid, key, slot, many, registry: self.clone() }
    }

    /// The server targets for a CancelRequest: none unless the key matches and a query runs.
    pub fn lookup(&self, pid: u32, key: u32) -> Vec<CancelTarget> {
        let clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        let Some((expected, slot, many)) = clients.get(&pid) else { return Vec::new() };
        if *expected != key {
            return Vec::new();
        }
        let mut targets = many.lock().unwrap_or_else(|e| e.into_inner()).clone();
        targets.extend(slot.lock().unwrap_or_else(|e| e.into_inner()).clone());
        targets
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
}
