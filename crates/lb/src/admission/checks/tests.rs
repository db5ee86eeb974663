use super::*;
use crate::crd::{HealthCheck, Listener, LoadBalancerSpec, keys::ANNOTATION_REMOVE_ALL_PVCS};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn mk_listener(name: &str, port: i32, protocol: &str, backend: i32) -> Listener {
    Listener {
        name: name.into(),
        port,
        protocol: protocol.into(),
        backend_port: backend,
    }
}

fn mk_lb(workload: &str, listeners: Vec<Listener>) -> LoadBalancer {
    LoadBalancer {
        metadata: ObjectMeta {
            name: Some("lb1".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: LoadBalancerSpec {
            workload_type: workload.into(),
            listeners,
            ..Default::default()
        },
        status: None,
    }
}

fn create(lb: &LoadBalancer) -> String {
    validate_lb_create(lb, &[])
        .expect_err("refused")
        .to_string()
}

#[test]
fn listener_messages() {
    assert_eq!(
        create(&mk_lb("vm", vec![])),
        "create loadbalancer default/lb1 failed: the loadbalancer needs to have at least one listener"
    );
    assert!(validate_lb_create(&mk_lb("cluster", vec![]), &[]).is_ok());
    let cases = [
        (
            vec![
                mk_listener("a", 80, "TCP", 8080),
                mk_listener("a", 81, "TCP", 8081),
            ],
            "listener has duplicate name a",
        ),
        (
            vec![
                mk_listener("a", 80, "TCP", 8080),
                mk_listener("b", 80, "TCP", 8081),
            ],
            "listener b has duplicate port TCP:80 with listener a",
        ),
        (
            vec![
                mk_listener("a", 80, "TCP", 8080),
                mk_listener("b", 81, "TCP", 8080),
            ],
            "listener b has duplicate backend port TCP:8080 with listener a",
        ),
        (
            vec![mk_listener("a", 65536, "TCP", 1)],
            "listener port 65536 must <= 65535",
        ),
        (
            vec![mk_listener("a", 0, "TCP", 1)],
            "listener port 0 must >= 1",
        ),
        (
            vec![mk_listener("a", 1, "TCP", 70000)],
            "listener backend port 70000 must <= 65535",
        ),
        (
            vec![mk_listener("a", 1, "TCP", -1)],
            "listener backend port -1 must >= 1",
        ),
    ];
    for (listeners, want) in cases {
        assert_eq!(
            create(&mk_lb("vm", listeners)),
            format!("create loadbalancer default/lb1 failed: {want}")
        );
    }
    // Upstream's TestCheckListeners: an empty protocol with valid ports is accepted, and with bad
    // ports refused by the port rules, in upstream's words.
    assert!(validate_lb_create(&mk_lb("vm", vec![mk_listener("a", 80, "", 8080)]), &[]).is_ok());
    for (listener, want) in [
        (mk_listener("a", -1, "", 80), "listener port -1 must >= 1"),
        (
            mk_listener("b", 800000, "", 80),
            "listener port 800000 must <= 65535",
        ),
        (
            mk_listener("a", 80, "", 0),
            "listener backend port 0 must >= 1",
        ),
        (
            mk_listener("a", 80, "", 800000),
            "listener backend port 800000 must <= 65535",
        ),
        // A bad port is refused in upstream's words before our protocol rule.
        (mk_listener("a", 0, "HTTP", 80), "listener port 0 must >= 1"),
        (
            mk_listener("a", 80, "HTTP", 80),
            "listener a has protocol \"HTTP\", which is not TCP, UDP or SCTP",
        ),
    ] {
        assert_eq!(
            create(&mk_lb("vm", vec![listener])),
            format!("create loadbalancer default/lb1 failed: {want}")
        );
    }
    // Empty is TCP: on one port with a TCP listener, the Service would have the port twice.
    assert_eq!(
        create(&mk_lb(
            "vm",
            vec![
                mk_listener("a", 80, "TCP", 80),
                mk_listener("b", 80, "", 81)
            ]
        )),
        "create loadbalancer default/lb1 failed: listener b has duplicate port TCP:80 with listener a"
    );
    // The protocol is part of the key.
    assert!(
        validate_lb_create(
            &mk_lb(
                "",
                vec![
                    mk_listener("a", 80, "TCP", 80),
                    mk_listener("b", 80, "UDP", 80)
                ]
            ),
            &[]
        )
        .is_ok()
    );
}

#[test]
fn health_check_messages_in_order() {
    let mut lb = mk_lb(
        "vm",
        vec![
            mk_listener("a", 80, "UDP", 8080),
            mk_listener("b", 81, "TCP", 8081),
        ],
    );
    let with = |lb: &mut LoadBalancer, hc: HealthCheck| {
        lb.spec.health_check = Some(hc);
        create(lb)
    };
    let prefix = "create loadbalancer default/lb1 failed with healthyCheck: ";
    assert_eq!(
        with(
            &mut lb,
            HealthCheck {
                port: 8080,
                ..Default::default()
            }
        ),
        format!("{prefix}healthcheck port 8080 can only be a TCP backend port")
    );
    assert_eq!(
        with(
            &mut lb,
            HealthCheck {
                port: 9999,
                ..Default::default()
            }
        ),
        format!("{prefix}healthcheck port 9999 is not in listener backend port list")
    );
    let mut hc = HealthCheck {
        port: 8081,
        ..Default::default()
    };
    for want in [
        "healthcheck SuccessThreshold should > 0",
        "healthcheck FailureThreshold should > 0",
        "healthcheck PeriodSeconds should > 0",
        "healthcheck TimeoutSeconds should > 0",
    ] {
        assert_eq!(with(&mut lb, hc.clone()), format!("{prefix}{want}"));
        match want {
            w if w.contains("Success") => hc.success_threshold = 1,
            w if w.contains("Failure") => hc.failure_threshold = 1,
            w if w.contains("Period") => hc.period_seconds = 1,
            _ => hc.timeout_seconds = 1,
        }
    }
    lb.spec.health_check = Some(hc.clone());
    assert!(validate_lb_create(&lb, &[]).is_ok());
    // Ours: HTTP(S) health-check annotations the prober cannot run.
    lb.metadata.annotations = Some(
        [(
            crate::crd::keys::ANNOTATION_HEALTH_CHECK_HTTP_PATH.to_string(),
            "healthz".to_string(),
        )]
        .into(),
    );
    assert_eq!(
        create(&lb),
        format!(
            "{prefix}annotation loadbalancer.harvesterhci.io/healthCheckHTTPPath: \"healthz\" is not an absolute path (it must start with \"/\")"
        )
    );
    lb.metadata.annotations = None;
    // pkg/webhook/loadbalancer/validator.go (checkHealthyCheck): not the first listener on the
    // port, any TCP one passes; a UDP listener before it is skipped.
    let mut lb = mk_lb(
        "vm",
        vec![
            mk_listener("dns-udp", 53, "UDP", 8053),
            mk_listener("dns-tcp", 53, "TCP", 8053),
        ],
    );
    lb.spec.health_check = Some(HealthCheck {
        port: 8053,
        ..hc.clone()
    });
    assert!(validate_lb_create(&lb, &[]).is_ok());
    // Its thresholds are the ones checked.
    lb.spec.health_check = Some(HealthCheck {
        port: 8053,
        period_seconds: 0,
        ..hc
    });
    assert_eq!(
        create(&lb),
        format!("{prefix}healthcheck PeriodSeconds should > 0")
    );
    // The mutator fills zero thresholds, so a mutated object passes.
    let mut lb = mk_lb("vm", vec![mk_listener("a", 80, "TCP", 8080)]);
    lb.spec.health_check = Some(HealthCheck {
        port: 8080,
        ..Default::default()
    });
    mutate_lb(&mut lb, None, &[]);
    let hc = lb.spec.health_check.clone().expect("kept");
    assert_eq!(
        (
            hc.success_threshold,
            hc.failure_threshold,
            hc.period_seconds,
            hc.timeout_seconds
        ),
        (2, 2, 1, 1)
    );
    assert!(validate_lb_create(&lb, &[]).is_ok());
}

/// Ours (issue 25): the durations the prober waits are bounded, with messages in upstream's voice;
/// on update only when the health check changes, so an object stored before the bounds can still
/// be written (the prober clamps it).
#[test]
fn health_check_durations_are_bounded() {
    let mut lb = mk_lb("vm", vec![mk_listener("a", 80, "TCP", 8080)]);
    let hc = HealthCheck {
        port: 8080,
        success_threshold: 1,
        failure_threshold: 1,
        period_seconds: 300,
        timeout_seconds: 300,
    };
    lb.spec.health_check = Some(hc.clone());
    assert!(validate_lb_create(&lb, &[]).is_ok());
    let prefix = "create loadbalancer default/lb1 failed with healthyCheck: ";
    for (period_seconds, timeout_seconds, want) in [
        (301, 1, "healthcheck PeriodSeconds 301 should <= 300"),
        (
            u64::MAX,
            1,
            "healthcheck PeriodSeconds 18446744073709551615 should <= 300",
        ),
        (
            1,
            3_000_000,
            "healthcheck TimeoutSeconds 3000000 should <= PeriodSeconds 1",
        ),
        (
            10,
            11,
            "healthcheck TimeoutSeconds 11 should <= PeriodSeconds 10",
        ),
    ] {
        lb.spec.health_check = Some(HealthCheck {
            period_seconds,
            timeout_seconds,
            ..hc.clone()
        });
        assert_eq!(create(&lb), format!("{prefix}{want}"));
    }
    // The issue's object, stored before the bounds: another change passes, a change of its health
    // check is judged.
    let old = lb.clone();
    let mut new = old.clone();
    new.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
    assert!(validate_lb_update(&old, &new).is_ok());
    new.spec.health_check = Some(HealthCheck {
        timeout_seconds: 12,
        ..new.spec.health_check.clone().expect("set")
    });
    assert_eq!(
        validate_lb_update(&old, &new)
            .expect_err("refused")
            .to_string(),
        "update loadbalancer default/lb1 failed with healthyCheck: healthcheck TimeoutSeconds 12 should <= PeriodSeconds 10"
    );
    // Cluster type has no health check to bound.
    let mut cluster = lb.clone();
    cluster.spec.workload_type = "cluster".into();
    assert!(check_health_check_bounds(&cluster).is_ok());
}

#[test]
fn ipam_and_workload_type_changes() {
    let mut old = mk_lb("cluster", vec![]);
    let mut new = old.clone();
    old.spec.ipam = String::new();
    new.spec.ipam = "pool".into();
    assert!(validate_lb_update(&old, &new).is_ok());
    new.spec.ipam = "dhcp".into();
    assert_eq!(
        validate_lb_update(&old, &new)
            .expect_err("refused")
            .to_string(),
        "update loadbalancer default/lb1 failed: can't change the IPAM from  to dhcp"
    );
    new.spec.ipam = String::new();
    new.spec.workload_type = "vm".into();
    new.spec.listeners = vec![mk_listener("a", 80, "TCP", 80)];
    assert_eq!(
        validate_lb_update(&old, &new)
            .expect_err("refused")
            .to_string(),
        "update loadbalancer default/lb1 failed: can't change the WorkloadType from cluster to vm"
    );
    // Objects being deleted are not checked.
    new.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    ));
    assert!(validate_lb_update(&old, &new).is_ok());
}

#[test]
fn carried_service_labels_must_read_as_a_json_object_of_strings() {
    use crate::crd::keys::ANNOTATION_SERVICE_LABELS;
    let mut lb = mk_lb("cluster", vec![]);
    for ok in [r#"{}"#, r#"{"app":"web","example.com/tier":""}"#] {
        lb.metadata.annotations =
            Some([(ANNOTATION_SERVICE_LABELS.to_string(), ok.to_string())].into());
        assert!(validate_lb_create(&lb, &[]).is_ok(), "{ok}");
        assert!(validate_lb_update(&lb, &lb).is_ok(), "{ok}");
    }
    lb.metadata.annotations = Some(
        [(
            ANNOTATION_SERVICE_LABELS.to_string(),
            r#"{"replicas":3}"#.to_string(),
        )]
        .into(),
    );
    assert_eq!(
        create(&lb),
        "create loadbalancer default/lb1 failed: annotation cloudprovider.harvesterhci.io/serviceLabels is not a JSON object of label values: invalid type: integer `3`, expected a string at line 1 column 13"
    );
    let old = mk_lb("cluster", vec![]);
    assert!(
        validate_lb_update(&old, &lb)
            .expect_err("refused")
            .to_string()
            .starts_with("update loadbalancer default/lb1 failed: annotation cloudprovider.harvesterhci.io/serviceLabels is not a JSON object")
    );
}

#[test]
fn dhcp_lease_records_are_what_kube_vip_can_lease_with() {
    let with = |ipam: &str, record: &[(&str, &str)]| {
        let mut lb = mk_lb("cluster", vec![]);
        lb.spec.ipam = ipam.into();
        lb.metadata.annotations = Some(
            record
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        lb
    };
    let good = with(
        "dhcp",
        &[
            (ANNOTATION_DHCP_MAC, "00:00:6c:12:34:56"),
            (ANNOTATION_DHCP_LEASED_IP, "192.168.1.20,fd00::20"),
            (ANNOTATION_DHCP_HOSTNAME, "web-lb"),
            (ANNOTATION_DHCP_RETAINED_UNTIL, "2026-01-02T15:04:05Z"),
        ],
    );
    assert!(validate_lb_create(&good, &[]).is_ok());
    assert!(validate_lb_update(&good, &good).is_ok());
    for (record, message) in [
        (
            (ANNOTATION_DHCP_MAC, "ff:ff:ff:ff:ff:ff"),
            "annotation cloudprovider.harvesterhci.io/dhcpMACAddress is \"ff:ff:ff:ff:ff:ff\": the broadcast MAC address; the lease needs a unicast address",
        ),
        (
            (ANNOTATION_DHCP_MAC, "33:33:00:00:00:01"),
            "annotation cloudprovider.harvesterhci.io/dhcpMACAddress is \"33:33:00:00:00:01\": a multicast MAC address (the low bit of the first octet, 33, is set); the lease needs a unicast address",
        ),
        (
            (ANNOTATION_DHCP_LEASED_IP, "0.0.0.0"),
            "annotation cloudprovider.harvesterhci.io/dhcpLeasedIP is \"0.0.0.0\": 0.0.0.0 is not an address a DHCP server leases",
        ),
        (
            (ANNOTATION_DHCP_RETAINED_UNTIL, "tomorrow"),
            "annotation cloudprovider.harvesterhci.io/dhcpRetainedUntil is \"tomorrow\": not an RFC 3339 time, as in 2026-01-02T15:04:05Z",
        ),
    ] {
        let lb = with("dhcp", &[record]);
        assert_eq!(
            create(&lb),
            format!("create loadbalancer default/lb1 failed: {message}")
        );
        assert_eq!(
            validate_lb_update(&good, &lb)
                .expect_err("refused")
                .to_string(),
            format!("update loadbalancer default/lb1 failed: {message}")
        );
    }
    assert_eq!(
        create(&with("pool", &[(ANNOTATION_DHCP_MAC, "00:00:6c:12:34:56")])),
        "create loadbalancer default/lb1 failed: annotation cloudprovider.harvesterhci.io/dhcpMACAddress is a DHCP lease record, and spec.ipam is not dhcp"
    );
    // Empty values are no record.
    assert!(validate_lb_create(&with("pool", &[(ANNOTATION_DHCP_MAC, "")]), &[]).is_ok());
}

fn mk_vm(name: &str, cluster: &str, removing: bool) -> VirtualMachine {
    let mut vm = VirtualMachine::default();
    vm.metadata.name = Some(name.into());
    vm.metadata.namespace = Some("default".into());
    vm.metadata.labels = Some(
        [
            (LABEL_CREATOR.to_string(), NODE_DRIVER.to_string()),
            (LABEL_GUEST_CLUSTER_NAME.to_string(), cluster.to_string()),
        ]
        .into(),
    );
    if removing {
        vm.metadata.annotations =
            Some([(ANNOTATION_REMOVE_ALL_PVCS.to_string(), "true".to_string())].into());
    }
    vm
}

#[test]
fn guest_cluster_being_removed_refuses_new_cluster_lbs() {
    let mut lb = mk_lb("cluster", vec![]);
    lb.metadata.labels = Some([(LABEL_GUEST_CLUSTER.to_string(), "gc1".to_string())].into());
    let vms = [mk_vm("gc1-a", "gc1", false), mk_vm("gc2-a", "gc2", true)];
    assert!(validate_lb_create(&lb, &vms).is_ok());
    let vms = [mk_vm("gc1-a", "gc1", true)];
    assert_eq!(
        validate_lb_create(&lb, &vms)
            .expect_err("refused")
            .to_string(),
        "create loadbalancer default/lb1 failed with guest cluster check: the vm default/gc1-a shows guest cluster gc1 is being removed"
    );
    // `kubernetes` (the framework default) and a missing label skip the check.
    lb.metadata.labels = Some([(LABEL_GUEST_CLUSTER.to_string(), "kubernetes".to_string())].into());
    assert!(validate_lb_create(&lb, &vms).is_ok());
}

fn mk_vmi(name: &str, labels: &[(&str, &str)], network: &str) -> VirtualMachineInstance {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default",
                     "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>()},
        "spec": {"networks": [{"name": "nic", "multus": {"networkName": network}}]}
    }))
    .expect("vmi")
}

#[test]
fn find_network_priorities() {
    let mut lb = mk_lb("cluster", vec![]);
    let vmis = [
        mk_vmi(
            "gc1-legacy",
            &[(LABEL_CREATOR, NODE_DRIVER)],
            "default/legacy",
        ),
        mk_vmi(
            "x",
            &[(LABEL_GUEST_CLUSTER_NAME, "gc1")],
            "default/labelled",
        ),
    ];
    // 3: no cluster annotation.
    assert_eq!(find_network(&lb, &vmis), "");
    let set = |lb: &mut LoadBalancer, k: &str, v: &str| {
        lb.metadata
            .annotations
            .get_or_insert_default()
            .insert(k.into(), v.into());
    };
    set(&mut lb, ANNOTATION_CLUSTER, "gc1");
    // 4 before 5.
    assert_eq!(find_network(&lb, &vmis), "default/labelled");
    assert_eq!(find_network(&lb, &vmis[..1]), "default/legacy");
    // pkg/webhook/loadbalancer/mutator.go (getFirstMultusNetworkNameFromVMI): a Multus network
    // with an empty name is skipped, for the next network or the next VMI.
    let mut empty_first = mk_vmi("y", &[(LABEL_GUEST_CLUSTER_NAME, "gc1")], "");
    empty_first.rest["spec"]["networks"]
        .as_array_mut()
        .expect("networks")
        .push(serde_json::json!({"name": "nic2", "multus": {"networkName": "default/second"}}));
    assert_eq!(
        find_network(&lb, std::slice::from_ref(&empty_first)),
        "default/second"
    );
    let empty_only = mk_vmi("z", &[(LABEL_GUEST_CLUSTER_NAME, "gc1")], "");
    assert_eq!(
        find_network(&lb, &[empty_only.clone(), vmis[1].clone()]),
        "default/labelled"
    );
    assert_eq!(find_network(&lb, &[empty_only]), "");
    // 2, then 1.
    set(&mut lb, ANNOTATION_MANAGEMENT_NETWORK, "default/mgmt");
    assert_eq!(find_network(&lb, &vmis), "default/mgmt");
    set(&mut lb, ANNOTATION_NETWORK, "default/vlan10");
    assert_eq!(find_network(&lb, &vmis), "default/vlan10");
}

#[test]
fn find_network_resolution_order() {
    let vmis = [
        mk_vmi(
            "x-legacy-1",
            &[(LABEL_CREATOR, NODE_DRIVER)],
            "default/legacy",
        ),
        mk_vmi(
            "other",
            &[(LABEL_GUEST_CLUSTER_NAME, "gc2")],
            "default/gc2-net",
        ),
        mk_vmi(
            "gc1-pool-a",
            &[(LABEL_GUEST_CLUSTER_NAME, "gc1")],
            "default/gc1-net",
        ),
        mk_vmi(
            "gc3-pool",
            &[(LABEL_CREATOR, NODE_DRIVER)],
            "default/gc3-legacy",
        ),
    ];
    let find = |a: &[(&str, &str)]| {
        let mut lb = mk_lb("cluster", vec![]);
        lb.metadata.annotations = Some(
            a.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        find_network(&lb, &vmis)
    };
    assert_eq!(
        find(&[
            (ANNOTATION_NETWORK, "default/explicit"),
            (ANNOTATION_MANAGEMENT_NETWORK, "default/m")
        ]),
        "default/explicit"
    );
    assert_eq!(
        find(&[
            (ANNOTATION_NETWORK, ""),
            (ANNOTATION_MANAGEMENT_NETWORK, "default/m")
        ]),
        "default/m"
    );
    assert_eq!(find(&[]), "");
    assert_eq!(find(&[(ANNOTATION_CLUSTER, "gc1")]), "default/gc1-net");
    assert_eq!(find(&[(ANNOTATION_CLUSTER, "gc3")]), "default/gc3-legacy");
    assert_eq!(find(&[(ANNOTATION_CLUSTER, "nobody")]), "");
}

#[test]
fn mutator_sets_namespace_project_and_network() {
    let mut lb = mk_lb("cluster", vec![]);
    let mut ns = Namespace::default();
    ns.metadata.annotations =
        Some([(PROJECT_ID_ANNOTATION.to_string(), "c-abc:p-xyz".to_string())].into());
    mutate_lb(&mut lb, Some(&ns), &[]);
    let a = lb.metadata.annotations.clone().expect("annotations");
    assert_eq!(a[ANNOTATION_NAMESPACE], "default");
    assert_eq!(a[ANNOTATION_PROJECT], "c-abc/p-xyz");
    assert_eq!(a[ANNOTATION_NETWORK], "");
    let mut vm_lb = mk_lb("vm", vec![]);
    mutate_lb(&mut vm_lb, None, &[]);
    let a = vm_lb.metadata.annotations.expect("annotations");
    assert_eq!(a.len(), 1);
    assert_eq!(a[ANNOTATION_NAMESPACE], "default");
}
