//! The statement analysis, statement by statement.

use super::*;
use crate::router::{ConfigArg, Protected, target_of};

const P: &str = "pgtenant.tenant_id";

fn kind(sql: &str) -> StatementKind {
    analyze(sql.as_bytes(), P, TenantKey::Bigint).kind
}

#[test]
fn tells_reads_from_writes() {
    let writes = |sql: &str| analyze(sql.as_bytes(), P, TenantKey::Bigint).effects().writes.shown();
    assert!(!writes("select * from accounts where tenant_id = 1"));
    assert!(!writes("/* c */ SHOW TimeZone; BEGIN; select 1; COMMIT"));
    assert!(!writes("with a as (select 1) select * from a"));
    assert!(writes("insert into accounts values (1)"));
    assert!(writes("select 1; delete from accounts"));
    assert!(writes("with d as (delete from accounts returning *) select * from d"));
    assert!(writes("select * into copy_of from accounts"));
    assert!(writes("select * from accounts for update"));
    assert!(writes("select * from accounts for share"));
    assert!(writes("SELECT name FROM accounts a WHERE a.tenant_id = 5 FOR KEY SHARE"));
    assert!(writes("explain analyze update accounts set x = 1"));
    assert!(writes("create table t (a int)"));
    assert!(writes("copy accounts from stdin"));
    assert!(!writes("COPY (SELECT 1) TO STDOUT"));
    assert!(!writes("copy accounts to stdout with (format csv)"));
    assert!(writes("copy (delete from accounts returning *) to stdout"));
    assert!(writes("copy accounts to program 'cat'"));
    assert!(!writes("BEGIN; SAVEPOINT a; RELEASE a; ROLLBACK TO SAVEPOINT a; COMMIT"));
}

#[test]
fn sees_every_way_to_lift_the_read_only_wall() {
    let lifts =
        |sql: &str| analyze(sql.as_bytes(), P, TenantKey::Bigint).protected.contains(Protected::ReadOnlyWall);
    for sql in [
        "BEGIN READ WRITE",
        "begin isolation level serializable, read write",
        "START TRANSACTION READ WRITE",
        "BEGIN; SET TRANSACTION READ WRITE; SELECT 1; COMMIT",
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
        "SET default_transaction_read_only = off",
        "set session DEFAULT_TRANSACTION_READ_ONLY to false",
        "SET LOCAL transaction_read_only = off",
        "RESET default_transaction_read_only",
        "SELECT set_config('default_transaction_read_only', 'off', false)",
        "SELECT 1; SELECT pg_catalog.set_config('transaction_read_only', 'off', true)",
    ] {
        assert!(lifts(sql), "{sql}");
    }
    for sql in
        ["BEGIN", "BEGIN READ ONLY", "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", "SELECT 1", "RESET ALL"]
    {
        assert!(!lifts(sql), "{sql}");
    }
}

#[test]
fn sees_every_way_to_change_the_tenant_signature() {
    let tampers = |sql: &str| {
        analyze(sql.as_bytes(), P, TenantKey::Bigint).protected.contains(Protected::TenantSignature)
    };
    for sql in [
        "SET pgtenant.tenant_sig = 'x'",
        "set session \"pgtenant\".tenant_sig to default",
        "SET LOCAL pgtenant.TENANT_SIG = ''",
        "RESET pgtenant.tenant_sig",
        "SELECT 1; SELECT pg_catalog.set_config('pgtenant.tenant_sig', '', false)",
        "ALTER ROLE app SET pgtenant.tenant_sig = 'x'",
    ] {
        assert!(tampers(sql), "{sql}");
    }
    for sql in ["SET pgtenant.tenant_id = 7", "RESET ALL", "SELECT current_setting('pgtenant.tenant_sig')"] {
        assert!(!tampers(sql), "{sql}");
    }
}

#[test]
fn sees_sql_that_names_pgtenants_own_prepared_statements() {
    let reserved = |sql: &str| analyze(sql.as_bytes(), P, TenantKey::Bigint).reserved_statement;
    for (sql, name) in [
        ("EXECUTE __pgtenant_1", "__pgtenant_1"),
        ("execute __PGTENANT_12 (1, 'x')", "__pgtenant_12"),
        ("DEALLOCATE \"__pgtenant_set_tenant\"", "__pgtenant_set_tenant"),
        ("DEALLOCATE PREPARE __pgtenant_3", "__pgtenant_3"),
        ("SELECT 1; PREPARE __pgtenant_x AS SELECT 1", "__pgtenant_x"),
    ] {
        assert_eq!(reserved(sql).as_deref(), Some(name), "{sql}");
    }
    for sql in [
        "EXECUTE pgtenant_set_tenant",
        "PREPARE TRANSACTION '__pgtenant_1'",
        "DEALLOCATE ALL",
        "EXECUTE \"__PGTENANT_1\"",
        "SELECT '__pgtenant_1'",
    ] {
        assert_eq!(reserved(sql), None, "{sql}");
    }
}

#[test]
fn sees_every_way_to_change_the_tenant_guc() {
    let tampers =
        |sql: &str| analyze(sql.as_bytes(), P, TenantKey::Bigint).protected.contains(Protected::TenantGuc);
    assert!(tampers("SELECT set_config('pgtenant.tenant_id', '5', false)"));
    assert!(tampers("select pg_catalog.set_config('PGTENANT.TENANT_ID', '5', true)"));
    let bound = analyze(b"SELECT set_config($2, $1, true)", P, TenantKey::Bigint);
    assert!(bound.protected.is_empty(), "the name is read from the Bind");
    assert_eq!(&bound.set_config_name_params[..], [2], "and checked there");
    assert!(tampers("SELECT set_config(lower('PGTENANT.TENANT_ID'), '5', false)"));
    assert!(tampers("SELECT set_config(E'pgtenant\\x2etenant_id', '5', false)"));
    assert!(tampers("BEGIN; SET LOCAL pgtenant.tenant_id = 5; COMMIT"));
    assert!(tampers("ALTER ROLE app SET pgtenant.tenant_id = '5'"));
    assert!(tampers("alter database app set PGTENANT.tenant_id to 5"));
    assert!(!tampers("SELECT set_config('application_name', 'x', false)"));
    // pg_dump's way: the name of the one pg_settings row read.
    let dump = "SELECT set_config(name, 'view, foreign-table', false) FROM pg_settings WHERE name = 'restrict_nonsystem_relation_kind'";
    assert!(!tampers(dump));
    assert!(tampers(
        "SELECT set_config(name, '5', false) FROM pg_settings WHERE name = 'pgtenant.tenant_id'"
    ));
    assert!(tampers("SELECT set_config(name, '5', false) FROM pg_settings WHERE name LIKE 'pgtenant%'"));
    assert!(tampers("SELECT set_config(name, '5', false) FROM pg_settings"));
    assert!(tampers("SELECT set_config(name, 'x', false)"));
    assert!(!tampers(
        "select set_config(name, 'x', false) from pg_catalog.pg_settings where name = 'work_mem'"
    ));
    let changes = analyze(dump.as_bytes(), P, TenantKey::Bigint).session_changes;
    assert_eq!(
        changes[..],
        [SessionChange::Set {
            name: "restrict_nonsystem_relation_kind".into(),
            value: "'view, foreign-table'".into()
        }]
    );
    assert!(!tampers("SET LOCAL statement_timeout = 5"));
    assert!(!tampers("ALTER TABLE accounts ADD COLUMN note text"));
}

#[test]
fn classifies_transaction_control_and_settings() {
    assert_eq!(kind("BEGIN"), StatementKind::Begin);
    assert_eq!(kind("start transaction isolation level serializable"), StatementKind::Begin);
    assert_eq!(kind("commit;"), StatementKind::Commit);
    assert_eq!(kind("ROLLBACK"), StatementKind::Rollback);
    assert_eq!(kind("ROLLBACK TO SAVEPOINT a"), StatementKind::Other);
    assert_eq!(kind("SET pgtenant.tenant_id = 42"), StatementKind::SetTenant(TenantId::Int(42)));
    assert_eq!(kind("set session pgtenant.tenant_id to '7';"), StatementKind::SetTenant(TenantId::Int(7)));
    assert_eq!(kind("RESET pgtenant.tenant_id"), StatementKind::ResetTenant);
    assert_eq!(kind("show pgtenant.routing_version;"), StatementKind::ShowRoutingVersion);
    assert_eq!(kind("show pgtenant.routing_version_x"), StatementKind::Other);
    assert_eq!(kind("SET pgtenant.tenant_id TO DEFAULT"), StatementKind::ResetTenant);
    assert_eq!(
        kind("SET application_name = 'x y'"),
        StatementKind::Set { name: "application_name".into(), value: "'x y'".into() }
    );
    assert_eq!(
        kind("SET TIME ZONE 'UTC'"),
        StatementKind::Set { name: "TimeZone".into(), value: "'UTC'".into() }
    );
    assert_eq!(kind("SET LOCAL search_path = a"), StatementKind::Other);
    assert_eq!(kind("RESET ALL"), StatementKind::ResetAll);
    assert_eq!(kind("reset search_path"), StatementKind::Reset { name: "search_path".into() });
    assert_eq!(kind("DISCARD ALL"), StatementKind::DiscardAll);
    assert_eq!(kind("DEALLOCATE ALL"), StatementKind::DiscardAll);
    assert_eq!(kind("deallocate prepare ALL"), StatementKind::DiscardAll);
    assert_eq!(kind("DEALLOCATE a1"), StatementKind::Deallocate("a1".into()));
    assert_eq!(kind("DEALLOCATE PREPARE \"S_1\""), StatementKind::Deallocate("S_1".into()));
    let a = analyze(b"SET pgtenant.tenant_id = abc", P, TenantKey::Bigint);
    assert_eq!(a.bad_setting.map(|b| b.value).as_deref(), Some("abc"));
    let a = analyze(b"SET pgtenant.target = 'anywhere'", P, TenantKey::Bigint);
    assert_eq!(a.bad_setting.map(|b| b.value).as_deref(), Some("'anywhere'"));
    assert_eq!(
        kind("set pgtenant.target to 'prefer-replica'"),
        StatementKind::Set { name: "pgtenant.target".into(), value: "'prefer-replica'".into() }
    );
    assert_eq!(target_of("'prefer-replica'"), Some(crate::router::TargetMode::PreferReplica));
    assert_eq!(target_of("replica"), Some(crate::router::TargetMode::Replica));
}

#[test]
fn follows_session_settings_or_pins_what_it_cannot_follow() {
    let changes = |sql: &str| analyze(sql.as_bytes(), P, TenantKey::Bigint).session_changes.to_vec();
    let pin = |sql: &str| analyze(sql.as_bytes(), P, TenantKey::Bigint).pin;
    let set = |name: &str, value: &str| SessionChange::Set { name: name.into(), value: value.into() };
    assert_eq!(
        kind("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ"),
        StatementKind::Set {
            name: "default_transaction_isolation".into(),
            value: "'repeatable read'".into()
        }
    );
    assert_eq!(
        changes("set session characteristics as transaction read only"),
        [set("default_transaction_read_only", "on")]
    );
    let reset = |name: &str| StatementKind::Reset { name: name.into() };
    assert_eq!(kind("SET TIME ZONE LOCAL"), reset("TimeZone"));
    // The SQL-standard spellings and DEFAULT are the RESETs they stand for.
    assert_eq!(kind("RESET TIME ZONE"), reset("TimeZone"));
    assert_eq!(kind("set time zone default"), reset("TimeZone"));
    assert_eq!(kind("SET statement_timeout TO DEFAULT"), reset("statement_timeout"));
    assert_eq!(kind("SET SESSION search_path = default"), reset("search_path"));
    assert_eq!(kind("SET NAMES DEFAULT"), reset("client_encoding"));
    assert_eq!(
        kind("SET SCHEMA 'x'"),
        StatementKind::Set { name: "search_path".into(), value: "'x'".into() }
    );
    assert_eq!(changes("DISCARD ALL"), [SessionChange::ResetAll]);
    // Several statements: every change, in order, when nothing else decides their fate.
    assert_eq!(
        changes("SET search_path = a; SELECT 1; RESET TimeZone"),
        [set("search_path", "a"), SessionChange::Reset { name: "TimeZone".into() }]
    );
    for sql in [
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY, DEFERRABLE",
        "SET XML OPTION DOCUMENT",
        "SET TIME ZONE INTERVAL '+02:00' HOUR TO MINUTE",
        "SET SEED TO 0.5",
        "set seed = 0",
        "BEGIN; SET search_path = a; ROLLBACK",
        "SELECT 1; SET XML OPTION CONTENT",
    ] {
        assert_eq!(pin(sql), Some(PinReason::UnfollowedSet), "{sql}");
        assert!(changes(sql).is_empty(), "{sql}");
    }
    // Over with the transaction: nothing to follow, nothing to pin.
    for sql in [
        "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        "SET LOCAL search_path = a",
        "SET CONSTRAINTS ALL DEFERRED",
    ] {
        assert_eq!(pin(sql), None, "{sql}");
        assert!(changes(sql).is_empty(), "{sql}");
    }
    // set_config for the session, as asyncpg calls it around its type introspection.
    assert_eq!(
        changes("SELECT current_setting('jit') AS cur, set_config('jit', 'off', false) AS new"),
        [set("jit", "'off'")]
    );
    assert_eq!(
        changes("select pg_catalog.set_config('jit', $1, 'f'), set_config('x.y', 5, false)"),
        [
            SessionChange::SetFromParameters {
                name: ConfigArg::Text("jit".into()),
                value: ConfigArg::Parameter(1)
            },
            set("x.y", "5")
        ]
    );
    for sql in [
        "select 1, set_config('x.y', f(1, 2), false)",
        "SELECT set_config(name, 'v', false) FROM t",
        "SELECT set_config('x.y', 'v', $1)",
        "SELECT set_config('x.y', E'\\n', false)",
    ] {
        assert_eq!(pin(sql), Some(PinReason::UnfollowedSet), "{sql}");
    }
    // Local to the transaction: nothing to follow.
    for sql in
        ["SELECT set_config('request.claims', concat('a', $1), true)", "SELECT set_config('x.y', 'v', 'on')"]
    {
        assert_eq!(pin(sql), None, "{sql}");
        assert!(changes(sql).is_empty(), "{sql}");
    }
    assert_eq!(pin("SET SESSION AUTHORIZATION other"), Some(PinReason::RoleChange));
    assert_eq!(pin("SET ROLE other"), Some(PinReason::RoleChange));
}

#[test]
fn every_prefix_of_a_settings_statement_is_analysed_without_panic() {
    for sql in [
        "SELECT set_config(name, 'x', false) FROM pg_catalog.pg_settings WHERE name = 'work_mem'",
        "select pg_catalog.set_config('a.b', $12, 'off'), set_config(('x'), f(1, (2)), true)",
        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED, READ ONLY",
        "DEALLOCATE PREPARE \"a\"\"b\"; BEGIN; SET TIME ZONE INTERVAL '1' HOUR; COMMIT",
    ] {
        for end in 0..=sql.len() {
            let _ = analyze(&sql.as_bytes()[..end], P, TenantKey::Bigint);
        }
    }
}

#[test]
fn finds_hints_pins_and_multi_statements() {
    assert_eq!(
        analyze(b"SELECT 1 /* pgtenant.tenant_id=42 */", P, TenantKey::Bigint).hint,
        Some(TenantId::Int(42))
    );
    assert_eq!(
        analyze(b"SELECT * FROM t /*controller='x',tenant_id='1500'*/", P, TenantKey::Bigint).hint,
        Some(TenantId::Int(1500))
    );
    assert_eq!(analyze(b"SELECT '/* tenant_id=5 */'", P, TenantKey::Bigint).hint, None);
    assert_eq!(analyze(b"LISTEN chan", P, TenantKey::Bigint).pin, Some(PinReason::Listen));
    assert_eq!(
        analyze(b"select pg_advisory_lock(1)", P, TenantKey::Bigint).pin,
        Some(PinReason::AdvisoryLock)
    );
    assert_eq!(analyze(b"select pg_advisory_xact_lock(1)", P, TenantKey::Bigint).pin, None);
    assert_eq!(analyze(b"CREATE TEMP TABLE t (a int)", P, TenantKey::Bigint).pin, Some(PinReason::TempTable));
    for sql in [
        "SELECT 1 AS a INTO TEMP t",
        "select * into local temporary table t from x",
        "CREATE TABLE pg_temp.t (a int)",
    ] {
        assert_eq!(analyze(sql.as_bytes(), P, TenantKey::Bigint).pin, Some(PinReason::TempTable), "{sql}");
    }
    assert_eq!(analyze(b"SELECT 1 INTO t", P, TenantKey::Bigint).pin, None);
    assert_eq!(
        analyze(b"DECLARE c CURSOR WITH HOLD FOR SELECT 1", P, TenantKey::Bigint).pin,
        Some(PinReason::HoldCursor)
    );
    assert!(analyze(b"SELECT 1; SELECT 2;", P, TenantKey::Bigint).is_multi);
    assert!(analyze(b"SELECT 1; SET pgtenant.tenant_id = 5", P, TenantKey::Bigint).sets_tenant_among_many);
    assert!(analyze(b"RESET pgtenant.tenant_id; SELECT 1", P, TenantKey::Bigint).sets_tenant_among_many);
    assert!(!analyze(b"SET pgtenant.tenant_id = 5", P, TenantKey::Bigint).sets_tenant_among_many);
    assert!(analyze(b"SELECT 1; SET pgtenant.tenant_id = abc", P, TenantKey::Bigint).sets_tenant_among_many);
    assert!(!analyze(b"SELECT ';' ; ", P, TenantKey::Bigint).is_multi);
}

#[test]
fn plain_dml_takes_the_fast_path_and_anything_unusual_does_not() {
    assert!(is_plain_dml(b"SELECT abalance FROM pgbench_accounts WHERE aid = $1"));
    assert!(!is_plain_dml(b"select $$;$$"));
    assert!(is_plain_dml(b" select * from t where id = 5;"));
    assert!(is_plain_dml(b"UPDATE t SET v = v + 1 WHERE id = 2"));
    assert!(!is_plain_dml(b"select 1; select 2"));
    assert!(!is_plain_dml(b"select 1 /* pgtenant.tenant_id=4 */"));
    assert!(!is_plain_dml(b"select pg_advisory_lock(1)"));
    assert!(!is_plain_dml(b"select * into temp t from x"));
    assert!(!is_plain_dml(b"SET x = 1"));
    assert!(!is_plain_dml(b"select 1 -- note"));
    assert!(!is_plain_dml(b"select $tag$x$tag$"));
    assert!(!is_plain_dml(b"select $"));
    assert!(!is_plain_dml(b"select E'a\\b'"));
    assert!(!is_plain_dml(b"SELECT SET_CONFIG('a', 'b', false)"));
    assert!(!is_plain_dml(b"SELECT PGTENANT.next_id()"));
    assert!(!is_plain_dml(b"create temp table t (a int)"));
    assert!(is_plain_dml(b"select a - b, c / d from t where x = $12"));
    assert!(
        is_plain_dml(b"TABLE t") && is_plain_dml(b"MERGE INTO t USING u ON true WHEN MATCHED THEN DELETE")
    );
    // Case-insensitive search by first byte, at the end and past it.
    assert!(contains_ignore_case(b"xx TENANT_id", b"tenant_id"));
    assert!(!contains_ignore_case(b"tenant_i", b"tenant_id"));
    assert!(!contains_ignore_case(b"", b"a") && !contains_ignore_case(b"abc", b""));
    // Both paths agree on what they share.
    for sql in [
        "select * from t where id = 5",
        "insert into t values (1)",
        "TABLE t",
        "merge into t using u on true when matched then delete",
    ] {
        let a = analyze(sql.as_bytes(), P, TenantKey::Bigint);
        assert_eq!((a.kind, a.hint, a.pin, a.is_multi), (StatementKind::Other, None, None, false));
    }
}

#[test]
fn invalid_utf8_and_multibyte_text_never_panic() {
    let a = analyze(b"SELECT \xff\xfe /* pgtenant.tenant_id=5 */ FROM t", P, TenantKey::Bigint);
    assert_eq!(a.hint, Some(TenantId::Int(5)));
    let a = analyze("SELECT 'é' /* café=1 */ , \"ü\" FROM t; SET é = ü".as_bytes(), P, TenantKey::Bigint);
    assert!(a.is_multi);
    for junk in [&b"\xc3"[..], b"E'\\\xc3", b"/*\xe2\x82", b"$\xf0$ x", b"SET \xff = 1"] {
        let _ = analyze(junk, P, TenantKey::Bigint);
    }
}

/// The plain-DML fast path and the analysis from tokens agree on every statement of the
/// SQL fuzz corpus (and a few written here) that the fast path takes.
#[test]
fn the_fast_path_agrees_with_the_full_analysis_on_the_corpus() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/sql");
    let mut texts: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .map(|entries| entries.filter_map(|e| std::fs::read(e.ok()?.path()).ok()).collect())
        .unwrap_or_default();
    assert!(texts.len() > 100, "the corpus at {}", dir.display());
    for sql in [
        "SELECT abalance FROM pgbench_accounts WHERE aid = $1",
        "UPDATE pgbench_accounts SET abalance = abalance + $1 WHERE aid = $2",
        "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (1, 2, 3, 4, CURRENT_TIMESTAMP)",
        "select * from pg_stat_activity",
        "SELECT * FROM pg_prepared_statements",
        "select pg_backend_pid()",
        "select 1 from t where a = 'pg_locks'",
    ] {
        texts.push(sql.as_bytes().to_vec());
    }
    let mut plain = 0;
    for sql in &texts {
        if !is_plain_dml(sql) || mentions_all_shards(sql) {
            continue;
        }
        plain += 1;
        let full = analyze_tokens(sql, P, TenantKey::Bigint);
        let what = String::from_utf8_lossy(sql);
        assert_eq!(full.kind, StatementKind::Other, "{what}");
        assert_eq!((full.pin, full.is_multi, full.sets_tenant_among_many), (None, false, false), "{what}");
        assert!(full.session_changes.is_empty() && full.bad_setting.is_none(), "{what}");
        assert!(full.protected.is_empty() && !full.effects().controls_transaction, "{what}");
        assert!(full.set_config_name_params.is_empty(), "{what}");
        assert!(full.other_sessions.is_none() && full.prepared_view.is_empty(), "{what}");
        assert!(full.effects().single_dml && full.hint.is_none(), "{what}");
    }
    assert!(plain > 10, "only {plain} statements took the fast path");
}

/// The search at underscores answers as a look at every byte does, on texts built
/// around the word's edges (case, what follows, overlaps, the ends of the text).
#[test]
fn all_shards_is_found_at_its_underscore_as_at_any_byte() {
    let every_byte = |sql: &[u8]| {
        let n = ALL_SHARDS.len();
        sql.windows(n + 1)
            .any(|w| w[..n].eq_ignore_ascii_case(ALL_SHARDS.as_bytes()) && matches!(w[n], b'.' | b'"'))
    };
    let parts: [&[u8]; 10] =
        [b"all_shards", b"ALL_SHARDS", b"All_Shards", b"all_", b"_shards", b".", b"\"", b"x", b"_", b" "];
    let mut texts: Vec<Vec<u8>> = vec![Vec::new()];
    for _ in 0..3 {
        let longer: Vec<Vec<u8>> =
            texts.iter().flat_map(|t| parts.iter().map(move |p| [t.as_slice(), p].concat())).collect();
        texts.extend(longer);
    }
    for text in &texts {
        assert_eq!(mentions_all_shards(text), every_byte(text), "{}", String::from_utf8_lossy(text));
    }
    assert!(mentions_all_shards(b"select * from all_shards.t"));
    assert!(!mentions_all_shards(b"select all_shards from t"));
}
