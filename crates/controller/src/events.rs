//! Events about LoadBalancers and IPPools (`Allocated`, `Released`, `NoMatchedIPPool`,
//! `PoolExhausted`, `AllocationFailed`), written as core/v1 Event objects through the store port: real
//! Kubernetes Events on the Kubernetes backend, and the same objects as an event log on the embedded
//! one.
//!
//! Events are best effort, as in Kubernetes: they are queued and written by a background task so a
//! reconcile never waits for one, and dropped if the queue is full (a warning per burst, and
//! `harvester_cloud_events_dropped_total` counts each; `harvester_cloud_events_queued` is the
//! backlog). They are written in batches (`ObjectStore::create_each`), which the embedded store
//! answers once committed, before the fsync that makes them durable (the next write's, or the
//! syncer's). At the stop, the Events queued are still written for up to 5 s. Kubernetes deletes
//! Events after an hour; the embedded store has no such TTL, so the writer also deletes its own Events
//! older than [`EVENT_TTL`] (on Kubernetes that only anticipates the API server).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::{
    api::core::v1::{Event, EventSource, ObjectReference},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span, warn};

use crate::{
    crd::keys::{MANAGED_BY, MANAGED_BY_LABEL},
    store::{Api, LabelSelector, ObjectStore, Preconditions},
};

/// The component named in Events.
pub const COMPONENT: &str = "harvester-cloud-lb";
/// How long Events are kept (Kubernetes' default `--event-ttl`).
pub(crate) const EVENT_TTL: Duration = Duration::from_secs(3600);
/// How often old Events are looked for.
const PRUNE_EVERY: Duration = Duration::from_secs(600);
/// Events waiting to be written (besides up to [`LANE`] + [`BATCH`] per lane); beyond this they
/// are dropped.
const QUEUE: usize = 16_384;
/// Lanes written at once (see [`write_in_lanes`]).
const WRITERS: usize = 8;
/// Events a lane holds before the queue waits for it.
const LANE: usize = 256;
/// The most Events a lane writes at once (the embedded store commits them as one write).
const BATCH: usize = 256;
/// How long the writer keeps writing the Events queued when it is stopped.
const DRAIN: Duration = Duration::from_secs(5);

/// Event reasons.
pub mod reason {
    pub const ALLOCATED: &str = "Allocated";
    pub const RELEASED: &str = "Released";
    pub const NO_MATCHED_IP_POOL: &str = "NoMatchedIPPool";
    pub const POOL_EXHAUSTED: &str = "PoolExhausted";
    pub const ALLOCATION_FAILED: &str = "AllocationFailed";
    /// A requested address lies in no pool the LoadBalancer may use, or is not a valid request.
    pub const REQUESTED_ADDRESS_UNAVAILABLE: &str = "RequestedAddressUnavailable";
    /// A requested address is held by another LoadBalancer.
    pub const REQUESTED_ADDRESS_TAKEN: &str = "RequestedAddressTaken";
    /// On an IPPool: 90% or more of its addresses are allocated.
    pub const POOL_NEARLY_FULL: &str = "PoolNearlyFull";
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// An Event recorded and not yet written. It counts in `harvester_cloud_events_queued` for as
/// long as it exists, so whichever way it goes (written, failed, dropped, given up at a stop) it
/// leaves the backlog exactly once.
pub struct Recorded(Event);

impl Recorded {
    pub fn new(event: Event) -> Self {
        harvester_cloud_metrics::events_queued(1);
        Recorded(event)
    }

    /// The Event (it leaves the backlog).
    pub fn into_event(mut self) -> Event {
        std::mem::take(&mut self.0)
    }
}

impl std::ops::Deref for Recorded {
    type Target = Event;

    fn deref(&self) -> &Event {
        &self.0
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        harvester_cloud_metrics::events_queued(-1);
    }
}

/// Queues Events for the writer task. Cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    tx: mpsc::Sender<Recorded>,
    component: Arc<str>,
    instance: Arc<str>,
    sequence: Arc<AtomicU64>,
    /// Whether the last Event was dropped for a full queue: a burst warns once, not per Event
    /// (`harvester_cloud_events_dropped_total` counts each).
    dropping: Arc<AtomicBool>,
}

impl Recorder {
    /// Starts the writer; it stops when `stop` is cancelled, after writing the Events queued by then
    /// (for up to 5 s, and unless the process exits first).
    pub fn start(store: Arc<dyn ObjectStore>, instance: &str, stop: CancellationToken) -> Self {
        Self::start_as(store, COMPONENT, instance, true, stop)
    }

    /// [`Recorder::start`] for another component (the name Events give as their source); `prune`:
    /// whether it deletes its own Events once they are old (not needed where the API server expires
    /// Events itself, and then it needs no right to list or delete them).
    pub fn start_as(
        store: Arc<dyn ObjectStore>,
        component: &str,
        instance: &str,
        prune: bool,
        stop: CancellationToken,
    ) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(
            write_events(store, rx, prune, stop).instrument(info_span!("event_writer", component)),
        );
        Self::sending_to(tx, component, instance)
    }

    /// A recorder whose Events go to the returned receiver, in the order recorded, instead of a
    /// store: for tests that call a reconcile directly and read what it reported.
    pub fn capture(component: &str, instance: &str) -> (Self, mpsc::Receiver<Recorded>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (Self::sending_to(tx, component, instance), rx)
    }

    /// A recorder that queues its Events on `tx`.
    fn sending_to(tx: mpsc::Sender<Recorded>, component: &str, instance: &str) -> Self {
        Recorder {
            tx,
            component: component.into(),
            instance: instance.into(),
            sequence: Arc::new(AtomicU64::new(0)),
            dropping: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Records an event about `object`.
    pub fn record<K: kube::Resource<DynamicType = ()>>(
        &self,
        object: &K,
        kind: EventType,
        reason: &'static str,
        message: String,
    ) {
        let meta = object.meta();
        let name = meta.name.clone().unwrap_or_default();
        let mut involved: ObjectReference = object.object_ref(&());
        involved.resource_version = meta.resource_version.clone();
        let now = Timestamp::now();
        // Kubernetes names events `<object>.<unique hex>`; the sequence keeps two events of one
        // nanosecond apart.
        let unique = (now.as_nanosecond() as u64)
            .wrapping_add(self.sequence.fetch_add(1, Ordering::Relaxed));
        let event = Event {
            metadata: ObjectMeta {
                name: Some(format!("{name}.{unique:x}")),
                // Events about cluster-scoped objects live in `default`, as Kubernetes puts them.
                namespace: Some(meta.namespace.clone().unwrap_or_else(|| "default".into())),
                labels: Some([(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string())].into()),
                ..Default::default()
            },
            involved_object: involved,
            reason: Some(reason.into()),
            message: Some(message),
            type_: Some(kind.as_str().into()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            source: Some(EventSource {
                component: Some(self.component.to_string()),
                host: None,
            }),
            reporting_component: Some(self.component.to_string()),
            reporting_instance: Some(self.instance.to_string()),
            ..Default::default()
        };
        match self.tx.try_send(Recorded::new(event)) {
            Ok(()) => self.dropping.store(false, Ordering::Relaxed),
            Err(mpsc::error::TrySendError::Full(_)) => {
                harvester_cloud_metrics::event_dropped(reason);
                if !self.dropping.swap(true, Ordering::Relaxed) {
                    warn!(%reason, "event queue full; dropping events until it has room (harvester_cloud_events_dropped_total counts them)");
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                harvester_cloud_metrics::event_dropped(reason);
                debug!(%reason, "event writer stopped; dropping event");
            }
        }
    }
}

async fn write_events(
    store: Arc<dyn ObjectStore>,
    rx: mpsc::Receiver<Recorded>,
    prune: bool,
    stop: CancellationToken,
) {
    let api = Api::<Event>::new(store.clone());
    let prune = {
        let api = api.clone();
        let stop = stop.clone();
        async move {
            if !prune {
                return std::future::pending().await;
            }
            let mut tick = tokio::time::interval(PRUNE_EVERY);
            loop {
                tokio::select! {
                    // Pruning stops, but the writer ends the task: after the stop it still
                    // writes what was queued (`write_in_lanes`), which ending here would cut off.
                    _ = stop.cancelled() => return std::future::pending().await,
                    _ = tick.tick() => prune_old(&api).await,
                }
            }
        }
    };
    let kind = crate::store::Kind::of::<Event>();
    let write_batch = |events: Vec<Recorded>| {
        let (store, kind) = (store.clone(), kind.clone());
        async move {
            let mut objects = Vec::with_capacity(events.len());
            let mut reasons = Vec::with_capacity(events.len());
            for event in &events {
                match crate::store::to_stored(&**event) {
                    Ok((_, object)) => {
                        objects.push(object);
                        reasons.push(event.reason.as_deref().unwrap_or_default());
                    }
                    Err(e) => {
                        warn!(reason = event.reason.as_deref().unwrap_or_default(), error = %e, "cannot write event");
                    }
                }
            }
            for (written, reason) in store
                .create_each(&kind, objects)
                .await
                .into_iter()
                .zip(reasons)
            {
                if let Err(e) = written {
                    warn!(%reason, error = %e, "cannot write event");
                }
            }
            // The batch leaves the backlog only now, written or not.
            drop(events);
        }
    };
    // The writer ends when every Recorder is gone (or on `stop`); pruning goes with it.
    tokio::select! {
        _ = prune => {},
        _ = write_in_lanes(rx, stop, write_batch) => {},
    }
    debug!("event writer stopped");
}

/// The lane an Event is written in: one per involved object, so that object's Events are stored
/// (and get their resourceVersions) in the order they were recorded.
fn lane_of(event: &Event) -> usize {
    use std::hash::{Hash, Hasher};
    let o = &event.involved_object;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&o.uid, &o.namespace, &o.name, &o.kind).hash(&mut h);
    (h.finish() % WRITERS as u64) as usize
}

/// Writes the queued Events with `write`, in [`WRITERS`] lanes at once, each lane a batch (up to
/// [`BATCH`] Events, in the order recorded) at a time, and each object's Events in one lane: the
/// Events of one object must list in the order they happened, and with timestamps of whole seconds
/// only the store's order tells two of one second apart (a "deleted" written before the "ensured"
/// it follows would read backwards). On `stop`, what was recorded until then is still written, for
/// up to [`DRAIN`]; later records are refused.
async fn write_in_lanes<F, Fut>(mut rx: mpsc::Receiver<Recorded>, stop: CancellationToken, write: F)
where
    F: Fn(Vec<Recorded>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut lanes = Vec::with_capacity(WRITERS);
    let mut writers = futures::stream::FuturesUnordered::new();
    for _ in 0..WRITERS {
        let (tx, mut lane) = mpsc::channel::<Recorded>(LANE);
        lanes.push(tx);
        let write = &write;
        writers.push(async move {
            let mut batch = Vec::with_capacity(BATCH);
            while lane.recv_many(&mut batch, BATCH).await > 0 {
                write(std::mem::take(&mut batch)).await;
            }
        });
    }
    let dispatch = async {
        loop {
            let event = tokio::select! {
                biased;
                event = rx.recv() => event,
                _ = stop.cancelled() => None,
            };
            let Some(event) = event else { break };
            // A lane only closes when this loop has ended.
            let _ = lanes[lane_of(&event)].send(event).await;
        }
        rx.close();
        while let Some(event) = rx.recv().await {
            let _ = lanes[lane_of(&event)].send(event).await;
        }
        drop(lanes);
    };
    let work = futures::future::join(dispatch, async { while writers.next().await.is_some() {} });
    tokio::pin!(work);
    tokio::select! {
        _ = &mut work => return,
        _ = stop.cancelled() => {}
    }
    if tokio::time::timeout(DRAIN, work).await.is_err() {
        warn!("events still queued at the stop were dropped");
    }
}

async fn prune_old(api: &Api<Event>) {
    let ours = LabelSelector::from_labels([(MANAGED_BY_LABEL, MANAGED_BY)]);
    let events = match api.list(None, &ours).await {
        Ok(events) => events,
        Err(e) => {
            warn!(error = %e, "cannot list events to prune");
            return;
        }
    };
    let Ok(ttl) = k8s_openapi::jiff::SignedDuration::try_from(EVENT_TTL) else {
        return;
    };
    let cutoff = Timestamp::now() - ttl;
    for event in events {
        let last = event.last_timestamp.as_ref().map(|t| t.0);
        if last.is_some_and(|t| t < cutoff) {
            let (namespace, name) = (
                event.metadata.namespace.as_deref().unwrap_or_default(),
                event.metadata.name.as_deref().unwrap_or_default(),
            );
            if let Err(e) = api.delete(namespace, name, &Preconditions::default()).await
                && !e.is_not_found()
            {
                warn!(%namespace, %name, error = %e, "cannot delete old event");
            }
        }
    }
}

/// Sorts Events oldest first: by their last time, then by store order (timestamps have whole
/// seconds, so the resourceVersion breaks ties), then by name.
pub fn oldest_first(events: &mut [Event]) {
    events.sort_by(|a, b| {
        let last = |e: &Event| {
            e.last_timestamp
                .as_ref()
                .map(|t| t.0)
                .or(e.event_time.as_ref().map(|t| t.0))
        };
        let version = |e: &Event| {
            e.metadata
                .resource_version
                .as_deref()
                .and_then(|v| v.parse::<u64>().ok())
        };
        last(a)
            .cmp(&last(b))
            .then_with(|| version(a).cmp(&version(b)))
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
}

/// The Events this service wrote about `object` (this incarnation of it: a namesake deleted
/// before shares the name but not the UID), oldest first, and the list's resourceVersion.
pub async fn about<K: kube::Resource<DynamicType = ()>>(
    store: &dyn ObjectStore,
    object: &K,
) -> Result<(Vec<Event>, String), crate::store::StoreError> {
    let meta = object.meta();
    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
    let ours = LabelSelector::from_labels([(MANAGED_BY_LABEL, MANAGED_BY)]);
    let list = store
        .list(&crate::store::Kind::of::<Event>(), Some(&namespace), &ours)
        .await?;
    let kind = K::kind(&());
    let api_version = K::api_version(&());
    let mut events: Vec<Event> = list
        .items
        .into_iter()
        .filter_map(|v| serde_json::from_value::<Event>(v).ok())
        .filter(|e| {
            let o = &e.involved_object;
            o.kind.as_deref() == Some(kind.as_ref())
                && o.api_version.as_deref() == Some(api_version.as_ref())
                && o.name == meta.name
                && (o.uid.is_none() || meta.uid.is_none() || o.uid == meta.uid)
        })
        .collect();
    oldest_first(&mut events);
    Ok((events, list.resource_version))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::{Durability, EmbeddedStore};

    /// Held by the tests that read `harvester_cloud_events_queued` or record Events, which moves it.
    static BACKLOG_TESTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// `harvester_cloud_events_queued` now.
    fn backlog() -> f64 {
        harvester_cloud_metrics::sample(
            &harvester_cloud_metrics::encode(),
            "harvester_cloud_events_queued",
        )
        .expect("registered")
    }

    /// An embedded store in a directory of its own (kept while the store is used).
    async fn store() -> (tempfile::TempDir, Arc<EmbeddedStore>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = EmbeddedStore::open(dir.path(), Durability::Normal)
            .await
            .expect("opens");
        (dir, store)
    }

    fn mk_event(name: &str, age: Duration, ours: bool) -> Event {
        let at = Timestamp::now() - k8s_openapi::jiff::SignedDuration::try_from(age).expect("fits");
        Event {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                labels: ours
                    .then(|| [(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string())].into()),
                ..Default::default()
            },
            last_timestamp: Some(Time(at)),
            ..Default::default()
        }
    }

    fn about(object: &str, reason: &str) -> Event {
        Event {
            involved_object: ObjectReference {
                kind: Some("Service".into()),
                namespace: Some("default".into()),
                name: Some(object.into()),
                uid: Some(format!("uid-{object}")),
                ..Default::default()
            },
            reason: Some(reason.into()),
            ..Default::default()
        }
    }

    /// Two Events about one object are written in the order recorded even when the first write is
    /// slow, while another object's Event does not wait for them.
    #[tokio::test]
    async fn one_object_s_events_are_written_in_order() {
        let _alone = BACKLOG_TESTS.lock().await;
        let other = (0..)
            .map(|i| format!("other-{i}"))
            .find(|o| lane_of(&about(o, "")) != lane_of(&about("web", "")))
            .expect("some name takes another lane");
        let (tx, rx) = mpsc::channel(QUEUE);
        for event in [
            about("web", "Ensured"),
            about("web", "Deleted"),
            about(&other, "Other"),
        ] {
            tx.send(Recorded::new(event)).await.expect("queued");
        }
        drop(tx);
        let written = std::sync::Mutex::new(Vec::new());
        write_in_lanes(rx, CancellationToken::new(), |events: Vec<Recorded>| {
            let written = &written;
            async move {
                for event in events {
                    let reason = event.into_event().reason.expect("reason");
                    if reason == "Ensured" {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    written.lock().expect("not poisoned").push(reason);
                }
            }
        })
        .await;
        assert_eq!(
            written.into_inner().expect("not poisoned"),
            ["Other", "Ensured", "Deleted"]
        );
    }

    /// On stop, the Events already queued are still written; the writer then ends.
    #[tokio::test]
    async fn queued_events_are_written_after_the_stop() {
        let _alone = BACKLOG_TESTS.lock().await;
        let (tx, rx) = mpsc::channel(QUEUE);
        for i in 0..20 {
            tx.send(Recorded::new(about(&format!("svc-{i}"), "Ensured")))
                .await
                .expect("queued");
        }
        let stop = CancellationToken::new();
        stop.cancel();
        let written = AtomicU64::new(0);
        write_in_lanes(rx, stop, |events: Vec<Recorded>| {
            let written = &written;
            async move {
                written.fetch_add(events.len() as u64, Ordering::Relaxed);
            }
        })
        .await;
        assert_eq!(written.load(Ordering::Relaxed), 20);
        assert!(tx.is_closed(), "later records are refused");
    }

    /// With pruning on (the reconcilers' recorder), the Events queued at the stop are still
    /// written: the pruning task ending at the stop does not end the writer with it.
    #[tokio::test]
    async fn queued_events_are_stored_after_the_stop_with_pruning_on() {
        let _alone = BACKLOG_TESTS.lock().await;
        let (_dir, store) = store().await;
        let before = backlog();
        let (tx, rx) = mpsc::channel(QUEUE);
        for i in 0..20 {
            tx.send(Recorded::new(mk_event(
                &format!("e-{i}"),
                Duration::from_secs(5),
                true,
            )))
            .await
            .expect("queued");
        }
        let stop = CancellationToken::new();
        stop.cancel();
        tokio::time::timeout(
            Duration::from_secs(30),
            write_events(store.clone(), rx, true, stop),
        )
        .await
        .expect("the writer ends after its drain");
        let stored = Api::<Event>::new(store)
            .list(None, &LabelSelector::everything())
            .await
            .expect("lists");
        assert_eq!(stored.len(), 20);
        assert_eq!(
            backlog(),
            before,
            "written through the store, they left the backlog"
        );
    }

    /// The backlog gauge (`harvester_cloud_events_queued`) counts an Event from its record until
    /// it is written or given up after the drain at a stop (a full queue: see
    /// `dropped_events_are_counted_by_reason`; the store's writer: the pruning test).
    #[tokio::test(start_paused = true)]
    async fn the_backlog_counts_each_event_until_it_leaves() {
        // The gauge is the process's: no other test of this binary may record meanwhile.
        let _alone = BACKLOG_TESTS.lock().await;
        let queued = backlog;
        let before = queued();
        let service = |name: &str| k8s_openapi::api::core::v1::Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            ..Default::default()
        };
        let (recorder, mut rx) = Recorder::capture("test", "test");
        let mut lane = |name: &str| {
            recorder.record(&service(name), EventType::Normal, "Test", name.into());
            lane_of(&rx.try_recv().expect("recorded"))
        };
        let stuck = lane("stuck");
        let written_name = (0..)
            .map(|i| format!("written-{i}"))
            .find(|n| lane(n) != stuck)
            .expect("some name takes another lane");
        for name in [written_name.as_str(), "stuck"] {
            recorder.record(&service(name), EventType::Normal, "Test", name.into());
        }
        assert_eq!(queued(), before + 2.0, "recorded, none written");
        let stop = CancellationToken::new();
        stop.cancel();
        let written = AtomicU64::new(0);
        // One write never ends: the drain gives it up after its 5 s (paused time runs them out).
        write_in_lanes(rx, stop, |events: Vec<Recorded>| {
            let written = &written;
            async move {
                if events.iter().any(|e| e.message.as_deref() == Some("stuck")) {
                    std::future::pending::<()>().await;
                }
                written.fetch_add(events.len() as u64, Ordering::Relaxed);
            }
        })
        .await;
        assert_eq!(written.load(Ordering::Relaxed), 1);
        assert_eq!(
            queued(),
            before,
            "written or given up, each left the backlog"
        );
        recorder.record(&service("late"), EventType::Normal, "Test", "late".into());
        assert_eq!(
            queued(),
            before,
            "an Event refused by stopped writers never joins it"
        );
    }

    /// An Event recorded when the queue is full, or after the writers stopped, is dropped and
    /// counted by its reason (`harvester_cloud_events_dropped_total`), not lost unseen.
    #[tokio::test]
    async fn dropped_events_are_counted_by_reason() {
        let _alone = BACKLOG_TESTS.lock().await;
        // A reason of this test's own: the registry is the process's, shared with other tests.
        const REASON: &str = "TestQueueFull";
        let dropped = || {
            harvester_cloud_metrics::sample(
                &harvester_cloud_metrics::encode(),
                &format!("harvester_cloud_events_dropped_total{{reason=\"{REASON}\"}}"),
            )
            .unwrap_or(0.0)
        };
        let before = backlog();
        let (recorder, rx) = Recorder::capture("test", "test");
        let object = about("web", "");
        for i in 0..QUEUE {
            recorder.record(&object, EventType::Normal, REASON, format!("queued {i}"));
        }
        assert_eq!(dropped(), 0.0, "a queue of {QUEUE} holds them all");
        for i in 0..3 {
            recorder.record(&object, EventType::Normal, REASON, format!("over {i}"));
        }
        assert_eq!(dropped(), 3.0, "the queue is full");
        assert_eq!(
            backlog(),
            before + QUEUE as f64,
            "the dropped never joined the backlog"
        );
        drop(rx);
        assert_eq!(backlog(), before, "dropped with the queue, they left it");
        recorder.record(&object, EventType::Normal, REASON, "stopped".into());
        assert_eq!(dropped(), 4.0, "the writers stopped");
        assert_eq!(backlog(), before);
    }

    #[tokio::test]
    async fn only_own_events_older_than_the_ttl_are_pruned() {
        let (_dir, store) = store().await;
        let api = Api::<Event>::new(store);
        for (name, age, ours) in [
            ("old", EVENT_TTL * 2, true),
            ("fresh", Duration::from_secs(5), true),
            ("foreign", EVENT_TTL * 2, false),
        ] {
            api.create(&mk_event(name, age, ours))
                .await
                .expect("creates");
        }
        prune_old(&api).await;
        let mut left: Vec<String> = api
            .list(None, &LabelSelector::everything())
            .await
            .expect("lists")
            .into_iter()
            .filter_map(|e| e.metadata.name)
            .collect();
        left.sort();
        assert_eq!(left, ["foreign", "fresh"]);
    }
}
