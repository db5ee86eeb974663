//! Sharing one address by a sharing key, with no primary: the Services of type LoadBalancer of one
//! namespace of a guest cluster with the same key (`cloudprovider.harvesterhci.io/sharing-key`, or
//! MetalLB's or Cilium's key as an alias) are a sharing group. The group's address belongs to a
//! LoadBalancer of its own ([`crate::naming::shared_load_balancer_name`]), not to any one Service: any
//! member can go, and the address stays while one remains.
//!
//! [`decide`] judges a whole group at once, so that every member's reconcile, and the up-front check
//! of a Service written over HTTP, come to the same answer: members in order of precedence (those
//! admitted before first, then the oldest), each admitted when it can be served as it asks
//! ([`own_terms`]), agrees with the group (network, requested address, family) and its (protocol,
//! port)s are free. A port's holder is the member that the group's LoadBalancer records in its
//! listeners (`<service>-<protocol>-<port>`), so a member that changes its ports to clash with
//! another member is the one refused, not the other.
//!
//! Namespace scope (a decision): MetalLB shares across namespaces, Cilium only within one unless
//! `lbipam.cilium.io/sharing-cross-namespace` allows it. Here a group never crosses a namespace, so
//! a Service of another namespace can neither take ports from a group nor pin its address; the
//! Cilium opt-in is not honoured, and a Service that sets it is told so.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use k8s_openapi::api::core::v1::Service;

use super::{
    GuestError,
    mapping::{self, GuestContext, LbPlan, Slot, annotation, service_ipam, service_key},
    share,
};
use crate::{
    crd::{Listener, LoadBalancer, keys},
    ipam::Family,
    validation::go_quote,
};

/// The annotations a Service's sharing key is read from: ours first, then MetalLB's (current and
/// legacy) and Cilium's. Two of them naming different keys is a refusal, not a pick.
pub const KEY_ANNOTATIONS: [&str; 4] = [
    keys::SVC_SHARING_KEY,
    keys::METALLB_SHARING_KEY,
    keys::METALLB_LEGACY_SHARING_KEY,
    keys::CILIUM_SHARING_KEY,
];

/// A Service's sharing key, and the annotation it was read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharingKey {
    pub value: String,
    pub annotation: &'static str,
}

/// The sharing key a Service gives (`None`: none, or only empty values).
pub fn sharing_key(svc: &Service) -> Result<Option<SharingKey>, GuestError> {
    let found: Vec<(&'static str, &str)> = KEY_ANNOTATIONS
        .iter()
        .filter_map(|a| {
            annotation(svc, a)
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(|v| (*a, v))
        })
        .collect();
    let Some(&(first_annotation, first)) = found.first() else {
        return Ok(None);
    };
    if found.iter().any(|(_, v)| *v != first) {
        return Err(GuestError::SharingKeysDisagree {
            service: service_key(svc),
            values: found
                .iter()
                .map(|(a, v)| format!("{a} is {}", go_quote(v)))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(Some(SharingKey {
        value: first.to_string(),
        annotation: first_annotation,
    }))
}

/// Whether a Service asks to share across namespaces (Cilium's opt-in), which is not honoured.
pub fn asks_cross_namespace(svc: &Service) -> bool {
    annotation(svc, keys::CILIUM_SHARING_CROSS_NAMESPACE).is_some_and(|v| !v.trim().is_empty())
}

/// The group a sharing LoadBalancer of guest cluster `ctx` holds the address of: its namespace (the
/// Services') and key. Only one this guest cluster made (its identity recorded), labelled with its
/// cluster name.
pub fn group_of(ctx: &GuestContext, lb: &LoadBalancer) -> Option<(String, String)> {
    let annotations = lb.metadata.annotations.as_ref()?;
    if annotations.get(keys::ANNOTATION_GUEST_CLUSTER_ID) != Some(&ctx.identity) {
        return None;
    }
    let key = annotations
        .get(keys::ANNOTATION_SHARING_GROUP)
        .filter(|k| !k.is_empty())?;
    let labels = lb.metadata.labels.as_ref()?;
    if labels.get(keys::LABEL_GUEST_CLUSTER) != Some(&ctx.cluster) {
        return None;
    }
    let namespace = labels.get(keys::LABEL_SERVICE_NAMESPACE)?;
    Some((namespace.clone(), key.clone()))
}

/// What the decision needs of a group's LoadBalancer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupLb {
    /// `namespace/name`.
    pub key: String,
    /// The network it was made on (`cloudprovider.harvesterhci.io/lb-network`).
    pub network: String,
    /// The address it holds, if any (`status.allocatedAddress.ip`).
    pub address: Option<IpAddr>,
    /// (protocol, port) → the name of the member Service holding it, from its listeners.
    pub holders: BTreeMap<(String, i32), String>,
}

impl GroupLb {
    pub fn of(lb: &LoadBalancer) -> Self {
        let holders = lb
            .spec
            .listeners
            .iter()
            .filter_map(|l| {
                let protocol = l.effective_protocol().to_string();
                let suffix = format!("-{}-{}", protocol.to_ascii_lowercase(), l.port);
                let owner = l.name.strip_suffix(&suffix).filter(|o| !o.is_empty())?;
                Some(((protocol, l.port), owner.to_string()))
            })
            .collect();
        GroupLb {
            key: format!(
                "{}/{}",
                lb.metadata.namespace.as_deref().unwrap_or_default(),
                lb.metadata.name.as_deref().unwrap_or_default()
            ),
            network: lb
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(keys::ANNOTATION_SERVICE_NETWORK))
                .cloned()
                .unwrap_or_default(),
            address: lb
                .status
                .as_ref()
                .and_then(|s| s.allocated_address.ip.parse().ok()),
            holders,
        }
    }
}

/// A Service of the group, as the decision sees it.
#[derive(Clone, Debug)]
pub struct Candidate<'a> {
    pub svc: &'a Service,
    /// Admitted before (its record names the group's LoadBalancer, or this process admitted it).
    pub admitted: bool,
    /// The secondaries (`<ns>/<name>`) that name it as their primary.
    pub secondaries: Vec<String>,
}

/// What a member asks of the group's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Terms {
    pub network: String,
    pub requested: Option<IpAddr>,
    /// The request is `spec.loadBalancerIP`'s (it stays in force and moves the address).
    pub authoritative: bool,
    pub family: Option<Family>,
    /// The (protocol, port)s it exposes.
    pub ports: Vec<(String, i32)>,
    /// MetalLB's backend key: under `externalTrafficPolicy: Local` the Service's selector (the
    /// nodes with its endpoints are those that may announce the address), else empty.
    pub backend: String,
}

/// The terms of the group: those of its first member, with the request and family of the first
/// member that gives one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupTerms {
    pub terms: Terms,
    /// The member whose terms these are (`<ns>/<name>`).
    pub reference: String,
    /// The member the request (or family) came from.
    pub request_holder: String,
}

/// The judgement of a whole group.
#[derive(Clone, Debug)]
pub struct Decision<'a> {
    /// The admitted members, in order of precedence.
    pub members: Vec<&'a Service>,
    /// `<ns>/<name>` → why that Service is not admitted.
    pub refused: BTreeMap<String, GuestError>,
    /// The group's terms (`None`: no member).
    pub terms: Option<GroupTerms>,
    /// The members' ports, each named after its holder, sorted by protocol and port.
    pub listeners: Vec<Listener>,
}

impl Decision<'_> {
    /// The members, `<ns>/<name>`, in order of precedence.
    pub fn member_keys(&self) -> Vec<String> {
        self.members.iter().map(|s| service_key(s)).collect()
    }
}

fn family_name(family: Family) -> &'static str {
    match family {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    }
}

/// What a Service asks of a group it is to join, or why it cannot be a member at all. A request
/// read from `kube-vip.io/loadbalancerIPs` counts only before the Service is admitted (afterwards the
/// cloud provider wrote it).
pub fn own_terms(candidate: &Candidate<'_>, key: &SharingKey) -> Result<Terms, GuestError> {
    let svc = candidate.svc;
    let not_shareable = |reason: String| GuestError::NotShareable {
        service: service_key(svc),
        key: go_quote(&key.value),
        reason,
    };
    if annotation(svc, keys::SVC_PRIMARY).is_some_and(|v| !v.is_empty()) {
        return Err(GuestError::PrimaryAndSharingKey {
            service: service_key(svc),
            key_annotation: key.annotation.to_string(),
        });
    }
    if !candidate.secondaries.is_empty() {
        return Err(not_shareable(format!(
            "it is the primary service of [{}], which share its own load balancer's address",
            candidate.secondaries.join(" ")
        )));
    }
    let ipam = service_ipam(svc);
    if ipam != "pool" && ipam != "dhcp" {
        return Err(GuestError::InvalidIpam {
            service: service_key(svc),
            value: go_quote(&ipam),
        });
    }
    if ipam == "dhcp" {
        return Err(not_shareable(
            "its IPAM mode is dhcp: a DHCP lease is held by one service's kube-vip and cannot outlive it, so only pool addresses are shared by key (share a DHCP address with cloudprovider.harvesterhci.io/primary-service)".into(),
        ));
    }
    let spec = svc.spec.clone().unwrap_or_default();
    if let Some(policy @ ("PreferDualStack" | "RequireDualStack")) =
        spec.ip_family_policy.as_deref()
    {
        return Err(not_shareable(format!(
            "ipFamilyPolicy is {policy}, and a sharing group has one address"
        )));
    }
    let addressing = mapping::addressing(svc)?;
    let slot = addressing.slots.first().cloned().unwrap_or_default();
    let ipv6_only = spec.ip_families.as_deref() == Some(&["IPv6".to_string()][..]);
    let requested = slot
        .requested
        .filter(|_| slot.authoritative || !candidate.admitted);
    let mut ports = share::ports(svc);
    ports.sort();
    ports.dedup();
    let backend = if spec.external_traffic_policy.as_deref() == Some("Local") {
        let selector: Vec<String> = spec
            .selector
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        format!("Local, selector {{{}}}", selector.join(","))
    } else {
        String::new()
    };
    Ok(Terms {
        network: annotation(svc, keys::SVC_NETWORK)
            .unwrap_or_default()
            .to_string(),
        requested,
        authoritative: slot.authoritative && requested.is_some(),
        family: requested
            .map(Family::of)
            .or(ipv6_only.then_some(Family::V6)),
        ports,
        backend,
    })
}

/// Judges group `key` (whose LoadBalancer is `lb`, when it exists) over all its candidates: the
/// Services of type LoadBalancer of its namespace with that key and not being deleted.
pub fn decide<'a>(
    key: &SharingKey,
    candidates: &[Candidate<'a>],
    lb: Option<&GroupLb>,
) -> Decision<'a> {
    let quoted = go_quote(&key.value);
    let mut order: Vec<&Candidate<'a>> = candidates.iter().collect();
    order.sort_by_key(|c| {
        let created = c.svc.metadata.creation_timestamp.as_ref().map(|t| t.0);
        (!c.admitted, created.is_none(), created, service_key(c.svc))
    });
    let mut refused = BTreeMap::new();
    let mut own = BTreeMap::new();
    for c in &order {
        match own_terms(c, key) {
            Ok(terms) => {
                own.insert(service_key(c.svc), terms);
            }
            Err(e) => {
                refused.insert(service_key(c.svc), e);
            }
        }
    }
    let namespace = order
        .first()
        .and_then(|c| c.svc.metadata.namespace.clone())
        .unwrap_or_default();
    // A recorded holder holds its port while it still exposes it and can be a member.
    let recorded: BTreeMap<(String, i32), String> = lb
        .map(|lb| &lb.holders)
        .into_iter()
        .flatten()
        .map(|(port, owner)| (port.clone(), format!("{namespace}/{owner}")))
        .filter(|(port, owner)| own.get(owner).is_some_and(|t| t.ports.contains(port)))
        .collect();
    let mut held: BTreeMap<(String, i32), String> = BTreeMap::new();
    let mut members = Vec::new();
    let mut group: Option<GroupTerms> = None;
    for c in order {
        let me = service_key(c.svc);
        let Some(mine) = own.get(&me) else {
            continue;
        };
        match admit(&me, mine, &quoted, lb, group.as_ref(), &held, &recorded) {
            Err(e) => {
                refused.insert(me, e);
            }
            Ok(()) => {
                for port in &mine.ports {
                    held.insert(port.clone(), me.clone());
                }
                match &mut group {
                    None => {
                        group = Some(GroupTerms {
                            terms: mine.clone(),
                            reference: me.clone(),
                            request_holder: me.clone(),
                        })
                    }
                    Some(g) => {
                        if g.terms.requested.is_none() && mine.requested.is_some() {
                            g.terms.requested = mine.requested;
                            g.terms.authoritative = mine.authoritative;
                            g.request_holder = me.clone();
                        }
                        if g.terms.family.is_none() && mine.family.is_some() {
                            g.terms.family = mine.family;
                        }
                    }
                }
                members.push(c.svc);
            }
        }
    }
    let listeners = held
        .iter()
        .map(|((protocol, port), holder)| {
            let name = holder.split_once('/').map_or(holder.as_str(), |(_, n)| n);
            Listener::new(
                &format!("{name}-{}-{port}", protocol.to_ascii_lowercase()),
                *port,
                protocol,
                *port,
            )
        })
        .collect();
    Decision {
        members,
        refused,
        terms: group,
        listeners,
    }
}

/// Whether member `me` (asking `mine`) joins a group with terms `group` and ports `held` (by those
/// admitted before it in this judgement) and `recorded` (by the LoadBalancer's listeners).
fn admit(
    me: &str,
    mine: &Terms,
    quoted: &str,
    lb: Option<&GroupLb>,
    group: Option<&GroupTerms>,
    held: &BTreeMap<(String, i32), String>,
    recorded: &BTreeMap<(String, i32), String>,
) -> Result<(), GuestError> {
    if let Some(lb) = lb
        && lb.network != mine.network
    {
        // The network of a LoadBalancer is fixed once it exists, as for a Service's own.
        return Err(GuestError::NetworkChanged {
            service: me.to_string(),
            lb: lb.key.clone(),
            service_network: mine.network.clone(),
            lb_network: lb.network.clone(),
        });
    }
    let disagree =
        |what: &str, mine: String, theirs: String, holder: &str| GuestError::SharingTermsDisagree {
            service: me.to_string(),
            key: quoted.to_string(),
            disagreement: format!("its {what} is {mine}, and service {holder}'s is {theirs}"),
            holder: holder.to_string(),
        };
    let address = lb.and_then(|lb| lb.address.map(|a| (lb, a)));
    match group {
        Some(g) => {
            if g.terms.network != mine.network {
                return Err(disagree(
                    "network",
                    go_quote(&mine.network),
                    go_quote(&g.terms.network),
                    &g.reference,
                ));
            }
            if g.terms.backend != mine.backend {
                // MetalLB's rule: under Local, the nodes that may announce the address are those
                // with the Service's endpoints, which must then be the same for all.
                let shown = |b: &str| {
                    if b.is_empty() {
                        "Cluster".to_string()
                    } else {
                        b.to_string()
                    }
                };
                return Err(disagree(
                    "externalTrafficPolicy",
                    shown(&mine.backend),
                    shown(&g.terms.backend),
                    &g.reference,
                ));
            }
            if let (Some(r), Some(t)) = (mine.requested, g.terms.requested)
                && r != t
            {
                return Err(disagree(
                    "requested address",
                    r.to_string(),
                    t.to_string(),
                    &g.request_holder,
                ));
            }
            if let (Some(f), Some(t)) = (mine.family, g.terms.family)
                && f != t
            {
                return Err(disagree(
                    "IP family",
                    family_name(f).into(),
                    family_name(t).into(),
                    &g.request_holder,
                ));
            }
            // A later member does not move the group's address.
            if g.terms.requested.is_none()
                && let Some((lb, held_address)) = address
            {
                check_address(me, mine, quoted, lb, held_address)?;
            }
        }
        None => {
            // The first member's `spec.loadBalancerIP` moves the group's address, as it moves a
            // Service's own; a request it made only before it had an address does not.
            if !mine.authoritative
                && let Some((lb, held_address)) = address
            {
                check_address(me, mine, quoted, lb, held_address)?;
            }
        }
    }
    let mut clashes = Vec::new();
    let mut holders = BTreeSet::new();
    for port in &mine.ports {
        let holder = held
            .get(port)
            .or_else(|| recorded.get(port))
            .filter(|h| h.as_str() != me);
        if let Some(h) = holder {
            clashes.push(format!("{}/{} is held by service {h}", port.0, port.1));
            holders.insert(h.clone());
        }
    }
    if !clashes.is_empty() {
        return Err(GuestError::SharingPortsClash {
            service: me.to_string(),
            key: quoted.to_string(),
            clashes: clashes.join("; "),
            holders: holders.into_iter().collect(),
        });
    }
    Ok(())
}

/// A member that does not move the group's address must ask for nothing else.
fn check_address(
    me: &str,
    mine: &Terms,
    quoted: &str,
    lb: &GroupLb,
    address: IpAddr,
) -> Result<(), GuestError> {
    let refuse = |requested: String| GuestError::SharingAddressDisagrees {
        service: me.to_string(),
        key: quoted.to_string(),
        requested,
        address: address.to_string(),
        lb: lb.key.clone(),
    };
    if let Some(r) = mine.requested
        && r != address
    {
        return Err(refuse(r.to_string()));
    }
    if let Some(f) = mine.family
        && f != Family::of(address)
    {
        return Err(refuse(format!("an {} address", family_name(f))));
    }
    Ok(())
}

/// The plan of group `key`'s LoadBalancer in namespace `namespace` of the guest cluster: upstream's
/// annotations and labels as for a Service's own (project and namespace from the group's first
/// member, `reference`), no `serviceName` label nor Service UID, the key in
/// `cloudprovider.harvesterhci.io/sharing-group`, the group's request, and its members' ports as
/// listeners.
pub fn plan(
    ctx: &GuestContext,
    key: &SharingKey,
    decision: &Decision<'_>,
    reference: &Service,
) -> Result<LbPlan, GuestError> {
    let terms = decision
        .terms
        .as_ref()
        .map(|g| g.terms.clone())
        .unwrap_or_else(|| Terms {
            network: String::new(),
            requested: None,
            authoritative: false,
            family: None,
            ports: Vec::new(),
            backend: String::new(),
        });
    let slot = Slot {
        family: terms.family,
        requested: terms.requested,
        authoritative: terms.authoritative,
    };
    // No DHCP lease record: a sharing group's address is a pool's.
    let mut plan = mapping::plan_slot(reference, ctx, None, 0, &slot, None)?;
    let namespace = reference.metadata.namespace.clone().unwrap_or_default();
    plan.name = crate::naming::shared_load_balancer_name(&ctx.cluster, &namespace, &key.value);
    plan.annotations.remove(keys::ANNOTATION_SERVICE_UID);
    plan.annotations
        .insert(keys::ANNOTATION_SHARING_GROUP.into(), key.value.clone());
    plan.labels.remove(keys::LABEL_SERVICE_NAME);
    plan.address = None;
    plan.listeners = Some(decision.listeners.clone());
    Ok(plan)
}

#[cfg(test)]
mod tests;
