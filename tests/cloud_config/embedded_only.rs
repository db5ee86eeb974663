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

/// The held table is read again the moment `harvester-cloud token` marks it changed (it writes the
/// marker in place), however long the refresh interval; and a marker replaced by another file (a new
/// inode the held one does not see) is still honoured by the next read after the interval.
#[tokio::test]
async fn a_marked_change_is_seen_at_once() {
    use harvester_cloud::auth::{
        ApiToken, Authenticator, Credential, embedded::EmbeddedAuthenticator,
    };
    let b = EmbeddedBackend::start().await;
    let pool = b.app.store.pool().clone();
    let admin = ApiToken::parse(&b.admin_token()).unwrap();
    let auth = EmbeddedAuthenticator::with_refresh(
        pool.clone(),
        &b.data_dir(),
        std::time::Duration::from_secs(3600),
    );
    let check = |t: &ApiToken| {
        let (auth, credential) = (&auth, Credential::Api(t.clone()));
        async move { auth.authenticate(&credential).await }
    };
    assert!(check(&admin).await.is_ok());
    let (other, _) = tokens::create(&pool, "", None).await.unwrap();
    assert!(check(&other).await.is_err(), "not read again unmarked");
    assert_eq!(auth.table_reads(), 1);
    tokens::mark_changed(&b.data_dir());
    assert!(check(&other).await.is_ok(), "read again once marked");
    tokens::revoke(&pool, &other.name).await.unwrap();
    tokens::mark_changed(&b.data_dir());
    assert_eq!(
        check(&other).await.unwrap_err().to_string(),
        format!("token {} is revoked", other.name)
    );
    assert_eq!(auth.table_reads(), 3);

    // A marker replaced by a rename: seen by the read after the interval.
    let short = EmbeddedAuthenticator::with_refresh(
        pool.clone(),
        &b.data_dir(),
        std::time::Duration::from_millis(300),
    );
    assert!(
        short
            .authenticate(&Credential::Api(admin.clone()))
            .await
            .is_ok()
    );
    tokens::revoke(&pool, &admin.name).await.unwrap();
    let marker = b.data_dir().join("admin-tokens.changed");
    let replacement = b.data_dir().join("admin-tokens.changed.new");
    std::fs::write(&replacement, "replaced").unwrap();
    std::fs::rename(&replacement, &marker).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert_eq!(
        short
            .authenticate(&Credential::Api(admin.clone()))
            .await
            .unwrap_err()
            .to_string(),
        format!("token {} is revoked", admin.name)
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
    let claims = jsonwebtoken::decode::<Value>(&token, &DecodingKey::from_jwk(jwk).unwrap(), &v)
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
