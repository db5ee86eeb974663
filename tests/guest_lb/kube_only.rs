use super::*;

/// A DHCP lease the guest's kube-vip reports cannot be written to the LoadBalancer's status with
/// Harvester's `harvesterhci.io:cloudprovider` role where the CRD has a status subresource (the
/// role has no `loadbalancers/status`): the ccm skips it and keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_not_reported_without_the_status_permission() {
    lease_reported(true).await;
}

/// On Harvester's own CRDs (no status subresource) the status is part of the LoadBalancer, which
/// the role allows: the lease is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_reported_on_harvester_s_crds() {
    lease_reported(false).await;
}

async fn lease_reported(status_subresource: bool) {
    let env = KubeEnv::start().await;
    support::kube_env::install_lb_crds(&env.b.client, status_subresource).await;
    create_pool(
        env.harvester(),
        mk_pool(
            "p1",
            range("10.90.0.0/24", "10.90.0.10", "10.90.0.20"),
            global(),
        ),
    )
    .await;
    env.put(mk_svc(
        "default",
        "leased",
        &[("TCP", 80)],
        &[("cloudprovider.harvesterhci.io/ipam", "dhcp")],
    ))
    .await
    .expect("accepted");
    let (svc, _) = address(&env, "default", "leased").await;
    // kube-vip got a lease and reports it.
    let api = env.services("default");
    let mut current = api.get("leased").await.expect("reads");
    current.status = Some(
        serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "192.168.50.7"}]}}))
            .expect("status"),
    );
    api.replace_status("leased", &PostParams::default(), &current)
        .await
        .expect("kube-vip writes the status");
    if !status_subresource {
        let lb = eventually("the lease reported on the LoadBalancer", async || {
            let lb = lb_of(&env, &svc).await?;
            (lb["status"]["address"] == "192.168.50.7").then_some(lb)
        })
        .await;
        // Its allocation is the pool's business: DHCP has none.
        assert_eq!(lb["spec"]["ipam"], "dhcp");
        return;
    }
    // The ccm tries (as the cloud-config's service account) and is refused.
    let status_path = format!(
        "/apis/loadbalancer.harvesterhci.io/v1beta1/namespaces/{NS}/loadbalancers/{}/status",
        lb_name(&svc)
    );
    // The Harvester API server's audit log has the attempt.
    eventually("the ccm to try to report the lease", async || {
        env.b
            .cp
            .audit()
            .iter()
            .any(|r| {
                r.verb == "update"
                    && r.uri.split('?').next() == Some(status_path.as_str())
                    && r.user == format!("system:serviceaccount:{NS}:{CLUSTER}")
            })
            .then_some(())
    })
    .await;
    // The ccm goes on serving others.
    env.put(mk_svc("default", "web", &[("TCP", 80)], &[]))
        .await
        .expect("accepted");
    address(&env, "default", "web").await;
    let lb = lb_of(&env, &svc).await.expect("exists");
    assert_eq!(
        lb["status"]["address"],
        Value::Null,
        "not reported without loadbalancers/status"
    );
    let leased = env.get("default", "leased").await.expect("exists");
    assert_eq!(
        annotation(&leased, "kube-vip.io/loadbalancerIPs"),
        Some("0.0.0.0")
    );
    assert_eq!(
        ingress(&leased),
        Some("192.168.50.7"),
        "kube-vip's report stays"
    );
    assert!(
        env.events("default", "leased")
            .await
            .iter()
            .all(|(r, _)| r != reconcile::reason::SYNC_FAILED),
        "not a failure of the service"
    );
}

/// Two guest clusters with the same `--cluster-name`, whose cloud-configs put their
/// LoadBalancers in the same Harvester namespace (two guest control planes, two ccms): each
/// records its own identity and collects only what it made, so neither deletes the other's,
/// even for a Service the other lacks or has under the same name with another UID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_guest_clusters_share_a_name_and_a_namespace() {
    let mut planes = support::control_plane::ControlPlane::lease_many(3).await;
    let guest_b = planes.pop().expect("three");
    let guest_a = planes.pop().expect("three");
    let harvester = planes.pop().expect("three");
    let mut env = KubeEnv::on(harvester, guest_a).await;
    let kubeconfig = ccm_guest_kubeconfig(&env.guest).await;
    std::fs::write(env.dir.path().join("guest.kubeconfig"), kubeconfig).expect("writes");
    env.start_ccm();
    // The second guest cluster: the same cloud-config and cluster name, its own ccm.
    let dir_b = tempfile::tempdir().expect("tempdir");
    std::fs::copy(
        env.dir.path().join("cloud-config"),
        dir_b.path().join("cloud-config"),
    )
    .expect("copies");
    std::fs::write(
        dir_b.path().join("guest.kubeconfig"),
        ccm_guest_kubeconfig(&guest_b).await,
    )
    .expect("writes");
    let args_b = ccm_args(dir_b.path());
    let ccm_b = Task::spawn(|stop| async move {
        harvester_cloud::cli::ccm::run(&args_b, stop)
            .await
            .expect("the ccm runs");
    });
    let mut probes = support::Refusals::refusal_probes(&env);
    probes.push(guest_b.refusal_probe(&[CCM_USER]));
    let (id_a, id_b) = (
        namespace_uid(&env.guest_client).await,
        namespace_uid(&guest_b.admin).await,
    );
    assert_ne!(id_a, id_b);
    create_pool(
        env.harvester(),
        mk_pool(
            "p1",
            range("10.76.0.0/24", "10.76.0.10", "10.76.0.30"),
            global(),
        ),
    )
    .await;
    let services_b: ::kube::Api<Service> =
        ::kube::Api::namespaced(guest_b.admin.clone(), "default");
    let put_b = async |name: &str| {
        let svc: Service = serde_json::from_value(mk_svc("default", name, &[("TCP", 80)], &[]))
            .expect("a Service");
        services_b
            .create(&PostParams::default(), &svc)
            .await
            .expect("creates");
    };
    let address_b = async |name: &str| -> Value {
        eventually(
            &format!("B's service {name} to get its address"),
            async || {
                let svc = services_b.get_opt(name).await.expect("reads")?;
                let svc = serde_json::to_value(svc).expect("encodes");
                let ip = annotation(&svc, "kube-vip.io/loadbalancerIPs")?;
                (ingress(&svc) == Some(ip)).then_some(svc.clone())
            },
        )
        .await
    };
    // A and B both have default/web (other UIDs, so other LoadBalancer names); each also has a
    // Service the other lacks.
    for name in ["web", "only-a"] {
        env.put(mk_svc("default", name, &[("TCP", 80)], &[]))
            .await
            .expect("accepted");
    }
    put_b("web").await;
    put_b("only-b").await;
    let mut lbs = BTreeMap::new();
    for name in ["web", "only-a"] {
        let (svc, _) = address(&env, "default", name).await;
        lbs.insert(format!("a/{name}"), (lb_name(&svc), id_a.clone()));
    }
    for name in ["web", "only-b"] {
        let svc = address_b(name).await;
        lbs.insert(format!("b/{name}"), (lb_name(&svc), id_b.clone()));
    }
    let mut uids = BTreeMap::new();
    for (key, (lb, maker)) in &lbs {
        let found = lb_of_name(&env, lb).await.expect("exists");
        assert_eq!(
            found["metadata"]["annotations"]["cloudprovider.harvesterhci.io/clusterID"],
            json!(maker),
            "{key} records its maker"
        );
        uids.insert(key.clone(), lb_uid(&env, lb).await);
    }
    // Both collectors have judged every LoadBalancer of the other's.
    collector_caught_up(&env, &id_a, "gc1-default-ghost-a-0badf00d").await;
    collector_caught_up(&env, &id_b, "gc1-default-ghost-b-0badf00d").await;
    for (key, (lb, _)) in &lbs {
        assert_eq!(lb_uid(&env, lb).await, uids[key], "{key} is left alone");
    }
    // A's web goes: its LoadBalancer goes, B's web keeps its own.
    env.delete("default", "web").await;
    lb_gone(&env, &lbs["a/web"].0).await;
    services_b
        .delete("only-b", &DeleteParams::default())
        .await
        .expect("deletes");
    lb_gone(&env, &lbs["b/only-b"].0).await;
    collector_caught_up(&env, &id_a, "gc1-default-ghost-a2-0badf00d").await;
    collector_caught_up(&env, &id_b, "gc1-default-ghost-b2-0badf00d").await;
    for key in ["a/only-a", "b/web"] {
        assert_eq!(
            lb_uid(&env, &lbs[key].0).await,
            uids[key],
            "{key} is left alone"
        );
    }
    ccm_b.stop().await;
    for probe in probes {
        probe.assert_none_refused();
    }
}

/// The `ccm` binary: warns about the default cluster name, serves (and its metrics say it
/// leads and reconciles), and on SIGTERM stops cleanly and gives its Lease up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_warns_serves_and_stops_on_sigterm() {
    let env = KubeEnv::without_ccm().await;
    create_pool(
        env.harvester(),
        mk_pool(
            "p1",
            range("10.91.0.0/24", "10.91.0.10", "10.91.0.20"),
            global(),
        ),
    )
    .await;
    let log = env.dir.path().join("ccm.log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_harvester-cloud"))
        .args([
            "--log-format",
            "json",
            "ccm",
            "--cluster-name",
            "kubernetes",
            "--metrics-listen",
            "127.0.0.1:0",
            "--cloud-config",
        ])
        .arg(env.dir.path().join("cloud-config"))
        .arg("--kubeconfig")
        .arg(env.dir.path().join("guest.kubeconfig"))
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("starts the binary");
    env.put(mk_svc("default", "web", &[("TCP", 80)], &[]))
        .await
        .expect("accepted");
    let (svc, _) = address(&env, "default", "web").await;
    let lb = call(
        env.harvester(),
        Method::GET,
        &format!(
            "{LBS}/{NS}/{}",
            load_balancer_name(
                "kubernetes",
                "default",
                "web",
                svc["metadata"]["uid"].as_str().expect("uid")
            )
        ),
        None,
    )
    .await;
    assert_eq!(lb.status, StatusCode::OK, "named after --cluster-name");
    let metrics_url = eventually("the ccm to log its metrics address", async || {
        std::fs::read_to_string(&log)
            .ok()?
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["message"] == "serving metrics")
            .and_then(|v| v["url"].as_str().map(String::from))
    })
    .await;
    let text = reqwest::get(&metrics_url)
        .await
        .expect("scrapes")
        .text()
        .await
        .expect("reads");
    let sample = |name: &str| harvester_cloud::metrics::sample(&text, name);
    assert_eq!(sample("harvester_cloud_leader"), Some(1.0), "{text}");
    assert!(
        sample(r#"harvester_cloud_reconcile_duration_seconds_count{controller="guestservice"}"#)
            .is_some_and(|n| n >= 1.0),
        "{text}"
    );
    let pid = child.id().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("joins")
        .expect("waits");
    let text = std::fs::read_to_string(&log).expect("reads the log");
    assert!(status.success(), "exit after SIGTERM: {status}\n{text}");
    assert!(
        text.contains(harvester_cloud::cli::ccm::CLUSTER_NAME_WARNING),
        "{text}"
    );
    let leases: ::kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        ::kube::Api::namespaced(env.guest_client.clone(), "kube-system");
    let lease = leases
        .get("harvester-cloud-ccm")
        .await
        .expect("the ccm's Lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity),
        None,
        "given up on SIGTERM"
    );
}
