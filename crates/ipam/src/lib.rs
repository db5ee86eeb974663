//! IP address management for load balancers: pool ranges, pool selection, allocation, pool status and
//! pool admission, compatible with Harvester's `loadbalancer.harvesterhci.io/v1beta1` IPPool.
//!
//! Pure domain code: no I/O, no clock, no Kubernetes types. The reconciler owns persistence (it writes
//! [`PoolAllocator::status`] to the IPPool and rebuilds with [`PoolAllocator::from_status`]) and
//! concurrency (one allocator per pool behind a lock).
//!
//! - [`spec`]: the IPPool spec as JSON.
//! - [`range`]: ranges, defaults, totals, range errors.
//! - [`allocator`]: allocate, release, resize.
//! - [`status`]: the IPPool status as JSON, and rebuilding from it.
//! - [`select`]: which pool a load balancer uses.
//! - [`admission`]: the IPPool webhook checks.
//! - [`release`]: the `manuallyReleaseIP` annotation.
//! - [`skip`] and [`labels`]: ours, not upstream's: the pool annotations that skip addresses of its
//!   ranges (`skipAddresses`) and that serve only load balancers whose Service labels match
//!   (`serviceSelector`).
#![forbid(unsafe_code)]

pub mod addr;
pub mod admission;
pub mod allocator;
pub mod labels;
pub mod patch;
pub mod range;
pub mod release;
pub mod select;
pub mod skip;
pub mod spec;
pub mod status;

#[cfg(test)]
mod peer_tests;
#[cfg(test)]
mod proptests;

pub use addr::{Cidr, Family};
pub use admission::{AdmissionError, Rejection, validate_create, validate_delete, validate_update};
pub use allocator::{AllocateError, Allocation, Origin, PoolAllocator, PoolError};
pub use labels::{SERVICE_SELECTOR, SelectorError, ServiceSelector};
pub use range::{BoundError, IpRange, RangeError, RangeSet};
pub use release::{MANUALLY_RELEASE_IP, ManualRelease, ManualReleaseError, ManualReleaseOutcome};
pub use select::{
    LbRequest, PoolEntry, PoolIndex, PoolOptions, PoolPlan, Requirement, SelectError, Selected,
    SelectedBy, WorkloadType, plan_pool, select_pool,
};
pub use skip::{SKIP_ADDRESSES, Skip, SkipError};
pub use spec::{ALL, Families, PoolSpec, RangeSpec, Selector, Tuple};
pub use status::{Condition, PoolStatus};
