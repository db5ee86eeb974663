//! The changes the embedded store retains for watches that resume from an older resourceVersion,
//! kept per kind.
//!
//! The bound is global (a count and a size), but what is trimmed when it is exceeded is the oldest
//! change of the kind that takes the most: an IP pool's status holds every allocation and is
//! written once per allocation round, so with one shared queue a few hundred pool versions pushed
//! every LoadBalancer change out, and the LoadBalancer watchers that fell behind the change channel
//! (4,096 changes) had to list every LoadBalancer again (and their controllers to reconcile every
//! one again): 11 times in a 100,000 LoadBalancer convergence. A kind's watch now resumes as long
//! as its own changes since are retained.

use std::collections::{HashMap, VecDeque};

use super::held::Held;
use crate::{Change, ChangeType};

/// How many changes are retained in all.
const COUNT: usize = 100_000;
/// And how much of them, as stored (JSON bytes). A watcher resumes within seconds (the
/// reconcilers' watches start right after their list), so the latest changes cover it; a watcher
/// further behind lists again, as after a 410 from Kubernetes. Most retained changes are the
/// objects' current versions, shared with the index; the bound is on the versions a kind's churn
/// leaves behind (100,000 changes of which some are large take gigabytes).
const BYTES: usize = 32 << 20;

/// A change as the history keeps it: its object as the index holds it (the current version's text
/// is shared with the index), and its weight in the history's bound (about its size as stored, more
/// for a tree), so that the history is bounded by memory as well as by count.
#[derive(Clone, Debug)]
pub(crate) struct Retained {
    pub change: ChangeType,
    pub api_version: String,
    pub kind: String,
    pub resource_version: u64,
    pub object: Held,
    pub bytes: usize,
}

impl Retained {
    /// The change as watchers receive it.
    pub fn to_change(&self) -> Change {
        self.with_object(self.object.value())
    }

    /// The change as watchers receive it, with its object's tree at hand.
    pub fn with_object(&self, object: std::sync::Arc<serde_json::Value>) -> Change {
        Change {
            change: self.change,
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            object,
            resource_version: self.resource_version,
        }
    }
}

#[derive(Default)]
struct Kind {
    changes: VecDeque<Retained>,
    bytes: usize,
    /// The resourceVersion of the last change of this kind trimmed: a watch from before it has
    /// missed changes the history no longer has.
    trimmed_to: u64,
}

/// The retained changes, by apiVersion and kind.
#[derive(Default)]
pub(crate) struct History {
    kinds: HashMap<(String, String), Kind>,
    /// The resourceVersion the store opened at: changes before it were never retained.
    opened: u64,
    len: usize,
    bytes: usize,
}

/// A watch from this resourceVersion cannot resume: changes since were trimmed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Gone;

impl History {
    pub fn new(opened: u64) -> Self {
        History {
            opened,
            ..Default::default()
        }
    }

    /// Retains a published change (in resourceVersion order), trimming what the bounds no longer
    /// allow.
    pub fn push(&mut self, c: Retained) {
        self.len += 1;
        self.bytes += c.bytes;
        let kind = self
            .kinds
            .entry((c.api_version.clone(), c.kind.clone()))
            .or_default();
        kind.bytes += c.bytes;
        kind.changes.push_back(c);
        self.trim(COUNT, BYTES);
    }

    fn trim(&mut self, count: usize, bytes: usize) {
        while self.len > 1 && (self.len > count || self.bytes > bytes) {
            let by_count = self.len > count;
            // A handful of kinds: a scan is cheaper than keeping them ordered.
            let Some(kind) = self
                .kinds
                .values_mut()
                .filter(|k| !k.changes.is_empty())
                .max_by_key(|k| if by_count { k.changes.len() } else { k.bytes })
            else {
                return;
            };
            if let Some(c) = kind.changes.pop_front() {
                kind.bytes -= c.bytes;
                kind.trimmed_to = c.resource_version;
                self.len -= 1;
                self.bytes -= c.bytes;
            }
        }
    }

    /// The changes of a kind after `since`, or [`Gone`] when some of them were trimmed (or came
    /// before the store opened).
    pub fn since(&self, api_version: &str, kind: &str, since: u64) -> Result<Vec<Change>, Gone> {
        let retained = self.kinds.get(&(api_version.to_string(), kind.to_string()));
        let covered_from = retained.map_or(self.opened, |k| k.trimmed_to.max(self.opened));
        if since < covered_from {
            return Err(Gone);
        }
        Ok(retained
            .map(|k| {
                // In resourceVersion order: skip what the watcher has seen.
                let first = k.changes.partition_point(|c| c.resource_version <= since);
                k.changes.range(first..).map(Retained::to_change).collect()
            })
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn change(kind: &str, rv: u64, bytes: usize) -> Retained {
        Retained {
            change: ChangeType::Modified,
            api_version: "v1".into(),
            kind: kind.into(),
            resource_version: rv,
            object: Held::written(json!({"metadata": {"name": format!("o{rv}")}}).to_string()),
            bytes,
        }
    }

    /// The resourceVersions a watch of `kind` from `since` replays.
    fn at(h: &History, kind: &str, since: u64) -> Result<Vec<u64>, Gone> {
        h.since("v1", kind, since)
            .map(|changes| changes.iter().map(|c| c.resource_version).collect())
    }

    /// A kind whose few changes are large is trimmed before one with many small ones: the
    /// watchers of the small kind still resume where a shared queue would have made them list.
    #[test]
    fn the_largest_kind_is_trimmed_first() {
        let mut h = History::new(10);
        for rv in 11..=40 {
            let (kind, bytes) = if rv % 3 == 0 {
                ("Pool", 100)
            } else {
                ("Lb", 1)
            };
            h.len += 1;
            h.bytes += bytes;
            let k = h.kinds.entry(("v1".into(), kind.into())).or_default();
            k.bytes += bytes;
            k.changes.push_back(change(kind, rv, bytes));
        }
        h.trim(COUNT, 250);
        assert!(h.bytes <= 250);
        // Every Lb change since the store opened is still there.
        assert_eq!(at(&h, "Lb", 10).expect("resumes").len(), 20);
        // The Pool's oldest are gone, its latest are not.
        assert_eq!(at(&h, "Pool", 10), Err(Gone));
        assert_eq!(
            at(&h, "Pool", 35).expect("resumes from a recent version"),
            [36, 39]
        );
    }

    #[test]
    fn a_kind_resumes_from_where_it_was_trimmed_and_not_before_the_store_opened() {
        let mut h = History::new(100);
        assert_eq!(at(&h, "Lb", 99), Err(Gone), "before the store opened");
        assert_eq!(at(&h, "Lb", 100), Ok(Vec::new()), "a kind never changed");
        for rv in 101..=105 {
            h.push(change("Lb", rv, 1));
        }
        h.trim(3, BYTES);
        // 101 and 102 were trimmed: a watcher that saw 102 resumes, one at 101 does not.
        assert_eq!(at(&h, "Lb", 101), Err(Gone));
        assert_eq!(at(&h, "Lb", 102).unwrap(), [103, 104, 105]);
        assert_eq!(at(&h, "Lb", 104).unwrap(), [105]);
        assert_eq!(at(&h, "Lb", 105), Ok(Vec::new()));
        // Another kind is not affected by Lb's trimming.
        assert_eq!(at(&h, "Pool", 100), Ok(Vec::new()));
    }

    #[test]
    fn the_count_bound_trims_the_kind_with_the_most_changes() {
        let mut h = History::new(0);
        for rv in 1..=10 {
            h.push(change(if rv <= 2 { "Pool" } else { "Lb" }, rv, 1));
        }
        h.trim(6, BYTES);
        assert_eq!(h.len, 6);
        assert_eq!(at(&h, "Pool", 0).unwrap(), [1, 2]);
        assert_eq!(at(&h, "Lb", 6).unwrap(), [7, 8, 9, 10]);
        assert_eq!(at(&h, "Lb", 5), Err(Gone));
    }
}
