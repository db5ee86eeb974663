//! Shared helpers for the integration tests: backends behind one interface so that the same
//! HTTP suite runs on each, and small request/response utilities.
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
    pub fn kubeconfig(&self) -> String {
        assert_eq!(self.status, StatusCode::OK, "{}", self.text());
        assert_eq!(self.content_type(), "application/json");
        serde_json::from_slice::<String>(&self.body).expect("body is a JSON string")
    }
    /// Asserts Rancher's error shape with this status and code, and returns the message.
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

/// A service under test, reached through its router.
pub trait Backend: Sized {
    fn router(&self) -> Router;
    fn admin_token(&self) -> String;
    /// Stops the service and starts it again on the same state.
    async fn restart(self) -> Self;
    /// The CA that kubeconfigs must carry.
    fn expected_ca(&self) -> Vec<u8>;
    /// The store behind the service, to inspect what a request left behind.
    fn store(&self) -> std::sync::Arc<dyn harvester_cloud::store::ObjectStore>;

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

// --- The Kubernetes backend, against the Kubernetes API fake ---------------------------------------

pub mod kube_env {
    //! A Harvester-like cluster in the Kubernetes API fake: the namespaces the suites use, the two
    //! ClusterRoles, the `vip` ConfigMap, Rancher's token and global-role-binding CRDs, and helpers to
    //! make Rancher tokens.

    use harvester_cloud::auth::{ApiToken, hash};
    use k8s_openapi::api::{
        core::v1::{ConfigMap, Namespace},
        rbac::v1::ClusterRole,
    };
    use kube::{
        Api, Client,
        api::{ApiResource, DynamicObject, PostParams},
    };
    use serde_json::{Value, json};

    /// Every namespace a shared suite uses.
    pub const NAMESPACES: &[&str] = &[
        "default",
        "gc-test",
        "a",
        "a-b",
        "guest-cluster-namespace-with-a-rather-long-name",
        "harvester-system",
        "ns1",
        "ns2",
    ];

    pub async fn client(fake: &kube_fake::FakeHandle) -> Client {
        let kc =
            kube::config::Kubeconfig::from_yaml(&fake.kubeconfig_yaml()).expect("fake kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .expect("config");
        Client::try_from(config).expect("client")
    }

    async fn create<K>(api: &Api<K>, obj: &K)
    where
        K: kube::Resource
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        match api.create(&PostParams::default(), obj).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_already_exists() => {}
            Err(e) => panic!("cannot create {obj:?}: {e}"),
        }
    }

    fn crd(plural: &str, group: &str, kind: &str, version: &str, scope: &str) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.{group}")},
            "spec": {
                "group": group,
                "scope": scope,
                "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind},
                "versions": [{
                    "name": version, "served": true, "storage": true,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
                }]
            }
        }))
        .expect("crd")
    }

    fn crd_api(client: &Client) -> Api<DynamicObject> {
        Api::all_with(
            client.clone(),
            &ApiResource {
                group: "apiextensions.k8s.io".into(),
                version: "v1".into(),
                api_version: "apiextensions.k8s.io/v1".into(),
                kind: "CustomResourceDefinition".into(),
                plural: "customresourcedefinitions".into(),
            },
        )
    }

    fn rancher(kind: &str, plural: &str) -> ApiResource {
        ApiResource {
            group: "management.cattle.io".into(),
            version: "v3".into(),
            api_version: "management.cattle.io/v3".into(),
            kind: kind.into(),
            plural: plural.into(),
        }
    }

    /// Everything a Harvester cluster has that the service relies on.
    pub async fn seed(client: &Client, vip: &str) {
        let nss: Api<Namespace> = Api::all(client.clone());
        for ns in NAMESPACES {
            let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
            create(&nss, &obj).await;
        }
        let roles: Api<ClusterRole> = Api::all(client.clone());
        // Harvester's own roles, with the rules its chart ships.
        for (name, rules) in [
            (
                "harvesterhci.io:cloudprovider",
                harvester_cloud::kubeconfig::seed::cloudprovider_rules(),
            ),
            (
                "harvesterhci.io:csi-driver",
                harvester_cloud::kubeconfig::seed::csi_driver_rules(),
            ),
        ] {
            let role = ClusterRole {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                rules: Some(rules),
                ..Default::default()
            };
            create(&roles, &role).await;
        }
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "harvester-system");
        let vip_cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": "vip"}, "data": {"ip": vip}}))
                .unwrap();
        create(&cms, &vip_cm).await;
        let crds = crd_api(client);
        for obj in [
            crd("tokens", "management.cattle.io", "Token", "v3", "Cluster"),
            crd(
                "globalrolebindings",
                "management.cattle.io",
                "GlobalRoleBinding",
                "v3",
                "Cluster",
            ),
            crd(
                "loadbalancers",
                "loadbalancer.harvesterhci.io",
                "LoadBalancer",
                "v1beta1",
                "Namespaced",
            ),
            crd(
                "widgets",
                "example.harvesterhci.io",
                "Widget",
                "v1",
                "Namespaced",
            ),
        ] {
            create(&crds, &obj).await;
        }
    }

    /// Registers what a Harvester cluster has beyond the shared seed: our LoadBalancer and IPPool
    /// CRDs (replacing the seed's bare LoadBalancer one) and KubeVirt's and Multus's kinds
    /// (schemaless), and waits until they are established.
    pub async fn harvester_crds(client: &Client) {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        use kube::runtime::wait::{await_condition, conditions};
        let foreign = |group: &str, kind: &str, plural: &str| -> CustomResourceDefinition {
            serde_json::from_value(json!({
                "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": format!("{plural}.{group}")},
                "spec": {"group": group, "scope": "Namespaced",
                    "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase()},
                    "versions": [{"name": "v1", "served": true, "storage": true,
                        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
            }))
            .expect("crd")
        };
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let all = harvester_cloud::crd::crds().into_iter().chain([
            foreign("kubevirt.io", "VirtualMachine", "virtualmachines"),
            foreign(
                "kubevirt.io",
                "VirtualMachineInstance",
                "virtualmachineinstances",
            ),
            foreign(
                "k8s.cni.cncf.io",
                "NetworkAttachmentDefinition",
                "network-attachment-definitions",
            ),
        ]);
        for crd in all {
            let name = crd.metadata.name.clone().expect("named");
            match crds.create(&PostParams::default(), &crd).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    let mut current = crds.get(&name).await.expect("reads the CRD");
                    current.spec = crd.spec.clone();
                    crds.replace(&name, &PostParams::default(), &current)
                        .await
                        .unwrap_or_else(|e| panic!("cannot replace {name}: {e}"));
                }
                Err(e) => panic!("cannot register {name}: {e}"),
            }
            tokio::time::timeout(
                super::PATIENCE,
                await_condition(crds.clone(), &name, conditions::is_crd_established()),
            )
            .await
            .expect("established in time")
            .expect("established");
        }
    }

    /// How a Rancher token is stored.
    #[derive(Clone, Debug, Default)]
    pub struct TokenOpts {
        /// Store the secret in clear (older Rancher) instead of hashed.
        pub plain: bool,
        pub enabled: Option<bool>,
        pub expired: Option<bool>,
        pub expires_at: Option<String>,
    }

    /// Creates a Rancher API token for `user` and returns it as a client sends it.
    pub async fn rancher_token(client: &Client, user: &str, opts: TokenOpts) -> String {
        let token = ApiToken::generate();
        let mut obj = json!({
            "apiVersion": "management.cattle.io/v3",
            "kind": "Token",
            "metadata": {
                "name": token.name,
                "labels": {"authn.management.cattle.io/token-userId": user},
                "annotations": {},
            },
            "userId": user,
            "authProvider": "local",
            "ttl": 0,
            "token": if opts.plain { token.secret.clone() } else { hash::hash_secret(&token.secret) },
        });
        if !opts.plain {
            obj["metadata"]["annotations"]["authn.management.cattle.io/token-hashed"] =
                Value::from("true");
        }
        if let Some(e) = opts.enabled {
            obj["enabled"] = Value::from(e);
        }
        if let Some(e) = opts.expired {
            obj["expired"] = Value::from(e);
        }
        if let Some(at) = opts.expires_at {
            obj["expiresAt"] = Value::from(at);
        }
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &rancher("Token", "tokens"));
        create(&api, &serde_json::from_value(obj).unwrap()).await;
        token.expose()
    }

    /// Binds `user` to Rancher's global role `role` (`admin`, `restricted-admin`, `user`).
    pub async fn bind_global_role(client: &Client, user: &str, role: &str) {
        let obj = json!({
            "apiVersion": "management.cattle.io/v3",
            "kind": "GlobalRoleBinding",
            "metadata": {"name": format!("grb-{user}-{role}")},
            "globalRoleName": role,
            "userName": user,
        });
        let api: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &rancher("GlobalRoleBinding", "globalrolebindings"),
        );
        create(&api, &serde_json::from_value(obj).unwrap()).await;
    }
}

/// The Kubernetes backend against a Kubernetes API fake seeded like a Harvester cluster.
pub struct KubeBackend {
    pub fake: kube_fake::FakeHandle,
    pub client: kube::Client,
    pub app: app::Service,
    pub dir: tempfile::TempDir,
    pub extra_args: Vec<String>,
    token: String,
}

impl KubeBackend {
    pub async fn start() -> Self {
        Self::start_with(kube_fake::FakeApiServer::builder(), &[]).await
    }

    pub async fn start_with(builder: kube_fake::FakeApiServerBuilder, extra: &[&str]) -> Self {
        let fake = builder
            .start()
            .await
            .expect("start the Kubernetes API fake");
        let client = kube_env::client(&fake).await;
        kube_env::seed(&client, VIP).await;
        kube_env::bind_global_role(&client, "user-admin", "admin").await;
        let token = kube_env::rancher_token(&client, "user-admin", Default::default()).await;
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("admin.kubeconfig"), fake.kubeconfig_yaml())
            .expect("write kubeconfig");
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let app = Self::open(dir.path(), &extra).await;
        KubeBackend {
            fake,
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

    async fn open(dir: &Path, extra: &[String]) -> app::Service {
        let mut args = vec![
            "--backend".to_string(),
            "kube".into(),
            "--kubeconfig".into(),
            dir.join("admin.kubeconfig").display().to_string(),
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
        self.fake.ca_pem().as_bytes().to_vec()
    }

    fn store(&self) -> std::sync::Arc<dyn harvester_cloud::store::ObjectStore> {
        self.app.state.store.clone()
    }
}
