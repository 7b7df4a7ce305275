//! Tenancy control: what happens to a tenant's (or a shard's) traffic as a whole,
//! beside routing it: the pauses of the admin console (`pause`) and the placement of
//! new tenants (`placement`), online moves of one tenant to another shard (`moves`),
//! and fleet batches of them: drain, rebalance, isolate (`fleet`); and this proxy's
//! slices of the connection budgets the fleet shares (`connection_budget`).

pub mod connection_budget;
pub mod fleet;
pub mod moves;
pub mod pause;
pub mod placement;

pub use pause::{PauseBoard, PauseOutcome, PauseScope, StillPaused, tenant_tag_of};
pub use placement::{Placement, PlacementError, PlacementStep, placement};
