//! Reading the catalog: the whole topology in one consistent snapshot, and one
//! tenant's explicit placement.

use tokio_postgres::Client;

use crate::config::{NodeConfig, NodeRole};
use crate::directory::{
    Placement, Shard, ShardStatus, TenantId, TenantKey, TenantLimit, TenantLimits, TenantState, Topology,
};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{}", describe(.0))]
    Db(#[from] tokio_postgres::Error),
    #[error("the catalog holds an unusable layout: {0}")]
    Invalid(String),
    #[error("no catalog connection: {0}")]
    Unavailable(String),
}

/// A tokio-postgres error with the server's SQLSTATE and message, which its own
/// Display leaves out ("db error").
pub fn describe(e: &tokio_postgres::Error) -> String {
    match (e.as_db_error(), std::error::Error::source(e)) {
        (Some(db), _) => format!("{} {}", db.code().code(), db.message()),
        (None, Some(cause)) => format!("{e}: {cause}"),
        (None, None) => e.to_string(),
    }
}

/// The topology and the routing version it belongs to.
pub struct Snapshot {
    pub topology: Topology,
    pub version: i64,
}

/// Reads shards, nodes, ranges, hash groups, tenant limits and the version in one
/// snapshot; `kind` reads the limits' tenant keys.
pub async fn snapshot(client: &Client, kind: TenantKey) -> Result<Snapshot, LoadError> {
    // One REPEATABLE READ transaction: every table as of the same moment.
    client.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").await?;
    let result = read_snapshot(client, kind).await;
    let _ = client.batch_execute("COMMIT").await;
    result
}

async fn read_snapshot(client: &Client, kind: TenantKey) -> Result<Snapshot, LoadError> {
    let state = client.query_one("SELECT version, hash_group_count FROM pgtenant.routing_state", &[]).await?;
    let version: i64 = state.get(0);
    let group_count: i32 = state.get(1);

    let mut shards = Vec::new();
    let mut ranges = Vec::new();
    let rows = client
        .query(
            "SELECT shard_id, status, is_active, min_tenant_id, max_tenant_id FROM pgtenant.shard_config",
            &[],
        )
        .await?;
    for row in rows {
        let id = row.get::<_, i16>(0) as u16;
        let status_text: String = row.get(1);
        let status = ShardStatus::parse(&status_text)
            .ok_or_else(|| LoadError::Invalid(format!("shard {id} has status {status_text:?}")))?;
        let status = if row.get::<_, bool>(2) { status } else { ShardStatus::Disabled };
        if let (Some(min), Some(max)) = (row.get::<_, Option<i64>>(3), row.get::<_, Option<i64>>(4)) {
            ranges.push((min, max, id));
        }
        shards.push(Shard { id, status, nodes: Vec::new() });
    }

    let rows = client
        .query("SELECT shard_id, host, port, dbname, role, failover_priority FROM pgtenant.shard_node", &[])
        .await?;
    for row in rows {
        let id = row.get::<_, i16>(0) as u16;
        let role = match row.get::<_, &str>(4) {
            "primary" => NodeRole::Primary,
            _ => NodeRole::Replica,
        };
        let port = u16::try_from(row.get::<_, i32>(2))
            .map_err(|_| LoadError::Invalid(format!("shard {id} has a node with an invalid port")))?;
        let node = NodeConfig {
            host: row.get(1),
            port,
            role,
            priority: row.get::<_, i32>(5).max(0) as u32,
            dbname: row.get(3),
        };
        if let Some(shard) = shards.iter_mut().find(|s| s.id == id) {
            shard.nodes.push(node);
        }
    }

    let mut hash_groups = vec![None; group_count.max(0) as usize];
    if !hash_groups.is_empty() {
        let rows = client.query("SELECT group_id, shard_id FROM pgtenant.hash_group", &[]).await?;
        for row in rows {
            let group = row.get::<_, i32>(0);
            if let Some(slot) = usize::try_from(group).ok().and_then(|g| hash_groups.get_mut(g)) {
                *slot = Some(row.get::<_, i16>(1) as u16);
            }
        }
    }

    let topology = Topology::new(shards, ranges, hash_groups).map_err(LoadError::Invalid)?;
    let limits = tenant_limits(client, kind).await?;
    Ok(Snapshot { topology: topology.with_limits(limits), version })
}

/// The `tenant_limits` table; none when the catalog predates it (sql/catalog.sql
/// creates it when run again).
async fn tenant_limits(client: &Client, kind: TenantKey) -> Result<TenantLimits, LoadError> {
    let mut limits = TenantLimits::default();
    let exists = client.query_one("SELECT to_regclass('pgtenant.tenant_limits') IS NOT NULL", &[]).await?;
    if !exists.get::<_, bool>(0) {
        return Ok(limits);
    }
    let rows = client
        .query("SELECT tenant_key, weight, max_connections, min_connections FROM pgtenant.tenant_limits", &[])
        .await?;
    for row in rows {
        let key: String = row.get(0);
        let Some(tenant) = TenantId::from_text_bytes(key.as_bytes(), kind) else {
            return Err(LoadError::Invalid(format!(
                "tenant_limits holds a key {key:?} that is not a tenant"
            )));
        };
        let count = |v: Option<i32>| v.map(|n| n.max(0) as u32);
        limits.set(
            tenant,
            TenantLimit {
                weight: row.get::<_, i32>(1).max(1) as u32,
                max_connections: count(row.get(2)),
                min_connections: count(row.get(3)).unwrap_or(0),
            },
        );
    }
    Ok(limits)
}

const LOOKUP_SQL: &str = "SELECT shard_id, state FROM pgtenant.tenant_shard_map WHERE tenant_id = $1";
const LOOKUP_TEXT_SQL: &str =
    "SELECT shard_id, state FROM pgtenant.tenant_shard_map_text WHERE tenant_key = $1";

/// A tenant's `tenant_shard_map` (or `tenant_shard_map_text`) row, if it has one.
pub async fn explicit_placement(
    client: &deadpool_postgres::Client,
    tenant: &TenantId,
) -> Result<Option<Placement>, LoadError> {
    let row = match tenant {
        TenantId::Int(key) => client.query_opt(&client.prepare_cached(LOOKUP_SQL).await?, &[key]).await?,
        TenantId::Text(key) => {
            client.query_opt(&client.prepare_cached(LOOKUP_TEXT_SQL).await?, &[&key.as_ref()]).await?
        }
    };
    let Some(row) = row else {
        return Ok(None);
    };
    let shard = row.get::<_, i16>(0) as u16;
    let state_text: &str = row.get(1);
    let state = TenantState::parse(state_text)
        .ok_or_else(|| LoadError::Invalid(format!("tenant {tenant} has state {state_text:?}")))?;
    Ok(Some(Placement { shard, state }))
}
