//! SQL-aware routing and tenant isolation: tenants found in the SQL (simple and
//! extended protocol, literals and Bind parameters of every integer width), the
//! statements refused for naming another tenant or spanning shards, the tenant GUC
//! that clients may not change, and row-level security as the second wall.

use std::process::Command;

use crate::harness::{shard_admin, sqlstate, start_proxy, stderr, stdout};

/// The first column of the first row of a simple query's answer.
fn first_value(messages: &[tokio_postgres::SimpleQueryMessage]) -> Option<String> {
    messages.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    })
}

const SHARD_AND_COUNT: &str = "SELECT (SELECT shard_id FROM pgtenant_shard), count(*) FROM accounts WHERE";

#[tokio::test(flavor = "multi_thread")]
async fn simple_queries_are_routed_by_the_tenant_they_name() {
    let proxy = start_proxy(|_| {}).await;
    let client = proxy.connect(None).await;
    for (tenant, shard) in [(42, 2), (7, 1), (1500, 2), (500, 1)] {
        let sql = format!("{SHARD_AND_COUNT} tenant_id = {tenant}");
        let rows = client.simple_query(&sql).await.unwrap();
        let row = rows.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                Some((r.get(0).unwrap().to_string(), r.get(1).unwrap().to_string()))
            }
            _ => None,
        });
        assert_eq!(row, Some((shard.to_string(), "3".to_string())), "{sql}");
    }
    // A join and a subquery constrain the tenant just as well.
    let rows = client
        .simple_query(
            "SELECT s.shard_id FROM pgtenant_shard s
             WHERE EXISTS (SELECT 1 FROM accounts a WHERE a.tenant_id IN (1500) AND a.name LIKE 'account%')",
        )
        .await
        .unwrap();
    assert_eq!(first_value(&rows).as_deref(), Some("2"));
    // INSERT ... VALUES names its tenant in the column list; every row agrees.
    let inserted = client
        .simple_query(
            "INSERT INTO accounts (tenant_id, name) VALUES (1999, 'a'), (1999, 'b')
             RETURNING (SELECT shard_id FROM pgtenant_shard)",
        )
        .await
        .unwrap();
    assert_eq!(first_value(&inserted).as_deref(), Some("2"));
    client.batch_execute("DELETE FROM accounts WHERE tenant_id = 1999").await.unwrap();

    // A transaction stays on the shard of its first tenant.
    client.batch_execute("BEGIN").await.unwrap();
    let shard: i32 = client
        .query_one("SELECT shard_id FROM pgtenant_shard, accounts WHERE tenant_id = 1500 LIMIT 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(shard, 2);
    let err = client.simple_query("SELECT count(*) FROM accounts WHERE tenant_id = 7").await.unwrap_err();
    assert_eq!(sqlstate(&err), "0A000", "{err:?}");
    client.batch_execute("ROLLBACK").await.unwrap();

    // Statements across shards: reads point to the scatter-gather, writes are refused.
    let err =
        client.simple_query("SELECT count(*) FROM accounts WHERE tenant_id IN (7, 1500)").await.unwrap_err();
    assert_eq!(sqlstate(&err), "0A000");
    assert!(format!("{err:?}").contains("scatter-gather"), "{err:?}");
    let err = client
        .simple_query("DELETE FROM accounts WHERE tenant_id = 7 OR tenant_id = 1500")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&err), "0A000");
    assert!(format!("{err:?}").contains("cannot span shards"), "{err:?}");
    // Two tenants of one shard are fine to route; the demo table's row-level security
    // then shows none of their rows, since the statement runs with no tenant GUC.
    let n: i64 = client
        .query_one("SELECT count(*) FROM accounts WHERE tenant_id IN (7, 500)", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bind_parameters_route_in_every_integer_width_and_prepared_statements_follow_their_values() {
    let proxy = start_proxy(|_| {}).await;
    let client = proxy.connect(None).await;
    let by8 = client.prepare(&format!("{SHARD_AND_COUNT} tenant_id = $1")).await.unwrap();
    let by4 = client.prepare(&format!("{SHARD_AND_COUNT} tenant_id = $1::int4")).await.unwrap();
    let by2 = client.prepare(&format!("{SHARD_AND_COUNT} tenant_id = $1::int2")).await.unwrap();
    for (tenant, shard) in [(7i64, 1), (1500, 2), (42, 2), (500, 1)] {
        let row = client.query_one(&by8, &[&tenant]).await.unwrap();
        assert_eq!((row.get::<_, i32>(0), row.get::<_, i64>(1)), (shard, 3), "int8 {tenant}");
        let row = client.query_one(&by4, &[&(tenant as i32)]).await.unwrap();
        assert_eq!(row.get::<_, i32>(0), shard, "int4 {tenant}");
        let row = client.query_one(&by2, &[&(tenant as i16)]).await.unwrap();
        assert_eq!(row.get::<_, i32>(0), shard, "int2 {tenant}");
    }
    // Text parameters: pgbench -M extended and -M prepared send them as text.
    let script = std::env::temp_dir().join(format!("pgtenant-sql-routing-{}.sql", std::process::id()));
    std::fs::write(
        &script,
        "\\set tid random(1, 2000)\nSELECT count(*) FROM accounts WHERE tenant_id = :tid;\n\
         SELECT shard_id FROM pgtenant_shard, accounts WHERE accounts.tenant_id = :tid LIMIT 1;\n",
    )
    .unwrap();
    for mode in ["simple", "extended", "prepared"] {
        let out = Command::new("pgbench")
            .args(["-n", "-M", mode, "-c", "4", "-j", "2", "-t", "200", "-f"])
            .arg(&script)
            .args(["-h", "127.0.0.1", "-p", &proxy.addr.port().to_string(), "-U", "app", "app"])
            .env("PGPASSWORD", "app")
            .output()
            .unwrap();
        assert!(out.status.success(), "pgbench -M {mode}: {}{}", stdout(&out), stderr(&out));
        assert!(
            stdout(&out).contains("number of transactions actually processed: 800/800"),
            "{}",
            stdout(&out)
        );
    }
    let _ = std::fs::remove_file(&script);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn statements_sqlparser_cannot_parse_run_on_the_session_tenant_and_are_refused_only_without_one() {
    let proxy = start_proxy(|_| {}).await;
    let block = "DO $$ BEGIN PERFORM 1 FROM accounts WHERE tenant_id = 1500; END $$";
    let bound = proxy.connect(Some(1500)).await;
    bound.batch_execute(block).await.unwrap();
    let name: String = bound
        .query_one(
            "SELECT name FROM accounts WHERE tenant_id = 1500 ORDER BY id LIMIT 1 FOR NO KEY UPDATE",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(name.contains("tenant 1500"), "{name}");
    let unbound = proxy.connect(None).await;
    let err = unbound.batch_execute(block).await.unwrap_err();
    assert_eq!(sqlstate(&err), "22023", "no tenant anywhere: the clear error, not a parse failure");
    proxy.shutdown().await;
}

/// Requests sent in one piece (Parse, Bind, Describe, Execute, Sync: tokio-postgres
/// `query_typed`, pgbench `-M extended`, many drivers) take a shorter path through the
/// proxy; they are routed, refused and followed exactly like the others.
#[tokio::test(flavor = "multi_thread")]
async fn one_piece_requests_are_routed_refused_and_followed_like_any_other() {
    use tokio_postgres::types::Type;
    let proxy = start_proxy(|c| c.proxy.allow_tenant_switch = true).await;
    let client = proxy.connect(None).await;
    let sql = format!("{SHARD_AND_COUNT} tenant_id = $1");
    for (tenant, shard) in [(7i64, 1), (1500, 2), (42, 2), (500, 1)] {
        let row = client.query_typed_one(&sql, &[(&tenant, Type::INT8)]).await.unwrap();
        assert_eq!((row.get::<_, i32>(0), row.get::<_, i64>(1)), (shard, 3), "tenant {tenant}");
    }
    let err = client.query_typed("SELECT count(*) FROM accounts", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "22023", "no tenant: {err}");
    let both = format!("{SHARD_AND_COUNT} tenant_id = $1 OR tenant_id = $2");
    let err = client.query_typed(&both, &[(&7i64, Type::INT8), (&1500i64, Type::INT8)]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "0A000", "two shards: {err}");
    let row = client.query_typed_one(&sql, &[(&1500i64, Type::INT8)]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 2, "the session goes on after the refusals");

    let bound = proxy.connect(Some(7)).await;
    let err = bound.query_typed(&sql, &[(&500i64, Type::INT8)]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "another tenant of the same shard");
    let err = bound
        .query_typed("SELECT pg_catalog.set_config('pgtenant.tenant_id', $1, false)", &[(&"500", Type::TEXT)])
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "the tenant GUC is protected");
    let row = bound.query_typed_one(&sql, &[(&7i64, Type::INT8)]).await.unwrap();
    assert_eq!((row.get::<_, i32>(0), row.get::<_, i64>(1)), (1, 3));
    // pgtenant answers a SET of the tenant parameter itself, in one piece too.
    bound.query_typed("SET pgtenant.tenant_id = 42", &[]).await.unwrap();
    let row = bound.query_typed_one(&sql, &[(&42i64, Type::INT8)]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 2);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bound_session_never_reaches_another_tenant() {
    let proxy = start_proxy(|_| {}).await;
    let client = proxy.connect(Some(7)).await;
    let err = client.simple_query("SELECT * FROM accounts WHERE tenant_id = 500").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "same shard, still another tenant");
    let err = client.simple_query("SELECT * FROM accounts /*tenant_id='42'*/").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501");
    let by_tenant = client.prepare("SELECT count(*) FROM accounts WHERE tenant_id = $1").await.unwrap();
    let n: i64 = client.query_one(&by_tenant, &[&7i64]).await.unwrap().get(0);
    assert_eq!(n, 3);
    let err = client.query_one(&by_tenant, &[&500i64]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "the prepared statement with a new value");
    // Inside a transaction too, and the transaction goes on.
    client.batch_execute("BEGIN").await.unwrap();
    assert_eq!(client.query_one(&by_tenant, &[&7i64]).await.unwrap().get::<_, i64>(0), 3);
    let err = client.query_one(&by_tenant, &[&1500i64]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501");
    let err = client.batch_execute("SET LOCAL pgtenant.tenant_id = 500").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501");
    client.batch_execute("ROLLBACK").await.unwrap();
    let err = client.simple_query("SELECT set_config('pgtenant.tenant_id', '500', false)").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501");
    let err = client
        .query("SELECT pg_catalog.set_config('pgtenant.tenant_id', $1, false)", &[&"500"])
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&err), "42501");
    let guc: String =
        client.query_one("SELECT current_setting('pgtenant.tenant_id')", &[]).await.unwrap().get(0);
    assert_eq!(guc, "7", "the server's tenant GUC is still the session's");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_fixed_at_login_cannot_switch_when_the_config_says_so() {
    let proxy = start_proxy(|c| c.proxy.allow_tenant_switch = false).await;
    let fixed = proxy.connect(Some(7)).await;
    let err = fixed.batch_execute("SET pgtenant.tenant_id = 1500").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501");
    fixed.batch_execute("SET pgtenant.tenant_id = 7").await.unwrap();
    fixed.batch_execute("RESET pgtenant.tenant_id").await.unwrap();
    let free = proxy.connect(None).await;
    free.batch_execute("SET pgtenant.tenant_id = 1500").await.unwrap();
    assert_eq!(crate::harness::shard_of(&free).await, 2);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn row_level_security_shows_a_query_without_where_only_the_session_tenant() {
    let admin = shard_admin(1, "app").await;
    admin.batch_execute(include_str!("../../sql/rls.sql")).await.unwrap();
    admin
        .batch_execute(
            "DROP TABLE IF EXISTS rls_notes;
             CREATE TABLE rls_notes (tenant_id bigint NOT NULL, note text);
             ALTER TABLE rls_notes OWNER TO app;
             INSERT INTO rls_notes VALUES (7, 'seven'), (7, 'seven again'), (500, 'five hundred');
             CALL pgtenant.enable_tenant_isolation('rls_notes');",
        )
        .await
        .unwrap();
    let proxy = start_proxy(|_| {}).await;
    let seven = proxy.connect(Some(7)).await;
    let notes: Vec<String> = seven
        .query("SELECT note FROM rls_notes ORDER BY note", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(notes, vec!["seven", "seven again"]);
    let err = seven.execute("INSERT INTO rls_notes VALUES (500, 'sneaky')", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "refused by pgtenant before the policy could");
    let err = seven.execute("INSERT INTO rls_notes SELECT 500, 'via select'", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "the policy's WITH CHECK stops what the SQL hid: {err:?}");
    let five_hundred = proxy.connect(Some(500)).await;
    let n: i64 = five_hundred.query_one("SELECT count(*) FROM rls_notes", &[]).await.unwrap().get(0);
    assert_eq!(n, 1);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_default_for_the_tenant_guc_never_reaches_a_session() {
    let admin = shard_admin(1, "postgres").await;
    let exists =
        admin.query_opt("SELECT 1 FROM pg_database WHERE datname = 'guc_default'", &[]).await.unwrap();
    if exists.is_none() {
        admin.batch_execute("CREATE DATABASE guc_default OWNER app").await.unwrap();
    }
    admin.batch_execute("ALTER DATABASE guc_default SET pgtenant.tenant_id = '500'").await.unwrap();
    let proxy = start_proxy(|_| {}).await;
    let client = crate::harness::connect(&format!(
        "host=127.0.0.1 port={} user=app password=app dbname=guc_default sslmode=disable",
        proxy.addr.port()
    ))
    .await
    .unwrap();
    for _ in 0..3 {
        let guc: String =
            client.query_one("SELECT current_setting('pgtenant.tenant_id', true)", &[]).await.unwrap().get(0);
        assert_eq!(guc, "", "a session without a tenant must not run as the database's default tenant 500");
    }
    client.batch_execute("SET pgtenant.tenant_id = 7").await.unwrap();
    let guc: String =
        client.query_one("SELECT current_setting('pgtenant.tenant_id')", &[]).await.unwrap().get(0);
    assert_eq!(guc, "7");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_setting_one_shard_refuses_is_reported_and_never_undoes_the_tenant_guc() {
    use crate::harness::raw::{RawClient, first_column};
    // A text search configuration that only shard 1 has: a setting naming it is valid
    // there and refused by shard 2.
    shard_admin(1, "app")
        .await
        .batch_execute(
            "DO $$ BEGIN CREATE TEXT SEARCH CONFIGURATION public.only_on_shard1 (COPY = pg_catalog.simple); \
             EXCEPTION WHEN unique_violation OR duplicate_object THEN NULL; END $$",
        )
        .await
        .unwrap();
    // One server connection per shard, so the second client gets the first one's.
    let proxy = start_proxy(|c| {
        c.users[0].pool_size = 1;
        c.proxy.allow_tenant_switch = true;
    })
    .await;
    let first = proxy.connect(Some(42)).await;
    let row =
        first.query_one("SELECT current_setting('pgtenant.tenant_id'), pg_backend_pid()", &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "42");
    let shard2_pid = row.get::<_, i32>(1).to_string();
    drop(first);
    // Shard 1 accepts the setting at login; shard 2 refuses it when the session's next
    // tenant takes it there, in the same checkout that sets the tenant GUC.
    let options = "-c pgtenant.tenant_id=7 -c default_text_search_config=public.only_on_shard1";
    let mut second = RawClient::login(proxy.addr, &[("options", options)]).await;
    let config = first_column(&second.query("SHOW default_text_search_config").await);
    assert_eq!(config, ["public.only_on_shard1"]);
    second.query("SET pgtenant.tenant_id = 1500").await;
    for _ in 0..2 {
        let msgs = second
            .query("SELECT current_setting('pgtenant.tenant_id') || ' ' || pg_backend_pid() FROM pgtenant_shard WHERE shard_id = 2")
            .await;
        assert!(msgs.iter().all(|m| m.tag != b'E'), "{msgs:?}");
        let warning = msgs.iter().find(|m| m.tag == b'N').expect("a warning that the settings were refused");
        let text = String::from_utf8_lossy(&warning.body);
        assert!(
            text.contains("WARNING") && text.contains("shard 2 refused this session's settings"),
            "{text}"
        );
        assert_eq!(warning.sqlstate().as_deref(), Some("22023"));
        // The tenant GUC holds; the server connection is kept (the refused SETs undid
        // themselves), not closed and opened again for every transaction.
        assert_eq!(first_column(&msgs), [format!("1500 {shard2_pid}")]);
    }
    proxy.shutdown().await;
}

/// The tenant GUC of an extended request is set inside that request; when the request
/// fails, the SET rolls back with it, and the next request must set it again.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_or_pipelined_request_never_leaves_another_on_a_wrong_tenant_guc() {
    // One server connection per shard: every request below reuses the same one.
    let proxy = start_proxy(|c| c.users[0].pool_size = 1).await;
    let client = proxy.connect(None).await;
    // Prepared once: each query below is one request (Bind, Execute, Sync).
    let stmt = client
        .prepare("SELECT current_setting('pgtenant.tenant_id'), count(*) FROM accounts WHERE tenant_id = $1")
        .await
        .unwrap();
    let failing =
        client.prepare("SELECT (1 / (count(*) * 0))::int FROM accounts WHERE tenant_id = $1").await.unwrap();
    let guc_of = |tenant: i64| {
        let (client, stmt) = (&client, &stmt);
        async move { client.query_one(stmt, &[&tenant]).await.unwrap().get::<_, String>(0) }
    };
    assert_eq!(guc_of(5).await, "5");
    let err = client.query_one(&failing, &[&6i64]).await.unwrap_err();
    assert_eq!(crate::harness::sqlstate(&err), "22012");
    assert_eq!(guc_of(6).await, "6", "the failed request's SET was rolled back; it must be sent again");
    assert_eq!(guc_of(6).await, "6");
    assert_eq!(guc_of(7).await, "7");
    // The same with the next request pipelined behind the failing one (sent before its
    // answer): it must not run on the GUC that the failure rolled back.
    assert_eq!(guc_of(5).await, "5");
    let (failed, next) = futures_util::join!(client.query_one(&failing, &[&6i64]), guc_of(6));
    assert_eq!(crate::harness::sqlstate(&failed.unwrap_err()), "22012");
    assert_eq!(next, "6", "a pipelined request saw the tenant GUC of a rolled-back SET");
    // Pipelined requests of two tenants of one shard: each runs with its own GUC (the
    // first needs no SET, the connection already holds tenant 8).
    assert_eq!(guc_of(8).await, "8");
    let (a, b) = futures_util::join!(guc_of(8), guc_of(9));
    assert_eq!((a.as_str(), b.as_str()), ("8", "9"));
    proxy.shutdown().await;
}

/// A simple query carries its tenant GUC in the same way (the SET as unsynced extended
/// messages ahead of the Query): a failed query rolls it back, and the next one sets it
/// again; a statement PostgreSQL refuses after an unsynced message gets its SET apart.
#[tokio::test(flavor = "multi_thread")]
async fn a_simple_query_carries_its_tenant_guc_and_a_failure_takes_it_back() {
    let proxy = start_proxy(|c| c.users[0].pool_size = 1).await;
    let client = proxy.connect(None).await;
    let guc_of = |tenant: i64| {
        let client = &client;
        async move {
            let sql = format!(
                "SELECT current_setting('pgtenant.tenant_id'), count(*) FROM accounts WHERE tenant_id = {tenant}"
            );
            first_value(&client.simple_query(&sql).await.unwrap()).unwrap()
        }
    };
    assert_eq!(guc_of(5).await, "5");
    let failing = "SELECT (1 / (count(*) * 0))::int FROM accounts WHERE tenant_id = 6";
    let err = client.simple_query(failing).await.unwrap_err();
    assert_eq!(crate::harness::sqlstate(&err), "22012");
    assert_eq!(guc_of(6).await, "6", "the failed query's SET was rolled back; it must be sent again");
    assert_eq!(guc_of(7).await, "7");
    let (failed, next) = futures_util::join!(client.simple_query(failing), guc_of(6));
    assert_eq!(crate::harness::sqlstate(&failed.unwrap_err()), "22012");
    assert_eq!(next, "6", "a pipelined query saw the tenant GUC of a rolled-back SET");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn vacuum_runs_after_a_tenant_switch_in_both_protocols() {
    let proxy = start_proxy(|c| c.users[0].pool_size = 1).await;
    for tenant in [5i64, 6, 7] {
        // Each session starts on a connection that holds the previous tenant's GUC.
        let client = proxy.connect(Some(tenant)).await;
        // Extended protocol: PostgreSQL answers "VACUUM cannot be executed within a
        // pipeline" if the tenant SET went before it without a Sync.
        client.execute("VACUUM accounts", &[]).await.unwrap();
        client.batch_execute("VACUUM accounts").await.unwrap();
        let guc: String =
            client.query_one("SELECT current_setting('pgtenant.tenant_id')", &[]).await.unwrap().get(0);
        assert_eq!(guc, tenant.to_string());
    }
    proxy.shutdown().await;
}

/// Two requests in one write, for two tenants of one shard, no session tenant: the
/// second must not ride on the server connection (and tenant GUC) of the first.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_pipelined_behind_another_tenants_is_routed_on_its_own() {
    use bytes::BytesMut;
    use postgres_protocol::message::frontend;
    let proxy = start_proxy(|c| c.users[0].pool_size = 1).await;
    let mut raw = crate::harness::raw::RawClient::login(proxy.addr, &[]).await;
    let request = |tenant: i64, out: &mut BytesMut| {
        let sql = format!(
            "SELECT current_setting('pgtenant.tenant_id'), count(*) FROM accounts WHERE tenant_id = {tenant}"
        );
        frontend::parse("", &sql, std::iter::empty(), out).unwrap();
        crate::harness::raw::bind_unnamed(out);
        frontend::execute("", 0, out).unwrap();
        frontend::sync(out);
    };
    let mut first = BytesMut::new();
    request(8, &mut first);
    raw.send(&first).await;
    assert_eq!(crate::harness::raw::first_column(&raw.until_ready().await), vec!["8"]);
    let mut both = BytesMut::new();
    request(8, &mut both);
    request(9, &mut both);
    raw.send(&both).await;
    let mut gucs = crate::harness::raw::first_column(&raw.until_ready().await);
    gucs.extend(crate::harness::raw::first_column(&raw.until_ready().await));
    assert_eq!(gucs, vec!["8", "9"]);
    proxy.shutdown().await;
}
