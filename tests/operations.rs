//! The binary as production runs it: metrics on their own port, JSON logs that carry a request id on
//! every line of a request and never a secret, and a SIGTERM that drains in-flight requests (bounded
//! by `--shutdown-timeout`) without failing an accepted request or losing an acknowledged write.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

#[macro_use]
#[allow(unused_macros)]
mod support;

use base64::Engine;
use serde_json::Value;
use support::binary::{BIN, Server, client, json, message};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KUBECONFIG: &str = "/v1/harvester/kubeconfig";
/// How long a test waits for a condition before it declares the service stuck (not a bound on speed).
const PATIENCE: Duration = Duration::from_secs(60);

/// The request id of the `request` span a log line was written in, if any.
fn request_id(v: &Value) -> Option<&str> {
    v["spans"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == "request")
        .map(|s| s["request_id"].as_str().unwrap_or_default())
}

fn admin_token(data_dir: &Path) -> String {
    std::fs::read_to_string(data_dir.join("admin-token"))
        .unwrap()
        .trim()
        .to_string()
}

fn account(ns: &str, sa: &str, output: Option<&str>) -> String {
    let mut v = serde_json::json!({"namespace": ns, "serviceAccountName": sa});
    if let Some(o) = output {
        v["outputFormat"] = o.into();
    }
    v.to_string()
}

/// The bearer token inside a kubeconfig (the minted service-account JWT).
fn kubeconfig_token(kubeconfig: &str) -> String {
    kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .unwrap_or_else(|| panic!("no token in {kubeconfig}"))
        .trim_matches('"')
        .to_string()
}

/// A raw TLS connection to the API, for requests that must stay in flight on purpose.
async fn tls_connect(
    data_dir: &Path,
    addr: &str,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    let ca = std::fs::read(data_dir.join("tls/ca.crt")).unwrap();
    for cert in rustls_pemfile::certs(&mut &ca[..]) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap()
}

/// Sends the head and half the body of a POST, and returns the connection and the rest of the body.
async fn start_slow_post(
    data_dir: &Path,
    addr: &str,
    token: &str,
    request_id: &str,
    body: &str,
) -> (
    tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    String,
) {
    let mut conn = tls_connect(data_dir, addr).await;
    let (first, rest) = body.split_at(body.len() / 2);
    let head = format!(
        "POST {KUBECONFIG} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\n\
         x-request-id: {request_id}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{first}",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.flush().await.unwrap();
    (conn, rest.to_string())
}

/// The metrics page's text.
async fn scrape(metrics_url: &str) -> String {
    reqwest::get(metrics_url)
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Reads a response up to the end of its head and returns the status code.
async fn read_status(conn: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> u16 {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf).await.expect("read the response");
        assert!(n > 0, "connection closed before the response: {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&got);
    head.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {head}"))
}

/// Metrics are served on the metrics port only, by route template, and count cloud-configs and
/// authentication failures by reason.
#[tokio::test]
async fn metrics_on_their_own_port() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data, "info", &[]);
    let http = client(&data);
    let token = admin_token(&data);
    let api = |path: &str| format!("{}{path}", server.url);

    let post = http
        .post(api(KUBECONFIG))
        .bearer_auth(&token)
        .body(account("default", "metrics", None))
        .send()
        .await
        .unwrap();
    assert_eq!(post.status(), 200);
    let yaml = http
        .post(api(KUBECONFIG))
        .bearer_auth(&token)
        .body(account("default", "metrics", Some("yaml")))
        .send()
        .await
        .unwrap();
    assert_eq!(yaml.status(), 200);
    let missing = http
        .get(api(&format!(
            "{KUBECONFIG}?namespace=default&serviceAccountName=nobody"
        )))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let invalid = http
        .post(api(KUBECONFIG))
        .bearer_auth(&token)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(invalid.status(), 422);
    let bad_token = http
        .get(api(KUBECONFIG))
        .bearer_auth("token-zzzzz:not-a-real-secret-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(bad_token.status(), 401);
    let no_token = http.get(api(KUBECONFIG)).send().await.unwrap();
    assert_eq!(no_token.status(), 401);
    let unrouted = http.get(api("/made-up/x1y2z3")).send().await.unwrap();
    assert_eq!(unrouted.status(), 404);
    // The API port does not serve metrics.
    let on_api = http.get(api("/metrics")).send().await.unwrap();
    assert_eq!(on_api.status(), 404);
    let spec = http.get(api("/openapi.json")).send().await.unwrap();
    assert_eq!(spec.status(), 200);
    let spec: Value = spec.json().await.unwrap();
    assert!(spec["paths"][KUBECONFIG]["post"].is_object());

    // A pool with one load balancer: the reconciler reports the pool's counters and its reconciles.
    let pool = serde_json::json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "IPPool",
        "metadata": {"name": "metrics-pool"},
        "spec": {
            "ranges": [{"subnet": "192.168.100.0/24", "rangeStart": "192.168.100.10", "rangeEnd": "192.168.100.19"}],
            "selector": {"scope": [{"project": "*", "namespace": "*", "guestCluster": "*"}]}
        }
    });
    let created = http
        .post(api("/v1/harvester/loadbalancer.harvesterhci.io.ippools"))
        .bearer_auth(&token)
        .json(&pool)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201, "{}", created.text().await.unwrap());
    let lb = serde_json::json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
        "metadata": {"name": "metrics-lb", "namespace": "default"},
        "spec": {"ipam": "pool", "listeners": [{"name": "http", "port": 80, "protocol": "TCP", "backendPort": 8080}]}
    });
    let created = http
        .post(api(
            "/v1/harvester/loadbalancer.harvesterhci.io.loadbalancers",
        ))
        .bearer_auth(&token)
        .json(&lb)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201, "{}", created.text().await.unwrap());
    let allocated_key = r#"harvester_cloud_ippool_allocated_addresses{pool="metrics-pool"}"#;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let text = scrape(&server.metrics_url).await;
        // The pool task allocates while the load balancer's reconcile is still under way, and that
        // reconcile is timed only once it has written the status: wait for both.
        let reconciled = |controller: &str| {
            harvester_cloud::metrics::sample(
                &text,
                &format!(
                    r#"harvester_cloud_reconcile_duration_seconds_count{{controller="{controller}"}}"#
                ),
            )
            .is_some_and(|n| n >= 1.0)
        };
        if harvester_cloud::metrics::sample(&text, allocated_key) == Some(1.0)
            && reconciled("loadbalancer")
            && reconciled("ippool")
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pool gauges never showed the allocation, or the reconciles were never timed:\n{text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    let scrape = reqwest::get(&server.metrics_url).await.unwrap();
    assert_eq!(scrape.status(), 200);
    assert_eq!(
        scrape.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = scrape.text().await.unwrap();
    let value = |key: &str| {
        harvester_cloud::metrics::sample(&text, key)
            .unwrap_or_else(|| panic!("no sample {key} in\n{text}"))
    };
    for (key, want) in [
        (
            r#"harvester_cloud_http_requests_total{method="POST",route="/v1/harvester/kubeconfig",status="200"}"#,
            2.0,
        ),
        (
            r#"harvester_cloud_http_requests_total{method="GET",route="/v1/harvester/kubeconfig",status="401"}"#,
            2.0,
        ),
        (
            r#"harvester_cloud_http_requests_total{method="GET",route="unmatched",status="404"}"#,
            2.0,
        ),
        (
            r#"harvester_cloud_http_request_duration_seconds_count{method="POST",route="/v1/harvester/kubeconfig",status="200"}"#,
            2.0,
        ),
        (
            r#"harvester_cloud_cloud_config_issued_total{operation="create",output="kubeconfig"}"#,
            1.0,
        ),
        (
            r#"harvester_cloud_cloud_config_issued_total{operation="create",output="cloud-init"}"#,
            1.0,
        ),
        (
            r#"harvester_cloud_cloud_config_failures_total{operation="get",reason="not_found"}"#,
            1.0,
        ),
        (
            r#"harvester_cloud_cloud_config_failures_total{operation="create",reason="invalid_request"}"#,
            1.0,
        ),
        (
            r#"harvester_cloud_auth_failures_total{reason="invalid"}"#,
            1.0,
        ),
        (
            r#"harvester_cloud_auth_failures_total{reason="missing"}"#,
            1.0,
        ),
        // The embedded backend always leads.
        ("harvester_cloud_leader", 1.0),
        (
            r#"harvester_cloud_ippool_total_addresses{pool="metrics-pool"}"#,
            10.0,
        ),
        (
            r#"harvester_cloud_ippool_available_addresses{pool="metrics-pool"}"#,
            9.0,
        ),
        (allocated_key, 1.0),
    ] {
        assert_eq!(value(key), want, "{key}");
    }
    for controller in ["loadbalancer", "ippool"] {
        let key = format!(
            r#"harvester_cloud_reconcile_duration_seconds_count{{controller="{controller}"}}"#
        );
        assert!(value(&key) >= 1.0, "{key}");
    }
    // Raw paths never become labels.
    assert!(!text.contains("made-up"), "{text}");
    let other = reqwest::get(server.metrics_url.replace("/metrics", "/healthz"))
        .await
        .unwrap();
    assert_eq!(other.status(), 404);
    server.stop();
}

/// A full session at `--log debug` (every library's debug lines too): no log line holds a token
/// secret, a minted service-account JWT, the signing key or the TLS key; and every line written while
/// serving a request carries that request's id.
#[tokio::test]
async fn no_secret_in_any_log_line_and_a_request_id_on_every_request_line() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data, "debug", &[]);
    let http = client(&data);
    let admin = admin_token(&data);
    let api = |path: &str| format!("{}{path}", server.url);
    let mut secrets: BTreeSet<String> = BTreeSet::new();
    let mut cli_logs: Vec<String> = Vec::new();
    let secret_of = |token: &str| token.split_once(':').unwrap().1.to_string();
    secrets.insert(admin.clone());
    secrets.insert(secret_of(&admin));

    let token_cmd = |args: &[&str]| {
        Command::new(BIN)
            .arg("--data-dir")
            .arg(&data)
            .args(["--log-format", "json", "--log", "debug", "token"])
            .args(args)
            .output()
            .unwrap()
    };
    let out = token_cmd(&["create", "--ttl", "1h", "--description", "session"]);
    assert!(out.status.success());
    cli_logs.extend(
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .map(String::from),
    );
    let created = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let created_name = created.split_once(':').unwrap().0.to_string();
    secrets.insert(created.clone());
    secrets.insert(secret_of(&created));

    let mut jwts = BTreeSet::new();
    for (i, (ns, sa, output)) in [
        ("default", "session-a", None),
        ("default", "session-b", Some("yaml")),
        ("guests", "session-c", Some("json")),
    ]
    .into_iter()
    .enumerate()
    {
        let r = http
            .post(api(KUBECONFIG))
            .bearer_auth(if i == 1 { &created } else { &admin })
            .header("x-request-id", format!("session-post-{i}"))
            .body(account(ns, sa, output))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(
            r.headers()["x-request-id"],
            format!("session-post-{i}").as_str()
        );
        let body = r.text().await.unwrap();
        let kubeconfig = match output {
            // Cloud-init user data carries the kubeconfig base64-encoded: that is a secret too.
            Some("yaml") => {
                let content = body
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("content: "))
                    .expect("a write_files content")
                    .to_string();
                secrets.insert(content.clone());
                String::from_utf8(
                    base64::engine::general_purpose::STANDARD
                        .decode(&content)
                        .unwrap(),
                )
                .unwrap()
            }
            _ => serde_json::from_str::<String>(&body).unwrap(),
        };
        jwts.insert(kubeconfig_token(&kubeconfig));
        let r = http
            .get(api(&format!(
                "{KUBECONFIG}?namespace={ns}&serviceAccountName={sa}"
            )))
            .bearer_auth(&admin)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        jwts.insert(kubeconfig_token(&r.json::<String>().await.unwrap()));
    }
    assert_eq!(jwts.len(), 3, "one token per account");
    for jwt in &jwts {
        secrets.insert(jwt.clone());
        // The signature alone is a secret too (header and claims are not).
        secrets.insert(jwt.rsplit('.').next().unwrap().to_string());
    }

    // HTTP Basic credentials: the token name as user, the secret as password.
    let (name, secret) = admin.split_once(':').unwrap();
    secrets.insert(base64::engine::general_purpose::STANDARD.encode(format!("{name}:{secret}")));
    let r = http
        .post(api(KUBECONFIG))
        .basic_auth(name, Some(secret))
        .body(account("default", "session-a", None))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // Tokens that do not work are secrets of whoever sent them.
    let bogus = "token-zzzzz:bogussecretbogussecretbogussecretbogussecret0123456789";
    let garbage = "garbage-credential-6d1f0c5e9a7b";
    secrets.insert(secret_of(bogus));
    secrets.insert(garbage.to_string());
    for auth in [format!("Bearer {bogus}"), format!("Bearer {garbage}")] {
        let r = http
            .get(api(KUBECONFIG))
            .header("authorization", auth)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
    }

    // Revocation, then the revoked token is refused (within about a second: poll).
    let out = token_cmd(&["revoke", &created_name]);
    assert!(out.status.success());
    cli_logs.extend(
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .map(String::from),
    );
    let out = token_cmd(&["list"]);
    assert!(out.status.success());
    cli_logs.extend(
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .map(String::from),
    );
    let listed = String::from_utf8_lossy(&out.stdout).to_string();
    let mut refused = false;
    for _ in 0..100 {
        let r = http
            .get(api(&format!(
                "{KUBECONFIG}?namespace=default&serviceAccountName=session-a"
            )))
            .bearer_auth(&created)
            .send()
            .await
            .unwrap();
        if r.status() == 401 {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refused, "a revoked token is refused");
    for path in [
        "/openid/v1/jwks",
        "/.well-known/openid-configuration",
        "/openapi.json",
    ] {
        assert_eq!(http.get(api(path)).send().await.unwrap().status(), 200);
    }
    assert_eq!(
        reqwest::get(&server.metrics_url).await.unwrap().status(),
        200
    );

    let logs = server.stop();

    // The private keys: the JWT signing key(s) in the store, and the TLS key.
    let store = harvester_cloud::store::embedded::EmbeddedStore::open(
        &data,
        harvester_cloud::store::embedded::Durability::Full,
    )
    .await
    .unwrap();
    let mut pems = store.signing_keys().await.unwrap();
    store.close().await;
    pems.push(std::fs::read_to_string(data.join("tls/tls.key")).unwrap());
    for pem in &pems {
        let body: Vec<&str> = pem
            .lines()
            .filter(|l| !l.starts_with("-----") && l.len() >= 16)
            .collect();
        assert!(!body.is_empty(), "a PEM body");
        secrets.extend(body.iter().map(|l| l.to_string()));
        secrets.insert(body.concat());
    }

    // The run must actually have logged in depth, or the check proves nothing.
    assert!(logs.len() > 50, "{} lines", logs.len());
    for needle in ["\"authenticated\"", "\"authentication failed\"", "sqlx"] {
        assert!(
            logs.iter().any(|l| l.contains(needle)),
            "no {needle} line at --log debug"
        );
    }
    for line in logs.iter().chain(&cli_logs).chain([&listed]) {
        for s in &secrets {
            assert!(!line.contains(s.as_str()), "a secret in a log line: {line}");
        }
    }

    // Every line inside a request span has the request's id; the request lines we know of do.
    let parsed: Vec<Value> = logs.iter().map(|l| json(l)).collect();
    let mut ids_seen = BTreeSet::new();
    for v in &parsed {
        if let Some(id) = request_id(v) {
            assert!(!id.is_empty(), "empty request id: {v}");
            ids_seen.insert(id.to_string());
        }
        if [
            "authenticated",
            "authentication failed",
            "started processing request",
            "finished processing request",
        ]
        .contains(&message(v))
        {
            assert!(request_id(v).is_some(), "no request id: {v}");
        }
    }
    for i in 0..3 {
        let id = format!("session-post-{i}");
        let lines = parsed.iter().filter(|v| request_id(v) == Some(&id)).count();
        assert!(lines >= 3, "{id}: {lines} lines");
    }
    // Generated ids are UUIDs, one per request.
    assert!(ids_seen.iter().filter(|id| id.len() == 36).count() >= 10);
}

/// What happened to one request of the load.
#[derive(Debug)]
enum Outcome {
    Ok(u16, String),
    /// The connection was refused: the listener had closed.
    Refused,
    /// Any other transport error, with its description.
    Broken(String),
}

async fn send(req: reqwest::RequestBuilder) -> Outcome {
    match req.send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            match r.text().await {
                Ok(body) => Outcome::Ok(status, body),
                Err(e) => Outcome::Broken(format!("reading the body: {e}")),
            }
        }
        Err(e) if e.is_connect() => Outcome::Refused,
        Err(e) => Outcome::Broken(format!("{e:?}")),
    }
}

/// SIGTERM while 16 clients POST and GET: the listener closes, in-flight requests finish (one of
/// them held open across the signal on purpose), the process exits 0, and then:
/// - every request the server read (its id is in the server's log) completed with a 200;
/// - a request that failed at the transport level was refused or was never read by the server,
///   so it had no effect and a client may retry it (with `http::drain`, keep-alive clients are told
///   `Connection: close` and end with a refused connect; the other case is the residual race of a
///   connect that reaches the kernel's backlog as the listener closes);
/// - after a restart, every account whose POST got a 200 is there with the same kubeconfig.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_fails_no_accepted_request_and_loses_no_write() {
    const CLIENTS: usize = 16;
    const ROUNDS: usize = 150;
    /// SIGTERM once this many POSTs were acknowledged, so that the load is in full swing.
    const SIGNAL_AFTER: usize = 64;

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data, "info,tower_http=debug", &[]);
    let token = admin_token(&data);

    // One POST that is still in flight when SIGTERM arrives: head and half its body now.
    let slow_body = account("default", "held-across-sigterm", None);
    let (mut slow, slow_rest) =
        start_slow_post(&data, &server.addr, &token, "slow-post", &slow_body).await;
    server.wait_for("the slow request starting", |v| {
        message(v) == "started processing request" && request_id(v) == Some("slow-post")
    });

    let acknowledged = Arc::new(AtomicUsize::new(0));
    let outcomes: Arc<Mutex<Vec<(String, String, Outcome)>>> = Arc::default();
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let http = client(&data);
        let (url, token) = (server.url.clone(), token.clone());
        let (acknowledged, outcomes) = (acknowledged.clone(), outcomes.clone());
        clients.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let sa = format!("load-{c}-{round}");
                let id = format!("post-{c}-{round}");
                let out = send(
                    http.post(format!("{url}{KUBECONFIG}"))
                        .bearer_auth(&token)
                        .header("x-request-id", &id)
                        .body(account("load", &sa, None)),
                )
                .await;
                let ok = matches!(out, Outcome::Ok(200, _));
                if ok {
                    acknowledged.fetch_add(1, Ordering::SeqCst);
                }
                let done = !ok;
                outcomes.lock().unwrap().push((id, sa.clone(), out));
                if done {
                    return;
                }
                let id = format!("get-{c}-{round}");
                let out = send(
                    http.get(format!(
                        "{url}{KUBECONFIG}?namespace=load&serviceAccountName={sa}"
                    ))
                    .bearer_auth(&token)
                    .header("x-request-id", &id),
                )
                .await;
                let done = !matches!(out, Outcome::Ok(200, _));
                outcomes.lock().unwrap().push((id, sa, out));
                if done {
                    return;
                }
            }
        }));
    }

    while acknowledged.load(Ordering::SeqCst) < SIGNAL_AFTER {
        assert!(
            !clients.iter().all(|c| c.is_finished()),
            "the clients stopped before the signal: {:?}",
            outcomes.lock().unwrap().last()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.sigterm();
    server.wait_for("the shutdown signal", |v| {
        message(v) == "shutdown signal received"
    });

    // The listener closes while the slow request is still in flight.
    let mut refused = false;
    for _ in 0..500 {
        match tokio::net::TcpStream::connect(&server.addr).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                refused = true;
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    assert!(refused, "the listener closed after SIGTERM");
    for c in clients {
        c.await.unwrap();
    }
    // The held request finishes after the signal, and is answered.
    slow.write_all(slow_rest.as_bytes()).await.unwrap();
    slow.flush().await.unwrap();
    assert_eq!(read_status(&mut slow).await, 200, "the in-flight request");
    drop(slow);

    let (status, logs) = server.wait();
    assert!(status.success(), "exit after SIGTERM: {status}");
    let parsed: Vec<Value> = logs.iter().map(|l| json(l)).collect();
    assert!(parsed.iter().any(|v| message(v) == "stopped"), "{logs:?}");
    let read_by_server: BTreeSet<&str> = parsed
        .iter()
        .filter(|v| message(v) == "started processing request")
        .filter_map(request_id)
        .collect();

    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap());
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut written: Vec<(String, String)> = Vec::new();
    for (id, sa, out) in &outcomes {
        match out {
            Outcome::Ok(200, body) => {
                *counts.entry("answered 200").or_default() += 1;
                if id.starts_with("post-") {
                    written.push((sa.clone(), serde_json::from_str(body).unwrap()));
                }
            }
            Outcome::Ok(status, body) => panic!("{id} failed: {status} {body}"),
            Outcome::Refused => *counts.entry("refused").or_default() += 1,
            Outcome::Broken(e) => {
                assert!(
                    !read_by_server.contains(id.as_str()),
                    "{id} was read by the server but not answered: {e}"
                );
                *counts
                    .entry("closed before the server read it")
                    .or_default() += 1;
            }
        }
    }
    eprintln!("load outcomes: {counts:?}");
    assert!(written.len() >= SIGNAL_AFTER);

    // Nothing acknowledged was lost.
    let server = Server::start(&data, "info", &[]);
    let http = client(&data);
    let get = |ns: &str, sa: &str| {
        http.get(format!(
            "{}{KUBECONFIG}?namespace={ns}&serviceAccountName={sa}",
            server.url
        ))
        .bearer_auth(&token)
        .send()
    };
    for (sa, kubeconfig) in &written {
        let r = get("load", sa).await.unwrap();
        assert_eq!(r.status(), 200, "load/{sa} after restart");
        assert_eq!(&r.json::<String>().await.unwrap(), kubeconfig, "{sa}");
    }
    let held = get("default", "held-across-sigterm").await.unwrap();
    assert_eq!(held.status(), 200, "the request held across SIGTERM");
    server.stop();
}

/// A request that never finishes holds the drain for `--shutdown-timeout` only: the process still
/// exits cleanly, and says so.
/// A request still being answered when SIGTERM comes is in flight: the drain waits for it, until
/// `--shutdown-timeout`. Here a POST on the Kubernetes backend waits for a token that the (real)
/// token controller is kept from writing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_timeout_bounds_the_drain() {
    let cp = support::control_plane::ControlPlane::lease().await;
    let _never = cp.hold_tokens("gc-test", None).await;
    let dir = tempfile::tempdir().unwrap();
    let data: PathBuf = dir.path().join("data");
    let kubeconfig = dir.path().join("service.kubeconfig");
    std::fs::write(
        &kubeconfig,
        support::kube_env::service_kubeconfig(&cp).await,
    )
    .unwrap();
    let kubeconfig = kubeconfig.display().to_string();
    let server = Server::start(
        &data,
        "info,tower_http=debug",
        &[
            "--backend",
            "kube",
            "--kubeconfig",
            &kubeconfig,
            "--leader-elect=false",
            "--token-timeout",
            "120s",
            "--shutdown-timeout",
            "1s",
        ],
    );
    let token = support::kube_env::rancher_token(&cp.admin, "user-admin", Default::default()).await;
    let http = client_for_generated_ca(&server);
    let url = format!("{}{KUBECONFIG}", server.url);
    let pending = tokio::spawn(async move {
        http.post(url)
            .bearer_auth(token)
            .header("x-request-id", "waits-for-its-token")
            .body(account("gc-test", "stuck", None))
            .send()
            .await
    });
    server.wait_for("the stuck request starting", |v| {
        message(v) == "started processing request" && request_id(v) == Some("waits-for-its-token")
    });
    server.sigterm();
    let (status, logs) = server.wait();
    assert!(status.success(), "exit after SIGTERM: {status}");
    assert!(
        logs.iter()
            .any(|l| l.contains("in-flight requests did not finish in time")),
        "the drain did not wait for the request in flight"
    );
    assert!(logs.iter().any(|l| l.contains("\"stopped\"")));
    let _ = pending.await;
}

/// A client for a server whose certificate it has not seen (the Kubernetes backend keeps its
/// generated CA in memory): no verification, for the drain test only.
fn client_for_generated_ca(_server: &Server) -> reqwest::Client {
    reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap()
}

/// A connection that sends a byte now and then: what a slow-loris client does.
async fn drip<S: tokio::io::AsyncWrite + tokio::io::AsyncRead + Unpin>(mut conn: S) -> bool {
    let head = b"POST /v1/harvester/kubeconfig HTTP/1.1\r\nhost: x\r\nx-drip: ";
    for b in head.iter().chain(std::iter::repeat(&b'a')) {
        if conn.write_all(&[*b]).await.is_err() || conn.flush().await.is_err() {
            break;
        }
        let mut buf = [0u8; 1024];
        // The server's answer or its close, whichever: either ends the drip.
        match tokio::time::timeout(Duration::from_millis(400), conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(_)) => continue,
            Err(_) => continue,
        }
    }
    true
}

/// Slow clients meet the header timeout, the TLS handshake timeout and the drain: with hundreds of
/// them drip-feeding request heads or never finishing a handshake, normal requests all answer, the
/// server closes every slow connection, and a SIGTERM is not held up by them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_neither_starve_others_nor_hold_a_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let data: PathBuf = dir.path().join("data");
    let server = Server::start(
        &data,
        "info",
        &["--header-timeout", "2s", "--shutdown-timeout", "60s"],
    );
    let token = admin_token(&data);
    let closed = Arc::new(AtomicUsize::new(0));
    let mut slow = Vec::new();
    for _ in 0..300 {
        let conn = tls_connect(&data, &server.addr).await;
        let closed = closed.clone();
        slow.push(tokio::spawn(async move {
            drip(conn).await;
            closed.fetch_add(1, Ordering::SeqCst);
        }));
    }
    // Connections that never start their TLS handshake.
    for _ in 0..100 {
        let tcp = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
        let closed = closed.clone();
        slow.push(tokio::spawn(async move {
            let mut tcp = tcp;
            let mut buf = [0u8; 16];
            let _ = tcp.read(&mut buf).await;
            closed.fetch_add(1, Ordering::SeqCst);
        }));
    }
    let http = client(&data);
    let mut answered = 0;
    for i in 0..20 {
        let r = http
            .post(format!("{}{KUBECONFIG}", server.url))
            .bearer_auth(&token)
            .body(account("default", &format!("normal-{i}"), None))
            .send()
            .await
            .expect("a normal request is answered");
        assert_eq!(r.status(), 200);
        answered += 1;
    }
    assert_eq!(answered, 20);
    // Every slow connection is closed by the server (the test would otherwise wait forever).
    for t in slow {
        tokio::time::timeout(PATIENCE, t)
            .await
            .expect("the server closes a slow connection")
            .unwrap();
    }
    assert_eq!(closed.load(Ordering::SeqCst), 400);
    // The server counts a refused connection once it has closed it, so a client can see the close
    // a moment before the count: the count is waited for, within the tests' patience.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let metrics = scrape(&server.metrics_url).await;
        let timed_out = harvester_cloud::metrics::sample(
            &metrics,
            "harvester_cloud_http_connections_refused_total{reason=\"handshake_timeout\"}",
        )
        .unwrap_or(0.0);
        if timed_out >= 100.0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Slow clients open at SIGTERM: the drain closes them at once instead of waiting for them.
    for _ in 0..50 {
        let conn = tls_connect(&data, &server.addr).await;
        tokio::spawn(drip(conn));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.sigterm();
    let (status, logs) = server.wait();
    assert!(status.success(), "exit after SIGTERM: {status}");
    assert!(
        !logs
            .iter()
            .any(|l| l.contains("in-flight requests did not finish in time")),
        "slow clients held the shutdown: {logs:?}"
    );
}

/// The first-request deadline is for connections that never send one: a keep-alive connection
/// busy with requests for several times `--header-timeout` is never closed under its client (it was:
/// the deadline stayed armed for the connection's life, and a load test's POSTs failed with
/// "connection closed before message completed" every 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_keep_alive_connection_outlives_the_header_timeout() {
    use http_body_util::{BodyExt, Full};
    let dir = tempfile::tempdir().unwrap();
    let data: PathBuf = dir.path().join("data");
    let server = Server::start(&data, "info", &["--header-timeout", "1s"]);
    let token = admin_token(&data);
    let conn = tls_connect(&data, &server.addr).await;
    let (mut send, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(conn))
            .await
            .unwrap();
    let connection = tokio::spawn(connection);
    // Three header timeouts' worth of requests, one after the other on the one connection.
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut answered = 0;
    while tokio::time::Instant::now() < until {
        let req = hyper::Request::post(KUBECONFIG)
            .header("host", &server.addr)
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .body(Full::new(hyper::body::Bytes::from(account(
                "default",
                &format!("busy-{answered}"),
                None,
            ))))
            .unwrap();
        let resp = send
            .send_request(req)
            .await
            .unwrap_or_else(|e| panic!("request {answered} on the busy connection: {e}"));
        assert_eq!(resp.status(), 200);
        resp.into_body().collect().await.unwrap();
        answered += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(answered > 1, "{answered}");
    assert!(
        !connection.is_finished(),
        "the server closed the connection"
    );
    let metrics = scrape(&server.metrics_url).await;
    assert_eq!(
        harvester_cloud::metrics::sample(
            &metrics,
            "harvester_cloud_http_connections_refused_total{reason=\"no_request\"}",
        )
        .unwrap_or(0.0),
        0.0,
        "{metrics}"
    );
}

/// Past `--max-connections`, new connections wait in the backlog (logged once, counted) and are
/// served as slots free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_limit_holds_new_clients_until_a_slot_frees() {
    let dir = tempfile::tempdir().unwrap();
    let data: PathBuf = dir.path().join("data");
    let server = Server::start(
        &data,
        "info",
        &[
            "--http",
            "--max-connections",
            "20",
            "--header-timeout",
            "2s",
        ],
    );
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(tokio::net::TcpStream::connect(&server.addr).await.unwrap());
    }
    server.wait_for("the limit's warning", |v| {
        message(v).starts_with("connection limit reached")
    });
    // The idle ones time out, and a normal request is served.
    let r = reqwest::Client::new()
        .get(format!("{}/healthz", server.url))
        .timeout(PATIENCE)
        .send()
        .await
        .expect("served once a slot frees");
    assert_eq!(r.status(), 200);
    let metrics = scrape(&server.metrics_url).await;
    assert!(
        harvester_cloud::metrics::sample(
            &metrics,
            "harvester_cloud_http_connections_refused_total{reason=\"at_capacity\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    drop(idle);
    server.stop();
}

/// A client's `X-Request-Id` reaches the logs and the response only when it is a short token of
/// safe characters: text that imitates a log line, or 16 KB of it, is replaced by a generated id.
/// (16 KB stays under every header limit: past hyper's read buffer the request is refused before
/// any middleware runs, and whether it is depends on how the bytes arrive, which made 60 KB flaky.)
/// A malformed chunked body is a 400 in the error shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_cannot_forge_log_lines_and_bad_bodies_are_json() {
    let dir = tempfile::tempdir().unwrap();
    let data: PathBuf = dir.path().join("data");
    let server = Server::start(&data, "debug", &["--http"]);
    let http = reqwest::Client::new();
    let forged = "x\"},{\"level\":\"ERROR\",\"message\":\"FORGED-LINE\"}";
    let huge = "FORGED-HUGE".repeat(1500);
    for id in [forged, huge.as_str(), "ok-id_1.2:3"] {
        let r = http
            .get(format!("{}/healthz", server.url))
            .header("x-request-id", id)
            .send()
            .await
            .unwrap();
        let answered = r
            .headers()
            .get("x-request-id")
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        if id == "ok-id_1.2:3" {
            assert_eq!(answered, id);
        } else {
            assert_ne!(answered, id);
            assert_eq!(answered.len(), 36, "a generated UUID: {answered}");
        }
    }
    // A chunked body whose chunk size is not hex.
    let mut tcp = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
    tcp.write_all(
        b"POST /v1/harvester/kubeconfig HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nZZ\r\nnot hex\r\n0\r\n\r\n",
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut got)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("\"code\":\"InvalidBodyContent\""), "{text}");
    let logs = server.stop();
    assert!(
        !logs.iter().any(|l| l.contains("FORGED")),
        "a forged id reached the log"
    );
}
