//! Server-side names for named prepared statements. Identical statements (same
//! text and parameter types) from any client share one id and one server name, so
//! a server that prepared it for one client serves all of them, until a schema change
//! that alters its result retires it: the next Parse of the text gets a new id.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// A statement as pgtenant prepares it on servers.
#[derive(Debug)]
pub struct PreparedStatement {
    pub id: u64,
    /// `__pgtenant_<id>`, the name used on every server.
    pub server_name: Bytes,
    pub query: Bytes,
    /// The raw parameter-type section of the client's Parse.
    pub param_types: Bytes,
    /// A server accepted it once, so a later Parse of it needs no server to succeed.
    validated: AtomicBool,
    /// A server refused it as outdated by a schema change: new Parses of its text get
    /// a statement of their own, while clients that hold this one keep it, as a server
    /// would keep theirs.
    retired: AtomicBool,
}

impl PreparedStatement {
    pub fn is_validated(&self) -> bool {
        self.validated.load(Ordering::Relaxed)
    }

    pub fn mark_validated(&self) {
        self.validated.store(true, Ordering::Relaxed);
    }

    /// The server that accepted it did so in a transaction that did not commit: its
    /// acceptance may have rested on what that transaction created.
    pub fn unmark_validated(&self) {
        self.validated.store(false, Ordering::Relaxed);
    }

    pub fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
    }

    fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Relaxed)
    }
}

/// The name statement `id` has on every server.
pub fn server_name(id: u64) -> String {
    format!("{}{id}", crate::protocol::RESERVED_PREFIX)
}

/// Interns statements; bounded by entries and by bytes of text, so that clients
/// inventing endless (or huge) statements cannot grow it without limit. Past either,
/// a new statement is still prepared, for its client alone.
pub struct StatementRegistry {
    by_text: Mutex<Interned>,
    next_id: AtomicU64,
    capacity: usize,
    byte_budget: usize,
}

#[derive(Default)]
struct Interned {
    map: foldhash::HashMap<(Bytes, Bytes), Arc<PreparedStatement>>,
    bytes: usize,
}

impl StatementRegistry {
    pub fn new(capacity: usize, byte_budget: usize) -> Self {
        Self { by_text: Mutex::default(), next_id: AtomicU64::new(1), capacity, byte_budget }
    }

    pub fn intern(&self, query: &[u8], param_types: &[u8]) -> Arc<PreparedStatement> {
        let mut interned = self.by_text.lock().unwrap_or_else(|e| e.into_inner());
        let Interned { map, bytes } = &mut *interned;
        // Look up with borrowed slices would need a custom key type; statements are
        // short and this runs once per client Parse, not per execution.
        let key = (Bytes::copy_from_slice(query), Bytes::copy_from_slice(param_types));
        if let Some(s) = map.get(&key).filter(|s| !s.is_retired()) {
            return s.clone();
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let stmt = Arc::new(PreparedStatement {
            id,
            server_name: Bytes::from(server_name(id)),
            query: key.0.clone(),
            param_types: key.1.clone(),
            validated: AtomicBool::new(false),
            retired: AtomicBool::new(false),
        });
        let cost = key.0.len() + key.1.len();
        if map.contains_key(&key) {
            map.insert(key, stmt.clone());
        } else if map.len() < self.capacity && *bytes + cost <= self.byte_budget {
            *bytes += cost;
            map.insert(key, stmt.clone());
        }
        stmt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_text_and_types_share_an_id() {
        let r = StatementRegistry::new(10, 1 << 20);
        let a = r.intern(b"SELECT $1", b"\0\0");
        let b = r.intern(b"SELECT $1", b"\0\0");
        let c = r.intern(b"SELECT $1", b"\0\x01\0\0\0\x17");
        assert_eq!(a.id, b.id);
        assert_ne!(a.id, c.id);
        assert_eq!(&a.server_name[..], format!("__pgtenant_{}", a.id).as_bytes());
    }

    #[test]
    fn a_retired_statement_gives_way_to_a_new_one() {
        let r = StatementRegistry::new(1, 1 << 20);
        let old = r.intern(b"SELECT * FROM t", b"\0\0");
        old.retire();
        let new = r.intern(b"SELECT * FROM t", b"\0\0");
        assert_ne!(old.id, new.id);
        assert_eq!(r.intern(b"SELECT * FROM t", b"\0\0").id, new.id, "replaced, even at capacity");
    }

    #[test]
    fn statements_past_the_byte_budget_are_not_shared() {
        let r = StatementRegistry::new(100, 64);
        let long = vec![b'x'; 100];
        assert_ne!(r.intern(&long, b"").id, r.intern(&long, b"").id, "too long to keep");
        assert_eq!(r.intern(b"SELECT 1", b"").id, r.intern(b"SELECT 1", b"").id);
    }
}
