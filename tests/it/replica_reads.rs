//! Reads on replicas (issue 23): with `pgtenant.target` (a session's, else its
//! user's), a provably read-only autocommit request goes to a healthy replica; writes
//! and transactions go to the primary; a replica whose replay is paused falls out of use once it is behind and
//! comes back once it catches up; a killed replica costs prefer-replica reads nothing.

use std::time::Duration;

use pgtenant::config::ReadTarget;

use crate::harness::{self, connect, eventually, sqlstate, start_proxy_on_pair};

async fn session(proxy: &harness::Proxy, target: &str) -> tokio_postgres::Client {
    let options = format!("options='-c pgtenant.tenant_id=7 -c pgtenant.target={target}'");
    connect(&proxy.conninfo(&options)).await.expect("connect through the proxy")
}

/// Whether a read of `client` ran on a replica (Err: its SQLSTATE).
async fn read_on_replica(client: &tokio_postgres::Client) -> Result<bool, String> {
    client.query_one("SELECT pg_is_in_recovery()", &[]).await.map(|r| r.get(0)).map_err(|e| sqlstate(&e))
}

#[tokio::test(flavor = "multi_thread")]
async fn reads_go_to_a_fresh_replica_and_everything_else_to_the_primary() {
    let (primary, replica, admin) = crate::harness::pair_with(
        "reads",
        "CREATE TABLE replica_reads (id bigint, tenant_id bigint); GRANT ALL ON replica_reads TO app;",
    )
    .await;
    let replica_port = replica.port;
    let proxy = start_proxy_on_pair(primary.port, replica_port, |c| {
        c.health.max_replica_lag_bytes = 1 << 20;
        c.users[0].target = Some(ReadTarget::PreferReplica);
        c.observe.listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let replica_only = session(&proxy, "replica").await;
    let prefer = session(&proxy, "prefer-replica").await;
    let primary_only = session(&proxy, "primary").await;
    let seen =
        eventually(Duration::from_secs(10), || async { read_on_replica(&replica_only).await == Ok(true) })
            .await;
    assert!(seen.is_some(), "a replica-mode read reaches the replica once it is checked");
    assert_eq!(read_on_replica(&prefer).await, Ok(true));
    assert_eq!(read_on_replica(&primary_only).await, Ok(false), "a session's own target wins");
    let user_default = proxy.connect(Some(7)).await;
    assert_eq!(
        read_on_replica(&user_default).await,
        Ok(true),
        "the user's target when the session names none"
    );
    // SET in the session, simple and extended protocol; RESET goes back to the login target.
    primary_only.batch_execute("SET pgtenant.target = replica").await.unwrap();
    assert_eq!(read_on_replica(&primary_only).await, Ok(true), "SET pgtenant.target (simple)");
    primary_only.execute("RESET pgtenant.target", &[]).await.unwrap();
    assert_eq!(read_on_replica(&primary_only).await, Ok(false), "RESET: the login target (extended)");
    primary_only.execute("SET pgtenant.target TO 'prefer-replica'", &[]).await.unwrap();
    assert_eq!(read_on_replica(&primary_only).await, Ok(true), "SET pgtenant.target (extended)");
    let bad = primary_only.batch_execute("SET pgtenant.target = anywhere").await.unwrap_err();
    assert_eq!(sqlstate(&bad), "22023");
    let bad = primary_only.execute("SET pgtenant.target = 'anywhere'", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&bad), "22023");
    assert_eq!(read_on_replica(&primary_only).await, Ok(true), "a refused SET changes nothing");
    primary_only.batch_execute("RESET ALL").await.unwrap();
    assert_eq!(read_on_replica(&primary_only).await, Ok(false), "RESET ALL: the login target");

    // Writes and transactions go to the primary, whatever the target.
    assert_eq!(replica_only.execute("INSERT INTO replica_reads VALUES (1, 7)", &[]).await.unwrap(), 1);
    replica_only.batch_execute("BEGIN").await.unwrap();
    assert_eq!(read_on_replica(&replica_only).await, Ok(false), "inside a transaction: the primary");
    replica_only.batch_execute("COMMIT").await.unwrap();

    // Replay paused: once the replica is more than 1 MiB behind, it takes no reads.
    let on_replica =
        connect(&format!("host=127.0.0.1 port={replica_port} user=postgres dbname=app")).await.unwrap();
    on_replica.batch_execute("SELECT pg_wal_replay_pause()").await.unwrap();
    admin
        .batch_execute("INSERT INTO replica_reads SELECT g, 7 FROM generate_series(1, 50000) g")
        .await
        .unwrap();
    let fell_back =
        eventually(Duration::from_secs(10), || async { read_on_replica(&prefer).await == Ok(false) }).await;
    assert!(fell_back.is_some(), "a lagging replica is left for the primary");
    assert_eq!(read_on_replica(&replica_only).await, Err("57P03".into()), "replica mode: a clear error");
    // The lag is on /metrics, as the dashboard and the alert rules read it.
    let metrics = harness::http_get(proxy.http_addr().unwrap(), "/metrics").await.1;
    let missing = harness::dashboard_series_missing("replica", &metrics);
    assert!(missing.is_empty(), "replica series the dashboard or rules use, not on /metrics: {missing:?}");
    on_replica.batch_execute("SELECT pg_wal_replay_resume()").await.unwrap();
    let back =
        eventually(Duration::from_secs(10), || async { read_on_replica(&prefer).await == Ok(true) }).await;
    assert!(back.is_some(), "caught up, it takes reads again");

    // An idle primary writes nothing: its replica stays fresh however long it idles.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(read_on_replica(&prefer).await, Ok(true), "idle: not behind");
    // Behind by one small row (far under the byte bound) for longer than
    // max_replica_lag_ms (1 s): left for the primary until it replays it.
    on_replica.batch_execute("SELECT pg_wal_replay_pause()").await.unwrap();
    admin.batch_execute("INSERT INTO replica_reads VALUES (2, 7)").await.unwrap();
    let paused_at = std::time::Instant::now();
    let fell_back =
        eventually(Duration::from_secs(10), || async { read_on_replica(&prefer).await == Ok(false) }).await;
    assert!(
        fell_back.is_some() && paused_at.elapsed() >= Duration::from_millis(900),
        "a replica behind in time is left for the primary once past the bound, not before: {:?}",
        paused_at.elapsed()
    );
    on_replica.batch_execute("SELECT pg_wal_replay_resume()").await.unwrap();
    let back =
        eventually(Duration::from_secs(10), || async { read_on_replica(&prefer).await == Ok(true) }).await;
    assert!(back.is_some(), "caught up in time, it takes reads again");

    // The replica killed: prefer-replica reads go on, on the primary, without an error.
    let killed = replica.clone();
    tokio::task::spawn_blocking(move || killed.kill()).await.unwrap().expect("kill the replica");
    for _ in 0..5 {
        assert_eq!(read_on_replica(&prefer).await, Ok(false));
    }
    proxy.shutdown().await;
}

/// Read-your-writes: a prefer-replica session that wrote reads its own row while the
/// replica has not replayed it (its reads go to the primary), in both protocols, while
/// another session is still served by that replica; once the replica replays the
/// write, the writing session's reads go back to it.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_reads_its_own_writes_while_its_replica_lags() {
    let (primary, replica, _admin) = crate::harness::pair_with(
        "read_own_writes",
        "CREATE TABLE own_writes (id bigint, tenant_id bigint); GRANT ALL ON own_writes TO app;",
    )
    .await;
    let replica_port = replica.port;
    let proxy = start_proxy_on_pair(primary.port, replica_port, |c| {
        // Lag bounds that never exclude the replica: read-your-writes alone decides.
        c.health.max_replica_lag_ms = 600_000;
        c.health.max_replica_lag_bytes = 1 << 40;
    })
    .await;
    let writer = session(&proxy, "prefer-replica").await;
    let other = session(&proxy, "prefer-replica").await;
    let on_replica =
        eventually(Duration::from_secs(10), || async { read_on_replica(&other).await == Ok(true) }).await;
    assert!(on_replica.is_some(), "reads reach the replica once it is checked");
    let replica_admin =
        connect(&format!("host=127.0.0.1 port={replica_port} user=postgres dbname=app")).await.unwrap();
    replica_admin.batch_execute("SELECT pg_wal_replay_pause()").await.unwrap();

    writer.execute("INSERT INTO own_writes VALUES (1, 7)", &[]).await.unwrap();
    let count = "SELECT count(*) FROM own_writes WHERE id = 1";
    let extended: i64 = writer.query_one(count, &[]).await.unwrap().get(0);
    assert_eq!(extended, 1, "the writer reads its row (extended protocol)");
    let simple = writer.simple_query(count).await.unwrap();
    let simple = simple.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    });
    assert_eq!(simple.as_deref(), Some("1"), "and in the simple protocol");
    assert_eq!(read_on_replica(&writer).await, Ok(false), "served by the primary meanwhile");
    // Another session still reads the replica, which has not replayed the row.
    assert_eq!(read_on_replica(&other).await, Ok(true));
    let seen: i64 = other.query_one(count, &[]).await.unwrap().get(0);
    assert_eq!(seen, 0, "the replica is behind: another session is not promised the write");

    replica_admin.batch_execute("SELECT pg_wal_replay_resume()").await.unwrap();
    let back =
        eventually(Duration::from_secs(10), || async { read_on_replica(&writer).await == Ok(true) }).await;
    assert!(back.is_some(), "once the replica replayed the write, the writer reads it again");
    let replayed: i64 = writer.query_one(count, &[]).await.unwrap().get(0);
    assert_eq!(replayed, 1);
    proxy.shutdown().await;
}

/// Read-your-writes follows every way a session can write, not only a statement whose
/// text writes in the extended protocol: an autocommit INSERT in the simple protocol,
/// and a call of a function that writes (the text reads; the code writes), in either
/// protocol. Each session reads its row back while the replica's replay is paused.
#[tokio::test(flavor = "multi_thread")]
async fn every_way_of_writing_is_read_back() {
    let (primary, replica, _admin) = crate::harness::pair_with(
        "read_every_write",
        "CREATE TABLE every_write (id bigint, tenant_id bigint); GRANT ALL ON every_write TO app;
         CREATE FUNCTION every_write_w(bigint) RETURNS bigint LANGUAGE sql
             AS 'INSERT INTO every_write VALUES ($1, 7) RETURNING $1';
         GRANT EXECUTE ON FUNCTION every_write_w(bigint) TO app;",
    )
    .await;
    let replica_port = replica.port;
    let proxy = start_proxy_on_pair(primary.port, replica_port, |c| {
        c.health.max_replica_lag_ms = 600_000;
        c.health.max_replica_lag_bytes = 1 << 40;
    })
    .await;
    let writes =
        ["INSERT INTO every_write VALUES (1, 7)", "SELECT every_write_w(2)", "SELECT every_write_w(3)"];
    let mut writers = Vec::new();
    for _ in writes {
        let writer = session(&proxy, "prefer-replica").await;
        let on_replica =
            eventually(Duration::from_secs(10), || async { read_on_replica(&writer).await == Ok(true) })
                .await;
        assert!(on_replica.is_some(), "reads reach the replica once it is checked");
        writers.push(writer);
    }
    // What PostgreSQL allows a read-only transaction works for a replica session too.
    let reader = &writers[0];
    reader
        .batch_execute("BEGIN; SAVEPOINT a; SELECT 1; RELEASE a; SAVEPOINT b; ROLLBACK TO b; COMMIT")
        .await
        .unwrap();
    let copied = reader.copy_out("COPY (SELECT 1) TO STDOUT").await.map(|_| ());
    assert!(copied.is_ok(), "COPY ... TO: {copied:?}");
    let replica_admin =
        connect(&format!("host=127.0.0.1 port={replica_port} user=postgres dbname=app")).await.unwrap();
    replica_admin.batch_execute("SELECT pg_wal_replay_pause()").await.unwrap();
    for (i, (writer, write)) in writers.iter().zip(writes).enumerate() {
        match i {
            1 => assert_eq!(writer.query_one(write, &[]).await.unwrap().get::<_, i64>(0), 2),
            _ => drop(writer.simple_query(write).await.unwrap()),
        }
        let count = format!("SELECT count(*) FROM every_write WHERE id = {}", i + 1);
        let seen: i64 = writer.query_one(&count, &[]).await.unwrap().get(0);
        assert_eq!(seen, 1, "{write}: the writer reads its row");
        assert_eq!(read_on_replica(writer).await, Ok(false), "{write}: served by the primary meanwhile");
    }
    replica_admin.batch_execute("SELECT pg_wal_replay_resume()").await.unwrap();
    proxy.shutdown().await;
}

/// `read_your_writes = "user"`: a write by one session of a login is read by every
/// session of that login, while the replica has not replayed it.
#[tokio::test(flavor = "multi_thread")]
async fn under_user_read_your_writes_a_login_s_sessions_read_each_other_s_writes() {
    let (primary, replica, _admin) = crate::harness::pair_with(
        "read_login_writes",
        "CREATE TABLE login_writes (id bigint, tenant_id bigint); GRANT ALL ON login_writes TO app;",
    )
    .await;
    let replica_port = replica.port;
    let proxy = start_proxy_on_pair(primary.port, replica_port, |c| {
        c.health.max_replica_lag_ms = 600_000;
        c.health.max_replica_lag_bytes = 1 << 40;
        c.proxy.read_your_writes = pgtenant::config::ReadYourWrites::User;
    })
    .await;
    let writer = session(&proxy, "prefer-replica").await;
    let sibling = session(&proxy, "prefer-replica").await;
    let on_replica =
        eventually(Duration::from_secs(10), || async { read_on_replica(&sibling).await == Ok(true) }).await;
    assert!(on_replica.is_some(), "reads reach the replica once it is checked");
    let replica_admin =
        connect(&format!("host=127.0.0.1 port={replica_port} user=postgres dbname=app")).await.unwrap();
    replica_admin.batch_execute("SELECT pg_wal_replay_pause()").await.unwrap();
    writer.execute("INSERT INTO login_writes VALUES (1, 7)", &[]).await.unwrap();
    let seen: i64 = sibling.query_one("SELECT count(*) FROM login_writes", &[]).await.unwrap().get(0);
    assert_eq!(seen, 1, "another session of the login reads the write");
    assert_eq!(read_on_replica(&sibling).await, Ok(false), "from the primary, while the replica lags");
    replica_admin.batch_execute("SELECT pg_wal_replay_resume()").await.unwrap();
    let back =
        eventually(Duration::from_secs(10), || async { read_on_replica(&sibling).await == Ok(true) }).await;
    assert!(back.is_some(), "back on the replica once it replayed the write");
    proxy.shutdown().await;
}
