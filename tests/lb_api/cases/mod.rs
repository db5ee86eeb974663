//! The cases `suite!` runs on every backend (see main.rs), one module per topic.

pub use super::replicas::only_the_leader_reconciles_and_the_other_takes_over;

mod admission;
mod allocation;
mod api;
mod guest_clusters;
mod pool_options;
mod pools;
mod sharing;

pub use admission::*;
pub use allocation::*;
pub use api::*;
pub use guest_clusters::*;
pub use pool_options::*;
pub use pools::*;
pub use sharing::*;
