//! Logins as real deployments have them (issue 54, its timeouts and limits): an idle
//! client is closed after `client_idle_timeout_ms` as PostgreSQL closes an idle session,
//! one that keeps asking (even what pgtenant answers itself) is not; a login's clients
//! are capped by `max_user_client_connections` or its own `max_client_connections`; a
//! transaction longer than `transaction_timeout_ms` ends its session with PostgreSQL
//! 17's FATAL 25P04 and is rolled back, a request unanswered past `query_timeout_ms` is
//! canceled on the server and ends its session (57014), as PgBouncer's.

use std::time::{Duration, Instant};

use crate::harness::raw::RawClient;
use crate::harness::{eventually, shard_admin, sqlstate, start_proxy};

/// Sends `sql` on a raw session of tenant 7 (waiting for its answer when
/// `answered`), then reads what the proxy sends up to the connection's end: the
/// SQLSTATE of the last ErrorResponse, if any.
async fn error_before_the_end(proxy: &crate::harness::Proxy, sql: &str, answered: bool) -> Option<String> {
    let mut raw = RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")]).await;
    let mut out = bytes::BytesMut::new();
    postgres_protocol::message::frontend::query(sql, &mut out).unwrap();
    raw.send(&out).await;
    if answered {
        let answer = raw.until_ready().await;
        assert_eq!(crate::harness::raw::sqlstate(&answer), None, "{sql}: {answer:?}");
    }
    let mut last = None;
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(m) = raw.recv().await {
            last = m.sqlstate().or(last.take());
        }
    })
    .await;
    assert!(ended.is_ok(), "{sql}: the proxy ends the session");
    last
}

/// Whether a statement with `marker` in its text still runs on shard 1.
async fn still_runs(admin: &tokio_postgres::Client, marker: &str) -> bool {
    let sql = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%{marker}%' AND state = 'active' AND pid <> pg_backend_pid()"
    );
    admin.query_one(&sql, &[]).await.unwrap().get::<_, i64>(0) > 0
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_past_transaction_timeout_ends_and_is_rolled_back() {
    let admin = shard_admin(1, "app").await;
    admin
        .batch_execute("DROP TABLE IF EXISTS tx_timeout; CREATE TABLE tx_timeout (tenant_id bigint); GRANT ALL ON tx_timeout TO app;")
        .await
        .unwrap();
    let proxy = start_proxy(|c| c.proxy.transaction_timeout_ms = 400).await;
    // Short transactions, one after another past the timeout, are each timed alone.
    let steady = proxy.connect(Some(7)).await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1000) {
        steady.batch_execute("BEGIN; SELECT 1; COMMIT").await.expect("short transactions stay");
    }
    // Idle in a transaction that wrote: FATAL 25P04, the write rolled back.
    let idle = error_before_the_end(&proxy, "BEGIN; INSERT INTO tx_timeout VALUES (7)", true).await;
    assert_eq!(idle.as_deref(), Some("25P04"));
    let empty = || async {
        admin.query_one("SELECT count(*) FROM tx_timeout", &[]).await.unwrap().get::<_, i64>(0) == 0
    };
    assert!(eventually(Duration::from_secs(10), empty).await.is_some(), "rolled back");
    // A statement still running when it fires is canceled on the server.
    let busy = error_before_the_end(&proxy, "SELECT pg_sleep(30), 'tx_timeout_sleep'", false).await;
    assert_eq!(busy.as_deref(), Some("25P04"));
    let gone = || async { !still_runs(&admin, "tx_timeout_sleep").await };
    assert!(eventually(Duration::from_secs(10), gone).await.is_some(), "no longer runs on the server");
    assert_eq!(steady.query_one("SELECT 1", &[]).await.unwrap().get::<_, i32>(0), 1, "others go on");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_unanswered_past_query_timeout_is_canceled_and_ends_its_session() {
    let admin = shard_admin(1, "app").await;
    let proxy = start_proxy(|c| c.proxy.query_timeout_ms = 400).await;
    let client = proxy.connect(Some(7)).await;
    // Idle in a transaction past the timeout: no request is outstanding, nothing fires.
    client.batch_execute("BEGIN; SELECT 1").await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    client.batch_execute("COMMIT").await.expect("a quiet transaction is no unanswered request");
    let sleeping = error_before_the_end(&proxy, "SELECT pg_sleep(30), 'query_timeout_sleep'", false).await;
    assert_eq!(sleeping.as_deref(), Some("57014"));
    let gone = || async { !still_runs(&admin, "query_timeout_sleep").await };
    assert!(eventually(Duration::from_secs(10), gone).await.is_some(), "no longer runs on the server");
    proxy.shutdown().await;
}

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

/// Writes a self-signed certificate for `localhost` and its key to `cert` and `key`.
fn write_self_signed(cert: &std::path::Path, key: &std::path::Path) {
    let pair = rcgen::KeyPair::generate().unwrap();
    let made = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap().self_signed(&pair).unwrap();
    std::fs::write(cert, made.pem()).unwrap();
    std::fs::write(key, pair.serialize_pem()).unwrap();
}

/// psql over TLS verifying the proxy's certificate against `root` (its own self-signed
/// one): whether it connected.
fn verified_by(port: u16, root: &std::path::Path) -> bool {
    let conninfo = format!(
        "host=localhost hostaddr=127.0.0.1 port={port} user=app password=app dbname=app sslmode=verify-full sslrootcert={} options='-c pgtenant.tenant_id=7'",
        root.display()
    );
    let out = crate::harness::psql_at(&conninfo, "SELECT 1");
    out.status.success()
}

/// A RELOAD applies the session timeouts (to a running session from its next request)
/// and reads
/// the TLS certificate again: a certificate renewed at the same paths is what the next
/// TLS client gets.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_applies_timeouts_and_a_renewed_certificate() {
    let dir = crate::harness::clusters::base_dir().join("reload_tls");
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key, first, second) =
        (dir.join("server.crt"), dir.join("server.key"), dir.join("first.crt"), dir.join("second.crt"));
    write_self_signed(&cert, &key);
    std::fs::copy(&cert, &first).unwrap();
    let (cert_path, key_path) = (cert.clone(), key.clone());
    let (proxy, file) = crate::harness::start_proxy_from_file("reload_tls", move |c| {
        c.tls = Some(pgtenant::config::TlsConfig { cert: cert_path, key: key_path });
    })
    .await;
    let port = proxy.addr.port();
    assert!(verified_by(port, &first), "the first certificate is served");
    let running = proxy.connect(Some(7)).await;

    // Renewed at the same paths, and the session timeout turned on, in the file.
    write_self_signed(&cert, &key);
    std::fs::copy(&cert, &second).unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    let text = text.replace("client_idle_timeout_ms = 0", "client_idle_timeout_ms = 300");
    assert!(text.contains("client_idle_timeout_ms = 300"));
    std::fs::write(&file, text).unwrap();
    let console = crate::harness::connect(&proxy.admin_conninfo()).await.unwrap();
    console.simple_query("RELOAD").await.expect("timeouts and TLS change live");

    assert!(verified_by(port, &second), "the renewed certificate is served");
    assert!(!verified_by(port, &first), "the old one is not");
    // The session that ran before the RELOAD is timed by the new setting from its next
    // request on.
    running.simple_query("SELECT 1").await.unwrap();
    let closed = eventually(Duration::from_secs(10), || async { running.is_closed() }).await;
    assert!(closed.is_some(), "idle past the reloaded client_idle_timeout_ms");
    proxy.shutdown().await;
}

/// A client of the test's own database `caps` on shard 1, as `user`.
async fn caps_client(proxy: &crate::harness::Proxy, user: &str) -> tokio_postgres::Client {
    let conninfo = format!(
        "host=127.0.0.1 port={} user={user} password={user} dbname=caps sslmode=disable options='-c pgtenant.tenant_id=7'",
        proxy.addr.port()
    );
    crate::harness::connect(&conninfo).await.expect("a client of caps")
}

/// `max_db_connections` caps a node's server connections to a database over every
/// user's pool: six clients at once share two, an idle one of another user's pool is
/// closed to make room, and with both held in transactions the next request gets 53300
/// naming the cap after `checkout_timeout_ms`; `max_user_connections` caps a server
/// role's the same way.
#[tokio::test(flavor = "multi_thread")]
async fn max_db_connections_caps_every_pool_of_a_database() {
    let admin = shard_admin(1, "app").await;
    admin.batch_execute("DROP DATABASE IF EXISTS caps WITH (FORCE)").await.unwrap();
    admin.batch_execute("CREATE DATABASE caps OWNER app").await.unwrap();
    let proxy = start_proxy(|c| {
        c.proxy.max_db_connections = 2;
        c.proxy.checkout_timeout_ms = 2_000;
    })
    .await;
    let backends = "SELECT count(*) FROM pg_stat_activity WHERE datname = 'caps'";
    let clients: Vec<_> = futures_util::future::join_all((0..6).map(|_| caps_client(&proxy, "app"))).await;
    let running = futures_util::future::join_all(
        clients.iter().map(|c| c.batch_execute("BEGIN; SELECT pg_sleep(0.3); COMMIT")),
    );
    let sampling = async {
        let mut most = 0;
        for _ in 0..40 {
            most = most.max(admin.query_one(backends, &[]).await.unwrap().get::<_, i64>(0));
            tokio::task::yield_now().await;
        }
        most
    };
    let (done, most) = tokio::join!(running, sampling);
    assert!(done.iter().all(Result::is_ok), "every client's transaction ran: {done:?}");
    assert!((1..=2).contains(&most), "at most 2 server connections to caps, saw {most}");
    // app's pool holds both, idle: the admin login (another server role) gets one by
    // closing one of them (nothing else would free a slot before its checkout timeout).
    let dba = caps_client(&proxy, "admin").await;
    let role: String = dba.query_one("SELECT current_user::text WHERE true", &[]).await.unwrap().get(0);
    assert_eq!(role, "postgres");
    assert!(admin.query_one(backends, &[]).await.unwrap().get::<_, i64>(0) <= 2);
    // Both held in transactions: a third request waits, then 53300 naming the cap.
    for c in [&clients[0], &dba] {
        c.batch_execute("BEGIN; SELECT 1").await.unwrap();
    }
    let refused = clients[1].simple_query("SELECT 1 WHERE true").await.expect_err("the cap is full");
    assert_eq!(sqlstate(&refused), "53300");
    let message = refused.as_db_error().map(|d| d.message().to_string()).unwrap_or_default();
    assert!(message.contains("database caps") && message.contains("max_db_connections"), "{message}");
    for c in [&clients[0], &dba] {
        c.batch_execute("COMMIT").await.unwrap();
    }
    clients[1].simple_query("SELECT 1 WHERE true").await.expect("a slot is free again");
    proxy.shutdown().await;

    // max_user_connections: one server role's connections to a node, over its pools.
    let proxy = start_proxy(|c| c.proxy.max_user_connections = 1).await;
    let clients: Vec<_> = futures_util::future::join_all((0..3).map(|_| caps_client(&proxy, "app"))).await;
    let running = futures_util::future::join_all(
        clients.iter().map(|c| c.batch_execute("BEGIN; SELECT pg_sleep(0.2); COMMIT")),
    );
    let sampling = async {
        let mut most = 0;
        for _ in 0..30 {
            let sql = format!("{backends} AND usename = 'app'");
            most = most.max(admin.query_one(&sql, &[]).await.unwrap().get::<_, i64>(0));
            tokio::task::yield_now().await;
        }
        most
    };
    let (done, most) = tokio::join!(running, sampling);
    assert!(done.iter().all(Result::is_ok), "{done:?}");
    assert_eq!(most, 1, "one server connection of role app at a time");
    proxy.shutdown().await;
}
