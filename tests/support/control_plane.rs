//! The real Kubernetes control planes the Kubernetes-backend tests run against: etcd,
//! kube-apiserver and kube-controller-manager built from the upstream Go modules and started by
//! `scripts/control-plane.sh` (`scripts/test.sh` starts a few, and passes their directories in
//! `HARVESTER_CLOUD_CONTROL_PLANES`).
//!
//! A test leases a control plane for itself alone (a file lock, released when the test's process
//! ends, however it ends), so the cluster-scoped objects it makes (IPPools, webhook
//! configurations, bindings) and the reconcilers it runs see no other test. The lease brings the
//! control plane back to its seeded baseline first: every object the previous tenant left is
//! deleted (finalizers stripped: its reconcilers are gone), and the seed is applied again.
//!
//! What the real server cannot do is added here, and only that: delaying or withholding the token
//! controller's writes (a validating webhook on its Secret updates), and reading back who was
//! refused what (the audit log).

use std::{
    collections::{BTreeSet, HashMap},
    fs::File,
    io::{Read, Seek, SeekFrom},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    core::v1::ServiceAccount,
};
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
    discovery::{Discovery, Scope, verbs},
};
use serde_json::{Value, json};

/// The environment variable naming the control planes' directories (colon-separated).
pub const ENV: &str = "HARVESTER_CLOUD_CONTROL_PLANES";

/// One leased control plane.
pub struct ControlPlane {
    pub dir: PathBuf,
    /// `https://127.0.0.1:<port>`
    pub server: String,
    /// The cluster CA (PEM), which signs the API server's serving certificate.
    pub ca_pem: String,
    /// A `system:masters` client, for seeding and for looking at what a test left behind.
    pub admin: Client,
    users: HashMap<String, String>,
    audit_from: u64,
    _lease: File,
}

fn dirs() -> Vec<PathBuf> {
    let Ok(list) = std::env::var(ENV) else {
        panic!(
            "{ENV} is not set: the Kubernetes-backend tests need real control planes. Run \
             scripts/test.sh, or scripts/control-plane.sh with 2 cargo nextest run …"
        );
    };
    list.split(':')
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .collect()
}

/// The file whose lock is the lease of the control plane in `dir`.
fn lease_file(dir: &Path) -> File {
    File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lease.lock"))
        .unwrap_or_else(|e| panic!("cannot open {}/lease.lock: {e}", dir.display()))
}

/// Takes `n` control planes that no other test holds, waiting for them to be free.
async fn take(n: usize) -> Vec<(PathBuf, File)> {
    let all = dirs();
    assert!(
        all.len() >= n,
        "{ENV} names {} control plane(s); this test needs {n}",
        all.len()
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30 * 60);
    loop {
        let mut held = Vec::new();
        for dir in &all {
            let file = lease_file(dir);
            if file.try_lock().is_ok() {
                held.push((dir.clone(), file));
                if held.len() == n {
                    return held;
                }
            }
        }
        drop(held);
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {n} control plane(s) free in 30 minutes"
        );
        let jitter = rand::random::<u64>() % 40;
        tokio::time::sleep(Duration::from_millis(30 + jitter)).await;
    }
}

impl ControlPlane {
    /// A control plane for this test alone, in its seeded state.
    pub async fn lease() -> ControlPlane {
        let (dir, file) = take(1).await.pop().expect("one");
        Self::prepare(dir, file).await
    }

    /// Two control planes for this test alone (a Harvester cluster and a guest cluster).
    pub async fn lease_two() -> (ControlPlane, ControlPlane) {
        let mut held = take(2).await.into_iter();
        let (d1, f1) = held.next().expect("two");
        let (d2, f2) = held.next().expect("two");
        let a = Self::prepare(d1, f1).await;
        let b = Self::prepare(d2, f2).await;
        (a, b)
    }

    /// The control plane in `dir` (one a test started for itself, outside
    /// `HARVESTER_CLOUD_CONTROL_PLANES`), leased and in its seeded state.
    pub async fn lease_at(dir: &Path) -> ControlPlane {
        let file = lease_file(dir);
        file.lock()
            .unwrap_or_else(|e| panic!("cannot lock {}/lease.lock: {e}", dir.display()));
        Self::prepare(dir.to_path_buf(), file).await
    }

    /// `n` control planes for this test alone (a Harvester cluster and guest clusters).
    pub async fn lease_many(n: usize) -> Vec<ControlPlane> {
        let mut out = Vec::with_capacity(n);
        for (dir, file) in take(n).await {
            out.push(Self::prepare(dir, file).await);
        }
        out
    }

    async fn prepare(dir: PathBuf, lease: File) -> ControlPlane {
        let env = std::fs::read_to_string(dir.join("env"))
            .unwrap_or_else(|e| panic!("{} is not a running control plane: {e}", dir.display()));
        let server = env
            .lines()
            .find_map(|l| l.strip_prefix("KUBE_APISERVER="))
            .expect("KUBE_APISERVER in env")
            .to_string();
        let ca_pem = std::fs::read_to_string(dir.join("pki/ca.crt")).expect("reads the CA");
        let admin = client_from(&dir.join("admin.kubeconfig")).await;
        let users = std::fs::read_to_string(dir.join("pki/users.csv"))
            .expect("reads users.csv")
            .lines()
            .filter_map(|l| {
                let mut f = l.splitn(3, ',');
                let token = f.next()?;
                let user = f.next()?;
                Some((user.to_string(), token.to_string()))
            })
            .collect();
        let cp = ControlPlane {
            audit_from: 0,
            dir,
            server,
            ca_pem,
            admin,
            users,
            _lease: lease,
        };
        let baseline_file = cp.dir.join("baseline.json");
        match std::fs::read(&baseline_file) {
            Ok(bytes) => {
                let baseline: BTreeSet<String> =
                    serde_json::from_slice(&bytes).expect("a baseline");
                cp.reset(&baseline).await;
                super::kube_env::seed(&cp).await;
            }
            Err(_) => {
                super::kube_env::seed(&cp).await;
                super::kube_env::wait_for_controllers(&cp).await;
                let baseline = cp.snapshot().await;
                std::fs::write(&baseline_file, serde_json::to_vec(&baseline).unwrap())
                    .expect("writes the baseline");
            }
        }
        let audit_from = std::fs::metadata(cp.dir.join("audit.log"))
            .map(|m| m.len())
            .unwrap_or(0);
        ControlPlane { audit_from, ..cp }
    }

    /// The kinds a test may leave objects of: everything listable and deletable but what the
    /// control plane keeps for itself.
    async fn resources(&self) -> Vec<(ApiResource, bool)> {
        const SKIP_GROUPS: &[&str] = &[
            "apiregistration.k8s.io",
            "apiextensions.k8s.io",
            "flowcontrol.apiserver.k8s.io",
            "events.k8s.io",
            "scheduling.k8s.io",
            "node.k8s.io",
            "storage.k8s.io",
            "certificates.k8s.io",
            "resource.k8s.io",
            "internal.apiserver.k8s.io",
            "storagemigration.k8s.io",
        ];
        let discovery = Discovery::new(self.admin.clone())
            .exclude(SKIP_GROUPS)
            .run_aggregated()
            .await
            .expect("discovery");
        let mut out = Vec::new();
        for group in discovery.groups() {
            for (ar, caps) in group.recommended_resources() {
                if caps.supports_operation(verbs::LIST) && caps.supports_operation(verbs::DELETE) {
                    out.push((ar, caps.scope == Scope::Namespaced));
                }
            }
        }
        out
    }

    fn key(ar: &ApiResource, obj: &DynamicObject) -> String {
        format!(
            "{}/{}/{}/{}",
            ar.group,
            ar.plural,
            obj.metadata.namespace.as_deref().unwrap_or(""),
            obj.metadata.name.as_deref().unwrap_or("")
        )
    }

    async fn snapshot(&self) -> BTreeSet<String> {
        let mut keys = BTreeSet::new();
        for (ar, _) in self.resources().await {
            let api: Api<DynamicObject> = Api::all_with(self.admin.clone(), &ar);
            for obj in api
                .list(&ListParams::default())
                .await
                .unwrap_or_else(|e| panic!("lists {}: {e}", ar.plural))
            {
                keys.insert(Self::key(&ar, &obj));
            }
        }
        keys
    }

    /// Deletes every object that is not in the baseline, webhooks first (a dead tenant's
    /// `failurePolicy: Fail` webhook would refuse the rest), namespaces last.
    async fn reset(&self, baseline: &BTreeSet<String>) {
        let mut resources = self.resources().await;
        let rank = |ar: &ApiResource| match ar.plural.as_str() {
            "mutatingwebhookconfigurations" | "validatingwebhookconfigurations" => 0,
            "validatingadmissionpolicies" | "validatingadmissionpolicybindings" => 0,
            "namespaces" => 2,
            _ => 1,
        };
        resources.sort_by_key(|(ar, _)| rank(ar));
        for (ar, namespaced) in resources {
            let all: Api<DynamicObject> = Api::all_with(self.admin.clone(), &ar);
            let list = all
                .list(&ListParams::default())
                .await
                .unwrap_or_else(|e| panic!("lists {}: {e}", ar.plural));
            for obj in list {
                if baseline.contains(&Self::key(&ar, &obj)) {
                    continue;
                }
                let name = obj.metadata.name.clone().unwrap_or_default();
                let api: Api<DynamicObject> = match (&obj.metadata.namespace, namespaced) {
                    (Some(ns), true) => Api::namespaced_with(self.admin.clone(), ns, &ar),
                    _ => all.clone(),
                };
                if obj
                    .metadata
                    .finalizers
                    .as_ref()
                    .is_some_and(|f| !f.is_empty())
                {
                    let strip = json!({"metadata": {"finalizers": null}});
                    match api
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&strip))
                        .await
                    {
                        Ok(_) | Err(kube::Error::Api(_)) => {}
                        Err(e) => panic!("strips the finalizers of {}: {e}", Self::key(&ar, &obj)),
                    }
                }
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                };
                match api.delete(&name, &dp).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                    Err(e) => panic!("deletes {}: {e}", Self::key(&ar, &obj)),
                }
            }
        }
    }

    /// The bearer token of one of the control plane's plain users (`alice` in group `team-a`,
    /// `bob`, `carol`, `dave` in `team-a` and `team-b`, `eve`).
    pub fn user_token(&self, user: &str) -> String {
        self.users
            .get(user)
            .unwrap_or_else(|| panic!("no user {user} in users.csv"))
            .clone()
    }

    /// A kubeconfig that authenticates with `token`, its context in `namespace`.
    pub fn kubeconfig_for_token(&self, token: &str, namespace: &str) -> String {
        use base64::Engine;
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: cp\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: cp\n  context:\n    cluster: cp\n    user: u\n    namespace: {namespace}\ncurrent-context: cp\n",
            self.server
        )
    }

    /// A new client from a kubeconfig file (a new connection pool, as a restarted process has).
    pub async fn client_from_kubeconfig(path: &Path) -> Client {
        client_from(path).await
    }

    /// The admin kubeconfig, as text.
    pub fn admin_kubeconfig_yaml(&self) -> String {
        std::fs::read_to_string(self.dir.join("admin.kubeconfig")).expect("reads admin.kubeconfig")
    }

    pub fn admin_kubeconfig_path(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// A token of the ServiceAccount `namespace/name` (TokenRequest, one day).
    pub async fn service_account_token(&self, namespace: &str, name: &str) -> String {
        let sas: Api<ServiceAccount> = Api::namespaced(self.admin.clone(), namespace);
        let req = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![],
                expiration_seconds: Some(86_400),
                ..Default::default()
            },
            ..Default::default()
        };
        sas.create_token_request(name, &PostParams::default(), &req)
            .await
            .unwrap_or_else(|e| panic!("a token for {namespace}/{name}: {e}"))
            .status
            .expect("a TokenRequest status")
            .token
    }

    /// A client as `token`'s user.
    pub async fn client_for_token(&self, token: &str) -> Client {
        let kc = kube::config::Kubeconfig::from_yaml(&self.kubeconfig_for_token(token, "default"))
            .expect("a kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .expect("config");
        Client::try_from(config).expect("client")
    }

    /// An object as the API server has it, `None` when there is none.
    pub async fn object(&self, group: &str, plural: &str, ns: &str, name: &str) -> Option<Value> {
        let ar = self.api_resource(group, plural).await;
        let api: Api<DynamicObject> = if ns.is_empty() {
            Api::all_with(self.admin.clone(), &ar)
        } else {
            Api::namespaced_with(self.admin.clone(), ns, &ar)
        };
        api.get_opt(name)
            .await
            .unwrap_or_else(|e| panic!("reads {plural} {ns}/{name}: {e}"))
            .map(|o| serde_json::to_value(o).expect("JSON"))
    }

    async fn api_resource(&self, group: &str, plural: &str) -> ApiResource {
        let discovery = Discovery::new(self.admin.clone())
            .filter(&[group])
            .run_aggregated()
            .await
            .expect("discovery");
        for g in discovery.groups() {
            for (ar, _) in g.recommended_resources() {
                if ar.plural == plural {
                    return ar;
                }
            }
        }
        panic!("no resource {plural} in group {group:?}");
    }

    /// What the API server audited since the lease began, one entry per request (the service, the
    /// ccm and plain users; the control plane's own clients and the tests' admin are not audited).
    pub fn audit(&self) -> Vec<Audited> {
        let mut file = File::open(self.dir.join("audit.log")).expect("opens audit.log");
        file.seek(SeekFrom::Start(self.audit_from)).expect("seeks");
        let mut text = String::new();
        file.read_to_string(&mut text).expect("reads audit.log");
        let mut order = Vec::new();
        let mut by_id: HashMap<String, Audited> = HashMap::new();
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let id = v["auditID"].as_str().unwrap_or_default().to_string();
            let entry = Audited {
                user: v["user"]["username"].as_str().unwrap_or_default().into(),
                verb: v["verb"].as_str().unwrap_or_default().into(),
                uri: v["requestURI"].as_str().unwrap_or_default().into(),
                resource: v["objectRef"]["resource"]
                    .as_str()
                    .unwrap_or_default()
                    .into(),
                namespace: v["objectRef"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .into(),
                code: v["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
                reason: v["annotations"]["authorization.k8s.io/reason"]
                    .as_str()
                    .unwrap_or_default()
                    .into(),
            };
            if !by_id.contains_key(&id) {
                order.push(id.clone());
            }
            by_id.insert(id, entry);
        }
        order
            .into_iter()
            .filter_map(|id| by_id.remove(&id))
            .collect()
    }

    /// The requests of `user` that were refused (401 or 403) since the lease began.
    pub fn refused(&self, user: &str) -> Vec<Audited> {
        self.audit()
            .into_iter()
            .filter(|a| a.user == user && (a.code == 401 || a.code == 403))
            .collect()
    }

    /// A probe that later says whether any of `users` was refused from now on.
    pub fn refusal_probe(&self, users: &[&str]) -> RefusalProbe {
        RefusalProbe {
            audit: self.dir.join("audit.log"),
            from: std::fs::metadata(self.dir.join("audit.log"))
                .map(|m| m.len())
                .unwrap_or(0),
            users: users.iter().map(|u| u.to_string()).collect(),
        }
    }

    /// Makes the token controller's writes to Secrets in `namespace` wait `delay` (or, with
    /// `None`, refuses them, so no token ever arrives) until the returned guard is dropped.
    pub async fn hold_tokens(&self, namespace: &str, delay: Option<Duration>) -> TokenFault {
        TokenFault::install(self, namespace, delay).await
    }
}

/// Whether some users were refused anything since the probe was taken (see
/// [`ControlPlane::refusal_probe`]).
pub struct RefusalProbe {
    audit: PathBuf,
    from: u64,
    users: Vec<String>,
}

impl RefusalProbe {
    /// Fails the test if the API server refused any of the users a request (401 or 403), even
    /// one whose refusal the caller only logged.
    pub fn assert_none_refused(&self) {
        let mut file = File::open(&self.audit).expect("opens audit.log");
        file.seek(SeekFrom::Start(self.from)).expect("seeks");
        let mut text = String::new();
        file.read_to_string(&mut text).expect("reads audit.log");
        let refused: Vec<String> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| {
                let code = v["responseStatus"]["code"].as_u64().unwrap_or(0);
                let user = v["user"]["username"].as_str().unwrap_or_default();
                (code == 401 || code == 403) && self.users.iter().any(|u| u == user)
            })
            .map(|v| {
                format!(
                    "{} {} {}: {}",
                    v["user"]["username"].as_str().unwrap_or_default(),
                    v["verb"].as_str().unwrap_or_default(),
                    v["requestURI"].as_str().unwrap_or_default(),
                    v["responseStatus"]["code"]
                )
            })
            .collect();
        assert!(refused.is_empty(), "the API server refused: {refused:#?}");
    }
}

/// One audited request.
#[derive(Clone, Debug)]
pub struct Audited {
    pub user: String,
    pub verb: String,
    pub uri: String,
    pub resource: String,
    pub namespace: String,
    pub code: u16,
    pub reason: String,
}

async fn client_from(path: &Path) -> Client {
    let kc = kube::config::Kubeconfig::read_from(path).expect("reads a kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}

/// A validating webhook, served by this test process, that the API server calls on the token
/// controller's Secret updates in one namespace: it answers after a delay, or refuses.
pub struct TokenFault {
    task: tokio::task::JoinHandle<()>,
    admin: Client,
    name: String,
}

impl TokenFault {
    async fn install(cp: &ControlPlane, namespace: &str, delay: Option<Duration>) -> TokenFault {
        use hyper::{Request, Response, body::Incoming, service::service_fn};
        use hyper_util::rt::{TokioExecutor, TokioIo};

        let key = rcgen::KeyPair::generate().expect("a key");
        let mut params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("params");
        params.subject_alt_names = vec![rcgen::SanType::IpAddress([127, 0, 0, 1].into())];
        let cert = params.self_signed(&key).expect("a certificate");
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .expect("a TLS config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let port = listener.local_addr().expect("addr").port();
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let counted = counted.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let counted = counted.clone();
                        async move {
                            use http_body_util::BodyExt;
                            counted.fetch_add(1, Ordering::SeqCst);
                            let body = req.into_body().collect().await?.to_bytes();
                            let review: Value = serde_json::from_slice(&body).unwrap_or_default();
                            let uid = review["request"]["uid"].clone();
                            let response = match delay {
                                Some(d) => {
                                    tokio::time::sleep(d).await;
                                    json!({"uid": uid, "allowed": true})
                                }
                                None => json!({"uid": uid, "allowed": false,
                                "status": {"code": 403, "message": "held by the test"}}),
                            };
                            let out = json!({"apiVersion": "admission.k8s.io/v1",
                            "kind": "AdmissionReview", "response": response});
                            Ok::<_, hyper::Error>(
                                Response::builder()
                                    .header("content-type", "application/json")
                                    .body(http_body_util::Full::new(bytes_of(&out)))
                                    .expect("a response"),
                            )
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        use base64::Engine;
        let ca = base64::engine::general_purpose::STANDARD.encode(cert.pem());
        let name = format!("test-token-fault-{namespace}");
        let config = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{
                "name": "token-fault.tests.harvester-cloud.io",
                "clientConfig": {"url": format!("https://127.0.0.1:{port}/"), "caBundle": ca},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                           "resources": ["secrets"], "scope": "Namespaced"}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "matchConditions": [{"name": "token-controller",
                    "expression": "request.userInfo.username == 'system:kube-controller-manager'"}],
                // A dead test's webhook must not hold a later tenant's tokens.
                "failurePolicy": "Ignore",
                "sideEffects": "None",
                "timeoutSeconds": 30,
                "admissionReviewVersions": ["v1"],
            }]
        });
        let ar = ApiResource {
            group: "admissionregistration.k8s.io".into(),
            version: "v1".into(),
            api_version: "admissionregistration.k8s.io/v1".into(),
            kind: "ValidatingWebhookConfiguration".into(),
            plural: "validatingwebhookconfigurations".into(),
        };
        let api: Api<DynamicObject> = Api::all_with(cp.admin.clone(), &ar);
        api.create(
            &PostParams::default(),
            &serde_json::from_value(config).expect("an object"),
        )
        .await
        .expect("registers the token fault webhook");
        // The API server picks a new webhook configuration up asynchronously: wait until it is
        // called.
        wait_for_webhook(cp, namespace, &calls).await;
        TokenFault {
            task,
            admin: cp.admin.clone(),
            name,
        }
    }

    /// Removes the fault: the token controller's writes go through again.
    pub async fn release(self) {
        let ar = ApiResource {
            group: "admissionregistration.k8s.io".into(),
            version: "v1".into(),
            api_version: "admissionregistration.k8s.io/v1".into(),
            kind: "ValidatingWebhookConfiguration".into(),
            plural: "validatingwebhookconfigurations".into(),
        };
        let api: Api<DynamicObject> = Api::all_with(self.admin.clone(), &ar);
        let _ = api.delete(&self.name, &DeleteParams::default()).await;
        self.task.abort();
    }
}

impl Drop for TokenFault {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn bytes_of(v: &Value) -> hyper::body::Bytes {
    hyper::body::Bytes::from(serde_json::to_vec(v).expect("JSON"))
}

/// Waits until the API server calls the fault webhook, probing with throwaway ServiceAccount
/// token Secrets in `namespace` (the token controller's update of each is what it sees).
async fn wait_for_webhook(cp: &ControlPlane, namespace: &str, calls: &AtomicUsize) {
    use k8s_openapi::api::core::v1::Secret;
    let sas: Api<ServiceAccount> = Api::namespaced(cp.admin.clone(), namespace);
    let secrets: Api<Secret> = Api::namespaced(cp.admin.clone(), namespace);
    for attempt in 0..100 {
        let name = format!("fault-probe-{attempt}");
        let sa: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name}})).expect("sa");
        sas.create(&PostParams::default(), &sa)
            .await
            .expect("creates a probe ServiceAccount");
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": {"kubernetes.io/service-account.name": name}},
            "type": "kubernetes.io/service-account-token"
        }))
        .expect("secret");
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("creates a probe token Secret");
        for _ in 0..40 {
            if calls.load(Ordering::SeqCst) > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = secrets.delete(&name, &DeleteParams::default()).await;
        let _ = sas.delete(&name, &DeleteParams::default()).await;
        if calls.load(Ordering::SeqCst) > 0 {
            return;
        }
    }
    panic!("the API server never called the token fault webhook");
}
