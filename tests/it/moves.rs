//! Online tenant moves (issue 27, its second half): a tenant's rows go to another shard
//! through row-filtered logical replication while its clients write through two
//! proxies on one catalog; the cutover pauses it briefly at both, flips its routing
//! once, and its held transactions run on the target. Preflight refusals, rollbacks
//! before and after the switch, and a cutover that a running transaction outlasts.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::harness::{Catalog, Proxy, connect, new_catalog, shard_admin, sqlstate, start_catalog_proxy};

/// Creates database `db` on both shared shards with the tables tenants keep there
/// (`orders`, `events`: the tenant column in their primary keys) and `pgtenant_shard`.
pub(crate) async fn tenant_database(db: &str) {
    for shard in 1..=2usize {
        let admin = shard_admin(shard, "postgres").await;
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)")).await.unwrap();
        admin.batch_execute(&format!("CREATE DATABASE {db} OWNER app")).await.unwrap();
        let c = shard_admin(shard, db).await;
        c.batch_execute(&format!(
            "CREATE TABLE orders (tenant_id bigint NOT NULL, id bigint NOT NULL, note text, amount int NOT NULL DEFAULT 0,
                                  PRIMARY KEY (tenant_id, id));
             CREATE TABLE events (tenant_id bigint NOT NULL, id bigint NOT NULL, payload text, PRIMARY KEY (tenant_id, id));
             CREATE TABLE pgtenant_shard (shard_id int PRIMARY KEY);
             INSERT INTO pgtenant_shard VALUES ({shard});
             ALTER TABLE orders OWNER TO app; ALTER TABLE events OWNER TO app; ALTER TABLE pgtenant_shard OWNER TO app;"
        ))
        .await
        .unwrap();
    }
}

/// Gives `tenant` `n` orders and `n` events on `shard`.
pub(crate) async fn seed(db: &str, shard: usize, tenant: i64, n: i64) {
    shard_admin(shard, db)
        .await
        .execute(
            "WITH o AS (INSERT INTO orders (tenant_id, id, note) SELECT $1, g, 'seed' FROM generate_series(1, $2::bigint) g)
             INSERT INTO events (tenant_id, id, payload) SELECT $1, g, 'seed' FROM generate_series(1, $2::bigint) g",
            &[&tenant, &n],
        )
        .await
        .unwrap();
}

pub(crate) async fn start_proxy(
    catalog: &Catalog,
    db: &str,
    tweak: impl FnOnce(&mut pgtenant::config::Config),
) -> Proxy {
    let db = db.to_string();
    start_catalog_proxy(catalog.config.clone(), move |c| {
        c.moves.database = Some(db);
        tweak(c);
    })
    .await
}

pub(crate) fn tenant_conninfo(proxy: &Proxy, db: &str, tenant: i64) -> String {
    format!(
        "host=127.0.0.1 port={} user=app password=app dbname={db} sslmode=disable options='-c pgtenant.tenant_id={tenant}'",
        proxy.addr.port()
    )
}

/// What a writer saw: the ids of its acknowledged orders, the longest time between two
/// answered transactions, its errors, and the shard that answered its last read.
#[derive(Debug, Default)]
pub(crate) struct Writes {
    pub acked: Vec<i64>,
    pub longest_gap: Duration,
    pub errors: Vec<String>,
    pub last_shard: i32,
}

/// Writes orders (and events, in one transaction every other time) for `tenant`
/// through `conninfo` until `stop`, ids from `first`.
pub(crate) async fn writer(conninfo: String, tenant: i64, first: i64, stop: Arc<AtomicBool>) -> Writes {
    let mut client = connect(&conninfo).await.unwrap();
    let mut w = Writes::default();
    let mut last = Instant::now();
    let mut id = first;
    while !stop.load(Ordering::Relaxed) {
        id += 1;
        let result = if id % 2 == 0 {
            client
                .execute("INSERT INTO orders (tenant_id, id, note) VALUES ($1, $2, 'live')", &[&tenant, &id])
                .await
                .map(|_| ())
        } else {
            async {
                let tx = client.transaction().await?;
                tx.execute(
                    "INSERT INTO orders (tenant_id, id, note) VALUES ($1, $2, 'live')",
                    &[&tenant, &id],
                )
                .await?;
                tx.execute(
                    "INSERT INTO events (tenant_id, id, payload) VALUES ($1, $2, 'live')",
                    &[&tenant, &id],
                )
                .await?;
                tx.execute(
                    "UPDATE orders SET amount = amount + 1 WHERE tenant_id = $1 AND id = 1",
                    &[&tenant],
                )
                .await?;
                tx.commit().await
            }
            .await
        };
        match result {
            Ok(()) => w.acked.push(id),
            Err(e) => w.errors.push(format!("{e:?}")),
        }
        match client.query_one("SELECT shard_id FROM pgtenant_shard", &[]).await {
            Ok(row) => w.last_shard = row.get(0),
            Err(e) => w.errors.push(format!("{e:?}")),
        }
        w.longest_gap = w.longest_gap.max(last.elapsed());
        last = Instant::now();
    }
    w
}

pub(crate) async fn ids_on(db: &str, shard: usize, tenant: i64) -> BTreeSet<i64> {
    let c = shard_admin(shard, db).await;
    let rows = c.query("SELECT id FROM orders WHERE tenant_id = $1", &[&tenant]).await.unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

/// Waits until move `id` is in `phase` (panics with its state otherwise).
async fn wait_phase(
    console: &tokio_postgres::Client,
    id: i64,
    phase: &str,
    within: Duration,
) -> tokio_postgres::Row {
    let started = Instant::now();
    loop {
        let rows = console.query("SHOW MOVES", &[]).await.unwrap();
        let row = rows.into_iter().find(|r| r.get::<_, i64>("move_id") == id).expect("the move is listed");
        if row.get::<_, String>("phase") == phase {
            return row;
        }
        assert!(
            started.elapsed() < within,
            "move {id} is {} (error {:?}), not {phase}",
            row.get::<_, String>("phase"),
            row.get::<_, Option<String>>("error")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn shard_answering(proxy: &Proxy, db: &str, tenant: i64) -> i32 {
    let c = connect(&tenant_conninfo(proxy, db, tenant)).await.unwrap();
    c.query_one("SELECT shard_id FROM pgtenant_shard", &[]).await.unwrap().get(0)
}

/// Move `id`'s publication, slot and subscription still on the shards (counts).
async fn replication_left(catalog: &Catalog, db: &str, id: i64) -> (i64, i64, i64) {
    let token: String = catalog
        .admin
        .query_one("SELECT token FROM pgtenant.tenant_move WHERE move_id = $1", &[&id])
        .await
        .unwrap()
        .get(0);
    let name = format!("pgtenant_move_{id}_{token}");
    let count = |shard: usize, sql: &'static str| {
        let name = name.clone();
        async move { shard_admin(shard, db).await.query_one(sql, &[&name]).await.unwrap().get::<_, i64>(0) }
    };
    (
        count(1, "SELECT count(*) FROM pg_publication WHERE pubname = $1").await,
        count(1, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1").await,
        count(2, "SELECT count(*) FROM pg_subscription WHERE subname = $1").await,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_moves_while_it_writes_through_two_proxies_and_every_acknowledged_write_is_on_the_target() {
    let db = "moves_main";
    tenant_database(db).await;
    seed(db, 1, 77, 2000).await;
    seed(db, 1, 78, 100).await;
    seed(db, 2, 1078, 100).await;
    let catalog = new_catalog(db).await;
    let a = start_proxy(&catalog, db, |c| c.observe.listen = Some("127.0.0.1:0".parse().unwrap())).await;
    let b = start_proxy(&catalog, db, |_| {}).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut movers = Vec::new();
    for (i, proxy) in [&a, &b, &a, &b].into_iter().enumerate() {
        let conninfo = tenant_conninfo(proxy, db, 77);
        movers.push(tokio::spawn(writer(conninfo, 77, (i as i64 + 1) * 1_000_000, stop.clone())));
    }
    let mut others = Vec::new();
    for (tenant, proxy) in [(78, &a), (1078, &b)] {
        let conninfo = tenant_conninfo(proxy, db, tenant);
        others.push(tokio::spawn(writer(conninfo, tenant, 1_000_000, stop.clone())));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let console = connect(&a.admin_conninfo()).await.unwrap();
    let row = console.query_one("MOVE TENANT 77 TO SHARD 2", &[]).await.unwrap();
    let id: i64 = row.get("move_id");
    assert_eq!((row.get::<_, i64>("source"), row.get::<_, i64>("target")), (1, 2));
    let switched = wait_phase(&console, id, "switched", Duration::from_secs(60)).await;
    // The driving proxy reports the move as the dashboard and the alert rules read it,
    // once its driver has read the switched move back (its next step).
    let http = a.http_addr().unwrap();
    let reported = crate::harness::eventually(Duration::from_secs(10), || async {
        let metrics = crate::harness::http_get(http, "/metrics").await.1;
        crate::harness::dashboard_series_missing("moves", &metrics).is_empty()
    })
    .await;
    let metrics = crate::harness::http_get(http, "/metrics").await.1;
    let missing = crate::harness::dashboard_series_missing("moves", &metrics);
    assert!(reported.is_some(), "move series the dashboard or rules use, not on /metrics: {missing:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut acked = BTreeSet::new();
    let mut tenant_gap = Duration::ZERO;
    for m in movers {
        let w = m.await.unwrap();
        assert!(w.errors.is_empty(), "tenant 77's writers saw no error: {:?}", w.errors);
        assert_eq!(w.last_shard, 2, "after the switch, both proxies send tenant 77 to shard 2");
        tenant_gap = tenant_gap.max(w.longest_gap);
        acked.extend(w.acked);
    }
    for o in others {
        let w = o.await.unwrap();
        assert!(w.errors.is_empty(), "other tenants saw no error: {:?}", w.errors);
        assert!(!w.acked.is_empty());
        assert!(w.longest_gap < Duration::from_secs(2), "other tenants kept going: {:?}", w.longest_gap);
    }
    let pause_ms: i64 = switched.get("pause_ms");
    eprintln!(
        "move {id}: pause {pause_ms} ms, tenant 77's longest gap {tenant_gap:?}, {} writes acknowledged",
        acked.len()
    );
    assert!(pause_ms < 2000, "the cutover's pause stays in its budget: {pause_ms} ms");
    assert!(tenant_gap < Duration::from_secs(4), "tenant 77's longest gap: {tenant_gap:?}");
    assert!(switched.get::<_, i64>("rows_copied") >= 4000, "{switched:?}");

    // Every acknowledged write is on the target, and nothing else is.
    let on_target = ids_on(db, 2, 77).await;
    let expected: BTreeSet<i64> = (1..=2000).chain(acked.iter().copied()).collect();
    assert_eq!(on_target, expected, "shard 2 holds exactly the seeded and acknowledged orders");
    assert!(acked.len() > 20, "the writers wrote through the move: {}", acked.len());
    let events_on_target: i64 = shard_admin(2, db)
        .await
        .query_one("SELECT count(*) FROM events WHERE tenant_id = 77", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(events_on_target, 2000 + acked.iter().filter(|id| *id % 2 == 1).count() as i64);
    // Other tenants stayed where they were.
    assert!(ids_on(db, 1, 78).await.len() > 100);
    assert!(ids_on(db, 2, 1078).await.len() > 100);
    assert_eq!(shard_answering(&b, db, 77).await, 2);
    let mapped: i16 = catalog
        .admin
        .query_one("SELECT shard_id FROM pgtenant.tenant_shard_map WHERE tenant_id = 77", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(mapped, 2);
    assert_eq!(replication_left(&catalog, db, id).await, (0, 0, 0), "replication is dropped at the switch");

    // The source keeps its copy until CLEANUP MOVE.
    assert!(ids_on(db, 1, 77).await.len() >= 2000, "the source keeps its copy until the cleanup");
    console.query_one(&format!("CLEANUP MOVE {id}"), &[]).await.unwrap();
    wait_phase(&console, id, "cleaned", Duration::from_secs(30)).await;
    assert!(ids_on(db, 1, 77).await.is_empty(), "the source's rows of tenant 77 are deleted");
    assert!(ids_on(db, 1, 78).await.len() > 100, "tenant 78's rows on the source stay");
    assert_eq!(ids_on(db, 2, 77).await, expected);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn preflight_refuses_a_replica_identity_without_the_tenant_column_and_a_missing_table() {
    let db = "moves_preflight";
    tenant_database(db).await;
    for shard in 1..=2 {
        shard_admin(shard, db)
            .await
            .batch_execute("CREATE TABLE items (id bigint PRIMARY KEY, tenant_id bigint NOT NULL, name text)")
            .await
            .unwrap();
    }
    seed(db, 1, 77, 10).await;
    let catalog = new_catalog(db).await;
    let proxy = start_proxy(&catalog, db, |_| {}).await;
    let console = connect(&proxy.admin_conninfo()).await.unwrap();

    let err = console.simple_query("MOVE TENANT 77 TO SHARD 2").await.unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "{err:?}");
    let message = err.as_db_error().unwrap().message().to_string();
    assert!(
        message.contains("public.items")
            && message.contains("REPLICA IDENTITY FULL")
            && message.contains("shard 1"),
        "names the table, the shard and the fix: {message}"
    );
    // Nothing is left behind, and the refusal is on record.
    let moves = console.query("SHOW MOVES", &[]).await.unwrap();
    assert_eq!(moves.len(), 1);
    assert_eq!(moves[0].get::<_, String>("phase"), "rolled_back");
    assert!(moves[0].get::<_, Option<String>>("error").unwrap().contains("replica identity"));
    assert_eq!(replication_left(&catalog, db, moves[0].get("move_id")).await, (0, 0, 0));
    // UPDATE and DELETE of the table still work on the source for every tenant.
    shard_admin(1, db).await.batch_execute("UPDATE items SET name = 'x'; DELETE FROM items").await.unwrap();

    // The fix on the source only: the target's identity is checked too.
    shard_admin(1, db).await.batch_execute("ALTER TABLE items REPLICA IDENTITY FULL").await.unwrap();
    let err = console.simple_query("MOVE TENANT 77 TO SHARD 2").await.unwrap_err();
    assert!(err.as_db_error().unwrap().message().contains("shard 2"), "{err:?}");
    // Both fixed, but a table missing on the target.
    shard_admin(2, db).await.batch_execute("DROP TABLE items").await.unwrap();
    let err = console.simple_query("MOVE TENANT 77 TO SHARD 2").await.unwrap_err();
    assert_eq!(sqlstate(&err), "55000");
    let message = err.as_db_error().unwrap().message().to_string();
    assert!(message.contains("public.items is missing on shard 2"), "{message}");
    // Other refusals: not placed there, the same shard, a shard that does not exist.
    let err = console.simple_query("MOVE TENANT 77 TO SHARD 1").await.unwrap_err();
    assert_eq!(sqlstate(&err), "22023", "{err:?}");
    let err = console.simple_query("MOVE TENANT 77 TO SHARD 9").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42704", "{err:?}");
    // Fixed: the move goes through, rows and routing follow.
    shard_admin(2, db)
        .await
        .batch_execute("CREATE TABLE items (id bigint PRIMARY KEY, tenant_id bigint NOT NULL, name text); ALTER TABLE items REPLICA IDENTITY FULL")
        .await
        .unwrap();
    let id: i64 = console.query_one("MOVE TENANT 77 TO SHARD 2", &[]).await.unwrap().get("move_id");
    wait_phase(&console, id, "switched", Duration::from_secs(60)).await;
    assert_eq!(ids_on(db, 2, 77).await.len(), 10);
    assert_eq!(shard_answering(&proxy, db, 77).await, 2);
    let err = console.simple_query("MOVE TENANT 77 TO SHARD 1").await.unwrap_err();
    assert_eq!(sqlstate(&err), "55006", "one open move per tenant: {err:?}");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rollbacks_mid_copy_mid_cutover_and_after_the_switch_lose_nothing() {
    let db = "moves_rollback";
    tenant_database(db).await;
    // Enough rows that the copy is still running when the rollback comes.
    seed(db, 1, 77, 300_000).await;
    let catalog = new_catalog(db).await;
    let proxy = start_proxy(&catalog, db, |c| {
        c.moves.pause_timeout_ms = 300;
        c.moves.cutover_attempts = 2;
    })
    .await;
    let console = connect(&proxy.admin_conninfo()).await.unwrap();

    // Mid-copy.
    let id: i64 = console.query_one("MOVE TENANT 77 TO SHARD 2", &[]).await.unwrap().get("move_id");
    let row = console.query_one(&format!("CANCEL MOVE {id}"), &[]).await.unwrap();
    assert_eq!(row.get::<_, String>("requested"), "rollback");
    let done = wait_phase(&console, id, "rolled_back", Duration::from_secs(60)).await;
    assert!(done.get::<_, Option<String>>("switched_at").is_none());
    assert!(ids_on(db, 2, 77).await.is_empty(), "the target's copy is gone");
    assert_eq!(ids_on(db, 1, 77).await.len(), 300_000);
    assert_eq!(replication_left(&catalog, db, id).await, (0, 0, 0));
    assert_eq!(shard_answering(&proxy, db, 77).await, 1);
    shard_admin(1, db)
        .await
        .execute("DELETE FROM orders WHERE tenant_id = 77 AND id > 100", &[])
        .await
        .unwrap();
    shard_admin(1, db)
        .await
        .execute("DELETE FROM events WHERE tenant_id = 77 AND id > 100", &[])
        .await
        .unwrap();

    // Mid-cutover: a transaction of tenant 77 stays open past the pause budget, so no
    // attempt gets every proxy's acknowledgement; the tenant resumes on the source
    // each time and the move rolls back once its attempts are spent. (It only reads at
    // first: a transaction that wrote would hold up the subscription's slot instead,
    // which waits for the writers running on the source when it is made.)
    let tenant = connect(&tenant_conninfo(&proxy, db, 77)).await.unwrap();
    tenant.batch_execute("BEGIN; SELECT count(*) FROM orders").await.unwrap();
    let id: i64 = console.query_one("MOVE TENANT 77 TO SHARD 2", &[]).await.unwrap().get("move_id");
    let done = wait_phase(&console, id, "rolled_back", Duration::from_secs(60)).await;
    let error: String = done.get::<_, Option<String>>("error").unwrap();
    assert!(error.contains("2 cutover attempts") && error.contains("did not hold tenant 77"), "{error}");
    assert_eq!(done.get::<_, i64>("attempts"), 2);
    tenant
        .batch_execute(
            "INSERT INTO orders (tenant_id, id, note) VALUES (77, 500, 'open'), (77, 501, 'open'); COMMIT",
        )
        .await
        .unwrap();
    let on_source = ids_on(db, 1, 77).await;
    assert!(
        on_source.contains(&500) && on_source.contains(&501),
        "the open transaction committed on the source"
    );
    assert!(ids_on(db, 2, 77).await.is_empty());
    assert_eq!(shard_answering(&proxy, db, 77).await, 1);

    // After the switch: writes made on the target come back with the rollback.
    let id: i64 = console.query_one("MOVE TENANT 77 TO SHARD 2", &[]).await.unwrap().get("move_id");
    wait_phase(&console, id, "switched", Duration::from_secs(60)).await;
    tenant
        .execute("INSERT INTO orders (tenant_id, id, note) VALUES (77, 600, 'on the target')", &[])
        .await
        .unwrap();
    tenant
        .execute("UPDATE orders SET note = 'changed on the target' WHERE tenant_id = 77 AND id = 1", &[])
        .await
        .unwrap();
    assert!(ids_on(db, 2, 77).await.contains(&600));
    console.query_one(&format!("ROLLBACK MOVE {id}"), &[]).await.unwrap();
    wait_phase(&console, id, "rolled_back", Duration::from_secs(60)).await;
    let on_source = ids_on(db, 1, 77).await;
    assert!(on_source.contains(&600), "a write made after the switch is on the source again");
    assert_eq!(on_source.len(), 100 + 3, "{on_source:?}");
    let note: String = shard_admin(1, db)
        .await
        .query_one("SELECT note FROM orders WHERE tenant_id = 77 AND id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(note, "changed on the target");
    assert!(ids_on(db, 2, 77).await.is_empty(), "the target's rows are removed");
    assert_eq!(shard_answering(&proxy, db, 77).await, 1);
    let mapped = catalog
        .admin
        .query_opt("SELECT 1 FROM pgtenant.tenant_shard_map WHERE tenant_id = 77", &[])
        .await
        .unwrap();
    assert!(mapped.is_none(), "routing as before: by range, no map row");
    let err = console.simple_query(&format!("CLEANUP MOVE {id}")).await.unwrap_err();
    assert_eq!(sqlstate(&err), "55000");
    proxy.shutdown().await;
}

/// A `pgtenant serve` process over `catalog`, killed (SIGKILL) when dropped.
struct Killable(std::process::Child);

impl Drop for Killable {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve_on_catalog(catalog: &Catalog, db: &str, port: u16) -> Killable {
    let s = crate::harness::shards();
    let listen = format!("127.0.0.1:{port}").parse().unwrap();
    let mut config =
        pgtenant::dev::demo::demo_catalog_config(listen, catalog.config.clone(), Some(&s.tls_dir));
    config.moves.database = Some(db.into());
    config.moves.proxy_stale_ms = 1000;
    let file = crate::harness::clusters::base_dir().join(format!("{db}-{port}.toml"));
    std::fs::write(&file, toml::to_string_pretty(&config).unwrap()).unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_pgtenant"))
        .args(["serve", "--config"])
        .arg(&file)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("pgtenant serve");
    Killable(child)
}

async fn console_on(port: u16) -> tokio_postgres::Client {
    let conninfo =
        format!("host=127.0.0.1 port={port} user=admin password=admin dbname=pgtenant sslmode=disable");
    let started = Instant::now();
    loop {
        match connect(&conninfo).await {
            Ok(c) => return c,
            Err(e) => assert!(started.elapsed() < Duration::from_secs(30), "the proxy does not serve: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_proxy_killed_while_it_drives_a_move_resumes_it_once_restarted() {
    let db = "moves_killed";
    tenant_database(db).await;
    seed(db, 1, 77, 200_000).await;
    let catalog = new_catalog(db).await;
    let port = crate::harness::clusters::free_port();
    let proxy = serve_on_catalog(&catalog, db, port);
    let console = console_on(port).await;
    let id: i64 = console.query_one("MOVE TENANT 77 TO SHARD 2", &[]).await.unwrap().get("move_id");
    drop(console);
    drop(proxy); // SIGKILL while the copy runs
    let phase: String = catalog
        .admin
        .query_one("SELECT phase FROM pgtenant.tenant_move WHERE move_id = $1", &[&id])
        .await
        .unwrap()
        .get(0);
    assert!(["planned", "copying"].contains(&phase.as_str()), "killed mid-move: {phase}");

    let _restarted = serve_on_catalog(&catalog, db, port);
    let console = console_on(port).await;
    let row = wait_phase(&console, id, "switched", Duration::from_secs(90)).await;
    let driver: String = row.get("driver");
    assert!(driver.contains(&format!(":{port} ")), "the restarted proxy drives it: {driver}");
    assert_eq!(ids_on(db, 2, 77).await.len(), 200_000, "every row copied once");
    assert_eq!(replication_left(&catalog, db, id).await, (0, 0, 0));
    let c = connect(&format!(
        "host=127.0.0.1 port={port} user=app password=app dbname={db} sslmode=disable options='-c pgtenant.tenant_id=77'"
    ))
    .await
    .unwrap();
    let shard: i32 = c.query_one("SELECT shard_id FROM pgtenant_shard", &[]).await.unwrap().get(0);
    assert_eq!(shard, 2);
    let proxies: i64 =
        catalog.admin.query_one("SELECT count(*) FROM pgtenant.proxy_instance", &[]).await.unwrap().get(0);
    assert_eq!(proxies, 2, "the killed proxy's row stays (stale), the new one heartbeats");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pause_the_catalog_stops_asking_for_without_a_resume_is_lifted_and_the_held_client_runs() {
    let db = "moves_unasked";
    tenant_database(db).await;
    seed(db, 1, 77, 10).await;
    let catalog = new_catalog(db).await;
    // A switched move whose driver (another proxy, alive) still has tenant 77 paused:
    // this proxy holds it from the start.
    catalog
        .admin
        .batch_execute(&format!(
            "INSERT INTO pgtenant.proxy_instance (proxy_id, seen_at) VALUES ('elsewhere', now() + interval '1 hour');
             INSERT INTO pgtenant.tenant_move (tenant_id, source_shard, target_shard, dbname, phase, driver, pause_epoch, paused)
             VALUES (77, 1, 2, '{db}', 'switched', 'elsewhere', 1, true)"
        ))
        .await
        .unwrap();
    let proxy = start_proxy(&catalog, db, |_| {}).await;
    let console = connect(&proxy.admin_conninfo()).await.unwrap();
    let held = crate::harness::eventually(Duration::from_secs(10), || async {
        !console.query("SHOW PAUSES", &[]).await.unwrap().is_empty()
    })
    .await;
    assert!(held.is_some(), "the proxy holds tenant 77 for the move");

    let client = connect(&tenant_conninfo(&proxy, db, 77)).await.unwrap();
    let waiting = tokio::spawn(async move {
        let rows = client.query("SELECT count(*) FROM orders", &[]).await;
        rows.map(|r| r[0].get::<_, i64>(0))
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "held while the move's pause is in force");
    // The catalog stops asking without the "resume" notification (a message missed
    // while the connection was down): the next reconciliation lifts the pause.
    catalog.admin.batch_execute("UPDATE pgtenant.tenant_move SET paused = false").await.unwrap();
    let answered = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the held client runs once the pause is lifted (pause_hold_ms is 60 s)")
        .unwrap();
    assert_eq!(answered.unwrap(), 10, "tenant 77's rows, on its mapped shard");
    assert!(console.query("SHOW PAUSES", &[]).await.unwrap().is_empty(), "nothing paused any more");
    // The agent still works: a new pause of another tenant is held and answered.
    catalog
        .admin
        .batch_execute(&format!(
            "INSERT INTO pgtenant.tenant_move (tenant_id, source_shard, target_shard, dbname, phase, driver, pause_epoch, paused)
             VALUES (78, 1, 2, '{db}', 'switched', 'elsewhere', 1, true);
             SELECT pg_notify('pgtenant_move', json_build_object('move_id', currval('pgtenant.tenant_move_move_id_seq'),
                              'tenant', 78, 'epoch', 1, 'action', 'pause')::text)"
        ))
        .await
        .unwrap();
    let acked = crate::harness::eventually(Duration::from_secs(10), || async {
        let n: i64 = catalog
            .admin
            .query_one(
                "SELECT count(*) FROM pgtenant.move_ack a JOIN pgtenant.tenant_move m USING (move_id)
                 WHERE m.tenant_id = 78",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        n == 1
    })
    .await;
    assert!(acked.is_some(), "the proxy acknowledged the second pause");
    proxy.shutdown().await;
}

/// Moves in opposite directions between the same shards, all started together: two in
/// one fleet and two in another (its own catalog and database on the same servers).
/// Each move's slot waits for the transactions writing on its source, where the
/// opposite move sets up its subscription; none of them waits for the other, so all
/// four switch.
#[tokio::test(flavor = "multi_thread")]
async fn moves_in_opposite_directions_started_together_in_two_fleets_all_switch() {
    let mut fleets = Vec::new();
    for db in ["moves_crossing", "moves_crossing_other"] {
        tenant_database(db).await;
        seed(db, 1, 81, 50).await;
        seed(db, 2, 1081, 50).await;
        let catalog = new_catalog(db).await;
        let proxy = start_proxy(&catalog, db, |_| {}).await;
        let consoles = (
            connect(&proxy.admin_conninfo()).await.unwrap(),
            connect(&proxy.admin_conninfo()).await.unwrap(),
        );
        fleets.push((db, catalog, proxy, consoles));
    }
    let [(_, _, _, (a1, a2)), (_, _, _, (b1, b2))] = &fleets[..] else { unreachable!() };
    let (a, b, c, d) = tokio::join!(
        a1.query_one("MOVE TENANT 81 TO SHARD 2", &[]),
        a2.query_one("MOVE TENANT 1081 TO SHARD 1", &[]),
        b1.query_one("MOVE TENANT 1081 TO SHARD 1", &[]),
        b2.query_one("MOVE TENANT 81 TO SHARD 2", &[])
    );
    let ids = [a, b, c, d].map(|r| r.unwrap().get::<_, i64>("move_id"));
    for (n, (db, _, proxy, (console, _))) in fleets.iter().enumerate() {
        for id in &ids[2 * n..2 * n + 2] {
            wait_phase(console, *id, "switched", Duration::from_secs(60)).await;
        }
        assert_eq!(shard_answering(proxy, db, 81).await, 2);
        assert_eq!(shard_answering(proxy, db, 1081).await, 1);
        assert_eq!((ids_on(db, 2, 81).await.len(), ids_on(db, 1, 1081).await.len()), (50, 50));
    }
    for (_, _, proxy, _) in fleets {
        proxy.shutdown().await;
    }
}

/// A move with ten proxies on the catalog, as a small sidecar fleet (issue 56), writers
/// of the moving tenant through three of them: every proxy acknowledges the cutover's
/// pause, and every acknowledged write is on the target.
#[tokio::test(flavor = "multi_thread")]
async fn a_move_through_a_fleet_of_ten_proxies_loses_nothing() {
    let db = "moves_fleet";
    tenant_database(db).await;
    seed(db, 1, 91, 100).await;
    let catalog = new_catalog("moves_fleet").await;
    let mut proxies = Vec::new();
    for _ in 0..10 {
        proxies.push(start_proxy(&catalog, db, |_| {}).await);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = proxies
        .iter()
        .take(3)
        .enumerate()
        .map(|(i, p)| {
            tokio::spawn(writer(tenant_conninfo(p, db, 91), 91, 1_000_000 * (i as i64 + 1), stop.clone()))
        })
        .collect();
    let writing =
        crate::harness::eventually(Duration::from_secs(10), || async { ids_on(db, 1, 91).await.len() > 130 });
    assert!(writing.await.is_some(), "the writers write");
    let console = connect(&proxies[0].admin_conninfo()).await.unwrap();
    let id: i64 = console.query_one("MOVE TENANT 91 TO SHARD 2", &[]).await.unwrap().get("move_id");
    let switched = wait_phase(&console, id, "switched", Duration::from_secs(60)).await;
    let copied = switched.get::<_, i64>("rows_copied") as usize;
    // Writes after the switch land on the target too.
    let after = crate::harness::eventually(Duration::from_secs(10), || async {
        ids_on(db, 2, 91).await.len() > copied + 30
    });
    assert!(after.await.is_some(), "writes go on on the target");
    stop.store(true, Ordering::Relaxed);
    // Every writer's last write ends first: one acknowledged after a look at the target
    // would seem lost.
    let mut written = Vec::new();
    for w in writers {
        written.push(w.await.unwrap());
    }
    let on_target = ids_on(db, 2, 91).await;
    for (i, w) in written.into_iter().enumerate() {
        let lost: Vec<&i64> = w.acked.iter().filter(|id| !on_target.contains(id)).collect();
        assert!(!w.acked.is_empty() && lost.is_empty(), "writer {i}: lost {lost:?}");
    }
    let acked: i64 = catalog
        .admin
        .query_one(
            "SELECT count(DISTINCT proxy_id) FROM pgtenant.move_ack a JOIN pgtenant.tenant_move m USING (move_id)
             WHERE move_id = $1 AND a.epoch = m.pause_epoch",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(acked, 10, "every proxy of the fleet acknowledged the pause");
    for p in proxies {
        p.shutdown().await;
    }
}
