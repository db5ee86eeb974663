//! The remotedialer tunnel against the real peer: `tools/rancher-peer`, built on
//! `github.com/rancher/remotedialer`'s own server, plays Rancher. These cases serve a small test
//! router through the tunnel, so they check the protocol itself: requests both ways, Rancher's
//! headers, back-pressure on large bodies, refusal and reconnection, the peer's restart, requests in
//! flight when the tunnel drops, and pings past the server's 60 s read deadline.

#[macro_use]
mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Json, Router,
    body::Bytes,
    extract::Request,
    http::HeaderMap,
    routing::{any, get},
};
use harvester_cloud::tunnel::{self, Endpoint, Limits, Stats};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use support::{eventually, rancher_peer::Peer};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const BIG: usize = 12 << 20;

#[derive(Default)]
struct Seen {
    slow_started: AtomicUsize,
    slow_dropped: AtomicBool,
}

struct DropFlag(Arc<Seen>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.slow_dropped.store(true, Ordering::SeqCst);
    }
}

fn router(seen: Arc<Seen>) -> Router {
    Router::new()
        .route(
            "/echo",
            any(|headers: HeaderMap, req: Request| async move {
                let method = req.method().to_string();
                let path = req.uri().path().to_string();
                let body = axum::body::to_bytes(req.into_body(), usize::MAX)
                    .await
                    .unwrap();
                let h = |name: &str| {
                    headers
                        .get_all(name)
                        .iter()
                        .map(|v| v.to_str().unwrap().to_string())
                        .collect::<Vec<_>>()
                };
                Json(json!({
                    "method": method,
                    "path": path,
                    "user": h("impersonate-user"),
                    "groups": h("impersonate-group"),
                    "extraUsername": h("impersonate-extra-username"),
                    "authorization": h("authorization"),
                    "length": body.len(),
                    "sha256": hex::encode(Sha256::digest(&body)),
                }))
            }),
        )
        .route("/big", get(|| async { Bytes::from(vec![7u8; BIG]) }))
        .route(
            "/slow",
            get(move || {
                let seen = seen.clone();
                async move {
                    let _flag = DropFlag(seen.clone());
                    seen.slow_started.fetch_add(1, Ordering::SeqCst);
                    std::future::pending::<()>().await;
                    "never"
                }
            }),
        )
}

struct Client {
    stats: Arc<Stats>,
    endpoints: watch::Sender<Option<Endpoint>>,
    seen: Arc<Seen>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Client {
    fn start(peer: &Peer, token: &str) -> Client {
        let stats = Arc::new(Stats::default());
        let seen = Arc::new(Seen::default());
        let stop = CancellationToken::new();
        let (endpoints, rx) = watch::channel(Some(Endpoint {
            url: peer.url(),
            token: token.to_string(),
            ca_pem: peer.ca_pem(),
        }));
        let accept = harvester_cloud::http::tunnel::acceptor(router(seen.clone()), stop.clone());
        let task = tokio::spawn(tunnel::run(
            rx,
            accept,
            Limits::default(),
            stats.clone(),
            stop.clone(),
        ));
        Client {
            stats,
            endpoints,
            seen,
            stop,
            task,
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.expect("the tunnel task ends");
    }
}

async fn connected(peer: &Peer) {
    eventually("the tunnel session", async || {
        peer.has_session().await.then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_round_trip_with_rancher_headers() {
    let peer = Peer::start("s3cret");
    let client = Client::start(&peer, "s3cret");
    connected(&peer).await;
    let http = peer.client();
    for _ in 0..20 {
        let r = http
            .post(peer.proxy_url("/echo"))
            .header("authorization", "Bearer the-users-own-token")
            .header("x-test-user", "alice")
            .header("x-test-groups", "team-a,system:authenticated")
            .header("x-test-extra-username", "Alice A.")
            .body("hello")
            .send()
            .await
            .expect("answered through the tunnel");
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["method"], "POST");
        assert_eq!(v["path"], "/echo");
        assert_eq!(v["user"], json!(["alice"]));
        assert_eq!(v["groups"], json!(["team-a", "system:authenticated"]));
        assert_eq!(v["extraUsername"], json!(["Alice A."]));
        // Rancher never passes the caller's Authorization on.
        assert_eq!(v["authorization"], json!([]));
        assert_eq!(v["length"], 5);
    }
    assert_eq!(client.stats.sessions_total.load(Ordering::SeqCst), 1);
    client.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_flow_both_ways_under_back_pressure() {
    let peer = Peer::start("s3cret");
    let client = Client::start(&peer, "s3cret");
    connected(&peer).await;
    let http = peer.client();
    // Six times the buffer past which each side pauses the other.
    let body: Vec<u8> = (0..BIG).map(|i| (i % 251) as u8).collect();
    let want = hex::encode(Sha256::digest(&body));
    let r = http
        .put(peer.proxy_url("/echo"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["length"], BIG);
    assert_eq!(v["sha256"], want);
    let down = http
        .get(peer.proxy_url("/big"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(down.len(), BIG);
    assert!(down.iter().all(|b| *b == 7));
    client.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_is_retried_and_a_new_secret_connects_at_once() {
    let peer = Peer::start("right");
    let client = Client::start(&peer, "wrong");
    eventually("two refused dials", async || {
        (client.stats.failures_total.load(Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    assert!(!peer.has_session().await);
    assert_eq!(client.stats.sessions_total.load(Ordering::SeqCst), 0);
    // Rancher rewrites the Secret: the tunnel dials with it without waiting out its back-off.
    client.endpoints.send_replace(Some(Endpoint {
        url: peer.url(),
        token: "right".into(),
        ca_pem: peer.ca_pem(),
    }));
    connected(&peer).await;
    client.stop().await;
}

/// The Secret changes under a connected tunnel to a token the peer refuses: the session goes, and
/// the tunnel says it is not connected while every dial is refused (the dropped session left it
/// saying connected).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_secret_ends_the_connected_state() {
    let peer = Peer::start("right");
    let client = Client::start(&peer, "right");
    connected(&peer).await;
    // The peer holds the session once it has answered the upgrade; the tunnel says connected
    // once it has read that answer, a moment later.
    eventually("the tunnel to say it is connected", async || {
        client.stats.connected.load(Ordering::SeqCst).then_some(())
    })
    .await;
    client.endpoints.send_replace(Some(Endpoint {
        url: peer.url(),
        token: "wrong".into(),
        ca_pem: peer.ca_pem(),
    }));
    eventually("a refused dial with the new Secret", async || {
        (client.stats.failures_total.load(Ordering::SeqCst) >= 1).then_some(())
    })
    .await;
    assert!(
        !client.stats.connected.load(Ordering::SeqCst),
        "not connected while its dials are refused"
    );
    client.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_is_never_trusted() {
    let peer = Peer::start("s3cret");
    let other = Peer::start("s3cret");
    let client = Client::start(&peer, "s3cret");
    client.endpoints.send_replace(Some(Endpoint {
        url: peer.url(),
        token: "s3cret".into(),
        ca_pem: other.ca_pem(),
    }));
    eventually("two failed TLS dials", async || {
        (client.stats.failures_total.load(Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    assert!(!peer.has_session().await);
    client.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tunnel_survives_the_peers_restart() {
    let mut peer = Peer::start("s3cret");
    let client = Client::start(&peer, "s3cret");
    connected(&peer).await;
    peer.restart();
    connected(&peer).await;
    let r = peer
        .client()
        .get(peer.proxy_url("/echo"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(client.stats.sessions_total.load(Ordering::SeqCst), 2);
    client.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_fail_cleanly_when_the_tunnel_drops() {
    let mut peer = Peer::start("s3cret");
    let client = Client::start(&peer, "s3cret");
    connected(&peer).await;
    let http = peer.client();
    let url = peer.proxy_url("/slow");
    let pending = tokio::spawn(async move { http.get(url).send().await });
    let seen = client.seen.clone();
    eventually("the slow request to reach the handler", async || {
        (seen.slow_started.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    peer.kill();
    // The caller is told (its connection to the peer closes), and on our side the request's
    // handler is cancelled and its connection released: nothing waits for a peer that is gone.
    let answer = pending.await.expect("joins");
    assert!(answer.is_err(), "{answer:?}");
    eventually("the handler to be dropped", async || {
        seen.slow_dropped.load(Ordering::SeqCst).then_some(())
    })
    .await;
    eventually("no tunnelled connection left", async || {
        (client.stats.connections.load(Ordering::SeqCst) == 0).then_some(())
    })
    .await;
    client.stop().await;
}

/// remotedialer's server drops a session it hears nothing from for 60 s; our pings keep an idle
/// tunnel open past that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_keep_an_idle_tunnel_open() {
    let peer = Peer::start("s3cret");
    let client = Client::start(&peer, "s3cret");
    connected(&peer).await;
    tokio::time::sleep(Duration::from_secs(66)).await;
    assert!(peer.has_session().await);
    assert_eq!(client.stats.sessions_total.load(Ordering::SeqCst), 1);
    assert_eq!(client.stats.failures_total.load(Ordering::SeqCst), 0);
    let r = peer
        .client()
        .get(peer.proxy_url("/echo"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    client.stop().await;
}
