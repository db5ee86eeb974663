//! The kit every reconciler uses, on the store port of either backend: leader election
//! ([`leader`]), Events ([`events`]), the back-off of failed objects ([`backoff`]), the finalizer that brackets a reconcile ([`mod@finalizer`]) and the
//! read-modify-write with conflict retry that every write of a reconciler goes through ([`mod@modify`]).
//!
//! The load balancer reconcilers and the guest reconciler stand on it side by side; nothing here
//! knows either.
#![forbid(unsafe_code)]

// The crates below this one, under the names the modules use.
use harvester_cloud_api as crd;
use harvester_cloud_store as store;
use harvester_cloud_store::sync;

pub mod backoff;
pub mod events;
pub mod finalizer;
pub mod leader;
pub mod modify;

pub use backoff::Backoff;
pub use finalizer::{Event, FinalizerError, Release, finalizer, finalizer_when};
pub use modify::{Modified, Target, modify};

/// `<hostname>_<random>`, as client-go names leader-election candidates; also the
/// `reportingInstance` of Events.
pub fn default_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "harvester-cloud".into());
    format!("{host}_{}", uuid::Uuid::new_v4().simple())
}
