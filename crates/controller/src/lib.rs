//! The kit every reconciler uses, on the store port of either backend: leader election
//! ([`leader`]), Events ([`events`]), the back-off of failed objects ([`backoff`]), the finalizer that brackets a reconcile ([`mod@finalizer`]) and the
//! read-modify-write with conflict retry that every write of a reconciler goes through ([`mod@modify`]),
//! and the controller loop they run in ([`runner`]).
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
pub mod runner;

pub use backoff::Backoff;
pub use finalizer::{Event, FinalizerError, Release, finalizer, finalizer_when};
pub use modify::{Modified, Target, modify};
pub use runner::{Action, Controller};

/// A fingerprint of what a reconcile of an object depends on, for the controller's predicate
/// filter: its uid, labels, annotations, finalizers, the second it began to be deleted, its spec
/// (as JSON) and what else the caller names (`extra`). Not the resourceVersion nor the status, so
/// an object's own status writes do not reconcile it again.
pub fn reconcile_fingerprint<S: serde::Serialize>(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    spec: &S,
    extra: impl std::hash::Hash,
) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let relevant = (
        &meta.uid,
        &meta.labels,
        &meta.annotations,
        &meta.finalizers,
        meta.deletion_timestamp.as_ref().map(|t| t.0.as_second()),
        serde_json::to_string(spec).ok(),
        extra,
    );
    let mut h = std::collections::hash_map::DefaultHasher::new();
    relevant.hash(&mut h);
    Some(h.finish())
}

/// `<hostname>_<random>`, as client-go names leader-election candidates; also the
/// `reportingInstance` of Events.
pub fn default_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "harvester-cloud".into());
    format!("{host}_{}", uuid::Uuid::new_v4().simple())
}
