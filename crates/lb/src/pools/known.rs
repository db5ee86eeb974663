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
//! deleting pool's versions are always decoded.
//!
//! A task learns each patch's version as the store plans the write
//! ([`crate::store::ObjectStore::merge_status_planned`]), before any watch can deliver it: the
//! embedded store publishes a change before its writer hears back, so a version learnt only from
//! the answer would mostly reach the watch first, be decoded, and take the view down.

use std::collections::{HashMap, VecDeque};

use serde_json::Value;

use crate::{ipam::PoolStatus, store::ChangeType, sync::lock};

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
}

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
        lock(&self.0)
            .get(pool)
            .is_some_and(|p| p.written.iter().any(|v| v == version))
    }

    /// The task wrote `pool` at `version`, over `before`: `patch` (a status merge patch) or the
    /// whole status; `status` is the status now stored.
    pub fn written(
        &self,
        pool: &str,
        before: Option<&str>,
        version: &str,
        patch: Option<&Value>,
        status: Option<&PoolStatus>,
    ) {
        let mut known = lock(&self.0);
        let p = known.entry(pool.to_string()).or_default();
        p.remember(version);
        match (&mut p.view, patch) {
            (Some(view), Some(patch)) if Some(view.version.as_str()) == before => {
                view.patch(patch);
                view.version = version.to_string();
            }
            _ => p.view = Some(View::of(version, status)),
        }
    }

    /// The task's write of `pool` is to have `version`: told before the watch can deliver it, so
    /// that the watch knows it for the task's own.
    pub fn planned(&self, pool: &str, version: &str) {
        lock(&self.0)
            .entry(pool.to_string())
            .or_default()
            .remember(version);
    }

    /// The task read `pool` at `version`, with `status`.
    pub fn read(&self, pool: &str, version: &str, status: Option<&PoolStatus>) {
        let mut known = lock(&self.0);
        let p = known.entry(pool.to_string()).or_default();
        if p.view.as_ref().is_none_or(|v| v.version != version) {
            p.view = Some(View::of(version, status));
        }
    }

    /// Whether the pool holds `ip` for `who`, by the view; `None` when there is none (ask the
    /// cache).
    pub fn holds(&self, pool: &str, ip: &str, who: &str) -> Option<bool> {
        let known = lock(&self.0);
        let view = known.get(pool)?.view.as_ref()?;
        Some(view.allocated.get(ip).is_some_and(|id| id == who))
    }

    /// Whether the watch must decode `object` (a change of type `change`, or `None`: listed):
    /// not when its task wrote it and its view stands. A version decoded that is not the view's
    /// takes the view down.
    pub fn screen(&self, object: &Value, change: Option<ChangeType>) -> bool {
        let meta = object.get("metadata");
        let field = |f: &str| meta.and_then(|m| m.get(f));
        let Some(name) = field("name").and_then(Value::as_str) else {
            return true;
        };
        let version = field("resourceVersion").and_then(Value::as_str);
        let deleting = field("deletionTimestamp").is_some_and(|v| !v.is_null());
        let mut known = lock(&self.0);
        let Some(p) = known.get_mut(name) else {
            return true;
        };
        if change == Some(ChangeType::Modified)
            && !deleting
            && p.view.is_some()
            && version.is_some_and(|v| p.written.iter().any(|w| w == v))
        {
            return false;
        }
        if change == Some(ChangeType::Deleted)
            || p.view
                .as_ref()
                .is_some_and(|view| Some(view.version.as_str()) != version)
        {
            p.view = None;
        }
        true
    }

    pub fn forget(&self, pool: &str) {
        lock(&self.0).remove(pool);
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

    const MODIFIED: Option<ChangeType> = Some(ChangeType::Modified);

    /// A pool the task read at 10, then wrote at 11 and 12 by patches.
    fn written_twice() -> Known {
        let known = Known::default();
        known.read("p", "10", Some(&status(&[("10.0.0.1", "ns/a")])));
        known.written(
            "p",
            Some("10"),
            "11",
            Some(&json!({"allocated": {"10.0.0.2": "ns/b"}})),
            Some(&status(&[("10.0.0.1", "ns/a"), ("10.0.0.2", "ns/b")])),
        );
        known.written(
            "p",
            Some("11"),
            "12",
            Some(&json!({"allocated": {"10.0.0.1": null, "10.0.0.3": "ns/c"}})),
            // What the task holds; the view follows the patch, not this.
            None,
        );
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
        known.written(
            "p",
            Some("12"),
            "13",
            Some(&json!({"allocated": null})),
            None,
        );
        assert_eq!(known.holds("p", "10.0.0.2", "ns/b"), Some(false));
        // A patch over a version the view is not at rebuilds the view from the status.
        known.written(
            "p",
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
        assert!(!known.screen(&version("p", "11"), MODIFIED));
        assert!(!known.screen(&version("p", "12"), MODIFIED));
        // Not a version it wrote: decoded; the view's own version leaves it standing.
        assert!(known.screen(&version("p", "10"), MODIFIED));
        assert!(known.screen(&version("p", "12"), None));
        // Another pool, a pool no task knows, an object without a name.
        assert!(known.screen(&version("q", "11"), MODIFIED));
        assert!(known.screen(&json!({}), MODIFIED));
    }

    #[test]
    fn a_version_the_view_is_not_takes_it_down_until_the_task_reads_or_writes_again() {
        // Someone else's change.
        let known = written_twice();
        assert!(known.screen(&version("p", "13"), MODIFIED));
        assert_eq!(known.holds("p", "10.0.0.2", "ns/b"), None);
        // From then on the task's own versions are decoded too, so the cache catches up.
        assert!(known.screen(&version("p", "12"), MODIFIED));
        // Until the task reads (or writes) the pool again.
        known.read("p", "13", Some(&status(&[("10.0.0.5", "ns/e")])));
        assert_eq!(known.holds("p", "10.0.0.5", "ns/e"), Some(true));
        known.written("p", Some("13"), "14", Some(&json!({"allocated": {}})), None);
        assert!(!known.screen(&version("p", "14"), MODIFIED));

        // An older version delivered late (the task read a newer one first): the versions after
        // it, its own included, are decoded.
        let known = written_twice();
        assert!(known.screen(&version("p", "9"), MODIFIED));
        assert!(known.screen(&version("p", "11"), MODIFIED));
        assert_eq!(known.holds("p", "10.0.0.3", "ns/c"), None);

        // A list.
        let known = written_twice();
        assert!(known.screen(&version("p", "11"), None));
        assert_eq!(known.holds("p", "10.0.0.3", "ns/c"), None);
    }

    #[test]
    fn deletions_and_deleting_pools_are_always_decoded() {
        let known = written_twice();
        let mut deleting = version("p", "12");
        deleting["metadata"]["deletionTimestamp"] = json!("2026-12-07T00:00:00Z");
        assert!(known.screen(&deleting, MODIFIED));
        assert!(known.screen(&version("p", "12"), Some(ChangeType::Deleted)));
        assert_eq!(known.holds("p", "10.0.0.3", "ns/c"), None);
        known.forget("p");
        assert!(!known.wrote("p", "12"));
    }

    #[test]
    fn only_the_last_versions_are_remembered() {
        let known = Known::default();
        for rv in 1..=(WRITTEN + 1) {
            known.written("p", None, &rv.to_string(), None, None);
        }
        assert!(!known.wrote("p", "1"));
        assert!(known.wrote("p", "2"));
        assert!(known.wrote("p", &(WRITTEN + 1).to_string()));
    }
}
