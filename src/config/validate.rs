//! Checks a parsed `Config` and lists every problem found, so that an operator
//! fixes them in one pass.

use std::collections::HashSet;

use super::{AuthMethod, Config, MappedKey, NodeRole, TenantKey};

/// Highest shard id: the snowflake layout gives the shard 10 bits.
pub const MAX_SHARD_ID: u16 = 1023;

/// Returns every problem in `config`; empty means valid.
pub fn validate(config: &Config) -> Vec<String> {
    let mut problems = Vec::new();
    let mut shard_ids = HashSet::new();
    if let Some(catalog) = &config.catalog {
        if !(config.shards.is_empty() && config.ranges.is_empty() && config.tenant_map.is_empty()) {
            problems.push(
                "[catalog] holds shards, ranges and placements: remove [[shards]], [[ranges]] and [[tenant_map]]"
                    .to_string(),
            );
        }
        if catalog.host.is_empty() || catalog.user.is_empty() || catalog.dbname.is_empty() {
            problems.push("[catalog] needs host, user and dbname".to_string());
        }
        if catalog.cache_capacity == 0 || catalog.lookup_connections == 0 {
            problems.push("[catalog] cache_capacity and lookup_connections must be above 0".to_string());
        }
    } else if config.shards.is_empty() {
        problems.push("no shards are configured".to_string());
    }
    let moves = &config.moves;
    if moves.pause_timeout_ms < 50 || moves.cutover_attempts == 0 {
        problems
            .push("[moves] pause_timeout_ms must be at least 50 and cutover_attempts at least 1".to_string());
    }
    // Proxies heartbeat every 500 ms: a shorter bound would find live ones gone.
    if moves.proxy_stale_ms < 1000 {
        problems.push("[moves] proxy_stale_ms must be at least 1000".to_string());
    }
    for limit in &config.tenant_limits {
        if !(1..=10_000).contains(&limit.weight) {
            problems.push(format!(
                "[[tenant_limits]] tenant {:?}: weight {} must be 1..10000",
                limit.tenant, limit.weight
            ));
        }
        if limit.max_connections.is_some_and(|cap| cap < limit.min_connections.max(1)) {
            problems.push(format!(
                "[[tenant_limits]] tenant {:?}: max_connections must be at least 1 and at least min_connections",
                limit.tenant
            ));
        }
    }
    let sf = &config.snowflake;
    if !(1..=11).contains(&sf.instance_bits) {
        problems.push(format!("[snowflake] instance_bits is {}; it must be 1..11", sf.instance_bits));
    } else if !(1..(1i64 << sf.instance_bits)).contains(&sf.instance) {
        problems.push(format!(
            "[snowflake] instance is {}; with {} instance bits it must be 1..{} (0 is the servers' SQL function)",
            sf.instance,
            sf.instance_bits,
            (1i64 << sf.instance_bits) - 1
        ));
    }
    if sf.lease_ttl_ms < 300 {
        problems.push("[snowflake] lease_ttl_ms must be at least 300".to_string());
    }
    if sf.lease_idle_ms < 1000 {
        problems.push("[snowflake] lease_idle_ms must be at least 1000".to_string());
    }
    for shard in &config.shards {
        if shard.id > MAX_SHARD_ID {
            problems.push(format!("shard id {} is outside 0..{MAX_SHARD_ID}", shard.id));
        }
        if !shard_ids.insert(shard.id) {
            problems.push(format!("shard id {} is defined twice", shard.id));
        }
        let primaries = shard.nodes.iter().filter(|n| n.role == NodeRole::Primary).count();
        match primaries {
            0 => problems.push(format!("shard {} has no primary node", shard.id)),
            1 => {}
            n => problems.push(format!("shard {} has {n} primary nodes; exactly one is allowed", shard.id)),
        }
        for node in &shard.nodes {
            if node.host.is_empty() || node.port == 0 {
                problems.push(format!(
                    "shard {}: node '{}:{}' needs a host and a port",
                    shard.id, node.host, node.port
                ));
            }
        }
    }

    let mut ranges: Vec<_> = config.ranges.iter().collect();
    for r in &ranges {
        if r.min > r.max {
            problems.push(format!("range [{},{}] -> shard {}: min is above max", r.min, r.max, r.shard));
        }
        if !shard_ids.contains(&r.shard) {
            problems.push(format!("range [{},{}] names unknown shard {}", r.min, r.max, r.shard));
        }
    }
    ranges.sort_by_key(|r| r.min);
    for pair in ranges.windows(2) {
        if pair[1].min <= pair[0].max {
            problems.push(format!(
                "ranges [{},{}] (shard {}) and [{},{}] (shard {}) overlap",
                pair[0].min, pair[0].max, pair[0].shard, pair[1].min, pair[1].max, pair[1].shard
            ));
        }
    }

    let mut mapped = HashSet::new();
    for m in &config.tenant_map {
        if !shard_ids.contains(&m.shard) {
            problems.push(format!("tenant {} is mapped to unknown shard {}", m.tenant, m.shard));
        }
        if config.proxy.tenant_key == TenantKey::Bigint && matches!(m.tenant, MappedKey::Text(_)) {
            problems.push(format!("tenant \"{}\" is text, but tenant_key is bigint", m.tenant));
        }
        if !mapped.insert(m.tenant.to_string()) {
            problems.push(format!("tenant {} is mapped twice", m.tenant));
        }
    }

    if let Some(default) = config.proxy.default_shard
        && config.catalog.is_none()
        && !shard_ids.contains(&default)
    {
        problems.push(format!("default_shard {default} is not a configured shard"));
    }

    let mut user_names = HashSet::new();
    let auth = &config.auth;
    if config.users.is_empty() && auth.query.is_none() {
        problems.push("no users are configured ([[users]] or [auth] query)".to_string());
    }
    if let Some(query) = &auth.query {
        if !query.contains("$1") {
            problems.push("[auth] query must take the login's name as $1".to_string());
        }
        if auth.user.is_none() {
            problems.push("[auth] query needs [auth] user, the login it runs as".to_string());
        }
        if auth.pool_size == 0 {
            problems.push("[auth] pool_size must be at least 1".to_string());
        }
        if let Some(shard) = auth.shard
            && config.catalog.is_none()
            && !shard_ids.contains(&shard)
        {
            problems.push(format!("[auth] shard {shard} is not a configured shard"));
        }
    }
    for user in &config.users {
        if !user_names.insert(user.name.as_str()) {
            problems.push(format!("user '{}' is defined twice", user.name));
        }
        let has_client_secret = user.password.is_some() || user.scram_secret.is_some();
        match user.auth {
            AuthMethod::Trust => {}
            AuthMethod::ScramSha256 if !has_client_secret => {
                problems.push(format!("user '{}' has no password or scram_secret", user.name))
            }
            AuthMethod::Md5 | AuthMethod::Cleartext if user.password.is_none() => problems
                .push(format!("user '{}' needs a password for {:?} authentication", user.name, user.auth)),
            _ => {}
        }
        if let Some(secret) = &user.scram_secret
            && !is_scram_verifier(secret)
        {
            problems.push(format!("user '{}': scram_secret is not a SCRAM-SHA-256 verifier", user.name));
        }
        if user.pool_size == 0 {
            problems.push(format!("user '{}': pool_size must be at least 1", user.name));
        }
    }

    if let Some(tls) = &config.tls {
        for (what, path) in [("certificate", &tls.cert), ("key", &tls.key)] {
            if !path.exists() {
                problems.push(format!("TLS {what} file {} does not exist", path.display()));
            }
        }
    }
    if config.proxy.tenant_parameter.is_empty() {
        problems.push("tenant_parameter must not be empty".to_string());
    }
    if config.proxy.max_message_size < 1024 {
        problems.push("max_message_size must be at least 1024 bytes".to_string());
    }
    problems
}

/// `SCRAM-SHA-256$<iterations>:<salt>$<stored key>:<server key>`, as in pg_authid.
pub fn is_scram_verifier(secret: &str) -> bool {
    let Some(rest) = secret.strip_prefix("SCRAM-SHA-256$") else {
        return false;
    };
    let Some((iter_salt, keys)) = rest.split_once('$') else {
        return false;
    };
    let Some((iter, _salt)) = iter_salt.split_once(':') else {
        return false;
    };
    iter.parse::<u32>().is_ok_and(|i| i > 0) && keys.split_once(':').is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn lists_every_problem() {
        let text = r#"
            [[users]]
            name = "app"
            [[shards]]
            id = 1
            [[shards.nodes]]
            host = "127.0.0.1"
            port = 5432
            role = "primary"
            [[shards]]
            id = 2000
            [[ranges]]
            min = 1
            max = 100
            shard = 1
            [[ranges]]
            min = 50
            max = 200
            shard = 1
            [[tenant_map]]
            tenant = 42
            shard = 9
        "#;
        let config = Config::from_toml(text, Path::new("t.toml")).unwrap();
        let problems = validate(&config);
        let joined = problems.join("\n");
        assert!(joined.contains("shard id 2000 is outside"), "{joined}");
        assert!(joined.contains("shard 2000 has no primary"), "{joined}");
        assert!(joined.contains("overlap"), "{joined}");
        assert!(joined.contains("unknown shard 9"), "{joined}");
        assert!(joined.contains("user 'app' has no password"), "{joined}");
        assert_eq!(problems.len(), 5, "{joined}");
    }
}
