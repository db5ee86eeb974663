//! Shared helpers for the integration tests: backends behind one interface so that the same
//! HTTP suite runs on each, and small request/response utilities. Test binaries that are a
//! directory (`tests/NAME/main.rs`) include it with `#[path = "../support/mod.rs"]`.
//!
//! Beside it: [`lb`] (the load balancer reconcilers, pool builders, what a LoadBalancer's status
//! says), [`binary`] (the built binary as a `serve` process), [`control_plane`] and [`kube_env`]
//! (real control planes seeded like Harvester), [`foreign`] (foreign kinds from upstream's types),
//! [`faulty`] (stores that fail on purpose), [`netns`] (a private network namespace) and
//! [`rancher_peer`].
#![allow(dead_code, async_fn_in_trait)]

use std::path::{Path, PathBuf};

use axum::{
    Router,
    body::Body,
    http::{HeaderMap, Method, Request, StatusCode},
};
use clap::Parser;
use harvester_cloud::{
    app::{self, Embedded},
    config::{Cli, Command},
};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

pub const VIP: &str = "192.168.1.10";

/// A response, fully read.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).expect("UTF-8 body")
    }
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
    pub fn content_type(&self) -> &str {
        self.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }
    /// The raw kubeconfig of a 200 JSON-string body.
    #[track_caller]
    pub fn kubeconfig(&self) -> String {
        assert_eq!(self.status, StatusCode::OK, "{}", self.text());
        assert_eq!(self.content_type(), "application/json");
        serde_json::from_slice::<String>(&self.body).expect("body is a JSON string")
    }
    /// Asserts the status and returns the JSON body.
    pub fn expect(self, status: StatusCode) -> Value {
        assert_eq!(self.status, status, "{}", self.text());
        self.json()
    }
    /// Asserts Rancher's error shape with this status and code, and returns the message.
    #[track_caller]
    pub fn error(&self, status: StatusCode, code: &str) -> String {
        assert_eq!(self.status, status, "{}", self.text());
        assert_eq!(self.content_type(), "application/json", "{}", self.text());
        let v = self.json();
        assert_eq!(v["type"], "error");
        assert_eq!(v["status"], status.as_u16());
        assert_eq!(v["code"], code, "{v}");
        v["message"].as_str().expect("message").to_string()
    }
}

/// How long a test waits for a condition before it declares the service stuck. Not a performance
/// bound: conditions normally hold within milliseconds.
pub const PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// Polls `probe` until it finds something (every 20 ms), failing the test after [`PATIENCE`].
pub async fn eventually<T>(what: &str, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Logs what the service does when `TEST_LOG` asks for it (`TEST_LOG=harvester_cloud=debug`);
/// nothing otherwise. Once per test binary.
pub fn init_logging() {
    let filter = std::env::var("TEST_LOG").unwrap_or_else(|_| "off".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
}

/// A background task stopped by its token (also when dropped).
pub struct Task {
    stop: tokio_util::sync::CancellationToken,
    handle: Option<tokio::task::JoinHandle<()>>,
}

impl Task {
    pub fn spawn<F: Future<Output = ()> + Send + 'static>(
        f: impl FnOnce(tokio_util::sync::CancellationToken) -> F,
    ) -> Self {
        let stop = tokio_util::sync::CancellationToken::new();
        let handle = tokio::spawn(f(stop.clone()));
        Task {
            stop,
            handle: Some(handle),
        }
    }

    /// Stops it and waits until it has.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(h) = self.handle.take() {
            h.await.expect("stops cleanly");
        }
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A request with the admin token and a JSON body, if any ([`Backend::admin`]).
pub async fn call<B: Backend>(b: &B, method: Method, path: &str, body: Option<Value>) -> Reply {
    b.admin(method, path, body).await
}

/// Asserts the status and returns the JSON body ([`Reply::expect`]).
#[track_caller]
pub fn ok(r: Reply, status: StatusCode) -> Value {
    assert_eq!(r.status, status, "{}", r.text());
    r.json()
}

/// Creates a VirtualMachineInstance as KubeVirt does, `status` included (KubeVirt's VMI CRD has no
/// status subresource). Returns it as stored.
pub async fn create_vmi(
    store: std::sync::Arc<dyn harvester_cloud::store::ObjectStore>,
    vmi: &harvester_cloud::crd::kinds::VirtualMachineInstance,
) -> harvester_cloud::crd::kinds::VirtualMachineInstance {
    vmi_api(store).create(vmi).await.expect("creates the VMI")
}

/// Typed store access to VirtualMachineInstances.
pub fn vmi_api(
    store: std::sync::Arc<dyn harvester_cloud::store::ObjectStore>,
) -> harvester_cloud::store::Api<harvester_cloud::crd::kinds::VirtualMachineInstance> {
    harvester_cloud::store::Api::with_kind(store, harvester_cloud::crd::kinds::vmi_kind())
}

/// A service under test, reached through its router.
pub trait Backend: Sized {
    fn router(&self) -> Router;
    fn admin_token(&self) -> String;
    /// Stops the service and starts it again on the same state.
    async fn restart(self) -> Self;
    /// The CA that kubeconfigs must carry.
    fn expected_ca(&self) -> Vec<u8>;
    /// The store as the test sees it, to set up objects and inspect what a request left behind
    /// (on Kubernetes, as a `system:masters` client).
    fn store(&self) -> std::sync::Arc<dyn harvester_cloud::store::ObjectStore>;
    /// The store as the service sees it, for reconcilers the test runs in process (on
    /// Kubernetes, with the chart's RBAC).
    fn service_store(&self) -> std::sync::Arc<dyn harvester_cloud::store::ObjectStore> {
        self.store()
    }
    /// The service's cloud-config issuer (to run its token sweeper in the test).
    fn cloud_config(&self) -> std::sync::Arc<harvester_cloud::kubeconfig::CloudConfig>;
    /// Whether the API server (on Kubernetes, the real one; here, the embedded store's verifier)
    /// accepts `token` as the service account `user`: `false` is a 401.
    async fn token_works(&self, token: &str, user: &str) -> bool;

    async fn call(
        &self,
        method: Method,
        uri: &str,
        token: Option<&str>,
        body: impl Into<Body>,
    ) -> Reply {
        let mut req = Request::builder().method(method).uri(uri);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let resp = self
            .router()
            .oneshot(req.body(body.into()).expect("request"))
            .await
            .expect("infallible");
        let (parts, body) = resp.into_parts();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.expect("body").to_bytes().to_vec(),
        }
    }

    /// A request with the admin token and a JSON body, if any.
    async fn admin(&self, method: Method, uri: &str, body: Option<Value>) -> Reply {
        let t = self.admin_token();
        let body = body.map_or_else(Body::empty, |v| Body::from(v.to_string()));
        self.call(method, uri, Some(&t), body).await
    }

    async fn post(&self, body: &str) -> Reply {
        let t = self.admin_token();
        self.call(
            Method::POST,
            "/v1/harvester/kubeconfig",
            Some(&t),
            body.to_string(),
        )
        .await
    }

    async fn get(&self, query: &str) -> Reply {
        let t = self.admin_token();
        self.call(
            Method::GET,
            &format!("/v1/harvester/kubeconfig?{query}"),
            Some(&t),
            Body::empty(),
        )
        .await
    }
}

/// The embedded backend on a real SQLite file in a temporary directory.
pub struct EmbeddedBackend {
    pub dir: tempfile::TempDir,
    pub app: Embedded,
    pub extra_args: Vec<String>,
    token: String,
}

pub fn cli(
    data_dir: &Path,
    extra: &[String],
) -> (
    harvester_cloud::config::GlobalArgs,
    harvester_cloud::config::ServeArgs,
) {
    let mut args: Vec<String> = vec![
        "harvester-cloud".into(),
        "--data-dir".into(),
        data_dir.display().to_string(),
        "serve".into(),
        "--http".into(),
    ];
    // The Kubernetes backend reads the VIP from the cluster's `vip` ConfigMap, as Harvester does.
    if !extra.iter().any(|a| a == "--vip" || a == "--backend") {
        args.extend(["--vip".into(), VIP.into()]);
    }
    args.extend(extra.iter().cloned());
    let cli = Cli::try_parse_from(args).expect("valid test arguments");
    match cli.command {
        Command::Serve(serve) => (cli.global, serve),
        _ => unreachable!(),
    }
}

impl EmbeddedBackend {
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    pub async fn start_with(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let (global, serve) = cli(dir.path(), &extra);
        let app = app::open_embedded(&global, &serve)
            .await
            .expect("open embedded");
        let token = app
            .admin_token
            .as_ref()
            .expect("first start creates a token")
            .expose();
        EmbeddedBackend {
            dir,
            app,
            extra_args: extra,
            token,
        }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

impl Backend for EmbeddedBackend {
    fn router(&self) -> Router {
        harvester_cloud::http::router(self.app.service.state.clone())
    }

    fn admin_token(&self) -> String {
        self.token.clone()
    }

    async fn restart(self) -> Self {
        let EmbeddedBackend {
            dir,
            app,
            extra_args,
            token,
        } = self;
        app.store.close().await;
        drop(app);
        let (global, serve) = cli(dir.path(), &extra_args);
        let app = app::open_embedded(&global, &serve)
            .await
            .expect("reopen embedded");
        assert!(
            app.admin_token.is_none(),
            "a restart must not create another admin token"
        );
        EmbeddedBackend {
            dir,
            app,
            extra_args,
            token,
        }
    }

    fn store(&self) -> std::sync::Arc<dyn harvester_cloud::store::ObjectStore> {
        self.app.service.state.store.clone()
    }

    fn cloud_config(&self) -> std::sync::Arc<harvester_cloud::kubeconfig::CloudConfig> {
        self.app.service.state.cloud_config.clone()
    }

    async fn token_works(&self, token: &str, user: &str) -> bool {
        // An authenticated service account may not list pools here: 403 names it; 401 refuses
        // the token.
        let r = self
            .call(
                Method::GET,
                "/v1/harvester/loadbalancer.harvesterhci.io.ippools",
                Some(token),
                Body::empty(),
            )
            .await;
        match r.status {
            StatusCode::FORBIDDEN => {
                assert!(r.text().contains(user), "{}", r.text());
                true
            }
            StatusCode::UNAUTHORIZED => false,
            other => panic!("a service-account token answered {other}: {}", r.text()),
        }
    }

    fn expected_ca(&self) -> Vec<u8> {
        std::fs::read(self.dir.path().join("tls/ca.crt")).expect("generated CA")
    }
}

pub fn account(ns: &str, sa: &str) -> String {
    serde_json::json!({"namespace": ns, "serviceAccountName": sa}).to_string()
}

pub fn account_yaml(ns: &str, sa: &str) -> String {
    serde_json::json!({"namespace": ns, "serviceAccountName": sa, "outputFormat": "yaml"})
        .to_string()
}

// --- The Kubernetes backend, against a real control plane ------------------------------------------

pub mod binary;
pub mod control_plane;
pub mod faulty;
pub mod foreign;
pub mod kube_env;
pub mod lb;
pub mod netns;
pub mod rancher_peer;

use control_plane::ControlPlane;

/// The Kubernetes backend on a leased real control plane seeded like a Harvester cluster, the
/// service holding the chart's own RBAC.
pub struct KubeBackend {
    pub cp: ControlPlane,
    /// A `system:masters` client for the test's own reads and writes.
    pub client: kube::Client,
    pub app: app::Service,
    pub dir: tempfile::TempDir,
    pub extra_args: Vec<String>,
    token: String,
}

impl KubeBackend {
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    pub async fn start_with(extra: &[&str]) -> Self {
        Self::start_on(ControlPlane::lease().await, extra).await
    }

    /// The service on a control plane the test already leased.
    pub async fn start_on(cp: ControlPlane, extra: &[&str]) -> Self {
        let client = cp.admin.clone();
        let token = kube_env::rancher_token(&client, "user-admin", Default::default()).await;
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("service.kubeconfig"),
            kube_env::service_kubeconfig(&cp).await,
        )
        .expect("write kubeconfig");
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let app = Self::open(dir.path(), &extra).await;
        KubeBackend {
            cp,
            client,
            app,
            dir,
            extra_args: extra,
            token,
        }
    }

    /// The same cluster, served with other flags.
    pub async fn with_args(self, extra: &[&str]) -> Self {
        let extra_args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let app = Self::open(self.dir.path(), &extra_args).await;
        KubeBackend {
            app,
            extra_args,
            ..self
        }
    }

    /// The kubeconfig the service runs with (the chart's ServiceAccount).
    pub fn service_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("service.kubeconfig")
    }

    async fn open(dir: &Path, extra: &[String]) -> app::Service {
        let mut args = vec![
            "--backend".to_string(),
            "kube".into(),
            "--kubeconfig".into(),
            dir.join("service.kubeconfig").display().to_string(),
        ];
        args.extend(extra.iter().cloned());
        let (_, serve) = cli(dir, &args);
        app::open_kube(&serve)
            .await
            .expect("open the Kubernetes backend")
    }
}

impl Backend for KubeBackend {
    fn router(&self) -> Router {
        harvester_cloud::http::router(self.app.state.clone())
    }

    fn admin_token(&self) -> String {
        self.token.clone()
    }

    async fn restart(self) -> Self {
        let app = Self::open(self.dir.path(), &self.extra_args).await;
        KubeBackend { app, ..self }
    }

    fn expected_ca(&self) -> Vec<u8> {
        self.cp.ca_pem.as_bytes().to_vec()
    }

    fn store(&self) -> std::sync::Arc<dyn harvester_cloud::store::ObjectStore> {
        std::sync::Arc::new(harvester_cloud::store::kubernetes::KubeStore::new(
            self.client.clone(),
        ))
    }

    fn service_store(&self) -> std::sync::Arc<dyn harvester_cloud::store::ObjectStore> {
        self.app.state.store.clone()
    }

    fn cloud_config(&self) -> std::sync::Arc<harvester_cloud::kubeconfig::CloudConfig> {
        self.app.state.cloud_config.clone()
    }

    async fn token_works(&self, token: &str, user: &str) -> bool {
        use k8s_openapi::api::authentication::v1::SelfSubjectReview;
        let client = self.cp.client_for_token(token).await;
        let reviews: kube::Api<SelfSubjectReview> = kube::Api::all(client);
        match reviews
            .create(&Default::default(), &SelfSubjectReview::default())
            .await
        {
            Ok(r) => {
                let name = r
                    .status
                    .and_then(|s| s.user_info)
                    .and_then(|u| u.username)
                    .unwrap_or_default();
                assert_eq!(name, user, "the API server's user for the token");
                true
            }
            Err(kube::Error::Api(e)) if e.code == 401 => false,
            Err(e) => panic!("a SelfSubjectReview with a service-account token: {e}"),
        }
    }
}

/// What a suite case's environment lets the suite check afterwards: that the API servers refused
/// none of the requests of the service (and the ccm) while the case ran, so the chart's and the
/// ccm manifest's RBAC are enough for everything the case made them do.
pub trait Refusals {
    fn refusal_probes(&self) -> Vec<control_plane::RefusalProbe> {
        Vec::new()
    }
}

impl Refusals for EmbeddedBackend {}

impl Refusals for KubeBackend {
    fn refusal_probes(&self) -> Vec<control_plane::RefusalProbe> {
        vec![self.cp.refusal_probe(&[kube_env::SERVICE_USER])]
    }
}

/// Runs each case on each backend: `suite!([embedded => EmbeddedBackend::start(), kube =>
/// KubeBackend::start()], [case_a, case_b])` makes `embedded::case_a`, `kube::case_a`, … calling
/// `cases::case_a(<backend>)`, and then checks that the API servers refused the service nothing
/// ([`Refusals`]). (Test files declare `#[macro_use] mod support;`.)
///
/// `suite!(netns, [...], [...])` runs each case again by itself inside a private network namespace
/// ([`netns`]) and starts its environment there.
#[allow(unused_macros)]
macro_rules! suite {
    ([$($backend:ident => $start:expr),+ $(,)?], $cases:tt) => {
        $( suite!(@one $backend, $start, $cases); )+
    };
    (netns, [$($backend:ident => $start:expr),+ $(,)?], $cases:tt) => {
        $( suite!(@netns $backend, $start, $cases); )+
    };
    (@netns $backend:ident, $start:expr, [$($case:ident),* $(,)?]) => {
        mod $backend {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    if !support::netns::inside() {
                        support::netns::rerun(concat!(
                            stringify!($backend),
                            "::",
                            stringify!($case)
                        ))
                        .await;
                        return;
                    }
                    let env = $start.await;
                    let probes = support::Refusals::refusal_probes(&env);
                    cases::$case(env).await;
                    for probe in probes {
                        probe.assert_none_refused();
                    }
                }
            )*
        }
    };
    (@one $backend:ident, $start:expr, [$($case:ident),* $(,)?]) => {
        mod $backend {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let env = $start.await;
                    let probes = support::Refusals::refusal_probes(&env);
                    cases::$case(env).await;
                    for probe in probes {
                        probe.assert_none_refused();
                    }
                }
            )*
        }
    };
}
