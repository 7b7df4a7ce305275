//! Strict isolation (issue 22): with `proxy.isolation = "strict"`, a session with a
//! tenant may touch a table that holds tenants without forced row-level security only
//! in statements confined to its tenant; tables under forced RLS, and tables without
//! the tenant column, are not restricted.

use std::time::Duration;

use pgtenant::config::IsolationMode;

use crate::harness::{eventually, shard_admin, sqlstate, start_proxy};

async fn setup() -> tokio_postgres::Client {
    let admin = shard_admin(1, "app").await;
    admin
        .batch_execute(
            "DROP TABLE IF EXISTS strict_open, strict_walled, strict_plain, strict_later;
             CREATE TABLE strict_open (tenant_id bigint, secret text);
             CREATE TABLE strict_walled (tenant_id bigint, secret text);
             CREATE TABLE strict_later (tenant_id bigint, secret text);
             CREATE TABLE strict_plain (x int);
             INSERT INTO strict_open VALUES (7, 'secret-7'), (8, 'secret-8');
             INSERT INTO strict_walled VALUES (7, 'secret-7'), (8, 'secret-8');
             INSERT INTO strict_later VALUES (7, 'secret-7'), (8, 'secret-8');
             INSERT INTO strict_plain VALUES (1);
             GRANT SELECT, INSERT ON strict_open, strict_walled, strict_later, strict_plain TO app;
             CALL pgtenant.enable_tenant_isolation('strict_walled');",
        )
        .await
        .unwrap();
    admin
}

fn values(rows: &[tokio_postgres::Row]) -> Vec<String> {
    rows.iter().map(|r| r.get::<_, String>(0)).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn strict_isolation_refuses_what_it_cannot_prove_confined() {
    let admin = setup().await;
    let proxy = start_proxy(|c| c.proxy.isolation = IsolationMode::Strict).await;
    let seven = proxy.connect(Some(7)).await;

    // Confined: one table, its tenant column = the session's tenant at the top level.
    for sql in [
        "SELECT secret FROM strict_open WHERE tenant_id = 7",
        "SELECT secret FROM strict_open WHERE secret <> '' AND (tenant_id = 7)",
    ] {
        assert_eq!(values(&seven.query(sql, &[]).await.unwrap()), ["secret-7"], "{sql}");
    }
    let by_parameter = "SELECT secret FROM strict_open WHERE tenant_id = $1";
    assert_eq!(values(&seven.query(by_parameter, &[&7i64]).await.unwrap()), ["secret-7"]);
    let simple = seven.simple_query("SELECT secret FROM strict_open WHERE tenant_id = 7").await.unwrap();
    assert!(simple.iter().any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_))));
    seven
        .execute("INSERT INTO strict_open (tenant_id, secret) VALUES (7, 'more'), ($1, 'too')", &[&7i64])
        .await
        .unwrap();
    // Forced row-level security, or no tenant column: nothing to prove.
    assert_eq!(values(&seven.query("SELECT secret FROM strict_walled", &[]).await.unwrap()), ["secret-7"]);
    let plain: i32 = seven.query_one("SELECT x FROM strict_plain", &[]).await.unwrap().get(0);
    assert_eq!(plain, 1);

    // Not provably confined: refused, naming the table, the session goes on.
    for sql in [
        "SELECT secret FROM strict_open",
        "SELECT secret FROM strict_open WHERE tenant_id > 6",
        "SELECT secret FROM strict_open WHERE tenant_id = 7 OR true",
        "SELECT o.secret FROM strict_open o JOIN strict_plain p ON true WHERE o.tenant_id = 7",
        "SELECT secret FROM strict_walled WHERE tenant_id IN (SELECT tenant_id FROM strict_open)",
        "INSERT INTO strict_open (secret) VALUES ('no tenant')",
        // Without a column list, which value is the tenant's is the table's business.
        "INSERT INTO strict_open VALUES (7, 'x')",
        // sqlparser cannot parse it: which tables it touches is unknown.
        "SELECT secret FROM strict_open WHERE tenant_id = 7 FOR NO KEY UPDATE",
    ] {
        let err = seven.query(sql, &[]).await.expect_err(sql);
        assert_eq!(sqlstate(&err), "42501", "{sql}: {err:?}");
        assert!(format!("{err:?}").contains("strict isolation"), "{sql}: {err:?}");
        let err = seven.simple_query(sql).await.expect_err(sql);
        assert_eq!(sqlstate(&err), "42501", "{sql}, simple protocol: {err:?}");
    }
    let err = seven.query(by_parameter, &[&8i64]).await.expect_err("another tenant's value");
    assert_eq!(sqlstate(&err), "42501");

    // Inside a transaction too.
    let mut seven = seven;
    let tx = seven.transaction().await.unwrap();
    assert_eq!(values(&tx.query(by_parameter, &[&7i64]).await.unwrap()), ["secret-7", "more", "too"]);
    let err = tx.query("SELECT secret FROM strict_open", &[]).await.expect_err("in a transaction");
    assert_eq!(sqlstate(&err), "42501");
    drop(tx);

    // A table whose policy is forced later is followed once the cached list expires.
    let read_later = "SELECT secret FROM strict_later";
    assert_eq!(sqlstate(&seven.query(read_later, &[]).await.unwrap_err()), "42501");
    admin.batch_execute("CALL pgtenant.enable_tenant_isolation('strict_later')").await.unwrap();
    let seven = &seven;
    let followed = eventually(Duration::from_secs(20), || async move {
        seven.query(read_later, &[]).await.is_ok_and(|rows| values(&rows) == ["secret-7"])
    })
    .await;
    assert!(followed.is_some(), "strict isolation never saw the policy forced on strict_later");
}
