//! The load balancer kinds on the CRDs a cluster really has. Harvester installs IPPool and
//! LoadBalancer without a status subresource (load-balancer-harvester `crds/`; `deploy/crds` ships
//! the same shape); clusters that installed the project's earlier CRDs have one. The service finds
//! out by discovery and must allocate, release and report on either, follow a CRD swapped under it,
//! never read a missing `/status` endpoint as a missing pool (that leaked the address of every
//! LoadBalancer deleted meanwhile), and refuse to start without the kinds.

#[macro_use]
mod support;

use std::{collections::BTreeMap, sync::Arc};

use harvester_cloud::{app, crd, lb, store::ObjectStore};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, PostParams},
};
use serde_json::json;
use support::{
    KubeBackend,
    control_plane::ControlPlane,
    eventually,
    kube_env::install_lb_crds,
    lb::{Reconcilers, global, mk_pool, range},
};

/// The reconcilers on the service's own store (the chart's RBAC), until stopped or dropped.
fn run_reconcilers(store: Arc<dyn ObjectStore>) -> Reconcilers {
    Reconcilers::start_with(
        store,
        lb::Settings {
            identity: "harvester-crds-test".into(),
            // The service's default on this backend.
            concurrency: lb::CONCURRENCY_KUBE,
            ..lb::Settings::default()
        },
    )
}

fn ar(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "loadbalancer.harvesterhci.io".into(),
        version: "v1beta1".into(),
        api_version: "loadbalancer.harvesterhci.io/v1beta1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn pools(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ar("IPPool", "ippools"))
}

fn lbs(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &ar("LoadBalancer", "loadbalancers"))
}

async fn create_pool(client: &Client, name: &str, subnet: &str, start: &str, end: &str) {
    let pool: DynamicObject =
        serde_json::from_value(mk_pool(name, range(subnet, start, end), global())).expect("a pool");
    pools(client)
        .create(&PostParams::default(), &pool)
        .await
        .expect("creates the pool");
}

/// A LoadBalancer as a guest's cloud provider makes it: no status.
async fn create_lb(client: &Client, ns: &str, name: &str) {
    let lb: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"ipam": "pool", "workloadType": "cluster",
                 "listeners": [{"name": "http", "port": 80, "protocol": "TCP", "backendPort": 30080}]}
    }))
    .expect("a LoadBalancer");
    lbs(client, ns)
        .create(&PostParams::default(), &lb)
        .await
        .expect("creates the LoadBalancer");
}

/// The address the LoadBalancer was given (status.address and allocatedAddress agree).
async fn address(client: &Client, ns: &str, name: &str) -> String {
    eventually(&format!("{ns}/{name} to get an address"), async || {
        let lb = lbs(client, ns).get_opt(name).await.ok()??;
        let status = &lb.data["status"];
        let ip = status["address"].as_str().filter(|a| !a.is_empty())?;
        (status["allocatedAddress"]["ip"] == ip).then(|| ip.to_string())
    })
    .await
}

async fn allocated(client: &Client, pool: &str) -> BTreeMap<String, String> {
    let p = pools(client).get(pool).await.expect("reads the pool");
    serde_json::from_value(p.data["status"]["allocated"].clone()).unwrap_or_default()
}

async fn delete_lb(client: &Client, ns: &str, name: &str) {
    lbs(client, ns)
        .delete(name, &DeleteParams::default())
        .await
        .expect("deletes the LoadBalancer");
    eventually(&format!("{ns}/{name} gone"), async || {
        matches!(lbs(client, ns).get_opt(name).await, Ok(None)).then_some(())
    })
    .await;
}

/// Allocate, release and report on one shape: two LoadBalancers get distinct addresses recorded in
/// the pool, Ready says so, a delete releases exactly its own address, and a write of the object
/// that carries no status (as a client's PUT) leaves the status alone.
async fn works_on(cp: ControlPlane, subresource: bool) {
    let client = cp.admin.clone();
    install_lb_crds(&client, subresource).await;
    let b = KubeBackend::start_on(cp, &[]).await;
    let reconcilers = run_reconcilers(b.app.state.store.clone());
    let pool = if subresource {
        "with-status"
    } else {
        "harvester"
    };
    create_pool(&client, pool, "10.91.0.0/24", "10.91.0.10", "10.91.0.20").await;
    create_lb(&client, "default", "one").await;
    create_lb(&client, "default", "two").await;
    let one = address(&client, "default", "one").await;
    let two = address(&client, "default", "two").await;
    assert_ne!(one, two);
    let held = eventually("the pool to record both", async || {
        let held = allocated(&client, pool).await;
        (held.len() == 2).then_some(held)
    })
    .await;
    assert_eq!(held[&one], "default/one");
    assert_eq!(held[&two], "default/two");
    let lb = lbs(&client, "default").get("one").await.expect("reads");
    let ready = lb.data["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .expect("a Ready condition");
    assert_eq!(ready["status"], "True", "{ready}");

    // A replace through the service's store without a status keeps the stored one.
    let mut stripped = serde_json::to_value(&lb).expect("JSON");
    stripped
        .as_object_mut()
        .expect("an object")
        .remove("status");
    stripped["metadata"]["labels"] = json!({"touched": "yes"});
    let replaced = b
        .app
        .state
        .store
        .replace(&crd::lb_kind(), stripped)
        .await
        .expect("replaces");
    assert_eq!(replaced["status"]["address"], one.as_str(), "{replaced}");
    assert_eq!(replaced["metadata"]["labels"]["touched"], "yes");

    delete_lb(&client, "default", "one").await;
    let held = eventually("the pool to release one", async || {
        let held = allocated(&client, pool).await;
        (!held.contains_key(&one)).then_some(held)
    })
    .await;
    assert_eq!(held.len(), 1);
    assert_eq!(held[&two], "default/two");
    drop(reconcilers);
}

#[tokio::test]
async fn allocates_on_harvester_s_crds_without_status_subresource() {
    works_on(ControlPlane::lease().await, false).await;
}

#[tokio::test]
async fn allocates_on_crds_with_a_status_subresource() {
    works_on(ControlPlane::lease().await, true).await;
}

/// The CRD changes under a running service, both ways; a delete during each shape releases its
/// address (no leak from a 404 read as "the pool is gone") and a new LoadBalancer is served.
#[tokio::test]
async fn follows_a_crd_swapped_under_it() {
    let cp = ControlPlane::lease().await;
    let client = cp.admin.clone();
    install_lb_crds(&client, true).await;
    let b = KubeBackend::start_on(cp, &[]).await;
    let reconcilers = run_reconcilers(b.app.state.store.clone());
    create_pool(&client, "swap", "10.92.0.0/24", "10.92.0.10", "10.92.0.40").await;
    for name in ["a", "b", "c"] {
        create_lb(&client, "default", name).await;
    }
    let a = address(&client, "default", "a").await;
    let b_ip = address(&client, "default", "b").await;
    address(&client, "default", "c").await;

    // To Harvester's shape: the service remembered a subresource that is gone now.
    install_lb_crds(&client, false).await;
    delete_lb(&client, "default", "a").await;
    eventually("a's address released after the swap", async || {
        (!allocated(&client, "swap").await.contains_key(&a)).then_some(())
    })
    .await;
    create_lb(&client, "default", "d").await;
    let d = address(&client, "default", "d").await;
    assert_eq!(allocated(&client, "swap").await[&d], "default/d");

    // And back: a status written in the object would be dropped now.
    install_lb_crds(&client, true).await;
    delete_lb(&client, "default", "b").await;
    eventually("b's address released after the swap back", async || {
        (!allocated(&client, "swap").await.contains_key(&b_ip)).then_some(())
    })
    .await;
    create_lb(&client, "default", "e").await;
    let e = address(&client, "default", "e").await;
    let held = allocated(&client, "swap").await;
    assert_eq!(held[&e], "default/e");
    assert_eq!(held.len(), 3, "c, d and e hold addresses: {held:?}");
    drop(reconcilers);
}

/// Without the IPPool CRD the service does not start, and says which CRD is missing.
#[tokio::test]
async fn refuses_to_start_without_the_kinds() {
    let cp = ControlPlane::lease().await;
    let client = cp.admin.clone();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete(
        "ippools.loadbalancer.harvesterhci.io",
        &DeleteParams::default(),
    )
    .await
    .expect("deletes the CRD");
    eventually("the IPPool CRD gone", async || {
        matches!(
            crds.get_opt("ippools.loadbalancer.harvesterhci.io").await,
            Ok(None)
        )
        .then_some(())
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("service.kubeconfig");
    std::fs::write(
        &kubeconfig,
        support::kube_env::service_kubeconfig(&cp).await,
    )
    .expect("writes the kubeconfig");
    let args: Vec<String> = vec![
        "--backend".into(),
        "kube".into(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
    ];
    let (_, serve) = support::cli(dir.path(), &args);
    let err = match app::open_kube(&serve).await {
        Ok(_) => panic!("started without the IPPool CRD"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains(
            "CustomResourceDefinition ippools.loadbalancer.harvesterhci.io is not installed"
        ),
        "{err}"
    );
    // The next lease's seed installs it again.
}
