//! Behaviour only the Kubernetes backend has, against a real control plane with the service holding
//! the chart's RBAC: the token controller's timing, missing namespaces, Rancher tokens, TokenReview
//! users checked with SubjectAccessReview, and kubeconfigs that really work against the cluster with
//! exactly the granted permissions.

#[macro_use]
mod support;

use std::{sync::Arc, time::Duration};

use axum::{
    body::Body,
    http::{Method, StatusCode},
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, ObjectMeta, PostParams};
use serde_json::Value;
use support::{
    Backend, KubeBackend, account,
    kube_env::{self, TokenOpts},
};

const PATH: &str = "/v1/harvester/kubeconfig";

#[tokio::test]
async fn a_token_that_arrives_late_is_waited_for() {
    let b = KubeBackend::start().await;
    // The real token controller, made to take 1.5 s for each token in gc-test.
    let _late =
        b.cp.hold_tokens("gc-test", Some(Duration::from_millis(1500)))
            .await;
    b.post(&account("gc-test", "late")).await.kubeconfig();
}

#[tokio::test]
async fn a_token_that_never_arrives_is_504_and_leaves_nothing() {
    let b = KubeBackend::start_with(&["--token-timeout", "1s"]).await;
    let _never = b.cp.hold_tokens("gc-test", None).await;
    let m = b
        .post(&account("gc-test", "never"))
        .await
        .error(StatusCode::GATEWAY_TIMEOUT, "GatewayTimeout");
    assert!(
        m.contains("timeout while waiting for secret gc-test/never-token"),
        "{m}"
    );
    // The request rolled back what it created.
    for (group, plural, ns, name) in [
        ("", "serviceaccounts", "gc-test", "never"),
        ("", "secrets", "gc-test", "never-token"),
        (
            "rbac.authorization.k8s.io",
            "rolebindings",
            "gc-test",
            "gc-test-never",
        ),
        (
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            "",
            "gc-test-never",
        ),
    ] {
        assert!(
            b.cp.object(group, plural, ns, name).await.is_none(),
            "{plural} {name} was left behind"
        );
    }
}

#[tokio::test]
async fn a_missing_namespace_is_404_naming_it() {
    let b = KubeBackend::start().await;
    let m = b
        .post(&account("no-such-ns", "gc4"))
        .await
        .error(StatusCode::NOT_FOUND, "NotFound");
    assert!(m.contains("namespace \"no-such-ns\" not found"), "{m}");
}

#[tokio::test]
async fn a_missing_cluster_role_is_422_as_upstream() {
    let b = KubeBackend::start().await;
    let roles: Api<ClusterRole> = Api::all(b.client.clone());
    roles
        .delete("harvesterhci.io:cloudprovider", &Default::default())
        .await
        .unwrap();
    let m = b
        .post(&account("gc-test", "gc4"))
        .await
        .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
    // harvester pkg/api/kubeconfig/generate_handler.go: errors.Wrapf(err, "clusterRole %s is not
    // found", ...) around the cache's NotFound.
    assert_eq!(
        m,
        "clusterRole harvesterhci.io:cloudprovider is not found: clusterroles.rbac.authorization.k8s.io \"harvesterhci.io:cloudprovider\" not found"
    );
}

/// The server URL comes from Harvester's `vip` ConfigMap as upstream reads it (harvester
/// pkg/api/kubeconfig/generate_handler.go getServerURL: the data decoded with mapstructure, whose
/// key match ignores case; a missing key is an empty address, "invalid vip ").
#[tokio::test]
async fn the_vip_configmap_is_read_as_upstream_reads_it() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let b = KubeBackend::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(b.client.clone(), "harvester-system");
    let set = |data: Value| {
        let cms = cms.clone();
        async move {
            let mut cm = cms.get("vip").await.unwrap();
            cm.data = serde_json::from_value(data).unwrap();
            cms.replace("vip", &PostParams::default(), &cm)
                .await
                .unwrap();
        }
    };
    // Errors are not cached; a good address is, so the good case comes last.
    set(serde_json::json!({"enabled": "true"})).await;
    let m = b
        .post(&account("gc-test", "gc4"))
        .await
        .error(StatusCode::INTERNAL_SERVER_ERROR, "ServerError");
    assert!(
        m.starts_with("failed to get server url: invalid vip  ("),
        "{m}"
    );
    set(serde_json::json!({"ip": "10.0.0.300"})).await;
    let m = b
        .post(&account("gc-test", "gc4"))
        .await
        .error(StatusCode::INTERNAL_SERVER_ERROR, "ServerError");
    assert_eq!(m, "failed to get server url: invalid vip 10.0.0.300");
    cms.delete("vip", &Default::default()).await.unwrap();
    let m = b
        .post(&account("gc-test", "gc4"))
        .await
        .error(StatusCode::INTERNAL_SERVER_ERROR, "ServerError");
    assert_eq!(m, "failed to get server url: configmaps \"vip\" not found");
    // Nothing was made by the failed requests.
    assert!(
        b.cp.object("", "serviceaccounts", "gc-test", "gc4")
            .await
            .is_none()
    );
    kube_env::apply(
        &b.client,
        &serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "vip", "namespace": "harvester-system"},
            "data": {"IP": "10.1.2.3"}
        }),
        "configmaps",
    )
    .await;
    let k = b.post(&account("gc-test", "gc4")).await.kubeconfig();
    assert!(k.contains("server: https://10.1.2.3:6443\n"), "{k}");
}

#[tokio::test]
async fn rancher_tokens() {
    let backend = KubeBackend::start().await;
    let c = &backend.client.clone();
    let b = &backend;
    let call = |token: String| async move {
        b.call(Method::POST, PATH, Some(&token), account("gc-test", "gc4"))
            .await
    };

    // A plain (unhashed, older Rancher) admin token works too.
    let plain = kube_env::rancher_token(
        c,
        "user-admin",
        TokenOpts {
            plain: true,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(call(plain.clone()).await.status, StatusCode::OK);

    // The right name with a wrong secret.
    let name = plain.split(':').next().unwrap();
    let m = call(format!("{name}:wrong"))
        .await
        .error(StatusCode::UNAUTHORIZED, "Unauthorized");
    assert_eq!(m, "invalid token");

    // Expired three ways, and disabled.
    for opts in [
        TokenOpts {
            expired: Some(true),
            ..Default::default()
        },
        TokenOpts {
            expires_at: Some("2020-01-01T00:00:00Z".into()),
            ..Default::default()
        },
    ] {
        let t = kube_env::rancher_token(c, "user-admin", opts).await;
        let m = call(t.clone())
            .await
            .error(StatusCode::UNAUTHORIZED, "Unauthorized");
        assert_eq!(
            m,
            format!("token {} is expired", t.split(':').next().unwrap())
        );
    }
    let t = kube_env::rancher_token(
        c,
        "user-admin",
        TokenOpts {
            enabled: Some(false),
            ..Default::default()
        },
    )
    .await;
    let m = call(t)
        .await
        .error(StatusCode::UNAUTHORIZED, "Unauthorized");
    assert!(m.ends_with("is disabled"), "{m}");

    // A valid token of a user who is not a global admin.
    kube_env::bind_global_role(c, "user-plain", "user").await;
    let t = kube_env::rancher_token(c, "user-plain", Default::default()).await;
    let m = call(t)
        .await
        .error(StatusCode::FORBIDDEN, "PermissionDenied");
    assert_eq!(
        m,
        "user \"user-plain\" is not a Rancher administrator (no GlobalRoleBinding to admin)"
    );

    // restricted-admin only counts when allowed.
    kube_env::bind_global_role(c, "user-restricted", "restricted-admin").await;
    let t = kube_env::rancher_token(c, "user-restricted", Default::default()).await;
    call(t.clone())
        .await
        .error(StatusCode::FORBIDDEN, "PermissionDenied");
    let allowing = backend.with_args(&["--allow-restricted-admin"]).await;
    let r = allowing
        .call(Method::POST, PATH, Some(&t), account("gc-test", "gc4"))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
}

fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(resources.iter().map(|s| s.to_string()).collect()),
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn user_subject(name: &str) -> Option<Vec<Subject>> {
    Some(vec![Subject {
        kind: "User".into(),
        name: name.into(),
        api_group: Some("rbac.authorization.k8s.io".into()),
        ..Default::default()
    }])
}

async fn grant_in_namespace(client: &kube::Client, user: &str, ns: &str, rules: Vec<PolicyRule>) {
    let meta = ObjectMeta {
        name: Some(format!("{user}-grant")),
        namespace: Some(ns.into()),
        ..Default::default()
    };
    let roles: Api<Role> = Api::namespaced(client.clone(), ns);
    roles
        .create(
            &PostParams::default(),
            &Role {
                metadata: meta.clone(),
                rules: Some(rules),
            },
        )
        .await
        .unwrap();
    let rbs: Api<RoleBinding> = Api::namespaced(client.clone(), ns);
    rbs.create(
        &PostParams::default(),
        &RoleBinding {
            metadata: meta.clone(),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: format!("{user}-grant"),
            },
            subjects: user_subject(user),
        },
    )
    .await
    .unwrap();
}

async fn grant_cluster(client: &kube::Client, user: &str, rules: Vec<PolicyRule>) {
    let meta = ObjectMeta {
        name: Some(format!("{user}-cluster-grant")),
        ..Default::default()
    };
    let roles: Api<ClusterRole> = Api::all(client.clone());
    roles
        .create(
            &PostParams::default(),
            &ClusterRole {
                metadata: meta.clone(),
                rules: Some(rules),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let crbs: Api<ClusterRoleBinding> = Api::all(client.clone());
    crbs.create(
        &PostParams::default(),
        &ClusterRoleBinding {
            metadata: meta.clone(),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: format!("{user}-cluster-grant"),
            },
            subjects: user_subject(user),
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn token_review_users_need_every_permission_and_403_names_the_missing_one() {
    let b = KubeBackend::start().await;
    let c = &b.client;
    let rbac = "rbac.authorization.k8s.io";

    // Nothing granted: the first permission is named.
    let alice = b.cp.user_token("alice");
    let r = b
        .call(Method::POST, PATH, Some(&alice), account("gc-test", "gc4"))
        .await;
    let m = r.error(StatusCode::FORBIDDEN, "PermissionDenied");
    assert_eq!(
        m,
        "user \"alice\" cannot create resource \"serviceaccounts\" in API group \"\" in the namespace \"gc-test\""
    );

    // Everything in the namespace but not the cluster-scoped binding.
    let bob = b.cp.user_token("bob");
    grant_in_namespace(
        c,
        "bob",
        "gc-test",
        vec![
            rule("", &["serviceaccounts", "secrets"], &["create", "get"]),
            rule(rbac, &["rolebindings"], &["create"]),
        ],
    )
    .await;
    let r = b
        .call(Method::POST, PATH, Some(&bob), account("gc-test", "gc4"))
        .await;
    let m = r.error(StatusCode::FORBIDDEN, "PermissionDenied");
    assert_eq!(
        m,
        "user \"bob\" cannot create resource \"clusterrolebindings\" in API group \"rbac.authorization.k8s.io\" at the cluster scope"
    );
    // ...and nothing was created on the way.
    assert!(
        b.cp.object("", "serviceaccounts", "gc-test", "gc4")
            .await
            .is_none()
    );

    // With every permission the request goes through, and GET needs only reads.
    let carol = b.cp.user_token("carol");
    grant_in_namespace(
        c,
        "carol",
        "gc-test",
        vec![
            rule("", &["serviceaccounts", "secrets"], &["create", "get"]),
            rule(rbac, &["rolebindings"], &["create"]),
        ],
    )
    .await;
    grant_cluster(
        c,
        "carol",
        vec![rule(rbac, &["clusterrolebindings"], &["create"])],
    )
    .await;
    let r = b
        .call(Method::POST, PATH, Some(&carol), account("gc-test", "gc4"))
        .await;
    let posted = r.kubeconfig();
    let got = b
        .call(
            Method::GET,
            &format!("{PATH}?namespace=gc-test&serviceAccountName=gc4"),
            Some(&carol),
            Body::empty(),
        )
        .await
        .kubeconfig();
    assert_eq!(posted, got);
    // Carol may not delete.
    let r = b
        .call(
            Method::DELETE,
            &format!("{PATH}?namespace=gc-test&serviceAccountName=gc4"),
            Some(&carol),
            Body::empty(),
        )
        .await;
    let m = r.error(StatusCode::FORBIDDEN, "PermissionDenied");
    assert!(
        m.contains("cannot delete resource \"serviceaccounts\""),
        "{m}"
    );
    // Her permissions are namespaced: another namespace is refused.
    let r = b
        .call(Method::POST, PATH, Some(&carol), account("default", "gc4"))
        .await;
    r.error(StatusCode::FORBIDDEN, "PermissionDenied");

    // A token the cluster does not know.
    let r = b
        .call(
            Method::POST,
            PATH,
            Some("eyJhbGciOiJSUzI1NiJ9.e30.c2ln"),
            account("gc-test", "gc4"),
        )
        .await;
    assert_eq!(
        r.error(StatusCode::UNAUTHORIZED, "Unauthorized"),
        "invalid token"
    );
}

#[tokio::test]
async fn objects_are_labelled_and_the_cluster_binding_has_no_namespaced_owner() {
    let b = KubeBackend::start().await;
    b.post(&account("gc-test", "gc4")).await.kubeconfig();
    let label = |v: &Value| v["metadata"]["labels"]["app.kubernetes.io/managed-by"].clone();
    let sa =
        b.cp.object("", "serviceaccounts", "gc-test", "gc4")
            .await
            .unwrap();
    let secret =
        b.cp.object("", "secrets", "gc-test", "gc4-token")
            .await
            .unwrap();
    let rb =
        b.cp.object(
            "rbac.authorization.k8s.io",
            "rolebindings",
            "gc-test",
            "gc-test-gc4",
        )
        .await
        .unwrap();
    let crb =
        b.cp.object(
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            "",
            "gc-test-gc4",
        )
        .await
        .unwrap();
    for v in [&sa, &secret, &rb, &crb] {
        assert_eq!(label(v), "harvester-cloud", "{v}");
    }
    // The Secret as upstream: type, annotations, owner.
    assert_eq!(secret["type"], "kubernetes.io/service-account-token");
    assert_eq!(
        secret["metadata"]["annotations"]["kubernetes.io/service-account.name"],
        "gc4"
    );
    assert_eq!(
        secret["metadata"]["annotations"]["kubernetes.io/service-account.uid"],
        sa["metadata"]["uid"]
    );
    assert_eq!(
        secret["metadata"]["ownerReferences"][0]["uid"],
        sa["metadata"]["uid"]
    );
    assert_eq!(
        rb["metadata"]["ownerReferences"][0]["kind"],
        "ServiceAccount"
    );
    assert!(crb["metadata"].get("ownerReferences").is_none());
    assert_eq!(crb["roleRef"]["name"], "harvesterhci.io:csi-driver");
}

#[tokio::test]
async fn accounts_made_by_harvester_itself_are_served_by_get() {
    // Harvester creates no labels and puts an owner reference on both bindings.
    let b = KubeBackend::start().await;
    let c = &b.client;
    let sa: k8s_openapi::api::core::v1::ServiceAccount = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "legacy", "namespace": "gc-test"}}),
    )
    .unwrap();
    let sa = Api::namespaced(c.clone(), "gc-test")
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    let uid = sa.metadata.uid.clone().unwrap();
    let owner = serde_json::json!([{"apiVersion": "v1", "kind": "ServiceAccount", "name": "legacy", "uid": uid}]);
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "legacy-token", "namespace": "gc-test", "ownerReferences": owner,
            "annotations": {"kubernetes.io/service-account.name": "legacy", "kubernetes.io/service-account.uid": uid}},
        "type": "kubernetes.io/service-account-token"
    }))
    .unwrap();
    Api::namespaced(c.clone(), "gc-test")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let subjects =
        serde_json::json!([{"kind": "ServiceAccount", "name": "legacy", "namespace": "gc-test"}]);
    let rb: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "gc-test-legacy", "namespace": "gc-test", "ownerReferences": owner},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "harvesterhci.io:cloudprovider"},
        "subjects": subjects
    }))
    .unwrap();
    Api::namespaced(c.clone(), "gc-test")
        .create(&PostParams::default(), &rb)
        .await
        .unwrap();
    let crb: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "gc-test-legacy", "ownerReferences": owner},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "harvesterhci.io:csi-driver"},
        "subjects": subjects
    }))
    .unwrap();
    Api::all(c.clone())
        .create(&PostParams::default(), &crb)
        .await
        .unwrap();
    // Wait for the token controller, then GET (which never waits) serves it.
    let store = b.store();
    store
        .wait_for_token("gc-test", "legacy-token", Duration::from_secs(30))
        .await
        .unwrap();
    let k = b
        .get("namespace=gc-test&serviceAccountName=legacy")
        .await
        .kubeconfig();
    // And POST reuses it rather than calling it foreign.
    assert_eq!(b.post(&account("gc-test", "legacy")).await.kubeconfig(), k);
}

/// The kubeconfig works against the cluster, with exactly the permissions of the two roles.
// kubectl blocks its thread while the fake serves it from this runtime: two workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_kubeconfigs_work_with_kubectl_and_kube_rs() {
    let b = KubeBackend::start().await;
    // Point the kubeconfig at the API server itself instead of a VIP.
    let url = b.cp.server.clone();
    let b = b.with_args(&["--server-url", &url]).await;
    let kubeconfig = b.post(&account("gc-test", "gc4")).await.kubeconfig();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("guest.kubeconfig");
    std::fs::write(&path, &kubeconfig).unwrap();

    let can_i = |args: &[&str]| {
        let out = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&path)
            .args(["auth", "can-i"])
            .args(args)
            .output()
            .expect("kubectl");
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            !answer.is_empty(),
            "kubectl auth can-i {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        answer
    };
    assert_eq!(
        can_i(&[
            "create",
            "loadbalancers.loadbalancer.harvesterhci.io",
            "-n",
            "gc-test"
        ]),
        "yes"
    );
    assert_eq!(can_i(&["get", "secrets", "-n", "gc-test"]), "no");
    assert_eq!(can_i(&["create", "clusterrolebindings"]), "no");
    // The cloudprovider role is bound in gc-test only.
    assert_eq!(
        can_i(&[
            "create",
            "loadbalancers.loadbalancer.harvesterhci.io",
            "-n",
            "default"
        ]),
        "no"
    );
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&path)
        .args([
            "get",
            "loadbalancers.loadbalancer.harvesterhci.io",
            "-o",
            "name",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // kube-rs with the same file: allowed and refused requests.
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    assert_eq!(config.default_namespace, "gc-test");
    let client = kube::Client::try_from(config).unwrap();
    let lbs: Api<DynamicObject> = Api::default_namespaced_with(
        client.clone(),
        &ApiResource {
            group: "loadbalancer.harvesterhci.io".into(),
            version: "v1beta1".into(),
            api_version: "loadbalancer.harvesterhci.io/v1beta1".into(),
            kind: "LoadBalancer".into(),
            plural: "loadbalancers".into(),
        },
    );
    let lb: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
        "metadata": {"name": "lb1"}, "spec": {"ipam": "pool"}
    }))
    .unwrap();
    lbs.create(&PostParams::default(), &lb)
        .await
        .expect("the cloud provider may create load balancers");
    assert_eq!(
        lbs.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    // The CSI role is bound cluster-wide (ask RBAC directly: there is no storage to list).
    let review = |group: &str, resource: &str| {
        let client = client.clone();
        let (group, resource) = (group.to_string(), resource.to_string());
        async move {
            let ssar = k8s_openapi::api::authorization::v1::SelfSubjectAccessReview {
                spec: k8s_openapi::api::authorization::v1::SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(
                        k8s_openapi::api::authorization::v1::ResourceAttributes {
                            verb: Some("list".into()),
                            group: Some(group),
                            resource: Some(resource),
                            ..Default::default()
                        },
                    ),
                    ..Default::default()
                },
                ..Default::default()
            };
            let api: Api<k8s_openapi::api::authorization::v1::SelfSubjectAccessReview> =
                Api::all(client);
            api.create(&PostParams::default(), &ssar)
                .await
                .unwrap()
                .status
                .unwrap()
                .allowed
        }
    };
    assert!(review("storage.k8s.io", "storageclasses").await);
    assert!(!review("", "nodes").await);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::default_namespaced(client.clone());
    match secrets.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403),
        other => panic!("secrets must be forbidden, got {other:?}"),
    }

    // After DELETE the same kubeconfig stops working.
    let t = b.admin_token();
    let r = b
        .call(
            Method::DELETE,
            &format!("{PATH}?namespace=gc-test&serviceAccountName=gc4"),
            Some(&t),
            Body::empty(),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    // The bindings are gone at once (403); kube-apiserver then refuses the token itself (401) as
    // soon as its service-account lookup sees the deleted Secret and ServiceAccount.
    support::eventually("the revoked token to be refused", async || {
        match lbs.list(&ListParams::default()).await {
            Err(kube::Error::Api(s)) if s.code == 401 => Some(()),
            Err(kube::Error::Api(s)) if s.code == 403 => None,
            other => panic!("a revoked token must be refused, got {other:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn one_post_makes_a_bounded_number_of_api_requests() {
    let b = KubeBackend::start().await;
    // Warm the role and VIP lookups, as a running service would have.
    b.post(&account("gc-test", "warm")).await.kubeconfig();
    let ours = || {
        b.cp.audit()
            .into_iter()
            .filter(|r| r.user == kube_env::SERVICE_USER)
            .collect::<Vec<_>>()
    };
    let before = ours().len();
    b.post(&account("gc-test", "gc4")).await.kubeconfig();
    // The API server's own record of what the service asked (its audit log).
    let requests: Vec<_> = ours().into_iter().skip(before).collect();
    // 4 reads, 4 creates, and the token wait (a list, then a watch if the token is not there yet).
    assert!(
        requests.len() <= 11,
        "{} requests: {requests:#?}",
        requests.len()
    );
    let creates = requests.iter().filter(|r| r.verb == "create").count();
    assert_eq!(creates, 4, "{requests:#?}");
}

/// `harvester-cloud kubeconfig generate`, the replacement for generate_addon.sh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeconfig_generate_prints_both_sections() {
    let b = KubeBackend::start().await;
    let admin = b.cp.admin_kubeconfig_path();
    let run = |args: Vec<String>| async move {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_harvester-cloud"))
            .args(["kubeconfig", "generate"])
            .args(args)
            .output()
            .await
            .unwrap()
    };
    let out = run(vec![
        "gc4".into(),
        "gc-test".into(),
        "--kubeconfig".into(),
        admin.display().to_string(),
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let (cloud_config, user_data) = text
        .strip_prefix("########## cloud config ############\n")
        .and_then(|t| t.split_once("\n########## cloud-init user data ############\n"))
        .unwrap_or_else(|| panic!("unexpected output:\n{text}"));
    // It points where the caller's kubeconfig points, and is the account the API would serve.
    assert!(
        cloud_config.contains(&format!(
            "    server: {}\n",
            b.cp.server.trim_end_matches('/')
        )),
        "{cloud_config}"
    );
    let served = b
        .get("namespace=gc-test&serviceAccountName=gc4")
        .await
        .kubeconfig();
    let token_line = |k: &str| {
        k.lines()
            .find(|l| l.contains("token:"))
            .unwrap()
            .to_string()
    };
    assert_eq!(token_line(cloud_config), token_line(&served));
    for path in [
        "/etc/kubernetes/cloud-config",
        "/var/lib/rancher/rke2/etc/config-files/cloud-provider-config",
    ] {
        assert!(
            user_data.contains(&format!("  path: {path}\n")),
            "{user_data}"
        );
    }
    // Bad names are refused before anything is created.
    let out = run(vec![
        "Bad_Name".into(),
        "gc-test".into(),
        "--kubeconfig".into(),
        admin.display().to_string(),
    ])
    .await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a valid service account name"));
}

/// Stopping a replica (what SIGTERM does) stops its reconcilers and gives the Lease up at once, so
/// another replica need not wait for it to expire. Here the cluster serves no VirtualMachine kind
/// (its CRD is deleted first), so that controller's cache never fills: stopping must not wait for
/// it either. (Without the IPPool or LoadBalancer CRD the service does not start at all:
/// tests/harvester_crds.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_releases_the_lease() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let b = KubeBackend::start().await;
    let crds: Api<CustomResourceDefinition> = Api::all(b.client.clone());
    for name in ["virtualmachines.kubevirt.io"] {
        crds.delete(name, &Default::default()).await.unwrap();
        support::eventually(&format!("{name} gone"), async || {
            crds.get_opt(name).await.unwrap().is_none().then_some(())
        })
        .await;
    }
    let kubeconfig = b.service_kubeconfig().display().to_string();
    let (_, serve) = support::cli(
        b.dir.path(),
        &[
            "--backend".into(),
            "kube".into(),
            "--kubeconfig".into(),
            kubeconfig,
            "--metrics-listen".into(),
            "127.0.0.1:0".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
        ],
    );
    let app = harvester_cloud::app::open_kube(&serve).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            harvester_cloud::app::serve_on(listener, app, &serve, shutdown).await
        })
    };
    let holder = async || {
        b.cp.object(
            "coordination.k8s.io",
            "leases",
            "harvester-system",
            harvester_cloud::app::LB_LEASE,
        )
        .await
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
        .filter(|h| !h.is_empty())
    };
    support::eventually("the replica takes the Lease", async || holder().await).await;
    shutdown.cancel();
    server.await.unwrap().unwrap();
    assert_eq!(
        holder().await,
        None,
        "the Lease is still held after a clean stop"
    );
}

/// A client that hangs up while its POST waits for the token does not cut the POST short: it runs
/// to its end (here the 504 after `--token-timeout`) and rolls back what it created, instead of
/// leaving the ServiceAccount, its Secret and the bindings behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_whose_client_hangs_up_leaves_nothing_behind() {
    use tokio::io::AsyncWriteExt;
    let b = KubeBackend::start_with(&["--token-timeout", "3s"]).await;
    let _never = b.cp.hold_tokens("gc-test", None).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = b.router();
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let body = account("gc-test", "hangs-up");
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(
        format!(
            "POST {PATH} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            b.admin_token(),
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    // The POST has made its ServiceAccount and waits for the token: hang up now.
    support::eventually("the POST to create its ServiceAccount", async || {
        b.cp.object("", "serviceaccounts", "gc-test", "hangs-up")
            .await
            .map(|_| ())
    })
    .await;
    drop(tcp);
    // After the token timeout the POST's own rollback has removed everything it made.
    tokio::time::sleep(Duration::from_secs(4)).await;
    support::eventually("the rollback", async || {
        let mut left = Vec::new();
        for (group, plural, ns, name) in [
            ("", "serviceaccounts", "gc-test", "hangs-up"),
            ("", "secrets", "gc-test", "hangs-up-token"),
            (
                "rbac.authorization.k8s.io",
                "rolebindings",
                "gc-test",
                "gc-test-hangs-up",
            ),
            (
                "rbac.authorization.k8s.io",
                "clusterrolebindings",
                "",
                "gc-test-hangs-up",
            ),
        ] {
            if b.cp.object(group, plural, ns, name).await.is_some() {
                left.push(plural);
            }
        }
        left.is_empty().then_some(())
    })
    .await;
    server.abort();
}

/// Kubernetes users (TokenReview) use the IPPool and LoadBalancer routes as far as the cluster's
/// RBAC lets them use those kinds: cluster-admin may do everything, a namespaced grant reaches its
/// namespace only, and a refusal names the permission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_users_reach_the_load_balancer_routes_by_their_rbac() {
    let b = KubeBackend::start().await;
    let c = &b.client;
    let pools = "/v1/harvester/loadbalancer.harvesterhci.io.ippools";
    let lbs = "/v1/harvester/loadbalancer.harvesterhci.io.loadbalancers";
    // dave: cluster-admin (as a system:masters user would be).
    let crbs: Api<ClusterRoleBinding> = Api::all(c.clone());
    crbs.create(
        &PostParams::default(),
        &ClusterRoleBinding {
            metadata: ObjectMeta {
                name: Some("dave-admin".into()),
                ..Default::default()
            },
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: "cluster-admin".into(),
            },
            subjects: user_subject("dave"),
        },
    )
    .await
    .unwrap();
    let dave = b.cp.user_token("dave");
    let r = b.call(Method::GET, pools, Some(&dave), Body::empty()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let pool = serde_json::json!({"metadata": {"name": "daves"},
        "spec": {"ranges": [{"subnet": "10.77.0.0/24"}],
            "selector": {"scope": [{"project": "*", "namespace": "*", "guestCluster": "*"}]}}});
    let r = b
        .call(Method::POST, pools, Some(&dave), pool.to_string())
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());

    // eve: read access to LoadBalancers in ns1 only.
    grant_in_namespace(
        c,
        "eve",
        "ns1",
        vec![rule(
            "loadbalancer.harvesterhci.io",
            &["loadbalancers"],
            &["get", "list"],
        )],
    )
    .await;
    let eve = b.cp.user_token("eve");
    let r = b
        .call(
            Method::GET,
            &format!("{lbs}/ns1"),
            Some(&eve),
            Body::empty(),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let m = b
        .call(
            Method::GET,
            &format!("{lbs}/ns2"),
            Some(&eve),
            Body::empty(),
        )
        .await
        .error(StatusCode::FORBIDDEN, "PermissionDenied");
    assert_eq!(
        m,
        "user \"eve\" cannot list resource \"loadbalancers\" in API group \"loadbalancer.harvesterhci.io\" in the namespace \"ns2\""
    );
    let m = b
        .call(Method::GET, pools, Some(&eve), Body::empty())
        .await
        .error(StatusCode::FORBIDDEN, "PermissionDenied");
    assert!(m.contains("cannot list resource \"ippools\""), "{m}");
    // A LoadBalancer's Events are hers to read where she may get the LoadBalancer.
    b.call(
        Method::GET,
        &format!("{lbs}/ns1/none/events"),
        Some(&eve),
        Body::empty(),
    )
    .await
    .error(StatusCode::NOT_FOUND, "NotFound");
    let m = b
        .call(
            Method::GET,
            &format!("{lbs}/ns2/none/events"),
            Some(&eve),
            Body::empty(),
        )
        .await
        .error(StatusCode::FORBIDDEN, "PermissionDenied");
    assert!(m.contains("cannot get resource \"loadbalancers\""), "{m}");
}

/// The caches keep objects without their managedFields (`store::watcher::strip_for_cache`); a write
/// built from such a copy omits the field, and the API server keeps the managedFields it has. A copy
/// that carried an empty list instead (`Some(vec![])`, what a default filled in before a write would
/// send) clears them all: the case below that shows the first assertion can fail.
#[tokio::test]
async fn writes_from_a_stripped_copy_keep_managed_fields() {
    use futures::StreamExt;
    use harvester_cloud::store::{self, Kind, ObjectStore, kubernetes::KubeStore, watcher};
    use k8s_openapi::{
        api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry,
    };
    use kube::{
        api::{Patch, PatchParams},
        runtime::watcher::Event,
    };

    let cp = support::control_plane::ControlPlane::lease().await;
    let cms: Api<ConfigMap> = Api::namespaced(cp.admin.clone(), "default");
    // Server-side apply, so the server records the manager and the fields it owns.
    for name in ["kept", "emptied"] {
        let applied = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default"},
            "data": {"a": "1"},
        });
        cms.patch(
            name,
            &PatchParams::apply("test-manager"),
            &Patch::Apply(&applied),
        )
        .await
        .unwrap();
    }
    let applier = |fields: &[ManagedFieldsEntry]| {
        fields
            .iter()
            .find(|e| e.manager.as_deref() == Some("test-manager"))
            .cloned()
    };
    let before = cms.get("kept").await.unwrap().metadata.managed_fields;
    let before = applier(before.as_deref().unwrap_or_default()).expect("the server recorded it");

    // The copy a controller's cache holds.
    let store: Arc<dyn ObjectStore> = Arc::new(KubeStore::new(cp.admin.clone()));
    let events = watcher::watcher::<ConfigMap>(
        store.clone(),
        Kind::of::<ConfigMap>(),
        Some("default".into()),
    );
    tokio::pin!(events);
    let mut cached = std::collections::HashMap::new();
    while let Some(event) = events.next().await {
        match event.unwrap() {
            Event::InitApply(cm) => {
                cached.insert(cm.metadata.name.clone().unwrap(), cm);
            }
            Event::InitDone => break,
            _ => {}
        }
    }
    let mut kept = cached.remove("kept").expect("listed");
    assert_eq!(kept.metadata.managed_fields, None, "stripped in the cache");

    // A write through the store from that copy (a field test-manager does not own, so its entry
    // has no reason to change).
    kept.data
        .get_or_insert_default()
        .insert("b".into(), "2".into());
    let api = store::Api::<ConfigMap>::new(store);
    api.replace(&kept).await.unwrap();
    let after = cms.get("kept").await.unwrap();
    assert_eq!(
        after.data.unwrap_or_default().get("b").map(String::as_str),
        Some("2")
    );
    let after = after.metadata.managed_fields.unwrap_or_default();
    assert_eq!(
        applier(&after),
        Some(before),
        "test-manager's entry as it was: {after:?}"
    );

    // What the assertion guards against: an empty list in the copy clears them all.
    let mut emptied = cached.remove("emptied").expect("listed");
    emptied.metadata.managed_fields = Some(vec![]);
    api.replace(&emptied).await.unwrap();
    let after = cms.get("emptied").await.unwrap().metadata.managed_fields;
    assert_eq!(
        applier(after.as_deref().unwrap_or_default()),
        None,
        "{after:?}"
    );
}
