//! pgtenant's statement analysis held against PostgreSQL itself (issue 50): each
//! statement of the SQL fuzz corpus and of a list written here runs on a real shard,
//! in a READ ONLY transaction that is rolled back, and the server's verdict is checked
//! against what the analysis promised:
//!
//! - one it calls a read that waits on nobody (`cannot_wait`: what lanes and replicas
//!   take) and one it calls not writing that runs no code pgtenant does not know (what
//!   a read-only tenant is allowed without the server's wall) must not be refused as a
//!   write (25006), nor change a row (`pg_stat_xact_user_tables`);
//! - one it calls neutral to the session (`session_risk` Nothing, no setting it
//!   follows) must leave the session's settings (`pg_settings`, source `session`) as
//!   they were.
//!
//! A disagreement is a bug of the analysis, to be fixed there.

use pgtenant::directory::TenantKey;
use pgtenant::router::{SessionRisk, StatementKind, analyze_statement};
use tokio_postgres::SimpleQueryMessage;

use crate::harness::{shard_admin, sqlstate};

/// Statements written for this test: reads, writes and session changes of every
/// shape the analysis tells apart.
const WRITTEN: &[&str] = &[
    "SELECT * FROM cls_t WHERE tenant_id = 7",
    "SELECT count(*), max(v) FROM cls_t GROUP BY tenant_id ORDER BY 1 LIMIT 3",
    "WITH x AS (SELECT * FROM cls_t) SELECT * FROM x",
    "WITH d AS (DELETE FROM cls_t RETURNING *) SELECT * FROM d",
    "WITH u AS (UPDATE cls_t SET v = v RETURNING *) SELECT count(*) FROM u",
    "SELECT * FROM cls_t FOR UPDATE",
    "SELECT * FROM cls_t FOR NO KEY UPDATE",
    "SELECT * FROM cls_t FOR SHARE",
    "SELECT * INTO cls_copy FROM cls_t",
    "VALUES (1), (2)",
    "TABLE cls_t",
    "SELECT nextval('cls_seq')",
    "SELECT setval('cls_seq', 5)",
    "SELECT pg_advisory_xact_lock(1)",
    "SELECT set_config('application_name', 'x', false)",
    "SELECT set_config('work_mem', '5MB', true)",
    "SELECT current_setting('work_mem'), now(), lower('A'), jsonb_build_object('a', 1)",
    "SELECT cls_write()",
    "INSERT INTO cls_t VALUES (7, 1)",
    "UPDATE cls_t SET v = 2",
    "DELETE FROM cls_t",
    "MERGE INTO cls_t t USING (VALUES (7)) s(a) ON t.tenant_id = s.a WHEN MATCHED THEN DELETE",
    "COPY cls_t TO STDOUT",
    "COPY (SELECT 1) TO STDOUT",
    "COPY (DELETE FROM cls_t RETURNING *) TO STDOUT",
    "EXPLAIN SELECT * FROM cls_t",
    "EXPLAIN ANALYZE DELETE FROM cls_t",
    "EXPLAIN (ANALYZE, COSTS OFF) UPDATE cls_t SET v = 3",
    "SHOW work_mem",
    "SET work_mem = '8MB'",
    "SET LOCAL work_mem = '8MB'",
    "RESET work_mem",
    "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",
    "SAVEPOINT a",
    "DECLARE c CURSOR FOR SELECT * FROM cls_t",
    "LISTEN cls_channel",
    "NOTIFY cls_channel",
    "DISCARD ALL",
    "CREATE TABLE cls_new (a int)",
    "CREATE TEMP TABLE cls_tmp (a int)",
    "DROP TABLE cls_t",
    "TRUNCATE cls_t",
    "ALTER TABLE cls_t ADD COLUMN w int",
    "VACUUM cls_t",
    "ANALYZE cls_t",
    "CLUSTER cls_t",
    "GRANT SELECT ON cls_t TO PUBLIC",
    "COMMENT ON TABLE cls_t IS 'x'",
    "LOCK TABLE cls_t",
    "DO $$ BEGIN INSERT INTO cls_t VALUES (7, 9); END $$",
    "CALL cls_proc()",
    "PREPARE cls_p AS SELECT 1",
    "SELECT lo_create(0)",
    "SELECT txid_current()",
    "SELECT pg_notify('cls_channel', 'x')",
    "REFRESH MATERIALIZED VIEW cls_mv",
    "SECURITY LABEL ON TABLE cls_t IS 'x'",
    "IMPORT FOREIGN SCHEMA x FROM SERVER y INTO z",
    "REINDEX TABLE cls_t",
    "CHECKPOINT",
];

/// The corpus and the list above, as text.
fn statements() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/sql");
    let mut all: Vec<String> = std::fs::read_dir(&dir)
        .expect("the SQL fuzz corpus")
        .filter_map(|e| String::from_utf8(std::fs::read(e.ok()?.path()).ok()?).ok())
        // Over this length the corpus holds generated noise only.
        .filter(|s| s.len() < 4096 && !s.contains('\0'))
        .collect();
    all.sort();
    all.extend(WRITTEN.iter().map(|s| s.to_string()));
    all
}

/// One column of the one row of `sql`.
async fn one(client: &tokio_postgres::Client, sql: &str) -> String {
    let rows = client.simple_query(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("").to_string()),
            _ => None,
        })
        .unwrap_or_default()
}

/// A session on shard 1 as the superuser, acting as `app` (the role tenants use).
async fn fresh_session() -> tokio_postgres::Client {
    let client = shard_admin(1, "app").await;
    client.batch_execute(SETUP).await.unwrap();
    client
}

/// The session the statements run in: the role tenants use, and no statement of the
/// corpus waits long.
const SETUP: &str = "SET ROLE app; SET statement_timeout = '5s'";

const ROWS_CHANGED: &str =
    "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_xact_user_tables";
const SESSION_SETTINGS: &str = "SELECT coalesce(string_agg(name || '=' || setting, ',' ORDER BY name), '') FROM pg_settings WHERE source = 'session'";

#[tokio::test(flavor = "multi_thread")]
async fn the_analysis_agrees_with_postgresql_on_what_a_statement_does() {
    let admin = shard_admin(1, "app").await;
    admin
        .batch_execute(
            "DROP TABLE IF EXISTS cls_t CASCADE; DROP SEQUENCE IF EXISTS cls_seq;
             CREATE TABLE cls_t (tenant_id bigint, v int); INSERT INTO cls_t VALUES (7, 1), (8, 2);
             CREATE SEQUENCE cls_seq;
             CREATE OR REPLACE FUNCTION cls_write() RETURNS int LANGUAGE sql AS 'INSERT INTO cls_t VALUES (7, 5) RETURNING 5';
             CREATE OR REPLACE PROCEDURE cls_proc() LANGUAGE sql AS 'INSERT INTO cls_t VALUES (7, 6)';
             CREATE MATERIALIZED VIEW IF NOT EXISTS cls_mv AS SELECT 1 AS a;",
        )
        .await
        .unwrap();
    let mut disagreements = Vec::new();
    let mut checked = (0, 0);
    let mut client = fresh_session().await;
    for sql in statements() {
        let analysis = analyze_statement(sql.as_bytes(), "pgtenant.tenant_id", TenantKey::Bigint);
        let reads = analysis.effects().cannot_wait
            || (!analysis.effects().writes.shown() && analysis.effects().session == SessionRisk::Nothing);
        let neutral = analysis.effects().session == SessionRisk::Nothing
            && analysis.session_changes.is_empty()
            && analysis.pin.is_none()
            && !matches!(
                analysis.kind,
                StatementKind::Set { .. } | StatementKind::Reset { .. } | StatementKind::ResetAll
            );
        if !reads && !neutral {
            continue;
        }
        if client.is_closed() {
            client = fresh_session().await;
        }
        let settings_before = one(&client, SESSION_SETTINGS).await;
        client.batch_execute("BEGIN READ ONLY").await.unwrap();
        let outcome = client.simple_query(&sql).await;
        let refused_as_write = matches!(&outcome, Err(e) if sqlstate(e) == "25006");
        let in_transaction =
            outcome.is_ok() && !matches!(analysis.kind, StatementKind::Commit | StatementKind::Rollback);
        let rows_changed = if in_transaction { one(&client, ROWS_CHANGED).await } else { "0".into() };
        let _ = client.batch_execute("ROLLBACK").await;
        if client.is_closed() {
            // COPY ... TO STDOUT in a simple query ends tokio-postgres's connection.
            client = fresh_session().await;
            continue;
        }
        let settings_after = one(&client, SESSION_SETTINGS).await;
        if reads {
            checked.0 += 1;
            if refused_as_write || rows_changed != "0" {
                disagreements
                    .push(format!("called a read, but wrote: {sql:?} ({outcome:?}, rows {rows_changed})"));
            }
        }
        if neutral && outcome.is_ok() {
            checked.1 += 1;
            if settings_after != settings_before {
                disagreements.push(format!(
                    "called session-neutral, but changed settings: {sql:?} ({settings_before} -> {settings_after})"
                ));
            }
        }
        // Nothing a statement left in the session reaches the next one.
        if settings_after != settings_before || !neutral {
            let _ = client.batch_execute("DISCARD ALL").await;
            let _ = client.batch_execute(SETUP).await;
        }
    }
    eprintln!("checked {} statements called reads, {} called session-neutral", checked.0, checked.1);
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
    assert!(checked.0 > 50 && checked.1 > 50, "too few statements checked: {checked:?}");
}
