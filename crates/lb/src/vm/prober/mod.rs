//! The prober: probes every backend of every VM load balancer that has a health check, and tells
//! the reconciler when one's health changes.
//!
//! One task per reconciler set (so one per store backend) runs every probe, on one timer: the
//! targets wait in a queue ordered by when they are due, the task sleeps until the first, starts
//! what is due (at most [`MAX_IN_FLIGHT`] at once, shared fairly between load balancers, see
//! [`lanes`]) and polls the probes in flight itself, each bounded by its timeout. Nothing is
//! spawned per target or per probe; a thousand load balancers with three backends each are three
//! thousand queue entries.
//!
//! Semantics are upstream's worker's: a target is probed every period (the first time one period
//! after it appears); `successThreshold` successes in a row make it healthy, `failureThreshold`
//! failures in a row unhealthy, and in between it keeps what it was. A new target has no verdict
//! until a threshold is reached, and its endpoint keeps the `ready` condition it has. The prober
//! never writes: it keeps the verdicts, which the reconciler reads ([`Prober::health`]), and wakes
//! the load balancer when one changes, so the EndpointSlice has one writer.
//!
//! Beyond upstream: an address no VM can have ([`address`]) is never connected to; its verdict is
//! unhealthy from the start, with the refusal as its error.

pub mod address;
pub mod check;
mod lanes;

use std::{
    cmp::Reverse,
    collections::HashMap,
    net::IpAddr,
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

pub use self::address::{AddressPolicy, Refused};
use self::lanes::{Job, Run, State, Target};
use super::health::ProbeSettings;
use crate::{crd::LoadBalancer, pools::Wake, sync::lock};

/// Probes running at once, for all load balancers; beyond that, due probes wait for a slot
/// ([`lanes`] says who gets it).
pub(crate) const MAX_IN_FLIGHT: usize = 1024;

/// The load balancer a target belongs to.
pub(crate) type LbRef = ObjectRef<LoadBalancer>;

/// One probe of one address; the error is what the Event and condition show. The prober bounds
/// it by the settings' timeout whatever it does.
pub(crate) type ProbeFn = Arc<
    dyn Fn(std::net::SocketAddr, Arc<ProbeSettings>) -> BoxFuture<'static, Result<(), String>>
        + Send
        + Sync,
>;

/// What the prober last concluded about one backend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// `None` until a threshold was reached.
    pub healthy: Option<bool>,
    /// Why the last probe failed, if it did (or why the address is not probed).
    pub error: Option<String>,
}

/// A target of a load balancer that is not probed, and whether [`Prober::set`] just added it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusedTarget {
    pub refused: Refused,
    pub new: bool,
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
    policy: AddressPolicy,
    probes: AtomicU64,
    failures: AtomicU64,
}

/// A probe that returned: `result` is `None` when it was cancelled before it finished.
struct Done {
    id: u64,
    lb: LbRef,
    started: Instant,
    cancel: CancellationToken,
    result: Option<Result<(), String>>,
}

type Running = Pin<Box<dyn Future<Output = Done> + Send>>;

impl Prober {
    /// Starts the prober task with the real probes, connecting only to the addresses `policy`
    /// allows; it stops at `stop`.
    pub fn start(wake: Wake, stop: CancellationToken, policy: AddressPolicy) -> Prober {
        let tls = Arc::new(check::Tls::default());
        let probe: ProbeFn = Arc::new(move |addr, settings: Arc<ProbeSettings>| {
            let tls = tls.clone();
            Box::pin(async move {
                check::probe(addr, &settings.check, settings.timeout, &tls)
                    .await
                    .map_err(|e| e.to_string())
            })
        });
        Self::start_with(probe, policy, wake, stop)
    }

    /// Starts the prober task with `probe` as the check of every target `policy` allows.
    pub fn start_with(
        probe: ProbeFn,
        policy: AddressPolicy,
        wake: Wake,
        stop: CancellationToken,
    ) -> Prober {
        let inner = Arc::new(Inner {
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            wake,
            probe,
            policy,
            probes: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        });
        tokio::spawn(drive(inner.clone(), stop).instrument(info_span!("prober")));
        Prober { inner }
    }

    /// Makes `addresses` the targets of `lb`, probed as `settings` say. A target whose address and
    /// settings are unchanged keeps its counters and verdict; the others start afresh. An address
    /// the policy refuses is never probed: its verdict is unhealthy at once, the refusal its error.
    /// Returns the refused targets of `lb`.
    pub fn set(
        &self,
        lb: &LbRef,
        addresses: &[IpAddr],
        settings: &ProbeSettings,
    ) -> Vec<RefusedTarget> {
        let now = Instant::now();
        let mut added = false;
        let mut refused = Vec::new();
        {
            let mut guard = lock(&self.inner.state);
            let st = &mut *guard;
            let lbs_before = st.by_lb.len();
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
                        st.drop_target(id);
                        None
                    }
                    None => None,
                };
                let id = match kept {
                    Some(id) => {
                        if let Some(Run::Refused(why)) = st.targets.get(&id).map(|t| &t.run) {
                            refused.push(RefusedTarget {
                                refused: why.clone(),
                                new: false,
                            });
                        }
                        id
                    }
                    None => {
                        st.next_id += 1;
                        let id = st.next_id;
                        let due = now + settings.period;
                        let (run, health) = match self.inner.policy.check(*ip) {
                            Ok(()) => {
                                st.queue.push(Reverse((due, id)));
                                added = true;
                                (Run::Idle, Health::default())
                            }
                            Err(why) => {
                                info!(lb = %lb, backend = %ip, "{why}");
                                let health = Health {
                                    healthy: Some(false),
                                    error: Some(why.to_string()),
                                };
                                refused.push(RefusedTarget {
                                    refused: why.clone(),
                                    new: true,
                                });
                                (Run::Refused(why), health)
                            }
                        };
                        st.targets.insert(
                            id,
                            Target {
                                lb: lb.clone(),
                                ip: *ip,
                                settings: shared.clone(),
                                due,
                                run,
                                successes: 0,
                                failures: 0,
                                health,
                            },
                        );
                        id
                    }
                };
                next.insert(*ip, id);
            }
            for id in current.into_values() {
                st.drop_target(id);
            }
            if !next.is_empty() {
                st.by_lb.insert(lb.clone(), next);
            }
            if st.by_lb.len() != lbs_before {
                st.reshare();
            }
            crate::metrics::set_probe_targets(st.targets.len());
        }
        if added {
            debug!(lb = %lb, targets = addresses.len(), "probe targets changed");
            self.inner.changed.notify_one();
        }
        refused
    }

    /// Stops probing `lb`'s backends (probes in flight are cancelled).
    pub fn remove(&self, lb: &LbRef) {
        let mut st = lock(&self.inner.state);
        if let Some(ids) = st.by_lb.remove(lb) {
            for id in ids.into_values() {
                st.drop_target(id);
            }
            st.reshare();
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
    fn run(self: &Arc<Self>, job: Job) -> Running {
        let Job {
            id,
            lb,
            addr,
            settings,
            cancel,
        } = job;
        let timeout = settings.timeout;
        let probe = (self.probe)(addr, settings);
        Box::pin(async move {
            let started = Instant::now();
            // The timeout is the prober's too: a probe that ignores it still gives its slot back.
            let result = tokio::select! {
                _ = cancel.cancelled() => None,
                r = tokio::time::timeout(timeout, probe) => Some(r.unwrap_or_else(|_| {
                    Err(check::ProbeError::Timeout { addr, after: timeout }.to_string())
                })),
            };
            Done {
                id,
                lb,
                started,
                cancel,
                result,
            }
        })
    }

    /// Counts a finished probe against its target's thresholds and queues its next one; a
    /// cancelled one counts for nothing, and its target (if still wanted) is due again at once.
    fn record(&self, done: Done) {
        let Done {
            id,
            lb,
            started,
            cancel,
            result,
        } = done;
        let cancelled = cancel.is_cancelled();
        let result = result.filter(|_| !cancelled);
        if let Some(result) = &result {
            self.probes.fetch_add(1, Ordering::Relaxed);
            if result.is_err() {
                self.failures.fetch_add(1, Ordering::Relaxed);
            }
            crate::metrics::probe_done(result.is_ok());
        }
        let now = Instant::now();
        let mut changed = None;
        {
            let mut guard = lock(&self.state);
            let st = &mut *guard;
            st.finished(&lb, cancelled);
            // Removed (or replaced) while it ran.
            let Some(t) = st.targets.get_mut(&id) else {
                return;
            };
            if !matches!(t.run, Run::Running { .. }) {
                return;
            }
            t.run = Run::Idle;
            let Some(result) = result else {
                t.due = now;
                st.queue.push(Reverse((now, id)));
                return;
            };
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
            t.due = (started + t.settings.period).max(now);
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
        let (jobs, next) = lock(&inner.state).schedule(Instant::now());
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
            Some(done) = running.next(), if !running.is_empty() => inner.record(done),
            _ = inner.changed.notified() => {}
            _ = timer => {}
        }
    }
    debug!("prober stopped");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::health::Check;
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
        let prober = Prober::start_with(script.probe(), AddressPolicy::default(), tx, stop.clone());
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
        let prober = Prober::start_with(script.probe(), AddressPolicy::default(), tx, stop.clone());
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

    /// Issue 25: a load balancer whose 1,100 backends never answer (more than the prober's slots,
    /// with the longest timeout) does not delay another's probe past its period.
    #[tokio::test(start_paused = true)]
    async fn hanging_backends_of_one_load_balancer_do_not_delay_another() {
        let hung = Arc::new(AtomicU64::new(0));
        let b_calls = Arc::new(AtomicU64::new(0));
        let probe: ProbeFn = {
            let (hung, b_calls) = (hung.clone(), b_calls.clone());
            Arc::new(move |addr, _| {
                if matches!(addr.ip(), IpAddr::V4(v4) if v4.octets()[0] == 10) {
                    hung.fetch_add(1, Ordering::Relaxed);
                    Box::pin(futures::future::pending())
                } else {
                    b_calls.fetch_add(1, Ordering::Relaxed);
                    Box::pin(async { Ok(()) })
                }
            })
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let prober = Prober::start_with(probe, AddressPolicy::default(), tx, stop.clone());
        let (a, b) = (mk_lb("a"), mk_lb("b"));
        let slow = ProbeSettings {
            period: Duration::from_secs(300),
            timeout: Duration::from_secs(300),
            ..mk_settings(1, 1)
        };
        let hanging: Vec<IpAddr> = (0..1_100u32)
            .map(|i| IpAddr::from([10, 0, (i / 256) as u8, (i % 256) as u8]))
            .collect();
        prober.set(&a, &hanging, &slow);
        // A's first probes start one period later and hang, taking every slot.
        tokio::time::sleep(slow.period + Duration::from_secs(1)).await;
        assert_eq!(hung.load(Ordering::Relaxed), MAX_IN_FLIGHT as u64);

        // B appears elsewhere: its first probe is due one period later, and it is judged then.
        let fast = mk_settings(1, 1);
        let since = Instant::now();
        prober.set(&b, &[ip(2)], &fast);
        let woken = tokio::time::timeout(fast.period * 3, rx.recv())
            .await
            .expect("B judged while A's probes hang")
            .expect("a wake-up");
        assert_eq!(woken, b);
        assert_eq!(prober.health(&b)[&ip(2)].healthy, Some(true));
        assert!(
            since.elapsed() <= fast.period,
            "B was probed {:?} after it appeared, its period is {:?}",
            since.elapsed(),
            fast.period
        );
        // And once a period from then on, while A's probes still hang.
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert!(b_calls.load(Ordering::Relaxed) >= 100);
        assert_eq!(prober.health(&a)[&hanging[0]].healthy, None);

        // A's probes end at their timeout, the prober's own: A's backends are judged too.
        tokio::time::sleep(slow.timeout * 2).await;
        let judged = prober.health(&a);
        let unhealthy = judged.values().filter(|h| h.healthy == Some(false)).count();
        assert!(unhealthy > 0, "A's timed-out probes count as failures");
        let error = judged
            .values()
            .find_map(|h| h.error.clone())
            .expect("an error");
        assert!(error.starts_with("no answer from 10.0."), "{error}");
        assert!(error.ends_with("within 300s"), "{error}");
        stop.cancel();
    }

    /// The shares bind only when slots are short: 2,000 load balancers (a share of one slot each)
    /// with three backends each still have every backend probed once a period.
    #[tokio::test(start_paused = true)]
    async fn free_slots_are_used_beyond_the_share() {
        let script = Script::default();
        let (tx, _rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let prober = Prober::start_with(script.probe(), AddressPolicy::default(), tx, stop.clone());
        for n in 0..2_000u32 {
            let addresses: Vec<IpAddr> = (0..3u32)
                .map(|k| {
                    let i = n * 3 + k;
                    IpAddr::from([10, (i >> 16) as u8, (i >> 8) as u8, i as u8])
                })
                .collect();
            prober.set(&mk_lb(&format!("lb{n}")), &addresses, &mk_settings(1, 1));
        }
        tokio::time::sleep(Duration::from_millis(10_500)).await;
        assert_eq!(prober.stats().probes, 6_000 * 10);
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn refused_addresses_are_never_probed_and_unhealthy_at_once() {
        let script = Script::default();
        let (tx, _rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let prober = Prober::start_with(script.probe(), AddressPolicy::default(), tx, stop.clone());
        let lb = mk_lb("lb1");
        let lo: IpAddr = [127, 0, 0, 1].into();
        let refused = prober.set(&lb, &[lo, ip(2)], &mk_settings(1, 1));
        let expected = Refused {
            ip: lo,
            kind: address::Special::Loopback,
        };
        assert_eq!(
            refused,
            [RefusedTarget {
                refused: expected.clone(),
                new: true
            }]
        );
        assert_eq!(
            prober.health(&lb)[&lo],
            Health {
                healthy: Some(false),
                error: Some("address 127.0.0.1 is loopback; not probed".into())
            }
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(script.calls(lo), 0);
        assert!(script.calls(ip(2)) >= 4);
        // Still refused, no longer new.
        let again = prober.set(&lb, &[lo, ip(2)], &mk_settings(1, 1));
        assert_eq!(
            again,
            [RefusedTarget {
                refused: expected,
                new: false
            }]
        );
        stop.cancel();

        // Allowed by the operator: probed.
        let stop = CancellationToken::new();
        let (tx, _rx) = mpsc::unbounded_channel();
        let loopback = crate::ipam::Cidr::parse("127.0.0.0/8").expect("a CIDR");
        let prober = Prober::start_with(
            script.probe(),
            AddressPolicy::allowing(vec![loopback]),
            tx,
            stop.clone(),
        );
        assert!(prober.set(&lb, &[lo], &mk_settings(1, 1)).is_empty());
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(script.calls(lo), 1);
        assert_eq!(prober.health(&lb)[&lo].healthy, Some(true));
        stop.cancel();
    }

    /// With the real probes: an HTTP check of a loopback listener never connects to it, unless
    /// the operator allows loopback.
    #[tokio::test]
    async fn a_loopback_listener_is_not_connected_to() {
        use crate::vm::health::{HttpCheck, StatusRange};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let port = listener.local_addr().expect("addr").port();
        let settings = ProbeSettings {
            port,
            check: Check::Http(HttpCheck {
                tls: false,
                path: "/".into(),
                expect: vec![StatusRange {
                    low: 200,
                    high: 399,
                }],
            }),
            period: Duration::from_millis(100),
            timeout: Duration::from_millis(100),
            success_threshold: 1,
            failure_threshold: 1,
        };
        let lb = mk_lb("lb1");
        let lo: IpAddr = [127, 0, 0, 1].into();
        let (tx, _rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let prober = Prober::start(tx, stop.clone(), AddressPolicy::default());
        prober.set(&lb, &[lo], &settings);
        // Ten periods: nothing arrives.
        let accepted = tokio::time::timeout(Duration::from_secs(1), listener.accept()).await;
        assert!(accepted.is_err(), "the prober connected to 127.0.0.1");
        stop.cancel();
        // The same with loopback allowed: the probe arrives (so the wait above could see one).
        let (tx, _rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let loopback = crate::ipam::Cidr::parse("127.0.0.0/8").expect("a CIDR");
        let prober = Prober::start(tx, stop.clone(), AddressPolicy::allowing(vec![loopback]));
        prober.set(&lb, &[lo], &settings);
        tokio::time::timeout(Duration::from_secs(30), listener.accept())
            .await
            .expect("the allowed probe connects")
            .expect("accepts");
        stop.cancel();
    }
}
