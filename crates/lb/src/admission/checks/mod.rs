//! The checks of upstream's LoadBalancer and IPPool webhooks as pure functions of the object and
//! what they read, with upstream's messages: listener and health-check rules, the guest-cluster
//! check, IPAM and workload-type changes, findNetwork and the LoadBalancer mutator. (An IPPool's
//! ranges and scope are checked by [`crate::ipam::admission`], its network by [`super::network`].)

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Namespace;

use crate::{
    crd::{
        LoadBalancer,
        keys::{
            ANNOTATION_CLUSTER, ANNOTATION_DHCP_HOSTNAME, ANNOTATION_DHCP_LEASED_IP,
            ANNOTATION_DHCP_MAC, ANNOTATION_DHCP_RETAINED_UNTIL, ANNOTATION_MANAGEMENT_NETWORK,
            ANNOTATION_NAMESPACE, ANNOTATION_NETWORK, ANNOTATION_PROJECT, LABEL_CREATOR,
            LABEL_GUEST_CLUSTER, LABEL_GUEST_CLUSTER_NAME, NODE_DRIVER,
        },
        kinds::{VirtualMachine, VirtualMachineInstance},
    },
    vm::health::MAX_PERIOD_SECONDS,
};

/// The largest port number.
const MAX_PORT: i32 = 65535;
/// Rancher's annotation of a namespace: its project, `c-xxxxx:p-xxxxx`.
const PROJECT_ID_ANNOTATION: &str = "field.cattle.io/projectId";

/// Why a LoadBalancer is refused; the texts are the upstream webhook's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LbRejection {
    #[error("the loadbalancer needs to have at least one listener")]
    NoListener,
    #[error("listener has duplicate name {name}")]
    DuplicateName { name: String },
    #[error("listener {listener} has duplicate port {key} with listener {other}")]
    DuplicatePort {
        listener: String,
        key: String,
        other: String,
    },
    #[error("listener {listener} has duplicate backend port {key} with listener {other}")]
    DuplicateBackendPort {
        listener: String,
        key: String,
        other: String,
    },
    #[error("listener {listener} has protocol {protocol:?}, which is not TCP, UDP or SCTP")]
    Protocol { listener: String, protocol: String },
    #[error("listener port {port} must <= {MAX_PORT}")]
    PortTooLarge { port: i32 },
    #[error("listener port {port} must >= 1")]
    PortTooSmall { port: i32 },
    #[error("listener backend port {port} must <= {MAX_PORT}")]
    BackendPortTooLarge { port: i32 },
    #[error("listener backend port {port} must >= 1")]
    BackendPortTooSmall { port: i32 },
    #[error("healthcheck SuccessThreshold should > 0")]
    SuccessThreshold,
    #[error("healthcheck FailureThreshold should > 0")]
    FailureThreshold,
    #[error("healthcheck PeriodSeconds should > 0")]
    PeriodSeconds,
    #[error("healthcheck TimeoutSeconds should > 0")]
    TimeoutSeconds,
    /// Ours: the prober's bounds (see [`crate::vm::health`]).
    #[error("healthcheck PeriodSeconds {value} should <= {MAX_PERIOD_SECONDS}")]
    PeriodTooLong { value: u64 },
    #[error("healthcheck TimeoutSeconds {timeout} should <= PeriodSeconds {period}")]
    TimeoutOverPeriod { timeout: u64, period: u64 },
    #[error("healthcheck port {port} can only be a TCP backend port")]
    HealthCheckNotTcp { port: u64 },
    #[error("healthcheck port {port} is not in listener backend port list")]
    HealthCheckPortUnknown { port: u64 },
    /// Ours: the HTTP(S) health-check annotations cannot be run.
    #[error("{reason}")]
    HealthCheckHttp { reason: String },
    /// Ours: the requested address or family annotations are not usable.
    #[error("{reason}")]
    AddressRequest { reason: String },
    /// Ours: the carried Service labels (`cloudprovider.harvesterhci.io/serviceLabels`) do not read.
    #[error("{reason}")]
    ServiceLabels { reason: String },
    /// Ours: the DHCP lease record of a guest Service's LoadBalancer is not one kube-vip could
    /// lease with, or is on a load balancer that is not DHCP.
    #[error("{reason}")]
    DhcpRecord { reason: String },
    #[error("can't change the IPAM from {old} to {new}")]
    IpamChange { old: String, new: String },
    #[error("can't change the WorkloadType from {old} to {new}")]
    WorkloadTypeChange { old: String, new: String },
    #[error("the vm {namespace}/{vm} shows guest cluster {cluster} is being removed")]
    GuestClusterRemoving {
        namespace: String,
        vm: String,
        cluster: String,
    },
}

/// A refused LoadBalancer create or update, wrapped as upstream wraps it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LbAdmissionError {
    #[error("create loadbalancer {namespace}/{name} failed: {source}")]
    Create {
        namespace: String,
        name: String,
        source: Box<LbRejection>,
    },
    #[error("create loadbalancer {namespace}/{name} failed with healthyCheck: {source}")]
    CreateHealthCheck {
        namespace: String,
        name: String,
        source: Box<LbRejection>,
    },
    #[error("create loadbalancer {namespace}/{name} failed with guest cluster check: {source}")]
    CreateGuestCluster {
        namespace: String,
        name: String,
        source: Box<LbRejection>,
    },
    #[error("update loadbalancer {namespace}/{name} failed: {source}")]
    Update {
        namespace: String,
        name: String,
        source: Box<LbRejection>,
    },
    #[error("update loadbalancer {namespace}/{name} failed with healthyCheck: {source}")]
    UpdateHealthCheck {
        namespace: String,
        name: String,
        source: Box<LbRejection>,
    },
}

fn ids(lb: &LoadBalancer) -> (String, String) {
    (
        lb.metadata.namespace.clone().unwrap_or_default(),
        lb.metadata.name.clone().unwrap_or_default(),
    )
}

pub(super) fn is_cluster(lb: &LoadBalancer) -> bool {
    lb.spec.workload_type == "cluster"
}

/// Listener rules; a cluster-type load balancer may have none (its load balancing is in the guest).
pub(crate) fn check_listeners(lb: &LoadBalancer) -> Result<(), LbRejection> {
    if is_cluster(lb) {
        return Ok(());
    }
    let listeners = &lb.spec.listeners;
    if listeners.is_empty() {
        return Err(LbRejection::NoListener);
    }
    let mut names = std::collections::HashSet::new();
    let mut ports: HashMap<String, usize> = HashMap::new();
    let mut backends: HashMap<String, usize> = HashMap::new();
    for (i, l) in listeners.iter().enumerate() {
        if !names.insert(l.name.as_str()) {
            return Err(LbRejection::DuplicateName {
                name: l.name.clone(),
            });
        }
        // The key of an empty protocol is TCP's: two such listeners on one port would be one
        // Service port twice, which the API server refuses when the Service is made.
        let key = format!("{}:{}", l.effective_protocol(), l.port);
        if let Some(&other) = ports.get(&key) {
            return Err(LbRejection::DuplicatePort {
                listener: l.name.clone(),
                key,
                other: listeners[other].name.clone(),
            });
        }
        ports.insert(key, i);
        let key = format!("{}:{}", l.effective_protocol(), l.backend_port);
        if let Some(&other) = backends.get(&key) {
            return Err(LbRejection::DuplicateBackendPort {
                listener: l.name.clone(),
                key,
                other: listeners[other].name.clone(),
            });
        }
        backends.insert(key, i);
    }
    // Upstream's port checks first, in its order (pkg/webhook/loadbalancer/validator.go,
    // checkListeners), so what upstream refuses is refused in its words.
    for l in listeners {
        if l.port > MAX_PORT {
            return Err(LbRejection::PortTooLarge { port: l.port });
        }
        if l.port < 1 {
            return Err(LbRejection::PortTooSmall { port: l.port });
        }
        if l.backend_port > MAX_PORT {
            return Err(LbRejection::BackendPortTooLarge {
                port: l.backend_port,
            });
        }
        if l.backend_port < 1 {
            return Err(LbRejection::BackendPortTooSmall {
                port: l.backend_port,
            });
        }
    }
    // Upstream accepts any string here and its Service for the load balancer then fails to be
    // created: refused up front instead, with the protocols a Service takes. Empty is TCP.
    for l in listeners {
        if !matches!(l.effective_protocol(), "TCP" | "UDP" | "SCTP") {
            return Err(LbRejection::Protocol {
                listener: l.name.clone(),
                protocol: l.protocol.clone(),
            });
        }
    }
    Ok(())
}

/// Health-check rules (VM type, port set), as upstream's checkHealthyCheck: the listeners are walked
/// in order and the first TCP one whose backend port is the health-check port decides (its
/// thresholds must be positive), so a UDP listener on that port before it does not matter. Only
/// when no TCP listener has that backend port is the port refused: as not TCP if some other
/// listener has it, else as unknown.
pub(crate) fn check_health_check(lb: &LoadBalancer) -> Result<(), LbRejection> {
    if is_cluster(lb) {
        return Ok(());
    }
    let Some(hc) = lb.spec.health_check.as_ref().filter(|hc| hc.port != 0) else {
        return Ok(());
    };
    let mut wrong_protocol = false;
    for l in &lb.spec.listeners {
        if u64::try_from(l.backend_port).ok() != Some(hc.port) {
            continue;
        }
        if l.effective_protocol() == "TCP" {
            return match () {
                _ if hc.success_threshold == 0 => Err(LbRejection::SuccessThreshold),
                _ if hc.failure_threshold == 0 => Err(LbRejection::FailureThreshold),
                _ if hc.period_seconds == 0 => Err(LbRejection::PeriodSeconds),
                _ if hc.timeout_seconds == 0 => Err(LbRejection::TimeoutSeconds),
                _ => crate::vm::health::check_of(lb.metadata.annotations.as_ref())
                    .map(|_| ())
                    .map_err(|e| LbRejection::HealthCheckHttp {
                        reason: e.to_string(),
                    }),
            };
        }
        wrong_protocol = true;
    }
    Err(if wrong_protocol {
        LbRejection::HealthCheckNotTcp { port: hc.port }
    } else {
        LbRejection::HealthCheckPortUnknown { port: hc.port }
    })
}

/// Ours: the bounds of a health check's durations, after [`check_health_check`] passed. On update
/// they are checked only when the health check changes, as Kubernetes ratchets a tightened rule: an
/// object stored before the bounds (which the prober clamps) can still be written, e.g. by the
/// reconciler, until someone edits its health check.
pub(crate) fn check_health_check_bounds(lb: &LoadBalancer) -> Result<(), LbRejection> {
    if is_cluster(lb) {
        return Ok(());
    }
    let Some(hc) = lb.spec.health_check.as_ref().filter(|hc| hc.port != 0) else {
        return Ok(());
    };
    if hc.period_seconds > MAX_PERIOD_SECONDS {
        return Err(LbRejection::PeriodTooLong {
            value: hc.period_seconds,
        });
    }
    if hc.timeout_seconds > hc.period_seconds {
        return Err(LbRejection::TimeoutOverPeriod {
            timeout: hc.timeout_seconds,
            period: hc.period_seconds,
        });
    }
    Ok(())
}

/// The guest-cluster check of a new cluster-type load balancer: refused while a VM of its cluster (in
/// its namespace) is marked for removal. `vms` are the VMs of the load balancer's namespace.
pub(crate) fn check_guest_cluster(
    lb: &LoadBalancer,
    vms: &[VirtualMachine],
) -> Result<(), LbRejection> {
    if !is_cluster(lb) {
        return Ok(());
    }
    let cluster = lb
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_GUEST_CLUSTER))
        .map(String::as_str)
        .unwrap_or_default();
    if cluster.is_empty() || cluster == "kubernetes" {
        return Ok(());
    }
    let namespace = lb.metadata.namespace.as_deref().unwrap_or_default();
    match vms.iter().find(|vm| {
        vm.metadata.namespace.as_deref() == Some(namespace)
            && vm.guest_cluster() == Some(cluster)
            && vm.guest_cluster_removing()
    }) {
        Some(vm) => Err(LbRejection::GuestClusterRemoving {
            namespace: namespace.into(),
            vm: vm.metadata.name.clone().unwrap_or_default(),
            cluster: cluster.into(),
        }),
        None => Ok(()),
    }
}

/// Ours: `loadbalancer.harvesterhci.io/requestedIP` and `…/ipFamily` must parse and agree, and a
/// DHCP load balancer cannot ask for an address (the guest's DHCP server chooses it).
pub(crate) fn check_address_request(lb: &LoadBalancer) -> Result<(), LbRejection> {
    let (requested, _) = lb
        .address_request()
        .map_err(|reason| LbRejection::AddressRequest { reason })?;
    if let Some(ip) = requested
        && lb.is_dhcp()
    {
        return Err(LbRejection::AddressRequest {
            reason: format!("requested address {ip} needs pool IPAM, and spec.ipam is dhcp"),
        });
    }
    Ok(())
}

/// Ours: the Service labels the cloud provider carries for pools' service selectors must read as a
/// JSON object of strings.
pub(crate) fn check_service_labels(lb: &LoadBalancer) -> Result<(), LbRejection> {
    lb.selector_labels()
        .map(|_| ())
        .map_err(|reason| LbRejection::ServiceLabels { reason })
}

/// Ours: the DHCP lease record the guest cloud provider keeps on a LoadBalancer
/// (`cloudprovider.harvesterhci.io/dhcp…`, [`crate::crd::dhcp`]) must be what kube-vip can lease
/// with, since the guest writes it back for kube-vip, and only a DHCP load balancer has one.
pub(crate) fn check_dhcp_record(lb: &LoadBalancer) -> Result<(), LbRejection> {
    let annotations = lb.metadata.annotations.clone().unwrap_or_default();
    crate::crd::dhcp::record_of(&annotations)
        .map_err(|reason| LbRejection::DhcpRecord { reason })?;
    let recorded = [
        ANNOTATION_DHCP_MAC,
        ANNOTATION_DHCP_LEASED_IP,
        ANNOTATION_DHCP_HOSTNAME,
        ANNOTATION_DHCP_RETAINED_UNTIL,
    ]
    .into_iter()
    .find(|k| annotations.get(*k).is_some_and(|v| !v.is_empty()));
    match recorded {
        Some(key) if !lb.is_dhcp() => Err(LbRejection::DhcpRecord {
            reason: format!("annotation {key} is a DHCP lease record, and spec.ipam is not dhcp"),
        }),
        _ => Ok(()),
    }
}

/// The validating webhook on create.
pub fn validate_lb_create(
    lb: &LoadBalancer,
    vms: &[VirtualMachine],
) -> Result<(), LbAdmissionError> {
    let (namespace, name) = ids(lb);
    check_listeners(lb)
        .and_then(|()| check_address_request(lb))
        .and_then(|()| check_service_labels(lb))
        .and_then(|()| check_dhcp_record(lb))
        .map_err(|source| LbAdmissionError::Create {
            namespace: namespace.clone(),
            name: name.clone(),
            source: Box::new(source),
        })?;
    check_health_check(lb)
        .and_then(|()| check_health_check_bounds(lb))
        .map_err(|source| LbAdmissionError::CreateHealthCheck {
            namespace: namespace.clone(),
            name: name.clone(),
            source: Box::new(source),
        })?;
    check_guest_cluster(lb, vms).map_err(|source| LbAdmissionError::CreateGuestCluster {
        namespace,
        name,
        source: Box::new(source),
    })
}

/// The validating webhook on update; objects being deleted are not checked.
pub fn validate_lb_update(old: &LoadBalancer, new: &LoadBalancer) -> Result<(), LbAdmissionError> {
    if new.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let (namespace, name) = ids(new);
    let update = |source| LbAdmissionError::Update {
        namespace: namespace.clone(),
        name: name.clone(),
        source: Box::new(source),
    };
    check_listeners(new)
        .and_then(|()| check_address_request(new))
        .and_then(|()| check_service_labels(new))
        .and_then(|()| check_dhcp_record(new))
        .map_err(update)?;
    let changed = old.spec.health_check != new.spec.health_check;
    check_health_check(new)
        .and_then(|()| {
            if changed {
                check_health_check_bounds(new)
            } else {
                Ok(())
            }
        })
        .map_err(|source| LbAdmissionError::UpdateHealthCheck {
            namespace: namespace.clone(),
            name: name.clone(),
            source: Box::new(source),
        })?;
    let (old_ipam, new_ipam) = (&old.spec.ipam, &new.spec.ipam);
    if (old_ipam == "dhcp") != (new_ipam == "dhcp") {
        return Err(update(LbRejection::IpamChange {
            old: old_ipam.clone(),
            new: new_ipam.clone(),
        }));
    }
    let (old_type, new_type) = (&old.spec.workload_type, &new.spec.workload_type);
    if (old_type == "cluster") != (new_type == "cluster") {
        return Err(update(LbRejection::WorkloadTypeChange {
            old: old_type.clone(),
            new: new_type.clone(),
        }));
    }
    Ok(())
}

/// Upstream's findNetwork (v1.9): the LoadBalancer's network annotation, else the guest cluster's
/// management network, else the first Multus network of a VMI of its guest cluster (by label, then
/// by the legacy name prefix of a node-driver VMI). `vmis` are the VMIs of the load balancer's
/// namespace.
pub(crate) fn find_network(lb: &LoadBalancer, vmis: &[VirtualMachineInstance]) -> String {
    match named_network(lb) {
        Named::Network(n) => n,
        Named::Discover(cluster) => discover_network(&cluster, vmis),
    }
}

/// What a LoadBalancer's annotations say of its network, before any VMI is looked at.
pub(crate) enum Named {
    /// The network, or "" when it cannot be discovered (no cluster-name annotation).
    Network(String),
    /// To be found among the VMIs of this guest cluster.
    Discover(String),
}

/// Upstream's order: the network annotation, then the management network one; without either, the
/// cluster-name annotation says which VMIs to look at. Upstream lists VMIs only in that last case,
/// and so do we: a status write of a load balancer that names its network reads nothing.
pub(crate) fn named_network(lb: &LoadBalancer) -> Named {
    let get = |k: &str| {
        lb.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .filter(|v| !v.is_empty())
            .cloned()
    };
    if let Some(n) = get(ANNOTATION_NETWORK).or_else(|| get(ANNOTATION_MANAGEMENT_NETWORK)) {
        return Named::Network(n);
    }
    match get(ANNOTATION_CLUSTER) {
        Some(cluster) => Named::Discover(cluster),
        None => Named::Network(String::new()),
    }
}

fn discover_network(cluster: &str, vmis: &[VirtualMachineInstance]) -> String {
    let first_network = |pred: &dyn Fn(&VirtualMachineInstance) -> bool| {
        vmis.iter()
            .filter(|v| pred(v))
            .find_map(|v| v.first_multus_network().map(String::from))
    };
    first_network(&|v| v.label(LABEL_GUEST_CLUSTER_NAME) == Some(cluster))
        .or_else(|| {
            first_network(&|v| {
                v.label(LABEL_CREATOR) == Some(NODE_DRIVER)
                    && v.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with(cluster))
            })
        })
        .unwrap_or_default()
}

/// Upstream's mutator: VM type records its namespace; cluster type also gets its project (from the
/// namespace, when known) and network; health-check thresholds left at zero get their defaults.
pub fn mutate_lb(
    lb: &mut LoadBalancer,
    namespace: Option<&Namespace>,
    vmis: &[VirtualMachineInstance],
) {
    if lb.metadata.deletion_timestamp.is_some() {
        return;
    }
    let lb_namespace = lb.metadata.namespace.clone().unwrap_or_default();
    let network = is_cluster(lb).then(|| find_network(lb, vmis));
    let annotations = lb.metadata.annotations.get_or_insert_default();
    annotations.insert(ANNOTATION_NAMESPACE.into(), lb_namespace);
    if let Some(network) = network {
        if let Some(ns) = namespace {
            let project = ns
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(PROJECT_ID_ANNOTATION))
                .map(|p| p.replacen(':', "/", 1))
                .unwrap_or_default();
            annotations.insert(ANNOTATION_PROJECT.into(), project);
        }
        annotations.insert(ANNOTATION_NETWORK.into(), network);
    }
    if let Some(hc) = lb.spec.health_check.as_mut().filter(|hc| hc.port != 0) {
        for (field, default) in [
            (&mut hc.success_threshold, 2),
            (&mut hc.failure_threshold, 2),
            (&mut hc.period_seconds, 1),
            (&mut hc.timeout_seconds, 1),
        ] {
            if *field == 0 {
                *field = default;
            }
        }
    }
}

#[cfg(test)]
mod tests;
