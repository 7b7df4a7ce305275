//! Snowflake IDs minted by the proxy: both protocols, inside transactions, bad input,
//! three proxies leasing instance numbers from one catalog when they mint, a lost
//! lease (the shard mints meanwhile) and an idle one given back, more proxies than
//! instance numbers, and the servers' own SQL function (`sql/snowflake.sql`) agreeing
//! with the proxy.

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use pgtenant::snowflake::Layout;
use postgres_protocol::message::frontend;

use crate::harness::raw::RawClient;
use crate::harness::{self, eventually, new_catalog, sqlstate, start_catalog_proxy, start_proxy};

/// The IDs `sql` returns, run `times` times.
async fn minted(client: &tokio_postgres::Client, sql: &str, times: usize) -> Vec<i64> {
    let mut ids = Vec::new();
    for _ in 0..times {
        ids.extend(client.query(sql, &[]).await.unwrap().iter().map(|r| r.get::<_, i64>(0)));
    }
    ids
}

/// The instance number of the next `next_id()` within `within` that `wanted` accepts,
/// and that ID.
async fn next_id_from(
    client: &tokio_postgres::Client,
    within: Duration,
    wanted: impl Fn(i64) -> bool,
) -> Option<(i64, i64)> {
    let found = std::sync::Mutex::new(None);
    eventually(within, || async {
        let Ok(row) = client.query_one("SELECT pgtenant.next_id()", &[]).await else { return false };
        let id: i64 = row.get(0);
        let instance = Layout::default().decode(id).instance;
        *found.lock().unwrap() = Some((instance, id));
        wanted(instance)
    })
    .await?;
    found.into_inner().unwrap()
}

fn unix_ms_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_are_minted_in_both_protocols_for_the_tenants_shard() {
    let proxy = start_proxy(|c| c.snowflake.instance = 3).await;
    let layout = Layout::default();
    let client = proxy.connect(Some(42)).await; // tenant 42 lives on shard 2
    let before = unix_ms_now();

    // Simple protocol.
    let rows = client.simple_query("SELECT pgtenant.next_id()").await.unwrap();
    let simple_id: i64 = match &rows[1] {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).unwrap().parse().unwrap(),
        other => panic!("expected a row, got {other:?}"),
    };
    let d = layout.decode(simple_id);
    assert_eq!((d.shard, d.instance), (2, 3));
    assert!(d.unix_ms >= before - 1 && d.unix_ms <= unix_ms_now() + 1, "timestamp is now: {d:?}");

    // Extended protocol, binary results (tokio-postgres asks for binary).
    let id: i64 = client.query_one("SELECT pgtenant.next_id()", &[]).await.unwrap().get(0);
    assert!(id > simple_id, "monotonic per shard");
    let explicit: i64 =
        client.query_one("SELECT pgtenant.next_id($1) AS id", &[&7i64]).await.unwrap().get("id");
    assert_eq!(layout.decode(explicit).shard, 7);
    // A parameter cast to int is described as int4, so the driver sends an i32.
    let typed: i64 = client.query_one("SELECT pgtenant.next_id($1::int)", &[&9i32]).await.unwrap().get(0);
    assert_eq!(layout.decode(typed).shard, 9);

    // psql, as an application would type it.
    let out = proxy.psql(Some(42), &["-At", "-c", "SELECT pgtenant.next_id()"], "");
    let psql_id: i64 =
        harness::stdout(&out).trim().parse().unwrap_or_else(|_| panic!("{}", harness::stderr(&out)));
    assert_eq!((layout.decode(psql_id).shard, layout.decode(psql_id).instance), (2, 3));

    // A prepared statement used many times: 1000 rows each, ascending, never repeated.
    let stmt = client.prepare("SELECT * FROM pgtenant.next_ids($1)").await.unwrap();
    assert_eq!(stmt.columns()[0].name(), "next_ids");
    assert_eq!(stmt.columns()[0].type_(), &tokio_postgres::types::Type::INT8);
    let mut seen = HashSet::new();
    for _ in 0..5 {
        let ids: Vec<i64> =
            client.query(&stmt, &[&1000i64]).await.unwrap().iter().map(|r| r.get(0)).collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        for id in ids {
            assert_eq!(layout.decode(id).shard, 2);
            assert!(seen.insert(id));
        }
    }

    // decode_id, with a typed timestamp.
    let row = client.query_one("SELECT * FROM pgtenant.decode_id($1)", &[&explicit]).await.unwrap();
    let ts: SystemTime = row.get("timestamp");
    let d = layout.decode(explicit);
    assert_eq!(ts.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64, d.unix_ms);
    assert_eq!(
        (row.get::<_, i32>("shard_id"), row.get::<_, i32>("instance"), row.get::<_, i32>("sequence")),
        (7, 3, d.counter as i32)
    );
    let text = client.simple_query("SELECT * FROM pgtenant.decode_id(4194304)").await.unwrap();
    match &text[1] {
        tokio_postgres::SimpleQueryMessage::Row(r) => {
            assert_eq!(r.get("timestamp"), Some("2024-01-01 00:00:00.001+00"));
            assert_eq!(
                (r.get("shard_id"), r.get("instance"), r.get("sequence")),
                (Some("0"), Some("0"), Some("0"))
            );
        }
        other => panic!("expected a row, got {other:?}"),
    }

    // Inside a transaction on shard 2: the answer comes in order, the transaction goes on.
    client.batch_execute("BEGIN").await.unwrap();
    let shard = harness::shard_of(&client).await;
    let in_tx: i64 = client.query_one("SELECT pgtenant.next_id()", &[]).await.unwrap().get(0);
    assert_eq!(layout.decode(in_tx).shard as i32, shard);
    let status = client.query_one("SELECT now() = statement_timestamp()", &[]).await.unwrap();
    assert!(!status.get::<_, bool>(0), "still the same transaction");
    client.batch_execute("COMMIT").await.unwrap();

    // Bad input: clear errors, the session goes on.
    for (sql, code) in [
        ("SELECT pgtenant.next_id(1024)", "22023"),
        ("SELECT pgtenant.next_id(-1)", "22023"),
        ("SELECT * FROM pgtenant.next_ids(0)", "22023"),
        ("SELECT * FROM pgtenant.next_ids(10001)", "22023"),
    ] {
        let err = client.simple_query(sql).await.unwrap_err();
        assert_eq!(sqlstate(&err), code, "{sql}: {err}");
        let err = client.query(sql, &[]).await.unwrap_err();
        assert_eq!(sqlstate(&err), code, "{sql} (extended): {err}");
    }
    let err = client.query_one("SELECT pgtenant.next_id($1)", &[&None::<i64>]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "22004");
    let one: i64 = client.query_one("SELECT 1::int8", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);

    // Without a tenant there is no shard to mint for.
    let anonymous = proxy.connect(None).await;
    let err = anonymous.simple_query("SELECT pgtenant.next_id()").await.unwrap_err();
    assert_eq!(sqlstate(&err), "22023", "{err}");
    let id: i64 = anonymous.query_one("SELECT pgtenant.next_id(1)", &[]).await.unwrap().get(0);
    assert_eq!(layout.decode(id).shard, 1);
    proxy.shutdown().await;
}

/// One request (one Sync) mixing a statement for the server with a snowflake call, and
/// a portal fetched in parts: the replies come in the order of the messages.
#[tokio::test]
async fn snowflake_messages_keep_their_place_in_a_pipelined_request() {
    let proxy = start_proxy(|_| {}).await;
    let mut raw = RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")]).await;
    let mut out = BytesMut::new();
    for sql in ["SELECT shard_id FROM pgtenant_shard", "SELECT pgtenant.next_id()", "SELECT 2"] {
        frontend::parse("", sql, std::iter::empty(), &mut out).unwrap();
        harness::raw::bind_unnamed(&mut out);
        frontend::describe(b'P', "", &mut out).unwrap();
        frontend::execute("", 0, &mut out).unwrap();
    }
    frontend::sync(&mut out);
    raw.send(&out).await;
    let msgs = raw.until_ready().await;
    let tags: String = msgs.iter().map(|m| m.tag as char).collect();
    assert_eq!(tags, "12TDC12TDC12TDCZ");
    let values = harness::raw::first_column(&msgs);
    assert_eq!(values[0], "1", "tenant 7 is on shard 1");
    let id: i64 = values[1].parse().unwrap();
    assert_eq!(Layout::default().decode(id).shard, 1);
    assert_eq!(values[2], "2");

    // next_ids(5) fetched two rows at a time: D D s, D D s, D C.
    let mut out = BytesMut::new();
    frontend::parse("", "SELECT * FROM pgtenant.next_ids(5)", std::iter::empty(), &mut out).unwrap();
    harness::raw::bind_unnamed(&mut out);
    for _ in 0..3 {
        frontend::execute("", 2, &mut out).unwrap();
    }
    frontend::sync(&mut out);
    raw.send(&out).await;
    let msgs = raw.until_ready().await;
    let tags: String = msgs.iter().map(|m| m.tag as char).collect();
    assert_eq!(tags, "12DDsDDsDCZ");
    let ids: Vec<i64> = harness::raw::first_column(&msgs).iter().map(|v| v.parse().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]) && ids.len() == 5);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_proxies_on_one_catalog_never_mint_the_same_id() {
    let catalog = new_catalog("snowflake_three").await;
    let mut proxies = Vec::new();
    for _ in 0..3 {
        proxies.push(start_catalog_proxy(catalog.config.clone(), |_| {}).await);
    }
    let leased = || async {
        catalog
            .admin
            .query(
                "SELECT instance::int FROM pgtenant.snowflake_lease WHERE expires_at > now() ORDER BY 1",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, i32>(0))
            .collect::<Vec<i32>>()
    };
    assert_eq!(leased().await, Vec::<i32>::new(), "a proxy that has not minted holds no number");
    // Every proxy mints for the same shard (tenant 42, shard 2) at once: 3 x 1,000,000 IDs.
    let mut tasks = Vec::new();
    for proxy in &proxies {
        let client = proxy.connect(Some(42)).await;
        tasks.push(tokio::spawn(async move {
            let stmt = client.prepare("SELECT * FROM pgtenant.next_ids($1)").await.unwrap();
            let mut ids = Vec::with_capacity(1_000_000);
            for _ in 0..100 {
                ids.extend(
                    client.query(&stmt, &[&10_000i64]).await.unwrap().iter().map(|r| r.get::<_, i64>(0)),
                );
            }
            ids
        }));
    }
    let mut all = Vec::new();
    let mut instances = HashSet::new();
    for t in tasks {
        let ids = t.await.unwrap();
        assert_eq!(ids.len(), 1_000_000);
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "one proxy's IDs ascend");
        instances.insert(Layout::default().decode(ids[0]).instance);
        all.extend(ids);
    }
    assert_eq!(instances, HashSet::from([1, 2, 3]), "one instance number each, leased to mint");
    assert_eq!(leased().await, vec![1, 2, 3]);
    all.sort_unstable();
    let total = all.len();
    all.dedup();
    assert_eq!(all.len(), total, "no duplicate among {total} IDs");
    for p in proxies {
        p.shutdown().await;
    }
    // Shutdown gave the numbers back (expired now), for the next proxies.
    assert_eq!(leased().await, Vec::<i32>::new());
}

// On worker threads of its own: with a 600 ms lease renewed every 200 ms, a
// single-threaded runtime shared with the proxy's other tasks (health checks, the
// catalog watcher) can miss a renewal on a loaded machine.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_lease_hands_minting_to_the_shard_until_a_new_one_and_an_idle_one_is_given_back() {
    let catalog = new_catalog("snowflake_lease").await;
    let proxy = start_catalog_proxy(catalog.config.clone(), |c| {
        c.snowflake.lease_ttl_ms = 600;
        c.snowflake.lease_idle_ms = 1500;
    })
    .await;
    let client = proxy.connect(Some(7)).await;
    let first: i64 = client.query_one("SELECT pgtenant.next_id()", &[]).await.unwrap().get(0);
    assert_eq!(Layout::default().decode(first).instance, 1);
    // Another holder takes every number, ours included (as an operator or a split brain might).
    catalog
        .admin
        .batch_execute(
            "INSERT INTO pgtenant.snowflake_lease (instance, holder, expires_at)
             SELECT i, 'thief', now() + interval '1 hour' FROM generate_series(1, 15) i
             ON CONFLICT (instance) DO UPDATE SET holder = 'thief', expires_at = now() + interval '1 hour'",
        )
        .await
        .unwrap();
    // The shard (tenant 7's, shard 1) mints instead: instance 0, its own shard id, later.
    let (_, on_shard) = next_id_from(&client, Duration::from_secs(3), |instance| instance == 0)
        .await
        .expect("the shard mints once the lease is gone");
    let decoded = Layout::default().decode(on_shard);
    assert_eq!((decoded.shard, decoded.instance), (1, 0), "{decoded:?}");
    assert!(on_shard > first);
    let batch = minted(&client, "SELECT * FROM pgtenant.next_ids(500)", 1).await;
    assert!(batch.len() == 500 && batch.windows(2).all(|w| w[0] < w[1]), "500 ascending IDs from the shard");
    // A shard id no shard of the directory has: nobody can mint it, and says so.
    let err = client.query_one("SELECT pgtenant.next_id(999)", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "55000");
    let message = err.as_db_error().map(|e| e.message().to_string()).unwrap_or_default();
    assert!(message.contains("shard 999 could not mint"), "{message}");
    assert_eq!(harness::shard_of(&client).await, 1, "the session goes on");
    // Numbers free again: the proxy leases one and mints with it, after the old holder's expiry.
    catalog.admin.batch_execute("DELETE FROM pgtenant.snowflake_lease WHERE holder = 'thief'").await.unwrap();
    let (instance, again) = next_id_from(&client, Duration::from_secs(5), |instance| instance > 0)
        .await
        .expect("minting with a leased number resumes");
    assert!(again > on_shard && instance > 0);
    // Not minting for lease_idle_ms: the number is given back while the proxy runs.
    let given_back = eventually(Duration::from_secs(5), || async {
        let live: i64 = catalog
            .admin
            .query_one("SELECT count(*) FROM pgtenant.snowflake_lease WHERE expires_at > now()", &[])
            .await
            .unwrap()
            .get(0);
        live == 0
    })
    .await;
    assert!(given_back.is_some(), "an idle proxy gives its number back");
    let after: i64 = client.query_one("SELECT pgtenant.next_id()", &[]).await.unwrap().get(0);
    assert!(Layout::default().decode(after).instance > 0 && after > again, "and leases one again to mint");
    proxy.shutdown().await;
}

/// Seventeen proxies on one catalog, more than the 15 instance numbers of the default
/// layout, mint at once: the first to ask lease the numbers, the others' shards mint
/// for them, and no ID repeats.
#[tokio::test(flavor = "multi_thread")]
async fn more_proxies_than_instance_numbers_all_mint_unique_ids() {
    let catalog = new_catalog("snowflake_fleet").await;
    let mut proxies = Vec::new();
    for _ in 0..17 {
        proxies.push(start_catalog_proxy(catalog.config.clone(), |_| {}).await);
    }
    let mut tasks = Vec::new();
    for proxy in &proxies {
        let client = proxy.connect(Some(42)).await;
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..20 {
                let rows = client.query("SELECT * FROM pgtenant.next_ids(200)", &[]).await.unwrap();
                ids.extend(rows.iter().map(|r| r.get::<_, i64>(0)));
            }
            ids
        }));
    }
    let mut all = Vec::new();
    let mut instances = HashSet::new();
    for t in tasks {
        let ids = t.await.unwrap();
        assert_eq!(ids.len(), 4000);
        instances.extend(ids.iter().map(|id| Layout::default().decode(*id).instance));
        assert!(ids.iter().all(|id| Layout::default().decode(*id).shard == 2), "tenant 42's shard");
        all.extend(ids);
    }
    assert!(instances.contains(&0), "some were minted by the shard: {instances:?}");
    assert!(instances.len() >= 15, "the leased numbers were used too: {instances:?}");
    let total = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), total, "no duplicate among {total} IDs");
    for p in proxies {
        p.shutdown().await;
    }
}

/// The servers' SQL function mints as instance 0 with the same layout: IDs from both
/// never collide, and each side decodes the other's IDs alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_function_and_the_proxy_agree_and_never_collide() {
    // The demo shards carry sql/snowflake.sql (dev's setup); the application role mints.
    let direct = harness::connect(&format!(
        "host=127.0.0.1 port={} user=app password=app dbname=app",
        harness::shards().ports[1]
    ))
    .await
    .unwrap();
    let proxy = start_proxy(|_| {}).await;
    let client = proxy.connect(Some(42)).await;

    let on_server = tokio::spawn(async move {
        let ids = minted(&direct, "SELECT * FROM pgtenant.next_ids(5000)", 3).await;
        (direct, ids)
    });
    let via_proxy = minted(&client, "SELECT * FROM pgtenant.next_ids(500)", 30).await;
    let (direct, server_ids) = on_server.await.unwrap();
    assert!(server_ids.windows(2).all(|w| w[0] < w[1]), "the server's IDs ascend");
    let layout = Layout::default();
    let mut all: HashSet<i64> = HashSet::new();
    for id in server_ids.iter().chain(&via_proxy) {
        assert!(all.insert(*id), "duplicate {id}");
    }
    // Each side decodes the other's IDs to the same parts.
    let server_id = server_ids[100];
    let row = client.query_one("SELECT * FROM pgtenant.decode_id($1)", &[&server_id]).await.unwrap();
    assert_eq!((row.get::<_, i32>("shard_id"), row.get::<_, i32>("instance")), (2, 0));
    let d = layout.decode(via_proxy[7]);
    let row = direct.query_one("SELECT * FROM pgtenant.decode_id($1)", &[&via_proxy[7]]).await.unwrap();
    let ts: SystemTime = row.get("timestamp");
    assert_eq!(ts.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64, d.unix_ms);
    assert_eq!(
        (row.get::<_, i32>("shard_id"), row.get::<_, i32>("instance"), row.get::<_, i32>("sequence")),
        (2, 1, d.counter as i32)
    );
    // Their timestamps are the same clock: within a second of each other.
    let server_ms = layout.decode(*server_ids.last().unwrap()).unix_ms;
    assert!((server_ms - layout.decode(*via_proxy.last().unwrap()).unix_ms).abs() < 5_000);
    proxy.shutdown().await;
}

/// A proxy that cannot reach the catalog cannot renew its lease: minting with its
/// number stops when the lease runs out (another proxy could be given the number),
/// the shard mints meanwhile, and the proxy's own minting resumes once the catalog is
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_catalog_lets_the_lease_run_out() {
    let cluster = harness::private_cluster("snowflake-catalog", 0);
    let config = harness::demo_catalog_on(cluster.port, "pgtenant_catalog").await;
    let proxy = start_catalog_proxy(config, |c| c.snowflake.lease_ttl_ms = 900).await;
    let client = proxy.connect(Some(42)).await;
    let first: i64 = client.query_one("SELECT pgtenant.next_id()", &[]).await.unwrap().get(0);
    let conninfo = format!("host=127.0.0.1 port={} user=postgres dbname=pgtenant_catalog", cluster.port);
    harness::connect(&conninfo).await.unwrap().batch_execute("CHECKPOINT").await.unwrap();

    cluster.kill().unwrap();
    let (_, on_shard) = next_id_from(&client, Duration::from_secs(3), |instance| instance == 0)
        .await
        .expect("the shard mints once the lease cannot be renewed");
    assert!(on_shard > first);
    assert_eq!(harness::shard_of(&client).await, 2, "routing a cached tenant goes on");

    cluster.start().unwrap();
    let (_, again) = next_id_from(&client, Duration::from_secs(10), |instance| instance > 0)
        .await
        .expect("minting with a leased number resumes once the catalog is back");
    assert!(again > on_shard);
    proxy.shutdown().await;
    cluster.stop().unwrap();
}

/// Many large answers asked for without reading them: pgtenant stops taking requests
/// while the client's unread answers pile up (instead of holding them all), and every
/// answer arrives, whole and in order, once the client reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_answers_hold_back_further_requests_and_all_arrive() {
    let proxy = start_proxy(|_| {}).await;
    let mut raw = RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")]).await;
    let mut out = BytesMut::new();
    for _ in 0..40 {
        frontend::query("SELECT * FROM pgtenant.next_ids(10000)", &mut out).unwrap();
    }
    raw.send(&out).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut last = 0i64;
    for _ in 0..40 {
        let ids: Vec<i64> =
            harness::raw::first_column(&raw.until_ready().await).iter().map(|v| v.parse().unwrap()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids[0] > last && ids.windows(2).all(|w| w[0] < w[1]));
        last = ids[9_999];
    }
    // The same for a server's answer larger than what pgtenant buffers for a client.
    let mut out = BytesMut::new();
    frontend::query("SELECT repeat('x', 1000) FROM generate_series(1, 5000)", &mut out).unwrap();
    raw.send(&out).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rows = harness::raw::first_column(&raw.until_ready().await);
    assert_eq!(rows.len(), 5000);
    assert!(rows.iter().all(|r| r.len() == 1000));
    proxy.shutdown().await;
}

/// A read-only tenant mints as any other when the shard mints for the proxy: the
/// shard's function runs outside the tenant's read-only wall, which its session's
/// pooled connections carry.
#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_tenant_mints_on_the_shard_when_no_number_is_free() {
    let catalog = new_catalog("snowflake_read_only").await;
    catalog
        .admin
        .batch_execute(
            "INSERT INTO pgtenant.tenant_shard_map (tenant_id, shard_id, state) VALUES (77, 1, 'read_only');
             INSERT INTO pgtenant.snowflake_lease (instance, holder, expires_at)
             SELECT i, 'thief', now() + interval '1 hour' FROM generate_series(1, 15) i",
        )
        .await
        .unwrap();
    let proxy = start_catalog_proxy(catalog.config.clone(), |_| {}).await;
    let client = proxy.connect(Some(77)).await;
    // The connection its statements ran on carries the wall now, back in the pool.
    let wall: String = client.query_one("SHOW default_transaction_read_only", &[]).await.unwrap().get(0);
    assert_eq!(wall, "on");
    let ids = minted(&client, "SELECT * FROM pgtenant.next_ids(3)", 1).await;
    assert_eq!(ids.len(), 3);
    assert!(ids.iter().all(|id| Layout::default().decode(*id).instance == 0), "minted by the shard: {ids:?}");
    proxy.shutdown().await;
}
