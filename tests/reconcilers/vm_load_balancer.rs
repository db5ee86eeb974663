//! One reconcile of a VM load balancer (`lb::loadbalancer::reconcile` with its VM part): once it
//! has an address, its Service, the announcement of the address, its EndpointSlice, and each
//! reason it is not Ready that needs no VMI. (Backends from VMIs, their health and the prober are
//! tests/vm_lb's, end to end with real listeners.)

use harvester_cloud::controller::Action;
use harvester_cloud::{crd::LoadBalancer, lb};
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use serde_json::{Value, json};

use crate::{
    load_balancer::default_pool,
    world::{LbWorld, normal, requeue, typed, warning},
};

const NS: &str = "default";

/// A VM load balancer for the VMIs labelled `app: web`, port 80 to their 8080.
fn mk_vm_lb(name: &str) -> Value {
    json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1",
        "kind": "LoadBalancer",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "ipam": "pool", "workloadType": "vm",
            "listeners": [{"name": "http", "port": 80, "protocol": "TCP", "backendPort": 8080}],
            "backendServerSelector": {"app": ["web"]}
        }
    })
}

/// Where no kube-vip runs (the embedded backend): the reconciler announces the address itself.
async fn announcing() -> LbWorld {
    let mut w = LbWorld::with_settings(lb::Settings {
        fill_service_ingress: true,
        ..lb::Settings::default()
    })
    .await;
    w.add_pool(default_pool()).await;
    w
}

fn ready(lb: &LoadBalancer) -> (String, String, String) {
    let c = lb
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.r#type == "Ready"))
        .expect("a Ready condition");
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

fn ingress(svc: &Service) -> Vec<String> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|i| i.iter().filter_map(|i| i.ip.clone()).collect())
        .unwrap_or_default()
}

async fn service(w: &LbWorld, name: &str) -> Option<Service> {
    harvester_cloud::store::Api::<Service>::new(w.store.clone())
        .get(NS, name)
        .await
        .expect("reads the service")
}

async fn slice(w: &LbWorld, name: &str) -> Option<EndpointSlice> {
    harvester_cloud::store::Api::<EndpointSlice>::new(w.store.clone())
        .get(NS, name)
        .await
        .expect("reads the endpoint slice")
}

#[tokio::test]
async fn a_vm_load_balancer_gets_its_service_and_waits_for_kube_vip_to_announce_the_address() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    w.add_lb(mk_vm_lb("lb1")).await;

    assert_eq!(w.reconcile(NS, "lb1").await, requeue(30));

    let lb = w.lb(NS, "lb1").await;
    assert_eq!(
        ready(&lb),
        (
            "False".into(),
            "WaitingForExternalIP".into(),
            "service is waiting for external IP".into()
        )
    );
    let status = lb.status.expect("status");
    assert_eq!(status.allocated_address.ip, "192.168.0.10");
    assert_eq!(status.address, "", "nobody announces it yet");
    let svc = service(&w, "lb1").await.expect("its Service");
    assert_eq!(
        svc.spec.and_then(|s| s.type_).as_deref(),
        Some("LoadBalancer")
    );
    assert!(ingress(&service(&w, "lb1").await.expect("svc")).is_empty());
    assert_eq!(
        w.events(),
        [
            normal(
                "default/lb1",
                "Allocated",
                "allocated 192.168.0.10 from IP pool default"
            ),
            warning(
                "default/lb1",
                "WaitingForExternalIP",
                "service is waiting for external IP"
            ),
        ]
    );
}

#[tokio::test]
async fn a_vm_load_balancer_without_backends_is_refused_with_no_backend_servers() {
    let mut w = announcing().await;
    w.add_lb(mk_vm_lb("lb1")).await;

    assert_eq!(w.reconcile(NS, "lb1").await, Action::await_change());

    let lb = w.lb(NS, "lb1").await;
    assert_eq!(
        ready(&lb),
        (
            "False".into(),
            "NoBackendServers".into(),
            "no running backend servers".into()
        )
    );
    assert_eq!(lb.status.expect("status").address, "192.168.0.10");
    let svc = service(&w, "lb1").await.expect("its Service");
    assert_eq!(ingress(&svc), ["192.168.0.10"]);
    // Only upstream's dummy endpoint, which keeps kube-proxy from sending the traffic to the node.
    let slice = slice(&w, "lb1").await.expect("its EndpointSlice");
    let addresses: Vec<&str> = slice
        .endpoints
        .iter()
        .flat_map(|e| e.addresses.iter().map(String::as_str))
        .collect();
    assert_eq!(addresses, [lb::vm::endpoints::DUMMY_ADDRESS]);
    assert_eq!(
        w.events().last(),
        Some(&warning(
            "default/lb1",
            "NoBackendServers",
            "no running backend servers"
        ))
    );
}

#[tokio::test]
async fn a_service_of_its_name_that_is_not_its_own_is_refused_with_name_taken() {
    let mut w = announcing().await;
    let other: Service = typed(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": NS, "name": "lb1"},
        "spec": {"type": "ClusterIP", "ports": [{"port": 443}]}
    }));
    harvester_cloud::store::Api::<Service>::new(w.store.clone())
        .create(&other)
        .await
        .expect("creates a Service");
    w.add_lb(mk_vm_lb("lb1")).await;

    assert_eq!(w.reconcile(NS, "lb1").await, requeue(10));

    let message = "Service default/lb1 exists and is not this load balancer's; delete or rename it";
    assert_eq!(
        ready(&w.lb(NS, "lb1").await),
        ("False".into(), "NameTaken".into(), message.into())
    );
    assert_eq!(
        w.events().last(),
        Some(&warning("default/lb1", "NameTaken", message))
    );
    let svc = service(&w, "lb1").await.expect("the other Service");
    assert_eq!(
        svc.spec.and_then(|s| s.type_).as_deref(),
        Some("ClusterIP"),
        "left alone"
    );
}

#[tokio::test]
async fn a_health_check_that_cannot_run_is_refused_with_health_check_invalid() {
    let mut w = announcing().await;
    let mut lb = mk_vm_lb("lb1");
    lb["spec"]["healthCheck"] = json!({"port": 70000, "periodSeconds": 5, "timeoutSeconds": 3,
                                      "successThreshold": 1, "failureThreshold": 3});
    w.add_lb(lb).await;

    assert_eq!(w.reconcile(NS, "lb1").await, Action::await_change());

    let message = "healthcheck port 70000 is not a port";
    assert_eq!(
        ready(&w.lb(NS, "lb1").await),
        ("False".into(), "HealthCheckInvalid".into(), message.into())
    );
    assert_eq!(
        w.events().last(),
        Some(&warning("default/lb1", "HealthCheckInvalid", message))
    );
    assert!(service(&w, "lb1").await.is_none(), "nothing is made for it");
}

#[tokio::test]
async fn a_deleted_vm_load_balancer_takes_its_service_and_endpoint_slice_and_releases_its_address()
{
    let mut w = announcing().await;
    w.add_lb(mk_vm_lb("lb1")).await;
    w.reconcile(NS, "lb1").await;
    w.events();
    assert!(service(&w, "lb1").await.is_some() && slice(&w, "lb1").await.is_some());

    w.delete_lb(NS, "lb1").await;
    assert_eq!(w.reconcile(NS, "lb1").await, Action::await_change());

    assert!(w.try_lb(NS, "lb1").await.is_none());
    assert!(service(&w, "lb1").await.is_none());
    assert!(slice(&w, "lb1").await.is_none());
    assert_eq!(
        w.events(),
        [normal(
            "default/lb1",
            "Released",
            "released 192.168.0.10 to IP pool default"
        )]
    );
}
