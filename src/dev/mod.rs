//! `pgtenant dev`: starts local shard clusters (two by default) and a catalog cluster (reusing
//! the state directory), loads the demo layout into the catalog, writes the
//! configuration it serves, and runs the proxy until Ctrl-C, then stops the clusters.

pub mod cluster;
pub mod demo;

use std::path::{Path, PathBuf};

use cluster::{Cluster, find_bin_dir};

/// The catalog database `dev` creates.
pub const CATALOG_DATABASE: &str = "pgtenant_catalog";

/// What `pgtenant dev` was asked for (its command-line arguments).
#[derive(clap::Args, Debug)]
pub struct DevOptions {
    /// State directory (clusters, certificates); reused on the next start.
    #[arg(long, default_value = ".pgtenant-dev")]
    pub dir: PathBuf,
    /// Port of the proxy.
    #[arg(long, default_value_t = 6432)]
    pub port: u16,
    /// First port of the shard clusters (shard 1, then shard 2, the catalog, then
    /// the replicas).
    #[arg(long, default_value_t = 6442)]
    pub shard_port: u16,
    /// Shard clusters; shard i holds tenants (i - 1) * 1000 + 1 ..= i * 1000.
    #[arg(long, default_value_t = 2)]
    pub shards: u16,
    /// Streaming replicas of each shard (pg_basebackup, physical slots), so that
    /// failover can be tried locally: stop a shard's primary and promote its replica.
    #[arg(long, default_value_t = 1)]
    pub replicas: u16,
    /// Let the proxy promote a shard's replica itself when the primary is down
    /// (`[health] auto_promote`), instead of leaving it to you.
    #[arg(long)]
    pub auto_promote: bool,
    /// Port of the HTTP endpoints (`/metrics`, `/healthz`, `/readyz`); 0 turns them off.
    #[arg(long, default_value_t = 9930)]
    pub http_port: u16,
    /// Tokio worker threads of the proxy; 0 means one per two cores (at least one), 1 a
    /// single-threaded runtime.
    #[arg(long, default_value_t = 0)]
    pub workers: usize,
    /// Serve each client on one of `workers` single-threaded runtimes
    /// (`[proxy] thread_per_core`).
    #[arg(long)]
    pub thread_per_core: bool,
    /// Clients the proxy serves at once (`[proxy] max_clients`); past it, 53300.
    #[arg(long, default_value_t = crate::config::ProxyConfig::default().max_clients)]
    pub max_clients: usize,
}

pub async fn run(options: DevOptions) -> Result<(), String> {
    let DevOptions {
        dir,
        port,
        shard_port,
        shards,
        replicas,
        auto_promote,
        http_port,
        workers,
        thread_per_core,
        max_clients,
    } = options;
    if shards < 2 {
        return Err("pgtenant dev needs at least 2 shards (its demo tenants live on shards 1 and 2)".into());
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let dir = std::fs::canonicalize(&dir).map_err(|e| e.to_string())?;
    let bin = find_bin_dir()?;
    let shard_ports: Vec<u16> = (0..shards).map(|i| shard_port + i).collect();
    let catalog_port = shard_port + shards;
    let mut clusters: Vec<Cluster> = (0..usize::from(shards))
        .map(|i| Cluster::new(&bin, &dir.join(format!("shard{}", i + 1)), shard_ports[i]))
        .collect();
    clusters.push(Cluster::new(&bin, &dir.join("catalog"), catalog_port));
    let blocking = clusters.clone();
    tokio::task::spawn_blocking(move || {
        for c in &blocking {
            c.init()?;
            c.start()?;
        }
        Ok::<_, String>(())
    })
    .await
    .map_err(|e| e.to_string())??;
    for (i, port) in shard_ports.iter().enumerate() {
        demo::setup_shard(*port, i as u16 + 1).await?;
    }
    // The proxy reaches the shards through their Unix sockets, as a proxy on the database
    // host does: a relayed transaction then costs the kernel less than over loopback TCP.
    let shard_nodes: Vec<(String, u16)> =
        clusters[..usize::from(shards)].iter().map(|c| (c.local_host(), c.port)).collect();
    demo::setup_catalog(catalog_port, CATALOG_DATABASE, &shard_nodes).await?;
    // Replicas after the shards' setup, which they copy: shard i's r-th on the port
    // after the catalog's, shard by shard.
    let mut replica_nodes = Vec::new();
    let primaries: Vec<Cluster> = clusters[..usize::from(shards)].to_vec();
    for (i, primary) in primaries.iter().enumerate() {
        for r in 1..=replicas {
            let port = catalog_port + 1 + i as u16 * replicas + (r - 1);
            let name = format!("shard{}_replica{r}", i + 1);
            let (primary, replica) = (primary.clone(), Cluster::new(&bin, &dir.join(&name), port));
            replica_nodes.push((i as u16 + 1, name.clone(), replica.local_host(), port, u32::from(r)));
            clusters.push(replica.clone());
            tokio::task::spawn_blocking(move || {
                replica.init_replica_of(&primary, &name)?;
                replica.start()
            })
            .await
            .map_err(|e| e.to_string())??;
        }
    }
    demo::add_replicas(catalog_port, CATALOG_DATABASE, &replica_nodes).await?;
    let tls_dir = dir.join("tls");
    demo::ensure_certificate(&tls_dir)?;
    let listen = format!("127.0.0.1:{port}").parse().map_err(|e| format!("{e}"))?;
    let catalog = demo::local_catalog(catalog_port, CATALOG_DATABASE);
    let mut config = demo::demo_catalog_config(listen, catalog, Some(&tls_dir));
    config.proxy.workers = workers;
    config.proxy.thread_per_core = thread_per_core;
    config.proxy.max_clients = max_clients;
    if http_port != 0 {
        config.observe.listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], http_port)));
    }
    if auto_promote {
        config.health.auto_promote = true;
        // pg_promote() is a superuser's; the dev clusters trust local connections.
        config.health.user = Some("postgres".into());
    }
    write_config(&dir, &config)?;
    let served = serve(config, dir.join("pgtenant.toml"), shards).await;
    // Replicas first: a primary stopping before them waits for nothing, and they would
    // only retry.
    let stopping: Vec<Cluster> = clusters.iter().rev().cloned().collect();
    let stopped = tokio::task::spawn_blocking(move || stopping.iter().try_for_each(Cluster::stop))
        .await
        .map_err(|e| e.to_string())?;
    served.and(stopped)
}

/// Serves `config`, written to `file` (which RELOAD and SIGHUP read again).
async fn serve(config: crate::config::Config, file: PathBuf, shards: u16) -> Result<(), String> {
    let config_catalog = config.catalog.clone();
    let auto_promote = config.health.auto_promote;
    let proxy = crate::server::start_with_file(config, Some(file)).await.map_err(|e| e.to_string())?;
    println!(
        "pgtenant dev is serving on {} ({shards} shards; tenants 1..=1000 -> 1, 1001..=2000 -> 2, ..., 42 -> 2)",
        proxy.addr
    );
    if auto_promote {
        println!(
            "  failover: stop a shard's primary (pg_ctl stop -m immediate); pgtenant promotes its replica"
        );
    } else {
        println!(
            "  failover: stop a shard's primary (pg_ctl stop -m immediate) and promote its replica (pg_ctl promote)"
        );
    }
    if let Some(c) = &config_catalog {
        println!("  catalog: psql \"host={} port={} user={} dbname={}\"", c.host, c.port, c.user, c.dbname);
    }
    println!(
        "  psql \"host=127.0.0.1 port={} user=app password=app dbname=app options='-c pgtenant.tenant_id=42'\"",
        proxy.addr.port()
    );
    println!(
        "  admin console: psql \"host=127.0.0.1 port={} user={} password={} dbname={}\" -c 'SHOW POOLS'",
        proxy.addr.port(),
        demo::ADMIN_USER,
        demo::ADMIN_PASSWORD,
        crate::admin::CONSOLE_DATABASE
    );
    if let Some(http) = proxy.http_addr {
        println!("  metrics: http://{http}/metrics (health: /healthz, readiness: /readyz)");
    }
    println!("  TLS: add sslmode=require. Stop with Ctrl-C.");
    proxy.serve_until_signal().await;
    Ok(())
}

fn write_config(dir: &Path, config: &crate::config::Config) -> Result<(), String> {
    let text = toml::to_string_pretty(config).map_err(|e| e.to_string())?;
    let header =
        "# Written by `pgtenant dev`; serve it with `pgtenant serve --config` while the clusters run.\n";
    std::fs::write(dir.join("pgtenant.toml"), format!("{header}{text}")).map_err(|e| e.to_string())
}
