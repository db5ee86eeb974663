//! Token rotation: the newest token wins, the old one keeps its grace, what is refused, and a token
//! that expires.

use super::*;

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
            let replies = futures::future::join_all((0..8).map(|_| rotate(&b, body.clone()))).await;
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
        time::OffsetDateTime::parse(&ends, &time::format_description::well_known::Rfc3339).unwrap();
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
