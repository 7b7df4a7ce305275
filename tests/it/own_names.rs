//! Nothing of pgtenant's own in the client's way (issue 50): the statements pgtenant
//! prepares on a server neither collide with the client's SQL `PREPARE` nor can be
//! run or dropped by it, and the statement that sets the tenant GUC ahead of a
//! client's request changes no error PostgreSQL gives that request alone.

use pgtenant::config::PoolMode;

use crate::harness::{shard_admin, shard_of, sqlstate, start_pooled_proxy};

/// Server-side names of pgtenant's own (`__pgtenant_<n>`, the tenant statement) are
/// refused in SQL with 42939, in both protocols and pool modes, and the session goes
/// on; names pgtenant used before (`pgtenant_set_tenant`) are the client's to use.
#[tokio::test(flavor = "multi_thread")]
async fn a_clients_sql_reaches_no_statement_pgtenant_prepared() {
    for mode in [PoolMode::Transaction, PoolMode::Session] {
        // Two server connections, which both clients share in transaction pooling.
        let proxy = start_pooled_proxy(mode, 2).await;
        let other = proxy.connect(Some(8)).await;
        let row = other.query_one("SELECT $1::int + 8000", &[&1i32]).await.unwrap();
        assert_eq!(row.get::<_, i32>(0), 8001);
        let client = proxy.connect(Some(7)).await;
        client.query_one("SELECT $1::int + 7000", &[&1i32]).await.unwrap();
        for sql in [
            "EXECUTE __pgtenant_1",
            "EXECUTE __pgtenant_set_tenant('pgtenant.tenant_id', '8', 'x', 'y')",
            "DEALLOCATE __pgtenant_1",
            "DEALLOCATE PREPARE \"__pgtenant_2\"",
            "PREPARE __pgtenant_3 AS SELECT 1",
        ] {
            let simple = client.batch_execute(sql).await.expect_err(sql);
            assert_eq!(sqlstate(&simple), "42939", "{mode:?}, {sql}: {simple}");
            let message = simple.as_db_error().map(|e| e.message().to_string()).unwrap_or_default();
            assert!(message.contains("reserved"), "{message}");
            let extended = client.query(sql, &[]).await.expect_err(sql);
            assert_eq!(sqlstate(&extended), "42939", "{mode:?}, extended {sql}: {extended}");
        }
        // The session goes on, and so do the statements of the other client.
        assert_eq!(client.query_one("SELECT 7", &[]).await.unwrap().get::<_, i32>(0), 7);
        let row = other.query_one("SELECT $1::int + 8000", &[&2i32]).await.unwrap();
        assert_eq!(row.get::<_, i32>(0), 8002, "{mode:?}");
        // The name pgtenant's tenant statement had is the client's own now.
        client.batch_execute("BEGIN; PREPARE pgtenant_set_tenant AS SELECT 42").await.unwrap();
        let rows = client.simple_query("EXECUTE pgtenant_set_tenant").await.unwrap();
        let value = rows.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        });
        assert_eq!(value.as_deref(), Some("42"), "{mode:?}");
        client.batch_execute("DEALLOCATE pgtenant_set_tenant; COMMIT").await.unwrap();
        proxy.shutdown().await;
    }
}

/// A function that runs VACUUM gets PostgreSQL's own error for it ("cannot be executed
/// from a function", 25001) on a connection that pgtenant switches to the caller's
/// tenant, not one about a pipeline pgtenant made.
#[tokio::test(flavor = "multi_thread")]
async fn a_function_that_vacuums_gets_postgresqls_own_error() {
    let admin = shard_admin(1, "app").await;
    admin
        .batch_execute(
            "CREATE OR REPLACE FUNCTION own_names_vacuum() RETURNS void LANGUAGE plpgsql AS
               $$ BEGIN VACUUM; END $$;
             GRANT EXECUTE ON FUNCTION own_names_vacuum() TO app;",
        )
        .await
        .unwrap();
    for mode in [PoolMode::Transaction, PoolMode::Session] {
        let proxy = start_pooled_proxy(mode, 1).await;
        for extended in [false, true] {
            // The one server connection holds tenant 8 now (and is free again when its
            // client leaves, in session pooling): tenant 7's call switches it.
            let eight = proxy.connect(Some(8)).await;
            assert_eq!(shard_of(&eight).await, 1, "tenant 8 lives on shard 1");
            drop(eight);
            let seven = proxy.connect(Some(7)).await;
            let sql = "SELECT own_names_vacuum()";
            let err = match extended {
                true => seven.query(sql, &[]).await.expect_err(sql),
                false => seven.batch_execute(sql).await.expect_err(sql),
            };
            assert_eq!(sqlstate(&err), "25001", "{mode:?}, extended: {extended}: {err}");
            let message = err.as_db_error().map(|e| e.message().to_string()).unwrap_or_default();
            assert!(message.contains("from a function"), "{mode:?}, extended: {extended}: {message}");
            assert_eq!(shard_of(&seven).await, 1, "tenant 7 lives on shard 1");
        }
        proxy.shutdown().await;
    }
}
