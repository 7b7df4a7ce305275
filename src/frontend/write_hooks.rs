//! Whether a write on a shard can run code pgtenant does not see: a trigger, a rule, or
//! a default, constraint, generated column or index expression that calls a function of
//! the user's (or `set_config`). Without any, a single INSERT/UPDATE/DELETE/MERGE runs
//! only PostgreSQL's own code, which cannot change the tenant GUC: the server
//! connection's GUC is still known after it, and is not set again before the next
//! transaction (issue 49: that SET was most of what PostgreSQL spent on top of a
//! single-row INSERT through pgtenant, and a fifth of a TPC-B transaction).
//!
//! Read from the shard's catalog over a control-plane connection (the user's server
//! credentials, as strict isolation reads it), kept for `REFRESH`, and forgotten when
//! this proxy forwards DDL and again when that DDL's transaction ends (a read under
//! way meanwhile may have seen the catalog before it: its answer is dropped). Until it
//! is known, and after it expires, a write counts as one that may run such code: never
//! a guess in the unsafe direction. A hook created by another proxy or directly on the
//! shard is seen within `REFRESH` (a session told "none" just before trusts that up to
//! `MEMO_MS` longer, see `HooksMemo`); the signed tenant context (`tenant_context_key`)
//! keeps a GUC forged meanwhile from being trusted by row-level security.
//!
//! The read runs on a connection of the writing session's own pool when the pool has a
//! place free (`HooksReader::Pooled`: an idle connection, or a new one), else on a
//! connection made as the pool makes one but outside it (`HooksReader::Apart`: a
//! backend's start on the shard, every `REFRESH` at most while the pool stays full).
//! That connection holds a slot of the shard's caps and fleet budget while it lives,
//! and is made only when one is free: where the pool's full size is all the caps
//! allow, no read runs and writes keep setting the tenant GUC again.
//! Either logs in with the SCRAM keys the pool keeps: a read that logged in through a
//! control-plane client of its own (every `REFRESH` while writes came) cost the proxy a
//! SCRAM key derivation each time, about 50 million instructions (callgrind; some 300
//! per transaction at the INSERT benchmark's pace).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::backend::{BackendError, CheckoutError, PooledConn, ServerConn};
use crate::directory::ShardId;

/// The `application_name` of a read's connection made beside a full pool.
pub const APART_NAME: &str = "pgtenant write hooks";

/// How long a shard's answer is trusted.
const REFRESH: Duration = Duration::from_secs(10);

/// The catalog query: true when a write may run code pgtenant does not see.
/// The rules of `pg_catalog` relations are PostgreSQL's own: `pg_settings`' turn an
/// UPDATE of it into `set_config`, which the analysis counts as anything already.
const HOOKS_SQL: &str = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger WHERE NOT tgisinternal)
    OR EXISTS (SELECT 1 FROM pg_catalog.pg_rewrite r JOIN pg_catalog.pg_class c ON c.oid = r.ev_class
               WHERE r.rulename <> '_RETURN' AND c.relnamespace <> 'pg_catalog'::regnamespace)
    OR EXISTS (
        SELECT 1 FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_proc p ON p.oid = d.refobjid
        WHERE d.refclassid = 'pg_catalog.pg_proc'::regclass
          AND d.classid IN ('pg_catalog.pg_attrdef'::regclass, 'pg_catalog.pg_constraint'::regclass,
                            'pg_catalog.pg_class'::regclass)
          AND (p.pronamespace <> 'pg_catalog'::regnamespace OR p.proname = 'set_config'))";

/// Where a read of a shard's write hooks runs.
pub enum HooksReader {
    /// The checkout of a connection of the writing session's pool, which had a place
    /// free: no login of its own.
    Pooled(Pin<Box<dyn Future<Output = Result<PooledConn, CheckoutError>> + Send>>),
    /// A connection to the pool's node outside the pool, which was full
    /// (`ServerPool::connect_apart`).
    Apart(Pin<Box<dyn Future<Output = Result<ServerConn, BackendError>> + Send>>),
}

/// What each (shard, database) answered, and which are being read.
pub struct WriteHooks {
    known: moka::sync::Cache<(ShardId, String), bool>,
    reading: moka::sync::Cache<(ShardId, String), ()>,
    /// Counts `forget`s: a read that began before one may have seen the catalog as it
    /// was before the DDL, and its answer is not kept.
    forgotten: AtomicU64,
}

impl Default for WriteHooks {
    fn default() -> Self {
        Self {
            known: moka::sync::Cache::builder().max_capacity(4096).time_to_live(REFRESH).build(),
            reading: moka::sync::Cache::builder().max_capacity(4096).time_to_live(REFRESH).build(),
            forgotten: AtomicU64::new(0),
        }
    }
}

/// How long a session trusts the shared answer it read last without asking again.
const MEMO_MS: u64 = 1000;

/// One session's copy of the last "none" it was told, for its next writes: the shared
/// answer costs a key of the database's name and a hashed lookup, on every write. Kept
/// by shard (a session's database does not change); void once any DDL made the shared
/// answers be read again, and after `MEMO_MS`.
#[derive(Default)]
pub struct HooksMemo(Option<(ShardId, u64, u64)>);

impl HooksMemo {
    /// `WriteHooks::none_known`, answered from the memo while it holds.
    pub fn none_known(
        &mut self,
        hooks: &Arc<WriteHooks>,
        shard: ShardId,
        database: &str,
        reader: impl FnOnce() -> Option<HooksReader>,
    ) -> bool {
        let now = crate::backend::coarse_clock::coarse_ms();
        let forgotten = hooks.forgotten.load(Ordering::Acquire);
        if let Some((memo_shard, memo_forgotten, until)) = self.0
            && (memo_shard, memo_forgotten) == (shard, forgotten)
            && now < until
        {
            return true;
        }
        let none = hooks.none_known(shard, database, reader);
        self.0 = none.then_some((shard, forgotten, now + MEMO_MS));
        none
    }
}

impl WriteHooks {
    /// Whether a write to `database` on `shard` is known to run no code pgtenant does not
    /// see. When that is not known, it is read in the background (through the `reader`
    /// asked for then) and the answer is `false` meanwhile.
    pub fn none_known(
        self: &Arc<Self>,
        shard: ShardId,
        database: &str,
        reader: impl FnOnce() -> Option<HooksReader>,
    ) -> bool {
        let key = (shard, database.to_string());
        if let Some(hooks) = self.known.get(&key) {
            return !hooks;
        }
        if self.reading.contains_key(&key) {
            return false;
        }
        let Some(reader) = reader() else { return false };
        self.reading.insert(key.clone(), ());
        let hooks = self.clone();
        let forgotten = self.forgotten.load(Ordering::Acquire);
        tokio::spawn(async move {
            match read_hooks(reader).await {
                Ok(any) if hooks.forgotten.load(Ordering::Acquire) == forgotten => {
                    hooks.known.insert(key.clone(), any);
                    hooks.reading.invalidate(&key);
                }
                // DDL since: read again on next need (its `forget` let a new read begin).
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(shard = key.0, error = %e, "could not read the shard's write hooks");
                    hooks.reading.invalidate(&key);
                }
            }
        });
        false
    }

    /// DDL went to `database` on `shard`, or its transaction ended: read again on next
    /// need, and keep no answer read before now.
    pub fn forget(&self, shard: ShardId, database: &str) {
        self.forgotten.fetch_add(1, Ordering::AcqRel);
        let key = (shard, database.to_string());
        self.known.invalidate(&key);
        self.reading.invalidate(&key);
    }
}

/// Reads whether writes may run hooks, through `reader`. A server that answers
/// something else than false (NULL, another type) counts as one with hooks.
async fn read_hooks(reader: HooksReader) -> Result<bool, String> {
    let answer = match reader {
        HooksReader::Pooled(checkout) => {
            checkout.await.map_err(|e| e.to_string())?.query_first_column(HOOKS_SQL).await
        }
        HooksReader::Apart(connect) => {
            connect.await.map_err(|e| e.to_string())?.query_first_column(HOOKS_SQL).await
        }
    };
    match answer {
        Ok(Ok(values)) => Ok(values.first().is_none_or(|v| v != "f")),
        Ok(Err(refused)) => Err(refused.message),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_s_memo_holds_until_ddl_makes_the_answers_be_read_again() {
        let hooks = Arc::new(WriteHooks::default());
        let mut memo = HooksMemo::default();
        // Nothing known, nothing to read it with: writes count as running hooks.
        assert!(!memo.none_known(&hooks, 1, "app", || None));
        hooks.known.insert((1, "app".into()), false);
        assert!(memo.none_known(&hooks, 1, "app", || None));
        // Told by the memo while the shared answer is gone, on the same shard only.
        hooks.known.invalidate(&(1, "app".into()));
        assert!(memo.none_known(&hooks, 1, "app", || None));
        assert!(!memo.none_known(&hooks, 2, "app", || None));
        hooks.known.insert((1, "app".into()), false);
        assert!(memo.none_known(&hooks, 1, "app", || None));
        // DDL: the memo is void at once.
        hooks.forget(1, "app");
        assert!(!memo.none_known(&hooks, 1, "app", || None));
    }
}
