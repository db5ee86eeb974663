//! How long a cloud provider takes to give N guest Services of type LoadBalancer their addresses
//! on real control planes (a Harvester cluster and a guest cluster, kube-apiserver and etcd on
//! loopback): ours (`harvester-cloud ccm`) and, when its path is given, upstream's
//! (harvester/cloud-provider-harvester, the second binary `scripts/interop.sh build DIR` prints),
//! each against this service's load balancer controller on the Harvester side.
//!
//! `scripts/control-plane.sh with 2 cargo bench --bench kube_guest_converge -- --services N
//! [--upstream-ccm PATH] [--limit SECONDS]` (200 Services, 300 s by default).
//!
//! Setup (not timed), the same for each cloud provider, on freshly leased control planes: the
//! Harvester cluster seeded as the tests seed it, with this service's load balancer reconcilers
//! running (in this process) and one global IPPool (a /16); a cloud-config issued by the service's
//! cloud-config API for guest cluster `bench` in `gc-test`; the guest cluster seeded as the interop
//! harness seeds it (one Ready node), with the harness's kube-vip stand-in running (upstream's
//! cloud provider only asks kube-vip to announce the address, and reads it back from the
//! Service's ingress; ours writes the ingress itself), and N Services of type LoadBalancer. Timed:
//! the cloud provider starts cold as its own process (the command lines of
//! `scripts/interop/peers.json`, as a guest ServiceAccount bound to `cluster-admin`), until every
//! Service has an ingress address or the limit has passed. The two run one after the other, never
//! at once. Each reports its process's CPU time and peak RSS, its API requests per Service on
//! both clusters by verb and by response status, the addresses held by more than one Service,
//! and its log lines reporting an error; then a table of upstream's figures over ours.

#[path = "../tests/support/mod.rs"]
#[allow(unused_imports, unused_macros)]
mod support;

#[path = "support/peers.rs"]
#[allow(dead_code)]
mod peers;
#[path = "support/usage.rs"]
#[allow(dead_code)]
mod usage;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use harvester_cloud::{
    controller::leader::AlwaysLeader,
    lb::{self, vm::service::ingress_ip},
};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::json;
use support::{Backend, KubeBackend, control_plane::ControlPlane, kube_env};
use tokio_util::sync::CancellationToken;

/// The guest cluster's namespace on Harvester, and its name.
const NS: &str = "gc-test";
const CLUSTER: &str = "bench";

fn arg(name: &str, default: usize) -> usize {
    peers::flag(name)
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} takes a number"))
        })
        .unwrap_or(default)
}

enum Ccm<'a> {
    Ours,
    Upstream(&'a str),
}

fn main() {
    let services = arg("--services", 200);
    let limit = Duration::from_secs(arg("--limit", 300) as u64);
    let upstream = peers::flag("--upstream-ccm");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        println!(
            "kube_guest_converge: {services} Services of type LoadBalancer in one guest cluster, the cloud provider started cold as its own process{}, at most {} s each",
            if upstream.is_some() {
                "; ours, then upstream's, one after the other on freshly leased control planes"
            } else {
                ""
            },
            limit.as_secs()
        );
        let work = tempfile::tempdir().expect("a work dir");
        let ours = one_side(Ccm::Ours, services, limit, work.path()).await;
        ours.print("Service");
        if let Some(path) = &upstream {
            let theirs = one_side(Ccm::Upstream(path), services, limit, work.path()).await;
            theirs.print("Service");
            peers::print_ratios(&ours, &theirs, "Service");
        }
    });
}

/// The Harvester cluster's side: this service on the kube backend, its load balancer
/// reconcilers, a global pool, and a cloud-config for the guest cluster (its path).
async fn harvester(
    cp: ControlPlane,
    dir: &std::path::Path,
) -> (
    KubeBackend,
    CancellationToken,
    tokio::task::JoinHandle<()>,
    String,
) {
    // Kubeconfigs issued here point at the Harvester cluster's API server.
    let url = cp.server.clone();
    let b = KubeBackend::start_on(cp, &["--server-url", &url]).await;
    let stop = CancellationToken::new();
    let reconcilers = tokio::spawn({
        let (store, stop) = (b.service_store(), stop.clone());
        async move {
            // The service's own default on this backend (`--lb-concurrency` unset); until
            // 2026-12-07 this took the embedded one (then 1,024).
            let settings = lb::Settings {
                concurrency: lb::CONCURRENCY_KUBE,
                ..lb::Settings::default()
            };
            lb::run(store, settings, Arc::new(AlwaysLeader), stop).await;
        }
    });
    let pool = json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "IPPool",
        "metadata": {"name": "bench-guest", "labels": {
            "loadbalancer.harvesterhci.io/global-ip-pool": "true",
            "loadbalancer.harvesterhci.io/vid": "0"}},
        "spec": {
            "ranges": [{"subnet": "10.200.0.0/16"}],
            "selector": {"scope": [{"project": "*", "namespace": "*", "guestCluster": "*"}]}
        }
    });
    kube_env::apply(&b.client, &pool, "ippools").await;
    let reply = b
        .post(&json!({"namespace": NS, "serviceAccountName": CLUSTER}).to_string())
        .await;
    let cloud_config = dir.join("cloud-config");
    std::fs::write(&cloud_config, reply.kubeconfig()).expect("writes the cloud-config");
    (b, stop, reconcilers, cloud_config.display().to_string())
}

async fn create_services(client: &kube::Client, n: usize) {
    peers::create_all("Service", (0..n).map(|i| {
            let api: Api<Service> = Api::namespaced(client.clone(), "default");
            async move {
                let svc: Service = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": format!("bench{i}"), "namespace": "default"},
                    "spec": {"type": "LoadBalancer", "ports": [{"name": "p", "port": 80, "protocol": "TCP"}]}
                }))
                .expect("a Service");
                api.create(&PostParams::default(), &svc).await.is_ok()
            }
    }))
    .await;
}

/// One cloud provider on freshly leased control planes: set up, start, wait, count.
async fn one_side(
    ccm: Ccm<'_>,
    services: usize,
    limit: Duration,
    work: &std::path::Path,
) -> peers::Figures {
    let tag = match ccm {
        Ccm::Ours => "ours",
        Ccm::Upstream(_) => "upstream",
    };
    let dir = work.join(tag);
    std::fs::create_dir_all(&dir).expect("a dir");
    let (host, guest) = ControlPlane::lease_two().await;
    let (b, stop, reconcilers, cloud_config) = harvester(host, &dir).await;
    peers::seed_guest(&guest);
    let (ccm_user, kubeconfig) =
        peers::admin_account(&guest, "kube-system", "bench-ccm", &dir).await;
    let kubeconfig = kubeconfig.display().to_string();
    let vip = peers::kube_vip(&guest, "guest", &dir);
    let setup = Instant::now();
    create_services(&guest.admin, services).await;
    eprintln!(
        "{tag}: created {services} Services in {:.1?}",
        setup.elapsed()
    );
    let (who, cmd) = match ccm {
        Ccm::Ours => (
            "ours (harvester-cloud ccm)".to_string(),
            peers::command(
                "ours-ccm",
                &[
                    ("ours", support::binary::BIN),
                    ("cloud_config", &cloud_config),
                    ("kubeconfig", &kubeconfig),
                    ("cluster", CLUSTER),
                    ("metrics_port", "0"),
                ],
            ),
        ),
        Ccm::Upstream(bin) => (
            format!("upstream's ({bin})"),
            peers::command(
                "upstream-ccm",
                &[
                    ("ccm_bin", bin),
                    ("cloud_config", &cloud_config),
                    ("kubeconfig", &kubeconfig),
                    ("cluster", CLUSTER),
                ],
            ),
        ),
    };
    let host_from = b.cp.audit().len();
    let guest_from = guest.audit().len();
    let all: Api<Service> = Api::namespaced(guest.admin.clone(), "default");
    let started = Instant::now();
    let mut peer = peers::Peer::start(&format!("{tag}-ccm"), cmd, &dir);
    let (done, took, usage) = peers::converge(&mut peer, services, limit, started, async || {
        let list = all.list(&ListParams::default()).await.expect("lists");
        list.items.iter().filter_map(ingress_ip).count()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Its requests on both clusters: as the guest's account, and as the cloud-config's.
    let mut requests = peers::Requests::default();
    requests.add(
        "guest",
        peers::requests(&guest.audit()[guest_from..], &[&ccm_user]),
    );
    requests.add(
        "Harvester",
        peers::requests(
            &b.cp.audit()[host_from..],
            &[&format!("system:serviceaccount:{NS}:{CLUSTER}")],
        ),
    );
    let list = all.list(&ListParams::default()).await.expect("lists");
    let addresses: Vec<String> = list.items.iter().filter_map(ingress_ip).collect();
    let duplicates = peers::duplicates(addresses.iter().map(String::as_str));
    let lbs = harvester_lbs(&b.client).await;
    eprintln!("{tag}: {lbs} LoadBalancers in {NS} on Harvester");
    let error_lines = peer.error_lines();
    peer.stop();
    vip.stop();
    stop.cancel();
    reconcilers.await.expect("the reconcilers stop");
    peers::Figures {
        who,
        n: services,
        done,
        took,
        usage,
        requests,
        duplicates,
        error_lines,
    }
}

async fn harvester_lbs(client: &kube::Client) -> usize {
    let ar = kube_env::api_resource(
        "loadbalancer.harvesterhci.io/v1beta1",
        "LoadBalancer",
        "loadbalancers",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &ar);
    api.list(&ListParams::default())
        .await
        .map(|l| l.items.len())
        .unwrap_or(0)
}
