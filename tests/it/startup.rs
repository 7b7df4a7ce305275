//! Startup phase: TLS (and its strict negotiation), authentication, the server's
//! parameters, cancel requests.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::raw::RawClient;
use crate::harness::{self, sqlstate, start_proxy, stdout};

#[tokio::test(flavor = "multi_thread")]
async fn tls_and_plain_connections_both_work() {
    let proxy = start_proxy(|_| {}).await;
    let port = proxy.addr.port();
    let tls = harness::run_with_stdin(
        std::process::Command::new("psql").args([
            "-X",
            "-d",
            &format!("host=127.0.0.1 port={port} user=app password=app dbname=app sslmode=require options='-c pgtenant.tenant_id=7'"),
            "-c",
            "\\conninfo",
            "-c",
            "SELECT shard_id FROM pgtenant_shard",
        ]),
        "",
    );
    let out = stdout(&tls);
    assert!(out.contains("SSL connection"), "{out}{}", harness::stderr(&tls));
    assert!(out.contains(" 1\n"), "{out}");
    let plain = proxy.psql(Some(7), &["-c", "\\conninfo"], "");
    assert!(!stdout(&plain).contains("SSL connection"), "{}", stdout(&plain));
}

#[tokio::test(flavor = "multi_thread")]
async fn scram_binds_to_the_tls_channel_when_the_client_asks() {
    let proxy = start_proxy(|_| {}).await;
    let psql = |conninfo: &str| {
        harness::run_with_stdin(
            std::process::Command::new("psql").args([
                "-X",
                "-tA",
                "-d",
                &format!("host=127.0.0.1 port={} user=app dbname=app {conninfo}", proxy.addr.port()),
                "-c",
                "SELECT shard_id FROM pgtenant_shard",
            ]),
            "",
        )
    };
    let tenant = "options='-c pgtenant.tenant_id=7'";
    // SCRAM-SHA-256-PLUS with tls-server-end-point, as against PostgreSQL over TLS.
    let bound = psql(&format!("password=app sslmode=require channel_binding=require {tenant}"));
    assert_eq!(stdout(&bound).trim(), "1", "{}", harness::stderr(&bound));
    let wrong = psql(&format!("password=nope sslmode=require channel_binding=require {tenant}"));
    assert!(
        harness::stderr(&wrong).contains("password authentication failed"),
        "{}",
        harness::stderr(&wrong)
    );
    // Without TLS there is no channel to bind to, and libpq will not go on without one.
    let plain = psql(&format!("password=app sslmode=disable channel_binding=require {tenant}"));
    assert!(!plain.status.success());
    assert!(harness::stderr(&plain).contains("channel binding"), "{}", harness::stderr(&plain));
}

#[tokio::test(flavor = "multi_thread")]
async fn bytes_after_ssl_request_are_refused() {
    let proxy = start_proxy(|_| {}).await;
    let mut tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    // SSLRequest followed at once by plaintext that must never be taken as TLS data.
    let mut packet = vec![0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
    packet.extend_from_slice(b"Q\0\0\0\x0dSELECT 1\0");
    tcp.write_all(&packet).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut answer))
        .await
        .expect("connection closed");
    assert!(!answer.starts_with(b"S"), "TLS was accepted after injected bytes: {answer:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn gssenc_is_refused_and_startup_continues() {
    let proxy = start_proxy(|_| {}).await;
    let out = harness::run_with_stdin(
        std::process::Command::new("psql").args([
            "-X",
            "-At",
            "-d",
            &format!(
                "host=127.0.0.1 port={} user=app password=app dbname=app gssencmode=prefer sslmode=disable",
                proxy.addr.port()
            ),
            "-c",
            "SELECT 42",
        ]),
        "",
    );
    assert_eq!(stdout(&out).trim(), "42", "{}", harness::stderr(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_password_and_unknown_user_get_28p01() {
    let proxy = start_proxy(|_| {}).await;
    let port = proxy.addr.port();
    for conninfo in [
        format!("host=127.0.0.1 port={port} user=app password=nope dbname=app"),
        format!("host=127.0.0.1 port={port} user=ghost password=app dbname=app"),
    ] {
        let err = harness::connect(&conninfo).await.expect_err("login must fail");
        assert_eq!(sqlstate(&err), "28P01", "{err}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_database_gets_3d000_from_the_server() {
    let proxy = start_proxy(|_| {}).await;
    let conninfo = format!("host=127.0.0.1 port={} user=app password=app dbname=nowhere", proxy.addr.port());
    let err = harness::connect(&conninfo).await.expect_err("login must fail");
    assert_eq!(sqlstate(&err), "3D000", "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn client_sees_the_real_server_parameters_and_its_own_settings() {
    let proxy = start_proxy(|_| {}).await;
    let mut c =
        RawClient::login(proxy.addr, &[("application_name", "param-test"), ("TimeZone", "Asia/Tokyo")]).await;
    // ParameterStatus values came before the first ReadyForQuery; ask again to compare.
    let msgs = c.query("SELECT current_setting('server_version'), current_setting('TimeZone'), current_setting('application_name')").await;
    let row = msgs.iter().find(|m| m.tag == b'D').expect("row");
    let text = String::from_utf8_lossy(&row.body);
    assert!(text.contains("Asia/Tokyo") && text.contains("param-test"), "{text}");

    let client = proxy.connect(None).await;
    let version: String = client.query_one("SHOW server_version", &[]).await.unwrap().get(0);
    assert!(version.starts_with(char::is_numeric), "{version}");
}

#[tokio::test(flavor = "multi_thread")]
async fn startup_parameters_are_reported_in_parameter_status() {
    let proxy = start_proxy(|_| {}).await;
    let mut c = RawClient::connect(proxy.addr).await;
    let mut out = bytes::BytesMut::new();
    postgres_protocol::message::frontend::startup_message(
        [("user", "app"), ("database", "app"), ("application_name", "reported")].into_iter(),
        &mut out,
    )
    .unwrap();
    c.send(&out).await;
    let mut scram = postgres_protocol::authentication::sasl::ScramSha256::new(
        b"app",
        postgres_protocol::authentication::sasl::ChannelBinding::unsupported(),
    );
    let mut params = Vec::new();
    let mut got_key = false;
    loop {
        let m = c.recv().await.expect("message");
        match m.tag {
            b'R' => {
                let code = i32::from_be_bytes(m.body[..4].try_into().unwrap());
                let mut out = bytes::BytesMut::new();
                if code == 10 {
                    postgres_protocol::message::frontend::sasl_initial_response(
                        "SCRAM-SHA-256",
                        scram.message(),
                        &mut out,
                    )
                    .unwrap();
                } else if code == 11 {
                    scram.update(&m.body[4..]).unwrap();
                    postgres_protocol::message::frontend::sasl_response(scram.message(), &mut out).unwrap();
                }
                if !out.is_empty() {
                    c.send(&out).await;
                }
            }
            b'S' => params.push(String::from_utf8_lossy(&m.body).replace('\0', "=")),
            b'K' => got_key = true,
            b'Z' => break,
            b'E' => panic!("{}", String::from_utf8_lossy(&m.body)),
            _ => {}
        }
    }
    assert!(got_key, "no BackendKeyData");
    assert!(params.iter().any(|p| p.starts_with("application_name=reported")), "{params:?}");
    assert!(params.iter().any(|p| p.starts_with("server_version=1")), "{params:?}");
    assert!(params.iter().any(|p| p.starts_with("server_encoding=UTF8")), "{params:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_stops_a_running_query() {
    let proxy = start_proxy(|_| {}).await;
    let client = proxy.connect(Some(7)).await;
    let token = client.cancel_token();
    let started = Instant::now();
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        token.cancel_query(tokio_postgres::NoTls).await
    });
    let err = client.simple_query("SELECT pg_sleep(20)").await.expect_err("query must be cancelled");
    assert_eq!(sqlstate(&err), "57014", "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    canceller.await.unwrap().unwrap();
    // The session goes on.
    let one: i32 = client.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
}

/// A cancel that reaches the server only after its statement ended on its own does
/// not hit the statement its server connection runs next, another client's: the
/// connection goes back to the pool only once the server confirmed the cancel. And
/// the client's cancel connection closes only then, as PostgreSQL's does.
#[tokio::test(flavor = "multi_thread")]
async fn a_late_cancel_never_hits_the_next_clients_statement() {
    let hold = Duration::from_millis(2500);
    let shard = std::net::SocketAddr::from(([127, 0, 0, 1], harness::shards().ports[0]));
    let (relay, cancels_received) = harness::slow_cancels::relay_holding_cancels(shard, hold).await;
    let proxy = start_proxy(|c| {
        c.shards[0].nodes[0].port = relay.port();
        c.users[0].pool_size = 1;
        c.proxy.checkout_timeout_ms = 10_000;
    })
    .await;
    let mut first = RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")]).await;
    let (pid, key) = first.key.expect("BackendKeyData");
    let second = proxy.connect(Some(7)).await;
    let console = harness::connect(&proxy.admin_conninfo()).await.unwrap();
    // (being canceled, waiting for a connection) of the app pool, as PgBouncer shows them.
    let held_back = || async {
        let pools = console.query("SHOW POOLS", &[]).await.unwrap();
        let app = pools.iter().find(|r| r.get::<_, String>("database") == "app").expect("the app pool");
        (app.get::<_, i64>("sv_being_canceled"), app.get::<_, i64>("cl_waiting"))
    };

    // The pool's one connection is opened first (a login through the relay can take
    // longer than the statement on a loaded machine; a cancel then ends a wait).
    assert_eq!(crate::harness::raw::first_column(&first.query("SELECT 1").await), vec!["1".to_string()]);
    let statement = "SELECT pg_backend_pid() FROM pg_sleep(1)";
    let mut query = bytes::BytesMut::new();
    postgres_protocol::message::frontend::query(statement, &mut query).unwrap();
    let started = Instant::now();
    first.send(&query).await;
    let shard_admin = harness::shard_admin(1, "app").await;
    let running = harness::eventually(Duration::from_secs(5), || async {
        let active = "SELECT count(*) FROM pg_stat_activity WHERE query = $1 AND state = 'active'";
        shard_admin.query_one(active, &[&statement]).await.unwrap().get::<_, i64>(0) == 1
    })
    .await;
    assert!(running.is_some(), "the statement runs on the server");
    // Sent while the statement runs; the relay passes it on after the statement ended.
    let proxy_addr = proxy.addr;
    let canceller = tokio::spawn(async move {
        let mut cancel = tokio::net::TcpStream::connect(proxy_addr).await.unwrap();
        let mut request = bytes::BytesMut::new();
        postgres_protocol::message::frontend::cancel_request(pid, key, &mut request);
        let sent = Instant::now();
        cancel.write_all(&request).await.unwrap();
        let mut rest = Vec::new();
        cancel.read_to_end(&mut rest).await.unwrap();
        sent.elapsed()
    });
    let forwarded = harness::eventually(Duration::from_secs(2), || async {
        cancels_received.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    assert!(forwarded.is_some(), "pgtenant passed the cancel on");
    // Waits for the only server connection, then runs for longer than the cancel is
    // held back (extended protocol).
    let second_pid = tokio::spawn(async move {
        second.query_one("SELECT pg_backend_pid() FROM pg_sleep(1)", &[]).await.map(|r| r.get::<_, i32>(0))
    });

    let answer = first.until_ready().await;
    let ended = started.elapsed();
    assert_eq!(crate::harness::raw::sqlstate(&answer), None, "ended on its own: {answer:?}");
    let first_pid: i32 = crate::harness::raw::first_column(&answer)[0].parse().unwrap();
    // Until the cancel is confirmed, its connection is held back.
    let seen = harness::eventually(Duration::from_secs(1), || async { held_back().await == (1, 1) }).await;
    assert!(seen.is_some(), "{:?} after {ended:?} and more", held_back().await);
    let second_pid = second_pid.await.unwrap().expect("the late cancel did not hit it");
    assert_eq!(second_pid, first_pid, "the same server connection, the one the cancel was for");
    let confirmed_after = canceller.await.unwrap();
    assert!(confirmed_after >= hold - Duration::from_millis(300), "closed after {confirmed_after:?}");
    assert_eq!(held_back().await, (0, 0));
    // The first client goes on.
    let again = first.query("SELECT 1").await;
    assert_eq!(crate::harness::raw::first_column(&again), vec!["1".to_string()]);
}

/// A cancel reaches a request that waits in pgtenant, not yet on a server: for a
/// connection of a full pool, and through an admin's PAUSE. It fails with 57014 at
/// once (it would wait out `checkout_timeout_ms` or `pause_hold_ms` otherwise), in
/// both protocols, and the session goes on.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_ends_a_request_waiting_in_pgtenant() {
    let proxy = start_proxy(|c| {
        c.users[0].pool_size = 1;
        c.proxy.checkout_timeout_ms = 20_000;
        c.proxy.pause_hold_ms = 20_000;
    })
    .await;
    let holder = proxy.connect(Some(7)).await;
    holder.batch_execute("BEGIN; SELECT 1").await.unwrap();
    let waiter = std::sync::Arc::new(proxy.connect(Some(7)).await);
    let console = std::sync::Arc::new(harness::connect(&proxy.admin_conninfo()).await.unwrap());
    // Cancels once the waiter's request waits (SHOW POOLS' cl_waiting counts paused ones too).
    let cancel_after = |token: tokio_postgres::CancelToken| {
        let console = console.clone();
        async move {
            let waits = harness::eventually(Duration::from_secs(5), || async {
                let pools = console.query("SHOW POOLS", &[]).await.unwrap();
                pools
                    .iter()
                    .any(|r| r.get::<_, String>("database") == "app" && r.get::<_, i64>("cl_waiting") == 1)
            })
            .await;
            assert!(waits.is_some(), "the request waits");
            token.cancel_query(tokio_postgres::NoTls).await.unwrap();
        }
    };
    for extended in [false, true] {
        let started = Instant::now();
        let canceller = tokio::spawn(cancel_after(waiter.cancel_token()));
        let err = if extended {
            waiter.query("SELECT 2", &[]).await.map(|_| ()).unwrap_err()
        } else {
            waiter.simple_query("SELECT 2").await.map(|_| ()).unwrap_err()
        };
        assert_eq!(sqlstate(&err), "57014", "{err}");
        let message = err.as_db_error().map(|e| e.message().to_string()).unwrap_or_default();
        assert!(message.contains("waiting in pgtenant"), "{message}");
        assert!(started.elapsed() < Duration::from_secs(5), "canceled, not timed out");
        canceller.await.unwrap();
    }
    holder.batch_execute("COMMIT").await.unwrap();
    let three: i32 = waiter.query_one("SELECT 3", &[]).await.unwrap().get(0);
    assert_eq!(three, 3, "the session goes on");

    // Held by a PAUSE of its tenant.
    console.simple_query("PAUSE TENANT 7").await.unwrap();
    let started = Instant::now();
    let canceller = tokio::spawn(cancel_after(waiter.cancel_token()));
    let err = waiter.simple_query("SELECT 4").await.map(|_| ()).unwrap_err();
    assert_eq!(sqlstate(&err), "57014", "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "canceled, not held to the end");
    canceller.await.unwrap();
    console.simple_query("RESUME TENANT 7").await.unwrap();
    let five: i32 = waiter.query_one("SELECT 5", &[]).await.unwrap().get(0);
    assert_eq!(five, 5);
}

#[tokio::test(flavor = "multi_thread")]
async fn too_many_clients_get_53300() {
    let proxy = start_proxy(|c| c.proxy.max_clients = 1).await;
    let first = proxy.connect(Some(7)).await;
    let err = proxy.try_connect(Some(7)).await.expect_err("second client refused");
    assert_eq!(sqlstate(&err), "53300", "{err}");
    drop(first);
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.connect(Some(7)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_tells_idle_clients_57p01() {
    let proxy = start_proxy(|_| {}).await;
    let mut idle = RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")]).await;
    let started = Instant::now();
    proxy.shutdown().await;
    assert!(started.elapsed() < Duration::from_secs(5), "idle sessions do not hold up shutdown");
    let msg = idle.recv().await.expect("a FATAL before the close");
    assert_eq!(msg.sqlstate().as_deref(), Some("57P01"));
}

#[tokio::test(flavor = "multi_thread")]
async fn start_up_settings_the_server_rejects_refuse_every_login() {
    let proxy = start_proxy(|_| {}).await;
    // This first login makes the pool's server parameters known, so that later logins
    // could be answered without a server: the settings must still be checked.
    let first = proxy.connect(Some(7)).await;
    first.batch_execute("SELECT 1").await.unwrap();
    for (setting, code, message) in [
        ("work_mem=banana", "22023", r#"invalid value for parameter "work_mem": "banana""#),
        ("log_statement=all", "42501", r#"permission denied to set parameter "log_statement""#),
    ] {
        for attempt in 0..2 {
            let conninfo = proxy.conninfo(&format!("options='-c pgtenant.tenant_id=7 -c {setting}'"));
            let err = harness::connect(&conninfo).await.expect_err("PostgreSQL refuses this login");
            assert_eq!(sqlstate(&err), code, "attempt {attempt}: {err}");
            let said = err.as_db_error().map(|e| e.message().to_string()).unwrap_or_default();
            assert_eq!(said, message, "attempt {attempt}");
        }
    }
    // Accepted settings are applied, the first time and when the node is known to accept them.
    for _ in 0..2 {
        let conninfo = proxy.conninfo("options='-c pgtenant.tenant_id=7 -c work_mem=5MB'");
        let client = harness::connect(&conninfo).await.unwrap();
        let work_mem: String = client.query_one("SHOW work_mem", &[]).await.unwrap().get(0);
        assert_eq!(work_mem, "5MB");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn logins_do_not_wait_for_a_busy_pool_to_check_their_settings() {
    let proxy = start_proxy(|c| {
        c.users[0].pool_size = 1;
        c.proxy.checkout_timeout_ms = 300;
    })
    .await;
    let busy = proxy.connect(Some(7)).await;
    busy.batch_execute("BEGIN; SELECT 1").await.unwrap();
    // The only server connection is taken: a login that had to check its settings on a
    // server would wait for it, and fail (53300). application_name needs no check.
    let conninfo = proxy.conninfo("application_name=worker-4711 options='-c pgtenant.tenant_id=7'");
    let client = harness::connect(&conninfo).await.expect("login without a server connection");
    // New settings are not checked while no connection is free (they are at checkout).
    let conninfo = proxy.conninfo("options='-c pgtenant.tenant_id=7 -c work_mem=6MB'");
    let tuned = harness::connect(&conninfo).await.expect("login without a server connection");
    busy.batch_execute("COMMIT").await.unwrap();
    let name: String = client.query_one("SHOW application_name", &[]).await.unwrap().get(0);
    assert_eq!(name, "worker-4711");
    let work_mem: String = tuned.query_one("SHOW work_mem", &[]).await.unwrap().get(0);
    assert_eq!(work_mem, "6MB");
}

#[tokio::test(flavor = "multi_thread")]
async fn session_pooling_keeps_one_server_connection() {
    let proxy = start_proxy(|c| c.proxy.pool_mode = pgtenant::config::PoolMode::Session).await;
    let client = proxy.connect(Some(7)).await;
    let pid: i32 = harness::server_pid(&client).await;
    client.batch_execute("SET work_mem = '7MB'").await.unwrap();
    let other = proxy.connect(Some(7)).await;
    other.batch_execute("SELECT 1").await.unwrap();
    for _ in 0..3 {
        let row =
            client.query_one("SELECT pg_backend_pid(), current_setting('work_mem')", &[]).await.unwrap();
        assert_eq!(row.get::<_, i32>(0), pid);
        assert_eq!(row.get::<_, String>(1), "7MB");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn md5_and_cleartext_logins() {
    use pgtenant::config::AuthMethod;
    let proxy = start_proxy(|c| {
        for (name, auth) in [("md5user", AuthMethod::Md5), ("plainuser", AuthMethod::Cleartext)] {
            let mut u = c.users[0].clone();
            u.name = name.into();
            u.auth = auth;
            u.server_user = Some("app".into());
            c.users.push(u);
        }
    })
    .await;
    let port = proxy.addr.port();
    for user in ["md5user", "plainuser"] {
        let ok = harness::connect(&format!(
            "host=127.0.0.1 port={port} user={user} password=app dbname=app options='-c pgtenant.tenant_id=42'"
        ))
        .await
        .unwrap();
        let shard: i32 = ok.query_one("SELECT shard_id FROM pgtenant_shard", &[]).await.unwrap().get(0);
        assert_eq!(shard, 2);
        let err =
            harness::connect(&format!("host=127.0.0.1 port={port} user={user} password=wrong dbname=app"))
                .await
                .expect_err("wrong password");
        assert_eq!(sqlstate(&err), "28P01", "{user}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_to_servers_with_and_without_verification() {
    use pgtenant::config::ServerTlsMode;
    let secure = harness::private_tls_cluster("tls-shard", 2);
    let port = secure.port;
    let ca = harness::shards().tls_dir.join("server.crt");
    for verify in [false, true] {
        let ca = ca.clone();
        let proxy = start_proxy(move |c| {
            c.shards[1].nodes[0].port = port;
            c.server_tls.mode = ServerTlsMode::Require;
            c.server_tls.ca = verify.then_some(ca);
        })
        .await;
        let client = proxy.connect(Some(1500)).await;
        let server_pid = harness::server_pid(&client).await;
        // pg_stat_ssl shows every session: the shard's superuser reads it, not a tenant.
        let admin =
            harness::connect(&format!("host=127.0.0.1 port={port} user=postgres dbname=app")).await.unwrap();
        let ssl: bool = admin
            .query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = $1", &[&server_pid])
            .await
            .unwrap()
            .get(0);
        assert!(ssl, "server connection is encrypted (verify: {verify})");
    }
    // A server without TLS (shard 1 here) is refused when TLS is required.
    let proxy = start_proxy(|c| c.server_tls.mode = ServerTlsMode::Require).await;
    let err = proxy.try_connect(Some(7)).await.expect_err("shard 1 offers no TLS");
    assert_eq!(sqlstate(&err), "08001", "{err}");
    assert!(err.as_db_error().unwrap().message().contains("does not offer TLS"), "{err}");
    let _ = tokio::task::spawn_blocking(move || secure.stop()).await;
}
