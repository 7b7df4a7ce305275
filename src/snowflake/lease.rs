//! The instance number, leased from the catalog (`snowflake_lease` in
//! `sql/catalog.sql`) and renewed every third of its lifetime. A renewal that finds
//! the lease gone revokes it at once; one that cannot reach the catalog lets the
//! grant run out at its local deadline. Either way minting stops before another
//! proxy could be given the same number, and resumes with the next lease.

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
            max_instance: minter.layout().max_instance(),
            minter,
        }
    }

    /// Takes the first lease (so that a proxy mints from its first client on) and
    /// keeps it renewed in a task until `shutdown`, then gives it back.
    pub async fn start(self, shutdown: watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
        let client = self.connect().await.ok();
        let held = match &client {
            Some(c) => self.keep(c, None).await,
            None => None,
        };
        tokio::spawn(self.run(client, held, shutdown))
    }

    async fn run(
        self,
        mut client: Option<Client>,
        mut held: Option<i64>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.ttl / 3) => {}
                _ = shutdown.changed() => break,
            }
            if client.as_ref().is_none_or(|c| c.is_closed()) {
                client = self.connect().await.ok();
            }
            if let Some(c) = &client {
                held = self.keep(c, held).await;
            }
        }
        if let (Some(instance), Some(c)) = (held, &client) {
            self.minter.revoke();
            // Expire now rather than delete: the expiry tells the next holder where our IDs end.
            let _ = c
                .execute(
                    "UPDATE pgtenant.snowflake_lease SET expires_at = now() WHERE instance = $1 AND holder = $2",
                    &[&(instance as i16), &self.holder],
                )
                .await;
        }
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
                tracing::error!(
                    max = self.max_instance,
                    "snowflake: every instance number is leased; not minting"
                );
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "snowflake: cannot lease an instance number");
                None
            }
        }
    }
}
