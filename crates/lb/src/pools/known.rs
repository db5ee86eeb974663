//! What the pool tasks know of their pools' stored statuses, so that the pool watch need not decode
//! the tasks' own status writes.
//!
//! A pool task writes its pool's status at every allocation round. The pool watch delivers each of
//! those versions, and decoding one copies every address of the pool into a new object for the
//! pool cache: with a hundred pools of a thousand addresses, that was a tenth of the CPU of
//! converging their load balancers, all to learn what the task had just written. Only one thing
//! of a pool's status is read from the cache: which load balancer holds an address. So each task
//! keeps a **view** of that, as of the version it last read or wrote, and the watch leaves out,
//! undecoded, a version the task wrote while the view stands. The cache then holds an older
//! version of that pool, and [`Known::holds`] answers from the view.
//!
//! The view stands only while it is the newest version this process has seen of its pool: any
//! version the watch does decode that is not the view's own takes the view down (someone else's
//! change, or one the watch delivers late), and from then on every version is decoded again, in
//! order, until the task reads or writes the pool next. Watch events of one object come in order,
//! so the cache catches up through every version the view covered. A list, a deletion and a
//! deleting pool's versions are always decoded. A task stands its view afresh only if the watch
//! decoded nothing of the pool since the task began the read or write the view comes from, but
//! that very version: otherwise someone else's newer version may be in the cache already, and the
//! view would be older than the cache (or the pool gone).
//!
//! A task learns each patch's version as the store plans the write
//! ([`crate::store::ObjectStore::merge_status_planned`]), before any watch can deliver it: the
//! embedded store publishes a change before its writer hears back, so a version learnt only from
//! the answer would mostly reach the watch first, be decoded, and take the view down.

use std::collections::{HashMap, VecDeque};

use serde_json::Value;

use crate::{
    ipam::PoolStatus,
    store::{ChangeType, watcher::Seen},
    sync::lock,
};

/// How many of a pool's own versions are remembered: far more rounds than a watch lags behind.
const WRITTEN: usize = 64;

/// Per pool, the versions its task wrote and its view.
#[derive(Default)]
pub(super) struct Known(std::sync::Mutex<HashMap<String, Pool>>);

#[derive(Default)]
struct Pool {
    /// The versions the task wrote last, newest at the back. More than the last one: the pool
    /// watch delivers a version after its task may have written the next round already.
    written: VecDeque<String>,
    view: Option<View>,
    /// Bumped at each version of the pool the watch decodes that is neither the view's nor one the
    /// task wrote, at each deletion, at the start and the end of each list, and when the pool is
    /// forgotten. A task stands a view afresh only if nothing was decoded since it began the read or
    /// write the view comes from, but that very version: else someone else's version, newer than
    /// the task's, is in the cache (or the pool is gone) and the view would be older than the cache.
    decoded: u64,
    /// The version the watch decoded last.
    last_decoded: Option<String>,
}

/// Where a pool's watch stood when its task began a read or a write ([`Known::mark`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Mark(u64);

impl Pool {
    fn remember(&mut self, version: &str) {
        if self.written.back().is_some_and(|v| v == version) {
            return;
        }
        if self.written.len() == WRITTEN {
            self.written.pop_front();
        }
        self.written.push_back(version.to_string());
    }

    fn wrote(&self, version: &str) -> bool {
        self.written.iter().any(|v| v == version)
    }

    /// Whether a view of `version` built from a read or write begun at `mark` may stand.
    fn may_stand(&self, mark: Mark, version: &str) -> bool {
        self.decoded == mark.0
            || (self.decoded == mark.0 + 1 && self.last_decoded.as_deref() == Some(version))
    }

    /// The watch decoded `version` (`None`: not known).
    fn decoded(&mut self, version: Option<&str>) {
        self.view = None;
        self.decoded += 1;
        self.last_decoded = version.map(str::to_string);
    }
}

/// Who holds each address of a pool (`status.allocated`), as stored at `version`.
struct View {
    version: String,
    allocated: HashMap<String, String>,
}

impl View {
    fn of(version: &str, status: Option<&PoolStatus>) -> View {
        View {
            version: version.to_string(),
            allocated: status
                .map(|s| {
                    s.allocated
                        .iter()
                        .map(|(ip, id)| (ip.clone(), id.clone()))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// Applies the `allocated` part of a status merge patch (`null`: emptied).
    fn patch(&mut self, patch: &Value) {
        match patch.get("allocated") {
            None => {}
            Some(Value::Object(entries)) => {
                for (ip, id) in entries {
                    match id.as_str() {
                        Some(id) => {
                            self.allocated.insert(ip.clone(), id.to_string());
                        }
                        None => {
                            self.allocated.remove(ip);
                        }
                    }
                }
            }
            Some(_) => self.allocated.clear(),
        }
    }
}

impl Known {
    /// Whether `version` of `pool` is one its task wrote (one of the last [`WRITTEN`]).
    pub fn wrote(&self, pool: &str, version: &str) -> bool {
        lock(&self.0).get(pool).is_some_and(|p| p.wrote(version))
    }

    /// Where `pool`'s watch stands now: taken before a read or a write whose version the task may
    /// then stand its view at.
    pub fn mark(&self, pool: &str) -> Mark {
        // Made here if need be, so that a list after this mark counts against it.
        Mark(lock(&self.0).entry(pool.to_string()).or_default().decoded)
    }

    /// The task's write of `pool` is to have `version`: told before the watch can deliver it, so
    /// that the watch knows it for the task's own.
    pub fn planned(&self, pool: &str, version: &str) {
        lock(&self.0)
            .entry(pool.to_string())
            .or_default()
            .remember(version);
    }

    /// The task wrote `pool` at `version`, over `before`, in a write begun at `mark`: `patch` (a
    /// status merge patch) or the whole status; `status` is the status now stored. A standing
    /// view of `before` follows the patch; otherwise one is built from `status` (outside the lock:
    /// the store tells versions under its own) and stands if [`Pool::may_stand`].
    pub fn written(
        &self,
        pool: &str,
        mark: Mark,
        before: Option<&str>,
        version: &str,
        patch: Option<&Value>,
        status: Option<&PoolStatus>,
    ) {
        {
            let mut known = lock(&self.0);
            let p = known.entry(pool.to_string()).or_default();
            p.remember(version);
            if let (Some(view), Some(patch)) = (&mut p.view, patch)
                && Some(view.version.as_str()) == before
            {
                view.patch(patch);
                view.version = version.to_string();
                return;
            }
        }
        self.stand(pool, mark, View::of(version, status));
    }

    /// The task read `pool` at `version`, with `status`, in a read begun at `mark`.
    pub fn read(&self, pool: &str, mark: Mark, version: &str, status: Option<&PoolStatus>) {
        let standing = lock(&self.0)
            .get(pool)
            .and_then(|p| p.view.as_ref())
            .is_some_and(|v| v.version == version);
        if !standing {
            self.stand(pool, mark, View::of(version, status));
        }
    }

    fn stand(&self, pool: &str, mark: Mark, view: View) {
        let mut known = lock(&self.0);
        let p = known.entry(pool.to_string()).or_default();
        if p.may_stand(mark, &view.version) {
            p.view = Some(view);
        }
    }

    /// Whether the pool holds `ip` for `who`, by the view; `None` when there is none (ask the
    /// cache).
    pub fn holds(&self, pool: &str, ip: &str, who: &str) -> Option<bool> {
        let known = lock(&self.0);
        let view = known.get(pool)?.view.as_ref()?;
        Some(view.allocated.get(ip).is_some_and(|id| id == who))
    }

    /// Whether the watch must decode what it has `seen`: not a change its task wrote while its
    /// view stands. Any other version decoded takes the view down, as does a list.
    pub fn screen(&self, seen: Seen<'_>) -> bool {
        let (object, change) = match seen {
            Seen::Listing => {
                for p in lock(&self.0).values_mut() {
                    p.decoded(None);
                }
                return true;
            }
            Seen::Listed(object) => (object, None),
            Seen::Changed(object, change) => (object, Some(change)),
        };
        let meta = object.get("metadata");
        let field = |f: &str| meta.and_then(|m| m.get(f));
        let Some(name) = field("name").and_then(Value::as_str) else {
            return true;
        };
        let version = field("resourceVersion").and_then(Value::as_str);
        let deleting = field("deletionTimestamp").is_some_and(|v| !v.is_null());
        let mut known = lock(&self.0);
        if !known.contains_key(name) {
            known.insert(name.to_string(), Pool::default());
        }
        let Some(p) = known.get_mut(name) else {
            return true;
        };
        if change == Some(ChangeType::Modified) && !deleting && version.is_some_and(|v| p.wrote(v))
        {
            // The task's own: left out while its view stands. Decoded otherwise (the view is
            // down), but not counted against a read or write of the task's: its writes are
            // sequential and conditional, so an own version decoded after its mark is no newer
            // than what that read or write will see.
            return p.view.is_none();
        }
        if change == Some(ChangeType::Deleted) {
            p.decoded(None);
        } else if p.view.as_ref().map(|v| v.version.as_str()) != version {
            p.decoded(version);
        }
        true
    }

    /// The pool is gone: what its task wrote and its view are forgotten; a read or write begun
    /// before may not stand a view.
    pub fn forget(&self, pool: &str) {
        if let Some(p) = lock(&self.0).get_mut(pool) {
            p.written.clear();
            p.decoded(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn version(name: &str, rv: &str) -> Value {
        json!({"metadata": {"name": name, "resourceVersion": rv}})
    }

    fn status(entries: &[(&str, &str)]) -> PoolStatus {
        PoolStatus {
            allocated: entries
                .iter()
                .map(|(ip, id)| (ip.to_string(), id.to_string()))
                .collect(),
            ..PoolStatus::default()
        }
    }

    fn modified(known: &Known, name: &str, rv: &str) -> bool {
        known.screen(Seen::Changed(&version(name, rv), ChangeType::Modified))
    }

    /// A pool the task read at 10, then wrote at 11 and 12 by patches (the versions told at plan
    /// time, as the embedded store tells them).
    fn written_twice() -> Known {
        let known = Known::default();
        known.read(
            "p",
            known.mark("p"),
            "10",
            Some(&status(&[("10.0.0.1", "ns/a")])),
        );
        for (before, after, patch) in [
            ("10", "11", json!({"allocated": {"10.0.0.2": "ns/b"}})),
            (
                "11",
                "12",
                json!({"allocated": {"10.0.0.1": null, "10.0.0.3": "ns/c"}}),
            ),
        ] {
            let mark = known.mark("p");
            known.planned("p", after);
            // What the task holds is not read when its view follows the patch.
            known.written("p", mark, Some(before), after, Some(&patch), None);
        }
        known
    }

    #[test]
    fn the_view_follows_the_task_s_patches() {
        let known = written_twice();
        assert_eq!(known.holds("p", "10.0.0.1", "ns/a"), Some(false));
        assert_eq!(known.holds("p", "10.0.0.2", "ns/b"), Some(true));
        assert_eq!(known.holds("p", "10.0.0.2", "ns/x"), Some(false));
        assert_eq!(known.holds("p", "10.0.0.3", "ns/c"), Some(true));
        assert_eq!(known.holds("other", "10.0.0.3", "ns/c"), None);
        // An emptied map is written as null.
        let mark = known.mark("p");
        known.written(
            "p",
            mark,
            Some("12"),
            "13",
            Some(&json!({"allocated": null})),
            None,
        );
        assert_eq!(known.holds("p", "10.0.0.2", "ns/b"), Some(false));
        // A patch over a version the view is not at: the view is built from the status.
        let mark = known.mark("p");
        known.written(
            "p",
            mark,
            Some("99"),
            "14",
            Some(&json!({"allocated": {"10.0.0.9": "ns/z"}})),
            Some(&status(&[("10.0.0.8", "ns/y")])),
        );
        assert_eq!(known.holds("p", "10.0.0.8", "ns/y"), Some(true));
        assert_eq!(known.holds("p", "10.0.0.9", "ns/z"), Some(false));
    }

    #[test]
    fn the_task_s_own_versions_are_left_out_while_its_view_stands() {
        let known = written_twice();
        assert!(!modified(&known, "p", "11"));
        assert!(!modified(&known, "p", "12"));
        // The view's own version, decoded (someone else wrote it; the task read it), leaves the
        // view standing.
        let read = Known::default();
        read.read(
            "r",
            read.mark("r"),
            "10",
            Some(&status(&[("10.0.0.1", "ns/a")])),
        );
        assert!(modified(&read, "r", "10"));
        assert_eq!(read.holds("r", "10.0.0.1", "ns/a"), Some(true));
        // Another pool, an object without a name.
        assert!(modified(&known, "q", "11"));
        assert!(known.screen(Seen::Changed(&json!({}), ChangeType::Modified)));
        assert_eq!(known.holds("p", "10.0.0.3", "ns/c"), Some(true));
    }

    #[test]
    fn a_version_the_view_is_not_takes_it_down_until_the_task_reads_or_writes_again() {
        // Someone else's change.
        let known = written_twice();
        assert!(modified(&known, "p", "13"));
        assert_eq!(known.holds("p", "10.0.0.2", "ns/b"), None);
        // From then on the task's own versions are decoded too, so the cache catches up.
        assert!(modified(&known, "p", "12"));
        // Until the task reads (or writes) the pool again.
        known.read(
            "p",
            known.mark("p"),
            "13",
            Some(&status(&[("10.0.0.5", "ns/e")])),
        );
        assert_eq!(known.holds("p", "10.0.0.5", "ns/e"), Some(true));
        let mark = known.mark("p");
        known.planned("p", "14");
        known.written(
            "p",
            mark,
            Some("13"),
            "14",
            Some(&json!({"allocated": {}})),
            None,
        );
        assert!(!modified(&known, "p", "14"));

        // An older version delivered late (the task read a newer one first): the versions after
        // it, its own included, are decoded.
        let known = written_twice();
        assert!(modified(&known, "p", "9"));
        assert!(modified(&known, "p", "11"));
        assert_eq!(known.holds("p", "10.0.0.3", "ns/c"), None);

        // A list, whatever it holds.
        let known = written_twice();
        assert!(known.screen(Seen::Listing));
        assert_eq!(known.holds("p", "10.0.0.3", "ns/c"), None);
        assert!(modified(&known, "p", "12"));
    }

    /// A view stands afresh only if the watch decoded nothing since the read or write it comes
    /// from began, but that very version: else someone else's newer version is in the cache and
    /// the view would be older than the cache.
    #[test]
    fn a_view_does_not_stand_over_a_change_decoded_meanwhile() {
        // The task's patch 13 is told and left out; someone else's 14 is decoded before the
        // task hears back: no view at 13.
        let known = written_twice();
        let mark = known.mark("p");
        known.planned("p", "13");
        assert!(!modified(&known, "p", "13"));
        assert!(modified(&known, "p", "14"));
        known.written(
            "p",
            mark,
            Some("12"),
            "13",
            Some(&json!({"allocated": {}})),
            Some(&status(&[("10.0.0.2", "ns/b")])),
        );
        assert_eq!(known.holds("p", "10.0.0.2", "ns/b"), None);
        // Nor from a read begun before 14 was decoded.
        let known = written_twice();
        assert!(modified(&known, "p", "13"));
        let mark = known.mark("p");
        assert!(modified(&known, "p", "14"));
        known.read("p", mark, "13", Some(&status(&[("10.0.0.2", "ns/b")])));
        assert_eq!(known.holds("p", "10.0.0.2", "ns/b"), None);
        // The only version decoded meanwhile is the one written (told after the write, as the
        // Kubernetes backend tells it): the view stands.
        let known = written_twice();
        assert!(modified(&known, "p", "13"));
        let mark = known.mark("p");
        assert!(modified(&known, "p", "14"));
        known.written(
            "p",
            mark,
            Some("13"),
            "14",
            None,
            Some(&status(&[("10.0.0.7", "ns/g")])),
        );
        assert_eq!(known.holds("p", "10.0.0.7", "ns/g"), Some(true));
        // Deleted meanwhile: no view, and none from a write begun before the pool was forgotten.
        let known = written_twice();
        let mark = known.mark("p");
        known.planned("p", "13");
        assert!(!modified(&known, "p", "13"));
        assert!(known.screen(Seen::Changed(&version("p", "14"), ChangeType::Deleted)));
        known.written("p", mark, Some("12"), "13", None, Some(&status(&[])));
        assert_eq!(known.holds("p", "10.0.0.3", "ns/c"), None);
        let known = written_twice();
        let mark = known.mark("p");
        known.forget("p");
        known.written("p", mark, Some("12"), "13", None, Some(&status(&[])));
        assert_eq!(known.holds("p", "10.0.0.3", "ns/c"), None);
        assert!(!known.wrote("p", "12"));
    }

    /// The task's own versions the watch delivers late (its view down) are decoded but do not
    /// keep the view from standing again; a list begun after the mark does.
    #[test]
    fn late_own_versions_do_not_keep_a_view_down_but_a_list_does() {
        let known = written_twice();
        assert!(modified(&known, "p", "13"));
        let mark = known.mark("p");
        assert!(modified(&known, "p", "11"));
        assert!(modified(&known, "p", "12"));
        known.read("p", mark, "13", Some(&status(&[("10.0.0.5", "ns/e")])));
        assert_eq!(known.holds("p", "10.0.0.5", "ns/e"), Some(true));

        let known = written_twice();
        assert!(modified(&known, "p", "13"));
        let mark = known.mark("p");
        assert!(known.screen(Seen::Listing));
        known.read("p", mark, "13", Some(&status(&[("10.0.0.5", "ns/e")])));
        assert_eq!(known.holds("p", "10.0.0.5", "ns/e"), None);
        // Nor for a pool the watch had not shown yet when the task marked it.
        let known = Known::default();
        let mark = known.mark("new");
        assert!(known.screen(Seen::Listing));
        known.read("new", mark, "3", None);
        assert_eq!(known.holds("new", "10.0.0.5", "ns/e"), None);
    }

    #[test]
    fn deletions_and_deleting_pools_are_always_decoded() {
        let known = written_twice();
        let mut deleting = version("p", "12");
        deleting["metadata"]["deletionTimestamp"] = json!("2026-12-07T00:00:00Z");
        assert!(known.screen(Seen::Changed(&deleting, ChangeType::Modified)));
        assert!(known.screen(Seen::Changed(&version("p", "12"), ChangeType::Deleted)));
        assert_eq!(known.holds("p", "10.0.0.3", "ns/c"), None);
        known.forget("p");
        assert!(!known.wrote("p", "12"));
    }

    #[test]
    fn only_the_last_versions_are_remembered() {
        let known = Known::default();
        for rv in 1..=(WRITTEN + 1) {
            known.planned("p", &rv.to_string());
        }
        assert!(!known.wrote("p", "1"));
        assert!(known.wrote("p", "2"));
        assert!(known.wrote("p", &(WRITTEN + 1).to_string()));
    }
}
