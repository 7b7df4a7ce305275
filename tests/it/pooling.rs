//! Which server connection a transaction gets: tenant-aware checkouts.

use crate::harness::{self, start_proxy};

/// The server process and the value of `setting` in it, as the server itself reports them.
async fn backend_with(client: &tokio_postgres::Client, setting: &str) -> (i32, String) {
    let row = client
        .query_one("SELECT pg_backend_pid(), current_setting($1)", &[&setting])
        .await
        .expect("query through the proxy");
    (row.get(0), row.get(1))
}

/// The server process and the tenant GUC it holds.
async fn backend_of(client: &tokio_postgres::Client) -> (i32, String) {
    backend_with(client, "pgtenant.tenant_id").await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_gets_back_the_connection_that_holds_its_guc() {
    let proxy = start_proxy(|c| {
        c.users[0].pool_size = 2;
        c.proxy.workers = 2;
        c.proxy.thread_per_core = true;
    })
    .await;
    // Tenants 1, 2 and 3 all live on shard 1: one pool of two connections. Clients
    // take the two client threads in turn: 1 and 3 are served on one, 2 on the other.
    let one = proxy.connect(Some(1)).await;
    let two = proxy.connect(Some(2)).await;
    let three = proxy.connect(Some(3)).await;

    // Tenant 1 holds a connection in a transaction while tenant 2 needs one: two open.
    one.batch_execute("BEGIN").await.unwrap();
    let (first, guc) = backend_of(&one).await;
    assert_eq!(guc, "1");
    let (second, guc) = backend_of(&two).await;
    assert_eq!(guc, "2");
    assert_ne!(second, first);
    one.batch_execute("COMMIT").await.unwrap();

    // Tenant 1's connection came back last: newest-first would hand it to tenant 2.
    assert_eq!(backend_of(&two).await, (second, "2".to_string()));
    assert_eq!(backend_of(&one).await, (first, "1".to_string()));

    // No idle connection holds tenant 3: it takes the newest and switches it.
    assert_eq!(backend_of(&three).await, (first, "3".to_string()));
    assert_eq!(backend_of(&two).await, (second, "2".to_string()), "tenant 2 keeps its connection");
    // And tenant 1, whose tenant no idle connection holds now, gets the one of its own
    // thread (tenant 3's), switched back to it, before the newest (tenant 2's, which
    // another thread used last).
    assert_eq!(backend_of(&one).await, (first, "1".to_string()));
}

#[tokio::test(flavor = "multi_thread")]
async fn clients_with_other_settings_keep_to_their_own_connections() {
    let proxy = start_proxy(|c| c.users[0].pool_size = 2).await;
    let billing = connect_as(&proxy, "billing", 1).await;
    let reports = connect_as(&proxy, "reports", 1).await;

    let name = "application_name";
    billing.batch_execute("BEGIN").await.unwrap();
    let (billing_pid, seen) = backend_with(&billing, name).await;
    assert_eq!(seen, "billing");
    let (reports_pid, seen) = backend_with(&reports, name).await;
    assert_eq!(seen, "reports");
    billing.batch_execute("COMMIT").await.unwrap();

    // Both connections hold tenant 1; the newest is billing's, but reports' has its name.
    assert_eq!(backend_with(&reports, name).await, (reports_pid, "reports".to_string()));
    assert_eq!(backend_with(&billing, name).await, (billing_pid, "billing".to_string()));
    assert_eq!(backend_with(&reports, name).await, (reports_pid, "reports".to_string()));

    // Billing's connection passes to tenant 2 (and comes back newest). A reports client
    // of tenant 2 then gets reports' connection: the settings weigh more than the tenant
    // (their SETs would be a query of their own).
    let billing_of_two = connect_as(&proxy, "billing", 2).await;
    assert_eq!(backend_of(&billing_of_two).await, (billing_pid, "2".to_string()));
    let reports_of_two = connect_as(&proxy, "reports", 2).await;
    assert_eq!(backend_of(&reports_of_two).await, (reports_pid, "2".to_string()));
}

async fn connect_as(proxy: &harness::Proxy, application_name: &str, tenant: i64) -> tokio_postgres::Client {
    let conninfo = proxy
        .conninfo(&format!("application_name={application_name} options='-c pgtenant.tenant_id={tenant}'"));
    harness::connect(&conninfo).await.expect("connect through the proxy")
}

/// A proxy whose pools of `pool_size` close a server connection idle for `idle_ms` or
/// older than `lifetime_ms` (0: never).
async fn proxy_with_expiry(pool_size: usize, idle_ms: u64, lifetime_ms: u64) -> harness::Proxy {
    start_proxy(|c| {
        c.users[0].pool_size = pool_size;
        c.proxy.server_idle_timeout_ms = idle_ms;
        c.proxy.server_lifetime_ms = lifetime_ms;
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_idle_too_long_are_closed() {
    let proxy = proxy_with_expiry(2, 300, 0).await;
    let client = proxy.connect(Some(7)).await;
    let (first, _) = backend_of(&client).await;
    assert_eq!(backend_of(&client).await.0, first, "reused while fresh");
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    assert!(
        harness::backend_ends(first, std::time::Duration::from_secs(2)).await,
        "closed after sitting idle"
    );
    assert_ne!(backend_of(&client).await.0, first);
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_past_their_lifetime_are_replaced() {
    let proxy = proxy_with_expiry(1, 0, 500).await;
    let client = proxy.connect(Some(7)).await;
    let started = std::time::Instant::now();
    let (first, _) = backend_of(&client).await;
    // Busy all along (never idle for long): replaced as it comes back past its lifetime.
    let mut pid = first;
    while pid == first && started.elapsed() < std::time::Duration::from_secs(5) {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        pid = backend_of(&client).await.0;
    }
    assert_ne!(pid, first, "still the first server process after {:?}", started.elapsed());
    assert!(started.elapsed() >= std::time::Duration::from_millis(500));
    assert!(harness::backend_ends(first, std::time::Duration::from_secs(2)).await);
}

/// A BEGIN sent through the extended protocol (pgbench -M extended, pgJDBC) is answered
/// at once and goes to the server with the transaction's first statement, in the same
/// write, as a simple query's BEGIN does: until then it holds no connection. What the
/// transaction then does is what it would do on the server: its writes roll back with
/// it, an error aborts it.
#[tokio::test(flavor = "multi_thread")]
async fn an_extended_begin_holds_no_connection_until_its_first_statement() {
    use crate::harness::raw::{Msg, RawClient, first_column, unnamed_request};
    use postgres_protocol::message::frontend;
    let proxy = start_proxy(|c| c.users[0].pool_size = 1).await;
    let other = proxy.connect(Some(7)).await;
    other
        .batch_execute(
            "DROP TABLE IF EXISTS deferred_begin; CREATE TABLE deferred_begin (tenant_id bigint, n int)",
        )
        .await
        .unwrap();
    let mut c = RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")]).await;
    let extended = |sql: &str, describe: Option<u8>| unnamed_request(sql, describe, frontend::sync);
    let tags = |msgs: &[Msg]| String::from_utf8(msgs.iter().map(|m| m.tag).collect()).unwrap();
    let status = |msgs: &[Msg]| msgs.last().map(|m| m.body.clone()).unwrap();

    let begun = c.request(&extended("BEGIN", Some(b'P'))).await;
    assert_eq!((tags(&begun), status(&begun)), ("12nCZ".into(), b"T".to_vec()));
    // The pool's only connection is free: another client's statement runs meanwhile.
    let meanwhile = tokio::time::timeout(std::time::Duration::from_secs(3), other.batch_execute("SELECT 1"));
    meanwhile.await.expect("the connection is not held by a BEGIN alone").unwrap();
    let inserted = c.request(&extended("INSERT INTO deferred_begin VALUES (7, 1)", None)).await;
    assert_eq!((tags(&inserted), status(&inserted)), ("12CZ".into(), b"T".to_vec()), "{inserted:?}");
    assert_eq!(tags(&c.query("ROLLBACK").await), "CZ");
    assert_eq!(first_column(&c.query("SELECT count(*) FROM deferred_begin").await), ["0"], "rolled back");

    // Described as a statement: no parameters, no rows. An error aborts the
    // transaction, on the server or before it reaches one (a tenant SET refused).
    let begun = c.request(&extended("BEGIN", Some(b'S'))).await;
    assert_eq!(tags(&begun), "12tnCZ");
    let failed = c.request(&extended("SELECT 1/0", None)).await;
    assert_eq!((tags(&failed), status(&failed)), ("1E".to_string() + "Z", b"E".to_vec()), "{failed:?}");
    assert_eq!(tags(&c.query("ROLLBACK").await), "CZ");
    c.request(&extended("BEGIN", None)).await;
    let refused = c.request(&extended("SET pgtenant.tenant_id = 8", None)).await;
    assert_eq!(status(&refused), b"E", "{refused:?}");
    assert_eq!(tags(&c.query("ROLLBACK").await), "CZ");
    let idle = c.query("SELECT 2").await;
    assert_eq!((first_column(&idle), status(&idle)), (vec!["2".to_string()], b"I".to_vec()));
}
