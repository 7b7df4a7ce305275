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
    /// The text of setting `name` (case-insensitive) as the client gave it, quotes of a
    /// SQL literal taken off; `None` when the session did not set it.
    pub fn value_of(&self, name: &str) -> Option<&str> {
        Some(match self.get(name)? {
            SettingValue::Sql(text) => text.trim().trim_matches('\''),
            SettingValue::Config(text) => text.trim(),
        })
    }

    /// The session's `statement_timeout` in milliseconds, when it set one above 0, read
    /// as PostgreSQL reads it (a number is milliseconds; `us`, `ms`, `s`, `min`, `h`
    /// and `d` units).
    pub fn statement_timeout_ms(&self) -> Option<u64> {
        let text = self.value_of("statement_timeout")?;
        let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let number: f64 = number.parse().ok()?;
        let ms = number
            * match unit.trim() {
                "" | "ms" => 1.0,
                "us" => 0.001,
                "s" => 1000.0,
                "min" => 60_000.0,
                "h" => 3_600_000.0,
                "d" => 86_400_000.0,
                _ => return None,
            };
        (ms >= 1.0).then_some(ms as u64)
    }

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

/// What a server connection's `default_transaction_read_only` holds, as far as pgtenant
/// knows: the server's own wall behind its check of each statement for tenants that
/// may not write, which also stops writes hidden in functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ReadOnlyGuc {
    /// Not turned on by pgtenant, as a new connection starts (or after RESET ALL,
    /// DISCARD ALL): what it holds is the server's default or the client's own.
    #[default]
    Off,
    /// Turned on by pgtenant.
    On,
    /// Turned on by pgtenant, then SQL pgtenant cannot follow (a DO block, a function)
    /// ran, which may have turned it off: set again before the next transaction (or
    /// taken down, for a tenant that may write). Code that runs where pgtenant put up no
    /// wall leaves `Off`: what it does to the setting is the client's own business.
    Unknown,
}

impl ReadOnlyGuc {
    /// Whether the server is known to hold the mode a tenant that may (`false`) or may
    /// not (`true`) write needs.
    pub fn holds(self, read_only: bool) -> bool {
        self == if read_only { ReadOnlyGuc::On } else { ReadOnlyGuc::Off }
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

/// The GUC that carries the signature of the tenant GUC's value (see `sql/rls.sql`).
pub const TENANT_SIGNATURE_GUC: &str = "pgtenant.tenant_sig";

/// How pgtenant tells a server connection whose tenant it serves: the tenant GUC, and
/// the key it signs the value with (`proxy.tenant_context_key`), so that row-level
/// security can tell pgtenant's value from one the tenant's own SQL set.
#[derive(Clone, Copy, Debug)]
pub struct TenantContext<'a> {
    pub guc: &'a str,
    pub key: Option<&'a str>,
}

impl TenantContext<'_> {
    /// The signature of tenant value `value` on server backend `pid`: HMAC-SHA-256 under
    /// the key of `<value>/<pid>`, in hex (what `pgtenant.current_tenant_text()` checks).
    /// Empty without a key or a value.
    pub fn signature(&self, value: &str, pid: u32) -> String {
        use hmac::{Hmac, KeyInit, Mac};
        let Some(key) = self.key.filter(|_| !value.is_empty()) else { return String::new() };
        let mut mac =
            <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(key.as_bytes()).expect("any key length");
        mac.update(value.as_bytes());
        mac.update(b"/");
        mac.update(itoa::Buffer::new().format(pid).as_bytes());
        mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The SQL that sets the tenant GUC and its signature for server backend `pid` from
/// `from` to `to`, or `None` when it already holds it (or `context` is `None`: no GUC is set).
pub fn tenant_sql(
    from: &TenantGuc,
    to: Option<&TenantId>,
    context: Option<TenantContext>,
    pid: u32,
) -> Option<String> {
    let context = context?;
    if from.holds(to) {
        return None;
    }
    // Empty, not RESET: RESET would restore a default that ALTER ROLE/DATABASE may have set.
    let value = to.map(|t| t.key_text()).unwrap_or_default();
    Some(format!(
        "SET {} = {};SET {TENANT_SIGNATURE_GUC} = '{}';",
        context.guc,
        quote_literal(&value),
        context.signature(&value, pid)
    ))
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

    /// `printf '7/4242' | openssl dgst -sha256 -hmac key`.
    const HMAC_7_4242: &str = "f42a8cc8995145c7bf8b544f35ff334b773617cca802bca1dd72be520b56fc07";

    #[test]
    fn sync_sets_resets_and_switches_tenant() {
        let from = Settings::intern(vec![("search_path".into(), cfg("a")), ("work_mem".into(), cfg("4MB"))]);
        let to = Settings::intern(vec![("search_path".into(), SettingValue::Sql("b, public".into()))]);
        assert_eq!(settings_sql(&from, &to).unwrap(), r#"RESET "work_mem";SET "search_path" = b, public;"#);
        assert_eq!(settings_sql(&to, &to), None);
        let one = TenantGuc::Known(Some(TenantId::Int(1)));
        let g = |key| Some(TenantContext { guc: "g", key });
        let sig = "pgtenant.tenant_sig";
        let sql = tenant_sql(&one, Some(&TenantId::Int(2)), g(None), 1).unwrap();
        assert_eq!(sql, format!("SET g = '2';SET {sig} = '';"));
        assert_eq!(tenant_sql(&TenantGuc::Known(None), None, g(None), 1), None);
        let three = TenantGuc::Known(Some(TenantId::Int(3)));
        assert_eq!(tenant_sql(&three, None, g(Some("k")), 1).unwrap(), format!("SET g = '';SET {sig} = '';"));
        assert_eq!(tenant_sql(&three, None, None, 1), None);
        // A connection whose GUC pgtenant did not set gets it set, even to "none".
        assert_eq!(
            tenant_sql(&TenantGuc::Unknown, None, g(None), 1).unwrap(),
            format!("SET g = '';SET {sig} = '';")
        );
        // Text keys are quoted as literals.
        let text = TenantId::Text("o'brien".into());
        assert!(tenant_sql(&three, Some(&text), g(None), 1).unwrap().starts_with("SET g = 'o''brien';"));
        // Signed: HMAC-SHA-256 of "7/4242" under "key" (as `openssl dgst -sha256 -hmac key`).
        let signed = tenant_sql(&one, Some(&TenantId::Int(7)), g(Some("key")), 4242).unwrap();
        assert_eq!(
            signed,
            format!(
                "SET g = '7';SET {sig} = '{}';",
                TenantContext { guc: "g", key: Some("key") }.signature("7", 4242)
            )
        );
        assert_eq!(TenantContext { guc: "g", key: Some("key") }.signature("7", 4242), HMAC_7_4242);
        let quoted = settings_sql(
            &Settings::empty(),
            &Settings::intern(vec![("application_name".into(), cfg("it's"))]),
        );
        assert_eq!(quoted.unwrap(), "SELECT pg_catalog.set_config('application_name', 'it''s', false);");
    }
}

#[cfg(test)]
mod statement_timeout_tests {
    use super::*;

    #[test]
    fn statement_timeout_is_read_as_postgres_reads_it() {
        let of = |value: SettingValue| {
            Settings::intern(vec![("Statement_Timeout".into(), value)]).statement_timeout_ms()
        };
        assert_eq!(of(SettingValue::Config("1500".into())), Some(1500));
        assert_eq!(of(SettingValue::Sql("'2s'".into())), Some(2000));
        assert_eq!(of(SettingValue::Sql("'1min'".into())), Some(60_000));
        assert_eq!(of(SettingValue::Sql("0".into())), None, "0 turns it off");
        assert_eq!(of(SettingValue::Sql("'soon'".into())), None);
        assert_eq!(Settings::empty().statement_timeout_ms(), None);
    }
}
