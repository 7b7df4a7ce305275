//! Logins from the database (issue 54): a role created on the shards logs in through
//! pgtenant with no `[[users]]` entry (the demo configuration, as `pgtenant dev`, looks
//! logins up with `[auth] query`), reaches the servers as itself (SCRAM passthrough, over
//! the client's channel binding too), so per-role row-level security sees its
//! `current_user` through transaction pooling; an unknown role and a wrong password get
//! the same error; a rotated password takes effect on the next attempts; a shard whose
//! verifier for the role differs is refused with a reason; RELOAD turns it on and off.

use std::time::Duration;

use crate::harness::{Proxy, eventually, shard_admin, sqlstate, start_proxy};

/// Creates `role` with `password` on shard 1 and, with the very same SCRAM verifier,
/// on shard 2 (passthrough needs the same verifier wherever the role logs in).
async fn role_on_both_shards(role: &str, password: &str) {
    let first = shard_admin(1, "app").await;
    let second = shard_admin(2, "app").await;
    for admin in [&first, &second] {
        admin.batch_execute(&format!("DROP OWNED BY {role} CASCADE; DROP ROLE IF EXISTS {role}")).await.ok();
        admin.batch_execute(&format!("DROP ROLE IF EXISTS {role}")).await.unwrap();
    }
    first.batch_execute(&format!("CREATE ROLE {role} LOGIN PASSWORD '{password}'")).await.unwrap();
    let verifier: String = first
        .query_one("SELECT rolpassword FROM pg_authid WHERE rolname = $1", &[&role])
        .await
        .unwrap()
        .get(0);
    assert!(verifier.starts_with("SCRAM-SHA-256$"), "{verifier}");
    second.batch_execute(&format!("CREATE ROLE {role} LOGIN PASSWORD '{verifier}'")).await.unwrap();
}

async fn login(
    proxy: &Proxy,
    role: &str,
    password: &str,
    tenant: i64,
) -> Result<tokio_postgres::Client, String> {
    let conninfo = format!(
        "host=127.0.0.1 port={} user={role} password={password} dbname=app sslmode=disable options='-c pgtenant.tenant_id={tenant}'",
        proxy.addr.port()
    );
    crate::harness::connect(&conninfo).await.map_err(|e| {
        let message = e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_string());
        format!("{} {message}", sqlstate(&e))
    })
}

/// The error of a login that must fail.
async fn refused(proxy: &Proxy, role: &str, password: &str, tenant: i64, why: &str) -> String {
    match login(proxy, role, password, tenant).await {
        Ok(_) => panic!("{why}: it logged in"),
        Err(e) => e,
    }
}

async fn who(client: &tokio_postgres::Client) -> (String, String) {
    let row =
        client.query_one("SELECT current_user::text, session_user::text WHERE true", &[]).await.unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_role_created_on_the_shards_logs_in_as_itself_with_no_entry_in_the_file() {
    role_on_both_shards("dbl_alice", "alice-pw").await;
    let proxy = start_proxy(|_| {}).await;
    for tenant in [7, 1500] {
        let alice = login(&proxy, "dbl_alice", "alice-pw", tenant).await.expect("alice logs in");
        let role = "dbl_alice".to_string();
        assert_eq!(
            who(&alice).await,
            (role.clone(), role),
            "tenant {tenant}: the server sees the client's role"
        );
    }
    // An unknown role and a wrong password: the same SQLSTATE and wording.
    let wrong = refused(&proxy, "dbl_alice", "not-it", 7, "a wrong password fails").await;
    let unknown = refused(&proxy, "dbl_nobody", "alice-pw", 7, "an unknown role fails").await;
    assert!(wrong.starts_with("28P01 "), "{wrong}");
    assert_eq!(wrong.replace("dbl_alice", "X"), unknown.replace("dbl_nobody", "X"));
    // Over TLS with channel binding required, as psql offers it.
    let conninfo = format!(
        "host=127.0.0.1 port={} user=dbl_alice password=alice-pw dbname=app sslmode=require channel_binding=require options='-c pgtenant.tenant_id=7'",
        proxy.addr.port()
    );
    let out = crate::harness::psql_at(&conninfo, "SELECT current_user WHERE true");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "dbl_alice");
    proxy.shutdown().await;
}

/// A policy `USING (owner = current_user)` sees each client's own role through
/// transaction pooling: each reads only its own rows.
#[tokio::test(flavor = "multi_thread")]
async fn per_role_row_level_security_sees_the_client_s_role() {
    role_on_both_shards("dbl_ann", "ann-pw").await;
    role_on_both_shards("dbl_bob", "bob-pw").await;
    let admin = shard_admin(1, "app").await;
    admin
        .batch_execute(
            "DROP TABLE IF EXISTS dbl_notes;
             CREATE TABLE dbl_notes (tenant_id bigint NOT NULL, owner name NOT NULL DEFAULT current_user, body text);
             ALTER TABLE dbl_notes ENABLE ROW LEVEL SECURITY;
             CREATE POLICY own ON dbl_notes USING (owner = current_user) WITH CHECK (owner = current_user);
             GRANT SELECT, INSERT ON dbl_notes TO dbl_ann, dbl_bob;",
        )
        .await
        .unwrap();
    let proxy = start_proxy(|c| c.auth.pool_size = 1).await;
    let ann = login(&proxy, "dbl_ann", "ann-pw", 7).await.unwrap();
    let bob = login(&proxy, "dbl_bob", "bob-pw", 7).await.unwrap();
    for (client, body) in [(&ann, "ann's"), (&bob, "bob's"), (&ann, "ann's again")] {
        client.execute("INSERT INTO dbl_notes (tenant_id, body) VALUES (7, $1)", &[&body]).await.unwrap();
    }
    let bodies =
        |rows: Vec<tokio_postgres::Row>| rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>();
    let sql = "SELECT body FROM dbl_notes WHERE tenant_id = 7 ORDER BY body";
    assert_eq!(bodies(ann.query(sql, &[]).await.unwrap()), vec!["ann's", "ann's again"]);
    assert_eq!(bodies(bob.query(sql, &[]).await.unwrap()), vec!["bob's"]);
    let owners: i64 =
        admin.query_one("SELECT count(DISTINCT owner) FROM dbl_notes", &[]).await.unwrap().get(0);
    assert_eq!(owners, 2);
    proxy.shutdown().await;
}

/// A password changed on the shard is taken at the latest on the attempt after a
/// failed one (the answer is asked again), the old one then fails; a shard still
/// holding the old verifier refuses the role with the reason.
#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_password_takes_effect_and_another_verifier_is_named() {
    role_on_both_shards("dbl_carol", "carol-pw").await;
    let proxy = start_proxy(|_| {}).await;
    login(&proxy, "dbl_carol", "carol-pw", 7).await.expect("carol logs in");
    shard_admin(1, "app").await.batch_execute("ALTER ROLE dbl_carol PASSWORD 'carol-new'").await.unwrap();
    let took = eventually(Duration::from_secs(15), || async {
        login(&proxy, "dbl_carol", "carol-new", 7).await.is_ok()
    })
    .await;
    assert!(took.is_some(), "the new password logs in");
    let old = refused(&proxy, "dbl_carol", "carol-pw", 7, "the old password fails").await;
    assert!(old.starts_with("28P01 "), "{old}");
    // Shard 2 still has the old verifier: a tenant there cannot be served as carol.
    let elsewhere = match login(&proxy, "dbl_carol", "carol-new", 1500).await {
        Err(e) => e,
        Ok(client) => {
            client.simple_query("SELECT 1 WHERE true").await.err().map(|e| e.to_string()).unwrap_or_default()
        }
    };
    assert!(elsewhere.starts_with("28000 ") && elsewhere.contains("shard 2"), "{elsewhere}");
    assert!(elsewhere.contains("not the one its client logged in with"), "{elsewhere}");
    proxy.shutdown().await;
}

/// `[auth]` changes on RELOAD: logins from the database turned on in the file reach a
/// running proxy, and turned off again, a role that is not in `[[users]]` no longer
/// logs in.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_turns_logins_from_the_database_on_and_off() {
    role_on_both_shards("dbl_dave", "dave-pw").await;
    let (proxy, file) = crate::harness::start_proxy_from_file("reload_auth", |c| c.auth.query = None).await;
    let off = refused(&proxy, "dbl_dave", "dave-pw", 7, "not in the file, and no [auth] query").await;
    assert!(off.starts_with("28P01 "), "{off}");
    let on = {
        let mut config = proxy.config.clone();
        config.auth = pgtenant::dev::demo::database_logins();
        toml::to_string_pretty(&config).unwrap()
    };
    std::fs::write(&file, &on).unwrap();
    let console = crate::harness::connect(&proxy.admin_conninfo()).await.unwrap();
    console.simple_query("RELOAD").await.expect("[auth] changes live");
    let dave = login(&proxy, "dbl_dave", "dave-pw", 7).await.expect("dave logs in after the RELOAD");
    assert_eq!(who(&dave).await.0, "dbl_dave");
    let mut config = proxy.config.clone();
    config.auth.query = None;
    std::fs::write(&file, toml::to_string_pretty(&config).unwrap()).unwrap();
    console.simple_query("RELOAD").await.expect("[auth] changes live");
    refused(&proxy, "dbl_dave", "dave-pw", 7, "turned off again").await;
    proxy.shutdown().await;
}
