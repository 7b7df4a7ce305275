//! Open connections, as the admin console lists them: clients (`SHOW CLIENTS`, the
//! client counts of `SHOW POOLS`) and server connections (`SHOW SERVERS`), one
//! registry each. Who each is, and what it is doing now: its owner (a session, a
//! server connection) holds the entry and updates its state with relaxed atomic stores
//! at the moments it changes (waiting, active, idle); dropping the handle removes it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// What a connection is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ConnState {
    /// A client between transactions, holding no server; a server in its pool.
    Idle = 0,
    /// A client waiting for a server connection (a pool's place, a primary after a
    /// failover).
    Waiting = 1,
    /// A client holding a server connection; a server held by a client.
    Active = 2,
    /// A client held back by a PAUSE of its shard or tenant.
    Paused = 3,
    /// A client whose request waits for its shard to get a primary (a failover,
    /// `failover_hold_ms`).
    Held = 4,
}

impl ConnState {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => ConnState::Waiting,
            2 => ConnState::Active,
            3 => ConnState::Paused,
            4 => ConnState::Held,
            _ => ConnState::Idle,
        }
    }

    /// PgBouncer's words (`cl_idle`, `cl_waiting`, `cl_active`).
    pub fn name(self) -> &'static str {
        match self {
            ConnState::Idle => "idle",
            ConnState::Waiting => "waiting",
            ConnState::Active => "active",
            ConnState::Paused => "paused",
            ConnState::Held => "held",
        }
    }
}

/// A tenant as the registry shows it: observe depends on no layer, so the directory's
/// tenant id is copied in (an integer, or a shared text: no allocation either way).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShownTenant {
    Int(i64),
    Text(Arc<str>),
}

impl std::fmt::Display for ShownTenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShownTenant::Int(n) => write!(f, "{n}"),
            ShownTenant::Text(t) => f.write_str(t),
        }
    }
}

/// What is fixed at login.
#[derive(Clone, Debug)]
pub struct ConnInfo {
    pub user: String,
    pub database: String,
    pub addr: String,
    pub port: u16,
    pub tls: bool,
    pub application_name: String,
    pub connect_unix_ms: u64,
    /// A client: the process id pgtenant gave it (its cancel key's); a server: its
    /// backend's.
    pub pid: u32,
}

/// What changes while the client is connected.
#[derive(Debug)]
struct Live {
    state: AtomicU8,
    /// The shard it holds or waits for, or belongs to (`u32::MAX`: none).
    shard: AtomicU32,
    /// A tag of the tenant whose transaction it runs or waits to run (0: none), for
    /// per-tenant pauses.
    tenant_tag: AtomicU64,
    /// When its current wait began (unix ms), if it waits.
    since_unix_ms: AtomicU64,
    /// When it last asked for a server (unix ms; its connect time before that).
    request_unix_ms: AtomicU64,
    /// A client: its session tenant, changed only by its SET/RESET (rare). A server:
    /// the tenant of the transaction it runs, or last ran.
    tenant: Mutex<Option<ShownTenant>>,
    /// The connection it is paired with: a client's server, a server's client (its id
    /// in the other registry; 0: none). PgBouncer's `link`.
    link: AtomicU64,
    /// Prepared statements it holds: a client's, as of its last transaction; a server's,
    /// as of its last checkout or return.
    prepared: AtomicU32,
    /// A server an admin's RECONNECT (or a RELOAD that replaced its pool) retired: it
    /// closes when it comes back.
    close_needed: AtomicBool,
    /// An admin asked to end it (KILL): the flag, and the wake-up of its owner.
    killed: AtomicBool,
    kill: Notify,
    /// The end was asked by `pg_terminate_backend` (set before `killed`).
    terminated: AtomicBool,
}

struct Entry {
    info: ConnInfo,
    live: Arc<Live>,
}

impl Entry {
    fn row(&self, id: u64) -> ConnRow {
        let shard = self.live.shard.load(Ordering::Relaxed);
        ConnRow {
            id,
            info: self.info.clone(),
            state: ConnState::from_u8(self.live.state.load(Ordering::SeqCst)),
            shard: (shard != u32::MAX).then_some(shard),
            since_unix_ms: self.live.since_unix_ms.load(Ordering::Relaxed),
            request_unix_ms: self.live.request_unix_ms.load(Ordering::Relaxed),
            tenant: self.live.tenant.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            link: Some(self.live.link.load(Ordering::Relaxed)).filter(|l| *l != 0),
            prepared: self.live.prepared.load(Ordering::Relaxed),
            close_needed: self.live.close_needed.load(Ordering::Relaxed),
        }
    }
}

/// Every open connection of one kind, by id.
#[derive(Default)]
pub struct ConnRegistry {
    next_id: AtomicU64,
    entries: Mutex<BTreeMap<u64, Entry>>,
}

/// A connection's entry: updates it, removes it when dropped.
pub struct ConnHandle {
    id: u64,
    live: Arc<Live>,
    registry: Arc<ConnRegistry>,
}

/// One connection as listed.
#[derive(Clone, Debug)]
pub struct ConnRow {
    pub id: u64,
    pub info: ConnInfo,
    pub state: ConnState,
    pub shard: Option<u32>,
    pub since_unix_ms: u64,
    pub request_unix_ms: u64,
    pub tenant: Option<ShownTenant>,
    /// The paired connection's id in the other registry.
    pub link: Option<u64>,
    pub prepared: u32,
    pub close_needed: bool,
}

pub fn unix_ms() -> u64 {
    super::moment::unix_ms()
}

impl ConnRegistry {
    pub fn register(self: &Arc<Self>, info: ConnInfo, tenant: Option<ShownTenant>) -> ConnHandle {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let now = unix_ms();
        let live = Arc::new(Live {
            state: AtomicU8::new(ConnState::Idle as u8),
            shard: AtomicU32::new(u32::MAX),
            tenant_tag: AtomicU64::new(0),
            since_unix_ms: AtomicU64::new(now),
            request_unix_ms: AtomicU64::new(info.connect_unix_ms),
            tenant: Mutex::new(tenant),
            link: AtomicU64::new(0),
            prepared: AtomicU32::new(0),
            close_needed: AtomicBool::new(false),
            killed: AtomicBool::new(false),
            kill: Notify::new(),
            terminated: AtomicBool::new(false),
        });
        self.lock().insert(id, Entry { info, live: live.clone() });
        ConnHandle { id, live, registry: self.clone() }
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many connections `user` has open.
    pub fn count_user(&self, user: &str) -> usize {
        self.lock().values().filter(|e| e.info.user == user).count()
    }

    /// Every client, by id.
    pub fn rows(&self) -> Vec<ConnRow> {
        self.lock().iter().map(|(id, e)| e.row(*id)).collect()
    }

    /// The connection whose pid (`ConnInfo::pid`) is `pid`, if one is open.
    pub fn find_pid(&self, pid: u32) -> Option<ConnRow> {
        self.lock().iter().find(|(_, e)| e.info.pid == pid).map(|(id, e)| e.row(*id))
    }

    /// How many connections `pick(state, shard, tenant_tag, database)` says yes to, read
    /// without copying any (a PAUSE asks this every few milliseconds while it waits).
    pub fn count(&self, pick: impl Fn(ConnState, Option<u32>, u64, &str) -> bool) -> usize {
        self.lock()
            .values()
            .filter(|e| {
                let shard = e.live.shard.load(Ordering::Relaxed);
                pick(
                    ConnState::from_u8(e.live.state.load(Ordering::SeqCst)),
                    (shard != u32::MAX).then_some(shard),
                    e.live.tenant_tag.load(Ordering::SeqCst),
                    &e.info.database,
                )
            })
            .count()
    }

    /// Marks the connections `pick(info, shard)` says yes to as to be closed; how many.
    pub fn mark_close_needed(&self, pick: impl Fn(&ConnInfo, Option<u32>) -> bool) -> usize {
        let entries = self.lock();
        let mut marked = 0;
        for e in entries.values() {
            let shard = e.live.shard.load(Ordering::Relaxed);
            if pick(&e.info, (shard != u32::MAX).then_some(shard)) {
                e.live.close_needed.store(true, Ordering::Relaxed);
                marked += 1;
            }
        }
        marked
    }

    /// How many connections (of `database`, or all) are marked to be closed and still open.
    pub fn close_needed(&self, database: Option<&str>) -> usize {
        self.lock()
            .values()
            .filter(|e| e.live.close_needed.load(Ordering::Relaxed))
            .filter(|e| database.is_none_or(|d| d == e.info.database))
            .count()
    }

    /// Asks the owners of every connection to `database` to end them; how many.
    pub fn kill_database(&self, database: &str) -> usize {
        let ids: Vec<u64> =
            self.lock().iter().filter(|(_, e)| e.info.database == database).map(|(id, _)| *id).collect();
        ids.into_iter().filter(|id| self.kill(*id)).count()
    }

    /// Asks the owner of connection `id` to end it; false when no such connection.
    pub fn kill(&self, id: u64) -> bool {
        let entries = self.lock();
        let Some(e) = entries.get(&id) else { return false };
        e.live.killed.store(true, Ordering::SeqCst);
        e.live.kill.notify_waiters();
        true
    }

    /// Asks the owner of connection `id` to end it as `pg_terminate_backend` ends a
    /// backend; false when no such connection.
    pub fn terminate(&self, id: u64) -> bool {
        if let Some(e) = self.lock().get(&id) {
            e.live.terminated.store(true, Ordering::SeqCst);
        }
        self.kill(id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ConnHandle {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The connection now does `state` (on `shard`, when it waits for or holds one).
    /// An idle one is paired with no other.
    #[inline]
    pub fn set_state(&self, state: ConnState, shard: Option<u16>) {
        self.live.shard.store(shard.map_or(u32::MAX, u32::from), Ordering::Relaxed);
        if state == ConnState::Idle {
            self.live.link.store(0, Ordering::Relaxed);
        }
        // Sequentially consistent: a pause that reads the states after raising its flag
        // sees every client that did not see the flag (see `tenancy::pause`). Only a
        // wait's start is shown (SHOW POOLS' maxwait, SHOW CLIENTS' wait): the clock is
        // read for those alone.
        let before = self.live.state.swap(state as u8, Ordering::SeqCst);
        if before != state as u8 && matches!(state, ConnState::Waiting | ConnState::Paused | ConnState::Held)
        {
            self.live.since_unix_ms.store(unix_ms(), Ordering::Relaxed);
        }
    }

    /// A server connection's state. Servers are not counted by a pause (it reads the
    /// clients' states, see `set_state`) and never wait, so a plain store does, where a
    /// client's change of state is a full barrier.
    #[inline]
    pub fn set_server_state(&self, state: ConnState, shard: u16) {
        self.live.shard.store(u32::from(shard), Ordering::Relaxed);
        if state == ConnState::Idle {
            self.live.link.store(0, Ordering::Relaxed);
        }
        self.live.state.store(state as u8, Ordering::Release);
    }

    /// The client is about to run a transaction of the tenant tagged `tenant_tag` on
    /// `shard` (0: no tenant): it waits for a server from now on.
    #[inline]
    pub fn enter(&self, shard: u16, tenant_tag: u64) {
        self.live.tenant_tag.store(tenant_tag, Ordering::Relaxed);
        self.set_state(ConnState::Waiting, Some(shard));
        // Its wait began now too: one clock read for both columns.
        let now = self.live.since_unix_ms.load(Ordering::Relaxed);
        self.live.request_unix_ms.store(now, Ordering::Relaxed);
    }

    /// Whether an admin asked to end this connection (a flag; cheap).
    #[inline]
    pub fn is_killed(&self) -> bool {
        self.live.killed.load(Ordering::Relaxed)
    }

    /// Whether the end was asked by `pg_terminate_backend` rather than by an admin's KILL.
    pub fn is_terminated(&self) -> bool {
        self.live.terminated.load(Ordering::SeqCst)
    }

    /// Completes once an admin asks to end this connection (at once if one did
    /// already). Polled once, it keeps the owner's waker; `is_killed` tells after.
    pub fn killed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let live = self.live.clone();
        async move {
            let notified = live.kill.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if live.killed.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }

    pub fn set_tenant(&self, tenant: Option<ShownTenant>) {
        *self.live.tenant.lock().unwrap_or_else(|p| p.into_inner()) = tenant;
    }

    /// This server now runs a transaction of `client` for `tenant`: each is the other's
    /// link, and the server's request time is the client's (read from it, not the clock).
    #[inline]
    pub fn serve(&self, client: &ConnHandle, tenant: Option<&ShownTenant>) {
        self.live.link.store(client.id, Ordering::Relaxed);
        client.live.link.store(self.id, Ordering::Relaxed);
        let asked = client.live.request_unix_ms.load(Ordering::Relaxed);
        self.live.request_unix_ms.store(asked, Ordering::Relaxed);
        let mut shown = self.live.tenant.lock().unwrap_or_else(|p| p.into_inner());
        if shown.as_ref() != tenant {
            *shown = tenant.cloned();
        }
    }

    /// How many prepared statements the connection holds now.
    #[inline]
    pub fn set_prepared(&self, n: usize) {
        self.live.prepared.store(u32::try_from(n).unwrap_or(u32::MAX), Ordering::Relaxed);
    }
}

impl Drop for ConnHandle {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(user: &str) -> ConnInfo {
        ConnInfo {
            user: user.into(),
            database: "app".into(),
            addr: "127.0.0.1".into(),
            port: 5000,
            tls: false,
            application_name: String::new(),
            connect_unix_ms: 1,
            pid: 7,
        }
    }

    #[test]
    fn clients_are_listed_with_their_state_until_their_handle_drops() {
        let registry = Arc::new(ConnRegistry::default());
        let a = registry.register(info("a"), Some(ShownTenant::Int(7)));
        let b = registry.register(info("b"), None);
        b.enter(2, 0);
        let rows = registry.rows();
        assert!(rows[1].request_unix_ms > 1, "asked for a server now, after connecting at 1");
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].state, rows[0].tenant.clone()), (ConnState::Idle, Some(ShownTenant::Int(7))));
        assert_eq!((rows[1].state, rows[1].shard), (ConnState::Waiting, Some(2)));
        drop(a);
        assert_eq!(registry.rows().iter().map(|r| r.id).collect::<Vec<_>>(), vec![b.id()]);
    }

    #[test]
    fn a_server_serving_a_client_links_both_and_takes_its_tenant_and_request_time() {
        let clients = Arc::new(ConnRegistry::default());
        let servers = Arc::new(ConnRegistry::default());
        let client = clients.register(info("a"), None);
        let server = servers.register(info("a"), None);
        client.enter(1, 0);
        let tenant = ShownTenant::Text("acme".into());
        server.serve(&client, Some(&tenant));
        server.set_prepared(3);
        let (c, s) = (&clients.rows()[0], &servers.rows()[0]);
        assert_eq!((c.link, s.link), (Some(server.id()), Some(client.id())));
        assert_eq!(s.request_unix_ms, c.request_unix_ms);
        assert!(s.request_unix_ms > 1, "moved off its connect time");
        assert_eq!((s.tenant.clone(), s.prepared), (Some(tenant), 3));
        server.set_state(ConnState::Idle, Some(1));
        client.set_state(ConnState::Idle, None);
        assert_eq!((clients.rows()[0].link, servers.rows()[0].link), (None, None));
        assert!(servers.rows()[0].tenant.is_some(), "the tenant it last ran stays shown");
    }

    #[test]
    fn a_connection_is_found_by_its_pid_and_told_how_it_was_ended() {
        let registry = Arc::new(ConnRegistry::default());
        let mut other = info("a");
        other.pid = 8;
        let seven = registry.register(info("a"), None);
        let eight = registry.register(other, None);
        assert_eq!(registry.find_pid(8).map(|r| r.id), Some(eight.id()));
        assert!(registry.find_pid(9).is_none());
        assert!(registry.terminate(eight.id()) && registry.kill(seven.id()));
        assert!(eight.is_killed() && eight.is_terminated());
        assert!(seven.is_killed() && !seven.is_terminated());
    }
}
