//! SHOW TENANTS: the per-tenant statistics (`observe::tenants`), one row per kept
//! tenant of each shard, the heaviest by transactions first unless ordered otherwise.

use super::super::AdminView;
use super::super::table::{Kind, Table, int, text};
use crate::backend::coarse_clock;
use crate::observe::tenants::TenantRow;
use crate::protocol::values::Value;

/// The columns, in order; every number but `window_s` may order the rows (descending).
const COLUMNS: [(&str, Kind); 13] = [
    ("tenant", Kind::Text),
    ("shard", Kind::Int8),
    ("transactions", Kind::Int8),
    ("transactions_error", Kind::Int8),
    ("requests", Kind::Int8),
    ("server_time_ms", Kind::Float8),
    ("bytes_out", Kind::Int8),
    ("errors", Kind::Int8),
    ("waits", Kind::Int8),
    ("recent_transactions", Kind::Int8),
    ("recent_server_time_ms", Kind::Float8),
    ("recent_errors", Kind::Int8),
    ("window_s", Kind::Float8),
];

/// A row's value in column `i` (numbers only: what ordering compares).
fn number(row: &TenantRow<crate::directory::TenantId>, i: usize) -> f64 {
    let (t, r) = (&row.total, &row.recent);
    match i {
        1 => f64::from(row.shard),
        2 => t.transactions as f64,
        3 => row.error as f64,
        4 => t.requests as f64,
        5 => t.server_us as f64 / 1000.0,
        6 => t.bytes_out as f64,
        7 => t.errors as f64,
        8 => t.waits as f64,
        9 => r.transactions as f64,
        10 => r.server_us as f64 / 1000.0,
        11 => r.errors as f64,
        _ => 0.0,
    }
}

/// The column `name` may order the rows by (its index), if it may.
pub fn order_column(name: &str) -> Option<usize> {
    COLUMNS.iter().position(|(c, _)| *c == name).filter(|&i| (1..COLUMNS.len() - 1).contains(&i))
}

pub(super) fn table(
    view: &AdminView<'_>,
    shard: Option<u16>,
    order_by: Option<&str>,
    limit: Option<usize>,
) -> Table {
    let mut t = Table::new(&COLUMNS);
    // The command checked the column (`order_column`).
    let by = order_by.and_then(order_column).unwrap_or(2);
    let mut rows = view.tenant_stats.rows(shard, coarse_clock::coarse_ms());
    rows.sort_by(|a, b| {
        number(b, by)
            .total_cmp(&number(a, by))
            .then_with(|| a.shard.cmp(&b.shard))
            .then_with(|| a.tenant.cmp(&b.tenant))
    });
    let window_s = view.config.observe.tenant_stats_window_ms as f64 / 1000.0;
    for row in rows.iter().take(limit.unwrap_or(usize::MAX)) {
        let mut cells: Vec<Value> = vec![text(row.tenant.to_string())];
        for (i, (_, kind)) in COLUMNS.iter().enumerate().take(COLUMNS.len() - 1).skip(1) {
            cells.push(match kind {
                Kind::Float8 => Value::Float8(number(row, i)),
                _ => int(number(row, i) as u64),
            });
        }
        cells.push(Value::Float8(window_s));
        t.push(cells);
    }
    t
}
