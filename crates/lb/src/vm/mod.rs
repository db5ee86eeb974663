//! VM load balancers (`workloadType: vm`): once the address is allocated, the part of a
//! LoadBalancer's reconcile upstream's service-LB manager does, in its order:
//!
//! 1. the Service kube-vip announces ([`service`]), created or brought in step;
//! 2. `status.address` from the Service's `status.loadBalancer.ingress` (kube-vip writes it; on a
//!    backend without kube-vip, the embedded store, this reconciler writes it itself); until then
//!    not Ready with `service is waiting for external IP`;
//! 3. the backends the selector picks among the VMIs, their EndpointSlice with the dummy endpoint
//!    ([`endpoints`]), the prober's targets ([`prober`], [`health`]) and `status.backendServers`;
//!    not Ready with upstream's messages when there is no backend, none with an address, or none
//!    probed healthy.
//!
//! Beyond upstream: a backend changing health is an Event (`BackendHealthy`, `BackendUnhealthy`,
//! naming the VMI and the probe's error) and the `BackendsHealthy` condition lists the unhealthy
//! ones; a VMI that stops matching (or goes) wakes the load balancers it was a backend of, so it
//! leaves the slice at once (upstream wakes only those matching its new labels); an HTTP(S) probe;
//! a Service or EndpointSlice someone else changed is put back at once (both are watched); one of
//! that name the load balancer does not own is left alone; deletion removes the EndpointSlice and the
//! Service before the address is released, so kube-vip has stopped announcing it before another load
//! balancer can get it (upstream leaves both to the garbage collector, after the release).
//!
//! With a health check, a backend whose address no VM can have (loopback, link-local, …; see
//! [`prober::address`]) is not probed: it is listed in `status.backendServers` as upstream lists
//! every backend, counts as unhealthy in `BackendsHealthy` with the refusal as its reason, has a
//! `BackendRefused` Event, and is left out of the EndpointSlice (where upstream would put it, not
//! ready). Left in, kube-apiserver refuses the whole slice for a loopback, link-local or unspecified
//! address (`ValidateEndpointIP`), so one guest agent's report would take every backend of the load
//! balancer down; out, the slice is the same on both backends.

pub mod endpoints;
pub mod health;
pub mod prober;
pub mod service;
pub mod vmi;

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::runtime::reflector::{ObjectRef, Store};
use tracing::{debug, info};

use self::{
    endpoints::{Backends, Flip},
    prober::{Health, Prober},
};
use super::{LbCtx, pools::set_condition, refusal::Refusal};
use crate::{
    controller::{
        Target,
        events::{EventType, Recorder},
        modify,
    },
    crd::{LoadBalancer, LoadBalancerStatus, kinds::VirtualMachineInstance},
    ipam::WorkloadType,
    store::{Api, Object, ObjectStore, Preconditions, StoreError},
    sync::lock,
};

/// Ready reasons and Event reasons of VM load balancers (upstream has messages only).
pub mod reason {
    pub(crate) const WAITING_FOR_ADDRESS: &str = "WaitingForExternalIP";
    pub(crate) const NO_BACKENDS: &str = "NoBackendServers";
    pub(crate) const BACKENDS_WITHOUT_ADDRESS: &str = "BackendServersWithoutIP";
    pub(crate) const NONE_HEALTHY: &str = "NoHealthyBackendServers";
    pub(crate) const SERVICE_REFUSED: &str = "ServiceRefused";
    pub(crate) const NOT_OURS: &str = "NameTaken";
    pub(crate) const HEALTH_CHECK_INVALID: &str = "HealthCheckInvalid";
    pub(crate) const BACKEND_HEALTHY: &str = "BackendHealthy";
    pub(crate) const BACKEND_UNHEALTHY: &str = "BackendUnhealthy";
    pub(crate) const BACKEND_REFUSED: &str = "BackendRefused";
    pub(crate) const PROBING: &str = "Probing";
    pub(crate) const ALL_HEALTHY: &str = "AllBackendServersHealthy";
}

/// The condition that says which backends are unhealthy (only with a health check).
pub(crate) const BACKENDS_HEALTHY: &str = "BackendsHealthy";

/// Upstream's messages.
const WAITING_FOR_ADDRESS: &str = "service is waiting for external IP";
const NO_BACKENDS: &str = "no running backend servers";
const BACKENDS_WITHOUT_ADDRESS: &str = "running backend servers have no IP";

/// Fallback re-checks: the watches on Services and VMIs and the prober normally come first.
const ADDRESS_RECHECK: Duration = Duration::from_secs(30);
const CACHE_RECHECK: Duration = Duration::from_secs(1);
const TAKEN_RECHECK: Duration = Duration::from_secs(10);

/// A failed step of a VM load balancer's reconcile (retried with back-off).
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("load balancer {key} has no {field}")]
    MissingField { key: String, field: &'static str },
    #[error("cannot read the Service of load balancer {key}: {source}")]
    GetService { key: String, source: StoreError },
    #[error("cannot write the Service of load balancer {key}: {source}")]
    WriteService { key: String, source: StoreError },
    #[error("cannot write the ingress of the Service of load balancer {key}: {source}")]
    WriteIngress { key: String, source: StoreError },
    #[error("cannot read the EndpointSlice of load balancer {key}: {source}")]
    GetEndpointSlice { key: String, source: StoreError },
    #[error("cannot write the EndpointSlice of load balancer {key}: {source}")]
    WriteEndpointSlice { key: String, source: StoreError },
    #[error("cannot delete the {what} of load balancer {key}: {source}")]
    Delete {
        what: &'static str,
        key: String,
        source: StoreError,
    },
}

impl VmError {
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            VmError::WriteService { source, .. }
                | VmError::WriteIngress { source, .. }
                | VmError::WriteEndpointSlice { source, .. }
                if matches!(source, StoreError::Conflict { .. } | StoreError::AlreadyExists { .. })
        )
    }
}

/// How the VM part of a reconcile ended.
pub enum Outcome {
    Ready,
    Refused(Refusal),
    /// Not decidable yet (the VMI cache has not had its first list): Ready is left as it is.
    Deferred(Duration),
}

/// Which load balancers each VMI is a backend of (selected by, address or not), so that one that
/// stops matching wakes them.
#[derive(Default)]
struct Members {
    by_vmi: HashMap<(String, String), HashSet<ObjectRef<LoadBalancer>>>,
    by_lb: HashMap<ObjectRef<LoadBalancer>, BTreeSet<(String, String)>>,
}

impl Members {
    fn set(&mut self, lb: &ObjectRef<LoadBalancer>, vmis: BTreeSet<(String, String)>) {
        if self.by_lb.get(lb) == Some(&vmis) {
            return;
        }
        self.remove(lb);
        for vmi in &vmis {
            self.by_vmi
                .entry(vmi.clone())
                .or_default()
                .insert(lb.clone());
        }
        if !vmis.is_empty() {
            self.by_lb.insert(lb.clone(), vmis);
        }
    }

    fn remove(&mut self, lb: &ObjectRef<LoadBalancer>) {
        for vmi in self.by_lb.remove(lb).unwrap_or_default() {
            if let Some(lbs) = self.by_vmi.get_mut(&vmi) {
                lbs.remove(lb);
                if lbs.is_empty() {
                    self.by_vmi.remove(&vmi);
                }
            }
        }
    }
}

/// What the VM part of the reconciler shares.
pub struct VmContext {
    pub prober: Prober,
    vmis: Store<VirtualMachineInstance>,
    services: Api<Service>,
    slices: Api<EndpointSlice>,
    /// Write the Services' ingress as kube-vip would (where none runs).
    fill_ingress: bool,
    members: Mutex<Members>,
}

impl VmContext {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        vmis: Store<VirtualMachineInstance>,
        prober: Prober,
        fill_ingress: bool,
    ) -> Self {
        VmContext {
            prober,
            vmis,
            services: Api::new(store.clone()),
            slices: Api::new(store),
            fill_ingress,
            members: Mutex::new(Members::default()),
        }
    }

    /// The VM load balancers a change of `vmi` concerns: those that select it now and those it was
    /// a backend of.
    pub(crate) fn load_balancers_of(
        &self,
        vmi: &VirtualMachineInstance,
        lbs: &Store<LoadBalancer>,
    ) -> Vec<ObjectRef<LoadBalancer>> {
        let key = (
            vmi.metadata.namespace.clone().unwrap_or_default(),
            vmi.metadata.name.clone().unwrap_or_default(),
        );
        let mut out: HashSet<ObjectRef<LoadBalancer>> = lock(&self.members)
            .by_vmi
            .get(&key)
            .cloned()
            .unwrap_or_default();
        for lb in lbs.state() {
            if lb.workload_type() == WorkloadType::Vm
                && lb.metadata.deletion_timestamp.is_none()
                && lb.metadata.namespace == vmi.metadata.namespace
                && endpoints::selects(
                    &lb.spec.backend_server_selector,
                    vmi.metadata.labels.as_ref(),
                )
            {
                out.insert(ObjectRef::from_obj(lb.as_ref()));
            }
        }
        out.into_iter().collect()
    }
}

fn refused(reason: &'static str, message: impl Into<String>, recheck: Option<Duration>) -> Outcome {
    Outcome::Refused(Refusal::new(reason, message.into(), recheck))
}

/// The VM part of `lb`'s reconcile, on the status being built (its address is allocated).
pub(super) async fn ensure(
    lb: &LoadBalancer,
    key: &str,
    status: &mut LoadBalancerStatus,
    ctx: &LbCtx,
) -> Result<Outcome, VmError> {
    let vm = &ctx.vm;
    let lb_ref = ObjectRef::from_obj(lb);
    let uid = lb
        .metadata
        .uid
        .clone()
        .ok_or_else(|| VmError::MissingField {
            key: key.into(),
            field: "metadata.uid",
        })?;
    let namespace = lb.metadata.namespace.clone().unwrap_or_default();
    let settings = match health::settings(lb) {
        Ok(s) => s,
        Err(e) => {
            vm.prober.remove(&lb_ref);
            return Ok(refused(reason::HEALTH_CHECK_INVALID, e.to_string(), None));
        }
    };

    // 1. The Service, and 2. the address kube-vip announces for it.
    let ip = service::requested_ip(lb, &status.allocated_address);
    let svc = match ensure_service(lb, key, &uid, &ip, vm).await? {
        Ok(svc) => svc,
        Err(outcome) => return Ok(outcome),
    };
    let Some(address) = service::ingress_ip(&svc) else {
        status.address.clear();
        return Ok(refused(
            reason::WAITING_FOR_ADDRESS,
            WAITING_FOR_ADDRESS,
            Some(ADDRESS_RECHECK),
        ));
    };
    status.address = address;

    // 3. Backends, their EndpointSlice and their probes.
    if futures::FutureExt::now_or_never(vm.vmis.wait_until_ready()).is_none() {
        return Ok(Outcome::Deferred(CACHE_RECHECK));
    }
    let cached = vm.vmis.state();
    let backends = endpoints::backends(lb, cached.iter().map(|v| v.as_ref()));
    lock(&vm.members).set(
        &lb_ref,
        backends
            .selected
            .iter()
            .map(|n| (namespace.clone(), n.clone()))
            .collect(),
    );
    let mut not_probed = HashSet::new();
    let health = settings.as_ref().map(|s| {
        let addresses: Vec<IpAddr> = backends
            .servers
            .iter()
            .map(|b| IpAddr::V4(b.address))
            .collect();
        for target in vm.prober.set(&lb_ref, &addresses, s) {
            if target.new {
                record_refusal(&ctx.events, lb, key, &backends, &target.refused);
            }
            not_probed.insert(target.refused.ip);
        }
        vm.prober.health(&lb_ref)
    });
    if settings.is_none() {
        vm.prober.remove(&lb_ref);
    }
    // Refused addresses are no endpoints (see the module's documentation).
    let endpoints = Backends {
        servers: backends
            .servers
            .iter()
            .filter(|b| !not_probed.contains(&IpAddr::V4(b.address)))
            .cloned()
            .collect(),
        selected: backends.selected.clone(),
    };
    let ready = match write_slice(lb, key, &uid, &endpoints, health.as_ref(), ctx).await? {
        Ok(ready) => ready,
        Err(outcome) => return Ok(outcome),
    };

    status.backend_servers = backends
        .servers
        .iter()
        .map(|b| b.address.to_string())
        .collect();
    match (&settings, &health) {
        (Some(_), Some(health)) => {
            let (state, why, message) = health_condition(&backends, &ready, health);
            set_condition(
                &mut status.conditions,
                BACKENDS_HEALTHY,
                state,
                why,
                &message,
            );
        }
        _ => status.conditions.retain(|c| c.r#type != BACKENDS_HEALTHY),
    }
    if backends.servers.is_empty() {
        return Ok(if backends.selected.is_empty() {
            refused(reason::NO_BACKENDS, NO_BACKENDS, None)
        } else {
            refused(
                reason::BACKENDS_WITHOUT_ADDRESS,
                BACKENDS_WITHOUT_ADDRESS,
                None,
            )
        });
    }
    if settings.is_some() && ready.is_empty() {
        return Ok(refused(
            reason::NONE_HEALTHY,
            format!(
                "running backend servers are not probed as healthy total:{}, healthy:0",
                backends.servers.len()
            ),
            None,
        ));
    }
    Ok(Outcome::Ready)
}

/// Creates the Service or brings it in step, and (where no kube-vip runs) writes its ingress.
async fn ensure_service(
    lb: &LoadBalancer,
    key: &str,
    uid: &str,
    ip: &str,
    vm: &VmContext,
) -> Result<Result<Service, Outcome>, VmError> {
    let (namespace, name) = (
        lb.metadata.namespace.as_deref().unwrap_or_default(),
        lb.metadata.name.as_deref().unwrap_or_default(),
    );
    let current = vm
        .services
        .get(namespace, name)
        .await
        .map_err(|source| VmError::GetService {
            key: key.into(),
            source,
        })?;
    let written = match current {
        None => vm.services.create(&service::desired(lb, uid, ip)).await,
        Some(svc) if !service::owned_by(&svc.metadata, uid) => {
            return Ok(Err(not_ours("Service", namespace, name)));
        }
        Some(svc) => modify(&vm.services, &svc, Target::Object, |s| {
            service::update(s, lb, ip)
        })
        .await
        .map(|m| m.map_or(svc, |m| m.object)),
    };
    let svc = match written {
        Ok(svc) => svc,
        Err(StoreError::Invalid { reason, .. }) => {
            return Ok(Err(refused(
                reason::SERVICE_REFUSED,
                format!("fail to write service {namespace}/{name}: {reason}"),
                None,
            )));
        }
        Err(source) => {
            return Err(VmError::WriteService {
                key: key.into(),
                source,
            });
        }
    };
    if !vm.fill_ingress {
        return Ok(Ok(svc));
    }
    match modify(&vm.services, &svc, Target::Status, service::announce).await {
        Ok(m) => Ok(Ok(m.map_or(svc, |m| m.object))),
        Err(source) => Err(VmError::WriteIngress {
            key: key.into(),
            source,
        }),
    }
}

fn not_ours(kind: &str, namespace: &str, name: &str) -> Outcome {
    refused(
        reason::NOT_OURS,
        format!(
            "{kind} {namespace}/{name} exists and is not this load balancer's; delete or rename it"
        ),
        Some(TAKEN_RECHECK),
    )
}

/// Writes the EndpointSlice (with an Event per backend that changed health) and returns the
/// addresses of the ready backends, or the refusal to report.
async fn write_slice(
    lb: &LoadBalancer,
    key: &str,
    uid: &str,
    backends: &Backends,
    health: Option<&HashMap<IpAddr, Health>>,
    ctx: &LbCtx,
) -> Result<Result<HashSet<String>, Outcome>, VmError> {
    let vm = &ctx.vm;
    let (namespace, name) = (
        lb.metadata.namespace.clone().unwrap_or_default(),
        lb.metadata.name.clone().unwrap_or_default(),
    );
    let current =
        vm.slices
            .get(&namespace, &name)
            .await
            .map_err(|source| VmError::GetEndpointSlice {
                key: key.into(),
                source,
            })?;
    if current
        .as_ref()
        .is_some_and(|s| !service::owned_by(&s.metadata, uid))
    {
        return Ok(Err(not_ours("EndpointSlice", &namespace, &name)));
    }
    let eps = endpoints::endpoints(lb, backends, current.as_ref(), health);
    let flips = if health.is_some() {
        endpoints::flips(current.as_ref(), &eps)
    } else {
        Vec::new()
    };
    let written = match &current {
        None => vm
            .slices
            .create(&endpoints::desired(lb, uid, eps.clone()))
            .await
            .map(|_| ()),
        Some(slice) => modify(&vm.slices, slice, Target::Object, |s| {
            endpoints::update(s, lb, &eps)
        })
        .await
        .map(|_| ()),
    };
    match written {
        Ok(()) => {}
        Err(StoreError::Invalid { reason, .. }) => {
            return Ok(Err(refused(
                reason::SERVICE_REFUSED,
                format!("fail to write endpointslice {namespace}/{name}: {reason}"),
                None,
            )));
        }
        Err(source) => {
            return Err(VmError::WriteEndpointSlice {
                key: key.into(),
                source,
            });
        }
    }
    for flip in &flips {
        record_flip(&ctx.events, lb, key, flip, health);
    }
    Ok(Ok(eps
        .iter()
        .filter(|ep| !endpoints::is_dummy(ep) && endpoints::is_ready(ep))
        .filter_map(|ep| ep.addresses.first().cloned())
        .collect()))
}

fn record_flip(
    events: &Recorder,
    lb: &LoadBalancer,
    key: &str,
    flip: &Flip,
    health: Option<&HashMap<IpAddr, Health>>,
) {
    let Flip {
        name,
        address,
        ready,
    } = flip;
    if *ready {
        info!(lb = %key, backend = %name, %address, "backend server is healthy");
        events.record(
            lb,
            EventType::Normal,
            reason::BACKEND_HEALTHY,
            format!("backend server {name} ({address}) passed its health check"),
        );
    } else {
        let error = address
            .parse::<IpAddr>()
            .ok()
            .and_then(|ip| health?.get(&ip)?.error.clone())
            .unwrap_or_else(|| "no reason given".into());
        info!(lb = %key, backend = %name, %address, %error, "backend server is unhealthy");
        events.record(
            lb,
            EventType::Warning,
            reason::BACKEND_UNHEALTHY,
            format!("backend server {name} ({address}) failed its health check: {error}"),
        );
    }
}

fn record_refusal(
    events: &Recorder,
    lb: &LoadBalancer,
    key: &str,
    backends: &Backends,
    refused: &prober::Refused,
) {
    let name = backends
        .servers
        .iter()
        .find(|b| IpAddr::V4(b.address) == refused.ip)
        .map_or("", |b| b.name.as_str());
    info!(lb = %key, backend = %name, address = %refused.ip, "backend server refused: {refused}");
    events.record(
        lb,
        EventType::Warning,
        reason::BACKEND_REFUSED,
        format!(
            "backend server {name} ({}) is refused: {refused}",
            refused.ip
        ),
    );
}

/// The `BackendsHealthy` condition: False naming the unhealthy backends, Unknown while some are not
/// probed yet, True when all are healthy.
fn health_condition(
    backends: &Backends,
    ready: &HashSet<String>,
    health: &HashMap<IpAddr, Health>,
) -> (&'static str, &'static str, String) {
    let total = backends.servers.len();
    let mut unhealthy = Vec::new();
    let mut pending = Vec::new();
    for b in &backends.servers {
        let address = b.address.to_string();
        if ready.contains(&address) {
            continue;
        }
        match health.get(&IpAddr::V4(b.address)) {
            Some(Health {
                healthy: Some(false),
                error,
            }) => unhealthy.push(format!(
                "{} ({address}): {}",
                b.name,
                error.as_deref().unwrap_or("failed")
            )),
            _ => pending.push(format!("{} ({address})", b.name)),
        }
    }
    let tally = format!("{}/{total} healthy", ready.len());
    if total == 0 {
        (
            "Unknown",
            reason::NO_BACKENDS,
            "no backend server to probe".into(),
        )
    } else if !unhealthy.is_empty() {
        (
            "False",
            reason::BACKEND_UNHEALTHY,
            format!("{tally}; unhealthy: {}", unhealthy.join("; ")),
        )
    } else if !pending.is_empty() {
        (
            "Unknown",
            reason::PROBING,
            format!("{tally}; not probed yet: {}", pending.join(", ")),
        )
    } else {
        ("True", reason::ALL_HEALTHY, tally)
    }
}

/// Deletion: stop probing, then delete the EndpointSlice and the Service the load balancer owns
/// (tolerating that apply never ran).
pub(super) async fn cleanup(lb: &LoadBalancer, key: &str, ctx: &LbCtx) -> Result<(), VmError> {
    let vm = &ctx.vm;
    let lb_ref = ObjectRef::from_obj(lb);
    vm.prober.remove(&lb_ref);
    lock(&vm.members).remove(&lb_ref);
    let Some(uid) = lb.metadata.uid.as_deref() else {
        return Ok(());
    };
    delete_owned(&vm.slices, lb, uid, "EndpointSlice", key).await?;
    delete_owned(&vm.services, lb, uid, "Service", key).await
}

async fn delete_owned<K: Object>(
    api: &Api<K>,
    lb: &LoadBalancer,
    uid: &str,
    what: &'static str,
    key: &str,
) -> Result<(), VmError> {
    let (namespace, name) = (
        lb.metadata.namespace.as_deref().unwrap_or_default(),
        lb.metadata.name.as_deref().unwrap_or_default(),
    );
    let err = |source| VmError::Delete {
        what,
        key: key.into(),
        source,
    };
    let Some(obj) = api.get(namespace, name).await.map_err(err)? else {
        return Ok(());
    };
    if !service::owned_by(obj.meta(), uid) {
        return Ok(());
    }
    let preconditions = Preconditions {
        uid: obj.meta().uid.clone(),
        resource_version: None,
    };
    match api.delete(namespace, name, &preconditions).await {
        Ok(_) => {
            debug!(lb = %key, what, "deleted");
            Ok(())
        }
        Err(e) if e.is_not_found() => Ok(()),
        Err(source) => Err(err(source)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn mk_backends(names: &[(&str, [u8; 4])]) -> Backends {
        Backends {
            servers: names
                .iter()
                .map(|(n, ip)| endpoints::Backend {
                    name: n.to_string(),
                    uid: format!("uid-{n}"),
                    address: Ipv4Addr::from(*ip),
                })
                .collect(),
            selected: names.iter().map(|(n, _)| n.to_string()).collect(),
        }
    }

    fn mk_lb_ref(name: &str) -> ObjectRef<LoadBalancer> {
        ObjectRef::new(name).within("default")
    }

    #[test]
    fn health_condition_names_the_unhealthy_backends() {
        let b = mk_backends(&[("a", [203, 0, 113, 2]), ("b", [203, 0, 113, 3])]);
        let ready: HashSet<String> = ["203.0.113.2".to_string()].into();
        let mut health: HashMap<IpAddr, Health> = HashMap::new();
        health.insert(
            IpAddr::from([203, 0, 113, 2]),
            Health {
                healthy: Some(true),
                error: None,
            },
        );
        assert_eq!(
            health_condition(&b, &ready, &health),
            (
                "Unknown",
                reason::PROBING,
                "1/2 healthy; not probed yet: b (203.0.113.3)".to_string()
            )
        );
        health.insert(
            IpAddr::from([203, 0, 113, 3]),
            Health {
                healthy: Some(false),
                error: Some("refused".into()),
            },
        );
        assert_eq!(
            health_condition(&b, &ready, &health),
            (
                "False",
                reason::BACKEND_UNHEALTHY,
                "1/2 healthy; unhealthy: b (203.0.113.3): refused".to_string()
            )
        );
        let all: HashSet<String> = ["203.0.113.2".into(), "203.0.113.3".into()].into();
        assert_eq!(
            health_condition(&b, &all, &health),
            ("True", reason::ALL_HEALTHY, "2/2 healthy".to_string())
        );
    }

    #[test]
    fn members_follow_what_each_load_balancer_selected() {
        let mut m = Members::default();
        let (a, b) = (mk_lb_ref("a"), mk_lb_ref("b"));
        let vmi = |n: &str| ("default".to_string(), n.to_string());
        m.set(&a, [vmi("x"), vmi("y")].into());
        m.set(&b, [vmi("y")].into());
        assert_eq!(m.by_vmi[&vmi("y")], [a.clone(), b.clone()].into());
        m.set(&a, [vmi("x")].into());
        assert_eq!(m.by_vmi[&vmi("y")], [b.clone()].into());
        m.remove(&b);
        assert!(!m.by_vmi.contains_key(&vmi("y")));
        m.set(&a, BTreeSet::new());
        assert!(m.by_vmi.is_empty() && m.by_lb.is_empty());
    }
}
