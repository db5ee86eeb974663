//! The load balancer reconcilers (LoadBalancer, IPPool, guest-cluster cleanup), their admission
//! checks, and the leader election that decides which replica runs them.
//!
//! Everything runs on the store port, so the same code serves the embedded and the Kubernetes
//! backend: each kind is listed and watched through [`crate::store::watcher`], cached in a kube-runtime
//! reflector, and driven by our controller loop ([`crate::controller::Controller`]). Allocation state lives only in
//! IPPool statuses; [`pools`] serialises each pool's writes in-process.
//!
//! Entry point: [`run`], which waits for leadership, runs the controllers until leadership is lost or
//! the shutdown token is cancelled, and starts over.
#![forbid(unsafe_code)]

// The crates below this one, under the names the modules use.
use harvester_cloud_api as crd;
use harvester_cloud_controller as controller;
use harvester_cloud_ipam as ipam;
use harvester_cloud_metrics as metrics;
use harvester_cloud_store as store;
use harvester_cloud_store::sync;

pub mod admission;
pub mod guest;
pub mod ippool;
pub mod loadbalancer;
pub mod owners;
pub mod pools;
pub mod refusal;
pub mod selection;
pub mod sharing;
pub mod vm;
pub mod webhook;

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
};

use futures::StreamExt;
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::runtime::{
    PredicateConfig, WatchStreamExt,
    reflector::{self, ObjectRef, Store},
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span, warn};

use self::pools::{Pools, Wake};
use crate::{
    controller::{
        Action, Backoff, Controller, default_identity,
        events::Recorder,
        leader::{self, LeaderElector},
    },
    crd::{
        IPPool, LoadBalancer,
        kinds::{VirtualMachine, VirtualMachineInstance, vmi_kind},
        lb_api, lb_kind, pool_api, pool_kind,
    },
    store::{
        Api, Kind, ObjectStore,
        watcher::{screened_watcher, watcher},
    },
    sync::lock,
};

/// What the guest-cluster cleanup needs of the cloud-config domain: revoking the account issued
/// for a guest cluster that Rancher removes. The binary wires the cloud-config accounts in; `lb`
/// knows no other domain.
#[async_trait::async_trait]
pub trait ClusterAccounts: Send + Sync {
    /// Revokes the account of `cluster` in `namespace` if this service issued it (`None`: there was
    /// none).
    async fn revoke_of_cluster(
        &self,
        namespace: &str,
        cluster: &str,
    ) -> Result<Option<ClusterRevocation>, Box<dyn std::error::Error + Send + Sync>>;
}

/// What a revocation did: the objects deleted (`kind namespace/name`), and those of the account's
/// names that were not the account's, left alone, with why.
#[derive(Clone, Debug, Default)]
pub struct ClusterRevocation {
    pub deleted: Vec<String>,
    pub kept: Vec<(String, String)>,
}

/// How the reconcilers run.
/// LoadBalancers reconciled at once by default on the embedded store, which batches many writes
/// into one transaction (at most 256 writes or 4 MiB each, however many wait), and each pool task
/// allocates for up to 1,024 waiting reconciles in one status write: so many in flight help it.
/// 4,096 rather than 1,024 since 2026-12-07: with 100 pools, 1,024 in flight left about ten per
/// pool round; 4,096 took about 18% less CPU per LoadBalancer at 100,000 / 100 and 10 to 14% less
/// at 10,000 / 10, for about 30 MiB more peak RSS at 10,000 and no consistent difference at
/// 100,000 (`benches/lb-results.md`).
pub const CONCURRENCY_EMBEDDED: u16 = 4096;
/// …and on the Kubernetes backend, where each write is a request whose latency bounds the rate:
/// more in flight only hold memory and trip the API server's rate limits (429s).
pub const CONCURRENCY_KUBE: u16 = 128;

#[derive(Clone)]
pub struct Settings {
    /// LoadBalancers reconciled at once. Many in flight let the store and the pool tasks batch
    /// their writes ([`CONCURRENCY_EMBEDDED`] by default).
    pub concurrency: u16,
    /// This replica's name in Events and the Lease.
    pub identity: String,
    /// Write the ingress of VM load balancers' Services (`status.loadBalancer.ingress`) as kube-vip
    /// would: where no kube-vip runs (the embedded backend). Off on Kubernetes, where kube-vip does.
    pub fill_service_ingress: bool,
    /// Where the cloud-config accounts of a guest cluster Rancher removes are revoked (`None`:
    /// kept, `--keep-accounts-of-removed-clusters`).
    pub cluster_accounts: Option<Arc<dyn ClusterAccounts>>,
    /// The addresses VM load balancers' health checks may connect to (`--probe-allow-cidr`).
    pub probe_policy: vm::prober::AddressPolicy,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("concurrency", &self.concurrency)
            .field("identity", &self.identity)
            .field("fill_service_ingress", &self.fill_service_ingress)
            .field("revokes_cluster_accounts", &self.cluster_accounts.is_some())
            .field("probe_policy", &self.probe_policy)
            .finish()
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            concurrency: CONCURRENCY_EMBEDDED,
            identity: default_identity(),
            fill_service_ingress: false,
            cluster_accounts: None,
            probe_policy: vm::prober::AddressPolicy::default(),
        }
    }
}

/// The three controllers' contexts, one each, made together: they share the pool tasks, the
/// Event recorder and the waker of the load balancers that found no pool.
pub struct Contexts {
    pub pools: Arc<PoolCtx>,
    pub lbs: Arc<LbCtx>,
    pub cleanup: Arc<CleanupCtx>,
}

/// The IPPool controller's context.
pub struct PoolCtx {
    pub pools_api: Api<IPPool>,
    pub lbs: Api<LoadBalancer>,
    pub pools: Arc<Pools>,
    unmatched: Arc<Unmatched>,
    /// Consecutive failures per pool.
    backoff: Backoff,
}

/// The LoadBalancer controller's context.
pub struct LbCtx {
    pub lbs: Api<LoadBalancer>,
    pub pool_cache: Store<IPPool>,
    pub pools: Arc<Pools>,
    pub events: Recorder,
    /// The VM load balancers' Services, EndpointSlices, backends and prober.
    pub vm: vm::VmContext,
    unmatched: Arc<Unmatched>,
    /// Consecutive failures per load balancer.
    backoff: Backoff,
    /// The resourceVersion each LoadBalancer was last applied at (`namespace/name`).
    applied: Mutex<std::collections::HashMap<String, String>>,
    /// What this process knows of the sharing groups ([`sharing`]).
    sharing: sharing::Groups,
    /// The pools chosen per request for the pool cache as it is.
    pub selections: Arc<selection::Selections>,
}

/// The guest-cluster cleanup controller's context.
pub struct CleanupCtx {
    pub store: Arc<dyn ObjectStore>,
    pub lbs: Api<LoadBalancer>,
    pub events: Recorder,
    /// The cloud-config accounts, when a removed guest cluster's are to be revoked.
    pub accounts: Option<Arc<dyn ClusterAccounts>>,
    /// Consecutive failures per VM.
    backoff: Backoff,
}

/// Load balancers that found no usable pool: any pool change wakes them.
struct Unmatched {
    wake: Wake,
    waiting: Mutex<HashSet<ObjectRef<LoadBalancer>>>,
    /// Bumped on every pool change, so a load balancer that failed to match while a pool appeared
    /// notices it missed the wake-up.
    generation: std::sync::atomic::AtomicU64,
}

impl Contexts {
    /// The contexts of the reconciles on `store`: they read pools from `pool_cache` and VMIs from
    /// `vmis` (the controllers keep both from their watches), record Events with `events`, and
    /// send the load balancers to reconcile again to `wake`. Starts the prober; the pool tasks
    /// start on first use. Everything stops with `stop`.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        settings: &Settings,
        pool_cache: Store<IPPool>,
        vmis: Store<VirtualMachineInstance>,
        events: Recorder,
        wake: Wake,
        stop: CancellationToken,
    ) -> Self {
        let prober =
            vm::prober::Prober::start(wake.clone(), stop.clone(), settings.probe_policy.clone());
        let pools = Arc::new(Pools::new(
            store.clone(),
            wake.clone(),
            events.clone(),
            stop,
        ));
        let unmatched = Arc::new(Unmatched {
            wake,
            waiting: Mutex::new(HashSet::new()),
            generation: std::sync::atomic::AtomicU64::new(0),
        });
        Contexts {
            pools: Arc::new(PoolCtx {
                pools_api: pool_api(store.clone()),
                lbs: lb_api(store.clone()),
                pools: pools.clone(),
                unmatched: unmatched.clone(),
                backoff: Backoff::default(),
            }),
            lbs: Arc::new(LbCtx {
                lbs: lb_api(store.clone()),
                pool_cache,
                pools,
                events: events.clone(),
                vm: vm::VmContext::new(store.clone(), vmis, prober, settings.fill_service_ingress),
                unmatched,
                backoff: Backoff::default(),
                applied: Mutex::default(),
                sharing: sharing::Groups::default(),
                selections: Arc::default(),
            }),
            cleanup: Arc::new(CleanupCtx {
                lbs: lb_api(store.clone()),
                store,
                events,
                accounts: settings.cluster_accounts.clone(),
                backoff: Backoff::default(),
            }),
        }
    }
}

impl Unmatched {
    /// Records a load balancer that found no pool and returns how to report it.
    fn record(
        &self,
        lb: ObjectRef<LoadBalancer>,
        reason: &'static str,
        message: String,
    ) -> loadbalancer::Refusal {
        let before = self.generation();
        lock(&self.waiting).insert(lb.clone());
        if self.generation() != before {
            // A pool changed while this one was choosing: look again now.
            let _ = self.wake.send(lb);
        }
        loadbalancer::Refusal::unmatched(reason, message)
    }

    fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A pool appeared or changed: every load balancer that found none looks again.
    fn pools_changed(&self) {
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let waiting: Vec<_> = lock(&self.waiting).drain().collect();
        if !waiting.is_empty() {
            debug!(
                count = waiting.len(),
                "pools changed; waking unmatched load balancers"
            );
        }
        for lb in waiting {
            let _ = self.wake.send(lb);
        }
    }
}

impl PoolCtx {
    /// A pool appeared or changed: every load balancer that found none looks again.
    fn pools_changed(&self) {
        self.unmatched.pools_changed();
    }
}

impl LbCtx {
    /// Records a load balancer that found no pool and returns how to report it.
    fn unmatched(
        &self,
        lb: ObjectRef<LoadBalancer>,
        reason: &'static str,
        message: String,
    ) -> loadbalancer::Refusal {
        self.unmatched.record(lb, reason, message)
    }

    /// Records that `lb` was applied at exactly this version.
    fn applied_at(&self, key: &str, lb: &LoadBalancer) {
        if let Some(version) = &lb.metadata.resource_version {
            lock(&self.applied).insert(key.to_string(), version.clone());
        }
    }

    /// The load balancer is gone: nothing to remember of it.
    fn forget_applied(&self, key: &str) {
        lock(&self.applied).remove(key);
    }

    /// Whether this very version of `lb` has been applied already: the change that made it was
    /// this reconciler's own write (the finalizer, added in the same pass that then applied on
    /// the object as written), so reconciling it again would only find a cache one write behind
    /// and conflict.
    fn already_applied(&self, lb: &LoadBalancer) -> bool {
        let (Some(namespace), Some(name), Some(version)) = (
            &lb.metadata.namespace,
            &lb.metadata.name,
            &lb.metadata.resource_version,
        ) else {
            return false;
        };
        lock(&self.applied).get(&format!("{namespace}/{name}")) == Some(version)
    }
}

/// Runs the reconcilers whenever this replica leads, until `shutdown`.
pub async fn run(
    store: Arc<dyn ObjectStore>,
    settings: Settings,
    elector: Arc<dyn LeaderElector>,
    shutdown: CancellationToken,
) {
    leader::lead(
        elector.as_ref(),
        &shutdown,
        "load balancer reconcilers",
        &settings.identity,
        |stop| {
            let controllers = run_controllers(store.clone(), &settings, stop);
            async move {
                crate::metrics::set_leader(true);
                controllers.await;
                crate::metrics::set_leader(false);
            }
        },
    )
    .await;
}

/// What a LoadBalancer reconcile depends on: everything but `status` and the resourceVersion.
/// Not `generation` either: the spec is here already, and on Harvester's CRDs (no status
/// subresource) every status write moves the generation, which would reconcile each LoadBalancer
/// once more after each of its own status writes.
fn lb_fingerprint(lb: &LoadBalancer) -> Option<u64> {
    crate::controller::reconcile_fingerprint(&lb.metadata, &lb.spec, ())
}

fn kind_of<K: crate::store::Object>() -> Kind {
    Kind::of::<K>()
}

/// Runs the three controllers until `stop`.
pub(crate) async fn run_controllers(
    store: Arc<dyn ObjectStore>,
    settings: &Settings,
    stop: CancellationToken,
) {
    let (wake_tx, wake_rx) = mpsc::unbounded_channel();
    let (pool_reader, pool_writer) = reflector::store::<IPPool>();
    let (lb_reader, lb_writer) = reflector::store::<LoadBalancer>();
    let (vm_reader, vm_writer) = reflector::store::<VirtualMachine>();
    let (vmi_reader, vmi_writer) = reflector::store::<VirtualMachineInstance>();
    let events = Recorder::start(store.clone(), &settings.identity, stop.clone());
    let Contexts {
        pools: pool_ctx,
        lbs: lb_ctx,
        cleanup: cleanup_ctx,
    } = Contexts::new(
        store.clone(),
        settings,
        pool_reader.clone(),
        vmi_reader,
        events,
        wake_tx,
        stop.clone(),
    );
    let shutdown = || {
        let stop = stop.clone();
        async move { stop.cancelled().await }
    };

    // A pool task's own status writes (one per allocation round) are known to it: reconciling the
    // pool for each would read and decode its whole status again. A deleting pool's are not
    // skipped: the release of its last address is what lets it go. While its task's view of the
    // pool stands, they are not even decoded into the cache ([`pools::Pools::screen`]).
    let pool_stream = reflector::reflector(
        pool_writer,
        screened_watcher::<IPPool>(
            store.clone(),
            pool_kind(),
            None,
            Some(pool_ctx.pools.screen()),
        ),
    )
    .applied_objects()
    .filter({
        let ctx = pool_ctx.clone();
        move |pool| {
            let own = pool
                .as_ref()
                .is_ok_and(|p| !p.is_deleting() && ctx.pools.wrote(p));
            std::future::ready(!own)
        }
    });
    let pools = Controller::for_stream("ippool", pool_stream, pool_reader)
        .graceful_shutdown_on(shutdown())
        .run(
            |pool, ctx| timed("ippool", ippool::reconcile(pool, ctx)),
            |pool, e: &ippool::PoolReconcileError, ctx: Arc<PoolCtx>| {
                warn!(pool = pool.metadata.name.as_deref().unwrap_or_default(), error = %e, "IP pool reconcile failed");
                ctx.backoff.failed(
                    pool.metadata.name.as_deref().unwrap_or_default(),
                    e.is_conflict(),
                )
            },
            pool_ctx.clone(),
        );

    // Status-only changes (this controller's own writes, mostly) do not call for a reconcile; waking
    // up for them would only find the cache one write behind.
    let lb_stream = reflector::reflector(
        lb_writer,
        watcher::<LoadBalancer>(store.clone(), lb_kind(), None),
    )
    .applied_objects()
    .predicate_filter(lb_fingerprint, PredicateConfig::default())
    // After the predicate, which so remembers the version as seen: a later change back (our
    // finalizer removed by hand) still differs from it.
    .filter({
        let ctx = lb_ctx.clone();
        move |lb| {
            let own = lb.as_ref().is_ok_and(|lb| ctx.already_applied(lb));
            std::future::ready(!own)
        }
    });
    // VM load balancers: a VMI wakes those that select it and those it was a backend of; their own
    // Services and EndpointSlices wake their owner.
    let vmis = reflector::reflector(
        vmi_writer,
        watcher::<VirtualMachineInstance>(store.clone(), vmi_kind(), None),
    )
    .touched_objects();
    let services = watcher::<Service>(store.clone(), kind_of::<Service>(), None).touched_objects();
    let slices =
        watcher::<EndpointSlice>(store.clone(), kind_of::<EndpointSlice>(), None).touched_objects();
    let vmi_owners = {
        let (ctx, lbs) = (lb_ctx.clone(), lb_reader.clone());
        move |vmi: VirtualMachineInstance| ctx.vm.load_balancers_of(&vmi, &lbs)
    };
    let controller = Controller::for_stream("loadbalancer", lb_stream, lb_reader)
        .concurrency(settings.concurrency.into())
        .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(
            wake_rx,
        ))
        .watches_stream(vmis, vmi_owners)
        .watches_stream(services, |svc: Service| {
            vm::service::owner_of(&svc.metadata)
        })
        .watches_stream(slices, |slice: EndpointSlice| {
            vm::service::owner_of(&slice.metadata)
        })
        .graceful_shutdown_on(shutdown())
        .run(
            |lb, ctx| timed("loadbalancer", loadbalancer::reconcile(lb, ctx)),
            |lb, e: &loadbalancer::LbError, ctx: Arc<LbCtx>| {
                let key = format!(
                    "{}/{}",
                    lb.metadata.namespace.as_deref().unwrap_or_default(),
                    lb.metadata.name.as_deref().unwrap_or_default()
                );
                if e.is_conflict() {
                    debug!(lb = %key, error = %e, "load balancer changed meanwhile; retrying");
                } else {
                    warn!(lb = %key, error = %e, "load balancer reconcile failed");
                }
                ctx.backoff.failed(&key, e.is_conflict())
            },
            lb_ctx.clone(),
        );
    // Pool selection and cleanup read the pool cache, so load balancers wait for its first list.
    // Waiting here, once, rather than in every reconcile: kube-runtime's readiness signal wakes only
    // the last of several concurrent waiters.
    let lbs = {
        let (pools_ready, stop) = (lb_ctx.pool_cache.clone(), stop.clone());
        async move {
            tokio::select! {
                ready = pools_ready.wait_until_ready() => if ready.is_ok() {
                    controller.await;
                },
                _ = stop.cancelled() => {},
            }
        }
    };

    let vm_stream = reflector::reflector(
        vm_writer,
        watcher::<VirtualMachine>(store.clone(), kind_of::<VirtualMachine>(), None),
    )
    .applied_objects();
    let vms = Controller::for_stream("guestcluster", vm_stream, vm_reader)
        .graceful_shutdown_on(shutdown())
        .run(
            |vm, ctx| timed("guestcluster", guest::reconcile(vm, ctx)),
            |vm, e: &guest::GuestCleanupError, ctx: Arc<CleanupCtx>| {
                let key = format!(
                    "vm/{}/{}",
                    vm.metadata.namespace.as_deref().unwrap_or_default(),
                    vm.metadata.name.as_deref().unwrap_or_default()
                );
                warn!(vm = %key, error = %e, "guest cluster cleanup failed");
                ctx.backoff.failed(&key, e.is_conflict())
            },
            cleanup_ctx,
        );

    tokio::join!(
        pools.instrument(info_span!("controller", kind = "IPPool")),
        lbs.instrument(info_span!("controller", kind = "LoadBalancer")),
        vms.instrument(info_span!("controller", kind = "VirtualMachine")),
    );
    debug!("controllers stopped");
}

/// A reconcile failure as a metrics label: a lost write race (retried at once) is not a fault.
trait FailureReason {
    fn reason(&self) -> &'static str;
}

macro_rules! failure_reason {
    ($($t:ty),*) => {$(
        impl FailureReason for $t {
            fn reason(&self) -> &'static str {
                if self.is_conflict() { "conflict" } else { "failed" }
            }
        }
    )*};
}
failure_reason!(
    loadbalancer::LbError,
    ippool::PoolReconcileError,
    guest::GuestCleanupError
);

/// Runs one reconcile and records its duration, and its failure, in the metrics.
async fn timed<E: FailureReason>(
    controller: &'static str,
    reconcile: impl Future<Output = Result<Action, E>>,
) -> Result<Action, E> {
    let started = std::time::Instant::now();
    let result = reconcile.await;
    crate::metrics::observe_reconcile(
        controller,
        started.elapsed(),
        result.as_ref().err().map(FailureReason::reason),
    );
    result
}
