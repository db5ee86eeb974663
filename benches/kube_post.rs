//! POST latency of the cloud-config API on the Kubernetes backend, against the Kubernetes API fake
//! (in process, HTTPS on loopback), and how many API requests one POST makes.
//!
//! Run with `cargo bench --bench kube_post` (`-- --requests N` to change the sample size). Each POST
//! creates a new account, sequentially, through the service's router. It is measured twice: with the
//! fake's token controller filling tokens at once, which shows the service's own cost, and with a
//! 50 ms delay, closer to a real cluster's controller.

#[path = "../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

use std::time::{Duration, Instant};

use support::{Backend, KubeBackend, account};

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

async fn measure(delay: Duration, n: usize) {
    let b =
        KubeBackend::start_with(kube_fake::FakeApiServer::builder().token_delay(delay), &[]).await;
    // Warm up: connection pool, role and VIP lookups.
    for i in 0..5 {
        b.post(&account("gc-test", &format!("warm-{i}")))
            .await
            .kubeconfig();
    }
    b.fake.reset_requests();
    let mut latencies = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        b.post(&account("gc-test", &format!("sa-{i}")))
            .await
            .kubeconfig();
        latencies.push(t.elapsed());
    }
    let requests = b.fake.request_count();
    latencies.sort();
    println!(
        "token controller delay {:>3} ms: {n} POSTs, median {:>6.2} ms, p99 {:>6.2} ms, {:.1} API requests per POST",
        delay.as_millis(),
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
        println!("harvester-cloud POST on the Kubernetes backend against the Kubernetes API fake (sequential, new account each)");
        measure(Duration::ZERO, n).await;
        measure(Duration::from_millis(50), n).await;
        println!("Harvester v1.9 waits at least 1000 ms per POST (a 1 s ticker before its first token check).");
    });
}
