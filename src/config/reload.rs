//! What a RELOAD may change in a running proxy. The users (logins, rights, pool sizes
//! and modes, server credentials), the file's shards, ranges and tenant map, and its
//! tenant limits are applied live; everything else (listen addresses, TLS, the
//! catalog, health and proxy settings) is fixed for the process. A new file that changes any of those
//! is refused as a whole, naming each, so that a RELOAD never half-applies.

use std::collections::BTreeMap;

use super::Config;

/// Every setting of `new` that differs from `running` and cannot change without a
/// restart (empty: the file may be applied).
pub fn needs_restart(running: &Config, new: &Config) -> Vec<String> {
    let mut changed = Vec::new();
    let (a, b) = (fixed_part(running), fixed_part(new));
    for key in a.keys().chain(b.keys().filter(|k| !a.contains_key(*k))) {
        if a.get(key) != b.get(key) {
            changed.push(key.clone());
        }
    }
    changed.sort();
    changed.dedup();
    changed
}

/// The `section.key`s outside the live sections (users, `[auth]`, shards, ranges, the tenant map
/// and limits, `[tls]`) that a RELOAD changes for the running proxy: the session
/// timeouts (`frontend::live`).
pub const LIVE_KEYS: [&str; 4] = [
    "proxy.idle_transaction_timeout_ms",
    "proxy.client_idle_timeout_ms",
    "proxy.transaction_timeout_ms",
    "proxy.query_timeout_ms",
];

/// The settings fixed for the process, flattened to `section.key` -> value.
fn fixed_part(config: &Config) -> BTreeMap<String, serde_json::Value> {
    let mut c = config.clone();
    // Read again from their files by every RELOAD.
    c.tls = None;
    c.users.clear();
    c.auth = Default::default();
    c.shards.clear();
    c.ranges.clear();
    c.tenant_map.clear();
    c.tenant_limits.clear();
    let Ok(serde_json::Value::Object(sections)) = serde_json::to_value(&c) else { return BTreeMap::new() };
    let mut flat = BTreeMap::new();
    for (section, value) in sections {
        match value {
            serde_json::Value::Object(keys) => {
                for (key, v) in keys {
                    let name = format!("{section}.{key}");
                    if !LIVE_KEYS.contains(&name.as_str()) {
                        flat.insert(name, v);
                    }
                }
            }
            other => {
                flat.insert(section, other);
            }
        }
    }
    flat
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_sections_may_change_and_the_rest_is_named() {
        let running = crate::dev::demo::demo_config("127.0.0.1:6432".parse().unwrap(), [1, 2], None);
        let mut new = running.clone();
        new.users[0].password = Some("changed".into());
        new.tenant_map.clear();
        assert!(needs_restart(&running, &new).is_empty(), "passwords and placements change live");
        new.proxy.client_idle_timeout_ms = 1000;
        new.proxy.query_timeout_ms = 5000;
        assert!(needs_restart(&running, &new).is_empty(), "the session timeouts change live");
        new.proxy.max_clients += 1;
        new.health.interval_ms += 1;
        new.users[0].pool_size += 1;
        let named = needs_restart(&running, &new);
        assert_eq!(named, vec!["health.interval_ms".to_string(), "proxy.max_clients".to_string()]);
    }
}
