//! API semantics of the fake over raw HTTPS: Status bodies, resourceVersion and conflicts, no-op
//! writes, watch replay and expiry, selectors, pagination, finalizers, media types, tokens and RBAC.

mod support;

use anyhow::Result;
use reqwest::Method;
use serde_json::{Value, json};
use support::{Raw, WatchLines, eventually, start};

const CM: &str = "/api/v1/namespaces/default/configmaps";

fn mk_cm(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}, "data": {"k": "v"}})
}

#[tokio::test]
async fn unauthenticated_requests_get_the_canonical_401() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::with_token(&fake, "wrong")?;
    let (code, body) = raw.get(CM).await?;
    assert_eq!(code, 401);
    assert_eq!(
        body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
    );
    let (code, version) = raw.get("/version").await?;
    assert_eq!((code, version["minor"].as_str()), (200, Some("32")));
    Ok(())
}

#[tokio::test]
async fn discovery_documents() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    let (_, api) = raw.get("/api").await?;
    assert_eq!(api["versions"], json!(["v1"]));
    let (_, apis) = raw.get("/apis").await?;
    let groups: Vec<&str> = apis["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g["name"].as_str())
        .collect();
    for g in [
        "apiextensions.k8s.io",
        "rbac.authorization.k8s.io",
        "coordination.k8s.io",
        "events.k8s.io",
    ] {
        assert!(groups.contains(&g), "{g} missing from {groups:?}");
    }
    let (_, core) = raw.get("/api/v1").await?;
    let sa = core["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["name"] == "serviceaccounts/token");
    assert_eq!(sa.map(|r| r["kind"].clone()), Some(json!("TokenRequest")));
    let svc = core["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["name"] == "services");
    assert_eq!(svc.map(|r| r["shortNames"].clone()), Some(json!(["svc"])));
    let (code, _) = raw.get("/apis/nope.example.com/v1").await?;
    assert_eq!(code, 404);
    Ok(())
}

#[tokio::test]
async fn create_get_conflicts_and_canonical_errors() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    let (code, created) = raw.post(CM, &mk_cm("a", json!({}))).await?;
    assert_eq!(code, 201);
    assert!(
        created["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| u.len() == 36)
    );
    assert!(
        created["metadata"]["creationTimestamp"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );
    let rv = created["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();

    let (code, body) = raw.post(CM, &mk_cm("a", json!({}))).await?;
    assert_eq!(code, 409);
    assert_eq!(
        body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "configmaps \"a\" already exists", "reason": "AlreadyExists",
               "details": {"name": "a", "kind": "configmaps"}, "code": 409})
    );

    let (code, body) = raw.get(&format!("{CM}/missing")).await?;
    assert_eq!(code, 404);
    assert_eq!(body["message"], "configmaps \"missing\" not found");
    assert_eq!(
        body["details"],
        json!({"name": "missing", "kind": "configmaps"})
    );

    let (code, body) = raw
        .get("/apis/coordination.k8s.io/v1/namespaces/default/leases/x")
        .await?;
    assert_eq!(
        (code, body["details"].clone()),
        (
            404,
            json!({"name": "x", "group": "coordination.k8s.io", "kind": "leases"})
        )
    );
    assert_eq!(
        body["message"],
        "leases.coordination.k8s.io \"x\" not found"
    );

    let (code, body) = raw
        .post("/api/v1/namespaces/nope/configmaps", &mk_cm("a", json!({})))
        .await?;
    assert_eq!(
        (code, body["message"].clone()),
        (404, json!("namespaces \"nope\" not found"))
    );
    assert_eq!(
        body["details"],
        json!({"name": "nope", "kind": "namespaces"})
    );

    let mut stale = created.clone();
    stale["data"]["k"] = json!("new");
    let (code, updated) = raw.put(&format!("{CM}/a"), &stale).await?;
    assert_eq!(code, 200);
    assert_ne!(
        updated["metadata"]["resourceVersion"].as_str(),
        Some(rv.as_str())
    );
    let (code, body) = raw.put(&format!("{CM}/a"), &stale).await?;
    assert_eq!(code, 409);
    assert_eq!(
        body["message"],
        "Operation cannot be fulfilled on configmaps \"a\": the object has been modified; please apply your changes to the latest version and try again"
    );
    assert_eq!(body["reason"], "Conflict");

    let (code, gen_named) = raw
        .post(CM, &json!({"metadata": {"generateName": "gen-"}}))
        .await?;
    assert_eq!(code, 201);
    assert!(
        gen_named["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("gen-") && n.len() == 9)
    );

    let (code, body) = raw.post(CM, &json!({"metadata": {}})).await?;
    assert_eq!(code, 422);
    assert_eq!(
        body["message"],
        "ConfigMap \"\" is invalid: metadata.name: Required value: name or generateName is required"
    );
    assert_eq!(body["details"]["causes"][0]["reason"], "FieldValueRequired");
    Ok(())
}

#[tokio::test]
async fn invalid_token_secret_is_rejected_with_causes() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    let secret = json!({"metadata": {"name": "t"}, "type": "kubernetes.io/service-account-token"});
    let (code, body) = raw
        .post("/api/v1/namespaces/default/secrets", &secret)
        .await?;
    assert_eq!(code, 422);
    assert_eq!(
        body["message"],
        "Secret \"t\" is invalid: metadata.annotations[kubernetes.io/service-account.name]: Required value"
    );
    assert_eq!(body["details"]["kind"], "Secret");
    Ok(())
}

#[tokio::test]
async fn no_op_writes_keep_the_version_and_emit_no_event() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    let (_, created) = raw.post(CM, &mk_cm("quiet", json!({}))).await?;
    let rv = created["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let (code, same) = raw.put(&format!("{CM}/quiet"), &created).await?;
    assert_eq!(
        (code, same["metadata"]["resourceVersion"].as_str()),
        (200, Some(rv.as_str()))
    );
    let (_, same) = raw
        .patch(
            &format!("{CM}/quiet"),
            "application/merge-patch+json",
            &json!({"data": {"k": "v"}}),
        )
        .await?;
    assert_eq!(
        same["metadata"]["resourceVersion"].as_str(),
        Some(rv.as_str())
    );

    let resp = raw
        .req(Method::GET, &format!("{CM}?watch=1&resourceVersion={rv}"))
        .send()
        .await?;
    let mut events = WatchLines::new(resp);
    raw.patch(
        &format!("{CM}/quiet"),
        "application/merge-patch+json",
        &json!({"data": {"k": "changed"}}),
    )
    .await?;
    let (ty, obj) = events.event().await?;
    assert_eq!(
        (ty.as_str(), obj["data"]["k"].as_str()),
        ("MODIFIED", Some("changed"))
    );
    Ok(())
}

#[tokio::test]
async fn watch_replays_from_a_version_and_expires_old_ones() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    let (_, created) = raw.post(CM, &mk_cm("w", json!({"app": "x"}))).await?;
    let rv = created["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    raw.patch(
        &format!("{CM}/w"),
        "application/merge-patch+json",
        &json!({"data": {"k": "2"}}),
    )
    .await?;
    raw.delete(&format!("{CM}/w")).await?;

    let resp = raw
        .req(
            Method::GET,
            &format!("{CM}?watch=true&resourceVersion={rv}&labelSelector=app%3Dx"),
        )
        .send()
        .await?;
    let mut events = WatchLines::new(resp);
    let (t1, o1) = events.event().await?;
    let (t2, o2) = events.event().await?;
    assert_eq!(
        (t1.as_str(), o1["data"]["k"].as_str()),
        ("MODIFIED", Some("2"))
    );
    assert_eq!(
        (t2.as_str(), o2["metadata"]["name"].as_str()),
        ("DELETED", Some("w"))
    );
    assert!(
        o2["metadata"]["resourceVersion"].as_str() > o1["metadata"]["resourceVersion"].as_str()
    );

    fake.compact_history();
    let resp = raw
        .req(
            Method::GET,
            &format!("{CM}?watch=true&resourceVersion={rv}"),
        )
        .send()
        .await?;
    let mut expired = WatchLines::new(resp);
    let (ty, status) = expired.event().await?;
    assert_eq!(ty, "ERROR");
    assert_eq!(
        (status["code"].clone(), status["reason"].clone()),
        (json!(410), json!("Expired"))
    );
    assert!(
        expired.next().await?.is_none(),
        "the stream ends after Expired"
    );

    let resp = raw
        .req(Method::GET, &format!("{CM}?watch=true&timeoutSeconds=1"))
        .send()
        .await?;
    let mut timed = WatchLines::new(resp);
    while timed.next().await?.is_some() {}
    Ok(())
}

#[tokio::test]
async fn watch_reports_selector_transitions_and_bookmarks() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    let (_, list) = raw.get(CM).await?;
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let resp = raw
        .req(
            Method::GET,
            &format!(
                "{CM}?watch=1&resourceVersion={rv}&labelSelector=app%3Dweb&allowWatchBookmarks=true"
            ),
        )
        .send()
        .await?;
    let mut events = WatchLines::new(resp);
    raw.post(CM, &mk_cm("t", json!({"app": "db"}))).await?;
    raw.patch(
        &format!("{CM}/t"),
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"app": "web"}}}),
    )
    .await?;
    raw.patch(
        &format!("{CM}/t"),
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"app": "db"}}}),
    )
    .await?;
    assert_eq!(events.event().await?.0, "ADDED");
    assert_eq!(events.event().await?.0, "DELETED");
    loop {
        let Some(ev) = events.next().await? else {
            anyhow::bail!("stream ended")
        };
        if ev["type"] == "BOOKMARK" {
            assert!(
                ev["object"]["metadata"]["resourceVersion"]
                    .as_str()
                    .is_some()
            );
            break;
        }
    }
    Ok(())
}

#[tokio::test]
async fn selectors_and_pagination() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    for (name, app) in [("a1", "web"), ("a2", "db"), ("a3", "web"), ("a4", "cache")] {
        raw.post(CM, &mk_cm(name, json!({"app": app}))).await?;
    }
    let names = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string))
            .collect()
    };
    let (_, l) = raw
        .get(&format!("{CM}?labelSelector=app%20in%20(web,cache)"))
        .await?;
    assert_eq!(names(&l), ["a1", "a3", "a4"]);
    let (_, l) = raw
        .get(&format!("{CM}?labelSelector=app%20notin%20(web),app"))
        .await?;
    assert_eq!(names(&l), ["a2", "a4"]);
    let (_, l) = raw
        .get(&format!("{CM}?fieldSelector=metadata.name%3Da2"))
        .await?;
    assert_eq!(names(&l), ["a2"]);
    assert!(
        l["items"][0].get("kind").is_none(),
        "built-in list items carry no kind"
    );
    let (code, body) = raw.get(&format!("{CM}?fieldSelector=spec.x%3D1")).await?;
    assert_eq!(
        (code, body["message"].clone()),
        (400, json!("field label not supported: spec.x"))
    );

    let (_, p1) = raw.get(&format!("{CM}?labelSelector=app&limit=2")).await?;
    assert_eq!(names(&p1), ["a1", "a2"]);
    assert_eq!(p1["metadata"]["remainingItemCount"], 2);
    let cont = p1["metadata"]["continue"].as_str().unwrap_or_default();
    let (_, p2) = raw
        .get(&format!("{CM}?labelSelector=app&limit=2&continue={cont}"))
        .await?;
    assert_eq!(names(&p2), ["a3", "a4"]);
    assert!(p2["metadata"].get("continue").is_none());
    Ok(())
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    let mut cm = mk_cm("held", json!({}));
    cm["metadata"]["finalizers"] = json!(["example.com/hold"]);
    raw.post(CM, &cm).await?;
    let (code, pending) = raw.delete(&format!("{CM}/held")).await?;
    assert_eq!(code, 200);
    assert!(pending["metadata"]["deletionTimestamp"].is_string());
    let (code, _) = raw.get(&format!("{CM}/held")).await?;
    assert_eq!(code, 200);
    let (code, body) = raw
        .patch(
            &format!("{CM}/held"),
            "application/merge-patch+json",
            &json!({"metadata": {"finalizers": ["x"]}}),
        )
        .await?;
    assert_eq!((code, body["reason"].clone()), (422, json!("Invalid")));
    raw.patch(
        &format!("{CM}/held"),
        "application/json-patch+json",
        &json!([{"op": "remove", "path": "/metadata/finalizers"}]),
    )
    .await?;
    let (code, _) = raw.get(&format!("{CM}/held")).await?;
    assert_eq!(code, 404);

    let (code, deleted) = raw.delete(&format!("{CM}/held")).await?;
    assert_eq!(code, 404);
    assert_eq!(deleted["reason"], "NotFound");
    raw.post(CM, &mk_cm("plain", json!({}))).await?;
    let (code, status) = raw.delete(&format!("{CM}/plain")).await?;
    assert_eq!(
        (code, status["kind"].clone(), status["status"].clone()),
        (200, json!("Status"), json!("Success"))
    );
    Ok(())
}

#[tokio::test]
async fn media_types() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    let pod_envelope = b"k8s\x00\x0a\x09\x0a\x02v1\x12\x03Pod".to_vec();
    let rb = raw
        .req(Method::POST, CM)
        .header("content-type", "application/vnd.kubernetes.protobuf")
        .body(pod_envelope);
    let (code, body) = raw.send(rb).await?;
    assert_eq!(
        (code, body["reason"].clone()),
        (415, json!("UnsupportedMediaType"))
    );
    let rb = raw
        .req(Method::POST, CM)
        .header("content-type", "text/plain")
        .body("x");
    assert_eq!(raw.send(rb).await?.0, 415);

    let resp = raw
        .req(Method::GET, CM)
        .header(
            "accept",
            "application/vnd.kubernetes.protobuf, application/json",
        )
        .send()
        .await?;
    assert_eq!(
        resp.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/json")
    );
    let resp = raw
        .req(Method::GET, CM)
        .header("accept", "application/vnd.kubernetes.protobuf")
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 406);

    let rb = raw.req(Method::GET, "/api/v1/namespaces").header(
        "accept",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    );
    let (_, table) = raw.send(rb).await?;
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["columnDefinitions"][0]["name"], "Name");
    assert_eq!(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    Ok(())
}

#[tokio::test]
async fn token_controller_fills_and_validates_tokens() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    raw.post(
        "/api/v1/namespaces/default/serviceaccounts",
        &json!({"metadata": {"name": "bot"}}),
    )
    .await?;
    let secret = json!({"metadata": {"name": "bot-token", "annotations": {"kubernetes.io/service-account.name": "bot"}},
        "type": "kubernetes.io/service-account-token"});
    raw.post("/api/v1/namespaces/default/secrets", &secret)
        .await?;
    let filled = eventually(|| async {
        let (_, s) = raw
            .get("/api/v1/namespaces/default/secrets/bot-token")
            .await?;
        Ok(s["data"]["token"].is_string().then_some(s))
    })
    .await?;
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let token =
        String::from_utf8(b64.decode(filled["data"]["token"].as_str().unwrap_or_default())?)?;
    let ca = String::from_utf8(b64.decode(filled["data"]["ca.crt"].as_str().unwrap_or_default())?)?;
    assert_eq!(ca, fake.ca_pem());
    assert!(filled["metadata"]["annotations"]["kubernetes.io/service-account.uid"].is_string());

    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}});
    let (code, r) = raw
        .post("/apis/authentication.k8s.io/v1/tokenreviews", &review)
        .await?;
    assert_eq!(code, 201);
    assert_eq!(r["status"]["authenticated"], true);
    assert_eq!(
        r["status"]["user"]["username"],
        "system:serviceaccount:default:bot"
    );
    assert_eq!(
        r["status"]["user"]["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:default",
            "system:authenticated"
        ])
    );

    let as_bot = Raw::with_token(&fake, &token)?;
    let (code, body) = as_bot.get(CM).await?;
    assert_eq!(code, 403);
    assert_eq!(
        body["message"],
        "configmaps is forbidden: User \"system:serviceaccount:default:bot\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"default\""
    );

    let (code, tr) = raw
        .post(
            "/api/v1/namespaces/default/serviceaccounts/bot/token",
            &json!({"spec": {"expirationSeconds": 600}}),
        )
        .await?;
    assert_eq!(code, 201);
    let bound = tr["status"]["token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let (code, _) = Raw::with_token(&fake, &bound)?.get("/api").await?;
    assert_eq!(code, 200);
    let (code, body) = raw
        .post(
            "/api/v1/namespaces/default/serviceaccounts/bot/token",
            &json!({"spec": {"expirationSeconds": 60}}),
        )
        .await?;
    assert_eq!((code, body["reason"].clone()), (422, json!("Invalid")));

    raw.delete("/api/v1/namespaces/default/serviceaccounts/bot")
        .await?;
    let (_, r) = raw
        .post("/apis/authentication.k8s.io/v1/tokenreviews", &review)
        .await?;
    assert!(
        r["status"].get("authenticated").is_none(),
        "a deleted account's token is invalid"
    );
    assert_eq!(Raw::with_token(&fake, &bound)?.get("/api").await?.0, 401);
    let gone = eventually(|| async {
        let (code, _) = raw
            .get("/api/v1/namespaces/default/secrets/bot-token")
            .await?;
        Ok((code == 404).then_some(()))
    })
    .await;
    assert!(
        gone.is_ok(),
        "the token Secret of a deleted account is removed"
    );
    Ok(())
}

#[tokio::test]
async fn never_filling_tokens_leaves_secrets_empty() -> Result<()> {
    let fake = start().await?;
    fake.never_fill_tokens();
    let raw = Raw::admin(&fake)?;
    raw.post(
        "/api/v1/namespaces/default/serviceaccounts",
        &json!({"metadata": {"name": "slow"}}),
    )
    .await?;
    let secret = json!({"metadata": {"name": "slow-token", "annotations": {"kubernetes.io/service-account.name": "slow"}},
        "type": "kubernetes.io/service-account-token"});
    raw.post("/api/v1/namespaces/default/secrets", &secret)
        .await?;
    // Later writes wake the controllers; the Secret must still be empty afterwards.
    raw.post(CM, &mk_cm("poke", json!({}))).await?;
    let (_, s) = raw
        .get("/api/v1/namespaces/default/secrets/slow-token")
        .await?;
    assert!(s.get("data").is_none_or(|d| d.get("token").is_none()));
    Ok(())
}

#[tokio::test]
async fn subject_access_reviews_evaluate_stored_rbac() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    let sar = |user: &str, groups: Value, verb: &str, resource: &str, sub: &str, name: &str| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
            "user": user, "groups": groups, "resourceAttributes": {"namespace": "default", "verb": verb,
            "resource": resource, "subresource": sub, "name": name}}})
    };
    let allowed = |v: &Value| v["status"]["allowed"].as_bool().unwrap_or(false);
    let path = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
    let (_, r) = raw
        .post(path, &sar("alice", json!([]), "get", "secrets", "", "s1"))
        .await?;
    assert!(!allowed(&r));
    raw.post(
        "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles",
        &json!({"metadata": {"name": "r"}, "rules": [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": ["s1"]},
            {"apiGroups": [""], "resources": ["services/status"], "verbs": ["*"]}]}),
    )
    .await?;
    raw.post(
        "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings",
        &json!({"metadata": {"name": "rb"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
            "subjects": [{"kind": "User", "name": "alice"}, {"kind": "Group", "name": "team"}]}),
    )
    .await?;
    let (_, r) = raw
        .post(path, &sar("alice", json!([]), "get", "secrets", "", "s1"))
        .await?;
    assert!(allowed(&r));
    assert_eq!(
        r["status"]["reason"],
        "RBAC: allowed by RoleBinding \"rb/default\" of Role \"r\" to User \"alice\""
    );
    let (_, r) = raw
        .post(path, &sar("alice", json!([]), "get", "secrets", "", "s2"))
        .await?;
    assert!(!allowed(&r), "resourceNames restrict");
    let (_, r) = raw
        .post(
            path,
            &sar("bob", json!(["team"]), "patch", "services", "status", ""),
        )
        .await?;
    assert!(allowed(&r), "group subject, subresource, verb wildcard");
    let (_, r) = raw
        .post(
            path,
            &sar("bob", json!(["team"]), "patch", "services", "", ""),
        )
        .await?;
    assert!(
        !allowed(&r),
        "the subresource grant does not cover the resource"
    );
    let (_, r) = raw
        .post(
            path,
            &sar(
                "root",
                json!(["system:masters"]),
                "delete",
                "anything",
                "",
                "",
            ),
        )
        .await?;
    assert!(allowed(&r));

    let token = fake.add_user("carol", &[]);
    let carol = Raw::with_token(&fake, &token)?;
    let ssar = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"namespace": "default", "verb": "list", "resource": "secrets"}}});
    let (code, r) = carol
        .post(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            &ssar,
        )
        .await?;
    assert_eq!((code, allowed(&r)), (201, false));
    let (code, _) = carol
        .post(path, &sar("alice", json!([]), "get", "secrets", "", "s1"))
        .await?;
    assert_eq!(code, 403, "SubjectAccessReview itself needs RBAC");
    Ok(())
}

#[tokio::test]
async fn binding_escalation_is_prevented_for_non_admins() -> Result<()> {
    let fake = start().await?;
    let admin = Raw::admin(&fake)?;
    admin
        .post(
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            &json!({"metadata": {"name": "binder"}, "rules": [
                {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings"], "verbs": ["create"]},
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}),
        )
        .await?;
    admin
        .post(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            &json!({"metadata": {"name": "dave-binder"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "binder"},
                "subjects": [{"kind": "User", "name": "dave"}]}),
        )
        .await?;
    let dave = Raw::with_token(&fake, &fake.add_user("dave", &[]))?;
    let binding = |role: &str, name: &str| {
        json!({"metadata": {"name": name}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "User", "name": "eve"}]})
    };
    let path = "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings";
    let (code, body) = dave.post(path, &binding("cluster-admin", "b1")).await?;
    assert_eq!(code, 403);
    assert!(
        body["message"].as_str().is_some_and(
            |m| m.contains("is attempting to grant RBAC permissions not currently held")
        )
    );
    let (code, _) = dave.post(path, &binding("binder", "b2")).await?;
    assert_eq!(
        code, 201,
        "a role whose permissions the caller holds can be bound"
    );
    admin
        .post(
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            &json!({"metadata": {"name": "may-bind-admin"}, "rules": [
                {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"], "resourceNames": ["cluster-admin"]}]}),
        )
        .await?;
    admin
        .post(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            &json!({"metadata": {"name": "dave-bind"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "may-bind-admin"},
                "subjects": [{"kind": "User", "name": "dave"}]}),
        )
        .await?;
    let (code, _) = dave.post(path, &binding("cluster-admin", "b3")).await?;
    assert_eq!(code, 201, "the bind verb allows it");
    let (code, body) = dave
        .patch(
            &format!("{path}/b3"),
            "application/merge-patch+json",
            &json!({"roleRef": {"name": "binder"}}),
        )
        .await?;
    assert_eq!(code, 403, "patch needs its own RBAC: {body}");
    let (code, body) = admin
        .patch(
            &format!("{path}/b3"),
            "application/merge-patch+json",
            &json!({"roleRef": {"name": "binder"}}),
        )
        .await?;
    assert_eq!(
        (code, body["reason"].clone()),
        (422, json!("Invalid")),
        "roleRef is immutable"
    );
    Ok(())
}

#[tokio::test]
async fn request_log_counts_requests() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    fake.reset_requests();
    raw.post(CM, &mk_cm("c", json!({}))).await?;
    raw.get(&format!("{CM}/c")).await?;
    raw.delete(&format!("{CM}/c")).await?;
    let log: Vec<(String, String)> = fake
        .requests()
        .into_iter()
        .map(|r| (r.method, r.path))
        .collect();
    assert_eq!(
        log,
        vec![
            ("POST".to_string(), CM.to_string()),
            ("GET".to_string(), format!("{CM}/c")),
            ("DELETE".to_string(), format!("{CM}/c")),
        ]
    );
    assert_eq!(fake.request_count(), 3);
    Ok(())
}

#[tokio::test]
async fn namespace_deletion_and_garbage_collection() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    raw.post(
        "/api/v1/namespaces",
        &json!({"metadata": {"name": "doomed"}}),
    )
    .await?;
    let (_, owner) = raw
        .post(
            "/api/v1/namespaces/doomed/configmaps",
            &mk_cm("owner", json!({})),
        )
        .await?;
    let mut dep = mk_cm("dependent", json!({}));
    dep["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}]);
    raw.post("/api/v1/namespaces/doomed/configmaps", &dep)
        .await?;
    raw.delete("/api/v1/namespaces/doomed/configmaps/owner")
        .await?;
    eventually(|| async {
        let (code, _) = raw
            .get("/api/v1/namespaces/doomed/configmaps/dependent")
            .await?;
        Ok((code == 404).then_some(()))
    })
    .await?;

    raw.post(
        "/api/v1/namespaces/doomed/configmaps",
        &mk_cm("content", json!({})),
    )
    .await?;
    let (code, ns) = raw.delete("/api/v1/namespaces/doomed").await?;
    assert_eq!(
        (code, ns["status"]["phase"].clone()),
        (200, json!("Terminating"))
    );
    let (code, body) = raw
        .post(
            "/api/v1/namespaces/doomed/configmaps",
            &mk_cm("late", json!({})),
        )
        .await?;
    if code != 404 {
        assert_eq!((code, body["reason"].clone()), (403, json!("Forbidden")));
    }
    eventually(|| async {
        let (code, _) = raw.get("/api/v1/namespaces/doomed").await?;
        Ok((code == 404).then_some(()))
    })
    .await?;
    let (code, _) = raw
        .get("/api/v1/namespaces/doomed/configmaps/content")
        .await?;
    assert_eq!(code, 404);
    Ok(())
}

#[tokio::test]
async fn impersonation_requires_rbac() -> Result<()> {
    let fake = start().await?;
    let admin = Raw::admin(&fake)?;
    let rb = admin
        .req(Method::GET, CM)
        .header("Impersonate-User", "frank");
    let (code, body) = admin.send(rb).await?;
    assert_eq!(code, 403);
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("User \"frank\" cannot list resource \"configmaps\""))
    );
    let grace = Raw::with_token(&fake, &fake.add_user("grace", &[]))?;
    let rb = grace
        .req(Method::GET, "/api")
        .header("Impersonate-User", "kube-fake-admin");
    let (code, body) = grace.send(rb).await?;
    assert_eq!(code, 403);
    assert_eq!(body["details"]["kind"], "users");
    Ok(())
}

#[tokio::test]
async fn token_secret_for_a_replaced_account_is_deleted() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    raw.post(
        "/api/v1/namespaces/default/serviceaccounts",
        &json!({"metadata": {"name": "old"}}),
    )
    .await?;
    let secret = json!({"metadata": {"name": "old-token", "annotations": {
        "kubernetes.io/service-account.name": "old", "kubernetes.io/service-account.uid": "not-the-uid"}},
        "type": "kubernetes.io/service-account-token"});
    assert_eq!(
        raw.post("/api/v1/namespaces/default/secrets", &secret)
            .await?
            .0,
        201
    );
    eventually(|| async {
        let (code, _) = raw
            .get("/api/v1/namespaces/default/secrets/old-token")
            .await?;
        Ok((code == 404).then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn deletecollection_and_method_not_allowed() -> Result<()> {
    let fake = start().await?;
    let raw = Raw::admin(&fake)?;
    for (name, app) in [("d1", "x"), ("d2", "x"), ("d3", "y")] {
        raw.post(CM, &mk_cm(name, json!({"app": app}))).await?;
    }
    let (code, _) = raw.delete(&format!("{CM}?labelSelector=app%3Dx")).await?;
    assert_eq!(code, 200);
    let (_, left) = raw.get(&format!("{CM}?labelSelector=app")).await?;
    assert_eq!(left["items"].as_array().map(Vec::len), Some(1));
    let (code, body) = raw.put(CM, &mk_cm("d4", json!({}))).await?;
    assert_eq!(
        (code, body["reason"].clone()),
        (405, json!("MethodNotAllowed"))
    );
    let (code, _) = raw
        .get("/api/v1/namespaces/default/configmaps/d3/status")
        .await?;
    assert_eq!(code, 404, "configmaps have no status subresource");
    Ok(())
}
