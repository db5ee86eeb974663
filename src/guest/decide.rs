//! The guest reconciler's decisions, as pure functions of the objects involved: which Services it
//! serves, which primary a Service names, the name and shape of a Service's LoadBalancer (new, or
//! brought to the plan), whether a LoadBalancer is left over, and the edits written back to the
//! Service. Both the reconciler ([`super::reconcile`]) and the HTTP API ([`super::api`], which refuses
//! up front what the reconciler would refuse) decide with these.

use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus as ServiceLbStatus, Service, ServiceStatus,
};
use kube::runtime::reflector::ObjectRef;

use super::{
    GuestError,
    mapping::{self, ExistingLb, GuestContext, LbPlan, annotation, service_key},
    naming, network, share,
};
use crate::crd::{LoadBalancer, LoadBalancerSpec, keys};

/// The `type` of Services this reconciler serves.
const LOAD_BALANCER: &str = "LoadBalancer";

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
pub fn service_of(cluster: &str, lb: &LoadBalancer) -> Option<ObjectRef<Service>> {
    let labels = lb.metadata.labels.as_ref()?;
    if labels.get(keys::LABEL_GUEST_CLUSTER).map(String::as_str) != Some(cluster) {
        return None;
    }
    let ns = labels.get(keys::LABEL_SERVICE_NAMESPACE)?;
    let name = labels.get(keys::LABEL_SERVICE_NAME)?;
    Some(ObjectRef::new(name).within(ns))
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
            ..Default::default()
        },
    );
    lb.metadata.namespace = Some(plan.namespace.clone());
    lb.metadata.labels = Some(plan.labels.clone());
    lb.metadata.annotations = Some(annotations);
    lb
}

/// Brings an existing LoadBalancer to the plan; says whether anything changed.
pub fn update_lb(lb: &mut LoadBalancer, plan: &LbPlan) -> bool {
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

pub fn set_annotation(svc: &mut Service, key: &str, value: &str) -> bool {
    let a = svc.metadata.annotations.get_or_insert_default();
    if a.get(key).map(String::as_str) == Some(value) {
        return false;
    }
    a.insert(key.into(), value.into());
    true
}

pub fn remove_annotation(svc: &mut Service, key: &str) -> bool {
    svc.metadata
        .annotations
        .as_mut()
        .is_some_and(|a| a.remove(key).is_some())
}

pub fn set_label(svc: &mut Service, key: &str, value: &str) -> bool {
    let l = svc.metadata.labels.get_or_insert_default();
    if l.get(key).map(String::as_str) == Some(value) {
        return false;
    }
    l.insert(key.into(), value.into());
    true
}

/// Sets `status.loadBalancer.ingress` to the one address (none for `None`).
pub fn set_ingress(svc: &mut Service, ip: Option<&str>) -> bool {
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
pub fn not_ready_message(lb: &LoadBalancer) -> Option<String> {
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
pub fn service_fingerprint(svc: &Service) -> Option<u64> {
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
