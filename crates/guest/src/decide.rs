//! The guest reconciler's decisions, as pure functions of the objects involved: which Services it
//! serves, which primary a Service names, the name and shape of a Service's LoadBalancer (new, or
//! brought to the plan), whether a LoadBalancer is left over, and the edits written back to the
//! Service. Both the reconciler ([`super::reconcile`]) and the up-front check of Services written over
//! HTTP ([`super::admit`]) decide with these.

use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus as ServiceLbStatus, Service, ServiceStatus,
};
use kube::runtime::reflector::ObjectRef;

use super::{
    GuestError,
    mapping::{self, Addressing, ExistingLb, GuestContext, LbPlan, annotation, service_key},
    naming, network, share, sharing,
};
use crate::{
    crd::{LoadBalancer, LoadBalancerSpec, dhcp::DhcpRecord, keys},
    ipam::Family,
};

/// The `type` of Services this reconciler serves.
const LOAD_BALANCER: &str = "LoadBalancer";

/// A Service this reconciler serves: of type LoadBalancer, and not claimed by another
/// implementation through `spec.loadBalancerClass` (which Kubernetes' cloud providers leave alone).
pub(crate) fn is_load_balancer(svc: &Service) -> bool {
    svc.spec.as_ref().is_some_and(|s| {
        s.type_.as_deref() == Some(LOAD_BALANCER) && s.load_balancer_class.is_none()
    })
}

/// The primary a Service's annotation names, if it names one.
pub(crate) fn primary_of(svc: &Service) -> Result<Option<(String, String)>, GuestError> {
    match annotation(svc, keys::SVC_PRIMARY).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => {
            share::primary_ref(v, svc.metadata.namespace.as_deref().unwrap_or_default()).map(Some)
        }
    }
}

/// The name of a Service's own LoadBalancer in guest cluster `cluster` (`None` before it has a UID).
pub(crate) fn lb_name_of(cluster: &str, svc: &Service) -> Option<String> {
    let uid = svc.metadata.uid.as_deref().filter(|u| !u.is_empty())?;
    Some(naming::load_balancer_name(
        cluster,
        svc.metadata.namespace.as_deref().unwrap_or_default(),
        svc.metadata.name.as_deref().unwrap_or_default(),
        uid,
    ))
}

/// Every LoadBalancer name a Service's LoadBalancers may have (its first, and a dual-stack
/// Service's second of either family), whatever it asks for now (`None` before it has a UID).
pub(crate) fn lb_names_of(cluster: &str, svc: &Service) -> Option<Vec<String>> {
    lb_name_of(cluster, svc)?;
    let mut names = vec![mapping::slot_lb_name(cluster, svc, 0, None)];
    for family in [Family::V4, Family::V6] {
        names.push(mapping::slot_lb_name(cluster, svc, 1, Some(family)));
    }
    Some(names)
}

/// The names of the LoadBalancers a Service needs for `addressing`, one per slot.
pub(crate) fn slot_names(cluster: &str, svc: &Service, addressing: &Addressing) -> Vec<String> {
    addressing
        .slots
        .iter()
        .enumerate()
        .map(|(i, slot)| mapping::slot_lb_name(cluster, svc, i, slot.family))
        .collect()
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

/// Every Service naming a network, primary or secondary, is checked against the guest's NAD mapping
/// first (as upstream's EnsureLoadBalancer does before anything else): the interface kube-vip
/// announces on (`nad_mapping` is the ConfigMap's value; `None` when the ConfigMap does not exist,
/// and the Service passes through).
pub(crate) fn judge_network(
    svc: &Service,
    nad_mapping: Option<Option<&str>>,
) -> Result<Option<String>, GuestError> {
    let network = annotation(svc, keys::SVC_NETWORK).unwrap_or_default();
    network::service_interface(nad_mapping, network, &service_key(svc))
}

/// A primary: the plan of its LoadBalancer, refusing network and IPAM changes against `existing`.
pub(crate) fn judge_primary(
    svc: &Service,
    ctx: &GuestContext,
    existing: Option<&LoadBalancer>,
) -> Result<LbPlan, GuestError> {
    let addressing = mapping::addressing(svc)?;
    let first = addressing.slots.first().cloned().unwrap_or_default();
    mapping::plan_slot(
        svc,
        ctx,
        existing.map(existing_view).as_ref(),
        0,
        &first,
        None,
    )
}

/// The plan of the LoadBalancer in slot `index` of a primary Service (see [`mapping::addressing`]);
/// `carried`: the DHCP record a deleted Service of the same name left (see [`super::dhcp`]).
pub(crate) fn judge_slot(
    svc: &Service,
    ctx: &GuestContext,
    existing: Option<&LoadBalancer>,
    index: usize,
    slot: &mapping::Slot,
    carried: Option<&DhcpRecord>,
) -> Result<LbPlan, GuestError> {
    mapping::plan_slot(
        svc,
        ctx,
        existing.map(existing_view).as_ref(),
        index,
        slot,
        carried,
    )
}

/// A secondary of `primary_ref`: the primary's address, if it may share it with `others` (the
/// primary's other secondaries) and its network is that of the primary's LoadBalancer
/// (`primary_lb`, when it exists).
pub(crate) fn judge_secondary(
    svc: &Service,
    primary_ref: (&str, &str),
    primary: Option<&Service>,
    primary_lb: Option<&LoadBalancer>,
    others: &[&Service],
) -> Result<String, GuestError> {
    let primary = primary.ok_or_else(|| GuestError::PrimaryNotFound {
        namespace: primary_ref.0.into(),
        name: primary_ref.1.into(),
    })?;
    // A primary admitted to a sharing group shares the group's address: a secondary's ports would
    // escape the group's clash check.
    if let Ok(Some(k)) = sharing::sharing_key(primary)
        && annotation(primary, keys::SVC_SHARED_LOAD_BALANCER).is_some_and(|v| !v.is_empty())
    {
        return Err(GuestError::PrimarySharesByKey {
            primary: service_key(primary),
            secondary: service_key(svc),
            key: crate::validation::go_quote(&k.value),
        });
    }
    let ip = share::check(primary, svc, others)?;
    share::check_network(svc, primary_lb)?;
    Ok(ip)
}

/// The guest cluster that made a LoadBalancer, if it recorded itself (upstream's cloud provider,
/// and versions of ours before the record, do not).
pub(crate) fn maker_of(lb: &LoadBalancer) -> Option<&str> {
    lb.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::ANNOTATION_GUEST_CLUSTER_ID))
        .map(String::as_str)
        .filter(|m| !m.is_empty())
}

/// Whether guest cluster `ctx` looks at a LoadBalancer at all: labelled with its cluster name and a
/// Service, and made by it or by no one it can tell (a LoadBalancer of upstream's cloud provider,
/// which records no maker); or one of its sharing groups' ([`sharing::group_of`]). Another guest
/// cluster's, sharing the name and the namespace, is not.
pub fn in_scope(ctx: &GuestContext, lb: &LoadBalancer) -> bool {
    service_of(ctx, lb).is_some() || sharing::group_of(ctx, lb).is_some()
}

/// The Service a LoadBalancer was made for, when it is in `ctx`'s scope ([`in_scope`]).
pub(crate) fn service_of(ctx: &GuestContext, lb: &LoadBalancer) -> Option<ObjectRef<Service>> {
    if maker_of(lb).is_some_and(|m| m != ctx.identity) {
        return None;
    }
    let labels = lb.metadata.labels.as_ref()?;
    if labels.get(keys::LABEL_GUEST_CLUSTER) != Some(&ctx.cluster) {
        return None;
    }
    let ns = labels.get(keys::LABEL_SERVICE_NAMESPACE)?;
    let name = labels.get(keys::LABEL_SERVICE_NAME)?;
    Some(ObjectRef::new(name).within(ns))
}

/// Whether a LoadBalancer made for Service `svc` (`None`: the Service does not exist) is left over:
/// this guest cluster made it (its record says so), and the Service is gone or was recreated with a
/// new UID. One without the record is never left over: nothing proves it is this cluster's rather
/// than another's of the same name; its own Service adopts it (the LoadBalancer's name is made from
/// the Service's UID, and the next sync records the maker).
pub(crate) fn is_leftover(ctx: &GuestContext, lb: &LoadBalancer, svc: Option<&Service>) -> bool {
    if maker_of(lb) != Some(ctx.identity.as_str()) {
        return false;
    }
    let Some(svc) = svc else {
        return true;
    };
    let uid = svc.metadata.uid.as_deref().unwrap_or_default();
    let recorded = lb
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::ANNOTATION_SERVICE_UID));
    if recorded.is_some_and(|r| r != uid) {
        return true;
    }
    // A name the Service no longer needs (a dual-stack Service become single-stack); while what
    // it asks for cannot be read, none of its names.
    let wanted = match mapping::addressing(svc) {
        Ok(addressing) => Some(slot_names(&ctx.cluster, svc, &addressing)),
        Err(_) => lb_names_of(&ctx.cluster, svc),
    };
    !wanted
        .unwrap_or_default()
        .iter()
        .any(|n| Some(n.as_str()) == lb.metadata.name.as_deref())
}

/// The LoadBalancer the plan of a primary Service asks for.
pub fn new_lb(plan: &LbPlan) -> LoadBalancer {
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
            listeners: plan.listeners.clone().unwrap_or_default(),
            ..Default::default()
        },
    );
    lb.metadata.namespace = Some(plan.namespace.clone());
    lb.metadata.labels = Some(plan.labels.clone());
    lb.metadata.annotations = Some(annotations);
    lb
}

/// Brings an existing LoadBalancer to the plan; says whether anything changed.
pub(crate) fn update_lb(lb: &mut LoadBalancer, plan: &LbPlan) -> bool {
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
    if let Some(listeners) = &plan.listeners
        && &lb.spec.listeners != listeners
    {
        lb.spec.listeners = listeners.clone();
        changed = true;
    }
    changed
}

pub(crate) fn set_annotation(svc: &mut Service, key: &str, value: &str) -> bool {
    let a = svc.metadata.annotations.get_or_insert_default();
    if a.get(key).map(String::as_str) == Some(value) {
        return false;
    }
    a.insert(key.into(), value.into());
    true
}

pub(crate) fn remove_annotation(svc: &mut Service, key: &str) -> bool {
    svc.metadata
        .annotations
        .as_mut()
        .is_some_and(|a| a.remove(key).is_some())
}

pub(crate) fn set_label(svc: &mut Service, key: &str, value: &str) -> bool {
    let l = svc.metadata.labels.get_or_insert_default();
    if l.get(key).map(String::as_str) == Some(value) {
        return false;
    }
    l.insert(key.into(), value.into());
    true
}

/// Empties a label that is set to something; one that is absent stays absent.
pub(crate) fn empty_label(svc: &mut Service, key: &str) -> bool {
    match svc.metadata.labels.as_mut().and_then(|l| l.get_mut(key)) {
        Some(v) if !v.is_empty() => {
            v.clear();
            true
        }
        _ => false,
    }
}

/// Sets `status.loadBalancer.ingress` to the addresses, in order (none for an empty slice).
pub(crate) fn set_ingress(svc: &mut Service, ips: &[&str]) -> bool {
    let want: Vec<LoadBalancerIngress> = ips
        .iter()
        .map(|ip| LoadBalancerIngress {
            ip: Some((*ip).into()),
            ..Default::default()
        })
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
pub(crate) fn not_ready_message(lb: &LoadBalancer) -> Option<String> {
    lb.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.r#type == "Ready" && c.status == "False")
        .map(|c| c.message.clone())
        .filter(|m| !m.is_empty())
}

/// What a Service reconcile depends on: not its resourceVersion, nor its status but for the address
/// kube-vip reports.
pub(crate) fn service_fingerprint(svc: &Service) -> Option<u64> {
    crate::controller::reconcile_fingerprint(&svc.metadata, &svc.spec, mapping::ingress_ip(svc))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

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
            identity: "guest-a".into(),
            lb_namespace: "default".into(),
            management_network: None,
        }
    }

    /// The LoadBalancer `svc` gets, with the Service UID and maker records as given (`None`: not
    /// recorded, as upstream's cloud provider makes it).
    fn mk_lb_for(svc: &Service, uid: Option<&str>, maker: Option<&str>) -> LoadBalancer {
        let plan = judge_primary(svc, &mk_ctx(), None).expect("plan");
        let mut lb = new_lb(&plan);
        let annotations = lb.metadata.annotations.get_or_insert_default();
        for (key, value) in [
            (keys::ANNOTATION_SERVICE_UID, uid),
            (keys::ANNOTATION_GUEST_CLUSTER_ID, maker),
        ] {
            match value {
                Some(v) => annotations.insert(key.into(), v.into()),
                None => annotations.remove(key),
            };
        }
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
        let plan = judge_primary(&svc, &mk_ctx(), None).expect("plan");
        assert_eq!(
            judge_network(&svc, None),
            Ok(None),
            "no NAD mapping: passes"
        );
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
        // As Harvester's mutator stores it (the LoadBalancer's namespace, the namespace's
        // project): a Service that gives neither has nothing to write again.
        let mut mutated = lb.clone();
        let a = mutated.metadata.annotations.get_or_insert_default();
        a.insert(keys::ANNOTATION_NAMESPACE.into(), "gc-ns".into());
        a.insert(keys::ANNOTATION_PROJECT.into(), "c-1/p-1".into());
        assert!(!update_lb(&mut mutated.clone(), &plan));
        // One the Service gives is written again, as upstream writes it.
        let given = mk_svc(
            "default",
            "abcd",
            UID,
            &[
                (keys::SVC_NETWORK, "default/vlan1"),
                (keys::SVC_PROJECT, "c-2/p-2"),
            ],
        );
        let plan = judge_primary(&given, &mk_ctx(), None).expect("plan");
        assert!(update_lb(&mut mutated, &plan));
        let a = mutated.metadata.annotations.expect("annotations");
        assert_eq!(a[keys::ANNOTATION_PROJECT], "c-2/p-2");
        assert_eq!(a[keys::ANNOTATION_NAMESPACE], "gc-ns");
    }

    #[test]
    fn leftovers_are_only_this_cluster_s_own() {
        let ctx = mk_ctx();
        let svc = mk_svc("default", "abcd", UID, &[]);
        let recreated = mk_svc("default", "abcd", "another-uid", &[]);
        let mine = mk_lb_for(&svc, Some(UID), Some("guest-a"));
        assert_eq!(maker_of(&mine), Some("guest-a"));
        assert!(in_scope(&ctx, &mine));
        assert!(!is_leftover(&ctx, &mine, Some(&svc)));
        assert!(is_leftover(&ctx, &mine, None));
        assert!(is_leftover(&ctx, &mine, Some(&recreated)));
        // Another guest cluster of the same name, in the same namespace: out of scope, never
        // collected, whatever this cluster's Services.
        let theirs = mk_lb_for(&svc, Some(UID), Some("guest-b"));
        assert!(!in_scope(&ctx, &theirs));
        assert_eq!(service_of(&ctx, &theirs), None);
        assert!(!is_leftover(&ctx, &theirs, None));
        // Upstream's (no maker recorded): in scope, adopted by its Service, never collected.
        let upstream = mk_lb_for(&svc, None, None);
        assert!(in_scope(&ctx, &upstream));
        assert!(!is_leftover(&ctx, &upstream, None));
        assert!(!is_leftover(&ctx, &upstream, Some(&recreated)));
        let mut adopted = upstream.clone();
        let plan = judge_primary(&svc, &ctx, Some(&upstream)).expect("plan");
        assert!(update_lb(&mut adopted, &plan), "the sync records the maker");
        assert_eq!(maker_of(&adopted), Some("guest-a"));
        assert_eq!(
            service_of(&ctx, &mine),
            Some(ObjectRef::new("abcd").within("default"))
        );
        let other_name = GuestContext {
            cluster: "other".into(),
            ..mk_ctx()
        };
        assert_eq!(service_of(&other_name, &mine), None);
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
        // pkg/cloud-controller-manager/loadbalancer.go (getPrimaryService): the Service cache's
        // NotFound, wrapped.
        assert_eq!(
            judge_secondary(&secondary, ("default", "p"), None, None, &[])
                .expect_err("no primary")
                .to_string(),
            "get service default/p failed: service \"p\" not found"
        );
        // Same port, same protocol as the primary.
        assert!(matches!(
            judge_secondary(&secondary, ("default", "p"), Some(&primary), None, &[]),
            Err(GuestError::PortInUse { .. })
        ));
        let mut udp = secondary.clone();
        udp.spec
            .as_mut()
            .and_then(|s| s.ports.as_mut())
            .expect("ports")[0]
            .protocol = Some("UDP".into());
        let primary_lb = new_lb(&judge_primary(&primary, &mk_ctx(), None).expect("plan"));
        assert_eq!(
            judge_secondary(
                &udp,
                ("default", "p"),
                Some(&primary),
                Some(&primary_lb),
                &[]
            ),
            Ok("10.0.0.5".into())
        );
        let mut elsewhere = udp.clone();
        elsewhere
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(keys::SVC_NETWORK.into(), "default/vlan2".into());
        assert_eq!(
            judge_secondary(
                &elsewhere,
                ("default", "p"),
                Some(&primary),
                Some(&primary_lb),
                &[]
            )
            .expect_err("network")
            .to_string(),
            format!(
                "network annotation of service default/s is not same as the load balancer default/{}, service: 'default/vlan2', lb: 'default/vlan1'",
                lb_name_of("test", &primary).expect("a name")
            )
        );
    }

    #[test]
    fn ingress_and_annotations_are_written_only_when_they_change() {
        let mut svc = mk_svc("default", "abcd", UID, &[]);
        assert!(set_ingress(&mut svc, &["10.0.0.1"]));
        assert!(!set_ingress(&mut svc, &["10.0.0.1"]));
        assert_eq!(mapping::ingress_ip(&svc).as_deref(), Some("10.0.0.1"));
        assert!(set_ingress(&mut svc, &[]));
        assert_eq!(mapping::ingress_ip(&svc), None);
        assert!(set_annotation(&mut svc, keys::KUBE_VIP_IPS, "10.0.0.1"));
        assert!(!set_annotation(&mut svc, keys::KUBE_VIP_IPS, "10.0.0.1"));
        assert!(remove_annotation(&mut svc, keys::KUBE_VIP_IPS));
        assert!(!remove_annotation(&mut svc, keys::KUBE_VIP_IPS));
        // pkg/cloud-controller-manager/loadbalancer.go (updatePrimaryServiceLoadBalancerIP): the
        // primary-service label is emptied only when present and not empty, never added.
        assert!(!empty_label(&mut svc, keys::SVC_PRIMARY));
        assert_eq!(
            svc.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(keys::SVC_PRIMARY)),
            None
        );
        assert!(set_label(&mut svc, keys::SVC_PRIMARY, "default.p"));
        assert!(empty_label(&mut svc, keys::SVC_PRIMARY));
        assert!(!empty_label(&mut svc, keys::SVC_PRIMARY));
        assert_eq!(
            svc.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(keys::SVC_PRIMARY))
                .map(String::as_str),
            Some("")
        );
    }
}
