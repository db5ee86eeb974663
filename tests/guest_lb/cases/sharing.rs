//! Services sharing one address by a sharing key, with no primary: the group's LoadBalancer holds
//! the pool address (the pool names it, no Service's), any member may go, and the last one's going
//! releases it.

use harvester_cloud::guest::naming::shared_load_balancer_name;

use crate::*;

const SHARING_KEY: &str = "cloudprovider.harvesterhci.io/sharing-key";

/// A member of group `key` in `default`.
fn member(name: &str, ports: &[(&str, i32)], key: &str) -> Value {
    mk_svc("default", name, ports, &[(SHARING_KEY, key)])
}

fn group(key: &str) -> String {
    shared_load_balancer_name(CLUSTER, "default", key)
}

/// Waits until a Service's address is something other than `not` (its annotation and ingress).
async fn address_other_than<E: GuestEnv>(env: &E, name: &str, not: &str) -> String {
    eventually(
        &format!("service default/{name} to get an address other than {not}"),
        async || {
            let svc = env.get("default", name).await?;
            let ip = annotation(&svc, "kube-vip.io/loadbalancerIPs")?.to_string();
            (ip != not && ingress(&svc) == Some(ip.as_str())).then_some(ip)
        },
    )
    .await
}

/// Two and three members share (TCP/53 and UDP/53 among them, one named by MetalLB's key); a clash
/// is refused naming the holder and admitted once the holder goes; members go and the address
/// stays; the last one's going releases it.
pub async fn share_by_key<E: GuestEnv>(env: E) {
    create_pool(
        env.harvester(),
        mk_pool(
            "p1",
            range("10.33.0.0/24", "10.33.0.10", "10.33.0.20"),
            global(),
        ),
    )
    .await;
    env.put(member("dns-tcp", &[("TCP", 53)], "dns"))
        .await
        .expect("accepted");
    env.put(member("dns-udp", &[("UDP", 53)], "dns"))
        .await
        .expect("accepted");
    let (tcp, ip) = address(&env, "default", "dns-tcp").await;
    assert_eq!(address(&env, "default", "dns-udp").await.1, ip);
    env.put(mk_svc(
        "default",
        "web",
        &[("TCP", 80)],
        &[("metallb.io/allow-shared-ip", "dns")],
    ))
    .await
    .expect("accepted");
    assert_eq!(address(&env, "default", "web").await.1, ip);
    // One LoadBalancer holds the address, and it is no Service's own.
    let lb = lb_of_name(&env, &group("dns")).await.expect("the group's");
    assert_eq!(lb["spec"]["workloadType"], "cluster");
    assert_eq!(
        lb["metadata"]["annotations"]["cloudprovider.harvesterhci.io/sharing-group"],
        "dns"
    );
    assert!(lb_of(&env, &tcp).await.is_none());
    assert_eq!(
        allocated(&env, "p1").await,
        BTreeMap::from([(ip.clone(), format!("{NS}/{}", group("dns")))])
    );

    // A clash on protocol and port is refused and names the holder.
    let put = env.put(member("dns2", &[("TCP", 53)], "dns")).await;
    let refused_at_once = put.is_err();
    refused(
        &env,
        put,
        "default",
        "dns2",
        "service default/dns2 cannot share the address of sharing key \"dns\": TCP/53 is held by service default/dns-tcp",
    )
    .await;

    // The holder goes: the address stays with the others, and the one it refused is admitted
    // (on Kubernetes by itself; the HTTP API refused it at once, so it is written again).
    env.delete("default", "dns-tcp").await;
    service_gone(&env, "default", "dns-tcp").await;
    if refused_at_once {
        env.put(member("dns2", &[("TCP", 53)], "dns"))
            .await
            .expect("accepted once the holder is gone");
    }
    assert_eq!(address(&env, "default", "dns2").await.1, ip);
    assert_eq!(address(&env, "default", "dns-udp").await.1, ip);
    assert_eq!(
        allocated(&env, "p1").await,
        BTreeMap::from([(ip.clone(), format!("{NS}/{}", group("dns")))])
    );

    // The last ones go: the group's LoadBalancer goes and the pool shows the address free.
    for name in ["dns-udp", "web"] {
        env.delete("default", name).await;
        service_gone(&env, "default", name).await;
    }
    assert!(
        lb_of_name(&env, &group("dns")).await.is_some(),
        "dns2 remains"
    );
    env.delete("default", "dns2").await;
    service_gone(&env, "default", "dns2").await;
    lb_gone(&env, &group("dns")).await;
    eventually("the shared address to be released", async || {
        allocated(&env, "p1").await.is_empty().then_some(())
    })
    .await;
}

/// A Service changing its key leaves its group (the old address stays with the others) and gets the
/// new group's; the last member of a group moving away releases it; a key and a primary are
/// refused together; a member recreated with a new UID gets its group's address again.
pub async fn sharing_key_changes<E: GuestEnv>(env: E) {
    create_pool(
        env.harvester(),
        mk_pool(
            "p1",
            range("10.34.0.0/24", "10.34.0.10", "10.34.0.20"),
            global(),
        ),
    )
    .await;
    for (name, port) in [("a", 80), ("b", 81)] {
        env.put(member(name, &[("TCP", port)], "k1"))
            .await
            .expect("accepted");
    }
    let (_, ip1) = address(&env, "default", "a").await;
    assert_eq!(address(&env, "default", "b").await.1, ip1);

    env.put(member("b", &[("TCP", 81)], "k2"))
        .await
        .expect("accepted");
    let ip2 = address_other_than(&env, "b", &ip1).await;
    assert_eq!(address(&env, "default", "a").await.1, ip1);
    assert_eq!(
        allocated(&env, "p1").await,
        BTreeMap::from([
            (ip1.clone(), format!("{NS}/{}", group("k1"))),
            (ip2.clone(), format!("{NS}/{}", group("k2")))
        ])
    );

    // A key and a primary at once.
    let mut both = member("both", &[("TCP", 90)], "k2");
    both["metadata"]["annotations"]["cloudprovider.harvesterhci.io/primary-service"] =
        json!("default/a");
    let put = env.put(both).await;
    refused(
        &env,
        put,
        "default",
        "both",
        "service default/both: annotations cloudprovider.harvesterhci.io/primary-service and cloudprovider.harvesterhci.io/sharing-key are both set: a service shares an address either with a primary service or by a sharing key, not both",
    )
    .await;

    // Recreated with a new UID (its deletion missed): the group's address again, and nothing
    // else held.
    let (old, _) = address(&env, "default", "b").await;
    env.force_delete("default", "b").await;
    env.put(member("b", &[("TCP", 81)], "k2"))
        .await
        .expect("accepted");
    let (new, again) = address(&env, "default", "b").await;
    assert_ne!(new["metadata"]["uid"], old["metadata"]["uid"]);
    assert_eq!(again, ip2);

    // The last member of k1 moves to k2: k1's address is released, and it shares k2's.
    env.put(member("a", &[("TCP", 80)], "k2"))
        .await
        .expect("accepted");
    assert_eq!(address_other_than(&env, "a", &ip1).await, ip2);
    lb_gone(&env, &group("k1")).await;
    eventually("only the k2 group to hold an address", async || {
        (allocated(&env, "p1").await
            == BTreeMap::from([(ip2.clone(), format!("{NS}/{}", group("k2")))]))
        .then_some(())
    })
    .await;
}
