//! `[[users]]`: the logins clients may use, the credentials pgtenant uses on the servers
//! for each, and what each may do (pool, read target, admin, scatter-gather, limits);
//! `[auth]`: the logins looked up in the database instead.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{PoolMode, ProxyConfig};
use crate::protocol::scram::ScramKeys;

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, Default)]
pub enum AuthMethod {
    #[default]
    #[serde(rename = "scram-sha-256")]
    ScramSha256,
    #[serde(rename = "md5")]
    Md5,
    #[serde(rename = "password")]
    Cleartext,
    #[serde(rename = "trust")]
    Trust,
}

/// A login clients may use, and the credentials pgtenant uses on the servers for it.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    pub name: String,
    /// Password clients present; also the server password unless `server_password` is set.
    pub password: Option<String>,
    /// A SCRAM verifier (`SCRAM-SHA-256$iter:salt$stored:server`) instead of a password.
    pub scram_secret: Option<String>,
    #[serde(default)]
    pub auth: AuthMethod,
    pub server_user: Option<String>,
    pub server_password: Option<String>,
    #[serde(default = "default_pool_size")]
    pub pool_size: usize,
    pub pool_mode: Option<PoolMode>,
    /// Overrides `[proxy].allow_tenant_switch` for this user (a service that serves
    /// many tenants on one connection, say).
    pub allow_tenant_switch: Option<bool>,
    /// Where this user's provably read-only requests go when its sessions do not say
    /// (`pgtenant.target` at login): `primary` (the default), `prefer-replica` or `replica`.
    #[serde(default)]
    pub target: Option<ReadTarget>,
    /// May use the admin console (the virtual database `pgtenant`).
    #[serde(default)]
    pub admin: bool,
    /// May run scatter-gather queries (`all_shards.`) without being an admin.
    #[serde(default)]
    pub scatter_gather: bool,
    /// Clients of this login connected at once at most; overrides `[proxy]
    /// max_user_client_connections` (0 = no limit).
    #[serde(default)]
    pub max_client_connections: Option<usize>,
    /// Its sessions may name the server-wide views and functions of other sessions
    /// (`pg_stat_activity`, `pg_locks`, `pg_terminate_backend`, ...), which pgtenant
    /// refuses to everyone else: for a DBA's or a monitor's login with a server role of
    /// its own, never for one that tenants share.
    #[serde(default)]
    pub see_other_sessions: bool,
    /// A login from the database (`[auth]`): pgtenant logs in to the servers as the
    /// client's own role with these keys (SCRAM passthrough), never with a password.
    #[serde(skip)]
    pub passthrough: Option<Arc<ScramKeys>>,
    /// Who reads the shards' catalogs for its sessions (strict isolation's tables) where
    /// its own server login cannot be made with a password (a login passed through):
    /// `[auth]`'s user and password.
    #[serde(skip)]
    pub catalog_login: Option<Arc<(String, Option<String>)>>,
}

/// `[auth]`: logins that are not in `[[users]]` are looked up in the database, as
/// PgBouncer's `auth_query`, and log in to the servers as the client's own role.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// The query that finds a login: `$1` is the name the client gave, and it answers
    /// one row of the role's name and its `rolpassword` (a SCRAM verifier), or none.
    /// Unset: only `[[users]]` log in.
    pub query: Option<String>,
    /// The login the query runs as (it must be able to read what the query reads; for
    /// `pg_shadow`, a superuser, or a SECURITY DEFINER function of one).
    pub user: Option<String>,
    pub password: Option<String>,
    /// The database the query runs in.
    pub database: String,
    /// The shard whose primary answers the query (the roles must be the same on every
    /// shard); unset: `[proxy] default_shard`, else the lowest shard id.
    pub shard: Option<u16>,
    /// How long an answer is used before the query runs again. A failed login with an
    /// answer older than a second runs it again for the next attempt, so a new password
    /// works at the latest on the second try.
    pub cache_ttl_ms: u64,
    /// Server connections per (node, role, database) for these logins.
    pub pool_size: usize,
    /// Overrides `[proxy] pool_mode` for these logins.
    pub pool_mode: Option<PoolMode>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            query: None,
            user: None,
            password: None,
            database: "postgres".into(),
            shard: None,
            cache_ttl_ms: 60_000,
            pool_size: default_pool_size(),
            pool_mode: None,
        }
    }
}

impl AuthConfig {
    /// The settings of a login the query found, as a `[[users]]` entry with the
    /// defaults, logging in to the servers as itself with `keys`.
    pub fn login_of(&self, role: &str, keys: ScramKeys) -> UserConfig {
        UserConfig {
            name: role.to_string(),
            password: None,
            scram_secret: None,
            auth: AuthMethod::ScramSha256,
            server_user: None,
            server_password: None,
            pool_size: self.pool_size,
            pool_mode: self.pool_mode,
            allow_tenant_switch: None,
            target: None,
            admin: false,
            scatter_gather: false,
            max_client_connections: None,
            see_other_sessions: false,
            passthrough: Some(Arc::new(keys)),
            catalog_login: self.user.clone().map(|user| Arc::new((user, self.password.clone()))),
        }
    }
}

impl UserConfig {
    /// Clients of this login that may be connected at once (`None`: no limit of its own).
    pub fn client_limit(&self, proxy: &ProxyConfig) -> Option<usize> {
        Some(self.max_client_connections.unwrap_or(proxy.max_user_client_connections)).filter(|n| *n > 0)
    }
}

/// Where a session's reads may go, as libpq's `target_session_attrs`: all to the
/// primary, to a healthy replica when there is one, or only to replicas.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ReadTarget {
    #[default]
    Primary,
    PreferReplica,
    Replica,
}

fn default_pool_size() -> usize {
    20
}

impl UserConfig {
    pub fn server_user(&self) -> &str {
        self.server_user.as_deref().unwrap_or(&self.name)
    }
    pub fn server_password(&self) -> Option<&str> {
        self.server_password.as_deref().or(self.password.as_deref())
    }
}
