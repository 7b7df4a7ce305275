//! The catalog directory: resolution paths and their precedence, NOTIFY-driven
//! invalidation, the routing version, read-only tenants, disabled shards, and a
//! catalog that goes away and comes back.

use std::time::Duration;

use pgtenant::directory::{TenantId, hash_group};

use crate::harness::{Proxy, eventually, new_catalog, shard_of, sqlstate, start_catalog_proxy};

async fn routing_version(proxy: &Proxy) -> i64 {
    let client = proxy.connect(None).await;
    let rows = client.simple_query("SHOW pgtenant.routing_version").await.unwrap();
    let row = rows.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap().to_string()),
        _ => None,
    });
    row.expect("a row").parse().unwrap()
}

/// The shard a new session of `tenant` lands on, or the SQLSTATE it gets.
async fn lands_on(proxy: &Proxy, tenant: i64) -> Result<i32, String> {
    let client = proxy.connect(Some(tenant)).await;
    client
        .query_one("SELECT shard_id FROM pgtenant_shard", &[])
        .await
        .map(|r| r.get(0))
        .map_err(|e| sqlstate(&e))
}

#[tokio::test(flavor = "multi_thread")]
async fn map_then_ranges_then_hash_groups_then_not_placed() {
    let catalog = new_catalog("paths").await;
    // Four hash groups: 0 and 1 on shard 1, 2 on shard 2, 3 unassigned.
    catalog
        .admin
        .batch_execute(
            "INSERT INTO pgtenant.hash_group VALUES (0, 1), (1, 1), (2, 2);
             UPDATE pgtenant.routing_state SET hash_group_count = 4;",
        )
        .await
        .unwrap();
    let proxy = start_catalog_proxy(catalog.config.clone(), |_| {}).await;
    assert_eq!(lands_on(&proxy, 42).await, Ok(2), "the explicit row beats the range 1..=1000");
    assert_eq!(lands_on(&proxy, 7).await, Ok(1));
    assert_eq!(lands_on(&proxy, 1500).await, Ok(2));
    let outside = |group: u32| (5000..6000).find(|&t| hash_group(&TenantId::Int(t), 4) == group).unwrap();
    assert_eq!(lands_on(&proxy, outside(1)).await, Ok(1), "hash group 1");
    assert_eq!(lands_on(&proxy, outside(2)).await, Ok(2), "hash group 2");
    assert_eq!(lands_on(&proxy, outside(3)).await, Err("42704".into()), "unassigned group: not placed");
    // The catalog's SQL function computes the same groups as the proxy.
    for t in (1..300).chain([i64::MAX, -5]) {
        let sql: i32 = catalog
            .admin
            .query_one("SELECT pgtenant.hash_group_of($1, 4)", &[&t.to_string()])
            .await
            .unwrap()
            .get(0);
        assert_eq!(sql as u32, hash_group(&TenantId::Int(t), 4), "tenant {t}");
    }
    assert_eq!(routing_version(&proxy).await, catalog.version().await);
    // The extended protocol gets the same answer (prepared, then bound and executed).
    let client = proxy.connect(None).await;
    let version: String = client.query_one("SHOW pgtenant.routing_version", &[]).await.unwrap().get(0);
    assert_eq!(version, catalog.version().await.to_string());
    proxy.shutdown().await;
}

/// How long a test waits for a catalog change to reach routing. Only the change's NOTIFY
/// can move a tenant this soon: the cache trusts a placement for 300 s (`local_catalog`).
/// How soon it does (the target: within a second) is measured by `cargo bench --bench
/// directory`, not here, where the load of a CI machine running every test decides.
const NOTIFY_WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread")]
async fn a_catalog_change_reaches_routing_through_its_notify() {
    let catalog = new_catalog("notify").await;
    let proxy = start_catalog_proxy(catalog.config.clone(), |_| {}).await;
    let client = proxy.connect(Some(7)).await;
    assert_eq!(shard_of(&client).await, 1);

    // Clients keep running while the mapping changes under them.
    let background = {
        let conninfo = proxy.conninfo("options='-c pgtenant.tenant_id=7'");
        tokio::spawn(async move {
            let c = crate::harness::connect(&conninfo).await.unwrap();
            // Until it has answered from shard 2 fifty times in a row, or the wait is over.
            let (mut seen, start) = (Vec::new(), std::time::Instant::now());
            while seen.len() < 200 || (!seen.ends_with(&[2; 50]) && start.elapsed() < NOTIFY_WAIT) {
                let shard: i32 =
                    c.query_one("SELECT shard_id FROM pgtenant_shard", &[]).await.unwrap().get(0);
                seen.push(shard);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            seen
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = routing_version(&proxy).await;
    catalog
        .admin
        .batch_execute("INSERT INTO pgtenant.tenant_shard_map (tenant_id, shard_id) VALUES (7, 2)")
        .await
        .unwrap();
    let took = eventually(NOTIFY_WAIT, || async { shard_of(&client).await == 2 }).await;
    assert!(took.is_some(), "tenant 7 did not move to shard 2 within {NOTIFY_WAIT:?}");
    assert_eq!(routing_version(&proxy).await, before + 1);
    assert_eq!(routing_version(&proxy).await, catalog.version().await);

    let seen = background.await.unwrap();
    assert_eq!(seen.first(), Some(&1));
    assert_eq!(seen.last(), Some(&2), "the running client follows the change");
    let flips = seen.windows(2).filter(|w| w[0] != w[1]).count();
    assert_eq!(flips, 1, "once moved, never back: {seen:?}");

    // A bulk change bumps the version once, and its NOTIFY makes proxies forget every
    // cached tenant rather than list 401 of them.
    assert_eq!(lands_on(&proxy, 500).await, Ok(1));
    let before = catalog.version().await;
    catalog
        .admin
        .batch_execute("INSERT INTO pgtenant.tenant_shard_map (tenant_id, shard_id) SELECT g, 2 FROM generate_series(300, 700) g")
        .await
        .unwrap();
    assert_eq!(catalog.version().await, before + 1, "one version per statement");
    let took = eventually(NOTIFY_WAIT, || async { lands_on(&proxy, 500).await == Ok(2) }).await;
    assert!(took.is_some(), "the bulk change did not reach routing within {NOTIFY_WAIT:?}");

    // A node moving to another port (a shard change) reloads the topology: shard 2's
    // node is pointed at shard 1's server, so tenant 7 now answers from there.
    catalog
        .admin
        .batch_execute(
            "UPDATE pgtenant.shard_node SET port = (SELECT port FROM pgtenant.shard_node WHERE shard_id = 1)
             WHERE shard_id = 2",
        )
        .await
        .unwrap();
    let took = eventually(NOTIFY_WAIT, || async { shard_of(&client).await == 1 }).await;
    assert!(took.is_some(), "the node change did not reach routing within {NOTIFY_WAIT:?}");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn read_only_tenants_read_but_do_not_write_and_disabled_shards_refuse() {
    let catalog = new_catalog("states").await;
    catalog
        .admin
        .batch_execute(
            "INSERT INTO pgtenant.tenant_shard_map (tenant_id, shard_id, state) VALUES (500, 1, 'read_only')",
        )
        .await
        .unwrap();
    let proxy = start_catalog_proxy(catalog.config.clone(), |_| {}).await;
    let client = proxy.connect(Some(500)).await;
    let n: i64 =
        client.query_one("SELECT count(*) FROM accounts WHERE tenant_id = 500", &[]).await.unwrap().get(0);
    assert_eq!(n, 3);
    let err = client.execute("UPDATE accounts SET balance = 0 WHERE tenant_id = 500", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "25006");
    assert!(err.to_string().contains("tenant 500") || format!("{err:?}").contains("tenant 500"), "{err:?}");
    let err =
        client.batch_execute("INSERT INTO accounts (tenant_id, name) VALUES (500, 'x')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "25006");
    // In one piece (Parse to Sync): the Parse is answered, the write refused.
    let err =
        client.query_typed("UPDATE accounts SET balance = 0 WHERE tenant_id = 500", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "25006");
    let rows = client.query_typed("SELECT 1 FROM accounts WHERE tenant_id = 500", &[]).await.unwrap();
    assert_eq!(rows.len(), 3);
    // A write hidden in a function is stopped by the server itself.
    let err = client.query_one("SELECT nextval('accounts_id_seq')", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "25006");
    // The session goes on.
    assert_eq!(shard_of(&client).await, 1);

    // Back to active: writes work again, and the server connection is writable again.
    catalog
        .admin
        .batch_execute("UPDATE pgtenant.tenant_shard_map SET state = 'active' WHERE tenant_id = 500")
        .await
        .unwrap();
    let version = catalog.version().await;
    assert!(eventually(NOTIFY_WAIT, || async { routing_version(&proxy).await == version }).await.is_some());
    let updated =
        client.execute("UPDATE accounts SET balance = balance WHERE tenant_id = 500", &[]).await.unwrap();
    assert_eq!(updated, 3);

    catalog
        .admin
        .batch_execute("UPDATE pgtenant.shard_config SET status = 'disabled' WHERE shard_id = 2")
        .await
        .unwrap();
    assert!(
        eventually(NOTIFY_WAIT, || async { lands_on(&proxy, 1500).await == Err("57P03".into()) })
            .await
            .is_some()
    );
    assert_eq!(lands_on(&proxy, 7).await, Ok(1), "shard 1 still serves");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn while_the_catalog_is_away_cached_tenants_route_and_on_return_nothing_routes_stale() {
    let mut catalog = new_catalog("away").await;
    // The proxy reads the catalog as a role of its own, which the test can lock out.
    catalog
        .admin
        .batch_execute(
            "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'catalog_reader') THEN
               CREATE ROLE catalog_reader LOGIN PASSWORD 'reader'; END IF; END $$;
             GRANT USAGE ON SCHEMA pgtenant TO catalog_reader;
             GRANT SELECT ON ALL TABLES IN SCHEMA pgtenant TO catalog_reader;",
        )
        .await
        .unwrap();
    catalog.config.user = "catalog_reader".into();
    catalog.config.password = Some("reader".into());
    let proxy = start_catalog_proxy(catalog.config.clone(), |_| {}).await;
    assert_eq!(lands_on(&proxy, 42).await, Ok(2), "tenant 42 is now cached");

    catalog
        .admin
        .batch_execute(
            "ALTER ROLE catalog_reader NOLOGIN;
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'catalog_reader';",
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Missed by the proxy: tenant 42 moves while nobody listens.
    catalog
        .admin
        .batch_execute("UPDATE pgtenant.tenant_shard_map SET shard_id = 1 WHERE tenant_id = 42")
        .await
        .unwrap();
    assert_eq!(lands_on(&proxy, 42).await, Ok(2), "cached tenants keep routing while the catalog is away");
    let err = lands_on(&proxy, 600).await.unwrap_err();
    assert_eq!(err, "08001", "an uncached tenant gets a clear error");

    catalog.admin.batch_execute("ALTER ROLE catalog_reader LOGIN").await.unwrap();
    let took = eventually(Duration::from_secs(5), || async { lands_on(&proxy, 42).await == Ok(1) }).await;
    assert!(took.is_some(), "after reconnecting, the missed move must be applied");
    assert_eq!(lands_on(&proxy, 600).await, Ok(1));
    assert_eq!(routing_version(&proxy).await, catalog.version().await);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_catalog_server_is_survived_and_followed_again_once_back() {
    let cluster = crate::harness::private_cluster("catalog-killed", 0);
    let config = crate::harness::demo_catalog_on(cluster.port, "pgtenant_catalog").await;
    let proxy = start_catalog_proxy(config, |_| {}).await;
    assert_eq!(lands_on(&proxy, 42).await, Ok(2));

    // The test clusters trade durability for speed: make the layout survive the crash.
    let conninfo = format!("host=127.0.0.1 port={} user=postgres dbname=pgtenant_catalog", cluster.port);
    crate::harness::connect(&conninfo).await.unwrap().batch_execute("CHECKPOINT").await.unwrap();
    cluster.kill().unwrap();
    assert_eq!(lands_on(&proxy, 42).await, Ok(2), "a cached tenant routes without its catalog");
    assert_eq!(lands_on(&proxy, 600).await, Err("08001".into()), "an uncached one gets a clear error");

    cluster.start().unwrap();
    let admin = crate::harness::connect(&conninfo).await.unwrap();
    assert_eq!(lands_on(&proxy, 600).await, Ok(1), "lookups work again at once");
    admin
        .batch_execute("UPDATE pgtenant.tenant_shard_map SET shard_id = 1 WHERE tenant_id = 42")
        .await
        .unwrap();
    let took = eventually(Duration::from_secs(5), || async { lands_on(&proxy, 42).await == Ok(1) }).await;
    assert!(took.is_some(), "the proxy listens again after the catalog came back");
    proxy.shutdown().await;
    cluster.stop().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn text_tenant_keys_route_by_map_and_hash_groups_and_stay_isolated() {
    let catalog = new_catalog("textkeys").await;
    catalog
        .admin
        .batch_execute(
            "INSERT INTO pgtenant.tenant_shard_map_text (tenant_key, shard_id) VALUES ('acme', 2), ('globex', 1);
             INSERT INTO pgtenant.hash_group VALUES (0, 1), (1, 2);
             UPDATE pgtenant.routing_state SET hash_group_count = 2;",
        )
        .await
        .unwrap();
    for shard_number in [1, 2] {
        let shard = crate::harness::shard_admin(shard_number, "app").await;
        let owner = if shard_number == 1 { "globex" } else { "acme" };
        shard
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS text_notes (tenant_id text NOT NULL, note text);
                 ALTER TABLE text_notes OWNER TO app;
                 DELETE FROM text_notes;
                 INSERT INTO text_notes VALUES ('{owner}', 'note of {owner}'), ('zz-other', 'not for {owner}');"
            ))
            .await
            .unwrap();
        if shard_number == 2 {
            // Row-level security on a text tenant column: the policy compares with the text
            // GUC. (Shard 1's copy of sql/rls.sql belongs to the RLS test running alongside.)
            shard.batch_execute(include_str!("../../sql/rls.sql")).await.unwrap();
            shard.batch_execute("CALL pgtenant.enable_tenant_isolation('text_notes')").await.unwrap();
        }
    }
    let proxy = start_catalog_proxy(catalog.config.clone(), |c| {
        c.proxy.tenant_key = pgtenant::config::TenantKey::Text;
    })
    .await;

    // Session tenants, from the explicit map.
    let acme =
        crate::harness::connect(&proxy.conninfo("options='-c pgtenant.tenant_id=acme'")).await.unwrap();
    assert_eq!(shard_of(&acme).await, 2);
    let guc: String =
        acme.query_one("SELECT current_setting('pgtenant.tenant_id')", &[]).await.unwrap().get(0);
    assert_eq!(guc, "acme");
    // Isolation: a bound session cannot name another text key, as a literal or a parameter.
    let err = acme.simple_query("SELECT note FROM text_notes WHERE tenant_id = 'globex'").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501");
    let err = acme.query("SELECT note FROM text_notes WHERE tenant_id = $1", &[&"globex"]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501");

    // Routing by SQL without a session tenant: literals and (binary) text parameters.
    let free = proxy.connect(None).await;
    let note: String =
        free.query_one("SELECT note FROM text_notes WHERE tenant_id = 'globex'", &[]).await.unwrap().get(0);
    assert_eq!(note, "note of globex");
    let note: String =
        free.query_one("SELECT note FROM text_notes WHERE tenant_id = $1", &[&"acme"]).await.unwrap().get(0);
    assert_eq!(note, "note of acme");

    // Unmapped keys go by hash group, as the SQL function computes it; quotes survive.
    for key in ["initech", "umbrella", "o'brien"] {
        let group: i32 =
            catalog.admin.query_one("SELECT pgtenant.hash_group_of($1, 2)", &[&key]).await.unwrap().get(0);
        let client = proxy.connect(None).await;
        client
            .batch_execute(&format!("SET pgtenant.tenant_id = '{}'", key.replace('\'', "''")))
            .await
            .unwrap();
        assert_eq!(shard_of(&client).await, group + 1, "key {key}");
        let guc: String =
            client.query_one("SELECT current_setting('pgtenant.tenant_id')", &[]).await.unwrap().get(0);
        assert_eq!(guc, key);
    }

    // A change of the text map reaches routing like any other.
    catalog
        .admin
        .batch_execute("UPDATE pgtenant.tenant_shard_map_text SET shard_id = 1 WHERE tenant_key = 'acme'")
        .await
        .unwrap();
    let took = eventually(NOTIFY_WAIT, || async { shard_of(&acme).await == 1 }).await;
    assert!(took.is_some(), "acme did not move within {NOTIFY_WAIT:?}");
    proxy.shutdown().await;
}

/// A proxy's catalog connections once it is up and routing (issue 56): the one
/// connection its routing watcher and moves' agent both LISTEN on, and one lookup
/// connection; the snowflake lease adds its own only once the proxy mints.
#[tokio::test(flavor = "multi_thread")]
async fn a_proxy_holds_two_catalog_connections_its_listeners_sharing_one() {
    let catalog = new_catalog("connections").await;
    // One lookup connection at most: with the default four, the watcher's snapshot read
    // and a lookup of this test's that overlap it (a loaded machine) open a second.
    let config = pgtenant::config::CatalogConfig { lookup_connections: 1, ..catalog.config.clone() };
    let proxy = start_catalog_proxy(config, |_| {}).await;
    let connections = || async {
        catalog
            .admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'pgtenant-catalog'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    // Both listeners work on the shared connection: the agent heartbeats, and a
    // routing change reaches the watcher.
    let heartbeating = eventually(Duration::from_secs(10), || async {
        let n: i64 = catalog
            .admin
            .query_one("SELECT count(*) FROM pgtenant.proxy_instance", &[])
            .await
            .unwrap()
            .get(0);
        n == 1
    })
    .await;
    assert!(heartbeating.is_some(), "the moves' agent heartbeats");
    assert_eq!(lands_on(&proxy, 42).await, Ok(2));
    catalog
        .admin
        .execute("UPDATE pgtenant.tenant_shard_map SET shard_id = 1 WHERE tenant_id = 42", &[])
        .await
        .unwrap();
    let followed =
        eventually(Duration::from_secs(10), || async { lands_on(&proxy, 42).await == Ok(1) }).await;
    assert!(followed.is_some(), "the routing watcher applied the change");
    assert_eq!(connections().await, 2, "the shared LISTEN connection and one lookup connection");
    let client = proxy.connect(Some(42)).await;
    client.query_one("SELECT pgtenant.next_id()", &[]).await.unwrap();
    assert_eq!(connections().await, 3, "and the snowflake lease's, now that it mints");
    proxy.shutdown().await;
}
