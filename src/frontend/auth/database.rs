//! Logins from the database (`[auth] query`, PgBouncer's `auth_query`): a name that is
//! not in `[[users]]` is looked up on a shard's primary, on pgtenant's own connection as
//! `[auth] user`, and the role's SCRAM verifier it answers checks the client. The answers
//! are cached for `cache_ttl_ms`; one that let a login fail (a rotated password, a role
//! created since) is asked again for the next attempt once it is a second old.
//!
//! Nothing the client sends before it is authenticated reaches that connection but its
//! name, as the query's one parameter: its startup `options`, `search_path` or database
//! never change what the query runs (PgBouncer's CVE-2025-12819), and the connection
//! fixes its own `search_path`. An unknown role, one without a SCRAM verifier and a
//! wrong password all fail at the same step with the same error.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::UserAuth;
use super::scram::ScramVerifier;
use crate::config::{AuthConfig, AuthMethod, NodeConfig, UserConfig};
use crate::protocol::scram::ScramKeys;

/// Names whose answers are kept at most; more are looked up again.
const MAX_ANSWERS: u64 = 10_000;
/// An answer younger than this is not asked again after a failed login, so that
/// repeated failures cannot make the query run more than once a second per name.
const MIN_REFRESH: Duration = Duration::from_secs(1);
/// The longest a lookup may take (connecting included).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// What the query answered for a name.
pub struct Answer {
    /// The role and how its clients are checked; `None`: no such login (or one without a
    /// SCRAM verifier), checked against a verifier no password matches.
    pub found: Option<Found>,
    at: Instant,
}

pub struct Found {
    pub auth: UserAuth,
    /// Its `[[users]]`-like settings, made at its first login (every client that proves
    /// this verifier recovers the same keys).
    user: OnceLock<Arc<UserConfig>>,
}

#[derive(Clone, Debug, thiserror::Error)]
#[error("the auth query on {addr} failed: {reason}")]
pub struct LookupError {
    addr: String,
    reason: String,
}

pub struct DatabaseLogins {
    config: AuthConfig,
    answers: moka::sync::Cache<String, Arc<Answer>>,
    /// One connection, reused while its node stays the one asked.
    client: tokio::sync::Mutex<Option<(String, Arc<tokio_postgres::Client>)>>,
}

impl DatabaseLogins {
    /// `None` when `[auth] query` is not set.
    pub fn new(config: &AuthConfig) -> Option<Self> {
        config.query.as_ref()?;
        let ttl = Duration::from_millis(config.cache_ttl_ms.max(1));
        Some(Self {
            config: config.clone(),
            answers: moka::sync::Cache::builder().max_capacity(MAX_ANSWERS).time_to_live(ttl).build(),
            client: tokio::sync::Mutex::new(None),
        })
    }

    /// The shard whose primary answers the query, when `[auth] shard` names one.
    pub fn shard(&self) -> Option<u16> {
        self.config.shard
    }

    /// The answer for `name`, from the cache or from `node` (the primary of the shard
    /// the query runs on).
    pub async fn lookup(&self, name: &str, node: &NodeConfig) -> Result<Arc<Answer>, LookupError> {
        if let Some(answer) = self.answers.get(name) {
            // "No such login" is asked again after a second: a role just created logs in.
            if answer.found.is_some() || answer.at.elapsed() < MIN_REFRESH {
                return Ok(answer);
            }
        }
        let addr = format!("{}:{}", node.host, node.port);
        let found = tokio::time::timeout(LOOKUP_TIMEOUT, self.query(name, node, &addr))
            .await
            .map_err(|_| LookupError { addr: addr.clone(), reason: "timed out".into() })??;
        let answer = Arc::new(Answer { found, at: Instant::now() });
        self.answers.insert(name.to_string(), answer.clone());
        Ok(answer)
    }

    /// A login of `name` failed: its answer is asked again for the next attempt, unless
    /// it is younger than a second.
    pub fn failed(&self, name: &str) {
        if self.answers.get(name).is_some_and(|a| a.at.elapsed() >= MIN_REFRESH) {
            self.answers.invalidate(name);
        }
    }

    /// The settings of `found`'s role, logging in to the servers with `keys`.
    pub fn user(&self, role: &str, found: &Found, keys: ScramKeys) -> Arc<UserConfig> {
        found.user.get_or_init(|| Arc::new(self.config.login_of(role, keys))).clone()
    }

    async fn query(&self, name: &str, node: &NodeConfig, addr: &str) -> Result<Option<Found>, LookupError> {
        let failed = |e: tokio_postgres::Error| LookupError { addr: addr.to_string(), reason: e.to_string() };
        let client = self.connection(node, addr).await.map_err(failed)?;
        let query = self.config.query.as_deref().unwrap_or_default();
        let row = match client.query_opt(query, &[&name]).await {
            Ok(row) => row,
            Err(e) => {
                // A broken connection is made again next time.
                let mut held = self.client.lock().await;
                if held.as_ref().is_some_and(|(_, c)| Arc::ptr_eq(c, &client)) {
                    *held = None;
                }
                return Err(failed(e));
            }
        };
        let secret = row.and_then(|r| r.try_get::<_, Option<String>>(1).ok().flatten());
        // Only a SCRAM verifier can check a client and log in as the role (an md5 hash
        // or no password is answered as an unknown role is).
        let verifier = secret.as_deref().and_then(ScramVerifier::parse);
        if secret.is_some() && verifier.is_none() {
            tracing::warn!(
                role = name,
                "the auth query answered a password that is not a SCRAM-SHA-256 verifier: the role cannot log in through pgtenant (set password_encryption = scram-sha-256 and set its password again)"
            );
        }
        Ok(verifier.map(|verifier| Found {
            auth: UserAuth { method: AuthMethod::ScramSha256, password: None, verifier: Some(verifier) },
            user: OnceLock::new(),
        }))
    }

    async fn connection(
        &self,
        node: &NodeConfig,
        addr: &str,
    ) -> Result<Arc<tokio_postgres::Client>, tokio_postgres::Error> {
        let mut held = self.client.lock().await;
        if let Some((at, client)) = held.as_ref()
            && at == addr
            && !client.is_closed()
        {
            return Ok(client.clone());
        }
        let mut pg = tokio_postgres::Config::new();
        pg.host(&node.host).port(node.port).dbname(&self.config.database);
        pg.user(self.config.user.as_deref().unwrap_or("postgres"));
        if let Some(password) = &self.config.password {
            pg.password(password);
        }
        pg.application_name("pgtenant auth query").connect_timeout(LOOKUP_TIMEOUT);
        pg.options("-c search_path=pg_catalog");
        let (client, connection) = pg.connect(tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        let client = Arc::new(client);
        *held = Some((addr.to_string(), client.clone()));
        Ok(client)
    }
}
