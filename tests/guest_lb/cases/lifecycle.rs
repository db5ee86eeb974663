//! What goes when a Service, its UID or the whole guest cluster goes, and what is not this
//! cluster's to touch.

use crate::*;

/// Deleting a Service deletes its LoadBalancer, which releases the address (a Service waiting
/// on the full pool gets it).
pub async fn service_deletion_releases<E: GuestEnv>(env: E) {
    create_pool(
        env.harvester(),
        mk_pool(
            "small",
            range("10.50.0.0/24", "10.50.0.10", "10.50.0.11"),
            global(),
        ),
    )
    .await;
    for name in ["a", "b"] {
        env.put(mk_svc("default", name, &[("TCP", 80)], &[]))
            .await
            .expect("accepted");
    }
    let (a, a_ip) = address(&env, "default", "a").await;
    address(&env, "default", "b").await;
    env.put(mk_svc("default", "c", &[("TCP", 80)], &[]))
        .await
        .expect("accepted");
    eventually("c to be told it waits for an address", async || {
        env.events("default", "c")
            .await
            .iter()
            .any(|(r, m)| {
                r == reconcile::reason::SYNC_FAILED
                    && m.starts_with("ip is not allocated, mode: pool, message: ")
            })
            .then_some(())
    })
    .await;
    env.delete("default", "a").await;
    service_gone(&env, "default", "a").await;
    lb_gone(&env, &lb_name(&a)).await;
    event(
        &env,
        "default",
        "a",
        reconcile::reason::DELETED,
        &format!("Deleted load balancer {NS}/{}", lb_name(&a)),
    )
    .await;
    let (_, c_ip) = address(&env, "default", "c").await;
    assert_eq!(
        c_ip, a_ip,
        "the released address serves the waiting service"
    );

    // A Service that is no longer of type LoadBalancer releases its address too.
    let b = env.get("default", "b").await.expect("exists");
    let mut internal = mk_svc("default", "b", &[("TCP", 80)], &[]);
    internal["spec"]["type"] = json!("ClusterIP");
    env.put(internal).await.expect("accepted");
    lb_gone(&env, &lb_name(&b)).await;
    let b = eventually("b to lose its address and finalizer", async || {
        let b = env.get("default", "b").await?;
        (annotation(&b, "kube-vip.io/loadbalancerIPs").is_none()
            && b["metadata"]["finalizers"]
                .as_array()
                .is_none_or(|f| f.is_empty()))
        .then_some(b)
    })
    .await;
    assert_eq!(ingress(&b), None);
}

/// A Service recreated with a new UID (its deletion missed) gets a new LoadBalancer, and the old
/// one is garbage-collected instead of leaking its address.
pub async fn uid_change_does_not_leak<E: GuestEnv>(env: E) {
    create_pool(
        env.harvester(),
        mk_pool(
            "p1",
            range("10.60.0.0/24", "10.60.0.10", "10.60.0.20"),
            global(),
        ),
    )
    .await;
    env.put(mk_svc("default", "svc", &[("TCP", 80)], &[]))
        .await
        .expect("accepted");
    let (old, _) = address(&env, "default", "svc").await;
    let old_lb = lb_name(&old);
    env.force_delete("default", "svc").await;
    env.put(mk_svc("default", "svc", &[("TCP", 80)], &[]))
        .await
        .expect("accepted");
    let (new, ip) = address(&env, "default", "svc").await;
    assert_ne!(new["metadata"]["uid"], old["metadata"]["uid"]);
    let new_lb = lb_name(&new);
    assert_ne!(new_lb, old_lb);
    lb_gone(&env, &old_lb).await;
    eventually(
        "only the new load balancer to hold an address",
        async || {
            let held = allocated(&env, "p1").await;
            (held.len() == 1 && held.get(&ip) == Some(&format!("{NS}/{new_lb}"))).then_some(())
        },
    )
    .await;
}

/// Deleting a guest cluster deletes its LoadBalancers and frees their addresses; other
/// clusters' are left alone.
pub async fn guest_cluster_deletion<E: GuestEnv>(mut env: E) {
    create_pool(
        env.harvester(),
        mk_pool(
            "p1",
            range("10.70.0.0/24", "10.70.0.10", "10.70.0.30"),
            global(),
        ),
    )
    .await;
    let mut lbs = Vec::new();
    for name in ["one", "two", "three"] {
        env.put(mk_svc("default", name, &[("TCP", 80)], &[]))
            .await
            .expect("accepted");
        lbs.push(lb_name(&address(&env, "default", name).await.0));
    }
    // Another cluster's load balancer in the same namespace.
    let other = json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
        "metadata": {"name": "gc2-lb", "namespace": NS, "labels": {"cloudprovider.harvesterhci.io/cluster": "gc2"}},
        "spec": {"workloadType": "cluster", "ipam": "pool"}
    });
    ok(
        call(env.harvester(), Method::POST, LBS, Some(other)).await,
        StatusCode::CREATED,
    );
    eventually("gc2's load balancer to get an address", async || {
        allocated(&env, "p1")
            .await
            .values()
            .any(|v| v == &format!("{NS}/gc2-lb"))
            .then_some(())
    })
    .await;

    env.delete_cluster().await;
    for lb in &lbs {
        lb_gone(&env, lb).await;
    }
    eventually("the cluster's addresses to be free", async || {
        let held = allocated(&env, "p1").await;
        (held.len() == 1 && held.values().all(|v| v == &format!("{NS}/gc2-lb"))).then_some(())
    })
    .await;
    let r = call(
        env.harvester(),
        Method::GET,
        &format!("{LBS}/{NS}/gc2-lb"),
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
}

/// LoadBalancers of this cluster's name that it did not make are left alone: one another guest
/// cluster of the same name made in the same namespace (it records another identity), and one
/// upstream's cloud provider made for a Service this cluster lacks; one upstream's cloud
/// provider made for a Service this cluster has (the name made from its UID proves it) is
/// adopted. Only what this cluster made is collected.
pub async fn foreign_load_balancers_are_left_alone<E: GuestEnv>(env: E) {
    create_pool(
        env.harvester(),
        mk_pool(
            "p1",
            range("10.75.0.0/24", "10.75.0.10", "10.75.0.30"),
            global(),
        ),
    )
    .await;
    let me = env.identity().await;
    env.put(mk_svc("default", "web", &[("TCP", 80)], &[]))
        .await
        .expect("accepted");
    let (web, _) = address(&env, "default", "web").await;
    let web_lb = lb_of(&env, &web).await.expect("exists");
    assert_eq!(
        web_lb["metadata"]["annotations"]["cloudprovider.harvesterhci.io/clusterID"],
        json!(me),
        "the cluster records itself"
    );
    let web_uid = lb_uid(&env, &lb_name(&web)).await;
    // A Service not yet of type LoadBalancer, whose load balancer upstream's cloud provider
    // made (under the name its UID gives, recording no maker).
    let mut legacy = mk_svc("default", "legacy", &[("TCP", 81)], &[]);
    legacy["spec"]["type"] = json!("ClusterIP");
    let legacy = env.put(legacy).await.expect("accepted");
    let legacy_lb = lb_name(&legacy);
    let adoptee = hand_made_lb(&env, &legacy_lb, "legacy", None).await;
    // Another guest cluster's, named for this cluster's web Service; and upstream's for a
    // Service this cluster does not have.
    let foreign = hand_made_lb(
        &env,
        "gc1-default-web-0badf00d",
        "web",
        Some("another-cluster"),
    )
    .await;
    let orphan = hand_made_lb(&env, "gc1-default-gone-0badf00d", "gone", None).await;
    collector_caught_up(&env, &me, "gc1-default-ghost-0badf00d").await;
    assert_eq!(lb_uid(&env, "gc1-default-web-0badf00d").await, foreign);
    assert_eq!(lb_uid(&env, "gc1-default-gone-0badf00d").await, orphan);
    assert_eq!(lb_uid(&env, &lb_name(&web)).await, web_uid);
    assert_eq!(lb_uid(&env, &legacy_lb).await, adoptee);

    // The Service becomes a load balancer: it takes the one upstream made as its own.
    let mut legacy = mk_svc("default", "legacy", &[("TCP", 81)], &[]);
    legacy["metadata"]["annotations"] = json!({"cloudprovider.harvesterhci.io/ipam": "dhcp"});
    env.put(legacy).await.expect("accepted");
    let (legacy, ip) = address(&env, "default", "legacy").await;
    assert_eq!(ip, "0.0.0.0");
    assert_eq!(lb_name(&legacy), legacy_lb);
    let adopted = lb_of(&env, &legacy).await.expect("exists");
    assert_eq!(
        adopted["metadata"]["uid"],
        json!(adoptee),
        "adopted, not made again"
    );
    assert_eq!(
        adopted["metadata"]["annotations"]["cloudprovider.harvesterhci.io/clusterID"],
        json!(me)
    );
    // Its own now: collected once its Service goes behind the reconciler's back.
    env.force_delete("default", "legacy").await;
    lb_gone(&env, &legacy_lb).await;
    collector_caught_up(&env, &me, "gc1-default-ghost2-0badf00d").await;
    assert_eq!(lb_uid(&env, "gc1-default-web-0badf00d").await, foreign);
    assert_eq!(lb_uid(&env, "gc1-default-gone-0badf00d").await, orphan);
}
