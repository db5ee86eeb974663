//! kube-runtime watcher events from the store port: list, then watch from the list's resourceVersion,
//! and list again when the watch says the version is too old (`Gone`), exactly as kube-runtime's own
//! watcher does against the Kubernetes API. The stream feeds a reflector and the controller loop
//! (`harvester_cloud_controller::Controller::for_stream`), so one controller driver serves every
//! backend.
//!
//! The stream never ends on its own: failures are reported as items (the controller logs them) and
//! retried with a capped exponential back-off; a watch that simply ends (Kubernetes closes watches
//! after a timeout) is resumed from the last resourceVersion seen.

use std::{fmt::Debug, sync::Arc, time::Duration};

use futures::{Stream, StreamExt, stream};
use kube::core::Status;
use kube::runtime::watcher::{Error as WatchError, Event};
use tracing::{debug, warn};

use super::{
    Change, ChangeStream, ChangeType, Kind, LabelSelector, Object, ObjectStore, StoreError,
};

/// First and largest pause after a failed list or watch.
const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

enum State {
    /// Must list (first start, or the watch position is gone).
    Listing,
    /// Watching from `rv`; `stream` is `None` when the watch must be (re)started.
    Watching {
        rv: String,
        stream: Option<ChangeStream>,
    },
}

/// What a [`Screen`] is shown.
#[derive(Clone, Copy, Debug)]
pub enum Seen<'a> {
    /// A list begins, and again once it is taken: what was known of every object may be gone (a
    /// deletion during a watch gap is only an absence from the list).
    Listing,
    /// An object of the list (always yielded, whatever the answer: a list is the whole state).
    Listed(&'a serde_json::Value),
    /// A watched change.
    Changed(&'a serde_json::Value, ChangeType),
}

/// Looks at each object before it is decoded: `false` leaves a watched change out of the stream
/// (it is neither decoded nor yielded).
pub type Screen = Arc<dyn Fn(Seen<'_>) -> bool + Send + Sync>;

struct Source {
    store: Arc<dyn ObjectStore>,
    kind: Kind,
    namespace: Option<String>,
    failures: u32,
    screen: Option<Screen>,
}

impl Source {
    async fn pause_after_failure(&mut self) {
        if self.failures > 0 {
            let factor = 1u32 << self.failures.min(10);
            tokio::time::sleep((BACKOFF_START * factor).min(BACKOFF_MAX)).await;
        }
    }

    fn failed(&mut self, what: &str, e: &StoreError) -> WatchError {
        self.failures = self.failures.saturating_add(1);
        warn!(kind = %self.kind.kind, error = %e, failures = self.failures, "{what} failed; retrying");
        WatchError::WatchError(
            Status::failure(
                &format!("{what} of {} failed: {e}", self.kind.plural),
                "StoreError",
            )
            .boxed(),
        )
    }

    /// What the screen, if any, says of `seen` (`true`: decode it).
    fn show(&self, seen: Seen<'_>) -> bool {
        self.screen.as_ref().is_none_or(|screen| screen(seen))
    }

    fn decode<K: Object>(&self, value: &serde_json::Value) -> Option<K> {
        // Decoded from the shared change by reference: a copy of the JSON first would cost as much
        // again (a pool status holds thousands of entries).
        match K::deserialize(value) {
            Ok(mut k) => {
                strip_for_cache(&mut k);
                Some(k)
            }
            Err(e) => {
                let (namespace, name) = super::object_key(value);
                // One undecodable object must not stop the controller for all others.
                warn!(kind = %self.kind.kind, %namespace, %name, error = %e, "skipping an object that does not decode");
                None
            }
        }
    }
}

/// Drops what no reader of a watched object uses before the object is kept: `metadata.managedFields`,
/// which on a real API server is most of an object's bytes (one entry per field manager, each with a
/// JSON map of every field it set) and which no controller reads. Every object a watcher yields lands
/// in a reflector cache or a controller queue, so this is what they hold, thousands of times over.
///
/// `None`, never `Some(vec![])`: a write built from the stripped copy then omits the field (k8s-openapi
/// serializes no `None`), and the API server keeps the managedFields it has; an empty list would
/// tell it to clear them.
pub fn strip_for_cache<K: Object>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// The watcher event stream of `kind` (in `namespace`, or all namespaces).
pub fn watcher<K>(
    store: Arc<dyn ObjectStore>,
    kind: Kind,
    namespace: Option<String>,
) -> impl Stream<Item = Result<Event<K>, WatchError>> + Send + 'static
where
    K: Object + Debug,
{
    screened_watcher(store, kind, namespace, None)
}

/// [`watcher`], with each watched change left out, undecoded, when `screen` says so (the watch
/// position still moves past it).
pub fn screened_watcher<K>(
    store: Arc<dyn ObjectStore>,
    kind: Kind,
    namespace: Option<String>,
    screen: Option<Screen>,
) -> impl Stream<Item = Result<Event<K>, WatchError>> + Send + 'static
where
    K: Object + Debug,
{
    let source = Source {
        store,
        kind,
        namespace,
        failures: 0,
        screen,
    };
    stream::unfold((source, State::Listing), |(mut source, state)| async move {
        let (items, next) = step::<K>(&mut source, state).await;
        Some((stream::iter(items), (source, next)))
    })
    .flatten()
}

async fn step<K: Object + Debug>(
    source: &mut Source,
    state: State,
) -> (Vec<Result<Event<K>, WatchError>>, State) {
    match state {
        State::Listing => {
            source.pause_after_failure().await;
            // Each object is decoded as the store hands it over and its JSON dropped at once: the
            // whole list as JSON beside the whole list decoded was the peak of a cold start.
            let mut events = vec![Ok(Event::Init)];
            source.show(Seen::Listing);
            let listed = {
                let src = &*source;
                src.store
                    .list_each(
                        &src.kind,
                        src.namespace.as_deref(),
                        &LabelSelector::everything(),
                        &mut |v| {
                            src.show(Seen::Listed(&v));
                            if let Some(k) = src.decode::<K>(&v) {
                                events.push(Ok(Event::InitApply(k)));
                            }
                        },
                    )
                    .await
            };
            match listed {
                Ok(resource_version) => {
                    source.failures = 0;
                    // Again once listed: an object deleted while the list was being taken is only
                    // absent from it.
                    source.show(Seen::Listing);
                    debug!(kind = %source.kind.kind, objects = events.len() - 1, %resource_version, "listed");
                    events.push(Ok(Event::InitDone));
                    (
                        events,
                        State::Watching {
                            rv: resource_version,
                            stream: None,
                        },
                    )
                }
                Err(e) => (vec![Err(source.failed("list", &e))], State::Listing),
            }
        }
        State::Watching { rv, stream: None } => {
            source.pause_after_failure().await;
            match source
                .store
                .watch(&source.kind, source.namespace.as_deref(), &rv)
                .await
            {
                Ok(stream) => (
                    Vec::new(),
                    State::Watching {
                        rv,
                        stream: Some(stream),
                    },
                ),
                Err(StoreError::Gone) => {
                    debug!(kind = %source.kind.kind, "watch position is gone; listing again");
                    crate::metrics::watch_relisted(&source.kind.kind);
                    (Vec::new(), State::Listing)
                }
                Err(e) => (
                    vec![Err(source.failed("watch", &e))],
                    State::Watching { rv, stream: None },
                ),
            }
        }
        State::Watching {
            rv,
            stream: Some(mut stream),
        } => match stream.next().await {
            Some(Ok(change)) => {
                source.failures = 0;
                let rv = change.resource_version.to_string();
                let events = event_of(source, &change).into_iter().map(Ok).collect();
                (
                    events,
                    State::Watching {
                        rv,
                        stream: Some(stream),
                    },
                )
            }
            Some(Err(StoreError::Gone)) => {
                debug!(kind = %source.kind.kind, "watch position is gone; listing again");
                crate::metrics::watch_relisted(&source.kind.kind);
                (Vec::new(), State::Listing)
            }
            Some(Err(e)) => (
                vec![Err(source.failed("watch", &e))],
                State::Watching { rv, stream: None },
            ),
            // Watches end (Kubernetes closes them after a timeout): resume where this one stopped.
            None => (Vec::new(), State::Watching { rv, stream: None }),
        },
    }
}

fn event_of<K: Object + Debug>(source: &Source, change: &Change) -> Option<Event<K>> {
    if !source.show(Seen::Changed(&change.object, change.change)) {
        return None;
    }
    let object = source.decode::<K>(&change.object)?;
    Some(match change.change {
        ChangeType::Added | ChangeType::Modified => Event::Apply(object),
        ChangeType::Deleted => Event::Delete(object),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        Api, Preconditions,
        embedded::{Durability, EmbeddedStore},
    };
    use k8s_openapi::{api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::ObjectMeta};

    fn mk_cm(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn names(events: &[Event<ConfigMap>]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                Event::Init => "init".to_string(),
                Event::InitApply(c) => {
                    format!("initapply:{}", c.metadata.name.clone().unwrap_or_default())
                }
                Event::InitDone => "initdone".to_string(),
                Event::Apply(c) => format!("apply:{}", c.metadata.name.clone().unwrap_or_default()),
                Event::Delete(c) => {
                    format!("delete:{}", c.metadata.name.clone().unwrap_or_default())
                }
            })
            .collect()
    }

    /// A fresh embedded store (the directory lives as long as the first half).
    async fn open() -> (tempfile::TempDir, Arc<dyn ObjectStore>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = EmbeddedStore::open(dir.path(), Durability::Normal)
            .await
            .expect("opens");
        (dir, store)
    }

    #[tokio::test]
    async fn lists_then_follows_changes() {
        let (_dir, dyn_store) = open().await;
        let api = Api::<ConfigMap>::new(dyn_store.clone());
        api.create(&mk_cm("a")).await.expect("create");
        let events = watcher::<ConfigMap>(dyn_store, Kind::of::<ConfigMap>(), None);
        tokio::pin!(events);
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(events.next().await.expect("event").expect("ok"));
        }
        assert_eq!(names(&seen), ["init", "initapply:a", "initdone"]);
        api.create(&mk_cm("b")).await.expect("create");
        api.delete("ns", "a", &Preconditions::default())
            .await
            .expect("delete");
        let mut seen = Vec::new();
        for _ in 0..2 {
            seen.push(events.next().await.expect("event").expect("ok"));
        }
        assert_eq!(names(&seen), ["apply:b", "delete:a"]);
    }

    /// A screen sees a list begin and end around its objects, and each change before it is
    /// decoded; a change it refuses is not yielded, and the watch goes on past it.
    #[tokio::test]
    async fn a_screen_sees_lists_whole_and_leaves_out_what_it_refuses() {
        let (_dir, dyn_store) = open().await;
        let api = Api::<ConfigMap>::new(dyn_store.clone());
        api.create(&mk_cm("a")).await.expect("create");
        api.create(&mk_cm("b")).await.expect("create");
        let shown = Arc::new(std::sync::Mutex::new(Vec::new()));
        let screen: Screen = {
            let shown = shown.clone();
            Arc::new(move |seen| {
                let (tag, name) = match seen {
                    Seen::Listing => ("listing", String::new()),
                    Seen::Listed(o) => ("listed", super::super::object_key(o).1),
                    Seen::Changed(o, _) => ("changed", super::super::object_key(o).1),
                };
                shown.lock().unwrap().push(format!("{tag}:{name}"));
                name != "refused"
            })
        };
        let events =
            screened_watcher::<ConfigMap>(dyn_store, Kind::of::<ConfigMap>(), None, Some(screen));
        tokio::pin!(events);
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(events.next().await.expect("event").expect("ok"));
        }
        assert_eq!(
            names(&seen),
            ["init", "initapply:a", "initapply:b", "initdone"]
        );
        assert_eq!(
            *shown.lock().unwrap(),
            ["listing:", "listed:a", "listed:b", "listing:"]
        );
        api.create(&mk_cm("refused")).await.expect("create");
        api.create(&mk_cm("c")).await.expect("create");
        let next = events.next().await.expect("event").expect("ok");
        assert_eq!(names(&[next]), ["apply:c"]);
        assert_eq!(shown.lock().unwrap()[4..], ["changed:refused", "changed:c"]);
    }

    /// What the watcher yields (and so what every cache keeps) has no managedFields, listed or
    /// changed, although the store holds them.
    #[tokio::test]
    async fn cached_objects_have_no_managed_fields() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        let (_dir, dyn_store) = open().await;
        let api = Api::<ConfigMap>::new(dyn_store.clone());
        let with_fields = |name: &str| {
            let mut cm = mk_cm(name);
            cm.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
                manager: Some("kubectl".into()),
                operation: Some("Apply".into()),
                fields_type: Some("FieldsV1".into()),
                ..Default::default()
            }]);
            cm
        };
        api.create(&with_fields("listed")).await.expect("create");
        let stored = api.get("ns", "listed").await.expect("get").expect("there");
        assert!(
            stored
                .metadata
                .managed_fields
                .is_some_and(|m| !m.is_empty()),
            "the store keeps them, so the watcher has something to drop"
        );
        let events = watcher::<ConfigMap>(dyn_store, Kind::of::<ConfigMap>(), None);
        tokio::pin!(events);
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(events.next().await.expect("event").expect("ok"));
        }
        api.create(&with_fields("changed")).await.expect("create");
        seen.push(events.next().await.expect("event").expect("ok"));
        assert_eq!(
            names(&seen),
            ["init", "initapply:listed", "initdone", "apply:changed"]
        );
        for event in &seen {
            if let Event::InitApply(cm) | Event::Apply(cm) = event {
                // None, not an empty list: a write from this copy must not clear the server's.
                assert_eq!(cm.metadata.managed_fields, None, "{:?}", cm.metadata.name);
            }
        }
    }

    fn relists() -> f64 {
        // Each test runs in a process of its own (nextest), so the count is this test's.
        crate::metrics::sample(
            &crate::metrics::encode(),
            "harvester_cloud_watch_relists_total{kind=\"ConfigMap\"}",
        )
        .unwrap_or(0.0)
    }

    /// Creates `count` ConfigMaps of `bytes` each while the watcher reads nothing (it has
    /// subscribed: a poll that times out left it waiting on the store's changes), then reads until
    /// it has seen them all; whether it listed again.
    async fn fall_behind(count: usize, bytes: usize) -> bool {
        let (_dir, dyn_store) = open().await;
        let api = Api::<ConfigMap>::new(dyn_store.clone());
        let events = watcher::<ConfigMap>(dyn_store, Kind::of::<ConfigMap>(), None);
        tokio::pin!(events);
        for _ in 0..2 {
            events.next().await.expect("event").expect("ok");
        }
        let idle = tokio::time::timeout(Duration::from_millis(50), events.next()).await;
        assert!(idle.is_err(), "nothing to see yet");
        let data = "x".repeat(bytes);
        for i in 0..count {
            let mut cm = mk_cm(&format!("cm{i}"));
            cm.data = Some([("d".to_string(), data.clone())].into());
            api.create(&cm).await.expect("create");
        }
        let mut relisted = false;
        let mut seen = std::collections::HashSet::new();
        while seen.len() < count {
            match events.next().await.expect("event").expect("ok") {
                Event::Init => relisted = true,
                Event::InitApply(c) | Event::Apply(c) => {
                    seen.insert(c.metadata.name.unwrap_or_default());
                }
                _ => {}
            }
        }
        relisted
    }

    /// A watcher further behind than the store's change channel holds (4,096 changes) resumes
    /// from the history and misses nothing, without listing again.
    #[tokio::test]
    async fn a_watcher_behind_the_channel_resumes_from_the_history() {
        assert!(!fall_behind(5_000, 10).await, "no list again");
        assert_eq!(relists(), 0.0);
    }

    /// A watcher further behind than the history reaches (32 MiB of changes) lists again, as
    /// after a 410 from Kubernetes, misses nothing, and is counted.
    #[tokio::test]
    async fn a_watcher_behind_the_history_lists_again_and_is_counted() {
        assert!(fall_behind(4_200, 16 << 10).await, "listed again");
        assert!(relists() >= 1.0, "and the relist was counted");
    }
}
