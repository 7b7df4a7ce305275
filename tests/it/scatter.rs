//! Scatter-gather (issue 25): `SELECT ... FROM all_shards.<table>` through the proxy
//! returns what the same statement returns on one PostgreSQL database holding the
//! union of the shards' rows (a reference database the test fills), in both protocols
//! (text rows through the simple protocol, binary values and types through the
//! extended one); the seed's query runs verbatim; a stopped shard fails a strict query
//! and leaves a partial one with a WARNING; a slow shard times out; a cancel reaches
//! every shard; what cannot be merged and who may not scatter are refused.

use std::time::{Duration, Instant};

use tokio_postgres::types::{FromSql, ToSql, Type};
use tokio_postgres::{Client, SimpleQueryMessage};

use crate::harness::{Proxy, connect, private_cluster, shard_admin, shards, sqlstate, start_proxy};
use pgtenant::dev::demo;

/// Rows of the test table on one shard: ids `from..=to`. Text in mixed case (collation
/// order), NULLs, NaN and infinities, int8 values whose total passes int8's range.
fn fill_sql(table: &str, from: i32, to: i32, shard: Option<i32>) -> String {
    let shard_col = shard.map(|s| format!(", {s}")).unwrap_or_default();
    format!(
        "INSERT INTO {table} SELECT g, g % 7,
            (ARRAY['active', 'Active', 'ACTIVE', 'closed', 'b', 'B'])[1 + g % 6],
            CASE WHEN g % 11 = 0 THEN NULL ELSE (g * 37) % 101 - 50 END,
            round(((g * 13) % 1000) / 7.0, 2),
            CASE WHEN g = 200 THEN 'NaN'::float8 WHEN g = 20 THEN 'Infinity'::float8 ELSE (g % 20) / 4.0 END,
            CASE WHEN g % 50 = 0 THEN 4000000000000000000 ELSE g * 1000 END,
            CASE WHEN g % 13 = 0 THEN NULL ELSE g % 3 <> 0 END,
            timestamptz '2026-01-01 00:00:00+00' + g * interval '5 hours',
            CASE WHEN g % 4 = 0 THEN NULL ELSE 'n' || g END{shard_col}
         FROM generate_series({from}, {to}) g"
    )
}

const COLUMNS: &str = "id int PRIMARY KEY, tenant_id bigint, kind text, score int, amount numeric(12,2), \
                       ratio float8, big bigint, flag bool, created_at timestamptz, note text";

/// The seed's table: sessions of users, some older than a day.
fn sessions_sql(table: &str, from: i32, to: i32, shard: Option<i32>) -> String {
    let shard_col = shard.map(|s| format!(", {s}")).unwrap_or_default();
    format!(
        "INSERT INTO {table} SELECT g, g % 5, now() - (g % 48) * interval '1 hour'{shard_col}
         FROM generate_series({from}, {to}) g"
    )
}

/// A table with a `shard_id` of its own (seed 003's tables have one: the shard a row was
/// written for, which is not the shard it is on after a move), a column whose name needs
/// quotes, and one named by a keyword PostgreSQL lets stand alone.
const OWNED_COLUMNS: &str = "id int, shard_id int, \"Kind\" text, status text";

fn owned_sql(from: i32, to: i32) -> String {
    format!(
        "INSERT INTO scatter_owned SELECT g, 10 + g % 3, (ARRAY['x', 'X', 'y'])[1 + g % 3],
            (ARRAY['open', 'done', NULL, 'Open'])[1 + g % 4]
         FROM generate_series({from}, {to}) g"
    )
}

/// Fills both shared shards and the reference database (on shard 1's cluster) once;
/// a connection to the reference database.
async fn tables() -> Client {
    static FILLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    FILLED
        .get_or_init(|| async {
            let ranges = [(1, 150), (151, 300)];
            for (i, (from, to)) in ranges.iter().enumerate() {
                let shard = shard_admin(i + 1, "app").await;
                shard
                    .batch_execute(&format!(
                        "DROP TABLE IF EXISTS scatter_events; CREATE TABLE scatter_events ({COLUMNS});
                         {};
                         DROP TABLE IF EXISTS user_sessions;
                         CREATE TABLE user_sessions (id int, user_id int, created_at timestamptz);
                         {};
                         DROP TABLE IF EXISTS scatter_owned;
                         CREATE TABLE scatter_owned ({OWNED_COLUMNS});
                         {};",
                        fill_sql("scatter_events", *from, *to, None),
                        sessions_sql("user_sessions", *from, *to, None),
                        owned_sql(*from, *to)
                    ))
                    .await
                    .expect("shard table");
            }
            let postgres = shard_admin(1, "postgres").await;
            let _ = postgres.batch_execute("CREATE DATABASE scatter_reference").await;
            let reference = shard_admin(1, "scatter_reference").await;
            let mut sql = format!(
                "DROP TABLE IF EXISTS scatter_events; CREATE TABLE scatter_events ({COLUMNS}, shard_id int);
                 DROP TABLE IF EXISTS user_sessions;
                 CREATE TABLE user_sessions (id int, user_id int, created_at timestamptz, shard_id int);
                 DROP TABLE IF EXISTS scatter_owned; CREATE TABLE scatter_owned ({OWNED_COLUMNS});"
            );
            for (i, (from, to)) in ranges.iter().enumerate() {
                let shard = Some(i as i32 + 1);
                sql.push_str(&format!(
                    "{}; {}; {};",
                    fill_sql("scatter_events", *from, *to, shard),
                    sessions_sql("user_sessions", *from, *to, shard),
                    owned_sql(*from, *to)
                ));
            }
            reference.batch_execute(&sql).await.expect("reference table");
        })
        .await;
    shard_admin(1, "scatter_reference").await
}

fn admin_conninfo(proxy: &Proxy, extra: &str) -> String {
    format!(
        "host=127.0.0.1 port={} user={} password={} dbname=app sslmode=disable {extra}",
        proxy.addr.port(),
        demo::ADMIN_USER,
        demo::ADMIN_PASSWORD
    )
}

async fn admin(proxy: &Proxy) -> Client {
    connect(&admin_conninfo(proxy, "")).await.expect("admin connects to app")
}

/// Any value as its raw bytes (binary format), NULL as `None`.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Clone)]
struct Raw(Option<Vec<u8>>);

impl<'a> FromSql<'a> for Raw {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Raw(Some(raw.to_vec())))
    }
    fn from_sql_null(_: &Type) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Raw(None))
    }
    fn accepts(_: &Type) -> bool {
        true
    }
}

/// Column names and types, and the rows' binary values (extended protocol).
async fn extended(
    client: &Client,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<(Vec<(String, Type)>, Vec<Vec<Raw>>), tokio_postgres::Error> {
    let statement = client.prepare(sql).await?;
    let columns = statement.columns().iter().map(|c| (c.name().to_string(), c.type_().clone())).collect();
    let rows = client.query(&statement, params).await?;
    let values = rows.iter().map(|r| (0..r.len()).map(|i| r.get::<_, Raw>(i)).collect()).collect();
    Ok((columns, values))
}

/// Column names and the rows' text values (simple protocol), and the command tag.
async fn simple(
    client: &Client,
    sql: &str,
) -> Result<(Vec<String>, Vec<Vec<Option<String>>>, u64), tokio_postgres::Error> {
    let mut names = Vec::new();
    let mut rows = Vec::new();
    let mut tag = u64::MAX;
    for message in client.simple_query(sql).await? {
        match message {
            SimpleQueryMessage::Row(row) => {
                names = row.columns().iter().map(|c| c.name().to_string()).collect();
                rows.push((0..row.len()).map(|i| row.get(i).map(str::to_string)).collect());
            }
            SimpleQueryMessage::RowDescription(cols) => {
                names = cols.iter().map(|c| c.name().to_string()).collect();
            }
            SimpleQueryMessage::CommandComplete(n) => tag = n,
            _ => {}
        }
    }
    Ok((names, rows, tag))
}

/// The statements compared, and whether their ORDER BY fixes the row order.
const QUERIES: &[(&str, bool)] = &[
    ("SELECT id, kind, score FROM all_shards.scatter_events WHERE score > 10", false),
    ("SELECT count(*) FROM all_shards.scatter_events", true),
    (
        "SELECT count(*), count(score), sum(score), min(score), max(score), avg(score) FROM all_shards.scatter_events",
        true,
    ),
    ("SELECT sum(amount), avg(amount), min(amount), max(amount) FROM all_shards.scatter_events", true),
    ("SELECT sum(big), avg(big), max(big) FROM all_shards.scatter_events", true),
    (
        "SELECT max(ratio), min(ratio), sum(ratio), avg(ratio) FROM all_shards.scatter_events WHERE id <> 200",
        true,
    ),
    ("SELECT max(ratio), sum(ratio) FROM all_shards.scatter_events", true),
    ("SELECT bool_and(flag), bool_or(flag), every(score > -100) FROM all_shards.scatter_events", true),
    ("SELECT kind, count(*), sum(score) FROM all_shards.scatter_events GROUP BY kind ORDER BY kind", true),
    (
        "SELECT shard_id, count(*) AS n FROM all_shards.scatter_events GROUP BY shard_id ORDER BY shard_id",
        true,
    ),
    (
        "SELECT tenant_id % 3 AS t3, count(*) FROM all_shards.scatter_events GROUP BY 1 ORDER BY 2 DESC, 1",
        true,
    ),
    ("SELECT lower(kind) AS kind, count(*) FROM all_shards.scatter_events GROUP BY kind ORDER BY 1, 2", true),
    ("SELECT lower(kind) AS lk, count(*) FROM all_shards.scatter_events GROUP BY lk ORDER BY lk", true),
    (
        "SELECT kind, count(*) FROM all_shards.scatter_events GROUP BY kind HAVING sum(score) > 100 ORDER BY kind",
        true,
    ),
    ("SELECT count(*) FROM all_shards.scatter_events HAVING count(*) > 1000", true),
    (
        "SELECT count(*), sum(score), avg(score), max(kind), bool_and(flag) FROM all_shards.scatter_events WHERE id < 0",
        true,
    ),
    ("SELECT kind, count(*) FROM all_shards.scatter_events WHERE id < 0 GROUP BY kind", true),
    ("SELECT id, kind FROM all_shards.scatter_events ORDER BY kind DESC, id LIMIT 7", true),
    ("SELECT id, score FROM all_shards.scatter_events ORDER BY score NULLS FIRST, id LIMIT 5 OFFSET 3", true),
    ("SELECT id, score FROM all_shards.scatter_events ORDER BY score DESC NULLS LAST, id OFFSET 290", true),
    ("SELECT id, ratio FROM all_shards.scatter_events ORDER BY ratio DESC, id LIMIT 4", true),
    ("SELECT id, score * -1 AS score FROM all_shards.scatter_events ORDER BY score, id LIMIT 5", true),
    ("SELECT id, note FROM all_shards.scatter_events ORDER BY note, id LIMIT 5", true),
    ("SELECT DISTINCT kind FROM all_shards.scatter_events ORDER BY kind", true),
    ("SELECT DISTINCT tenant_id FROM all_shards.scatter_events", false),
    ("SELECT count(DISTINCT tenant_id), count(*) FROM all_shards.scatter_events", true),
    (
        "SELECT kind, count(DISTINCT tenant_id) FROM all_shards.scatter_events GROUP BY kind ORDER BY kind",
        true,
    ),
    (
        "SELECT count(*) FILTER (WHERE flag), sum(score) FILTER (WHERE kind = 'b') FROM all_shards.scatter_events",
        true,
    ),
    (
        "SELECT date_trunc('day', created_at) AS day, count(*) FROM all_shards.scatter_events GROUP BY 1 ORDER BY 1 LIMIT 3",
        true,
    ),
    (
        "SELECT kind, round(avg(score), 2), max(score) - min(score) AS spread FROM all_shards.scatter_events \
         GROUP BY kind ORDER BY spread DESC, kind",
        true,
    ),
    ("SELECT * FROM all_shards.scatter_events WHERE shard_id > 0 ORDER BY id LIMIT 3", true),
    (
        "SELECT kind, sum(score) FROM all_shards.scatter_events GROUP BY kind ORDER BY sum(score) DESC LIMIT 2",
        true,
    ),
    ("SELECT e.kind, max(e.id) FROM all_shards.scatter_events AS e GROUP BY e.kind ORDER BY 2", true),
    ("SELECT id FROM all_shards.scatter_events WHERE shard_id = 2 AND id % 50 = 0", false),
    // The table's own shard_id is the one read, in every position.
    ("SELECT shard_id, COUNT(*) FROM all_shards.scatter_owned GROUP BY shard_id ORDER BY shard_id", true),
    ("SELECT shard_id, id FROM all_shards.scatter_owned WHERE shard_id = 11 AND id % 20 = 0", false),
    ("SELECT * FROM all_shards.scatter_owned ORDER BY shard_id DESC, id LIMIT 4", true),
    ("SELECT DISTINCT shard_id FROM all_shards.scatter_owned ORDER BY 1", true),
    // One column however it is spelled; a quoted capital is another.
    (r#"SELECT "status", count(*) FROM all_shards.scatter_owned GROUP BY status ORDER BY "status""#, true),
    (r#"SELECT DISTINCT "status" FROM all_shards.scatter_owned ORDER BY STATUS"#, true),
    (
        r#"SELECT Status, "Kind", count(*), max(ID) FROM all_shards.scatter_owned GROUP BY "Kind", "status" ORDER BY status, "Kind""#,
        true,
    ),
    (r#"SELECT o."Kind", min(o.id) FROM all_shards.scatter_owned AS O GROUP BY O."Kind" ORDER BY 1"#, true),
];

fn on_reference(sql: &str) -> String {
    sql.replace("all_shards.", "")
}

fn sorted<T: Ord>(mut rows: Vec<T>, ordered: bool) -> Vec<T> {
    if !ordered {
        rows.sort();
    }
    rows
}

#[tokio::test(flavor = "multi_thread")]
async fn every_construct_matches_one_database_in_both_protocols() {
    // With connections to spare, and with one per pool, where the coordinator runs its
    // own shard's part itself (INSERT ... SELECT into its table).
    for pool_size in [20, 1] {
        every_construct_matches_with(pool_size).await;
    }
}

async fn every_construct_matches_with(pool_size: usize) {
    let reference = tables().await;
    let proxy = start_proxy(move |c| {
        c.users.iter_mut().find(|u| u.name == demo::ADMIN_USER).unwrap().pool_size = pool_size;
    })
    .await;
    let client = admin(&proxy).await;
    for (sql, ordered) in QUERIES {
        let (names, rows, tag) = simple(&client, sql).await.unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        let (ref_names, ref_rows, ref_tag) = simple(&reference, &on_reference(sql)).await.unwrap();
        assert_eq!(names, ref_names, "{sql}: column names");
        assert_eq!(sorted(rows, *ordered), sorted(ref_rows, *ordered), "{sql}: text rows");
        assert_eq!(tag, ref_tag, "{sql}: SELECT <rows> tag");

        let (columns, values) = extended(&client, sql, &[]).await.unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        let (ref_columns, ref_values) = extended(&reference, &on_reference(sql), &[]).await.unwrap();
        assert_eq!(columns, ref_columns, "{sql}: names and types");
        assert_eq!(sorted(values, *ordered), sorted(ref_values, *ordered), "{sql}: binary values");
    }
    // Parameters, in the WHERE pushed to the shards and in the LIMIT/OFFSET applied at the end.
    let with_params: &[(&str, &[&(dyn ToSql + Sync)])] = &[
        (
            "SELECT kind, count(*) FROM all_shards.scatter_events WHERE score > $1 GROUP BY kind ORDER BY kind LIMIT $2",
            &[&0i32, &3i64],
        ),
        (
            "SELECT id, kind FROM all_shards.scatter_events WHERE tenant_id = $1 ORDER BY id LIMIT $2 OFFSET $3",
            &[&3i64, &4i64, &2i64],
        ),
        (
            "SELECT id FROM all_shards.scatter_events WHERE kind = $1 ORDER BY id LIMIT $2",
            &[&"b", &None::<i64>],
        ),
    ];
    for (sql, params) in with_params {
        let got = extended(&client, sql, params).await.unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        let want = extended(&reference, &on_reference(sql), params).await.unwrap();
        assert_eq!(got, want, "{sql}");
    }
    // Unordered plain rows stream from both shards.
    let (_, rows, _) = simple(&client, "SELECT id FROM all_shards.scatter_events").await.unwrap();
    assert_eq!(rows.len(), 300);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_seed_query_runs_verbatim() {
    let reference = tables().await;
    let proxy = start_proxy(|_| {}).await;
    let client = admin(&proxy).await;
    let sql = "SELECT shard_id, COUNT(*) AS session_count FROM all_shards.user_sessions WHERE created_at > NOW() - \
               INTERVAL '1 day' GROUP BY shard_id";
    let rows = client.query(sql, &[]).await.unwrap();
    let mut got: Vec<(i32, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    got.sort();
    let want: Vec<(i32, i64)> = reference
        .query(&format!("{} ORDER BY 1", on_reference(sql)), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(got, want);
    assert_eq!(got.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![1, 2], "one row per shard");
    assert!(got.iter().all(|(_, n)| *n > 0 && *n < 150), "only the last day's sessions: {got:?}");
    // The same through psql.
    let out = crate::harness::run_with_stdin(
        std::process::Command::new("psql").args([
            "-X",
            "-A",
            "-t",
            "-d",
            &admin_conninfo(&proxy, ""),
            "-c",
            sql,
        ]),
        "",
    );
    let mut lines: Vec<String> = crate::harness::stdout(&out).lines().map(str::to_string).collect();
    lines.sort();
    let want_lines: Vec<String> = got.iter().map(|(s, n)| format!("{s}|{n}")).collect();
    assert_eq!(lines, want_lines, "psql: {}", crate::harness::stderr(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn what_cannot_be_merged_and_who_may_not_scatter_are_refused() {
    tables().await;
    let proxy = start_proxy(|_| {}).await;
    let client = admin(&proxy).await;
    let refused = [
        ("SELECT e.id FROM all_shards.scatter_events e JOIN accounts a ON a.id = e.id", "join"),
        ("SELECT rank() OVER (ORDER BY id) FROM all_shards.scatter_events", "window"),
        ("SELECT string_agg(kind, ',') FROM all_shards.scatter_events", "string_agg"),
        ("SELECT count(DISTINCT kind), count(DISTINCT tenant_id) FROM all_shards.scatter_events", "DISTINCT"),
        ("SELECT id FROM all_shards.scatter_events WHERE id IN (SELECT 1)", "subquery"),
        ("SELECT id FROM all_shards.scatter_events UNION SELECT 1", "UNION"),
        // PostgreSQL accepts it (kind depends on the primary key id); pgtenant cannot tell.
        ("SELECT id, kind, count(*) FROM all_shards.scatter_events GROUP BY id", "kind"),
        // Named by the construct, not by a column inside it.
        ("SELECT kind, count(*) FROM all_shards.scatter_events GROUP BY ROLLUP (kind)", "ROLLUP"),
        ("SELECT kind, count(*) FROM all_shards.scatter_events GROUP BY CUBE (kind, flag)", "CUBE"),
        (
            "SELECT kind, count(*) FROM all_shards.scatter_events GROUP BY GROUPING SETS ((kind), ())",
            "GROUPING SETS",
        ),
        // A row value cannot be shipped, and pgtenant's own names stay out of the message.
        ("SELECT count(DISTINCT (kind, flag)) FROM all_shards.scatter_events", "row value"),
        ("SELECT DISTINCT (kind, flag) FROM all_shards.scatter_events", "row value"),
    ];
    for (sql, named) in refused {
        for simple_protocol in [true, false] {
            let err = if simple_protocol {
                client.simple_query(sql).await.map(|_| ()).unwrap_err()
            } else {
                client.query(sql, &[]).await.map(|_| ()).unwrap_err()
            };
            assert_eq!(sqlstate(&err), "0A000", "{sql}: {err:?}");
            let message = err.as_db_error().unwrap().message().to_string();
            assert!(message.contains(named), "{sql}: {message}");
            assert!(!message.contains("__pgtenant"), "{sql}: {message}");
        }
    }
    // A write is refused, and a locking read.
    let err = client.simple_query("DELETE FROM all_shards.scatter_events").await.unwrap_err();
    assert_eq!(sqlstate(&err), "25006");
    let err = client.simple_query("SELECT id FROM all_shards.scatter_events FOR UPDATE").await.unwrap_err();
    assert_eq!(sqlstate(&err), "25006");
    // The statement's own errors are PostgreSQL's.
    let err = client.query("SELECT nope FROM all_shards.scatter_events", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "42703");
    let err = client
        .simple_query("SELECT kind, score FROM all_shards.scatter_events GROUP BY kind")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&err), "42803");
    // A bad policy value.
    let err = client.simple_query("SET pgtenant.scatter = 'sometimes'").await.unwrap_err();
    assert_eq!(sqlstate(&err), "22023");
    // The session goes on.
    let n: i64 =
        client.query_one("SELECT count(*) FROM all_shards.scatter_events", &[]).await.unwrap().get(0);
    assert_eq!(n, 300);

    // Not an admin: refused.
    let app = proxy.connect(None).await;
    let err = app.query("SELECT count(*) FROM all_shards.scatter_events", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501");
    // An admin session bound to a tenant: refused too.
    let bound = connect(&admin_conninfo(&proxy, "options='-c pgtenant.tenant_id=7'")).await.unwrap();
    let err = bound.simple_query("SELECT count(*) FROM all_shards.scatter_events").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reporting_user_may_scatter() {
    tables().await;
    let proxy = start_proxy(|c| {
        let app = c.users.iter_mut().find(|u| u.name == "app").unwrap();
        app.scatter_gather = true;
        app.server_user = Some("postgres".into());
    })
    .await;
    let app = proxy.connect(None).await;
    let n: i64 = app.query_one("SELECT count(*) FROM all_shards.scatter_events", &[]).await.unwrap().get(0);
    assert_eq!(n, 300);
}

/// A scatter-gather whose checkout on a shard waits behind a full pool ends when its
/// client hangs up, instead of when `checkout_timeout_ms` passes.
#[tokio::test(flavor = "multi_thread")]
async fn a_scatter_that_waits_for_a_shard_ends_when_its_client_leaves() {
    use postgres_protocol::message::frontend;
    tables().await;
    let proxy = start_proxy(|c| {
        let app = c.users.iter_mut().find(|u| u.name == "app").unwrap();
        app.scatter_gather = true;
        app.server_user = Some("postgres".into());
        app.pool_size = 1;
        c.proxy.checkout_timeout_ms = 20_000;
    })
    .await;
    let console = connect(&proxy.admin_conninfo()).await.unwrap();
    let listed = || async { crate::harness::client_states(&console).await.len() };
    let holder = proxy.connect(Some(7)).await;
    holder.batch_execute("BEGIN; SELECT 1").await.unwrap();
    let mut scatter = crate::harness::raw::RawClient::login(proxy.addr, &[]).await;
    let mut request = bytes::BytesMut::new();
    frontend::query("SELECT count(*) FROM all_shards.scatter_events", &mut request).unwrap();
    scatter.send(&request).await;
    let both = crate::harness::eventually(Duration::from_secs(5), || async { listed().await == 2 }).await;
    assert!(both.is_some(), "the holder and the scatter are listed: {}", listed().await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(scatter);
    let gone = crate::harness::eventually(Duration::from_secs(3), || async { listed().await == 1 }).await;
    assert!(gone.is_some(), "the scatter's session is still listed");
    holder.batch_execute("COMMIT").await.unwrap();
    drop(holder);
    // With one connection per pool, merged and streamed, in both protocols: each
    // statement holds one connection of each pool (before, a merged one waited for a
    // second connection of shard 1's pool, and a streamed simple query held the
    // probe's while it waited for shard 1's part).
    let app = proxy.connect(None).await;
    let n: i64 = app.query_one("SELECT count(*) FROM all_shards.scatter_events", &[]).await.unwrap().get(0);
    assert_eq!(n, 300, "the pool serves scatter-gathers again");
    for sql in [
        "SELECT count(*) FROM all_shards.scatter_events",
        "SELECT id FROM all_shards.scatter_events WHERE id IN (1, 300)",
    ] {
        let messages = app.simple_query(sql).await.unwrap();
        let mut values: Vec<String> = messages
            .iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                _ => None,
            })
            .collect();
        values.sort();
        let expected = if sql.contains("count") { vec!["300"] } else { vec!["1", "300"] };
        assert_eq!(values, expected, "{sql}");
    }
}

/// With one connection per pool, the coordinator (shard 1 here) runs its own shard's
/// part itself. When that part fails or runs past `scatter_timeout_ms`, the statement
/// fails naming shard 1 (strict), or leaves shard 1 out with a WARNING (partial), as
/// for any other shard; and the next statement runs normally.
#[tokio::test(flavor = "multi_thread")]
async fn the_coordinators_own_part_fails_and_times_out_as_any_part() {
    let proxy = start_proxy(|c| {
        c.proxy.scatter_timeout_ms = 1000;
        c.users.iter_mut().find(|u| u.name == demo::ADMIN_USER).unwrap().pool_size = 1;
    })
    .await;
    let (one, two) = (shard_admin(1, "app").await, shard_admin(2, "app").await);
    two.batch_execute("CREATE OR REPLACE VIEW scatter_own AS SELECT v FROM generate_series(1, 4) v")
        .await
        .unwrap();
    let (tx, mut notices) = tokio::sync::mpsc::unbounded_channel();
    let (client, conn) =
        tokio_postgres::connect(&admin_conninfo(&proxy, ""), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(async move {
        let mut conn = conn;
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        use futures_util::StreamExt;
        while let Some(Ok(tokio_postgres::AsyncMessage::Notice(n))) = messages.next().await {
            let _ = tx.send((n.code().code().to_string(), n.message().to_string()));
        }
    });
    let sql = "SELECT count(*), sum(v) FROM all_shards.scatter_own";
    let cases = [
        (
            "SELECT v / (v - v) AS v FROM generate_series(1, 3) v",
            "22012",
            "division by zero",
            "division by zero",
        ),
        (
            "SELECT v FROM generate_series(1, 3) v, pg_sleep(3)",
            "57014",
            "did not answer within 1000 ms",
            "no answer within 1000 ms",
        ),
    ];
    for (view, code, why, partial_why) in cases {
        one.batch_execute(&format!("CREATE OR REPLACE VIEW scatter_own AS {view}")).await.unwrap();
        client.batch_execute("SET pgtenant.scatter = strict").await.unwrap();
        let started = Instant::now();
        let err = client.query_one(sql, &[]).await.unwrap_err();
        assert_eq!(sqlstate(&err), code, "{err:?}");
        let message = err.as_db_error().unwrap().message().to_string();
        assert!(message.contains("shard 1") && message.contains(why), "{message}");
        assert!(started.elapsed() < Duration::from_millis(2500), "{code}: {:?}", started.elapsed());

        client.batch_execute("SET pgtenant.scatter = partial").await.unwrap();
        let row = client.query_one(sql, &[]).await.unwrap();
        assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (4, 10), "{code}: shard 2's rows only");
        let (warning, text) = notices.recv().await.expect("a warning");
        assert_eq!(warning, "01000");
        assert!(text.contains("shard 1 is missing") && text.contains(partial_why), "{text}");
    }
    one.batch_execute("CREATE OR REPLACE VIEW scatter_own AS SELECT v FROM generate_series(1, 3) v")
        .await
        .unwrap();
    client.batch_execute("SET pgtenant.scatter = strict").await.unwrap();
    let row = client.query_one(sql, &[]).await.unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (7, 16), "both shards again");
    assert!(notices.try_recv().is_err(), "no more warnings");
}

/// The proxy's `/metrics` page.
async fn metrics(proxy: &Proxy) -> String {
    crate::harness::http_get(proxy.http_addr().unwrap(), "/metrics").await.1
}

/// A proxy whose shard 2 is a cluster of the test's own, with the test table.
async fn proxy_with_private_shard(name: &str, timeout_ms: u64) -> (Proxy, pgtenant::dev::cluster::Cluster) {
    tables().await;
    let cluster = private_cluster(name, 2);
    let shard =
        connect(&format!("host=127.0.0.1 port={} user=postgres dbname=app", cluster.port)).await.unwrap();
    shard
        .batch_execute(&format!(
            "CREATE TABLE scatter_events ({COLUMNS}); {}",
            fill_sql("scatter_events", 151, 300, None)
        ))
        .await
        .unwrap();
    let port = cluster.port;
    let proxy = start_proxy(move |c| {
        c.shards[1].nodes[0].port = port;
        c.proxy.scatter_timeout_ms = timeout_ms;
        c.observe.listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    (proxy, cluster)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_shard_fails_a_strict_query_and_leaves_a_partial_one_with_a_warning() {
    let (proxy, cluster) = proxy_with_private_shard("scatter_stopped", 30_000).await;
    let client = admin(&proxy).await;
    let sql = "SELECT shard_id, count(*) FROM all_shards.scatter_events GROUP BY 1 ORDER BY 1";
    assert_eq!(client.query(sql, &[]).await.unwrap().len(), 2);
    cluster.stop().expect("stop shard 2");

    let err = client.query(sql, &[]).await.unwrap_err();
    let message = err.as_db_error().map(|e| e.message().to_string()).unwrap_or_default();
    assert!(message.contains("shard 2"), "strict names the shard: {message} ({err:?})");
    assert_eq!(sqlstate(&err), "08006");

    // Partial: shard 1's rows, and a WARNING naming shard 2 and why.
    let (tx, mut notices) = tokio::sync::mpsc::unbounded_channel();
    let (partial, conn) =
        tokio_postgres::connect(&admin_conninfo(&proxy, ""), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(async move {
        let mut conn = conn;
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        use futures_util::StreamExt;
        while let Some(Ok(tokio_postgres::AsyncMessage::Notice(n))) = messages.next().await {
            let _ = tx.send((n.severity().to_string(), n.code().code().to_string(), n.message().to_string()));
        }
    });
    partial.batch_execute("SET pgtenant.scatter = partial").await.unwrap();
    for simple_protocol in [true, false] {
        let rows: Vec<(i32, i64)> = if simple_protocol {
            let (_, rows, _) = simple(&partial, sql).await.unwrap();
            rows.iter()
                .map(|r| (r[0].as_ref().unwrap().parse().unwrap(), r[1].as_ref().unwrap().parse().unwrap()))
                .collect()
        } else {
            partial.query(sql, &[]).await.unwrap().iter().map(|r| (r.get(0), r.get(1))).collect()
        };
        assert_eq!(rows, vec![(1, 150)], "shard 1's rows only");
        let (severity, code, message) = notices.recv().await.expect("a warning");
        assert_eq!((severity.as_str(), code.as_str()), ("WARNING", "01000"));
        assert!(message.contains("partial") && message.contains("shard 2 is missing"), "{message}");
    }
    // Streamed rows too.
    let ids = partial.query("SELECT id FROM all_shards.scatter_events", &[]).await.unwrap();
    assert_eq!(ids.len(), 150);
    assert!(notices.recv().await.unwrap().2.contains("shard 2"));
    cluster.start().expect("restart shard 2");
    // The metrics count the queries, the failed one and the partial ones.
    let metrics = metrics(&proxy).await;
    let value = |name: &str| -> f64 {
        let line =
            metrics.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name} in {metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let outcome = |name: &str| value(&format!("pgtenant_scatter_statements_total{{outcome=\"{name}\"}}"));
    assert!(outcome("failed_by_shard") >= 1.0, "the strict query shard 2 failed");
    assert!(outcome("partial") >= 3.0);
    assert!(metrics.contains("pgtenant_scatter_shard_time_seconds_total{shard=\"1\"}"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_shard_times_out_and_a_cancel_reaches_every_shard() {
    let (proxy, _cluster) = proxy_with_private_shard("scatter_slow", 500).await;
    let client = admin(&proxy).await;
    let slow = "SELECT count(*) FROM all_shards.scatter_events \
                WHERE pg_sleep(CASE WHEN shard_id = 2 AND id = 151 THEN 3 ELSE 0 END) IS NOT NULL";
    let started = Instant::now();
    let err = client.query(slow, &[]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "57014", "{err:?}");
    assert!(err.as_db_error().unwrap().message().contains("shard 2"));
    assert!(started.elapsed() < Duration::from_millis(2500), "gave up at the timeout");
    client.batch_execute("SET pgtenant.scatter = partial").await.unwrap();
    let n: i64 = client.query_one(slow, &[]).await.unwrap().get(0);
    assert_eq!(n, 150, "shard 1's count alone");
    client.batch_execute("RESET pgtenant.scatter").await.unwrap();

    // A cancel stops every shard's part.
    let long = "SELECT count(*) FROM all_shards.scatter_events WHERE pg_sleep(CASE WHEN id IN (1, 151) THEN 20 ELSE 0 END) IS NOT NULL";
    let proxy_long = start_proxy(|c| c.proxy.scatter_timeout_ms = 60_000).await;
    let canceled = admin(&proxy_long).await;
    let token = canceled.cancel_token();
    let started = Instant::now();
    let run = tokio::spawn(async move {
        let r = canceled.query(long, &[]).await.map(|_| ());
        (r, canceled)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    token.cancel_query(tokio_postgres::NoTls).await.unwrap();
    let (result, canceled) = run.await.unwrap();
    assert_eq!(sqlstate(&result.unwrap_err()), "57014");
    assert!(started.elapsed() < Duration::from_secs(10), "canceled, not waited out");
    let n: i64 =
        canceled.query_one("SELECT count(*) FROM all_shards.scatter_events", &[]).await.unwrap().get(0);
    assert_eq!(n, 300, "the session and its shard connections go on");
    // No shard still runs the canceled statement.
    let busy = shard_admin(1, "app")
        .await
        .query_one("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(CASE WHEN id IN%' AND pid <> pg_backend_pid()", &[])
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(busy, 0);
    let _ = shards();
}
