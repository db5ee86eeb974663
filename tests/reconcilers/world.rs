//! The worlds the reconciles run in: an embedded store in a temporary directory (no fsync per
//! commit), the caches a controller would keep, filled from the store by hand, the Events a
//! reconcile records, captured instead of written, and the wake-ups it sends, kept to be read.
//! Nothing runs in the background but the pool tasks (and the prober, idle): each step is one
//! reconcile, and what it did is in the store, the Events and the returned action when it returns.
//! (The tests run on tokio's current-thread runtime, so a pool task finishes the round it answers,
//! Events and wake-ups included, before the caller resumes.)

use std::{fmt, sync::Arc, time::Duration};

use harvester_cloud::controller::Action;
use harvester_cloud::{
    controller::events::{self, Recorded, Recorder},
    crd::{IPPool, LoadBalancer, lb_api, pool_api},
    guest::{
        clusters::{ClusterKey, ClusterStore},
        decide::in_scope,
        mapping::GuestContext,
        reconcile::{self as guest_reconcile, Ports},
    },
    lb::{
        self, Contexts,
        admission::{NetworkCheck, admitted},
        ippool::PoolReconcileError,
        loadbalancer::LbError,
    },
    store::{
        Api, LabelSelector, ObjectStore, Preconditions,
        embedded::{Durability, EmbeddedStore},
    },
};
use k8s_openapi::api::core::v1::{Event, Service};
use kube::runtime::{
    reflector::{self, ObjectRef, store::Writer},
    watcher,
};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::support::faulty::{Hooked, KillAfter};

/// An embedded store in its own temporary directory.
pub async fn open_store() -> (tempfile::TempDir, Arc<dyn ObjectStore>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = EmbeddedStore::open(dir.path(), Durability::Normal)
        .await
        .expect("opens the embedded store");
    (dir, store)
}

/// A typed object from its JSON.
pub fn typed<K: DeserializeOwned>(v: Value) -> K {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("not the kind ({e}): {v}"))
}

/// Fills a cache with exactly `objects`, as a relist does.
fn relist<K>(cache: &mut Writer<K>, objects: Vec<K>)
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    cache.apply_watcher_event(&watcher::Event::Init);
    for o in objects {
        cache.apply_watcher_event(&watcher::Event::InitApply(o));
    }
    cache.apply_watcher_event(&watcher::Event::InitDone);
}

/// An Event as a reconcile recorded it.
#[derive(Clone, PartialEq, Eq)]
pub struct Reported {
    pub kind: String,
    pub reason: String,
    pub message: String,
    /// `namespace/name` (or `name`) of the object it is about.
    pub about: String,
}

impl fmt::Debug for Reported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} about {}: {}",
            self.kind, self.reason, self.about, self.message
        )
    }
}

fn reported(e: Event) -> Reported {
    let o = &e.involved_object;
    let about = match o.namespace.as_deref().filter(|n| !n.is_empty()) {
        Some(ns) => format!("{ns}/{}", o.name.as_deref().unwrap_or_default()),
        None => o.name.clone().unwrap_or_default(),
    };
    Reported {
        kind: e.type_.unwrap_or_default(),
        reason: e.reason.unwrap_or_default(),
        message: e.message.unwrap_or_default(),
        about,
    }
}

/// A Normal Event about `about`.
pub fn normal(about: &str, reason: &str, message: &str) -> Reported {
    Reported {
        kind: "Normal".into(),
        reason: reason.into(),
        message: message.into(),
        about: about.into(),
    }
}

/// A Warning Event about `about`.
pub fn warning(about: &str, reason: &str, message: &str) -> Reported {
    Reported {
        kind: "Warning".into(),
        reason: reason.into(),
        message: message.into(),
        about: about.into(),
    }
}

/// Every Event recorded since the last call.
fn drain(events: &mut mpsc::Receiver<Recorded>) -> Vec<Reported> {
    let mut out = Vec::new();
    while let Ok(e) = events.try_recv() {
        out.push(reported(e.into_event()));
    }
    out
}

fn drain_woken<K>(woken: &mut mpsc::UnboundedReceiver<ObjectRef<K>>) -> Vec<String>
where
    K: kube::Resource<DynamicType = ()>,
{
    let mut out = Vec::new();
    while let Ok(r) = woken.try_recv() {
        out.push(format!(
            "{}/{}",
            r.namespace.as_deref().unwrap_or_default(),
            r.name
        ));
    }
    out.sort();
    out.dedup();
    out
}

/// What a reconcile asked for: wait for a change, or look again after this long.
pub fn requeue(secs: u64) -> Action {
    Action::requeue(Duration::from_secs(secs))
}

// --- The load balancer reconcilers ------------------------------------------------------------------

/// The LoadBalancer and IPPool reconciles on one store, with their pool tasks.
pub struct LbWorld {
    _dir: tempfile::TempDir,
    pub store: Arc<dyn ObjectStore>,
    pub ctx: Contexts,
    pool_cache: Writer<IPPool>,
    events: mpsc::Receiver<Recorded>,
    woken: mpsc::UnboundedReceiver<ObjectRef<LoadBalancer>>,
    stop: CancellationToken,
}

impl Drop for LbWorld {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl LbWorld {
    /// The reconciles as on Kubernetes: kube-vip, not the reconciler, announces VM load
    /// balancers' addresses.
    pub async fn new() -> Self {
        Self::with_settings(lb::Settings::default()).await
    }

    /// The reconciles with these settings (their identity is `test`).
    pub async fn with_settings(settings: lb::Settings) -> Self {
        let (dir, store) = open_store().await;
        let stop = CancellationToken::new();
        let (pool_reader, pool_cache) = reflector::store::<IPPool>();
        let (vmi_reader, mut vmi_cache) = reflector::store();
        // No VMIs: a VM load balancer here has no backends (and is decided, not deferred).
        relist(&mut vmi_cache, Vec::new());
        let (events_recorder, events) = Recorder::capture(events::COMPONENT, "test");
        let (wake, woken) = mpsc::unbounded_channel();
        let ctx = Contexts::new(
            store.clone(),
            &lb::Settings {
                identity: "test".into(),
                ..settings
            },
            pool_reader,
            vmi_reader,
            events_recorder,
            wake,
            stop.clone(),
        );
        let mut world = LbWorld {
            _dir: dir,
            store,
            ctx,
            pool_cache,
            events,
            woken,
            stop,
        };
        world.sync_pools().await;
        world
    }

    /// A world with these pools (each stored, and in the cache).
    pub async fn with_pools(pools: impl IntoIterator<Item = Value>) -> Self {
        let mut world = Self::new().await;
        for pool in pools {
            world.add_pool(pool).await;
        }
        world
    }

    pub fn pools_api(&self) -> Api<IPPool> {
        pool_api(self.store.clone())
    }

    pub fn lbs_api(&self) -> Api<LoadBalancer> {
        lb_api(self.store.clone())
    }

    /// The pool cache as the controllers would have it now.
    pub async fn sync_pools(&mut self) {
        let pools = self
            .pools_api()
            .list(None, &LabelSelector::everything())
            .await
            .expect("lists pools");
        relist(&mut self.pool_cache, pools);
    }

    /// Puts a pool in the cache only: one that the store no longer has (the cache lags).
    pub fn cache_only(&mut self, pool: Value) {
        self.pool_cache
            .apply_watcher_event(&watcher::Event::Apply(typed(pool)));
    }

    /// Stores a pool and lets the cache see it.
    pub async fn add_pool(&mut self, pool: Value) -> IPPool {
        let created = self
            .pools_api()
            .create(&typed(pool))
            .await
            .expect("creates the pool");
        self.sync_pools().await;
        created
    }

    pub async fn pool(&self, name: &str) -> IPPool {
        self.pools_api()
            .get("", name)
            .await
            .expect("reads the pool")
            .unwrap_or_else(|| panic!("no pool {name}"))
    }

    /// Stores a LoadBalancer.
    pub async fn add_lb(&self, lb: Value) -> LoadBalancer {
        self.lbs_api()
            .create(&typed(lb))
            .await
            .expect("creates the load balancer")
    }

    pub async fn lb(&self, ns: &str, name: &str) -> LoadBalancer {
        self.try_lb(ns, name)
            .await
            .unwrap_or_else(|| panic!("no load balancer {ns}/{name}"))
    }

    pub async fn try_lb(&self, ns: &str, name: &str) -> Option<LoadBalancer> {
        self.lbs_api()
            .get(ns, name)
            .await
            .expect("reads the load balancer")
    }

    /// Brings a stored LoadBalancer to `edit`'s version (a user's write).
    pub async fn edit_lb(&self, ns: &str, name: &str, edit: impl FnOnce(&mut LoadBalancer)) {
        let mut lb = self.lb(ns, name).await;
        edit(&mut lb);
        self.lbs_api()
            .replace(&lb)
            .await
            .expect("replaces the load balancer");
    }

    /// A user's delete: with the finalizer on, the LoadBalancer is only marked.
    pub async fn delete_lb(&self, ns: &str, name: &str) {
        self.lbs_api()
            .delete(ns, name, &Preconditions::default())
            .await
            .expect("deletes the load balancer");
    }

    /// A user's delete of a pool.
    pub async fn delete_pool(&mut self, name: &str) {
        self.pools_api()
            .delete("", name, &Preconditions::default())
            .await
            .expect("deletes the pool");
        self.sync_pools().await;
    }

    /// One LoadBalancer reconcile of the stored object.
    pub async fn try_reconcile(&self, ns: &str, name: &str) -> Result<Action, LbError> {
        let lb = self.lb(ns, name).await;
        lb::loadbalancer::reconcile(Arc::new(lb), self.ctx.lbs.clone()).await
    }

    /// One LoadBalancer reconcile, which must succeed.
    pub async fn reconcile(&self, ns: &str, name: &str) -> Action {
        self.try_reconcile(ns, name)
            .await
            .unwrap_or_else(|e| panic!("reconcile of {ns}/{name} failed: {e}"))
    }

    /// One IPPool reconcile of the stored pool.
    pub async fn try_reconcile_pool(&self, name: &str) -> Result<Action, PoolReconcileError> {
        let pool = self.pool(name).await;
        lb::ippool::reconcile(Arc::new(pool), self.ctx.pools.clone()).await
    }

    pub async fn reconcile_pool(&self, name: &str) -> Action {
        self.try_reconcile_pool(name)
            .await
            .unwrap_or_else(|e| panic!("reconcile of pool {name} failed: {e}"))
    }

    /// The Events recorded since the last call, in order.
    pub fn events(&mut self) -> Vec<Reported> {
        drain(&mut self.events)
    }

    /// The load balancers woken since the last call (`namespace/name`, sorted).
    pub fn woken(&mut self) -> Vec<String> {
        drain_woken(&mut self.woken)
    }
}

// --- The guest Service reconciler -------------------------------------------------------------------

/// The Harvester namespace of the guest cluster's cloud-config, and the guest cluster.
pub const NS: &str = "gc-test";
pub const CLUSTER: &str = "gc1";

/// One guest cluster of the embedded backend: its Services in a [`ClusterStore`], Harvester's
/// LoadBalancers behind admission, as `serve` wires them.
pub struct GuestWorld {
    _dir: tempfile::TempDir,
    /// The store under both.
    pub raw: Arc<dyn ObjectStore>,
    pub ports: Ports,
    pub cluster: GuestContext,
    ctx: Arc<guest_reconcile::Ctx>,
    svc_cache: Writer<Service>,
    lb_cache: Writer<LoadBalancer>,
    events: mpsc::Receiver<Recorded>,
    woken: mpsc::UnboundedReceiver<ObjectRef<Service>>,
    /// Counts the writes to the Harvester side (each create, replace and delete tried).
    harvester_writes: Arc<Hooked<KillAfter>>,
}

impl GuestWorld {
    pub async fn new() -> Self {
        let (dir, raw) = open_store().await;
        let key = ClusterKey::new(NS, CLUSTER).expect("valid names");
        let harvester_writes = KillAfter::new(
            Arc::new(admitted(raw.clone(), NetworkCheck::Skip)),
            usize::MAX,
        );
        let ports = Ports {
            guest: Arc::new(ClusterStore::new(raw.clone(), key.clone())),
            harvester: harvester_writes.clone(),
        };
        let cluster = key.context();
        let (svc_reader, svc_cache) = reflector::store();
        let (lb_reader, lb_cache) = reflector::store();
        let (recorder, events) = Recorder::capture(guest_reconcile::COMPONENT, "test");
        let (wake, woken) = mpsc::unbounded_channel();
        let ctx = guest_reconcile::Ctx::new(
            &ports,
            cluster.clone(),
            svc_reader,
            lb_reader,
            recorder,
            wake,
        );
        let mut world = GuestWorld {
            _dir: dir,
            raw,
            ports,
            cluster,
            ctx,
            svc_cache,
            lb_cache,
            events,
            woken,
            harvester_writes,
        };
        world.sync().await;
        world
    }

    /// How many writes to the Harvester side the reconciles tried so far.
    pub fn harvester_writes(&self) -> usize {
        self.harvester_writes.writes_made()
    }

    pub fn services(&self) -> Api<Service> {
        Api::new(self.ports.guest.clone())
    }

    pub fn lbs(&self) -> Api<LoadBalancer> {
        lb_api(self.ports.harvester.clone())
    }

    /// Both caches as the reconciler's watches would have them now (only this cluster's
    /// LoadBalancers, as its watch keeps them).
    pub async fn sync(&mut self) {
        self.release_deleted().await;
        self.sync_services().await;
        let lbs = self
            .lbs()
            .list(Some(NS), &LabelSelector::everything())
            .await
            .expect("lists load balancers")
            .into_iter()
            .filter(|lb| in_scope(&self.cluster, lb))
            .collect::<Vec<_>>();
        relist(&mut self.lb_cache, lbs.clone());
        // The reconciler's LoadBalancer watch hands each event to the context after the cache.
        self.ctx.lb_event(&watcher::Event::Init);
        for lb in lbs {
            self.ctx.lb_event(&watcher::Event::InitApply(lb));
        }
        self.ctx.lb_event(&watcher::Event::InitDone);
    }

    /// The Service cache as the reconciler's watch would have it now.
    async fn sync_services(&mut self) {
        let services = self
            .services()
            .list(None, &LabelSelector::everything())
            .await
            .expect("lists services");
        relist(&mut self.svc_cache, services);
    }

    /// The LoadBalancer watch delivers each of this cluster's LoadBalancers as it is now (an
    /// Apply each, not a new list).
    pub async fn deliver_lbs(&mut self) {
        let lbs = self
            .lbs()
            .list(Some(NS), &LabelSelector::everything())
            .await
            .expect("lists load balancers");
        for lb in lbs.into_iter().filter(|lb| in_scope(&self.cluster, lb)) {
            let event = watcher::Event::Apply(lb);
            self.lb_cache.apply_watcher_event(&event);
            self.ctx.lb_event(&event);
        }
    }

    /// The LoadBalancer watch delivers the deletion of `name` (the cache never showed it).
    pub fn deliver_lb_deletion(&self, lb: &LoadBalancer) {
        self.ctx.lb_event(&watcher::Event::Delete(lb.clone()));
    }

    /// Stores a Service in the guest cluster; returns it as stored.
    pub async fn add(&self, svc: Value) -> Service {
        self.services()
            .create(&typed(svc))
            .await
            .expect("creates the service")
    }

    pub async fn svc(&self, ns: &str, name: &str) -> Service {
        self.try_svc(ns, name)
            .await
            .unwrap_or_else(|| panic!("no service {ns}/{name}"))
    }

    pub async fn try_svc(&self, ns: &str, name: &str) -> Option<Service> {
        self.services()
            .get(ns, name)
            .await
            .expect("reads the service")
    }

    /// Brings a stored Service to `edit`'s version (a user's write).
    pub async fn edit(&self, ns: &str, name: &str, edit: impl FnOnce(&mut Service)) {
        let mut svc = self.svc(ns, name).await;
        edit(&mut svc);
        self.services()
            .replace(&svc)
            .await
            .expect("replaces the service");
    }

    /// A user's delete: with the finalizer on, the Service is only marked.
    pub async fn delete(&self, ns: &str, name: &str) {
        self.services()
            .delete(ns, name, &Preconditions::default())
            .await
            .expect("deletes the service");
    }

    /// How long the LoadBalancer of a deleted DHCP Service is kept for its lease record.
    pub fn set_record_retention(&self, retention: Duration) {
        self.ctx.set_record_retention(retention);
    }

    /// Plays Harvester's load balancer reconciler for deleted LoadBalancers: admission gave them
    /// its finalizer, and its cleanup takes it off once the address is released.
    async fn release_deleted(&self) {
        let api = lb_api(self.raw.clone());
        let lbs = api
            .list(Some(NS), &LabelSelector::everything())
            .await
            .expect("lists load balancers");
        for mut lb in lbs {
            let finalizers = lb.metadata.finalizers.get_or_insert_default();
            let before = finalizers.len();
            finalizers.retain(|f| f != harvester_cloud::crd::LB_FINALIZER);
            if lb.metadata.deletion_timestamp.is_some() && finalizers.len() != before {
                api.replace(&lb).await.expect("releases the load balancer");
            }
        }
    }

    /// A LoadBalancer of the guest cluster by name, if it exists.
    pub async fn try_lb(&self, name: &str) -> Option<LoadBalancer> {
        self.release_deleted().await;
        self.lbs()
            .get(NS, name)
            .await
            .expect("reads the load balancer")
    }

    /// Every LoadBalancer in the guest cluster's Harvester namespace.
    pub async fn all_lbs(&self) -> Vec<LoadBalancer> {
        self.release_deleted().await;
        self.lbs()
            .list(Some(NS), &LabelSelector::everything())
            .await
            .expect("lists load balancers")
    }

    /// The LoadBalancer of a Service (there must be exactly one).
    pub async fn lb_of(&self, ns: &str, name: &str) -> LoadBalancer {
        let mut lbs: Vec<LoadBalancer> = self
            .all_lbs()
            .await
            .into_iter()
            .filter(|lb| {
                let labels = lb.metadata.labels.clone().unwrap_or_default();
                labels.get(harvester_cloud::crd::keys::LABEL_SERVICE_NAMESPACE)
                    == Some(&ns.to_string())
                    && labels.get(harvester_cloud::crd::keys::LABEL_SERVICE_NAME)
                        == Some(&name.to_string())
            })
            .collect();
        assert_eq!(lbs.len(), 1, "load balancers of {ns}/{name}: {lbs:?}");
        lbs.remove(0)
    }

    /// Plays Harvester's load balancer reconciler: the LoadBalancer gets `ip` and is Ready.
    pub async fn allocate(&self, lb: &LoadBalancer, ip: &str) {
        self.set_status(
            lb,
            serde_json::json!({
                "allocatedAddress": {"ip": ip, "ipPool": if ip == "0.0.0.0" { "" } else { "pool" }},
                "address": if ip == "0.0.0.0" { "" } else { ip },
                "conditions": [{"type": "Ready", "status": "True"}]
            }),
        )
        .await;
    }

    /// Plays Harvester's load balancer reconciler: the LoadBalancer is refused with `message`.
    pub async fn refuse(&self, lb: &LoadBalancer, reason: &str, message: &str) {
        self.set_status(
            lb,
            serde_json::json!({
                "conditions": [{"type": "Ready", "status": "False", "reason": reason, "message": message}]
            }),
        )
        .await;
    }

    async fn set_status(&self, lb: &LoadBalancer, status: Value) {
        let api = lb_api(self.raw.clone());
        let mut current = api
            .get(NS, lb.metadata.name.as_deref().expect("name"))
            .await
            .expect("reads")
            .expect("the load balancer exists");
        current.status = Some(typed(status));
        api.replace_status(&current)
            .await
            .expect("writes the load balancer's status");
    }

    /// One reconcile of the stored Service, on caches synced first.
    pub async fn try_reconcile(
        &mut self,
        ns: &str,
        name: &str,
    ) -> Result<Action, guest_reconcile::SyncError> {
        self.sync().await;
        let svc = self.svc(ns, name).await;
        guest_reconcile::reconcile(Arc::new(svc), self.ctx.clone()).await
    }

    /// One reconcile of the stored Service with the LoadBalancer cache left as it was, as when the
    /// LoadBalancer watch lags behind the reconciler's own writes.
    pub async fn reconcile_before_the_lb_watch(&mut self, ns: &str, name: &str) -> Action {
        self.sync_services().await;
        let svc = self.svc(ns, name).await;
        guest_reconcile::reconcile(Arc::new(svc), self.ctx.clone())
            .await
            .unwrap_or_else(|e| panic!("reconcile of {ns}/{name} failed: {e}"))
    }

    /// One reconcile, which must succeed.
    pub async fn reconcile(&mut self, ns: &str, name: &str) -> Action {
        self.try_reconcile(ns, name)
            .await
            .unwrap_or_else(|e| panic!("reconcile of {ns}/{name} failed: {e}"))
    }

    /// The Events recorded since the last call, in order.
    pub fn events(&mut self) -> Vec<Reported> {
        drain(&mut self.events)
    }

    /// The Services woken since the last call (`namespace/name`, sorted).
    pub fn woken(&mut self) -> Vec<String> {
        drain_woken(&mut self.woken)
    }
}
