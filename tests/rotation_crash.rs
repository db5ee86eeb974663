//! A rotation killed between any two of its writes: the service started again on the same store
//! (with its sweeper) leaves at most two working tokens of the account, GET serves one that works,
//! and once the ends the rotation gave have passed exactly one works. Each kill point is a write
//! of the rotation ([`support::faulty::KillAfter`]), tried in turn until the rotation runs to its
//! end, on one account each.

#[macro_use]
mod support;

use base64::{Engine, engine::general_purpose::STANDARD as B64};
use harvester_cloud::{
    kubeconfig::{CloudConfig, request},
    store::{Kind, LabelSelector},
};
use k8s_openapi::api::core::v1::Secret;
use serde_json::Value;
use support::{Backend, EmbeddedBackend, KubeBackend, account, eventually};

pub mod cases {
    use super::*;

    const NS: &str = "gc-test";

    fn user(sa: &str) -> String {
        format!("system:serviceaccount:{NS}:{sa}")
    }

    fn token_of(kubeconfig: &str) -> String {
        let v: Value = yaml_serde::from_str(kubeconfig).expect("kubeconfig YAML");
        v["users"][0]["user"]["token"]
            .as_str()
            .expect("a token")
            .to_string()
    }

    /// The tokens in the account's token Secrets, by Secret name.
    async fn tokens<B: Backend>(b: &B, sa: &str) -> Vec<(String, String)> {
        b.store()
            .list(
                &Kind::of::<Secret>(),
                Some(NS),
                &LabelSelector::everything(),
            )
            .await
            .expect("list Secrets")
            .items
            .iter()
            .filter(|s| s["metadata"]["annotations"]["kubernetes.io/service-account.name"] == sa)
            .filter_map(|s| {
                let token = B64.decode(s["data"]["token"].as_str()?).ok()?;
                Some((
                    s["metadata"]["name"].as_str()?.to_string(),
                    String::from_utf8(token).ok()?,
                ))
            })
            .collect()
    }

    /// The Secrets whose token the API server (or the embedded verifier) accepts.
    async fn working<B: Backend>(b: &B, sa: &str) -> Vec<String> {
        let mut out = Vec::new();
        for (name, token) in tokens(b, sa).await {
            if b.token_works(&token, &user(sa)).await {
                out.push(name);
            }
        }
        out
    }

    async fn rotate<B: Backend>(b: &B, sa: &str, grace: &str) -> String {
        let body =
            serde_json::json!({"namespace": NS, "serviceAccountName": sa, "gracePeriod": grace});
        let t = b.admin_token();
        let r = b
            .call(
                axum::http::Method::POST,
                "/v1/harvester/kubeconfig/rotate",
                Some(&t),
                body.to_string(),
            )
            .await;
        r.kubeconfig()
    }

    pub async fn a_killed_rotation_leaves_at_most_two_tokens<B: Backend>(b: B) {
        // Each account: its first token (made current by a rotation) and the one before it in a
        // grace that lasts through the checks right after the restart; then a rotation with a
        // short grace, killed after `kill` writes.
        let mut accounts = Vec::new();
        for kill in 0.. {
            assert!(kill < 30, "a rotation makes fewer than 30 writes");
            let sa = format!("kill{kill}");
            b.post(&account(NS, &sa)).await.kubeconfig();
            rotate(&b, &sa, "45s").await;
            accounts.push(sa.clone());

            let faulty = support::faulty::KillAfter::new(b.service_store(), kill);
            let cloud_config =
                CloudConfig::new(faulty.clone(), b.cloud_config().settings().clone());
            let req = request::from_json(
                serde_json::json!({"namespace": NS, "serviceAccountName": sa, "gracePeriod": "3s"})
                    .to_string()
                    .as_bytes(),
            )
            .expect("a valid rotation");
            let finished = tokio::select! {
                r = cloud_config.rotate(&req) => Some(r),
                () = faulty.killed() => None,
            };
            match finished {
                // The rotation made all its writes: the last kill point was after the last one.
                Some(Ok(_)) => break,
                Some(Err(e)) => panic!("rotation of {sa} failed before its kill point: {e}"),
                None => assert_eq!(faulty.writes_made(), kill),
            }
        }
        assert!(accounts.len() > 3, "a rotation makes several writes");

        // The service starts again on the same store, its sweeper with it.
        let b = b.restart().await;
        let stop = tokio_util::sync::CancellationToken::new();
        tokio::spawn(b.cloud_config().run_sweeper(stop.clone()));
        let _sweeper = stop.drop_guard();
        let restarted = tokio::time::Instant::now();

        for (kill, sa) in accounts.iter().enumerate() {
            let works = working(&b, sa).await;
            assert!(
                works.len() <= 2,
                "killed after {kill} writes: {} tokens work: {works:?}",
                works.len()
            );
            let got = b
                .get(&format!("namespace={NS}&serviceAccountName={sa}"))
                .await;
            let current = token_of(&got.kubeconfig());
            eventually(
                &format!("killed after {kill} writes: GET's token to work"),
                async || b.token_works(&current, &user(sa)).await.then_some(()),
            )
            .await;
        }

        // Every end the rotations gave (45 s of grace, 3 s of grace, and whatever ends a
        // rotation that never finished) has passed: one token works, the one GET serves.
        tokio::time::sleep_until(restarted + std::time::Duration::from_secs(45)).await;
        for (kill, sa) in accounts.iter().enumerate() {
            eventually(
                &format!("killed after {kill} writes: exactly one token to work, GET's"),
                async || {
                    let works = working(&b, sa).await;
                    let got = b
                        .get(&format!("namespace={NS}&serviceAccountName={sa}"))
                        .await;
                    if got.status != axum::http::StatusCode::OK || works.len() != 1 {
                        return None;
                    }
                    let served = token_of(&got.kubeconfig());
                    let left = tokens(&b, sa).await;
                    left.iter()
                        .any(|(name, token)| *name == works[0] && *token == served)
                        .then_some(())
                },
            )
            .await;
        }
    }

    /// A token Secret of the account that is neither current nor has an end, as a rotation killed
    /// before this was fixed left one: the sweeper ends it, and only it.
    pub async fn a_token_nobody_holds_is_ended<B: Backend>(b: B) {
        use harvester_cloud::kubeconfig::{naming::AccountNames, objects};
        let sa = "orphan";
        let posted = token_of(&b.post(&account(NS, sa)).await.kubeconfig());
        let names = AccountNames::new(NS, sa);
        let account_sa =
            harvester_cloud::store::Api::<k8s_openapi::api::core::v1::ServiceAccount>::new(
                b.store(),
            )
            .get(NS, sa)
            .await
            .expect("get")
            .expect("the account's ServiceAccount");
        let uid = account_sa.metadata.uid.expect("uid");
        let orphan = objects::token_secret(&names.with_secret(format!("{sa}-token-xxxxx")), &uid);
        harvester_cloud::store::Api::<Secret>::new(b.store())
            .create(&orphan)
            .await
            .expect("create the orphan");
        let orphan_token = eventually("the orphan's token", async || {
            tokens(&b, sa)
                .await
                .into_iter()
                .find(|(name, _)| name.ends_with("-xxxxx"))
                .map(|(_, t)| t)
        })
        .await;
        eventually("the orphan's token to work", async || {
            b.token_works(&orphan_token, &user(sa)).await.then_some(())
        })
        .await;

        // Not a token Secret, though labelled as ours: never the sweeper's.
        let mut other =
            objects::token_secret(&names.with_secret("orphan-not-a-token".into()), &uid);
        other.type_ = Some("Opaque".into());
        let secrets = harvester_cloud::store::Api::<Secret>::new(b.store());
        secrets
            .create(&other)
            .await
            .expect("create an Opaque Secret");

        b.cloud_config().sweep().await.expect("a sweep");
        assert!(
            secrets
                .get(NS, "orphan-not-a-token")
                .await
                .expect("get")
                .is_some(),
            "the sweeper deleted a Secret that is not a token"
        );
        eventually("the orphan's token to be refused", async || {
            (!b.token_works(&orphan_token, &user(sa)).await).then_some(())
        })
        .await;
        assert!(
            b.token_works(&posted, &user(sa)).await,
            "the current token works on"
        );
        let got = b
            .get(&format!("namespace={NS}&serviceAccountName={sa}"))
            .await;
        assert_eq!(token_of(&got.kubeconfig()), posted);
    }
}

suite!(
    [
        embedded => EmbeddedBackend::start_with(&["--token-timeout", "5s"]),
        kube => KubeBackend::start_with(&["--token-timeout", "5s"]),
    ],
    [a_killed_rotation_leaves_at_most_two_tokens, a_token_nobody_holds_is_ended]
);
