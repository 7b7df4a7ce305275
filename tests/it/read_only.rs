//! A tenant that may not write (`read_only` in the catalog) meets a wall it cannot take
//! down (issue 50): pgtenant refuses its writes, and the server's own wall
//! (`default_transaction_read_only`, which pgtenant sets for it) stands whatever the
//! tenant sends: `READ WRITE` transactions, SET/RESET/`set_config` of the setting (by
//! name or by a Bind parameter), `RESET ALL`, a function that turns it off. What
//! PostgreSQL allows in a read-only transaction works: SAVEPOINT, RELEASE, ROLLBACK TO,
//! `COPY ... TO`. Both pool modes, both protocols; no write ever reaches the table.

use pgtenant::config::PoolMode;
use postgres_protocol::message::frontend;

use crate::harness::raw::RawClient;
use crate::harness::{new_catalog, shard_admin, sqlstate, start_catalog_proxy};

const TENANT: i64 = 501;

/// The SQLSTATE a simple query got, or `None` when it ran.
async fn simple(client: &tokio_postgres::Client, sql: &str) -> Option<String> {
    client.batch_execute(sql).await.err().map(|e| sqlstate(&e))
}

async fn writes_so_far(admin: &tokio_postgres::Client) -> i64 {
    admin.query_one("SELECT count(*) FROM ro_writes", &[]).await.unwrap().get(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_tenant_cannot_take_down_its_wall() {
    let admin = shard_admin(1, "app").await;
    admin
        .batch_execute(
            "DROP TABLE IF EXISTS ro_writes CASCADE;
             CREATE TABLE ro_writes (tenant_id bigint, v int);
             GRANT ALL ON ro_writes TO app;
             CREATE OR REPLACE FUNCTION ro_w() RETURNS int LANGUAGE sql
                 AS 'INSERT INTO ro_writes VALUES (501, 1) RETURNING 1';
             CREATE OR REPLACE FUNCTION ro_lift() RETURNS int LANGUAGE plpgsql AS
                 $$ BEGIN PERFORM set_config('default_transaction_read_only', 'off', false); RETURN 1; END $$;
             GRANT EXECUTE ON FUNCTION ro_w(), ro_lift() TO app;",
        )
        .await
        .unwrap();
    let catalog = new_catalog("read_only_wall").await;
    catalog
        .admin
        .batch_execute(&format!(
            "INSERT INTO pgtenant.tenant_shard_map (tenant_id, shard_id, state) VALUES ({TENANT}, 1, 'read_only')"
        ))
        .await
        .unwrap();
    let refused = Some("25006".to_string());
    for mode in [PoolMode::Transaction, PoolMode::Session] {
        let proxy = start_catalog_proxy(catalog.config.clone(), move |c| c.proxy.pool_mode = mode).await;
        let client = proxy.connect(Some(TENANT)).await;
        // The simple protocol.
        for sql in [
            "SELECT ro_w()",
            "SET default_transaction_read_only = off",
            "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
            "SELECT set_config('default_transaction_read_only', 'off', false)",
            "RESET default_transaction_read_only",
            "DO $$ BEGIN PERFORM set_config('default_transaction_read_only', 'off', false); END $$",
            "SELECT ro_lift(); COMMIT; SELECT ro_w()",
        ] {
            assert_eq!(simple(&client, sql).await, refused, "{mode:?}: {sql}");
            assert_eq!(simple(&client, "SELECT ro_w()").await, refused, "{mode:?}: after {sql}");
        }
        for begin in ["BEGIN READ WRITE", "START TRANSACTION ISOLATION LEVEL SERIALIZABLE, READ WRITE"] {
            simple(&client, begin).await;
            assert_eq!(simple(&client, "SELECT ro_w()").await, refused, "{mode:?}: {begin}");
            assert_eq!(simple(&client, "COMMIT").await, None, "{mode:?}");
        }
        assert_eq!(simple(&client, "BEGIN").await, None);
        assert_eq!(simple(&client, "SET TRANSACTION READ WRITE").await, refused, "{mode:?}");
        assert_eq!(simple(&client, "ROLLBACK").await, None);
        // What the server allows a read-only tenant, and code that turns the wall off
        // for later transactions: pgtenant sets it again before each.
        for sql in ["SELECT ro_lift()", "RESET ALL", "DISCARD ALL"] {
            assert_eq!(simple(&client, sql).await, None, "{mode:?}: {sql}");
            assert_eq!(simple(&client, "SELECT ro_w()").await, refused, "{mode:?}: after {sql}");
        }
        let savepoints = "BEGIN; SAVEPOINT a; RELEASE a; SAVEPOINT b; ROLLBACK TO b; COMMIT";
        assert_eq!(simple(&client, savepoints).await, None, "{mode:?}");
        for sql in ["BEGIN", "SAVEPOINT a", "SELECT 1", "RELEASE a", "COMMIT"] {
            assert_eq!(simple(&client, sql).await, None, "{mode:?}: {sql}");
        }
        let out = client.copy_out("COPY (SELECT 1) TO STDOUT").await.map(|_| ()).map_err(|e| sqlstate(&e));
        assert_eq!(out, Ok(()), "{mode:?}: COPY ... TO");

        // The extended protocol.
        let extended = |sql: &'static str| {
            let client = &client;
            async move { client.execute(sql, &[]).await.err().map(|e| sqlstate(&e)) }
        };
        assert_eq!(extended("SELECT ro_w()").await, refused, "{mode:?}");
        assert_eq!(extended("SET default_transaction_read_only = off").await, refused, "{mode:?}");
        let by_parameter = client
            .execute("SELECT set_config($1, $2, false)", &[&"default_transaction_read_only", &"off"])
            .await
            .map_err(|e| sqlstate(&e));
        assert_eq!(by_parameter.err(), refused, "{mode:?}: the name as a parameter");
        let other_setting =
            client.execute("SELECT set_config($1, $2, false)", &[&"application_name", &"ro"]).await;
        assert!(other_setting.is_ok(), "{mode:?}: {other_setting:?}");
        assert_eq!(extended("SELECT ro_lift()").await, None, "{mode:?}");
        assert_eq!(extended("SELECT ro_w()").await, refused, "{mode:?}: set again");

        // One pipelined request: a function that turns the wall off, a COMMIT, a write.
        let mut raw =
            RawClient::login(proxy.addr, &[("options", &format!("-c pgtenant.tenant_id={TENANT}"))]).await;
        let mut out = bytes::BytesMut::new();
        for sql in ["BEGIN", "SELECT ro_lift()", "COMMIT", "SELECT ro_w()"] {
            frontend::parse("", sql, std::iter::empty(), &mut out).unwrap();
            crate::harness::raw::bind_unnamed(&mut out);
            frontend::execute("", 0, &mut out).unwrap();
        }
        frontend::sync(&mut out);
        let answer = raw.request(&out).await;
        assert_eq!(crate::harness::raw::sqlstate(&answer), refused, "{mode:?}: {answer:?}");
        assert_eq!(crate::harness::raw::first_column(&raw.query("SELECT 1").await), ["1"], "{mode:?}");
        raw.query("ROLLBACK").await;
        // Pipelined requests: the write comes before the first one's answer.
        for pipelined in [["SELECT ro_lift()", "SELECT ro_w()"], ["BEGIN; SELECT ro_lift()", "COMMIT"]] {
            out.clear();
            for sql in pipelined {
                frontend::query(sql, &mut out).unwrap();
            }
            frontend::query("SELECT ro_w()", &mut out).unwrap();
            raw.send(&out).await;
            let mut answers = Vec::new();
            for _ in 0..3 {
                answers.push(raw.until_ready().await);
            }
            assert_eq!(crate::harness::raw::sqlstate(&answers[2]), refused, "{mode:?}: {pipelined:?}");
        }

        // BEGIN READ WRITE, then a request that only prepares: the transaction opens on
        // a server with no statement to admit, and the BEGIN is refused there.
        raw.query("BEGIN READ WRITE").await;
        out.clear();
        frontend::parse("", "SELECT ro_w()", std::iter::empty(), &mut out).unwrap();
        frontend::sync(&mut out);
        let mut answer = raw.request(&out).await;
        out.clear();
        crate::harness::raw::bind_unnamed(&mut out);
        frontend::execute("", 0, &mut out).unwrap();
        frontend::sync(&mut out);
        answer.extend(raw.request(&out).await);
        // Refused at the Parse when it needs a server, else at the Execute.
        assert_eq!(crate::harness::raw::sqlstate(&answer), refused, "{mode:?}: {answer:?}");
        raw.query("ROLLBACK").await;

        // A tenant that may write sends the same pipeline: nothing of it is refused.
        let mut writer = RawClient::login(proxy.addr, &[("options", "-c pgtenant.tenant_id=7")]).await;
        out.clear();
        for sql in ["BEGIN", "SELECT ro_lift()", "COMMIT", "SELECT 1"] {
            frontend::parse("", sql, std::iter::empty(), &mut out).unwrap();
            crate::harness::raw::bind_unnamed(&mut out);
            frontend::execute("", 0, &mut out).unwrap();
        }
        frontend::sync(&mut out);
        let answer = writer.request(&out).await;
        assert!(answer.iter().all(|m| m.tag != b'E'), "{mode:?}: {answer:?}");

        assert_eq!(writes_so_far(&admin).await, 0, "{mode:?}: a write reached the table");
        proxy.shutdown().await;
    }
}

/// Where pgtenant put up no wall, `default_transaction_read_only` is the client's own:
/// a tenant that may write sets it (by SET SESSION CHARACTERISTICS, or by name), and
/// SQL pgtenant cannot follow (a failing DROP, a DO block) does not make pgtenant take
/// it down behind the client's back (PostgreSQL's regression test `transactions` found
/// it: pgtenant reset the setting before the next transaction). In session pooling and
/// on a connection a temporary table pins in transaction pooling.
#[tokio::test(flavor = "multi_thread")]
async fn a_writable_tenants_own_read_only_setting_is_left_alone() {
    let admin = shard_admin(1, "app").await;
    admin
        .batch_execute(
            "DROP TABLE IF EXISTS own_ro CASCADE; CREATE TABLE own_ro (tenant_id bigint, v int);
             GRANT ALL ON own_ro TO app;",
        )
        .await
        .unwrap();
    let refused = Some("25006".to_string());
    for mode in [PoolMode::Session, PoolMode::Transaction] {
        let proxy = crate::harness::start_proxy(move |c| c.proxy.pool_mode = mode).await;
        for own in
            ["SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY", "SET default_transaction_read_only = on"]
        {
            let client = proxy.connect(Some(7)).await;
            assert_eq!(simple(&client, "CREATE TEMP TABLE own_ro_pin (a int)").await, None, "{mode:?}");
            assert_eq!(simple(&client, own).await, None, "{mode:?}: {own}");
            assert_eq!(simple(&client, "DROP TABLE own_ro").await, refused, "{mode:?}: {own}");
            assert_eq!(simple(&client, "INSERT INTO own_ro VALUES (7, 1)").await, refused, "{mode:?}: {own}");
            assert_eq!(simple(&client, "DO $$ BEGIN PERFORM 1; END $$").await, None, "{mode:?}: {own}");
            let insert =
                client.execute("INSERT INTO own_ro VALUES (7, 2)", &[]).await.map_err(|e| sqlstate(&e));
            assert_eq!(insert.err(), refused, "{mode:?}: {own}, extended");
            assert_eq!(
                simple(&client, "START TRANSACTION READ WRITE; INSERT INTO own_ro VALUES (7, 3); COMMIT")
                    .await,
                None
            );
        }
        proxy.shutdown().await;
    }
    let rows: i64 = admin.query_one("SELECT count(*) FROM own_ro", &[]).await.unwrap().get(0);
    assert_eq!(rows, 4, "only the READ WRITE transactions wrote");
}
