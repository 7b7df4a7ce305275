//! Routing: which shard answers for which tenant, tenant switches, comment hints,
//! statements that need no tenant, and the errors when there is none.

use crate::harness::raw::{RawClient, first_column};
use crate::harness::{shard_of, sqlstate, start_proxy};

#[tokio::test(flavor = "multi_thread")]
async fn tenants_land_on_their_shards() {
    let proxy = start_proxy(|_| {}).await;
    for (tenant, shard) in [(42, 2), (1500, 2), (7, 1), (1000, 1), (1001, 2)] {
        let client = proxy.connect(Some(tenant)).await;
        assert_eq!(shard_of(&client).await, shard, "tenant {tenant}");
        let port: i32 = client.query_one("SELECT inet_server_port()", &[]).await.unwrap().get(0);
        assert_eq!(port as u16, proxy.config.shards[shard as usize - 1].nodes[0].port, "tenant {tenant}");
        let guc: String =
            client.query_one("SELECT current_setting('pgtenant.tenant_id')", &[]).await.unwrap().get(0);
        assert_eq!(guc, tenant.to_string());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tenant_as_a_startup_parameter() {
    let proxy = start_proxy(|_| {}).await;
    let mut c = RawClient::login(proxy.addr, &[("pgtenant.tenant_id", "1500")]).await;
    assert_eq!(first_column(&c.query("SELECT shard_id FROM pgtenant_shard").await), vec!["2"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn set_switches_tenant_between_transactions() {
    let proxy = start_proxy(|c| c.proxy.allow_tenant_switch = true).await;
    let client = proxy.connect(Some(7)).await;
    assert_eq!(shard_of(&client).await, 1);
    client.batch_execute("SET pgtenant.tenant_id = 42").await.unwrap();
    assert_eq!(shard_of(&client).await, 2);
    client.batch_execute("SET SESSION pgtenant.tenant_id TO '500'").await.unwrap();
    assert_eq!(shard_of(&client).await, 1);
    client.batch_execute("RESET pgtenant.tenant_id").await.unwrap();
    assert_eq!(shard_of(&client).await, 1, "RESET goes back to the startup tenant 7");
    let guc: String =
        client.query_one("SELECT current_setting('pgtenant.tenant_id')", &[]).await.unwrap().get(0);
    assert_eq!(guc, "7");

    // Once the transaction has run a statement, its tenant is settled.
    client.batch_execute("BEGIN").await.unwrap();
    client.batch_execute("SELECT 1").await.unwrap();
    let err = client.batch_execute("SET pgtenant.tenant_id = 42").await.err().unwrap();
    assert_eq!(sqlstate(&err), "25001");
    client.batch_execute("ROLLBACK").await.unwrap();

    let err = client.batch_execute("SET pgtenant.tenant_id = 999999").await.err().unwrap();
    assert_eq!(sqlstate(&err), "42704", "{err}");
    assert!(err.as_db_error().unwrap().message().contains("999999"));
    let err = client.batch_execute("SET pgtenant.tenant_id = 'abc'").await.err().unwrap();
    assert_eq!(sqlstate(&err), "22023");
    assert_eq!(shard_of(&client).await, 1, "refused SETs leave the tenant as it was");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_tenant_catalog_queries_work_and_table_queries_are_refused() {
    let proxy = start_proxy(|_| {}).await;
    let client = proxy.connect(None).await;
    let one: i32 = client.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
    let n: i64 = client.query_one("SELECT count(*) FROM pg_catalog.pg_class", &[]).await.unwrap().get(0);
    assert!(n > 0);
    // Catalog-only text sqlparser cannot parse (a record operator), in both protocols;
    // the same with a table of the user's in it is refused.
    let catalog_only = "SELECT count(*) FROM pg_catalog.pg_class c, pg_namespace n \
                        WHERE n.oid = c.relnamespace AND NOT (c *<> c)";
    let n: i64 = client.query_one(catalog_only, &[]).await.unwrap().get(0);
    assert!(n > 0);
    let rows = client.simple_query(catalog_only).await.unwrap();
    assert!(rows.iter().any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_))));
    let with_a_table = format!("{catalog_only} AND EXISTS (SELECT 1 FROM pg_class, accounts)");
    assert_eq!(sqlstate(&client.query(&with_a_table, &[]).await.unwrap_err()), "22023");
    let err = client.query("SELECT * FROM accounts", &[]).await.err().unwrap();
    assert_eq!(sqlstate(&err), "22023");
    assert!(err.as_db_error().unwrap().message().contains("pgtenant.tenant_id"), "{err}");
    // The session is still usable, and a hint routes one statement.
    let shard: i32 = client
        .query_one("SELECT shard_id FROM pgtenant_shard /* pgtenant.tenant_id=1500 */", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(shard, 2);
    let shard: i32 =
        client.query_one("SELECT shard_id FROM pgtenant_shard /*tenant_id='7'*/", &[]).await.unwrap().get(0);
    assert_eq!(shard, 1);
    let err = client
        .query("SELECT shard_id FROM pgtenant_shard /* pgtenant.tenant_id=5000 */", &[])
        .await
        .err()
        .unwrap();
    assert_eq!(sqlstate(&err), "42704");
}

#[tokio::test(flavor = "multi_thread")]
async fn begin_is_deferred_until_a_statement_names_the_tenant() {
    let proxy = start_proxy(|_| {}).await;
    let client = proxy.connect(None).await;
    client.batch_execute("BEGIN").await.unwrap();
    let rows = client.simple_query("SELECT shard_id, txid_current_if_assigned() IS NULL FROM pgtenant_shard /* pgtenant.tenant_id=42 */").await.unwrap();
    let row = rows.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap().to_string()),
        _ => None,
    });
    assert_eq!(row.as_deref(), Some("2"));
    // Still in the same transaction on shard 2.
    let status = client.simple_query("SELECT now() = statement_timestamp() AS same").await.unwrap();
    let same = status.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap().to_string()),
        _ => None,
    });
    assert_eq!(same.as_deref(), Some("f"), "now() is the transaction start, so the BEGIN ran first");
    client.batch_execute("COMMIT").await.unwrap();
    // An empty transaction never touches a server.
    client.batch_execute("BEGIN; COMMIT").await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bound_session_cannot_name_another_tenant() {
    let proxy = start_proxy(|_| {}).await;
    let client = proxy.connect(Some(7)).await;
    let err = client.query("SELECT 1 FROM accounts /* pgtenant.tenant_id=500 */", &[]).await.err().unwrap();
    assert_eq!(sqlstate(&err), "42501");
    let same: i64 = client
        .query_one("SELECT count(*) FROM accounts /* pgtenant.tenant_id=7 */", &[])
        .await
        .unwrap()
        .get(0);
    assert!(same > 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn cross_shard_hint_inside_a_transaction_is_refused() {
    let proxy = start_proxy(|_| {}).await;
    let client = proxy.connect(None).await;
    client.batch_execute("BEGIN").await.unwrap();
    client.batch_execute("SELECT 1 FROM accounts /* pgtenant.tenant_id=7 */").await.unwrap();
    let err =
        client.batch_execute("SELECT 1 FROM accounts /* pgtenant.tenant_id=1500 */").await.err().unwrap();
    assert_eq!(sqlstate(&err), "0A000", "{err}");
    client.batch_execute("ROLLBACK").await.unwrap();
}

/// A whole extended request (`Parse Bind Describe Execute Sync`, or `Bind Execute Sync`
/// of a named statement) inside a transaction is checked as the transaction's next
/// statement, whichever way it is taken (several of them pipelined in one write, one
/// refused among them): a tenant on another shard is refused (for a session bound to
/// its tenant, any other tenant), the rest run in the same transaction, in order; in
/// both pool modes.
#[tokio::test(flavor = "multi_thread")]
async fn whole_extended_requests_inside_a_transaction_are_checked_as_its_next_statements() {
    use crate::harness::raw::{bind_unnamed, sqlstate as raw_sqlstate};
    use postgres_protocol::message::frontend;
    let request = |out: &mut bytes::BytesMut, sql: &str| {
        frontend::parse("", sql, std::iter::empty(), out).unwrap();
        bind_unnamed(out);
        frontend::describe(b'P', "", out).unwrap();
        frontend::execute("", 0, out).unwrap();
        frontend::sync(out);
    };
    for mode in [pgtenant::config::PoolMode::Transaction, pgtenant::config::PoolMode::Session] {
        let proxy = start_proxy(move |c| c.proxy.pool_mode = mode).await;
        // Tenant 1500 (shard 2) looked up once, so that its placement is known below.
        let mut warm = RawClient::login(proxy.addr, &[]).await;
        assert_eq!(first_column(&warm.query("SELECT 15 /* pgtenant.tenant_id=1500 */").await), ["15"]);
        // Unbound, the transaction's tenant named in the statement; bound at login.
        for (login, refused) in [(&[][..], "0A000"), (&[("pgtenant.tenant_id", "7")][..], "42501")] {
            let mut c = RawClient::login(proxy.addr, login).await;
            // A named statement, prepared outside the transaction.
            let mut out = bytes::BytesMut::new();
            frontend::parse("named_txid", "SELECT txid_current()::text", [], &mut out).unwrap();
            frontend::sync(&mut out);
            assert_eq!(raw_sqlstate(&c.request(&out).await), None, "{mode:?} {login:?}");

            c.query("BEGIN").await;
            out.clear();
            request(&mut out, "SELECT shard_id::text FROM pgtenant_shard /* pgtenant.tenant_id=7 */");
            assert_eq!(first_column(&c.request(&out).await), ["1"], "{mode:?} {login:?}");
            out.clear();
            request(&mut out, "SELECT txid_current()::text");
            request(&mut out, "SELECT 2 /* pgtenant.tenant_id=1500 */");
            request(&mut out, "SELECT shard_id::text FROM pgtenant_shard");
            let no_values = std::iter::empty::<()>();
            let bound =
                frontend::bind("", "named_txid", [], no_values, |_, _| unreachable!(), [0i16], &mut out);
            assert!(bound.is_ok(), "Bind encodes");
            frontend::execute("", 0, &mut out).unwrap();
            frontend::sync(&mut out);
            c.send(&out).await;
            let mut answers = Vec::new();
            for _ in 0..4 {
                answers.push(c.until_ready().await);
            }
            let txid = first_column(&answers[0]);
            assert_eq!(txid.len(), 1, "{mode:?} {login:?}: {:?}", answers[0]);
            assert_eq!(
                raw_sqlstate(&answers[1]).as_deref(),
                Some(refused),
                "{mode:?} {login:?}: {:?}",
                answers[1]
            );
            assert!(first_column(&answers[1]).is_empty(), "{mode:?} {login:?}: the refused statement ran");
            assert_eq!(first_column(&answers[2]), ["1"], "{mode:?} {login:?}: {:?}", answers[2]);
            assert_eq!(
                first_column(&answers[3]),
                txid,
                "{mode:?} {login:?}: the same transaction throughout"
            );
            c.query("ROLLBACK").await;
        }
        proxy.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn default_policy_sends_tenantless_work_to_the_default_shard() {
    let proxy = start_proxy(|c| {
        c.proxy.no_tenant_policy = pgtenant::config::NoTenantPolicy::Default;
        c.proxy.default_shard = Some(2);
    })
    .await;
    let client = proxy.connect(None).await;
    assert_eq!(shard_of(&client).await, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn tenant_set_through_the_extended_protocol() {
    let proxy = start_proxy(|c| c.proxy.allow_tenant_switch = true).await;
    let client = proxy.connect(Some(7)).await;
    // tokio-postgres sends these as Parse/Describe/Sync, then Bind/Execute/Sync.
    client.execute("SET pgtenant.tenant_id = 42", &[]).await.unwrap();
    assert_eq!(shard_of(&client).await, 2);
    client.execute("RESET pgtenant.tenant_id", &[]).await.unwrap();
    assert_eq!(shard_of(&client).await, 1);
    let err = client.execute("SET pgtenant.tenant_id = 99999", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "42704");
    // Prepared outside a transaction, executed inside one: refused at execution too.
    let prepared_set = client.prepare("SET pgtenant.tenant_id = 42").await.unwrap();
    client.batch_execute("BEGIN").await.unwrap();
    client.execute("SELECT 1", &[]).await.unwrap();
    let err = client.execute("SET pgtenant.tenant_id = 42", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "25001");
    client.batch_execute("ROLLBACK; BEGIN").await.unwrap();
    let err = client.execute(&prepared_set, &[]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "25001");
    client.batch_execute("ROLLBACK").await.unwrap();
    let guc: String =
        client.query_one("SELECT current_setting('pgtenant.tenant_id')", &[]).await.unwrap().get(0);
    assert_eq!(guc, "7", "the server never saw the refused SETs");
}

#[tokio::test(flavor = "multi_thread")]
async fn servers_behind_unix_sockets() {
    let dir = crate::harness::shards().dirs[0].display().to_string();
    let proxy = start_proxy(move |c| c.shards[0].nodes[0].host = dir).await;
    let client = proxy.connect(Some(7)).await;
    assert_eq!(shard_of(&client).await, 1);
    let local: bool = client.query_one("SELECT inet_server_addr() IS NULL", &[]).await.unwrap().get(0);
    assert!(local, "the server connection is a Unix socket");
    // Larger than the socket's buffer both ways: the proxy's write waits for the server
    // to read (the socket is registered for reading only until then), and the answer
    // comes in many reads.
    let big = "x".repeat(6_000_000);
    let row = client.query_one("SELECT length($1::text), md5($1::text), repeat('y', 5000000)", &[&big]).await;
    let row = row.unwrap();
    assert_eq!(row.get::<_, i32>(0), 6_000_000);
    let md5: String = client.query_one("SELECT md5(repeat('x', 6000000))", &[]).await.unwrap().get(0);
    assert_eq!(row.get::<_, String>(1), md5);
    assert_eq!(row.get::<_, String>(2), "y".repeat(5_000_000));
    // Cancel goes to the Unix socket too.
    let token = client.cancel_token();
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        token.cancel_query(tokio_postgres::NoTls).await
    });
    let err = client.simple_query("SELECT pg_sleep(20)").await.unwrap_err();
    assert_eq!(sqlstate(&err), "57014");
    canceller.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn tenant_set_inside_a_multi_statement_string_is_refused() {
    let proxy = start_proxy(|_| {}).await;
    let client = proxy.connect(Some(7)).await;
    for sql in [
        "SET pgtenant.tenant_id = 42; SELECT 1",
        "SELECT 1; RESET pgtenant.tenant_id",
        "SELECT 1; SET pgtenant.tenant_id = x",
    ] {
        let err = client.batch_execute(sql).await.unwrap_err();
        assert_eq!(sqlstate(&err), "0A000", "{sql}: {err}");
    }
    let guc: String =
        client.query_one("SELECT current_setting('pgtenant.tenant_id')", &[]).await.unwrap().get(0);
    assert_eq!(guc, "7", "nothing of the refused strings ran");
    assert_eq!(shard_of(&client).await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_set_first_in_a_transaction_lasts_if_it_commits() {
    let proxy = start_proxy(|c| c.proxy.allow_tenant_switch = true).await;
    let mut client = proxy.connect(Some(7)).await;
    // As psycopg and pgJDBC do outside autocommit: BEGIN, then the SET.
    client.batch_execute("BEGIN").await.unwrap();
    client.batch_execute("SET pgtenant.tenant_id = 42").await.unwrap();
    assert_eq!(shard_of(&client).await, 2, "the transaction runs on the new tenant's shard");
    client.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(shard_of(&client).await, 1, "rolled back with its transaction, as a server's SET");
    client.batch_execute("BEGIN").await.unwrap();
    client.batch_execute("SET pgtenant.tenant_id = 42").await.unwrap();
    client.batch_execute("COMMIT").await.unwrap();
    assert_eq!(shard_of(&client).await, 2, "committed: the session's tenant from now on");
    // Through the extended protocol, in a transaction that fails on the server.
    let tx = client.transaction().await.unwrap();
    tx.execute("SET pgtenant.tenant_id = 7", &[]).await.unwrap();
    let shard: i32 = tx.query_one("SELECT shard_id FROM pgtenant_shard", &[]).await.unwrap().get(0);
    assert_eq!(shard, 1);
    let err = tx.execute("SELECT 1/0", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "22012");
    // The server answers a failed transaction's COMMIT with ROLLBACK.
    tx.commit().await.unwrap();
    assert_eq!(shard_of(&client).await, 2, "a failed transaction's COMMIT rolls back");
    let tx = client.transaction().await.unwrap();
    tx.execute("SET pgtenant.tenant_id = 7", &[]).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(shard_of(&client).await, 1);
    // A multi-statement query that begins a transaction runs all of it.
    let rows = client.simple_query("BEGIN; SELECT 42; COMMIT").await.unwrap();
    let values: Vec<_> = rows
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .collect();
    assert_eq!(values, ["42"]);
}
