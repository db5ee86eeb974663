//! The Service of a VM load balancer, as upstream makes it: named after the load balancer in its
//! namespace, owned by it (an ownerReference without `controller`), labelled
//! `loadbalancer.harvesterhci.io/servicelb: "true"`, `type: LoadBalancer` without a selector,
//! `spec.loadBalancerIP` the allocated address (`0.0.0.0` for DHCP, which kube-vip reads as "lease
//! one"), and one port per listener (`targetPort` its backend port). kube-vip announces the address
//! and writes `status.loadBalancer.ingress`, which the load balancer's `status.address` follows.
//!
//! An update rewrites only the address and the ports, as upstream's does, but keeps the node ports
//! the API server allocated (upstream's rewrite drops them, so its every pass is a write). Unlike
//! upstream, a Service of that name that the load balancer does not own is left alone.

use k8s_openapi::{
    api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Service, ServicePort, ServiceSpec},
    apimachinery::pkg::{
        apis::meta::v1::{ObjectMeta, OwnerReference},
        util::intstr::IntOrString,
    },
};
use kube::{Resource, runtime::reflector::ObjectRef};

use crate::crd::{
    AllocatedAddress, GROUP, LoadBalancer,
    keys::{DHCP_ADDRESS, LABEL_SERVICE_LB},
};

/// The address the Service asks kube-vip for, given what was allocated.
pub fn requested_ip(lb: &LoadBalancer, allocated: &AllocatedAddress) -> String {
    if lb.is_dhcp() {
        DHCP_ADDRESS.to_string()
    } else {
        allocated.ip.clone()
    }
}

/// The ownerReference of everything the load balancer owns (upstream's four fields).
pub fn owner_reference(lb: &LoadBalancer, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: LoadBalancer::api_version(&()).into_owned(),
        kind: LoadBalancer::kind(&()).into_owned(),
        name: lb.metadata.name.clone().unwrap_or_default(),
        uid: uid.to_string(),
        ..Default::default()
    }
}

/// Whether the object is owned by the load balancer of that UID.
pub fn owned_by(meta: &ObjectMeta, uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == uid && o.kind == LoadBalancer::kind(&()))
}

/// The load balancer owning an object, if one does: what wakes it when its Service or
/// EndpointSlice changes.
pub(crate) fn owner_of(meta: &ObjectMeta) -> Option<ObjectRef<LoadBalancer>> {
    let namespace = meta.namespace.as_deref()?;
    meta.owner_references.iter().flatten().find_map(|o| {
        let group = o.api_version.split_once('/').map(|(g, _)| g);
        (o.kind == LoadBalancer::kind(&()) && group == Some(GROUP))
            .then(|| ObjectRef::new(&o.name).within(namespace))
    })
}

fn ports(lb: &LoadBalancer) -> Vec<ServicePort> {
    lb.spec
        .listeners
        .iter()
        .map(|l| ServicePort {
            name: (!l.name.is_empty()).then(|| l.name.clone()),
            protocol: Some(l.effective_protocol().to_string()),
            port: l.port,
            target_port: Some(IntOrString::Int(l.backend_port)),
            ..Default::default()
        })
        .collect()
}

/// The Service to create, asking for `ip`.
pub fn desired(lb: &LoadBalancer, uid: &str, ip: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: lb.metadata.name.clone(),
            namespace: lb.metadata.namespace.clone(),
            labels: Some([(LABEL_SERVICE_LB.to_string(), "true".to_string())].into()),
            owner_references: Some(vec![owner_reference(lb, uid)]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            load_balancer_ip: Some(ip.to_string()),
            ports: Some(ports(lb)),
            ..Default::default()
        }),
        status: None,
    }
}

/// Brings an existing Service's address and ports in step; `false` when they already are. The node
/// port of a port that stays (same port and protocol) is kept.
pub fn update(svc: &mut Service, lb: &LoadBalancer, ip: &str) -> bool {
    let spec = svc.spec.get_or_insert_default();
    let old = spec.ports.clone().unwrap_or_default();
    let mut want = ports(lb);
    let protocol = |p: &ServicePort| p.protocol.clone().unwrap_or_else(|| "TCP".into());
    for p in &mut want {
        p.node_port = old
            .iter()
            .find(|o| o.port == p.port && protocol(o) == protocol(p))
            .and_then(|o| o.node_port);
    }
    // What the API server fills in (the default protocol) does not count as a difference.
    let same_ports = old.len() == want.len()
        && old.iter().zip(&want).all(|(o, w)| {
            o.name == w.name
                && protocol(o) == protocol(w)
                && o.port == w.port
                && o.target_port == w.target_port
        });
    if spec.load_balancer_ip.as_deref() == Some(ip) && same_ports {
        return false;
    }
    spec.load_balancer_ip = Some(ip.to_string());
    spec.ports = Some(want);
    true
}

/// The first address kube-vip reports, as upstream reads it.
pub fn ingress_ip(svc: &Service) -> Option<String> {
    svc.status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .ip
        .clone()
        .filter(|ip| !ip.is_empty())
}

/// Writes the ingress as kube-vip would, for a backend where none runs; `false` when it already
/// says that. A DHCP address is not leased here, so it gets none.
pub fn announce(svc: &mut Service) -> bool {
    let ip = svc
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_ip.clone())
        .filter(|ip| !ip.is_empty() && ip != DHCP_ADDRESS);
    let Some(ip) = ip else {
        return false;
    };
    let want = Some(LoadBalancerStatus {
        ingress: Some(vec![LoadBalancerIngress {
            ip: Some(ip),
            ..Default::default()
        }]),
    });
    let status = svc.status.get_or_insert_default();
    if status.load_balancer == want {
        return false;
    }
    status.load_balancer = want;
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{Listener, LoadBalancerSpec, LoadBalancerStatus};

    fn mk_lb(ipam: &str, ip: &str, listeners: Vec<Listener>) -> LoadBalancer {
        let mut lb = LoadBalancer::new(
            "lb1",
            LoadBalancerSpec {
                ipam: ipam.into(),
                listeners,
                ..Default::default()
            },
        );
        lb.metadata.namespace = Some("default".into());
        lb.status = Some(LoadBalancerStatus {
            allocated_address: AllocatedAddress {
                ip: ip.into(),
                ..Default::default()
            },
            ..Default::default()
        });
        lb
    }

    fn ip_of(lb: &LoadBalancer) -> String {
        let status = lb.status.clone().unwrap_or_default();
        requested_ip(lb, &status.allocated_address)
    }

    #[test]
    fn the_service_is_upstreams() {
        let lb = mk_lb(
            "pool",
            "192.168.0.10",
            vec![
                Listener::new("http", 80, "TCP", 8080),
                Listener::new("dns", 53, "UDP", 5353),
            ],
        );
        let svc = desired(&lb, "u1", &ip_of(&lb));
        assert_eq!(
            serde_json::to_value(&svc).expect("JSON"),
            serde_json::json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {
                    "name": "lb1", "namespace": "default",
                    "labels": {"loadbalancer.harvesterhci.io/servicelb": "true"},
                    "ownerReferences": [{"apiVersion": "loadbalancer.harvesterhci.io/v1beta1",
                        "kind": "LoadBalancer", "name": "lb1", "uid": "u1"}]
                },
                "spec": {
                    "type": "LoadBalancer", "loadBalancerIP": "192.168.0.10",
                    "ports": [
                        {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080},
                        {"name": "dns", "protocol": "UDP", "port": 53, "targetPort": 5353}
                    ]
                }
            })
        );
        assert!(owned_by(&svc.metadata, "u1"));
        assert!(!owned_by(&svc.metadata, "u2"));
        assert_eq!(
            owner_of(&svc.metadata),
            Some(ObjectRef::new("lb1").within("default"))
        );
        let dhcp = mk_lb(
            "dhcp",
            "0.0.0.0",
            vec![Listener::new("http", 80, "TCP", 8080)],
        );
        assert_eq!(
            desired(&dhcp, "u1", &ip_of(&dhcp))
                .spec
                .and_then(|s| s.load_balancer_ip)
                .as_deref(),
            Some("0.0.0.0")
        );
    }

    #[test]
    fn updates_touch_only_the_address_and_ports_and_keep_node_ports() {
        let lb = mk_lb(
            "pool",
            "192.168.0.10",
            vec![Listener::new("http", 80, "TCP", 8080)],
        );
        let mut svc = desired(&lb, "u1", &ip_of(&lb));
        // As the API server keeps it: defaults and a node port.
        let spec = svc.spec.as_mut().expect("spec");
        spec.cluster_ip = Some("10.96.0.5".into());
        spec.ports.as_mut().expect("ports")[0].node_port = Some(31000);
        svc.metadata.labels = None;
        assert!(!update(&mut svc, &lb, &ip_of(&lb)), "already in step");

        let moved = mk_lb(
            "pool",
            "192.168.0.11",
            vec![
                Listener::new("http", 80, "TCP", 9090),
                Listener::new("https", 443, "TCP", 8443),
            ],
        );
        assert!(update(&mut svc, &moved, &ip_of(&moved)));
        let spec = svc.spec.as_ref().expect("spec");
        assert_eq!(spec.load_balancer_ip.as_deref(), Some("192.168.0.11"));
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.5"));
        let ports = spec.ports.as_ref().expect("ports");
        assert_eq!(ports[0].node_port, Some(31000));
        assert_eq!(ports[0].target_port, Some(IntOrString::Int(9090)));
        assert_eq!(ports[1].node_port, None);
        assert_eq!(svc.metadata.labels, None, "labels are not rewritten");
    }

    #[test]
    fn announcing_fills_the_ingress_once_and_never_for_dhcp() {
        let lb = mk_lb(
            "pool",
            "192.168.0.10",
            vec![Listener::new("http", 80, "TCP", 8080)],
        );
        let mut svc = desired(&lb, "u1", &ip_of(&lb));
        assert_eq!(ingress_ip(&svc), None);
        assert!(announce(&mut svc));
        assert_eq!(ingress_ip(&svc).as_deref(), Some("192.168.0.10"));
        assert!(!announce(&mut svc));
        let dhcp = mk_lb(
            "dhcp",
            "0.0.0.0",
            vec![Listener::new("http", 80, "TCP", 8080)],
        );
        let mut svc = desired(&dhcp, "u1", &ip_of(&dhcp));
        assert!(!announce(&mut svc));
        assert_eq!(ingress_ip(&svc), None);
    }
}
