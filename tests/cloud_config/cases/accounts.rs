//! The accounts behind the kubeconfigs: made once, kept over a restart, revoked by DELETE, and what
//! GET checks and serves.

use super::*;

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
    let count =
        |items: Vec<Value>, pred: &dyn Fn(&Value) -> bool| items.iter().filter(|v| pred(v)).count();
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
