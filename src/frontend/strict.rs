//! Strict isolation (`proxy.isolation = "strict"`): which tables of a shard hold
//! tenants without forced row-level security, read from the shard's catalog and cached,
//! and the check that a session's statement touching one is confined to its tenant.
//!
//! The list is read over a control-plane connection (tokio-postgres, the user's server
//! credentials, no TLS), kept for `REFRESH` and forgotten when this proxy forwards DDL,
//! so that a table whose policy changes is seen within that time. One read per
//! (shard, database) at a time: the sessions that need the list while it is read wait
//! for that read's answer, so a busy proxy does not log in once per waiting session
//! (each login a SCRAM key derivation here and a backend's start on the shard) each
//! time the list expires.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, NodeConfig, UserConfig};
use crate::directory::{ShardId, TenantId};
use crate::router::Confinement;

use super::error::FrontendError;

/// How long a shard's list of tenant tables is trusted.
const REFRESH: Duration = Duration::from_secs(10);

/// How long one read of a list may take, its login included. Past it the statements
/// that wait for it are refused as for a read that failed, and the next need reads
/// again: a catalog that stopped answering (a lock on it, a server that hangs) held
/// every strict session of that shard and database for as long as it did. The server
/// is told the same as its `statement_timeout` (`catalog_reader`).
const READ_LIMIT: Duration = Duration::from_secs(10);

/// Tables and views with the tenant column, by name (`name` and `schema.name`,
/// lowercased): whether row-level security binds everyone there (enabled and forced).
#[derive(Debug, Default)]
pub struct TenantTables(foldhash::HashMap<Box<str>, bool>);

impl TenantTables {
    /// Whether `relation` (as a statement names it) holds tenants without forced RLS.
    fn unforced(&self, relation: &str) -> bool {
        self.0.get(relation).is_some_and(|forced| !forced)
    }

    /// Whether any table of the shard holds tenants without forced RLS.
    fn any_unforced(&self) -> bool {
        self.0.values().any(|forced| !forced)
    }
}

/// A read's answer: the tables, or why they could not be read.
type ReadAnswer = Result<Arc<TenantTables>, String>;

/// The answer of one (shard, database)'s read, shared by whoever needs it while it runs.
type SharedRead = Arc<tokio::sync::OnceCell<ReadAnswer>>;

/// The tenant tables of each (shard, database), read on first need.
pub struct StrictCatalog {
    tables: moka::sync::Cache<(ShardId, String), SharedRead>,
}

impl Default for StrictCatalog {
    fn default() -> Self {
        Self { tables: moka::sync::Cache::builder().max_capacity(4096).time_to_live(REFRESH).build() }
    }
}

impl StrictCatalog {
    /// The tenant tables of `database` on `node` of `shard`.
    async fn tables(
        &self,
        config: &Config,
        shard: ShardId,
        node: &NodeConfig,
        user: &UserConfig,
        database: &str,
    ) -> Result<Arc<TenantTables>, FrontendError> {
        let dbname = node.dbname.as_deref().unwrap_or(database);
        let read = || async {
            read_tenant_tables(config, node, user, dbname).await.map(Arc::new).map_err(|e| e.to_string())
        };
        self.tables_with((shard, dbname.to_string()), READ_LIMIT, read)
            .await
            .map_err(|reason| FrontendError::StrictCatalog { shard, reason })
    }

    /// The tables kept for `key`, or `read`'s answer: the one read of `key` under way
    /// if there is one, else a new one, given `limit`. A failed read is not kept
    /// (the next need reads again), but everyone who waited for it gets its error
    /// rather than a read of their own one after another.
    async fn tables_with<F, R>(&self, key: (ShardId, String), limit: Duration, read: F) -> ReadAnswer
    where
        F: FnOnce() -> R,
        R: std::future::Future<Output = ReadAnswer>,
    {
        // By reference: the key is copied only when a new read is put in the cache.
        let shared: SharedRead = self.tables.get_with_by_ref(&key, Default::default);
        let bounded = || async {
            let late = || format!("the catalog did not answer within {} ms", limit.as_millis());
            tokio::time::timeout(limit, read()).await.unwrap_or_else(|_| Err(late()))
        };
        let answer = shared.get_or_init(bounded).await.clone();
        if answer.is_err() {
            // Only this read's entry: a later one may be in its place already.
            self.tables.entry(key).and_compute_with(|kept| match kept {
                Some(entry) if Arc::ptr_eq(entry.value(), &shared) => moka::ops::compute::Op::Remove,
                _ => moka::ops::compute::Op::Nop,
            });
        }
        answer
    }

    /// DDL went to `database` on `shard`: its list is read again on next need.
    fn forget(&self, shard: ShardId, node: &NodeConfig, database: &str) {
        self.tables.invalidate(&(shard, node.dbname.as_deref().unwrap_or(database).to_string()));
    }
}

async fn read_tenant_tables(
    config: &Config,
    node: &NodeConfig,
    user: &UserConfig,
    dbname: &str,
) -> Result<TenantTables, tokio_postgres::Error> {
    let client = super::catalog_reader(node, user, dbname, "pgtenant strict isolation", READ_LIMIT).await?;
    let rows = client
        .query(
            "SELECT lower(n.nspname), lower(c.relname), c.relrowsecurity AND c.relforcerowsecurity
             FROM pg_catalog.pg_attribute a
             JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE a.attname = $1 AND a.attnum > 0 AND NOT a.attisdropped
               AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
               AND n.nspname NOT IN ('pg_catalog', 'information_schema')",
            &[&config.proxy.tenant_column],
        )
        .await?;
    let mut tables = TenantTables::default();
    for row in rows {
        let (schema, name, forced): (String, String, bool) = (row.get(0), row.get(1), row.get(2));
        // A name in several schemas counts as forced only if it is forced in all.
        for key in [format!("{schema}.{name}"), name] {
            let entry = tables.0.entry(key.into()).or_insert(true);
            *entry &= forced;
        }
    }
    Ok(tables)
}

/// What the strict check needs of the session.
pub(crate) struct StrictCheck<'a> {
    pub config: &'a Config,
    pub catalog: &'a StrictCatalog,
    pub shard: ShardId,
    pub node: &'a NodeConfig,
    pub user: &'a UserConfig,
    pub database: &'a str,
    /// The session's tenant.
    pub tenant: &'a TenantId,
}

impl StrictCheck<'_> {
    /// Refuses a statement that touches a table holding tenants without forced RLS,
    /// unless `confinement` shows it confined to the session's tenant. `ddl`: the
    /// statement may change tables, and the shard's list is read again afterwards.
    pub async fn check(&self, confinement: Confinement, ddl: bool) -> Result<(), FrontendError> {
        let tables =
            self.catalog.tables(self.config, self.shard, self.node, self.user, self.database).await?;
        if ddl {
            self.catalog.forget(self.shard, self.node, self.database);
        }
        let refuse = |table: &str| FrontendError::StrictIsolation {
            tenant: self.tenant.clone(),
            shard: self.shard,
            table: table.to_string(),
        };
        let Some(relations) = confinement.relations else {
            // pgtenant cannot tell which tables it touches.
            return match tables.any_unforced() {
                true => Err(refuse("a table the statement may touch")),
                false => Ok(()),
            };
        };
        let Some(unforced) = relations.iter().find(|r| tables.unforced(r)) else { return Ok(()) };
        let confined = relations.len() == 1
            && !confinement.tenants.is_empty()
            && confinement.tenants.iter().all(|t| t.as_ref() == Some(self.tenant));
        if confined { Ok(()) } else { Err(refuse(unforced)) }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::sync::Notify;

    use super::*;

    fn key() -> (ShardId, String) {
        (1, "app".to_string())
    }

    /// Sixteen needs of `key()` at once, whose read (if any) answers `answer` once
    /// every read under way has begun: how many reads ran, and what each need got.
    async fn sixteen_needs(catalog: &StrictCatalog, answer: ReadAnswer) -> (usize, Vec<ReadAnswer>) {
        let (reads, release) = (AtomicUsize::new(0), Notify::new());
        let read = || async {
            reads.fetch_add(1, Ordering::SeqCst);
            release.notified().await;
            answer.clone()
        };
        let needs =
            futures_util::future::join_all((0..16).map(|_| catalog.tables_with(key(), READ_LIMIT, read)));
        let release_when_reading = async {
            while reads.load(Ordering::SeqCst) == 0 {
                tokio::task::yield_now().await;
            }
            // Every read under way goes on: were there several, all would count.
            release.notify_waiters();
        };
        let both = async { tokio::join!(needs, release_when_reading) };
        let (answers, ()) = tokio::time::timeout(Duration::from_secs(10), both).await.expect("the needs end");
        (reads.load(Ordering::SeqCst), answers)
    }

    /// Sixteen needs of one (shard, database) while its read runs: all wait for it,
    /// and its answer, once kept, serves the next need without a read.
    #[tokio::test]
    async fn needs_during_a_read_share_it() {
        let catalog = StrictCatalog::default();
        let tables = Arc::new(TenantTables([("t".into(), false)].into_iter().collect()));
        let (reads, answers) = sixteen_needs(&catalog, Ok(tables)).await;
        assert_eq!(reads, 1);
        assert!(answers.iter().all(|a| a.as_ref().is_ok_and(|t| t.unforced("t"))));
        let unread = catalog.tables_with(key(), READ_LIMIT, || async { unreachable!("kept: no read") }).await;
        assert!(unread.is_ok_and(|t| t.unforced("t")));
    }

    /// A read that fails fails everyone who waited for it, once, and is not kept.
    #[tokio::test]
    async fn a_failed_read_fails_its_waiters_and_is_not_kept() {
        let catalog = StrictCatalog::default();
        let (reads, answers) = sixteen_needs(&catalog, Err("connection refused".to_string())).await;
        assert_eq!(reads, 1);
        assert!(answers.iter().all(|a| a.as_ref().is_err_and(|e| e == "connection refused")));
        let again =
            catalog.tables_with(key(), READ_LIMIT, || async { Ok(Arc::new(TenantTables::default())) }).await;
        assert!(again.is_ok());
    }

    /// A read that never ends fails its waiters at the limit, and is not kept.
    #[tokio::test]
    async fn a_read_that_hangs_fails_its_waiters_at_the_limit() {
        let catalog = StrictCatalog::default();
        let limit = Duration::from_millis(50);
        let hung = || std::future::pending::<ReadAnswer>();
        let needs = futures_util::future::join_all((0..16).map(|_| catalog.tables_with(key(), limit, hung)));
        let needs = tokio::time::timeout(Duration::from_secs(10), needs).await.expect("the needs end");
        assert!(
            needs.iter().all(|a| a.as_ref().is_err_and(|e| e == "the catalog did not answer within 50 ms"))
        );
        let again =
            catalog.tables_with(key(), limit, || async { Ok(Arc::new(TenantTables::default())) }).await;
        assert!(again.is_ok(), "the hung read is not kept");
    }
}
