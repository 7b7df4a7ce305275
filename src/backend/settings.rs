//! Session settings a client expects on whatever server connection it gets
//! (startup parameters and SET), interned so that clients with identical settings
//! share one version and a server already synchronised for one needs no new SETs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use crate::directory::TenantId;

/// How a setting's value is written.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SettingValue {
    /// Text as in a startup parameter or postgresql.conf, applied with `set_config`.
    Config(String),
    /// SQL text from the client's own `SET name = <value>`.
    Sql(String),
}

/// One immutable set of settings, identified by `version`.
#[derive(Debug, PartialEq, Eq)]
pub struct Settings {
    pub version: u64,
    /// Sorted by lower-cased name, one entry per name.
    pub list: Vec<(String, SettingValue)>,
}

const MAX_INTERNED: usize = 10_000;

static NEXT_VERSION: AtomicU64 = AtomicU64::new(1);
/// Settings by content, so identical lists share one `Arc` and one version.
type Interned = HashMap<Vec<(String, SettingValue)>, Arc<Settings>>;

static INTERNED: LazyLock<Mutex<Interned>> = LazyLock::new(|| Mutex::new(HashMap::new()));
static EMPTY: LazyLock<Arc<Settings>> = LazyLock::new(|| Arc::new(Settings { version: 0, list: Vec::new() }));

impl Settings {
    /// The settings of a fresh server connection.
    pub fn empty() -> Arc<Settings> {
        EMPTY.clone()
    }

    /// Returns the shared `Settings` for this list.
    pub fn intern(mut list: Vec<(String, SettingValue)>) -> Arc<Settings> {
        list.sort_by_key(|a| a.0.to_ascii_lowercase());
        list.dedup_by(|later, earlier| {
            if later.0.eq_ignore_ascii_case(&earlier.0) {
                earlier.1 = later.1.clone();
                true
            } else {
                false
            }
        });
        if list.is_empty() {
            return Self::empty();
        }
        let mut interned = INTERNED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = interned.get(&list) {
            return s.clone();
        }
        let s =
            Arc::new(Settings { version: NEXT_VERSION.fetch_add(1, Ordering::Relaxed), list: list.clone() });
        if interned.len() < MAX_INTERNED {
            interned.insert(list, s.clone());
        }
        s
    }

    /// These settings with `name` set to `value`.
    pub fn with(&self, name: &str, value: SettingValue) -> Arc<Settings> {
        let mut list: Vec<_> =
            self.list.iter().filter(|(n, _)| !n.eq_ignore_ascii_case(name)).cloned().collect();
        list.push((name.to_string(), value));
        Self::intern(list)
    }

    /// These settings without `name`.
    pub fn without(&self, name: &str) -> Arc<Settings> {
        Self::intern(self.list.iter().filter(|(n, _)| !n.eq_ignore_ascii_case(name)).cloned().collect())
    }

    fn get(&self, name: &str) -> Option<&SettingValue> {
        self.list.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v)
    }
}

/// Quotes `s` as an SQL string literal.
pub fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A setting's name as quoted identifiers (`"app"."user"`): a part may be a reserved
/// word, and the server looks settings up ignoring case anyway.
fn quote_setting_name(name: &str) -> String {
    name.split('.').map(|part| format!("\"{}\"", part.replace('"', "\"\""))).collect::<Vec<_>>().join(".")
}

/// What a server connection's tenant GUC holds, as far as pgtenant knows.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum TenantGuc {
    /// Whatever the server's defaults say (a new connection, after RESET ALL or
    /// DISCARD ALL): possibly a default that ALTER ROLE/DATABASE set, so never trusted.
    #[default]
    Unknown,
    /// Set by pgtenant: to a tenant, or empty for none.
    Known(Option<TenantId>),
}

impl TenantGuc {
    /// Whether the server is known to hold `to` (a tenant, or none) already.
    pub fn holds(&self, to: Option<&TenantId>) -> bool {
        matches!(self, TenantGuc::Known(t) if t.as_ref() == to)
    }
}

/// The SQL that takes a server's session settings from `from` to `to`, or `None`
/// when nothing differs. A value the server rejects fails the whole string, which
/// runs as one implicit transaction: keep the tenant GUC out of it (`tenant_sql`).
pub fn settings_sql(from: &Settings, to: &Settings) -> Option<String> {
    if from.version == to.version {
        return None;
    }
    let mut sql = String::new();
    for (name, _) in &from.list {
        if to.get(name).is_none() {
            sql.push_str(&format!("RESET {};", quote_setting_name(name)));
        }
    }
    for (name, value) in &to.list {
        if from.get(name) == Some(value) {
            continue;
        }
        match value {
            SettingValue::Config(v) => sql.push_str(&format!(
                "SELECT pg_catalog.set_config({}, {}, false);",
                quote_literal(name),
                quote_literal(v)
            )),
            SettingValue::Sql(v) => sql.push_str(&format!("SET {} = {v};", quote_setting_name(name))),
        }
    }
    (!sql.is_empty()).then_some(sql)
}

/// The SQL that sets the tenant GUC (named `tenant_guc`; `None` when it is not set)
/// from `from` to `to`, or `None` when it already holds it.
pub fn tenant_sql(from: &TenantGuc, to: Option<&TenantId>, tenant_guc: Option<&str>) -> Option<String> {
    let guc = tenant_guc?;
    if from.holds(to) {
        return None;
    }
    Some(match to {
        Some(t) => format!("SET {guc} = {};", quote_literal(&t.key_text())),
        // Empty, not RESET: RESET would restore a default that ALTER ROLE/DATABASE may have set.
        None => format!("SET {guc} = '';"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(v: &str) -> SettingValue {
        SettingValue::Config(v.into())
    }

    #[test]
    fn identical_lists_share_a_version() {
        let a =
            Settings::intern(vec![("TimeZone".into(), cfg("UTC")), ("application_name".into(), cfg("x"))]);
        let b =
            Settings::intern(vec![("application_name".into(), cfg("x")), ("TimeZone".into(), cfg("UTC"))]);
        assert!(Arc::ptr_eq(&a, &b));
        assert_ne!(a.version, Settings::empty().version);
        let c = a.with("timezone", cfg("Europe/Paris"));
        assert_eq!(c.list.len(), 2);
        assert_ne!(c.version, a.version);
    }

    #[test]
    fn sync_sets_resets_and_switches_tenant() {
        let from = Settings::intern(vec![("search_path".into(), cfg("a")), ("work_mem".into(), cfg("4MB"))]);
        let to = Settings::intern(vec![("search_path".into(), SettingValue::Sql("b, public".into()))]);
        assert_eq!(settings_sql(&from, &to).unwrap(), r#"RESET "work_mem";SET "search_path" = b, public;"#);
        assert_eq!(settings_sql(&to, &to), None);
        let one = TenantGuc::Known(Some(TenantId::Int(1)));
        let sql = tenant_sql(&one, Some(&TenantId::Int(2)), Some("pgtenant.tenant_id")).unwrap();
        assert_eq!(sql, "SET pgtenant.tenant_id = '2';");
        assert_eq!(tenant_sql(&TenantGuc::Known(None), None, Some("g")), None);
        let three = TenantGuc::Known(Some(TenantId::Int(3)));
        assert_eq!(tenant_sql(&three, None, Some("g")).unwrap(), "SET g = '';");
        assert_eq!(tenant_sql(&three, None, None), None);
        // A connection whose GUC pgtenant did not set gets it set, even to "none".
        assert_eq!(tenant_sql(&TenantGuc::Unknown, None, Some("g")).unwrap(), "SET g = '';");
        // Text keys are quoted as literals.
        let text = TenantId::Text("o'brien".into());
        assert_eq!(tenant_sql(&three, Some(&text), Some("g")).unwrap(), "SET g = 'o''brien';");
        let quoted = settings_sql(
            &Settings::empty(),
            &Settings::intern(vec![("application_name".into(), cfg("it's"))]),
        );
        assert_eq!(quoted.unwrap(), "SELECT pg_catalog.set_config('application_name', 'it''s', false);");
    }
}
