//! Secondaries sharing a primary's address: the share-IP rules, checked as for primaries.

use crate::*;

/// Share IP: by bare name; the same port on another protocol shares; a clash on protocol and
/// port, a chain and a primary without an address are refused; a primary in use cannot go
/// until its secondaries have.
pub async fn share_ip<E: GuestEnv>(env: E) {
    create_pool(
        env.harvester(),
        mk_pool(
            "p1",
            range("10.30.0.0/24", "10.30.0.10", "10.30.0.20"),
            global(),
        ),
    )
    .await;
    env.put(mk_svc("default", "dns", &[("TCP", 53)], &[]))
        .await
        .expect("accepted");
    let (dns, ip) = address(&env, "default", "dns").await;
    // pkg/cloud-controller-manager/loadbalancer.go (updatePrimaryServiceLoadBalancerIP): the
    // primary-service label is emptied when set, never added.
    assert_eq!(
        dns["metadata"]["labels"]["cloudprovider.harvesterhci.io/primary-service"],
        Value::Null
    );

    // Same port, other protocol, primary named without its namespace.
    env.put(secondary("dns-udp", &[("UDP", 53)], "dns"))
        .await
        .expect("accepted");
    let (udp, shared) = address(&env, "default", "dns-udp").await;
    assert_eq!(shared, ip);
    assert_eq!(
        udp["metadata"]["labels"]["cloudprovider.harvesterhci.io/primary-service"],
        "default.dns"
    );
    assert!(
        lb_of(&env, &udp).await.is_none(),
        "a secondary has no load balancer of its own"
    );
    env.put(secondary("web", &[("TCP", 80)], "default/dns"))
        .await
        .expect("accepted");
    assert_eq!(address(&env, "default", "web").await.1, ip);

    // Clashes on protocol and port, with the primary or another secondary; the message names
    // the port number only (pkg/cloud-controller-manager/loadbalancer.go, checkPortOverlap).
    let put = env
        .put(secondary("dns-tcp", &[("TCP", 53)], "default/dns"))
        .await;
    refused(&env, put, "default", "dns-tcp", "check port overlap failed, primary service: default/dns, secondary service: default/dns-tcp, error: port 53 has been used in service default/dns").await;
    let put = env
        .put(secondary("web2", &[("TCP", 80)], "default/dns"))
        .await;
    refused(&env, put, "default", "web2", "check port overlap failed, primary service: default/dns, secondary service: default/web2, error: port 80 has been used in service default/web").await;
    // A primary that does not exist: upstream's Service cache error, wrapped
    // (pkg/cloud-controller-manager/loadbalancer.go, getPrimaryService).
    let put = env
        .put(secondary("lost", &[("TCP", 90)], "default/nope"))
        .await;
    refused(
        &env,
        put,
        "default",
        "lost",
        "get service default/nope failed: service \"nope\" not found",
    )
    .await;
    // No chaining.
    let put = env
        .put(secondary("chain", &[("TCP", 8080)], "default/web"))
        .await;
    refused(
        &env,
        put,
        "default",
        "chain",
        "service default/web is not a primary service",
    )
    .await;
    // A primary without an address (DHCP: the lease holder reports it, and nothing does here).
    env.put(mk_svc(
        "default",
        "leased",
        &[("TCP", 80)],
        &[("cloudprovider.harvesterhci.io/ipam", "dhcp")],
    ))
    .await
    .expect("accepted");
    address(&env, "default", "leased").await;
    let put = env
        .put(secondary("leased-sec", &[("TCP", 81)], "default/leased"))
        .await;
    refused(
        &env,
        put,
        "default",
        "leased-sec",
        "primary service default/leased has no ingress IP",
    )
    .await;

    // The primary cannot go while its secondaries use the address.
    let lb = lb_name(&dns);
    env.delete("default", "dns").await;
    event(
        &env,
        "default",
        "dns",
        reconcile::reason::DELETE_FAILED,
        "could not delete load balancer for service default/dns: service default/dns is still used by other services [default/dns-udp default/web]",
    )
    .await;
    let waiting = env.get("default", "dns").await.expect("still there");
    assert!(waiting["metadata"]["deletionTimestamp"].is_string());
    assert!(allocated(&env, "p1").await.contains_key(&ip));
    // Once they are gone, so is the primary, and the address is released.
    env.delete("default", "dns-udp").await;
    env.delete("default", "web").await;
    service_gone(&env, "default", "dns").await;
    lb_gone(&env, &lb).await;
    eventually("the shared address to be released", async || {
        (!allocated(&env, "p1").await.contains_key(&ip)).then_some(())
    })
    .await;
}

/// A secondary is checked as upstream's EnsureLoadBalancer checks every Service: against the NAD
/// mapping first (before its primary is even looked at), then its network against the one its
/// primary's LoadBalancer was made on.
pub async fn secondaries_are_checked_like_primaries<E: GuestEnv>(env: E) {
    create_pool(
        env.harvester(),
        mk_pool(
            "p1",
            range("10.32.0.0/24", "10.32.0.10", "10.32.0.20"),
            global(),
        ),
    )
    .await;
    env.set_nad_mapping(r#"{"default/vlan10":"enp2s0","default/vlan20":"enp3s0"}"#)
        .await;
    env.put(mk_svc(
        "default",
        "p",
        &[("TCP", 80)],
        &[("cloudprovider.harvesterhci.io/network", "default/vlan10")],
    ))
    .await
    .expect("accepted");
    let (primary, ip) = address(&env, "default", "p").await;
    let on = |name: &str, port: i32, network: &str| {
        let mut s = secondary(name, &[("TCP", port)], "default/p");
        s["metadata"]["annotations"]["cloudprovider.harvesterhci.io/network"] = json!(network);
        s
    };
    // Not in the NAD mapping: refused for that, although its port clashes too
    // (pkg/cloud-controller-manager/loadbalancer.go: resolveNetworkInterface comes first).
    let put = env.put(on("s30", 80, "default/vlan30")).await;
    refused(
        &env,
        put,
        "default",
        "s30",
        "network default/vlan30 not found in NAD mapping for service default/s30",
    )
    .await;
    // In the mapping, but not the network of the primary's load balancer
    // (pkg/cloud-controller-manager/loadbalancer.go, checkNetworkChanged with secondary=true).
    let put = env.put(on("s20", 81, "default/vlan20")).await;
    let message = format!(
        "network annotation of service default/s20 is not same as the load balancer {NS}/{}, service: 'default/vlan20', lb: 'default/vlan10'",
        lb_name(&primary)
    );
    refused(&env, put, "default", "s20", &message).await;
    // Naming none, it gets the primary's (and no interface of its own).
    env.put(secondary("s", &[("TCP", 82)], "default/p"))
        .await
        .expect("accepted");
    let (s, shared) = address(&env, "default", "s").await;
    assert_eq!(shared, ip);
    assert_eq!(
        annotation(&s, "cloudprovider.harvesterhci.io/network"),
        Some("default/vlan10")
    );
    assert_eq!(annotation(&s, "kube-vip.io/serviceInterface"), None);
}

/// A secondary made together with its primary gets the address as soon as the primary has it
/// (on Kubernetes it waits, woken by the primary's change; the HTTP API says to come back).
pub async fn secondary_made_with_its_primary<E: GuestEnv>(env: E) {
    create_pool(
        env.harvester(),
        mk_pool(
            "p1",
            range("10.31.0.0/24", "10.31.0.10", "10.31.0.20"),
            global(),
        ),
    )
    .await;
    env.put(mk_svc("default", "primary", &[("TCP", 80)], &[]))
        .await
        .expect("accepted");
    let secondary = secondary("secondary", &[("TCP", 443)], "primary");
    if let Err(message) = env.put(secondary.clone()).await {
        assert_eq!(message, "primary service default/primary has no ingress IP");
        address(&env, "default", "primary").await;
        env.put(secondary)
            .await
            .expect("accepted once the primary has its address");
    }
    let (_, ip) = address(&env, "default", "primary").await;
    assert_eq!(address(&env, "default", "secondary").await.1, ip);
}
