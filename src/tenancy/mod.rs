//! Tenancy control: what happens to a tenant's (or a shard's) traffic as a whole,
//! beside routing it. Today the pauses of the admin console (`pause`); tenant
//! placement and online moves will live here too.

pub mod pause;

pub use pause::{PauseBoard, PauseOutcome, PauseScope, StillPaused, tenant_tag_of};
