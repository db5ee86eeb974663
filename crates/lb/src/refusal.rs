//! Why a load balancer has no address: the reconcile of a LoadBalancer and of its VM part both
//! end in one.

use std::time::Duration;

/// Fallback re-checks for load balancers that wait for an event (a pool appearing or freeing an
/// address); the event normally comes first.
pub(crate) const UNMATCHED_RECHECK: Duration = Duration::from_secs(30);

/// Why a load balancer has no address (its Ready message), and when to look again.
pub struct Refusal {
    pub(super) reason: &'static str,
    pub(super) message: String,
    pub(super) recheck: Option<Duration>,
}

impl Refusal {
    pub(super) fn new(reason: &'static str, message: String, recheck: Option<Duration>) -> Self {
        Refusal {
            reason,
            message,
            recheck,
        }
    }

    /// No usable pool: a pool change wakes the load balancer; the re-check is a fallback.
    pub(super) fn unmatched(reason: &'static str, message: String) -> Self {
        Refusal {
            reason,
            message,
            recheck: Some(UNMATCHED_RECHECK),
        }
    }
}
