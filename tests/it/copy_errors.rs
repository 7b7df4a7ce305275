//! COPY FROM STDIN that the server ends early (issue 21): refused right after
//! CopyInResponse, a bad row early in a large COPY, CopyFail, inside a transaction and
//! a savepoint, another request in the middle of a COPY, through the simple and the
//! extended protocol. Each exchange runs
//! against PostgreSQL directly and through pgtenant in both pool modes, with the copy
//! data sent both before and after the server's answer arrived; the client must see
//! the same messages and its session must go on.

use bytes::BytesMut;
use postgres_protocol::message::frontend;

use crate::harness::raw::{RawClient, bind_unnamed};
use crate::harness::{shard_admin, shards, start_proxy};
use pgtenant::config::PoolMode;

/// What a step waits for after sending its bytes.
#[derive(Clone, Copy)]
enum Until {
    /// This many ReadyForQuery messages.
    Ready(usize),
    /// A CopyInResponse.
    CopyIn,
    /// Nothing: the next step is sent at once.
    Nothing,
}

/// The messages a client saw: tag, and the SQLSTATE, command tag or status that
/// tells them apart.
type Seen = Vec<String>;

async fn run(client: &mut RawClient, steps: &[(BytesMut, Until)]) -> Seen {
    let mut seen = Vec::new();
    for (bytes, until) in steps {
        client.send(bytes).await;
        let mut readies = 0;
        loop {
            match until {
                Until::Nothing => break,
                Until::Ready(n) if readies == *n => break,
                _ => {}
            }
            let Some(m) = client.recv().await else {
                seen.push("no answer within 10 s".to_string());
                return seen;
            };
            let text = String::from_utf8_lossy(&m.body);
            seen.push(match m.tag {
                b'E' => format!("E {}", m.sqlstate().unwrap_or_default()),
                b'C' => format!("C {}", text.trim_end_matches('\0')),
                b'Z' => format!("Z {}", m.body.first().map(|b| *b as char).unwrap_or('?')),
                b'D' => format!("D {}", text.get(6..).unwrap_or_default()),
                tag => (tag as char).to_string(),
            });
            match (m.tag, until) {
                (b'Z', _) => readies += 1,
                (b'G', Until::CopyIn) => break,
                _ => {}
            }
        }
    }
    seen
}

fn query(sql: &str) -> BytesMut {
    let mut b = BytesMut::new();
    frontend::query(sql, &mut b).unwrap();
    b
}

fn copy_data(rows: &[&str]) -> BytesMut {
    let mut b = BytesMut::new();
    for row in rows {
        frontend::CopyData::new(row.as_bytes()).unwrap().write(&mut b);
    }
    b
}

fn copy_done() -> BytesMut {
    let mut b = BytesMut::new();
    frontend::copy_done(&mut b);
    b
}

fn copy_fail(reason: &str) -> BytesMut {
    let mut b = BytesMut::new();
    frontend::copy_fail(reason, &mut b).unwrap();
    b
}

fn sync() -> BytesMut {
    let mut b = BytesMut::new();
    frontend::sync(&mut b);
    b
}

/// Parse, Bind, Execute and Sync of `sql` (unnamed), as libpq sends a COPY through
/// the extended protocol.
fn extended(sql: &str) -> BytesMut {
    let mut b = BytesMut::new();
    frontend::parse("", sql, std::iter::empty(), &mut b).unwrap();
    bind_unnamed(&mut b);
    frontend::execute("", 0, &mut b).unwrap();
    frontend::sync(&mut b);
    b
}

fn join(parts: &[BytesMut]) -> BytesMut {
    let mut b = BytesMut::new();
    for p in parts {
        b.extend_from_slice(p);
    }
    b
}

/// The last step of every script: the session answers a new query.
fn after() -> (BytesMut, Until) {
    (query("SELECT 'after'"), Until::Ready(1))
}

/// The exchanges, by name. `t` is a table the test made, empty and writable by app.
fn scripts(t: &str) -> Vec<(&'static str, Vec<(BytesMut, Until)>)> {
    let big: Vec<String> = (0..2000).map(|i| format!("7,row {i}\n")).collect();
    let mut bad_early: Vec<&str> = vec!["7,first\n", "not a number,second\n"];
    bad_early.extend(big.iter().map(String::as_str));
    let freeze = format!("COPY {t} FROM STDIN (FORMAT csv, FREEZE)");
    let csv = format!("COPY {t} FROM STDIN (FORMAT csv)");
    vec![
        (
            // The data arrives after the server's error and ReadyForQuery.
            "simple, refused after CopyInResponse, data after the answer",
            vec![
                (query(&freeze), Until::Ready(1)),
                (join(&[copy_data(&["7,m\n"]), copy_done()]), Until::Nothing),
                after(),
            ],
        ),
        (
            // As psql sends it: the data right after CopyInResponse.
            "simple, refused after CopyInResponse, data at once",
            vec![
                (query(&freeze), Until::CopyIn),
                (join(&[copy_data(&["7,m\n"]), copy_done()]), Until::Ready(1)),
                after(),
            ],
        ),
        (
            "simple, a bad row early in a large COPY",
            vec![
                (query(&csv), Until::CopyIn),
                (join(&[copy_data(&bad_early), copy_done()]), Until::Ready(1)),
                after(),
            ],
        ),
        (
            "simple, CopyFail",
            vec![
                (query(&csv), Until::CopyIn),
                (join(&[copy_data(&["7,a\n"]), copy_fail("the client gave up")]), Until::Ready(1)),
                after(),
            ],
        ),
        (
            "in a transaction and a savepoint",
            vec![
                (query(&format!("BEGIN; INSERT INTO {t} VALUES (7, 'kept'); SAVEPOINT s")), Until::Ready(1)),
                (query(&csv), Until::CopyIn),
                (join(&[copy_data(&["7,ok\n", "x,bad\n"]), copy_done()]), Until::Ready(1)),
                (query("SELECT 1"), Until::Ready(1)),
                (query("ROLLBACK TO SAVEPOINT s"), Until::Ready(1)),
                (query(&freeze), Until::Ready(1)),
                (join(&[copy_data(&["7,m\n"]), copy_done()]), Until::Nothing),
                (query("ROLLBACK TO SAVEPOINT s"), Until::Ready(1)),
                (query(&csv), Until::CopyIn),
                (join(&[copy_data(&["7,good\n"]), copy_done()]), Until::Ready(1)),
                (query(&format!("SELECT count(*) FROM {t}")), Until::Ready(1)),
                (query("ROLLBACK"), Until::Ready(1)),
                after(),
            ],
        ),
        (
            // libpq ends an extended-protocol COPY with CopyDone and a Sync.
            "extended, refused after CopyInResponse",
            vec![
                (extended(&freeze), Until::Ready(1)),
                (join(&[copy_data(&["7,m\n"]), copy_done(), sync()]), Until::Ready(1)),
                after(),
            ],
        ),
        (
            "extended, a bad row early",
            vec![
                (extended(&csv), Until::CopyIn),
                (join(&[copy_data(&bad_early), copy_done(), sync()]), Until::Ready(1)),
                after(),
            ],
        ),
        (
            "extended, CopyFail",
            vec![
                (extended(&csv), Until::CopyIn),
                (join(&[copy_data(&["7,a\n"]), copy_fail("the client gave up"), sync()]), Until::Ready(1)),
                after(),
            ],
        ),
        (
            "extended, a good COPY",
            vec![
                (extended(&csv), Until::CopyIn),
                (join(&[copy_data(&["7,a\n", "7,b\n"]), copy_done(), sync()]), Until::Ready(1)),
                (query(&format!("SELECT count(*) FROM {t}")), Until::Ready(1)),
                (query(&format!("TRUNCATE {t}")), Until::Ready(1)),
                after(),
            ],
        ),
    ]
}

async fn same_as_postgres(mode: PoolMode, table: &str) {
    let admin = shard_admin(1, "app").await;
    admin
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (tenant_id bigint, a text); \
             GRANT ALL ON {table} TO app"
        ))
        .await
        .unwrap();
    let direct_addr = format!("127.0.0.1:{}", shards().ports[0]).parse().unwrap();
    let proxy = start_proxy(|c| c.proxy.pool_mode = mode).await;
    for (name, steps) in scripts(table) {
        let mut direct = RawClient::login(direct_addr, &[]).await;
        let expected = run(&mut direct, &steps).await;
        assert_eq!(expected.last().map(String::as_str), Some("Z I"), "{name}, directly: {expected:?}");
        assert!(expected.contains(&"D after".to_string()), "{name}, directly: {expected:?}");
        for attempt in 0..3 {
            let mut client = RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")]).await;
            let seen = run(&mut client, &steps).await;
            assert_eq!(seen, expected, "{name}, {mode:?} pooling, attempt {attempt}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn copy_ended_early_by_the_server_answers_as_postgres_does_in_transaction_pooling() {
    same_as_postgres(PoolMode::Transaction, "copy_early_tx").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn copy_ended_early_by_the_server_answers_as_postgres_does_in_session_pooling() {
    same_as_postgres(PoolMode::Session, "copy_early_session").await;
}

/// Found by the session fuzz target: a request sent in the middle of a COPY FROM STDIN
/// (or right behind the COPY, in one write) hung the session: pgtenant waited for the
/// COPY's answer before passing the request on, and the server waited for copy data.
/// PostgreSQL fails the COPY on it (08P01) and then ends the connection (protocol
/// synchronization lost). Through pgtenant in transaction pooling the client sees the
/// 08P01 and gets its ReadyForQuery, and its session goes on, in both protocols; in
/// session pooling the session was its server's, and it ends as PostgreSQL's does.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_in_the_middle_of_a_copy_fails_the_copy_without_a_hang() {
    let t = "copy_interrupted";
    let admin = shard_admin(1, "app").await;
    admin
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {t}; CREATE TABLE {t} (tenant_id bigint, a text); GRANT ALL ON {t} TO app"
        ))
        .await
        .unwrap();
    let csv = format!("COPY {t} FROM STDIN (FORMAT csv)");
    let cases = [
        (
            "simple, a query in the middle",
            vec![(query(&csv), Until::CopyIn), (query("SELECT 1"), Until::Ready(1))],
        ),
        (
            // Both went to the server before its CopyInResponse came: each is answered.
            "simple, COPY and a query in one write",
            vec![(join(&[query(&csv), query("SELECT 1")]), Until::Ready(2))],
        ),
        (
            "extended, a request in the middle",
            vec![(extended(&csv), Until::CopyIn), (extended("SELECT 1"), Until::Ready(1))],
        ),
    ];
    let direct_addr = format!("127.0.0.1:{}", shards().ports[0]).parse().unwrap();
    let mut directly = Vec::new();
    for (name, steps) in &cases {
        let mut direct = RawClient::login(direct_addr, &[]).await;
        let seen = run(&mut direct, steps).await;
        assert!(seen.contains(&"E 08P01".to_string()), "{name}, directly: {seen:?}");
        directly.push(seen);
    }
    for mode in [PoolMode::Transaction, PoolMode::Session] {
        let proxy = start_proxy(|c| c.proxy.pool_mode = mode).await;
        for ((name, steps), direct) in cases.iter().zip(&directly) {
            let mut client = RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")]).await;
            let seen = run(&mut client, steps).await;
            if mode == PoolMode::Session {
                assert_eq!(&seen, direct, "{name}, {mode:?} pooling: as PostgreSQL");
                continue;
            }
            assert!(seen.contains(&"E 08P01".to_string()), "{name}, {mode:?} pooling: {seen:?}");
            assert!(seen.last().is_some_and(|s| s.starts_with('Z')), "{name}, {mode:?} pooling: {seen:?}");
            let (after, until) = after();
            let seen = run(&mut client, &[(after, until)]).await;
            assert!(seen.contains(&"D after".to_string()), "{name}, {mode:?} pooling, then: {seen:?}");
        }
        proxy.shutdown().await;
    }
}
