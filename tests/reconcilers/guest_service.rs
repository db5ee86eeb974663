//! One guest Service reconcile at a time (`guest::reconcile::reconcile`), on a guest cluster of the
//! embedded backend, with Harvester's side played by hand (a LoadBalancer's status is written as
//! its reconciler would write it): every way a Service is served, skipped, refused and cleaned up,
//! with the Service and LoadBalancers it leaves, the Events on the Service and the action.

use harvester_cloud::controller::Action;
use harvester_cloud::{
    crd::{LoadBalancer, keys, kinds::VirtualMachine},
    guest::reconcile::FINALIZER,
    store::Api,
};
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use serde_json::{Value, json};

use crate::world::{GuestWorld, NS, normal, requeue, typed, warning};

/// A Service of type LoadBalancer in `default`, on these TCP ports, with these annotations.
fn mk_svc(name: &str, ports: &[i32], annotations: &[(&str, &str)]) -> Value {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let ports: Vec<Value> = ports
        .iter()
        .map(|p| json!({"name": format!("p{p}"), "protocol": "TCP", "port": p}))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "default", "name": name, "annotations": annotations},
        "spec": {"type": "LoadBalancer", "ports": ports}
    })
}

/// A secondary of `default/primary` on `port`.
fn secondary(name: &str, port: i32) -> Value {
    mk_svc(name, &[port], &[(keys::SVC_PRIMARY, "default/primary")])
}

fn annotation<'a>(svc: &'a Service, key: &str) -> Option<&'a str> {
    svc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn ingress(svc: &Service) -> Vec<String> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|i| i.iter().filter_map(|i| i.ip.clone()).collect())
        .unwrap_or_default()
}

fn has_finalizer(svc: &Service) -> bool {
    svc.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
}

fn lb_key(lb: &LoadBalancer) -> String {
    format!("{NS}/{}", lb.metadata.name.as_deref().unwrap_or_default())
}

/// The guest's NAD mapping ConfigMap with this `interface-nad-mapping` value.
async fn set_nad_mapping(w: &GuestWorld, mapping: &str) {
    let cm: ConfigMap = typed(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"namespace": keys::NAD_MAPPING_NAMESPACE, "name": keys::NAD_MAPPING_NAME},
        "data": {keys::NAD_MAPPING_KEY: mapping}
    }));
    Api::<ConfigMap>::new(w.ports.guest.clone())
        .create(&cm)
        .await
        .expect("creates the NAD mapping");
}

/// A served primary `default/primary` on port 80 with `ip`.
async fn served_primary(w: &mut GuestWorld, ip: &str) -> LoadBalancer {
    w.add(mk_svc("primary", &[80], &[])).await;
    w.reconcile("default", "primary").await;
    let lb = w.lb_of("default", "primary").await;
    w.allocate(&lb, ip).await;
    w.reconcile("default", "primary").await;
    w.events();
    lb
}

/// The refusal one reconcile ends in: a Warning `SyncLoadBalancerFailed` with `message` on the
/// Service, and a look again in a minute.
async fn assert_refused(w: &mut GuestWorld, name: &str, message: &str) {
    assert_eq!(w.reconcile("default", name).await, requeue(60));
    assert_eq!(
        w.events(),
        [warning(
            &format!("default/{name}"),
            "SyncLoadBalancerFailed",
            message
        )]
    );
}

// --- Served ------------------------------------------------------------------------------------

#[tokio::test]
async fn a_load_balancer_service_gets_the_finalizer_and_a_load_balancer_and_waits_for_its_address()
{
    let mut w = GuestWorld::new().await;
    let svc = w.add(mk_svc("web", &[80], &[])).await;

    assert_eq!(w.reconcile("default", "web").await, requeue(30));

    assert!(has_finalizer(&w.svc("default", "web").await));
    let lb = w.lb_of("default", "web").await;
    assert_eq!(lb.spec.ipam, "pool");
    assert_eq!(lb.spec.workload_type, "cluster");
    let annotations = lb.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get(keys::ANNOTATION_SERVICE_UID),
        svc.metadata.uid.as_ref()
    );
    assert_eq!(
        annotations
            .get(keys::ANNOTATION_GUEST_CLUSTER_ID)
            .map(String::as_str),
        Some("embedded:gc-test/gc1")
    );
    assert_eq!(
        lb.metadata
            .labels
            .clone()
            .unwrap_or_default()
            .get(keys::LABEL_GUEST_CLUSTER)
            .map(String::as_str),
        Some("gc1")
    );
    assert!(ingress(&w.svc("default", "web").await).is_empty());
    assert_eq!(w.events(), []);
}

/// A LoadBalancer made by a pass and deleted behind the reconciler's back before its cache ever
/// showed it: once the watch delivers the deletion, the next pass makes it again instead of
/// waiting on one that is gone.
#[tokio::test]
async fn a_load_balancer_deleted_before_the_cache_showed_it_is_made_again() {
    let mut w = GuestWorld::new().await;
    w.add(mk_svc("web", &[80], &[])).await;
    assert_eq!(w.reconcile("default", "web").await, requeue(30));
    let lb = w.lb_of("default", "web").await;
    let name = lb.metadata.name.clone().unwrap();
    // Gone for good (the world's load balancer controller releases it as it is deleted); the
    // watch delivers a deletion once it is done.
    w.lbs()
        .delete(NS, &name, &Default::default())
        .await
        .expect("deletes");
    assert!(w.try_lb(&name).await.is_none());
    w.deliver_lb_deletion(&lb);

    assert_eq!(
        w.reconcile_before_the_lb_watch("default", "web").await,
        requeue(30)
    );
    let again = w.lb_of("default", "web").await;
    assert_ne!(again.metadata.uid, lb.metadata.uid, "made again");
}

/// Its finalizer's own change brings a Service back at once, often before the LoadBalancer watch
/// shows the LoadBalancer the first pass made: it is found as written, not created again into an
/// AlreadyExists and a read. Once the cache is newer (the address allocated), the cache is read.
#[tokio::test]
async fn a_service_back_before_the_watch_shows_its_load_balancer_does_not_create_it_again() {
    let mut w = GuestWorld::new().await;
    w.add(mk_svc("web", &[80], &[])).await;
    assert_eq!(w.reconcile("default", "web").await, requeue(30));
    let made = w.harvester_writes();
    assert_eq!(made, 1, "the first pass creates the load balancer");

    assert_eq!(
        w.reconcile_before_the_lb_watch("default", "web").await,
        requeue(30)
    );
    assert_eq!(w.harvester_writes(), made, "nothing written again");

    // Versions are compared as numbers: the allocation's has one digit more than the creation's.
    let lb = w.lb_of("default", "web").await;
    let created: u64 = lb
        .metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    for i in 0..(10 - created.min(10)) {
        w.add(mk_svc(&format!("filler-{i}"), &[80], &[])).await;
    }
    w.allocate(&lb, "192.168.0.10").await;
    let allocated = w.lb_of("default", "web").await;
    assert!(
        created < 10
            && allocated
                .metadata
                .resource_version
                .as_deref()
                .unwrap()
                .len()
                > 1
    );
    // The watch delivers the allocated version (not a new list): the copy it supersedes goes.
    w.deliver_lbs().await;
    assert_eq!(
        w.reconcile_before_the_lb_watch("default", "web").await,
        Action::await_change()
    );
    assert_eq!(ingress(&w.svc("default", "web").await), ["192.168.0.10"]);
    // The cache is the one view again: once settled (the pass after the write-back adds the
    // address family the Service now reads), a pass writes nothing on Harvester.
    w.reconcile("default", "web").await;
    for _ in 0..2 {
        let writes = w.harvester_writes();
        assert_eq!(w.reconcile("default", "web").await, Action::await_change());
        assert_eq!(
            w.harvester_writes(),
            writes,
            "nothing written once the cache shows it"
        );
    }
}

#[tokio::test]
async fn the_address_of_its_load_balancer_is_written_back_to_the_service() {
    let mut w = GuestWorld::new().await;
    w.add(mk_svc("web", &[80], &[])).await;
    w.reconcile("default", "web").await;
    let lb = w.lb_of("default", "web").await;
    w.allocate(&lb, "192.168.0.10").await;

    assert_eq!(w.reconcile("default", "web").await, Action::await_change());

    let svc = w.svc("default", "web").await;
    assert_eq!(annotation(&svc, keys::KUBE_VIP_IPS), Some("192.168.0.10"));
    assert_eq!(ingress(&svc), ["192.168.0.10"]);
    assert_eq!(
        w.events(),
        [normal(
            "default/web",
            "EnsuredLoadBalancer",
            &format!(
                "Ensured load balancer {} with address 192.168.0.10",
                lb_key(&lb)
            )
        )]
    );
}

#[tokio::test]
async fn reconciling_a_served_service_again_writes_and_reports_nothing() {
    let mut w = GuestWorld::new().await;
    served_primary(&mut w, "192.168.0.10").await;
    let before = w.svc("default", "primary").await;

    assert_eq!(
        w.reconcile("default", "primary").await,
        Action::await_change()
    );

    let after = w.svc("default", "primary").await;
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );
    assert_eq!(w.events(), []);
}

#[tokio::test]
async fn a_dhcp_service_gets_the_dhcp_mark_and_no_ingress() {
    let mut w = GuestWorld::new().await;
    w.add(mk_svc("web", &[80], &[(keys::SVC_IPAM, "dhcp")]))
        .await;
    w.reconcile("default", "web").await;
    let lb = w.lb_of("default", "web").await;
    assert_eq!(lb.spec.ipam, "dhcp");
    w.allocate(&lb, keys::DHCP_ADDRESS).await;

    assert_eq!(w.reconcile("default", "web").await, Action::await_change());

    let svc = w.svc("default", "web").await;
    assert_eq!(annotation(&svc, keys::KUBE_VIP_IPS), Some("0.0.0.0"));
    assert!(ingress(&svc).is_empty(), "the guest's kube-vip reports it");
}

#[tokio::test]
async fn a_network_in_the_nad_mapping_gives_kube_vip_its_interface() {
    let mut w = GuestWorld::new().await;
    set_nad_mapping(&w, r#"{"default/vlan1":"enp2s0"}"#).await;
    w.add(mk_svc(
        "web",
        &[80],
        &[(keys::SVC_NETWORK, "default/vlan1")],
    ))
    .await;
    w.reconcile("default", "web").await;
    let lb = w.lb_of("default", "web").await;
    assert_eq!(
        lb.metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .get(keys::ANNOTATION_SERVICE_NETWORK)
            .map(String::as_str),
        Some("default/vlan1")
    );
    w.allocate(&lb, "192.168.1.10").await;

    w.reconcile("default", "web").await;

    let svc = w.svc("default", "web").await;
    assert_eq!(annotation(&svc, keys::KUBE_VIP_INTERFACE), Some("enp2s0"));
    assert_eq!(ingress(&svc), ["192.168.1.10"]);
}

#[tokio::test]
async fn a_secondary_shares_its_primary_s_address_and_gets_no_load_balancer() {
    let mut w = GuestWorld::new().await;
    served_primary(&mut w, "192.168.0.10").await;
    w.add(secondary("second", 8080)).await;

    assert_eq!(
        w.reconcile("default", "second").await,
        Action::await_change()
    );

    let svc = w.svc("default", "second").await;
    assert_eq!(annotation(&svc, keys::KUBE_VIP_IPS), Some("192.168.0.10"));
    assert_eq!(ingress(&svc), ["192.168.0.10"]);
    assert_eq!(
        svc.metadata
            .labels
            .clone()
            .unwrap_or_default()
            .get(keys::SVC_PRIMARY)
            .map(String::as_str),
        Some("default.primary")
    );
    assert_eq!(w.all_lbs().await.len(), 1, "only the primary's");
    assert_eq!(
        w.events(),
        [normal(
            "default/second",
            "EnsuredLoadBalancer",
            "Ensured address 192.168.0.10 shared with primary service default/primary"
        )]
    );
}

// --- Skipped -------------------------------------------------------------------------------------

#[tokio::test]
async fn a_service_that_is_not_a_load_balancer_is_left_alone() {
    let mut w = GuestWorld::new().await;
    let mut svc = mk_svc("web", &[80], &[]);
    svc["spec"]["type"] = json!("ClusterIP");
    w.add(svc).await;

    assert_eq!(w.reconcile("default", "web").await, Action::await_change());

    assert!(!has_finalizer(&w.svc("default", "web").await));
    assert!(w.all_lbs().await.is_empty());
    assert_eq!(w.events(), []);
}

#[tokio::test]
async fn a_service_of_another_load_balancer_class_is_left_alone() {
    let mut w = GuestWorld::new().await;
    let mut svc = mk_svc("web", &[80], &[]);
    svc["spec"]["loadBalancerClass"] = json!("example.com/other");
    w.add(svc).await;

    assert_eq!(w.reconcile("default", "web").await, Action::await_change());

    assert!(!has_finalizer(&w.svc("default", "web").await));
    assert!(w.all_lbs().await.is_empty());
}

#[tokio::test]
async fn a_service_whose_load_balancer_is_being_deleted_waits_for_it_to_go() {
    let mut w = GuestWorld::new().await;
    w.add(mk_svc("web", &[80], &[])).await;
    w.reconcile("default", "web").await;
    // Harvester's finalizer holds the LoadBalancer while it releases the address.
    let mut lb = w.lb_of("default", "web").await;
    lb.metadata.finalizers = Some(vec!["test/releasing".into()]);
    w.lbs().replace(&lb).await.expect("adds a finalizer");
    w.lbs()
        .delete(
            NS,
            lb.metadata.name.as_deref().expect("name"),
            &Default::default(),
        )
        .await
        .expect("deletes the load balancer");

    assert_eq!(w.reconcile("default", "web").await, requeue(30));

    assert_eq!(w.all_lbs().await.len(), 1, "no second one meanwhile");
    assert_eq!(w.events(), []);
}

// --- Refused -------------------------------------------------------------------------------------

#[tokio::test]
async fn a_refused_load_balancer_is_reported_on_its_waiting_service_once() {
    let mut w = GuestWorld::new().await;
    w.add(mk_svc("web", &[80], &[])).await;
    w.reconcile("default", "web").await;
    let lb = w.lb_of("default", "web").await;
    w.refuse(&lb, "NoMatchedIPPool", "no matched IPPool").await;

    assert_eq!(w.reconcile("default", "web").await, requeue(30));
    assert_eq!(
        w.events(),
        [warning(
            "default/web",
            "SyncLoadBalancerFailed",
            "ip is not allocated, mode: pool, message: no matched IPPool"
        )]
    );

    assert_eq!(w.reconcile("default", "web").await, requeue(30));
    assert_eq!(w.events(), [], "the same refusal is reported once");
}

#[tokio::test]
async fn an_unknown_ipam_mode_is_refused_before_any_load_balancer_is_made() {
    let mut w = GuestWorld::new().await;
    w.add(mk_svc("web", &[80], &[(keys::SVC_IPAM, "static")]))
        .await;
    assert_refused(
        &mut w,
        "web",
        "service default/web: annotation cloudprovider.harvesterhci.io/ipam is \"static\": supported values: \"pool\", \"dhcp\"",
    )
    .await;
    assert!(w.all_lbs().await.is_empty());
}

#[tokio::test]
async fn changing_the_ipam_mode_is_refused() {
    let mut w = GuestWorld::new().await;
    w.add(mk_svc("web", &[80], &[])).await;
    w.reconcile("default", "web").await;
    let lb = w.lb_of("default", "web").await;
    w.edit("default", "web", |s| {
        s.metadata
            .annotations
            .get_or_insert_default()
            .insert(keys::SVC_IPAM.into(), "dhcp".into());
    })
    .await;
    let message = format!(
        "ipam annotation of service default/web is not same as the load balancer {}, service: 'dhcp', lb: 'pool'; the IPAM mode of a load balancer cannot change: create a new service instead",
        lb_key(&lb)
    );
    assert_refused(&mut w, "web", &message).await;
    assert_eq!(w.lb_of("default", "web").await.spec.ipam, "pool");
}

#[tokio::test]
async fn changing_the_network_is_refused() {
    let mut w = GuestWorld::new().await;
    w.add(mk_svc("web", &[80], &[])).await;
    w.reconcile("default", "web").await;
    let lb = w.lb_of("default", "web").await;
    w.edit("default", "web", |s| {
        s.metadata
            .annotations
            .get_or_insert_default()
            .insert(keys::SVC_NETWORK.into(), "default/vlan1".into());
    })
    .await;
    let message = format!(
        "network annotation of service default/web is not same as the load balancer {}, service: 'default/vlan1', lb: ''",
        lb_key(&lb)
    );
    assert_refused(&mut w, "web", &message).await;
}

#[tokio::test]
async fn a_network_with_an_empty_nad_mapping_is_refused() {
    let mut w = GuestWorld::new().await;
    set_nad_mapping(&w, "").await;
    w.add(mk_svc(
        "web",
        &[80],
        &[(keys::SVC_NETWORK, "default/vlan1")],
    ))
    .await;
    assert_refused(
        &mut w,
        "web",
        "there is no common NAD mapping: kube-system/harvester-nad-mapping is empty",
    )
    .await;
    assert!(w.all_lbs().await.is_empty());
}

#[tokio::test]
async fn a_network_missing_from_the_nad_mapping_is_refused() {
    let mut w = GuestWorld::new().await;
    set_nad_mapping(&w, r#"{"default/vlan1":"enp2s0"}"#).await;
    w.add(mk_svc(
        "web",
        &[80],
        &[(keys::SVC_NETWORK, "default/vlan2")],
    ))
    .await;
    assert_refused(
        &mut w,
        "web",
        "network default/vlan2 not found in NAD mapping for service default/web",
    )
    .await;
}

#[tokio::test]
async fn an_address_that_is_not_an_address_is_refused() {
    let mut w = GuestWorld::new().await;
    let mut svc = mk_svc("web", &[80], &[]);
    svc["spec"]["loadBalancerIP"] = json!("not-an-ip");
    w.add(svc).await;
    assert_refused(
        &mut w,
        "web",
        "service default/web: requested address \"not-an-ip\" is not an IP address",
    )
    .await;
    assert!(w.all_lbs().await.is_empty());
}

#[tokio::test]
async fn a_load_balancer_that_admission_refuses_is_reported_on_the_service() {
    let mut w = GuestWorld::new().await;
    // Rancher is removing the guest cluster: Harvester's webhook refuses its new LoadBalancers.
    let vm: VirtualMachine = typed(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"namespace": NS, "name": "gc1-pool1-a", "labels": {
            keys::LABEL_CREATOR: keys::NODE_DRIVER, keys::LABEL_GUEST_CLUSTER_NAME: "gc1"},
            "annotations": {keys::ANNOTATION_REMOVE_ALL_PVCS: "true"}},
        "spec": {}
    }));
    Api::<VirtualMachine>::new(w.raw.clone())
        .create(&vm)
        .await
        .expect("creates the VM");
    w.add(mk_svc("web", &[80], &[])).await;

    assert_eq!(w.reconcile("default", "web").await, requeue(60));

    let events = w.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let (reason, message) = (&events[0].reason, &events[0].message);
    assert_eq!(reason, "SyncLoadBalancerFailed");
    assert!(
        message.starts_with(&format!("create or update lb {NS}/"))
            && message.contains("gc1-pool1-a"),
        "{message}"
    );
    assert!(w.all_lbs().await.is_empty());
}

#[tokio::test]
async fn a_secondary_of_a_primary_that_does_not_exist_is_refused() {
    let mut w = GuestWorld::new().await;
    w.add(secondary("second", 8080)).await;
    assert_refused(
        &mut w,
        "second",
        "get service default/primary failed: service \"primary\" not found",
    )
    .await;
}

#[tokio::test]
async fn a_secondary_naming_an_invalid_primary_is_refused() {
    let mut w = GuestWorld::new().await;
    w.add(mk_svc("second", &[8080], &[(keys::SVC_PRIMARY, "a/b/c")]))
        .await;
    assert_refused(&mut w, "second", "invalid service name a/b/c").await;
}

#[tokio::test]
async fn a_secondary_of_a_secondary_is_refused() {
    let mut w = GuestWorld::new().await;
    served_primary(&mut w, "192.168.0.10").await;
    w.add(secondary("second", 8080)).await;
    w.reconcile("default", "second").await;
    w.add(mk_svc(
        "third",
        &[9090],
        &[(keys::SVC_PRIMARY, "default/second")],
    ))
    .await;
    w.events();
    assert_refused(
        &mut w,
        "third",
        "service default/second is not a primary service",
    )
    .await;
}

#[tokio::test]
async fn a_secondary_of_a_primary_without_an_address_is_refused() {
    let mut w = GuestWorld::new().await;
    w.add(mk_svc("primary", &[80], &[])).await;
    w.reconcile("default", "primary").await;
    w.add(secondary("second", 8080)).await;
    assert_refused(
        &mut w,
        "second",
        "primary service default/primary has no ingress IP",
    )
    .await;
}

#[tokio::test]
async fn a_secondary_on_a_port_its_primary_uses_is_refused() {
    let mut w = GuestWorld::new().await;
    served_primary(&mut w, "192.168.0.10").await;
    w.add(secondary("second", 80)).await;
    assert_refused(
        &mut w,
        "second",
        "check port overlap failed, primary service: default/primary, secondary service: default/second, error: port 80 has been used in service default/primary",
    )
    .await;
}

#[tokio::test]
async fn a_secondary_of_a_dual_stack_primary_is_refused() {
    let mut w = GuestWorld::new().await;
    served_primary(&mut w, "192.168.0.10").await;
    // Two addresses in the primary's ingress, as a dual-stack primary has.
    let mut primary = w.svc("default", "primary").await;
    primary.status = Some(typed(json!({"loadBalancer": {"ingress": [
        {"ip": "192.168.0.10"}, {"ip": "fd00::10"}]}})));
    w.services()
        .replace_status(&primary)
        .await
        .expect("writes the ingress");
    w.add(secondary("second", 8080)).await;
    assert_refused(
        &mut w,
        "second",
        "primary service default/primary is dual-stack; sharing its addresses is not supported: give service default/second its own load balancer",
    )
    .await;
}

#[tokio::test]
async fn a_secondary_on_another_network_than_its_primary_s_load_balancer_is_refused() {
    let mut w = GuestWorld::new().await;
    let lb = served_primary(&mut w, "192.168.0.10").await;
    w.add(mk_svc(
        "second",
        &[8080],
        &[
            (keys::SVC_PRIMARY, "default/primary"),
            (keys::SVC_NETWORK, "default/vlan1"),
        ],
    ))
    .await;
    let message = format!(
        "network annotation of service default/second is not same as the load balancer {}, service: 'default/vlan1', lb: ''",
        lb_key(&lb)
    );
    assert_refused(&mut w, "second", &message).await;
}

// --- Cleaned up ----------------------------------------------------------------------------------

#[tokio::test]
async fn a_deleted_service_deletes_its_load_balancer_and_loses_its_finalizer() {
    let mut w = GuestWorld::new().await;
    let lb = served_primary(&mut w, "192.168.0.10").await;

    w.delete("default", "primary").await;
    assert_eq!(
        w.reconcile("default", "primary").await,
        Action::await_change()
    );

    assert!(w.try_svc("default", "primary").await.is_none());
    assert!(w.all_lbs().await.is_empty());
    assert_eq!(
        w.events(),
        [normal(
            "default/primary",
            "DeletedLoadBalancer",
            &format!("Deleted load balancer {}", lb_key(&lb))
        )]
    );
}

#[tokio::test]
async fn a_service_no_longer_of_type_load_balancer_gives_everything_back_and_stays() {
    let mut w = GuestWorld::new().await;
    served_primary(&mut w, "192.168.0.10").await;

    w.edit("default", "primary", |s| {
        s.spec.get_or_insert_default().type_ = Some("ClusterIP".into());
    })
    .await;
    assert_eq!(
        w.reconcile("default", "primary").await,
        Action::await_change()
    );

    let svc = w.svc("default", "primary").await;
    assert!(!has_finalizer(&svc));
    assert!(ingress(&svc).is_empty());
    assert_eq!(annotation(&svc, keys::KUBE_VIP_IPS), None);
    assert!(w.all_lbs().await.is_empty());
}

#[tokio::test]
async fn a_primary_still_shared_waits_for_its_secondaries_and_their_going_wakes_it() {
    let mut w = GuestWorld::new().await;
    served_primary(&mut w, "192.168.0.10").await;
    w.add(secondary("second", 8080)).await;
    w.reconcile("default", "second").await;
    w.events();

    w.delete("default", "primary").await;
    assert_eq!(w.reconcile("default", "primary").await, requeue(15));
    assert_eq!(
        w.events(),
        [warning(
            "default/primary",
            "DeleteLoadBalancerFailed",
            "could not delete load balancer for service default/primary: service default/primary is still used by other services [default/second]"
        )]
    );
    assert!(has_finalizer(&w.svc("default", "primary").await));
    assert_eq!(w.all_lbs().await.len(), 1);

    w.delete("default", "second").await;
    w.reconcile("default", "second").await;
    assert_eq!(w.woken(), ["default/primary"]);
    assert_eq!(
        w.reconcile("default", "primary").await,
        Action::await_change()
    );
    assert!(w.try_svc("default", "primary").await.is_none());
    assert!(w.all_lbs().await.is_empty());
}
