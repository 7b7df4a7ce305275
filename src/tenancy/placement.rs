//! Placement of new tenants (seed 000), through the catalog's SQL functions
//! (`sql/catalog.sql`: `place_tenant`, `confirm_placement`, `cancel_placement`), so that
//! the proxy and anything else that holds a catalog connection place tenants the same
//! way: a pending reservation with a lease on the fullest active shard with room, then
//! confirmed (mapped: routing follows through the catalog's NOTIFY) or cancelled.

use tokio_postgres::error::SqlState;

use crate::config::CatalogConfig;

/// A reservation as the catalog reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub tenant: i64,
    pub shard: i16,
    /// `pending`, `confirmed`, `cancelled` or `expired`.
    pub status: String,
    /// When a pending reservation's lease runs out (text, as the catalog prints it).
    pub lease_expires_at: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("tenant placement needs a catalog ([catalog] in the configuration)")]
    NoCatalog,
    #[error("no active shard has room for tenant {tenant} (capacity in pgtenant.shard_config)")]
    NoRoom { tenant: i64 },
    #[error("{0}")]
    NotPending(String),
    #[error("{0}")]
    BadArgument(String),
    #[error("the catalog could not place the tenant: {0}")]
    Catalog(String),
}

/// What to do with a tenant's placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacementStep {
    /// Reserve a place, with a lease of this many seconds.
    Place {
        lease_secs: i32,
    },
    Confirm,
    Cancel,
}

/// Carries out `step` for `tenant` on the catalog.
pub async fn placement(
    catalog: Option<&CatalogConfig>,
    tenant: i64,
    step: PlacementStep,
) -> Result<Placement, PlacementError> {
    let catalog = catalog.ok_or(PlacementError::NoCatalog)?;
    let (client, conn) =
        tokio::time::timeout(catalog.connect_timeout(), catalog.pg_config().connect(tokio_postgres::NoTls))
            .await
            .map_err(|_| {
                PlacementError::Catalog(format!("no connection within {:?}", catalog.connect_timeout()))
            })?
            .map_err(|e| PlacementError::Catalog(e.to_string()))?;
    tokio::spawn(conn);
    const COLUMNS: &str = "tenant_id, shard_id, status, lease_expires_at::text";
    let row = match step {
        PlacementStep::Place { lease_secs } => {
            let sql = format!("SELECT {COLUMNS} FROM pgtenant.place_tenant($1, $2)");
            client.query_opt(&sql, &[&tenant, &lease_secs]).await
        }
        PlacementStep::Confirm => {
            client
                .query_opt(&format!("SELECT {COLUMNS} FROM pgtenant.confirm_placement($1)"), &[&tenant])
                .await
        }
        PlacementStep::Cancel => {
            client
                .query_opt(&format!("SELECT {COLUMNS} FROM pgtenant.cancel_placement($1)"), &[&tenant])
                .await
        }
    };
    let row = row.map_err(|e| match e.as_db_error() {
        Some(db) if *db.code() == SqlState::CONFIGURATION_LIMIT_EXCEEDED => PlacementError::NoRoom { tenant },
        Some(db) if *db.code() == SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE => {
            PlacementError::NotPending(db.message().to_string())
        }
        Some(db) if *db.code() == SqlState::INVALID_PARAMETER_VALUE => {
            PlacementError::BadArgument(db.message().to_string())
        }
        Some(db) => PlacementError::Catalog(db.message().to_string()),
        None => PlacementError::Catalog(e.to_string()),
    })?;
    let row = row.ok_or_else(|| PlacementError::NotPending(format!("tenant {tenant} has no placement")))?;
    Ok(Placement { tenant: row.get(0), shard: row.get(1), status: row.get(2), lease_expires_at: row.get(3) })
}
