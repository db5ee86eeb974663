//! One LoadBalancer reconcile at a time (`lb::loadbalancer::reconcile`): every outcome, and every
//! reason a load balancer is refused an address, with the status, the Events and the action it
//! ends in.

use harvester_cloud::controller::Action;
use harvester_cloud::crd::{LB_FINALIZER, LoadBalancer, keys};
use serde_json::{Value, json};

use crate::{
    support::lb::{global, mk_pool, range},
    world::{LbWorld, Reported, normal, requeue, warning},
};

const NS: &str = "default";

/// A guest cluster's load balancer (no VM part: its Service and backends are the guest's), with
/// these annotations.
pub fn mk_lb(name: &str, annotations: &[(&str, &str)]) -> Value {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1",
        "kind": "LoadBalancer",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations},
        "spec": {"ipam": "pool", "workloadType": "cluster"}
    })
}

/// `mk_lb` with `spec` fields set.
pub fn mk_lb_with(name: &str, spec: Value) -> Value {
    let mut lb = mk_lb(name, &[]);
    if let (Some(into), Value::Object(fields)) = (lb["spec"].as_object_mut(), spec) {
        into.extend(fields);
    }
    lb
}

/// Three addresses, .10 to .12 of 192.168.0.0/24, for everybody.
pub fn default_pool() -> Value {
    mk_pool(
        "default",
        range("192.168.0.0/24", "192.168.0.10", "192.168.0.12"),
        global(),
    )
}

/// One address.
fn tiny_pool() -> Value {
    mk_pool(
        "tiny",
        range("192.168.9.0/24", "192.168.9.10", "192.168.9.10"),
        global(),
    )
}

fn condition<'a>(lb: &'a LoadBalancer, kind: &str) -> Option<&'a harvester_cloud::ipam::Condition> {
    lb.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.r#type == kind)
}

/// `(status, reason, message)` of the Ready condition.
fn ready(lb: &LoadBalancer) -> (String, String, String) {
    let c = condition(lb, "Ready").expect("a Ready condition");
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

fn ip(lb: &LoadBalancer) -> String {
    lb.status
        .as_ref()
        .map(|s| s.allocated_address.ip.clone())
        .unwrap_or_default()
}

fn has_finalizer(lb: &LoadBalancer) -> bool {
    lb.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == LB_FINALIZER))
}

/// The refusal a load balancer's one reconcile ends in: Ready is False with `reason` and
/// `message`, a Warning Event says the same, no address is held, and the action is `action`.
async fn assert_refused(w: &mut LbWorld, name: &str, reason: &str, message: &str, action: Action) {
    assert_eq!(w.reconcile(NS, name).await, action);
    let lb = w.lb(NS, name).await;
    assert!(has_finalizer(&lb), "the finalizer comes first");
    assert_eq!(
        ready(&lb),
        ("False".into(), reason.to_string(), message.to_string())
    );
    assert_eq!(ip(&lb), "", "a refused load balancer holds nothing");
    assert!(condition(&lb, keys::CONDITION_ADDRESS_ALLOCATED).is_none());
    assert_eq!(
        w.events(),
        [warning(&format!("{NS}/{name}"), reason, message)]
    );
}

fn allocated_event(name: &str, ip: &str, pool: &str) -> Reported {
    normal(
        &format!("{NS}/{name}"),
        "Allocated",
        &format!("allocated {ip} from IP pool {pool}"),
    )
}

fn released_event(name: &str, ip: &str, pool: &str) -> Reported {
    normal(
        &format!("{NS}/{name}"),
        "Released",
        &format!("released {ip} to IP pool {pool}"),
    )
}

// --- Outcomes ------------------------------------------------------------------------------------

#[tokio::test]
async fn a_load_balancer_gets_an_address_from_the_matching_pool_and_is_ready() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    w.add_lb(mk_lb("lb1", &[])).await;

    assert_eq!(w.reconcile(NS, "lb1").await, Action::await_change());

    let lb = w.lb(NS, "lb1").await;
    assert!(has_finalizer(&lb));
    let status = lb.status.clone().expect("a status");
    assert_eq!(status.allocated_address.ip_pool, "default");
    assert_eq!(status.allocated_address.ip, "192.168.0.10");
    assert_eq!(status.allocated_address.mask, "255.255.255.0");
    assert_eq!(status.address, "192.168.0.10");
    assert_eq!(ready(&lb), ("True".into(), "".into(), "".into()));
    let allocated = condition(&lb, keys::CONDITION_ADDRESS_ALLOCATED).expect("AddressAllocated");
    assert_eq!(
        (allocated.status.as_str(), allocated.message.as_str()),
        ("True", "192.168.0.10 from IP pool default")
    );
    assert_eq!(
        w.events(),
        [allocated_event("lb1", "192.168.0.10", "default")]
    );
    let pool = w.pool("default").await.status.expect("pool status");
    assert_eq!(
        pool.allocated,
        [("192.168.0.10".to_string(), "default/lb1".to_string())].into()
    );
    assert_eq!(pool.available, 2);
}

/// Admission puts the finalizer on a LoadBalancer as it is created; one that was never admitted
/// (a cluster without the webhook, objects from before it) gets it from the reconciler, before its
/// address. Either way it carries it once.
#[tokio::test]
async fn the_finalizer_is_there_once_whether_admission_put_it_there_or_not() {
    let w = LbWorld::with_pools([default_pool()]).await;
    let mut admitted = mk_lb("admitted", &[]);
    admitted["metadata"]["finalizers"] = json!([LB_FINALIZER]);
    w.add_lb(admitted).await;
    w.add_lb(mk_lb("unadmitted", &[])).await;
    for name in ["admitted", "unadmitted"] {
        assert_eq!(w.reconcile(NS, name).await, Action::await_change());
        let lb = w.lb(NS, name).await;
        assert_eq!(
            lb.metadata.finalizers.clone().unwrap_or_default(),
            [LB_FINALIZER],
            "{name}"
        );
        assert_eq!(ready(&lb).0, "True", "{name}");
        assert!(!ip(&lb).is_empty(), "{name}");
    }
}

#[tokio::test]
async fn reconciling_an_allocated_load_balancer_again_writes_and_reports_nothing() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    w.add_lb(mk_lb("lb1", &[])).await;
    w.reconcile(NS, "lb1").await;
    w.events();
    let before = w.lb(NS, "lb1").await;

    assert_eq!(w.reconcile(NS, "lb1").await, Action::await_change());

    let after = w.lb(NS, "lb1").await;
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );
    assert_eq!(w.events(), []);
}

#[tokio::test]
async fn a_dhcp_load_balancer_is_marked_0_0_0_0_without_any_pool() {
    let mut w = LbWorld::new().await;
    w.add_lb(mk_lb_with("lb1", json!({"ipam": "dhcp"}))).await;

    assert_eq!(w.reconcile(NS, "lb1").await, Action::await_change());

    let lb = w.lb(NS, "lb1").await;
    let status = lb.status.clone().expect("a status");
    assert_eq!(status.allocated_address.ip, keys::DHCP_ADDRESS);
    assert_eq!(status.allocated_address.ip_pool, "");
    assert_eq!(status.address, "");
    assert_eq!(ready(&lb), ("True".into(), "".into(), "".into()));
    assert!(condition(&lb, keys::CONDITION_ADDRESS_ALLOCATED).is_none());
    assert_eq!(
        w.events(),
        [normal(
            "default/lb1",
            "Allocated",
            "0.0.0.0 marks the address for DHCP in the guest"
        )]
    );
}

#[tokio::test]
async fn a_load_balancer_switched_to_dhcp_releases_its_pool_address() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    w.add_lb(mk_lb("lb1", &[])).await;
    w.reconcile(NS, "lb1").await;
    w.events();

    w.edit_lb(NS, "lb1", |lb| lb.spec.ipam = "dhcp".into())
        .await;
    assert_eq!(w.reconcile(NS, "lb1").await, Action::await_change());

    assert_eq!(ip(&w.lb(NS, "lb1").await), keys::DHCP_ADDRESS);
    assert_eq!(
        w.events(),
        [
            released_event("lb1", "192.168.0.10", "default"),
            normal(
                "default/lb1",
                "Allocated",
                "0.0.0.0 marks the address for DHCP in the guest"
            )
        ]
    );
    let pool = w.pool("default").await.status.expect("pool status");
    assert!(pool.allocated.is_empty());
    assert_eq!(
        pool.allocated_history,
        [("192.168.0.10".to_string(), "default/lb1".to_string())].into()
    );
}

#[tokio::test]
async fn a_requested_address_is_allocated_exactly() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    w.add_lb(mk_lb(
        "lb1",
        &[(keys::ANNOTATION_REQUESTED_IP, "192.168.0.12")],
    ))
    .await;

    assert_eq!(w.reconcile(NS, "lb1").await, Action::await_change());

    assert_eq!(ip(&w.lb(NS, "lb1").await), "192.168.0.12");
    assert_eq!(
        w.events(),
        [allocated_event("lb1", "192.168.0.12", "default")]
    );
}

#[tokio::test]
async fn an_address_family_takes_the_address_from_a_pool_of_that_family() {
    let v6 = mk_pool(
        "v6",
        range("fd00::/120", "fd00::10", "fd00::12"),
        json!({"scope": [{"project": "*", "namespace": "*", "guestCluster": "*"}], "priority": 0}),
    );
    let w = LbWorld::with_pools([default_pool(), v6]).await;
    w.add_lb(mk_lb("lb1", &[(keys::ANNOTATION_IP_FAMILY, "IPv6")]))
        .await;

    assert_eq!(w.reconcile(NS, "lb1").await, Action::await_change());

    let lb = w.lb(NS, "lb1").await;
    assert_eq!(ip(&lb), "fd00::10");
    assert_eq!(lb.status.expect("status").allocated_address.ip_pool, "v6");
}

#[tokio::test]
async fn asking_for_another_address_of_the_same_pool_moves_the_load_balancer_to_it() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    w.add_lb(mk_lb("lb1", &[])).await;
    w.reconcile(NS, "lb1").await;
    w.events();

    w.edit_lb(NS, "lb1", |lb| {
        lb.metadata
            .annotations
            .get_or_insert_default()
            .insert(keys::ANNOTATION_REQUESTED_IP.into(), "192.168.0.12".into());
    })
    .await;
    assert_eq!(w.reconcile(NS, "lb1").await, Action::await_change());

    assert_eq!(ip(&w.lb(NS, "lb1").await), "192.168.0.12");
    assert_eq!(
        w.events(),
        [allocated_event("lb1", "192.168.0.12", "default")]
    );
    let pool = w.pool("default").await.status.expect("pool status");
    assert_eq!(
        pool.allocated,
        [("192.168.0.12".to_string(), "default/lb1".to_string())].into()
    );
}

#[tokio::test]
async fn naming_another_pool_releases_the_address_to_the_old_pool_and_takes_one_from_the_new() {
    let other = mk_pool(
        "other",
        range("192.168.1.0/24", "192.168.1.10", "192.168.1.12"),
        json!({"scope": [{"namespace": "elsewhere"}]}),
    );
    let mut w = LbWorld::with_pools([default_pool(), other]).await;
    w.add_lb(mk_lb("lb1", &[])).await;
    w.reconcile(NS, "lb1").await;
    w.events();

    w.edit_lb(NS, "lb1", |lb| lb.spec.ip_pool = "other".into())
        .await;
    assert_eq!(w.reconcile(NS, "lb1").await, Action::await_change());

    let lb = w.lb(NS, "lb1").await;
    assert_eq!(ip(&lb), "192.168.1.10");
    assert_eq!(
        lb.status.expect("status").allocated_address.ip_pool,
        "other"
    );
    assert_eq!(
        w.events(),
        [
            released_event("lb1", "192.168.0.10", "default"),
            allocated_event("lb1", "192.168.1.10", "other"),
        ]
    );
    assert!(
        w.pool("default")
            .await
            .status
            .expect("pool status")
            .allocated
            .is_empty()
    );
}

#[tokio::test]
async fn a_deleted_load_balancer_releases_its_address_and_goes() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    w.add_lb(mk_lb("lb1", &[])).await;
    w.reconcile(NS, "lb1").await;
    w.events();

    w.delete_lb(NS, "lb1").await;
    assert_eq!(w.reconcile(NS, "lb1").await, Action::await_change());

    assert!(w.try_lb(NS, "lb1").await.is_none(), "the finalizer is off");
    assert_eq!(
        w.events(),
        [released_event("lb1", "192.168.0.10", "default")]
    );
    let pool = w.pool("default").await.status.expect("pool status");
    assert!(pool.allocated.is_empty());
    assert_eq!(
        pool.allocated_history,
        [("192.168.0.10".to_string(), "default/lb1".to_string())].into()
    );
    assert_eq!(pool.available, 3);
}

#[tokio::test]
async fn a_deleted_load_balancer_that_never_had_an_address_goes_quietly() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    let mut lb = mk_lb("lb1", &[]);
    lb["metadata"]["finalizers"] = json!([LB_FINALIZER]);
    w.add_lb(lb).await;

    w.delete_lb(NS, "lb1").await;
    assert_eq!(w.reconcile(NS, "lb1").await, Action::await_change());

    assert!(w.try_lb(NS, "lb1").await.is_none());
    assert_eq!(w.events(), []);
}

#[tokio::test]
async fn a_deleted_load_balancer_whose_pool_is_gone_goes_anyway() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    w.add_lb(mk_lb("lb1", &[])).await;
    w.reconcile(NS, "lb1").await;
    w.events();
    // The pool never got its finalizer (no pool reconcile ran): deleting it removes it.
    w.delete_pool("default").await;

    w.delete_lb(NS, "lb1").await;
    assert_eq!(w.reconcile(NS, "lb1").await, Action::await_change());

    assert!(w.try_lb(NS, "lb1").await.is_none());
    assert_eq!(w.events(), []);
}

#[tokio::test]
async fn the_release_of_an_exhausted_pool_wakes_the_load_balancer_it_refused() {
    let mut w = LbWorld::with_pools([tiny_pool()]).await;
    w.add_lb(mk_lb("lb1", &[])).await;
    w.add_lb(mk_lb("lb2", &[])).await;
    w.reconcile(NS, "lb1").await;
    w.reconcile(NS, "lb2").await;
    w.events();
    assert_eq!(w.woken(), Vec::<String>::new());

    w.delete_lb(NS, "lb1").await;
    w.reconcile(NS, "lb1").await;

    assert_eq!(w.woken(), ["default/lb2"]);
    assert_eq!(w.reconcile(NS, "lb2").await, Action::await_change());
    let lb2 = w.lb(NS, "lb2").await;
    assert_eq!(ip(&lb2), "192.168.9.10");
    assert_eq!(ready(&lb2), ("True".into(), "".into(), "".into()));
}

#[tokio::test]
async fn a_new_pool_wakes_the_load_balancers_that_found_none() {
    let mut w = LbWorld::new().await;
    w.add_lb(mk_lb("lb1", &[])).await;
    w.reconcile(NS, "lb1").await;
    w.events();

    w.add_pool(default_pool()).await;
    w.reconcile_pool("default").await;

    assert_eq!(w.woken(), ["default/lb1"]);
    assert_eq!(w.reconcile(NS, "lb1").await, Action::await_change());
    assert_eq!(ip(&w.lb(NS, "lb1").await), "192.168.0.10");
}

// --- Refusals ------------------------------------------------------------------------------------

#[tokio::test]
async fn no_pool_at_all_is_refused_with_no_matched_ip_pool() {
    let mut w = LbWorld::new().await;
    w.add_lb(mk_lb("lb1", &[])).await;
    assert_refused(
        &mut w,
        "lb1",
        "NoMatchedIPPool",
        "no matched IPPool with requirement &{Network: Project: Namespace:default Cluster:}",
        requeue(30),
    )
    .await;
}

#[tokio::test]
async fn a_network_no_pool_is_on_is_refused_with_no_matched_ip_pool() {
    let vlan1 = mk_pool(
        "vlan1",
        range("192.168.1.0/24", "192.168.1.10", "192.168.1.12"),
        json!({"network": "default/vlan1", "scope": [{"namespace": "default"}]}),
    );
    let mut w = LbWorld::with_pools([vlan1]).await;
    w.add_lb(mk_lb("lb1", &[(keys::ANNOTATION_NETWORK, "default/vlan2")]))
        .await;
    assert_refused(
        &mut w,
        "lb1",
        "NoMatchedIPPool",
        "no matched IPPool with requirement &{Network:default/vlan2 Project: Namespace:default Cluster:}",
        requeue(30),
    )
    .await;
}

#[tokio::test]
async fn a_pool_scoped_to_another_namespace_is_refused_with_no_matched_ip_pool() {
    let elsewhere = mk_pool(
        "elsewhere",
        range("192.168.1.0/24", "192.168.1.10", "192.168.1.12"),
        json!({"scope": [{"namespace": "elsewhere"}]}),
    );
    let mut w = LbWorld::with_pools([elsewhere]).await;
    w.add_lb(mk_lb("lb1", &[])).await;
    assert_refused(
        &mut w,
        "lb1",
        "NoMatchedIPPool",
        "no matched IPPool with requirement &{Network: Project: Namespace:default Cluster:}",
        requeue(30),
    )
    .await;
}

#[tokio::test]
async fn a_named_pool_that_does_not_exist_is_refused_with_no_matched_ip_pool() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    w.add_lb(mk_lb_with("lb1", json!({"ipPool": "missing"})))
        .await;
    assert_refused(
        &mut w,
        "lb1",
        "NoMatchedIPPool",
        "fail to get allocator missing",
        requeue(30),
    )
    .await;
}

#[tokio::test]
async fn a_named_pool_being_deleted_is_refused_with_no_matched_ip_pool() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    w.reconcile_pool("default").await;
    w.delete_pool("default").await;
    w.add_lb(mk_lb_with("lb1", json!({"ipPool": "default"})))
        .await;
    assert_refused(
        &mut w,
        "lb1",
        "NoMatchedIPPool",
        "IP pool default is being deleted",
        requeue(30),
    )
    .await;
}

#[tokio::test]
async fn a_named_pool_without_the_asked_family_is_refused_with_no_matched_ip_pool() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    let mut lb = mk_lb_with("lb1", json!({"ipPool": "default"}));
    lb["metadata"]["annotations"] = json!({keys::ANNOTATION_IP_FAMILY: "IPv6"});
    w.add_lb(lb).await;
    assert_refused(
        &mut w,
        "lb1",
        "NoMatchedIPPool",
        "IP pool default has no IPv6 range",
        requeue(30),
    )
    .await;
}

#[tokio::test]
async fn an_exhausted_pool_is_refused_with_pool_exhausted() {
    let mut w = LbWorld::with_pools([tiny_pool()]).await;
    w.add_lb(mk_lb("lb1", &[])).await;
    w.add_lb(mk_lb("lb2", &[])).await;
    w.reconcile(NS, "lb1").await;
    w.events();
    assert_refused(
        &mut w,
        "lb2",
        "PoolExhausted",
        "fail to get ip from pool tiny, error: no IP addresses available in range set: 192.168.9.10-192.168.9.10",
        requeue(60),
    )
    .await;
}

#[tokio::test]
async fn a_requested_address_held_by_another_is_refused_with_requested_address_taken() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    let wants = [(keys::ANNOTATION_REQUESTED_IP, "192.168.0.11")];
    w.add_lb(mk_lb("lb1", &wants)).await;
    w.add_lb(mk_lb("lb2", &wants)).await;
    w.reconcile(NS, "lb1").await;
    w.events();
    assert_refused(
        &mut w,
        "lb2",
        "RequestedAddressTaken",
        "requested address 192.168.0.11 is held by default/lb1 in IP pool default",
        requeue(60),
    )
    .await;
    // Its release wakes the one refused.
    w.delete_lb(NS, "lb1").await;
    w.reconcile(NS, "lb1").await;
    assert_eq!(w.woken(), ["default/lb2"]);
}

#[tokio::test]
async fn a_load_balancer_refused_a_new_address_keeps_its_old_one() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    w.add_lb(mk_lb(
        "lb1",
        &[(keys::ANNOTATION_REQUESTED_IP, "192.168.0.11")],
    ))
    .await;
    w.add_lb(mk_lb("lb2", &[])).await;
    w.reconcile(NS, "lb1").await;
    w.reconcile(NS, "lb2").await;
    w.events();
    let old = ip(&w.lb(NS, "lb2").await);
    assert_ne!(old, "");

    w.edit_lb(NS, "lb2", |lb| {
        lb.metadata
            .annotations
            .get_or_insert_default()
            .insert(keys::ANNOTATION_REQUESTED_IP.into(), "192.168.0.11".into());
    })
    .await;
    assert_eq!(w.reconcile(NS, "lb2").await, requeue(60));

    let lb2 = w.lb(NS, "lb2").await;
    let message = format!(
        "requested address 192.168.0.11 is held by default/lb1 in IP pool default; keeps {old}"
    );
    assert_eq!(
        ready(&lb2),
        (
            "False".into(),
            "RequestedAddressTaken".into(),
            message.clone()
        )
    );
    assert_eq!(ip(&lb2), old);
    assert_eq!(
        w.events(),
        [warning("default/lb2", "RequestedAddressTaken", &message)]
    );
}

#[tokio::test]
async fn a_requested_address_outside_every_eligible_pool_is_refused_with_requested_address_unavailable()
 {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    w.add_lb(mk_lb("lb1", &[(keys::ANNOTATION_REQUESTED_IP, "10.0.0.5")]))
        .await;
    assert_refused(
        &mut w,
        "lb1",
        "RequestedAddressUnavailable",
        "requested address 10.0.0.5 is not in any IP pool this load balancer may use (eligible: default)",
        requeue(30),
    )
    .await;
}

#[tokio::test]
async fn a_requested_address_without_any_eligible_pool_is_refused_with_requested_address_unavailable()
 {
    let mut w = LbWorld::new().await;
    w.add_lb(mk_lb("lb1", &[(keys::ANNOTATION_REQUESTED_IP, "10.0.0.5")]))
        .await;
    assert_refused(
        &mut w,
        "lb1",
        "RequestedAddressUnavailable",
        "requested address 10.0.0.5: no matched IPPool with IPv4 ranges with requirement &{Network: Project: Namespace:default Cluster:}",
        requeue(30),
    )
    .await;
}

#[tokio::test]
async fn a_requested_address_that_is_not_an_address_is_refused_for_good() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    w.add_lb(mk_lb(
        "lb1",
        &[(keys::ANNOTATION_REQUESTED_IP, "not-an-ip")],
    ))
    .await;
    assert_refused(
        &mut w,
        "lb1",
        "RequestedAddressUnavailable",
        "annotation loadbalancer.harvesterhci.io/requestedIP \"not-an-ip\" is not an IP address",
        Action::await_change(),
    )
    .await;
}

#[tokio::test]
async fn a_requested_address_of_another_family_than_asked_is_refused_for_good() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    w.add_lb(mk_lb(
        "lb1",
        &[
            (keys::ANNOTATION_REQUESTED_IP, "192.168.0.11"),
            (keys::ANNOTATION_IP_FAMILY, "IPv6"),
        ],
    ))
    .await;
    assert_refused(
        &mut w,
        "lb1",
        "RequestedAddressUnavailable",
        "requested address 192.168.0.11 is not an IPv6 address, as annotation loadbalancer.harvesterhci.io/ipFamily asks",
        Action::await_change(),
    )
    .await;
}

#[tokio::test]
async fn a_requested_gateway_address_is_refused_with_allocation_failed() {
    let pool = mk_pool(
        "default",
        json!([{"subnet": "192.168.0.0/24", "rangeStart": "192.168.0.1",
                "rangeEnd": "192.168.0.12", "gateway": "192.168.0.1"}]),
        global(),
    );
    let mut w = LbWorld::with_pools([pool]).await;
    w.add_lb(mk_lb(
        "lb1",
        &[(keys::ANNOTATION_REQUESTED_IP, "192.168.0.1")],
    ))
    .await;
    assert_refused(
        &mut w,
        "lb1",
        "AllocationFailed",
        "fail to get ip from pool default, error: requested ip 192.168.0.1 is subnet's gateway",
        Action::await_change(),
    )
    .await;
}

#[tokio::test]
async fn a_pool_the_store_no_longer_has_is_refused_with_allocation_failed() {
    let mut w = LbWorld::new().await;
    // The cache still shows a pool the store has lost.
    w.cache_only(mk_pool(
        "ghost",
        range("192.168.0.0/24", "192.168.0.10", "192.168.0.12"),
        global(),
    ));
    w.add_lb(mk_lb("lb1", &[])).await;
    assert_refused(
        &mut w,
        "lb1",
        "AllocationFailed",
        "fail to get allocator ghost",
        requeue(30),
    )
    .await;
}

#[tokio::test]
async fn a_pool_being_deleted_gives_no_new_address_and_is_refused_with_allocation_failed() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    w.reconcile_pool("default").await;
    // Deleted in the store (it keeps its finalizer); the cache has not seen it yet.
    w.pools_api()
        .delete("", "default", &Default::default())
        .await
        .expect("deletes the pool");
    w.add_lb(mk_lb("lb1", &[])).await;
    assert_refused(
        &mut w,
        "lb1",
        "AllocationFailed",
        "IP pool default is being deleted",
        requeue(30),
    )
    .await;
}

#[tokio::test]
async fn a_pool_whose_ranges_do_not_parse_is_refused_with_allocation_failed() {
    let broken = mk_pool(
        "broken",
        range("192.168.0.0/24", "192.168.1.10", "192.168.1.12"),
        global(),
    );
    let mut w = LbWorld::with_pools([broken]).await;
    w.add_lb(mk_lb("lb1", &[])).await;
    assert_refused(
        &mut w,
        "lb1",
        "AllocationFailed",
        "invalid ranges for IP pool broken: invalid range start 192.168.1.10: IP 192.168.1.10 is out of subnet 192.168.0.0/24",
        Action::await_change(),
    )
    .await;
}
