//! A VM load balancer's backends and its EndpointSlice, as upstream chooses and writes them.
//!
//! Backends are the VirtualMachineInstances of the load balancer's namespace that
//! `spec.backendServerSelector` selects (each key an `In` requirement, all ANDed; an empty selector
//! selects nothing) and that are not being deleted; one counts through the first of its
//! `status.interfaces` whose `ipAddress` (KubeVirt's primary address of the interface, the first of
//! its `ipAddresses`) is IPv4, as upstream's `GetAddress` reads it. The EndpointSlice has the Service's name, owner and label plus
//! `kubernetes.io/service-name`, `addressType: IPv4`, one port per listener (the backend port) and
//! one endpoint per backend (`targetRef` the VMI). An endpoint that was there keeps its `ready`
//! condition until the prober decides otherwise; a new one starts not ready; with no health check
//! every one is ready. When no real endpoint is ready, upstream's dummy endpoint (a ready
//! `10.52.0.255`) keeps kube-proxy from sending the traffic to the node itself.
//!
//! Upstream writes the slice, then adds or removes the dummy in a second write (and drops it again
//! in the next pass's first); here the slice is computed whole and written once.

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, Ipv4Addr},
};

use k8s_openapi::{
    api::{
        core::v1::ObjectReference,
        discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde_json::Value;

use super::{prober::Health, service::owner_reference};
use crate::crd::{
    LoadBalancer,
    keys::{LABEL_SERVICE_LB, LABEL_SERVICE_NAME_K8S},
    kinds::VirtualMachineInstance,
};

/// Upstream's dummy endpoint: its address and the UID of its `targetRef`.
pub const DUMMY_ADDRESS: &str = "10.52.0.255";
pub(crate) const DUMMY_UID: &str = "dummy347-546a-4642-9da6-5608endpoint";

/// One backend: a selected VMI with an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    pub name: String,
    pub uid: String,
    pub address: Ipv4Addr,
}

/// The selected VMIs: the names of all, and those with an address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Backends {
    pub servers: Vec<Backend>,
    pub selected: Vec<String>,
}

/// Whether `selector` selects an object with `labels`.
pub fn selects(
    selector: &BTreeMap<String, Vec<String>>,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    !selector.is_empty()
        && selector.iter().all(|(key, values)| {
            labels
                .and_then(|l| l.get(key))
                .is_some_and(|v| values.contains(v))
        })
}

/// The address a VMI serves on: the first interface's `ipAddress` that is IPv4. Upstream reads that
/// field only (`VirtualMachineInstanceNetworkInterface.IP`), not the rest of `ipAddresses`: an
/// interface whose primary address is IPv6 does not count, whatever else it has.
pub fn address(vmi: &VirtualMachineInstance) -> Option<Ipv4Addr> {
    vmi.pointer("/status/interfaces")?
        .as_array()?
        .iter()
        .find_map(|i| i.get("ipAddress").and_then(Value::as_str)?.parse().ok())
}

/// Whether `lb` would take `vmi` as a backend (address aside).
pub fn selected(lb: &LoadBalancer, vmi: &VirtualMachineInstance) -> bool {
    vmi.metadata.namespace == lb.metadata.namespace
        && vmi.metadata.deletion_timestamp.is_none()
        && selects(
            &lb.spec.backend_server_selector,
            vmi.metadata.labels.as_ref(),
        )
}

/// The backends of `lb` among `vmis`, by VMI name.
pub fn backends<'a>(
    lb: &LoadBalancer,
    vmis: impl IntoIterator<Item = &'a VirtualMachineInstance>,
) -> Backends {
    let mut out = Backends::default();
    for vmi in vmis.into_iter().filter(|v| selected(lb, v)) {
        let name = vmi.metadata.name.clone().unwrap_or_default();
        out.selected.push(name.clone());
        if let Some(address) = address(vmi) {
            out.servers.push(Backend {
                name,
                uid: vmi.metadata.uid.clone().unwrap_or_default(),
                address,
            });
        }
    }
    out.servers.sort_by(|a, b| a.name.cmp(&b.name));
    out.selected.sort();
    out
}

pub(crate) fn is_dummy(ep: &Endpoint) -> bool {
    ep.target_ref
        .as_ref()
        .is_some_and(|t| t.uid.as_deref() == Some(DUMMY_UID))
}

pub fn is_ready(ep: &Endpoint) -> bool {
    ep.conditions.as_ref().and_then(|c| c.ready) == Some(true)
}

fn dummy(lb: &LoadBalancer) -> Endpoint {
    Endpoint {
        addresses: vec![DUMMY_ADDRESS.into()],
        target_ref: Some(ObjectReference {
            namespace: lb.metadata.namespace.clone(),
            name: lb.metadata.name.clone(),
            uid: Some(DUMMY_UID.into()),
            ..Default::default()
        }),
        conditions: Some(EndpointConditions {
            ready: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The endpoint of `server` in `slice`, if it has one (same VMI, same address).
fn existing<'a>(slice: Option<&'a EndpointSlice>, server: &Backend) -> Option<&'a Endpoint> {
    let address = server.address.to_string();
    slice?.endpoints.iter().find(|ep| {
        ep.addresses == [address.as_str()]
            && ep
                .target_ref
                .as_ref()
                .is_some_and(|t| t.uid.as_deref() == Some(server.uid.as_str()))
    })
}

/// The endpoints the slice should hold. `health`: what the prober knows, by address; `None` when the
/// health check is off.
pub fn endpoints(
    lb: &LoadBalancer,
    backends: &Backends,
    current: Option<&EndpointSlice>,
    health: Option<&HashMap<IpAddr, Health>>,
) -> Vec<Endpoint> {
    let mut out: Vec<Endpoint> = backends
        .servers
        .iter()
        .map(|server| {
            let mut ep = existing(current, server)
                .cloned()
                .unwrap_or_else(|| Endpoint {
                    addresses: vec![server.address.to_string()],
                    target_ref: Some(ObjectReference {
                        namespace: lb.metadata.namespace.clone(),
                        name: Some(server.name.clone()),
                        uid: Some(server.uid.clone()),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
            let kept = is_ready(&ep);
            let ready = match health {
                None => true,
                Some(h) => h
                    .get(&IpAddr::V4(server.address))
                    .and_then(|h| h.healthy)
                    .unwrap_or(kept),
            };
            ep.conditions.get_or_insert_default().ready = Some(ready);
            ep
        })
        .collect();
    if !out.iter().any(is_ready) {
        out.push(dummy(lb));
    }
    out
}

/// Real endpoints that are ready.
pub fn ready_count(endpoints: &[Endpoint]) -> usize {
    endpoints
        .iter()
        .filter(|ep| !is_dummy(ep) && is_ready(ep))
        .count()
}

/// A backend whose endpoint changed its `ready` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Flip {
    pub name: String,
    pub address: String,
    pub ready: bool,
}

/// The endpoints of `next` that were in `current` with the other `ready` value.
pub(crate) fn flips(current: Option<&EndpointSlice>, next: &[Endpoint]) -> Vec<Flip> {
    let Some(current) = current else {
        return Vec::new();
    };
    next.iter()
        .filter(|ep| !is_dummy(ep))
        .filter_map(|ep| {
            let uid = ep.target_ref.as_ref()?.uid.as_deref()?;
            let before = current.endpoints.iter().find(|old| {
                old.addresses == ep.addresses
                    && old.target_ref.as_ref().and_then(|t| t.uid.as_deref()) == Some(uid)
            })?;
            (is_ready(before) != is_ready(ep)).then(|| Flip {
                name: ep
                    .target_ref
                    .as_ref()
                    .and_then(|t| t.name.clone())
                    .unwrap_or_default(),
                address: ep.addresses.first().cloned().unwrap_or_default(),
                ready: is_ready(ep),
            })
        })
        .collect()
}

fn ports(lb: &LoadBalancer) -> Vec<EndpointPort> {
    lb.spec
        .listeners
        .iter()
        .map(|l| EndpointPort {
            name: Some(l.name.clone()),
            protocol: Some(l.effective_protocol().to_string()),
            port: Some(l.backend_port),
            ..Default::default()
        })
        .collect()
}

/// The EndpointSlice to create.
pub fn desired(lb: &LoadBalancer, uid: &str, endpoints: Vec<Endpoint>) -> EndpointSlice {
    let name = lb.metadata.name.clone().unwrap_or_default();
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: lb.metadata.namespace.clone(),
            labels: Some(
                [
                    (LABEL_SERVICE_LB.to_string(), "true".to_string()),
                    (LABEL_SERVICE_NAME_K8S.to_string(), name),
                ]
                .into(),
            ),
            owner_references: Some(vec![owner_reference(lb, uid)]),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints,
        ports: Some(ports(lb)),
    }
}

/// Brings an existing slice's ports and endpoints in step; `false` when they already are.
pub fn update(slice: &mut EndpointSlice, lb: &LoadBalancer, endpoints: &[Endpoint]) -> bool {
    let ports = Some(ports(lb));
    if slice.ports == ports && slice.endpoints == endpoints {
        return false;
    }
    slice.ports = ports;
    slice.endpoints = endpoints.to_vec();
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{Listener, LoadBalancerSpec};

    fn mk_lb(selector: &[(&str, &[&str])]) -> LoadBalancer {
        let mut lb = LoadBalancer::new(
            "lb1",
            LoadBalancerSpec {
                listeners: vec![Listener::new("http", 80, "TCP", 8080)],
                backend_server_selector: selector
                    .iter()
                    .map(|(k, vs)| (k.to_string(), vs.iter().map(|v| v.to_string()).collect()))
                    .collect(),
                ..Default::default()
            },
        );
        lb.metadata.namespace = Some("default".into());
        lb
    }

    fn mk_vmi(name: &str, labels: &[(&str, &str)], ips: &[&str]) -> VirtualMachineInstance {
        let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
        let interfaces: Vec<Value> = ips
            .iter()
            .map(|ip| serde_json::json!({"name": "default", "ipAddress": ip, "ipAddresses": [ip]}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                         "labels": labels},
            "status": {"interfaces": interfaces}
        }))
        .expect("a VMI")
    }

    fn mk_health(pairs: &[(&str, Option<bool>)]) -> HashMap<IpAddr, Health> {
        pairs
            .iter()
            .map(|(ip, healthy)| {
                (
                    ip.parse().expect("ip"),
                    Health {
                        healthy: *healthy,
                        error: None,
                    },
                )
            })
            .collect()
    }

    fn ready_of(eps: &[Endpoint]) -> Vec<(String, bool)> {
        eps.iter()
            .map(|e| (e.addresses[0].clone(), is_ready(e)))
            .collect()
    }

    #[test]
    fn selection_is_upstreams() {
        let lb = mk_lb(&[("app", &["web", "api"]), ("tier", &["front"])]);
        let mut deleting = mk_vmi("e", &[("app", "web"), ("tier", "front")], &["10.0.0.5"]);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        let mut elsewhere = mk_vmi("f", &[("app", "web"), ("tier", "front")], &["10.0.0.6"]);
        elsewhere.metadata.namespace = Some("other".into());
        let vmis = [
            // The first IPv4 address counts, after an IPv6 one.
            mk_vmi(
                "c",
                &[("app", "api"), ("tier", "front")],
                &["fd00::1", "10.0.0.3", "10.0.0.9"],
            ),
            mk_vmi("a", &[("app", "web"), ("tier", "front")], &["10.0.0.1"]),
            // Selected, but without an address yet.
            mk_vmi("b", &[("app", "web"), ("tier", "front")], &[]),
            mk_vmi("d", &[("app", "web")], &["10.0.0.4"]),
            deleting,
            elsewhere,
        ];
        let b = backends(&lb, &vmis);
        assert_eq!(b.selected, ["a", "b", "c"]);
        let got: Vec<(&str, String)> = b
            .servers
            .iter()
            .map(|s| (s.name.as_str(), s.address.to_string()))
            .collect();
        assert_eq!(got, [("a", "10.0.0.1".into()), ("c", "10.0.0.3".into())]);
        // An empty selector selects nothing.
        assert_eq!(backends(&mk_lb(&[]), &vmis), Backends::default());
    }

    #[test]
    fn the_address_is_the_first_ipv4_primary_address_of_an_interface() {
        let vmi = |interfaces: Value| -> VirtualMachineInstance {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "x", "namespace": "default"},
                "status": {"interfaces": interfaces}
            }))
            .expect("a VMI")
        };
        let dual = serde_json::json!({"name": "default", "ipAddress": "fd00::1",
                                      "ipAddresses": ["fd00::1", "10.0.0.7"]});
        assert_eq!(
            address(&vmi(
                serde_json::json!([dual, {"name": "nic-1", "ipAddress": "10.0.0.8"}])
            )),
            Some(Ipv4Addr::new(10, 0, 0, 8))
        );
        // Upstream reads `ipAddress` only: an IPv4 address further down `ipAddresses` is not one.
        assert_eq!(address(&vmi(serde_json::json!([dual]))), None);
        assert_eq!(
            address(&vmi(
                serde_json::json!([{"name": "default", "ip": "10.0.0.9"}])
            )),
            None,
            "not a field of KubeVirt's interface status"
        );
    }

    #[test]
    fn endpoints_keep_their_condition_until_the_prober_decides() {
        let lb = mk_lb(&[("app", &["web"])]);
        let vmis = [
            mk_vmi("a", &[("app", "web")], &["10.0.0.1"]),
            mk_vmi("b", &[("app", "web")], &["10.0.0.2"]),
        ];
        let b = backends(&lb, &vmis);
        // New endpoints start not ready: the dummy is there.
        let first = endpoints(&lb, &b, None, Some(&HashMap::new()));
        assert_eq!(
            ready_of(&first),
            [
                ("10.0.0.1".into(), false),
                ("10.0.0.2".into(), false),
                (DUMMY_ADDRESS.into(), true)
            ]
        );
        assert!(is_dummy(&first[2]));
        let slice = desired(&lb, "u1", first);
        // One healthy: it is ready, the dummy goes; the undecided one keeps its condition.
        let health = mk_health(&[("10.0.0.1", Some(true)), ("10.0.0.2", None)]);
        let second = endpoints(&lb, &b, Some(&slice), Some(&health));
        assert_eq!(
            ready_of(&second),
            [("10.0.0.1".into(), true), ("10.0.0.2".into(), false)]
        );
        assert_eq!(ready_count(&second), 1);
        assert_eq!(
            flips(Some(&slice), &second),
            [Flip {
                name: "a".into(),
                address: "10.0.0.1".into(),
                ready: true
            }]
        );
        // A VMI that moved to another address is a new endpoint (not ready), not a flip.
        let mut slice = slice;
        assert!(update(&mut slice, &lb, &second));
        assert!(!update(&mut slice, &lb, &second));
        let moved = [
            mk_vmi("a", &[("app", "web")], &["10.0.0.7"]),
            mk_vmi("b", &[("app", "web")], &["10.0.0.2"]),
        ];
        let third = endpoints(&lb, &backends(&lb, &moved), Some(&slice), Some(&health));
        assert_eq!(
            ready_of(&third),
            [
                ("10.0.0.7".into(), false),
                ("10.0.0.2".into(), false),
                (DUMMY_ADDRESS.into(), true)
            ]
        );
        assert!(flips(Some(&slice), &third).is_empty());
        // No health check: every endpoint is ready.
        let off = endpoints(&lb, &b, Some(&slice), None);
        assert_eq!(
            ready_of(&off),
            [("10.0.0.1".into(), true), ("10.0.0.2".into(), true)]
        );
        // No backend: the dummy alone.
        let none = endpoints(&lb, &Backends::default(), Some(&slice), None);
        assert_eq!(ready_of(&none), [(DUMMY_ADDRESS.into(), true)]);
        assert_eq!(ready_count(&none), 0);
    }

    #[test]
    fn the_slice_is_upstreams() {
        let lb = mk_lb(&[("app", &["web"])]);
        let slice = desired(&lb, "u1", endpoints(&lb, &Backends::default(), None, None));
        assert_eq!(
            serde_json::to_value(&slice).expect("JSON"),
            serde_json::json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {
                    "name": "lb1", "namespace": "default",
                    "labels": {"loadbalancer.harvesterhci.io/servicelb": "true",
                               "kubernetes.io/service-name": "lb1"},
                    "ownerReferences": [{"apiVersion": "loadbalancer.harvesterhci.io/v1beta1",
                        "kind": "LoadBalancer", "name": "lb1", "uid": "u1"}]
                },
                "addressType": "IPv4",
                "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
                "endpoints": [{
                    "addresses": ["10.52.0.255"],
                    "conditions": {"ready": true},
                    "targetRef": {"namespace": "default", "name": "lb1",
                                  "uid": "dummy347-546a-4642-9da6-5608endpoint"}
                }]
            })
        );
    }
}
