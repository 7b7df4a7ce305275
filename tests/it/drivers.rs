//! Stock drivers other than the Rust ones: psycopg 3, asyncpg, node-postgres and
//! pgJDBC, each running an asserting script (tests/drivers/) through the proxy.
//! `.ci/run` installs them; elsewhere a missing driver skips its test with a message,
//! but under CI (`CI` set) a missing driver fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::{start_proxy, stderr, stdout};

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/drivers")
}

/// Whether `probe` succeeds; panics under CI when it does not.
fn available(what: &str, probe: &mut Command) -> bool {
    let ok = probe.output().is_ok_and(|o| o.status.success());
    if !ok {
        assert!(std::env::var_os("CI").is_none(), "{what} is not installed (.ci/run installs it)");
        eprintln!("skipped: {what} is not installed");
    }
    ok
}

async fn run_check(cmd: Command, expected: &str) {
    // The driver checks switch tenants on one connection: what a user allows per login.
    run_check_on(cmd, expected, |c| c.users[0].allow_tenant_switch = Some(true)).await;
}

/// Runs `cmd` (given the port as its last argument) against a proxy `tweak` configures.
async fn run_check_on(mut cmd: Command, expected: &str, tweak: impl FnOnce(&mut pgtenant::config::Config)) {
    let proxy = start_proxy(tweak).await;
    let port = proxy.addr.port().to_string();
    let out = tokio::task::spawn_blocking(move || cmd.arg(port).output().expect("driver check runs"))
        .await
        .unwrap();
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains(expected), "{}", stdout(&out));
}

/// Runs a Python driver's check script when the driver module imports.
async fn python_check(module: &str, script: &str, expected: &str) {
    if !available(module, Command::new("python3").args(["-c", &format!("import {module}")])) {
        return;
    }
    let mut cmd = Command::new("python3");
    cmd.arg(scripts().join(script));
    run_check(cmd, expected).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn psycopg3() {
    python_check("psycopg", "psycopg_check.py", "psycopg ok").await;
}

/// What psycopg's own test suite found through pgtenant (issue 57), section by section
/// (`tests/drivers/psycopg_found.py`), in both pool modes.
#[tokio::test(flavor = "multi_thread")]
async fn psycopg_meets_what_its_suite_found() {
    if !available("psycopg", Command::new("python3").args(["-c", "import psycopg"])) {
        return;
    }
    use pgtenant::config::PoolMode;
    for mode in [PoolMode::Transaction, PoolMode::Session] {
        for section in [
            "own_backend",
            "poisoned_statement",
            "bulk_executemany",
            "set_config_parameter",
            "prepared_statements_view",
        ] {
            let mut cmd = Command::new("python3");
            cmd.arg(scripts().join("psycopg_found.py")).arg(section);
            run_check_on(cmd, &format!("psycopg {section} ok"), move |c| {
                c.proxy.pool_mode = mode;
                if section == "poisoned_statement" {
                    // The second client gets the first one's server connection.
                    c.users[0].pool_size = 1;
                }
            })
            .await;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn asyncpg() {
    python_check("asyncpg", "asyncpg_check.py", "asyncpg ok").await;
}

fn node_postgres_available() -> bool {
    available(
        "node-postgres",
        Command::new("node").env("NODE_PATH", node_path()).args(["-e", "require('pg')"]),
    )
}

fn node_path() -> String {
    std::env::var("PGTENANT_NODE_PATH").unwrap_or_else(|_| {
        format!("{}/.cache/pgtenant-node/node_modules", std::env::var("HOME").unwrap_or_default())
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn node_postgres() {
    if !node_postgres_available() {
        return;
    }
    let mut cmd = Command::new("node");
    cmd.env("NODE_PATH", node_path()).arg(scripts().join("node_pg_check.js"));
    run_check(cmd, "node-postgres ok").await;
}

/// What node-postgres' own tests found through pgtenant (issue 57, item 4): a client
/// whose backend ends gets its 'error' and 'end' events, in both pool modes.
#[tokio::test(flavor = "multi_thread")]
async fn node_postgres_learns_its_backend_ended() {
    if !node_postgres_available() {
        return;
    }
    use pgtenant::config::PoolMode;
    for mode in [PoolMode::Transaction, PoolMode::Session] {
        let mut cmd = Command::new("node");
        cmd.env("NODE_PATH", node_path())
            .env("SHARD_PORT", crate::harness::shards().ports[0].to_string())
            .arg(scripts().join("node_pg_found.js"));
        run_check_on(cmd, "node-postgres found ok", move |c| c.proxy.pool_mode = mode).await;
    }
}

const JDBC_JAR: &str = "/usr/share/java/postgresql.jar";

#[tokio::test(flavor = "multi_thread")]
async fn pgjdbc() {
    if !available("java", Command::new("java").arg("-version"))
        || !available("pgJDBC", Command::new("test").args(["-f", JDBC_JAR]))
    {
        return;
    }
    let mut cmd = Command::new("java");
    cmd.args(["-cp", JDBC_JAR]).arg(scripts().join("JdbcCheck.java"));
    run_check(cmd, "pgjdbc ok").await;
}
