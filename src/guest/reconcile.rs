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
//! - A primary whose secondaries still use it keeps its finalizer: its deletion waits, and an Event
//!   says why.
//! - Writing `status.address` of a LoadBalancer (the DHCP lease kube-vip reports) needs
//!   `loadbalancers/status`, which Harvester's `harvesterhci.io:cloudprovider` role lacks; refused,
//!   it is logged once and skipped.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    ConfigMap, LoadBalancerIngress, LoadBalancerStatus as ServiceLbStatus, Service, ServiceStatus,
};
use kube::runtime::{
    Controller, PredicateConfig, WatchStreamExt,
    controller::{Action, Config},
    reflector::{self, ObjectRef, Store},
    watcher::Event as WatchEvent,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use super::{
    GuestError,
    mapping::{self, ExistingLb, GuestContext, LbPlan, annotation, label},
    nad, naming, network, share,
};
use crate::{
    controller::{
        Backoff, Event, FinalizerError, Release, Target,
        events::{EventType, Recorder},
        finalizer_when, modify,
    },
    crd::{LoadBalancer, LoadBalancerSpec, keys, lb_api, lb_kind},
    store::{Api, Kind, ObjectStore, Preconditions, StoreError, watcher::watcher},
    sync::lock,
};

/// The finalizer on guest Services, Kubernetes' service controller's own (so Services that
/// upstream's cloud provider finalized are released here too).
pub const FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";
/// The component named in Events on guest Services.
pub const COMPONENT: &str = "harvester-cloud-ccm";
/// The `type` of Services this reconciler serves.
const LOAD_BALANCER: &str = "LoadBalancer";

/// Event reasons, as Kubernetes' service controller writes them.
pub mod reason {
    pub const ENSURED: &str = "EnsuredLoadBalancer";
    pub const SYNC_FAILED: &str = "SyncLoadBalancerFailed";
    pub const DELETED: &str = "DeletedLoadBalancer";
    pub const DELETE_FAILED: &str = "DeleteLoadBalancerFailed";
}

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
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            concurrency: 256,
            identity: crate::controller::default_identity(),
            prune_events: true,
        }
    }
}

// --- Decisions (pure) ----------------------------------------------------------------------------

/// `namespace/name` of a Service.
pub fn service_key(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or_default(),
        svc.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A Service this reconciler serves: of type LoadBalancer, and not claimed by another
/// implementation through `spec.loadBalancerClass` (which Kubernetes' cloud providers leave alone).
pub fn is_load_balancer(svc: &Service) -> bool {
    svc.spec.as_ref().is_some_and(|s| {
        s.type_.as_deref() == Some(LOAD_BALANCER) && s.load_balancer_class.is_none()
    })
}

/// The primary a Service's annotation names, if it names one.
pub fn primary_of(svc: &Service) -> Result<Option<(String, String)>, GuestError> {
    match annotation(svc, keys::SVC_PRIMARY).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => {
            share::primary_ref(v, svc.metadata.namespace.as_deref().unwrap_or_default()).map(Some)
        }
    }
}

/// The name of a Service's own LoadBalancer in guest cluster `cluster` (`None` before it has a UID).
pub fn lb_name_of(cluster: &str, svc: &Service) -> Option<String> {
    let uid = svc.metadata.uid.as_deref().filter(|u| !u.is_empty())?;
    Some(naming::load_balancer_name(
        cluster,
        svc.metadata.namespace.as_deref().unwrap_or_default(),
        svc.metadata.name.as_deref().unwrap_or_default(),
        uid,
    ))
}

fn existing_view(lb: &LoadBalancer) -> ExistingLb {
    ExistingLb {
        annotations: lb
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        ipam: lb.spec.ipam.clone(),
    }
}

/// A primary: the plan of its LoadBalancer (refusing network and IPAM changes against `existing`)
/// and the interface kube-vip announces on (from the NAD mapping ConfigMap's value; `None` when the
/// ConfigMap does not exist).
pub fn judge_primary(
    svc: &Service,
    ctx: &GuestContext,
    existing: Option<&LoadBalancer>,
    nad_mapping: Option<Option<&str>>,
) -> Result<(LbPlan, Option<String>), GuestError> {
    let plan = mapping::plan(svc, ctx, existing.map(existing_view).as_ref())?;
    let network = annotation(svc, keys::SVC_NETWORK).unwrap_or_default();
    let interface = network::service_interface(nad_mapping, network, &service_key(svc))?;
    Ok((plan, interface))
}

/// A secondary of `primary_ref`: the primary's address, if it may share it with `others` (the
/// primary's other secondaries).
pub fn judge_secondary(
    svc: &Service,
    primary_ref: (&str, &str),
    primary: Option<&Service>,
    others: &[&Service],
) -> Result<String, GuestError> {
    let primary = primary.ok_or_else(|| {
        GuestError::PrimaryNotFound(format!("{}/{}", primary_ref.0, primary_ref.1))
    })?;
    let ip = share::check(primary, svc, others)?;
    share::check_network(primary, svc)?;
    Ok(ip)
}

/// Whether a LoadBalancer made for Service `svc` (`None`: the Service does not exist) is left over:
/// the Service is gone, or was recreated with a new UID.
pub fn is_leftover(cluster: &str, lb: &LoadBalancer, svc: Option<&Service>) -> bool {
    let Some(svc) = svc else {
        return true;
    };
    let uid = svc.metadata.uid.as_deref().unwrap_or_default();
    let recorded = lb
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::ANNOTATION_SERVICE_UID));
    recorded.is_some_and(|r| r != uid)
        || lb_name_of(cluster, svc).as_deref() != lb.metadata.name.as_deref()
}

/// The Service a LoadBalancer was made for: its labels, when it is one of `cluster`'s.
fn service_of(cluster: &str, lb: &LoadBalancer) -> Option<ObjectRef<Service>> {
    let labels = lb.metadata.labels.as_ref()?;
    if labels.get(keys::LABEL_GUEST_CLUSTER).map(String::as_str) != Some(cluster) {
        return None;
    }
    let ns = labels.get(keys::LABEL_SERVICE_NAMESPACE)?;
    let name = labels.get(keys::LABEL_SERVICE_NAME)?;
    Some(ObjectRef::new(name).within(ns))
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

/// Secondaries accepted by this process whose label may not be in the cache yet, so that two
/// secondaries checked one right after the other see each other's ports.
#[derive(Default)]
struct Accepted {
    /// Primary key → secondary key → the secondary as accepted.
    by_primary: HashMap<String, BTreeMap<String, Arc<Service>>>,
    /// Secondary key → its primary's key.
    primary_of: HashMap<String, String>,
}

/// Which Services name which primary, so that a change of one wakes the others (a primary getting
/// its address, a secondary going away from a primary whose deletion waits).
#[derive(Default)]
struct ShareIndex {
    /// Primary key → the Services whose annotation names it.
    named_by: HashMap<String, HashSet<ObjectRef<Service>>>,
    /// Service → the primary key its annotation names.
    names: HashMap<ObjectRef<Service>, String>,
}

impl ShareIndex {
    /// Records `svc` as it now is (`present`) or as deleted; returns the Services to wake: those
    /// naming it, and the primary it named before if it no longer does.
    fn update(&mut self, svc: &Service, present: bool) -> Vec<ObjectRef<Service>> {
        let me = ObjectRef::from_obj(svc);
        let now = present
            .then(|| primary_of(svc).ok().flatten())
            .flatten()
            .map(|(ns, name)| format!("{ns}/{name}"));
        let before = self.names.remove(&me);
        let mut wake: Vec<ObjectRef<Service>> = self
            .named_by
            .get(&service_key(svc))
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        if let Some(before) = before
            && Some(&before) != now.as_ref()
        {
            if let Some(set) = self.named_by.get_mut(&before) {
                set.remove(&me);
                if set.is_empty() {
                    self.named_by.remove(&before);
                }
            }
            if let Some((ns, name)) = before.split_once('/') {
                wake.push(ObjectRef::new(name).within(ns));
            }
        }
        if let Some(now) = now {
            self.named_by
                .entry(now.clone())
                .or_default()
                .insert(me.clone());
            self.names.insert(me, now);
        }
        wake
    }
}

struct Ctx {
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
    /// Share-IP checks of one primary's secondaries run one at a time.
    share_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    status_forbidden: AtomicBool,
    backoff: Backoff,
}

impl Ctx {
    fn lb_namespace(&self) -> &str {
        &self.cluster.lb_namespace
    }

    fn lb_ref(&self, name: &str) -> String {
        format!("{}/{name}", self.lb_namespace())
    }

    /// Records an Event unless it repeats the last one about this Service.
    fn report(&self, svc: &Service, key: &str, kind: EventType, reason: &str, message: String) {
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
        self.forget_secondary(key);
        let mut accepted = lock(&self.accepted);
        accepted
            .by_primary
            .entry(primary.to_string())
            .or_default()
            .insert(key.to_string(), Arc::new(svc.clone()));
        accepted
            .primary_of
            .insert(key.to_string(), primary.to_string());
    }

    fn forget_secondary(&self, key: &str) {
        let mut accepted = lock(&self.accepted);
        if let Some(primary) = accepted.primary_of.remove(key)
            && let Some(secondaries) = accepted.by_primary.get_mut(&primary)
        {
            secondaries.remove(key);
            if secondaries.is_empty() {
                accepted.by_primary.remove(&primary);
            }
        }
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
        let remembered: Vec<(String, Arc<Service>)> = lock(&self.accepted)
            .by_primary
            .get(&primary_key)
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
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

fn new_lb(plan: &LbPlan) -> LoadBalancer {
    let mut annotations = plan.create_annotations.clone();
    annotations.extend(plan.annotations.clone());
    for k in &plan.remove_annotations {
        annotations.remove(*k);
    }
    let mut lb = LoadBalancer::new(
        &plan.name,
        LoadBalancerSpec {
            workload_type: "cluster".into(),
            ipam: plan.ipam.clone(),
            ..Default::default()
        },
    );
    lb.metadata.namespace = Some(plan.namespace.clone());
    lb.metadata.labels = Some(plan.labels.clone());
    lb.metadata.annotations = Some(annotations);
    lb
}

/// Brings an existing LoadBalancer to the plan; says whether anything changed.
fn update_lb(lb: &mut LoadBalancer, plan: &LbPlan) -> bool {
    let mut changed = false;
    let annotations = lb.metadata.annotations.get_or_insert_default();
    for (k, v) in &plan.annotations {
        if annotations.get(k) != Some(v) {
            annotations.insert(k.clone(), v.clone());
            changed = true;
        }
    }
    for k in &plan.remove_annotations {
        changed |= annotations.remove(*k).is_some();
    }
    let labels = lb.metadata.labels.get_or_insert_default();
    for (k, v) in &plan.labels {
        if labels.get(k) != Some(v) {
            labels.insert(k.clone(), v.clone());
            changed = true;
        }
    }
    if lb.spec.ipam != plan.ipam {
        lb.spec.ipam = plan.ipam.clone();
        changed = true;
    }
    if lb.spec.workload_type != "cluster" {
        lb.spec.workload_type = "cluster".into();
        changed = true;
    }
    changed
}

fn set_annotation(svc: &mut Service, key: &str, value: &str) -> bool {
    let a = svc.metadata.annotations.get_or_insert_default();
    if a.get(key).map(String::as_str) == Some(value) {
        return false;
    }
    a.insert(key.into(), value.into());
    true
}

fn remove_annotation(svc: &mut Service, key: &str) -> bool {
    svc.metadata
        .annotations
        .as_mut()
        .is_some_and(|a| a.remove(key).is_some())
}

fn set_label(svc: &mut Service, key: &str, value: &str) -> bool {
    let l = svc.metadata.labels.get_or_insert_default();
    if l.get(key).map(String::as_str) == Some(value) {
        return false;
    }
    l.insert(key.into(), value.into());
    true
}

/// Sets `status.loadBalancer.ingress` to the one address (none for `None`).
fn set_ingress(svc: &mut Service, ip: Option<&str>) -> bool {
    let want: Vec<LoadBalancerIngress> = ip
        .map(|ip| LoadBalancerIngress {
            ip: Some(ip.into()),
            ..Default::default()
        })
        .into_iter()
        .collect();
    let current = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.clone())
        .unwrap_or_default();
    if current == want {
        return false;
    }
    let status = svc.status.get_or_insert_with(ServiceStatus::default);
    status
        .load_balancer
        .get_or_insert_with(ServiceLbStatus::default)
        .ingress = (!want.is_empty()).then_some(want);
    true
}

/// The Ready=False message of a LoadBalancer, if it has one.
fn not_ready_message(lb: &LoadBalancer) -> Option<String> {
    lb.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.r#type == "Ready" && c.status == "False")
        .map(|c| c.message.clone())
        .filter(|m| !m.is_empty())
}

fn missing(field: &'static str) -> SyncError {
    SyncError::MissingField { field }
}

async fn reconcile(svc: Arc<Service>, ctx: Arc<Ctx>) -> Result<Action, SyncError> {
    let started = Instant::now();
    svc.metadata
        .namespace
        .as_ref()
        .ok_or(missing("metadata.namespace"))?;
    svc.metadata.name.as_ref().ok_or(missing("metadata.name"))?;
    let key = service_key(&svc);
    if svc.metadata.deletion_timestamp.is_some() || !is_load_balancer(&svc) {
        // Going, or no longer a load balancer: no longer anyone's secondary either.
        ctx.forget_secondary(&key);
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
/// secondary its primary's address.
async fn ensure(svc: &Service, key: &str, ctx: &Ctx) -> Result<Action, SyncError> {
    match primary_of(svc) {
        Err(e) => Ok(ctx.refuse(svc, key, e.to_string())),
        Ok(Some(primary)) => secondary(svc, key, primary, ctx).await,
        Ok(None) => {
            ctx.forget_secondary(key);
            primary(svc, key, ctx).await
        }
    }
}

async fn primary(svc: &Service, key: &str, ctx: &Ctx) -> Result<Action, SyncError> {
    let lb_name = lb_name_of(&ctx.cluster.cluster, svc).ok_or(missing("metadata.uid"))?;
    let lb_key = ctx.lb_ref(&lb_name);
    let cached = ctx
        .lb_cache
        .get(&ObjectRef::new(&lb_name).within(ctx.lb_namespace()));
    if cached
        .as_ref()
        .is_some_and(|lb| lb.metadata.deletion_timestamp.is_some())
    {
        // Its deletion (by hand, or by a garbage collection racing a recreated Service) finishes
        // first; the LoadBalancer's Delete event brings this Service back.
        return Ok(Action::requeue(WAIT_RECHECK));
    }
    let network = annotation(svc, keys::SVC_NETWORK).unwrap_or_default();
    let nad = if network.is_empty() {
        None
    } else {
        ctx.nad_mapping().await?
    };
    let (plan, interface) = match judge_primary(
        svc,
        &ctx.cluster,
        cached.as_deref(),
        nad.as_ref().map(|m| m.as_deref()),
    ) {
        Ok(judged) => judged,
        Err(e) => return Ok(ctx.refuse(svc, key, e.to_string())),
    };
    let write_failed = |source| SyncError::WriteLoadBalancer {
        lb: lb_key.clone(),
        source,
    };
    let lb = match cached {
        None => match ctx.lbs.create(&new_lb(&plan)).await {
            Ok(lb) => {
                info!(service = %key, lb = %lb_key, ipam = %plan.ipam, "created load balancer");
                Some(lb)
            }
            Err(e) if e.is_already_exists() => {
                // Made by an earlier pass the cache does not show yet: update it instead.
                let fresh = ctx
                    .lbs
                    .get(ctx.lb_namespace(), &lb_name)
                    .await
                    .map_err(write_failed)?;
                match fresh {
                    Some(fresh) => {
                        modify(&ctx.lbs, &fresh, Target::Object, |l| update_lb(l, &plan))
                            .await
                            .map_err(write_failed)?
                            .map(|m| m.object)
                    }
                    None => None,
                }
            }
            Err(source @ StoreError::Invalid { .. }) => {
                return Ok(ctx.refuse(svc, key, write_failed(source).to_string()));
            }
            Err(e) => return Err(write_failed(e)),
        },
        Some(lb) => match modify(&ctx.lbs, &lb, Target::Object, |l| update_lb(l, &plan)).await {
            Ok(lb) => lb.map(|m| m.object),
            Err(source @ StoreError::Invalid { .. }) => {
                return Ok(ctx.refuse(svc, key, write_failed(source).to_string()));
            }
            Err(e) => return Err(write_failed(e)),
        },
    };
    let Some(lb) = lb else {
        // Deleted meanwhile: its Delete event brings this Service back.
        return Ok(Action::requeue(WAIT_RECHECK));
    };
    report_address(&lb, &plan, &lb_key, ctx).await?;
    let ip = lb
        .status
        .as_ref()
        .map(|s| s.allocated_address.ip.clone())
        .unwrap_or_default();
    if ip.is_empty() {
        // Still waiting: the LoadBalancer's next change brings this Service back. Nothing is
        // deleted on a timeout (upstream's delete/recreate churn).
        if let Some(message) = not_ready_message(&lb) {
            let message = format!(
                "ip is not allocated, mode: {}, message: {message}",
                plan.ipam
            );
            ctx.report(svc, key, EventType::Warning, reason::SYNC_FAILED, message);
        }
        return Ok(Action::requeue(WAIT_RECHECK));
    }
    let ingress = (ip != keys::DHCP_ADDRESS).then_some(ip.as_str());
    let written = write_back(svc, key, ctx, ingress, |s| {
        let mut changed = set_annotation(s, keys::KUBE_VIP_IPS, &ip);
        if let Some(i) = &interface {
            changed |= set_annotation(s, keys::KUBE_VIP_INTERFACE, i);
        }
        // Upstream marks a primary with an empty primary-service label.
        changed | set_label(s, keys::SVC_PRIMARY, "")
    })
    .await?;
    if written {
        info!(service = %key, lb = %lb_key, %ip, "service has its address");
        ctx.report(
            svc,
            key,
            EventType::Normal,
            reason::ENSURED,
            format!("Ensured load balancer {lb_key} with address {ip}"),
        );
    }
    Ok(Action::await_change())
}

/// Writes the address back to the Service: its annotations (`annotate`), then
/// `status.loadBalancer.ingress` (`ingress`; none for DHCP, whose lease holder, the guest's kube-vip,
/// reports it). Returns whether anything was written.
async fn write_back(
    svc: &Service,
    key: &str,
    ctx: &Ctx,
    ingress: Option<&str>,
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
    if let Some(ip) = ingress {
        let written = modify(&ctx.services, &annotated.object, Target::Status, |s| {
            set_ingress(s, Some(ip))
        })
        .await
        .map_err(failed)?;
        changed |= written.is_some_and(|m| m.written);
    }
    Ok(changed)
}

/// The guest's kube-vip reports a DHCP lease in the Service's ingress; Harvester learns it as the
/// LoadBalancer's `status.address`. Without `loadbalancers/status` (Harvester's shipped role) this is
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
    let others = ctx.secondaries_of(&pns, &pname, key);
    let other_refs: Vec<&Service> = others.iter().map(|s| s.as_ref()).collect();
    let ip = match judge_secondary(svc, (&pns, &pname), primary.as_deref(), &other_refs) {
        Ok(ip) => ip,
        Err(e) => {
            ctx.forget_secondary(key);
            return Ok(ctx.refuse(svc, key, e.to_string()));
        }
    };
    ctx.accept_secondary(&primary_key, key, svc);
    drop(held);
    // Its own LoadBalancer, if it had one as a primary, goes (its finalizer releases that address).
    if let Some(own) = lb_name_of(&ctx.cluster.cluster, svc)
        && ctx
            .lb_cache
            .get(&ObjectRef::new(&own).within(ctx.lb_namespace()))
            .is_some()
    {
        match ctx
            .lbs
            .delete(ctx.lb_namespace(), &own, &Preconditions::default())
            .await
        {
            Ok(_) => {
                info!(service = %key, lb = %ctx.lb_ref(&own), "deleted the load balancer of a service that now shares another's address")
            }
            Err(e) if e.is_not_found() => {}
            Err(source) => {
                return Err(SyncError::DeleteLoadBalancer {
                    lb: ctx.lb_ref(&own),
                    source,
                });
            }
        }
    }
    let primary_network = primary
        .as_deref()
        .and_then(|p| annotation(p, keys::SVC_NETWORK))
        .filter(|n| !n.is_empty())
        .map(String::from);
    let label_value = share::primary_label_value(&pns, &pname);
    let ingress = (ip != keys::DHCP_ADDRESS).then_some(ip.as_str());
    let written = write_back(svc, key, ctx, ingress, |s| {
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
    if let Some(lb_name) = lb_name_of(&ctx.cluster.cluster, svc) {
        match ctx
            .lbs
            .delete(ctx.lb_namespace(), &lb_name, &Preconditions::default())
            .await
        {
            Ok(_) => deleted_lb = Some(ctx.lb_ref(&lb_name)),
            Err(e) if e.is_not_found() => {}
            Err(source) => {
                return Err(SyncError::DeleteLoadBalancer {
                    lb: ctx.lb_ref(&lb_name),
                    source,
                });
            }
        }
    }
    // A Service that stays (no longer a load balancer) also loses what was written for kube-vip.
    let written = release
        .release_with(svc, |s| {
            !deleting
                && (remove_annotation(s, keys::KUBE_VIP_IPS)
                    | remove_annotation(s, keys::KUBE_VIP_INTERFACE))
        })
        .await?;
    // Only the pass that took the finalizer off reports: a later pass on a stale copy (the
    // LoadBalancer still being released answers its delete too) must not report it again.
    let finalized = written.as_ref().is_some_and(|m| m.written);
    if !deleting && let Some(written) = written {
        modify(&ctx.services, &written.object, Target::Status, |s| {
            set_ingress(s, None)
        })
        .await
        .map_err(|source| SyncError::WriteService {
            service: key.into(),
            source,
        })?;
    }
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
    if deleting {
        lock(&ctx.reported).remove(key);
        lock(&ctx.share_locks).remove(key);
    }
    if let Some((pns, pname)) = primary {
        // A primary waiting for its secondaries to go may go now.
        let _ = ctx.wake.send(ObjectRef::new(&pname).within(&pns));
    }
    Ok(Action::await_change())
}

/// Deletes a LoadBalancer of this cluster whose Service is gone or was recreated, after confirming
/// with fresh reads (the caches may lag).
async fn collect(ctx: &Ctx, lb_name: &str) -> Result<(), SyncError> {
    let Some(lb) = ctx
        .lb_cache
        .get(&ObjectRef::new(lb_name).within(ctx.lb_namespace()))
    else {
        return Ok(());
    };
    if lb.metadata.deletion_timestamp.is_some() || lb.spec.workload_type != "cluster" {
        return Ok(());
    }
    let Some(svc_ref) = service_of(&ctx.cluster.cluster, &lb) else {
        return Ok(());
    };
    let svc_ns = svc_ref.namespace.clone().unwrap_or_default();
    if !is_leftover(
        &ctx.cluster.cluster,
        &lb,
        ctx.svc_cache.get(&svc_ref).as_deref(),
    ) {
        return Ok(());
    }
    let lb_key = ctx.lb_ref(lb_name);
    let fresh_svc = ctx
        .services
        .get(&svc_ns, &svc_ref.name)
        .await
        .map_err(|source| SyncError::Read {
            what: format!("service {svc_ns}/{}", svc_ref.name),
            source,
        })?;
    let fresh_lb = ctx
        .lbs
        .get(ctx.lb_namespace(), lb_name)
        .await
        .map_err(|source| SyncError::Read {
            what: format!("load balancer {lb_key}"),
            source,
        })?;
    let Some(fresh_lb) = fresh_lb else {
        return Ok(());
    };
    if !is_leftover(&ctx.cluster.cluster, &fresh_lb, fresh_svc.as_ref()) {
        return Ok(());
    }
    let preconditions = Preconditions {
        uid: fresh_lb.metadata.uid.clone(),
        resource_version: None,
    };
    match ctx
        .lbs
        .delete(ctx.lb_namespace(), lb_name, &preconditions)
        .await
    {
        Ok(_) => {
            info!(lb = %lb_key, service = %format!("{svc_ns}/{}", svc_ref.name), "deleted a load balancer whose service is gone or was recreated");
            Ok(())
        }
        Err(e) if e.is_not_found() => Ok(()),
        Err(source) => Err(SyncError::DeleteLoadBalancer { lb: lb_key, source }),
    }
}

/// What a Service reconcile depends on: not its resourceVersion, nor its status but for the address
/// kube-vip reports.
fn service_fingerprint(svc: &Service) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let m = &svc.metadata;
    let relevant = (
        &m.uid,
        &m.labels,
        &m.annotations,
        &m.finalizers,
        m.deletion_timestamp.as_ref().map(|t| t.0.as_second()),
        serde_json::to_string(&svc.spec).ok(),
        mapping::ingress_ip(svc),
    );
    let mut h = std::collections::hash_map::DefaultHasher::new();
    relevant.hash(&mut h);
    Some(h.finish())
}

/// Waits until both caches have their first list (or `stop`); false when stopped first.
async fn caches_ready(ctx: &Ctx, stop: &CancellationToken) -> bool {
    tokio::select! {
        ready = async {
            ctx.svc_cache.wait_until_ready().await.is_ok()
                && ctx.lb_cache.wait_until_ready().await.is_ok()
        } => ready,
        _ = stop.cancelled() => false,
    }
}

/// Runs the reconciler of guest cluster `cluster` until `stop`.
pub async fn run(ports: Ports, cluster: GuestContext, settings: Settings, stop: CancellationToken) {
    let (svc_cache, svc_writer) = reflector::store::<Service>();
    let (lb_cache, lb_writer) = reflector::store::<LoadBalancer>();
    let (svc_tx, svc_rx) = mpsc::unbounded_channel::<Service>();
    let (wake_tx, wake_rx) = mpsc::unbounded_channel::<ObjectRef<Service>>();
    let (gc_tx, gc_rx) = mpsc::unbounded_channel::<String>();
    let ctx = Arc::new(Ctx {
        services: Api::new(ports.guest.clone()),
        config_maps: Api::new(ports.guest.clone()),
        lbs: lb_api(ports.harvester.clone()),
        svc_cache: svc_cache.clone(),
        lb_cache,
        events: Recorder::start_as(
            ports.guest.clone(),
            COMPONENT,
            &settings.identity,
            settings.prune_events,
            stop.clone(),
        ),
        reported: Mutex::new(HashMap::new()),
        wake: wake_tx.clone(),
        share_index: Mutex::new(ShareIndex::default()),
        accepted: Mutex::new(Accepted::default()),
        share_locks: Mutex::new(HashMap::new()),
        status_forbidden: AtomicBool::new(false),
        backoff: Backoff::default(),
        cluster: cluster.clone(),
    });

    // Services: the cache, the controller's trigger, and the LoadBalancer of one deleted behind the
    // reconciler's back (no finalizer) to garbage-collect.
    let services = {
        let (gc, name, index) = (gc_tx.clone(), cluster.cluster.clone(), ctx.clone());
        reflector::reflector(
            svc_writer,
            watcher::<Service>(ports.guest.clone(), Kind::of::<Service>(), None),
        )
        .take_until(stop.clone().cancelled_owned())
        .inspect(move |e| {
            let woken = match e {
                Ok(WatchEvent::Init) => {
                    *lock(&index.share_index) = ShareIndex::default();
                    Vec::new()
                }
                // The first list reconciles every Service anyway.
                Ok(WatchEvent::InitApply(svc)) => {
                    lock(&index.share_index).update(svc, true);
                    Vec::new()
                }
                Ok(WatchEvent::Apply(svc)) => lock(&index.share_index).update(svc, true),
                Ok(WatchEvent::Delete(svc)) => {
                    if let Some(lb) = lb_name_of(&name, svc) {
                        let _ = gc.send(lb);
                    }
                    lock(&index.share_index).update(svc, false)
                }
                _ => Vec::new(),
            };
            for svc in woken {
                let _ = index.wake.send(svc);
            }
        })
        .applied_objects()
        .predicate_filter(service_fingerprint, PredicateConfig::default())
        .for_each(move |r| {
            if let Ok(svc) = r {
                let _ = svc_tx.send(svc);
            }
            std::future::ready(())
        })
    };

    // This cluster's LoadBalancers: the cache; each change wakes its Service and is looked at by
    // the garbage collector.
    let lbs = {
        let (wake, gc, name) = (wake_tx.clone(), gc_tx, cluster.cluster.clone());
        let mine = cluster.cluster.clone();
        reflector::reflector(
            lb_writer,
            watcher::<LoadBalancer>(
                ports.harvester.clone(),
                lb_kind(),
                Some(cluster.lb_namespace.clone()),
            )
            .filter(move |e| {
                // Only this cluster's (others' stay out of the cache).
                let keep = match e {
                    Ok(WatchEvent::Apply(lb) | WatchEvent::InitApply(lb)) => {
                        service_of(&mine, lb).is_some()
                    }
                    _ => true,
                };
                std::future::ready(keep)
            }),
        )
        .take_until(stop.clone().cancelled_owned())
        .touched_objects()
        .for_each(move |r| {
            if let Ok(lb) = r {
                if let Some(svc) = service_of(&name, &lb) {
                    let _ = wake.send(svc);
                }
                if let Some(n) = lb.metadata.name.clone() {
                    let _ = gc.send(n);
                }
            }
            std::future::ready(())
        })
    };

    // The guest's NAD mapping, kept from the cluster's VMIs: a change of what the guest holds wakes
    // the Services that name a network, so one refused for a network the mapping lacked goes on.
    let nad_sync = {
        let (wake, services) = (wake_tx.clone(), svc_cache.clone());
        nad::run(
            ports.guest.clone(),
            ports.harvester.clone(),
            cluster.clone(),
            move || {
                for svc in services.state() {
                    if annotation(&svc, keys::SVC_NETWORK).is_some_and(|n| !n.is_empty()) {
                        let _ = wake.send(ObjectRef::from_obj(&*svc));
                    }
                }
            },
            stop.clone(),
        )
    };

    let controller = {
        let (ctx, stop) = (ctx.clone(), stop.clone());
        async move {
            // Decisions read both caches (share-IP checks, the LoadBalancer), so nothing is decided
            // on a half-filled one.
            if !caches_ready(&ctx, &stop).await {
                return;
            }
            let shutdown = {
                let stop = stop.clone();
                async move { stop.cancelled().await }
            };
            Controller::for_stream(UnboundedReceiverStream::new(svc_rx).map(Ok), svc_cache)
                .with_config(Config::default().concurrency(settings.concurrency))
                .reconcile_on(UnboundedReceiverStream::new(wake_rx))
                .graceful_shutdown_on(shutdown)
                .run(
                    reconcile,
                    |svc, e: &SyncError, ctx: Arc<Ctx>| {
                        let key = service_key(&svc);
                        if e.is_conflict() {
                            debug!(service = %key, error = %e, "service changed meanwhile; retrying");
                        } else {
                            warn!(service = %key, error = %e, "service reconcile failed");
                        }
                        ctx.backoff.failed(&key, e.is_conflict())
                    },
                    ctx,
                )
                .for_each(|r| {
                    match r {
                        Ok(_) | Err(kube::runtime::controller::Error::ReconcilerFailed(..)) => {}
                        Err(kube::runtime::controller::Error::ObjectNotFound(obj)) => {
                            debug!(object = %obj, "service is gone");
                        }
                        Err(e) => warn!(error = %e, "controller error"),
                    }
                    std::future::ready(())
                })
                .await;
        }
    };

    let gc = {
        let (ctx, stop) = (ctx.clone(), stop.clone());
        async move {
            if !caches_ready(&ctx, &stop).await {
                return;
            }
            let mut requests = std::pin::pin!(
                UnboundedReceiverStream::new(gc_rx).take_until(stop.cancelled_owned())
            );
            while let Some(name) = requests.next().await {
                if let Err(e) = collect(&ctx, &name).await {
                    warn!(lb = %ctx.lb_ref(&name), error = %e, "garbage collection failed");
                }
            }
        }
    };

    info!(cluster = %cluster.cluster, lb_namespace = %cluster.lb_namespace, "guest service reconciler started");
    tokio::join!(
        services.instrument(info_span!("watch", kind = "Service")),
        lbs.instrument(info_span!("watch", kind = "LoadBalancer")),
        controller.instrument(info_span!("controller", kind = "Service")),
        gc.instrument(info_span!("garbage_collector")),
        nad_sync.instrument(info_span!("nad_mapping")),
    );
    debug!(cluster = %cluster.cluster, "guest service reconciler stopped");
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "d4b50d98-39ec-4d88-8098-36579de5db4a";

    fn mk_svc(ns: &str, name: &str, uid: &str, annotations: &[(&str, &str)]) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": name, "uid": uid,
                "annotations": annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]},
        }))
        .expect("service")
    }

    fn mk_ctx() -> GuestContext {
        GuestContext {
            cluster: "test".into(),
            lb_namespace: "default".into(),
            management_network: None,
        }
    }

    fn mk_lb_for(svc: &Service, uid_annotation: Option<&str>) -> LoadBalancer {
        let (plan, _) = judge_primary(svc, &mk_ctx(), None, None).expect("plan");
        let mut lb = new_lb(&plan);
        let annotations = lb.metadata.annotations.get_or_insert_default();
        match uid_annotation {
            Some(u) => annotations.insert(keys::ANNOTATION_SERVICE_UID.into(), u.into()),
            None => annotations.remove(keys::ANNOTATION_SERVICE_UID),
        };
        lb
    }

    #[test]
    fn new_load_balancers_follow_the_plan() {
        let svc = mk_svc(
            "default",
            "abcd",
            UID,
            &[(keys::SVC_NETWORK, "default/vlan1")],
        );
        let (plan, interface) = judge_primary(&svc, &mk_ctx(), None, None).expect("plan");
        assert_eq!(interface, None);
        let lb = new_lb(&plan);
        assert_eq!(
            lb.metadata.name.as_deref(),
            Some("test-default-abcd-7198d990")
        );
        assert_eq!(lb.spec.workload_type, "cluster");
        assert_eq!(lb.spec.ipam, "pool");
        let a = lb.metadata.annotations.clone().expect("annotations");
        assert_eq!(a[keys::ANNOTATION_NETWORK], "default/vlan1");
        assert_eq!(a[keys::ANNOTATION_SERVICE_NETWORK], "default/vlan1");
        assert_eq!(a[keys::ANNOTATION_SERVICE_UID], UID);
        assert!(!a.contains_key(keys::ANNOTATION_MANAGEMENT_NETWORK));
        // Updating with the same plan changes nothing; the create-only annotations are kept.
        let mut same = lb.clone();
        assert!(!update_lb(&mut same, &plan));
        let mut edited = lb.clone();
        edited
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(keys::ANNOTATION_CLUSTER.into(), "other".into());
        assert!(update_lb(&mut edited, &plan));
        assert_eq!(edited, lb);
    }

    #[test]
    fn leftovers() {
        let svc = mk_svc("default", "abcd", UID, &[]);
        let lb = mk_lb_for(&svc, Some(UID));
        assert!(!is_leftover("test", &lb, Some(&svc)));
        assert!(is_leftover("test", &lb, None));
        let recreated = mk_svc("default", "abcd", "another-uid", &[]);
        assert!(is_leftover("test", &lb, Some(&recreated)));
        // An upstream LoadBalancer (no UID annotation) is judged by its name.
        let upstream = mk_lb_for(&svc, None);
        assert!(!is_leftover("test", &upstream, Some(&svc)));
        assert!(is_leftover("test", &upstream, Some(&recreated)));
        assert_eq!(
            service_of("test", &lb),
            Some(ObjectRef::new("abcd").within("default"))
        );
        assert_eq!(service_of("other", &lb), None);
    }

    #[test]
    fn secondaries_are_judged_against_their_primary() {
        let mut primary = mk_svc("default", "p", UID, &[(keys::SVC_NETWORK, "default/vlan1")]);
        primary.status = Some(ServiceStatus {
            load_balancer: Some(ServiceLbStatus {
                ingress: Some(vec![LoadBalancerIngress {
                    ip: Some("10.0.0.5".into()),
                    ..Default::default()
                }]),
            }),
            ..Default::default()
        });
        let secondary = mk_svc("default", "s", "u2", &[(keys::SVC_PRIMARY, "p")]);
        assert_eq!(
            primary_of(&secondary),
            Ok(Some(("default".into(), "p".into())))
        );
        assert_eq!(primary_of(&primary), Ok(None));
        assert_eq!(
            judge_secondary(&secondary, ("default", "p"), None, &[])
                .expect_err("no primary")
                .to_string(),
            "primary service default/p not found"
        );
        // Same port, same protocol as the primary.
        assert!(matches!(
            judge_secondary(&secondary, ("default", "p"), Some(&primary), &[]),
            Err(GuestError::PortInUse { .. })
        ));
        let mut udp = secondary.clone();
        udp.spec
            .as_mut()
            .and_then(|s| s.ports.as_mut())
            .expect("ports")[0]
            .protocol = Some("UDP".into());
        assert_eq!(
            judge_secondary(&udp, ("default", "p"), Some(&primary), &[]),
            Ok("10.0.0.5".into())
        );
        let mut elsewhere = udp.clone();
        elsewhere
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(keys::SVC_NETWORK.into(), "default/vlan2".into());
        assert_eq!(
            judge_secondary(&elsewhere, ("default", "p"), Some(&primary), &[])
                .expect_err("network")
                .to_string(),
            "network annotation of service default/s is not same as the primary service default/p, service: 'default/vlan2', primary: 'default/vlan1'"
        );
    }

    #[test]
    fn the_share_index_wakes_who_depends_on_a_change() {
        let mut index = ShareIndex::default();
        let primary = mk_svc("default", "p", UID, &[]);
        let secondary = mk_svc("default", "s", "u2", &[(keys::SVC_PRIMARY, "p")]);
        assert!(index.update(&primary, true).is_empty());
        assert!(index.update(&secondary, true).is_empty());
        // The primary changes: its secondary wakes.
        assert_eq!(
            index.update(&primary, true),
            [ObjectRef::new("s").within("default")]
        );
        // The secondary goes: the primary (whose deletion may wait for it) wakes.
        assert_eq!(
            index.update(&secondary, false),
            [ObjectRef::new("p").within("default")]
        );
        assert!(index.update(&primary, true).is_empty());
        assert!(index.named_by.is_empty() && index.names.is_empty());
    }

    #[test]
    fn ingress_and_annotations_are_written_only_when_they_change() {
        let mut svc = mk_svc("default", "abcd", UID, &[]);
        assert!(set_ingress(&mut svc, Some("10.0.0.1")));
        assert!(!set_ingress(&mut svc, Some("10.0.0.1")));
        assert_eq!(mapping::ingress_ip(&svc).as_deref(), Some("10.0.0.1"));
        assert!(set_ingress(&mut svc, None));
        assert_eq!(mapping::ingress_ip(&svc), None);
        assert!(set_annotation(&mut svc, keys::KUBE_VIP_IPS, "10.0.0.1"));
        assert!(!set_annotation(&mut svc, keys::KUBE_VIP_IPS, "10.0.0.1"));
        assert!(remove_annotation(&mut svc, keys::KUBE_VIP_IPS));
        assert!(!remove_annotation(&mut svc, keys::KUBE_VIP_IPS));
    }
}
