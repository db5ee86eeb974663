//! Admission webhooks end to end: the fake calls small HTTPS webhook servers started here (their
//! own test CA) for matching writes, applies mutating patches, refuses on denials and call
//! failures with the real server's Status bodies, and never holds its lock while calling out.

mod support;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use axum::Router;
use axum::extract::{Request, State};
use axum::http::header;
use axum::response::IntoResponse;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use kube_fake::FakeApiServer;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};
use support::{Raw, start};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

const CM: &str = "/api/v1/namespaces/default/configmaps";
const MWC: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations";
const VWC: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";

/// The `response` a test webhook answers for one review (uid filled in by the server).
type Answer = Pin<Box<dyn Future<Output = Value> + Send>>;
type Responder = Arc<dyn Fn(String, Value) -> Answer + Send + Sync>;

/// One review a test webhook received.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    query: String,
    host: String,
    review: Value,
}

impl Seen {
    fn request(&self) -> &Value {
        &self.review["request"]
    }
}

/// A running test webhook server.
struct Hook {
    addr: SocketAddr,
    ca_pem: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Hook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Hook {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn seen_at(&self, path: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.path == path).collect()
    }

    fn clear(&self) {
        if let Ok(mut s) = self.seen.lock() {
            s.clear();
        }
    }

    /// `clientConfig` by URL on 127.0.0.1.
    fn url(&self, path: &str) -> Value {
        json!({"url": format!("https://127.0.0.1:{}{path}", self.addr.port()),
               "caBundle": STANDARD.encode(&self.ca_pem)})
    }
}

/// A CA (with a unique name) and a serving configuration for `names`.
fn pki(names: &[&str]) -> Result<(String, Arc<rustls::ServerConfig>)> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(
        DnType::CommonName,
        format!("webhook-test-ca-{}", uuid::Uuid::new_v4()),
    );
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);
    let params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((ca_cert.pem(), Arc::new(config)))
}

#[derive(Clone)]
struct HookState {
    seen: Arc<Mutex<Vec<Seen>>>,
    responder: Responder,
}

async fn review(State(state): State<HookState>, req: Request) -> axum::response::Response {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let Ok(bytes) = axum::body::to_bytes(req.into_body(), 1 << 22).await else {
        return (axum::http::StatusCode::BAD_REQUEST, "body").into_response();
    };
    let review: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if let Ok(mut s) = state.seen.lock() {
        s.push(Seen {
            path: path.clone(),
            query,
            host,
            review: review.clone(),
        });
    }
    let mut response = (state.responder)(path, review.clone()).await;
    response["uid"] = review["request"]["uid"].clone();
    axum::Json(json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}))
        .into_response()
}

/// Starts a webhook server with a certificate for `names` answering through `responder`.
async fn serve_hook(names: &[&str], responder: Responder) -> Result<Hook> {
    let (ca_pem, config) = pki(names)?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new().fallback(review).with_state(HookState {
        seen: seen.clone(),
        responder,
    });
    let acceptor = TlsAcceptor::from(config);
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let app = app.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                    .await;
            });
        }
    });
    Ok(Hook {
        addr,
        ca_pem,
        seen,
        task,
    })
}

fn responder<F>(f: F) -> Responder
where
    F: Fn(&str, &Value) -> Value + Send + Sync + 'static,
{
    Arc::new(move |path: String, review: Value| {
        let answer = f(&path, &review);
        Box::pin(async move { answer })
    })
}

fn allow() -> Value {
    json!({"allowed": true})
}

fn json_patch(ops: Value) -> Value {
    json!({"allowed": true, "patchType": "JSONPatch", "patch": STANDARD.encode(ops.to_string())})
}

fn mk_webhook(name: &str, client: Value, rules: Value) -> Value {
    json!({"name": name, "clientConfig": client, "rules": rules,
           "sideEffects": "None", "admissionReviewVersions": ["v1"]})
}

fn mk_rule(ops: &[&str], groups: &[&str], resources: &[&str]) -> Value {
    json!({"operations": ops, "apiGroups": groups, "apiVersions": ["*"], "resources": resources})
}

fn mk_config(kind: &str, name: &str, webhooks: Vec<Value>) -> Value {
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
           "metadata": {"name": name}, "webhooks": webhooks})
}

fn mk_cm(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})
}

async fn register(raw: &Raw, path: &str, config: Value) -> Result<Value> {
    let (code, body) = raw.post(path, &config).await?;
    if code != 201 {
        bail!("registering {path}: {code} {body}");
    }
    Ok(body)
}

fn status(code: u16, message: &str, reason: Option<&str>) -> Value {
    let mut s = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": message, "code": code});
    if let Some(r) = reason {
        s["reason"] = json!(r);
    }
    s
}

/// The Status of a webhook the fake could not call (failurePolicy Fail).
fn call_failure(webhook: &str, reason: &str) -> Value {
    let err = format!("failed calling webhook {webhook:?}: {reason}");
    let mut s = status(
        500,
        &format!("Internal error occurred: {err}"),
        Some("InternalError"),
    );
    s["details"] = json!({"causes": [{"message": err}]});
    s
}

#[tokio::test]
async fn mutating_patches_are_applied_in_order_and_stored() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    let hook = serve_hook(
        &["localhost", "127.0.0.1"],
        responder(|path, review| {
            let object = &review["request"]["object"];
            let seen = object["metadata"]["annotations"]
                .as_object()
                .map_or(0, |a| a.len());
            let mut ops = Vec::new();
            if object.pointer("/metadata/annotations").is_none() {
                ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
            }
            let step = path.trim_start_matches('/');
            ops.push(
                json!({"op": "add", "path": format!("/metadata/annotations/{step}"),
                            "value": seen.to_string()}),
            );
            if step == "first" {
                ops.push(
                    json!({"op": "add", "path": "/metadata/labels", "value": {"mutated": "yes"}}),
                );
            }
            json_patch(Value::Array(ops))
        }),
    )
    .await?;
    let rules = json!([mk_rule(&["CREATE"], &[""], &["configmaps"])]);
    // Registered in reverse: configuration names decide the order, not creation order.
    let created = register(
        &raw,
        MWC,
        mk_config(
            "MutatingWebhookConfiguration",
            "z-second",
            vec![mk_webhook(
                "second.example.com",
                hook.url("/second"),
                rules.clone(),
            )],
        ),
    )
    .await?;
    assert_eq!(created["webhooks"][0]["failurePolicy"], "Fail");
    assert_eq!(created["webhooks"][0]["timeoutSeconds"], 10);
    assert_eq!(created["webhooks"][0]["reinvocationPolicy"], "Never");
    register(
        &raw,
        MWC,
        mk_config(
            "MutatingWebhookConfiguration",
            "a-first",
            vec![mk_webhook("first.example.com", hook.url("/first"), rules)],
        ),
    )
    .await?;

    let (code, body) = raw.post(CM, &mk_cm("mutated")).await?;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["metadata"]["labels"], json!({"mutated": "yes"}));
    assert_eq!(
        body["metadata"]["annotations"],
        json!({"first": "0", "second": "1"})
    );
    let stored = fake.object("", "configmaps", "default", "mutated");
    assert_eq!(
        stored.map(|s| s["metadata"]["labels"].clone()),
        Some(json!({"mutated": "yes"}))
    );

    let seen = hook.seen();
    let paths: Vec<&str> = seen.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(paths, ["/first", "/second"]);
    let first = &seen[0];
    assert_eq!(first.query, "timeout=10s");
    assert_eq!(first.review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(first.review["kind"], "AdmissionReview");
    let r = first.request();
    assert!(r["uid"].as_str().is_some_and(|u| !u.is_empty()));
    assert_ne!(r["uid"], seen[1].request()["uid"]);
    let gvk = json!({"group": "", "version": "v1", "kind": "ConfigMap"});
    let gvr = json!({"group": "", "version": "v1", "resource": "configmaps"});
    assert_eq!(
        (
            &r["kind"],
            &r["resource"],
            &r["requestKind"],
            &r["requestResource"]
        ),
        (&gvk, &gvr, &gvk, &gvr)
    );
    assert_eq!(r.get("subResource"), None);
    assert_eq!(
        (&r["name"], &r["namespace"], &r["operation"]),
        (&json!("mutated"), &json!("default"), &json!("CREATE"))
    );
    assert_eq!(r["userInfo"]["username"], "kube-fake-admin");
    assert!(
        r["userInfo"]["groups"]
            .as_array()
            .is_some_and(|g| g.contains(&json!("system:masters")))
    );
    assert_eq!(r["object"]["data"], json!({"k": "v"}));
    assert_eq!(r["object"]["metadata"].get("uid"), None);
    assert_eq!(r["oldObject"], Value::Null);
    assert_eq!(r["dryRun"], false);
    assert_eq!(
        r["options"],
        json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"})
    );
    // The second webhook sees the first one's patch.
    assert_eq!(
        seen[1].request()["object"]["metadata"]["labels"],
        json!({"mutated": "yes"})
    );
    Ok(())
}

#[tokio::test]
async fn a_validating_denial_is_the_exact_status_and_stores_nothing() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    let hook = serve_hook(
        &["127.0.0.1"],
        responder(|path, review| {
            if path == "/mutate" {
                return json_patch(
                    json!([{"op": "add", "path": "/metadata/labels", "value": {"checked": "no"}}]),
                );
            }
            match review["request"]["object"]["metadata"]["name"].as_str() {
                Some("reserved") => {
                    json!({"allowed": false, "status": {"message": "name is reserved"}})
                }
                Some("forbidden") => json!({"allowed": false,
                    "status": {"code": 403, "reason": "Forbidden", "message": "not here"}}),
                Some("silent") => json!({"allowed": false}),
                _ => allow(),
            }
        }),
    )
    .await?;
    let rules = json!([mk_rule(&["CREATE"], &[""], &["configmaps"])]);
    register(
        &raw,
        MWC,
        mk_config(
            "MutatingWebhookConfiguration",
            "label",
            vec![mk_webhook(
                "label.example.com",
                hook.url("/mutate"),
                rules.clone(),
            )],
        ),
    )
    .await?;
    register(
        &raw,
        VWC,
        mk_config(
            "ValidatingWebhookConfiguration",
            "names",
            vec![mk_webhook(
                "names.example.com",
                hook.url("/validate"),
                rules,
            )],
        ),
    )
    .await?;

    let (code, body) = raw.post(CM, &mk_cm("reserved")).await?;
    assert_eq!(
        (code, body),
        (
            400,
            status(
                400,
                "admission webhook \"names.example.com\" denied the request: name is reserved",
                None
            )
        )
    );
    let (code, body) = raw.post(CM, &mk_cm("forbidden")).await?;
    assert_eq!(
        (code, body),
        (
            403,
            status(
                403,
                "admission webhook \"names.example.com\" denied the request: not here",
                Some("Forbidden")
            )
        )
    );
    let (code, body) = raw.post(CM, &mk_cm("silent")).await?;
    assert_eq!(
        (code, body["message"].clone()),
        (
            400,
            json!("admission webhook \"names.example.com\" denied the request without explanation")
        )
    );
    for name in ["reserved", "forbidden", "silent"] {
        assert_eq!(fake.object("", "configmaps", "default", name), None);
        let (code, _) = raw.get(&format!("{CM}/{name}")).await?;
        assert_eq!(code, 404);
    }

    // An allowed create: the validating webhook saw the final object, mutated and with its uid.
    hook.clear();
    let (code, body) = raw.post(CM, &mk_cm("fine")).await?;
    assert_eq!(code, 201, "{body}");
    let validated = hook.seen_at("/validate");
    assert_eq!(validated.len(), 1);
    let object = &validated[0].request()["object"];
    assert_eq!(object["metadata"]["labels"], json!({"checked": "no"}));
    assert_eq!(object["metadata"]["uid"], body["metadata"]["uid"]);
    Ok(())
}

#[tokio::test]
async fn rules_pick_operations_resources_subresources_namespaces_and_objects() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    let hook = serve_hook(&["127.0.0.1"], responder(|_, _| allow())).await?;
    let core = |ops: &[&str], resources: &[&str]| json!([mk_rule(ops, &[""], resources)]);
    let mut skip_labelled = mk_webhook(
        "namespaces.example.com",
        hook.url("/ns"),
        core(&["CREATE"], &["configmaps"]),
    );
    skip_labelled["namespaceSelector"] =
        json!({"matchExpressions": [{"key": "skip-webhooks", "operator": "DoesNotExist"}]});
    let mut labelled_only = mk_webhook(
        "objects.example.com",
        hook.url("/objects"),
        core(&["*"], &["configmaps"]),
    );
    labelled_only["objectSelector"] = json!({"matchLabels": {"hooked": "yes"}});
    register(
        &raw,
        VWC,
        mk_config(
            "ValidatingWebhookConfiguration",
            "rules",
            vec![
                mk_webhook(
                    "cm-create.example.com",
                    hook.url("/cm-create"),
                    core(&["CREATE"], &["configmaps"]),
                ),
                mk_webhook(
                    "svc-main.example.com",
                    hook.url("/svc-main"),
                    core(&["UPDATE"], &["services"]),
                ),
                mk_webhook(
                    "svc-status.example.com",
                    hook.url("/svc-status"),
                    core(&["UPDATE"], &["services/status"]),
                ),
                skip_labelled,
                labelled_only,
            ],
        ),
    )
    .await?;

    let (code, _) = raw
        .post(
            "/api/v1/namespaces",
            &json!({"metadata": {"name": "quiet", "labels": {"skip-webhooks": "true"}}}),
        )
        .await?;
    assert_eq!(code, 201);
    let (code, created) = raw.post(CM, &mk_cm("plain")).await?;
    assert_eq!(code, 201);
    let mut update = created.clone();
    update["data"] = json!({"k": "changed"});
    let (code, _) = raw.put(&format!("{CM}/plain"), &update).await?;
    assert_eq!(code, 200);
    let (code, _) = raw
        .post("/api/v1/namespaces/quiet/configmaps", &mk_cm("in-quiet"))
        .await?;
    assert_eq!(code, 201);
    let mut labelled = mk_cm("labelled");
    labelled["metadata"]["labels"] = json!({"hooked": "yes"});
    let (code, _) = raw.post(CM, &labelled).await?;
    assert_eq!(code, 201);
    let (code, _) = raw
        .post(
            "/api/v1/namespaces/default/secrets",
            &json!({"metadata": {"name": "s"}, "stringData": {"a": "b"}}),
        )
        .await?;
    assert_eq!(code, 201);
    let svc_path = "/api/v1/namespaces/default/services";
    let (code, svc) = raw
        .post(
            svc_path,
            &json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}),
        )
        .await?;
    assert_eq!(code, 201);
    let mut main = svc.clone();
    main["metadata"]["labels"] = json!({"tier": "front"});
    let (code, main) = raw.put(&format!("{svc_path}/web"), &main).await?;
    assert_eq!(code, 200);
    let mut with_status = main.clone();
    with_status["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}});
    let (code, _) = raw
        .put(&format!("{svc_path}/web/status"), &with_status)
        .await?;
    assert_eq!(code, 200);

    let summary = |path: &str| -> Vec<String> {
        hook.seen_at(path)
            .iter()
            .map(|s| {
                let r = s.request();
                format!(
                    "{} {}/{}{}",
                    r["operation"].as_str().unwrap_or_default(),
                    r["namespace"].as_str().unwrap_or_default(),
                    r["name"].as_str().unwrap_or_default(),
                    r["subResource"]
                        .as_str()
                        .map(|s| format!(" [{s}]"))
                        .unwrap_or_default()
                )
            })
            .collect()
    };
    assert_eq!(
        summary("/cm-create"),
        [
            "CREATE default/plain",
            "CREATE quiet/in-quiet",
            "CREATE default/labelled"
        ]
    );
    assert_eq!(summary("/svc-main"), ["UPDATE default/web"]);
    assert_eq!(summary("/svc-status"), ["UPDATE default/web [status]"]);
    assert_eq!(
        summary("/ns"),
        ["CREATE default/plain", "CREATE default/labelled"]
    );
    assert_eq!(summary("/objects"), ["CREATE default/labelled"]);
    let status_review = &hook.seen_at("/svc-status")[0];
    assert_eq!(
        status_review.request()["requestSubResource"],
        json!("status")
    );
    assert_eq!(
        status_review.request()["object"]["status"]["loadBalancer"]["ingress"][0]["ip"],
        "192.0.2.1"
    );
    assert!(
        status_review.request()["oldObject"]["status"]["loadBalancer"]
            .get("ingress")
            .is_none()
    );
    Ok(())
}

#[tokio::test]
async fn deletes_are_sent_with_the_old_object_and_can_be_refused() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    let hook = serve_hook(
        &["127.0.0.1"],
        responder(|_, review| {
            if review["request"]["oldObject"]["metadata"]["name"] == "keep" {
                json!({"allowed": false, "status": {"message": "keep is kept"}})
            } else {
                allow()
            }
        }),
    )
    .await?;
    register(
        &raw,
        VWC,
        mk_config(
            "ValidatingWebhookConfiguration",
            "deletes",
            vec![mk_webhook(
                "deletes.example.com",
                hook.url("/delete"),
                json!([mk_rule(&["DELETE"], &[""], &["configmaps"])]),
            )],
        ),
    )
    .await?;
    for name in ["gone", "keep", "many-1", "many-2"] {
        let mut cm = mk_cm(name);
        if name != "gone" {
            cm["metadata"]["labels"] =
                json!({"batch": if name == "keep" { "kept" } else { "many" }});
        }
        let (code, _) = raw.post(CM, &cm).await?;
        assert_eq!(code, 201);
    }
    assert!(hook.seen().is_empty(), "creates are not sent");

    let (code, _) = raw.delete(&format!("{CM}/gone")).await?;
    assert_eq!(code, 200);
    let seen = hook.seen();
    assert_eq!(seen.len(), 1);
    let r = seen[0].request();
    assert_eq!(
        (&r["operation"], &r["name"], &r["namespace"]),
        (&json!("DELETE"), &json!("gone"), &json!("default"))
    );
    assert_eq!(r["object"], Value::Null);
    assert_eq!(r["oldObject"]["metadata"]["name"], "gone");
    assert_eq!(r["oldObject"]["data"], json!({"k": "v"}));
    assert_eq!(
        r["options"],
        json!({"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1"})
    );

    let (code, body) = raw.delete(&format!("{CM}/keep")).await?;
    assert_eq!(
        (code, body),
        (
            400,
            status(
                400,
                "admission webhook \"deletes.example.com\" denied the request: keep is kept",
                None
            )
        )
    );
    assert!(fake.object("", "configmaps", "default", "keep").is_some());

    // deletecollection admits each object as its own DELETE.
    hook.clear();
    let (code, body) = raw
        .delete(&format!("{CM}?labelSelector=batch%3Dmany"))
        .await?;
    assert_eq!(code, 200, "{body}");
    let names: Vec<&str> = hook
        .seen()
        .iter()
        .filter_map(|s| s.request()["name"].as_str().map(|_| "x"))
        .collect();
    assert_eq!(names.len(), 2);
    let mut deleted: Vec<String> = hook
        .seen()
        .iter()
        .filter_map(|s| {
            s.request()["oldObject"]["metadata"]["name"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    deleted.sort();
    assert_eq!(deleted, ["many-1", "many-2"]);
    let (code, _) = raw
        .delete(&format!("{CM}?labelSelector=batch%3Dkept"))
        .await?;
    assert_eq!(code, 400);
    assert!(fake.object("", "configmaps", "default", "keep").is_some());
    Ok(())
}

#[tokio::test]
async fn failure_policy_decides_when_the_webhook_is_down() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let (ca_pem, _) = pki(&["127.0.0.1"])?;
    let client = json!({"url": format!("https://127.0.0.1:{port}/validate"),
                        "caBundle": STANDARD.encode(&ca_pem)});
    let config = mk_config(
        "ValidatingWebhookConfiguration",
        "down",
        vec![mk_webhook(
            "down.example.com",
            client,
            json!([mk_rule(&["CREATE"], &[""], &["configmaps"])]),
        )],
    );
    register(&raw, VWC, config).await?;
    let (code, body) = raw.post(CM, &mk_cm("blocked")).await?;
    assert_eq!(
        (code, body),
        (
            500,
            call_failure(
                "down.example.com",
                &format!(
                    "failed to call webhook: Post \"https://127.0.0.1:{port}/validate?timeout=10s\": dial tcp 127.0.0.1:{port}: connect: connection refused"
                )
            )
        )
    );
    assert_eq!(fake.object("", "configmaps", "default", "blocked"), None);

    let (code, _) = raw
        .patch(
            &format!("{VWC}/down"),
            "application/json-patch+json",
            &json!([{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}]),
        )
        .await?;
    assert_eq!(code, 200);
    let (code, _) = raw.post(CM, &mk_cm("through")).await?;
    assert_eq!(code, 201);
    assert!(
        fake.object("", "configmaps", "default", "through")
            .is_some()
    );
    Ok(())
}

#[tokio::test]
async fn a_wrong_ca_bundle_fails_tls() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    let hook = serve_hook(&["127.0.0.1"], responder(|_, _| allow())).await?;
    let (other_ca, _) = pki(&["127.0.0.1"])?;
    let mut client = hook.url("/validate");
    client["caBundle"] = json!(STANDARD.encode(other_ca));
    register(
        &raw,
        VWC,
        mk_config(
            "ValidatingWebhookConfiguration",
            "tls",
            vec![mk_webhook(
                "tls.example.com",
                client,
                json!([mk_rule(&["CREATE"], &[""], &["configmaps"])]),
            )],
        ),
    )
    .await?;
    let (code, body) = raw.post(CM, &mk_cm("untrusted")).await?;
    let port = hook.addr.port();
    assert_eq!(
        (code, body),
        (
            500,
            call_failure(
                "tls.example.com",
                &format!(
                    "failed to call webhook: Post \"https://127.0.0.1:{port}/validate?timeout=10s\": tls: failed to verify certificate: x509: certificate signed by unknown authority"
                )
            )
        )
    );
    assert!(
        hook.seen().is_empty(),
        "no review crosses an untrusted TLS session"
    );
    assert_eq!(fake.object("", "configmaps", "default", "untrusted"), None);

    // The right bundle makes the same webhook work.
    let (code, _) = raw
        .patch(
            &format!("{VWC}/tls"),
            "application/json-patch+json",
            &json!([{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle",
                     "value": STANDARD.encode(&hook.ca_pem)}]),
        )
        .await?;
    assert_eq!(code, 200);
    let (code, _) = raw.post(CM, &mk_cm("trusted")).await?;
    assert_eq!(code, 201);
    assert_eq!(hook.seen().len(), 1);
    Ok(())
}

#[tokio::test]
async fn a_webhook_reading_and_writing_the_fake_during_admission_does_not_deadlock() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    let callback = Arc::new(Raw::admin(&fake)?);
    let listed: Arc<Mutex<Vec<Vec<String>>>> = Arc::new(Mutex::new(Vec::new()));
    let responder: Responder = {
        let listed = listed.clone();
        Arc::new(move |path: String, review: Value| {
            let callback = callback.clone();
            let listed = listed.clone();
            Box::pin(async move {
                let Ok((200, list)) = callback.get(CM).await else {
                    return json!({"allowed": false, "status": {"message": "list failed"}});
                };
                let names = list["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string))
                    .filter(|n| n != "kube-root-ca.crt")
                    .collect();
                if let Ok(mut l) = listed.lock() {
                    l.push(names);
                }
                // A write during admission too (a Secret: no rule matches it).
                let uid = review["request"]["uid"].as_str().unwrap_or_default();
                let secret =
                    json!({"metadata": {"name": format!("audit-{}", &uid[..8.min(uid.len())])}});
                if !matches!(
                    callback
                        .post("/api/v1/namespaces/default/secrets", &secret)
                        .await,
                    Ok((201, _))
                ) {
                    return json!({"allowed": false, "status": {"message": "write failed"}});
                }
                // A patch on DELETE would be refused: there is no object to patch.
                if path == "/mutate" && review["request"]["operation"] != "DELETE" {
                    json_patch(json!([{"op": "add", "path": "/data/seen", "value": "yes"}]))
                } else {
                    allow()
                }
            })
        })
    };
    let hook = serve_hook(&["127.0.0.1"], responder).await?;
    let rules = json!([mk_rule(&["*"], &[""], &["configmaps"])]);
    register(
        &raw,
        MWC,
        mk_config(
            "MutatingWebhookConfiguration",
            "callback",
            vec![mk_webhook(
                "m.callback.example.com",
                hook.url("/mutate"),
                rules.clone(),
            )],
        ),
    )
    .await?;
    register(
        &raw,
        VWC,
        mk_config(
            "ValidatingWebhookConfiguration",
            "callback",
            vec![mk_webhook(
                "v.callback.example.com",
                hook.url("/validate"),
                rules,
            )],
        ),
    )
    .await?;

    // A deadlock would hang these; the bound turns a hang into a failure, it asserts no timing.
    let within = Duration::from_secs(60);
    let (code, _) = tokio::time::timeout(within, raw.post(CM, &mk_cm("first")))
        .await
        .context("create hung during admission")??;
    assert_eq!(code, 201);
    let (code, body) = tokio::time::timeout(within, raw.post(CM, &mk_cm("second")))
        .await
        .context("create hung during admission")??;
    assert_eq!(code, 201);
    assert_eq!(body["data"]["seen"], "yes");
    let (code, body) = tokio::time::timeout(
        within,
        raw.patch(
            &format!("{CM}/second"),
            "application/merge-patch+json",
            &json!({"data": {"k": "patched"}}),
        ),
    )
    .await
    .context("patch hung during admission")??;
    assert_eq!(code, 200, "{body}");
    let (code, body) = tokio::time::timeout(within, raw.delete(&format!("{CM}/first")))
        .await
        .context("delete hung during admission")??;
    assert_eq!(code, 200, "{body}");

    let listed = listed.lock().map(|l| l.clone()).unwrap_or_default();
    // Mutating then validating for each create: the object being created is not stored yet.
    assert_eq!(
        listed[..4],
        [
            Vec::<String>::new(),
            vec![],
            vec!["first".to_string()],
            vec!["first".to_string()]
        ]
    );
    assert_eq!(listed.len(), 8, "{listed:?}");
    let (_, secrets) = raw.get("/api/v1/namespaces/default/secrets").await?;
    let audits = secrets["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| {
            s["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("audit-"))
        })
        .count();
    assert_eq!(audits, 8);
    Ok(())
}

#[tokio::test]
async fn service_references_resolve_through_the_builder_map() -> Result<()> {
    let hook = serve_hook(
        &["hook.webhooks.svc"],
        responder(|_, _| {
            json_patch(
                json!([{"op": "add", "path": "/metadata/labels", "value": {"via": "service"}}]),
            )
        }),
    )
    .await?;
    let fake = FakeApiServer::builder()
        .webhook_service("webhooks", "hook", hook.addr)
        .start()
        .await?;
    let raw = Raw::admin(&fake)?;
    let service = |name: &str, port: Option<u16>| {
        let mut svc = json!({"namespace": "webhooks", "name": name, "path": "/mutate"});
        if let Some(p) = port {
            svc["port"] = json!(p);
        }
        json!({"service": svc, "caBundle": STANDARD.encode(&hook.ca_pem)})
    };
    let rules = json!([mk_rule(&["CREATE"], &[""], &["configmaps"])]);
    let created = register(
        &raw,
        MWC,
        mk_config(
            "MutatingWebhookConfiguration",
            "by-service",
            vec![mk_webhook(
                "svc.example.com",
                service("hook", Some(8443)),
                rules.clone(),
            )],
        ),
    )
    .await?;
    assert_eq!(
        created["webhooks"][0]["clientConfig"]["service"]["port"],
        8443
    );
    let (code, body) = raw.post(CM, &mk_cm("routed")).await?;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["metadata"]["labels"], json!({"via": "service"}));
    let seen = hook.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        (
            seen[0].host.as_str(),
            seen[0].path.as_str(),
            seen[0].query.as_str()
        ),
        ("hook.webhooks.svc:8443", "/mutate", "timeout=10s")
    );

    // A service the fake cannot resolve, then one that resolves to a server whose certificate is
    // not for `<name>.<namespace>.svc`.
    register(
        &raw,
        MWC,
        mk_config(
            "MutatingWebhookConfiguration",
            "unresolved",
            vec![mk_webhook(
                "absent.example.com",
                service("absent", None),
                rules,
            )],
        ),
    )
    .await?;
    let (code, body) = raw.post(CM, &mk_cm("nowhere")).await?;
    assert_eq!(
        (code, body),
        (
            500,
            call_failure(
                "absent.example.com",
                "failed to call webhook: Post \"https://absent.webhooks.svc:443/mutate?timeout=10s\": service \"absent\" not found"
            )
        )
    );
    fake.set_webhook_service("webhooks", "absent", hook.addr);
    let (code, body) = raw.post(CM, &mk_cm("misnamed")).await?;
    assert_eq!(
        (code, body["message"].clone()),
        (
            500,
            json!(
                "Internal error occurred: failed calling webhook \"absent.example.com\": failed to call webhook: Post \"https://absent.webhooks.svc:443/mutate?timeout=10s\": tls: failed to verify certificate: x509: certificate is valid for hook.webhooks.svc, not absent.webhooks.svc"
            )
        )
    );
    assert_eq!(fake.object("", "configmaps", "default", "misnamed"), None);
    Ok(())
}

#[tokio::test]
async fn webhook_configurations_are_exempt_from_webhooks() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    let hook = serve_hook(
        &["127.0.0.1"],
        responder(|_, _| json!({"allowed": false, "status": {"message": "nothing passes"}})),
    )
    .await?;
    let everything = json!([mk_rule(&["*"], &["*"], &["*/*"])]);
    register(
        &raw,
        VWC,
        mk_config(
            "ValidatingWebhookConfiguration",
            "deny-all",
            vec![mk_webhook(
                "deny.example.com",
                hook.url("/deny"),
                everything.clone(),
            )],
        ),
    )
    .await?;
    let (code, _) = raw.post(CM, &mk_cm("denied")).await?;
    assert_eq!(code, 400);
    // Other configurations, and the denying one itself, can still be written and removed.
    register(
        &raw,
        MWC,
        mk_config(
            "MutatingWebhookConfiguration",
            "another",
            vec![mk_webhook(
                "another.example.com",
                hook.url("/other"),
                everything,
            )],
        ),
    )
    .await?;
    let (code, _) = raw
        .patch(
            &format!("{VWC}/deny-all"),
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"edited": "yes"}}}),
        )
        .await?;
    assert_eq!(code, 200);
    let (code, _) = raw.delete(&format!("{VWC}/deny-all")).await?;
    assert_eq!(code, 200);
    let (code, _) = raw.delete(&format!("{MWC}/another")).await?;
    assert_eq!(code, 200);
    let configs: Vec<Value> = hook
        .seen()
        .iter()
        .map(|s| s.request()["resource"]["group"].clone())
        .collect();
    assert_eq!(configs, [json!("")], "only the ConfigMap create was sent");
    let (code, _) = raw.post(CM, &mk_cm("allowed")).await?;
    assert_eq!(code, 201);
    Ok(())
}

#[tokio::test]
async fn custom_resources_patches_and_apply_are_admitted() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "size": {"type": "integer"}, "color": {"type": "string"}}},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}});
    let (code, _) = raw
        .post(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            &crd,
        )
        .await?;
    assert_eq!(code, 201);
    let hook = serve_hook(
        &["127.0.0.1"],
        responder(|path, review| {
            let object = &review["request"]["object"];
            if path == "/mutate" && object["spec"].get("color").is_none() {
                return json_patch(json!([{"op": "add", "path": "/spec/color", "value": "blue"}]));
            }
            if path == "/validate" && object["spec"]["size"].as_i64().is_some_and(|s| s > 10) {
                return json!({"allowed": false, "status": {"code": 422, "reason": "Invalid",
                    "message": "size must be at most 10"}});
            }
            allow()
        }),
    )
    .await?;
    let rules = json!([mk_rule(
        &["CREATE", "UPDATE"],
        &["example.com"],
        &["widgets"]
    )]);
    register(
        &raw,
        MWC,
        mk_config(
            "MutatingWebhookConfiguration",
            "widgets",
            vec![mk_webhook(
                "color.example.com",
                hook.url("/mutate"),
                rules.clone(),
            )],
        ),
    )
    .await?;
    register(
        &raw,
        VWC,
        mk_config(
            "ValidatingWebhookConfiguration",
            "widgets",
            vec![mk_webhook("size.example.com", hook.url("/validate"), rules)],
        ),
    )
    .await?;
    let widgets = "/apis/example.com/v1/namespaces/default/widgets";
    let apply = |size: i64| {
        json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
               "spec": {"size": size}})
    };
    let (code, body) = raw
        .patch(
            &format!("{widgets}/w?fieldManager=tester"),
            "application/apply-patch+yaml",
            &apply(3),
        )
        .await?;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["spec"], json!({"size": 3, "color": "blue"}));
    let created = hook.seen_at("/mutate");
    let r = created[0].request();
    assert_eq!(r["operation"], "CREATE");
    assert_eq!(
        r["kind"],
        json!({"group": "example.com", "version": "v1", "kind": "Widget"})
    );
    assert_eq!(
        r["options"],
        json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "tester"})
    );

    hook.clear();
    let (code, body) = raw
        .patch(
            &format!("{widgets}/w"),
            "application/merge-patch+json",
            &json!({"spec": {"size": 11}}),
        )
        .await?;
    assert_eq!(
        (code, body),
        (
            422,
            status(
                422,
                "admission webhook \"size.example.com\" denied the request: size must be at most 10",
                Some("Invalid")
            )
        )
    );
    let validated = hook.seen_at("/validate");
    let r = validated[0].request();
    assert_eq!(r["operation"], "UPDATE");
    assert_eq!(r["oldObject"]["spec"], json!({"size": 3, "color": "blue"}));
    assert_eq!(r["object"]["spec"], json!({"size": 11, "color": "blue"}));
    assert_eq!(
        r["options"],
        json!({"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"})
    );
    let stored = fake.object("example.com", "widgets", "default", "w");
    assert_eq!(stored.map(|w| w["spec"]["size"].clone()), Some(json!(3)));

    // A status write matches no rule here (they name `widgets`, not `widgets/status`).
    hook.clear();
    let (code, _) = raw
        .patch(
            &format!("{widgets}/w/status"),
            "application/merge-patch+json",
            &json!({"status": {"ready": true}}),
        )
        .await?;
    assert_eq!(code, 200);
    assert!(hook.seen().is_empty());
    Ok(())
}
