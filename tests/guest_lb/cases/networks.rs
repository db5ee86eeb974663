//! Which network a Service's address comes from, the guest's NAD mapping kept from the VMIs, and
//! the network and IPAM changes that are refused.

use crate::*;

/// Network resolution: the Service's network annotation goes to the LoadBalancer (and picks the
/// pool of that network); the NAD mapping gives kube-vip's interface or refuses an unknown
/// network; without an annotation, the management network (ccm flag) and then Harvester's
/// findNetwork (a VMI of the guest cluster, by label before the legacy name prefix) decide.
pub async fn network_resolution_order<E: GuestEnv>(env: E) {
    create_nads(&env, &["vlan10", "vlan20", "mgmt"]).await;
    create_pool(
        env.harvester(),
        mk_pool(
            "p10",
            range("10.20.10.0/24", "10.20.10.10", "10.20.10.20"),
            on_network("default/vlan10"),
        ),
    )
    .await;
    create_pool(
        env.harvester(),
        mk_pool(
            "p20",
            range("10.20.20.0/24", "10.20.20.10", "10.20.20.20"),
            on_network("default/vlan20"),
        ),
    )
    .await;
    create_pool(
        env.harvester(),
        mk_pool(
            "pmgmt",
            range("10.20.30.0/24", "10.20.30.10", "10.20.30.20"),
            on_network("default/mgmt"),
        ),
    )
    .await;
    create_pool(
        env.harvester(),
        mk_pool(
            "pnone",
            range("10.20.40.0/24", "10.20.40.10", "10.20.40.20"),
            on_network(""),
        ),
    )
    .await;
    env.set_nad_mapping(r#"{"default/vlan20":"enp2s0"}"#).await;

    // 1. The Service's own network.
    env.put(mk_svc(
        "default",
        "v20",
        &[("TCP", 80)],
        &[("cloudprovider.harvesterhci.io/network", "default/vlan20")],
    ))
    .await
    .expect("accepted");
    let (svc, ip) = address(&env, "default", "v20").await;
    assert!(ip.starts_with("10.20.20."), "{ip}");
    assert_eq!(
        annotation(&svc, "kube-vip.io/serviceInterface"),
        Some("enp2s0")
    );
    let lb = lb_of(&env, &svc).await.expect("exists");
    assert_eq!(
        lb["metadata"]["annotations"]["loadbalancer.harvesterhci.io/network"],
        "default/vlan20"
    );
    assert_eq!(
        lb["metadata"]["annotations"]["cloudprovider.harvesterhci.io/lb-network"],
        "default/vlan20"
    );

    // A network the guest's NAD mapping does not know is refused.
    let put = env
        .put(mk_svc(
            "default",
            "v10",
            &[("TCP", 80)],
            &[("cloudprovider.harvesterhci.io/network", "default/vlan10")],
        ))
        .await;
    refused(
        &env,
        put,
        "default",
        "v10",
        "network default/vlan10 not found in NAD mapping for service default/v10",
    )
    .await;

    // 2./3. No network annotation: Harvester decides.
    if env.harvester_admission() {
        // findNetwork: a VMI labelled with the guest cluster wins over the legacy name prefix.
        let vmis = Api::<VirtualMachineInstance>::new(env.harvester().store());
        for (name, label, network) in [
            (
                format!("{CLUSTER}-legacy"),
                ("harvesterhci.io/creator", "docker-machine-driver-harvester"),
                "default/vlan20",
            ),
            (
                "node-a".to_string(),
                ("guestcluster.harvesterhci.io/name", CLUSTER),
                "default/vlan10",
            ),
        ] {
            // A Multus network with an empty name is skipped
            // (pkg/webhook/loadbalancer/mutator.go, getFirstMultusNetworkNameFromVMI).
            let vmi = support::foreign::vmi(&name)
                .namespace(NS)
                .label(label.0, label.1)
                .pod_network(&[], None)
                .multus("nic0", "", &[], None)
                .multus("nic", network, &[], None)
                .build();
            let vmi: VirtualMachineInstance = serde_json::from_value(vmi).expect("vmi");
            vmis.create(&vmi).await.expect("creates");
        }
        env.put(mk_svc("default", "plain", &[("TCP", 80)], &[]))
            .await
            .expect("accepted");
        let (svc, ip) = address(&env, "default", "plain").await;
        assert!(ip.starts_with("10.20.10."), "the VMI's network: {ip}");
        let lb = lb_of(&env, &svc).await.expect("exists");
        assert_eq!(
            lb["metadata"]["annotations"]["loadbalancer.harvesterhci.io/network"],
            "default/vlan10"
        );
        assert_eq!(
            lb["metadata"]["annotations"]["cloudprovider.harvesterhci.io/lb-network"],
            ""
        );
    } else {
        // The ccm records its management network; no Harvester webhook is registered here to turn
        // it into the LoadBalancer's network, so the pool without a network serves it.
        env.put(mk_svc("default", "plain", &[("TCP", 80)], &[]))
            .await
            .expect("accepted");
        let (svc, ip) = address(&env, "default", "plain").await;
        assert!(ip.starts_with("10.20.40."), "{ip}");
        let lb = lb_of(&env, &svc).await.expect("exists");
        assert_eq!(
            lb["metadata"]["annotations"]["cloudprovider.harvesterhci.io/managementNetwork"],
            "default/mgmt"
        );
        assert_eq!(
            lb["metadata"]["annotations"]["loadbalancer.harvesterhci.io/network"],
            ""
        );
    }
}

/// The guest's NAD mapping follows the cluster's running VMIs on Harvester (what every node has
/// on the same interface; other clusters' and stopped VMIs do not count), and a Service refused
/// for a network the mapping lacked goes on once the mapping has it.
pub async fn nad_mapping_follows_the_vmis<E: GuestEnv>(env: E) {
    // The guest cluster is served (on the embedded store, it exists from its first Service).
    env.put(mk_svc(
        "default",
        "first",
        &[("TCP", 80)],
        &[("cloudprovider.harvesterhci.io/ipam", "dhcp")],
    ))
    .await
    .expect("accepted");
    address(&env, "default", "first").await;
    create_nads(&env, &["vlan10", "vlan20"]).await;
    let vmis = support::vmi_api(env.harvester().store());
    // (name, cluster, phase, [(NIC, NAD, guest interface)]), from KubeVirt's Go types.
    let vmi_of = |name: &str, cluster: &str, phase: &str, nics: &[(&str, &str, &str)]| {
        let mut vmi = support::foreign::vmi(name)
            .namespace(NS)
            .label("guestcluster.harvesterhci.io/name", cluster)
            .phase(phase)
            .pod_network(&[], Some("eth0"));
        for (nic, nad, iface) in nics {
            vmi = vmi.multus(nic, nad, &[], Some(iface));
        }
        vmi
    };
    let typed = |vmi: &support::foreign::Vmi| {
        serde_json::from_value::<VirtualMachineInstance>(vmi.build()).expect("vmi")
    };
    let mk_vmi = |name: &str, cluster: &str, phase: &str, nics: &[(&str, &str, &str)]| {
        typed(&vmi_of(name, cluster, phase, nics))
    };
    for vmi in [
        mk_vmi(
            "node-a",
            CLUSTER,
            "Running",
            &[
                ("nic-1", "default/vlan10", "enp2s0"),
                ("nic-2", "default/vlan20", "enp3s0"),
            ],
        ),
        mk_vmi(
            "node-b",
            CLUSTER,
            "Running",
            &[
                ("nic-1", "default/vlan10", "enp2s0"),
                ("nic-2", "default/vlan20", "enp4s0"),
            ],
        ),
        mk_vmi(
            "node-c",
            CLUSTER,
            "Succeeded",
            &[("nic-1", "default/vlan10", "enp7s0")],
        ),
        mk_vmi(
            "other-node",
            "gc2",
            "Running",
            &[("nic-1", "default/vlan10", "enp9s0")],
        ),
    ] {
        support::create_vmi(env.harvester().store(), &vmi).await;
    }
    // Not counted either (pkg/utils/vmi.go, GetCommonVMINADs; pkg/controller/
    // virtualmachineinstance/controller.go lists by the cluster label alone): a node migrating,
    // and a node-driver VMI named like the cluster's nodes but not labelled.
    let migrating = typed(
        &vmi_of(
            "node-d",
            CLUSTER,
            "Running",
            &[("nic-1", "default/vlan10", "enp8s0")],
        )
        .migrating(),
    );
    vmis.create(&migrating).await.expect("creates");
    let unlabelled = typed(
        &support::foreign::vmi(&format!("{CLUSTER}-pool1-legacy"))
            .namespace(NS)
            .label("harvesterhci.io/creator", "docker-machine-driver-harvester")
            .pod_network(&[], Some("eth0"))
            .multus("nic-1", "default/vlan10", &[], Some("enp7s0")),
    );
    vmis.create(&unlabelled).await.expect("creates");
    let value = async || -> Option<String> {
        env.nad_mapping()
            .await?
            .data?
            .remove("interface-nad-mapping")
    };
    eventually("the NAD mapping of the two running nodes", async || {
        (value().await.as_deref() == Some(r#"{"default/vlan10":"enp2s0"}"#)).then_some(())
    })
    .await;
    let cm = env.nad_mapping().await.expect("exists");
    assert_eq!(
        cm.metadata
            .labels
            .unwrap_or_default()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("harvester-cloud")
    );

    let dhcp_on = |name: &str, network: &str| {
        mk_svc(
            "default",
            name,
            &[("TCP", 80)],
            &[
                ("cloudprovider.harvesterhci.io/ipam", "dhcp"),
                ("cloudprovider.harvesterhci.io/network", network),
            ],
        )
    };
    env.put(dhcp_on("v10", "default/vlan10"))
        .await
        .expect("accepted");
    let (svc, ip) = address(&env, "default", "v10").await;
    assert_eq!(ip, "0.0.0.0");
    assert_eq!(
        annotation(&svc, "kube-vip.io/serviceInterface"),
        Some("enp2s0")
    );

    // vlan20 is on different interfaces of the two nodes: not in the mapping, refused.
    let put = env.put(dhcp_on("v20", "default/vlan20")).await;
    let refused_at_once = put.is_err();
    refused(
        &env,
        put,
        "default",
        "v20",
        "network default/vlan20 not found in NAD mapping for service default/v20",
    )
    .await;

    // node-b's guest renames the NIC: vlan20 is on enp3s0 everywhere now.
    let mut b = vmis
        .get(NS, "node-b")
        .await
        .expect("reads")
        .expect("exists");
    b.rest["status"]["interfaces"][2]["interfaceName"] = json!("enp3s0");
    vmis.replace(&b).await.expect("updates");
    eventually("the NAD mapping to take vlan20", async || {
        (value().await.as_deref()
            == Some(r#"{"default/vlan10":"enp2s0","default/vlan20":"enp3s0"}"#))
        .then_some(())
    })
    .await;
    if refused_at_once {
        env.put(dhcp_on("v20", "default/vlan20"))
            .await
            .expect("accepted now");
    }
    // Kubernetes: the mapping's change wakes the refused Service (without the wake it would
    // wait for its 60 s re-check; not asserted, as timings are not).
    let (svc, _) = address(&env, "default", "v20").await;
    assert_eq!(
        annotation(&svc, "kube-vip.io/serviceInterface"),
        Some("enp3s0")
    );

    // Deleted by someone: written again, at the next pass (the next VMI change here; at the
    // latest after nad::RECHECK otherwise).
    env.delete_nad_mapping().await;
    let mut a = vmis
        .get(NS, "node-a")
        .await
        .expect("reads")
        .expect("exists");
    a.metadata
        .labels
        .get_or_insert_default()
        .insert("touched".into(), "yes".into());
    vmis.replace(&a).await.expect("updates");
    eventually("the NAD mapping to be written again", async || {
        (value().await.as_deref()
            == Some(r#"{"default/vlan10":"enp2s0","default/vlan20":"enp3s0"}"#))
        .then_some(())
    })
    .await;

    // No node counts any more (all stopped, or migrating): the value is emptied, as upstream
    // empties it (pkg/controller/virtualmachineinstance/controller.go, syncNADMappingConfigMap),
    // and a Service naming a network is refused for it.
    for name in ["node-a", "node-b"] {
        let mut v = vmis.get(NS, name).await.expect("reads").expect("exists");
        v.rest["status"]["phase"] = json!("Succeeded");
        vmis.replace(&v).await.expect("updates");
    }
    eventually("the NAD mapping to be emptied", async || {
        (value().await.as_deref() == Some("")).then_some(())
    })
    .await;
    let put = env.put(dhcp_on("v10-late", "default/vlan10")).await;
    refused(
        &env,
        put,
        "default",
        "v10-late",
        "there is no common NAD mapping: kube-system/harvester-nad-mapping is empty",
    )
    .await;
}

/// The network and the IPAM mode of a Service are fixed once its LoadBalancer exists.
pub async fn network_and_ipam_changes_are_refused<E: GuestEnv>(env: E) {
    create_pool(
        env.harvester(),
        mk_pool(
            "p1",
            range("10.40.0.0/24", "10.40.0.10", "10.40.0.20"),
            global(),
        ),
    )
    .await;
    let vlan1 = ("cloudprovider.harvesterhci.io/network", "default/vlan1");
    env.put(mk_svc("default", "svc", &[("TCP", 80)], &[vlan1]))
        .await
        .expect("accepted");
    let (svc, ip) = address(&env, "default", "svc").await;
    let lb = lb_name(&svc);

    let put = env
        .put(mk_svc(
            "default",
            "svc",
            &[("TCP", 80)],
            &[("cloudprovider.harvesterhci.io/network", "default/vlan2")],
        ))
        .await;
    refused(&env, put, "default", "svc", &format!("network annotation of service default/svc is not same as the load balancer {NS}/{lb}, service: 'default/vlan2', lb: 'default/vlan1'")).await;

    let put = env
        .put(mk_svc(
            "default",
            "svc",
            &[("TCP", 80)],
            &[vlan1, ("cloudprovider.harvesterhci.io/ipam", "dhcp")],
        ))
        .await;
    refused(&env, put, "default", "svc", &format!("ipam annotation of service default/svc is not same as the load balancer {NS}/{lb}, service: 'dhcp', lb: 'pool'; the IPAM mode of a load balancer cannot change: create a new service instead")).await;

    // The LoadBalancer kept its network, mode and address.
    let current = lb_of(&env, &svc).await.expect("exists");
    assert_eq!(current["spec"]["ipam"], "pool");
    assert_eq!(
        current["metadata"]["annotations"]["loadbalancer.harvesterhci.io/network"],
        "default/vlan1"
    );
    assert_eq!(current["status"]["allocatedAddress"]["ip"], ip.as_str());
}
