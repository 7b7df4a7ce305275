//! Memory bounded by bytes (issue 30): a client past its budget of prepared statements
//! gets 53200 and its session goes on (both pool modes); a statement far larger than
//! the parse cache's share is routed by its tenant and answered, in both protocols.

use pgtenant::config::PoolMode;

use crate::harness::{sqlstate, start_proxy};

async fn statement_budget_in(mode: PoolMode) {
    let proxy = start_proxy(|c| {
        c.proxy.pool_mode = mode;
        c.proxy.max_client_statement_bytes = 64 * 1024;
    })
    .await;
    let client = proxy.connect(Some(7)).await;
    // Each statement holds about 10 KB of text: the seventh does not fit in 64 KiB.
    let statement = |n: usize| format!("SELECT {n} AS n, '{}' AS pad", "x".repeat(10_000));
    let mut kept = Vec::new();
    let refused = loop {
        match client.prepare(&statement(kept.len())).await {
            Ok(s) => kept.push(s),
            Err(e) => break e,
        }
        assert!(kept.len() < 100, "the budget never applied");
    };
    assert_eq!(sqlstate(&refused), "53200", "{refused}");
    assert_eq!(kept.len(), 6, "six statements of ~10 KB fit in 64 KiB");
    // The session goes on, and its statements still run.
    let row = client.query_one(&kept[3], &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 3);
    let row = client.query_one("SELECT current_setting('pgtenant.tenant_id')", &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "7");
    // Closing statements makes room again (tokio-postgres closes a dropped one).
    kept.truncate(2);
    client.simple_query("SELECT 1").await.unwrap();
    let again = client.prepare(&statement(1000)).await.expect("room after closing");
    assert_eq!(client.query_one(&again, &[]).await.unwrap().get::<_, i32>(0), 1000);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn past_its_statement_budget_a_client_gets_53200_and_goes_on_in_transaction_mode() {
    statement_budget_in(PoolMode::Transaction).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn past_its_statement_budget_a_client_gets_53200_and_goes_on_in_session_mode() {
    statement_budget_in(PoolMode::Session).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_statement_larger_than_the_parse_cache_is_routed_by_its_tenant() {
    // A 64 KiB cache keeps shapes of at most 1 KiB; this one is 1 MB.
    let proxy = start_proxy(|c| c.proxy.parse_cache_bytes = 64 * 1024).await;
    let client = proxy.connect(None).await;
    let pad = "y".repeat(1 << 20);
    let sql = format!(
        "SELECT (SELECT shard_id FROM pgtenant_shard), count(*) FROM accounts WHERE tenant_id = 42 AND name <> '{pad}'"
    );
    for _ in 0..2 {
        // Tenant 42 lives on shard 2 and has three accounts.
        let rows = client.simple_query(&sql).await.unwrap();
        let row = rows
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => {
                    Some((r.get(0).unwrap().to_string(), r.get(1).unwrap().to_string()))
                }
                _ => None,
            })
            .expect("a row");
        assert_eq!(row, ("2".to_string(), "3".to_string()));
        let row = client.query_one(sql.as_str(), &[]).await.unwrap();
        assert_eq!((row.get::<_, i32>(0), row.get::<_, i64>(1)), (2, 3));
    }
    proxy.shutdown().await;
}
