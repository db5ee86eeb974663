//! The shipped manifests: `deploy/crds/*.yaml` are exactly what `harvester-cloud crds` prints (so they
//! cannot drift from the Rust types), and the webhook configurations of `deploy/manifests/` point at the routes the service serves.

use std::process::Command;

use harvester_cloud::crd;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_harvester-cloud");

fn deploy(file: &str) -> String {
    let path = format!("{}/deploy/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn shipped_crds_equal_the_generated_ones() {
    for c in crd::crds() {
        let file = crd::crd_file_name(&c);
        let generated = crd::crd_yaml(&c).expect("renders");
        assert_eq!(
            deploy(&format!("crds/{file}")),
            generated,
            "deploy/crds/{file} is stale: regenerate it from `harvester-cloud crds`"
        );
    }
}

#[test]
fn crds_subcommand_prints_both_documents() {
    let out = Command::new(BIN).arg("crds").output().expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    assert_eq!(text, crd::crds_yaml().expect("renders"));
    let names: Vec<String> = text
        .split("---\n")
        .filter(|d| !d.trim().is_empty())
        .map(|d| {
            let v: Value = yaml_serde::from_str(d).expect("YAML");
            v["metadata"]["name"].as_str().expect("name").to_string()
        })
        .collect();
    assert_eq!(
        names,
        [
            "loadbalancers.loadbalancer.harvesterhci.io",
            "ippools.loadbalancer.harvesterhci.io"
        ]
    );
}

#[test]
fn chart_crds_equal_the_generated_ones() {
    for c in crd::crds() {
        let file = crd::crd_file_name(&c);
        assert_eq!(
            deploy(&format!("chart/harvester-cloud/crds/{file}")),
            crd::crd_yaml(&c).expect("renders"),
            "deploy/chart/harvester-cloud/crds/{file} is stale: copy it from deploy/crds"
        );
    }
}

#[test]
fn webhook_manifest_targets_the_served_endpoints() {
    let text = deploy("manifests/harvester-cloud.yaml");
    let docs: Vec<Value> = text
        .split("\n---\n")
        .map(|d| yaml_serde::from_str::<Value>(d).expect("YAML"))
        .filter(|d| {
            d["kind"] == "MutatingWebhookConfiguration"
                || d["kind"] == "ValidatingWebhookConfiguration"
        })
        .collect();
    let mut paths = Vec::new();
    for doc in &docs {
        for hook in doc["webhooks"].as_array().expect("webhooks") {
            assert_eq!(hook["admissionReviewVersions"], serde_json::json!(["v1"]));
            assert_eq!(hook["sideEffects"], "None");
            paths.push(
                hook["clientConfig"]["service"]["path"]
                    .as_str()
                    .expect("path")
                    .to_string(),
            );
            let resources: Vec<&str> = hook["rules"]
                .as_array()
                .expect("rules")
                .iter()
                .flat_map(|r| r["resources"].as_array().expect("resources"))
                .filter_map(Value::as_str)
                .collect();
            assert_eq!(resources, ["ippools", "loadbalancers"]);
        }
    }
    assert_eq!(
        paths,
        [
            harvester_cloud::http::lb::MUTATION_PATH,
            harvester_cloud::http::lb::VALIDATION_PATH
        ]
    );
    assert_eq!(docs[0]["kind"], "MutatingWebhookConfiguration");
    assert_eq!(docs[1]["kind"], "ValidatingWebhookConfiguration");
}
