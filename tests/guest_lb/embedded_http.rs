use super::*;

/// PUT creates (201, a new UID) or replaces (200); stale versions and other UIDs conflict;
/// names are checked; the list is a ServiceList; a Service without a load balancer is deleted
/// at once; an unknown cluster is a 404; every route needs the admin token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_have_kubernetes_semantics() {
    let env = EmbeddedEnv::start().await;
    let b = &env.b;
    let mut svc = mk_svc("default", "internal", &[("TCP", 80)], &[]);
    svc["spec"]["type"] = json!("ClusterIP");
    let path = services_path("default", "internal");
    let created = ok(
        call(b, Method::PUT, &path, Some(svc.clone())).await,
        StatusCode::CREATED,
    );
    assert_eq!(created["apiVersion"], "v1");
    assert_eq!(created["kind"], "Service");
    let uid = created["metadata"]["uid"]
        .as_str()
        .expect("a UID")
        .to_string();
    let rv = created["metadata"]["resourceVersion"].clone();
    svc["metadata"]["labels"] = json!({"app": "x"});
    let replaced = ok(
        call(b, Method::PUT, &path, Some(svc.clone())).await,
        StatusCode::OK,
    );
    assert_eq!(replaced["metadata"]["uid"], uid.as_str());
    assert_eq!(replaced["metadata"]["labels"]["app"], "x");
    let mut stale = svc.clone();
    stale["metadata"]["resourceVersion"] = rv;
    call(b, Method::PUT, &path, Some(stale))
        .await
        .error(StatusCode::CONFLICT, "Conflict");
    let mut other = svc.clone();
    other["metadata"]["uid"] = json!("0a0b0c0d-0000-0000-0000-000000000000");
    call(b, Method::PUT, &path, Some(other))
        .await
        .error(StatusCode::CONFLICT, "Conflict");
    let mut renamed = svc.clone();
    renamed["metadata"]["name"] = json!("other");
    assert_eq!(
        call(b, Method::PUT, &path, Some(renamed))
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent"),
        "the name of the service (other) does not match the name on the URL (internal)"
    );
    let bad = format!("/v1/harvester/guestclusters/{NS}/Bad_Cluster/services/default/x");
    assert!(
        call(b, Method::GET, &bad, None)
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent")
            .starts_with("invalid guest cluster name \"Bad_Cluster\"")
    );
    call(b, Method::GET, &services_path("default", "nope"), None)
        .await
        .error(StatusCode::NOT_FOUND, "NotFound");
    let list = ok(
        call(
            b,
            Method::GET,
            &format!("/v1/harvester/guestclusters/{NS}/{CLUSTER}/services"),
            None,
        )
        .await,
        StatusCode::OK,
    );
    assert_eq!(list["kind"], "ServiceList");
    assert_eq!(list["items"][0]["metadata"]["name"], "internal");
    let empty = ok(
        call(
            b,
            Method::GET,
            &format!("/v1/harvester/guestclusters/{NS}/other/services"),
            None,
        )
        .await,
        StatusCode::OK,
    );
    assert_eq!(empty["items"], json!([]));
    let deleted = ok(call(b, Method::DELETE, &path, None).await, StatusCode::OK);
    assert_eq!(deleted["metadata"]["uid"], uid.as_str());
    call(b, Method::DELETE, &path, None)
        .await
        .error(StatusCode::NOT_FOUND, "NotFound");
    call(
        b,
        Method::DELETE,
        &format!("/v1/harvester/guestclusters/{NS}/{CLUSTER}"),
        None,
    )
    .await
    .error(StatusCode::NOT_FOUND, "NotFound");
    let r = b.call(Method::GET, &path, None, Body::empty()).await;
    r.error(StatusCode::UNAUTHORIZED, "Unauthorized");
}

/// A Service of type LoadBalancer deleted over HTTP is marked (202) until its load balancer is
/// released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_load_balancer_service_waits_for_the_release() {
    let env = EmbeddedEnv::start().await;
    create_pool(
        env.harvester(),
        mk_pool(
            "p1",
            range("10.80.0.0/24", "10.80.0.10", "10.80.0.20"),
            global(),
        ),
    )
    .await;
    env.put(mk_svc("default", "web", &[("TCP", 80)], &[]))
        .await
        .expect("accepted");
    let (svc, _) = address(&env, "default", "web").await;
    assert_eq!(svc["metadata"]["finalizers"], json!([reconcile::FINALIZER]));
    let r = call(
        &env.b,
        Method::DELETE,
        &services_path("default", "web"),
        None,
    )
    .await;
    let marked = ok(r, StatusCode::ACCEPTED);
    assert!(marked["metadata"]["deletionTimestamp"].is_string());
    service_gone(&env, "default", "web").await;
    lb_gone(&env, &lb_name(&svc)).await;
}

/// A guest cluster's Events over HTTP: what the reconciler said about its Services, oldest
/// first, as an EventList; the admin token is needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_listed() {
    let env = EmbeddedEnv::start().await;
    let events_path = format!("/v1/harvester/guestclusters/{NS}/{CLUSTER}/events");
    let list = ok(
        call(&env.b, Method::GET, &events_path, None).await,
        StatusCode::OK,
    );
    assert_eq!(list["kind"], "EventList");
    assert_eq!(
        list["items"],
        json!([]),
        "a cluster without Services has none"
    );
    create_pool(
        env.harvester(),
        mk_pool(
            "p1",
            range("10.92.0.0/24", "10.92.0.10", "10.92.0.20"),
            global(),
        ),
    )
    .await;
    env.put(mk_svc("default", "web", &[("TCP", 80)], &[]))
        .await
        .expect("accepted");
    let (svc, ip) = address(&env, "default", "web").await;
    env.delete("default", "web").await;
    service_gone(&env, "default", "web").await;
    let ensured = format!(
        "Ensured load balancer {NS}/{} with address {ip}",
        lb_name(&svc)
    );
    let mut seen = Vec::new();
    let items = eventually("both events over HTTP", async || {
        let list = ok(
            call(&env.b, Method::GET, &events_path, None).await,
            StatusCode::OK,
        );
        // Under load the reconciler may first find no pool in its cache (and say so): only
        // these two are asserted.
        let items: Vec<Value> = list["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e["reason"] != reconcile::reason::SYNC_FAILED)
            .collect();
        let reasons: Vec<&str> = items.iter().filter_map(|e| e["reason"].as_str()).collect();
        if reasons != seen {
            // What a failure shows: the reasons listed, as they changed.
            eprintln!("events listed: {reasons:?}");
            seen = reasons.iter().map(|r| r.to_string()).collect();
        }
        (reasons == [reconcile::reason::ENSURED, reconcile::reason::DELETED]).then_some(items)
    })
    .await;
    let first = &items[0];
    assert_eq!(first["apiVersion"], "v1");
    assert_eq!(first["kind"], "Event");
    assert_eq!(first["type"], "Normal");
    assert_eq!(first["message"], ensured.as_str());
    assert_eq!(first["involvedObject"]["kind"], "Service");
    assert_eq!(first["involvedObject"]["namespace"], "default");
    assert_eq!(first["involvedObject"]["name"], "web");
    assert_eq!(first["involvedObject"]["uid"], svc["metadata"]["uid"]);

    let anonymous = env
        .b
        .call(Method::GET, &events_path, None, Body::empty())
        .await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    let bad = call(
        &env.b,
        Method::GET,
        &format!("/v1/harvester/guestclusters/{NS}/Not_A_Name/events"),
        None,
    )
    .await;
    assert_eq!(
        bad.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        bad.text()
    );
}

/// A guest cluster's reconciler runs from its first Service until the cluster has nothing left:
/// once the cluster is deleted it stops, and nothing of the cluster is written again (its NAD
/// mapping stays gone when its VMIs change); a new Service starts it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_cluster_s_reconciler_stops() {
    let env = EmbeddedEnv::start().await;
    let running = || {
        harvester_cloud::metrics::sample(
            &harvester_cloud::metrics::encode(),
            "harvester_cloud_guest_clusters",
        )
        .unwrap_or(0.0)
    };
    let dhcp = |name: &str| {
        mk_svc(
            "default",
            name,
            &[("TCP", 80)],
            &[("cloudprovider.harvesterhci.io/ipam", "dhcp")],
        )
    };
    env.put(dhcp("one")).await.expect("accepted");
    address(&env, "default", "one").await;
    assert_eq!(running(), 1.0);
    let vmis = support::vmi_api(env.b.store());
    let vmi: VirtualMachineInstance = serde_json::from_value(
        support::foreign::vmi("node-a")
            .namespace(NS)
            .label("guestcluster.harvesterhci.io/name", CLUSTER)
            .multus("nic-1", "default/vlan10", &[], Some("enp2s0"))
            .build(),
    )
    .expect("vmi");
    support::create_vmi(env.b.store(), &vmi).await;
    eventually("the NAD mapping", async || env.nad_mapping().await).await;

    let r = call(
        &env.b,
        Method::DELETE,
        &format!("/v1/harvester/guestclusters/{NS}/{CLUSTER}"),
        None,
    )
    .await;
    ok(r, StatusCode::OK);
    eventually("the reconciler to stop", async || {
        (running() == 0.0).then_some(())
    })
    .await;
    assert!(
        env.nad_mapping().await.is_none(),
        "deleted with the cluster"
    );
    let mut vmi = vmis
        .get(NS, "node-a")
        .await
        .expect("reads")
        .expect("exists");
    vmi.rest["status"]["interfaces"][0]["interfaceName"] = json!("enp3s0");
    vmis.replace(&vmi).await.expect("updates");
    // No reconciler of the cluster exists any more to write it (the gauge counts finished ones
    // out only once they have ended).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(env.nad_mapping().await.is_none(), "not written again");

    env.put(dhcp("two")).await.expect("accepted");
    address(&env, "default", "two").await;
    assert_eq!(running(), 1.0);
    eventually("the NAD mapping of the cluster's new life", async || {
        env.nad_mapping().await
    })
    .await;
}

/// The Kubernetes backend keeps no guest clusters: they run `harvester-cloud ccm`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_backend_points_to_the_ccm() {
    let b = KubeBackend::start().await;
    let message = call(&b, Method::GET, &services_path("default", "web"), None)
        .await
        .error(StatusCode::NOT_FOUND, "NotFound");
    assert!(message.contains("harvester-cloud ccm"), "{message}");
}
