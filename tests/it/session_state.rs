//! Session state through transaction pooling: the settings a client changes (at
//! startup, with SET, or in less obvious ways) follow it across server connections and
//! stay its own; what cannot be carried (LISTEN, temporary tables, advisory locks)
//! pins the server connection until the session ends.

use std::time::Duration;

use crate::harness::{self, shard_of, start_proxy};

#[tokio::test(flavor = "multi_thread")]
async fn session_settings_follow_the_client_across_server_connections() {
    // One server connection shared by two clients with different settings.
    let proxy = start_proxy(|c| c.users[0].pool_size = 1).await;
    let a = harness::connect(&proxy.conninfo(
        "application_name=alpha options='-c pgtenant.tenant_id=7 -c search_path=pg_catalog,public'",
    ))
    .await
    .unwrap();
    let b = harness::connect(&proxy.conninfo("application_name=beta options='-c pgtenant.tenant_id=500'"))
        .await
        .unwrap();
    b.batch_execute("SET TimeZone = 'America/New_York'").await.unwrap();
    for _ in 0..3 {
        let row = a.query_one("SELECT current_setting('application_name'), current_setting('search_path'), current_setting('TimeZone'), current_setting('pgtenant.tenant_id')", &[]).await.unwrap();
        assert_eq!(row.get::<_, String>(0), "alpha");
        assert_eq!(row.get::<_, String>(1), "pg_catalog,public", "as a server reports a startup search_path");
        assert_ne!(row.get::<_, String>(2), "America/New_York");
        assert_eq!(row.get::<_, String>(3), "7");
        let row = b.query_one("SELECT current_setting('application_name'), current_setting('search_path'), current_setting('TimeZone'), current_setting('pgtenant.tenant_id')", &[]).await.unwrap();
        assert_eq!(row.get::<_, String>(0), "beta");
        assert_eq!(row.get::<_, String>(1), "\"$user\", public");
        assert_eq!(row.get::<_, String>(2), "America/New_York");
        assert_eq!(row.get::<_, String>(3), "500");
    }
    // RESET returns to the startup value, as on a server.
    a.batch_execute("SET application_name = 'changed'").await.unwrap();
    a.batch_execute("RESET application_name").await.unwrap();
    let name: String = a.query_one("SELECT current_setting('application_name')", &[]).await.unwrap().get(0);
    assert_eq!(name, "alpha");
}

/// This client's search_path, TimeZone, default isolation and `app.user`, as the
/// server reports them.
async fn settings_of(client: &tokio_postgres::Client) -> [String; 4] {
    let row = client
        .query_one(
            "SELECT current_setting('search_path'), current_setting('TimeZone'), current_setting('transaction_isolation'), coalesce(current_setting('app.user', true), '')",
            &[],
        )
        .await
        .unwrap();
    [row.get(0), row.get(1), row.get(2), row.get(3)]
}

#[tokio::test(flavor = "multi_thread")]
async fn settings_changed_any_way_follow_the_client_and_stay_its_own() {
    // One server connection per shard, shared by both clients.
    let proxy = start_proxy(|c| {
        c.users[0].pool_size = 1;
        // It switches tenants between transactions.
        c.proxy.allow_tenant_switch = true;
    })
    .await;
    let a = proxy.connect(Some(7)).await;
    let b = proxy.connect(Some(8)).await;
    let mut defaults = settings_of(&b).await;
    // A SET through the extended protocol (tokio-postgres prepares it, as pgJDBC does),
    // one inside a multi-statement query, and SET SESSION CHARACTERISTICS.
    a.execute("SET search_path = pg_catalog, public", &[]).await.unwrap();
    a.batch_execute("SET TimeZone = 'Asia/Tokyo'; SELECT 1").await.unwrap();
    a.batch_execute("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE").await.unwrap();
    // set_config for the session, its value a parameter (as asyncpg's around type lookups).
    let user: String =
        a.query_one("SELECT set_config('app.user', $1, false)", &[&"alice"]).await.unwrap().get(0);
    assert_eq!(user, "alice");
    // Undone by the server, so not followed: a SET in a rolled-back transaction, one in
    // a failed extended request.
    let mut a = a;
    let tx = a.transaction().await.unwrap();
    tx.execute("SET search_path = rolled_back", &[]).await.unwrap();
    tx.rollback().await.unwrap();
    a.execute("SET TimeZone = 'no/such_zone'", &[]).await.unwrap_err();
    let mine = ["pg_catalog, public", "Asia/Tokyo", "serializable", "alice"].map(String::from);
    for _ in 0..3 {
        assert_eq!(settings_of(&a).await, mine);
        assert_eq!(settings_of(&b).await, defaults, "another client's SETs must not leak");
    }
    // Not pinned by any of them: the session moves to tenant 1500 on shard 2, settings and all.
    a.batch_execute("SET pgtenant.tenant_id = 1500").await.unwrap();
    assert_eq!(shard_of(&a).await, 2);
    assert_eq!(settings_of(&a).await, mine);
    // RESET ALL through the extended protocol: back to the startup settings everywhere.
    a.execute("RESET ALL", &[]).await.unwrap();
    defaults[3] = String::new(); // a placeholder setting, once made, resets to empty
    assert_eq!(settings_of(&a).await, defaults);
    a.batch_execute("SET pgtenant.tenant_id = 7").await.unwrap();
    assert_eq!(settings_of(&a).await, defaults);
    // A session setting pgtenant cannot re-apply pins the connection rather than leak.
    a.execute("SET XML OPTION DOCUMENT", &[]).await.unwrap();
    a.batch_execute("SET pgtenant.tenant_id = 1500").await.unwrap();
    let err = a.query_one("SELECT shard_id FROM pgtenant_shard", &[]).await.unwrap_err();
    assert_eq!(harness::sqlstate(&err), "0A000", "{err}");
    assert!(format!("{err:?}").contains("cannot re-apply"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn session_state_made_in_less_obvious_ways_pins_too() {
    let proxy = start_proxy(|c| {
        c.users[0].pool_size = 2;
        // It switches tenants between transactions.
        c.proxy.allow_tenant_switch = true;
    })
    .await;
    for (sql, reason) in [
        ("SELECT 1 AS a INTO TEMP into_temp", "temporary table"),
        ("CREATE TABLE pg_temp.qualified_temp (a int)", "temporary table"),
        ("SELECT set_config('search_path', current_setting('search_path'), false)", "cannot re-apply"),
    ] {
        let client = proxy.connect(Some(7)).await;
        client.batch_execute(sql).await.unwrap();
        // Anyone else gets a clean connection of shard 1 meanwhile.
        let other = proxy.connect(Some(8)).await;
        let path: String = other.query_one("SHOW search_path", &[]).await.unwrap().get(0);
        assert_eq!(path, "\"$user\", public", "after {sql}");
        client.batch_execute("SET pgtenant.tenant_id = 1500").await.unwrap();
        let err = client.query_one("SELECT shard_id FROM pgtenant_shard", &[]).await.unwrap_err();
        assert_eq!(harness::sqlstate(&err), "0A000", "{sql}: {err:?}");
        assert!(format!("{err:?}").contains(reason), "{sql}: {err:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn listen_and_temp_tables_pin_the_server_connection() {
    let proxy = start_proxy(|c| c.users[0].pool_size = 3).await;
    let (listener, mut conn) =
        tokio_postgres::connect(&proxy.conninfo("options='-c pgtenant.tenant_id=7'"), tokio_postgres::NoTls)
            .await
            .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(msg) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
            if let Ok(tokio_postgres::AsyncMessage::Notification(n)) = msg {
                let _ = tx.send(n.payload().to_string());
            }
        }
    });
    listener.batch_execute("LISTEN pgtenant_chan").await.unwrap();
    // Other clients keep the other server connections busy in between.
    let other = proxy.connect(Some(7)).await;
    for i in 0..5 {
        other.batch_execute(&format!("NOTIFY pgtenant_chan, 'n{i}'")).await.unwrap();
    }
    for i in 0..5 {
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv())
            .await
            .expect("notification")
            .unwrap();
        assert_eq!(got, format!("n{i}"));
    }

    let client = proxy.connect(Some(7)).await;
    client.batch_execute("CREATE TEMP TABLE scratch (v int)").await.unwrap();
    for i in 0..5 {
        let noise = proxy.connect(Some(7)).await;
        noise.batch_execute("SELECT 1").await.unwrap();
        client.execute("INSERT INTO scratch VALUES ($1)", &[&i]).await.unwrap();
    }
    let n: i64 = client.query_one("SELECT count(*) FROM scratch", &[]).await.unwrap().get(0);
    assert_eq!(n, 5);
}

#[tokio::test(flavor = "multi_thread")]
async fn advisory_locks_pin_until_the_session_ends() {
    let proxy = start_proxy(|c| c.users[0].pool_size = 3).await;
    let holder = proxy.connect(Some(7)).await;
    let pid: i32 =
        holder.query_one("SELECT pg_backend_pid() FROM pg_advisory_lock(4242)", &[]).await.unwrap().get(0);
    let other = proxy.connect(Some(7)).await;
    for _ in 0..3 {
        other.batch_execute("SELECT 1").await.unwrap();
        let same: i32 = harness::server_pid(&holder).await;
        assert_eq!(same, pid, "the lock holder keeps its server connection");
    }
    let got: bool = other.query_one("SELECT pg_try_advisory_lock(4242)", &[]).await.unwrap().get(0);
    assert!(!got, "the lock is still held by the pinned session");
    drop(holder);
    // The departed session's server is reset (DISCARD ALL) as it goes back to the pool, not
    // when a client next takes it: the lock goes with no other client asking for it.
    let admin = crate::harness::shard_admin(1, "app").await;
    let released = crate::harness::eventually_none(
        &admin,
        Duration::from_secs(5),
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242",
        &[],
    )
    .await;
    assert!(released, "the lock is released when the session ends");
    let fresh = proxy.connect(Some(7)).await;
    let mut free = false;
    for _ in 0..3 {
        free = fresh.query_one("SELECT pg_try_advisory_lock(4242)", &[]).await.unwrap().get(0);
        if free {
            break;
        }
    }
    assert!(free, "the lock was released with the session");
}
