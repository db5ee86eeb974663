//! What the cloud provider writes on the Harvester LoadBalancer of a guest Service, and the changes
//! it refuses (network and IPAM mode are fixed once the LoadBalancer exists).

use std::{collections::BTreeMap, net::IpAddr};

use k8s_openapi::api::core::v1::Service;

use super::{GuestError, naming};
use crate::{
    crd::{
        dhcp::{DhcpRecord, record_of},
        keys,
    },
    ipam::Family,
};

/// Where the guest cluster's LoadBalancers go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestContext {
    pub cluster: String,
    /// The guest cluster's own identity, recorded on every LoadBalancer it makes
    /// (`cloudprovider.harvesterhci.io/clusterID`): the UID of its `kube-system` Namespace (the
    /// ccm), or `embedded:<namespace>/<cluster>` for a guest cluster the embedded store keeps (whose
    /// key already names it alone). Two guest clusters sharing a name and a Harvester namespace
    /// tell their LoadBalancers apart by it.
    pub identity: String,
    /// The Harvester namespace of the cloud-config.
    pub lb_namespace: String,
    /// `--management-network`, normalised (see [`normalize_management_network`]).
    pub management_network: Option<String>,
}

/// The parts of an existing LoadBalancer that decide what may change.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExistingLb {
    pub annotations: BTreeMap<String, String>,
    /// `spec.ipam`; empty means pool.
    pub ipam: String,
}

/// How a Service's addresses map onto LoadBalancers: one per address family it asks for (a
/// single-stack Service has one, named as upstream names it; a dual-stack one a second, for its
/// second family), each asking for at most one address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Addressing {
    pub slots: Vec<Slot>,
    /// `RequireDualStack`: the Service gets its addresses only once every slot has one.
    /// (`PreferDualStack` gets those there are.)
    pub require_all: bool,
}

/// One LoadBalancer of a Service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Slot {
    /// The family its address must have (`None`: any pool, as upstream chooses).
    pub family: Option<Family>,
    /// The address asked for.
    pub requested: Option<IpAddr>,
    /// The request is `spec.loadBalancerIP`'s, which stays in force (changing it moves the
    /// address); one read from `kube-vip.io/loadbalancerIPs` only counts before the LoadBalancer
    /// exists, since the cloud provider writes that annotation itself once there is an address.
    pub authoritative: bool,
}

fn family_name(family: Family) -> &'static str {
    match family {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    }
}

/// The addresses a Service asks for: `spec.loadBalancerIP`, else a `kube-vip.io/loadbalancerIPs`
/// (comma-separated; `0.0.0.0`, the DHCP mark, asks for nothing), one per family at most; and its
/// families: `spec.ipFamilies` for `PreferDualStack`/`RequireDualStack` (both families when it
/// lists none), else one LoadBalancer of the requested address's family, else IPv6 for an IPv6-only
/// Service, else of any.
pub(crate) fn addressing(svc: &Service) -> Result<Addressing, GuestError> {
    let refuse = |reason: String| GuestError::AddressRequest {
        service: service_key(svc),
        reason,
    };
    let spec = svc.spec.clone().unwrap_or_default();
    let from_spec = spec
        .load_balancer_ip
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty());
    let (texts, authoritative): (Vec<&str>, bool) = match from_spec {
        Some(v) => (vec![v], true),
        None => (
            annotation(svc, keys::KUBE_VIP_IPS)
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .collect(),
            false,
        ),
    };
    let policy = spec.ip_family_policy.as_deref().unwrap_or("SingleStack");
    let dual = matches!(policy, "PreferDualStack" | "RequireDualStack");
    let mut requested: Vec<IpAddr> = Vec::new();
    if service_ipam(svc) != "dhcp" {
        for text in texts.into_iter().filter(|t| *t != keys::DHCP_ADDRESS) {
            let parsed = text.parse::<IpAddr>().map(|ip| ip.to_canonical());
            let twice = parsed.as_ref().ok().and_then(|ip| {
                requested
                    .iter()
                    .find(|o| Family::of(**o) == Family::of(*ip))
            });
            if !authoritative && (parsed.is_err() || twice.is_some()) {
                // kube-vip's annotation is a request only as a user left it before there was an
                // address (the LoadBalancer is made with it); afterwards it is what this cloud
                // provider wrote, so what does not read as a request is no request.
                return Ok(default_addressing(&spec, None, false));
            }
            let ip = parsed
                .map_err(|_| refuse(format!("requested address {text:?} is not an IP address")))?;
            if let Some(other) = twice {
                return Err(refuse(format!(
                    "asks for two {} addresses ({other} and {ip}); one per family is served",
                    Family::of(ip)
                )));
            }
            requested.push(ip);
        }
    }
    if !dual {
        if requested.len() > 1 {
            if !authoritative {
                return Ok(default_addressing(&spec, None, false));
            }
            return Err(refuse(format!(
                "asks for {} addresses, and a {policy} service has one; set spec.ipFamilyPolicy to PreferDualStack or RequireDualStack",
                requested.len()
            )));
        }
        return Ok(default_addressing(
            &spec,
            requested.first().copied(),
            authoritative,
        ));
    }
    let mut families = Vec::new();
    for f in spec.ip_families.clone().unwrap_or_default() {
        families.push(match f.as_str() {
            "IPv4" => Family::V4,
            "IPv6" => Family::V6,
            other => return Err(refuse(format!("unknown IP family {other:?}"))),
        });
    }
    if families.is_empty() {
        families = vec![Family::V4, Family::V6];
    }
    if let Some(ip) = requested
        .iter()
        .find(|ip| !families.contains(&Family::of(**ip)))
    {
        return Err(refuse(format!(
            "requested address {ip} is not of the service's IP families ({})",
            families
                .iter()
                .map(|f| family_name(*f))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(Addressing {
        slots: families
            .iter()
            .map(|f| Slot {
                family: Some(*f),
                requested: requested.iter().copied().find(|ip| Family::of(*ip) == *f),
                authoritative,
            })
            .collect(),
        require_all: policy == "RequireDualStack",
    })
}

/// A single-stack Service's one LoadBalancer, asking for `requested`. A Service that is IPv6 only
/// says so; an IPv4 one may be so only by the guest cluster's default, so it takes any pool (as
/// upstream does, and as IPv4 guest clusters with IPv6 pools rely on).
fn default_addressing(
    spec: &k8s_openapi::api::core::v1::ServiceSpec,
    requested: Option<IpAddr>,
    authoritative: bool,
) -> Addressing {
    let ipv6_only = spec.ip_families.as_deref() == Some(&["IPv6".to_string()][..]);
    Addressing {
        slots: vec![Slot {
            family: requested
                .map(Family::of)
                .or(ipv6_only.then_some(Family::V6)),
            requested,
            authoritative,
        }],
        require_all: false,
    }
}

/// The desired LoadBalancer of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LbPlan {
    pub name: String,
    pub namespace: String,
    /// Set on every sync.
    pub annotations: BTreeMap<String, String>,
    /// Set only when the LoadBalancer is created.
    pub create_annotations: BTreeMap<String, String>,
    /// Removed on every sync.
    pub remove_annotations: Vec<&'static str>,
    pub labels: BTreeMap<String, String>,
    /// `spec.ipam`: `pool` or `dhcp`.
    pub ipam: String,
    /// `status.address` reported by the guest, if any.
    pub address: Option<String>,
    /// `spec.listeners`, when the plan has them (a sharing group's: its members' ports); `None`
    /// leaves them as they are (a Service's own LoadBalancer has none, as upstream makes it).
    pub listeners: Option<Vec<crate::crd::Listener>>,
    /// A DHCP Service's lease record (its first LoadBalancer only): recorded on the LoadBalancer,
    /// and written back onto the Service where it lacks a part ([`super::dhcp`]).
    pub dhcp: Option<DhcpRecord>,
}

/// `--management-network` as `ns/name`: a bare name is in `default`; empty or malformed values are
/// dropped (and the annotation removed).
pub fn normalize_management_network(flag: Option<&str>) -> Option<String> {
    let v = flag?.trim();
    match v.split('/').collect::<Vec<_>>().as_slice() {
        [name] if !name.is_empty() => Some(format!("default/{name}")),
        [ns, name] if !ns.is_empty() && !name.is_empty() => Some(format!("{ns}/{name}")),
        _ => None,
    }
}

/// A Service's annotation, if set.
pub fn annotation<'a>(svc: &'a Service, key: &str) -> Option<&'a str> {
    svc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// A Service's labels as the LoadBalancer carries them: a JSON object, `{}` when it has none.
pub(crate) fn service_labels(svc: &Service) -> String {
    let labels = svc.metadata.labels.clone().unwrap_or_default();
    // A map of strings always serialises.
    serde_json::to_string(&labels).unwrap_or_else(|_| "{}".into())
}

/// A Service's label, if set.
pub fn label<'a>(svc: &'a Service, key: &str) -> Option<&'a str> {
    svc.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

/// The Service's IPAM mode: its annotation verbatim, `pool` when absent or empty.
pub(crate) fn service_ipam(svc: &Service) -> String {
    annotation(svc, keys::SVC_IPAM)
        .filter(|v| !v.is_empty())
        .unwrap_or("pool")
        .to_string()
}

/// `namespace/name` of a Service.
pub(crate) fn service_key(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or_default(),
        svc.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The address the guest's kube-vip reported for the Service.
pub fn ingress_ip(svc: &Service) -> Option<String> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .and_then(|i| i.first())
        .and_then(|i| i.ip.clone())
        .filter(|ip| !ip.is_empty())
}

/// The LoadBalancer for `svc`, or why it cannot change the way the Service now asks.
pub fn plan(
    svc: &Service,
    ctx: &GuestContext,
    existing: Option<&ExistingLb>,
) -> Result<LbPlan, GuestError> {
    plan_slot(svc, ctx, existing, 0, &Slot::default(), None)
}

/// The name of the LoadBalancer in slot `index` of a Service: the first as upstream names it, the
/// second (a dual-stack Service's second family) from the UID and the family.
pub(crate) fn slot_lb_name(
    cluster: &str,
    svc: &Service,
    index: usize,
    family: Option<Family>,
) -> String {
    let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
    let name = svc.metadata.name.as_deref().unwrap_or_default();
    let uid = svc.metadata.uid.as_deref().unwrap_or_default();
    match (index, family) {
        (0, _) | (_, None) => naming::load_balancer_name(cluster, ns, name, uid),
        (_, Some(f)) => {
            naming::load_balancer_name(cluster, ns, name, &format!("{uid}/{}", family_name(f)))
        }
    }
}

/// The plan of the LoadBalancer in slot `index` of a Service; `carried` is the DHCP record a
/// deleted Service of the same name left, for a LoadBalancer about to be made.
pub(crate) fn plan_slot(
    svc: &Service,
    ctx: &GuestContext,
    existing: Option<&ExistingLb>,
    index: usize,
    slot: &Slot,
    carried: Option<&DhcpRecord>,
) -> Result<LbPlan, GuestError> {
    let ns = svc.metadata.namespace.clone().unwrap_or_default();
    let name = svc.metadata.name.clone().unwrap_or_default();
    let uid = svc.metadata.uid.clone().unwrap_or_default();
    let lb_name = slot_lb_name(&ctx.cluster, svc, index, slot.family);
    let network = annotation(svc, keys::SVC_NETWORK)
        .unwrap_or_default()
        .to_string();
    let ipam = service_ipam(svc);
    if ipam != "pool" && ipam != "dhcp" {
        return Err(GuestError::InvalidIpam {
            service: service_key(svc),
            value: crate::validation::go_quote(&ipam),
        });
    }

    if let Some(lb) = existing {
        let lb_network = lb
            .annotations
            .get(keys::ANNOTATION_SERVICE_NETWORK)
            .cloned()
            .unwrap_or_default();
        if lb_network != network {
            return Err(GuestError::NetworkChanged {
                service: service_key(svc),
                lb: format!("{}/{lb_name}", ctx.lb_namespace),
                service_network: network,
                lb_network,
            });
        }
        let lb_ipam = if lb.ipam.is_empty() {
            "pool".to_string()
        } else {
            lb.ipam.clone()
        };
        if lb_ipam != ipam {
            return Err(GuestError::IpamChanged {
                service: service_key(svc),
                lb: format!("{}/{lb_name}", ctx.lb_namespace),
                service_ipam: ipam,
                lb_ipam,
            });
        }
    }

    let mut annotations = BTreeMap::from([
        (keys::ANNOTATION_CLUSTER.to_string(), ctx.cluster.clone()),
        (keys::ANNOTATION_SERVICE_UID.to_string(), uid),
        (
            keys::ANNOTATION_GUEST_CLUSTER_ID.to_string(),
            ctx.identity.clone(),
        ),
        // The Service's labels, for pools' service selectors; kept current (a Service whose
        // labels change may then match a pool it waits for; an address it holds stays).
        (
            keys::ANNOTATION_SERVICE_LABELS.to_string(),
            service_labels(svc),
        ),
    ]);
    // As upstream's constructLB: from the Service's, empty when it has none. Harvester's mutator
    // then overwrites both on every write of a cluster LoadBalancer (the namespace always, the
    // project when the namespace exists), so only a value the Service gives is worth writing
    // again: an empty one, sent on every sync as upstream sends it, would be a write that the
    // mutator turns back into the stored object (a full admission round trip per reconcile, for
    // nothing). The namespace is the mutator's outright: written only at creation.
    let mut create_annotations = BTreeMap::new();
    for (from, to, always_mutated) in [
        (keys::SVC_PROJECT, keys::ANNOTATION_PROJECT, false),
        (keys::SVC_NAMESPACE, keys::ANNOTATION_NAMESPACE, true),
    ] {
        let v = annotation(svc, from).unwrap_or_default();
        let into = if always_mutated || v.is_empty() {
            &mut create_annotations
        } else {
            &mut annotations
        };
        into.insert(to.to_string(), v.to_string());
    }
    let mut remove_annotations = Vec::new();
    match &ctx.management_network {
        Some(net) => {
            annotations.insert(keys::ANNOTATION_MANAGEMENT_NETWORK.to_string(), net.clone());
        }
        None => remove_annotations.push(keys::ANNOTATION_MANAGEMENT_NETWORK),
    }
    create_annotations.extend([
        (keys::ANNOTATION_NETWORK.to_string(), network.clone()),
        (keys::ANNOTATION_SERVICE_NETWORK.to_string(), network),
    ]);
    match slot.family {
        Some(f) => {
            annotations.insert(keys::ANNOTATION_IP_FAMILY.into(), family_name(f).into());
        }
        None => remove_annotations.push(keys::ANNOTATION_IP_FAMILY),
    }
    if let Some(ip) = slot.requested {
        let to = if slot.authoritative {
            &mut annotations
        } else {
            &mut create_annotations
        };
        to.insert(keys::ANNOTATION_REQUESTED_IP.into(), ip.to_string());
    }
    // The lease record lives on the first LoadBalancer: kube-vip leases on one interface per
    // Service, whatever its families.
    let dhcp = if ipam == "dhcp" && index == 0 {
        let recorded = existing.and_then(|lb| record_of(&lb.annotations).ok());
        let record = super::dhcp::plan(svc, &ctx.identity, recorded.as_ref(), carried)?;
        for (key, part) in [
            (keys::ANNOTATION_DHCP_MAC, &record.mac),
            (keys::ANNOTATION_DHCP_LEASED_IP, &record.leased),
            (keys::ANNOTATION_DHCP_HOSTNAME, &record.hostname),
        ] {
            match part {
                Some(v) => {
                    annotations.insert(key.to_string(), v.clone());
                }
                None => remove_annotations.push(key),
            }
        }
        // A Service serves it again: no longer kept for a recreated one.
        remove_annotations.push(keys::ANNOTATION_DHCP_RETAINED_UNTIL);
        Some(record)
    } else {
        None
    };
    let labels = BTreeMap::from([
        (keys::LABEL_GUEST_CLUSTER.to_string(), ctx.cluster.clone()),
        (keys::LABEL_SERVICE_NAMESPACE.to_string(), ns),
        (keys::LABEL_SERVICE_NAME.to_string(), name),
    ]);
    Ok(LbPlan {
        name: lb_name,
        namespace: ctx.lb_namespace.clone(),
        annotations,
        create_annotations,
        remove_annotations,
        labels,
        ipam,
        address: ingress_ip(svc),
        listeners: None,
        dhcp,
    })
}

/// What to write on the Service once its LoadBalancer has `address`.
pub fn service_annotations(address: &str, interface: Option<&str>) -> BTreeMap<String, String> {
    let mut a = BTreeMap::from([(keys::KUBE_VIP_IPS.to_string(), address.to_string())]);
    if let Some(i) = interface {
        a.insert(keys::KUBE_VIP_INTERFACE.to_string(), i.to_string());
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn mk_service(ns: &str, name: &str, annotations: &[(&str, &str)]) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "namespace": ns, "name": name, "uid": "d4b50d98-39ec-4d88-8098-36579de5db4a",
                "annotations": annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
            },
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]},
        }))
        .unwrap()
    }

    fn mk_ctx(mgmt: Option<&str>) -> GuestContext {
        GuestContext {
            cluster: "test".into(),
            identity: "guest-uid".into(),
            lb_namespace: "gc-ns".into(),
            management_network: normalize_management_network(mgmt),
        }
    }

    #[test]
    fn maps_a_service() {
        let svc = mk_service(
            "default",
            "abcd",
            &[
                (keys::SVC_NETWORK, "default/vlan1"),
                (keys::SVC_PROJECT, "p1"),
            ],
        );
        let p = plan(&svc, &mk_ctx(Some("mgmt")), None).unwrap();
        assert_eq!(p.name, "test-default-abcd-7198d990");
        assert_eq!(p.namespace, "gc-ns");
        assert_eq!(p.ipam, "pool");
        assert_eq!(
            p.create_annotations[keys::ANNOTATION_NETWORK],
            "default/vlan1"
        );
        assert_eq!(
            p.create_annotations[keys::ANNOTATION_SERVICE_NETWORK],
            "default/vlan1"
        );
        assert_eq!(p.annotations[keys::ANNOTATION_PROJECT], "p1");
        // pkg/cloud-controller-manager/loadbalancer.go (constructLB): the namespace annotation is
        // written from the Service's, empty when it has none; Harvester's mutator owns it after.
        assert_eq!(p.create_annotations[keys::ANNOTATION_NAMESPACE], "");
        assert!(!p.annotations.contains_key(keys::ANNOTATION_NAMESPACE));
        assert_eq!(
            p.annotations[keys::ANNOTATION_GUEST_CLUSTER_ID],
            "guest-uid"
        );
        assert_eq!(p.annotations[keys::ANNOTATION_CLUSTER], "test");
        assert_eq!(
            p.annotations[keys::ANNOTATION_MANAGEMENT_NETWORK],
            "default/mgmt"
        );
        assert_eq!(p.labels[keys::LABEL_SERVICE_NAME], "abcd");
        assert_eq!(p.labels[keys::LABEL_SERVICE_NAMESPACE], "default");
        assert_eq!(p.labels[keys::LABEL_GUEST_CLUSTER], "test");
        assert_eq!(p.annotations[keys::ANNOTATION_SERVICE_LABELS], "{}");
        let p = plan(
            &mk_service("default", "abcd", &[(keys::SVC_IPAM, "dhcp")]),
            &mk_ctx(None),
            None,
        )
        .unwrap();
        assert_eq!(p.ipam, "dhcp");
        assert_eq!(
            p.remove_annotations,
            [
                keys::ANNOTATION_MANAGEMENT_NETWORK,
                keys::ANNOTATION_IP_FAMILY,
                keys::ANNOTATION_DHCP_LEASED_IP,
                keys::ANNOTATION_DHCP_HOSTNAME,
                keys::ANNOTATION_DHCP_RETAINED_UNTIL,
            ]
        );
        // Its lease record: the MAC address made from the guest cluster's identity and the
        // Service's name, until kube-vip reports a lease.
        let mac = super::super::dhcp::generated_mac("guest-uid", "default", "abcd");
        assert_eq!(p.annotations[keys::ANNOTATION_DHCP_MAC], mac);
        assert_eq!(
            p.dhcp,
            Some(DhcpRecord {
                mac: Some(mac),
                ..Default::default()
            })
        );
    }

    #[test]
    fn the_service_labels_ride_along_as_one_annotation() {
        let mut svc = mk_service("default", "abcd", &[]);
        svc.metadata.labels = Some(BTreeMap::from([
            ("app".to_string(), "web".to_string()),
            ("example.com/tier".to_string(), "front".to_string()),
            // A key of Harvester's own stays inside the annotation, never on the LoadBalancer.
            (keys::LABEL_GUEST_CLUSTER.to_string(), "other".to_string()),
        ]));
        let p = plan(&svc, &mk_ctx(None), None).unwrap();
        assert_eq!(
            p.annotations[keys::ANNOTATION_SERVICE_LABELS],
            r#"{"app":"web","cloudprovider.harvesterhci.io/cluster":"other","example.com/tier":"front"}"#
        );
        assert_eq!(p.labels[keys::LABEL_GUEST_CLUSTER], "test");
        assert!(!p.labels.contains_key("app"));
    }

    #[test]
    fn management_network_normalisation() {
        assert_eq!(
            normalize_management_network(Some("mgmt")),
            Some("default/mgmt".into())
        );
        assert_eq!(
            normalize_management_network(Some("ns/mgmt")),
            Some("ns/mgmt".into())
        );
        for v in [None, Some(""), Some("a/b/c"), Some("/x"), Some("x/")] {
            assert_eq!(normalize_management_network(v), None, "{v:?}");
        }
    }

    #[test]
    fn network_and_ipam_changes_are_refused() {
        let svc = mk_service("default", "abcd", &[(keys::SVC_NETWORK, "default/vlan2")]);
        let lb = ExistingLb {
            annotations: BTreeMap::from([(
                keys::ANNOTATION_SERVICE_NETWORK.to_string(),
                "default/vlan1".to_string(),
            )]),
            ipam: "pool".into(),
        };
        assert_eq!(
            plan(&svc, &mk_ctx(None), Some(&lb))
                .unwrap_err()
                .to_string(),
            "network annotation of service default/abcd is not same as the load balancer gc-ns/test-default-abcd-7198d990, service: 'default/vlan2', lb: 'default/vlan1'"
        );
        let svc = mk_service("default", "abcd", &[(keys::SVC_IPAM, "dhcp")]);
        let lb = ExistingLb {
            annotations: BTreeMap::new(),
            ipam: String::new(),
        };
        assert!(matches!(
            plan(&svc, &mk_ctx(None), Some(&lb)),
            Err(GuestError::IpamChanged { .. })
        ));
        // Unchanged: fine, and empty ipam on the LoadBalancer means pool.
        let svc = mk_service("default", "abcd", &[]);
        assert!(plan(&svc, &mk_ctx(None), Some(&lb)).is_ok());
    }

    #[test]
    fn an_ipam_annotation_that_names_no_mode_is_refused() {
        for ok in ["", "pool", "dhcp"] {
            let svc = mk_service("default", "abcd", &[(keys::SVC_IPAM, ok)]);
            assert!(plan(&svc, &mk_ctx(None), None).is_ok(), "{ok:?}");
        }
        let svc = mk_service("default", "abcd", &[(keys::SVC_IPAM, "‹img src=x>\n")]);
        assert_eq!(
            plan(&svc, &mk_ctx(None), None).unwrap_err().to_string(),
            "service default/abcd: annotation cloudprovider.harvesterhci.io/ipam is \"‹img src=x>\\n\": supported values: \"pool\", \"dhcp\""
        );
    }
}
