//! The cloud-config API over HTTP. The `cases` run on every backend through [`support::Backend`];
//! embedded-only behaviour (token minting, admin token store) is tested below them.

#[macro_use]
mod support;

use axum::{
    body::Body,
    http::{Method, StatusCode},
};
use base64::{Engine, engine::general_purpose::STANDARD as B64};
use harvester_cloud::store::{Kind, LabelSelector};
use k8s_openapi::api::{
    core::v1::{Secret, ServiceAccount},
    rbac::v1::{ClusterRoleBinding, RoleBinding},
};
use serde_json::Value;
use support::{
    Backend, EmbeddedBackend, KubeBackend, Reply, VIP, account, account_yaml, eventually,
};

fn yaml(text: &str) -> Value {
    yaml_serde::from_str(text).unwrap_or_else(|e| panic!("not YAML ({e}):\n{text}"))
}

/// The cloud-init body Harvester v1.9 writes for a kubeconfig, spelled out independently of the
/// templates under test.
fn expected_cloud_init(kubeconfig: &str) -> String {
    let b64 = B64.encode(kubeconfig);
    format!(
        "########## cloud-init user data ############\nwrite_files:\n- encoding: b64\n  content: {b64}\n  owner: root:root\n  path: /etc/kubernetes/cloud-config\n  permissions: '0644'\n- encoding: b64\n  content: {b64}\n  owner: root:root\n  path: /var/lib/rancher/rke2/etc/config-files/cloud-provider-config\n  permissions: '0644'\n"
    )
}

pub mod cases {
    use super::*;

    pub async fn raw_kubeconfig_shape<B: Backend>(b: B) {
        let r = b.post(&account("gc-test", "gc4")).await;
        let k = r.kubeconfig();
        // Go's encoder escapes '<', '>' and '&'; none appear, and the body ends at the quote.
        assert!(r.body.ends_with(b"\\n\""), "{}", r.text());
        let v = yaml(&k);
        assert_eq!(v["apiVersion"], "v1");
        assert_eq!(v["kind"], "Config");
        assert_eq!(v["current-context"], "default");
        assert_eq!(v["clusters"][0]["name"], "default");
        assert_eq!(
            v["clusters"][0]["cluster"]["server"],
            format!("https://{VIP}:6443")
        );
        let ca = B64
            .decode(
                v["clusters"][0]["cluster"]["certificate-authority-data"]
                    .as_str()
                    .unwrap(),
            )
            .unwrap();
        assert_eq!(ca, b.expected_ca());
        assert_eq!(v["contexts"][0]["name"], "default");
        assert_eq!(v["contexts"][0]["context"]["namespace"], "gc-test");
        assert_eq!(v["contexts"][0]["context"]["cluster"], "default");
        assert_eq!(v["contexts"][0]["context"]["user"], "default");
        assert_eq!(v["users"][0]["name"], "default");
        assert!(
            v["users"][0]["user"]["token"]
                .as_str()
                .is_some_and(|t| t.len() > 20)
        );
        // Keys in client-go's order, two-space indent, no preferences line (v1.9).
        let keys: Vec<&str> = k
            .lines()
            .filter(|l| !l.starts_with(' ') && !l.starts_with('-'))
            .collect();
        assert_eq!(
            keys,
            [
                "apiVersion: v1",
                "clusters:",
                "contexts:",
                "current-context: default",
                "kind: Config",
                "users:"
            ]
        );
        assert!(!k.contains("preferences"));
    }

    pub async fn post_is_idempotent_and_get_matches<B: Backend>(b: B) {
        let first = b.post(&account("gc-test", "gc4")).await.kubeconfig();
        let again = b.post(&account("gc-test", "gc4")).await.kubeconfig();
        assert_eq!(first, again, "repeated POSTs return the same kubeconfig");
        let got = b
            .get("namespace=gc-test&serviceAccountName=gc4")
            .await
            .kubeconfig();
        assert_eq!(first, got);
        // The dashboard's exact body is accepted too.
        let dashboard = r#"{"csiClusterRoleName":"harvesterhci.io:csi-driver","clusterRoleName":"harvesterhci.io:cloudprovider","namespace":"gc-test","serviceAccountName":"gc4"}"#;
        assert_eq!(b.post(dashboard).await.kubeconfig(), first);
    }

    pub async fn yaml_output_is_byte_exact<B: Backend>(b: B) {
        let k = b.post(&account("gc-test", "gc4")).await.kubeconfig();
        for r in [
            b.post(&account_yaml("gc-test", "gc4")).await,
            b.get("namespace=gc-test&serviceAccountName=gc4&outputFormat=yaml")
                .await,
        ] {
            assert_eq!(r.status, StatusCode::OK, "{}", r.text());
            assert_eq!(r.content_type(), "application/x-yaml; charset=utf-8");
            assert_eq!(r.text(), expected_cloud_init(&k));
        }
        // Only the exact, case-sensitive `yaml` selects cloud-init.
        let r = b
            .get("namespace=gc-test&serviceAccountName=gc4&outputFormat=YAML")
            .await;
        assert_eq!(r.kubeconfig(), k);
    }

    pub async fn get_unknown_account_is_404<B: Backend>(b: B) {
        let m = b
            .get("namespace=gc-test&serviceAccountName=nobody")
            .await
            .error(StatusCode::NOT_FOUND, "NotFound");
        assert_eq!(
            m,
            "fail to get serviceAccount: serviceaccounts \"nobody\" not found"
        );
        // GET creates nothing: a POST afterwards is the first to create the account.
        let m2 = b
            .get("namespace=gc-test&serviceAccountName=nobody")
            .await
            .error(StatusCode::NOT_FOUND, "NotFound");
        assert_eq!(m, m2);
    }

    pub async fn authentication_errors<B: Backend>(b: B) {
        let path = "/v1/harvester/kubeconfig";
        let body = account("gc-test", "gc4");
        for (token, why) in [
            (None, "must authenticate"),
            (Some("not-a-token"), "invalid token"),
            (Some("token-zzzzz:nope"), "invalid token"),
        ] {
            let r = b.call(Method::POST, path, token, body.clone()).await;
            let m = r.error(StatusCode::UNAUTHORIZED, "Unauthorized");
            assert!(m.contains(why), "{m}");
            assert_eq!(
                r.headers.get("www-authenticate").unwrap(),
                "Bearer realm=\"harvester-cloud\""
            );
        }
        // The right name with a wrong secret says nothing more than an unknown token.
        let name = b.admin_token().split(':').next().unwrap().to_string();
        let r = b
            .call(
                Method::GET,
                path,
                Some(&format!("{name}:wrong")),
                Body::empty(),
            )
            .await;
        assert_eq!(
            r.error(StatusCode::UNAUTHORIZED, "Unauthorized"),
            "invalid token"
        );
        // Basic auth with the token's name and secret works, as Terraform sends it.
        let basic = B64.encode(b.admin_token());
        let req = axum::http::Request::builder()
            .method(Method::POST)
            .uri(path)
            .header("authorization", format!("Basic {basic}"))
            .body(Body::from(body))
            .unwrap();
        use tower::ServiceExt;
        let resp = b.router().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }

    pub async fn invalid_requests_are_422<B: Backend>(b: B) {
        let cases: &[(&str, &str)] = &[
            ("", "fail to decode request: EOF"),
            (
                "null",
                "fail to decode request: invalid request: namespace and serviceAccountName cannot be empty",
            ),
            (
                r#"{"namespace":"gc-test"}"#,
                "fail to decode request: invalid request: namespace and serviceAccountName cannot be empty",
            ),
            (
                r#"{"namespace":"gc-test","serviceAccountName":"gc4","clusterRoleName":"cluster-admin"}"#,
                "fail to decode request: invalid request: clusterRoleName can only be harvesterhci.io:cloudprovider",
            ),
            (
                r#"{"namespace":"gc-test","serviceAccountName":"gc4","csiClusterRoleName":"cluster-admin"}"#,
                "fail to decode request: invalid request: csiClusterRoleName can only be harvesterhci.io:csi-driver",
            ),
            (
                r#"{"namespace":7,"serviceAccountName":"gc4"}"#,
                "fail to decode request: json: cannot unmarshal number into Go struct field req.namespace of type string",
            ),
            (
                r#"["gc-test"]"#,
                "fail to decode request: json: cannot unmarshal array into Go value of type kubeconfig.req",
            ),
            (
                r#"{"namespace":"gc-test","#,
                "fail to decode request: unexpected EOF",
            ),
            (
                "namespace=gc-test",
                "fail to decode request: the body is not valid JSON",
            ),
            (
                r#"{"namespace":"GC_Test","serviceAccountName":"gc4"}"#,
                "fail to decode request: invalid request: namespace \"GC_Test\" is not a valid namespace name",
            ),
            (
                r#"{"namespace":"gc-test","serviceAccountName":"gc4/x"}"#,
                "fail to decode request: invalid request: serviceAccountName \"gc4/x\" is not a valid service account name",
            ),
        ];
        for (body, want) in cases {
            let m = b
                .post(body)
                .await
                .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
            assert!(m.starts_with(want), "body {body:?}: {m}");
        }
        let long_ns = format!(
            r#"{{"namespace":"{}","serviceAccountName":"gc4"}}"#,
            "n".repeat(64)
        );
        let m = b
            .post(&long_ns)
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        assert!(m.contains("must be no more than 63 characters"), "{m}");
        // A body that is not UTF-8 is malformed JSON, not a crash.
        let t = b.admin_token();
        let r = b
            .call(
                Method::POST,
                "/v1/harvester/kubeconfig",
                Some(&t),
                vec![0xff, 0xfe, b'{'],
            )
            .await;
        r.error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");

        // As upstream reads a GET (harvester pkg/api/kubeconfig/generate_handler.go,
        // decodeGetRequest over Go's URL.Query()): a pair Go cannot parse is dropped.
        let queries: &[(&str, &str)] = &[
            ("", "namespace and serviceAccountName cannot be empty"),
            (
                "namespace=gc-test&serviceAccountName=%ff%fe",
                "is not a valid service account name",
            ),
            (
                "namespace=%zz&serviceAccountName=gc4",
                "namespace and serviceAccountName cannot be empty",
            ),
            (
                "namespace=gc-test;x&serviceAccountName=gc4",
                "namespace and serviceAccountName cannot be empty",
            ),
            (
                "namespace=Bad&serviceAccountName=gc4",
                "is not a valid namespace name",
            ),
        ];
        for (q, want) in queries {
            let m = b
                .get(q)
                .await
                .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
            assert!(m.contains(want), "query {q:?}: {m}");
        }
    }

    pub async fn foreign_binding_is_409_and_leaves_nothing<B: Backend>(b: B) {
        // ns=a-b, sa=c and ns=a, sa=b-c both name their ClusterRoleBinding `a-b-c`.
        b.post(&account("a-b", "c")).await.kubeconfig();
        let r = b.post(&account("a", "b-c")).await;
        let m = r.error(StatusCode::CONFLICT, "Conflict");
        assert!(
            m.starts_with("fail to create clusterRoleBinding: clusterrolebinding a-b-c is not owned by serviceAccount name:b-c"),
            "{m}"
        );
        assert!(m.contains("ServiceAccount a-b/c"), "{m}");
        // Checked before anything was created: the second account does not exist.
        let m = b
            .get("namespace=a&serviceAccountName=b-c")
            .await
            .error(StatusCode::NOT_FOUND, "NotFound");
        assert!(m.contains("serviceaccounts \"b-c\" not found"), "{m}");
        // The first account is untouched.
        b.get("namespace=a-b&serviceAccountName=c")
            .await
            .kubeconfig();
    }

    pub async fn oversized_body_is_413<B: Backend>(b: B) {
        let big = format!(
            r#"{{"namespace":"gc-test","serviceAccountName":"gc4","pad":"{}"}}"#,
            "x".repeat(64 * 1024)
        );
        let m = b
            .post(&big)
            .await
            .error(StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge");
        assert!(m.contains("65536"), "{m}");
        // Just under the limit is fine.
        let fits = format!(
            r#"{{"namespace":"gc-test","serviceAccountName":"gc4","pad":"{}"}}"#,
            "x".repeat(60 * 1024)
        );
        b.post(&fits).await.kubeconfig();
    }

    pub async fn other_methods_are_405<B: Backend>(b: B) {
        let t = b.admin_token();
        // HEAD is GET without a body, as HTTP defines it; everything else is refused.
        for m in [Method::PUT, Method::PATCH, Method::OPTIONS] {
            let r = b
                .call(
                    m.clone(),
                    "/v1/harvester/kubeconfig",
                    Some(&t),
                    Body::empty(),
                )
                .await;
            assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{m}");
            let allow = r
                .headers
                .get("allow")
                .unwrap()
                .to_str()
                .unwrap()
                .to_string();
            assert_eq!(allow, "GET, POST, DELETE");
            r.error(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed");
        }
        let r = b
            .call(
                Method::GET,
                "/v1/harvester/nothing",
                Some(&t),
                Body::empty(),
            )
            .await;
        r.error(StatusCode::NOT_FOUND, "NotFound");
    }

    pub async fn concurrent_posts_create_one_account<B: Backend>(b: B) {
        let body = account("gc-test", "racer");
        let replies: Vec<Reply> = futures::future::join_all((0..32).map(|_| b.post(&body))).await;
        let first = replies[0].kubeconfig();
        for r in &replies {
            assert_eq!(
                r.kubeconfig(),
                first,
                "every concurrent POST returns the same kubeconfig"
            );
        }
        assert_eq!(
            b.get("namespace=gc-test&serviceAccountName=racer")
                .await
                .kubeconfig(),
            first
        );
        // Exactly one of each object, whatever names a buggy path might have used.
        let store = b.store();
        let everything = LabelSelector::everything();
        let count = |items: Vec<Value>, pred: &dyn Fn(&Value) -> bool| {
            items.iter().filter(|v| pred(v)).count()
        };
        let sas = store
            .list(&Kind::of::<ServiceAccount>(), Some("gc-test"), &everything)
            .await
            .unwrap()
            .items;
        assert_eq!(count(sas, &|v| v["metadata"]["name"] == "racer"), 1);
        let secrets = store
            .list(&Kind::of::<Secret>(), Some("gc-test"), &everything)
            .await
            .unwrap()
            .items;
        assert_eq!(
            count(
                secrets,
                &|v| v["metadata"]["annotations"]["kubernetes.io/service-account.name"] == "racer"
            ),
            1
        );
        let subject_is_racer = |v: &Value| v["subjects"][0]["name"] == "racer";
        let rbs = store
            .list(&Kind::of::<RoleBinding>(), Some("gc-test"), &everything)
            .await
            .unwrap()
            .items;
        assert_eq!(count(rbs, &subject_is_racer), 1);
        let crbs = store
            .list(&Kind::of::<ClusterRoleBinding>(), None, &everything)
            .await
            .unwrap()
            .items;
        assert_eq!(count(crbs, &subject_is_racer), 1);
    }

    pub async fn restart_keeps_accounts_and_tokens<B: Backend>(b: B) {
        let before = b.post(&account("gc-test", "gc4")).await.kubeconfig();
        let b = b.restart().await;
        let after = b
            .get("namespace=gc-test&serviceAccountName=gc4")
            .await
            .kubeconfig();
        assert_eq!(before, after);
        assert_eq!(
            b.post(&account("gc-test", "gc4")).await.kubeconfig(),
            before
        );
    }

    pub async fn health_endpoints<B: Backend>(b: B) {
        for path in ["/healthz", "/readyz"] {
            let r = b.call(Method::GET, path, None, Body::empty()).await;
            assert_eq!(r.status, StatusCode::OK, "{path}");
            assert_eq!(r.text(), "ok");
        }
    }

    pub async fn delete_revokes_the_account<B: Backend>(b: B) {
        let t = b.admin_token();
        let first = b.post(&account("gc-test", "gc4")).await.kubeconfig();
        b.post(&account("gc-test", "other")).await.kubeconfig();
        let del = |q: &'static str| b.call(Method::DELETE, q, Some(&t), Body::empty());
        let r = del("/v1/harvester/kubeconfig?namespace=gc-test&serviceAccountName=gc4").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let v = r.json();
        assert_eq!(v["namespace"], "gc-test");
        assert_eq!(v["serviceAccountName"], "gc4");
        let deleted: Vec<&str> = v["deleted"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap())
            .collect();
        assert_eq!(
            deleted,
            [
                "clusterrolebinding gc-test-gc4",
                "rolebinding gc-test/gc-test-gc4",
                "secret gc-test/gc4-token",
                "serviceaccount gc-test/gc4"
            ]
        );
        assert_eq!(v["kept"], serde_json::json!([]));
        // Gone for GET; a new POST makes a new account with a new token.
        b.get("namespace=gc-test&serviceAccountName=gc4")
            .await
            .error(StatusCode::NOT_FOUND, "NotFound");
        // Idempotent: deleting again deletes nothing and succeeds.
        let r = del("/v1/harvester/kubeconfig?namespace=gc-test&serviceAccountName=gc4").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.json()["deleted"], serde_json::json!([]));
        let again = b.post(&account("gc-test", "gc4")).await.kubeconfig();
        assert_ne!(again, first, "a revoked token is never handed out again");
        // The other account is untouched.
        b.get("namespace=gc-test&serviceAccountName=other")
            .await
            .kubeconfig();
        // Names are validated like everywhere else.
        let r = del("/v1/harvester/kubeconfig?namespace=Bad&serviceAccountName=gc4").await;
        r.error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        let r = b
            .call(
                Method::DELETE,
                "/v1/harvester/kubeconfig?namespace=gc-test&serviceAccountName=gc4",
                None,
                Body::empty(),
            )
            .await;
        r.error(StatusCode::UNAUTHORIZED, "Unauthorized");
    }

    pub async fn delete_keeps_what_is_not_the_accounts<B: Backend>(b: B) {
        // a-b/c owns the ClusterRoleBinding a-b-c; revoking a/b-c must not take it.
        b.post(&account("a-b", "c")).await.kubeconfig();
        let t = b.admin_token();
        let r = b
            .call(
                Method::DELETE,
                "/v1/harvester/kubeconfig?namespace=a&serviceAccountName=b-c",
                Some(&t),
                Body::empty(),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let v = r.json();
        assert_eq!(v["deleted"], serde_json::json!([]));
        assert_eq!(v["kept"][0]["object"], "clusterrolebinding a-b-c");
        b.get("namespace=a-b&serviceAccountName=c")
            .await
            .kubeconfig();
    }

    /// GET reads its query as Harvester's handler does (pkg/api/kubeconfig/generate_handler.go:
    /// `req.URL.Query()`, then the role names forced to the defaults), and its router (pkg/server/
    /// router.go: gorilla/mux with `StrictSlash(true)`) sends a trailing slash to the path without.
    pub async fn get_is_as_lenient_as_upstream<B: Backend>(b: B) {
        let k = b.post(&account("gc-test", "gc4")).await.kubeconfig();
        for query in [
            // Upstream overwrites both role names before it looks at anything.
            "namespace=gc-test&serviceAccountName=gc4&clusterRoleName=cluster-admin&csiClusterRoleName=x",
            // Go's URL.Query() drops a pair whose escape does not decode or that holds a `;`.
            "namespace=gc-test&foo=%zz&serviceAccountName=gc4",
            "x=1;2&namespace=gc-test&serviceAccountName=gc4",
            "namespace=gc-test&serviceAccountName=gc4&%zz",
        ] {
            assert_eq!(b.get(query).await.kubeconfig(), k, "{query}");
        }
        // A dropped pair is dropped, not half-read: the name it held is missing.
        let m = b
            .get("namespace=gc-test;x&serviceAccountName=gc4")
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        assert!(m.contains("namespace"), "{m}");
        // The redirect comes before authentication and keeps the query.
        for method in [Method::GET, Method::POST, Method::DELETE] {
            let r = b
                .call(
                    method.clone(),
                    "/v1/harvester/kubeconfig/?namespace=gc-test&serviceAccountName=gc4",
                    None,
                    Body::empty(),
                )
                .await;
            assert_eq!(r.status, StatusCode::MOVED_PERMANENTLY, "{method}");
            assert_eq!(
                r.headers.get("location").unwrap(),
                "../kubeconfig?namespace=gc-test&serviceAccountName=gc4"
            );
        }
        let r = b
            .call(
                Method::GET,
                "/v1/harvester/kubeconfig/",
                None,
                Body::empty(),
            )
            .await;
        assert_eq!(r.headers.get("location").unwrap(), "../kubeconfig");
    }

    /// GET serves an account only when its bindings are the ServiceAccount's (upstream's
    /// validateOwner in pkg/api/kubeconfig/generate_handler.go) and bind what they should (ours);
    /// the message says which check failed.
    pub async fn get_checks_the_bindings<B: Backend>(b: B) {
        use harvester_cloud::kubeconfig::{naming::AccountNames, objects};
        let k = b.post(&account("gc-test", "gc5")).await.kubeconfig();
        let names = AccountNames::new("gc-test", "gc5");
        let store = b.store();
        let crbs = harvester_cloud::store::Api::<ClusterRoleBinding>::new(store.clone());
        let rbs = harvester_cloud::store::Api::<RoleBinding>::new(store);
        let query = "namespace=gc-test&serviceAccountName=gc5";

        // The ClusterRoleBinding's ServiceAccount UID is another's.
        let mut crb = crbs.get("", &names.binding).await.unwrap().unwrap();
        let kept = crb.clone();
        crb.metadata.annotations.as_mut().unwrap().insert(
            objects::BINDING_SA_UID_ANNOTATION.into(),
            "00000000-0000-0000-0000-000000000000".into(),
        );
        let crb = crbs.replace(&crb).await.unwrap();
        let m = b.get(query).await.error(StatusCode::CONFLICT, "Conflict");
        assert!(
            m.starts_with(&format!(
                "fail to get clusterRoleBinding: clusterrolebinding {} is not owned by serviceAccount name:gc5 UID:",
                names.binding
            )),
            "{m}"
        );

        // Owned again, but binding a second subject.
        let mut back = kept.clone();
        back.metadata.resource_version = crb.metadata.resource_version.clone();
        back.subjects
            .as_mut()
            .unwrap()
            .push(k8s_openapi::api::rbac::v1::Subject {
                kind: "ServiceAccount".into(),
                name: "intruder".into(),
                namespace: Some("gc-test".into()),
                ..Default::default()
            });
        let crb = crbs.replace(&back).await.unwrap();
        let m = b.get(query).await.error(StatusCode::CONFLICT, "Conflict");
        assert!(
            m.starts_with(&format!(
                "fail to get clusterRoleBinding: clusterrolebinding {} does not bind ClusterRole harvesterhci.io:csi-driver",
                names.binding
            )),
            "{m}"
        );
        let mut back = kept;
        back.metadata.resource_version = crb.metadata.resource_version.clone();
        crbs.replace(&back).await.unwrap();
        assert_eq!(b.get(query).await.kubeconfig(), k);

        // The RoleBinding without its owner reference is not the account's either.
        let mut rb = rbs.get("gc-test", &names.binding).await.unwrap().unwrap();
        rb.metadata.owner_references = None;
        rbs.replace(&rb).await.unwrap();
        let m = b.get(query).await.error(StatusCode::CONFLICT, "Conflict");
        assert!(
            m.starts_with(&format!(
                "fail to get roleBinding: rolebinding gc-test/{} is not owned by serviceAccount name:gc5 UID:",
                names.binding
            )),
            "{m}"
        );
    }

    pub async fn names_are_safely_concatenated<B: Backend>(b: B) {
        let (ns, sa) = (
            "guest-cluster-namespace-with-a-rather-long-name",
            "guest-cluster-service-account-name",
        );
        let k = b.post(&account(ns, sa)).await.kubeconfig();
        assert_eq!(
            b.get(&format!("namespace={ns}&serviceAccountName={sa}"))
                .await
                .kubeconfig(),
            k
        );
        // A 253-character service account name still works (its token Secret name is cut to 63).
        let long_sa = format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61)
        );
        assert_eq!(long_sa.len(), 253);
        b.post(&account("gc-test", &long_sa)).await.kubeconfig();
    }
    pub fn token_of(kubeconfig: &str) -> String {
        yaml(kubeconfig)["users"][0]["user"]["token"]
            .as_str()
            .expect("a token")
            .to_string()
    }

    /// How many token Secrets of the ServiceAccount `sa` there are in `ns`.
    async fn token_secrets<B: Backend>(b: &B, ns: &str, sa: &str) -> usize {
        b.store()
            .list(
                &Kind::of::<Secret>(),
                Some(ns),
                &LabelSelector::everything(),
            )
            .await
            .unwrap()
            .items
            .iter()
            .filter(|s| s["metadata"]["annotations"]["kubernetes.io/service-account.name"] == sa)
            .count()
    }

    async fn rotate<B: Backend>(b: &B, body: Value) -> Reply {
        let t = b.admin_token();
        b.call(
            Method::POST,
            "/v1/harvester/kubeconfig/rotate",
            Some(&t),
            body.to_string(),
        )
        .await
    }

    /// GET keeps what it rendered (by the versions of the account's objects), and never serves
    /// it once they changed: after a rotation, a binding edited or deleted, a token's end (no
    /// sweeper runs here, so the Secret is still there) and a revocation, each GET follows the
    /// objects as they are.
    pub async fn get_serves_nothing_stale<B: Backend>(b: B) {
        use harvester_cloud::kubeconfig::naming::AccountNames;
        let query = "namespace=gc-test&serviceAccountName=gc6";
        let get = || b.get(query);
        let posted = b.post(&account("gc-test", "gc6")).await.kubeconfig();
        assert_eq!(get().await.kubeconfig(), posted);
        assert_eq!(get().await.kubeconfig(), posted, "served again, as it was");

        // A rotation: the new token at once.
        let rotated = rotate(
            &b,
            serde_json::json!({"namespace": "gc-test", "serviceAccountName": "gc6", "gracePeriod": "1h"}),
        )
        .await
        .kubeconfig();
        assert_ne!(token_of(&rotated), token_of(&posted));
        assert_eq!(get().await.kubeconfig(), rotated);
        assert_eq!(get().await.kubeconfig(), rotated);

        // The RoleBinding binds another subject too: refused at once; deleted: not found;
        // recreated by POST: served again.
        let names = AccountNames::new("gc-test", "gc6");
        let rbs = harvester_cloud::store::Api::<RoleBinding>::new(b.store());
        let mut rb = rbs.get("gc-test", &names.binding).await.unwrap().unwrap();
        rb.subjects
            .as_mut()
            .unwrap()
            .push(k8s_openapi::api::rbac::v1::Subject {
                kind: "ServiceAccount".into(),
                name: "intruder".into(),
                namespace: Some("gc-test".into()),
                ..Default::default()
            });
        rbs.replace(&rb).await.unwrap();
        get().await.error(StatusCode::CONFLICT, "Conflict");
        rbs.delete("gc-test", &names.binding, &Default::default())
            .await
            .unwrap();
        let m = get().await.error(StatusCode::NOT_FOUND, "NotFound");
        assert!(m.contains("rolebinding"), "{m}");
        assert_eq!(
            b.post(&account("gc-test", "gc6")).await.kubeconfig(),
            rotated
        );
        assert_eq!(get().await.kubeconfig(), rotated);

        // The ClusterRoleBinding deleted: not found, though its RoleBinding and token are as
        // they were.
        let crbs = harvester_cloud::store::Api::<ClusterRoleBinding>::new(b.store());
        crbs.delete("", &names.binding, &Default::default())
            .await
            .unwrap();
        let m = get().await.error(StatusCode::NOT_FOUND, "NotFound");
        assert!(m.contains("clusterrolebinding"), "{m}");
        assert_eq!(
            b.post(&account("gc-test", "gc6")).await.kubeconfig(),
            rotated
        );
        assert_eq!(get().await.kubeconfig(), rotated);

        // Revoked: gone, and a new account of the name is served with its own token.
        let t = b.admin_token();
        let r = b
            .call(
                Method::DELETE,
                &format!("/v1/harvester/kubeconfig?{query}"),
                Some(&t),
                Body::empty(),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        get().await.error(StatusCode::NOT_FOUND, "NotFound");
        let again = b.post(&account("gc-test", "gc6")).await.kubeconfig();
        assert_ne!(token_of(&again), token_of(&rotated));
        assert_eq!(get().await.kubeconfig(), again);

        // A token with an end: served until then, and not a moment after, whether or not its
        // Secret is still there.
        // (The shortest lifetime a request may ask for is 10 s.)
        let short = serde_json::json!({"namespace": "gc-test", "serviceAccountName": "gc7", "expirationSeconds": 10}).to_string();
        let k = b.post(&short).await.kubeconfig();
        let query7 = "namespace=gc-test&serviceAccountName=gc7";
        assert_eq!(b.get(query7).await.kubeconfig(), k);
        let secret = harvester_cloud::store::Api::<Secret>::new(b.store())
            .get("gc-test", "gc7-token")
            .await
            .unwrap()
            .unwrap();
        let ends = harvester_cloud::kubeconfig::objects::expires_at(&secret).unwrap();
        let left = ends - time::OffsetDateTime::now_utc() + time::Duration::milliseconds(200);
        tokio::time::sleep(left.try_into().unwrap_or_default()).await;
        let m = b.get(query7).await.error(StatusCode::NOT_FOUND, "NotFound");
        assert!(m.contains("has ended"), "{m}");
    }

    /// The sweeper, as every replica runs it, for as long as the guard lives.
    fn sweeper<B: Backend>(b: &B) -> tokio_util::sync::DropGuard {
        let stop = tokio_util::sync::CancellationToken::new();
        tokio::spawn(b.cloud_config().run_sweeper(stop.clone()));
        stop.drop_guard()
    }

    /// Rotations of one account at once, through the API: each answers 200 or a 409 that says a
    /// rotation is under way and to retry; a task looking at the account's token Secrets all
    /// along never sees more than two; after each round GET serves a token that one of them
    /// answered and that works, and no more than two token Secrets are left. An older rotation's
    /// clean-up deleted the token a newer one had just made current (GET 404, the newest token
    /// refused), and each rotation made its token before the losers' 409.
    pub async fn concurrent_rotations_keep_the_newest_token<B: Backend>(b: B) {
        let user = "system:serviceaccount:gc-test:gc9";
        let first = token_of(&b.post(&account("gc-test", "gc9")).await.kubeconfig());
        let body = serde_json::json!({"namespace": "gc-test", "serviceAccountName": "gc9", "gracePeriod": "1h"});
        let mut answered = vec![first];
        for round in 0..6 {
            let done = std::sync::atomic::AtomicBool::new(false);
            let watch = async {
                let mut most = 0;
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    most = most.max(token_secrets(&b, "gc-test", "gc9").await);
                    tokio::task::yield_now().await;
                }
                most
            };
            let rotations = async {
                let replies =
                    futures::future::join_all((0..8).map(|_| rotate(&b, body.clone()))).await;
                done.store(true, std::sync::atomic::Ordering::SeqCst);
                replies
            };
            let (replies, most) = tokio::join!(rotations, watch);
            assert!(most <= 2, "round {round}: {most} token Secrets at once");
            for r in &replies {
                match r.status {
                    StatusCode::OK => answered.push(token_of(&r.kubeconfig())),
                    StatusCode::CONFLICT => assert!(
                        r.text().contains("under way") && r.text().contains("retry"),
                        "{}",
                        r.text()
                    ),
                    other => panic!("round {round}: rotation answered {other}: {}", r.text()),
                }
            }
            let got = b.get("namespace=gc-test&serviceAccountName=gc9").await;
            assert_eq!(got.status, StatusCode::OK, "round {round}: {}", got.text());
            let current = token_of(&got.kubeconfig());
            assert!(
                answered.contains(&current),
                "round {round}: GET serves a token no request was given"
            );
            eventually(
                &format!("round {round}: the current token to work"),
                async || b.token_works(&current, user).await.then_some(()),
            )
            .await;
            let tokens = token_secrets(&b, "gc-test", "gc9").await;
            assert!(tokens <= 2, "round {round}: {tokens} token Secrets");
        }
    }

    /// A rotation's new token works at once; the one it replaced works through its grace; a
    /// second rotation ends the token before that at once (only the newest two work); a short
    /// grace ends when it says, and POST and GET hand out the newest token.
    pub async fn rotation_keeps_the_old_token_for_its_grace<B: Backend>(b: B) {
        let _sweeper = sweeper(&b);
        let user = "system:serviceaccount:gc-test:gc4";
        let a = token_of(&b.post(&account("gc-test", "gc4")).await.kubeconfig());
        // A Kubernetes API server authenticates a new token Secret from its cache, which may lag
        // behind under load: a new token is waited for, never assumed at once.
        eventually("the first token to work", async || {
            b.token_works(&a, user).await.then_some(())
        })
        .await;
        let one_hour = serde_json::json!({"namespace": "gc-test", "serviceAccountName": "gc4", "gracePeriod": "1h"});
        let r = rotate(&b, one_hour).await;
        let kb = r.kubeconfig();
        let tb = token_of(&kb);
        assert_ne!(tb, a);
        eventually("the new token to work", async || {
            b.token_works(&tb, user).await.then_some(())
        })
        .await;
        assert!(
            b.token_works(&a, user).await,
            "the old one, in its grace, too"
        );
        // GET and POST now hand out the new token.
        let got = b
            .get("namespace=gc-test&serviceAccountName=gc4")
            .await
            .kubeconfig();
        assert_eq!(got, kb);
        assert_eq!(b.post(&account("gc-test", "gc4")).await.kubeconfig(), kb);

        // Again, with the optional fields null (as absent: the default grace, an hour, so the
        // replaced token keeps working): the token before the replaced one stops now.
        let nulls = serde_json::json!({"namespace": "gc-test", "serviceAccountName": "gc4",
            "gracePeriod": null, "cloudConfigPath": null, "expirationSeconds": null});
        let tc = token_of(&rotate(&b, nulls).await.kubeconfig());
        eventually("the oldest token to be refused", async || {
            (!b.token_works(&a, user).await).then_some(())
        })
        .await;
        assert!(b.token_works(&tb, user).await);
        eventually("the newest token to work", async || {
            b.token_works(&tc, user).await.then_some(())
        })
        .await;
        let tokens = token_secrets(&b, "gc-test", "gc4").await;
        assert_eq!(tokens, 2, "only the newest two token Secrets are kept");

        // A short grace: the replaced token stops when it ends (the sweeper deletes its Secret),
        // the new one keeps working.
        let r = rotate(
            &b,
            serde_json::json!({"namespace": "gc-test", "serviceAccountName": "gc4", "gracePeriod": 2, "outputFormat": "yaml"}),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert!(r.text().starts_with("########## cloud-init user data"));
        let kd = b
            .get("namespace=gc-test&serviceAccountName=gc4")
            .await
            .kubeconfig();
        let td = token_of(&kd);
        // Its Secret is gone before the rotation answers; the API server's token authenticator
        // reads Secrets from its informer's cache, so on Kubernetes the refusal follows within
        // moments.
        eventually(
            "the token older than the replaced to be refused",
            async || (!b.token_works(&tb, user).await).then_some(()),
        )
        .await;
        eventually("the replaced token to end with its grace", async || {
            (!b.token_works(&tc, user).await).then_some(())
        })
        .await;
        assert!(b.token_works(&td, user).await);
        eventually("the ended Secret to be deleted", async || {
            let left = token_secrets(&b, "gc-test", "gc4").await;
            (left == 1).then_some(())
        })
        .await;

        // DELETE ends every token of the account.
        let t = b.admin_token();
        let r = b
            .call(
                Method::DELETE,
                "/v1/harvester/kubeconfig?namespace=gc-test&serviceAccountName=gc4",
                Some(&t),
                Body::empty(),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        eventually("the revoked token to be refused", async || {
            (!b.token_works(&td, user).await).then_some(())
        })
        .await;
    }

    /// What a rotation refuses: an account that does not exist (404), one that is not a
    /// cloud-config account (409), a grace longer than the service allows and bad fields (422).
    pub async fn rotation_refusals<B: Backend>(b: B) {
        let r = rotate(
            &b,
            serde_json::json!({"namespace": "gc-test", "serviceAccountName": "nobody"}),
        )
        .await;
        let msg = r.error(StatusCode::NOT_FOUND, "NotFound");
        assert!(
            msg.contains("serviceaccounts \"nobody\" not found"),
            "{msg}"
        );
        // A ServiceAccount someone else made.
        let sas = harvester_cloud::store::Api::<ServiceAccount>::new(b.store());
        sas.create(&ServiceAccount {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("theirs".into()),
                namespace: Some("gc-test".into()),
                ..Default::default()
            },
            ..Default::default()
        })
        .await
        .unwrap();
        let r = rotate(
            &b,
            serde_json::json!({"namespace": "gc-test", "serviceAccountName": "theirs"}),
        )
        .await;
        let msg = r.error(StatusCode::CONFLICT, "Conflict");
        assert!(msg.contains("is not a cloud-config account"), "{msg}");
        b.post(&account("gc-test", "gc4")).await.kubeconfig();
        let r = rotate(&b, serde_json::json!({"namespace": "gc-test", "serviceAccountName": "gc4", "gracePeriod": "25h"})).await;
        let msg = r.error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        assert!(
            msg.contains("longer than this service allows (86400s"),
            "{msg}"
        );
        let r = rotate(&b, serde_json::json!({"namespace": "gc-test", "serviceAccountName": "gc4", "gracePeriod": "soon"})).await;
        r.error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        let r = rotate(&b, serde_json::json!({"namespace": "gc-test", "serviceAccountName": "gc4", "expirationSeconds": 5})).await;
        r.error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        // Nothing was made by the refusals: the account still has one token Secret.
        let secrets = b
            .store()
            .list(
                &Kind::of::<Secret>(),
                Some("gc-test"),
                &LabelSelector::everything(),
            )
            .await
            .unwrap();
        let names: Vec<&str> = secrets
            .items
            .iter()
            .filter(|s| s["metadata"]["annotations"]["kubernetes.io/service-account.name"] == "gc4")
            .map(|s| s["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["gc4-token"]);
        // Only POST.
        let t = b.admin_token();
        let r = b
            .call(
                Method::GET,
                "/v1/harvester/kubeconfig/rotate",
                Some(&t),
                Body::empty(),
            )
            .await;
        r.error(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed");
    }

    /// `expirationSeconds`: the token stops then; a POST asking the same lifetime again gets the
    /// same token, one asking another is a 409; a rotation may give the new token a lifetime.
    pub async fn an_expiring_token_stops<B: Backend>(b: B) {
        let _sweeper = sweeper(&b);
        let post = |sa: &str, secs: u64| {
            serde_json::json!({"namespace": "gc-test", "serviceAccountName": sa, "expirationSeconds": secs}).to_string()
        };
        // A long one works, and says when it ends.
        let long = b.post(&post("long", 3600)).await.kubeconfig();
        assert!(
            b.token_works(&token_of(&long), "system:serviceaccount:gc-test:long")
                .await
        );
        let secret = harvester_cloud::store::Api::<Secret>::new(b.store())
            .get("gc-test", "long-token")
            .await
            .unwrap()
            .unwrap();
        let ends = secret.metadata.annotations.unwrap()["harvester-cloud.io/expires-at"].clone();
        let ends =
            time::OffsetDateTime::parse(&ends, &time::format_description::well_known::Rfc3339)
                .unwrap();
        let left = ends - time::OffsetDateTime::now_utc();
        assert!(
            left <= time::Duration::hours(1) && left > time::Duration::minutes(50),
            "{left}"
        );
        assert_eq!(
            b.post(&post("long", 3600)).await.kubeconfig(),
            long,
            "the same lifetime: the same token"
        );
        let r = b.post(&post("long", 600)).await;
        let msg = r.error(StatusCode::CONFLICT, "Conflict");
        assert!(msg.contains("rotate it"), "{msg}");
        let msg = b
            .post(&post("forever", 0))
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        assert!(msg.contains("expirationSeconds"), "{msg}");
        let never = b.post(&account("gc-test", "never")).await.kubeconfig();
        let msg = b
            .post(&post("never", 3600))
            .await
            .error(StatusCode::CONFLICT, "Conflict");
        assert!(msg.contains("does not expire"), "{msg}");
        assert_eq!(
            b.post(&account("gc-test", "never")).await.kubeconfig(),
            never
        );

        // A short one stops by itself.
        let short = token_of(&b.post(&post("short", 10)).await.kubeconfig());
        eventually("the expiring token to be refused", async || {
            (!b.token_works(&short, "system:serviceaccount:gc-test:short")
                .await)
                .then_some(())
        })
        .await;
        // The account remains; GET then says its token is gone (ended, or its Secret deleted by
        // the sweeper), and POST issues a new one.
        let msg = b
            .get("namespace=gc-test&serviceAccountName=short")
            .await
            .error(StatusCode::NOT_FOUND, "NotFound");
        assert!(
            msg.contains("secrets \"short-token\" not found")
                || msg.contains("the token in secret \"short-token\" has ended"),
            "{msg}"
        );
        let again = token_of(&b.post(&account("gc-test", "short")).await.kubeconfig());
        assert!(
            b.token_works(&again, "system:serviceaccount:gc-test:short")
                .await
        );

        // A rotation may give the new token a lifetime.
        let r = rotate(
            &b,
            serde_json::json!({"namespace": "gc-test", "serviceAccountName": "never", "expirationSeconds": 10, "gracePeriod": 0}),
        )
        .await;
        let rotated = token_of(&r.kubeconfig());
        assert!(
            !b.token_works(&token_of(&never), "system:serviceaccount:gc-test:never")
                .await,
            "no grace: the old token stops at once"
        );
        eventually("the rotated expiring token to be refused", async || {
            (!b.token_works(&rotated, "system:serviceaccount:gc-test:never")
                .await)
                .then_some(())
        })
        .await;
    }

    /// `cloudConfigPath`: one file at that path in the cloud-init output, on POST, GET and rotate.
    pub async fn cloud_config_path_writes_one_file<B: Backend>(b: B) {
        let path = "/opt/rke2/etc/config-files/cloud-provider-config";
        let body = serde_json::json!({"namespace": "gc-test", "serviceAccountName": "gc4", "outputFormat": "yaml", "cloudConfigPath": path}).to_string();
        let r = b.post(&body).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let k = b.post(&account("gc-test", "gc4")).await.kubeconfig();
        let b64 = B64.encode(&k);
        let want = format!(
            "########## cloud-init user data ############\nwrite_files:\n- encoding: b64\n  content: {b64}\n  owner: root:root\n  path: {path}\n  permissions: '0644'\n"
        );
        assert_eq!(r.text(), want);
        let got = b
            .get(&format!(
                "namespace=gc-test&serviceAccountName=gc4&outputFormat=yaml&cloudConfigPath={}",
                path.replace('/', "%2F")
            ))
            .await;
        assert_eq!(got.text(), want);
        for bad in ["", "opt/rke2/cloud-config", "/opt/../etc/x"] {
            let body = serde_json::json!({"namespace": "gc-test", "serviceAccountName": "gc4", "outputFormat": "yaml", "cloudConfigPath": bad}).to_string();
            let msg = b
                .post(&body)
                .await
                .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
            assert!(msg.contains("cloudConfigPath"), "{msg}");
        }
        // Without it, Harvester's output, byte for byte.
        let r = b.post(&account_yaml("gc-test", "gc4")).await;
        assert_eq!(r.text(), expected_cloud_init(&k));
    }
}

suite!(
    [embedded => EmbeddedBackend::start(), kube => KubeBackend::start()],
    [
        raw_kubeconfig_shape,
        post_is_idempotent_and_get_matches,
        yaml_output_is_byte_exact,
        get_unknown_account_is_404,
        authentication_errors,
        invalid_requests_are_422,
        foreign_binding_is_409_and_leaves_nothing,
        oversized_body_is_413,
        other_methods_are_405,
        concurrent_posts_create_one_account,
        restart_keeps_accounts_and_tokens,
        health_endpoints,
        names_are_safely_concatenated,
        delete_revokes_the_account,
        delete_keeps_what_is_not_the_accounts,
        get_is_as_lenient_as_upstream,
        get_checks_the_bindings,
        rotation_keeps_the_old_token_for_its_grace,
        concurrent_rotations_keep_the_newest_token,
        rotation_refusals,
        an_expiring_token_stops,
        cloud_config_path_writes_one_file,
        get_serves_nothing_stale,
    ]
);

// --- Embedded-only behaviour ---------------------------------------------------------------------

mod embedded_only {
    use super::*;
    use harvester_cloud::auth::tokens;
    use jsonwebtoken::{DecodingKey, Validation, jwk::JwkSet};

    /// A cloud-config token on the routes only admins use: 403, saying the route is not its
    /// caller's (not that Rancher's role bindings are missing: there is no Rancher here).
    #[tokio::test]
    async fn a_cloud_config_token_is_refused_admin_routes() {
        let b = EmbeddedBackend::start().await;
        let token = super::cases::token_of(&b.post(&account("gc-test", "gc1")).await.kubeconfig());
        for path in [
            "/v1/harvester/kubevirt.io.virtualmachineinstances",
            "/v1/harvester/services",
            "/v1/harvester/discovery.k8s.io.endpointslices",
            "/v1/harvester/guestclusters/gc-test/gc1/services",
        ] {
            let m = b
                .call(Method::GET, path, Some(&token), Body::empty())
                .await
                .error(StatusCode::FORBIDDEN, "PermissionDenied");
            assert_eq!(
                m,
                "user \"system:serviceaccount:gc-test:gc1\" may not use this route: it is for the service's admin tokens and Rancher administrators",
                "{path}"
            );
        }
        // A LoadBalancer's Events are the LoadBalancer's: the permission it lacks is named.
        let m = b
            .call(
                Method::GET,
                "/v1/harvester/loadbalancer.harvesterhci.io.loadbalancers/default/lb/events",
                Some(&token),
                Body::empty(),
            )
            .await
            .error(StatusCode::FORBIDDEN, "PermissionDenied");
        assert!(m.contains("cannot get resource \"loadbalancers\""), "{m}");
    }

    /// Refusing an unknown token name does the work refusing a known one does: no query of the
    /// token table per request (the table is in memory), and a hash verified either way.
    #[tokio::test]
    async fn unknown_and_known_token_names_are_refused_alike() {
        use harvester_cloud::auth::{
            ApiToken, Authenticator, Credential, embedded::EmbeddedAuthenticator,
        };
        let b = EmbeddedBackend::start().await;
        let auth = EmbeddedAuthenticator::with_refresh(
            b.app.store.pool().clone(),
            &b.data_dir(),
            std::time::Duration::from_secs(3600),
        );
        let admin = ApiToken::parse(&b.admin_token()).unwrap();
        for i in 0..200 {
            let name = if i % 2 == 0 {
                admin.name.clone()
            } else {
                format!("token-{:05}", i)
            };
            let wrong = Credential::Api(ApiToken {
                name,
                secret: "wrong-secret".into(),
            });
            let refused = auth.authenticate(&wrong).await.unwrap_err();
            assert_eq!(refused.to_string(), "invalid token");
        }
        assert!(auth.authenticate(&Credential::Api(admin)).await.is_ok());
        assert_eq!(
            auth.table_reads(),
            1,
            "the table is read once, not per request"
        );
    }

    #[tokio::test]
    async fn tokens_are_jwts_verifiable_from_the_published_keys() {
        let b = EmbeddedBackend::start().await;
        let k = b.post(&account("gc-test", "gc4")).await.kubeconfig();
        let token = yaml(&k)["users"][0]["user"]["token"]
            .as_str()
            .unwrap()
            .to_string();

        let config = b
            .call(
                Method::GET,
                "/.well-known/openid-configuration",
                None,
                Body::empty(),
            )
            .await
            .json();
        let issuer = config["issuer"].as_str().unwrap().to_string();
        assert!(
            config["jwks_uri"]
                .as_str()
                .unwrap()
                .ends_with("/openid/v1/jwks")
        );
        let jwks: JwkSet = serde_json::from_slice(
            &b.call(Method::GET, "/openid/v1/jwks", None, Body::empty())
                .await
                .body,
        )
        .unwrap();
        let header = jsonwebtoken::decode_header(&token).unwrap();
        let jwk = jwks
            .find(header.kid.as_deref().unwrap())
            .expect("the signing key is published");
        let mut v = Validation::new(header.alg);
        v.set_issuer(&[&issuer]);
        v.set_audience(&[&issuer]);
        v.validate_exp = false;
        v.set_required_spec_claims(&["iss", "sub"]);
        let claims =
            jsonwebtoken::decode::<Value>(&token, &DecodingKey::from_jwk(jwk).unwrap(), &v)
                .expect("token verifies")
                .claims;
        assert_eq!(claims["sub"], "system:serviceaccount:gc-test:gc4");
        assert_eq!(claims["kubernetes.io"]["namespace"], "gc-test");
        assert_eq!(claims["kubernetes.io"]["serviceaccount"]["name"], "gc4");
        assert!(
            claims["kubernetes.io"]["serviceaccount"]["uid"]
                .as_str()
                .is_some_and(|u| u.len() == 36)
        );
    }

    #[tokio::test]
    async fn expired_and_revoked_tokens_are_refused() {
        let b = EmbeddedBackend::start().await;
        let pool = b.app.store.pool().clone();
        // What `harvester-cloud token` does after it writes: the server reads the table again.
        let changed = || tokens::mark_changed(&b.data_dir());
        let body = account("gc-test", "gc4");
        let path = "/v1/harvester/kubeconfig";

        let (expired, _) = tokens::create(&pool, "", Some(time::Duration::ZERO))
            .await
            .unwrap();
        changed();
        let r = b
            .call(Method::POST, path, Some(&expired.expose()), body.clone())
            .await;
        assert_eq!(
            r.error(StatusCode::UNAUTHORIZED, "Unauthorized"),
            format!("token {} is expired", expired.name)
        );

        let (live, _) = tokens::create(&pool, "", Some(time::Duration::hours(1)))
            .await
            .unwrap();
        changed();
        let r = b
            .call(Method::POST, path, Some(&live.expose()), body.clone())
            .await;
        assert_eq!(r.status, StatusCode::OK);

        let (revoked, _) = tokens::create(&pool, "", None).await.unwrap();
        tokens::revoke(&pool, &revoked.name).await.unwrap();
        changed();
        let r = b
            .call(Method::POST, path, Some(&revoked.expose()), body.clone())
            .await;
        assert_eq!(
            r.error(StatusCode::UNAUTHORIZED, "Unauthorized"),
            format!("token {} is revoked", revoked.name)
        );

        // Revoking a token in use takes effect at once when the writer says so, and otherwise
        // within the second after which the table is read again anyway.
        tokens::revoke(&pool, &live.name).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
        let r = b.call(Method::POST, path, Some(&live.expose()), body).await;
        r.error(StatusCode::UNAUTHORIZED, "Unauthorized");
    }

    #[tokio::test]
    async fn tokens_are_stored_hashed() {
        let b = EmbeddedBackend::start().await;
        let token = b.admin_token();
        let secret = token.split(':').nth(1).unwrap();
        let rows: Vec<(String, String)> = sqlx::query_as("SELECT name, hash FROM admin_tokens")
            .fetch_all(b.app.store.pool())
            .await
            .unwrap();
        assert_eq!(rows.len(), 1);
        assert!(rows[0].1.starts_with("$3:1:"));
        assert!(!rows[0].1.contains(secret));
        let db = std::fs::read(b.data_dir().join("harvester-cloud.db")).unwrap();
        assert!(!db.windows(secret.len()).any(|w| w == secret.as_bytes()));
        // The admin-token file holds the token on one line, readable by its owner only.
        let file = b.data_dir().join("admin-token");
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            format!("{token}\n")
        );
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[tokio::test]
    async fn server_url_and_cluster_ca_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nY2E=\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let b = EmbeddedBackend::start_with(&[
            "--server-url",
            "https://rancher.example/k8s/clusters/c-1",
            "--cluster-ca-file",
            ca.to_str().unwrap(),
        ])
        .await;
        let k = yaml(&b.post(&account("gc-test", "gc4")).await.kubeconfig());
        assert_eq!(
            k["clusters"][0]["cluster"]["server"],
            "https://rancher.example/k8s/clusters/c-1"
        );
        let got = B64
            .decode(
                k["clusters"][0]["cluster"]["certificate-authority-data"]
                    .as_str()
                    .unwrap(),
            )
            .unwrap();
        assert_eq!(got, std::fs::read(&ca).unwrap());
    }

    #[tokio::test]
    async fn ipv6_vip_is_bracketed() {
        let dir = tempfile::tempdir().unwrap();
        let (global, serve) = support::cli(dir.path(), &["--vip".into(), "2001:db8::1".into()]);
        let app = harvester_cloud::app::open_embedded(&global, &serve)
            .await
            .unwrap();
        let token = app.admin_token.clone().unwrap().expose();
        let r = tower::ServiceExt::oneshot(
            harvester_cloud::http::router(app.service.state.clone()),
            axum::http::Request::post("/v1/harvester/kubeconfig")
                .header("authorization", format!("Bearer {token}"))
                .body(Body::from(account("gc-test", "gc4")))
                .unwrap(),
        )
        .await
        .unwrap();
        let body = http_body_util::BodyExt::collect(r.into_body())
            .await
            .unwrap()
            .to_bytes();
        let k: String = serde_json::from_slice(&body).unwrap();
        assert!(k.contains("server: https://[2001:db8::1]:6443\n"), "{k}");
    }
}

/// The real checkers of generated output: `kubectl config view --minify --raw` and `cloud-init schema`.
mod external_checkers {
    use super::*;
    use std::process::Command;

    fn run(cmd: &mut Command) -> String {
        let out = cmd.output().unwrap_or_else(|e| {
            panic!("cannot run {cmd:?} (is it installed? .ci/run installs it): {e}")
        });
        assert!(
            out.status.success(),
            "{cmd:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[tokio::test]
    async fn kubectl_accepts_the_kubeconfig() {
        let b = EmbeddedBackend::start().await;
        let dir = tempfile::tempdir().unwrap();
        // Namespaces that YAML would read as other types must come back as strings.
        for ns in ["gc-test", "123", "true", "2024-01-02", "0x1f", "1e3"] {
            let k = b.post(&account(ns, "gc4")).await.kubeconfig();
            let path = dir.path().join(format!("{ns}.kubeconfig"));
            std::fs::write(&path, &k).unwrap();
            let out = run(Command::new("kubectl")
                .args([
                    "config",
                    "view",
                    "--minify",
                    "--raw",
                    "-o",
                    "json",
                    "--kubeconfig",
                ])
                .arg(&path));
            let v: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(v["contexts"][0]["context"]["namespace"], ns, "{k}");
            assert_eq!(
                v["clusters"][0]["cluster"]["server"],
                format!("https://{VIP}:6443")
            );
            let token = yaml(&k)["users"][0]["user"]["token"].clone();
            assert_eq!(v["users"][0]["user"]["token"], token);
            let ns_out = run(Command::new("kubectl")
                .args([
                    "config",
                    "view",
                    "--minify",
                    "-o",
                    "jsonpath={.contexts[0].context.namespace}",
                    "--kubeconfig",
                ])
                .arg(&path));
            assert_eq!(ns_out, ns);
        }
    }

    #[tokio::test]
    async fn cloud_init_accepts_the_user_data() {
        let b = EmbeddedBackend::start().await;
        let dir = tempfile::tempdir().unwrap();
        let body = b.post(&account_yaml("gc-test", "gc4")).await.text();
        let path = dir.path().join("user-data");
        std::fs::write(&path, format!("#cloud-config\n{body}")).unwrap();
        let out = run(Command::new("cloud-init")
            .args(["schema", "--config-file"])
            .arg(&path));
        assert!(out.contains("Valid cloud-config"), "{out}");
        // With cloudConfigPath: one file, at exactly that path, and still valid.
        let wanted = "/opt/rke2/etc/config-files/cloud-provider-config";
        let body = b
            .post(
                &serde_json::json!({"namespace": "gc-test", "serviceAccountName": "gc4",
                    "outputFormat": "yaml", "cloudConfigPath": wanted})
                .to_string(),
            )
            .await
            .text();
        std::fs::write(&path, format!("#cloud-config\n{body}")).unwrap();
        let out = run(Command::new("cloud-init")
            .args(["schema", "--config-file"])
            .arg(&path));
        assert!(out.contains("Valid cloud-config"), "{out}");
        let files = yaml(&body)["write_files"].clone();
        let paths: Vec<&str> = files
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["path"].as_str().unwrap())
            .collect();
        assert_eq!(paths, [wanted]);
        // The checker is real: a broken document fails it.
        std::fs::write(&path, "#cloud-config\nwrite_files: 5\n").unwrap();
        let out = Command::new("cloud-init")
            .args(["schema", "--config-file"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(!out.status.success());
    }
}

/// A POST that fails part-way (the disk fills: its third write fails, and so do the first tries
/// of its rollback) leaves nothing behind once the store writes again: the rollback is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_failing_part_way_leaves_nothing_once_the_store_recovers() {
    use harvester_cloud::store::{Kind, LabelSelector};
    let b = EmbeddedBackend::start().await;
    let store = b.store();
    // The ServiceAccount is there already (as Harvester may have left one), so POST makes the
    // rest one by one: the Secret is written; the RoleBinding and then the rollback's delete of
    // the Secret, three times, fail.
    store
        .create(
            &Kind::of::<ServiceAccount>(),
            serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "disk-full", "namespace": "gc-test"}}),
        )
        .await
        .unwrap();
    b.app.store.inject_write_failures(1, 4);
    let r = b.post(&account("gc-test", "disk-full")).await;
    r.error(StatusCode::INTERNAL_SERVER_ERROR, "ServerError");
    let left = async || {
        let mut left = Vec::new();
        for kind in [
            Kind::of::<ServiceAccount>(),
            Kind::of::<Secret>(),
            Kind::of::<RoleBinding>(),
            Kind::of::<ClusterRoleBinding>(),
        ] {
            for o in store
                .list(&kind, None, &LabelSelector::everything())
                .await
                .unwrap()
                .items
            {
                if o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.contains("disk-full"))
                    && kind.kind != "ServiceAccount"
                {
                    left.push(format!("{} {}", kind.kind, o["metadata"]["name"]));
                }
            }
        }
        left
    };
    support::eventually("the retried rollback", async || {
        left().await.is_empty().then_some(())
    })
    .await;
    // And the account can be made afterwards.
    b.post(&account("gc-test", "disk-full")).await.kubeconfig();
}

/// A new account's four objects are one write on the embedded store: when it fails, none of them
/// is there, with nothing to roll back; the next POST makes them all.
#[tokio::test]
async fn a_new_account_is_written_whole_or_not_at_all() {
    use harvester_cloud::store::{Kind, LabelSelector};
    let b = EmbeddedBackend::start().await;
    b.app.store.inject_write_failures(0, 1);
    let r = b.post(&account("gc-test", "all-or-none")).await;
    r.error(StatusCode::INTERNAL_SERVER_ERROR, "ServerError");
    let store = b.store();
    for kind in [
        Kind::of::<ServiceAccount>(),
        Kind::of::<Secret>(),
        Kind::of::<RoleBinding>(),
        Kind::of::<ClusterRoleBinding>(),
    ] {
        let left: Vec<Value> = store
            .list(&kind, None, &LabelSelector::everything())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|o| {
                o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.contains("all-or-none"))
            })
            .collect();
        assert_eq!(left, Vec::<Value>::new(), "{}", kind.kind);
    }
    let k = b
        .post(&account("gc-test", "all-or-none"))
        .await
        .kubeconfig();
    assert_eq!(
        b.get("namespace=gc-test&serviceAccountName=all-or-none")
            .await
            .kubeconfig(),
        k
    );
}
