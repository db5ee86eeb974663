//! How long 2,000 Services of type LoadBalancer in one guest cluster take, on the embedded backend
//! (durability `full`), from their creation to the last address written back.
//!
//! Setup (not timed): a fresh data directory, one global IPPool (a /16), the load balancer and guest
//! reconcilers running as `serve` runs them. Timed: the Services are PUT through the HTTP router (32
//! requests in flight), until every one carries its address (`kube-vip.io/loadbalancerIPs` and
//! `status.loadBalancer.ingress`); then every address is checked to be distinct and held in the pool.
//!
//! `cargo bench --bench guest_converge` (optionally `-- <services> <guest concurrency>`).

#[path = "support/usage.rs"]
#[allow(dead_code)]
mod usage;

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Instant,
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
    store::{Kind, ObjectStore},
};
use k8s_openapi::api::core::v1::Service;
use kube::runtime::watcher::Event as E;
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

/// The address a Service carries, when it carries one: the annotation and the ingress agree.
fn address_of(s: &Service) -> Option<String> {
    let annotated = s
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::KUBE_VIP_IPS))?;
    let ingress = guest::mapping::ingress_ip(s)?;
    (*annotated == ingress).then_some(ingress)
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
    let guest_view: Arc<dyn ObjectStore> = Arc::new(ClusterStore::new(
        embedded.service.state.store.clone(),
        ClusterKey::new(NS, CLUSTER).expect("valid"),
    ));

    // The end is seen on a watch of the guest cluster's Services (a list of every Service each
    // time would be a load of its own at 10,000).
    let (seen_tx, mut seen_rx) = tokio::sync::watch::channel(0usize);
    let addresses = tokio::spawn(async move {
        let mut ips: HashMap<String, String> = HashMap::new();
        let events = harvester_cloud::store::watcher::watcher::<Service>(
            guest_view,
            Kind::of::<Service>(),
            None,
        );
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            let (E::Apply(s) | E::InitApply(s)) = event.expect("watches") else {
                continue;
            };
            let key = format!("{:?}/{:?}", s.metadata.namespace, s.metadata.name);
            if let Some(ip) = address_of(&s) {
                ips.insert(key, ip);
                seen_tx.send_replace(ips.len());
                if ips.len() == services {
                    return ips.into_values().collect::<Vec<String>>();
                }
            }
        }
        panic!("the watch ended");
    });

    usage::profile_window(true);
    let started = Instant::now();
    let cpu_before = usage::own().cpu;
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
    seen_rx
        .wait_for(|n| *n == services)
        .await
        .expect("the watch runs until every Service has its address");
    let converged = started.elapsed();
    let cpu = usage::own().cpu - cpu_before;
    usage::profile_window(false);
    let ips = addresses.await.expect("the watch task ends");

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
    println!(
        "CPU from the first PUT to the last address: {cpu:.2} s, {:.2} ms per Service",
        1000.0 * cpu / services as f64
    );
    let relists: Vec<String> = harvester_cloud::metrics::encode()
        .lines()
        .filter(|l| l.starts_with("harvester_cloud_watch_relists_total"))
        .map(str::to_string)
        .collect();
    println!("watchers that listed again: {relists:?}");
    let writes: u64 = embedded
        .service
        .state
        .store
        .list(&Kind::of::<Service>(), Some("none"), &Default::default())
        .await
        .expect("lists")
        .resource_version
        .parse()
        .expect("a number");
    println!(
        "store writes (resourceVersions) per Service: {:.1}",
        writes as f64 / services as f64
    );
    stop.cancel();
    let _ = lb_task.await;
    let _ = guest_task.await;
    embedded.store.close().await;
}
