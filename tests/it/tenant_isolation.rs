//! Tenant isolation against the tenant's own SQL (issue 22): SQL that changes the tenant
//! GUC behind pgtenant's back (a DO block, a function) must not poison the pooled
//! server connection for the sessions that get it next.

use pgtenant::config::PoolMode;

use crate::harness::{shard_admin, start_pooled_proxy, start_proxy};

/// A table of shard 1 with one row of tenant 7 and one of tenant 8, under the
/// row-level security policy of `sql/rls.sql`, and a function that sets the tenant GUC.
async fn isolated_table(table: &str) {
    let admin = shard_admin(1, "app").await;
    // Other tests install sql/rls.sql on this shard at the same time: one of two
    // concurrent CREATE OR REPLACE FUNCTIONs may fail, and a second try then passes.
    for attempt in 0..5 {
        match admin.batch_execute(include_str!("../../sql/rls.sql")).await {
            Ok(()) => break,
            Err(e) if attempt < 4 => eprintln!("installing sql/rls.sql again: {e}"),
            Err(e) => panic!("sql/rls.sql: {e}"),
        }
    }
    admin
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table};
             CREATE TABLE {table} (tenant_id bigint, secret text);
             INSERT INTO {table} VALUES (7, 'secret-7'), (8, 'secret-8');
             GRANT SELECT ON {table} TO app;
             CALL pgtenant.enable_tenant_isolation('{table}');
             CREATE OR REPLACE FUNCTION iso_poison() RETURNS void LANGUAGE plpgsql AS
               $$ BEGIN PERFORM set_config('pgtenant.tenant_id', '8', false); END $$;
             GRANT EXECUTE ON FUNCTION iso_poison() TO app;"
        ))
        .await
        .unwrap();
}

/// The secrets a tenant-7 session reads, through the simple or extended protocol.
async fn secrets(client: &tokio_postgres::Client, table: &str, extended: bool) -> Vec<String> {
    let sql = format!("SELECT secret FROM {table} ORDER BY secret");
    if extended {
        client.query(&sql, &[]).await.unwrap().iter().map(|r| r.get(0)).collect()
    } else {
        first_values(client, &sql).await
    }
}

/// The first value of every row a simple query (of any number of statements) returns.
async fn first_values(client: &tokio_postgres::Client, sql: &str) -> Vec<String> {
    client
        .simple_query(sql)
        .await
        .unwrap()
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .collect()
}

async fn no_poisoning(mode: PoolMode, pipeline_depth: usize, table: &str) {
    isolated_table(table).await;
    // One server connection: every session gets the one the poisoner used.
    let proxy = start_proxy(|c| {
        c.users[0].pool_size = 1;
        c.proxy.pool_mode = mode;
        c.proxy.pipeline_depth = pipeline_depth;
    })
    .await;
    let label = format!("{mode:?} pooling, pipeline_depth {pipeline_depth}");
    for poison in
        ["DO $$ BEGIN PERFORM set_config('pgtenant.tenant_id', '8', false); END $$", "SELECT iso_poison()"]
    {
        let poisoner = proxy.connect(Some(7)).await;
        assert_eq!(secrets(&poisoner, table, false).await, ["secret-7"], "{label}");
        if poison.starts_with("DO") {
            poisoner.simple_query(poison).await.unwrap();
        } else {
            // The extended protocol, as drivers send it.
            poisoner.query(poison, &[]).await.unwrap();
        }
        // Its next transaction runs under the tenant pgtenant sets, not the one its SQL set.
        assert_eq!(secrets(&poisoner, table, true).await, ["secret-7"], "{label}, after {poison}");
        drop(poisoner);
        for n in 0..20 {
            let client = proxy.connect(Some(7)).await;
            let seen = secrets(&client, table, n % 2 == 1).await;
            assert_eq!(seen, ["secret-7"], "{label}: session {n} after {poison}");
        }
    }
    // A session of tenant 8 still sees its own row.
    let eight = proxy.connect(Some(8)).await;
    assert_eq!(secrets(&eight, table, false).await, ["secret-8"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn sql_that_sets_the_tenant_guc_poisons_no_pooled_connection_in_transaction_pooling() {
    no_poisoning(PoolMode::Transaction, 8, "iso_tx").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sql_that_sets_the_tenant_guc_poisons_no_pooled_connection_without_pipelining() {
    no_poisoning(PoolMode::Transaction, 0, "iso_tx_nopipe").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sql_that_sets_the_tenant_guc_poisons_no_pooled_connection_in_session_pooling() {
    no_poisoning(PoolMode::Session, 8, "iso_session").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_setting_changed_inside_a_do_block_does_not_reach_the_next_client_in_transaction_pooling() {
    let proxy = start_proxy(|c| c.users[0].pool_size = 1).await;
    let default_path = {
        let client = proxy.connect(Some(7)).await;
        client.query_one("SHOW search_path", &[]).await.unwrap().get::<_, String>(0)
    };
    let client = proxy.connect(Some(7)).await;
    client
        .simple_query("DO $$ BEGIN PERFORM set_config('search_path', 'pg_catalog', false); END $$")
        .await
        .unwrap();
    drop(client);
    for n in 0..5 {
        let next = proxy.connect(Some(7)).await;
        let path: String = next.query_one("SHOW search_path", &[]).await.unwrap().get(0);
        assert_eq!(path, default_path, "session {n} got the previous client's search_path");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_given_at_login_is_bound_unless_the_user_may_switch() {
    let bound = start_proxy(|_| {}).await;
    let client = bound.connect(Some(7)).await;
    let err = client.simple_query("SET pgtenant.tenant_id = 8").await.expect_err("bound by default");
    assert_eq!(crate::harness::sqlstate(&err), "42501");
    assert!(format!("{err:?}").contains("bound to tenant 7"), "{err:?}");
    let tenant: String = client.query_one("SHOW pgtenant.tenant_id", &[]).await.unwrap().get(0);
    assert_eq!(tenant, "7", "the session goes on, still tenant 7");
    // A session that logged in without a tenant may choose one.
    let free = bound.connect(None).await;
    free.simple_query("SET pgtenant.tenant_id = 8").await.expect("no tenant at login");

    // A user allowed to switch (a service serving many tenants on one connection).
    let switching = start_proxy(|c| c.users[0].allow_tenant_switch = Some(true)).await;
    let client = switching.connect(Some(7)).await;
    client.simple_query("SET pgtenant.tenant_id = 8").await.expect("allowed for this user");
    let row = client.query_one("SELECT current_setting('pgtenant.tenant_id')", &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "8");
}

#[tokio::test(flavor = "multi_thread")]
async fn statements_sqlparser_cannot_parse_are_checked_and_routed_all_the_same() {
    let proxy = start_proxy(|_| {}).await;
    let seven = proxy.connect(Some(7)).await;
    // sqlparser does not know FOR NO KEY UPDATE: the lexer still reads the tenant it
    // names, another one's, and pgtenant refuses it (on either protocol).
    for sql in [
        "SELECT name FROM accounts WHERE tenant_id = 500 FOR NO KEY UPDATE",
        "SELECT name FROM accounts a WHERE 500 = a.tenant_id FOR KEY SHARE",
    ] {
        let err = seven.simple_query(sql).await.expect_err("names tenant 500");
        assert_eq!(crate::harness::sqlstate(&err), "42501", "{sql}: {err:?}");
        let err = seven.query(sql, &[]).await.expect_err("names tenant 500");
        assert_eq!(crate::harness::sqlstate(&err), "42501", "{sql}: {err:?}");
    }
    let err = seven
        .query("SELECT name FROM accounts WHERE tenant_id = $1 FOR NO KEY UPDATE", &[&500i64])
        .await
        .expect_err("a parameter naming tenant 500");
    assert_eq!(crate::harness::sqlstate(&err), "42501");
    // Its own tenant, the same way, runs.
    let rows =
        seven.query("SELECT name FROM accounts WHERE tenant_id = 7 FOR NO KEY UPDATE", &[]).await.unwrap();
    assert_eq!(rows.len(), 3);
    // A comparison in the select list filters nothing and names no tenant: PostgreSQL
    // runs it, and so does pgtenant (row-level security keeps it to tenant 7's rows).
    let rows = seven
        .query("SELECT CASE WHEN tenant_id = 8 THEN 'eight' ELSE 'other' END FROM accounts", &[])
        .await
        .unwrap();
    assert_eq!(rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>(), ["other", "other", "other"]);
    // Without a tenant, an unparsed statement that names no table needs none.
    let nobody = proxy.connect(None).await;
    let user: String = nobody.query_one("SELECT pg_catalog.session_user()", &[]).await.unwrap().get(0);
    assert_eq!(user, "app");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_tenants_own_sql_cannot_forge_the_tenant_row_level_security_trusts() {
    let table = "iso_forge";
    isolated_table(table).await;
    let proxy = start_proxy(|_| {}).await;
    let seven = proxy.connect(Some(7)).await;
    assert_eq!(secrets(&seven, table, false).await, ["secret-7"]);
    // The GUC set by the tenant's own SQL, read in the same statement string, in the
    // same explicit transaction, and through a function: the signature pgtenant set is
    // for tenant 7 on this backend, so row-level security trusts no tenant at all.
    let forge = "DO $$ BEGIN PERFORM set_config('pgtenant.tenant_id', '8', false); END $$";
    for attempt in [
        format!("{forge}; SELECT secret FROM {table}"),
        format!("BEGIN; {forge}; SELECT secret FROM {table}; COMMIT"),
        format!("SELECT iso_poison(); SELECT secret FROM {table}"),
        // Copying the signature it holds (tenant 7's) along does not help.
        format!(
            "DO $$ BEGIN PERFORM set_config('pgtenant.tenant_id', '8', false); \
             PERFORM set_config('pgtenant.tenant_sig', current_setting('pgtenant.tenant_sig'), false); END $$; \
             SELECT secret FROM {table}"
        ),
    ] {
        let mut rows = first_values(&seven, &attempt).await;
        // iso_poison() answers one empty (void) value.
        rows.retain(|value| !value.is_empty());
        assert!(rows.is_empty(), "{attempt}: {rows:?}");
    }
    // The key is out of the tenant's reach.
    for sql in ["SELECT * FROM pgtenant.context_key", "SELECT pgtenant.set_context_key('mine')"] {
        let err = seven.simple_query(sql).await.expect_err("permission denied");
        assert_eq!(crate::harness::sqlstate(&err), "42501", "{sql}");
    }
    // And the session's next transaction runs as tenant 7 again.
    assert_eq!(secrets(&seven, table, true).await, ["secret-7"]);
}

/// A write runs a trigger that sets the tenant GUC (issue 49 spares the GUC's SET after
/// writes to a shard that runs no code of the user's on writes): on a shard that has
/// such a trigger, including one created through this proxy after writes found none,
/// the GUC is set again before the connection's next transaction, in both pool modes.
#[tokio::test(flavor = "multi_thread")]
async fn a_trigger_that_sets_the_tenant_guc_poisons_no_later_transaction() {
    let admin = shard_admin(1, "app").await;
    admin
        .batch_execute(
            "DROP TABLE IF EXISTS hooked CASCADE;
             CREATE TABLE hooked (tenant_id bigint, v int);
             ALTER TABLE hooked OWNER TO app;",
        )
        .await
        .unwrap();
    for mode in [PoolMode::Transaction, PoolMode::Session] {
        // One server connection: the next transaction gets the one the trigger ran on.
        let proxy = start_pooled_proxy(mode, 1).await;
        let client = proxy.connect(Some(7)).await;
        let guc = "SELECT current_setting('pgtenant.tenant_id') AS guc WHERE true";
        for _ in 0..3 {
            client.batch_execute("INSERT INTO hooked VALUES (7, 1)").await.unwrap();
            assert_eq!(first_values(&client, guc).await, ["7"], "{mode:?}");
        }
        // pg_settings' own rule: an UPDATE of it is set_config.
        let forge = "UPDATE pg_settings SET setting = '8' WHERE name = 'pgtenant.tenant_id'";
        client.batch_execute(forge).await.unwrap();
        assert_eq!(first_values(&client, guc).await, ["7"], "{mode:?}: after UPDATE pg_settings");
        // The tenant's own DDL, through this proxy.
        client
            .batch_execute(
                "CREATE OR REPLACE FUNCTION hooked_poison() RETURNS trigger LANGUAGE plpgsql AS
                   $$ BEGIN PERFORM set_config('pgtenant.tenant_id', '8', false); RETURN NEW; END $$;
                 DROP TRIGGER IF EXISTS hooked_poison ON hooked;
                 CREATE TRIGGER hooked_poison BEFORE INSERT ON hooked
                   FOR EACH ROW EXECUTE FUNCTION hooked_poison();",
            )
            .await
            .unwrap();
        for round in 0..3 {
            client.batch_execute("INSERT INTO hooked VALUES (7, 2)").await.unwrap();
            assert_eq!(first_values(&client, guc).await, ["7"], "{mode:?}, after the trigger ran ({round})");
            let extended = client.execute("INSERT INTO hooked VALUES ($1, 3)", &[&7i64]).await;
            assert!(extended.is_ok(), "{mode:?}: {extended:?}");
            let row = client.query_one(guc, &[]).await.unwrap();
            assert_eq!(row.get::<_, String>(0), "7", "{mode:?}, extended ({round})");
        }
        client.batch_execute("DROP TRIGGER hooked_poison ON hooked").await.unwrap();
        proxy.shutdown().await;
    }
}

/// A database `name` of its own on shard 1 (made again), a proxy `configure`d, and a
/// tenant-7 client of that database through it, with an empty table `plain`; and the
/// shard's admin connection.
async fn hooks_database(
    name: &str,
    configure: impl FnOnce(&mut pgtenant::config::Config),
) -> (tokio_postgres::Client, crate::harness::Proxy, tokio_postgres::Client) {
    let admin = shard_admin(1, "app").await;
    admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await.unwrap();
    admin.batch_execute(&format!("CREATE DATABASE {name} OWNER app")).await.unwrap();
    let proxy = start_proxy(configure).await;
    let conninfo = format!(
        "host=127.0.0.1 port={} user=app password=app dbname={name} sslmode=disable options='-c pgtenant.tenant_id=7'",
        proxy.addr.port()
    );
    let client = crate::harness::connect(&conninfo).await.unwrap();
    // The table's own catalog rows are read by its backend here, before any lock: a
    // table without triggers or rules is then written without reading `pg_trigger`.
    client.batch_execute("CREATE TABLE plain (tenant_id bigint, v int); SELECT * FROM plain").await.unwrap();
    (admin, proxy, client)
}

/// The catalog read that tells whether writes run hooks goes over a connection of the
/// writer's pool while it has a place free: no login of its own every `REFRESH` (its
/// SCRAM key derivation cost more than the writes between two reads). Seen on the
/// shard: the read's query is the last one of a pooled backend, not of a login that
/// came and went.
#[tokio::test(flavor = "multi_thread")]
async fn the_write_hooks_are_read_on_a_free_pooled_connection() {
    let (admin, proxy, client) = hooks_database("hooks_read", |_| {}).await;
    let read_on = "SELECT application_name FROM pg_stat_activity
                   WHERE datname = 'hooks_read' AND query LIKE '%NOT tgisinternal%' AND pid <> pg_backend_pid()";
    // Looked at before each write: a write right before the look could take the read's
    // connection back from the pool, and its last query with it. Past a refresh (10 s)
    // the answer is read again.
    let pooled = crate::harness::eventually(std::time::Duration::from_secs(25), || async {
        let rows = admin.query(read_on, &[]).await.unwrap();
        let seen = rows.iter().any(|r| r.get::<_, String>(0) != "pgtenant write hooks");
        client.batch_execute("INSERT INTO plain VALUES (7, 1)").await.unwrap();
        seen
    });
    assert!(pooled.await.is_some(), "no pooled connection ran the read");
    drop(client);
    proxy.shutdown().await;
    admin.batch_execute("DROP DATABASE IF EXISTS hooks_read WITH (FORCE)").await.unwrap();
}

/// A writer whose pool is full (one place, its own) still has the shard's write hooks
/// read: on a connection made beside the pool with the pool's keys, named for what it
/// does, closed after its one query. Seen on the shard while the read waits for a lock
/// on `pg_trigger`: the writer's pooled backend, and the read's beside it.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_pool_s_write_hooks_are_read_beside_it() {
    let (admin, proxy, client) = hooks_database("hooks_full", |c| c.users[0].pool_size = 1).await;
    let locker = shard_admin(1, "hooks_full").await;
    locker.batch_execute("BEGIN; LOCK pg_catalog.pg_trigger IN ACCESS EXCLUSIVE MODE").await.unwrap();
    client.batch_execute("INSERT INTO plain VALUES (7, 1)").await.unwrap();
    let backends = |name_is: &'static str| {
        let admin = &admin;
        async move {
            let sql = format!(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = 'hooks_full' AND usename = 'app'
                 AND (application_name = 'pgtenant write hooks') = {name_is}"
            );
            admin.query_one(&sql, &[]).await.unwrap().get::<_, i64>(0)
        }
    };
    let read_waits = "SELECT count(*) FROM pg_stat_activity WHERE datname = 'hooks_full'
                      AND application_name = 'pgtenant write hooks' AND wait_event_type = 'Lock'
                      AND query LIKE '%NOT tgisinternal%'";
    let waiting = crate::harness::eventually(std::time::Duration::from_secs(20), || async {
        admin.query_one(read_waits, &[]).await.unwrap().get::<_, i64>(0) == 1
    });
    assert!(waiting.await.is_some(), "no read of the write hooks beside the full pool");
    assert_eq!(backends("false").await, 1, "the pool kept its one connection");
    locker.batch_execute("ROLLBACK").await.unwrap();
    let closed = crate::harness::eventually(std::time::Duration::from_secs(20), || async {
        backends("true").await == 0
    });
    assert!(closed.await.is_some(), "the read's connection closes after its query");
    client.batch_execute("INSERT INTO plain VALUES (7, 2)").await.unwrap();
    drop(client);
    proxy.shutdown().await;
    admin.batch_execute("DROP DATABASE IF EXISTS hooks_full WITH (FORCE)").await.unwrap();
}

/// The read beside a full pool holds a slot of the shard's caps like any server
/// connection: where the pool's one connection is all `max_db_connections` allows, no
/// read runs beside it (writes go on, the GUC set again after each), and the database
/// never has more than that one backend of the proxy's, sampled while writes come and
/// a read, had one been made, would wait for its lock on `pg_trigger`.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_pool_at_its_cap_reads_no_write_hooks_beside_it() {
    let (admin, proxy, client) = hooks_database("hooks_capped", |c| {
        c.users[0].pool_size = 1;
        c.proxy.max_db_connections = 1;
    })
    .await;
    let locker = shard_admin(1, "hooks_capped").await;
    locker.batch_execute("BEGIN; LOCK pg_catalog.pg_trigger IN ACCESS EXCLUSIVE MODE").await.unwrap();
    let backends = "SELECT count(*) FROM pg_stat_activity WHERE datname = 'hooks_capped' AND usename = 'app'";
    let mut most = 0;
    for v in 0..50 {
        client.batch_execute(&format!("INSERT INTO plain VALUES (7, {v})")).await.unwrap();
        most = most.max(admin.query_one(backends, &[]).await.unwrap().get::<_, i64>(0));
    }
    assert_eq!(most, 1, "the proxy's backends on hooks_capped, at most");
    locker.batch_execute("ROLLBACK").await.unwrap();
    let rows: i64 = client.query_one("SELECT count(*) FROM plain WHERE true", &[]).await.unwrap().get(0);
    assert_eq!(rows, 50);
    drop(client);
    proxy.shutdown().await;
    admin.batch_execute("DROP DATABASE IF EXISTS hooks_capped WITH (FORCE)").await.unwrap();
}

/// pgtenant's signature GUC is protected as the tenant GUC is: a client's SET, RESET
/// or `set_config` of it is refused (42501), in both protocols, so that no client can
/// leave a pooled connection holding its tenant without the signature row-level
/// security checks (the next client of that tenant would read nothing).
#[tokio::test(flavor = "multi_thread")]
async fn the_tenant_signature_is_protected_as_the_tenant_guc_is() {
    let table = "iso_signature";
    isolated_table(table).await;
    for mode in [PoolMode::Transaction, PoolMode::Session] {
        // One server connection: the next client gets the one the first left.
        let proxy = start_pooled_proxy(mode, 1).await;
        let first = proxy.connect(Some(7)).await;
        assert_eq!(secrets(&first, table, false).await, ["secret-7"]);
        for sql in [
            "SET pgtenant.tenant_sig = 'forged'",
            "SET SESSION pgtenant.tenant_sig TO DEFAULT",
            "RESET pgtenant.tenant_sig",
            "SELECT set_config('pgtenant.tenant_sig', '', false)",
        ] {
            let simple = first.batch_execute(sql).await.expect_err(sql);
            assert_eq!(crate::harness::sqlstate(&simple), "42501", "{mode:?}: {sql}");
            let extended = first.query(sql, &[]).await.expect_err(sql);
            assert_eq!(crate::harness::sqlstate(&extended), "42501", "{mode:?}, extended: {sql}");
        }
        assert_eq!(secrets(&first, table, true).await, ["secret-7"], "{mode:?}");
        drop(first);
        let next = proxy.connect(Some(7)).await;
        assert_eq!(secrets(&next, table, false).await, ["secret-7"], "{mode:?}: the next client");
        assert_eq!(secrets(&next, table, true).await, ["secret-7"], "{mode:?}: the next client, extended");
        proxy.shutdown().await;
    }
}
