//! Throwaway clusters: created once per test binary under a temporary directory,
//! stopped and removed by a watchdog process when the test binary exits.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use pgtenant::dev::cluster::{Cluster, find_bin_dir};
use pgtenant::dev::demo;

pub struct Shards {
    pub ports: [u16; 2],
    /// Data directories, which are also the clusters' Unix socket directories.
    pub dirs: [PathBuf; 2],
    /// Kept so the shards live as long as the test binary.
    _clusters: Vec<Cluster>,
    pub tls_dir: PathBuf,
}

static SHARDS: OnceLock<Shards> = OnceLock::new();
static BASE: OnceLock<PathBuf> = OnceLock::new();

/// A loopback port nobody listens on right now, below the kernel's ephemeral range
/// (32768 and up on Linux): the tests' own client connections take their local ports
/// from that range, and one of them could take a port chosen there before the server
/// that was to listen on it binds it (seen in CI: a replica failed to start).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    const FIRST: u16 = 20_000;
    const END: u16 = 32_000;
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = FIRST + (std::process::id() % u32::from(END - FIRST)) as u16;
    let _ = NEXT.compare_exchange(0, start, Ordering::Relaxed, Ordering::Relaxed);
    loop {
        let taken = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = FIRST + taken.wrapping_sub(FIRST) % (END - FIRST);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// The directory of this test binary's clusters and files, removed after it exits.
pub fn base_dir() -> &'static Path {
    BASE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("pgtenant-it-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // The clusters may run as another user, who must reach their directories.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        spawn_watchdog(&dir);
        dir
    })
}

/// Stops every cluster under `dir` and removes it once this process is gone.
#[allow(
    clippy::zombie_processes,
    reason = "the watchdog must outlive the test process, which never waits for it"
)]
fn spawn_watchdog(dir: &Path) {
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
         for f in {dir}/*/postmaster.pid {dir}/*/*/postmaster.pid; do [ -f \"$f\" ] && kill -INT $(head -1 \"$f\"); done; \
         sleep 3; rm -rf {dir}",
        pid = std::process::id(),
        dir = dir.display()
    );
    std::process::Command::new("sh")
        .args(["-c", &script])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("watchdog");
}

/// Creates, starts and fills a cluster in its own thread (setup is async; tests already run inside a runtime).
fn create_cluster(name: &str, shard_id: u16, tls: bool) -> Cluster {
    let bin = find_bin_dir().expect("PostgreSQL binaries");
    let cluster = Cluster::new(&bin, &base_dir().join(name), free_port());
    let c = cluster.clone();
    let tls_dir = base_dir().join("tls");
    std::thread::spawn(move || {
        c.init().expect("initdb");
        if tls {
            demo::ensure_certificate(&tls_dir).expect("certificate");
            c.enable_ssl(&tls_dir.join("server.crt"), &tls_dir.join("server.key")).expect("ssl on");
        }
        c.start().expect("pg_ctl start");
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(demo::setup_shard(c.port, shard_id))
            .expect("demo setup");
    })
    .join()
    .expect("cluster setup thread");
    cluster
}

/// The two demo shards shared by all tests.
pub fn shards() -> &'static Shards {
    SHARDS.get_or_init(|| {
        let clusters = vec![create_cluster("shard1", 1, false), create_cluster("shard2", 2, false)];
        let tls_dir = base_dir().join("tls");
        demo::ensure_certificate(&tls_dir).expect("certificate");
        Shards {
            ports: [clusters[0].port, clusters[1].port],
            dirs: [clusters[0].data_dir.clone(), clusters[1].data_dir.clone()],
            _clusters: clusters,
            tls_dir,
        }
    })
}

/// A cluster of a test's own (for tests that stop or kill it), set up as shard `shard_id`.
pub fn private_cluster(name: &str, shard_id: u16) -> Cluster {
    create_cluster(name, shard_id, false)
}

/// A private cluster that offers TLS with the harness certificate.
pub fn private_tls_cluster(name: &str, shard_id: u16) -> Cluster {
    create_cluster(name, shard_id, true)
}

/// A private primary set up as shard `shard_id` and a streaming replica of it (a
/// physical slot, synchronous: the primary waits until it flushed every commit, so no
/// acknowledged write can be lost when it is promoted).
pub fn private_cluster_with_replica(name: &str, shard_id: u16) -> (Cluster, Cluster) {
    let primary = create_cluster(name, shard_id, false);
    let bin = find_bin_dir().expect("PostgreSQL binaries");
    let replica = Cluster::new(&bin, &base_dir().join(format!("{name}_replica")), free_port());
    replica.init_replica_of(&primary, &format!("{name}_slot")).expect("pg_basebackup");
    replica.start().expect("replica start");
    // Set by a reload: a restart would break the replica's stream for the 5 s its
    // walreceiver waits before it connects again.
    primary
        .configure("synchronous_commit = on\nsynchronous_standby_names = '*'")
        .expect("synchronous standby");
    primary.reload().expect("primary reload");
    wait_for_synchronous_standby(&primary);
    (primary, replica)
}

/// Waits until the primary counts its replica as a synchronous standby (the reload has
/// reached the walsender and the checkpointer), so every later commit waits for it.
fn wait_for_synchronous_standby(primary: &Cluster) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let out = std::process::Command::new("psql")
            .args(["-X", "-A", "-t", "-h", "127.0.0.1", "-p", &primary.port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-c"])
            .arg("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")
            .output()
            .expect("psql");
        if String::from_utf8_lossy(&out.stdout).trim() == "1" {
            // The walsender has the new setting; the checkpointer, which tells committing
            // backends that a synchronous standby is configured, reads it on the same
            // signal and is given a moment to.
            std::thread::sleep(std::time::Duration::from_millis(300));
            return;
        }
        assert!(std::time::Instant::now() < deadline, "the replica never became a synchronous standby");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
