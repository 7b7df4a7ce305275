//! Server side: connections opened and authenticated by pgtenant, pools per
//! (node, user, database), what each connection still owes, and the settings and
//! prepared statements it carries.

mod addr;
mod cancel;
mod caps;
pub mod coarse_clock;
mod conn;
mod error;
pub mod health;
mod lane;
mod pick;
mod pool;
mod pooled;
mod prepared;
mod prepared_on_server;
mod relay;
mod settings;
mod share;
mod state;
mod tls;

pub use addr::ServerAddr;
pub use cancel::CancelTarget;
pub use caps::{ServerCaps, SliceUse};
pub use conn::{MAX_SERVER_MESSAGE, ServerConn, first_text_value, record_param};
pub use error::{BackendError, CheckoutError};
pub use lane::{CancelSlot, Lane, LaneEntry, LaneJoin, LanePiece, LaneRoom};
pub use pick::Wanted;
pub use pool::{PoolView, PooledConn, Pools, ServerPool};
pub use prepared::{PreparedStatement, StatementRegistry, server_name};
pub use prepared_on_server::{PreparedOnServer, SET_TENANT_STATEMENT_ID};
pub use relay::{Answered, RelayNotes, RelayStop};
pub use settings::{
    ReadOnlyGuc, SettingValue, Settings, TENANT_SIGNATURE_GUC, TenantContext, TenantGuc, quote_literal,
    settings_sql, tenant_sql,
};
pub use state::{Effects, OnError, Pending, Reply, ResponseQueue};
pub use tls::ServerTls;
