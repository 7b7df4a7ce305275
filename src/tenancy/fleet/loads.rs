//! What a fleet plan weighs tenants by: the transactions every proxy on the catalog
//! counted for each, asked for when the plan is made (nothing is written between
//! plans). The planning proxy takes a request id, asks on the moves' channel, and
//! sums the rows the proxies' move agents answer with (`tenant_load_report`), waiting
//! until every live proxy has answered or `WAIT` has passed; a proxy that did not
//! answer in time is left out, this one's own counts are always in.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use super::FleetError;
use crate::tenancy::moves::MoveService;

/// How long a plan waits for the proxies' answers at most.
const WAIT: Duration = Duration::from_secs(2);
/// Between two looks at the answers.
const POLL: Duration = Duration::from_millis(20);

/// The fleet's per-tenant transaction counts, and how many proxies they came from.
pub struct FleetLoads {
    pub transactions: HashMap<i64, u64>,
    pub proxies: usize,
}

fn failed(e: tokio_postgres::Error) -> FleetError {
    FleetError::Catalog(e.to_string())
}

pub async fn gather(svc: &MoveService, catalog: &Client) -> Result<FleetLoads, FleetError> {
    let request: i64 =
        catalog.query_one("SELECT nextval('pgtenant.load_request')", &[]).await.map_err(failed)?.get(0);
    let ask = serde_json::json!({ "action": "report_loads", "request": request }).to_string();
    catalog
        .execute("SELECT pg_notify($1, $2)", &[&crate::tenancy::moves::CHANNEL, &ask])
        .await
        .map_err(failed)?;
    let stale_ms = svc.moves_config().proxy_stale_ms as i64;
    let started = Instant::now();
    loop {
        let row = catalog
            .query_one(
                "SELECT (SELECT count(*) FROM pgtenant.tenant_load_report WHERE request_id = $1),
                        (SELECT count(*) FROM pgtenant.proxy_instance
                         WHERE seen_at > clock_timestamp() - make_interval(secs => $2::float8 / 1000))",
                &[&request, &(stale_ms as f64)],
            )
            .await
            .map_err(failed)?;
        let (answered, live): (i64, i64) = (row.get(0), row.get(1));
        if answered >= live {
            break;
        }
        if started.elapsed() >= WAIT {
            tracing::warn!(
                answered,
                live,
                "fleet plan: not every proxy reported its tenant loads in time; planned without the others'"
            );
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    let rows = catalog
        .query(
            "DELETE FROM pgtenant.tenant_load_report WHERE request_id = $1 OR reported_at < now() - interval '1 hour'
             RETURNING request_id, proxy_id, tenants, transactions",
            &[&request],
        )
        .await
        .map_err(failed)?;
    let mut loads = FleetLoads { transactions: HashMap::new(), proxies: 0 };
    let mut mine = false;
    for row in rows.iter().filter(|r| r.get::<_, i64>(0) == request) {
        mine |= row.get::<_, &str>(1) == svc.proxy_id;
        let (tenants, counts): (Vec<i64>, Vec<i64>) = (row.get(2), row.get(3));
        add(&mut loads, tenants.into_iter().zip(counts.into_iter().map(|n| n.max(0) as u64)));
    }
    if !mine {
        add(&mut loads, svc.tenant_loads());
    }
    Ok(loads)
}

fn add(loads: &mut FleetLoads, counts: impl IntoIterator<Item = (i64, u64)>) {
    loads.proxies += 1;
    for (tenant, n) in counts {
        *loads.transactions.entry(tenant).or_insert(0) += n;
    }
}
