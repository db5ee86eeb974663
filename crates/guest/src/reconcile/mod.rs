//! The guest-Service reconciler: for each Service of type LoadBalancer of one guest cluster, the
//! Harvester LoadBalancer it maps to ([`super::mapping::plan`]), or the primary whose address it
//! shares ([`super::share`]); once that has an address, the address written back to the Service
//! (`kube-vip.io/loadbalancerIPs`, `status.loadBalancer.ingress`).
//!
//! It is written once against two store ports ([`Ports`]): the guest cluster's (its Services, the
//! `kube-system/harvester-nad-mapping` ConfigMap, Events on the Services) and Harvester's (the
//! LoadBalancers, in the cloud-config's namespace; the cluster's VMIs, from which [`super::nad`]
//! keeps the NAD mapping). `harvester-cloud ccm` runs it inside a guest
//! cluster against two Kubernetes APIs; the embedded backend runs one per guest cluster it keeps
//! ([`super::clusters`]).
//!
//! A Service giving a sharing key shares its group's address instead ([`group`], [`crate::sharing`]):
//! the group's LoadBalancer belongs to no one Service and goes with the group's last Service.
//!
//! Finalizer first (`service.kubernetes.io/load-balancer-cleanup`, as Kubernetes' own service
//! controller names it), then an idempotent apply; deletion removes the LoadBalancer (its Harvester
//! finalizer releases the address) and may run without apply ever having run. Refusals (a network
//! or IPAM change, a share-IP rule, a NAD mapping problem, an admission denial) are Kubernetes Events
//! on the Service with upstream's messages, each reported once per change rather than on every retry.
//!
//! Deliberate differences from upstream:
//! - While the LoadBalancer waits for an address the Service waits too (LoadBalancer events wake
//!   it): nothing is deleted on a timeout, so there is no delete/recreate churn.
//! - A LoadBalancer whose Service is gone, or was recreated with a new UID, is garbage-collected
//!   (the LoadBalancer carries the Service's UID in `cloudprovider.harvesterhci.io/serviceUID`).
//! - A DHCP Service's lease (the MAC address and address kube-vip reports, a host name) is recorded
//!   on its LoadBalancer and written back onto the Service where it lacks them
//!   ([`super::dhcp`]); the LoadBalancer of a deleted DHCP Service is kept a while for a Service
//!   recreated under the same name to take that record.
//! - A primary whose secondaries still use it keeps its finalizer: its deletion waits, and an Event
//!   says why.
//! - Writing `status.address` of a LoadBalancer (the DHCP lease kube-vip reports) goes through the
//!   object on Harvester's CRDs (no status subresource; the role may write LoadBalancers) and needs
//!   `loadbalancers/status` where the CRD has the subresource, which Harvester's
//!   `harvesterhci.io:cloudprovider` role lacks; refused, it is logged once and skipped.

mod group;
mod primary;
mod retain;
mod run;

use group::{leave, recorded_group};
use primary::{delete_own_lb, primary};
pub use run::run;

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::runtime::{
    reflector::{ObjectRef, Store},
    watcher::Event as WatchEvent,
};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::{
    decide::{
        is_load_balancer, judge_network, judge_secondary, lb_name_of, lb_names_of, primary_of,
        remove_annotation, set_annotation, set_ingress, set_label,
    },
    index::{Accepted, GroupIndex, ShareIndex},
    mapping::{GuestContext, LbPlan, annotation, label, service_key},
    share, sharing,
};
use crate::{
    controller::{
        Action, Backoff, Event, FinalizerError, Release, Target,
        events::{EventType, Recorder},
        finalizer_when, modify,
    },
    crd::{LoadBalancer, keys, lb_api},
    store::{Api, ObjectStore, Preconditions, StoreError, watcher::strip_for_cache},
    sync::lock,
};

/// An object's resourceVersion as the integer both backends give, if it is one.
fn version(lb: &LoadBalancer) -> Option<u64> {
    lb.metadata.resource_version.as_deref()?.parse().ok()
}

/// The finalizer on guest Services, Kubernetes' service controller's own (so Services that
/// upstream's cloud provider finalized are released here too).
pub const FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";
/// The component named in Events on guest Services.
pub const COMPONENT: &str = "harvester-cloud-ccm";

/// Event reasons, as Kubernetes' service controller writes them.
pub mod reason {
    pub const ENSURED: &str = "EnsuredLoadBalancer";
    pub const SYNC_FAILED: &str = "SyncLoadBalancerFailed";
    pub const DELETED: &str = "DeletedLoadBalancer";
    pub const DELETE_FAILED: &str = "DeleteLoadBalancerFailed";
    /// Ours: a Service asks to share across namespaces (Cilium's opt-in), which is not honoured.
    pub const CROSS_NAMESPACE_IGNORED: &str = "CrossNamespaceSharingIgnored";
}

/// How long the LoadBalancer of a deleted DHCP Service is kept for a Service recreated under the
/// same name to take its lease record, unless the settings say otherwise.
pub const DHCP_RECORD_RETENTION: Duration = Duration::from_secs(600);

/// Fallback re-checks; the events that end each wait (a LoadBalancer changing, a primary getting its
/// address, a secondary going away) normally come first.
const WAIT_RECHECK: Duration = Duration::from_secs(30);
const REFUSED_RECHECK: Duration = Duration::from_secs(60);
const BLOCKED_RECHECK: Duration = Duration::from_secs(15);

/// The two store ports: the guest cluster's and Harvester's.
#[derive(Clone)]
pub struct Ports {
    pub guest: Arc<dyn ObjectStore>,
    pub harvester: Arc<dyn ObjectStore>,
}

/// How the reconciler runs.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Services reconciled at once.
    pub concurrency: u16,
    /// This replica's name in Events.
    pub identity: String,
    /// Whether old Events are deleted by the reconciler (the embedded store); a Kubernetes API
    /// server expires them itself.
    pub prune_events: bool,
    /// How long the LoadBalancer of a deleted DHCP Service is kept for its lease record.
    pub dhcp_record_retention: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            concurrency: 256,
            identity: crate::controller::default_identity(),
            prune_events: true,
            dhcp_record_retention: DHCP_RECORD_RETENTION,
        }
    }
}

// --- The reconciler --------------------------------------------------------------------------------

/// A failed reconcile of one Service (the controller retries it with back-off).
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("service has no {field}")]
    MissingField { field: &'static str },
    #[error("create or update lb {lb} failed, error: {source}")]
    WriteLoadBalancer { lb: String, source: StoreError },
    #[error("cannot delete load balancer {lb}: {source}")]
    DeleteLoadBalancer { lb: String, source: StoreError },
    #[error("cannot read {what}: {source}")]
    Read { what: String, source: StoreError },
    #[error("update load balancer IP of service {service} failed, error: {source}")]
    WriteService { service: String, source: StoreError },
    #[error(transparent)]
    Finalizer(#[from] FinalizerError),
}

impl SyncError {
    fn source_error(&self) -> Option<&StoreError> {
        match self {
            SyncError::MissingField { .. } => None,
            SyncError::WriteLoadBalancer { source, .. }
            | SyncError::DeleteLoadBalancer { source, .. }
            | SyncError::Read { source, .. }
            | SyncError::WriteService { source, .. } => Some(source),
            SyncError::Finalizer(e) => Some(e.store_error()),
        }
    }

    /// A conflict only means the object moved on; the next event brings the new version.
    pub fn is_conflict(&self) -> bool {
        matches!(self.source_error(), Some(StoreError::Conflict { .. }))
    }

    /// A short label for metrics.
    fn reason(&self) -> &'static str {
        match self {
            SyncError::MissingField { .. } => "missing_field",
            SyncError::WriteLoadBalancer { .. } => "write_load_balancer",
            SyncError::DeleteLoadBalancer { .. } => "delete_load_balancer",
            SyncError::Read { .. } => "read",
            SyncError::WriteService { .. } => "write_service",
            SyncError::Finalizer(_) => "finalizer",
        }
    }
}

/// What every reconcile of one guest cluster's Services shares ([`run`] makes it; [`Ctx::new`] for
/// a reconcile driven by hand).
pub struct Ctx {
    cluster: GuestContext,
    services: Api<Service>,
    config_maps: Api<ConfigMap>,
    lbs: Api<LoadBalancer>,
    svc_cache: Store<Service>,
    lb_cache: Store<LoadBalancer>,
    events: Recorder,
    /// The last (reason, message) reported per Service, so each is reported once per change.
    reported: Mutex<HashMap<String, (String, String)>>,
    wake: mpsc::UnboundedSender<ObjectRef<Service>>,
    share_index: Mutex<ShareIndex>,
    accepted: Mutex<Accepted>,
    /// Which Services give which sharing key (kept from the Service watch).
    group_index: Mutex<GroupIndex>,
    /// The Services this process admitted to a sharing group (key → the group's LoadBalancer and
    /// the Service's UID), whose record the cache may not show yet.
    members: Mutex<HashMap<String, (String, Option<String>)>>,
    /// The LoadBalancers this process wrote or read (by name), each as the store answered, until
    /// the LoadBalancer watch delivers that version ([`Ctx::lb_as_known`]).
    written: Mutex<HashMap<String, Arc<LoadBalancer>>>,
    /// The highest resourceVersion the LoadBalancer watch has delivered.
    delivered: AtomicU64,
    /// Share-IP checks of one primary's secondaries run one at a time.
    share_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    status_forbidden: AtomicBool,
    backoff: Backoff,
    /// [`Settings::dhcp_record_retention`], in milliseconds.
    record_retention_ms: AtomicU64,
}

impl Ctx {
    /// The context of the reconciles of `cluster` on `ports`: they read Services from `svc_cache`
    /// and the cluster's LoadBalancers from `lb_cache` (the watches of [`run`] keep both), record
    /// Events on the Services with `events`, and send the Services to reconcile again to `wake`.
    pub fn new(
        ports: &Ports,
        cluster: GuestContext,
        svc_cache: Store<Service>,
        lb_cache: Store<LoadBalancer>,
        events: Recorder,
        wake: mpsc::UnboundedSender<ObjectRef<Service>>,
    ) -> Arc<Self> {
        Arc::new(Ctx {
            services: Api::new(ports.guest.clone()),
            config_maps: Api::new(ports.guest.clone()),
            lbs: lb_api(ports.harvester.clone()),
            svc_cache,
            lb_cache,
            events,
            reported: Mutex::new(HashMap::new()),
            wake,
            share_index: Mutex::new(ShareIndex::default()),
            accepted: Mutex::new(Accepted::default()),
            group_index: Mutex::new(GroupIndex::default()),
            members: Mutex::new(HashMap::new()),
            written: Mutex::new(HashMap::new()),
            delivered: AtomicU64::new(0),
            share_locks: Mutex::new(HashMap::new()),
            status_forbidden: AtomicBool::new(false),
            backoff: Backoff::default(),
            record_retention_ms: AtomicU64::new(DHCP_RECORD_RETENTION.as_millis() as u64),
            cluster,
        })
    }

    /// Sets how long the LoadBalancer of a deleted DHCP Service is kept for its lease record
    /// ([`DHCP_RECORD_RETENTION`] until set).
    pub fn set_record_retention(&self, retention: Duration) {
        let ms = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX);
        self.record_retention_ms.store(ms, Ordering::Relaxed);
    }

    fn record_retention(&self) -> Duration {
        Duration::from_millis(self.record_retention_ms.load(Ordering::Relaxed))
    }

    fn lb_namespace(&self) -> &str {
        &self.cluster.lb_namespace
    }

    fn lb_ref(&self, name: &str) -> String {
        format!("{}/{name}", self.lb_namespace())
    }

    /// LoadBalancer `name` as this process last wrote or read it while the cache shows an older
    /// version (or none, and the LoadBalancer watch has not passed that version), else as the cache
    /// shows it. A Service reconciled again soon after it made its LoadBalancer (its finalizer's own
    /// change brings it back at once) so finds it, instead of creating it again into a 409 and a
    /// read. Kubernetes calls resourceVersions opaque; they are compared here as the integers both
    /// backends give (etcd's revisions, the embedded store's counter; the store's Kubernetes backend
    /// already reads them so), and one that is not an integer leaves the cache as the one view.
    fn lb_as_known(&self, name: &str) -> Option<Arc<LoadBalancer>> {
        let cached = self
            .lb_cache
            .get(&ObjectRef::new(name).within(self.lb_namespace()));
        let mut written = lock(&self.written);
        let Some(ours) = written.get(name) else {
            return cached;
        };
        let newer = match (&cached, version(ours)) {
            // Not in the cache: not yet delivered, unless the watch has passed its version (then it
            // was deleted since).
            (None, Some(ours)) => ours > self.delivered.load(Ordering::Relaxed),
            (Some(cached), Some(ours)) => version(cached).is_some_and(|c| ours > c),
            (_, None) => false,
        };
        if newer {
            return Some(ours.clone());
        }
        written.remove(name);
        cached
    }

    /// This process wrote `lb` (the write's answer), or read it from the store: newer than the
    /// cache may be, unless the watch has passed its version already.
    fn knows_lb(&self, mut lb: LoadBalancer) {
        let Some(name) = lb.metadata.name.clone() else {
            return;
        };
        let mut written = lock(&self.written);
        // Under the lock that `lb_event` takes too: a delivery is seen before or after, whole.
        if version(&lb).is_none_or(|v| v <= self.delivered.load(Ordering::Relaxed)) {
            return;
        }
        strip_for_cache(&mut lb);
        written.insert(name, Arc::new(lb));
    }

    /// Forgets what this process knows of LoadBalancer `name` (it deletes it).
    fn forget_lb(&self, name: &str) {
        lock(&self.written).remove(name);
    }

    /// An event of the LoadBalancer watch, after the cache has it: a write of ours that the cache
    /// now shows (or that the watch passed) is forgotten, a deletion forgets its LoadBalancer, and
    /// a new list all of them.
    pub fn lb_event(&self, event: &WatchEvent<LoadBalancer>) {
        let mut written = lock(&self.written);
        let lb = match event {
            WatchEvent::Apply(lb) | WatchEvent::InitApply(lb) | WatchEvent::Delete(lb) => lb,
            WatchEvent::InitDone => {
                written.clear();
                return;
            }
            WatchEvent::Init => return,
        };
        if let Some(v) = version(lb) {
            self.delivered.fetch_max(v, Ordering::Relaxed);
        }
        let Some(name) = &lb.metadata.name else {
            return;
        };
        let forget = match event {
            WatchEvent::Delete(_) => true,
            _ => written.get(name).is_some_and(|ours| {
                version(ours).is_none_or(|ours| version(lb).is_none_or(|seen| seen >= ours))
            }),
        };
        if forget {
            written.remove(name);
        }
    }

    /// Deletes the LoadBalancer `name` of the guest cluster's namespace: true when this call
    /// deleted it, false when it was already gone.
    async fn delete_lb(
        &self,
        name: &str,
        preconditions: &crate::store::Preconditions,
    ) -> Result<bool, SyncError> {
        self.forget_lb(name);
        match self
            .lbs
            .delete(self.lb_namespace(), name, preconditions)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(source) => Err(SyncError::DeleteLoadBalancer {
                lb: self.lb_ref(name),
                source,
            }),
        }
    }

    /// Records an Event unless it repeats the last one about this Service.
    fn report(
        &self,
        svc: &Service,
        key: &str,
        kind: EventType,
        reason: &'static str,
        message: String,
    ) {
        {
            let mut reported = lock(&self.reported);
            let last = (reason.to_string(), message.clone());
            if reported.get(key) == Some(&last) {
                return;
            }
            reported.insert(key.to_string(), last);
        }
        self.events.record(svc, kind, reason, message);
    }

    /// A Service this reconciler cannot serve as it asks: an Event, and a later look.
    fn refuse(&self, svc: &Service, key: &str, message: String) -> Action {
        info!(service = %key, %message, "refused");
        self.report(svc, key, EventType::Warning, reason::SYNC_FAILED, message);
        Action::requeue(REFUSED_RECHECK)
    }

    fn share_lock(&self, primary: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.share_locks)
            .entry(primary.to_string())
            .or_default()
            .clone()
    }

    fn accept_secondary(&self, primary: &str, key: &str, svc: &Service) {
        lock(&self.accepted).accept(primary, key, svc);
    }

    fn forget_secondary(&self, key: &str) {
        lock(&self.accepted).forget(key);
    }

    /// The secondaries using primary `(ns, name)`, but `except`: those the cache shows labelled and
    /// still naming it, and those accepted here whose label the cache may not show yet (only while
    /// the cache still has that very Service, so a Service deleted behind the reconciler's back is
    /// not counted). Services being deleted no longer count.
    fn secondaries_of(&self, ns: &str, name: &str, except: &str) -> Vec<Arc<Service>> {
        let primary_key = format!("{ns}/{name}");
        let label_value = share::primary_label_value(ns, name);
        let names_primary = |s: &Service| {
            primary_of(s)
                .ok()
                .flatten()
                .as_ref()
                .map(|(n, m)| (n.as_str(), m.as_str()))
                == Some((ns, name))
        };
        let mut found: BTreeMap<String, Arc<Service>> = self
            .svc_cache
            .state()
            .into_iter()
            .filter(|s| {
                label(s, keys::SVC_PRIMARY) == Some(label_value.as_str())
                    && s.metadata.deletion_timestamp.is_none()
                    && names_primary(s)
            })
            .map(|s| (service_key(&s), s))
            .collect();
        let remembered = lock(&self.accepted).of(&primary_key);
        for (key, svc) in remembered {
            let Some((sns, sname)) = key.split_once('/') else {
                continue;
            };
            let current = self.svc_cache.get(&ObjectRef::new(sname).within(sns));
            let still = current.is_some_and(|c| {
                c.metadata.uid == svc.metadata.uid
                    && c.metadata.deletion_timestamp.is_none()
                    && names_primary(&c)
            });
            if still {
                found.entry(key).or_insert(svc);
            }
        }
        found.remove(except);
        found.into_values().collect()
    }

    /// The NAD mapping ConfigMap's value (`None` when the ConfigMap does not exist).
    async fn nad_mapping(&self) -> Result<Option<Option<String>>, SyncError> {
        let cm = self
            .config_maps
            .get(keys::NAD_MAPPING_NAMESPACE, keys::NAD_MAPPING_NAME)
            .await
            .map_err(|source| SyncError::Read {
                what: format!(
                    "configmap {}/{}",
                    keys::NAD_MAPPING_NAMESPACE,
                    keys::NAD_MAPPING_NAME
                ),
                source,
            })?;
        Ok(cm.map(|cm| cm.data.and_then(|mut d| d.remove(keys::NAD_MAPPING_KEY))))
    }
}

fn missing(field: &'static str) -> SyncError {
    SyncError::MissingField { field }
}

/// One reconcile of a Service: the finalizer, then serving it (or cleaning up after it).
pub async fn reconcile(svc: Arc<Service>, ctx: Arc<Ctx>) -> Result<Action, SyncError> {
    let started = Instant::now();
    svc.metadata
        .namespace
        .as_ref()
        .ok_or(missing("metadata.namespace"))?;
    svc.metadata.name.as_ref().ok_or(missing("metadata.name"))?;
    let key = service_key(&svc);
    if svc.metadata.deletion_timestamp.is_some() || !is_load_balancer(&svc) {
        // Going, or no longer a load balancer: no longer anyone's secondary or group member.
        ctx.forget_secondary(&key);
        ctx.forget_member(&key);
    }
    // A Service that is no longer of type LoadBalancer releases what it had, as a deleted one does.
    let result = finalizer_when(
        &ctx.services,
        FINALIZER,
        svc,
        is_load_balancer,
        |event| async {
            match event {
                Event::Apply(svc) => ensure(&svc, &key, &ctx).await,
                Event::Cleanup(svc, release) => cleanup(&svc, release, &key, &ctx).await,
            }
        },
    )
    .await;
    crate::metrics::observe_reconcile(
        "guestservice",
        started.elapsed(),
        result.as_ref().err().map(SyncError::reason),
    );
    if result.is_ok() {
        ctx.backoff.succeeded(&key);
    }
    result
}

/// A Service of type LoadBalancer with the finalizer: a primary gets its own LoadBalancer, a
/// secondary its primary's address, a Service giving a sharing key its group's.
async fn ensure(svc: &Service, key: &str, ctx: &Ctx) -> Result<Action, SyncError> {
    // The NAD mapping first, for a secondary too, as upstream checks every Service.
    let network = annotation(svc, keys::SVC_NETWORK).unwrap_or_default();
    let nad = if network.is_empty() {
        None
    } else {
        ctx.nad_mapping().await?
    };
    let interface = match judge_network(svc, nad.as_ref().map(|m| m.as_deref())) {
        Ok(interface) => interface,
        Err(e) => {
            ctx.forget_secondary(key);
            return Ok(ctx.refuse(svc, key, e.to_string()));
        }
    };
    let sharing = match sharing::sharing_key(svc) {
        Ok(sharing) => sharing,
        Err(e) => {
            ctx.forget_secondary(key);
            if let Some(old) = recorded_group(svc) {
                leave(svc, key, &old, ctx).await?;
            }
            return Ok(ctx.refuse(svc, key, e.to_string()));
        }
    };
    if let Some(sharing) = sharing {
        ctx.forget_secondary(key);
        return group::member(svc, key, sharing, interface, ctx).await;
    }
    // No key (any more): a group it was admitted to is left.
    let left;
    let svc = match recorded_group(svc) {
        Some(old) => {
            left = leave(svc, key, &old, ctx).await?;
            &left
        }
        None => svc,
    };
    match primary_of(svc) {
        Err(e) => Ok(ctx.refuse(svc, key, e.to_string())),
        Ok(Some(primary)) => secondary(svc, key, primary, ctx).await,
        Ok(None) => {
            ctx.forget_secondary(key);
            primary(svc, key, interface, ctx).await
        }
    }
}

/// Writes the address back to the Service: its annotations (`annotate`), then
/// `status.loadBalancer.ingress` (`ingress`, in order; none for DHCP, whose lease holder, the guest's
/// kube-vip, reports it). Returns whether anything was written.
async fn write_back(
    svc: &Service,
    key: &str,
    ctx: &Ctx,
    ingress: &[&str],
    annotate: impl Fn(&mut Service) -> bool,
) -> Result<bool, SyncError> {
    let failed = |source| SyncError::WriteService {
        service: key.into(),
        source,
    };
    let Some(annotated) = modify(&ctx.services, svc, Target::Object, annotate)
        .await
        .map_err(failed)?
    else {
        return Ok(false);
    };
    let mut changed = annotated.written;
    if !ingress.is_empty() {
        let written = modify(&ctx.services, &annotated.object, Target::Status, |s| {
            set_ingress(s, ingress)
        })
        .await
        .map_err(failed)?;
        changed |= written.is_some_and(|m| m.written);
    }
    Ok(changed)
}

/// The guest's kube-vip reports a DHCP lease in the Service's ingress; Harvester learns it as the
/// LoadBalancer's `status.address`. Where the CRD has a status subresource, Harvester's shipped role
/// (no `loadbalancers/status`) cannot, and this is
/// logged once and skipped.
async fn report_address(
    lb: &LoadBalancer,
    plan: &LbPlan,
    lb_key: &str,
    ctx: &Ctx,
) -> Result<(), SyncError> {
    let Some(address) = plan.address.as_deref().filter(|a| *a != keys::DHCP_ADDRESS) else {
        return Ok(());
    };
    let current = lb.status.as_ref().map(|s| s.address.as_str());
    if !current.unwrap_or_default().is_empty() {
        return Ok(());
    }
    let written = modify(&ctx.lbs, lb, Target::Status, |l| {
        let status = l.status.get_or_insert_default();
        if status.address == address {
            return false;
        }
        status.address = address.to_string();
        true
    })
    .await;
    match written {
        Ok(_) => Ok(()),
        Err(StoreError::Forbidden { message }) => {
            if !ctx.status_forbidden.swap(true, Ordering::Relaxed) {
                warn!(lb = %lb_key, %message, "cannot write load balancer status (the cloud-config's role lacks loadbalancers/status); Harvester will not see addresses leased in the guest");
            }
            Ok(())
        }
        Err(source) => Err(SyncError::WriteLoadBalancer {
            lb: lb_key.into(),
            source,
        }),
    }
}

async fn secondary(
    svc: &Service,
    key: &str,
    (pns, pname): (String, String),
    ctx: &Ctx,
) -> Result<Action, SyncError> {
    let primary_key = format!("{pns}/{pname}");
    let share_lock = ctx.share_lock(&primary_key);
    let held = share_lock.lock().await;
    let primary = ctx.svc_cache.get(&ObjectRef::new(&pname).within(&pns));
    let primary_lb = primary
        .as_deref()
        .and_then(|p| lb_name_of(&ctx.cluster.cluster, p))
        .and_then(|n| {
            ctx.lb_cache
                .get(&ObjectRef::new(&n).within(ctx.lb_namespace()))
        });
    let others = ctx.secondaries_of(&pns, &pname, key);
    let other_refs: Vec<&Service> = others.iter().map(|s| s.as_ref()).collect();
    let judged = judge_secondary(
        svc,
        (&pns, &pname),
        primary.as_deref(),
        primary_lb.as_deref(),
        &other_refs,
    );
    let ip = match judged {
        Ok(ip) => ip,
        Err(e) => {
            ctx.forget_secondary(key);
            return Ok(ctx.refuse(svc, key, e.to_string()));
        }
    };
    ctx.accept_secondary(&primary_key, key, svc);
    drop(held);
    // Its own LoadBalancers, if it had any as a primary, go (their finalizers release those
    // addresses).
    for own in lb_names_of(&ctx.cluster.cluster, svc).unwrap_or_default() {
        delete_own_lb(ctx, key, &own).await?;
    }
    let primary_network = primary
        .as_deref()
        .and_then(|p| annotation(p, keys::SVC_NETWORK))
        .filter(|n| !n.is_empty())
        .map(String::from);
    let label_value = share::primary_label_value(&pns, &pname);
    let ingress: Vec<&str> = (ip != keys::DHCP_ADDRESS)
        .then_some(ip.as_str())
        .into_iter()
        .collect();
    let written = write_back(svc, key, ctx, &ingress, |s| {
        let mut changed = set_annotation(s, keys::KUBE_VIP_IPS, &ip);
        if let Some(n) = &primary_network {
            changed |= set_annotation(s, keys::SVC_NETWORK, n);
        }
        changed |= remove_annotation(s, keys::KUBE_VIP_INTERFACE);
        changed |= remove_annotation(s, keys::SVC_IPAM);
        changed | set_label(s, keys::SVC_PRIMARY, &label_value)
    })
    .await?;
    if written {
        info!(service = %key, primary = %primary_key, %ip, "service shares its primary's address");
        ctx.report(
            svc,
            key,
            EventType::Normal,
            reason::ENSURED,
            format!("Ensured address {ip} shared with primary service {primary_key}"),
        );
    }
    Ok(Action::await_change())
}

/// Deletion, or a Service that is no longer of type LoadBalancer: its LoadBalancer goes, then the
/// finalizer. A primary that secondaries still use waits.
async fn cleanup(
    svc: &Service,
    release: Release<Service>,
    key: &str,
    ctx: &Ctx,
) -> Result<Action, SyncError> {
    let deleting = svc.metadata.deletion_timestamp.is_some();
    let (ns, name) = key.split_once('/').unwrap_or_default();
    let primary = primary_of(svc).ok().flatten();
    if primary.is_none() {
        let users = ctx.secondaries_of(ns, name, key);
        let user_refs: Vec<&Service> = users.iter().map(|s| s.as_ref()).collect();
        if let Err(e) = share::check_primary_deletion(svc, &user_refs) {
            info!(service = %key, error = %e, "deletion waits for the secondaries");
            ctx.report(
                svc,
                key,
                EventType::Warning,
                reason::DELETE_FAILED,
                e.to_string(),
            );
            return Ok(Action::requeue(BLOCKED_RECHECK));
        }
    }
    let mut deleted_lb = None;
    let mut retained_lb = None;
    // The group it shared an address with loses a member; the last one's going releases it.
    for group in group::groups_of(ctx, svc) {
        if group::release_if_empty(key, &group, ctx).await? {
            deleted_lb = Some(ctx.lb_ref(&group));
        }
    }
    for (i, lb_name) in lb_names_of(&ctx.cluster.cluster, svc)
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        // The first by name whatever the cache shows (as upstream deletes it); a second family's
        // only when the cache shows it.
        if i > 0 {
            delete_own_lb(ctx, key, &lb_name).await?;
            continue;
        }
        // A deleted DHCP Service's LoadBalancer is kept a while for its lease record, for a
        // Service recreated under the same name.
        let cached = ctx
            .lb_cache
            .get(&ObjectRef::new(&lb_name).within(ctx.lb_namespace()));
        if deleting
            && let Some(lb) = cached.filter(|lb| {
                lb.metadata.deletion_timestamp.is_none() && retain::worth_keeping(ctx, lb)
            })
        {
            if retain::retire(ctx, &lb).await? {
                retained_lb = Some(ctx.lb_ref(&lb_name));
            }
            continue;
        }
        ctx.forget_lb(&lb_name);
        match ctx
            .lbs
            .delete(ctx.lb_namespace(), &lb_name, &Preconditions::default())
            .await
        {
            Ok(_) => deleted_lb = deleted_lb.or(Some(ctx.lb_ref(&lb_name))),
            Err(e) if e.is_not_found() => {}
            Err(source) => {
                return Err(SyncError::DeleteLoadBalancer {
                    lb: ctx.lb_ref(&lb_name),
                    source,
                });
            }
        }
    }
    // A Service that stays (no longer a load balancer) also loses what was written for it: its
    // address first, so that once the finalizer is off nothing of it is left.
    let mut current = svc.clone();
    if !deleting
        && let Some(cleared) = modify(&ctx.services, svc, Target::Status, |s| set_ingress(s, &[]))
            .await
            .map_err(|source| SyncError::WriteService {
                service: key.into(),
                source,
            })?
    {
        current = cleared.object;
    }
    let written = release
        .release_with(&current, |s| {
            !deleting
                && (remove_annotation(s, keys::KUBE_VIP_IPS)
                    | remove_annotation(s, keys::KUBE_VIP_INTERFACE)
                    | remove_annotation(s, keys::SVC_SHARED_LOAD_BALANCER))
        })
        .await?;
    // Only the pass that took the finalizer off reports: a later pass on a stale copy (the
    // LoadBalancer still being released answers its delete too) must not report it again.
    let finalized = written.is_some_and(|m| m.written);
    if let Some(lb) = deleted_lb.filter(|_| finalized) {
        info!(service = %key, %lb, "deleted load balancer");
        ctx.report(
            svc,
            key,
            EventType::Normal,
            reason::DELETED,
            format!("Deleted load balancer {lb}"),
        );
    }
    if let Some(lb) = retained_lb.filter(|_| finalized) {
        ctx.report(
            svc,
            key,
            EventType::Normal,
            reason::DELETED,
            format!(
                "Released load balancer {lb}; its DHCP lease record is kept for {} for a service recreated as {key}",
                retain::shown(ctx.record_retention())
            ),
        );
    }
    if deleting {
        let mut reported = lock(&ctx.reported);
        reported.remove(key);
        reported.remove(&format!("{key}#cross-namespace"));
        drop(reported);
        lock(&ctx.share_locks).remove(key);
    }
    if let Some((pns, pname)) = primary {
        // A primary waiting for its secondaries to go may go now.
        let _ = ctx.wake.send(ObjectRef::new(&pname).within(&pns));
    }
    Ok(Action::await_change())
}
