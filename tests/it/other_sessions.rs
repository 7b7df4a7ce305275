//! Tenants share the server role, and PostgreSQL shows a role every session of its
//! own and lets it signal them (issue 57, item 1). Through pgtenant a tenant's session
//! reads no other session's statement through any server-wide view, signals no other
//! tenant's backend, and the pid it was given behaves as its own backend's does on
//! PostgreSQL: `pg_backend_pid()` returns it, and cancelling or terminating it ends
//! the caller's statement or session. Both pool modes, both protocols.

use std::time::Duration;

use pgtenant::config::PoolMode;
use tokio_postgres::SimpleQueryMessage;

use crate::harness::{self, shard_admin, sqlstate, start_proxy};

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
