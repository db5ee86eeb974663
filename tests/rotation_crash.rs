//! A rotation killed between any two of its writes: the service started again on the same store
//! (with its sweeper) leaves at most two working tokens of the account, GET serves one that works,
//! and once the ends the rotation gave have passed exactly one works. Each kill point is a write
//! of the rotation ([`support::faulty::KillAfter`]), tried in turn until the rotation runs to its
//! end, on one account each. And rotations of one account at once, every write of theirs watched
//! ([`support::faulty::Observed`]): never a third token.

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

    /// Rotations of one account at once, 8 per round: after every write any of them makes, at
    /// most two token Secrets of the account exist (each works until deleted); each answers with
    /// a new token or with a conflict that says another rotation is under way and to retry; after
    /// each round GET serves one of the tokens answered, and it and the one it replaced work, no
    /// other. Each rotation made its token before the losers got their conflict at the switch, so
    /// for a moment three or more tokens worked.
    pub async fn concurrent_rotations_never_make_a_third_token<B: Backend>(b: B) {
        use std::sync::{Arc, Mutex};
        let sa = "race";
        let first = token_of(&b.post(&account(NS, sa)).await.kubeconfig());
        let seen: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
        let observer = b.store();
        let check: support::faulty::Check = {
            let seen = seen.clone();
            Box::new(move || {
                let (seen, observer) = (seen.clone(), observer.clone());
                Box::pin(async move {
                    let listed = observer
                        .list(
                            &Kind::of::<Secret>(),
                            Some(NS),
                            &LabelSelector::everything(),
                        )
                        .await
                        .expect("list Secrets");
                    let names: Vec<String> = listed
                        .items
                        .iter()
                        .filter(|s| {
                            s["type"] == "kubernetes.io/service-account-token"
                                && s["metadata"]["annotations"]["kubernetes.io/service-account.name"]
                                    == sa
                        })
                        .filter_map(|s| Some(s["metadata"]["name"].as_str()?.to_string()))
                        .collect();
                    if names.len() > 2 {
                        seen.lock().expect("lock").push(names);
                    }
                })
            })
        };
        let observed = support::faulty::Observed::new(b.service_store(), check);
        let cloud_config = Arc::new(CloudConfig::new(
            observed,
            b.cloud_config().settings().clone(),
        ));
        let req = request::from_json(
            serde_json::json!({"namespace": NS, "serviceAccountName": sa, "gracePeriod": "1h"})
                .to_string()
                .as_bytes(),
        )
        .expect("a valid rotation");
        let mut answered = vec![first];
        for round in 0..4 {
            let replies = futures::future::join_all((0..8).map(|_| {
                let (cloud_config, req) = (cloud_config.clone(), req.clone());
                tokio::spawn(async move { cloud_config.rotate(&req).await })
            }))
            .await;
            let thirds = seen.lock().expect("lock").clone();
            let most = thirds.iter().max_by_key(|names| names.len());
            assert!(
                thirds.is_empty(),
                "round {round}: more than two token Secrets after {} writes, at most {most:?}",
                thirds.len()
            );
            let mut winners = 0;
            for r in replies {
                match r.expect("a rotation task") {
                    Ok(kubeconfig) => {
                        winners += 1;
                        answered.push(token_of(&kubeconfig));
                    }
                    Err(e @ harvester_cloud::kubeconfig::CloudConfigError::Foreign { .. }) => {
                        let m = e.to_string();
                        assert!(m.contains("under way") && m.contains("retry"), "{m}");
                    }
                    Err(e) => panic!("round {round}: a rotation failed: {e}"),
                }
            }
            assert!(winners >= 1, "round {round}: no rotation went through");

            let got = b
                .get(&format!("namespace={NS}&serviceAccountName={sa}"))
                .await;
            assert_eq!(
                got.status,
                axum::http::StatusCode::OK,
                "round {round}: {}",
                got.text()
            );
            let current = token_of(&got.kubeconfig());
            assert!(
                answered.contains(&current),
                "round {round}: GET serves a token no rotation answered"
            );
            let left = tokens(&b, sa).await;
            assert_eq!(left.len(), 2, "round {round}: {left:?}");
            for (name, token) in &left {
                assert!(
                    answered.contains(token),
                    "round {round}: {name} holds a token no rotation answered"
                );
                eventually(
                    &format!("round {round}: {name}'s token to work"),
                    async || b.token_works(token, &user(sa)).await.then_some(()),
                )
                .await;
            }
            assert!(
                left.iter().any(|(_, token)| *token == current),
                "round {round}: GET's token is not one of the account's: {left:?}"
            );
        }
    }

    /// A rotation whose store refuses one of its writes fails, and gives up its claim on the
    /// account: the next rotation goes through at once (it does not wait for the claim's end),
    /// and at most two token Secrets are left. Each write is refused in turn, until the rotation
    /// gets through.
    pub async fn a_failed_rotation_gives_up_its_claim<B: Backend>(b: B) {
        use harvester_cloud::kubeconfig::objects;
        use k8s_openapi::api::core::v1::ServiceAccount;
        let sa = "release";
        b.post(&account(NS, sa)).await.kubeconfig();
        rotate(&b, sa, "1h").await;
        let req = request::from_json(
            serde_json::json!({"namespace": NS, "serviceAccountName": sa, "gracePeriod": "1h"})
                .to_string()
                .as_bytes(),
        )
        .expect("a valid rotation");
        for refused in 0.. {
            assert!(refused < 30, "a rotation makes fewer than 30 writes");
            let faulty = support::faulty::KillAfter::failing(b.service_store(), refused);
            let cloud_config =
                CloudConfig::new(faulty.clone(), b.cloud_config().settings().clone());
            let failed = match cloud_config.rotate(&req).await {
                Ok(_) => false,
                Err(e) => {
                    assert!(
                        faulty.writes_made() == refused,
                        "write {refused} refused, the rotation failed otherwise: {e}"
                    );
                    true
                }
            };
            let account_sa = harvester_cloud::store::Api::<ServiceAccount>::new(b.store())
                .get(NS, sa)
                .await
                .expect("get")
                .expect("the account");
            let claim = account_sa
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(objects::ROTATING_UNTIL_ANNOTATION));
            assert_eq!(claim, None, "write {refused} refused: a claim is left");
            let left = tokens(&b, sa).await;
            assert!(left.len() <= 2, "write {refused} refused: {left:?}");
            // The next rotation, through the API, at once.
            let next = rotate(&b, sa, "1h").await;
            let got = b
                .get(&format!("namespace={NS}&serviceAccountName={sa}"))
                .await;
            assert_eq!(token_of(&got.kubeconfig()), token_of(&next));
            if !failed {
                break;
            }
        }
    }

    /// A rotation whose write is made but whose reply is lost (each write in turn): whatever it
    /// answers, the account keeps a working token that GET serves, at most two work, and the next
    /// rotation goes ahead. When the lost reply is the switch's, the new token may be current:
    /// rolling it back would leave the account with none.
    pub async fn a_lost_reply_never_leaves_the_account_without_a_token<B: Backend>(b: B) {
        let sa = "lost-reply";
        b.post(&account(NS, sa)).await.kubeconfig();
        let req = request::from_json(
            serde_json::json!({"namespace": NS, "serviceAccountName": sa, "gracePeriod": "1h"})
                .to_string()
                .as_bytes(),
        )
        .expect("a valid rotation");
        for lost in 0.. {
            assert!(lost < 30, "a rotation makes fewer than 30 writes");
            let faulty = support::faulty::KillAfter::landing(b.service_store(), lost);
            let cloud_config =
                CloudConfig::new(faulty.clone(), b.cloud_config().settings().clone());
            let done = cloud_config.rotate(&req).await.is_ok() && !faulty.reached();
            let got = b
                .get(&format!("namespace={NS}&serviceAccountName={sa}"))
                .await;
            let served = token_of(&got.kubeconfig());
            assert!(
                b.token_works(&served, &user(sa)).await,
                "reply {lost} lost: GET serves a token that does not work"
            );
            let left = tokens(&b, sa).await;
            assert!(left.len() <= 2, "reply {lost} lost: {left:?}");
            let next = rotate(&b, sa, "1h").await;
            let got = b
                .get(&format!("namespace={NS}&serviceAccountName={sa}"))
                .await;
            assert_eq!(token_of(&got.kubeconfig()), token_of(&next));
            if done {
                break;
            }
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
    [
        a_killed_rotation_leaves_at_most_two_tokens,
        a_token_nobody_holds_is_ended,
        concurrent_rotations_never_make_a_third_token,
        a_failed_rotation_gives_up_its_claim,
        a_lost_reply_never_leaves_the_account_without_a_token,
    ]
);
