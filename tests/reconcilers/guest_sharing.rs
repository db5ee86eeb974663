//! Guest Services sharing one address by a sharing key, one reconcile at a time (see
//! guest_service.rs for the world): the group's LoadBalancer (one per guest cluster, namespace and
//! key, belonging to no one Service), who is admitted and who is refused, and what leaving a group
//! leaves behind.

use harvester_cloud::controller::Action;
use harvester_cloud::{
    crd::{LoadBalancer, keys},
    guest::naming::shared_load_balancer_name,
    store::Preconditions,
};
use k8s_openapi::api::core::v1::Service;
use serde_json::{Value, json};

use crate::world::{CLUSTER, GuestWorld, NS, normal, requeue, warning};

/// A Service of type LoadBalancer in `default` on these (protocol, port)s, with these annotations.
fn mk_svc(name: &str, ports: &[(&str, i32)], annotations: &[(&str, &str)]) -> Value {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let ports: Vec<Value> = ports
        .iter()
        .map(|(proto, p)| json!({"name": format!("{}-{p}", proto.to_lowercase()), "protocol": proto, "port": p}))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "default", "name": name, "annotations": annotations},
        "spec": {"type": "LoadBalancer", "ports": ports}
    })
}

/// A member of group `key` (our annotation).
fn mk_member(name: &str, ports: &[(&str, i32)], key: &str) -> Value {
    mk_svc(name, ports, &[(keys::SVC_SHARING_KEY, key)])
}

fn group_name(key: &str) -> String {
    shared_load_balancer_name(CLUSTER, "default", key)
}

async fn group_lb(w: &GuestWorld, key: &str) -> Option<LoadBalancer> {
    w.try_lb(&group_name(key)).await
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

/// `(name, protocol, port)` of a LoadBalancer's listeners.
fn listeners(lb: &LoadBalancer) -> Vec<(String, String, i32)> {
    lb.spec
        .listeners
        .iter()
        .map(|l| (l.name.clone(), l.protocol.clone(), l.port))
        .collect()
}

fn ensured(name: &str, key: &str, ip: &str) -> crate::world::Reported {
    normal(
        &format!("default/{name}"),
        "EnsuredLoadBalancer",
        &format!(
            "Ensured load balancer {NS}/{} with address {ip} shared by sharing key \"{key}\"",
            group_name(key)
        ),
    )
}

/// Members `names` of group `key`, each on its (protocol, port)s, served with `ip`: the first makes
/// the group's LoadBalancer, which then gets `ip`, and every member gets it.
async fn served_group(w: &mut GuestWorld, key: &str, members: &[(&str, &[(&str, i32)])], ip: &str) {
    for (name, ports) in members {
        w.add(mk_member(name, ports, key)).await;
    }
    w.reconcile("default", members[0].0).await;
    let lb = group_lb(w, key).await.expect("the group's load balancer");
    w.allocate(&lb, ip).await;
    for (name, _) in members {
        assert_eq!(w.reconcile("default", name).await, Action::await_change());
        assert_eq!(
            annotation(&w.svc("default", name).await, keys::KUBE_VIP_IPS),
            Some(ip)
        );
    }
    w.events();
}

// --- Sharing -------------------------------------------------------------------------------------

#[tokio::test]
async fn two_services_with_one_key_share_one_load_balancer_that_is_neither_s() {
    let mut w = GuestWorld::new().await;
    w.add(mk_member("dns-tcp", &[("TCP", 53)], "dns")).await;
    w.add(mk_member("dns-udp", &[("UDP", 53)], "dns")).await;

    // The first makes the group's LoadBalancer and waits for its address.
    assert_eq!(w.reconcile("default", "dns-tcp").await, requeue(30));
    let lb = group_lb(&w, "dns").await.expect("made");
    assert_eq!(w.all_lbs().await.len(), 1);
    assert_eq!(lb.spec.workload_type, "cluster");
    assert_eq!(lb.spec.ipam, "pool");
    let labels = lb.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels[keys::LABEL_GUEST_CLUSTER], CLUSTER);
    assert_eq!(labels[keys::LABEL_SERVICE_NAMESPACE], "default");
    assert!(
        !labels.contains_key(keys::LABEL_SERVICE_NAME),
        "no one Service's: {labels:?}"
    );
    let annotations = lb.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations[keys::ANNOTATION_SHARING_GROUP], "dns");
    assert!(!annotations.contains_key(keys::ANNOTATION_SERVICE_UID));
    // Both are judged together: the listeners are already both members' ports.
    assert_eq!(
        listeners(&lb),
        [
            ("dns-tcp-tcp-53".to_string(), "TCP".to_string(), 53),
            ("dns-udp-udp-53".into(), "UDP".into(), 53)
        ]
    );
    w.allocate(&lb, "192.168.0.10").await;

    for name in ["dns-tcp", "dns-udp"] {
        assert_eq!(w.reconcile("default", name).await, Action::await_change());
        let svc = w.svc("default", name).await;
        assert_eq!(annotation(&svc, keys::KUBE_VIP_IPS), Some("192.168.0.10"));
        assert_eq!(ingress(&svc), ["192.168.0.10"]);
        assert_eq!(
            annotation(&svc, keys::SVC_SHARED_LOAD_BALANCER),
            Some(group_name("dns").as_str())
        );
    }
    assert_eq!(
        w.events(),
        [
            ensured("dns-tcp", "dns", "192.168.0.10"),
            ensured("dns-udp", "dns", "192.168.0.10")
        ]
    );
    assert_eq!(w.all_lbs().await.len(), 1, "no load balancer of their own");
}

#[tokio::test]
async fn a_third_member_named_by_an_alias_key_joins() {
    let mut w = GuestWorld::new().await;
    served_group(
        &mut w,
        "web",
        &[("a", &[("TCP", 80)]), ("b", &[("TCP", 443)])],
        "192.168.0.10",
    )
    .await;
    for (name, alias) in [
        ("c", keys::METALLB_SHARING_KEY),
        ("d", keys::METALLB_LEGACY_SHARING_KEY),
        ("e", keys::CILIUM_SHARING_KEY),
    ] {
        let port = 8000 + i32::from(name.as_bytes()[0]);
        w.add(mk_svc(name, &[("TCP", port)], &[(alias, "web")]))
            .await;
        assert_eq!(w.reconcile("default", name).await, Action::await_change());
        assert_eq!(ingress(&w.svc("default", name).await), ["192.168.0.10"]);
        assert_eq!(w.events(), [ensured(name, "web", "192.168.0.10")]);
    }
    let lb = group_lb(&w, "web").await.expect("exists");
    assert_eq!(lb.spec.listeners.len(), 5);
    assert_eq!(w.all_lbs().await.len(), 1);
}

#[tokio::test]
async fn a_service_asking_to_share_across_namespaces_is_told_it_shares_within_its_own() {
    let mut w = GuestWorld::new().await;
    w.add(mk_svc(
        "a",
        &[("TCP", 80)],
        &[
            (keys::CILIUM_SHARING_KEY, "web"),
            (keys::CILIUM_SHARING_CROSS_NAMESPACE, "*"),
        ],
    ))
    .await;
    assert_eq!(w.reconcile("default", "a").await, requeue(30));
    assert_eq!(
        w.events(),
        [warning(
            "default/a",
            "CrossNamespaceSharingIgnored",
            "service default/a: lbipam.cilium.io/sharing-cross-namespace is not honoured: services share an address by sharing key \"web\" only within their namespace"
        )]
    );
    assert!(group_lb(&w, "web").await.is_some(), "it is served");
}

// --- Leaving ---------------------------------------------------------------------------------------

#[tokio::test]
async fn a_member_going_leaves_the_address_to_the_others_and_the_last_releases_it() {
    let mut w = GuestWorld::new().await;
    served_group(
        &mut w,
        "k",
        &[
            ("a", &[("TCP", 80)]),
            ("b", &[("TCP", 81)]),
            ("c", &[("TCP", 82)]),
        ],
        "192.168.0.10",
    )
    .await;

    w.delete("default", "a").await;
    assert_eq!(w.reconcile("default", "a").await, Action::await_change());
    assert!(w.try_svc("default", "a").await.is_none());
    assert!(group_lb(&w, "k").await.is_some(), "the others still share");
    assert_eq!(w.events(), [], "nothing was deleted");
    // The next member's reconcile drops the one that went from the listeners.
    assert_eq!(w.reconcile("default", "b").await, Action::await_change());
    let lb = group_lb(&w, "k").await.expect("exists");
    assert_eq!(
        listeners(&lb),
        [
            ("b-tcp-81".to_string(), "TCP".to_string(), 81),
            ("c-tcp-82".into(), "TCP".into(), 82)
        ]
    );
    assert_eq!(
        ingress(&w.svc("default", "b").await),
        ["192.168.0.10"],
        "the address stays"
    );

    w.delete("default", "b").await;
    w.reconcile("default", "b").await;
    assert!(group_lb(&w, "k").await.is_some());
    w.delete("default", "c").await;
    assert_eq!(w.reconcile("default", "c").await, Action::await_change());
    assert!(
        group_lb(&w, "k").await.is_none(),
        "the last member's going deletes the group's load balancer (its finalizer releases the address)"
    );
    assert_eq!(
        w.events(),
        [normal(
            "default/c",
            "DeletedLoadBalancer",
            &format!("Deleted load balancer {NS}/{}", group_name("k"))
        )]
    );
}

#[tokio::test]
async fn a_member_no_longer_of_type_load_balancer_gives_back_its_address() {
    let mut w = GuestWorld::new().await;
    served_group(&mut w, "k", &[("a", &[("TCP", 80)])], "192.168.0.10").await;
    w.edit("default", "a", |s| {
        s.spec.get_or_insert_default().type_ = Some("ClusterIP".into());
    })
    .await;
    assert_eq!(w.reconcile("default", "a").await, Action::await_change());
    let a = w.svc("default", "a").await;
    assert!(ingress(&a).is_empty());
    assert_eq!(annotation(&a, keys::KUBE_VIP_IPS), None);
    assert_eq!(annotation(&a, keys::SVC_SHARED_LOAD_BALANCER), None);
    assert!(group_lb(&w, "k").await.is_none(), "it was the last");
}

#[tokio::test]
async fn changing_the_key_leaves_the_old_group_and_joins_the_new_one() {
    let mut w = GuestWorld::new().await;
    served_group(
        &mut w,
        "k1",
        &[("a", &[("TCP", 80)]), ("b", &[("TCP", 81)])],
        "192.168.0.10",
    )
    .await;

    w.edit("default", "b", |s| {
        s.metadata
            .annotations
            .get_or_insert_default()
            .insert(keys::SVC_SHARING_KEY.into(), "k2".into());
    })
    .await;
    assert_eq!(w.reconcile("default", "b").await, requeue(30));
    let b = w.svc("default", "b").await;
    assert!(ingress(&b).is_empty(), "the old address is withdrawn");
    assert_eq!(annotation(&b, keys::KUBE_VIP_IPS), None);
    assert!(group_lb(&w, "k1").await.is_some(), "a still shares k1's");
    let k2 = group_lb(&w, "k2").await.expect("k2's is made");
    w.allocate(&k2, "192.168.0.11").await;
    assert_eq!(w.reconcile("default", "b").await, Action::await_change());
    let b = w.svc("default", "b").await;
    assert_eq!(ingress(&b), ["192.168.0.11"]);
    assert_eq!(
        annotation(&b, keys::SVC_SHARED_LOAD_BALANCER),
        Some(group_name("k2").as_str())
    );

    // The sole member of k1 moving to k2 releases k1's address and shares k2's.
    w.edit("default", "a", |s| {
        s.metadata
            .annotations
            .get_or_insert_default()
            .insert(keys::SVC_SHARING_KEY.into(), "k2".into());
    })
    .await;
    assert_eq!(w.reconcile("default", "a").await, Action::await_change());
    assert!(group_lb(&w, "k1").await.is_none());
    assert_eq!(ingress(&w.svc("default", "a").await), ["192.168.0.11"]);
    assert_eq!(w.all_lbs().await.len(), 1);
}

#[tokio::test]
async fn dropping_the_key_gives_the_service_its_own_load_balancer() {
    let mut w = GuestWorld::new().await;
    served_group(&mut w, "k", &[("a", &[("TCP", 80)])], "192.168.0.10").await;
    w.edit("default", "a", |s| {
        s.metadata
            .annotations
            .get_or_insert_default()
            .remove(keys::SVC_SHARING_KEY);
    })
    .await;
    assert_eq!(w.reconcile("default", "a").await, requeue(30));
    assert!(group_lb(&w, "k").await.is_none());
    let own = w.lb_of("default", "a").await;
    assert_eq!(
        own.metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .get(keys::ANNOTATION_REQUESTED_IP),
        None,
        "the group's address is not asked for again"
    );
    let a = w.svc("default", "a").await;
    assert_eq!(annotation(&a, keys::SVC_SHARED_LOAD_BALANCER), None);
    assert!(ingress(&a).is_empty());
}

#[tokio::test]
async fn a_member_recreated_with_a_new_uid_rejoins_its_group() {
    let mut w = GuestWorld::new().await;
    served_group(
        &mut w,
        "k",
        &[("a", &[("TCP", 80)]), ("b", &[("TCP", 81)])],
        "192.168.0.10",
    )
    .await;
    let old = w.svc("default", "b").await;
    // Gone behind the reconciler's back (its finalizer stripped), then made again.
    w.edit("default", "b", |s| s.metadata.finalizers = None)
        .await;
    w.services()
        .delete("default", "b", &Preconditions::default())
        .await
        .expect("deletes");
    let mut again = mk_member("b", &[("TCP", 81)], "k");
    // As a user re-applies a manifest: the annotations it had, the cloud provider's among them.
    again["metadata"]["annotations"][keys::SVC_SHARED_LOAD_BALANCER] = json!(group_name("k"));
    w.add(again).await;
    assert_ne!(w.svc("default", "b").await.metadata.uid, old.metadata.uid);

    assert_eq!(w.reconcile("default", "b").await, Action::await_change());
    assert_eq!(ingress(&w.svc("default", "b").await), ["192.168.0.10"]);
    assert_eq!(w.all_lbs().await.len(), 1);
}

// --- Refused ---------------------------------------------------------------------------------------

#[tokio::test]
async fn a_clash_is_refused_naming_the_holder_and_admitted_once_the_holder_goes() {
    let mut w = GuestWorld::new().await;
    served_group(
        &mut w,
        "k",
        &[("a", &[("TCP", 80)]), ("b", &[("UDP", 80)])],
        "192.168.0.10",
    )
    .await;
    w.add(mk_member(
        "c",
        &[("TCP", 80), ("UDP", 80), ("TCP", 8080)],
        "k",
    ))
    .await;

    assert_eq!(w.reconcile("default", "c").await, requeue(60));
    assert_eq!(
        w.events(),
        [warning(
            "default/c",
            "SyncLoadBalancerFailed",
            "service default/c cannot share the address of sharing key \"k\": TCP/80 is held by service default/a; UDP/80 is held by service default/b"
        )]
    );
    let c = w.svc("default", "c").await;
    assert!(ingress(&c).is_empty());
    assert_eq!(annotation(&c, keys::KUBE_VIP_IPS), None);
    assert_eq!(
        group_lb(&w, "k")
            .await
            .expect("exists")
            .spec
            .listeners
            .len(),
        2,
        "the refused one holds no port"
    );

    for holder in ["a", "b"] {
        w.delete("default", holder).await;
        w.reconcile("default", holder).await;
    }
    assert!(
        group_lb(&w, "k").await.is_some(),
        "c still gives the key: the group keeps its address"
    );
    assert_eq!(w.reconcile("default", "c").await, Action::await_change());
    assert_eq!(ingress(&w.svc("default", "c").await), ["192.168.0.10"]);
}

#[tokio::test]
async fn a_member_changing_its_ports_onto_another_s_is_the_one_refused_and_loses_its_address() {
    let mut w = GuestWorld::new().await;
    served_group(
        &mut w,
        "k",
        &[("a", &[("TCP", 80)]), ("b", &[("TCP", 443)])],
        "192.168.0.10",
    )
    .await;
    // a, the older, moves onto b's port.
    w.edit("default", "a", |s| {
        s.spec.get_or_insert_default().ports =
            Some(vec![k8s_openapi::api::core::v1::ServicePort {
                name: Some("https".into()),
                protocol: Some("TCP".into()),
                port: 443,
                ..Default::default()
            }]);
    })
    .await;
    assert_eq!(w.reconcile("default", "a").await, requeue(60));
    assert_eq!(
        w.events(),
        [warning(
            "default/a",
            "SyncLoadBalancerFailed",
            "service default/a cannot share the address of sharing key \"k\": TCP/443 is held by service default/b"
        )]
    );
    let a = w.svc("default", "a").await;
    assert!(ingress(&a).is_empty());
    assert_eq!(annotation(&a, keys::KUBE_VIP_IPS), None);
    assert_eq!(w.reconcile("default", "b").await, Action::await_change());
    assert_eq!(ingress(&w.svc("default", "b").await), ["192.168.0.10"]);
}

#[tokio::test]
async fn a_sharing_key_with_a_primary_service_is_refused() {
    let mut w = GuestWorld::new().await;
    w.add(mk_svc(
        "s",
        &[("TCP", 80)],
        &[
            (keys::METALLB_SHARING_KEY, "k"),
            (keys::SVC_PRIMARY, "default/p"),
        ],
    ))
    .await;
    assert_eq!(w.reconcile("default", "s").await, requeue(60));
    assert_eq!(
        w.events(),
        [warning(
            "default/s",
            "SyncLoadBalancerFailed",
            "service default/s: annotations cloudprovider.harvesterhci.io/primary-service and metallb.io/allow-shared-ip are both set: a service shares an address either with a primary service or by a sharing key, not both"
        )]
    );
    assert!(w.all_lbs().await.is_empty());
}

#[tokio::test]
async fn sharing_keys_that_disagree_are_refused() {
    let mut w = GuestWorld::new().await;
    w.add(mk_svc(
        "s",
        &[("TCP", 80)],
        &[
            (keys::SVC_SHARING_KEY, "a"),
            (keys::METALLB_SHARING_KEY, "b"),
        ],
    ))
    .await;
    assert_eq!(w.reconcile("default", "s").await, requeue(60));
    assert_eq!(
        w.events(),
        [warning(
            "default/s",
            "SyncLoadBalancerFailed",
            "service default/s: the sharing key annotations disagree: cloudprovider.harvesterhci.io/sharing-key is \"a\", metallb.io/allow-shared-ip is \"b\""
        )]
    );
    assert!(w.all_lbs().await.is_empty());
}

#[tokio::test]
async fn members_disagreeing_on_the_network_or_asking_for_dhcp_are_refused() {
    let mut w = GuestWorld::new().await;
    served_group(&mut w, "k", &[("a", &[("TCP", 80)])], "192.168.0.10").await;
    w.add(mk_svc(
        "vlan",
        &[("TCP", 81)],
        &[
            (keys::SVC_SHARING_KEY, "k"),
            (keys::SVC_NETWORK, "default/vlan1"),
        ],
    ))
    .await;
    assert_eq!(w.reconcile("default", "vlan").await, requeue(60));
    assert_eq!(
        w.events(),
        [warning(
            "default/vlan",
            "SyncLoadBalancerFailed",
            &format!(
                "network annotation of service default/vlan is not same as the load balancer {NS}/{}, service: 'default/vlan1', lb: ''",
                group_name("k")
            )
        )]
    );
    w.add(mk_svc(
        "leased",
        &[("TCP", 82)],
        &[(keys::SVC_SHARING_KEY, "k"), (keys::SVC_IPAM, "dhcp")],
    ))
    .await;
    assert_eq!(w.reconcile("default", "leased").await, requeue(60));
    let events = w.events();
    assert_eq!(events.len(), 1);
    assert!(
        events[0].message.starts_with(
            "service default/leased cannot share an address by sharing key \"k\": its IPAM mode is dhcp"
        ),
        "{events:?}"
    );
    let mut asking = mk_member("asking", &[("TCP", 83)], "k");
    asking["spec"]["loadBalancerIP"] = json!("192.168.0.99");
    w.add(asking).await;
    assert_eq!(w.reconcile("default", "asking").await, requeue(60));
    assert_eq!(
        w.events(),
        [warning(
            "default/asking",
            "SyncLoadBalancerFailed",
            &format!(
                "service default/asking cannot share the address of sharing key \"k\": it asks for 192.168.0.99, and the group's load balancer {NS}/{} holds 192.168.0.10",
                group_name("k")
            )
        )]
    );
    assert_eq!(w.all_lbs().await.len(), 1);
}

#[tokio::test]
async fn a_secondary_naming_a_member_as_its_primary_is_refused() {
    let mut w = GuestWorld::new().await;
    served_group(&mut w, "k", &[("a", &[("TCP", 80)])], "192.168.0.10").await;
    w.add(mk_svc(
        "s",
        &[("TCP", 81)],
        &[(keys::SVC_PRIMARY, "default/a")],
    ))
    .await;
    assert_eq!(w.reconcile("default", "s").await, requeue(60));
    assert_eq!(
        w.events(),
        [warning(
            "default/s",
            "SyncLoadBalancerFailed",
            "service default/a shares an address by sharing key \"k\" and cannot be a primary service: give service default/s the sharing key instead"
        )]
    );
}
