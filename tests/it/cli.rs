//! The binary: `check-config` and `pgtenant dev` as a user runs them.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::clusters::{base_dir, free_port};
use crate::harness::{self, stderr, stdout};
use crate::harness::{DEV_CLUSTERS, DevProcess, free_port_run, stop_dev, wait_serving};

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

#[tokio::test(flavor = "multi_thread")]
async fn dev_serves_stops_its_clusters_and_restarts_quickly() {
    let dir = base_dir().join("dev-state");
    // Ports of its own, the HTTP one included: dev's default 9930 may be taken.
    let (port, shard_port, http_port) = (free_port(), free_port_run(DEV_CLUSTERS), free_port());
    let spawn = || {
        Command::new(BIN)
            .args(["dev", "--port", &port.to_string(), "--shard-port", &shard_port.to_string()])
            .args(["--http-port", &http_port.to_string(), "--dir"])
            .arg(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map(DevProcess)
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
    stop_dev(&mut first.0);
    let mut printed = String::new();
    std::io::Read::read_to_string(&mut first.0.stdout.take().unwrap(), &mut printed).unwrap();
    assert!(printed.contains("options='-c pgtenant.tenant_id=42'"), "prints how to connect: {printed}");
    for shard in [shard_port, shard_port + 1] {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", shard)).is_err(),
            "cluster on {shard} was stopped"
        );
    }

    let mut second = spawn();
    let took = wait_serving(port, Instant::now()).await;
    stop_dev(&mut second.0);
    assert!(took < Duration::from_secs(10), "second start took {took:?}");
}
