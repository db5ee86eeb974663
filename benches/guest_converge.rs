//! How long 2,000 Services of type LoadBalancer in one guest cluster take, on the embedded backend
//! (durability `full`), from their creation to the last address written back.
//!
//! Setup (not timed): a fresh data directory, one global IPPool (a /16), the load balancer and guest
//! reconcilers running as `serve` runs them. Timed: the Services are PUT through the HTTP router (32
//! requests in flight), until every one carries its address (`kube-vip.io/loadbalancerIPs` and
//! `status.loadBalancer.ingress`); then every address is checked to be distinct and held in the pool.
//!
//! `cargo bench --bench guest_converge` (optionally `-- <services> <guest concurrency>`).

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{body::Body, http::Request};
use clap::Parser;
use futures::StreamExt;
use harvester_cloud::{
    app,
    config::{Cli, Command},
    controller::leader::AlwaysLeader,
    crd::{self, keys},
    guest::{
        self,
        clusters::{ClusterKey, ClusterStore},
    },
    lb,
    store::{Api, LabelSelector, ObjectStore},
};
use k8s_openapi::api::core::v1::Service;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

const NS: &str = "gc-bench";
const CLUSTER: &str = "bench";

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let services = args.first().copied().unwrap_or(2_000);
    let concurrency = args
        .get(1)
        .and_then(|c| u16::try_from(*c).ok())
        .unwrap_or(guest::reconcile::Settings::default().concurrency);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(services, concurrency));
}

async fn call(router: &axum::Router, token: &str, method: &str, uri: &str, body: String) -> u16 {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {token}"))
        .body(Body::from(body))
        .expect("request");
    router
        .clone()
        .oneshot(req)
        .await
        .expect("infallible")
        .status()
        .as_u16()
}

/// How many Services carry their address, and those addresses.
async fn addressed(guest: &Api<Service>) -> (usize, Vec<String>) {
    let services = guest
        .list(None, &LabelSelector::everything())
        .await
        .expect("lists");
    let ips: Vec<String> = services
        .iter()
        .filter_map(|s| {
            let annotated = s
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(keys::KUBE_VIP_IPS))?;
            let ingress = guest::mapping::ingress_ip(s)?;
            (*annotated == ingress).then_some(ingress)
        })
        .collect();
    (ips.len(), ips)
}

async fn run(services: usize, concurrency: u16) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cli = Cli::try_parse_from([
        "harvester-cloud",
        "--data-dir",
        &dir.path().display().to_string(),
        "serve",
        "--http",
        "--vip",
        "192.168.1.10",
    ])
    .expect("arguments");
    let Command::Serve(serve) = cli.command else {
        unreachable!()
    };
    let embedded = app::open_embedded(&cli.global, &serve)
        .await
        .expect("opens the embedded store");
    let token = embedded.admin_token.as_ref().expect("first start").expose();
    let router = harvester_cloud::http::router(embedded.service.state.clone());
    let guests = embedded
        .service
        .state
        .guests
        .clone()
        .expect("guest clusters");
    let pool = json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "IPPool",
        "metadata": {"name": "bench"},
        "spec": {"ranges": [{"subnet": "10.100.0.0/16"}],
                 "selector": {"scope": [{"project": "*", "namespace": "*", "guestCluster": "*"}]}}
    });
    assert_eq!(
        call(
            &router,
            &token,
            "POST",
            "/v1/harvester/loadbalancer.harvesterhci.io.ippools",
            pool.to_string()
        )
        .await,
        201
    );
    let stop = CancellationToken::new();
    let lb_task = tokio::spawn(lb::run(
        embedded.service.state.store.clone(),
        lb::Settings::default(),
        Arc::new(AlwaysLeader),
        stop.clone(),
    ));
    let guest_task = tokio::spawn(guest::clusters::run(
        guests.store().clone(),
        guests.harvester().clone(),
        guest::reconcile::Settings {
            concurrency,
            ..Default::default()
        },
        stop.clone(),
    ));
    let guest_api = Api::<Service>::new(Arc::new(ClusterStore::new(
        embedded.service.state.store.clone(),
        ClusterKey::new(NS, CLUSTER).expect("valid"),
    )) as Arc<dyn ObjectStore>);

    let started = Instant::now();
    let created = futures::stream::iter(0..services)
        .map(|i| {
            let (router, token) = (router.clone(), token.clone());
            async move {
                let svc = json!({
                    "apiVersion": "v1", "kind": "Service",
                    "metadata": {"namespace": "default", "name": format!("svc{i}")},
                    "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}
                });
                call(
                    &router,
                    &token,
                    "PUT",
                    &format!("/v1/harvester/guestclusters/{NS}/{CLUSTER}/services/default/svc{i}"),
                    svc.to_string(),
                )
                .await
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<u16>>()
        .await;
    assert!(created.iter().all(|s| *s == 201), "every PUT creates");
    let all_created = started.elapsed();
    let ips = loop {
        let (done, ips) = addressed(&guest_api).await;
        if done == services {
            break ips;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let converged = started.elapsed();

    let distinct: HashSet<&String> = ips.iter().collect();
    assert_eq!(distinct.len(), services, "no address given twice");
    let held = crd::pool_api(embedded.service.state.store.clone())
        .get("", "bench")
        .await
        .expect("reads")
        .expect("exists")
        .allocated();
    assert!(
        ips.iter().all(|ip| held.contains_key(ip)),
        "every address is held in the pool"
    );
    println!(
        "{services} services in one guest cluster (guest concurrency {concurrency}): all created in {:.2} s, last address after {:.2} s ({:.0} services/s)",
        all_created.as_secs_f64(),
        converged.as_secs_f64(),
        services as f64 / converged.as_secs_f64()
    );
    stop.cancel();
    let _ = lb_task.await;
    let _ = guest_task.await;
    embedded.store.close().await;
}
