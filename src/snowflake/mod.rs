//! Snowflake IDs minted by the proxy: the layout (`layout`), the clock (`clock`),
//! minting per shard (`minter`) and the instance number's lease from the catalog
//! (`lease`). The SQL calls that reach it are recognised by the router and answered
//! by the frontend; this module knows nothing of either.

pub mod clock;
pub mod error;
pub mod layout;
pub mod lease;
pub mod minter;

use std::sync::Arc;

pub use clock::{Clock, ManualClock, SystemClock};
pub use error::SnowflakeError;
pub use layout::{Decoded, Layout};
pub use minter::{Grant, MAX_BATCH, Minter, check_batch};

use crate::config::Config;

/// A minter for `config`: with a catalog, it mints once `lease::LeaseKeeper` has
/// leased an instance number; without one, with the configured number from the start.
pub fn minter_for(config: &Config) -> Arc<Minter> {
    let sf = &config.snowflake;
    let layout = Layout::new(sf.instance_bits).unwrap_or_default();
    let minter = Arc::new(Minter::new(layout, Arc::new(SystemClock), sf.max_clock_backwards_ms));
    if config.catalog.is_none() {
        minter.grant(Grant { instance: sf.instance, valid_until: None, floor_unix_ms: 0 });
    }
    minter
}
