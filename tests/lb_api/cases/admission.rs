//! Admission: what the webhooks refuse (with upstream's messages), metadata rules, and the webhook
//! endpoint itself.

use crate::*;

/// A body's `metadata.deletionTimestamp` is not the store's: it does not make admission treat
/// the object as being deleted (the store drops the claim and would keep the object unchecked).
pub async fn a_claimed_deletion_does_not_skip_admission<B: Backend>(b: B) {
    let _r = Reconcilers::start(b.service_store());
    let claimed = json!("2026-01-01T00:00:00Z");
    create_pool(
        &b,
        mk_pool(
            "held",
            range("10.60.0.0/24", "10.60.0.10", "10.60.0.20"),
            global(),
        ),
    )
    .await;
    create_lb(&b, mk_lb("default", "holder", json!({}))).await;
    allocated(&b, "default", "holder").await;
    // A second pool over the same addresses, created plainly, then PUT claiming deletion.
    let mut other = mk_pool(
        "other",
        range("10.61.0.0/24", "10.61.0.10", "10.61.0.20"),
        json!({"scope": [{"project": "p", "namespace": "ns1", "guestCluster": "*"}]}),
    );
    let created = ok(
        call(&b, Method::POST, POOLS, Some(other.clone())).await,
        StatusCode::CREATED,
    );
    other["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"].clone();
    other["metadata"]["deletionTimestamp"] = claimed.clone();
    other["spec"]["ranges"] = range("10.60.0.0/24", "10.60.0.10", "10.60.0.20");
    let m = call(&b, Method::PUT, &format!("{POOLS}/other"), Some(other))
        .await
        .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
    assert!(m.contains("overlap"), "{m}");
    assert_eq!(
        pool(&b, "other").await["spec"]["ranges"][0]["subnet"],
        "10.61.0.0/24",
        "nothing of the refused update was stored"
    );
    // A LoadBalancer with duplicate listener names and port 0, claiming deletion.
    let mut lb = ok(
        get(&b, &format!("{LBS}/default/holder")).await,
        StatusCode::OK,
    );
    lb["metadata"]["deletionTimestamp"] = claimed;
    lb["spec"]["listeners"] = json!([
        {"name": "a", "port": 0, "protocol": "TCP", "backendPort": 1},
        {"name": "a", "port": 81, "protocol": "TCP", "backendPort": 2}
    ]);
    call(&b, Method::PUT, &format!("{LBS}/default/holder"), Some(lb))
        .await
        .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
    // And a create claiming deletion is judged as a create.
    let mut fresh = mk_lb("default", "fresh", json!({"listeners": []}));
    fresh["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    call(&b, Method::POST, LBS, Some(fresh))
        .await
        .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
}

/// Metadata Kubernetes refuses is refused over HTTP on both backends: 422, with the API
/// server's message (on the kube backend the API server's own; tests/store_conformance.rs
/// compares every case).
pub async fn metadata_is_refused_as_the_api_server_refuses_it<B: Backend>(b: B) {
    let label_msg = "metadata.labels: Invalid value: \"<html>\": a valid label must be an empty string or consist of alphanumeric characters";
    let lb = with_labels(
        mk_lb("default", "html-label", json!({"workloadType": "cluster"})),
        &[("cloudprovider.harvesterhci.io/cluster", "<html>")],
    );
    let message = call(&b, Method::POST, LBS, Some(lb))
        .await
        .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
    assert!(message.contains(label_msg), "{message}");
    let mut pool = mk_pool("bad-annotation", range("10.9.0.0/24", "", ""), global());
    pool["metadata"]["annotations"] = json!({"bad key": "v"});
    let message = call(&b, Method::POST, POOLS, Some(pool))
        .await
        .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
    assert!(
        message
            .contains("metadata.annotations: Invalid value: \"bad key\": name part must consist"),
        "{message}"
    );
    // An update is judged too, and nothing of it is kept.
    let mut lb = create_lb(
        &b,
        mk_lb("default", "fine", json!({"workloadType": "cluster"})),
    )
    .await;
    lb["metadata"]["finalizers"] = json!(["bad finalizer"]);
    let message = call(&b, Method::PUT, &format!("{LBS}/default/fine"), Some(lb))
        .await
        .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
    assert!(
        message.contains(
            "metadata.finalizers: Invalid value: \"bad finalizer\": name part must consist"
        ),
        "{message}"
    );
    let stored = ok(
        get(&b, &format!("{LBS}/default/fine")).await,
        StatusCode::OK,
    );
    assert!(
        !stored["metadata"]["finalizers"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|f| f == "bad finalizer"),
        "{stored}"
    );
}

pub async fn validation_messages<B: Backend>(b: B) {
    let refuse = async |method: Method, path: &str, body: Value| {
        call(&b, method, path, Some(body))
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent")
    };
    // LoadBalancer create.
    let listener = |name: &str, port: i64, protocol: &str, backend: i64| json!({"name": name, "port": port, "protocol": protocol, "backendPort": backend});
    let create_cases = [
        (
            json!({"listeners": []}),
            "failed: the loadbalancer needs to have at least one listener",
        ),
        (
            json!({"listeners": [listener("a", 80, "TCP", 1), listener("a", 81, "TCP", 2)]}),
            "failed: listener has duplicate name a",
        ),
        (
            json!({"listeners": [listener("a", 80, "TCP", 1), listener("b", 80, "TCP", 2)]}),
            "failed: listener b has duplicate port TCP:80 with listener a",
        ),
        (
            json!({"listeners": [listener("a", 80, "TCP", 1), listener("b", 81, "TCP", 1)]}),
            "failed: listener b has duplicate backend port TCP:1 with listener a",
        ),
        (
            json!({"listeners": [listener("a", 65536, "TCP", 1)]}),
            "failed: listener port 65536 must <= 65535",
        ),
        (
            json!({"listeners": [listener("a", 0, "TCP", 1)]}),
            "failed: listener port 0 must >= 1",
        ),
        (
            json!({"listeners": [listener("a", 1, "TCP", 65536)]}),
            "failed: listener backend port 65536 must <= 65535",
        ),
        (
            json!({"listeners": [listener("a", 1, "TCP", 0)]}),
            "failed: listener backend port 0 must >= 1",
        ),
        (
            json!({"listeners": [listener("a", 1, "UDP", 53)], "healthCheck": {"port": 53}}),
            "failed with healthyCheck: healthcheck port 53 can only be a TCP backend port",
        ),
        (
            json!({"listeners": [listener("a", 1, "TCP", 53)], "healthCheck": {"port": 54}}),
            "failed with healthyCheck: healthcheck port 54 is not in listener backend port list",
        ),
        // Ours: the prober's bounds.
        (
            json!({"listeners": [listener("a", 1, "TCP", 53)], "healthCheck": {"port": 53, "periodSeconds": 301}}),
            "failed with healthyCheck: healthcheck PeriodSeconds 301 should <= 300",
        ),
        (
            json!({"listeners": [listener("a", 1, "TCP", 53)], "healthCheck": {"port": 53, "periodSeconds": 1, "timeoutSeconds": 3000000}}),
            "failed with healthyCheck: healthcheck TimeoutSeconds 3000000 should <= PeriodSeconds 1",
        ),
    ];
    for (spec, want) in create_cases {
        let m = refuse(Method::POST, LBS, mk_lb("default", "lb1", spec)).await;
        assert_eq!(m, format!("create loadbalancer default/lb1 {want}"));
    }
    // The thresholds are checked after the mutator filled the defaults, so through the API only
    // an explicit zero... cannot be sent (zero means unset); they pass with defaults.
    let lb = create_lb(
        &b,
        mk_lb(
            "default",
            "hc",
            json!({"listeners": [listener("a", 1, "TCP", 53)], "healthCheck": {"port": 53}}),
        ),
    )
    .await;
    assert_eq!(
        lb["spec"]["healthCheck"],
        json!({"port": 53, "successThreshold": 2, "failureThreshold": 2, "periodSeconds": 1, "timeoutSeconds": 1})
    );
    // pkg/webhook/loadbalancer/validator.go (checkHealthyCheck): any TCP listener on the
    // health-check port passes, even after a UDP one on the same backend port.
    create_lb(
        &b,
        mk_lb(
            "default",
            "hc-udp-first",
            json!({"listeners": [listener("u", 53, "UDP", 53), listener("t", 53, "TCP", 53)], "healthCheck": {"port": 53}}),
        ),
    )
    .await;
    // LoadBalancer update.
    let created = create_lb(&b, mk_lb("default", "upd", json!({"ipam": "pool"}))).await;
    let path = format!("{LBS}/default/upd");
    let mut dhcp = created.clone();
    dhcp["spec"]["ipam"] = json!("dhcp");
    assert_eq!(
        refuse(Method::PUT, &path, dhcp).await,
        "update loadbalancer default/upd failed: can't change the IPAM from pool to dhcp"
    );
    let mut cluster = created.clone();
    cluster["spec"]["workloadType"] = json!("cluster");
    assert_eq!(
        refuse(Method::PUT, &path, cluster).await,
        "update loadbalancer default/upd failed: can't change the WorkloadType from  to cluster"
    );
    let mut no_listener = created.clone();
    no_listener["spec"]["listeners"] = json!([]);
    assert_eq!(
        refuse(Method::PUT, &path, no_listener).await,
        "update loadbalancer default/upd failed: the loadbalancer needs to have at least one listener"
    );
    let mut long_timeout = created.clone();
    long_timeout["spec"]["listeners"] = json!([listener("a", 1, "TCP", 9)]);
    long_timeout["spec"]["healthCheck"] =
        json!({"port": 9, "periodSeconds": 5, "timeoutSeconds": 6});
    assert_eq!(
        refuse(Method::PUT, &path, long_timeout).await,
        "update loadbalancer default/upd failed with healthyCheck: healthcheck TimeoutSeconds 6 should <= PeriodSeconds 5"
    );
    let mut bad_hc = created.clone();
    bad_hc["spec"]["healthCheck"] = json!({"port": 9});
    assert_eq!(
        refuse(Method::PUT, &path, bad_hc).await,
        "update loadbalancer default/upd failed with healthyCheck: healthcheck port 9 is not in listener backend port list"
    );
    // "" <-> pool is allowed.
    let mut empty = created.clone();
    empty["spec"]["ipam"] = json!("");
    ok(
        call(&b, Method::PUT, &path, Some(empty)).await,
        StatusCode::OK,
    );
    // A stale version is a conflict.
    call(&b, Method::PUT, &path, Some(created))
        .await
        .error(StatusCode::CONFLICT, "Conflict");
    // A body whose name is not the URL's.
    let m = refuse(Method::PUT, &path, mk_lb("default", "other", json!({}))).await;
    assert_eq!(
        m,
        "the name of the object (other) does not match the name on the URL (upd)"
    );
    let m = refuse(
        Method::POST,
        LBS,
        json!({"metadata": {"name": "x"}, "spec": {"workloadType": "cluster"}}),
    )
    .await;
    assert_eq!(m, "loadbalancer x: metadata.namespace: Required value");
    let m = refuse(Method::POST, LBS, json!({"metadata": {"name": "x", "namespace": "default"}, "spec": {"listeners": [{"port": "80"}]}})).await;
    assert!(m.starts_with("fail to decode loadbalancer: "), "{m}");
    // The CRD's enums and the object's own apiVersion and kind are checked, as Kubernetes does.
    let m = refuse(
        Method::POST,
        LBS,
        mk_lb("default", "x", json!({"workloadType": "container"})),
    )
    .await;
    assert_eq!(
        m,
        "fail to decode loadbalancer: spec.workloadType: Unsupported value: \"container\": supported values: \"vm\", \"cluster\""
    );
    let mut wrong_kind = mk_lb("default", "x", json!({}));
    wrong_kind["kind"] = json!("IPPool");
    let m = refuse(Method::POST, LBS, wrong_kind).await;
    assert_eq!(
        m,
        "fail to decode loadbalancer: kind must be \"LoadBalancer\", not \"IPPool\""
    );

    // IPPools: the upstream validator's cases.
    let ns_scope =
        |ns: &str| json!({"scope": [{"project": "*", "namespace": ns, "guestCluster": "*"}]});
    create_pool(
        &b,
        mk_pool(
            "global",
            range("10.0.0.0/24", "10.0.0.10", "10.0.0.20"),
            global(),
        ),
    )
    .await;
    create_pool(
        &b,
        mk_pool("prio", range("10.1.0.0/24", "", ""), json!({"priority": 10, "scope": [{"project": "*", "namespace": "a", "guestCluster": "*"}]})),
    )
    .await;
    create_pool(
        &b,
        mk_pool("zero", range("10.2.0.0/24", "", ""), ns_scope("b")),
    )
    .await;
    let pool_cases = [
        (
            mk_pool("p", json!([]), ns_scope("c")),
            "range can't be empty",
        ),
        (
            mk_pool("p", range("10.9.0.0/33", "", ""), ns_scope("c")),
            "invalid CIDR address: 10.9.0.0/33, a valid example is 192.168.1.0/24",
        ),
        (
            mk_pool("p", range("10.9.0.0/24", "10.9.1.1", ""), ns_scope("c")),
            "invalid range start 10.9.1.1: IP 10.9.1.1 is out of subnet 10.9.0.0/24",
        ),
        (
            mk_pool(
                "p",
                json!([{"subnet": "10.9.0.0/24", "rangeStart": "10.9.0.1", "rangeEnd": "10.9.0.9"}, {"subnet": "10.9.0.0/24", "rangeStart": "10.9.0.5", "rangeEnd": "10.9.0.20"}]),
                ns_scope("c"),
            ),
            "there are overlaps between range 10.9.0.1-10.9.0.9 and 10.9.0.5-10.9.0.20",
        ),
        (
            mk_pool(
                "p",
                range("10.0.0.0/24", "10.0.0.15", "10.0.0.30"),
                ns_scope("c"),
            ),
            "the ranges 10.0.0.15-10.0.0.30 overlap with other pools",
        ),
        (
            mk_pool("p", range("10.9.0.0/24", "", ""), global()),
            "there is already a global IP pool: global",
        ),
        (
            mk_pool(
                "p",
                range("10.9.0.0/24", "", ""),
                json!({"scope": [{"project": "*", "namespace": "c", "guestCluster": "*"}, {"project": "x", "namespace": "c", "guestCluster": "y"}]}),
            ),
            "selector {Priority:0 Network: Scope:[{Project:* Namespace:c GuestCluster:*} {Project:x Namespace:c GuestCluster:y}]} is invalid: scope overlaps",
        ),
        (
            mk_pool(
                "p",
                range("10.9.0.0/24", "", ""),
                json!({"priority": 10, "scope": [{"project": "*", "namespace": "c", "guestCluster": "*"}]}),
            ),
            "the priority can't be the same as the pool prio",
        ),
        (
            mk_pool("p", range("10.9.0.0/24", "", ""), ns_scope("b")),
            "scope selector is same as the pool zero with priority 0 Project * Namespace b GuestCluster *, set a different priority or scope",
        ),
    ];
    for (body, want) in pool_cases {
        let m = refuse(Method::POST, POOLS, body).await;
        assert_eq!(m, format!("can't create IP pool p because {want}"));
    }
    // Update messages wrap the same checks.
    let mut zero = pool(&b, "zero").await;
    zero["spec"]["ranges"] = range("10.0.0.0/24", "10.0.0.5", "10.0.0.15");
    let m = refuse(Method::PUT, &format!("{POOLS}/zero"), zero).await;
    assert_eq!(
        m,
        "can't update IP pool zero because the ranges 10.0.0.5-10.0.0.15 overlap with other pools"
    );
    call(&b, Method::GET, &format!("{POOLS}/nope"), None)
        .await
        .error(StatusCode::NOT_FOUND, "NotFound");
    call(
        &b,
        Method::POST,
        POOLS,
        Some(mk_pool(
            "zero",
            range("10.50.0.0/24", "", ""),
            ns_scope("q"),
        )),
    )
    .await
    .error(StatusCode::CONFLICT, "Conflict");
}

/// What upstream's IPPool webhooks and range rules accept and refuse, where we used to judge
/// otherwise: a pool may mix IPv4 and IPv6 ranges (allocated round robin across them, in spec
/// order); an update may make an allocated address the gateway; a bound naming a /32's only
/// address, or an IPv6 subnet's last address, is refused; so is a network that is not
/// `namespace/name`, before any lookup.
pub async fn upstream_range_and_network_rules<B: Backend>(b: B) {
    let _r = Reconcilers::start(b.service_store());
    let refuse = async |method: Method, path: &str, body: Value| {
        call(&b, method, path, Some(body))
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent")
    };
    // pkg/ipam/allocator.go (MakeRange, parseIP): networkIP and broadcastIP of every subnet.
    for (ranges, want) in [
        (
            range("10.81.0.9/32", "10.81.0.9", ""),
            "invalid range start 10.81.0.9: IP 10.81.0.9 is the network address",
        ),
        (
            range("10.81.0.9/32", "", "10.81.0.9"),
            "invalid range end 10.81.0.9: IP 10.81.0.9 is the network address",
        ),
        (
            range("fd00:81::/120", "fd00:81::10", "fd00:81::ff"),
            "invalid range end fd00:81::ff: IP fd00:81::ff is the broadcast address",
        ),
    ] {
        let m = refuse(Method::POST, POOLS, mk_pool("p", ranges, global())).await;
        assert_eq!(m, format!("can't create IP pool p because {want}"));
    }
    // pkg/utils/vid.go (GetVid): "invalid network" when the network does not split in two.
    for network in ["vlan10", "default/vlan10/x"] {
        let m = refuse(
            Method::POST,
            POOLS,
            mk_pool(
                "p",
                range("10.81.0.0/24", "", ""),
                json!({"network": network, "scope": [{"project": "*", "namespace": "n", "guestCluster": "*"}]}),
            ),
        )
        .await;
        assert_eq!(
            m,
            format!("can't create IP pool p because invalid network {network}")
        );
    }
    // A /32 without bounds is its one address, with no gateway.
    create_pool(
        &b,
        mk_pool(
            "one",
            range("10.81.1.9/32", "", ""),
            json!({"scope": [{"project": "*", "namespace": "one", "guestCluster": "*"}]}),
        ),
    )
    .await;

    // pkg/ipam/rangeset.go: both families in one pool; the CNI range set walks them in order.
    let mixed = json!([
        {"subnet": "10.80.0.0/24", "rangeStart": "10.80.0.10", "rangeEnd": "10.80.0.11"},
        {"subnet": "fd00:80::/120", "rangeStart": "fd00:80::10", "rangeEnd": "fd00:80::11"},
    ]);
    create_pool(&b, mk_pool("mixed", mixed, global())).await;
    eventually("the mixed pool to be counted", async || {
        (pool(&b, "mixed").await["status"]["total"] == 4).then_some(())
    })
    .await;
    let mut got = Vec::new();
    for name in ["lb1", "lb2", "lb3", "lb4"] {
        create_lb(&b, mk_lb("default", name, json!({"ipam": "pool"}))).await;
        got.push(ip_of(&allocated(&b, "default", name).await));
    }
    assert_eq!(
        got,
        ["10.80.0.10", "10.80.0.11", "fd00:80::10", "fd00:80::11"]
    );
    let lb3 = allocated(&b, "default", "lb3").await;
    assert_eq!(
        lb3["status"]["allocatedAddress"]["mask"],
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00"
    );
    assert_eq!(lb3["status"]["allocatedAddress"]["gateway"], "fd00:80::1");

    // pkg/webhook/ippool/validator.go (checkAllocated): the gateway counts as inside the range,
    // so lb1's address may become the gateway; it stays held, and no longer counts.
    ok(
        update_pool(&b, "mixed", |p| {
            p["spec"]["ranges"][0]["gateway"] = json!("10.80.0.10")
        })
        .await,
        StatusCode::OK,
    );
    eventually("the pool to be recounted", async || {
        let p = pool(&b, "mixed").await;
        (p["status"]["total"] == 3).then_some(())
    })
    .await;
    let p = pool(&b, "mixed").await;
    assert_eq!(p["status"]["allocated"]["10.80.0.10"], "default/lb1");
    // Upstream's pool controller would write total - len(allocated) = -1
    // (pkg/controller/ippool/controller.go); ours counts only addresses it could hand out.
    assert_eq!(p["status"]["available"], 0);
    assert_eq!(ip_of(&allocated(&b, "default", "lb1").await), "10.80.0.10");
    // Shrinking past it is still refused.
    assert_eq!(
        update_pool(&b, "mixed", |p| {
            p["spec"]["ranges"][0]["rangeStart"] = json!("10.80.0.11")
        })
        .await
        .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent"),
        "can't update IP pool mixed because allocated IP 10.80.0.10 is excluded"
    );
}

pub async fn webhook_answers_admission_reviews<B: Backend>(b: B) {
    let review = |operation: &str, kind: &str, object: Value, old: Value| {
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "loadbalancer.harvesterhci.io", "version": "v1beta1", "kind": kind},
                "resource": {"group": "loadbalancer.harvesterhci.io", "version": "v1beta1", "resource": "x"},
                "name": if object.is_null() { old["metadata"]["name"].clone() } else { object["metadata"]["name"].clone() },
                "operation": operation,
                "userInfo": {"username": "admin"},
                "object": object,
                "oldObject": old,
                "dryRun": false
            }
        })
    };
    let post = async |path: &str, body: Value| {
        let r = b
            .call(Method::POST, path, None, Body::from(body.to_string()))
            .await;
        ok(r, StatusCode::OK)["response"].clone()
    };
    let bad = mk_lb("default", "lb1", json!({"listeners": []}));
    let resp = post(
        "/v1/webhook/validation",
        review("CREATE", "LoadBalancer", bad, Value::Null),
    )
    .await;
    assert_eq!(resp["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(resp["allowed"], false);
    assert_eq!(
        resp["status"]["message"],
        "create loadbalancer default/lb1 failed: the loadbalancer needs to have at least one listener"
    );
    let good = mk_lb("default", "lb1", json!({}));
    let resp = post(
        "/v1/webhook/validation",
        review("CREATE", "LoadBalancer", good.clone(), Value::Null),
    )
    .await;
    assert_eq!(resp["allowed"], true);
    let mut dhcp = good.clone();
    dhcp["spec"]["ipam"] = json!("dhcp");
    let resp = post(
        "/v1/webhook/validation",
        review("UPDATE", "LoadBalancer", dhcp, good.clone()),
    )
    .await;
    assert_eq!(
        resp["status"]["message"],
        "update loadbalancer default/lb1 failed: can't change the IPAM from  to dhcp"
    );
    let mut held = mk_pool("p", range("10.0.0.0/24", "", ""), global());
    held["status"] = json!({"total": 253, "available": 252, "lastAllocated": "10.0.0.2", "allocated": {"10.0.0.2": "default/lb1"}});
    let resp = post(
        "/v1/webhook/validation",
        review("DELETE", "IPPool", Value::Null, held),
    )
    .await;
    assert_eq!(
        resp["status"]["message"],
        "can't delete pool before releasing all the allocated IP"
    );
    // The mutating webhook patches labels and annotations.
    let resp = post(
        "/v1/webhook/mutation",
        review(
            "CREATE",
            "IPPool",
            mk_pool("p", range("10.0.0.0/24", "", ""), global()),
            Value::Null,
        ),
    )
    .await;
    assert_eq!(resp["allowed"], true);
    assert_eq!(resp["patchType"], "JSONPatch", "{resp}");
    use base64::Engine;
    let patch = base64::engine::general_purpose::STANDARD
        .decode(resp["patch"].as_str().expect("patch"))
        .expect("base64");
    let patch: Value = serde_json::from_slice(&patch).expect("JSON patch");
    assert_eq!(
        patch,
        json!([{"op": "add", "path": "/metadata/labels", "value": {
            "loadbalancer.harvesterhci.io/global-ip-pool": "true",
            "loadbalancer.harvesterhci.io/vid": "0"}}])
    );
    // Garbage is a 422, not a crash.
    b.call(
        Method::POST,
        "/v1/webhook/validation",
        None,
        Body::from("{"),
    )
    .await
    .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
}
