//! Stock clients through the proxy: psql, pgbench and tokio-postgres, in
//! transaction pooling with small pools so that server connections change hands.

use std::process::Command;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt, pin_mut};
use pgtenant::config::PoolMode;
use tokio_postgres::binary_copy::{BinaryCopyInWriter, BinaryCopyOutStream};
use tokio_postgres::types::Type;

use crate::harness::{self, eventually, shard_of, start_proxy, stderr, stdout};

#[tokio::test(flavor = "multi_thread")]
async fn psql_multi_statements_errors_and_rollback() {
    let proxy = start_proxy(|_| {}).await;
    let out = proxy.psql(
        Some(1500),
        &["-At"],
        "SELECT 1; SELECT 2;
         CREATE TABLE IF NOT EXISTS psql_t (tenant_id bigint, v int);
         DELETE FROM psql_t;
         BEGIN;
         INSERT INTO psql_t VALUES (1500, 1);
         SELECT 1/0;
         SELECT 'ignored';
         ROLLBACK;
         SELECT count(*) FROM psql_t;
         SELECT 'alive', shard_id FROM pgtenant_shard;
        ",
    );
    let text = stdout(&out);
    let err = stderr(&out);
    assert_eq!(text, "1\n2\n0\nalive|2\n", "stdout {text} stderr {err}");
    assert!(err.contains("division by zero"), "{err}");
    assert!(err.contains("current transaction is aborted"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn pg_dump_of_a_tenant_table() {
    // pg_dump sets its session up with SETs and a set_config() on a pg_settings row.
    let proxy = start_proxy(|_| {}).await;
    let out = harness::run_with_stdin(
        Command::new("pg_dump").args([
            "-d",
            &proxy.conninfo("options='-c pgtenant.tenant_id=7'"),
            "-t",
            "accounts",
            // The demo table has row-level security (FORCE): the dump is tenant 7's rows.
            "--enable-row-security",
        ]),
        "",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let dump = stdout(&out);
    assert!(dump.contains("CREATE TABLE public.accounts"), "{dump}");
    assert!(dump.contains("COPY public.accounts"), "{dump}");
    assert!(dump.contains("account 1 of tenant 7"), "{dump}");
    assert!(!dump.contains("of tenant 8"), "another tenant's rows in the dump: {dump}");
}

#[tokio::test(flavor = "multi_thread")]
async fn psql_copy_both_ways() {
    let proxy = start_proxy(|_| {}).await;
    let dir = std::env::temp_dir().join(format!("pgtenant-copy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("in.csv");
    let output = dir.join("out.csv");
    let rows: String = (1..=500).map(|i| format!("{i},\"row, {i}\"\n")).collect();
    std::fs::write(&input, &rows).unwrap();
    let script = format!(
        "CREATE TABLE IF NOT EXISTS psql_copy (id int, label text);
         TRUNCATE psql_copy;
         \\copy psql_copy FROM '{}' csv
         \\copy (SELECT * FROM psql_copy ORDER BY id) TO '{}' csv
         SELECT count(*), sum(id) FROM psql_copy;",
        input.display(),
        output.display()
    );
    let out = proxy.psql(Some(42), &["-At"], &script);
    assert_eq!(stdout(&out).trim(), "500|125250", "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&output).unwrap(), rows);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn pgbench_in_every_query_mode() {
    let proxy = start_proxy(|c| c.users[0].pool_size = 4).await;
    let port = proxy.addr.port().to_string();
    let pgbench = |args: &[&str]| {
        Command::new("pgbench")
            .args(["-h", "127.0.0.1", "-p", &port, "-U", "app"])
            .args(args)
            .arg("app")
            .env("PGPASSWORD", "app")
            .env("PGOPTIONS", "-c pgtenant.tenant_id=500")
            .output()
            .expect("pgbench")
    };
    let init = pgbench(&["-i", "-s", "1", "-q"]);
    assert!(init.status.success(), "{}", stderr(&init));
    for mode in ["simple", "extended", "prepared"] {
        let run = pgbench(&["-M", mode, "-c", "8", "-j", "2", "-t", "150"]);
        let text = stdout(&run);
        assert!(run.status.success(), "{mode}: {text}{}", stderr(&run));
        assert!(text.contains("number of transactions actually processed: 1200/1200"), "{mode}: {text}");
        assert!(text.contains("number of failed transactions: 0"), "{mode}: {text}");
    }
    // The work landed on tenant 500's shard (1) and nowhere else.
    let client = proxy.connect(Some(500)).await;
    let history: i64 = client.query_one("SELECT count(*) FROM pgbench_history", &[]).await.unwrap().get(0);
    assert_eq!(history, 1200, "each run truncates pgbench_history first; the last run left 1200");
    let other = proxy.connect(Some(1500)).await;
    let exists: bool =
        other.query_one("SELECT to_regclass('pgbench_history') IS NOT NULL", &[]).await.unwrap().get(0);
    assert!(!exists, "pgbench tables must not exist on shard 2");
}

#[tokio::test(flavor = "multi_thread")]
async fn prepared_statements_survive_server_changes() {
    // Two server connections for six clients: every transaction may get another one.
    let proxy = start_proxy(|c| c.users[0].pool_size = 2).await;
    let mut tasks = Vec::new();
    for n in 0..6i64 {
        let client = proxy.connect(Some(7)).await;
        tasks.push(tokio::spawn(async move {
            let stmt = client
                .prepare("SELECT $1::bigint * 2, $2::text || '!', shard_id FROM pgtenant_shard")
                .await
                .unwrap();
            let typed = client.prepare_typed("SELECT $1 + 1", &[Type::INT4]).await.unwrap();
            for i in 0..40i64 {
                let row = client.query_one(&stmt, &[&(n * 1000 + i), &format!("c{n}")]).await.unwrap();
                assert_eq!(row.get::<_, i64>(0), (n * 1000 + i) * 2);
                assert_eq!(row.get::<_, String>(1), format!("c{n}!"));
                assert_eq!(row.get::<_, i32>(2), 1);
                let row = client.query_one(&typed, &[&(i as i32)]).await.unwrap();
                assert_eq!(row.get::<_, i32>(0), i as i32 + 1);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_statement_prepared_again_after_a_schema_change_sees_the_new_columns() {
    // One server connection: every client's statements share it, as pgtenant shares them.
    let proxy = start_proxy(|c| c.users[0].pool_size = 1).await;
    let a = proxy.connect(Some(7)).await;
    let b = proxy.connect(Some(7)).await;
    a.batch_execute("DROP TABLE IF EXISTS stale_plan_t; CREATE TABLE stale_plan_t (tenant_id bigint, a int)")
        .await
        .unwrap();
    let text = "SELECT * FROM stale_plan_t";
    let old_a = a.prepare(text).await.unwrap();
    let old_b = b.prepare(text).await.unwrap();
    assert!(a.query(&old_a, &[]).await.unwrap().is_empty());
    a.batch_execute("ALTER TABLE stale_plan_t ADD COLUMN b int; INSERT INTO stale_plan_t VALUES (7, 1, 2)")
        .await
        .unwrap();
    // As on PostgreSQL: a statement prepared before the change is refused, ...
    for (client, old) in [(&a, &old_a), (&b, &old_b)] {
        let err = client.query(old, &[]).await.unwrap_err();
        assert_eq!(harness::sqlstate(&err), "0A000", "{err:?}");
    }
    // ... and one prepared again (asyncpg and pgJDBC do it on that error) sees the new
    // columns, although the server connection still holds the old one under its name.
    for client in [&a, &b, &proxy.connect(Some(7)).await] {
        let rows = client.query(&client.prepare(text).await.unwrap(), &[]).await.unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].len(), 3, "the new column is there");
        assert_eq!(rows[0].get::<_, Option<i32>>(2), Some(2));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_connection_keeps_a_bounded_number_of_prepared_statements() {
    let proxy = start_proxy(|c| {
        c.users[0].pool_size = 1;
        c.proxy.max_prepared_statements = 4;
    })
    .await;
    let client = proxy.connect(Some(7)).await;
    // On the one server connection, through the simple protocol (which prepares nothing).
    let on_server = || async {
        let rows = client.simple_query("SELECT count(*) FROM pg_prepared_statements").await.unwrap();
        match &rows[1] {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).unwrap().parse::<usize>().unwrap(),
            other => panic!("{other:?}"),
        }
    };
    let mut statements = Vec::new();
    for n in 0..12 {
        statements.push(client.prepare_typed(&format!("SELECT $1 + {n}"), &[Type::INT4]).await.unwrap());
    }
    for round in 0..2 {
        for (n, stmt) in statements.iter().enumerate() {
            let row = client.query_one(stmt, &[&100i32]).await.unwrap();
            assert_eq!(row.get::<_, i32>(0), 100 + n as i32, "round {round}");
            let prepared = on_server().await;
            assert!(prepared <= 4, "{prepared} statements prepared on the server");
        }
    }
    // The most recently used stay: running the last ones again prepares nothing new.
    client.query_one(&statements[11], &[&1i32]).await.unwrap();
    assert_eq!(on_server().await, 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn typed_parameters_and_transactions() {
    let proxy = start_proxy(|c| c.users[0].pool_size = 2).await;
    let mut client = proxy.connect(Some(1500)).await;
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS typed_t (tenant_id bigint, b bool, f float8, t text, n numeric, ts timestamptz, j jsonb, a int[])")
        .await
        .unwrap();
    client.batch_execute("DELETE FROM typed_t").await.unwrap();
    let tx = client.transaction().await.unwrap();
    let ts = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
    let json = serde_json::json!({"k": [1, 2]});
    tx.execute(
        "INSERT INTO typed_t VALUES ($1, $2, $3, $4, 12.5, $5, $6, $7)",
        &[&1500i64, &true, &2.5f64, &"héllo", &ts, &json, &vec![1i32, 2, 3]],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let row = client.query_one("SELECT b, f, t, n::text, ts, j, a FROM typed_t", &[]).await.unwrap();
    assert!(row.get::<_, bool>(0));
    assert_eq!(row.get::<_, f64>(1), 2.5);
    assert_eq!(row.get::<_, String>(2), "héllo");
    assert_eq!(row.get::<_, String>(3), "12.5");
    assert_eq!(row.get::<_, std::time::SystemTime>(4), ts);
    assert_eq!(row.get::<_, serde_json::Value>(5), json);
    assert_eq!(row.get::<_, Vec<i32>>(6), vec![1, 2, 3]);

    let tx = client.transaction().await.unwrap();
    tx.execute("INSERT INTO typed_t (tenant_id) VALUES (1500)", &[]).await.unwrap();
    tx.rollback().await.unwrap();
    let n: i64 = client.query_one("SELECT count(*) FROM typed_t", &[]).await.unwrap().get(0);
    assert_eq!(n, 1, "the rolled back insert is gone");
}

#[tokio::test(flavor = "multi_thread")]
async fn binary_copy_in_and_out() {
    let proxy = start_proxy(|_| {}).await;
    let client = proxy.connect(Some(42)).await;
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS bin_copy (id int, label text); TRUNCATE bin_copy")
        .await
        .unwrap();
    let sink = client.copy_in("COPY bin_copy (id, label) FROM STDIN (FORMAT binary)").await.unwrap();
    let writer = BinaryCopyInWriter::new(sink, &[Type::INT4, Type::TEXT]);
    pin_mut!(writer);
    for i in 0..2000i32 {
        writer.as_mut().write(&[&i, &format!("label {i}")]).await.unwrap();
    }
    assert_eq!(writer.finish().await.unwrap(), 2000);
    let stream = client
        .copy_out("COPY (SELECT id, label FROM bin_copy ORDER BY id) TO STDOUT (FORMAT binary)")
        .await
        .unwrap();
    let rows = BinaryCopyOutStream::new(stream, &[Type::INT4, Type::TEXT]);
    pin_mut!(rows);
    let mut n = 0;
    while let Some(row) = rows.next().await {
        let row = row.unwrap();
        assert_eq!(row.get::<i32>(0), n);
        assert_eq!(row.get::<&str>(1), format!("label {n}"));
        n += 1;
    }
    assert_eq!(n, 2000);
    // Text COPY through the sink API as well.
    let sink = client.copy_in("COPY bin_copy FROM STDIN").await.unwrap();
    pin_mut!(sink);
    sink.send(bytes::Bytes::from_static(b"5000\tfive thousand\n")).await.unwrap();
    assert_eq!(sink.finish().await.unwrap(), 1);
    assert_eq!(shard_of(&client).await, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn flush_without_sync_gets_answers() {
    use bytes::BytesMut;
    use postgres_protocol::message::frontend;
    let proxy = start_proxy(|c| c.users[0].pool_size = 2).await;
    let mut c =
        crate::harness::raw::RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")]).await;
    // Parse + Describe + Flush: the answers must come without a Sync.
    let mut out = BytesMut::new();
    frontend::parse("flushed", "SELECT $1::int + 1", [23u32], &mut out).unwrap();
    frontend::describe(b'S', "flushed", &mut out).unwrap();
    frontend::flush(&mut out);
    c.send(&out).await;
    let tags: Vec<u8> = [c.recv().await.unwrap(), c.recv().await.unwrap(), c.recv().await.unwrap()]
        .iter()
        .map(|m| m.tag)
        .collect();
    assert_eq!(tags, b"1tT");
    // Then Bind/Execute/Sync on the same statement.
    let mut out = BytesMut::new();
    frontend::bind(
        "",
        "flushed",
        [0i16],
        [Some(&b"41"[..])],
        |v: Option<&[u8]>, buf: &mut BytesMut| {
            buf.extend_from_slice(v.unwrap());
            Ok::<_, Box<dyn std::error::Error + Sync + Send>>(postgres_protocol::IsNull::No)
        },
        [0i16],
        &mut out,
    )
    .map_err(|_| "bind")
    .unwrap();
    frontend::execute("", 0, &mut out).unwrap();
    frontend::sync(&mut out);
    c.send(&out).await;
    let msgs = c.until_ready().await;
    assert_eq!(crate::harness::raw::first_column(&msgs), vec!["42"]);
}

/// Parse, Bind and Execute of `sql` (unnamed), then `end` (Flush or Sync), as a pipeline sends them.
fn pipelined(sql: &str, end: fn(&mut bytes::BytesMut)) -> bytes::BytesMut {
    crate::harness::raw::unnamed_request(sql, None, end)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pipeline_that_sends_on_after_an_error_gets_its_answers() {
    use postgres_protocol::message::frontend;
    let proxy = start_proxy(|c| c.users[0].pool_size = 1).await;
    let mut c =
        crate::harness::raw::RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")]).await;
    assert_eq!(crate::harness::raw::first_column(&c.query("BEGIN; SELECT 1").await), ["1"]);
    // The error arrives before the client has sent the rest of its pipeline and the Sync.
    c.send(&pipelined("SELECT 1/0", frontend::flush)).await;
    let mut tags = Vec::new();
    while tags.last() != Some(&b'E') {
        tags.push(c.recv().await.expect("answers").tag);
    }
    assert_eq!(tags, b"1E", "1/0 fails as the Bind plans it");
    // The server skips everything up to the Sync, and so must pgtenant's expectations.
    c.send(&pipelined("SELECT 2", frontend::sync)).await;
    let msgs = tokio::time::timeout(Duration::from_secs(5), c.until_ready()).await.expect("ReadyForQuery");
    let tags: Vec<u8> = msgs.iter().map(|m| m.tag).collect();
    assert_eq!(tags, b"Z");
    assert_eq!(msgs[0].body, b"E", "in a failed transaction");
    c.query("ROLLBACK").await;
    assert_eq!(crate::harness::raw::first_column(&c.query("SELECT 3").await), ["3"]);

    // A Flush after a pipeline's Sync (psycopg sends one) opens no request: the server
    // connection goes back to the pool, and the only one serves another client at once.
    c.send(&pipelined("SELECT 4", frontend::sync)).await;
    c.send(&{
        let mut out = bytes::BytesMut::new();
        frontend::flush(&mut out);
        out
    })
    .await;
    assert_eq!(crate::harness::raw::first_column(&c.until_ready().await), ["4"]);
    let other = proxy.connect(Some(8)).await;
    let started = std::time::Instant::now();
    other.batch_execute("SELECT 1").await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2), "waited {:?} for the connection", started.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn deallocate_of_a_protocol_level_statement_works_as_on_a_server() {
    use crate::harness::raw::{first_column, sqlstate};
    use postgres_protocol::message::frontend;
    let proxy = start_proxy(|c| c.users[0].pool_size = 2).await;
    let mut c =
        crate::harness::raw::RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")]).await;
    let prepare = |sql: &str| {
        let mut out = bytes::BytesMut::new();
        frontend::parse("a1", sql, [], &mut out).unwrap();
        frontend::sync(&mut out);
        out
    };
    // Bind a1 and Execute it, without the Sync.
    let run_unsynced = |out: &mut bytes::BytesMut| {
        frontend::bind(
            "a1",
            "a1",
            [],
            std::iter::empty::<()>(),
            |_, _| Ok(postgres_protocol::IsNull::Yes),
            [0i16],
            out,
        )
        .map_err(|_| "bind")
        .unwrap();
        frontend::execute("a1", 0, out).unwrap();
    };
    let run = || {
        let mut out = bytes::BytesMut::new();
        run_unsynced(&mut out);
        frontend::sync(&mut out);
        out
    };
    // Parse, Bind, Describe and Execute of an unnamed statement, without the Sync.
    let unnamed = |sql: &str, out: &mut bytes::BytesMut| {
        frontend::parse("", sql, [], out).unwrap();
        crate::harness::raw::bind_unnamed(out);
        frontend::describe(b'P', "", out).unwrap();
        frontend::execute("", 0, out).unwrap();
    };
    let alone = |sql: &str| {
        let mut out = bytes::BytesMut::new();
        unnamed(sql, &mut out);
        frontend::sync(&mut out);
        out
    };
    let deallocated = |msgs: &[crate::harness::raw::Msg]| {
        assert_eq!(sqlstate(msgs), None, "{msgs:?}");
        assert!(msgs.iter().any(|m| m.tag == b'C' && m.body.starts_with(b"DEALLOCATE")), "{msgs:?}");
    };
    c.request(&prepare("SELECT 1")).await;
    assert_eq!(first_column(&c.request(&run()).await), ["1"]);
    // As Rails does when its statement cache lets a statement go.
    deallocated(&c.query("DEALLOCATE a1").await);
    let msgs = c.request(&run()).await;
    assert_eq!(sqlstate(&msgs), Some("26000".to_string()), "gone: {msgs:?}");
    // The name is free again.
    c.request(&prepare("SELECT 2")).await;
    assert_eq!(first_column(&c.request(&run()).await), ["2"]);
    let msgs = c.query("DEALLOCATE nosuch").await;
    assert_eq!(sqlstate(&msgs), Some("26000".to_string()), "{msgs:?}");

    // Through the extended protocol, amid other statements of one request: psycopg 3 in a
    // pipeline (with a libpq before 17) lets a statement go this way.
    let mut pipeline = bytes::BytesMut::new();
    run_unsynced(&mut pipeline);
    unnamed("DEALLOCATE a1", &mut pipeline);
    unnamed("SELECT 3", &mut pipeline);
    frontend::sync(&mut pipeline);
    let msgs = c.request(&pipeline).await;
    deallocated(&msgs);
    assert_eq!(first_column(&msgs), ["2", "3"]);
    let tags: Vec<_> = msgs
        .iter()
        .filter(|m| m.tag == b'C')
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect();
    assert_eq!(tags, ["SELECT 1\0", "DEALLOCATE\0", "SELECT 1\0"]);
    let msgs = c.request(&run()).await;
    assert_eq!(sqlstate(&msgs), Some("26000".to_string()), "gone: {msgs:?}");
    // A name pgtenant does not know is the server's business, as before.
    let msgs = c.request(&alone("DEALLOCATE nosuch")).await;
    assert_eq!(sqlstate(&msgs), Some("26000".to_string()), "{msgs:?}");
    // The same DEALLOCATE as a request of its own (the shape pgtenant copies to a server
    // straight from its read buffer when the statement is the server's).
    c.request(&prepare("SELECT 4")).await;
    assert_eq!(first_column(&c.request(&run()).await), ["4"]);
    deallocated(&c.request(&alone("DEALLOCATE a1")).await);
    let msgs = c.request(&run()).await;
    assert_eq!(sqlstate(&msgs), Some("26000".to_string()), "gone: {msgs:?}");
}

/// A request pgtenant answers itself (here a tenant SET, refused) waits for the answers the
/// server still owes before it. While it waits, the client may leave: its session
/// must end then, not when the server's statement does, and its server connection go.
/// With a pool of one, the next client is served at once (before the change it waited
/// for the 20-second statement and its checkout timed out).
#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_leaves_while_pgtenant_awaits_its_answers_frees_its_server() {
    use bytes::BytesMut;
    use postgres_protocol::message::frontend;
    for mode in [PoolMode::Transaction, PoolMode::Session] {
        let proxy = start_proxy(|c| {
            c.proxy.pool_mode = mode;
            c.users[0].pool_size = 1;
            c.proxy.checkout_timeout_ms = 3_000;
        })
        .await;
        let mut c =
            crate::harness::raw::RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")])
                .await;
        let mut out = BytesMut::new();
        frontend::query("SELECT pg_sleep(20)", &mut out).unwrap();
        frontend::query("SET pgtenant.tenant_id = 8", &mut out).unwrap();
        c.send(&out).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop(c);
        let next = proxy.connect(Some(7)).await;
        let row = next
            .query_one("SELECT 'served'::text", &[])
            .await
            .expect("the pool's one connection is free again");
        assert_eq!(row.get::<_, String>(0), "served", "{mode:?}");
        proxy.shutdown().await;
    }
}

/// A client that leaves while its request waits (for the one connection of a full pool,
/// or held by an admin PAUSE) is gone at once: its session ends and its place in the
/// line is given back. Before, both lasted until the wait timed out (20 s and 60 s here),
/// the console listed it as waiting all along, and its place counted in the line. An
/// admin's KILL of a waiting client ends it at once too (before, when the wait ended).
#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_leaves_while_its_request_waits_is_gone_at_once() {
    use bytes::BytesMut;
    use postgres_protocol::message::frontend;
    let login = [("options", "-c pgtenant.tenant_id=7")];
    // The same wait in both protocols, and with a second request pipelined behind it.
    let mut simple = BytesMut::new();
    frontend::query("SELECT 'waiter'", &mut simple).unwrap();
    let mut extended = BytesMut::new();
    frontend::parse("", "SELECT 'waiter'", std::iter::empty(), &mut extended).unwrap();
    crate::harness::raw::bind_unnamed(&mut extended);
    frontend::execute("", 0, &mut extended).unwrap();
    frontend::sync(&mut extended);
    let mut pipelined = simple.clone();
    frontend::query("SELECT 'behind the waiter'", &mut pipelined).unwrap();
    let requests = [("simple", simple), ("extended", extended), ("pipelined", pipelined)];
    for mode in [PoolMode::Transaction, PoolMode::Session] {
        let proxy = start_proxy(|c| {
            c.proxy.pool_mode = mode;
            c.users[0].pool_size = 1;
            c.proxy.checkout_timeout_ms = 20_000;
        })
        .await;
        let console = harness::connect(&proxy.admin_conninfo()).await.unwrap();
        let holder = proxy.connect(Some(7)).await;
        holder.batch_execute("BEGIN; SELECT 1").await.unwrap();
        for (protocol, request) in &requests {
            let mut waiter = crate::harness::raw::RawClient::login(proxy.addr, &login).await;
            waiter.send(request).await;
            let waiting = eventually(Duration::from_secs(5), || async {
                harness::client_states(&console).await == ["active", "waiting"]
            })
            .await;
            assert!(waiting.is_some(), "{mode:?} {protocol}: {:?}", harness::client_states(&console).await);
            drop(waiter);
            let gone = eventually(Duration::from_secs(3), || async {
                harness::client_states(&console).await == ["active"]
            })
            .await;
            assert!(
                gone.is_some(),
                "{mode:?} {protocol}: still listed: {:?}",
                harness::client_states(&console).await
            );
            let pools = console.query("SHOW POOLS", &[]).await.unwrap();
            let waiting: i64 = pools.iter().map(|r| r.get::<_, i64>("cl_waiting")).sum();
            assert_eq!(waiting, 0, "{mode:?} {protocol}");

            // A waiting client an admin KILLs is ended at once, with the KILL's FATAL only.
            let mut killed = crate::harness::raw::RawClient::login(proxy.addr, &login).await;
            killed.send(request).await;
            let waiting = eventually(Duration::from_secs(5), || async {
                harness::client_states(&console).await == ["active", "waiting"]
            })
            .await;
            assert!(waiting.is_some(), "{mode:?} {protocol}: {:?}", harness::client_states(&console).await);
            let rows = console.query("SHOW CLIENTS", &[]).await.unwrap();
            let id: i64 =
                rows.iter().find(|r| r.get::<_, String>("state") == "waiting").map(|r| r.get("id")).unwrap();
            console.simple_query(&format!("KILL CLIENT {id}")).await.unwrap();
            let ended = tokio::time::timeout(Duration::from_secs(3), async {
                let mut seen = Vec::new();
                while let Some(m) = killed.recv().await {
                    seen.push(m);
                }
                seen
            })
            .await
            .unwrap_or_else(|_| panic!("{mode:?} {protocol}: the killed client was not ended within 3 s"));
            let errors: Vec<(u8, Option<String>)> = ended
                .iter()
                .filter(|m| m.tag == b'E' || m.tag == b'Z')
                .map(|m| (m.tag, m.sqlstate()))
                .collect();
            assert_eq!(errors, [(b'E', Some("57P01".to_string()))], "{mode:?} {protocol}");
        }
        holder.batch_execute("COMMIT").await.unwrap();
        drop(holder);
        let next = proxy.connect(Some(7)).await;
        let row = next.query_one("SELECT 'served'::text", &[]).await.expect("the connection is free");
        assert_eq!(row.get::<_, String>(0), "served", "{mode:?}");
        drop(next);

        // Held by a PAUSE of its shard, then gone.
        console.simple_query("PAUSE").await.unwrap();
        for (protocol, request) in &requests {
            let mut held = crate::harness::raw::RawClient::login(proxy.addr, &login).await;
            held.send(request).await;
            let paused = eventually(Duration::from_secs(5), || async {
                harness::client_states(&console).await == ["paused"]
            })
            .await;
            assert!(paused.is_some(), "{mode:?} {protocol}: {:?}", harness::client_states(&console).await);
            drop(held);
            let gone = eventually(Duration::from_secs(3), || async {
                harness::client_states(&console).await.is_empty()
            })
            .await;
            assert!(
                gone.is_some(),
                "{mode:?} {protocol}: still listed: {:?}",
                harness::client_states(&console).await
            );
        }
        console.simple_query("RESUME").await.unwrap();
        proxy.shutdown().await;
    }
}

/// While pgtenant awaits a server's answers for a request it answers itself, it keeps
/// at most a bounded part of them: a client that does not read a 200 MB result leaves
/// the server waiting to write (before the change, pgtenant read the whole result into
/// its memory). Once the client reads, everything arrives, then the SET's answer (a
/// refusal: the session is bound to its login tenant).
#[tokio::test(flavor = "multi_thread")]
async fn a_result_awaited_before_a_request_pgtenant_answers_is_not_buffered_whole() {
    use bytes::BytesMut;
    use postgres_protocol::message::frontend;
    for mode in [PoolMode::Transaction, PoolMode::Session] {
        let proxy = start_proxy(|c| c.proxy.pool_mode = mode).await;
        let mut c =
            crate::harness::raw::RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")])
                .await;
        let mut out = BytesMut::new();
        frontend::query(
            "SELECT repeat('x', 1 << 20) AS big_answer_unread FROM generate_series(1, 200)",
            &mut out,
        )
        .unwrap();
        frontend::query("SET pgtenant.tenant_id = 8", &mut out).unwrap();
        c.send(&out).await;
        let shard = crate::harness::shard_admin(1, "app").await;
        let waiting = eventually(Duration::from_secs(10), || async {
        let rows = shard
            .query(
                "SELECT state, coalesce(wait_event, '') FROM pg_stat_activity WHERE query LIKE '%AS big_answer_unread%' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap();
        rows.len() == 1 && rows[0].get::<_, String>(0) == "active" && rows[0].get::<_, String>(1) == "ClientWrite"
    })
    .await;
        // A moment more: the server stays blocked while the client does not read.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let state: String = shard
        .query_one(
            "SELECT state FROM pg_stat_activity WHERE query LIKE '%AS big_answer_unread%' AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
        assert!(
            waiting.is_some() && state == "active",
            "{mode:?}: the server wrote its whole answer into pgtenant"
        );
        let (mut rows, mut bytes) = (0, 0);
        loop {
            let m = c.recv().await.expect("the answer");
            match m.tag {
                b'D' => {
                    rows += 1;
                    bytes += m.body.len();
                }
                b'E' => panic!("{:?}", m.sqlstate()),
                b'Z' => break,
                _ => {}
            }
        }
        assert_eq!(rows, 200);
        assert!(bytes > 200 << 20, "{bytes}");
        // pgtenant's own answer (a session bound to its login tenant may not switch).
        let set = c.until_ready().await;
        assert_eq!(crate::harness::raw::sqlstate(&set).as_deref(), Some("42501"), "{set:?}");
        let tenant = c.query("SELECT current_setting('pgtenant.tenant_id')").await;
        assert_eq!(crate::harness::raw::first_column(&tenant), ["7"]);
        proxy.shutdown().await;
    }
}
