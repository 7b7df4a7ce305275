//! Failures: pool exhaustion, a shard that dies and comes back (and a client that
//! leaves while its request is held for it), malformed client input, a client that
//! disappears mid-transaction, and a pooled server connection that the server closed.

use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;

use crate::harness::raw::{RawClient, first_column};
use crate::harness::{self, private_cluster, shard_of, shards, sqlstate, start_proxy};

#[tokio::test(flavor = "multi_thread")]
async fn exhausted_pool_gives_53300_naming_the_shard() {
    let proxy = start_proxy(|c| {
        c.users[0].pool_size = 1;
        c.proxy.checkout_timeout_ms = 300;
    })
    .await;
    let holder = proxy.connect(Some(7)).await;
    holder.batch_execute("BEGIN; SELECT 1").await.unwrap();
    let waiter = proxy.connect(Some(7)).await;
    let started = Instant::now();
    let err = waiter.query("SELECT 1", &[]).await.expect_err("pool is exhausted");
    assert_eq!(sqlstate(&err), "53300", "{err}");
    assert!(err.as_db_error().unwrap().message().contains("shard 1"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3));
    holder.batch_execute("COMMIT").await.unwrap();
    let one: i32 = waiter.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1, "the waiting session is usable once the pool frees up");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_shard_gives_clear_errors_and_serves_again_when_back() {
    let dying = private_cluster("dying", 2);
    let port = dying.port;
    let proxy = start_proxy(move |c| {
        c.shards[1].nodes[0].port = port;
        c.health.interval_ms = 200;
        c.health.failover_hold_ms = 1000;
    })
    .await;
    let client = proxy.connect(Some(1500)).await;
    assert_eq!(shard_of(&client).await, 2);

    // Killed in the middle of a query.
    let sleeper = client.simple_query("SELECT pg_sleep(30)");
    let killer = {
        let dying = dying.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            tokio::task::spawn_blocking(move || dying.kill()).await.unwrap()
        })
    };
    let err = sleeper.await.expect_err("the query dies with its server");
    killer.await.unwrap().expect("kill");
    let code = sqlstate(&err);
    assert!(code == "08006" || code == "57P01" || code == "57P02", "{code}: {err}");

    // While it is down: held for failover_hold_ms (a new primary, or this one back,
    // would serve it), then a clear error naming the shard, and the session survives.
    let err = client.query("SELECT 1 FROM pgtenant_shard", &[]).await.expect_err("shard is down");
    assert_eq!(sqlstate(&err), "57P03", "{err}");
    let message = err.as_db_error().unwrap().message();
    assert!(message.contains("shard 2") && message.contains("primary is down"), "{err}");
    let other_shard = proxy.connect(Some(7)).await;
    assert_eq!(shard_of(&other_shard).await, 1, "shard 1 is unaffected");

    let restart = dying.clone();
    tokio::task::spawn_blocking(move || restart.start()).await.unwrap().expect("restart");
    assert_eq!(shard_of(&client).await, 2, "the same session works again");
    let _ = tokio::task::spawn_blocking(move || dying.stop()).await;
}

/// A request held while its shard has no primary gives its place among the held ones
/// back when its client hangs up. With one place (`max_held_requests = 1`), the next
/// client's request is then held too, instead of refused at once for want of a place,
/// and runs once the primary is back.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_leaves_during_a_failover_hold_gives_its_place_back() {
    use postgres_protocol::message::frontend;
    let dying = private_cluster("holdleave", 2);
    let port = dying.port;
    let proxy = start_proxy(move |c| {
        c.shards[1].nodes[0].port = port;
        c.health.interval_ms = 200;
        c.health.failover_hold_ms = 20_000;
        c.health.max_held_requests = 1;
    })
    .await;
    let console = harness::connect(&proxy.admin_conninfo()).await.unwrap();
    let listed = || harness::client_states(&console);
    // Both log in while the shard is up: a login needs its server's parameters.
    let login = [("options", "-c pgtenant.tenant_id=1500")];
    let mut first = RawClient::login(proxy.addr, &login).await;
    let second = proxy.connect(Some(1500)).await;
    assert_eq!(shard_of(&second).await, 2);
    let killer = dying.clone();
    tokio::task::spawn_blocking(move || killer.kill()).await.unwrap().expect("kill");

    let mut request = bytes::BytesMut::new();
    frontend::query("SELECT shard_id FROM pgtenant_shard", &mut request).unwrap();
    first.send(&request).await;
    let held =
        harness::eventually(Duration::from_secs(5), || async { listed().await == ["held", "idle"] }).await;
    assert!(held.is_some(), "the first request is held: {:?}", listed().await);
    drop(first);
    let gone = harness::eventually(Duration::from_secs(3), || async { listed().await == ["idle"] }).await;
    assert!(gone.is_some(), "still listed: {:?}", listed().await);

    let waiting = tokio::spawn(async move {
        second.query_one("SELECT shard_id FROM pgtenant_shard", &[]).await.map(|r| r.get::<_, i32>(0))
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiting.is_finished(), "the second request is held in the place the first gave back");
    let restart = dying.clone();
    tokio::task::spawn_blocking(move || restart.start()).await.unwrap().expect("restart");
    let answered = tokio::time::timeout(Duration::from_secs(15), waiting).await.expect("answered").unwrap();
    assert_eq!(answered.map_err(|e| sqlstate(&e)), Ok(2), "runs on shard 2 once its primary is back");
    let _ = tokio::task::spawn_blocking(move || dying.stop()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_input_ends_only_that_client() {
    let proxy = start_proxy(|_| {}).await;
    let good = proxy.connect(Some(7)).await;
    assert_eq!(shard_of(&good).await, 1);

    // Garbage instead of a startup packet.
    let mut tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    tcp.write_all(b"\xff\xff\xff\xffGARBAGE").await.unwrap();
    // A logged-in client announcing a 2 GiB message.
    let mut huge = RawClient::login(proxy.addr, &[]).await;
    huge.send(b"Q\x7f\xff\xff\xff").await;
    let reply = huge.recv().await.expect("an error before the close");
    assert_eq!(reply.tag, b'E');
    assert_eq!(reply.sqlstate().as_deref(), Some("08P01"));
    assert!(huge.recv().await.is_none(), "connection closed");
    // An unknown message type.
    let mut odd = RawClient::login(proxy.addr, &[]).await;
    odd.send(b"\x01\0\0\0\x04").await;
    let reply = odd.recv().await.expect("error");
    assert_eq!(reply.sqlstate().as_deref(), Some("08P01"));
    // A truncated message followed by a close.
    let mut cut = RawClient::login(proxy.addr, &[]).await;
    cut.send(b"Q\0\0\0\x20SELE").await;
    drop(cut);

    assert_eq!(shard_of(&good).await, 1, "other clients are undisturbed");
    let mut fresh = RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=1500")]).await;
    assert_eq!(first_column(&fresh.query("SELECT shard_id FROM pgtenant_shard").await), vec!["2"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_leaving_mid_transaction_commits_nothing() {
    let proxy = start_proxy(|c| c.users[0].pool_size = 1).await;
    let setup = proxy.connect(Some(7)).await;
    setup
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS abandoned (tenant_id bigint, v text); DELETE FROM abandoned",
        )
        .await
        .unwrap();
    drop(setup);
    {
        let client =
            harness::connect(&proxy.conninfo("application_name=abandoner options='-c pgtenant.tenant_id=7'"))
                .await
                .unwrap();
        client.batch_execute("BEGIN; INSERT INTO abandoned VALUES (7, 'lost')").await.unwrap();
    }
    // The single server connection must come back clean, without the insert.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = proxy.connect(Some(7)).await;
    let n: i64 = client.query_one("SELECT count(*) FROM abandoned", &[]).await.unwrap().get(0);
    assert_eq!(n, 0);
    let direct =
        harness::connect(&format!("host=127.0.0.1 port={} user=postgres dbname=app", shards().ports[0]))
            .await
            .unwrap();
    let idle_in_tx: i64 = direct
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'abandoner' AND state LIKE 'idle in transaction%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(idle_in_tx, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_idle_in_transaction_is_cut_off_and_frees_the_server() {
    let proxy = start_proxy(|c| {
        c.users[0].pool_size = 1;
        c.proxy.idle_transaction_timeout_ms = 300;
        c.proxy.checkout_timeout_ms = 3000;
    })
    .await;
    let setup = proxy.connect(Some(7)).await;
    setup
        .batch_execute("CREATE TABLE IF NOT EXISTS idle_tx (tenant_id bigint); DELETE FROM idle_tx")
        .await
        .unwrap();
    drop(setup);
    let mut idle = RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")]).await;
    idle.query("BEGIN").await;
    idle.query("INSERT INTO idle_tx VALUES (7)").await;
    // The only server connection is held; the timeout must give it back.
    let started = Instant::now();
    let other = proxy.connect(Some(7)).await;
    let n: i64 = other.query_one("SELECT count(*) FROM idle_tx", &[]).await.unwrap().get(0);
    assert_eq!(n, 0, "the idle transaction was rolled back");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    let fatal = idle.recv().await.expect("a FATAL for the idle client");
    assert_eq!(fatal.sqlstate().as_deref(), Some("25P03"));
    assert!(idle.recv().await.is_none(), "and the connection is closed");
}

/// A pooled server connection that the server closed while it sat idle is noticed at
/// checkout and replaced: the client's next query runs on a new one, and never sees it.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_connection_closed_while_pooled_is_replaced_unseen() {
    let proxy = start_proxy(|c| c.users[0].pool_size = 1).await;
    let client = proxy.connect(Some(7)).await;
    let first: i32 = harness::server_pid(&client).await;
    let admin = harness::shard_admin(1, "app").await;
    let killed: bool =
        admin.query_one("SELECT pg_terminate_backend($1, 5000)", &[&first]).await.unwrap().get(0);
    assert!(killed);
    // The server's goodbye (a FATAL, then the close) reaches the idle pooled socket.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second: i32 = harness::server_pid(&client).await;
    assert_ne!(first, second, "the closed connection must not be handed out again");
    proxy.shutdown().await;
}

/// A server connection lost under a client's request closes its pool's idle ones: on a
/// node being stopped they are ending too, and the next request must not be put on one
/// whose backend has not gone yet. The client's next request runs on a fresh one.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_connection_lost_mid_request_closes_the_idle_ones_of_its_pool() {
    let proxy = start_proxy(|c| c.users[0].pool_size = 2).await;
    let (first, second) = (proxy.connect(Some(7)).await, proxy.connect(Some(7)).await);
    first.batch_execute("BEGIN").await.unwrap();
    let a: i32 = harness::server_pid(&first).await;
    let b: i32 = harness::server_pid(&second).await;
    first.batch_execute("COMMIT").await.unwrap();
    assert_ne!(a, b, "two server connections, both idle now");

    let admin = harness::shard_admin(1, "app").await;
    let (first, running) = terminated_mid_request(first, "SELECT pg_sleep(10)", &admin).await;
    let idle = if running == a { b } else { a };
    let closed = harness::backend_ends(idle, Duration::from_secs(3)).await;
    assert!(closed, "the pool's idle connection (pid {idle}) was closed with the lost one");
    let next: i32 = harness::server_pid(&first).await;
    assert!(next != a && next != b, "the next request runs on a fresh connection");
    proxy.shutdown().await;
}

/// The pool's busy connections are not reused either once they come back: opened to
/// the same node, their backends may be ending one by one too.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_connection_lost_mid_request_retires_the_busy_ones_of_its_pool() {
    let proxy = start_proxy(|c| c.users[0].pool_size = 2).await;
    let (first, second) = (proxy.connect(Some(7)).await, proxy.connect(Some(7)).await);
    second.batch_execute("BEGIN").await.unwrap();
    let busy: i32 = harness::server_pid(&second).await;
    let admin = harness::shard_admin(1, "app").await;
    let (first, running) = terminated_mid_request(first, "SELECT pg_sleep(10) AS retired_busy", &admin).await;
    // The busy one's transaction goes on to its end, then the connection closes.
    let still: i32 = harness::server_pid(&second).await;
    assert_eq!(still, busy);
    second.batch_execute("COMMIT").await.unwrap();
    let closed = harness::backend_ends(busy, Duration::from_secs(3)).await;
    assert!(closed, "the connection busy at the loss (pid {busy}) was closed when it came back");
    let next: i32 = harness::server_pid(&first).await;
    assert!(next != running && next != busy, "the next request runs on a fresh connection");
    proxy.shutdown().await;
}

/// Runs `sql` (a long statement, its text unique among the tests) through `client`,
/// terminates its backend once the shard shows it running, and checks the error the
/// client gets (08006 or 57P01); returns the client and the terminated backend's pid.
async fn terminated_mid_request(
    client: tokio_postgres::Client,
    sql: &'static str,
    admin: &tokio_postgres::Client,
) -> (tokio_postgres::Client, i32) {
    let sleeper = tokio::spawn(async move {
        let err = client.batch_execute(sql).await.unwrap_err();
        (sqlstate(&err), client)
    });
    let running = terminate_once_running(admin, sql).await;
    let (code, client) = sleeper.await.unwrap();
    assert!(code == "08006" || code == "57P01", "the lost request's error: {code}");
    (client, running)
}

/// Waits until the shard shows statement `sql` running (its text unique among the
/// tests), then terminates its backend as an administrator would; returns its pid.
async fn terminate_once_running(admin: &tokio_postgres::Client, sql: &str) -> i32 {
    let sleeping = "SELECT pid FROM pg_stat_activity WHERE query = $1 AND state = 'active'";
    let mut running = None;
    for _ in 0..200 {
        running = admin.query_opt(sleeping, &[&sql]).await.unwrap().map(|r| r.get::<_, i32>(0));
        if running.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let running = running.unwrap_or_else(|| panic!("{sql} runs"));
    let killed: bool =
        admin.query_one("SELECT pg_terminate_backend($1, 5000)", &[&running]).await.unwrap().get(0);
    assert!(killed);
    running
}

/// A client waiting for a full pool gets the place of a connection that closed under
/// another client: it opens a new connection there instead of waiting out its timeout.
#[tokio::test(flavor = "multi_thread")]
async fn a_waiting_client_gets_the_place_of_a_server_connection_that_closed() {
    let proxy = start_proxy(|c| {
        c.users[0].pool_size = 1;
        c.proxy.checkout_timeout_ms = 20_000;
    })
    .await;
    let holder = proxy.connect(Some(7)).await;
    holder.batch_execute("BEGIN").await.unwrap();
    let held: i32 = harness::server_pid(&holder).await;
    let waiter = proxy.connect(Some(7)).await;
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let row = waiter.query_one("SELECT pg_backend_pid(), 41 + 1", &[]).await.unwrap();
        (row.get::<_, i32>(0), row.get::<_, i32>(1), started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "the only connection is held in a transaction");

    let admin = harness::shard_admin(1, "app").await;
    let killed: bool =
        admin.query_one("SELECT pg_terminate_backend($1, 5000)", &[&held]).await.unwrap().get(0);
    assert!(killed);
    let (pid, answer, waited) = waiting.await.unwrap();
    assert_eq!(answer, 42);
    assert_ne!(pid, held, "a new server connection");
    assert!(waited < Duration::from_secs(10), "served after {waited:?}, not at the timeout");
    // The holder was told (its server's FATAL is relayed, as a server would send it).
    holder.query_one("SELECT 1", &[]).await.expect_err("the holder's transaction is gone");
    proxy.shutdown().await;
}

/// Reads until `readies` ReadyForQuery messages came; `None` if the proxy hung up or
/// went quiet for 10 s first.
async fn answers_up_to(client: &mut RawClient, readies: usize) -> Option<Vec<harness::raw::Msg>> {
    let mut seen = Vec::new();
    while seen.iter().filter(|m: &&harness::raw::Msg| m.tag == b'Z').count() < readies {
        seen.push(client.recv().await?);
    }
    Some(seen)
}

/// Found by the session fuzz target: a server that dies with requests pipelined
/// behind the running one (a Sync, another query; the server's own FATAL first, as
/// `pg_terminate_backend` sends it) answered only the first of them, and the client
/// waited forever for the rest. In transaction pooling every request is answered now,
/// each with one error (the server's FATAL is not passed on beside pgtenant's 08006),
/// and the session goes on. In session pooling the session was the server's: it ends
/// as on PostgreSQL, with the server's FATAL (issue 57, item 4). Both protocols.
#[tokio::test(flavor = "multi_thread")]
async fn every_request_pipelined_on_a_server_that_dies_is_answered() {
    use postgres_protocol::message::frontend;
    let admin = harness::shard_admin(1, "app").await;
    for mode in [pgtenant::config::PoolMode::Transaction, pgtenant::config::PoolMode::Session] {
        let proxy = start_proxy(move |c| c.proxy.pool_mode = mode).await;
        let mut client = RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")]).await;
        for extended in [false, true] {
            let sleep = format!("SELECT pg_sleep(30) /* dies under {mode:?} {extended} */");
            let mut out = bytes::BytesMut::new();
            if extended {
                for sql in [sleep.as_str(), "SELECT 2"] {
                    frontend::parse("", sql, std::iter::empty(), &mut out).unwrap();
                    harness::raw::bind_unnamed(&mut out);
                    frontend::execute("", 0, &mut out).unwrap();
                    frontend::sync(&mut out);
                }
            } else {
                frontend::query(&sleep, &mut out).unwrap();
                frontend::sync(&mut out);
                frontend::query("SELECT 2", &mut out).unwrap();
            }
            client.send(&out).await;
            terminate_once_running(&admin, &sleep).await;
            if mode == pgtenant::config::PoolMode::Session {
                let mut seen = Vec::new();
                while let Some(m) = client.recv().await {
                    seen.push(m);
                }
                let codes: Vec<String> = seen.iter().filter_map(|m| m.sqlstate()).collect();
                assert_eq!(codes, ["57P01"], "{mode:?}: the server's FATAL, then the connection closes");
                assert!(seen.iter().all(|m| m.tag != b'Z'), "{mode:?}: nothing after the FATAL");
                break;
            }
            let readies = if extended { 2 } else { 3 };
            let seen = answers_up_to(&mut client, readies).await;
            let seen = seen.unwrap_or_else(|| panic!("{mode:?}: the requests were not all answered"));
            let requests: Vec<&[harness::raw::Msg]> = seen.split_inclusive(|m| m.tag == b'Z').collect();
            let errors = |answer: &[harness::raw::Msg]| answer.iter().filter(|m| m.tag == b'E').count();
            assert_eq!(errors(requests[0]), 1, "{mode:?} {extended}: one error for the lost statement");
            assert_eq!(requests[0].iter().find_map(|m| m.sqlstate()).as_deref(), Some("08006"));
            assert!(requests.iter().all(|r| errors(r) <= 1), "{mode:?} {extended}: {seen:?}");
            assert_eq!(first_column(&client.query("SELECT 3").await), ["3"], "{mode:?}: the session goes on");
        }
        proxy.shutdown().await;
    }
}

/// Found by the session fuzz target: an extended-protocol request that pgtenant
/// refuses itself (a tenant SET among other statements) ended the session without a
/// FATAL error. It fails as a server fails a request now: its error, then
/// ReadyForQuery at the client's Sync, and the session goes on.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_extended_request_keeps_the_session() {
    use postgres_protocol::message::frontend;
    let proxy = start_proxy(|_| {}).await;
    let mut client = RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")]).await;
    let mut out = bytes::BytesMut::new();
    frontend::parse("", "SET pgtenant.tenant_id = 7", std::iter::empty(), &mut out).unwrap();
    frontend::parse("", "SELECT 1", std::iter::empty(), &mut out).unwrap();
    frontend::sync(&mut out);
    let answer = client.request(&out).await;
    assert_eq!(harness::raw::sqlstate(&answer).as_deref(), Some("0A000"), "{answer:?}");
    assert_eq!(answer.last().map(|m| m.tag), Some(b'Z'), "{answer:?}");
    assert_eq!(first_column(&client.query("SELECT 6").await), ["6"]);
}

/// Found by the session fuzz target: a simple query sent behind an extended request
/// whose Sync had not come yet (Parse, Bind, Execute, Flush, then Query) waited forever
/// when that request failed: PostgreSQL skips the query (everything up to the Sync),
/// pgtenant waited for its answer. Now the client sees what PostgreSQL sends.
#[tokio::test(flavor = "multi_thread")]
async fn a_query_behind_a_failed_extended_request_is_skipped_as_postgres_skips_it() {
    use postgres_protocol::message::frontend;
    let mut out = bytes::BytesMut::new();
    frontend::parse("", "SELECT 1/0", std::iter::empty(), &mut out).unwrap();
    harness::raw::bind_unnamed(&mut out);
    frontend::execute("", 0, &mut out).unwrap();
    frontend::flush(&mut out);
    frontend::query("SELECT 2", &mut out).unwrap();
    frontend::sync(&mut out);
    frontend::query("SELECT 3", &mut out).unwrap();
    let describe = |msgs: &[harness::raw::Msg]| -> Vec<String> {
        msgs.iter()
            .map(|m| match m.sqlstate() {
                Some(code) => format!("E {code}"),
                None => (m.tag as char).to_string(),
            })
            .collect()
    };
    let direct_addr = format!("127.0.0.1:{}", shards().ports[0]).parse().unwrap();
    let mut direct = RawClient::login(direct_addr, &[]).await;
    direct.send(&out).await;
    let expected = describe(&answers_up_to(&mut direct, 2).await.expect("PostgreSQL answers"));
    // ParseComplete, the error (at Bind: the division is folded when planned), the
    // Sync's ReadyForQuery, then SELECT 3: SELECT 2 was skipped.
    assert_eq!(expected, ["1", "E 22012", "Z", "T", "D", "C", "Z"]);
    for mode in [pgtenant::config::PoolMode::Transaction, pgtenant::config::PoolMode::Session] {
        let proxy = start_proxy(move |c| c.proxy.pool_mode = mode).await;
        let mut client = RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")]).await;
        client.send(&out).await;
        let seen = answers_up_to(&mut client, 2).await.map(|m| describe(&m));
        assert_eq!(seen.as_ref(), Some(&expected), "{mode:?} pooling");
        assert_eq!(first_column(&client.query("SELECT 4").await), ["4"], "{mode:?}: the session goes on");
        proxy.shutdown().await;
    }
}

/// A transaction whose server connection is lost ends its session, as on PostgreSQL
/// (issue 57, item 4): the client gets the server's FATAL and the connection closes,
/// in both pool modes, instead of a session that goes on without the transaction (and,
/// in session pooling, without its temporary tables and session locks). Nothing of the
/// transaction was written, and nothing the client sent after it reached a server.
#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_that_lost_its_server_ends_its_session() {
    use postgres_protocol::message::frontend;
    let admin = harness::shard_admin(1, "app").await;
    for mode in [pgtenant::config::PoolMode::Transaction, pgtenant::config::PoolMode::Session] {
        let proxy = start_proxy(move |c| c.proxy.pool_mode = mode).await;
        let table = format!("lost_tx_{mode:?}").to_lowercase();
        for extended in [false, true] {
            let mut client = RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")]).await;
            let created =
                client.query(&format!("CREATE TABLE IF NOT EXISTS {table} (tenant_id bigint, v int)")).await;
            assert!(!created.iter().any(|m| m.tag == b'E'), "{mode:?}: {created:?}");
            client.query("BEGIN").await;
            client.query(&format!("INSERT INTO {table} VALUES (7, 1)")).await;
            let pid = first_column(&client.query(harness::SERVER_PID_SQL).await);
            let pid: i32 = pid[0].parse().unwrap();
            let killed: bool =
                admin.query_one("SELECT pg_terminate_backend($1, 5000)", &[&pid]).await.unwrap().get(0);
            assert!(killed);

            let mut out = bytes::BytesMut::new();
            let insert = format!("INSERT INTO {table} VALUES (7, 2)");
            if extended {
                frontend::parse("", &insert, std::iter::empty(), &mut out).unwrap();
                harness::raw::bind_unnamed(&mut out);
                frontend::execute("", 0, &mut out).unwrap();
                frontend::sync(&mut out);
            } else {
                frontend::query(&insert, &mut out).unwrap();
            }
            // The FATAL may come before the request is sent: the write may then fail.
            let _ = tokio::io::AsyncWriteExt::write_all(&mut client.stream, &out).await;
            let mut seen = Vec::new();
            while let Some(m) = client.recv().await {
                seen.push(m);
            }
            let codes: Vec<String> = seen.iter().filter_map(|m| m.sqlstate()).collect();
            assert_eq!(codes, ["57P01"], "{mode:?} {extended}: the server's FATAL, then the end: {seen:?}");
            assert!(!seen.iter().any(|m| matches!(m.tag, b'C' | b'Z')), "{mode:?} {extended}: {seen:?}");
        }
        let rows: i64 = admin.query_one(&format!("SELECT count(*) FROM {table}"), &[]).await.unwrap().get(0);
        assert_eq!(rows, 0, "{mode:?}: nothing of the lost transactions was written");
        proxy.shutdown().await;
    }
}

/// A transaction that failed without a server's say (the client cancelled its own
/// statement, `pg_cancel_backend(pg_backend_pid())`, which pgtenant answers) stays
/// failed until the client ends it, in both protocols: no later statement of it runs
/// anywhere (it would commit alone, outside the transaction the client believes it is
/// in), and what the transaction wrote before is rolled back.
#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_failed_in_pgtenant_runs_nothing_more() {
    use postgres_protocol::message::frontend;
    for mode in [pgtenant::config::PoolMode::Transaction, pgtenant::config::PoolMode::Session] {
        let proxy = start_proxy(move |c| c.proxy.pool_mode = mode).await;
        let table = format!("failed_tx_{mode:?}").to_lowercase();
        let mut client = RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")]).await;
        let created = client.query(&format!("CREATE TABLE {table} (tenant_id bigint, v int)")).await;
        assert!(!created.iter().any(|m| m.tag == b'E'), "{mode:?}: {created:?}");
        client.query("BEGIN").await;
        client.query(&format!("INSERT INTO {table} VALUES (7, 0)")).await;
        let seen = client.query("SELECT pg_cancel_backend(pg_backend_pid())").await;
        assert_eq!(harness::raw::sqlstate(&seen).as_deref(), Some("57014"), "{mode:?}: {seen:?}");
        assert_eq!(seen.last().map(|m| m.body.clone()), Some(b"E".to_vec()), "{mode:?}: failed");

        // The extended protocol first: the statement must not run.
        let mut out = bytes::BytesMut::new();
        frontend::parse("", &format!("INSERT INTO {table} VALUES (7, 1)"), std::iter::empty(), &mut out)
            .unwrap();
        harness::raw::bind_unnamed(&mut out);
        frontend::execute("", 0, &mut out).unwrap();
        frontend::sync(&mut out);
        let seen = client.request(&out).await;
        let codes: Vec<String> = seen.iter().filter_map(|m| m.sqlstate()).collect();
        assert_eq!(codes, ["25P02"], "{mode:?}: {codes:?}");
        assert!(!seen.iter().any(|m| m.tag == b'C'), "{mode:?}: the insert ran: {seen:?}");
        assert_eq!(seen.last().map(|m| m.body.clone()), Some(b"E".to_vec()), "{mode:?}: still failed");

        // Then simple queries: refused until the client ends the transaction.
        let seen = client.query(&format!("INSERT INTO {table} VALUES (7, 2)")).await;
        assert_eq!(harness::raw::sqlstate(&seen).as_deref(), Some("25P02"), "{mode:?}");
        // A FunctionCall (pg_backend_pid, OID 2026, no arguments, text result) too.
        let mut call = bytes::BytesMut::new();
        call.extend_from_slice(b"F");
        call.extend_from_slice(&14i32.to_be_bytes());
        call.extend_from_slice(&2026i32.to_be_bytes());
        call.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        let seen = client.request(&call).await;
        assert_eq!(harness::raw::sqlstate(&seen).as_deref(), Some("25P02"), "{mode:?}: {seen:?}");
        assert_eq!(seen.last().map(|m| m.body.clone()), Some(b"E".to_vec()), "{mode:?}");
        // Ended by a simple ROLLBACK in one mode, an extended one in the other.
        let seen = if mode == pgtenant::config::PoolMode::Transaction {
            client.query("ROLLBACK").await
        } else {
            out.clear();
            frontend::parse("", "ROLLBACK", std::iter::empty(), &mut out).unwrap();
            harness::raw::bind_unnamed(&mut out);
            frontend::execute("", 0, &mut out).unwrap();
            frontend::sync(&mut out);
            client.request(&out).await
        };
        assert_eq!(harness::raw::sqlstate(&seen), None, "{mode:?}: {seen:?}");
        assert_eq!(seen.last().map(|m| m.body.clone()), Some(b"I".to_vec()), "{mode:?}");
        let admin = harness::shard_admin(1, "app").await;
        let rows: i64 = admin.query_one(&format!("SELECT count(*) FROM {table}"), &[]).await.unwrap().get(0);
        assert_eq!(rows, 0, "{mode:?}: nothing of the failed transaction was written");
        assert_eq!(first_column(&client.query("SELECT 5").await), ["5"], "{mode:?}: the session goes on");
        proxy.shutdown().await;
    }
}
