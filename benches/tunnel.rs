//! Requests per second through the Rancher aggregation tunnel against the direct listener, in one
//! run: the service's router on the embedded store, served on a plain-HTTP loopback listener and
//! through the tunnel to `tools/rancher-peer` (remotedialer's own server, proxying as Rancher
//! does). Both are loaded with the same client for the same time: `GET /healthz` and
//! `GET /v1/harvester/kubeconfig` of an existing account (the admin bearer token, which Rancher
//! passes on for a caller it did not authenticate itself).
//!
//! Run with `cargo bench --bench tunnel` (after `--`: `--seconds N`, `--connections N`). The
//! tunnel path has more hops (TLS to the peer, its reverse proxy, remotedialer's framing both ways),
//! so what it shows is what the tunnel costs a dashboard request, not a like-for-like listener.

#[path = "../tests/support/mod.rs"]
#[allow(unused_imports, unused_macros)]
mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use harvester_cloud::tunnel::{self, Endpoint, Limits, Stats};
use support::{Backend, EmbeddedBackend, account, rancher_peer::Peer};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `connections` clients looping on `url` for `seconds`: requests per second, all of them 200.
async fn load(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    connections: u64,
    seconds: u64,
) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let (client, url, token, done) = (
            client.clone(),
            url.to_string(),
            token.to_string(),
            done.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let r = client
                    .get(&url)
                    .bearer_auth(&token)
                    .send()
                    .await
                    .expect("answered");
                assert_eq!(r.status(), 200, "{url}");
                r.bytes().await.expect("body");
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("load task");
    }
    done.load(Ordering::Relaxed) as f64 / seconds as f64
}

fn main() {
    let smoke = !std::env::args().any(|a| a == "--bench");
    let seconds = if smoke { 1 } else { arg("--seconds", 5) };
    let connections = arg("--connections", 16);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let b = EmbeddedBackend::start().await;
        b.post(&account("default", "bench")).await.kubeconfig();
        let token = b.admin_token();
        let stop = CancellationToken::new();

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let direct = listener.local_addr().unwrap();
        let router = b.router();
        tokio::spawn(async move { axum::serve(listener, router).await });

        let peer = Peer::start("bench-token");
        let (_tx, endpoints) = watch::channel(Some(Endpoint {
            url: peer.url(),
            token: peer.token.clone(),
            ca_pem: peer.ca_pem(),
        }));
        let accept = harvester_cloud::http::tunnel::acceptor(b.router(), stop.clone());
        tokio::spawn(tunnel::run(
            endpoints,
            accept,
            Limits::default(),
            Arc::new(Stats::default()),
            stop.clone(),
        ));
        while !peer.has_session().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        let plain = reqwest::Client::builder()
            .pool_max_idle_per_host(connections as usize)
            .build()
            .unwrap();
        let via_peer = peer.client();
        let query = "/v1/harvester/kubeconfig?namespace=default&serviceAccountName=bench";
        println!(
            "harvester-cloud through the Rancher tunnel vs the direct listener ({connections} connections, {seconds} s each, embedded store)"
        );
        for (what, path) in [("GET /healthz", "/healthz"), ("GET kubeconfig", query)] {
            let d = load(&plain, &format!("http://{direct}{path}"), &token, connections, seconds).await;
            let t = load(&via_peer, &peer.proxy_url(path), &token, connections, seconds).await;
            println!(
                "{what:>15}: direct {d:>8.0} req/s, through the tunnel {t:>8.0} req/s ({:.0}% of direct)",
                100.0 * t / d
            );
        }
        stop.cancel();
    });
}
