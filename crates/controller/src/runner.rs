//! The controller loop every reconciler runs in: what to reconcile (triggers, deduplicated), when
//! (now, or after a requeue), and how many at once, never two of the same object together.
//!
//! It keeps kube-runtime's `Controller` contract, which our reconcilers were written against:
//! - a trigger for an object that is queued or waiting for a requeue runs it once, now;
//! - a trigger for an object being reconciled runs it again once that reconcile ends (and replaces
//!   the requeue that reconcile asks for);
//! - a reconcile asks, through its [`Action`], to run again after a while; a failure asks through the
//!   error policy;
//! - nothing starts before the cache is filled, and an object gone from the cache is not reconciled;
//! - at the graceful shutdown nothing new starts and the reconciles in flight finish.
//!
//! One difference: a reconcile that panics is logged and runs again after [`AFTER_PANIC`] (kube-runtime
//! resumes the panic in the controller, which ends it).
//!
//! What it does not keep is kube-runtime's cost at scale: on each wake-up its runner polls the
//! reconciles in flight in turn until one is ready (`FutureHashMap`; every one of them when none is,
//! as after each start), so a completion costs up to as many polls as there are reconciles in
//! flight, and the objects waiting for a slot are a hash set scanned from its start for each one
//! taken. Here the reconciles in flight are a `FuturesUnordered` (only those woken are polled), the
//! running objects a hash map, and the waiting ones a FIFO: each trigger, start and completion costs
//! the same at 100 or 100,000 objects.

use std::{
    collections::{HashMap, VecDeque, hash_map::Entry},
    fmt,
    future::Future,
    hash::Hash,
    pin::pin,
    sync::Arc,
    time::Duration,
};

use futures::{
    Stream, StreamExt,
    stream::{BoxStream, FuturesUnordered, SelectAll},
};
use kube::{
    Resource,
    runtime::reflector::{ObjectRef, Store},
};
use tokio::time::Instant;
use tokio_util::time::{DelayQueue, delay_queue};
use tracing::{Instrument, debug, error, info_span, warn};

/// What a reconcile asks for after it ran: nothing until the object or a related one changes, or
/// another run after a while.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Reconcile again after `after`, unless a change triggers it sooner.
    pub const fn requeue(after: Duration) -> Self {
        Self {
            requeue_after: Some(after),
        }
    }

    /// Reconcile again only when a change triggers it.
    pub const fn await_change() -> Self {
        Self {
            requeue_after: None,
        }
    }

    /// When the reconcile asked to run again, if it did.
    pub const fn requeue_after(&self) -> Option<Duration> {
        self.requeue_after
    }
}

/// The longest requeue: `DelayQueue` refuses deadlines about two years out.
const MAX_REQUEUE: Duration = Duration::from_secs(86_400 * 180);
/// A reconcile that panicked runs again after this long (the panic is logged).
const AFTER_PANIC: Duration = Duration::from_secs(5);

/// Why an object is to be reconciled, for the reconcile's span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    /// The object itself changed.
    ObjectUpdated,
    /// An object it relates to changed (a `watches` stream).
    RelatedObjectUpdated,
    /// Its reconcile asked to run again.
    ReconcilerRequestedRetry,
    /// Its error policy asked to run again.
    ErrorPolicyRequestedRetry,
    /// A wake-up from a `reconcile_on` stream.
    Requested,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reason::ObjectUpdated => "object updated",
            Reason::RelatedObjectUpdated => "related object updated",
            Reason::ReconcilerRequestedRetry => "reconciler requested retry",
            Reason::ErrorPolicyRequestedRetry => "error policy requested retry",
            Reason::Requested => "requested",
        })
    }
}

/// One item of a trigger stream: an object to reconcile, or why the stream failed (it retries
/// on its own, as the store's watcher does; the failure is logged).
type Trigger<K> = Result<(ObjectRef<K>, Reason), String>;

/// A controller of `K`: its triggers, its cache, how many reconciles run at once and when it stops.
pub struct Controller<K>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash,
{
    name: &'static str,
    reader: Store<K>,
    triggers: Vec<BoxStream<'static, Trigger<K>>>,
    concurrency: usize,
    shutdown: Vec<futures::future::BoxFuture<'static, ()>>,
}

impl<K> Controller<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync + Unpin,
{
    /// A controller named `name` (in its logs) of the objects `trigger` yields (each change of one
    /// reconciles it), reading them from `reader` when their turn comes.
    pub fn for_stream<E: fmt::Display + Send + 'static>(
        name: &'static str,
        trigger: impl Stream<Item = Result<K, E>> + Send + 'static,
        reader: Store<K>,
    ) -> Self {
        let triggers = vec![
            trigger
                .map(|changed| {
                    changed
                        .map(|obj| (ObjectRef::from_obj(&obj), Reason::ObjectUpdated))
                        .map_err(|e| e.to_string())
                })
                .boxed(),
        ];
        Self {
            name,
            reader,
            triggers,
            concurrency: 0,
            shutdown: Vec::new(),
        }
    }

    /// Also reconciles each object `requests` names.
    pub fn reconcile_on(
        mut self,
        requests: impl Stream<Item = ObjectRef<K>> + Send + 'static,
    ) -> Self {
        self.triggers
            .push(requests.map(|r| Ok((r, Reason::Requested))).boxed());
        self
    }

    /// Also reconciles, for each object `related` yields, the objects `owners` names for it.
    pub fn watches_stream<T, E, I>(
        mut self,
        related: impl Stream<Item = Result<T, E>> + Send + 'static,
        owners: impl Fn(T) -> I + Send + 'static,
    ) -> Self
    where
        E: fmt::Display + Send + 'static,
        I: IntoIterator<Item = ObjectRef<K>>,
        I::IntoIter: Send + 'static,
    {
        let triggers = related.flat_map(move |changed| match changed {
            Ok(obj) => futures::stream::iter(owners(obj))
                .map(|r| Ok((r, Reason::RelatedObjectUpdated)))
                .left_stream(),
            Err(e) => futures::stream::iter([Err(e.to_string())]).right_stream(),
        });
        self.triggers.push(triggers.boxed());
        self
    }

    /// At most `n` reconciles at once (0: no limit).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// Once `signal` completes, nothing new starts; the run ends when the reconciles in flight
    /// have finished.
    pub fn graceful_shutdown_on(
        mut self,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        self.shutdown.push(Box::pin(signal));
        self
    }

    /// Runs the controller until its shutdown (or until every trigger stream has ended), then
    /// waits for the reconciles in flight. Each reconcile is a task of its own. A failed one is
    /// retried when `error_policy` says (it logs the failure); an object not in the cache when
    /// its turn comes is skipped (a later change triggers it again).
    pub async fn run<Ctx, Fut, E>(
        self,
        mut reconcile: impl FnMut(Arc<K>, Arc<Ctx>) -> Fut,
        error_policy: impl Fn(Arc<K>, &E, Arc<Ctx>) -> Action,
        ctx: Arc<Ctx>,
    ) where
        Ctx: Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: Send + 'static,
    {
        let Controller {
            name,
            reader,
            triggers,
            concurrency,
            shutdown,
        } = self;
        let limit = if concurrency == 0 {
            usize::MAX
        } else {
            concurrency
        };
        let stopped = async move {
            if shutdown.is_empty() {
                std::future::pending::<()>().await;
            } else {
                futures::future::select_all(shutdown).await;
            }
        };
        let mut triggers = pin!(
            triggers
                .into_iter()
                .collect::<SelectAll<_>>()
                .take_until(stopped)
        );
        let mut triggers_open = true;
        let mut ready = pin!(reader.wait_until_ready());
        let mut is_ready = false;
        let mut queue = Queue::default();
        let mut in_flight = FuturesUnordered::new();

        loop {
            if is_ready && triggers_open {
                while queue.running.len() < limit {
                    let Some((key, reason)) = queue.next() else {
                        break;
                    };
                    let Some(obj) = reader.get(&key) else {
                        debug!(controller = name, object = %key, "object is gone");
                        continue;
                    };
                    queue.running.insert(key.clone(), None);
                    let span = info_span!("reconciling object", "object.ref" = %key, object.reason = %reason);
                    let task =
                        tokio::spawn(reconcile(obj.clone(), ctx.clone()).instrument(span.clone()));
                    let task = tokio_util::task::AbortOnDropHandle::new(task);
                    in_flight.push(async move { (key, obj, span, task.await) });
                }
            }
            if !triggers_open && in_flight.is_empty() {
                break;
            }
            tokio::select! {
                biased;
                Some((key, obj, span, outcome)) = in_flight.next(), if !in_flight.is_empty() => {
                    let (action, reason) = match outcome {
                        Ok(Ok(action)) => (action, Reason::ReconcilerRequestedRetry),
                        // In the reconcile's span, so that what the policy logs names the object.
                        Ok(Err(e)) => (
                            span.in_scope(|| error_policy(obj, &e, ctx.clone())),
                            Reason::ErrorPolicyRequestedRetry,
                        ),
                        Err(e) => {
                            error!(controller = name, object = %key, error = %e, "reconcile panicked");
                            (Action::requeue(AFTER_PANIC), Reason::ErrorPolicyRequestedRetry)
                        }
                    };
                    // After the shutdown nothing runs again (the start above is closed too).
                    let retry = action.requeue_after().filter(|_| triggers_open);
                    queue.finished(key, retry.map(|after| (after, reason)));
                }
                Some(expired) = queue.delayed.next(), if !queue.delayed.is_empty() && triggers_open => {
                    queue.expired(expired.into_inner());
                }
                filled = &mut ready, if !is_ready => match filled {
                    Ok(()) => is_ready = true,
                    Err(e) => {
                        warn!(controller = name, error = %e, "the cache will never fill; stopping");
                        triggers_open = false;
                        queue.clear();
                    }
                },
                trigger = triggers.next(), if triggers_open => match trigger {
                    Some(Ok((key, reason))) => queue.now(key, reason),
                    // The stream logged it and retries on its own (the store's watcher does).
                    Some(Err(e)) => debug!(controller = name, error = %e, "a trigger stream failed"),
                    None => {
                        triggers_open = false;
                        queue.clear();
                    }
                },
            }
        }
        debug!(controller = name, "controller stopped");
    }
}

/// The objects waiting for their turn, those waiting for a requeue, and those running.
///
/// An object is in at most one of `ready` and `delayed`; a running one is in neither (a trigger
/// while it runs is kept as its `running` entry's reason, and queues it when it finishes).
struct Queue<K>
where
    K: Resource,
    K::DynamicType: Eq + Hash,
{
    /// Waiting for a slot, first come first served.
    ready: VecDeque<ObjectRef<K>>,
    /// Why each of `ready` waits.
    waiting: HashMap<ObjectRef<K>, Reason>,
    /// Waiting for a requeue.
    delayed: DelayQueue<ObjectRef<K>>,
    /// When each of `delayed` is due, and its key in `delayed`.
    due: HashMap<ObjectRef<K>, (Instant, delay_queue::Key, Reason)>,
    /// Running, with why it is to run again when it finishes, if it is.
    running: HashMap<ObjectRef<K>, Option<Reason>>,
}

impl<K> Default for Queue<K>
where
    K: Resource,
    K::DynamicType: Eq + Hash,
{
    fn default() -> Self {
        Self {
            ready: VecDeque::new(),
            waiting: HashMap::new(),
            delayed: DelayQueue::new(),
            due: HashMap::new(),
            running: HashMap::new(),
        }
    }
}

impl<K> Queue<K>
where
    K: Resource,
    K::DynamicType: Eq + Hash + Clone,
{
    /// `key` is to be reconciled now (or, if it is running, once more when it finishes).
    fn now(&mut self, key: ObjectRef<K>, reason: Reason) {
        if let Some(again) = self.running.get_mut(&key) {
            again.get_or_insert(reason);
            return;
        }
        if self.waiting.contains_key(&key) {
            return;
        }
        if let Some((_, at, _)) = self.due.remove(&key) {
            self.delayed.remove(&at);
        }
        self.waiting.insert(key.clone(), reason);
        self.ready.push_back(key);
    }

    /// `key` is to be reconciled after `after`, unless something queues it sooner. (Called for a
    /// key that just finished, which is in neither `ready` nor `due`; an earlier requeue would be
    /// kept, as kube-runtime's scheduler keeps the earliest.)
    fn later(&mut self, key: ObjectRef<K>, after: Duration, reason: Reason) {
        let when = Instant::now() + after.min(MAX_REQUEUE);
        match self.due.entry(key) {
            Entry::Occupied(mut due) => {
                let (at, queued, _) = due.get_mut();
                if when < *at {
                    *at = when;
                    self.delayed.reset_at(queued, when);
                }
            }
            Entry::Vacant(due) => {
                let queued = self.delayed.insert_at(due.key().clone(), when);
                due.insert((when, queued, reason));
            }
        }
    }

    /// `key`'s requeue is due.
    fn expired(&mut self, key: ObjectRef<K>) {
        if let Some((_, _, reason)) = self.due.remove(&key) {
            self.waiting.insert(key.clone(), reason);
            self.ready.push_back(key);
        }
    }

    /// The next object to start, and why.
    fn next(&mut self) -> Option<(ObjectRef<K>, Reason)> {
        let key = self.ready.pop_front()?;
        let reason = self.waiting.remove(&key).unwrap_or(Reason::Requested);
        Some((key, reason))
    }

    /// `key`'s reconcile finished; `retry` is when and why it asked to run again.
    fn finished(&mut self, key: ObjectRef<K>, retry: Option<(Duration, Reason)>) {
        match self.running.remove(&key).flatten() {
            // Triggered while it ran: now, which replaces the requeue it asked for.
            Some(reason) => self.now(key, reason),
            None => {
                if let Some((after, reason)) = retry {
                    self.later(key, after, reason);
                }
            }
        }
    }

    /// Forgets what waits (at the shutdown); what runs is left to finish, and not run again (the
    /// start is closed too: this is belt and braces).
    fn clear(&mut self) {
        self.ready.clear();
        self.waiting.clear();
        self.delayed.clear();
        self.due.clear();
        for again in self.running.values_mut() {
            *again = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::{
        api::ObjectMeta,
        runtime::{
            reflector::{self, store::Writer},
            watcher,
        },
    };
    use tokio::{sync::mpsc, time::sleep};
    use tokio_stream::wrappers::UnboundedReceiverStream;
    use tokio_util::sync::CancellationToken;

    use super::*;

    fn cm(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    fn key(name: &str) -> ObjectRef<ConfigMap> {
        ObjectRef::new(name).within("ns")
    }

    /// A filled cache holding `names`.
    fn cache(names: &[&str]) -> (Store<ConfigMap>, Writer<ConfigMap>) {
        let (reader, mut writer) = reflector::store::<ConfigMap>();
        writer.apply_watcher_event(&watcher::Event::Init);
        for n in names {
            writer.apply_watcher_event(&watcher::Event::InitApply(cm(n)));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        (reader, writer)
    }

    /// What the reconciles did: each start and end, in virtual time since the test began.
    #[derive(Default)]
    struct Log {
        started: Vec<(String, Duration)>,
        ended: Vec<String>,
        active: HashMap<String, u32>,
        most_at_once: usize,
        failed_with: Vec<String>,
        /// Objects seen reconciled twice at once.
        overlaps: Vec<String>,
    }

    /// How each test's reconcile behaves: what it answers on its nth run of an object (0-based),
    /// and how long that run lasts.
    type Answer = fn(&str, usize) -> Result<Action, String>;
    type RunFor = fn(&str, usize) -> Duration;

    struct World {
        log: Arc<Mutex<Log>>,
        requests: mpsc::UnboundedSender<ObjectRef<ConfigMap>>,
        stop: CancellationToken,
        run: tokio::task::JoinHandle<()>,
        began: Instant,
    }

    impl World {
        fn start(
            reader: Store<ConfigMap>,
            concurrency: usize,
            run_for: RunFor,
            answer: Answer,
        ) -> World {
            let log = Arc::new(Mutex::new(Log::default()));
            let (requests, rx) = mpsc::unbounded_channel();
            let stop = CancellationToken::new();
            let began = Instant::now();
            let controller = Controller::for_stream(
                "test",
                futures::stream::pending::<Result<ConfigMap, String>>(),
                reader,
            )
            .reconcile_on(UnboundedReceiverStream::new(rx))
            .concurrency(concurrency)
            .graceful_shutdown_on(stop.clone().cancelled_owned());
            let ctx = log.clone();
            let run = tokio::spawn(controller.run(
                move |obj: Arc<ConfigMap>, log: Arc<Mutex<Log>>| async move {
                    let name = obj.metadata.name.clone().unwrap_or_default();
                    let nth = {
                        let mut l = log.lock().unwrap();
                        let nth = l.started.iter().filter(|(n, _)| *n == name).count();
                        l.started.push((name.clone(), began.elapsed()));
                        let a = l.active.entry(name.clone()).or_default();
                        *a += 1;
                        if *a > 1 {
                            l.overlaps.push(name.clone());
                        }
                        let running: u32 = l.active.values().sum();
                        l.most_at_once = l.most_at_once.max(running as usize);
                        nth
                    };
                    sleep(run_for(&name, nth)).await;
                    let mut l = log.lock().unwrap();
                    *l.active.get_mut(&name).unwrap() -= 1;
                    l.ended.push(name.clone());
                    let answer = answer(&name, nth);
                    if answer.as_ref().is_err_and(|e| e == "panic") {
                        drop(l);
                        panic!("the reconcile of {name} panics");
                    }
                    answer
                },
                |_obj, e: &String, log: Arc<Mutex<Log>>| {
                    log.lock().unwrap().failed_with.push(e.clone());
                    Action::requeue(Duration::from_secs(2))
                },
                ctx,
            ));
            World {
                log,
                requests,
                stop,
                run,
                began,
            }
        }

        fn trigger(&self, name: &str) {
            self.requests.send(key(name)).unwrap();
        }

        fn starts(&self) -> Vec<(String, Duration)> {
            self.log.lock().unwrap().started.clone()
        }

        /// Each start, with the whole seconds since the test began.
        fn starts_in_seconds(&self) -> Vec<(String, u64)> {
            self.starts()
                .into_iter()
                .map(|(n, t)| (n, t.as_secs()))
                .collect()
        }

        fn names_started(&self) -> Vec<String> {
            self.starts().into_iter().map(|(n, _)| n).collect()
        }

        /// Stops the controller and waits for its end; no object was reconciled twice at once.
        async fn stop(self) -> Arc<Mutex<Log>> {
            self.stop.cancel();
            tokio::time::timeout(Duration::from_secs(600), self.run)
                .await
                .expect("the controller ends after the shutdown")
                .expect("the controller does not panic");
            let overlaps = self.log.lock().unwrap().overlaps.clone();
            assert_eq!(overlaps, Vec::<String>::new(), "reconciled twice at once");
            self.log
        }
    }

    fn done(_: &str, _: usize) -> Result<Action, String> {
        Ok(Action::await_change())
    }

    #[tokio::test(start_paused = true)]
    async fn an_object_runs_once_at_a_time_and_once_more_after_a_change_meanwhile() {
        let (reader, _writer) = cache(&["a", "b"]);
        let w = World::start(reader, 0, |_, _| Duration::from_secs(1), done);
        w.trigger("a");
        w.trigger("a");
        sleep(Duration::from_millis(100)).await;
        assert_eq!(
            w.names_started(),
            ["a"],
            "two triggers while queued are one run"
        );
        // Three triggers while it runs: one more run, after this one.
        w.trigger("a");
        w.trigger("b");
        w.trigger("a");
        w.trigger("a");
        sleep(Duration::from_secs(5)).await;
        let starts = w.starts();
        assert_eq!(w.names_started(), ["a", "b", "a"]);
        assert_eq!(
            starts[2].1.as_secs(),
            1,
            "the second run of a starts when the first ends"
        );
        let log = w.stop().await;
        assert_eq!(log.lock().unwrap().ended.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_run_at_once_than_the_concurrency_and_first_come_first_served() {
        let names: Vec<String> = (0..10).map(|i| format!("o{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let (reader, _writer) = cache(&refs);
        let w = World::start(reader, 3, |_, _| Duration::from_secs(1), done);
        for n in &refs {
            w.trigger(n);
        }
        sleep(Duration::from_secs(10)).await;
        assert_eq!(
            w.names_started(),
            names,
            "in the order triggered, each once"
        );
        let log = w.stop().await;
        let log = log.lock().unwrap();
        assert_eq!(log.most_at_once, 3);
        assert_eq!(log.ended.len(), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_requeue_runs_again_unless_a_trigger_runs_it_sooner() {
        fn requeue_first(_: &str, nth: usize) -> Result<Action, String> {
            Ok(if nth == 0 {
                Action::requeue(Duration::from_secs(10))
            } else {
                Action::await_change()
            })
        }
        let (reader, _writer) = cache(&["a", "b"]);
        let w = World::start(reader, 0, |_, _| Duration::ZERO, requeue_first);
        w.trigger("a");
        w.trigger("b");
        sleep(Duration::from_secs(5)).await;
        // b's change comes before its requeue: it runs now, and not again at 10 s.
        w.trigger("b");
        sleep(Duration::from_secs(20)).await;
        let starts = w.starts_in_seconds();
        assert_eq!(
            starts,
            [
                ("a".into(), 0),
                ("b".into(), 0),
                ("b".into(), 5),
                ("a".into(), 10)
            ]
        );
        w.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_runs_again_when_the_error_policy_says() {
        fn fail_first(_: &str, nth: usize) -> Result<Action, String> {
            if nth == 0 {
                Err("no luck".into())
            } else {
                Ok(Action::await_change())
            }
        }
        let (reader, _writer) = cache(&["a"]);
        let w = World::start(reader, 0, |_, _| Duration::ZERO, fail_first);
        w.trigger("a");
        sleep(Duration::from_secs(5)).await;
        let starts: Vec<u64> = w.starts().into_iter().map(|(_, t)| t.as_secs()).collect();
        assert_eq!(starts, [0, 2]);
        let log = w.stop().await;
        assert_eq!(log.lock().unwrap().failed_with, ["no luck"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_panic_is_retried_and_the_others_go_on() {
        fn panic_first(name: &str, nth: usize) -> Result<Action, String> {
            if name == "a" && nth == 0 {
                Err("panic".into())
            } else {
                Ok(Action::await_change())
            }
        }
        let (reader, _writer) = cache(&["a", "b"]);
        let w = World::start(reader, 0, |_, _| Duration::ZERO, panic_first);
        w.trigger("a");
        sleep(Duration::from_secs(1)).await;
        w.trigger("b");
        sleep(Duration::from_secs(10)).await;
        let starts = w.starts_in_seconds();
        assert_eq!(
            starts,
            [
                ("a".into(), 0),
                ("b".into(), 1),
                ("a".into(), AFTER_PANIC.as_secs())
            ]
        );
        w.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_runs_before_the_cache_is_filled_nor_once_the_object_is_gone() {
        let (reader, mut writer) = reflector::store::<ConfigMap>();
        let w = World::start(reader, 0, |_, _| Duration::ZERO, done);
        w.trigger("a");
        w.trigger("gone");
        sleep(Duration::from_secs(1)).await;
        assert!(w.starts().is_empty(), "started before the cache was filled");
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(cm("a")));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        sleep(Duration::from_secs(1)).await;
        assert_eq!(
            w.names_started(),
            ["a"],
            "what is not in the cache is skipped"
        );
        writer.apply_watcher_event(&watcher::Event::Delete(cm("a")));
        w.trigger("a");
        sleep(Duration::from_secs(1)).await;
        assert_eq!(w.names_started(), ["a"]);
        w.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_shutdown_what_runs_finishes_and_nothing_else_starts() {
        fn requeue(_: &str, _: usize) -> Result<Action, String> {
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        let (reader, _writer) = cache(&["a", "b"]);
        let w = World::start(reader, 1, |_, _| Duration::from_secs(3), requeue);
        w.trigger("a");
        w.trigger("b");
        sleep(Duration::from_secs(1)).await;
        // Taken while a runs: a is to run again after it.
        w.trigger("a");
        sleep(Duration::from_millis(100)).await;
        let began = w.began;
        let log = w.stop().await;
        // The run waited for a to finish (at 3 s), and nothing ran after it: its requeue and the
        // trigger meanwhile are dropped; b, waiting, never started.
        assert_eq!(began.elapsed().as_secs(), 3);
        let log = log.lock().unwrap();
        assert_eq!(log.ended, ["a"]);
        assert_eq!(log.started.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_shutdown_before_the_cache_fills_ends_the_run() {
        let (reader, _writer) = reflector::store::<ConfigMap>();
        let w = World::start(reader, 0, |_, _| Duration::ZERO, done);
        w.trigger("a");
        sleep(Duration::from_secs(1)).await;
        let log = w.stop().await;
        assert!(log.lock().unwrap().started.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_requeue_due_while_every_slot_is_taken_waits_its_turn() {
        fn requeue_a(name: &str, nth: usize) -> Result<Action, String> {
            Ok(if name == "a" && nth == 0 {
                Action::requeue(Duration::from_secs(1))
            } else {
                Action::await_change()
            })
        }
        fn b_is_long(name: &str, _: usize) -> Duration {
            Duration::from_secs(if name == "b" { 5 } else { 0 })
        }
        let (reader, _writer) = cache(&["a", "b"]);
        let w = World::start(reader, 1, b_is_long, requeue_a);
        w.trigger("a");
        w.trigger("b");
        sleep(Duration::from_secs(10)).await;
        let starts = w.starts_in_seconds();
        assert_eq!(starts, [("a".into(), 0), ("b".into(), 0), ("a".into(), 5)]);
        w.stop().await;
    }

    /// The objects a related stream names are reconciled (its failures are left to it), and the
    /// run ends, after the reconciles in flight, once every trigger stream has ended.
    #[tokio::test(start_paused = true)]
    async fn related_objects_trigger_their_owners_and_the_run_ends_with_its_streams() {
        let (reader, _writer) = cache(&["a", "b", "c"]);
        let (objects, own) = mpsc::unbounded_channel::<ConfigMap>();
        let (related, rel) = mpsc::unbounded_channel::<Result<String, String>>();
        let started = Arc::new(Mutex::new(Vec::new()));
        let controller = Controller::for_stream(
            "test",
            UnboundedReceiverStream::new(own).map(Ok::<_, String>),
            reader,
        )
        .watches_stream(UnboundedReceiverStream::new(rel), |owners: String| {
            owners.split(',').map(key).collect::<Vec<_>>()
        });
        let run = tokio::spawn(controller.run(
            |obj: Arc<ConfigMap>, started: Arc<Mutex<Vec<String>>>| async move {
                started
                    .lock()
                    .unwrap()
                    .push(obj.metadata.name.clone().unwrap_or_default());
                sleep(Duration::from_secs(2)).await;
                Ok::<_, String>(Action::await_change())
            },
            |_, _, _| Action::await_change(),
            started.clone(),
        ));
        related.send(Err("a watch failed".into())).unwrap();
        related.send(Ok("b,c".into())).unwrap();
        objects.send(cm("a")).unwrap();
        sleep(Duration::from_secs(1)).await;
        let mut names = started.lock().unwrap().clone();
        names.sort();
        assert_eq!(names, ["a", "b", "c"]);
        drop((objects, related));
        let began = Instant::now();
        tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .expect("the run ends with its streams")
            .expect("no panic");
        assert_eq!(
            began.elapsed().as_secs(),
            1,
            "after the reconciles in flight"
        );
    }
}
