//! The pool annotations of ours, written as a user writes them: pools that skip addresses
//! (`loadbalancer.harvesterhci.io/skipAddresses`) and pools by Service labels
//! (`loadbalancer.harvesterhci.io/serviceSelector`), with what admission refuses, what the
//! reconcilers allocate and refuse, and the owners view's figures.

use crate::*;

const SKIP: &str = "loadbalancer.harvesterhci.io/skipAddresses";
const SELECTOR: &str = "loadbalancer.harvesterhci.io/serviceSelector";
const SERVICE_LABELS: &str = "cloudprovider.harvesterhci.io/serviceLabels";
const REQUESTED_IP: &str = "loadbalancer.harvesterhci.io/requestedIP";

fn annotated_pool(name: &str, ranges: Value, selector: Value, annotations: Value) -> Value {
    let mut pool = mk_pool(name, ranges, selector);
    pool["metadata"]["annotations"] = annotations;
    pool
}

/// Sets a pool's annotations with a PUT of the pool as read, reading again on a conflict (the pool
/// reconciler writes the pool too), as kubectl does.
async fn set_pool_annotations<B: Backend>(b: &B, name: &str, annotations: Value) {
    ok(
        update_pool(b, name, |p| {
            p["metadata"]["annotations"] = annotations.clone()
        })
        .await,
        StatusCode::OK,
    );
}

/// The owners view's `(total, available)` of a pool.
async fn owners_counts<B: Backend>(b: &B, name: &str) -> (i64, i64) {
    let view = ok(
        get(b, &format!("{POOLS}/{name}/addresses")).await,
        StatusCode::OK,
    );
    (
        view["total"].as_i64().expect("total"),
        view["available"].as_i64().expect("available"),
    )
}

/// The pool status's `(total, available)`.
async fn status_counts<B: Backend>(b: &B, name: &str) -> (i64, i64) {
    let p = pool(b, name).await;
    (
        p["status"]["total"].as_i64().unwrap_or_default(),
        p["status"]["available"].as_i64().unwrap_or_default(),
    )
}

pub async fn pools_that_skip_addresses<B: Backend>(b: B) {
    let _r = Reconcilers::start(b.service_store());
    // Refused at admission: a value that names something unknown, and one that leaves a range
    // nothing to hand out.
    let m = call(
        &b,
        Method::POST,
        POOLS,
        Some(annotated_pool(
            "bad",
            range("10.71.0.0/24", "", ""),
            global(),
            json!({SKIP: "true"}),
        )),
    )
    .await
    .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
    assert_eq!(
        m,
        "can't create IP pool bad because annotation loadbalancer.harvesterhci.io/skipAddresses \"true\" names \"true\", which is not firstLast (each range's subnet's first and last address) or dot0And255 (every IPv4 address ending in .0 or .255); the value is a comma-separated list of those"
    );
    let m = call(
        &b,
        Method::POST,
        POOLS,
        Some(annotated_pool(
            "starved",
            range("10.71.0.0/16", "10.71.0.255", "10.71.1.0"),
            global(),
            json!({SKIP: "dot0And255"}),
        )),
    )
    .await
    .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
    assert_eq!(
        m,
        "can't create IP pool starved because range 10.71.0.255-10.71.1.0 has no address left to hand out once annotation loadbalancer.harvesterhci.io/skipAddresses (dot0And255) skips its addresses"
    );

    // 10.70.0.254 to 10.70.1.1: four addresses, two of which the pool skips.
    create_pool(
        &b,
        annotated_pool(
            "edge",
            range("10.70.0.0/16", "10.70.0.254", "10.70.1.1"),
            global(),
            json!({SKIP: "dot0And255"}),
        ),
    )
    .await;
    create_lb(&b, mk_lb("default", "lb1", json!({}))).await;
    assert_eq!(ip_of(&allocated(&b, "default", "lb1").await), "10.70.0.254");
    create_lb(&b, mk_lb("default", "lb2", json!({}))).await;
    assert_eq!(ip_of(&allocated(&b, "default", "lb2").await), "10.70.1.1");
    // The status counts as upstream's controller would (it ignores the annotation); the owners
    // view counts what the pool hands out.
    eventually("the pool status to count both", async || {
        (status_counts(&b, "edge").await == (4, 2)).then_some(())
    })
    .await;
    assert_eq!(owners_counts(&b, "edge").await, (2, 0));

    // Asking for a skipped address is refused like any address the load balancer may not have.
    create_lb(
        &b,
        with_annotations(
            mk_lb("default", "asks", json!({"workloadType": "cluster"})),
            &[(REQUESTED_IP, "10.70.1.0")],
        ),
    )
    .await;
    let condition = refused(&b, "default", "asks").await;
    let message = "requested address 10.70.1.0 is skipped by IP pool edge (annotation loadbalancer.harvesterhci.io/skipAddresses: dot0And255)";
    assert_eq!(condition["reason"], "RequestedAddressUnavailable");
    assert_eq!(condition["message"], message);
    let events = events_about(&b, "asks", "RequestedAddressUnavailable").await;
    assert_eq!(events[0].message.as_deref(), Some(message));

    // The pool stops skipping: the waiting load balancer gets its address.
    set_pool_annotations(&b, "edge", json!({})).await;
    assert_eq!(ip_of(&allocated(&b, "default", "asks").await), "10.70.1.0");
    assert_eq!(owners_counts(&b, "edge").await.1, 1);
    // It skips again: nothing held moves, and the held skipped address counts in neither figure.
    set_pool_annotations(&b, "edge", json!({SKIP: "firstLast,dot0And255"})).await;
    eventually(
        "the owners view to count what the pool hands out",
        async || (owners_counts(&b, "edge").await == (2, 0)).then_some(()),
    )
    .await;
    let asks = ok(
        get(&b, &format!("{LBS}/default/asks")).await,
        StatusCode::OK,
    );
    assert_eq!(ip_of(&asks), "10.70.1.0");
    assert_eq!(status_counts(&b, "edge").await, (4, 1));
    // Released, the skipped address is not handed out again.
    ok(
        call(&b, Method::DELETE, &format!("{LBS}/default/asks"), None).await,
        StatusCode::OK,
    );
    gone(&b, &format!("{LBS}/default/asks")).await;
    create_lb(&b, mk_lb("default", "lb3", json!({}))).await;
    let condition = refused(&b, "default", "lb3").await;
    assert_eq!(condition["reason"], "PoolExhausted");
    assert_eq!(owners_counts(&b, "edge").await, (2, 0));
    assert_eq!(status_counts(&b, "edge").await, (4, 2));
    assert_consistent(&b).await;
}

pub async fn pools_by_service_labels<B: Backend>(b: B) {
    let _r = Reconcilers::start(b.service_store());
    // Refused at admission: a selector that is not one, a comparison a LabelSelector lacks, and
    // carried Service labels that are not a JSON object of strings.
    for (selector, reason) in [
        ("tier in (gold", "a set is not closed with ')'"),
        (
            "replicas>1",
            "operator '>' of \"replicas\" is not supported: a pool's selector takes =, ==, !=, in, notin, a key (exists) and !key (does not exist)",
        ),
    ] {
        let m = call(
            &b,
            Method::POST,
            POOLS,
            Some(annotated_pool(
                "bad",
                range("10.72.0.0/24", "", ""),
                global(),
                json!({SELECTOR: selector}),
            )),
        )
        .await
        .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        assert_eq!(
            m,
            format!(
                "can't create IP pool bad because annotation loadbalancer.harvesterhci.io/serviceSelector {selector:?} is not a label selector: {reason}"
            )
        );
    }
    let m = call(
        &b,
        Method::POST,
        LBS,
        Some(with_annotations(
            mk_lb("default", "bad", json!({"workloadType": "cluster"})),
            &[(SERVICE_LABELS, "tier=gold")],
        )),
    )
    .await
    .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
    assert!(
        m.starts_with("create loadbalancer default/bad failed: annotation cloudprovider.harvesterhci.io/serviceLabels is not a JSON object of label values: "),
        "{m}"
    );

    // A pool for the gold Services of namespace default, before the catch-all global pool.
    create_pool(
        &b,
        annotated_pool(
            "gold",
            range("10.72.0.0/24", "10.72.0.10", "10.72.0.20"),
            json!({"priority": 10, "scope": [{"project": "*", "namespace": "default", "guestCluster": "*"}]}),
            json!({SELECTOR: "tier in (gold,platinum),!canary"}),
        ),
    )
    .await;
    create_pool(
        &b,
        mk_pool(
            "all",
            range("10.73.0.0/24", "10.73.0.10", "10.73.0.20"),
            global(),
        ),
    )
    .await;
    let guest = |name: &str, labels: &str| {
        with_annotations(
            mk_lb("default", name, json!({"workloadType": "cluster"})),
            &[(SERVICE_LABELS, labels)],
        )
    };
    create_lb(&b, guest("gold", r#"{"tier":"gold","app":"web"}"#)).await;
    create_lb(&b, guest("canary", r#"{"tier":"gold","canary":"yes"}"#)).await;
    // The carried Service labels decide, not the LoadBalancer's own.
    create_lb(&b, with_labels(guest("own", "{}"), &[("tier", "gold")])).await;
    // A LoadBalancer made on Harvester is matched on its own labels.
    create_lb(
        &b,
        with_labels(mk_lb("default", "vm", json!({})), &[("tier", "platinum")]),
    )
    .await;
    for (name, want) in [
        ("gold", "gold"),
        ("canary", "all"),
        ("own", "all"),
        ("vm", "gold"),
    ] {
        assert_eq!(
            pool_of(&allocated(&b, "default", name).await),
            want,
            "{name}"
        );
    }

    // Named in spec.ipPool, the pool must select the labels too.
    let mut named = guest("named", r#"{"tier":"silver"}"#);
    named["spec"]["ipPool"] = json!("gold");
    create_lb(&b, named).await;
    let condition = refused(&b, "default", "named").await;
    let message = "the service selector \"tier in (gold,platinum),!canary\" of IP pool gold does not select the load balancer's labels tier=silver";
    assert_eq!(condition["reason"], "NoMatchedIPPool");
    assert_eq!(condition["message"], message);
    let events = events_about(&b, "named", "NoMatchedIPPool").await;
    assert_eq!(events[0].message.as_deref(), Some(message));
    // The pool widens its selector: the waiting load balancer is served; the others stay put.
    set_pool_annotations(
        &b,
        "gold",
        json!({SELECTOR: "tier in (gold,platinum,silver)"}),
    )
    .await;
    assert_eq!(pool_of(&allocated(&b, "default", "named").await), "gold");
    let canary = ok(
        get(&b, &format!("{LBS}/default/canary")).await,
        StatusCode::OK,
    );
    assert_eq!(pool_of(&canary), "all");
    assert_consistent(&b).await;
}
