//! Logins as real deployments have them (issue 54, its timeouts and limits): an idle
//! client is closed after `client_idle_timeout_ms` as PostgreSQL closes an idle session,
//! one that keeps asking (even what pgtenant answers itself) is not; a login's clients
//! are capped by `max_user_client_connections` or its own `max_client_connections`.

use std::time::{Duration, Instant};

use crate::harness::{eventually, sqlstate, start_proxy};

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_client_is_closed_as_postgres_closes_an_idle_session() {
    let proxy = start_proxy(|c| c.proxy.client_idle_timeout_ms = 300).await;
    // Busy with requests pgtenant answers itself (SET of the tenant), past the timeout.
    let busy = proxy.connect(None).await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(900) {
        busy.batch_execute("SET pgtenant.tenant_id = 7").await.expect("an active client stays");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Idle inside a transaction is idle_transaction_timeout_ms's (off here), not this.
    busy.batch_execute("BEGIN; SELECT 1").await.unwrap();
    let (idle, connection) =
        tokio_postgres::connect(&proxy.conninfo("options='-c pgtenant.tenant_id=7'"), tokio_postgres::NoTls)
            .await
            .unwrap();
    let ended = tokio::spawn(connection);
    idle.simple_query("SELECT 1").await.unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(10), ended).await.expect("closed by the proxy");
    let err = closed.unwrap().expect_err("a FATAL ends it");
    assert_eq!(sqlstate(&err), "57P05", "{err:?}");
    assert!(err.as_db_error().unwrap().message().contains("idle-session timeout"), "{err:?}");
    assert_eq!(busy.query_one("SELECT 1", &[]).await.unwrap().get::<_, i32>(0), 1, "in a transaction: kept");
    busy.batch_execute("COMMIT").await.unwrap();
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_login_s_clients_are_capped() {
    let proxy = start_proxy(|c| {
        c.proxy.max_user_client_connections = 2;
        let admin = c.users.iter_mut().find(|u| u.name == pgtenant::dev::demo::ADMIN_USER).unwrap();
        admin.max_client_connections = Some(0);
    })
    .await;
    let first = proxy.connect(Some(7)).await;
    let second = proxy.connect(Some(7)).await;
    let err = proxy.try_connect(Some(7)).await.unwrap_err();
    assert_eq!(sqlstate(&err), "53300", "{err:?}");
    assert!(err.as_db_error().unwrap().message().contains("max_user_client_connections"), "{err:?}");
    // A login of its own (0: no limit of its own) is not counted against app's.
    let admin = crate::harness::connect(&proxy.admin_conninfo()).await.unwrap();
    admin.simple_query("SHOW VERSION").await.unwrap();
    // Once one leaves, the next is let in.
    drop(first);
    let third =
        eventually(Duration::from_secs(5), || async { proxy.try_connect(Some(7)).await.is_ok() }).await;
    assert!(third.is_some(), "room again once a client left");
    second.simple_query("SELECT 1").await.unwrap();
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_keeps_min_pool_size_connections_open() {
    let proxy = start_proxy(|c| c.proxy.min_pool_size = 3).await;
    let client = proxy.connect(Some(7)).await;
    client.simple_query("SELECT 1").await.unwrap();
    let console = crate::harness::connect(&proxy.admin_conninfo()).await.unwrap();
    let servers_of_app = || async {
        let rows = console.simple_query("SHOW SERVERS").await.unwrap();
        rows.iter()
            .filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(r) if r.get("user") == Some("app") && r.get("shard") == Some("1")))
            .count()
    };
    let warm = eventually(Duration::from_secs(10), || async { servers_of_app().await == 3 }).await;
    assert!(warm.is_some(), "the pool opened up to min_pool_size: {}", servers_of_app().await);
    // Closed by RECONNECT, they are opened again.
    console.simple_query("RECONNECT").await.unwrap();
    let again = eventually(Duration::from_secs(10), || async { servers_of_app().await == 3 }).await;
    assert!(again.is_some(), "opened again after a RECONNECT");
    proxy.shutdown().await;
}
