//! The binary: `check-config` and `pgtenant dev` as a user runs them.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::clusters::{base_dir, free_port};
use crate::harness::{self, stderr, stdout};

const BIN: &str = env!("CARGO_BIN_EXE_pgtenant");

#[test]
fn check_config_accepts_the_example_and_lists_every_problem() {
    let example = Command::new(BIN).args(["check-config", "config/pgtenant.toml"]).output().unwrap();
    assert!(example.status.success(), "{}", stderr(&example));

    let bad = base_dir().join("bad.toml");
    std::fs::write(
        &bad,
        "[[users]]\nname = \"app\"\n[[shards]]\nid = 1\n[[shards.nodes]]\nhost = \"h\"\nport = 1\nrole = \"replica\"\n\
         [[ranges]]\nmin = 1\nmax = 10\nshard = 1\n[[ranges]]\nmin = 5\nmax = 20\nshard = 1\n\
         [[tenant_map]]\ntenant = 3\nshard = 7\n[[shards]]\nid = 4000\n",
    )
    .unwrap();
    let out = Command::new(BIN).arg("check-config").arg(&bad).output().unwrap();
    assert!(!out.status.success());
    let text = stderr(&out);
    for problem in ["shard 1 has no primary", "overlap", "unknown shard 7", "outside 0..1023", "no password"]
    {
        assert!(text.contains(problem), "missing '{problem}' in:\n{text}");
    }
    let serve = Command::new(BIN).arg("serve").arg("--config").arg(&bad).output().unwrap();
    assert!(!serve.status.success(), "serve refuses an invalid configuration");
    assert!(stderr(&serve).contains("overlap"));
}

/// The first of `n` consecutive free ports, all taken from `free_port`, so that no
/// other test of this process is handed one of them later.
fn free_port_run(n: u16) -> u16 {
    loop {
        let first = free_port();
        if (1..n).all(|i| free_port() == first.wrapping_add(i)) {
            return first;
        }
    }
}

/// The clusters `pgtenant dev` starts by default, on consecutive ports from
/// `--shard-port`: 2 shards, the catalog, a replica of each shard.
const DEV_CLUSTERS: u16 = 5;

async fn wait_serving(port: u16, started: Instant) -> Duration {
    let conninfo = format!(
        "host=127.0.0.1 port={port} user=app password=app dbname=app options='-c pgtenant.tenant_id=42'"
    );
    loop {
        if let Ok(c) = harness::connect(&conninfo).await
            && let Ok(row) = c.query_one("SELECT shard_id FROM pgtenant_shard", &[]).await
        {
            assert_eq!(row.get::<_, i32>(0), 2, "tenant 42 is mapped to shard 2");
            return started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(120), "pgtenant dev did not start serving");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn stop(child: &mut std::process::Child) {
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "pgtenant dev exits cleanly on SIGTERM: {status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn dev_serves_stops_its_clusters_and_restarts_quickly() {
    let dir = base_dir().join("dev-state");
    let (port, shard_port) = (free_port(), free_port_run(DEV_CLUSTERS));
    let spawn = || {
        Command::new(BIN)
            .args(["dev", "--port", &port.to_string(), "--shard-port", &shard_port.to_string(), "--dir"])
            .arg(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut first = spawn();
    wait_serving(port, Instant::now()).await;
    let tls = harness::run_with_stdin(
        Command::new("psql").args([
            "-XAt",
            "-d",
            &format!("host=127.0.0.1 port={port} user=app password=app dbname=app sslmode=require options='-c pgtenant.tenant_id=7'"),
            "-c",
            "SELECT shard_id FROM pgtenant_shard",
        ]),
        "",
    );
    assert_eq!(stdout(&tls).trim(), "1", "{}", stderr(&tls));
    stop(&mut first);
    let mut printed = String::new();
    std::io::Read::read_to_string(&mut first.stdout.take().unwrap(), &mut printed).unwrap();
    assert!(printed.contains("options='-c pgtenant.tenant_id=42'"), "prints how to connect: {printed}");
    for shard in [shard_port, shard_port + 1] {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", shard)).is_err(),
            "cluster on {shard} was stopped"
        );
    }

    let mut second = spawn();
    let took = wait_serving(port, Instant::now()).await;
    stop(&mut second);
    assert!(took < Duration::from_secs(10), "second start took {took:?}");
}
