//! Startup parameters: who the client is, its tenant, and the session settings it
//! asked for (directly or through `options=-c name=value`).

use crate::backend::SettingValue;
use crate::directory::{TenantId, TenantKey};
use crate::router::{TARGET_PARAMETER, TargetMode};

use super::error::FrontendError;

/// What a client's StartupMessage asks for.
#[derive(Debug, PartialEq, Eq)]
pub struct StartupParams {
    pub user: String,
    pub database: String,
    pub tenant: Option<TenantId>,
    /// `pgtenant.target`: where the session's provably read-only requests may go
    /// (`None`: as its user's configuration says).
    pub target: Option<TargetMode>,
    pub settings: Vec<(String, SettingValue)>,
    /// `_pq_.*` protocol options, which pgtenant does not implement.
    pub protocol_options: Vec<String>,
}

pub fn parse_startup(
    params: Vec<(String, String)>,
    tenant_param: &str,
    key: TenantKey,
) -> Result<StartupParams, FrontendError> {
    let mut user = None;
    let mut database = None;
    let mut pairs = Vec::new();
    let mut protocol_options = Vec::new();
    for (name, value) in params {
        match name.as_str() {
            "user" => user = Some(value),
            "database" => database = Some(value),
            "options" => pairs.extend(parse_options(&value)?),
            "replication" if !matches!(value.as_str(), "false" | "off" | "0" | "no") => {
                return Err(FrontendError::Unsupported(
                    "replication connections are not supported by pgtenant".into(),
                ));
            }
            "replication" => {}
            n if n.starts_with("_pq_.") => protocol_options.push(name),
            _ => pairs.push((name, value)),
        }
    }
    let user = user
        .filter(|u| !u.is_empty())
        .ok_or_else(|| FrontendError::Protocol("no user in the startup message".into()))?;
    let database = database.filter(|d| !d.is_empty()).unwrap_or_else(|| user.clone());
    let mut tenant = None;
    let mut target = None;
    let mut settings = Vec::new();
    for (name, value) in pairs {
        if name.eq_ignore_ascii_case(TARGET_PARAMETER) {
            target = Some(TargetMode::parse(&value).ok_or_else(|| {
                FrontendError::BadStartupParameter(format!(
                    "{TARGET_PARAMETER}=\"{value}\" is not one of primary, prefer-replica, replica"
                ))
            })?);
            continue;
        }
        if name.eq_ignore_ascii_case(tenant_param) {
            tenant = Some(TenantId::parse(&value, key).ok_or_else(|| {
                FrontendError::BadStartupParameter(format!(
                    "{tenant_param}=\"{value}\" is not a tenant id ({})",
                    key.describe()
                ))
            })?);
            continue;
        }
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.') {
            return Err(FrontendError::BadStartupParameter(format!("\"{name}\" is not a setting name")));
        }
        settings.push((name, SettingValue::Config(value)));
    }
    Ok(StartupParams { user, database, tenant, target, settings, protocol_options })
}

/// Splits `options` (`-c a=b --c=d -ce=f`, backslash escapes a space) into settings.
fn parse_options(options: &str) -> Result<Vec<(String, String)>, FrontendError> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut chars = options.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => word.extend(chars.next()),
            c if c.is_whitespace() => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    let mut out = Vec::new();
    let mut it = words.into_iter();
    while let Some(w) = it.next() {
        let assignment = if w == "-c" {
            it.next()
                .ok_or_else(|| FrontendError::BadStartupParameter("-c without a setting in options".into()))?
        } else if let Some(rest) = w.strip_prefix("--").or_else(|| w.strip_prefix("-c")) {
            rest.to_string()
        } else {
            return Err(FrontendError::BadStartupParameter(format!(
                "unsupported option \"{w}\" (only -c name=value)"
            )));
        };
        let (name, value) = assignment.split_once('=').ok_or_else(|| {
            FrontendError::BadStartupParameter(format!("\"{assignment}\" is not name=value"))
        })?;
        out.push((name.replace('-', "_"), value.to_string()));
    }
    Ok(out)
}

/// The `application_name` among start-up settings ("" when none).
pub fn application_name(settings: &[(String, SettingValue)]) -> String {
    settings
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("application_name"))
        .map(|(_, value)| match value {
            SettingValue::Config(v) | SettingValue::Sql(v) => v.clone(),
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pairs: &[(&str, &str)]) -> Result<StartupParams, FrontendError> {
        parse_startup(
            pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect(),
            "pgtenant.tenant_id",
            TenantKey::Bigint,
        )
    }

    #[test]
    fn tenant_from_options_or_parameter() {
        let s = p(&[("user", "app"), ("options", "-c pgtenant.tenant_id=42 -c search_path=a,b")]).unwrap();
        assert_eq!(s.tenant, Some(TenantId::Int(42)));
        assert_eq!(s.database, "app");
        assert_eq!(s.settings, vec![("search_path".to_string(), SettingValue::Config("a,b".into()))]);
        let s = p(&[
            ("user", "app"),
            ("database", "d"),
            ("pgtenant.tenant_id", "1500"),
            ("application_name", "x"),
        ])
        .unwrap();
        assert_eq!(s.tenant, Some(TenantId::Int(1500)));
        assert_eq!(s.settings.len(), 1);
        let s = p(&[("user", "u"), ("options", "--statement-timeout=5s -cwork_mem=1MB")]).unwrap();
        assert_eq!(s.settings[0].0, "statement_timeout");
        assert_eq!(s.settings[1].0, "work_mem");
    }

    #[test]
    fn the_read_target_is_taken_and_not_sent_to_servers() {
        let s = p(&[("user", "app"), ("options", "-c pgtenant.target=prefer-replica")]).unwrap();
        assert_eq!(s.target, Some(TargetMode::PreferReplica));
        assert!(s.settings.is_empty());
        assert_eq!(p(&[("user", "app")]).unwrap().target, None);
        assert!(p(&[("user", "app"), ("pgtenant.target", "anywhere")]).is_err());
    }

    #[test]
    fn rejects_bad_input() {
        assert!(p(&[("database", "d")]).is_err());
        assert!(p(&[("user", "u"), ("pgtenant.tenant_id", "abc")]).is_err());
        assert!(p(&[("user", "u"), ("options", "-X")]).is_err());
        assert!(p(&[("user", "u"), ("replication", "database")]).is_err());
        assert!(p(&[("user", "u"), ("bad name", "x")]).is_err());
    }
}
