//! The prober: probes every backend of every VM load balancer that has a health check, and tells
//! the reconciler when one's health changes.
//!
//! One task per reconciler set (so one per store backend) runs every probe, on one timer: the
//! targets wait in a queue ordered by when they are due, the task sleeps until the first, starts
//! what is due (at most [`MAX_IN_FLIGHT`] at once) and polls the probes in flight itself. Nothing is
//! spawned per target or per probe; a thousand load balancers with three backends each are three
//! thousand queue entries.
//!
//! Semantics are upstream's worker's: a target is probed every period (the first time one period
//! after it appears); `successThreshold` successes in a row make it healthy, `failureThreshold`
//! failures in a row unhealthy, and in between it keeps what it was. A new target has no verdict
//! until a threshold is reached, and its endpoint keeps the `ready` condition it has. The prober
//! never writes: it keeps the verdicts, which the reconciler reads ([`Prober::health`]), and wakes
//! the load balancer when one changes, so the EndpointSlice has one writer.

pub mod check;

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap},
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use futures::{StreamExt, future::BoxFuture, stream::FuturesUnordered};
use kube::runtime::reflector::ObjectRef;
use tokio::{sync::Notify, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span};

use super::health::ProbeSettings;
use crate::{crd::LoadBalancer, lb::pools::Wake, sync::lock};

/// Probes running at once; beyond that, due probes wait for one to finish.
pub const MAX_IN_FLIGHT: usize = 1024;

/// The load balancer a target belongs to.
pub type LbRef = ObjectRef<LoadBalancer>;

/// One probe of one address; the error is what the Event and condition show.
pub type ProbeFn = Arc<
    dyn Fn(SocketAddr, Arc<ProbeSettings>) -> BoxFuture<'static, Result<(), String>> + Send + Sync,
>;

/// What the prober last concluded about one backend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// `None` until a threshold was reached.
    pub healthy: Option<bool>,
    /// Why the last probe failed, if it did.
    pub error: Option<String>,
}

/// Counters, for the bench and the logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub targets: usize,
    pub probes: u64,
    pub failures: u64,
}

/// The handle to the prober task. Cheap to clone.
#[derive(Clone)]
pub struct Prober {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    /// A target was added: the task looks at the queue again.
    changed: Notify,
    wake: Wake,
    probe: ProbeFn,
    probes: AtomicU64,
    failures: AtomicU64,
}

#[derive(Default)]
struct State {
    targets: HashMap<u64, Target>,
    by_lb: HashMap<LbRef, HashMap<IpAddr, u64>>,
    /// (due, target); entries of removed targets, or of an older due time, are skipped.
    queue: BinaryHeap<Reverse<(Instant, u64)>>,
    next_id: u64,
}

struct Target {
    lb: LbRef,
    ip: IpAddr,
    settings: Arc<ProbeSettings>,
    due: Instant,
    in_flight: bool,
    successes: u32,
    failures: u32,
    health: Health,
}

/// A probe to start: target, address, settings.
type Job = (u64, SocketAddr, Arc<ProbeSettings>);
type Running = Pin<Box<dyn Future<Output = (u64, Instant, Result<(), String>)> + Send>>;

impl Prober {
    /// Starts the prober task with the real probes; it stops at `stop`.
    pub fn start(wake: Wake, stop: CancellationToken) -> Prober {
        let tls = Arc::new(check::Tls::default());
        let probe: ProbeFn = Arc::new(move |addr, settings: Arc<ProbeSettings>| {
            let tls = tls.clone();
            Box::pin(async move {
                check::probe(addr, &settings.check, settings.timeout, &tls)
                    .await
                    .map_err(|e| e.to_string())
            })
        });
        Self::start_with(probe, wake, stop)
    }

    /// Starts the prober task with `probe` as the check of every target.
    pub fn start_with(probe: ProbeFn, wake: Wake, stop: CancellationToken) -> Prober {
        let inner = Arc::new(Inner {
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            wake,
            probe,
            probes: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        });
        tokio::spawn(drive(inner.clone(), stop).instrument(info_span!("prober")));
        Prober { inner }
    }

    /// Makes `addresses` the targets of `lb`, probed as `settings` say. A target whose address and
    /// settings are unchanged keeps its counters and verdict; the others start afresh.
    pub fn set(&self, lb: &LbRef, addresses: &[IpAddr], settings: &ProbeSettings) {
        let now = Instant::now();
        let mut added = false;
        {
            let mut guard = lock(&self.inner.state);
            let st = &mut *guard;
            let mut current = st.by_lb.remove(lb).unwrap_or_default();
            let mut next = HashMap::with_capacity(addresses.len());
            let shared = Arc::new(settings.clone());
            for ip in addresses {
                if next.contains_key(ip) {
                    continue;
                }
                let kept = match current.remove(ip) {
                    Some(id)
                        if st
                            .targets
                            .get(&id)
                            .is_some_and(|t| *t.settings == *settings) =>
                    {
                        Some(id)
                    }
                    Some(id) => {
                        st.targets.remove(&id);
                        None
                    }
                    None => None,
                };
                let id = match kept {
                    Some(id) => id,
                    None => {
                        st.next_id += 1;
                        let id = st.next_id;
                        let due = now + settings.period;
                        st.targets.insert(
                            id,
                            Target {
                                lb: lb.clone(),
                                ip: *ip,
                                settings: shared.clone(),
                                due,
                                in_flight: false,
                                successes: 0,
                                failures: 0,
                                health: Health::default(),
                            },
                        );
                        st.queue.push(Reverse((due, id)));
                        added = true;
                        id
                    }
                };
                next.insert(*ip, id);
            }
            for id in current.into_values() {
                st.targets.remove(&id);
            }
            if !next.is_empty() {
                st.by_lb.insert(lb.clone(), next);
            }
            crate::metrics::set_probe_targets(st.targets.len());
        }
        if added {
            debug!(lb = %lb, targets = addresses.len(), "probe targets changed");
            self.inner.changed.notify_one();
        }
    }

    /// Stops probing `lb`'s backends.
    pub fn remove(&self, lb: &LbRef) {
        let mut st = lock(&self.inner.state);
        if let Some(ids) = st.by_lb.remove(lb) {
            for id in ids.into_values() {
                st.targets.remove(&id);
            }
            crate::metrics::set_probe_targets(st.targets.len());
        }
    }

    /// What the prober knows of `lb`'s backends, by address.
    pub fn health(&self, lb: &LbRef) -> HashMap<IpAddr, Health> {
        let st = lock(&self.inner.state);
        st.by_lb
            .get(lb)
            .map(|ids| {
                ids.iter()
                    .filter_map(|(ip, id)| st.targets.get(id).map(|t| (*ip, t.health.clone())))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn stats(&self) -> Stats {
        Stats {
            targets: lock(&self.inner.state).targets.len(),
            probes: self.inner.probes.load(Ordering::Relaxed),
            failures: self.inner.failures.load(Ordering::Relaxed),
        }
    }
}

impl Inner {
    /// Takes the probes that are due, at most `room` of them, and says when the next one is (`None`
    /// when the queue is empty, or when there is no room and a finishing probe must make some).
    fn due(&self, room: usize) -> (Vec<Job>, Option<Instant>) {
        let now = Instant::now();
        let mut st = lock(&self.state);
        let mut jobs = Vec::new();
        while let Some(&Reverse((due, id))) = st.queue.peek() {
            if due > now {
                return (jobs, Some(due));
            }
            if jobs.len() >= room {
                return (jobs, None);
            }
            st.queue.pop();
            if let Some(t) = st.targets.get_mut(&id)
                && t.due == due
                && !t.in_flight
            {
                t.in_flight = true;
                let addr = SocketAddr::new(t.ip, t.settings.port);
                jobs.push((id, addr, t.settings.clone()));
            }
        }
        (jobs, None)
    }

    fn run(self: &Arc<Self>, (id, addr, settings): Job) -> Running {
        let probe = (self.probe)(addr, settings);
        Box::pin(async move {
            let started = Instant::now();
            (id, started, probe.await)
        })
    }

    /// Counts a finished probe against its target's thresholds and queues its next one.
    fn record(&self, id: u64, started: Instant, result: Result<(), String>) {
        self.probes.fetch_add(1, Ordering::Relaxed);
        if result.is_err() {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        crate::metrics::probe_done(result.is_ok());
        let mut changed = None;
        {
            let mut guard = lock(&self.state);
            let st = &mut *guard;
            // Removed (or replaced) while it ran.
            let Some(t) = st.targets.get_mut(&id) else {
                return;
            };
            t.in_flight = false;
            let decided = match result {
                Ok(()) => {
                    t.failures = 0;
                    t.successes += 1;
                    t.health.error = None;
                    (t.successes >= t.settings.success_threshold).then(|| {
                        t.successes = 0;
                        true
                    })
                }
                Err(e) => {
                    t.successes = 0;
                    t.failures += 1;
                    t.health.error = Some(e);
                    (t.failures >= t.settings.failure_threshold).then(|| {
                        t.failures = 0;
                        false
                    })
                }
            };
            if let Some(healthy) = decided
                && t.health.healthy != Some(healthy)
            {
                t.health.healthy = Some(healthy);
                info!(lb = %t.lb, backend = %t.ip, healthy, error = t.health.error.as_deref().unwrap_or_default(), "backend health changed");
                changed = Some(t.lb.clone());
            }
            // Once a period, as a ticker fires; at once when the probe took longer than that.
            t.due = (started + t.settings.period).max(Instant::now());
            let next = (t.due, id);
            st.queue.push(Reverse(next));
        }
        if let Some(lb) = changed {
            let _ = self.wake.send(lb);
        }
    }
}

async fn drive(inner: Arc<Inner>, stop: CancellationToken) {
    let mut running: FuturesUnordered<Running> = FuturesUnordered::new();
    loop {
        let (jobs, next) = inner.due(MAX_IN_FLIGHT.saturating_sub(running.len()));
        for job in jobs {
            running.push(inner.run(job));
        }
        let timer = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => break,
            Some((id, started, result)) = running.next(), if !running.is_empty() => {
                inner.record(id, started, result);
            }
            _ = inner.changed.notified() => {}
            _ = timer => {}
        }
    }
    debug!("prober stopped");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lb::vm::health::Check;
    use std::{collections::VecDeque, time::Duration};
    use tokio::sync::mpsc;

    fn mk_settings(success: u32, failure: u32) -> ProbeSettings {
        ProbeSettings {
            port: 80,
            check: Check::Tcp,
            period: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            success_threshold: success,
            failure_threshold: failure,
        }
    }

    fn mk_lb(name: &str) -> LbRef {
        ObjectRef::new(name).within("default")
    }

    /// Probes that answer from a script per address (success when it runs out), counting calls.
    #[derive(Clone, Default)]
    struct Script {
        answers: Arc<Mutex<HashMap<IpAddr, VecDeque<bool>>>>,
        calls: Arc<Mutex<HashMap<IpAddr, usize>>>,
    }

    impl Script {
        fn push(&self, ip: IpAddr, answers: &[bool]) {
            lock(&self.answers)
                .entry(ip)
                .or_default()
                .extend(answers.iter().copied());
        }
        fn calls(&self, ip: IpAddr) -> usize {
            lock(&self.calls).get(&ip).copied().unwrap_or(0)
        }
        fn probe(&self) -> ProbeFn {
            let s = self.clone();
            Arc::new(move |addr, _| {
                *lock(&s.calls).entry(addr.ip()).or_default() += 1;
                let ok = lock(&s.answers)
                    .get_mut(&addr.ip())
                    .and_then(VecDeque::pop_front)
                    .unwrap_or(true);
                Box::pin(async move { if ok { Ok(()) } else { Err("refused".into()) } })
            })
        }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([203, 0, 113, last])
    }

    #[tokio::test(start_paused = true)]
    async fn thresholds_decide_and_each_change_wakes_the_load_balancer() {
        let script = Script::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let prober = Prober::start_with(script.probe(), tx, stop.clone());
        let lb = mk_lb("lb1");
        // Healthy after two successes, unhealthy after two failures; a single failure changes
        // nothing.
        script.push(ip(2), &[true, true, false, true, false, false, true, true]);
        prober.set(&lb, &[ip(2)], &mk_settings(2, 2));
        assert_eq!(prober.health(&lb)[&ip(2)].healthy, None);
        let mut seen = Vec::new();
        for _ in 0..3 {
            let woken = rx.recv().await.expect("a wake-up");
            assert_eq!(woken, lb);
            seen.push(prober.health(&lb)[&ip(2)].clone());
        }
        assert_eq!(
            seen,
            [
                Health {
                    healthy: Some(true),
                    error: None
                },
                Health {
                    healthy: Some(false),
                    error: Some("refused".into())
                },
                Health {
                    healthy: Some(true),
                    error: None
                },
            ]
        );
        // Eight probes, one a second, the first one period after the target appeared.
        assert_eq!(script.calls(ip(2)), 8);
        let stats = prober.stats();
        assert_eq!((stats.targets, stats.probes, stats.failures), (1, 8, 3));
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn targets_follow_set_and_remove() {
        let script = Script::default();
        let (tx, _rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let prober = Prober::start_with(script.probe(), tx, stop.clone());
        let (a, b) = (mk_lb("a"), mk_lb("b"));
        prober.set(&a, &[ip(2), ip(3)], &mk_settings(1, 1));
        prober.set(&b, &[ip(4)], &mk_settings(1, 1));
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(
            (
                script.calls(ip(2)),
                script.calls(ip(3)),
                script.calls(ip(4))
            ),
            (2, 2, 2)
        );
        assert_eq!(prober.health(&a)[&ip(2)].healthy, Some(true));
        // Same settings: the verdict stays. Other settings: it starts over.
        prober.set(&a, &[ip(2)], &mk_settings(1, 1));
        assert_eq!(prober.health(&a)[&ip(2)].healthy, Some(true));
        assert!(!prober.health(&a).contains_key(&ip(3)));
        prober.set(&b, &[ip(4)], &mk_settings(3, 1));
        assert_eq!(prober.health(&b)[&ip(4)].healthy, None);
        prober.remove(&a);
        assert!(prober.health(&a).is_empty());
        let before = (script.calls(ip(2)), script.calls(ip(3)));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!((script.calls(ip(2)), script.calls(ip(3))), before);
        assert!(script.calls(ip(4)) >= 6, "still probing b");
        assert_eq!(prober.stats().targets, 1);
        stop.cancel();
    }
}
