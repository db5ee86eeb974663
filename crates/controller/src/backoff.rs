//! How long a reconciler waits before it retries an object that failed: a capped exponential
//! back-off per object, reset by its next success.

use std::{collections::HashMap, sync::Mutex, time::Duration};

use crate::runner::Action;

use crate::sync::lock;

/// The first retry of a failure that is not a conflict; each further one doubles it.
const FIRST: Duration = Duration::from_millis(250);
/// The longest wait.
const CAP: Duration = Duration::from_secs(300);
/// A conflict retries quickly: the newer version of the object is already on its way.
const CONFLICT_STEP: Duration = Duration::from_millis(50);

/// Consecutive failures per object key.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    /// `key` reconciled: its next failure starts the back-off over.
    pub fn succeeded(&self, key: &str) {
        let mut failures = lock(&self.failures);
        if !failures.is_empty() {
            failures.remove(key);
        }
    }

    /// `key` failed (`conflict`: it lost a write race): when to try it again.
    pub fn failed(&self, key: &str, conflict: bool) -> Action {
        let mut failures = lock(&self.failures);
        let n = failures.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        if conflict {
            return Action::requeue(CONFLICT_STEP * (*n).min(20));
        }
        Action::requeue((FIRST * (1 << (*n).min(10))).min(CAP))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_back_off_until_a_success() {
        let backoff = Backoff::default();
        let waits: Vec<Action> = (0..12).map(|_| backoff.failed("a", false)).collect();
        assert_eq!(waits[0], Action::requeue(Duration::from_millis(500)));
        assert_eq!(waits[1], Action::requeue(Duration::from_secs(1)));
        // The doubling stops after ten.
        assert_eq!(waits[11], Action::requeue(Duration::from_secs(256)));
        assert_eq!(
            backoff.failed("b", true),
            Action::requeue(Duration::from_millis(50))
        );
        backoff.succeeded("a");
        assert_eq!(
            backoff.failed("a", false),
            Action::requeue(Duration::from_millis(500))
        );
    }
}
