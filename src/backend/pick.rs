//! Which idle connection a checkout takes (see `pool`): the newest that holds the most
//! of what the client wants already (its settings, its tenant GUC, its thread).

use super::conn::ServerConn;
use crate::directory::TenantId;

/// What a checkout would like its connection to hold already; nothing (the default)
/// takes the newest idle connection.
#[derive(Clone, Copy, Debug, Default)]
pub struct Wanted<'a> {
    /// The tenant GUC's value (the inner `None`: no tenant), when pgtenant sets that GUC.
    pub tenant: Option<Option<&'a TenantId>>,
    /// The `Settings::version` of the client's settings.
    pub settings: Option<u64>,
}

impl Wanted<'_> {
    const ALL: u8 = 7;

    /// How much of what is wanted `conn` holds, for a client on thread `home`. The
    /// settings count for more: their SETs go in a query of their own ahead of the
    /// client's request (an extra answer for the server to flush), where a switch of
    /// tenant alone mostly rides inside the request. Then its thread: one of another
    /// thread is registered again on the client's (`Stream::rehome`, four system
    /// calls) before the newest is preferred.
    fn score(&self, conn: &ServerConn, home: Option<usize>) -> u8 {
        let tenant = self.tenant.is_some_and(|t| conn.tenant.holds(t));
        let settings = self.settings == Some(conn.settings.version);
        4 * u8::from(settings) + 2 * u8::from(tenant) + u8::from(conn.home == home)
    }
}

/// Idle connections, oldest first. Boxed: one moves on and off the shelf per
/// transaction, a pointer rather than the whole struct.
pub(super) type Shelf = Vec<Box<ServerConn>>;

/// How many idle connections, newest first, a checkout looks at: the scan runs under the
/// pool's lock once per transaction, and a large pool's oldest connections are cold.
const SCAN_DEPTH: usize = 32;

/// Takes the newest idle connection that holds the most of `wanted` off `shelf` (among
/// the newest `SCAN_DEPTH`), skipping (and closing) any that cannot serve; `None` when
/// none is left.
pub(super) fn pick(shelf: &mut Shelf, wanted: Wanted<'_>) -> Option<Box<ServerConn>> {
    let home = crate::net::client_threads::current();
    loop {
        let newest = shelf.len().checked_sub(1)?;
        let (mut best, mut best_score) = (newest, wanted.score(&shelf[newest], home));
        for at in (newest.saturating_sub(SCAN_DEPTH - 1)..newest).rev() {
            if best_score == Wanted::ALL {
                break;
            }
            let score = wanted.score(&shelf[at], home);
            if score > best_score {
                (best, best_score) = (at, score);
            }
        }
        let mut conn = shelf.remove(best);
        if conn.is_reusable() && !conn.io.is_disturbed() {
            return Some(conn);
        }
    }
}
