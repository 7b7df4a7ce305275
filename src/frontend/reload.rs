//! RELOAD (the admin console) and SIGHUP: the configuration file is read again and
//! validated in full. A bad file, or one that changes a setting fixed for the process
//! (`config::needs_restart`), is refused with every problem named and the running
//! configuration kept. A good one replaces the users (new logins see new passwords,
//! users, rights and pool modes; a user's pools whose size or server credentials
//! changed are replaced, the old ones draining as their connections come back), the
//! file's shards, ranges and tenant map (sessions route by them from their next
//! transaction), its tenant limits, the session timeouts (running sessions from their next request), and
//! the TLS certificate and key, read again from their files even when the paths did
//! not change (new clients get the renewed certificate; connected ones keep theirs).

use std::collections::HashMap;
use std::sync::Arc;

use super::Shared;
use super::auth::UserAuth;
use super::auth::database::DatabaseLogins;
use crate::config::{Config, ConfigError, UserConfig, needs_restart};

/// The logins in force, and how each authenticates.
pub struct Users {
    pub configs: HashMap<String, Arc<UserConfig>>,
    pub auth: HashMap<String, UserAuth>,
    /// The logins looked up in the database (`[auth] query`), with their cache.
    pub from_database: Option<Arc<DatabaseLogins>>,
}

impl Users {
    pub fn of(config: &Config) -> Self {
        Self {
            configs: config.users.iter().map(|u| (u.name.clone(), Arc::new(u.clone()))).collect(),
            auth: config.users.iter().map(|u| (u.name.clone(), UserAuth::from_config(u))).collect(),
            from_database: DatabaseLogins::new(&config.auth).map(Arc::new),
        }
    }
}

impl Shared {
    /// Reads the configuration file again and applies it (see the module comment).
    pub fn reload(&self) -> Result<(), Vec<String>> {
        let Some(path) = self.config_path.get() else {
            return Err(vec![
                "this proxy was not started from a file (pgtenant serve --config): nothing to read again"
                    .into(),
            ]);
        };
        let new = Config::load(path).map_err(|e| match e {
            ConfigError::Invalid(problems) => problems,
            other => vec![other.to_string()],
        })?;
        let running = self.file_config();
        let fixed = needs_restart(&running, &new);
        if !fixed.is_empty() {
            return Err(fixed
                .into_iter()
                .map(|setting| format!("{setting} changed: that needs a restart"))
                .collect());
        }
        // Read before anything changes: a certificate that does not load refuses it all.
        let tls = match &new.tls {
            Some(t) => Some(Arc::new(super::client_tls(&t.cert, &t.key).map_err(|e| vec![e])?)),
            None => None,
        };
        self.router.reload_layout(&new).map_err(|e| vec![e])?;
        self.pools.reload_limits(&new);
        *self.users.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Users::of(&new));
        self.pools.users_changed(&new.users);
        self.timeouts.set(&new.proxy);
        *self.tls.write().unwrap_or_else(|e| e.into_inner()) = tls;
        *self.file_config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(new);
        tracing::info!(file = %path.display(), "configuration reloaded");
        Ok(())
    }

    /// The configuration as last read from the file (the startup one until a RELOAD).
    pub fn file_config(&self) -> Arc<Config> {
        self.file_config.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The logins in force.
    pub fn users(&self) -> Arc<Users> {
        self.users.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl crate::admin::Reloader for Shared {
    fn reload(&self) -> Result<(), Vec<String>> {
        Shared::reload(self)
    }
}
