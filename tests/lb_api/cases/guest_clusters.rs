//! The cleanup after a guest cluster Rancher removes.

use crate::*;

pub async fn guest_cluster_cleanup<B: Backend>(b: B) {
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
    let cluster_lb = |name: &str, cluster: &str| {
        with_labels(
            mk_lb("default", name, json!({"workloadType": "cluster"})),
            &[("cloudprovider.harvesterhci.io/cluster", cluster)],
        )
    };
    for (name, cluster) in [("gc1-a", "gc1"), ("gc1-b", "gc1"), ("gc2-a", "gc2")] {
        create_lb(&b, cluster_lb(name, cluster)).await;
        allocated(&b, "default", name).await;
    }
    // A VM load balancer with the same label is never touched.
    create_lb(
        &b,
        with_labels(
            mk_lb("default", "vm-lb", json!({})),
            &[("cloudprovider.harvesterhci.io/cluster", "gc1")],
        ),
    )
    .await;
    allocated(&b, "default", "vm-lb").await;

    // A node of guest cluster gc1, as Rancher's node driver makes it.
    let vms = Api::<VirtualMachine>::new(b.store());
    let vm: VirtualMachine = serde_json::from_value(
        support::foreign::vm("gc1-pool1-abcde")
            .label("harvesterhci.io/creator", "docker-machine-driver-harvester")
            .label("guestcluster.harvesterhci.io/name", "gc1")
            .build(),
    )
    .expect("vm");
    vms.create(&vm).await.expect("creates the vm");
    let vm = eventually("the VM to get the cleanup finalizer", async || {
        let vm = vms
            .get("default", "gc1-pool1-abcde")
            .await
            .expect("reads")?;
        vm.metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| {
                f.iter()
                    .any(|x| x == "wrangler.cattle.io/harvester-lb-vm-controller")
            })
            .then_some(vm)
    })
    .await;
    // Rancher marks the cluster's VMs for removal, then deletes them.
    let mut marked = vm.clone();
    marked.metadata.annotations = Some(
        [(
            "harvesterhci.io/removeAllPersistentVolumeClaims".to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    vms.replace(&marked).await.expect("annotates");
    let m = call(&b, Method::POST, LBS, Some(cluster_lb("gc1-c", "gc1")))
        .await
        .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
    assert_eq!(
        m,
        "create loadbalancer default/gc1-c failed with guest cluster check: the vm default/gc1-pool1-abcde shows guest cluster gc1 is being removed"
    );
    vms.delete("default", "gc1-pool1-abcde", &Preconditions::default())
        .await
        .expect("deletes the vm");
    for name in ["gc1-a", "gc1-b"] {
        gone(&b, &format!("{LBS}/default/{name}")).await;
    }
    eventually("the VM to go", async || {
        vms.get("default", "gc1-pool1-abcde")
            .await
            .expect("reads")
            .is_none()
            .then_some(())
    })
    .await;
    for name in ["gc2-a", "vm-lb"] {
        ok(
            get(&b, &format!("{LBS}/default/{name}")).await,
            StatusCode::OK,
        );
    }
    let p = pool(&b, "p").await;
    assert_eq!(
        p["status"]["allocated"]
            .as_object()
            .expect("allocated")
            .len(),
        2
    );
    assert_consistent(&b).await;
}
