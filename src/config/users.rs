//! `[[users]]`: the logins clients may use, the credentials pgtenant uses on the servers
//! for each, and what each may do (pool, read target, admin, scatter-gather, limits).

use serde::{Deserialize, Serialize};

use super::{PoolMode, ProxyConfig};

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
