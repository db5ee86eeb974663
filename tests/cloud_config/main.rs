//! The cloud-config API over HTTP. The `cases` run on every backend through [`support::Backend`];
//! embedded-only behaviour (token minting, admin token store) is tested below them. The cases live
//! in `cases/`, one module per topic; `embedded_only` and `external_checkers` are files beside them.

#[path = "../support/mod.rs"]
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

pub mod cases;

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

mod embedded_only;

/// The real checkers of generated output: `kubectl config view --minify --raw` and `cloud-init schema`.
mod external_checkers;

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
