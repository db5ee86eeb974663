//! Pools by Service labels, end to end: the cloud provider carries a Service's labels onto its
//! Harvester LoadBalancer, and a pool's service selector picks the Services it serves.

use crate::*;

const SERVICE_LABELS: &str = "cloudprovider.harvesterhci.io/serviceLabels";

/// A Service of type LoadBalancer in `default` on `port`, with these labels.
fn labelled_svc(name: &str, port: i32, labels: Value) -> Value {
    let mut svc = mk_svc("default", name, &[("TCP", port)], &[]);
    svc["metadata"]["labels"] = labels;
    svc
}

/// The Service labels its LoadBalancer carries, once they are `want`.
async fn carried<E: GuestEnv>(env: &E, name: &str, want: Value) {
    eventually(
        &format!("the load balancer of default/{name} to carry {want}"),
        async || {
            let svc = env.get("default", name).await?;
            let lb = lb_of(env, &svc).await?;
            let text = lb["metadata"]["annotations"][SERVICE_LABELS].as_str()?;
            let labels: Value = serde_json::from_str(text).expect("a JSON object");
            (labels == want).then_some(())
        },
    )
    .await
}

/// A Service labelled `tier=gold` gets its address from the pool whose selector selects it, the
/// others from the catch-all global pool; a Service's labels reach its LoadBalancer and follow it,
/// and a label change does not move an address already given.
pub async fn service_labels_choose_the_pool<E: GuestEnv>(env: E) {
    create_pool(
        env.harvester(),
        {
            let mut gold = mk_pool(
                "gold",
                range("10.40.0.0/24", "10.40.0.10", "10.40.0.20"),
                json!({"priority": 10, "scope": [{"project": "*", "namespace": "*", "guestCluster": CLUSTER}]}),
            );
            gold["metadata"]["annotations"] =
                json!({"loadbalancer.harvesterhci.io/serviceSelector": "tier=gold"});
            gold
        },
    )
    .await;
    create_pool(
        env.harvester(),
        mk_pool(
            "all",
            range("10.41.0.0/24", "10.41.0.10", "10.41.0.20"),
            global(),
        ),
    )
    .await;

    env.put(labelled_svc(
        "gold",
        80,
        json!({"tier": "gold", "app": "web"}),
    ))
    .await
    .expect("accepted");
    let (_, ip) = address(&env, "default", "gold").await;
    assert!(ip.starts_with("10.40.0."), "{ip}");
    carried(&env, "gold", json!({"tier": "gold", "app": "web"})).await;

    env.put(labelled_svc("plain", 81, json!({})))
        .await
        .expect("accepted");
    let (_, ip) = address(&env, "default", "plain").await;
    assert!(ip.starts_with("10.41.0."), "{ip}");

    env.put(labelled_svc("silver", 82, json!({"tier": "silver"})))
        .await
        .expect("accepted");
    let (_, silver_ip) = address(&env, "default", "silver").await;
    assert!(silver_ip.starts_with("10.41.0."), "{silver_ip}");
    // Its labels change: the LoadBalancer carries the new ones, and the address stays.
    env.put(labelled_svc("silver", 82, json!({"tier": "gold"})))
        .await
        .expect("accepted");
    carried(&env, "silver", json!({"tier": "gold"})).await;
    let (_, ip) = address(&env, "default", "silver").await;
    assert_eq!(ip, silver_ip);
    assert_eq!(allocated(&env, "gold").await.len(), 1);
}
