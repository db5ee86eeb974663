//! Allocation end to end: selection, DHCP, exhaustion, release on deletion and on a pool change,
//! requested addresses and families, and a restart.

use crate::*;

pub async fn allocation_end_to_end<B: Backend>(b: B) {
    let r = Reconcilers::start(b.service_store());
    let created = create_pool(
        &b,
        mk_pool(
            "pool1",
            range("192.168.100.0/24", "192.168.100.10", "192.168.100.20"),
            global(),
        ),
    )
    .await;
    assert_eq!(created["id"], "pool1");
    assert_eq!(created["type"], "loadbalancer.harvesterhci.io.ippool");
    assert_eq!(
        created["metadata"]["labels"]["loadbalancer.harvesterhci.io/global-ip-pool"],
        "true"
    );
    assert_eq!(
        created["metadata"]["labels"]["loadbalancer.harvesterhci.io/vid"],
        "0"
    );

    let lb = create_lb(&b, mk_lb("default", "lb1", json!({"ipam": "pool"}))).await;
    assert_eq!(lb["id"], "default/lb1");
    assert_eq!(lb["type"], "loadbalancer.harvesterhci.io.loadbalancer");
    assert_eq!(
        lb["metadata"]["annotations"]["loadbalancer.harvesterhci.io/namespace"],
        "default"
    );
    // Admission puts the reconciler's finalizer on it as it is created (the reconciler's first
    // write is then its status), on both backends.
    assert_eq!(
        lb["metadata"]["finalizers"],
        json!(["wrangler.cattle.io/harvester-lb-controller"])
    );

    let lb = allocated(&b, "default", "lb1").await;
    let address = &lb["status"]["allocatedAddress"];
    assert_eq!(address["ipPool"], "pool1");
    assert_eq!(address["ip"], "192.168.100.10");
    assert_eq!(address["mask"], "255.255.255.0");
    assert_eq!(address["gateway"], "192.168.100.1");
    // A VM load balancer's address is its Service's ingress, which kube-vip writes: until then
    // it has none, and says so with upstream's message.
    assert_eq!(lb["status"]["address"], Value::Null);
    let condition = ready(&lb).expect("ready");
    assert_eq!(condition["message"], "service is waiting for external IP");
    assert!(
        lb["metadata"]["finalizers"]
            .as_array()
            .expect("finalizers")
            .contains(&json!("wrangler.cattle.io/harvester-lb-controller"))
    );

    let p = eventually("the pool to be Ready and count", async || {
        let p = pool(&b, "pool1").await;
        (p["status"]["available"] == 10 && ready(&p).is_some_and(|c| c["status"] == "True"))
            .then_some(p)
    })
    .await;
    assert_eq!(p["status"]["total"], 11);
    assert_eq!(p["status"]["lastAllocated"], "192.168.100.10");
    assert_eq!(
        p["status"]["allocated"],
        json!({"192.168.100.10": "default/lb1"})
    );

    // Collections, in steve's shape.
    for (path, type_) in [
        (POOLS.to_string(), "loadbalancer.harvesterhci.io.ippool"),
        (LBS.to_string(), "loadbalancer.harvesterhci.io.loadbalancer"),
        (
            format!("{LBS}/default"),
            "loadbalancer.harvesterhci.io.loadbalancer",
        ),
    ] {
        let c = ok(get(&b, &path).await, StatusCode::OK);
        assert_eq!(c["type"], "collection");
        assert_eq!(c["resourceType"], type_);
        assert_eq!(c["data"].as_array().expect("data").len(), 1, "{path}");
        assert_eq!(c["data"][0]["type"], type_);
    }
    let other = ok(get(&b, &format!("{LBS}/other")).await, StatusCode::OK);
    assert_eq!(other["data"], json!([]));

    let events = events_about(&b, "lb1", "Allocated").await;
    assert_eq!(
        events[0].message.as_deref(),
        Some("allocated 192.168.100.10 from IP pool pool1")
    );
    assert_consistent(&b).await;
    r.stop().await;
}

pub async fn selection_matrix<B: Backend>(b: B) {
    let _r = Reconcilers::start(b.service_store());
    let vlan10 = "default/vlan10";
    let vlan20 = "default/vlan20";
    ensure_network(&b, "default", "vlan10", 10).await;
    ensure_network(&b, "default", "vlan20", 20).await;
    ensure_namespace(&b, "test", None).await;
    ensure_namespace(&b, "guest", Some("c-1:p-1")).await;
    ensure_namespace(&b, "guest2", Some("c-1:p-2")).await;
    create_pool(
        &b,
        mk_pool(
            "default",
            range("10.10.0.0/24", "10.10.0.10", "10.10.0.20"),
            json!({"network": vlan10, "scope": [{"project": "*", "namespace": "default", "guestCluster": "*"}]}),
        ),
    )
    .await;
    create_pool(
        &b,
        mk_pool(
            "withscope",
            range("10.20.0.0/24", "10.20.0.10", "10.20.0.20"),
            json!({"network": vlan20, "scope": [{"project": "c-1/p-1", "namespace": "guest", "guestCluster": "cluster1"}]}),
        ),
    )
    .await;
    create_pool(
        &b,
        mk_pool(
            "noscope",
            range("10.21.0.0/24", "10.21.0.10", "10.21.0.20"),
            json!({"network": vlan20, "scope": [{"namespace": "guest2"}]}),
        ),
    )
    .await;
    let net = |n: &str| ("loadbalancer.harvesterhci.io/network", n.to_string());
    let pick =
        async |namespace: &str, name: &str, spec: Value, annotations: Vec<(&str, String)>| {
            let a: Vec<(&str, &str)> = annotations.iter().map(|(k, v)| (*k, v.as_str())).collect();
            create_lb(&b, with_annotations(mk_lb(namespace, name, spec), &a)).await;
            pool_of(&allocated(&b, namespace, name).await)
        };

    // 1. vlan10 in namespace default: "default", then "defaultPriority" once it exists.
    assert_eq!(
        pick("default", "a1", json!({}), vec![net(vlan10)]).await,
        "default"
    );
    create_pool(
        &b,
        mk_pool(
            "defaultpriority",
            range("10.11.0.0/24", "10.11.0.10", "10.11.0.20"),
            json!({"network": vlan10, "priority": 100, "scope": [{"project": "*", "namespace": "default", "guestCluster": "*"}]}),
        ),
    )
    .await;
    assert_eq!(
        pick("default", "a2", json!({}), vec![net(vlan10)]).await,
        "defaultpriority"
    );
    // Stickiness: a1 keeps its pool although a better one exists now.
    assert_eq!(pool_of(&allocated(&b, "default", "a1").await), "default");

    // 2. Namespace test matches nothing: refused, then the global pool once it exists.
    create_lb(
        &b,
        with_annotations(
            mk_lb("test", "b1", json!({})),
            &[("loadbalancer.harvesterhci.io/network", vlan10)],
        ),
    )
    .await;
    let condition = refused(&b, "test", "b1").await;
    assert_eq!(condition["reason"], "NoMatchedIPPool");
    assert_eq!(
        condition["message"],
        "no matched IPPool with requirement &{Network:default/vlan10 Project: Namespace:test Cluster:}"
    );
    events_about(&b, "b1", "NoMatchedIPPool").await;
    create_pool(
        &b,
        mk_pool(
            "global",
            range("10.99.0.0/24", "10.99.0.10", "10.99.0.20"),
            global(),
        ),
    )
    .await;
    // Woken by the new pool, not by a timer.
    assert_eq!(pool_of(&allocated(&b, "test", "b1").await), "global");

    // 3. An exact project, namespace and cluster: the full-scope pool. The project comes from
    //    the namespace's Rancher project (the mutator overwrites what the guest wrote).
    let guest = |project: &str| {
        vec![
            net(vlan20),
            ("loadbalancer.harvesterhci.io/project", project.to_string()),
            (
                "loadbalancer.harvesterhci.io/cluster",
                "cluster1".to_string(),
            ),
        ]
    };
    let cluster = json!({"workloadType": "cluster"});
    assert_eq!(
        pick("guest", "c1", cluster.clone(), guest("ignored")).await,
        "withscope"
    );
    let c1 = get(&b, &format!("{LBS}/guest/c1")).await.json();
    assert_eq!(
        c1["metadata"]["annotations"]["loadbalancer.harvesterhci.io/project"],
        "c-1/p-1"
    );
    // 4. Loose mode for guest clusters: a project the pool does not name gives the
    //    namespace-only pool (before the global pool: upstream would pick the global one).
    assert_eq!(
        pick("guest2", "c2", cluster.clone(), guest("ignored")).await,
        "noscope"
    );
    // A VM load balancer does not match loosely: the global pool.
    assert_eq!(
        pick("guest2", "v1", json!({}), guest("unknown")).await,
        "global"
    );
    // An explicit pool wins over matching.
    assert_eq!(
        pick("test", "e1", json!({"ipPool": "noscope"}), vec![]).await,
        "noscope"
    );
    assert_consistent(&b).await;
}

pub async fn dhcp<B: Backend>(b: B) {
    let _r = Reconcilers::start(b.service_store());
    create_pool(
        &b,
        mk_pool(
            "pool1",
            range("10.0.0.0/24", "10.0.0.10", "10.0.0.20"),
            global(),
        ),
    )
    .await;
    create_lb(&b, mk_lb("default", "d1", json!({"ipam": "dhcp"}))).await;
    let lb = allocated(&b, "default", "d1").await;
    assert_eq!(lb["status"]["allocatedAddress"], json!({"ip": "0.0.0.0"}));
    // The guest's kube-vip reports the leased address; the controller does not invent one.
    assert!(lb["status"]["address"].is_null());
    let p = pool(&b, "pool1").await;
    assert!(p["status"]["allocated"].is_null(), "{p}");
    // Deleting it releases nothing and completes.
    ok(
        call(&b, Method::DELETE, &format!("{LBS}/default/d1"), None).await,
        StatusCode::OK,
    );
    gone(&b, &format!("{LBS}/default/d1")).await;
}

pub async fn exhaustion_then_success_after_delete<B: Backend>(b: B) {
    let _r = Reconcilers::start(b.service_store());
    create_pool(
        &b,
        mk_pool(
            "small",
            range("10.0.0.0/24", "10.0.0.10", "10.0.0.11"),
            global(),
        ),
    )
    .await;
    create_lb(&b, mk_lb("default", "lb1", json!({}))).await;
    let first = ip_of(&allocated(&b, "default", "lb1").await);
    create_lb(&b, mk_lb("default", "lb2", json!({}))).await;
    allocated(&b, "default", "lb2").await;
    create_lb(&b, mk_lb("default", "lb3", json!({}))).await;
    let condition = refused(&b, "default", "lb3").await;
    assert_eq!(condition["reason"], "PoolExhausted");
    assert_eq!(
        condition["message"],
        "fail to get ip from pool small, error: no IP addresses available in range set: 10.0.0.10-10.0.0.11"
    );
    events_about(&b, "lb3", "PoolExhausted").await;
    let p = pool(&b, "small").await;
    assert_eq!(p["status"]["available"], 0);

    ok(
        call(&b, Method::DELETE, &format!("{LBS}/default/lb1"), None).await,
        StatusCode::OK,
    );
    // The waiter is woken by the release (its fallback re-check is a minute away).
    let lb3 = allocated(&b, "default", "lb3").await;
    assert_eq!(ip_of(&lb3), first);
    gone(&b, &format!("{LBS}/default/lb1")).await;
    events_about(&b, "lb1", "Released").await;
    assert_consistent(&b).await;
}

pub async fn deletion_releases_to_history_and_recreate_gets_old_address<B: Backend>(b: B) {
    let _r = Reconcilers::start(b.service_store());
    create_pool(
        &b,
        mk_pool(
            "pool1",
            range("10.0.0.0/24", "10.0.0.10", "10.0.0.30"),
            global(),
        ),
    )
    .await;
    // An empty `spec.ipam` is pool IPAM, including the release on deletion.
    create_lb(&b, mk_lb("default", "a", json!({}))).await;
    let a = ip_of(&allocated(&b, "default", "a").await);
    create_lb(&b, mk_lb("default", "b", json!({"ipam": "pool"}))).await;
    let b_ip = ip_of(&allocated(&b, "default", "b").await);
    assert_ne!(a, b_ip);

    ok(
        call(&b, Method::DELETE, &format!("{LBS}/default/a"), None).await,
        StatusCode::OK,
    );
    gone(&b, &format!("{LBS}/default/a")).await;
    let p = pool(&b, "pool1").await;
    assert_eq!(p["status"]["allocatedHistory"][&a], "default/a");
    assert!(p["status"]["allocated"].get(&a).is_none());
    assert_eq!(p["status"]["available"], 20);

    // Another load balancer takes the next address, not the remembered one.
    create_lb(&b, mk_lb("default", "c", json!({}))).await;
    let c = ip_of(&allocated(&b, "default", "c").await);
    assert!(c != a && c != b_ip);
    // The same namespace/name gets its old address back.
    create_lb(&b, mk_lb("default", "a", json!({}))).await;
    assert_eq!(ip_of(&allocated(&b, "default", "a").await), a);
    let p = pool(&b, "pool1").await;
    assert!(p["status"]["allocatedHistory"].get(&a).is_none());
    assert_consistent(&b).await;
}

pub async fn pool_change_releases_to_the_old_pool<B: Backend>(b: B) {
    let _r = Reconcilers::start(b.service_store());
    create_pool(
        &b,
        mk_pool(
            "p1",
            range("10.1.0.0/24", "10.1.0.10", "10.1.0.20"),
            json!({}),
        ),
    )
    .await;
    create_pool(
        &b,
        mk_pool(
            "p2",
            range("10.2.0.0/24", "10.2.0.10", "10.2.0.20"),
            json!({}),
        ),
    )
    .await;
    create_lb(&b, mk_lb("default", "lb1", json!({"ipPool": "p1"}))).await;
    let lb = allocated(&b, "default", "lb1").await;
    assert_eq!(pool_of(&lb), "p1");
    let mut changed = lb.clone();
    changed["spec"]["ipPool"] = json!("p2");
    ok(
        call(
            &b,
            Method::PUT,
            &format!("{LBS}/default/lb1"),
            Some(changed),
        )
        .await,
        StatusCode::OK,
    );
    eventually("lb1 to move to p2", async || {
        let lb = get(&b, &format!("{LBS}/default/lb1")).await.json();
        (pool_of(&lb) == "p2").then_some(())
    })
    .await;
    let p1 = pool(&b, "p1").await;
    assert_eq!(p1["status"]["allocatedHistory"]["10.1.0.10"], "default/lb1");
    events_about(&b, "lb1", "Released").await;
    assert_consistent(&b).await;
}

/// `loadbalancer.harvesterhci.io/requestedIP` and `…/ipFamily`: a free requested address is
/// given (and its allocation time recorded), a held one is refused naming the holder with
/// nothing else allocated, one outside every eligible pool is refused, two racing for one
/// address get it once, the holder's release hands it over; an IPv6 pool serves next to an
/// IPv4 one (one global pool per network and family), a family asks for it; bad annotations
/// are refused by admission.
pub async fn requested_address_and_family<B: Backend>(b: B) {
    let r = Reconcilers::start(b.service_store());
    create_pool(
        &b,
        mk_pool(
            "ask4",
            range("192.168.110.0/24", "192.168.110.10", "192.168.110.20"),
            global(),
        ),
    )
    .await;
    create_pool(
        &b,
        mk_pool(
            "ask6",
            range("fd00:110::/64", "fd00:110::10", "fd00:110::20"),
            global(),
        ),
    )
    .await;
    let asking = |name: &str, annotations: &[(&str, &str)]| {
        with_annotations(
            mk_lb("default", name, json!({"workloadType": "cluster"})),
            annotations,
        )
    };
    const IP: &str = "loadbalancer.harvesterhci.io/requestedIP";
    const FAMILY: &str = "loadbalancer.harvesterhci.io/ipFamily";
    create_lb(&b, asking("want15", &[(IP, "192.168.110.15")])).await;
    let lb = allocated(&b, "default", "want15").await;
    assert_eq!(ip_of(&lb), "192.168.110.15");
    let at = lb["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .find(|c| c["type"] == "AddressAllocated")
        .expect("the allocation is recorded")
        .clone();
    assert_eq!(at["status"], "True");
    assert_eq!(at["message"], "192.168.110.15 from IP pool ask4");
    assert!(at["lastTransitionTime"].is_string(), "{at}");

    // Held: refused, naming the holder; nothing else allocated.
    create_lb(&b, asking("dup15", &[(IP, "192.168.110.15")])).await;
    let condition = refused(&b, "default", "dup15").await;
    assert_eq!(condition["reason"], "RequestedAddressTaken");
    assert_eq!(
        condition["message"],
        "requested address 192.168.110.15 is held by default/want15 in IP pool ask4"
    );
    assert_eq!(
        pool(&b, "ask4").await["status"]["allocated"],
        json!({"192.168.110.15": "default/want15"})
    );
    // Outside every pool it may use.
    create_lb(&b, asking("outside", &[(IP, "10.0.0.1")])).await;
    let condition = refused(&b, "default", "outside").await;
    assert_eq!(condition["reason"], "RequestedAddressUnavailable");
    assert_eq!(
        condition["message"],
        "requested address 10.0.0.1 is not in any IP pool this load balancer may use (eligible: ask4)"
    );
    // A family: IPv6 from the IPv6 pool; none asked: IPv4 first.
    create_lb(&b, asking("six", &[(FAMILY, "IPv6")])).await;
    assert!(ip_of(&allocated(&b, "default", "six").await).starts_with("fd00:110::"));
    create_lb(&b, asking("any", &[])).await;
    assert!(ip_of(&allocated(&b, "default", "any").await).starts_with("192.168.110."));
    create_lb(&b, asking("six-asked", &[(IP, "fd00:110::1a")])).await;
    assert_eq!(
        ip_of(&allocated(&b, "default", "six-asked").await),
        "fd00:110::1a"
    );

    // Two racing for one address: one gets it.
    let (x, y) = tokio::join!(
        call(
            &b,
            Method::POST,
            LBS,
            Some(asking("race-x", &[(IP, "192.168.110.17")]))
        ),
        call(
            &b,
            Method::POST,
            LBS,
            Some(asking("race-y", &[(IP, "192.168.110.17")]))
        ),
    );
    assert_eq!(x.status, StatusCode::CREATED, "{}", x.text());
    assert_eq!(y.status, StatusCode::CREATED, "{}", y.text());
    let loser = eventually("one racer to be refused", async || {
        for (name, other) in [("race-x", "race-y"), ("race-y", "race-x")] {
            let lb = get(&b, &format!("{LBS}/default/{name}")).await.json();
            let refused = ready(&lb).is_some_and(|c| c["reason"] == "RequestedAddressTaken");
            if refused {
                return Some((name, other));
            }
        }
        None
    })
    .await;
    let winner = allocated(&b, "default", loser.1).await;
    assert_eq!(ip_of(&winner), "192.168.110.17");
    let lost = get(&b, &format!("{LBS}/default/{}", loser.0)).await.json();
    assert_eq!(lost["status"]["allocatedAddress"]["ip"], Value::Null);

    // The holder goes: the waiting one gets the address.
    ok(
        call(&b, Method::DELETE, &format!("{LBS}/default/want15"), None).await,
        StatusCode::OK,
    );
    let lb = allocated(&b, "default", "dup15").await;
    assert_eq!(ip_of(&lb), "192.168.110.15");
    assert_consistent(&b).await;

    // Admission: what cannot be a request is refused.
    for (annotations, message) in [
        (
            vec![(IP, "nope")],
            "annotation loadbalancer.harvesterhci.io/requestedIP \"nope\" is not an IP address",
        ),
        (
            vec![(FAMILY, "IPv5")],
            "annotation loadbalancer.harvesterhci.io/ipFamily \"IPv5\" is neither IPv4 nor IPv6",
        ),
        (
            vec![(IP, "192.168.110.11"), (FAMILY, "IPv6")],
            "requested address 192.168.110.11 is not an IPv6 address, as annotation loadbalancer.harvesterhci.io/ipFamily asks",
        ),
    ] {
        let refusal = call(&b, Method::POST, LBS, Some(asking("bad", &annotations))).await;
        let text = refusal.error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        assert_eq!(
            text,
            format!("create loadbalancer default/bad failed: {message}")
        );
    }
    let mut dhcp = asking("bad", &[(IP, "192.168.110.12")]);
    dhcp["spec"]["ipam"] = json!("dhcp");
    let refusal = call(&b, Method::POST, LBS, Some(dhcp)).await;
    assert_eq!(
        refusal.error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent"),
        "create loadbalancer default/bad failed: requested address 192.168.110.12 needs pool IPAM, and spec.ipam is dhcp"
    );
    r.stop().await;
}

pub async fn restart_resyncs_without_double_assignment<B: Backend>(b: B) {
    let r = Reconcilers::start(b.service_store());
    create_pool(
        &b,
        mk_pool(
            "p",
            range("10.0.0.0/24", "10.0.0.10", "10.0.0.100"),
            global(),
        ),
    )
    .await;
    for i in 0..20 {
        create_lb(&b, mk_lb("default", &format!("lb{i}"), json!({}))).await;
    }
    let mut before = HashMap::new();
    for i in 0..20 {
        let name = format!("lb{i}");
        before.insert(name.clone(), ip_of(&allocated(&b, "default", &name).await));
    }
    r.stop().await;
    // While no reconciler runs: some go, some come (the API works without them).
    for i in 0..5 {
        ok(
            call(&b, Method::DELETE, &format!("{LBS}/default/lb{i}"), None).await,
            StatusCode::OK,
        );
    }
    for i in 20..30 {
        create_lb(&b, mk_lb("default", &format!("lb{i}"), json!({}))).await;
    }
    let b = b.restart().await;
    let _r = Reconcilers::start(b.service_store());
    for i in 0..5 {
        gone(&b, &format!("{LBS}/default/lb{i}")).await;
    }
    for i in 5..30 {
        let name = format!("lb{i}");
        let ip = ip_of(&allocated(&b, "default", &name).await);
        if let Some(old) = before.get(&name) {
            assert_eq!(&ip, old, "{name} kept its address across the restart");
        }
    }
    assert_consistent(&b).await;
}
