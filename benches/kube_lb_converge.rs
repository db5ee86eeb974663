//! How long the reconcilers take to converge LoadBalancers from a cold start on the Kubernetes
//! backend, against a real control plane (kube-apiserver and etcd on loopback), with the service
//! holding the chart's RBAC; how many API requests each LoadBalancer costs (from the API server's
//! audit log), our process's memory, and what the API server reports about its own latency.
//!
//! Setup (not timed): 7 IPPools, each scoped to one seeded namespace, and 2,000 LoadBalancers spread over
//! those namespaces, created by the admin as `kubectl apply` would (no status), as the chart's
//! mutating webhook leaves them (the reconciler's finalizer on; `--unadmitted`: without it). Timed:
//! the reconcilers start (list, watch, empty caches) until every LoadBalancer is Ready with an
//! address.
//!
//! `scripts/control-plane.sh with 1 cargo bench --bench kube_lb_converge` (optionally
//! `-- --lbs N --pools P --concurrency C --unadmitted`).
//!
//! Beside upstream's controller (harvester/load-balancer-harvester, built by
//! `scripts/interop.sh build DIR`, which prints its path):
//! `scripts/control-plane.sh with 2 cargo bench --bench kube_lb_converge -- --lbs 1000 --pools 5
//! --upstream-controller PATH --harvester-crds DIR/load-balancer-harvester/crds [--limit SECONDS]`.
//! Then both controllers run as processes of their own, one after the other (never at once: they
//! would share the two cores), each started cold on a control plane of its own (with one control
//! plane, the same one reset in between) holding the same pools and LoadBalancers, seeded as
//! above: ours as `harvester-cloud serve` with the chart's ServiceAccount on this repository's
//! CRDs, upstream's with `cluster-admin` on Harvester's CRDs (`--harvester-crds`), both with the
//! command lines of `scripts/interop/peers.json`. Timed: from the process's start until every
//! LoadBalancer has an allocated address, or `--limit` (300 s) has passed, when the count so far is
//! reported. Each side reports its CPU time and peak RSS (`/proc/<pid>`), its API requests per
//! LoadBalancer by verb and by response status (429s included), the addresses held by more than
//! one LoadBalancer, and its log lines reporting an error; then a table of upstream's figures over
//! ours.

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
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use harvester_cloud::{controller::leader::AlwaysLeader, lb};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::json;
use support::{Backend, KubeBackend, kube_env};
use tokio_util::sync::CancellationToken;

/// Namespaces the seed makes (kube_env::NAMESPACES), one per pool.
const NAMESPACES: &[&str] = &[
    "default",
    "gc-test",
    "a",
    "a-b",
    "ns1",
    "ns2",
    "cattle-system",
];

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// This process's resident set now and at its peak, in MiB (`/proc/self/status`).
fn rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn ready(lb: &DynamicObject) -> bool {
    let status = &lb.data["status"];
    let ready = status["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    });
    ready
        && status["allocatedAddress"]["ip"]
            .as_str()
            .is_some_and(|ip| !ip.is_empty())
}

/// `apiserver_request_duration_seconds` sums and counts by verb and resource, from `/metrics`.
async fn apiserver_latency(client: &kube::Client) -> BTreeMap<(String, String), (f64, f64)> {
    let req = axum::http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let text = client.request_text(req).await.unwrap_or_default();
    let mut out: BTreeMap<(String, String), (f64, f64)> = BTreeMap::new();
    for line in text.lines() {
        let (sum, rest) =
            if let Some(r) = line.strip_prefix("apiserver_request_duration_seconds_sum{") {
                (true, r)
            } else if let Some(r) = line.strip_prefix("apiserver_request_duration_seconds_count{") {
                (false, r)
            } else {
                continue;
            };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |k: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{k}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        let resource = label("resource");
        if !["loadbalancers", "ippools", "events", "leases"].contains(&resource.as_str()) {
            continue;
        }
        let mut verb = label("verb");
        let sub = label("subresource");
        if !sub.is_empty() {
            verb = format!("{verb} {sub}");
        }
        let value: f64 = value.trim().parse().unwrap_or(0.0);
        let entry = out.entry((resource, verb)).or_default();
        if sum {
            entry.0 += value;
        } else {
            entry.1 += value;
        }
    }
    out
}

/// The API server's answers to the service's requests by status code: a 429 is a request that API
/// Priority and Fairness refused (the client then sent it again, so it is counted among the requests
/// too), a 409 a write on a stale copy.
fn by_status(requests: &[support::control_plane::Audited]) -> BTreeMap<u16, usize> {
    let mut out = BTreeMap::new();
    for r in requests {
        *out.entry(r.code).or_default() += 1;
    }
    out
}

fn print_statuses(requests: &[support::control_plane::Audited]) {
    let statuses = by_status(requests);
    let list: Vec<String> = statuses
        .iter()
        .map(|(code, n)| format!("{code}: {n}"))
        .collect();
    println!(
        "  answers by status: {}; 429 (too many requests): {}",
        list.join(", "),
        statuses.get(&429).copied().unwrap_or(0)
    );
}

/// A seeded LoadBalancer's metadata: `admitted`, as the chart's mutating webhook stores it (with
/// the reconciler's finalizer; `tests/kube_webhooks.rs` checks that it does), else as a cluster
/// without the webhook, or from before it, has it (`--unadmitted`).
fn lb_metadata(name: &str, namespace: &str, admitted: bool) -> serde_json::Value {
    let mut meta = json!({"name": name, "namespace": namespace});
    if admitted {
        meta["finalizers"] = json!([harvester_cloud::crd::LB_FINALIZER]);
    }
    meta
}

async fn seed(client: &kube::Client, lbs: usize, pools: usize, admitted: bool) {
    let pool_ar =
        kube_env::api_resource("loadbalancer.harvesterhci.io/v1beta1", "IPPool", "ippools");
    let lb_ar = kube_env::api_resource(
        "loadbalancer.harvesterhci.io/v1beta1",
        "LoadBalancer",
        "loadbalancers",
    );
    let pool_api: Api<DynamicObject> = Api::all_with(client.clone(), &pool_ar);
    for p in 0..pools {
        let pool: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "IPPool",
            "metadata": {"name": format!("bench{p}")},
            "spec": {
                "ranges": [{"subnet": format!("10.{}.0.0/16", 100 + p)}],
                "selector": {"scope": [{"project": "*", "namespace": NAMESPACES[p % NAMESPACES.len()], "guestCluster": "*"}]}
            }
        }))
        .expect("a pool");
        pool_api
            .create(&PostParams::default(), &pool)
            .await
            .expect("creates a pool");
    }
    peers::create_all(
        "LoadBalancer",
        (0..lbs).map(|i| {
            let client = client.clone();
            let lb_ar = lb_ar.clone();
            async move {
                let ns = NAMESPACES[i % pools % NAMESPACES.len()];
                let api: Api<DynamicObject> = Api::namespaced_with(client, ns, &lb_ar);
                let lb: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
                    "metadata": lb_metadata(&format!("bench{i}"), ns, admitted),
                    "spec": {"workloadType": "cluster", "ipam": "pool"}
                }))
                .expect("a load balancer");
                api.create(&PostParams::default(), &lb).await.is_ok()
            }
        }),
    )
    .await;
}

fn main() {
    let lbs = arg("--lbs", 2_000);
    let admitted = !std::env::args().any(|a| a == "--unadmitted");
    // One pool per seeded namespace at most: each pool is scoped to one.
    let pools = arg("--pools", NAMESPACES.len()).clamp(1, NAMESPACES.len());
    // The service's own default on this backend (`--lb-concurrency` unset), not the embedded one.
    let concurrency =
        u16::try_from(arg("--concurrency", usize::from(lb::CONCURRENCY_KUBE))).unwrap_or(u16::MAX);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        if let Some(upstream) = peers::flag("--upstream-controller") {
            beside_upstream(lbs, pools, &upstream).await;
            return;
        }
        let b = KubeBackend::start().await;
        let version = b.client.apiserver_version().await.expect("a version");
        let setup = Instant::now();
        seed(&b.client, lbs, pools, admitted).await;
        eprintln!(
            "seeded {lbs} load balancers over {pools} pools in {:.1?}",
            setup.elapsed()
        );
        let ours = || {
            b.cp.audit()
                .into_iter()
                .filter(|r| r.user == kube_env::SERVICE_USER)
                .collect::<Vec<_>>()
        };
        let before = ours().len();
        let latency_before = apiserver_latency(&b.client).await;
        let (rss_before, _) = rss_mib();

        let started = Instant::now();
        let stop = CancellationToken::new();
        let reconcilers = tokio::spawn(lb::run(
            b.service_store(),
            lb::Settings {
                concurrency,
                ..lb::Settings::default()
            },
            Arc::new(AlwaysLeader),
            stop.clone(),
        ));
        let lb_ar = kube_env::api_resource(
            "loadbalancer.harvesterhci.io/v1beta1",
            "LoadBalancer",
            "loadbalancers",
        );
        let all: Api<DynamicObject> = Api::all_with(b.client.clone(), &lb_ar);
        let mut peak_rss: f64 = 0.0;
        loop {
            let list = all.list(&ListParams::default()).await.expect("lists");
            peak_rss = peak_rss.max(rss_mib().0);
            let done = list.items.iter().filter(|l| ready(l)).count();
            if done == lbs {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(600),
                "did not converge: {done}/{lbs}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let took = started.elapsed();
        // Events are written behind the reconciles: wait for the queue to drain before counting.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let requests = ours();
        let requests = &requests[before..];
        let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
        for r in requests {
            *by_kind
                .entry(format!("{} {}", r.verb, r.resource))
                .or_default() += 1;
        }
        let latency_after = apiserver_latency(&b.client).await;
        stop.cancel();
        reconcilers.await.expect("reconcilers stop");
        let (_, hwm) = rss_mib();
        println!(
            "kube_lb_converge: {lbs} load balancers over {pools} pools ({}) converged in {:.2} s on kube-apiserver {} ({concurrency} reconciles at once); {:.0} load balancers/s",
            if admitted { "admitted: the finalizer on" } else { "unadmitted" },
            took.as_secs_f64(),
            version.git_version,
            lbs as f64 / took.as_secs_f64()
        );
        println!(
            "  API requests of the service: {} in all, {:.2} per load balancer",
            requests.len(),
            requests.len() as f64 / lbs as f64
        );
        for (what, n) in &by_kind {
            println!("    {what:<32} {n:>6} ({:.2} per load balancer)", *n as f64 / lbs as f64);
        }
        print_statuses(requests);
        println!(
            "  our RSS: {rss_before:.0} MiB before the reconcilers, {peak_rss:.0} MiB at most while they converged (process peak {hwm:.0} MiB; the bench's own lists included)"
        );
        println!("  kube-apiserver's own latency during the run (apiserver_request_duration_seconds):");
        for (key, (sum, count)) in &latency_after {
            let (s0, c0) = latency_before.get(key).copied().unwrap_or_default();
            let (sum, count) = (sum - s0, count - c0);
            if count >= 1.0 {
                println!(
                    "    {:<32} {:>6} requests, mean {:>6.2} ms",
                    format!("{} {}", key.1, key.0),
                    count,
                    1000.0 * sum / count
                );
            }
        }
    });
}

/// Which controller a run of [`one_side`] starts.
enum Side<'a> {
    Ours,
    Upstream {
        bin: &'a str,
        crds: &'a std::path::Path,
    },
}

/// Ours, then upstream's controller, on the same inputs (the module's doc says how).
async fn beside_upstream(lbs: usize, pools: usize, upstream: &str) {
    let crds = peers::flag("--harvester-crds").unwrap_or_else(|| {
        panic!("--upstream-controller needs --harvester-crds DIR (load-balancer-harvester's crds/)")
    });
    let limit = Duration::from_secs(arg("--limit", 300) as u64);
    let work = tempfile::tempdir().expect("a work dir");
    let shared = peers::control_planes() < 2;
    println!(
        "kube_lb_converge beside upstream: {lbs} LoadBalancers over {pools} pools, each controller started cold as its own process, one after the other ({}), at most {} s each",
        if shared {
            "on one control plane, reset in between"
        } else {
            "each on a control plane of its own"
        },
        limit.as_secs()
    );
    let (ours, cp) = one_side(Side::Ours, lbs, pools, limit, work.path()).await;
    // The second lease takes the other control plane while this one is held.
    let held = (!shared).then_some(cp);
    let side = Side::Upstream {
        bin: upstream,
        crds: std::path::Path::new(&crds),
    };
    let (theirs, _) = one_side(side, lbs, pools, limit, work.path()).await;
    drop(held);
    ours.print("LoadBalancer");
    theirs.print("LoadBalancer");
    peers::print_ratios(&ours, &theirs, "LoadBalancer");
}

/// One controller on a freshly leased control plane: seed, start, wait until every
/// LoadBalancer is allocated or `limit` passes, count.
async fn one_side(
    side: Side<'_>,
    lbs: usize,
    pools: usize,
    limit: Duration,
    work: &std::path::Path,
) -> (peers::Figures, support::control_plane::ControlPlane) {
    let cp = support::control_plane::ControlPlane::lease().await;
    let (who, tag) = match side {
        Side::Ours => ("ours (harvester-cloud serve)".to_string(), "ours"),
        Side::Upstream { bin, .. } => (format!("upstream's ({bin})"), "upstream"),
    };
    if let Side::Upstream { crds, .. } = side {
        peers::harvester_crds(&cp, crds).await;
    }
    let setup = Instant::now();
    // Both controllers get the same objects, as a cluster without either's webhook stores them.
    seed(&cp.admin, lbs, pools, false).await;
    eprintln!(
        "{tag}: seeded {lbs} load balancers over {pools} pools in {:.1?}",
        setup.elapsed()
    );
    let dir = work.join(tag);
    std::fs::create_dir_all(&dir).expect("a dir");
    let (user, cmd) = match side {
        Side::Ours => {
            let kubeconfig = dir.join("service.kubeconfig");
            std::fs::write(&kubeconfig, kube_env::service_kubeconfig(&cp).await)
                .expect("writes a kubeconfig");
            let data = dir.join("data");
            let cmd = peers::command(
                "ours-serve",
                &[
                    ("ours", support::binary::BIN),
                    ("data", &data.display().to_string()),
                    ("kubeconfig", &kubeconfig.display().to_string()),
                    ("port", "0"),
                    ("metrics_port", "0"),
                ],
            );
            (kube_env::SERVICE_USER.to_string(), cmd)
        }
        Side::Upstream { bin, .. } => {
            let (user, kubeconfig) =
                peers::admin_account(&cp, "harvester-system", "harvester-load-balancer", &dir)
                    .await;
            let kubeconfig = kubeconfig.display().to_string();
            let cmd = peers::command(
                "upstream-lb",
                &[("lb_bin", bin), ("kubeconfig", &kubeconfig)],
            );
            (user, cmd)
        }
    };
    let lb_ar = kube_env::api_resource(
        "loadbalancer.harvesterhci.io/v1beta1",
        "LoadBalancer",
        "loadbalancers",
    );
    let all: Api<DynamicObject> = Api::all_with(cp.admin.clone(), &lb_ar);
    let address = |lb: &DynamicObject| {
        lb.data["status"]["allocatedAddress"]["ip"]
            .as_str()
            .filter(|ip| !ip.is_empty())
            .map(str::to_string)
    };
    let from = cp.audit().len();
    let started = Instant::now();
    let mut peer = peers::Peer::start(tag, cmd, &dir);
    let (done, took, usage) = peers::converge(&mut peer, lbs, limit, started, async || {
        let list = all.list(&ListParams::default()).await.expect("lists");
        list.items.iter().filter_map(address).count()
    })
    .await;
    // Events are written behind the allocations: let them drain before counting.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let audit = cp.audit();
    let requests = peers::requests(&audit[from..], &[&user]);
    let list = all.list(&ListParams::default()).await.expect("lists");
    let addresses: Vec<String> = list.items.iter().filter_map(address).collect();
    let duplicates = peers::duplicates(addresses.iter().map(String::as_str));
    let error_lines = peer.error_lines();
    peer.stop();
    let figures = peers::Figures {
        who,
        n: lbs,
        done,
        took,
        usage,
        requests,
        duplicates,
        error_lines,
    };
    (figures, cp)
}
