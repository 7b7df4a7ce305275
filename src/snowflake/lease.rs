//! The instance number, leased from the catalog (`snowflake_lease` in
//! `sql/catalog.sql`) when this proxy first mints, renewed every third of its
//! lifetime while it mints, and given back once it has not minted for `lease_idle_ms`:
//! of a fleet of hundreds of proxies, only those minting hold one of the
//! 2^instance_bits - 1 numbers. A renewal that finds the lease gone revokes it at
//! once; one that cannot reach the catalog lets the grant run out at its local
//! deadline. Either way minting with that number stops before another proxy could be
//! given it. With no number to be had, the minter says so at once (`NoneFree`) and the
//! session mints on the shard; the keeper tries again every third of the lifetime
//! while minting is asked for.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_postgres::Client;

use super::minter::{Grant, Minter};
use crate::config::{CatalogConfig, SnowflakeConfig};

pub struct LeaseKeeper {
    pg: tokio_postgres::Config,
    addr: String,
    holder: String,
    ttl: Duration,
    idle: Duration,
    max_instance: i64,
    minter: Arc<Minter>,
}

impl LeaseKeeper {
    pub fn new(
        catalog: &CatalogConfig,
        snowflake: &SnowflakeConfig,
        holder: String,
        minter: Arc<Minter>,
    ) -> Self {
        Self {
            pg: catalog.pg_config(),
            addr: catalog.addr(),
            holder,
            ttl: Duration::from_millis(snowflake.lease_ttl_ms),
            idle: Duration::from_millis(snowflake.lease_idle_ms),
            max_instance: minter.layout().max_instance(),
            minter,
        }
    }

    /// Keeps the lease in a task until `shutdown`, then gives it back: taken when
    /// minting is first asked for, given back when it is not asked for in `idle`.
    pub async fn start(self, shutdown: watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.run(shutdown))
    }

    async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut client: Option<Client> = None;
        let mut held: Option<i64> = None;
        // After a try that found no number, the next one waits (calls keep asking).
        let mut next_try = Instant::now();
        loop {
            let wanted = self.minter.idle_for() < self.idle;
            tokio::select! {
                // Held, or none to be had while minting is asked for: every third of
                // the lifetime. Otherwise when a call asks.
                _ = tokio::time::sleep(self.ttl / 3), if held.is_some() || wanted => {}
                _ = self.minter.demand.notified() => {}
                _ = shutdown.changed() => break,
            }
            if held.is_some() && self.minter.idle_for() >= self.idle {
                if let (Some(instance), Some(c)) = (held.take(), &client) {
                    self.minter.release();
                    self.give_back(c, instance).await;
                    tracing::info!(instance, "snowflake instance given back: not minted with for a while");
                }
                continue;
            }
            if held.is_none() && (self.minter.idle_for() >= self.idle || Instant::now() < next_try) {
                continue;
            }
            if client.as_ref().is_none_or(|c| c.is_closed()) {
                client = self.connect().await.ok();
            }
            match &client {
                Some(c) => held = self.keep(c, held).await,
                None if held.is_none() => self.minter.unavailable(),
                None => {}
            }
            if held.is_none() {
                next_try = Instant::now() + self.ttl / 3;
            }
        }
        if let (Some(instance), Some(c)) = (held, &client) {
            self.minter.revoke();
            self.give_back(c, instance).await;
        }
    }

    /// Expires the lease now rather than deleting it: the expiry tells the next holder
    /// where this proxy's IDs end.
    async fn give_back(&self, client: &Client, instance: i64) {
        let _ = client
            .execute(
                "UPDATE pgtenant.snowflake_lease SET expires_at = now() WHERE instance = $1 AND holder = $2",
                &[&(instance as i16), &self.holder],
            )
            .await;
    }

    async fn connect(&self) -> Result<Client, tokio_postgres::Error> {
        let (client, connection) = self.pg.connect(tokio_postgres::NoTls).await.inspect_err(|e| {
            tracing::warn!(catalog = %self.addr, error = %e, "snowflake lease: cannot reach the catalog");
        })?;
        tokio::spawn(connection);
        Ok(client)
    }

    /// Renews the lease held, or acquires one; returns the number held afterwards.
    async fn keep(&self, client: &Client, held: Option<i64>) -> Option<i64> {
        let asked = Instant::now();
        // The catalog counts the lifetime from its own now(), which is not before `asked`.
        let valid_until = asked + self.ttl.mul_f64(0.9);
        if let Some(instance) = held {
            let renewed = client
                .query_opt(
                    "UPDATE pgtenant.snowflake_lease SET expires_at = now() + make_interval(secs => $3::float8 / 1000) \
                     WHERE instance = $1 AND holder = $2 AND expires_at > now() RETURNING instance",
                    &[&(instance as i16), &self.holder, &(self.ttl.as_millis() as f64)],
                )
                .await;
            match renewed {
                Ok(Some(_)) => {
                    self.minter.grant(Grant { instance, valid_until: Some(valid_until), floor_unix_ms: 0 });
                    return Some(instance);
                }
                Ok(None) => {
                    self.minter.revoke();
                    tracing::error!(instance, "snowflake lease lost (expired or taken); minting stopped");
                }
                Err(e) => {
                    tracing::warn!(instance, error = %e, "snowflake lease not renewed; it runs out unless the next try works");
                    return Some(instance);
                }
            }
        }
        let acquired = client
            .query_opt(
                "SELECT instance, floor_unix_ms FROM pgtenant.acquire_snowflake_instance($1, $2, $3)",
                &[&self.holder, &(self.max_instance as i32), &(self.ttl.as_millis() as i64)],
            )
            .await;
        match acquired {
            Ok(Some(row)) => {
                let instance = row.get::<_, i32>(0) as i64;
                let floor_unix_ms: i64 = row.get(1);
                self.minter.grant(Grant { instance, valid_until: Some(valid_until), floor_unix_ms });
                tracing::info!(instance, holder = %self.holder, "snowflake instance leased");
                Some(instance)
            }
            Ok(None) => {
                self.minter.unavailable();
                tracing::warn!(
                    max = self.max_instance,
                    "snowflake: every instance number is leased; the shards mint this proxy's IDs meanwhile"
                );
                None
            }
            Err(e) => {
                self.minter.unavailable();
                tracing::warn!(error = %e, "snowflake: cannot lease an instance number; the shards mint meanwhile");
                None
            }
        }
    }
}
