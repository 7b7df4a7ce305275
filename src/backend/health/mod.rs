//! Shard node health and failover: a task per node checks its role, WAL position and
//! timeline (`checker`), and a shared view (`view`) says where each shard's work goes
//! now: the node answering as primary on the newest timeline, whoever promoted it.
//! While a shard has none, requests that need it wait for one (bounded), and with
//! `auto_promote` the proxy promotes its best replica (`promoter`).

mod checker;
mod promoter;
mod view;

pub use checker::spawn;
pub use promoter::spawn as spawn_promoter;
pub use view::{
    CheckOutcome, HealthView, HeldRequest, HoldReason, LagBound, NodeKey, NodeState, Observation,
    ObservedRole, PrimaryChoice,
};
