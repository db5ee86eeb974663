//! The pool annotations of ours, one reconcile at a time: a pool that skips addresses
//! (`loadbalancer.harvesterhci.io/skipAddresses`) and a pool that serves only the load balancers
//! whose Service labels its selector selects (`loadbalancer.harvesterhci.io/serviceSelector`, matched
//! against `cloudprovider.harvesterhci.io/serviceLabels` or a LoadBalancer's own labels).

use harvester_cloud::crd::{LoadBalancer, keys};
use serde_json::{Value, json};

use crate::{
    load_balancer::mk_lb,
    support::lb::{global, mk_pool, range},
    world::{GuestWorld, LbWorld, requeue, warning},
};

const NS: &str = "default";

/// `pool` with these annotations.
fn annotated(mut pool: Value, annotations: &[(&str, &str)]) -> Value {
    let map: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    pool["metadata"]["annotations"] = Value::Object(map);
    pool
}

/// Four addresses across a /24 boundary, 10.0.0.254 to 10.0.1.1, for everybody.
fn boundary_pool(annotations: &[(&str, &str)]) -> Value {
    annotated(
        mk_pool(
            "edge",
            range("10.0.0.0/16", "10.0.0.254", "10.0.1.1"),
            global(),
        ),
        annotations,
    )
}

fn ip(lb: &LoadBalancer) -> String {
    lb.status
        .as_ref()
        .map(|s| s.allocated_address.ip.clone())
        .unwrap_or_default()
}

fn pool_of(lb: &LoadBalancer) -> String {
    lb.status
        .as_ref()
        .map(|s| s.allocated_address.ip_pool.clone())
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

fn refused(reason: &str, message: &str) -> (String, String, String) {
    ("False".into(), reason.into(), message.into())
}

// --- Pools that skip addresses -------------------------------------------------------------------

#[tokio::test]
async fn a_pool_that_skips_dot0_and_255_hands_out_past_them_and_counts_as_upstream() {
    let w = LbWorld::with_pools([boundary_pool(&[(keys::SKIP_ADDRESSES, "dot0And255")])]).await;
    w.reconcile_pool("edge").await;
    for name in ["lb1", "lb2", "lb3"] {
        w.add_lb(mk_lb(name, &[])).await;
        w.reconcile(NS, name).await;
    }
    assert_eq!(ip(&w.lb(NS, "lb1").await), "10.0.0.254");
    assert_eq!(ip(&w.lb(NS, "lb2").await), "10.0.1.1");
    let lb3 = w.lb(NS, "lb3").await;
    assert_eq!(ip(&lb3), "");
    assert_eq!(
        ready(&lb3),
        refused(
            "PoolExhausted",
            "fail to get ip from pool edge, error: no IP addresses available in range set: 10.0.0.254-10.0.1.1"
        )
    );
    // The status is upstream's for the same allocations: four addresses, two of them held.
    let status = w.pool("edge").await.status.expect("status");
    assert_eq!((status.total, status.available), (4, 2));
    assert_eq!(status.allocated.len(), 2);
}

#[tokio::test]
async fn a_requested_address_the_pool_skips_is_refused_with_requested_address_unavailable() {
    let mut w = LbWorld::with_pools([boundary_pool(&[(keys::SKIP_ADDRESSES, "dot0And255")])]).await;
    w.add_lb(mk_lb("lb1", &[(keys::ANNOTATION_REQUESTED_IP, "10.0.1.0")]))
        .await;
    assert_eq!(w.reconcile(NS, "lb1").await, requeue(30));
    let message = "requested address 10.0.1.0 is skipped by IP pool edge (annotation loadbalancer.harvesterhci.io/skipAddresses: dot0And255)";
    let lb1 = w.lb(NS, "lb1").await;
    assert_eq!(ready(&lb1), refused("RequestedAddressUnavailable", message));
    assert_eq!(ip(&lb1), "");
    assert_eq!(
        w.events(),
        [warning(
            "default/lb1",
            "RequestedAddressUnavailable",
            message
        )]
    );
    // The pool stops skipping: its reconcile wakes the load balancer, which then gets the address.
    let mut pool = w.pool("edge").await;
    pool.metadata.annotations = None;
    w.pools_api()
        .replace(&pool)
        .await
        .expect("replaces the pool");
    w.sync_pools().await;
    w.reconcile_pool("edge").await;
    assert_eq!(w.woken(), ["default/lb1"]);
    w.reconcile(NS, "lb1").await;
    assert_eq!(ip(&w.lb(NS, "lb1").await), "10.0.1.0");
}

#[tokio::test]
async fn an_address_held_before_the_pool_skipped_it_is_kept_then_never_handed_out_again() {
    let mut w = LbWorld::with_pools([boundary_pool(&[])]).await;
    w.reconcile_pool("edge").await;
    w.add_lb(mk_lb(
        "lb1",
        &[(keys::ANNOTATION_REQUESTED_IP, "10.0.0.255")],
    ))
    .await;
    w.reconcile(NS, "lb1").await;
    assert_eq!(ip(&w.lb(NS, "lb1").await), "10.0.0.255");
    let before = w.pool("edge").await.status;

    let mut pool = w.pool("edge").await;
    pool.metadata.annotations =
        Some([(keys::SKIP_ADDRESSES.to_string(), "dot0And255".to_string())].into());
    w.pools_api()
        .replace(&pool)
        .await
        .expect("replaces the pool");
    w.sync_pools().await;
    w.reconcile_pool("edge").await;
    // Nothing churns: the pool status is as it was, and lb1 keeps its address on its next pass.
    assert_eq!(w.pool("edge").await.status, before);
    w.edit_lb(NS, "lb1", |lb| {
        lb.metadata.labels = Some([("touched".to_string(), "yes".to_string())].into());
    })
    .await;
    w.reconcile(NS, "lb1").await;
    let lb1 = w.lb(NS, "lb1").await;
    assert_eq!(
        (ip(&lb1), ready(&lb1).0),
        ("10.0.0.255".into(), "True".into())
    );

    // Released, it is not handed out again, not even to the load balancer that held it.
    w.delete_lb(NS, "lb1").await;
    w.reconcile(NS, "lb1").await;
    assert!(w.try_lb(NS, "lb1").await.is_none());
    w.add_lb(mk_lb("lb1", &[])).await;
    w.reconcile(NS, "lb1").await;
    assert_eq!(ip(&w.lb(NS, "lb1").await), "10.0.1.1");
    let status = w.pool("edge").await.status.expect("status");
    assert_eq!(
        status
            .allocated_history
            .get("10.0.0.255")
            .map(String::as_str),
        Some("default/lb1"),
        "kept in the history, as upstream keeps it"
    );
}

#[tokio::test]
async fn a_skip_value_written_past_admission_stops_new_addresses_but_not_held_ones_or_releases() {
    let mut w = LbWorld::with_pools([boundary_pool(&[])]).await;
    w.reconcile_pool("edge").await;
    w.add_lb(mk_lb("held", &[])).await;
    w.reconcile(NS, "held").await;
    assert_eq!(ip(&w.lb(NS, "held").await), "10.0.0.254");
    // The world's store has no admission: as if the value was written while upstream's webhook,
    // which ignores the annotation, ran.
    let mut pool = w.pool("edge").await;
    pool.metadata.annotations =
        Some([(keys::SKIP_ADDRESSES.to_string(), "yes".to_string())].into());
    w.pools_api()
        .replace(&pool)
        .await
        .expect("replaces the pool");
    w.sync_pools().await;
    w.reconcile_pool("edge").await;
    let message = "invalid annotation of IP pool edge: annotation loadbalancer.harvesterhci.io/skipAddresses \"yes\" names \"yes\", which is not firstLast (each range's subnet's first and last address) or dot0And255 (every IPv4 address ending in .0 or .255); the value is a comma-separated list of those";
    let status = w.pool("edge").await.status.expect("status");
    let condition = &status.conditions[0];
    assert_eq!(
        (condition.status.as_str(), condition.message.as_str()),
        ("False", message)
    );
    // No new address.
    w.add_lb(mk_lb("lb1", &[])).await;
    assert_eq!(w.reconcile(NS, "lb1").await, requeue(30));
    let lb1 = w.lb(NS, "lb1").await;
    assert_eq!(ready(&lb1), refused("AllocationFailed", message));
    assert_eq!(ip(&lb1), "");
    // The held address stays, and is released when its load balancer goes.
    w.edit_lb(NS, "held", |lb| {
        lb.metadata.labels = Some([("touched".to_string(), "yes".to_string())].into());
    })
    .await;
    w.reconcile(NS, "held").await;
    assert_eq!(ip(&w.lb(NS, "held").await), "10.0.0.254");
    w.delete_lb(NS, "held").await;
    w.reconcile(NS, "held").await;
    assert!(w.try_lb(NS, "held").await.is_none());
    let status = w.pool("edge").await.status.expect("status");
    assert!(status.allocated.is_empty(), "{status:?}");
    assert_eq!(
        status
            .allocated_history
            .get("10.0.0.254")
            .map(String::as_str),
        Some("default/held")
    );
    // Fixed, the pool is Ready again and wakes the load balancer it turned away.
    let mut pool = w.pool("edge").await;
    pool.metadata.annotations =
        Some([(keys::SKIP_ADDRESSES.to_string(), "dot0And255".to_string())].into());
    w.pools_api()
        .replace(&pool)
        .await
        .expect("replaces the pool");
    w.sync_pools().await;
    w.reconcile_pool("edge").await;
    let status = w.pool("edge").await.status.expect("status");
    assert_eq!(status.conditions[0].status, "True");
    assert_eq!(w.woken(), ["default/lb1"]);
    w.reconcile(NS, "lb1").await;
    assert_eq!(ip(&w.lb(NS, "lb1").await), "10.0.1.1");
}

// --- Pools by Service labels ---------------------------------------------------------------------

/// A pool of 10.0.9.0/24 for namespace `default` at priority 10 (before the global pool), for the
/// labels `selector` selects.
fn gold_pool(selector: &str) -> Value {
    annotated(
        mk_pool(
            "gold",
            range("10.0.9.0/24", "10.0.9.10", "10.0.9.20"),
            json!({"priority": 10, "scope": [{"project": "*", "namespace": NS, "guestCluster": "*"}]}),
        ),
        &[(keys::SERVICE_SELECTOR, selector)],
    )
}

/// Three addresses for everybody.
fn catch_all() -> Value {
    mk_pool(
        "all",
        range("192.168.0.0/24", "192.168.0.10", "192.168.0.12"),
        global(),
    )
}

/// A guest load balancer whose Service has `labels`, as the cloud provider carries them.
fn mk_guest_lb(name: &str, labels: &str) -> Value {
    mk_lb(name, &[(keys::ANNOTATION_SERVICE_LABELS, labels)])
}

#[tokio::test]
async fn a_selective_pool_serves_the_service_labels_it_selects_and_the_rest_fall_through() {
    let w = LbWorld::with_pools([gold_pool("tier in (gold,platinum),!canary"), catch_all()]).await;
    w.add_lb(mk_guest_lb("gold", r#"{"tier":"gold","app":"web"}"#))
        .await;
    w.add_lb(mk_guest_lb("canary", r#"{"tier":"gold","canary":""}"#))
        .await;
    // The Service's labels decide, not the LoadBalancer's own.
    let mut own = mk_guest_lb("own", "{}");
    own["metadata"]["labels"] = json!({"tier": "gold"});
    w.add_lb(own).await;
    // A LoadBalancer made on Harvester (no carried labels) is matched on its own labels.
    let mut vm = mk_lb_vm("vm");
    vm["metadata"]["labels"] = json!({"tier": "platinum"});
    w.add_lb(vm).await;
    for (name, pool) in [
        ("gold", "gold"),
        ("canary", "all"),
        ("own", "all"),
        ("vm", "gold"),
    ] {
        w.reconcile(NS, name).await;
        assert_eq!(pool_of(&w.lb(NS, name).await), pool, "{name}");
    }
}

/// A VM load balancer (no listeners needed: the store here has no admission).
fn mk_lb_vm(name: &str) -> Value {
    let mut lb = mk_lb(name, &[]);
    lb["spec"]["workloadType"] = json!("vm");
    lb
}

#[tokio::test]
async fn a_load_balancer_no_pool_selects_waits_and_a_label_change_serves_it() {
    let mut w = LbWorld::with_pools([gold_pool("tier=gold")]).await;
    w.add_lb(mk_guest_lb("lb1", r#"{"tier":"silver"}"#)).await;
    assert_eq!(w.reconcile(NS, "lb1").await, requeue(30));
    let message = "no matched IPPool with requirement &{Network: Project: Namespace:default Cluster:}: the service selector of IP pool gold does not select the load balancer's labels tier=silver";
    assert_eq!(
        ready(&w.lb(NS, "lb1").await),
        refused("NoMatchedIPPool", message)
    );
    assert_eq!(
        w.events(),
        [warning("default/lb1", "NoMatchedIPPool", message)]
    );
    // The cloud provider carries the Service's new labels: the next pass is served.
    w.edit_lb(NS, "lb1", |lb| {
        lb.metadata.annotations.get_or_insert_default().insert(
            keys::ANNOTATION_SERVICE_LABELS.into(),
            r#"{"tier":"gold"}"#.into(),
        );
    })
    .await;
    w.reconcile(NS, "lb1").await;
    let lb1 = w.lb(NS, "lb1").await;
    assert_eq!(
        (pool_of(&lb1), ip(&lb1)),
        ("gold".into(), "10.0.9.10".into())
    );
    // Once it has an address, a label change does not move it.
    w.edit_lb(NS, "lb1", |lb| {
        lb.metadata.annotations.get_or_insert_default().insert(
            keys::ANNOTATION_SERVICE_LABELS.into(),
            r#"{"tier":"bronze"}"#.into(),
        );
    })
    .await;
    w.reconcile(NS, "lb1").await;
    assert_eq!(ip(&w.lb(NS, "lb1").await), "10.0.9.10");
}

#[tokio::test]
async fn a_pool_change_wakes_the_load_balancers_its_selector_turned_away() {
    let mut w = LbWorld::with_pools([gold_pool("tier=gold")]).await;
    w.add_lb(mk_guest_lb("lb1", r#"{"tier":"silver"}"#)).await;
    w.reconcile(NS, "lb1").await;
    let mut pool = w.pool("gold").await;
    pool.metadata.annotations.get_or_insert_default().insert(
        keys::SERVICE_SELECTOR.into(),
        "tier in (gold,silver)".into(),
    );
    w.pools_api()
        .replace(&pool)
        .await
        .expect("replaces the pool");
    w.sync_pools().await;
    w.reconcile_pool("gold").await;
    assert_eq!(w.woken(), ["default/lb1"]);
    w.reconcile(NS, "lb1").await;
    assert_eq!(pool_of(&w.lb(NS, "lb1").await), "gold");
}

#[tokio::test]
async fn a_pool_named_in_spec_ip_pool_must_select_the_labels_too() {
    let w = LbWorld::with_pools([gold_pool("tier=gold"), catch_all()]).await;
    let mut lb = mk_guest_lb("lb1", r#"{"tier":"silver"}"#);
    lb["spec"]["ipPool"] = json!("gold");
    w.add_lb(lb).await;
    assert_eq!(w.reconcile(NS, "lb1").await, requeue(30));
    assert_eq!(
        ready(&w.lb(NS, "lb1").await),
        refused(
            "NoMatchedIPPool",
            "the service selector \"tier=gold\" of IP pool gold does not select the load balancer's labels tier=silver"
        )
    );
}

// --- The guest side: the Service's labels ride along ---------------------------------------------

/// A Service of type LoadBalancer in `default` on port 80, with these labels.
fn mk_labelled_svc(name: &str, labels: &[(&str, &str)]) -> Value {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "default", "name": name, "labels": labels},
        "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "protocol": "TCP", "port": 80}]}
    })
}

#[tokio::test]
async fn the_guest_reconcile_carries_the_service_labels_and_keeps_them_current() {
    let mut w = GuestWorld::new().await;
    w.add(mk_labelled_svc("web", &[("app", "web"), ("tier", "gold")]))
        .await;
    w.reconcile("default", "web").await;
    let lb = w.lb_of("default", "web").await;
    let carried = |lb: &LoadBalancer| {
        lb.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(keys::ANNOTATION_SERVICE_LABELS))
            .cloned()
    };
    assert_eq!(
        carried(&lb).as_deref(),
        Some(r#"{"app":"web","tier":"gold"}"#)
    );
    // Not copied as labels: the LoadBalancer's labels are Harvester's.
    assert!(!lb.metadata.labels.unwrap_or_default().contains_key("app"));
    w.edit("default", "web", |svc| {
        svc.metadata.labels = Some([("app".to_string(), "api".to_string())].into());
    })
    .await;
    w.reconcile("default", "web").await;
    let lb = w.lb_of("default", "web").await;
    assert_eq!(carried(&lb).as_deref(), Some(r#"{"app":"api"}"#));
}
