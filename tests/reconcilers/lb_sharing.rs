//! LoadBalancers sharing one pool address by a sharing key, one reconcile at a time (see
//! load_balancer.rs for the world): the pool names one holder, the others carry its address; a
//! clash or a disagreement is refused; the holder's going hands the address to the next member, and
//! the last one's going releases it.

use harvester_cloud::controller::Action;
use harvester_cloud::crd::{LoadBalancer, keys};
use serde_json::{Value, json};

use crate::{
    load_balancer::default_pool,
    world::{LbWorld, normal, requeue, warning},
};

const NS: &str = "default";

/// A cluster LoadBalancer on these (protocol, port)s with these annotations.
fn mk_lb(name: &str, listeners: &[(&str, i32)], annotations: &[(&str, &str)]) -> Value {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let listeners: Vec<Value> = listeners
        .iter()
        .map(|(proto, port)| json!({"name": format!("{}-{port}", proto.to_lowercase()), "protocol": proto, "port": port, "backendPort": port}))
        .collect();
    json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations},
        "spec": {"ipam": "pool", "workloadType": "cluster", "listeners": listeners}
    })
}

/// A member of group `key` (our annotation).
fn mk_member(name: &str, listeners: &[(&str, i32)], key: &str) -> Value {
    mk_lb(name, listeners, &[(keys::ANNOTATION_SHARING_KEY, key)])
}

fn ip(lb: &LoadBalancer) -> String {
    lb.status
        .as_ref()
        .map(|s| s.allocated_address.ip.clone())
        .unwrap_or_default()
}

/// `(status, reason, message)` of the Ready condition.
fn ready(lb: &LoadBalancer) -> (String, String, String) {
    let c = lb
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.r#type == "Ready"))
        .expect("a Ready condition");
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

async fn allocated(w: &LbWorld) -> Vec<(String, String)> {
    w.pool("default")
        .await
        .status
        .map(|s| s.allocated.into_iter().collect())
        .unwrap_or_default()
}

fn holds(ip: &str, lb: &str) -> Vec<(String, String)> {
    vec![(ip.to_string(), format!("{NS}/{lb}"))]
}

fn shared_event(name: &str, ip: &str, holder: &str) -> crate::world::Reported {
    normal(
        &format!("{NS}/{name}"),
        "AddressShared",
        &format!("shares {ip} (IP pool default) with load balancer {NS}/{holder}"),
    )
}

/// Members of group `key`, reconciled in order; the first allocates .10.
async fn served_group(w: &mut LbWorld, key: &str, members: &[(&str, &[(&str, i32)])]) {
    for (name, listeners) in members {
        w.add_lb(mk_member(name, listeners, key)).await;
        assert_eq!(w.reconcile(NS, name).await, Action::await_change());
        assert_eq!(ip(&w.lb(NS, name).await), "192.168.0.10");
    }
    w.sync_pools().await;
    w.events();
    w.woken();
}

#[tokio::test]
async fn load_balancers_with_one_key_share_the_address_the_pool_names_one_holder_for() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    w.add_lb(mk_member("dns-tcp", &[("TCP", 53)], "dns")).await;
    assert_eq!(w.reconcile(NS, "dns-tcp").await, Action::await_change());
    w.sync_pools().await;
    w.events();
    // TCP/53 and UDP/53 share; a third on an alias key too.
    w.add_lb(mk_member("dns-udp", &[("UDP", 53)], "dns")).await;
    assert_eq!(w.reconcile(NS, "dns-udp").await, Action::await_change());
    w.add_lb(mk_lb(
        "web",
        &[("TCP", 80)],
        &[(keys::METALLB_SHARING_KEY, "dns")],
    ))
    .await;
    assert_eq!(w.reconcile(NS, "web").await, Action::await_change());

    for name in ["dns-tcp", "dns-udp", "web"] {
        let lb = w.lb(NS, name).await;
        assert_eq!(ip(&lb), "192.168.0.10");
        assert_eq!(ready(&lb).0, "True");
        assert_eq!(
            lb.status.as_ref().map(|s| s.address.as_str()),
            Some("192.168.0.10")
        );
    }
    assert_eq!(
        allocated(&w).await,
        holds("192.168.0.10", "dns-tcp"),
        "one owner per address, as upstream's format has it"
    );
    assert_eq!(
        w.events(),
        [
            shared_event("dns-udp", "192.168.0.10", "dns-tcp"),
            shared_event("web", "192.168.0.10", "dns-tcp")
        ]
    );
    // Each one's coming woke the others (one refused may fit now).
    assert_eq!(w.woken(), ["default/dns-tcp", "default/dns-udp"]);
}

#[tokio::test]
async fn a_clash_is_refused_naming_the_holder_and_admitted_once_it_is_gone() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    served_group(
        &mut w,
        "k",
        &[("a", &[("TCP", 80)]), ("b", &[("TCP", 443)])],
    )
    .await;
    w.add_lb(mk_member("c", &[("TCP", 80), ("TCP", 8080)], "k"))
        .await;

    assert_eq!(w.reconcile(NS, "c").await, requeue(60));
    let message = "load balancer default/c cannot share the address of sharing key \"k\": TCP/80 is held by load balancer default/a";
    let c = w.lb(NS, "c").await;
    assert_eq!(ip(&c), "", "a refused member holds nothing");
    assert_eq!(
        ready(&c),
        ("False".into(), "SharingRefused".into(), message.into())
    );
    assert_eq!(
        w.events(),
        [warning("default/c", "SharingRefused", message)]
    );
    assert_eq!(allocated(&w).await, holds("192.168.0.10", "a"));
    assert_eq!(w.woken(), ["default/a", "default/b"]);

    // The holder goes: the address is handed to the next member (in one pool round), not released.
    w.delete_lb(NS, "a").await;
    assert_eq!(w.reconcile(NS, "a").await, Action::await_change());
    assert!(w.try_lb(NS, "a").await.is_none());
    assert_eq!(allocated(&w).await, holds("192.168.0.10", "b"));
    assert_eq!(
        w.events(),
        [normal(
            "default/a",
            "AddressHandedOver",
            "handed 192.168.0.10 (IP pool default) over to load balancer default/b, which shares it by key \"k\""
        )]
    );
    assert_eq!(w.woken(), ["default/b", "default/c"]);
    w.sync_pools().await;
    assert_eq!(w.reconcile(NS, "b").await, Action::await_change());
    assert_eq!(ip(&w.lb(NS, "b").await), "192.168.0.10");
    assert_eq!(w.reconcile(NS, "c").await, Action::await_change());
    assert_eq!(ip(&w.lb(NS, "c").await), "192.168.0.10");
    assert_eq!(allocated(&w).await, holds("192.168.0.10", "b"));
}

#[tokio::test]
async fn a_sharer_going_releases_nothing_and_the_last_one_releases_the_address() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    served_group(&mut w, "k", &[("a", &[("TCP", 80)]), ("b", &[("TCP", 81)])]).await;
    w.delete_lb(NS, "b").await;
    assert_eq!(w.reconcile(NS, "b").await, Action::await_change());
    assert!(w.try_lb(NS, "b").await.is_none());
    assert_eq!(allocated(&w).await, holds("192.168.0.10", "a"));
    assert_eq!(w.events(), [], "a sharer holds nothing to release");
    w.delete_lb(NS, "a").await;
    assert_eq!(w.reconcile(NS, "a").await, Action::await_change());
    assert_eq!(allocated(&w).await, []);
    assert_eq!(
        w.events(),
        [normal(
            "default/a",
            "Released",
            "released 192.168.0.10 to IP pool default"
        )]
    );
}

#[tokio::test]
async fn members_that_disagree_or_lease_by_dhcp_are_refused() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    served_group(&mut w, "k", &[("a", &[("TCP", 80)])]).await;
    w.add_lb(mk_lb(
        "asking",
        &[("TCP", 81)],
        &[
            (keys::ANNOTATION_SHARING_KEY, "k"),
            (keys::ANNOTATION_REQUESTED_IP, "192.168.0.11"),
        ],
    ))
    .await;
    assert_eq!(w.reconcile(NS, "asking").await, requeue(60));
    assert_eq!(
        ready(&w.lb(NS, "asking").await).2,
        "load balancer default/asking cannot share the address of sharing key \"k\": its requested address is 192.168.0.11, and load balancer default/a's is none"
    );
    let mut leased = mk_member("leased", &[("TCP", 82)], "k");
    leased["spec"]["ipam"] = json!("dhcp");
    w.add_lb(leased).await;
    assert_eq!(w.reconcile(NS, "leased").await, requeue(60));
    let leased = w.lb(NS, "leased").await;
    assert_eq!(ip(&leased), "", "not even the DHCP mark");
    assert!(ready(&leased).2.starts_with(
        "load balancer default/leased cannot share an address by sharing key \"k\": its IPAM mode is dhcp"
    ));
    w.add_lb(mk_lb(
        "two",
        &[("TCP", 83)],
        &[
            (keys::ANNOTATION_SHARING_KEY, "k"),
            (keys::CILIUM_SHARING_KEY, "other"),
        ],
    ))
    .await;
    assert_eq!(w.reconcile(NS, "two").await, requeue(60));
    assert_eq!(
        ready(&w.lb(NS, "two").await).2,
        "load balancer default/two: the sharing key annotations disagree: loadbalancer.harvesterhci.io/sharing-key is \"k\", lbipam.cilium.io/sharing-key is \"other\""
    );
    assert_eq!(allocated(&w).await, holds("192.168.0.10", "a"));
}

#[tokio::test]
async fn a_holder_dropping_its_key_hands_the_address_over_and_takes_a_fresh_one() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    served_group(&mut w, "k", &[("a", &[("TCP", 80)]), ("b", &[("TCP", 81)])]).await;
    w.edit_lb(NS, "a", |lb| {
        lb.metadata
            .annotations
            .get_or_insert_default()
            .remove(keys::ANNOTATION_SHARING_KEY);
    })
    .await;
    assert_eq!(w.reconcile(NS, "a").await, Action::await_change());
    assert_eq!(ip(&w.lb(NS, "a").await), "192.168.0.11");
    let mut held = allocated(&w).await;
    held.sort();
    assert_eq!(
        held,
        [
            ("192.168.0.10".to_string(), "default/b".to_string()),
            ("192.168.0.11".into(), "default/a".into())
        ]
    );
    w.sync_pools().await;
    assert_eq!(w.reconcile(NS, "b").await, Action::await_change());
    assert_eq!(ip(&w.lb(NS, "b").await), "192.168.0.10");
}

#[tokio::test]
async fn a_sharer_dropping_its_key_gets_an_address_of_its_own() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    served_group(&mut w, "k", &[("a", &[("TCP", 80)]), ("b", &[("TCP", 81)])]).await;
    w.edit_lb(NS, "b", |lb| {
        lb.metadata
            .annotations
            .get_or_insert_default()
            .remove(keys::ANNOTATION_SHARING_KEY);
    })
    .await;
    assert_eq!(w.reconcile(NS, "b").await, Action::await_change());
    assert_eq!(ip(&w.lb(NS, "b").await), "192.168.0.11");
    assert_eq!(ip(&w.lb(NS, "a").await), "192.168.0.10");
}
