//! The kubeconfig and cloud-init a POST returns and a GET repeats: shape, idempotence, byte-exact
//! YAML, the cloud-config path, and names.

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
