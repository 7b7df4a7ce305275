//! Local PostgreSQL clusters from the binaries on PATH (or Debian's
//! /usr/lib/postgresql/<version>/bin): initdb, start, stop. When pgtenant runs as
//! root, the clusters run as the `postgres` user (or `nobody`), since PostgreSQL
//! refuses to run as root.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The directory holding initdb, pg_ctl and postgres.
pub fn find_bin_dir() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("initdb").is_file() && dir.join("pg_ctl").is_file() {
                // Follow symlinks so that postgres and pg_ctl come from the same install.
                let real = std::fs::canonicalize(dir.join("initdb")).ok();
                return Ok(real.and_then(|p| p.parent().map(Path::to_path_buf)).unwrap_or(dir));
            }
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .filter(|p| p.join("initdb").is_file())
                .collect()
        })
        .unwrap_or_default();
    versions.sort_by_key(|p| {
        p.parent().and_then(|v| v.file_name()).and_then(|v| v.to_str()).and_then(|v| v.parse::<u32>().ok())
    });
    versions.pop().ok_or_else(|| {
        "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or in /usr/lib/postgresql".into()
    })
}

/// The user clusters run as: the current one, or an unprivileged one when root.
#[derive(Clone, Copy, Debug)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
}

impl RunAs {
    pub fn detect() -> Option<RunAs> {
        let me = std::fs::metadata("/proc/self").ok()?.uid();
        if me != 0 {
            return None;
        }
        let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
        let find = |name: &str| {
            passwd.lines().find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                if f.len() > 3 && f[0] == name {
                    Some(RunAs { uid: f[2].parse().ok()?, gid: f[3].parse().ok()? })
                } else {
                    None
                }
            })
        };
        find("postgres").or_else(|| find("nobody"))
    }

    /// Gives `path` and everything below it to this user. An entry that vanishes
    /// meanwhile (a running cluster's temporary file) is skipped.
    pub fn chown_tree(&self, path: &Path) -> std::io::Result<()> {
        let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
        match std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid)) {
            Err(e) if gone(&e) => return Ok(()),
            other => other?,
        }
        if path.is_dir() {
            let entries = match std::fs::read_dir(path) {
                Err(e) if gone(&e) => return Ok(()),
                other => other?,
            };
            for entry in entries {
                self.chown_tree(&entry?.path())?;
            }
        }
        Ok(())
    }
}

/// One cluster: a data directory served on a loopback port.
#[derive(Clone, Debug)]
pub struct Cluster {
    pub data_dir: PathBuf,
    pub port: u16,
    bin_dir: PathBuf,
    run_as: Option<RunAs>,
}

impl Cluster {
    pub fn new(bin_dir: &Path, data_dir: &Path, port: u16) -> Self {
        Self {
            data_dir: data_dir.to_path_buf(),
            port,
            bin_dir: bin_dir.to_path_buf(),
            run_as: RunAs::detect(),
        }
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin_dir.join(program));
        if let Some(r) = self.run_as {
            cmd.uid(r.uid).gid(r.gid);
        }
        cmd.env_remove("PGDATA").env("LC_ALL", "C");
        cmd
    }

    fn check(what: &str, out: std::io::Result<Output>) -> Result<(), String> {
        let out = out.map_err(|e| format!("{what}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{what} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    pub fn is_initialized(&self) -> bool {
        self.data_dir.join("PG_VERSION").is_file()
    }

    /// The host a proxy on this machine reaches the cluster at: its Unix socket
    /// directory (the data directory, `unix_socket_directories`), as psql or PgBouncer
    /// on a database host would; 127.0.0.1 when the directory is not absolute or the
    /// socket's path would not fit a socket address (108 bytes on Linux).
    pub fn local_host(&self) -> String {
        let dir = self.data_dir.display().to_string();
        let socket = format!("{dir}/.s.PGSQL.{}", self.port);
        if self.data_dir.is_absolute() && socket.len() < 108 { dir } else { "127.0.0.1".into() }
    }

    /// Runs initdb unless the directory already holds a cluster, and writes the
    /// settings pgtenant's local clusters use (loopback and the Unix socket only, SCRAM
    /// for everyone but the local `postgres` superuser, on both; logical WAL, which
    /// tenant moves replicate, and room for several moves at once: each takes a slot and
    /// a WAL sender on its source, an apply worker and table-sync workers on its target).
    pub fn init(&self) -> Result<(), String> {
        if self.is_initialized() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.data_dir).map_err(|e| format!("{}: {e}", self.data_dir.display()))?;
        if let Some(r) = self.run_as {
            r.chown_tree(&self.data_dir).map_err(|e| format!("chown {}: {e}", self.data_dir.display()))?;
        }
        let out = self
            .command("initdb")
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"])
            .output();
        Self::check("initdb", out)?;
        let conf = format!(
            "\nlisten_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = '{}'\nmax_connections = 300\nfsync = off\nsynchronous_commit = off\nfull_page_writes = off\npassword_encryption = 'scram-sha-256'\nlogging_collector = off\nwal_level = logical\nmax_worker_processes = 32\nmax_logical_replication_workers = 16\nmax_replication_slots = 32\nmax_wal_senders = 32\n",
            self.port,
            self.data_dir.display()
        );
        append(&self.data_dir.join("postgresql.conf"), &conf)?;
        let hba = "local all postgres trust\nlocal replication all trust\nlocal all all scram-sha-256\nhost all postgres 127.0.0.1/32 trust\nhost replication postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n";
        std::fs::write(self.data_dir.join("pg_hba.conf"), hba).map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Creates this cluster as a streaming replica of `primary` (pg_basebackup with a
    /// physical slot named `slot`), unless its directory already holds a cluster.
    pub fn init_replica_of(&self, primary: &Cluster, slot: &str) -> Result<(), String> {
        if self.is_initialized() {
            return Ok(());
        }
        let parent = self.data_dir.parent().unwrap_or(Path::new("/"));
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        if let Some(r) = self.run_as {
            // The directory alone: pg_basebackup, run as that user, creates the data
            // directory in it. (Its other clusters may be running: not theirs to touch.)
            std::os::unix::fs::chown(parent, Some(r.uid), Some(r.gid))
                .map_err(|e| format!("chown {}: {e}", parent.display()))?;
        }
        let out = self
            .command("pg_basebackup")
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-h", "127.0.0.1", "-p", &primary.port.to_string(), "-U", "postgres"])
            .args(["-X", "stream", "-R", "-C", "-S", slot, "--no-sync", "--checkpoint=fast"])
            .output();
        Self::check("pg_basebackup", out)?;
        let conf = format!(
            "\nport = {}\nunix_socket_directories = '{}'\nhot_standby = on\n",
            self.port,
            self.data_dir.display()
        );
        append(&self.data_dir.join("postgresql.conf"), &conf)
    }

    /// Appends settings to postgresql.conf (they apply at the next start or reload).
    pub fn configure(&self, settings: &str) -> Result<(), String> {
        append(&self.data_dir.join("postgresql.conf"), &format!("\n{settings}\n"))
    }

    /// Makes the running server read its configuration again (`pg_ctl reload`); the
    /// settings a reload can change apply once each process has handled the signal.
    pub fn reload(&self) -> Result<(), String> {
        let out = self.command("pg_ctl").arg("-D").arg(&self.data_dir).arg("reload").output();
        Self::check("pg_ctl reload", out)
    }

    /// Promotes a replica to primary and waits until it is one.
    pub fn promote(&self) -> Result<(), String> {
        let out = self.command("pg_ctl").arg("-D").arg(&self.data_dir).args(["-w", "promote"]).output();
        Self::check("pg_ctl promote", out)
    }

    /// Turns on TLS with the given PEM certificate and key (copied into the data
    /// directory, owned by the server's user); takes effect at the next start.
    pub fn enable_ssl(&self, cert: &Path, key: &Path) -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt;
        for (from, name) in [(cert, "server.crt"), (key, "server.key")] {
            let to = self.data_dir.join(name);
            std::fs::copy(from, &to).map_err(|e| format!("{}: {e}", from.display()))?;
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| e.to_string())?;
            if let Some(r) = self.run_as {
                r.chown_tree(&to).map_err(|e| e.to_string())?;
            }
        }
        append(&self.data_dir.join("postgresql.conf"), "\nssl = on\n")
    }

    /// Starts the cluster (a no-op when it already runs) and waits until it accepts connections.
    pub fn start(&self) -> Result<(), String> {
        if self.is_running() {
            return Ok(());
        }
        let log = self.data_dir.join("server.log");
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data_dir)
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", "60", "-o", &format!("-p {}", self.port), "start"])
            .output();
        Self::check("pg_ctl start", out).map_err(|e| {
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            format!("{e}\n{}", tail.lines().rev().take(10).collect::<Vec<_>>().join("\n"))
        })
    }

    pub fn stop(&self) -> Result<(), String> {
        if !self.is_running() {
            return Ok(());
        }
        let out =
            self.command("pg_ctl").arg("-D").arg(&self.data_dir).args(["-m", "fast", "-w", "stop"]).output();
        Self::check("pg_ctl stop", out)
    }

    /// Stops the cluster at once (as a crash would).
    pub fn kill(&self) -> Result<(), String> {
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-m", "immediate", "-w", "stop"])
            .output();
        Self::check("pg_ctl stop -m immediate", out)
    }

    pub fn is_running(&self) -> bool {
        self.command("pg_ctl")
            .arg("-D")
            .arg(&self.data_dir)
            .arg("status")
            .output()
            .is_ok_and(|o| o.status.success())
    }
}

fn append(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(text.as_bytes()).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proxy_reaches_a_local_cluster_through_its_socket_when_the_path_fits() {
        let bin = Path::new("/usr/bin");
        let at = |dir: &str| Cluster::new(bin, Path::new(dir), 6442).local_host();
        assert_eq!(at("/tmp/pgtenant-dev/shard1"), "/tmp/pgtenant-dev/shard1");
        // A relative directory is no socket directory to libpq or to pgtenant.
        assert_eq!(at("pgtenant-dev/shard1"), "127.0.0.1");
        // /<dir>/.s.PGSQL.6442 must fit sun_path (108 bytes with its NUL).
        let longest = format!("/{}", "d".repeat(107 - 1 - "/.s.PGSQL.6442".len()));
        assert_eq!(at(&longest), longest);
        assert_eq!(at(&format!("{longest}d")), "127.0.0.1");
    }
}
