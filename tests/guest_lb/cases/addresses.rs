//! What a Service is given: pool and DHCP addresses, requested addresses, and dual-stack Services.

use crate::*;

/// A Service asks for an address with `spec.loadBalancerIP` (or a `kube-vip.io/loadbalancerIPs`
/// of its own): a free one in an eligible pool is given; a held one is refused naming the
/// holder and nothing else is given; one outside every eligible pool is refused; two Services
/// racing for one address get it once; a changed request moves the address only onto a free
/// one.
pub async fn requested_addresses<E: GuestEnv>(env: E) {
    create_pool(
        env.harvester(),
        mk_pool(
            "req",
            range("10.30.0.0/24", "10.30.0.10", "10.30.0.30"),
            global(),
        ),
    )
    .await;
    env.put(svc_asking(
        "asks",
        80,
        json!({"loadBalancerIP": "10.30.0.15"}),
    ))
    .await
    .expect("accepted");
    let (asks, ip) = address(&env, "default", "asks").await;
    assert_eq!(ip, "10.30.0.15");
    let asks_lb = format!("{NS}/{}", lb_name(&asks));
    // The kube-vip annotation of a Service that has no load balancer yet is a request too.
    let mut annotated = mk_svc("default", "annotated", &[("TCP", 81)], &[]);
    annotated["metadata"]["annotations"] = json!({"kube-vip.io/loadbalancerIPs": "10.30.0.20"});
    env.put(annotated).await.expect("accepted");
    assert_eq!(address(&env, "default", "annotated").await.1, "10.30.0.20");

    // Held: refused with the holder named, and nothing else allocated.
    env.put(svc_asking(
        "same",
        82,
        json!({"loadBalancerIP": "10.30.0.15"}),
    ))
    .await
    .expect("accepted");
    let message = event_containing(&env, "same", "is held by").await;
    assert!(
        message.contains(&format!(
            "requested address 10.30.0.15 is held by {asks_lb} in IP pool req"
        )),
        "{message}"
    );
    let same = env.get("default", "same").await.expect("exists");
    let same_lb = lb_of(&env, &same).await.expect("its load balancer");
    assert_eq!(same_lb["status"]["allocatedAddress"]["ip"], Value::Null);
    assert_eq!(
        same_lb["status"]["conditions"][0]["reason"],
        "RequestedAddressTaken"
    );
    let held = allocated(&env, "req").await;
    assert_eq!(held.len(), 2, "nothing else allocated: {held:?}");

    // Outside every eligible pool.
    env.put(svc_asking(
        "outside",
        83,
        json!({"loadBalancerIP": "10.99.0.5"}),
    ))
    .await
    .expect("accepted");
    let message = event_containing(&env, "outside", "is not in any IP pool").await;
    assert!(message.contains("requested address 10.99.0.5"), "{message}");
    assert_eq!(allocated(&env, "req").await.len(), 2);

    // The holder goes: the waiting Service gets the address (the release wakes it).
    env.delete("default", "asks").await;
    let (_, ip) = address(&env, "default", "same").await;
    assert_eq!(ip, "10.30.0.15");

    // Two Services racing for one address: one gets it, the other is refused.
    let (a, b) = tokio::join!(
        env.put(svc_asking(
            "racer-a",
            84,
            json!({"loadBalancerIP": "10.30.0.17"})
        )),
        env.put(svc_asking(
            "racer-b",
            85,
            json!({"loadBalancerIP": "10.30.0.17"})
        )),
    );
    a.expect("accepted");
    b.expect("accepted");
    let (winner, loser) = eventually("one racer to get 10.30.0.17", async || {
        let a = env.get("default", "racer-a").await?;
        let b = env.get("default", "racer-b").await?;
        match (ingress(&a), ingress(&b)) {
            (Some(_), Some(_)) => panic!("both racers got an address: {a} {b}"),
            (Some(ip), None) => Some((ip.to_string(), "racer-b")),
            (None, Some(ip)) => Some((ip.to_string(), "racer-a")),
            (None, None) => None,
        }
    })
    .await;
    assert_eq!(winner, "10.30.0.17");
    event_containing(&env, loser, "requested address 10.30.0.17 is held by").await;
    let held = allocated(&env, "req").await;
    assert_eq!(
        held.keys().filter(|ip| *ip == "10.30.0.17").count(),
        1,
        "{held:?}"
    );

    // A changed request moves the address onto a free one, and the old one is freed.
    let mut moved = env.get("default", "same").await.expect("exists");
    moved["spec"]["loadBalancerIP"] = json!("10.30.0.18");
    env.put(moved).await.expect("accepted");
    ingress_is(&env, "same", &["10.30.0.18"]).await;
    eventually("10.30.0.15 to be free", async || {
        (!allocated(&env, "req").await.contains_key("10.30.0.15")).then_some(())
    })
    .await;
    // Onto a held one it does not move: it keeps its address and says why.
    let mut blocked = env.get("default", "same").await.expect("exists");
    blocked["spec"]["loadBalancerIP"] = json!("10.30.0.17");
    env.put(blocked).await.expect("accepted");
    let message = event_containing(&env, "same", "keeps 10.30.0.18").await;
    assert!(message.contains("10.30.0.17 is held by"), "{message}");
    let same = env.get("default", "same").await.expect("exists");
    assert_eq!(ingresses(&same), ["10.30.0.18"]);
    assert_eq!(
        allocated(&env, "req").await.get("10.30.0.18"),
        Some(&format!("{NS}/{}", lb_name(&same)))
    );

    // A request that is not an address is refused at once where the API answers.
    let put = env
        .put(svc_asking(
            "bad",
            86,
            json!({"loadBalancerIP": "10.30.0.300"}),
        ))
        .await;
    let expected = "service default/bad: requested address \"10.30.0.300\" is not an IP address";
    match put {
        Err(m) if m == expected => {}
        // The Kubernetes API server validates spec.loadBalancerIP itself.
        Err(m) => assert!(m.contains("loadBalancerIP"), "{m}"),
        Ok(_) => {
            event(
                &env,
                "default",
                "bad",
                reconcile::reason::SYNC_FAILED,
                expected,
            )
            .await
        }
    }
}

/// Dual-stack Services get one address per family in `ipFamilies` order (one LoadBalancer per
/// family); RequireDualStack without an IPv6 pool waits, saying why, while PreferDualStack takes
/// IPv4 alone; an IPv6 pool gives both the second family; a dual-stack primary's addresses are
/// not shared; going single-stack releases the second family's address.
pub async fn dual_stack_services<E: GuestEnv>(env: E) {
    ok(
        call(
            env.harvester(),
            Method::POST,
            POOLS,
            Some(mk_pool(
                "v4",
                range("10.40.0.0/24", "10.40.0.10", "10.40.0.20"),
                global(),
            )),
        )
        .await,
        StatusCode::CREATED,
    );
    let dual = |name: &str, port: i32, policy: &str, families: &[&str]| {
        svc_asking(
            name,
            port,
            json!({"ipFamilyPolicy": policy, "ipFamilies": families}),
        )
    };
    env.put(dual("strict", 80, "RequireDualStack", &["IPv4", "IPv6"]))
        .await
        .expect("accepted");
    env.put(dual("prefer", 81, "PreferDualStack", &["IPv4", "IPv6"]))
        .await
        .expect("accepted");
    // PreferDualStack: IPv4 alone for now.
    eventually("prefer to get its IPv4 address alone", async || {
        let svc = env.get("default", "prefer").await?;
        let got = ingresses(&svc);
        (got.len() == 1 && got[0].starts_with("10.40.0.")).then_some(())
    })
    .await;
    // RequireDualStack: nothing, and the Service says why.
    let message = event_containing(&env, "strict", "RequireDualStack").await;
    assert!(
        message.contains("no matched IPPool with IPv6 ranges"),
        "{message}"
    );
    let strict = env.get("default", "strict").await.expect("exists");
    assert!(ingresses(&strict).is_empty(), "{strict}");

    ok(
        call(
            env.harvester(),
            Method::POST,
            POOLS,
            Some(mk_pool(
                "v6",
                range("fd00:40::/64", "fd00:40::10", "fd00:40::20"),
                global(),
            )),
        )
        .await,
        StatusCode::CREATED,
    );
    let strict = eventually("strict to get both families", async || {
        let svc = env.get("default", "strict").await?;
        (ingresses(&svc).len() == 2).then_some(svc)
    })
    .await;
    let both = ingresses(&strict);
    assert!(both[0].starts_with("10.40.0."), "{both:?}");
    assert!(both[1].starts_with("fd00:40::"), "{both:?}");
    assert_eq!(
        annotation(&strict, "kube-vip.io/loadbalancerIPs"),
        Some(both.join(",").as_str())
    );
    eventually("prefer to get its IPv6 address too", async || {
        let svc = env.get("default", "prefer").await?;
        (ingresses(&svc).len() == 2).then_some(())
    })
    .await;
    // IPv6 first when the Service lists it first; a requested address per family.
    env.put(svc_asking(
        "six-first",
        82,
        json!({"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv6", "IPv4"]}),
    ))
    .await
    .expect("accepted");
    let six = eventually("six-first to get both families", async || {
        let svc = env.get("default", "six-first").await?;
        (ingresses(&svc).len() == 2).then_some(svc)
    })
    .await;
    let order = ingresses(&six);
    assert!(order[0].starts_with("fd00:40::"), "{order:?}");
    assert!(order[1].starts_with("10.40.0."), "{order:?}");
    // The first family's LoadBalancer has the upstream name; the second family has its own.
    let owner = |pool: &'static str, ip: String| {
        let env = &env;
        async move {
            let held = allocated(env, pool).await;
            let lb = held.get(&ip).cloned().expect("the address is held");
            lb.split_once('/').expect("ns/name").1.to_string()
        }
    };
    assert_eq!(owner("v6", order[0].clone()).await, lb_name(&six));
    let second = owner("v4", order[1].clone()).await;
    assert_ne!(second, lb_name(&six));
    let second = lb_of_name(&env, &second).await.expect("exists");
    assert_eq!(
        second["metadata"]["annotations"]["loadbalancer.harvesterhci.io/ipFamily"],
        "IPv4"
    );

    // A dual-stack primary is not shared.
    let put = env.put(secondary("rider", &[("UDP", 53)], "strict")).await;
    refused(
        &env,
        put,
        "default",
        "rider",
        "primary service default/strict is dual-stack; sharing its addresses is not supported: give service default/rider its own load balancer",
    )
    .await;

    // Single-stack again: the second family's LoadBalancer goes, and its address with it.
    // Only the policy changes: the API server drops the second family and cluster IP itself.
    let mut single = env.get("default", "six-first").await.expect("exists");
    single["spec"]["ipFamilyPolicy"] = json!("SingleStack");
    env.put(single).await.expect("accepted");
    ingress_is(&env, "six-first", &[order[0].as_str()]).await;
    let v4_of_six = order[1].clone();
    eventually("the IPv4 address of six-first to be released", async || {
        (!allocated(&env, "v4").await.contains_key(&v4_of_six)).then_some(())
    })
    .await;
}

/// Pool and DHCP Services get their addresses; the LoadBalancer carries upstream's name (with
/// the 55-character cut), labels and annotations.
pub async fn pool_and_dhcp_services_get_addresses<E: GuestEnv>(env: E) {
    create_pool(
        env.harvester(),
        mk_pool(
            "p1",
            range("10.10.0.0/24", "10.10.0.10", "10.10.0.20"),
            global(),
        ),
    )
    .await;
    env.put(mk_svc("default", "web", &[("TCP", 80)], &[]))
        .await
        .expect("accepted");
    let (svc, ip) = address(&env, "default", "web").await;
    assert!(ip.starts_with("10.10.0."), "{ip}");
    assert_eq!(ingress(&svc), Some(ip.as_str()));
    let uid = svc["metadata"]["uid"].as_str().expect("uid").to_string();
    let lb = lb_of(&env, &svc)
        .await
        .expect("the load balancer of its UID");
    assert_eq!(
        lb["metadata"]["name"],
        load_balancer_name(CLUSTER, "default", "web", &uid)
    );
    assert_eq!(lb["spec"]["workloadType"], "cluster");
    assert_eq!(lb["spec"]["ipam"], "pool");
    assert_eq!(lb["status"]["allocatedAddress"]["ip"], ip.as_str());
    let labels = &lb["metadata"]["labels"];
    assert_eq!(labels["cloudprovider.harvesterhci.io/cluster"], CLUSTER);
    assert_eq!(
        labels["cloudprovider.harvesterhci.io/serviceNamespace"],
        "default"
    );
    assert_eq!(labels["cloudprovider.harvesterhci.io/serviceName"], "web");
    let annotations = &lb["metadata"]["annotations"];
    assert_eq!(annotations["loadbalancer.harvesterhci.io/cluster"], CLUSTER);
    assert_eq!(
        annotations["cloudprovider.harvesterhci.io/serviceUID"],
        uid.as_str()
    );
    assert_eq!(
        allocated(&env, "p1").await.get(&ip).map(String::as_str),
        Some(format!("{NS}/{}", lb_name(&svc)).as_str())
    );
    event(
        &env,
        "default",
        "web",
        reconcile::reason::ENSURED,
        &format!(
            "Ensured load balancer {NS}/{} with address {ip}",
            lb_name(&svc)
        ),
    )
    .await;

    // The name is cut to 55 characters before its CRC suffix, as upstream cuts it.
    let long = "a-rather-long-service-name-that-overflows-the-base";
    env.put(mk_svc("default", long, &[("TCP", 443)], &[]))
        .await
        .expect("accepted");
    let (svc, _) = address(&env, "default", long).await;
    let lb = lb_of(&env, &svc).await.expect("exists");
    let name = lb["metadata"]["name"].as_str().expect("name");
    assert_eq!(name.len(), 63);
    assert!(name.starts_with(&format!(
        "{CLUSTER}-default-a-rather-long-service-name-that-overf"
    )));

    // DHCP: the guest's kube-vip leases the address; the Service is told 0.0.0.0.
    env.put(mk_svc(
        "default",
        "leased",
        &[("TCP", 80)],
        &[("cloudprovider.harvesterhci.io/ipam", "dhcp")],
    ))
    .await
    .expect("accepted");
    let (svc, ip) = address(&env, "default", "leased").await;
    assert_eq!(ip, "0.0.0.0");
    assert_eq!(ingress(&svc), None, "the lease holder reports the address");
    let lb = lb_of(&env, &svc).await.expect("exists");
    assert_eq!(lb["spec"]["ipam"], "dhcp");
    assert_eq!(lb["status"]["allocatedAddress"]["ip"], "0.0.0.0");
}
