//! `pgtenant dev`: local shard clusters, demo tenants, the proxy serving.

pub mod cluster;

use std::path::PathBuf;

pub async fn run(_dir: PathBuf, _port: u16, _shard_port: u16) -> Result<(), String> {
    Err("not yet".into())
}
