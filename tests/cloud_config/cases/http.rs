//! The HTTP contract: 404, authentication, 422, 409, 413 and 405 answers, and the health endpoints.

use super::*;

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

pub async fn health_endpoints<B: Backend>(b: B) {
    for path in ["/healthz", "/readyz"] {
        let r = b.call(Method::GET, path, None, Body::empty()).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        assert_eq!(r.text(), "ok");
    }
}
