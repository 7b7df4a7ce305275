//! The adversarial suite of issue 22: a session bound to tenant 7 tries every channel
//! we could think of to read tenant 8's row (same shard, row-level security on, signed
//! tenant context as `pgtenant dev` sets it up). Each attempt is refused (an error) or
//! confined (no row of tenant 8 comes back).
//!
//! And of issue 57: tenants share the server role, and PostgreSQL shows a role every
//! session of its own and lets it signal them. Through pgtenant a tenant's session reads
//! no other session's statement through any server-wide view, signals no other tenant's
//! backend, and the pid it was given behaves as its own backend's does on PostgreSQL:
//! `pg_backend_pid()` returns it, and cancelling or terminating it ends the caller's
//! statement or session. Both pool modes, both protocols.

use std::sync::Arc;
use std::time::Duration;

use pgtenant::config::PoolMode;
use tokio_postgres::SimpleQueryMessage;

use crate::harness::{self, shard_admin, sqlstate, start_proxy};

const TABLE: &str = "adv";

/// What an attempt got: an error's SQLSTATE, or the values of every row.
#[derive(Debug)]
enum Outcome {
    Refused(String),
    Rows(Vec<String>),
}

async fn simple(client: &tokio_postgres::Client, sql: &str) -> Outcome {
    match client.simple_query(sql).await {
        Ok(messages) => Outcome::Rows(
            messages
                .iter()
                .filter_map(|m| match m {
                    SimpleQueryMessage::Row(r) => {
                        Some((0..r.len()).filter_map(|i| r.get(i)).collect::<Vec<_>>().join(","))
                    }
                    _ => None,
                })
                .collect(),
        ),
        Err(e) => Outcome::Refused(crate::harness::sqlstate(&e)),
    }
}

fn rows_of(result: Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>) -> Outcome {
    match result {
        Ok(rows) => Outcome::Rows(rows.iter().map(|r| r.get::<_, String>(0)).collect()),
        Err(e) => Outcome::Refused(crate::harness::sqlstate(&e)),
    }
}

/// Tenant 8's secret never comes back: the attempt is refused with `refused` (pgtenant
/// reads the tenant it names), or, when `refused` is `None`, it runs and is confined
/// (no row of tenant 8 among its answers).
fn assert_walled(attempt: &str, outcome: &Outcome, refused: Option<&str>) {
    match (outcome, refused) {
        (Outcome::Refused(code), Some(expected)) => assert_eq!(code, expected, "{attempt}"),
        (Outcome::Refused(code), None) => panic!("{attempt} did not run (SQLSTATE {code})"),
        (Outcome::Rows(rows), None) => {
            assert!(rows.iter().all(|r| !r.contains("secret-8")), "{attempt} read tenant 8: {rows:?}")
        }
        (Outcome::Rows(rows), Some(expected)) => {
            panic!("{attempt} was not refused with {expected}: {rows:?}")
        }
    }
}

async fn setup() {
    let admin = shard_admin(1, "app").await;
    admin
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {TABLE} CASCADE;
             CREATE TABLE {TABLE} (tenant_id bigint, secret text);
             INSERT INTO {TABLE} VALUES (7, 'secret-7'), (8, 'secret-8');
             GRANT SELECT, INSERT, UPDATE ON {TABLE} TO app;
             CALL pgtenant.enable_tenant_isolation('{TABLE}');
             GRANT CREATE ON SCHEMA public TO app;"
        ))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bound_session_cannot_reach_another_tenants_rows_by_any_channel() {
    setup().await;
    let proxy = start_proxy(|c| c.users[0].pool_size = 4).await;
    let seven = proxy.connect(Some(7)).await;
    let t = TABLE;
    let refused = Some("42501");
    // Simple-protocol attempts: (SQL, must it be refused with 42501?).
    let attempts: Vec<(String, Option<&str>)> = vec![
        // Literals, casts, expressions.
        (format!("SELECT secret FROM {t} WHERE tenant_id = 8"), refused),
        (format!("SELECT secret FROM {t} WHERE tenant_id = '8'"), refused),
        (format!("SELECT secret FROM {t} WHERE tenant_id = '8'::bigint"), refused),
        (format!("SELECT secret FROM {t} WHERE tenant_id IN (7, 8)"), refused),
        (format!("SELECT secret FROM {t} WHERE secret = 'x' OR tenant_id = 8"), refused),
        (format!("SELECT secret FROM {t}"), None),
        (format!("SELECT secret FROM {t} WHERE tenant_id > 7"), None),
        (format!("SELECT secret FROM {t} WHERE tenant_id = 4 + 4"), None),
        (format!("SELECT secret FROM {t} WHERE tenant_id = 8.0"), None),
        (format!("SELECT secret FROM {t} WHERE tenant_id = 8e0"), None),
        (format!("SELECT secret FROM {t} WHERE tenant_id BETWEEN 8 AND 8"), None),
        (format!("SELECT secret FROM {t} WHERE tenant_id::text = '8'"), None),
        (format!("SELECT secret FROM {t} WHERE tenant_id = ANY(ARRAY[8])"), None),
        // Subqueries, CTEs, joins, UNION.
        (format!("SELECT secret FROM {t} WHERE tenant_id = (SELECT 8)"), None),
        (format!("WITH x AS (SELECT secret FROM {t} WHERE tenant_id = 8) SELECT * FROM x"), refused),
        (
            format!("WITH x AS (SELECT secret, tenant_id FROM {t}) SELECT secret FROM x WHERE tenant_id > 0"),
            None,
        ),
        (format!("SELECT a.secret FROM {t} a JOIN (VALUES (8)) v(t) ON a.tenant_id = v.t"), None),
        (
            format!(
                "SELECT secret FROM {t} WHERE tenant_id = 7 UNION SELECT secret FROM {t} WHERE tenant_id = 8"
            ),
            refused,
        ),
        (format!("SELECT (SELECT secret FROM {t} WHERE tenant_id = 8)"), refused),
        // Hints in comments are read; in strings and dollar quotes they are text.
        (format!("/* pgtenant.tenant_id=8 */ SELECT secret FROM {t}"), refused),
        (format!("/*tenant_id='8'*/ SELECT secret FROM {t}"), refused),
        (format!("SELECT '/* pgtenant.tenant_id=8 */', secret FROM {t}"), None),
        (format!("SELECT $$/* pgtenant.tenant_id=8 */$$, secret FROM {t}"), None),
        // What sqlparser does not parse.
        (format!("SELECT secret FROM {t} WHERE tenant_id = 8 FOR NO KEY UPDATE"), refused),
        (format!("SELECT secret FROM {t} FOR KEY SHARE"), None),
        // The tenant GUC, every way.
        ("SET pgtenant.tenant_id = 8".into(), refused),
        // RESET goes back to the login value: tenant 7.
        ("RESET pgtenant.tenant_id".into(), None),
        (format!("SELECT secret FROM {t}"), None),
        ("SET LOCAL pgtenant.tenant_id = 8".into(), refused),
        ("SELECT set_config('pgtenant.tenant_id', '8', false)".into(), refused),
        ("SELECT set_config('pgtenant.' || 'tenant_id', '8', false)".into(), refused),
        (
            format!(
                "DO $$ BEGIN PERFORM set_config('pgtenant.tenant_id', '8', false); END $$; SELECT secret FROM {t}"
            ),
            None,
        ),
        (
            format!(
                "BEGIN; DO $$ BEGIN PERFORM set_config('pgtenant.tenant_id', '8', true); END $$; \
                 SELECT secret FROM {t}; COMMIT"
            ),
            None,
        ),
        (
            "CREATE OR REPLACE PROCEDURE adv_proc() LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM set_config('pgtenant.tenant_id', '8', false); END $$"
                .into(),
            None,
        ),
        (format!("CALL adv_proc(); SELECT secret FROM {t}"), None),
        (
            "CREATE OR REPLACE FUNCTION adv_fn() RETURNS text LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM set_config('pgtenant.tenant_id', '8', false); RETURN 'x'; END $$"
                .into(),
            None,
        ),
        (format!("SELECT adv_fn(), secret FROM {t}"), None),
        (format!("SELECT adv_fn(); SELECT secret FROM {t}"), None),
        // SQL PREPARE, cursors, COPY, temporary views.
        (format!("PREPARE adv_p AS SELECT secret FROM {t} WHERE tenant_id = $1"), None),
        ("EXECUTE adv_p(8)".into(), None),
        (format!("BEGIN; DECLARE adv_c CURSOR FOR SELECT secret FROM {t} WHERE tenant_id = 8"), refused),
        ("ROLLBACK".into(), None),
        (
            format!("BEGIN; DECLARE adv_c CURSOR FOR SELECT secret FROM {t}; FETCH ALL FROM adv_c; COMMIT"),
            None,
        ),
        (format!("CREATE TEMP VIEW adv_v AS SELECT secret FROM {t}"), None),
        ("SELECT * FROM adv_v".into(), None),
        // Writing into another tenant.
        (format!("INSERT INTO {t} VALUES (8, 'planted')"), refused),
        (format!("UPDATE {t} SET secret = 'x' WHERE tenant_id = 8"), refused),
        (format!("UPDATE {t} SET tenant_id = 8 WHERE tenant_id = 7"), refused),
    ];
    for (sql, must_refuse) in &attempts {
        let outcome = simple(&seven, sql).await;
        assert_walled(sql, &outcome, *must_refuse);
    }
    // COPY out: the rows it writes are the rows it may read.
    let out = proxy.psql(Some(7), &["-At", "-c", &format!("COPY {t} TO STDOUT")], "");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("secret-8"), "COPY TO");
    let out = proxy.psql(
        Some(7),
        &["-At", "-c", &format!("COPY (SELECT * FROM {t} WHERE tenant_id = 8) TO STDOUT")],
        "",
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("secret-8"), "COPY (query) TO");

    // Parameters, text and binary, and prepared statements executed with new values.
    let sql = format!("SELECT secret FROM {t} WHERE tenant_id = $1");
    assert_walled("int8 parameter 8", &rows_of(seven.query(&sql, &[&8i64]).await), refused);
    // A text value cast twice: pgtenant does not read it; row-level security confines it.
    let text_sql = format!("SELECT secret FROM {t} WHERE tenant_id = $1::text::bigint");
    assert_walled("text parameter '8'", &rows_of(seven.query(&text_sql, &[&"8"]).await), None);
    let statement = seven.prepare(&sql).await.unwrap();
    assert_eq!(rows_of(seven.query(&statement, &[&7i64]).await).rows(), ["secret-7"]);
    assert_walled("prepared, then 8", &rows_of(seven.query(&statement, &[&8i64]).await), refused);
    let insert = format!("INSERT INTO {t} VALUES ($1, 'planted')");
    match seven.execute(&insert, &[&8i64]).await {
        Ok(n) => panic!("inserted {n} rows for tenant 8"),
        Err(e) => assert_eq!(crate::harness::sqlstate(&e), "42501"),
    }

    // Pipelined lanes under load: clients of tenants 7 and 8 on few connections, each
    // reading its own table rows only.
    let mut tasks = Vec::new();
    for n in 0..8i64 {
        let tenant = if n % 2 == 0 { 7 } else { 8 };
        let client = Arc::new(proxy.connect(Some(tenant)).await);
        let sql = format!("SELECT secret FROM {t}");
        tasks.push(tokio::spawn(async move {
            for _ in 0..50 {
                let rows = rows_of(client.query(&sql, &[]).await).rows();
                assert_eq!(rows, [format!("secret-{tenant}")], "a client of tenant {tenant}");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    // After all that, tenant 7 still reads its row, and tenant 8's row is unchanged.
    assert_eq!(rows_of(seven.query(&format!("SELECT secret FROM {t}"), &[]).await).rows(), ["secret-7"]);
    let admin = shard_admin(1, "app").await;
    let rows = admin.query(&format!("SELECT secret FROM {t} WHERE tenant_id = 8"), &[]).await.unwrap();
    assert_eq!(rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>(), ["secret-8"]);
}

impl Outcome {
    fn rows(self) -> Vec<String> {
        match self {
            Outcome::Rows(rows) => rows,
            Outcome::Refused(code) => panic!("refused with {code}"),
        }
    }
}

const SECRET: &str = "secret-of-tenant-8";

/// The single value of a one-row, one-column answer to a simple query, or the SQLSTATE.
async fn simple_value(client: &tokio_postgres::Client, sql: &str) -> Result<Option<String>, String> {
    match client.simple_query(sql).await {
        Ok(messages) => Ok(messages
            .iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some(r.get(0).map(str::to_string)),
                _ => None,
            })
            .flatten()),
        Err(e) => Err(sqlstate(&e)),
    }
}

/// Tenant 8's sleeping statement, as the shard sees it: its server pid.
async fn running_secret(admin: &tokio_postgres::Client) -> Option<i32> {
    let sql = format!(
        "SELECT pid FROM pg_stat_activity WHERE query LIKE '%{SECRET}%' AND state = 'active' AND pid <> pg_backend_pid()"
    );
    admin.query_opt(&sql, &[]).await.unwrap().map(|r| r.get(0))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_neither_reads_nor_signals_another_tenants_sessions() {
    for mode in [PoolMode::Transaction, PoolMode::Session] {
        let proxy = start_proxy(move |c| c.proxy.pool_mode = mode).await;
        let admin = shard_admin(1, "app").await;
        let eight = proxy.connect(Some(8)).await;
        let eights_pid: i32 = eight.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
        let sleeper = tokio::spawn(async move {
            let outcome = eight.simple_query(&format!("SELECT pg_sleep(30), '{SECRET}'")).await.map(|_| ());
            (outcome.map_err(|e| sqlstate(&e)), eight)
        });
        harness::eventually(Duration::from_secs(10), || async { running_secret(&admin).await.is_some() })
            .await
            .expect("tenant 8's statement runs");
        let server_pid = running_secret(&admin).await.expect("tenant 8's statement runs");

        let seven = proxy.connect(Some(7)).await;
        let refused = Err("42501".to_string());
        for sql in [
            "SELECT pid, query FROM pg_stat_activity".to_string(),
            format!("SELECT query FROM pg_catalog.pg_stat_activity WHERE query LIKE '%{SECRET}%'"),
            "SELECT query FROM \"pg_stat_activity\"".into(),
            "SELECT query FROM pg_stat_get_activity(NULL)".into(),
            "SELECT string_agg(pg_stat_get_backend_activity(s)::text, ',') FROM pg_stat_get_backend_idset() s".into(),
            "SELECT count(*) FROM pg_locks".into(),
            "SELECT count(*) FROM pg_stat_progress_vacuum".into(),
            "SELECT pg_blocking_pids(1)".into(),
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity".into(),
            format!("SELECT pg_cancel_backend({server_pid}), 1"),
            format!("SELECT 1; SELECT pg_terminate_backend({server_pid})"),
            "SELECT * FROM U&\"pg\\005fstat_activity\"".into(),
            // What pgtenant cannot read, the shard refuses (sql/session_privacy.sql).
            "DO $$ DECLARE q text; BEGIN \
             SELECT string_agg(query, ',') INTO q FROM pg_catalog.pg_stat_get_activity(NULL); \
             RAISE EXCEPTION 'read: %', q; END $$"
                .into(),
            format!("DO $$ BEGIN EXECUTE 'SELECT pg_' || 'terminate_backend({server_pid})'; END $$"),
        ] {
            assert_eq!(simple_value(&seven, &sql).await, refused, "{mode:?} simple: {sql}");
            if !sql.contains(';') || sql.starts_with("DO") {
                let extended = seven.query(&sql, &[]).await.map(|_| ()).map_err(|e| sqlstate(&e));
                assert_eq!(extended, Err("42501".to_string()), "{mode:?} extended: {sql}");
            }
        }
        // Another tenant's pid, the server's or the one pgtenant gave it: as for a pid
        // that is no backend at all (false, with PostgreSQL's warning).
        for pid in [server_pid, eights_pid] {
            for function in ["pg_terminate_backend", "pg_cancel_backend"] {
                let sql = format!("SELECT {function}({pid})");
                assert_eq!(simple_value(&seven, &sql).await, Ok(Some("f".into())), "{mode:?}: {sql}");
                let row = seven.query_one(&format!("SELECT {function}($1)"), &[&pid]).await.unwrap();
                assert!(!row.get::<_, bool>(0), "{mode:?}: {function}($1) of {pid}");
            }
        }
        assert_eq!(running_secret(&admin).await, Some(server_pid), "{mode:?}: tenant 8's statement runs on");

        // A sibling of the same tenant may cancel it, as a role may its own sessions.
        let sibling = proxy.connect(Some(8)).await;
        let canceled: bool =
            sibling.query_one("SELECT pg_cancel_backend($1)", &[&eights_pid]).await.unwrap().get(0);
        assert!(canceled, "{mode:?}");
        let (outcome, eight) = tokio::time::timeout(Duration::from_secs(10), sleeper).await.unwrap().unwrap();
        assert_eq!(outcome, Err("57014".to_string()), "{mode:?}: the sibling's cancel reached the statement");
        assert_eq!(
            simple_value(&eight, "SELECT 8").await,
            Ok(Some("8".into())),
            "{mode:?}: the session goes on"
        );
        let ended: bool =
            sibling.query_one("SELECT pg_terminate_backend($1)", &[&eights_pid]).await.unwrap().get(0);
        assert!(ended, "{mode:?}");
        let err = eight.simple_query("SELECT 1").await.expect_err("terminated");
        assert!(eight.is_closed() || sqlstate(&err) == "57P01", "{mode:?}: {err}");
        proxy.shutdown().await;
    }
}

/// A DBA's or a monitor's login (`see_other_sessions = true`, a server role of its own)
/// reads and signals the server's sessions as PostgreSQL lets its role; the login that
/// tenants share is still refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_login_that_may_see_other_sessions_reads_them() {
    let proxy = start_proxy(|c| {
        let mut dba = c.users[0].clone();
        dba.name = "dba".into();
        dba.server_user = Some("postgres".into());
        dba.see_other_sessions = true;
        c.users.push(dba);
    })
    .await;
    let port = proxy.addr.port();
    let dba = harness::connect(&format!("host=127.0.0.1 port={port} user=dba password=app dbname=app"))
        .await
        .unwrap();
    let tenant = proxy.connect(Some(7)).await;
    for sql in [
        "SELECT count(*) FROM pg_stat_activity WHERE usename = 'app'",
        "SELECT count(*) FROM pg_locks",
        "SELECT count(*) FROM pg_catalog.\"pg_stat_activity\"",
    ] {
        let simple = simple_value(&dba, sql).await;
        assert!(matches!(&simple, Ok(Some(n)) if n.parse::<i64>().is_ok()), "simple: {sql}: {simple:?}");
        let extended = dba.query_one(sql, &[]).await.map(|r| r.get::<_, i64>(0)).map_err(|e| sqlstate(&e));
        assert!(extended.is_ok(), "extended: {sql}: {extended:?}");
        assert_eq!(simple_value(&tenant, sql).await, Err("42501".into()), "the shared login: {sql}");
    }
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pid_pgtenant_gives_a_client_is_its_own_backends() {
    for mode in [PoolMode::Transaction, PoolMode::Session] {
        let proxy = start_proxy(move |c| c.proxy.pool_mode = mode).await;
        let mut raw =
            harness::raw::RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")]).await;
        let (given, _) = raw.key.expect("BackendKeyData");
        assert!(given > 1 << 22, "{mode:?}: {given} could be a server's pid");
        let answered = harness::raw::first_column(&raw.query("SELECT pg_backend_pid()").await);
        assert_eq!(answered, [given.to_string()], "{mode:?}");

        // Cancelling itself cancels the very statement, and its transaction block.
        let client = proxy.connect(Some(7)).await;
        let own: i32 = client.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
        let err = client.query_one("SELECT pg_cancel_backend(pg_backend_pid())", &[]).await.unwrap_err();
        assert_eq!(sqlstate(&err), "57014", "{mode:?}");
        client.batch_execute("BEGIN").await.unwrap();
        client.batch_execute("CREATE TEMP TABLE IF NOT EXISTS own_cancel (a int)").await.unwrap();
        let err = client.simple_query(&format!("SELECT pg_cancel_backend({own})")).await.unwrap_err();
        assert_eq!(sqlstate(&err), "57014", "{mode:?}");
        let err = client.simple_query("SELECT 1").await.unwrap_err();
        assert_eq!(sqlstate(&err), "25P02", "{mode:?}: the transaction is aborted");
        client.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(simple_value(&client, "SELECT 2").await, Ok(Some("2".into())), "{mode:?}");

        // Terminating itself ends the session as PostgreSQL does: FATAL 57P01, closed.
        for sql in
            ["SELECT pg_terminate_backend(pg_backend_pid())", "SELECT pg_catalog.pg_terminate_backend($1)"]
        {
            let client = proxy.connect(Some(7)).await;
            let own: i32 = client.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
            let err = if sql.contains("$1") {
                client.query(sql, &[&own]).await.unwrap_err()
            } else {
                client.simple_query(sql).await.unwrap_err()
            };
            assert_eq!(sqlstate(&err), "57P01", "{mode:?}: {sql}");
            harness::eventually(Duration::from_secs(5), || async { client.is_closed() })
                .await
                .unwrap_or_else(|| panic!("{mode:?}: {sql} left the connection open"));
        }
        proxy.shutdown().await;
    }
}
