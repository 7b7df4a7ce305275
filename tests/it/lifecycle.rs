//! The process as deployed (issue 26): the real binary serving a configuration file.
//! SIGTERM drains (a transaction in flight commits, new connections are refused, idle
//! clients get 57P01, exit status 0); SIGHUP reloads a changed password and pool size
//! under pgbench without dropping anyone; a second process takes over the port with
//! SO_REUSEPORT while the first drains, under pgbench -C, with no failed transaction;
//! clients reach it over a Unix socket; `${NAME}` comes from the environment.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pgtenant::config::Config;
use pgtenant::dev::demo;

use crate::harness::clusters::{base_dir, free_port};
use crate::harness::{connect, shards, sqlstate};

const BIN: &str = env!("CARGO_BIN_EXE_pgtenant");

/// The demo configuration over the shared shards on `port`, written to `name.toml`.
fn write_config(name: &str, port: u16, tweak: impl FnOnce(&mut Config)) -> PathBuf {
    let s = shards();
    let mut config =
        demo::demo_config(format!("127.0.0.1:{port}").parse().unwrap(), s.ports, Some(&s.tls_dir));
    tweak(&mut config);
    let file = base_dir().join(format!("{name}.toml"));
    std::fs::write(&file, toml::to_string_pretty(&config).unwrap()).unwrap();
    file
}

/// A `pgtenant serve` process, killed if the test ends (or panics) while it runs.
struct Served(Child);

impl std::ops::Deref for Served {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Served {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn serve(file: &Path, envs: &[(&str, &str)]) -> Served {
    let child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(file)
        .envs(envs.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("pgtenant serve");
    Served(child)
}

fn signal(child: &Child, name: &str) {
    Command::new("kill").args([&format!("-{name}"), &child.id().to_string()]).status().unwrap();
}

fn conninfo(port: u16, user: &str, password: &str) -> String {
    format!(
        "host=127.0.0.1 port={port} user={user} password={password} dbname=app sslmode=disable \
         options='-c pgtenant.tenant_id=7'"
    )
}

async fn wait_serving(port: u16) {
    let started = Instant::now();
    while connect(&conninfo(port, "app", "app")).await.is_err() {
        assert!(started.elapsed() < Duration::from_secs(30), "the proxy did not start serving");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A client whose connection's end (and its error, if any) the test can wait for.
async fn client_with_end(
    port: u16,
) -> (tokio_postgres::Client, tokio::sync::oneshot::Receiver<Result<(), tokio_postgres::Error>>) {
    let (client, conn) =
        tokio_postgres::connect(&conninfo(port, "app", "app"), tokio_postgres::NoTls).await.unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _ = tx.send(conn.await);
    });
    (client, rx)
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_a_transaction_commit_refuses_newcomers_and_ends_idle_clients() {
    let port = free_port();
    let file = write_config("drain", port, |c| c.proxy.shutdown_timeout_ms = 10_000);
    let mut proxy = serve(&file, &[]);
    wait_serving(port).await;
    let admin = crate::harness::shard_admin(1, "app").await;
    admin
        .batch_execute("CREATE TABLE IF NOT EXISTS drain_marks (tenant_id bigint, note text)")
        .await
        .unwrap();
    admin.batch_execute("GRANT ALL ON drain_marks TO app").await.unwrap();

    let (busy, _busy_end) = client_with_end(port).await;
    let (idle, idle_end) = client_with_end(port).await;
    idle.simple_query("SELECT 1").await.unwrap();
    busy.batch_execute("BEGIN; INSERT INTO drain_marks VALUES (7, 'committed during the drain')")
        .await
        .unwrap();

    let signaled = Instant::now();
    signal(&proxy, "TERM");
    // Idle clients are told 57P01 and let go.
    let ended =
        tokio::time::timeout(Duration::from_secs(5), idle_end).await.expect("the idle client is ended");
    let err = ended.unwrap().expect_err("ended with an error");
    assert_eq!(sqlstate(&err), "57P01", "{err:?}");
    // New connections are refused.
    let refused = connect(&conninfo(port, "app", "app")).await;
    assert!(refused.is_err(), "a newcomer is not served during the drain");
    // The transaction in flight goes on and commits.
    busy.batch_execute("INSERT INTO drain_marks VALUES (7, 'second row'); COMMIT")
        .await
        .expect("commits while draining");
    let status = tokio::task::spawn_blocking(move || proxy.wait().unwrap()).await.unwrap();
    assert!(status.success(), "exit status 0: {status}");
    assert!(signaled.elapsed() < Duration::from_secs(10), "within shutdown_timeout_ms");
    let rows: i64 = admin
        .query_one(
            "SELECT count(*) FROM drain_marks WHERE note IN ('committed during the drain', 'second row')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 2);
    admin.batch_execute("DROP TABLE drain_marks").await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_signal_exits_at_once() {
    let port = free_port();
    let file = write_config("second_signal", port, |c| c.proxy.shutdown_timeout_ms = 60_000);
    let mut proxy = serve(&file, &[]);
    wait_serving(port).await;
    let (busy, _end) = client_with_end(port).await;
    busy.batch_execute("BEGIN; SELECT 1").await.unwrap();
    signal(&proxy, "TERM");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(proxy.try_wait().unwrap().is_none(), "the first signal waits for the transaction");
    let signaled = Instant::now();
    signal(&proxy, "TERM");
    let status = tokio::task::spawn_blocking(move || proxy.wait().unwrap()).await.unwrap();
    assert!(status.success(), "{status}");
    assert!(signaled.elapsed() < Duration::from_secs(5), "the second signal does not wait");
}

/// pgbench's select-only script through `port` for `seconds`; its output.
fn pgbench(port: u16, password: &str, seconds: u32, connect_each: bool) -> std::process::Child {
    let script = base_dir().join("select_shard.sql");
    std::fs::write(&script, "SELECT shard_id FROM pgtenant_shard;\n").unwrap();
    let mut cmd = Command::new("pgbench");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "app", "-n", "-c", "4", "-j", "2"])
        .args(["-T", &seconds.to_string(), "-f"])
        .arg(&script)
        .arg("app")
        .env("PGPASSWORD", password)
        .env("PGOPTIONS", "-c pgtenant.tenant_id=7")
        .env("PGSSLMODE", "disable")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if connect_each {
        cmd.arg("-C");
    }
    cmd.spawn().expect("pgbench")
}

/// (transactions processed, failed transactions) from pgbench's report.
fn pgbench_counts(out: &std::process::Output) -> (u64, u64) {
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let number = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next()?.split('/').next()?.parse().ok())
    };
    let processed = number("number of transactions actually processed:").unwrap_or_else(|| panic!("{text}"));
    (processed, number("number of failed transactions:").unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_changes_a_password_and_a_pool_size_under_load_without_dropping_anyone() {
    let port = free_port();
    let file = write_config("hup", port, |_| {});
    let proxy = serve(&file, &[]);
    wait_serving(port).await;
    let load = pgbench(port, "app", 4, false);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut config: Config = toml::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let app = config.users.iter_mut().find(|u| u.name == "app").unwrap();
    app.password = Some("rotated".into());
    app.server_password = Some("app".into());
    app.pool_size = 7;
    std::fs::write(&file, toml::to_string_pretty(&config).unwrap()).unwrap();
    signal(&proxy, "HUP");
    let out = tokio::task::spawn_blocking(move || load.wait_with_output().unwrap()).await.unwrap();
    let (processed, failed) = pgbench_counts(&out);
    assert!(out.status.success() && processed > 100 && failed == 0, "{processed} done, {failed} failed");
    let err = connect(&conninfo(port, "app", "app")).await.expect_err("the old password is refused");
    assert_eq!(sqlstate(&err), "28P01");
    let new = connect(&conninfo(port, "app", "rotated")).await.expect("the new password works");
    new.simple_query("SELECT 1").await.unwrap();
    let console = connect(&format!(
        "host=127.0.0.1 port={port} user={} password={} dbname=pgtenant sslmode=disable",
        demo::ADMIN_USER,
        demo::ADMIN_PASSWORD
    ))
    .await
    .unwrap();
    let pools = console.query("SHOW POOLS", &[]).await.unwrap();
    assert!(
        pools
            .iter()
            .filter(|r| r.get::<_, String>("user") == "app")
            .all(|r| r.get::<_, i64>("sv_size") % 7 == 0),
        "pools of 7 per node"
    );
    signal(&proxy, "TERM");
    let mut proxy = proxy;
    assert!(proxy.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_process_takes_over_the_port_with_so_reuseport_and_no_transaction_fails() {
    let port = free_port();
    let file = write_config("reuse", port, |c| {
        c.proxy.reuse_port = true;
        c.proxy.shutdown_timeout_ms = 5_000;
    });
    let old = serve(&file, &[]);
    wait_serving(port).await;
    // A connection per transaction: every transaction after the switch goes to whichever
    // process the kernel picks, and the old one must let none of them fail.
    let load = pgbench(port, "app", 6, true);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut new = serve(&file, &[]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(new.try_wait().unwrap().is_none(), "the new process binds the port the old one holds");
    signal(&old, "TERM");
    let mut old = old;
    let status = tokio::task::spawn_blocking(move || old.wait().unwrap()).await.unwrap();
    assert!(status.success(), "the old process drains and exits 0");
    let out = tokio::task::spawn_blocking(move || load.wait_with_output().unwrap()).await.unwrap();
    let (processed, failed) = pgbench_counts(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The one loss the proxy cannot prevent: a connection whose handshake completes in
    // the microseconds between the old process's last accept and its close is reset by
    // the kernel (net.ipv4.tcp_migrate_req = 0, the default, hands it to nobody). One
    // such, before its login, is allowed; nothing else.
    let reset_by_the_kernel = stderr.matches("aborted while establishing connection").count() == 1
        && stderr.contains("server closed the connection unexpectedly")
        && !stderr.contains("aborted in command");
    assert!(
        (out.status.success() || reset_by_the_kernel) && processed > 50 && failed == 0,
        "{processed} done, {failed} failed: {stderr}"
    );
    // The new process serves on.
    connect(&conninfo(port, "app", "app")).await.expect("served by the new process");
    signal(&new, "TERM");
    assert!(new.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn clients_reach_it_over_a_unix_socket_and_passwords_come_from_the_environment() {
    let port = free_port();
    let dir = base_dir().join("socket_dir");
    std::fs::create_dir_all(&dir).unwrap();
    let file = write_config("unix", port, |c| {
        c.proxy.unix_socket_dir = Some(dir.clone());
        c.users[0].password = Some("${PGTENANT_TEST_APP_PASSWORD}".into());
        c.users[0].server_password = Some("app".into());
    });
    let mut proxy = serve(&file, &[("PGTENANT_TEST_APP_PASSWORD", "from-env")]);
    let started = Instant::now();
    let unix = format!(
        "host={} port={port} user=app password=from-env dbname=app options='-c pgtenant.tenant_id=42'",
        dir.display()
    );
    let client = loop {
        match connect(&unix).await {
            Ok(c) => break c,
            Err(e) => assert!(started.elapsed() < Duration::from_secs(30), "{e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let shard: i32 = client.query_one("SELECT shard_id FROM pgtenant_shard", &[]).await.unwrap().get(0);
    assert_eq!(shard, 2, "tenant 42, over the socket");
    // psql with sslmode=prefer (its default) falls back to plain over the socket.
    let out = Command::new("psql")
        .args(["-XAtc", "SELECT 1", &unix.replace("dbname=app", "dbname=app sslmode=prefer")])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1", "{}", String::from_utf8_lossy(&out.stderr));
    signal(&proxy, "TERM");
    assert!(proxy.wait().unwrap().success());
    assert!(!dir.join(format!(".s.PGSQL.{port}")).exists(), "the socket file is removed at exit");

    // A variable that is not set: the file is refused, naming it.
    let out = Command::new(BIN).arg("check-config").arg(&file).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("PGTENANT_TEST_APP_PASSWORD"));
}
