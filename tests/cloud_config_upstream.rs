//! Harvester's own cloud-config handler as a differential peer: the same corpus of requests goes to
//! `tools/upstream-cloudconfig` (harvester/harvester's `pkg/api/kubeconfig`, served as Harvester's
//! router serves it) and to our service on the Kubernetes backend with the chart's RBAC, on the same
//! control plane, and their statuses, normalized bodies and the objects each made are compared.
//!
//! Every difference must be one that the manual lists, with its reason, in the table under "Where
//! we differ from Harvester on purpose" in docs/src/api.md (the test reads that table): an unlisted difference fails,
//! and so does a listed one that no longer differs. A row names the Harvester lines it holds for
//! (`v1.8`, `v1.9`), so the same table serves the peer built from the module proxy (v1.8.0, the
//! newest release there) and one built from a v1.9 checkout (`scripts/interop-cloudconfig.sh`).
//!
//! The peer binary comes from `HARVESTER_CLOUD_UPSTREAM_CLOUDCONFIG`, else from
//! `scripts/upstream-cloudconfig.sh build` (cached; `scripts/test.sh` builds it before the tests).
//! There is no skip: without Go or the module proxy the build fails, and so does the test.

#[macro_use]
mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use axum::http::Method;
use base64::{Engine, engine::general_purpose::STANDARD as B64};
use k8s_openapi::api::{
    core::v1::{ConfigMap, Secret, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::{Value, json};
use support::{Backend, KubeBackend, control_plane::ControlPlane, eventually};

const ENV_BINARY: &str = "HARVESTER_CLOUD_UPSTREAM_CLOUDCONFIG";
const CLOUDPROVIDER: &str = "harvesterhci.io:cloudprovider";

// --- the corpus -----------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Auth {
    /// Ours: the admin's Rancher token. Harvester: what Rancher's proxy sends for that admin.
    Admin,
    /// No credentials at all.
    None,
}

struct Step {
    method: Method,
    /// Path and query.
    uri: String,
    body: String,
    auth: Auth,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setup {
    Nothing,
    /// The ClusterRole `harvesterhci.io:cloudprovider` is deleted for the case, then restored.
    NoCloudProviderRole,
    /// Harvester's `vip` ConfigMap holds this `ip` for the case (`None`: there is no ConfigMap),
    /// then the seeded VIP again.
    Vip(Option<&'static str>),
}

struct Case {
    id: &'static str,
    setup: Setup,
    /// The accounts whose objects are compared (and removed afterwards).
    accounts: Vec<(String, String)>,
    steps: Vec<Step>,
}

const PATH: &str = "/v1/harvester/kubeconfig";

fn post(body: impl Into<String>) -> Step {
    Step {
        method: Method::POST,
        uri: PATH.into(),
        body: body.into(),
        auth: Auth::Admin,
    }
}

fn get(query: &str) -> Step {
    Step {
        method: Method::GET,
        uri: format!("{PATH}?{query}"),
        body: String::new(),
        auth: Auth::Admin,
    }
}

/// The body the Rancher dashboard sends.
fn dashboard(ns: &str, sa: &str) -> String {
    json!({"csiClusterRoleName": "harvesterhci.io:csi-driver", "clusterRoleName": CLOUDPROVIDER,
           "namespace": ns, "serviceAccountName": sa})
    .to_string()
}

fn with(ns: &str, sa: &str, extra: Value) -> String {
    let mut v =
        json!({"clusterRoleName": CLOUDPROVIDER, "namespace": ns, "serviceAccountName": sa});
    for (k, x) in extra.as_object().expect("an object") {
        v[k] = x.clone();
    }
    v.to_string()
}

fn case(id: &'static str, accounts: &[(&str, &str)], steps: Vec<Step>) -> Case {
    Case {
        id,
        setup: Setup::Nothing,
        accounts: accounts
            .iter()
            .map(|(n, s)| (n.to_string(), s.to_string()))
            .collect(),
        steps,
    }
}

fn corpus() -> Vec<Case> {
    let long_ns = "guest-cluster-namespace-with-a-rather-long-name";
    let long_sa = "guest-cluster-service-account-name";
    let sa60 = "a".repeat(60);
    let sa63 = format!("s{}", "x".repeat(62));
    let q = |ns: &str, sa: &str| format!("namespace={ns}&serviceAccountName={sa}");
    vec![
        case(
            "post-dashboard",
            &[("gc-test", "dash")],
            vec![post(dashboard("gc-test", "dash"))],
        ),
        case(
            "post-repeated",
            &[("gc-test", "again")],
            vec![
                post(dashboard("gc-test", "again")),
                post(dashboard("gc-test", "again")),
                post(dashboard("gc-test", "again")),
            ],
        ),
        case(
            "post-without-clusterrolename",
            &[("gc-test", "bare")],
            vec![post(
                json!({"namespace": "gc-test", "serviceAccountName": "bare"}).to_string(),
            )],
        ),
        case(
            "post-cloud-init",
            &[("gc-test", "ci")],
            vec![post(with("gc-test", "ci", json!({"outputFormat": "yaml"})))],
        ),
        case(
            "post-outputformat-not-yaml",
            &[("gc-test", "upper")],
            vec![post(with(
                "gc-test",
                "upper",
                json!({"outputFormat": "YAML"}),
            ))],
        ),
        case(
            "post-keys-any-case",
            &[("gc-test", "cased")],
            vec![post(
                r#"{"ClusterRoleName":"harvesterhci.io:cloudprovider","NAMESPACE":"gc-test","ServiceAccountName":"cased","unknown":1} trailing"#,
            )],
        ),
        case(
            "get-after-post",
            &[("gc-test", "fetched")],
            vec![
                post(dashboard("gc-test", "fetched")),
                get(&q("gc-test", "fetched")),
                get(&format!("{}&outputFormat=yaml", q("gc-test", "fetched"))),
            ],
        ),
        case(
            "get-missing-account",
            &[("gc-test", "absent")],
            vec![get(&q("gc-test", "absent"))],
        ),
        case("get-without-names", &[], vec![get("namespace=gc-test")]),
        case("post-empty-body", &[], vec![post("")]),
        case("post-null", &[], vec![post("null")]),
        case("post-not-json", &[], vec![post("{\"namespace\":")]),
        case(
            "post-wrong-type",
            &[],
            vec![post(
                r#"{"clusterRoleName":"harvesterhci.io:cloudprovider","namespace":1,"serviceAccountName":"x"}"#,
            )],
        ),
        case("post-empty-names", &[], vec![post(with("", "", json!({})))]),
        case(
            "post-other-clusterrole",
            &[("gc-test", "other")],
            vec![post(with(
                "gc-test",
                "other",
                json!({"clusterRoleName": "no-such-role"}),
            ))],
        ),
        case(
            "post-cluster-admin",
            &[("gc-test", "admin-asked")],
            vec![post(with(
                "gc-test",
                "admin-asked",
                json!({"clusterRoleName": "cluster-admin"}),
            ))],
        ),
        case(
            "post-missing-namespace",
            &[("no-such-namespace", "gc")],
            vec![post(dashboard("no-such-namespace", "gc"))],
        ),
        Case {
            id: "post-missing-clusterrole",
            setup: Setup::NoCloudProviderRole,
            accounts: vec![("gc-test".into(), "norole".into())],
            steps: vec![post(dashboard("gc-test", "norole"))],
        },
        Case {
            id: "post-invalid-vip",
            setup: Setup::Vip(Some("not-an-ip")),
            accounts: vec![("gc-test".into(), "badvip".into())],
            steps: vec![post(dashboard("gc-test", "badvip"))],
        },
        Case {
            id: "post-missing-vip-configmap",
            setup: Setup::Vip(None),
            accounts: vec![("gc-test".into(), "novip".into())],
            steps: vec![post(dashboard("gc-test", "novip"))],
        },
        case(
            "post-invalid-name",
            &[("gc-test", "Not_A_Name")],
            vec![post(dashboard("gc-test", "Not_A_Name"))],
        ),
        case(
            "post-dotted-name",
            &[("gc-test", "gc.v2")],
            vec![post(dashboard("gc-test", "gc.v2"))],
        ),
        case(
            "post-long-names",
            &[(long_ns, long_sa)],
            vec![post(dashboard(long_ns, long_sa)), get(&q(long_ns, long_sa))],
        ),
        case(
            "post-name-past-63",
            &[("gc-test", sa60.as_str())],
            vec![post(dashboard("gc-test", &sa60))],
        ),
        case(
            "post-name-of-63",
            &[("gc-test", sa63.as_str())],
            vec![post(dashboard("gc-test", &sa63))],
        ),
        case(
            "post-binding-name-collision",
            &[("a-b", "c"), ("a", "b-c")],
            vec![post(dashboard("a-b", "c")), post(dashboard("a", "b-c"))],
        ),
        case(
            "post-unauthenticated",
            &[("gc-test", "anon")],
            vec![Step {
                auth: Auth::None,
                ..post(dashboard("gc-test", "anon"))
            }],
        ),
        case(
            "post-trailing-slash",
            &[],
            vec![Step {
                uri: format!("{PATH}/"),
                ..post(dashboard("gc-test", "slash"))
            }],
        ),
        case(
            "put",
            &[],
            vec![Step {
                method: Method::PUT,
                ..post(dashboard("gc-test", "put"))
            }],
        ),
    ]
}

// --- the peer -------------------------------------------------------------------------------------

fn peer_binary() -> PathBuf {
    if let Ok(path) = std::env::var(ENV_BINARY) {
        return PathBuf::from(path);
    }
    let out = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/upstream-cloudconfig.sh"
    ))
    .arg("build")
    .stderr(Stdio::inherit())
    .output()
    .expect("runs scripts/upstream-cloudconfig.sh (Go must be installed)");
    assert!(
        out.status.success(),
        "scripts/upstream-cloudconfig.sh build failed"
    );
    PathBuf::from(String::from_utf8(out.stdout).expect("a path").trim())
}

struct Peer {
    child: Child,
    base: String,
    /// `v1.8`, `v1.9`: the line of the Harvester version the peer was built against.
    line: String,
    version: String,
    log: PathBuf,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Peer {
    fn start(kubeconfig: &std::path::Path) -> Peer {
        let bin = peer_binary();
        let out = Command::new(&bin)
            .arg("--version")
            .output()
            .expect("runs the peer");
        let version = String::from_utf8(out.stdout)
            .expect("UTF-8")
            .trim()
            .to_string();
        let line = version.split('.').take(2).collect::<Vec<_>>().join(".");
        assert!(
            line == "v1.8" || line == "v1.9",
            "the peer was built against harvester {version:?}; docs/src/api.md's table knows v1.8 and v1.9"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("peer.log");
        let addr_file = dir.path().join("addr");
        let child = Command::new(&bin)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--addr-file")
            .arg(&addr_file)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("starts the peer");
        let mut peer = Peer {
            child,
            base: String::new(),
            line,
            version,
            log,
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("client"),
            _dir: dir,
        };
        // Its caches sync before it writes the address.
        for _ in 0..6000 {
            if let Ok(a) = std::fs::read_to_string(&addr_file) {
                peer.base = format!("http://{a}");
                return peer;
            }
            if let Ok(Some(status)) = peer.child.try_wait() {
                panic!("the peer exited ({status}):\n{}", peer.log_text());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the peer did not start:\n{}", peer.log_text());
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn send(&self, step: &Step) -> Answer {
        let mut req = self
            .http
            .request(step.method.clone(), format!("{}{}", self.base, step.uri))
            .body(step.body.clone());
        if step.auth == Auth::Admin {
            // What Rancher's proxy sends for the admin it authenticated.
            req = req
                .header("Impersonate-User", "user-admin")
                .header("Impersonate-Extra-Username", "admin")
                .header("Impersonate-Extra-Principalid", "local://user-admin");
        }
        let resp = req.send().await.expect("the peer answers");
        let status = resp.status().as_u16();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let (content_type, location) = (header("content-type"), header("location"));
        let body = resp.bytes().await.expect("a body").to_vec();
        Answer {
            status,
            content_type,
            location,
            body,
        }
    }

    /// What the peer's informer cache holds of an object: its resourceVersion, or `None`.
    async fn cached(&self, kind: &str, ns: &str, name: &str) -> Option<String> {
        let v: Value = self
            .http
            .get(format!("{}/peer/cache", self.base))
            .query(&[("kind", kind), ("namespace", ns), ("name", name)])
            .send()
            .await
            .expect("the peer answers")
            .json()
            .await
            .expect("JSON");
        v["exists"].as_bool().expect("exists").then(|| {
            v["resourceVersion"]
                .as_str()
                .expect("a version")
                .to_string()
        })
    }

    /// Whether the peer's caches hold exactly these versions of `objects` (`None`: absent).
    async fn holds(&self, objects: &[Obj]) -> bool {
        for o in objects {
            if self.cached(o.kind, &o.ns, &o.name).await != o.version {
                return false;
            }
        }
        true
    }

    /// Waits until the peer's caches hold exactly the versions of `objects` (absent ones absent):
    /// the handler reads nothing else, so this is what makes a sequence of requests mean the same
    /// to it as to a client of the API server.
    async fn catch_up(&self, objects: &[Obj]) {
        eventually("the peer's caches to catch up", async || {
            self.holds(objects).await.then_some(())
        })
        .await;
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One answer, fully read.
#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: String,
    location: String,
    body: Vec<u8>,
}

async fn ours(b: &KubeBackend, step: &Step) -> Answer {
    let token = (step.auth == Auth::Admin).then(|| b.admin_token());
    let r = b
        .call(
            step.method.clone(),
            &step.uri,
            token.as_deref(),
            step.body.clone(),
        )
        .await;
    let header = |name: &str| {
        r.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    Answer {
        status: r.status.as_u16(),
        content_type: header("content-type"),
        location: header("location"),
        body: r.body.clone(),
    }
}

// --- objects --------------------------------------------------------------------------------------

/// An object of an account as the API server has it.
#[derive(Clone, Debug)]
struct Obj {
    kind: &'static str,
    ns: String,
    name: String,
    version: Option<String>,
    value: Value,
}

fn obj<K: serde::Serialize + kube::Resource>(kind: &'static str, o: &K) -> Obj {
    Obj {
        kind,
        ns: o.meta().namespace.clone().unwrap_or_default(),
        name: o.meta().name.clone().unwrap_or_default(),
        version: o.meta().resource_version.clone(),
        value: serde_json::to_value(o).expect("JSON"),
    }
}

fn is_subject(
    subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>,
    ns: &str,
    sa: &str,
) -> bool {
    subjects
        .iter()
        .flatten()
        .any(|s| s.kind == "ServiceAccount" && s.name == sa && s.namespace.as_deref() == Some(ns))
}

/// Every object of the accounts, whatever its name: the ServiceAccount, the token Secrets made for
/// it, and the bindings whose subject it is.
async fn objects_of(client: &kube::Client, accounts: &[(String, String)]) -> Vec<Obj> {
    let mut out = Vec::new();
    let crbs: Api<ClusterRoleBinding> = Api::all(client.clone());
    let all_crbs = crbs.list(&ListParams::default()).await.expect("lists CRBs");
    for (ns, sa) in accounts {
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
        if let Some(o) = sas.get_opt(sa).await.expect("reads the SA") {
            out.push(obj("serviceaccount", &o));
        }
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
        for o in secrets
            .list(&ListParams::default())
            .await
            .expect("lists Secrets")
        {
            let for_sa = o
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("kubernetes.io/service-account.name"));
            if for_sa.map(String::as_str) == Some(sa.as_str()) {
                out.push(obj("secret", &o));
            }
        }
        let rbs: Api<RoleBinding> = Api::namespaced(client.clone(), ns);
        for o in rbs.list(&ListParams::default()).await.expect("lists RBs") {
            if is_subject(&o.subjects, ns, sa) {
                out.push(obj("rolebinding", &o));
            }
        }
        for o in &all_crbs {
            if is_subject(&o.subjects, ns, sa) {
                out.push(obj("clusterrolebinding", o));
            }
        }
    }
    out
}

/// Deletes the accounts' objects and waits until the API server and the peer's caches have none.
async fn remove(client: &kube::Client, peer: &Peer, accounts: &[(String, String)]) {
    let found = objects_of(client, accounts).await;
    for o in &found {
        let dp = DeleteParams::default();
        let r = match o.kind {
            "serviceaccount" => Api::<ServiceAccount>::namespaced(client.clone(), &o.ns)
                .delete(&o.name, &dp)
                .await
                .map(|_| ()),
            "secret" => Api::<Secret>::namespaced(client.clone(), &o.ns)
                .delete(&o.name, &dp)
                .await
                .map(|_| ()),
            "rolebinding" => Api::<RoleBinding>::namespaced(client.clone(), &o.ns)
                .delete(&o.name, &dp)
                .await
                .map(|_| ()),
            _ => Api::<ClusterRoleBinding>::all(client.clone())
                .delete(&o.name, &dp)
                .await
                .map(|_| ()),
        };
        match r {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => panic!("deletes {} {}/{}: {e}", o.kind, o.ns, o.name),
        }
    }
    eventually("the accounts' objects to be gone", async || {
        objects_of(client, accounts).await.is_empty().then_some(())
    })
    .await;
    let gone: Vec<Obj> = found
        .into_iter()
        .map(|o| Obj { version: None, ..o })
        .collect();
    peer.catch_up(&gone).await;
}

// --- normalization --------------------------------------------------------------------------------

/// The differences every case would show, normalized away by checked rules: each rule notes when
/// it applied, and a rule the manual lists that never applied is a listed difference that is gone.
#[derive(Default)]
struct Seen(BTreeSet<&'static str>);

/// Replaces every UUID in `s` with `<uid>`.
fn mask_uids(s: &str) -> String {
    let b = s.as_bytes();
    let is_uuid = |w: &[u8]| {
        w.len() == 36
            && w.iter().enumerate().all(|(i, c)| match i {
                8 | 13 | 18 | 23 => *c == b'-',
                _ => c.is_ascii_hexdigit(),
            })
    };
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        if i + 36 <= b.len() && is_uuid(&b[i..i + 36]) {
            out.push_str("<uid>");
            i += 36;
        } else {
            let ch = s[i..].chars().next().expect("a char");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// The tokens of the accounts' Secrets, to name a kubeconfig's token by the Secret it came from.
fn tokens(objects: &[Obj]) -> BTreeMap<String, String> {
    objects
        .iter()
        .filter(|o| o.kind == "secret")
        .filter_map(|o| {
            let t = o.value["data"]["token"].as_str()?;
            let t = String::from_utf8(B64.decode(t).ok()?).ok()?;
            Some((t, format!("{}/{}", o.ns, o.name)))
        })
        .collect()
}

/// A kubeconfig with its token named by its Secret and its CA named when it is the cluster's.
fn normalize_kubeconfig(
    text: &str,
    tokens: &BTreeMap<String, String>,
    ca_b64: &str,
    seen: &mut Seen,
    upstream: bool,
) -> String {
    let mut lines = Vec::new();
    for line in text.split_inclusive('\n') {
        if upstream && line == "preferences: {}\n" {
            // client-go before 0.34 writes empty preferences; v1.9's does not, nor do we.
            seen.0.insert("all-preferences");
            continue;
        }
        if let Some(t) = line.strip_prefix("    token: ") {
            let t = t.trim_end_matches('\n');
            let name = tokens
                .get(t)
                .map_or("<a token of no Secret of the account>".to_string(), |s| {
                    format!("<token of {s}>")
                });
            lines.push(format!("    token: {name}\n"));
            continue;
        }
        lines.push(line.replace(ca_b64, "<the cluster CA>"));
    }
    lines.concat()
}

/// A body as compared: content type, then the text, with tokens, CAs and UIDs named; errors of
/// both shapes as `Code: message`.
fn normalize_body(
    a: &Answer,
    tokens: &BTreeMap<String, String>,
    ca_b64: &str,
    seen: &mut Seen,
    upstream: bool,
) -> String {
    let text = String::from_utf8_lossy(&a.body).to_string();
    let location = if a.location.is_empty() {
        String::new()
    } else {
        format!("location: {}\n", a.location)
    };
    if a.status >= 400 {
        let parsed = if upstream {
            // `<Code> <status>: <message>`, plain text, no Content-Type of its own.
            text.split_once(": ").and_then(|(head, msg)| {
                let (code, status) = head.split_once(' ')?;
                (status == a.status.to_string()).then(|| format!("{code}: {msg}"))
            })
        } else {
            serde_json::from_str::<Value>(&text).ok().and_then(|v| {
                Some(format!(
                    "{}: {}",
                    v["code"].as_str()?,
                    v["message"].as_str()?
                ))
            })
        };
        if let Some(p) = parsed {
            seen.0.insert("all-error-shape");
            return format!("{location}error {}", mask_uids(&p));
        }
        return format!(
            "{location}content-type: {}\n{}",
            a.content_type,
            mask_uids(&text)
        );
    }
    let body = if a.content_type == "application/json" {
        match serde_json::from_str::<String>(&text) {
            // The JSON string literal itself is compared: only the token and CA inside are named.
            Ok(k) => {
                let n = normalize_kubeconfig(&k, tokens, ca_b64, seen, upstream);
                let encoded = serde_json::to_string(&k).expect("JSON");
                if encoded == text {
                    format!("a JSON string of:\n{n}")
                } else {
                    format!("a JSON string, encoded as {text:?}, of:\n{n}")
                }
            }
            Err(_) => text,
        }
    } else if a.content_type.starts_with("application/x-yaml") {
        // Cloud-init: each base64 kubeconfig decoded and normalized.
        text.split_inclusive('\n')
            .map(|l| match l.strip_prefix("  content: ") {
                Some(b) => match B64
                    .decode(b.trim_end())
                    .ok()
                    .and_then(|k| String::from_utf8(k).ok())
                {
                    Some(k) => format!(
                        "  content: <base64 of:\n{}>\n",
                        normalize_kubeconfig(&k, tokens, ca_b64, seen, upstream)
                    ),
                    None => l.to_string(),
                },
                None => l.to_string(),
            })
            .collect()
    } else {
        text
    };
    format!(
        "{location}content-type: {}\n{}",
        a.content_type,
        mask_uids(&body)
    )
}

/// An object as compared: what a client would read, less what the API server fills in for
/// anyone (UIDs, versions, times, managers), and less our listed additions (checked rules).
fn normalize_object(o: &Obj, seen: &mut Seen, upstream: bool) -> String {
    let mut v = o.value.clone();
    let meta = v["metadata"].as_object_mut().expect("metadata");
    for k in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "managedFields",
        "generation",
    ] {
        meta.remove(k);
    }
    if !upstream {
        let labels = meta.get_mut("labels").and_then(Value::as_object_mut);
        if let Some(l) = labels
            && l.remove("app.kubernetes.io/managed-by").as_ref() == Some(&json!("harvester-cloud"))
        {
            seen.0.insert("all-managed-by");
            if l.is_empty() {
                meta.remove("labels");
            }
        }
        if o.kind == "clusterrolebinding" {
            let annotation = meta
                .get_mut("annotations")
                .and_then(Value::as_object_mut)
                .and_then(|a| a.remove("harvester-cloud.io/serviceaccount-uid"));
            if let Some(uid) = annotation
                && meta.get("ownerReferences").is_none()
            {
                seen.0.insert("all-crb-owner");
                if meta["annotations"]
                    .as_object()
                    .is_some_and(|a| a.is_empty())
                {
                    meta.remove("annotations");
                }
                let sa = v["subjects"][0]["name"].clone();
                v["metadata"]["ownerReferences"] = json!([{
                    "apiVersion": "v1", "kind": "ServiceAccount", "name": sa, "uid": uid
                }]);
            }
        }
    }
    if let Some(data) = v.get_mut("data").and_then(Value::as_object_mut) {
        for (_, x) in data.iter_mut() {
            *x = json!("<data>");
        }
    }
    format!(
        "{} {}/{}: {}",
        o.kind,
        o.ns,
        o.name,
        mask_uids(&serde_json::to_string(&v).expect("JSON"))
    )
}

// --- running a case on each side ------------------------------------------------------------------

struct Side {
    answers: Vec<(u16, String)>,
    objects: Vec<String>,
}

async fn run_ours(b: &KubeBackend, peer: &Peer, c: &Case, ca_b64: &str, seen: &mut Seen) -> Side {
    let mut raw = Vec::new();
    for step in &c.steps {
        raw.push(ours(b, step).await);
    }
    let found = objects_of(&b.client, &c.accounts).await;
    let side = summarize(&raw, &found, ca_b64, seen, false);
    remove(&b.client, peer, &c.accounts).await;
    side
}

async fn run_upstream(
    client: &kube::Client,
    peer: &Peer,
    c: &Case,
    ca_b64: &str,
    seen: &mut Seen,
) -> Side {
    let mut raw = Vec::new();
    for step in &c.steps {
        let mut answer = peer.send(step).await;
        // Harvester gives the token controller 3 s; on a loaded machine it can take longer, and a
        // client then sends the same POST again (it reuses what the first one made). That is a
        // property of the machine, not of either handler, so the step is sent again, at most twice.
        for _ in 0..2 {
            let text = String::from_utf8_lossy(&answer.body);
            if !(answer.status == 422 && text.contains("timeout while waiting for secret")) {
                break;
            }
            eprintln!(
                "{}: Harvester timed out waiting for a token; sending it again",
                c.id
            );
            answer = peer.send(step).await;
        }
        raw.push(answer);
        // The next request must find in the handler's caches what this one made. The API server is
        // read again on every look: the token controller may still be writing a Secret.
        eventually(
            "the peer's caches to hold what the API server has",
            async || {
                let now = objects_of(client, &c.accounts).await;
                peer.holds(&now).await.then_some(())
            },
        )
        .await;
    }
    let found = objects_of(client, &c.accounts).await;
    let side = summarize(&raw, &found, ca_b64, seen, true);
    remove(client, peer, &c.accounts).await;
    side
}

fn summarize(raw: &[Answer], found: &[Obj], ca_b64: &str, seen: &mut Seen, upstream: bool) -> Side {
    let toks = tokens(found);
    let mut objects: Vec<String> = found
        .iter()
        .map(|o| normalize_object(o, seen, upstream))
        .collect();
    objects.sort();
    Side {
        answers: raw
            .iter()
            .map(|a| (a.status, normalize_body(a, &toks, ca_b64, seen, upstream)))
            .collect(),
        objects,
    }
}

/// Sets the `vip` ConfigMap's `ip` (`None`: deletes the ConfigMap) and waits for the peer to see it.
async fn set_vip(client: &kube::Client, peer: &Peer, vip: Option<&str>) {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "harvester-system");
    match vip {
        Some(ip) => support::kube_env::set_vip(client, ip).await,
        None => match cms.delete("vip", &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => panic!("deletes the vip ConfigMap: {e}"),
        },
    }
    let now = match cms.get_opt("vip").await.expect("reads the vip ConfigMap") {
        Some(cm) => obj("configmap", &cm),
        None => Obj {
            kind: "configmap",
            ns: "harvester-system".into(),
            name: "vip".into(),
            version: None,
            value: Value::Null,
        },
    };
    peer.catch_up(&[now]).await;
}

/// Deletes the ClusterRole for the case; returns it, to restore.
async fn drop_cloudprovider_role(client: &kube::Client, peer: &Peer) -> ClusterRole {
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let role = roles.get(CLOUDPROVIDER).await.expect("the seeded role");
    roles
        .delete(CLOUDPROVIDER, &DeleteParams::default())
        .await
        .expect("deletes the role");
    peer.catch_up(&[Obj {
        kind: "clusterrole",
        ns: String::new(),
        name: CLOUDPROVIDER.into(),
        version: None,
        value: Value::Null,
    }])
    .await;
    role
}

async fn restore_role(client: &kube::Client, peer: &Peer, mut role: ClusterRole) {
    role.metadata = kube::api::ObjectMeta {
        name: role.metadata.name.clone(),
        labels: role.metadata.labels.clone(),
        annotations: role.metadata.annotations.clone(),
        ..Default::default()
    };
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let made = roles
        .create(&PostParams::default(), &role)
        .await
        .expect("restores the role");
    peer.catch_up(&[obj("clusterrole", &made)]).await;
}

// --- the manual's table (docs/src/api.md) ------------------------------------------------------------

/// One row of the manual's table: a case (or an `all-…` rule) that differs on purpose from the
/// Harvester lines it names (a case may have a row for each line).
#[derive(Debug)]
struct Listed {
    lines: BTreeSet<String>,
    aspects: BTreeSet<String>,
}

const PAGE: &str = "docs/src/api.md";
const HEADING: &str = "## Where we differ from Harvester on purpose";

fn listed() -> BTreeMap<String, Vec<Listed>> {
    let page = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(PAGE))
        .unwrap_or_else(|e| panic!("reads {PAGE}: {e}"));
    let section = page
        .split_once(HEADING)
        .unwrap_or_else(|| panic!("{PAGE} has no {HEADING:?}"))
        .1;
    let section = section.split("\n## ").next().expect("a section");
    let mut out = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // ["", "`id`", "v1.8, v1.9", "status, body", "why", ""]
        assert!(cells.len() >= 5, "a row of the table: {line}");
        let id = cells[1].trim_matches('`').to_string();
        let set = |s: &str| -> BTreeSet<String> {
            s.split(',')
                .map(|x| x.trim().to_string())
                .filter(|x| !x.is_empty())
                .collect()
        };
        let row = Listed {
            lines: set(cells[2]),
            aspects: set(cells[3]),
        };
        assert!(
            row.lines.iter().all(|l| l == "v1.8" || l == "v1.9"),
            "{id}: the lines are v1.8 and/or v1.9: {line}"
        );
        assert!(
            row.aspects
                .iter()
                .all(|a| ["status", "body", "objects"].contains(&a.as_str())),
            "{id}: what differs is status, body and/or objects: {line}"
        );
        assert!(!cells[4].is_empty(), "{id}: a row says why: {line}");
        let rows: &mut Vec<Listed> = out.entry(id.clone()).or_default();
        assert!(
            rows.iter().all(|r| r.lines.is_disjoint(&row.lines)),
            "{id} is listed twice for the same line"
        );
        rows.push(row);
    }
    assert!(!out.is_empty(), "{PAGE}'s table of differences is empty");
    out
}

/// What the manual says differs in case `id` against Harvester `line` (nothing, when no row says).
fn expected(listed: &BTreeMap<String, Vec<Listed>>, id: &str, line: &str) -> BTreeSet<String> {
    listed
        .get(id)
        .into_iter()
        .flatten()
        .find(|l| l.lines.contains(line))
        .map(|l| l.aspects.clone())
        .unwrap_or_default()
}

// --- the test -------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_handler_and_ours_differ_only_as_listed() {
    let cp = ControlPlane::lease().await;
    let ca_b64 = B64.encode(cp.ca_pem.as_bytes());
    // Harvester's server runs with rights over the whole cluster.
    let peer = Peer::start(&cp.admin_kubeconfig_path());
    let client = cp.admin.clone();
    let mut b = KubeBackend::start_on(cp, &[]).await;
    let probes = support::Refusals::refusal_probes(&b);
    eprintln!(
        "upstream: harvester {} (line {}), at {}",
        peer.version, peer.line, peer.base
    );

    let listed = listed();
    let mut seen = Seen::default();
    let mut report = Vec::new();
    let mut failures = Vec::new();
    let cases = corpus();
    let ids: BTreeSet<&str> = cases.iter().map(|c| c.id).collect();
    for id in listed.keys() {
        assert!(
            ids.contains(id.as_str()) || id.starts_with("all-"),
            "{PAGE} lists {id}, which is no case of the corpus"
        );
    }

    for c in &cases {
        if c.setup != Setup::Nothing {
            // Ours reuses an answer about the roles and the VIP for a few seconds: a new process
            // has none.
            b = b.restart().await;
        }
        let role = match c.setup {
            Setup::NoCloudProviderRole => Some(drop_cloudprovider_role(&client, &peer).await),
            Setup::Vip(vip) => {
                set_vip(&client, &peer, vip).await;
                None
            }
            Setup::Nothing => None,
        };
        let our = run_ours(&b, &peer, c, &ca_b64, &mut seen).await;
        let up = run_upstream(&client, &peer, c, &ca_b64, &mut seen).await;
        if let Some(role) = role {
            restore_role(&client, &peer, role).await;
        }
        if let Setup::Vip(_) = c.setup {
            set_vip(&client, &peer, Some(support::VIP)).await;
        }

        let mut differs = BTreeSet::new();
        let mut detail = String::new();
        for (i, (u, o)) in up.answers.iter().zip(&our.answers).enumerate() {
            let step = &c.steps[i];
            if u.0 != o.0 {
                differs.insert("status".to_string());
            }
            if u.1 != o.1 {
                differs.insert("body".to_string());
            }
            if u != o {
                detail.push_str(&format!(
                    "  step {i} {} {}\n    harvester: {} {}\n    ours:      {} {}\n",
                    step.method,
                    step.uri,
                    u.0,
                    u.1.replace('\n', "\n      "),
                    o.0,
                    o.1.replace('\n', "\n      ")
                ));
            }
        }
        if up.objects != our.objects {
            differs.insert("objects".to_string());
            detail.push_str(&format!(
                "  objects\n    harvester: {:#?}\n    ours:      {:#?}\n",
                up.objects, our.objects
            ));
        }
        let expected = expected(&listed, c.id, &peer.line);
        let verdict = if differs.is_empty() {
            "same".to_string()
        } else {
            format!(
                "differs in {}",
                differs.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        };
        report.push(format!("{:<32} {verdict}", c.id));
        if differs != expected {
            failures.push(format!(
                "{}: {verdict}; {PAGE} lists for {}: {:?}\n{detail}",
                c.id, peer.line, expected
            ));
        }
    }

    // The rules that normalize what every case would show are listed differences too.
    let rules = [
        "all-error-shape",
        "all-managed-by",
        "all-crb-owner",
        "all-preferences",
    ];
    for id in listed.keys().filter(|k| k.starts_with("all-")) {
        assert!(
            rules.contains(&id.as_str()),
            "{PAGE} lists {id}, which no rule knows"
        );
    }
    for rule in rules {
        let listed_here = !expected(&listed, rule, &peer.line).is_empty();
        let applied = seen.0.contains(rule);
        report.push(format!(
            "{rule:<32} {}",
            if applied {
                "differs (normalized)"
            } else {
                "same"
            }
        ));
        if listed_here != applied {
            failures.push(format!(
                "{rule}: {PAGE} {} it for {}, and the run {} it",
                if listed_here {
                    "lists"
                } else {
                    "does not list"
                },
                peer.line,
                if applied { "needed" } else { "never needed" }
            ));
        }
    }

    eprintln!(
        "harvester {} against ours, {} cases:\n{}",
        peer.version,
        cases.len(),
        report.join("\n")
    );
    assert!(
        failures.is_empty(),
        "differences not as {PAGE} lists them:\n\n{}\n\nthe peer's log:\n{}",
        failures.join("\n"),
        peer.log_text()
    );
    // The chart's RBAC was enough for everything ours did.
    for probe in probes {
        probe.assert_none_refused();
    }
}
