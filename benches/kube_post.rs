//! POST latency of the cloud-config API on the Kubernetes backend, against a real control plane
//! (kube-apiserver, etcd and kube-controller-manager's token controller, on loopback), and how many
//! API requests one POST makes (from the API server's audit log).
//!
//! Run with `scripts/control-plane.sh with 1 cargo bench --bench kube_post` (`-- --requests N` to
//! change the sample size). Each POST creates a new account, sequentially, through the service's
//! router, with the service holding the chart's RBAC: spaced 250 ms apart, and back to back.

#[path = "../tests/support/mod.rs"]
#[allow(unused_imports, unused_macros)]
mod support;

use std::time::{Duration, Instant};

use support::{Backend, KubeBackend, account, kube_env};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// `n` POSTs of new accounts, `gap` apart (zero: back to back).
async fn measure(b: &KubeBackend, what: &str, n: usize, gap: Duration) {
    // Warm up: connection pool, role and VIP lookups.
    for i in 0..5 {
        b.post(&account("gc-test", &format!("{what}-warm-{i}")))
            .await
            .kubeconfig();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ours = || {
        b.cp.audit()
            .into_iter()
            .filter(|r| r.user == kube_env::SERVICE_USER)
            .count()
    };
    let before = ours();
    let mut latencies = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        b.post(&account("gc-test", &format!("{what}-{i}")))
            .await
            .kubeconfig();
        latencies.push(t.elapsed());
        tokio::time::sleep(gap).await;
    }
    let requests = ours() - before;
    latencies.sort();
    println!(
        "{what:>13}: {n} POSTs, median {:>6.2} ms, p99 {:>6.2} ms, {:.1} API requests per POST",
        pct(&latencies, 0.5),
        pct(&latencies, 0.99),
        requests as f64 / n as f64
    );
}

fn main() {
    let smoke = !std::env::args().any(|a| a == "--bench");
    let n = if smoke { 5 } else { arg("--requests", 200) };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let b = KubeBackend::start().await;
        let version = b.client.apiserver_version().await.expect("a version");
        println!(
            "harvester-cloud POST on the Kubernetes backend against kube-apiserver {} and the real token controller (sequential, new account each)",
            version.git_version
        );
        // kube-controller-manager's own client is limited to 20 requests/s (burst 30, the
        // defaults), and its token controller spends two per token: back to back, POSTs queue
        // behind that; spaced as a dashboard user sends them, they do not.
        measure(&b, "spaced-250ms", n.min(60), Duration::from_millis(250)).await;
        measure(&b, "back-to-back", n, Duration::ZERO).await;
        println!("Harvester v1.9 waits at least 1000 ms per POST (a 1 s ticker before its first token check).");
    });
}
