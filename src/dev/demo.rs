//! The demo layout of `pgtenant dev` (also used by the tests): shards 1 and 2,
//! tenants 1..=1000 on shard 1, 1001..=2000 on shard 2, tenant 42 mapped to shard 2;
//! a login `app`/`app`, a database `app`, and on every shard an `accounts` table
//! with a `tenant_id bigint` column under row-level security (signed tenant context,
//! `sql/rls.sql`) plus a one-row `pgtenant_shard` table.

use std::net::SocketAddr;
use std::path::Path;

use crate::backend::quote_literal;
use crate::config::{
    AuthMethod, CatalogConfig, Config, MappedKey, NodeConfig, NodeRole, ProxyConfig, RangeConfig,
    ServerTlsConfig, ShardConfig, SnowflakeConfig, TenantMapping, TlsConfig, UserConfig,
};

pub const DEMO_USER: &str = "app";
pub const DEMO_PASSWORD: &str = "app";
/// The admin console login `pgtenant dev` adds (`psql -d pgtenant`).
pub const ADMIN_USER: &str = "admin";
pub const ADMIN_PASSWORD: &str = "admin";
pub const DEMO_DATABASE: &str = "app";

/// The demo tenants and where they live: (tenant, shard).
pub const DEMO_TENANTS: [(i64, u16); 4] = [(7, 1), (500, 1), (42, 2), (1500, 2)];

/// The proxy configuration for shards 1 and 2 on the given ports.
pub fn demo_config(listen: SocketAddr, shard_ports: [u16; 2], tls_dir: Option<&Path>) -> Config {
    let node = |port| NodeConfig {
        host: "127.0.0.1".into(),
        port,
        role: NodeRole::Primary,
        priority: 0,
        dbname: None,
    };
    Config {
        proxy: ProxyConfig {
            listen,
            tenant_context_key: Some(DEMO_CONTEXT_KEY.into()),
            ..ProxyConfig::default()
        },
        tls: tls_dir.map(|d| TlsConfig { cert: d.join("server.crt"), key: d.join("server.key") }),
        server_tls: ServerTlsConfig::default(),
        users: vec![login(DEMO_USER, DEMO_PASSWORD, false), admin_login()],
        shards: vec![
            ShardConfig { id: 1, nodes: vec![node(shard_ports[0])] },
            ShardConfig { id: 2, nodes: vec![node(shard_ports[1])] },
        ],
        ranges: vec![
            RangeConfig { min: 1, max: 1000, shard: 1 },
            RangeConfig { min: 1001, max: 2000, shard: 2 },
        ],
        tenant_map: vec![TenantMapping { tenant: MappedKey::Int(42), shard: 2 }],
        tenant_limits: Vec::new(),
        catalog: None,
        snowflake: SnowflakeConfig::default(),
        health: Default::default(),
        moves: crate::config::MovesConfig { database: Some(DEMO_DATABASE.into()), ..Default::default() },
        auth: database_logins(),
        observe: Default::default(),
    }
}

/// Logins from the shards' roles: a role created with a password on the shards
/// (`CREATE ROLE x LOGIN PASSWORD '...'`) logs in through the proxy as itself. The
/// query runs as the local superuser `postgres` (trusted on loopback), which may read
/// `pg_authid`; superusers do not log in this way.
pub fn database_logins() -> crate::config::AuthConfig {
    crate::config::AuthConfig {
        query: Some(
            "SELECT rolname, rolpassword FROM pg_catalog.pg_authid WHERE rolname = $1 AND rolcanlogin AND NOT rolsuper AND (rolvaliduntil IS NULL OR rolvaliduntil > now())".into(),
        ),
        user: Some("postgres".into()),
        ..Default::default()
    }
}

/// A demo login (SCRAM, a pool of 20); `admin` opens the admin console to it.
fn login(name: &str, password: &str, admin: bool) -> UserConfig {
    UserConfig {
        name: name.into(),
        password: Some(password.into()),
        scram_secret: None,
        auth: AuthMethod::ScramSha256,
        server_user: None,
        server_password: None,
        pool_size: 20,
        pool_mode: None,
        allow_tenant_switch: None,
        target: None,
        admin,
        scatter_gather: false,
        see_other_sessions: false,
        max_client_connections: None,
        passthrough: None,
        catalog_login: None,
    }
}

/// The demo admin: the console, and scatter-gather as the clusters' superuser (which
/// row-level security does not bind, so that `all_shards.accounts` sees every tenant).
fn admin_login() -> UserConfig {
    UserConfig { server_user: Some("postgres".into()), ..login(ADMIN_USER, ADMIN_PASSWORD, true) }
}

/// The catalog schema, as in `sql/catalog.sql`.
pub const CATALOG_SQL: &str = include_str!("../../sql/catalog.sql");

/// The demo configuration with its layout in a catalog database instead of the file.
pub fn demo_catalog_config(listen: SocketAddr, catalog: CatalogConfig, tls_dir: Option<&Path>) -> Config {
    let mut config = demo_config(listen, [0, 0], tls_dir);
    config.shards.clear();
    config.ranges.clear();
    config.tenant_map.clear();
    config.catalog = Some(catalog);
    config
}

/// A catalog connection as the local superuser `postgres` (trusted on loopback).
pub fn local_catalog(port: u16, dbname: &str) -> CatalogConfig {
    CatalogConfig {
        host: "127.0.0.1".into(),
        port,
        user: "postgres".into(),
        password: None,
        dbname: dbname.into(),
        cache_capacity: 1_000_000,
        cache_ttl_ms: 300_000,
        miss_ttl_ms: 1_000,
        lookup_connections: 4,
        connect_timeout_ms: 3_000,
    }
}

/// Creates the catalog database (on the cluster at `port`), loads the schema and the
/// demo layout with the shards at `shard_nodes` (host, port); safe to run again.
pub async fn setup_catalog(port: u16, dbname: &str, shard_nodes: &[(String, u16)]) -> Result<(), String> {
    let admin = connect(&format!("host=127.0.0.1 port={port} user=postgres dbname=postgres")).await?;
    ensure_database(&admin, dbname, "postgres").await?;
    let db = connect(&format!("host=127.0.0.1 port={port} user=postgres dbname={dbname}")).await?;
    db.batch_execute(CATALOG_SQL).await.map_err(|e| format!("catalog schema: {e}"))?;
    // Shard i holds tenants (i - 1) * 1000 + 1 ..= i * 1000.
    let shards: Vec<String> = (1..=shard_nodes.len())
        .map(|i| format!("({i}, 'USA', 'local-{i}', {}, {})", (i - 1) * 1000 + 1, i * 1000))
        .collect();
    let nodes: Vec<String> = shard_nodes
        .iter()
        .enumerate()
        .map(|(i, (h, p))| {
            format!("({n}, 'shard{n}-primary', {}, {p}, 'primary')", quote_literal(h), n = i + 1)
        })
        .collect();
    // Rows are only written when they differ, so a restart bumps no routing version.
    let layout = format!(
        "INSERT INTO pgtenant.shard_config (shard_id, region_code, datacenter, min_tenant_id, max_tenant_id)
         VALUES {} ON CONFLICT DO NOTHING;
         INSERT INTO pgtenant.shard_node AS n (shard_id, name, host, port, role)
         VALUES {}
         {NODE_UPSERT};
         INSERT INTO pgtenant.tenant_shard_map (tenant_id, shard_id, region_code) VALUES (42, 2, 'USA')
         ON CONFLICT DO NOTHING;",
        shards.join(", "),
        nodes.join(", ")
    );
    db.batch_execute(&layout).await.map_err(|e| format!("catalog layout: {e}"))
}

/// Lists streaming replicas `(shard, name, host, port, failover priority)` in the
/// catalog; safe to run again.
pub async fn add_replicas(
    port: u16,
    dbname: &str,
    replicas: &[(u16, String, String, u16, u32)],
) -> Result<(), String> {
    if replicas.is_empty() {
        return Ok(());
    }
    let db = connect(&format!("host=127.0.0.1 port={port} user=postgres dbname={dbname}")).await?;
    let rows: Vec<String> = replicas
        .iter()
        .map(|(shard, name, host, port, priority)| {
            format!("({shard}, '{name}', {}, {port}, 'replica', {priority})", quote_literal(host))
        })
        .collect();
    let sql = format!(
        "INSERT INTO pgtenant.shard_node AS n (shard_id, name, host, port, role, failover_priority) VALUES {}
         {NODE_UPSERT}",
        rows.join(", ")
    );
    db.batch_execute(&sql).await.map_err(|e| format!("catalog replicas: {e}"))
}

/// `ports` on 127.0.0.1, as `setup_catalog` takes nodes.
pub fn loopback_nodes(ports: &[u16]) -> Vec<(String, u16)> {
    ports.iter().map(|p| ("127.0.0.1".to_string(), *p)).collect()
}

/// A node listed again keeps its row unless it moved (a state directory from a build
/// that reached it elsewhere): rows are only written when they differ, so a restart
/// bumps no routing version.
const NODE_UPSERT: &str =
    "ON CONFLICT (shard_id, name) DO UPDATE SET host = EXCLUDED.host, port = EXCLUDED.port
         WHERE (n.host, n.port) IS DISTINCT FROM (EXCLUDED.host, EXCLUDED.port)";

/// Creates the demo role, database and tables on one shard; safe to run again.
pub async fn setup_shard(port: u16, shard_id: u16) -> Result<(), String> {
    let admin = connect(&format!("host=127.0.0.1 port={port} user=postgres dbname=postgres")).await?;
    let role_sql = format!(
        "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{DEMO_USER}') THEN \
         CREATE ROLE {DEMO_USER} LOGIN PASSWORD '{DEMO_PASSWORD}'; END IF; END $$"
    );
    admin.batch_execute(&role_sql).await.map_err(|e| format!("create role: {e}"))?;
    ensure_database(&admin, DEMO_DATABASE, DEMO_USER).await?;
    let db = connect(&format!("host=127.0.0.1 port={port} user=postgres dbname={DEMO_DATABASE}")).await?;
    let mut sql = format!(
        "CREATE TABLE IF NOT EXISTS pgtenant_shard (shard_id int PRIMARY KEY);
         INSERT INTO pgtenant_shard VALUES ({shard_id}) ON CONFLICT DO NOTHING;
         CREATE TABLE IF NOT EXISTS accounts (
             id bigserial PRIMARY KEY,
             tenant_id bigint NOT NULL,
             name text NOT NULL,
             balance numeric NOT NULL DEFAULT 0);
         CREATE INDEX IF NOT EXISTS accounts_tenant ON accounts (tenant_id);
         -- Movable tenants: each shard numbers accounts from a range of its own, so a
         -- tenant's rows keep their keys on any shard, and the tenant column is in the
         -- replica identity (see MOVE TENANT).
         SELECT setval('accounts_id_seq', {shard_id}::bigint * 1000000000000)
         WHERE (SELECT last_value FROM accounts_id_seq) < {shard_id}::bigint * 1000000000000;
         ALTER TABLE accounts REPLICA IDENTITY FULL;
         ALTER TABLE pgtenant_shard OWNER TO {DEMO_USER};
         ALTER TABLE accounts OWNER TO {DEMO_USER};
         GRANT ALL ON SCHEMA public TO {DEMO_USER};"
    );
    for (tenant, shard) in DEMO_TENANTS.iter().filter(|(_, s)| *s == shard_id) {
        let _ = shard;
        sql.push_str(&format!(
            "INSERT INTO accounts (tenant_id, name, balance)
             SELECT {tenant}, 'account ' || g || ' of tenant {tenant}', g * 10
             FROM generate_series(1, 3) g
             WHERE NOT EXISTS (SELECT 1 FROM accounts WHERE tenant_id = {tenant});"
        ));
    }
    db.batch_execute(&sql).await.map_err(|e| format!("demo tables: {e}"))?;
    // The server's own wall around other sessions (tenants share the role `app`).
    db.batch_execute(SESSION_PRIVACY_SQL).await.map_err(|e| format!("session privacy: {e}"))?;
    // The servers' own snowflake functions (instance 0), for clients that bypass the proxy.
    db.batch_execute(SNOWFLAKE_SQL).await.map_err(|e| format!("snowflake functions: {e}"))?;
    let grants = format!(
        "SELECT pgtenant.set_snowflake_shard({shard_id});
         GRANT USAGE ON SCHEMA pgtenant TO {DEMO_USER};
         GRANT SELECT ON pgtenant.snowflake_shard TO {DEMO_USER};
         GRANT USAGE, UPDATE ON SEQUENCE pgtenant.snowflake_clock TO {DEMO_USER};"
    );
    db.batch_execute(&grants).await.map_err(|e| format!("snowflake functions: {e}"))?;
    // The second wall: row-level security on the demo table, so that a session sees its
    // own tenant's rows whatever its SQL says (FORCE: `app` owns the table).
    db.batch_execute(RLS_SQL).await.map_err(|e| format!("row-level security: {e}"))?;
    let isolation = format!(
        "SELECT pgtenant.set_context_key('{DEMO_CONTEXT_KEY}');
         CALL pgtenant.enable_tenant_isolation('accounts')"
    );
    db.batch_execute(&isolation).await.map_err(|e| format!("row-level security: {e}"))
}

/// The key the demo proxy signs its tenant GUC with, installed on the demo shards: a
/// fixed one, fit for a demo only (a deployment chooses its own secret).
pub const DEMO_CONTEXT_KEY: &str = "pgtenant-dev-context-key";

/// The row-level security helpers, as in `sql/rls.sql`.
pub const RLS_SQL: &str = include_str!("../../sql/rls.sql");

/// What keeps a shard's sessions from other tenants' sight, as in `sql/session_privacy.sql`.
pub const SESSION_PRIVACY_SQL: &str = include_str!("../../sql/session_privacy.sql");

/// The shards' snowflake functions, as in `sql/snowflake.sql`.
pub const SNOWFLAKE_SQL: &str = include_str!("../../sql/snowflake.sql");

/// Creates database `name` owned by `owner` unless it exists.
async fn ensure_database(admin: &tokio_postgres::Client, name: &str, owner: &str) -> Result<(), String> {
    let exists = admin
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await
        .map_err(|e| e.to_string())?
        .is_some();
    if !exists {
        admin
            .batch_execute(&format!("CREATE DATABASE {name} OWNER {owner}"))
            .await
            .map_err(|e| format!("create database {name}: {e}"))?;
    }
    Ok(())
}

async fn connect(conninfo: &str) -> Result<tokio_postgres::Client, String> {
    let (client, conn) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("{conninfo}: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// Writes a self-signed certificate for localhost/127.0.0.1 unless one exists.
pub fn ensure_certificate(dir: &Path) -> Result<(), String> {
    let (cert_path, key_path) = (dir.join("server.crt"), dir.join("server.key"));
    if cert_path.is_file() && key_path.is_file() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .map_err(|e| e.to_string())?;
    std::fs::write(&cert_path, cert.cert.pem()).map_err(|e| e.to_string())?;
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).map_err(|e| e.to_string())?;
    Ok(())
}
