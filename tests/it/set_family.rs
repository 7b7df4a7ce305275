//! The SET family (issue 21): SQL-standard spellings (`SET/RESET TIME ZONE`, `SET NAMES`,
//! `SET SCHEMA`, `SET SEED`, `SET XML OPTION`), `SET ... TO DEFAULT`, roles. The same
//! statements run against PostgreSQL directly and through pgtenant in both pool modes
//! and both protocols must answer the same: a RESET goes back to the login value.

use pgtenant::config::PoolMode;

use crate::harness::{self, shards, start_proxy};

/// How a step is sent.
#[derive(Clone, Copy, Debug)]
enum Via {
    Simple,
    Extended,
}

/// What a statement answered: the first column of its rows, its row count, or its
/// SQLSTATE.
async fn answer(client: &tokio_postgres::Client, sql: &str, via: Via) -> String {
    match via {
        Via::Simple => match client.simple_query(sql).await {
            Ok(messages) => messages
                .iter()
                .map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).unwrap_or("NULL").to_string(),
                    tokio_postgres::SimpleQueryMessage::CommandComplete(n) => format!("({n})"),
                    _ => String::new(),
                })
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(" "),
            Err(e) => format!("E {}", harness::sqlstate(&e)),
        },
        Via::Extended => match client.query(sql, &[]).await {
            Ok(rows) => rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>().join(" "),
            Err(e) => format!("E {}", harness::sqlstate(&e)),
        },
    }
}

/// The steps: each statement, then the setting it concerns, read back.
fn script(via: Via) -> Vec<(&'static str, Via)> {
    let show = |sql| (sql, via);
    vec![
        ("SET TIME ZONE 'CST7CDT'", via),
        show("SHOW TimeZone"),
        ("RESET TIME ZONE", via),
        show("SHOW TimeZone"),
        ("SET TIME ZONE 'Asia/Tokyo'", via),
        ("SET TIME ZONE DEFAULT", via),
        show("SHOW TimeZone"),
        ("SET TIME ZONE 'Asia/Tokyo'", via),
        ("SET TIME ZONE LOCAL", via),
        show("SHOW TimeZone"),
        ("SET TimeZone = 'Europe/Paris'", via),
        ("SET TimeZone TO DEFAULT", via),
        show("SHOW TimeZone"),
        ("SET statement_timeout = '5s'", via),
        show("SHOW statement_timeout"),
        ("SET statement_timeout TO DEFAULT", via),
        show("SHOW statement_timeout"),
        ("SET SCHEMA 'pg_catalog'", via),
        show("SHOW search_path"),
        ("SET search_path = DEFAULT", via),
        show("SHOW search_path"),
        ("SET NAMES 'UTF8'", via),
        ("SET NAMES DEFAULT", via),
        show("SHOW client_encoding"),
        ("SET XML OPTION DOCUMENT", via),
        show("SHOW xmloption"),
        ("RESET xmloption", via),
        show("SHOW xmloption"),
        ("SET ROLE app", via),
        show("SHOW role"),
        ("RESET ROLE", via),
        show("SHOW role"),
        ("SET SESSION AUTHORIZATION DEFAULT", via),
        show("SELECT current_user::text"),
        // The random() sequence a seed starts goes on across statements.
        ("SET SEED TO 0.25", via),
        ("SELECT random()::text", Via::Simple),
        ("SELECT random()::text", Via::Simple),
        ("SELECT random()::text", Via::Simple),
        ("RESET ALL", via),
        show("SHOW TimeZone"),
        show("SHOW statement_timeout"),
    ]
}

/// Login settings that differ from the server's defaults.
const LOGIN: &str = "options='-c TimeZone=PST8PDT -c statement_timeout=123s -c pgtenant.tenant_id=7'";

async fn run(conninfo: &str, via: Via) -> Vec<String> {
    let client = harness::connect(conninfo).await.expect("connect");
    let mut seen = Vec::new();
    for (sql, via) in script(via) {
        seen.push(format!("{sql}: {}", answer(&client, sql, via).await));
    }
    seen
}

async fn same_as_postgres(mode: PoolMode) {
    let direct = format!(
        "host=127.0.0.1 port={} user=app password=app dbname=app sslmode=disable {}",
        shards().ports[0],
        // A server takes the tenant parameter too: a custom setting.
        LOGIN
    );
    let proxy = start_proxy(|c| c.proxy.pool_mode = mode).await;
    for via in [Via::Simple, Via::Extended] {
        let expected = run(&direct, via).await;
        assert!(expected.iter().any(|l| l.starts_with("SHOW TimeZone: PST8PDT")), "{expected:?}");
        // Several clients at once, so that transaction pooling hands each statement to
        // whichever server connection is free.
        let runs: Vec<_> = (0..3)
            .map(|_| {
                let conninfo = proxy.conninfo(LOGIN);
                tokio::spawn(async move { run(&conninfo, via).await })
            })
            .collect();
        for seen in runs {
            assert_eq!(seen.await.unwrap(), expected, "{mode:?} pooling, {via:?} protocol");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_set_family_answers_as_postgres_does_in_transaction_pooling() {
    same_as_postgres(PoolMode::Transaction).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_set_family_answers_as_postgres_does_in_session_pooling() {
    same_as_postgres(PoolMode::Session).await;
}
