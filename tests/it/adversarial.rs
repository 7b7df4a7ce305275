//! The adversarial suite of issue 22: a session bound to tenant 7 tries every channel
//! we could think of to read tenant 8's row (same shard, row-level security on, signed
//! tenant context as `pgtenant dev` sets it up). Each attempt is refused (an error) or
//! confined (no row of tenant 8 comes back).

use std::sync::Arc;

use tokio_postgres::SimpleQueryMessage;

use crate::harness::{shard_admin, start_proxy};

const TABLE: &str = "adv";

/// What an attempt got: an error's SQLSTATE, or the values of every row.
#[derive(Debug)]
enum Outcome {
    Refused(String),
    Rows(Vec<String>),
}

async fn simple(client: &tokio_postgres::Client, sql: &str) -> Outcome {
    match client.simple_query(sql).await {
        Ok(messages) => Outcome::Rows(
            messages
                .iter()
                .filter_map(|m| match m {
                    SimpleQueryMessage::Row(r) => {
                        Some((0..r.len()).filter_map(|i| r.get(i)).collect::<Vec<_>>().join(","))
                    }
                    _ => None,
                })
                .collect(),
        ),
        Err(e) => Outcome::Refused(crate::harness::sqlstate(&e)),
    }
}

fn rows_of(result: Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>) -> Outcome {
    match result {
        Ok(rows) => Outcome::Rows(rows.iter().map(|r| r.get::<_, String>(0)).collect()),
        Err(e) => Outcome::Refused(crate::harness::sqlstate(&e)),
    }
}

/// Tenant 8's secret never comes back: the attempt is refused with `refused` (pgtenant
/// reads the tenant it names), or, when `refused` is `None`, it runs and is confined
/// (no row of tenant 8 among its answers).
fn assert_walled(attempt: &str, outcome: &Outcome, refused: Option<&str>) {
    match (outcome, refused) {
        (Outcome::Refused(code), Some(expected)) => assert_eq!(code, expected, "{attempt}"),
        (Outcome::Refused(code), None) => panic!("{attempt} did not run (SQLSTATE {code})"),
        (Outcome::Rows(rows), None) => {
            assert!(rows.iter().all(|r| !r.contains("secret-8")), "{attempt} read tenant 8: {rows:?}")
        }
        (Outcome::Rows(rows), Some(expected)) => {
            panic!("{attempt} was not refused with {expected}: {rows:?}")
        }
    }
}

async fn setup() {
    let admin = shard_admin(1, "app").await;
    admin
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {TABLE} CASCADE;
             CREATE TABLE {TABLE} (tenant_id bigint, secret text);
             INSERT INTO {TABLE} VALUES (7, 'secret-7'), (8, 'secret-8');
             GRANT SELECT, INSERT, UPDATE ON {TABLE} TO app;
             CALL pgtenant.enable_tenant_isolation('{TABLE}');
             GRANT CREATE ON SCHEMA public TO app;"
        ))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bound_session_cannot_reach_another_tenants_rows_by_any_channel() {
    setup().await;
    let proxy = start_proxy(|c| c.users[0].pool_size = 4).await;
    let seven = proxy.connect(Some(7)).await;
    let t = TABLE;
    let refused = Some("42501");
    // Simple-protocol attempts: (SQL, must it be refused with 42501?).
    let attempts: Vec<(String, Option<&str>)> = vec![
        // Literals, casts, expressions.
        (format!("SELECT secret FROM {t} WHERE tenant_id = 8"), refused),
        (format!("SELECT secret FROM {t} WHERE tenant_id = '8'"), refused),
        (format!("SELECT secret FROM {t} WHERE tenant_id = '8'::bigint"), refused),
        (format!("SELECT secret FROM {t} WHERE tenant_id IN (7, 8)"), refused),
        (format!("SELECT secret FROM {t} WHERE secret = 'x' OR tenant_id = 8"), refused),
        (format!("SELECT secret FROM {t}"), None),
        (format!("SELECT secret FROM {t} WHERE tenant_id > 7"), None),
        (format!("SELECT secret FROM {t} WHERE tenant_id = 4 + 4"), None),
        (format!("SELECT secret FROM {t} WHERE tenant_id = 8.0"), None),
        (format!("SELECT secret FROM {t} WHERE tenant_id = 8e0"), None),
        (format!("SELECT secret FROM {t} WHERE tenant_id BETWEEN 8 AND 8"), None),
        (format!("SELECT secret FROM {t} WHERE tenant_id::text = '8'"), None),
        (format!("SELECT secret FROM {t} WHERE tenant_id = ANY(ARRAY[8])"), None),
        // Subqueries, CTEs, joins, UNION.
        (format!("SELECT secret FROM {t} WHERE tenant_id = (SELECT 8)"), None),
        (format!("WITH x AS (SELECT secret FROM {t} WHERE tenant_id = 8) SELECT * FROM x"), refused),
        (
            format!("WITH x AS (SELECT secret, tenant_id FROM {t}) SELECT secret FROM x WHERE tenant_id > 0"),
            None,
        ),
        (format!("SELECT a.secret FROM {t} a JOIN (VALUES (8)) v(t) ON a.tenant_id = v.t"), None),
        (
            format!(
                "SELECT secret FROM {t} WHERE tenant_id = 7 UNION SELECT secret FROM {t} WHERE tenant_id = 8"
            ),
            refused,
        ),
        (format!("SELECT (SELECT secret FROM {t} WHERE tenant_id = 8)"), refused),
        // Hints in comments are read; in strings and dollar quotes they are text.
        (format!("/* pgtenant.tenant_id=8 */ SELECT secret FROM {t}"), refused),
        (format!("/*tenant_id='8'*/ SELECT secret FROM {t}"), refused),
        (format!("SELECT '/* pgtenant.tenant_id=8 */', secret FROM {t}"), None),
        (format!("SELECT $$/* pgtenant.tenant_id=8 */$$, secret FROM {t}"), None),
        // What sqlparser does not parse.
        (format!("SELECT secret FROM {t} WHERE tenant_id = 8 FOR NO KEY UPDATE"), refused),
        (format!("SELECT secret FROM {t} FOR KEY SHARE"), None),
        // The tenant GUC, every way.
        ("SET pgtenant.tenant_id = 8".into(), refused),
        // RESET goes back to the login value: tenant 7.
        ("RESET pgtenant.tenant_id".into(), None),
        (format!("SELECT secret FROM {t}"), None),
        ("SET LOCAL pgtenant.tenant_id = 8".into(), refused),
        ("SELECT set_config('pgtenant.tenant_id', '8', false)".into(), refused),
        ("SELECT set_config('pgtenant.' || 'tenant_id', '8', false)".into(), refused),
        (
            format!(
                "DO $$ BEGIN PERFORM set_config('pgtenant.tenant_id', '8', false); END $$; SELECT secret FROM {t}"
            ),
            None,
        ),
        (
            format!(
                "BEGIN; DO $$ BEGIN PERFORM set_config('pgtenant.tenant_id', '8', true); END $$; \
                 SELECT secret FROM {t}; COMMIT"
            ),
            None,
        ),
        (
            "CREATE OR REPLACE PROCEDURE adv_proc() LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM set_config('pgtenant.tenant_id', '8', false); END $$"
                .into(),
            None,
        ),
        (format!("CALL adv_proc(); SELECT secret FROM {t}"), None),
        (
            "CREATE OR REPLACE FUNCTION adv_fn() RETURNS text LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM set_config('pgtenant.tenant_id', '8', false); RETURN 'x'; END $$"
                .into(),
            None,
        ),
        (format!("SELECT adv_fn(), secret FROM {t}"), None),
        (format!("SELECT adv_fn(); SELECT secret FROM {t}"), None),
        // SQL PREPARE, cursors, COPY, temporary views.
        (format!("PREPARE adv_p AS SELECT secret FROM {t} WHERE tenant_id = $1"), None),
        ("EXECUTE adv_p(8)".into(), None),
        (format!("BEGIN; DECLARE adv_c CURSOR FOR SELECT secret FROM {t} WHERE tenant_id = 8"), refused),
        ("ROLLBACK".into(), None),
        (
            format!("BEGIN; DECLARE adv_c CURSOR FOR SELECT secret FROM {t}; FETCH ALL FROM adv_c; COMMIT"),
            None,
        ),
        (format!("CREATE TEMP VIEW adv_v AS SELECT secret FROM {t}"), None),
        ("SELECT * FROM adv_v".into(), None),
        // Writing into another tenant.
        (format!("INSERT INTO {t} VALUES (8, 'planted')"), refused),
        (format!("UPDATE {t} SET secret = 'x' WHERE tenant_id = 8"), refused),
        (format!("UPDATE {t} SET tenant_id = 8 WHERE tenant_id = 7"), refused),
    ];
    for (sql, must_refuse) in &attempts {
        let outcome = simple(&seven, sql).await;
        assert_walled(sql, &outcome, *must_refuse);
    }
    // COPY out: the rows it writes are the rows it may read.
    let out = proxy.psql(Some(7), &["-At", "-c", &format!("COPY {t} TO STDOUT")], "");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("secret-8"), "COPY TO");
    let out = proxy.psql(
        Some(7),
        &["-At", "-c", &format!("COPY (SELECT * FROM {t} WHERE tenant_id = 8) TO STDOUT")],
        "",
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("secret-8"), "COPY (query) TO");

    // Parameters, text and binary, and prepared statements executed with new values.
    let sql = format!("SELECT secret FROM {t} WHERE tenant_id = $1");
    assert_walled("int8 parameter 8", &rows_of(seven.query(&sql, &[&8i64]).await), refused);
    // A text value cast twice: pgtenant does not read it; row-level security confines it.
    let text_sql = format!("SELECT secret FROM {t} WHERE tenant_id = $1::text::bigint");
    assert_walled("text parameter '8'", &rows_of(seven.query(&text_sql, &[&"8"]).await), None);
    let statement = seven.prepare(&sql).await.unwrap();
    assert_eq!(rows_of(seven.query(&statement, &[&7i64]).await).rows(), ["secret-7"]);
    assert_walled("prepared, then 8", &rows_of(seven.query(&statement, &[&8i64]).await), refused);
    let insert = format!("INSERT INTO {t} VALUES ($1, 'planted')");
    match seven.execute(&insert, &[&8i64]).await {
        Ok(n) => panic!("inserted {n} rows for tenant 8"),
        Err(e) => assert_eq!(crate::harness::sqlstate(&e), "42501"),
    }

    // Pipelined lanes under load: clients of tenants 7 and 8 on few connections, each
    // reading its own table rows only.
    let mut tasks = Vec::new();
    for n in 0..8i64 {
        let tenant = if n % 2 == 0 { 7 } else { 8 };
        let client = Arc::new(proxy.connect(Some(tenant)).await);
        let sql = format!("SELECT secret FROM {t}");
        tasks.push(tokio::spawn(async move {
            for _ in 0..50 {
                let rows = rows_of(client.query(&sql, &[]).await).rows();
                assert_eq!(rows, [format!("secret-{tenant}")], "a client of tenant {tenant}");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    // After all that, tenant 7 still reads its row, and tenant 8's row is unchanged.
    assert_eq!(rows_of(seven.query(&format!("SELECT secret FROM {t}"), &[]).await).rows(), ["secret-7"]);
    let admin = shard_admin(1, "app").await;
    let rows = admin.query(&format!("SELECT secret FROM {t} WHERE tenant_id = 8"), &[]).await.unwrap();
    assert_eq!(rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>(), ["secret-8"]);
}

impl Outcome {
    fn rows(self) -> Vec<String> {
        match self {
            Outcome::Rows(rows) => rows,
            Outcome::Refused(code) => panic!("refused with {code}"),
        }
    }
}
