//! IPPools: shrinking and deleting one that holds addresses, the manual release annotation, and the
//! warning of a nearly full pool.

use crate::*;

pub async fn pool_shrink_refused<B: Backend>(b: B) {
    let _r = Reconcilers::start(b.service_store());
    create_pool(
        &b,
        mk_pool(
            "p",
            range("10.0.0.0/24", "10.0.0.10", "10.0.0.20"),
            global(),
        ),
    )
    .await;
    create_lb(&b, mk_lb("default", "lb1", json!({}))).await;
    allocated(&b, "default", "lb1").await;
    let current = pool(&b, "p").await;
    // The API server checks the version before admission: a 409 would hide the refusal.
    let shrunk = range("10.0.0.0/24", "10.0.0.15", "10.0.0.20");
    let m = update_pool(&b, "p", |p| p["spec"]["ranges"] = shrunk.clone())
        .await
        .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
    assert_eq!(
        m,
        "can't update IP pool p because allocated IP 10.0.0.10 is excluded"
    );
    // Growing is fine, and the reconciler recounts.
    let grown = range("10.0.0.0/24", "10.0.0.10", "10.0.0.40");
    ok(
        update_pool(&b, "p", |p| p["spec"]["ranges"] = grown.clone()).await,
        StatusCode::OK,
    );
    eventually("the grown pool to be recounted", async || {
        let p = pool(&b, "p").await;
        (p["status"]["total"] == 31 && p["status"]["available"] == 30).then_some(())
    })
    .await;
    // The version read before the update is stale now.
    let m = call(&b, Method::PUT, &format!("{POOLS}/p"), Some(current))
        .await
        .error(StatusCode::CONFLICT, "Conflict");
    assert!(m.contains("the object has been modified"), "{m}");
}

pub async fn pool_delete_refused_while_allocated<B: Backend>(b: B) {
    let _r = Reconcilers::start(b.service_store());
    create_pool(
        &b,
        mk_pool(
            "p",
            range("10.0.0.0/24", "10.0.0.10", "10.0.0.20"),
            global(),
        ),
    )
    .await;
    create_lb(&b, mk_lb("default", "lb1", json!({}))).await;
    allocated(&b, "default", "lb1").await;
    let m = call(&b, Method::DELETE, &format!("{POOLS}/p"), None)
        .await
        .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
    assert_eq!(m, "can't delete pool before releasing all the allocated IP");
    ok(
        call(&b, Method::DELETE, &format!("{LBS}/default/lb1"), None).await,
        StatusCode::OK,
    );
    gone(&b, &format!("{LBS}/default/lb1")).await;
    eventually("the pool to hold nothing", async || {
        pool(&b, "p").await["status"]["allocated"]
            .is_null()
            .then_some(())
    })
    .await;
    ok(
        call(&b, Method::DELETE, &format!("{POOLS}/p"), None).await,
        StatusCode::OK,
    );
    gone(&b, &format!("{POOLS}/p")).await;
}

pub async fn manual_release_annotation<B: Backend>(b: B) {
    let _r = Reconcilers::start(b.service_store());
    create_pool(
        &b,
        mk_pool(
            "p",
            range("10.0.0.0/24", "10.0.0.10", "10.0.0.20"),
            global(),
        ),
    )
    .await;
    create_lb(&b, mk_lb("default", "lb1", json!({}))).await;
    let held = ip_of(&allocated(&b, "default", "lb1").await);
    // A leak, as a hand edit or a lost finalizer leaves one: an address held for a load balancer
    // that does not exist.
    write_leak(b.store(), "p", "10.0.0.15", "default/ghost").await;
    let annotate = async |value: &str| {
        // The pool reconciler may write the pool between our read and our write (it answers
        // the leak written above): a 409 then, and a client reads again, as kubectl does.
        let release = json!({"loadbalancer.harvesterhci.io/manuallyReleaseIP": value});
        ok(
            update_pool(&b, "p", |p| p["metadata"]["annotations"] = release.clone()).await,
            StatusCode::OK,
        );
        eventually("the annotation to be removed", async || {
            let p = pool(&b, "p").await;
            p["metadata"]["annotations"]
                .get("loadbalancer.harvesterhci.io/manuallyReleaseIP")
                .is_none()
                .then_some(p)
        })
        .await
    };
    // The load balancer still exists: its own address is not released.
    let p = annotate(&format!("{held}: default/lb1")).await;
    assert_eq!(p["status"]["allocated"][&held], "default/lb1");
    // The holder does not match: nothing happens.
    let p = annotate("10.0.0.15: default/other").await;
    assert_eq!(p["status"]["allocated"]["10.0.0.15"], "default/ghost");
    // The holder matches and is gone: released into the history.
    let p = annotate("10.0.0.15: default/ghost").await;
    assert!(p["status"]["allocated"].get("10.0.0.15").is_none(), "{p}");
    assert_eq!(
        p["status"]["allocatedHistory"]["10.0.0.15"],
        "default/ghost"
    );
    assert_consistent(&b).await;
}

/// A pool that reaches 90% use gets one PoolNearlyFull Warning, and `ippool_usage_ratio`
/// follows its allocations.
pub async fn nearly_full_pools_warn<B: Backend>(b: B) {
    let r = Reconcilers::start(b.service_store());
    ensure_namespace(&b, "crowd", None).await;
    // Ten addresses (.1 is the gateway, outside the range).
    create_pool(
        &b,
        mk_pool(
            "crowded",
            range("192.168.120.0/24", "192.168.120.10", "192.168.120.19"),
            json!({"scope": [{"project": "*", "namespace": "crowd", "guestCluster": "*"}]}),
        ),
    )
    .await;
    for i in 0..9 {
        create_lb(
            &b,
            mk_lb(
                "crowd",
                &format!("lb{i}"),
                json!({"workloadType": "cluster"}),
            ),
        )
        .await;
        allocated(&b, "crowd", &format!("lb{i}")).await;
    }
    let events = events_about(&b, "crowded", "PoolNearlyFull").await;
    assert_eq!(events.len(), 1, "one warning per crossing: {events:?}");
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert_eq!(
        events[0].message.as_deref(),
        Some("IP pool crowded is 90% used: 9 of 10 addresses allocated, 1 available")
    );
    let key = r#"harvester_cloud_ippool_usage_ratio{pool="crowded"}"#;
    eventually("the usage ratio to be 0.9", async || {
        (harvester_cloud::metrics::sample(&harvester_cloud::metrics::encode(), key) == Some(0.9))
            .then_some(())
    })
    .await;
    r.stop().await;
}
