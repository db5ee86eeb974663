//! Rancher's dashboard reaching the cloud-config API: the service on a real control plane with the
//! chart's RBAC as installed where Rancher runs (`deploy/manifests/harvester-cloud-rancher.yaml`:
//! its APIService and the right to keep it), `tools/rancher-peer` (remotedialer's own server)
//! playing Rancher, and a Secret written as Rancher's APIService controller writes it. Every
//! decision about who may do what is the real API server's (SubjectAccessReview against RBAC).
//!
//! Also the other two ways in that do not go through the tunnel: Rancher tokens of an external
//! Rancher presented directly (ClusterAuthTokens), and forged `Impersonate-*` headers on the
//! direct listener, which are not honoured.

#[macro_use]
mod support;

use std::time::Duration;

use harvester_cloud::auth::hash;
use k8s_openapi::api::{
    core::v1::{Secret, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject},
};
use kube::api::{Api, DynamicObject, ObjectMeta, PostParams};
use serde_json::{Value, json};
use support::{
    control_plane::ControlPlane,
    eventually, foreign,
    kube_env::{self, api_resource},
    rancher_peer::Peer,
};
use tokio_util::sync::CancellationToken;

const PATH: &str = "/v1/harvester/kubeconfig";
/// The dashboard's body (rancher/dashboard rke2.vue).
const DASHBOARD_BODY: &str = r#"{"csiClusterRoleName":"harvesterhci.io:csi-driver","clusterRoleName":"harvesterhci.io:cloudprovider","namespace":"gc-test","serviceAccountName":"rke2-guest"}"#;

/// The service as `serve` runs it, in process: its direct listener and, with `--rancher-apiservice`,
/// the tunnel.
struct Served {
    cp: ControlPlane,
    probe: support::control_plane::RefusalProbe,
    addr: std::net::SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    _dir: tempfile::TempDir,
}

impl Served {
    async fn start(cp: ControlPlane, tunnel: bool) -> Served {
        kube_env::rancher_chart(&cp).await;
        let probe = cp.refusal_probe(&[kube_env::SERVICE_USER]);
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("service.kubeconfig");
        std::fs::write(&kubeconfig, kube_env::service_kubeconfig(&cp).await).expect("writes");
        let mut args = vec![
            "--backend".to_string(),
            "kube".into(),
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--metrics-listen".into(),
            "127.0.0.1:0".into(),
            "--leader-elect=false".into(),
        ];
        if tunnel {
            args.extend(["--rancher-apiservice".into(), "harvester-cloud".into()]);
        }
        let (_, serve) = support::cli(dir.path(), &args);
        let app = harvester_cloud::app::open_kube(&serve)
            .await
            .expect("opens the Kubernetes backend");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move {
                harvester_cloud::app::serve_on(listener, app, &serve, stop).await
            })
        };
        Served {
            cp,
            probe,
            addr,
            stop,
            task,
            _dir: dir,
        }
    }

    /// Writes the APIService's Secret as Rancher's controller does: the tunnel URL, the token of
    /// the APIService's service account, Rancher's CA.
    async fn rancher_secret(&self, peer: &Peer) {
        let secret = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "harvester-cloud-aggregation", "namespace": "harvester-system"},
            "stringData": {
                "url": peer.url(),
                "token": peer.token,
                "ca.crt": String::from_utf8(peer.ca_pem()).unwrap(),
            }
        });
        kube_env::apply(&self.cp.admin, &secret, "secrets").await;
    }

    fn direct(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Stops the service; the API server refused it nothing meanwhile (the chart's RBAC for
    /// Rancher clusters is enough for all of it, the APIService's upkeep included).
    async fn stop(self) {
        self.stop.cancel();
        self.task.await.expect("joins").expect("serve ends cleanly");
        self.probe.assert_none_refused();
    }
}

fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(resources.iter().map(|s| s.to_string()).collect()),
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// What a cloud-config POST needs, granted to `subject` (a User or a Group).
async fn grant_post(cp: &ControlPlane, name: &str, subject: Subject) {
    let rbac = "rbac.authorization.k8s.io";
    let meta = |ns: Option<&str>| ObjectMeta {
        name: Some(format!("{name}-cloud-config")),
        namespace: ns.map(str::to_string),
        ..Default::default()
    };
    Api::<Role>::namespaced(cp.admin.clone(), "gc-test")
        .create(
            &PostParams::default(),
            &Role {
                metadata: meta(Some("gc-test")),
                rules: Some(vec![
                    rule("", &["serviceaccounts", "secrets"], &["create", "get"]),
                    rule(rbac, &["rolebindings"], &["create"]),
                ]),
            },
        )
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(cp.admin.clone(), "gc-test")
        .create(
            &PostParams::default(),
            &RoleBinding {
                metadata: meta(Some("gc-test")),
                role_ref: RoleRef {
                    api_group: rbac.into(),
                    kind: "Role".into(),
                    name: format!("{name}-cloud-config"),
                },
                subjects: Some(vec![subject.clone()]),
            },
        )
        .await
        .unwrap();
    Api::<ClusterRole>::all(cp.admin.clone())
        .create(
            &PostParams::default(),
            &ClusterRole {
                metadata: meta(None),
                rules: Some(vec![rule(rbac, &["clusterrolebindings"], &["create"])]),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(cp.admin.clone())
        .create(
            &PostParams::default(),
            &ClusterRoleBinding {
                metadata: meta(None),
                role_ref: RoleRef {
                    api_group: rbac.into(),
                    kind: "ClusterRole".into(),
                    name: format!("{name}-cloud-config"),
                },
                subjects: Some(vec![subject]),
            },
        )
        .await
        .unwrap();
}

fn user(name: &str) -> Subject {
    Subject {
        kind: "User".into(),
        name: name.into(),
        api_group: Some("rbac.authorization.k8s.io".into()),
        ..Default::default()
    }
}

fn group(name: &str) -> Subject {
    Subject {
        kind: "Group".into(),
        name: name.into(),
        api_group: Some("rbac.authorization.k8s.io".into()),
        ..Default::default()
    }
}

/// A POST through Rancher for `user` (with `groups`): the status and the body.
async fn through_rancher(
    peer: &Peer,
    user: Option<&str>,
    groups: &str,
    body: &str,
) -> (u16, Value) {
    let mut req = peer
        .client()
        .post(peer.proxy_url(PATH))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(u) = user {
        req = req
            .header("x-test-user", u)
            .header("x-test-groups", groups)
            .header("x-test-extra-username", format!("{u} (local)"))
            .header("x-test-extra-principalid", format!("local://{u}"))
            .header("x-test-extra-requesthost", "rancher.example");
    }
    let r = req.send().await.expect("the peer answers");
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn tunnel_up(peer: &Peer) {
    eventually("the service's tunnel to Rancher", async || {
        peer.has_session().await.then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboards_post_through_rancher_is_authorized_by_the_users_rbac() {
    let served = Served::start(ControlPlane::lease().await, true).await;
    let cp = &served.cp;

    // The service keeps the APIService the chart made: exactly our path, and Rancher's Secret.
    let apiservices: Api<DynamicObject> = Api::all_with(
        cp.admin.clone(),
        &api_resource("management.cattle.io/v3", "APIService", "apiservices"),
    );
    let registered = apiservices.get("harvester-cloud").await.unwrap();
    assert_eq!(registered.data["spec"]["paths"], json!([PATH]));
    assert_eq!(
        registered.data["spec"]["secretName"],
        "harvester-cloud-aggregation"
    );
    assert_eq!(
        registered.data["spec"]["secretNamespace"],
        "harvester-system"
    );

    let peer = Peer::start(&format!("sa-token-{}", rand::random::<u32>()));
    served.rancher_secret(&peer).await;
    tunnel_up(&peer).await;

    // A Rancher user whose RBAC allows it: the dashboard's body, the kubeconfig back.
    grant_post(cp, "u-alice", user("u-alice")).await;
    let (status, body) = through_rancher(
        &peer,
        Some("u-alice"),
        "system:authenticated",
        DASHBOARD_BODY,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let kubeconfig = body.as_str().expect("the kubeconfig as a JSON string");
    assert!(kubeconfig.contains("namespace: gc-test"), "{kubeconfig}");
    let sas: Api<ServiceAccount> = Api::namespaced(cp.admin.clone(), "gc-test");
    assert!(sas.get_opt("rke2-guest").await.unwrap().is_some());

    // Through a group Rancher says the user has.
    grant_post(cp, "team-x", group("team-x")).await;
    let other = DASHBOARD_BODY.replace("rke2-guest", "rke2-guest-2");
    let (status, body) = through_rancher(
        &peer,
        Some("u-carol"),
        "system:authenticated,team-x",
        &other,
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // A user without the RBAC: 403 naming the permission, never a 401 (the dashboard would log
    // its user out), and nothing created.
    let refused = DASHBOARD_BODY.replace("rke2-guest", "rke2-refused");
    let (status, body) =
        through_rancher(&peer, Some("u-bob"), "system:authenticated", &refused).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["code"], "PermissionDenied");
    assert_eq!(
        body["message"],
        "user \"u-bob\" cannot create resource \"serviceaccounts\" in API group \"\" in the namespace \"gc-test\""
    );
    assert!(sas.get_opt("rke2-refused").await.unwrap().is_none());

    // A caller Rancher did not identify: still a 403.
    let (status, body) = through_rancher(&peer, None, "", &refused).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("user \"system:anonymous\" cannot create"),
        "{body}"
    );

    // A caller Rancher did not authenticate but whose bearer token it passes on: the token is
    // checked as on the direct listener, and a bad one is a 403 here too.
    let r = peer
        .client()
        .post(peer.proxy_url(PATH))
        .bearer_auth("token-zzzzz:not-a-real-secret")
        .body(refused.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["message"],
        "the caller Rancher forwarded was not identified: invalid token"
    );

    // Rancher restarts: the tunnel comes back, and so does the dashboard.
    let mut peer = peer;
    peer.restart();
    tunnel_up(&peer).await;
    let again = DASHBOARD_BODY.replace("rke2-guest", "rke2-after-restart");
    let (status, body) =
        through_rancher(&peer, Some("u-alice"), "system:authenticated", &again).await;
    assert_eq!(status, 200, "{body}");

    // Rancher rotates the APIService's token: the service dials with the new one.
    let mut rotated = Peer::start(&format!("sa-token-{}", rand::random::<u32>()));
    served.rancher_secret(&rotated).await;
    tunnel_up(&rotated).await;
    let (status, body) = through_rancher(
        &rotated,
        Some("u-alice"),
        "system:authenticated",
        &DASHBOARD_BODY.replace("rke2-guest", "rke2-rotated"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // The old Rancher no longer holds a session.
    eventually("the old session to end", async || {
        (!peer.has_session().await).then_some(())
    })
    .await;
    rotated.kill();
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonation_headers_on_the_direct_listener_are_ignored() {
    let served = Served::start(ControlPlane::lease().await, false).await;
    let http = reqwest::Client::new();
    let forge = |req: reqwest::RequestBuilder| {
        req.header("impersonate-user", "system:admin")
            .header("impersonate-group", "system:masters")
            .header("impersonate-extra-username", "admin")
            .body(DASHBOARD_BODY)
    };
    // No token: still not authenticated.
    let r = forge(http.post(served.direct(PATH))).send().await.unwrap();
    assert_eq!(r.status(), 401);
    // A user's own token: that user, not the one the headers name.
    let alice = served.cp.user_token("alice");
    let r = forge(http.post(served.direct(PATH)).bearer_auth(&alice))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .starts_with("user \"alice\" cannot"),
        "{v}"
    );
    served.stop().await;
}

/// A token of an external Rancher, mirrored into this cluster as a ClusterAuthToken (Rancher does
/// so when the authorized cluster endpoint is on): verified as rancher/kube-api-auth verifies it,
/// then the user's RBAC decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_auth_tokens_of_an_external_rancher() {
    let served = Served::start(ControlPlane::lease().await, false).await;
    let cp = &served.cp;
    let tokens: Api<DynamicObject> = Api::namespaced_with(
        cp.admin.clone(),
        "cattle-system",
        &api_resource(
            "cluster.cattle.io/v3",
            "ClusterAuthToken",
            "clusterauthtokens",
        ),
    );
    let attributes: Api<DynamicObject> = Api::namespaced_with(
        cp.admin.clone(),
        "cattle-system",
        &api_resource(
            "cluster.cattle.io/v3",
            "ClusterUserAttribute",
            "clusteruserattributes",
        ),
    );
    let secrets: Api<Secret> = Api::namespaced(cp.admin.clone(), "cattle-system");
    let mk_user = async |user: &str, enabled: bool, groups: &[&str]| {
        let obj = json!({"apiVersion": "cluster.cattle.io/v3", "kind": "ClusterUserAttribute",
            "metadata": {"name": user, "namespace": "cattle-system"},
            "enabled": enabled, "groups": groups});
        attributes
            .create(
                &PostParams::default(),
                &serde_json::from_value(foreign::rancher(obj)).unwrap(),
            )
            .await
            .unwrap();
    };
    // `legacy`: the hash in the object, as Rancher before v2.9 kept it.
    let mk_token = async |name: &str, user: &str, fields: Value, legacy: bool| {
        let secret = format!("s{}", rand::random::<u64>());
        let mut obj = json!({"apiVersion": "cluster.cattle.io/v3", "kind": "ClusterAuthToken",
            "metadata": {"name": name, "namespace": "cattle-system"},
            "userName": user, "enabled": true});
        for (k, v) in fields.as_object().unwrap() {
            obj[k] = v.clone();
        }
        if legacy {
            obj["hash"] = json!(hash::hash_secret(&secret));
        } else {
            let s: Secret = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "cattle-system"},
                "stringData": {"hash": hash::hash_secret(&secret)}
            }))
            .unwrap();
            secrets.create(&PostParams::default(), &s).await.unwrap();
        }
        tokens
            .create(
                &PostParams::default(),
                &serde_json::from_value(foreign::rancher(obj)).unwrap(),
            )
            .await
            .unwrap();
        format!("{name}:{secret}")
    };
    mk_user("u-dave", true, &["team-d"]).await;
    mk_user("u-erin", false, &["team-d"]).await;
    mk_user("u-frank", true, &[]).await;
    grant_post(cp, "team-d", group("team-d")).await;

    let http = reqwest::Client::new();
    let post = async |token: &str, sa: &str| {
        let r = http
            .post(served.direct(PATH))
            .bearer_auth(token)
            .body(json!({"namespace": "gc-test", "serviceAccountName": sa}).to_string())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json::<Value>().await.unwrap_or(Value::Null))
    };

    let good = mk_token("kubeconfig-u-dave1", "u-dave", json!({}), false).await;
    let (status, body) = post(&good, "cat-1").await;
    assert_eq!(status, 200, "{body}");
    let legacy = mk_token("token-dave2", "u-dave", json!({}), true).await;
    let (status, body) = post(&legacy, "cat-2").await;
    assert_eq!(status, 200, "{body}");
    // Rancher's `ext/` token names.
    let ext = mk_token("ext-dave3", "u-dave", json!({}), false).await;
    let (status, body) = post(&format!("ext/{ext}"), "cat-3").await;
    assert_eq!(status, 200, "{body}");

    let wrong = format!("{}:not-the-secret", good.split(':').next().unwrap());
    assert_eq!(post(&wrong, "cat-x").await.0, 401);
    let disabled = mk_token("token-dave4", "u-dave", json!({"enabled": false}), false).await;
    let (status, body) = post(&disabled, "cat-x").await;
    assert_eq!(
        (status, body["message"].as_str()),
        (401, Some("token token-dave4 is disabled"))
    );
    let expired = mk_token(
        "token-dave5",
        "u-dave",
        json!({"expiresAt": "2020-01-01T00:00:00Z"}),
        false,
    )
    .await;
    let (status, body) = post(&expired, "cat-x").await;
    assert_eq!(
        (status, body["message"].as_str()),
        (401, Some("token token-dave5 is expired"))
    );
    let user_off = mk_token("token-erin1", "u-erin", json!({}), false).await;
    let (status, body) = post(&user_off, "cat-x").await;
    assert_eq!(
        (status, body["message"].as_str()),
        (401, Some("user \"u-erin\" is disabled"))
    );
    // Authenticated, but the user's RBAC does not allow it.
    let no_rbac = mk_token("token-frank", "u-frank", json!({}), false).await;
    let (status, body) = post(&no_rbac, "cat-x").await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("user \"u-frank\" cannot create"),
        "{body}"
    );
    let sas: Api<ServiceAccount> = Api::namespaced(cp.admin.clone(), "gc-test");
    assert!(sas.get_opt("cat-x").await.unwrap().is_none());
    tokio::time::sleep(Duration::from_millis(10)).await;
    served.stop().await;
}
