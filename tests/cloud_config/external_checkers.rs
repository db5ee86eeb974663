use super::*;
use std::process::Command;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("cannot run {cmd:?} (is it installed? .ci/run installs it): {e}")
    });
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn kubectl_accepts_the_kubeconfig() {
    let b = EmbeddedBackend::start().await;
    let dir = tempfile::tempdir().unwrap();
    // Namespaces that YAML would read as other types must come back as strings.
    for ns in ["gc-test", "123", "true", "2024-01-02", "0x1f", "1e3"] {
        let k = b.post(&account(ns, "gc4")).await.kubeconfig();
        let path = dir.path().join(format!("{ns}.kubeconfig"));
        std::fs::write(&path, &k).unwrap();
        let out = run(Command::new("kubectl")
            .args([
                "config",
                "view",
                "--minify",
                "--raw",
                "-o",
                "json",
                "--kubeconfig",
            ])
            .arg(&path));
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["contexts"][0]["context"]["namespace"], ns, "{k}");
        assert_eq!(
            v["clusters"][0]["cluster"]["server"],
            format!("https://{VIP}:6443")
        );
        let token = yaml(&k)["users"][0]["user"]["token"].clone();
        assert_eq!(v["users"][0]["user"]["token"], token);
        let ns_out = run(Command::new("kubectl")
            .args([
                "config",
                "view",
                "--minify",
                "-o",
                "jsonpath={.contexts[0].context.namespace}",
                "--kubeconfig",
            ])
            .arg(&path));
        assert_eq!(ns_out, ns);
    }
}

#[tokio::test]
async fn cloud_init_accepts_the_user_data() {
    let b = EmbeddedBackend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let body = b.post(&account_yaml("gc-test", "gc4")).await.text();
    let path = dir.path().join("user-data");
    std::fs::write(&path, format!("#cloud-config\n{body}")).unwrap();
    let out = run(Command::new("cloud-init")
        .args(["schema", "--config-file"])
        .arg(&path));
    assert!(out.contains("Valid cloud-config"), "{out}");
    // With cloudConfigPath: one file, at exactly that path, and still valid.
    let wanted = "/opt/rke2/etc/config-files/cloud-provider-config";
    let body = b
        .post(
            &serde_json::json!({"namespace": "gc-test", "serviceAccountName": "gc4",
                "outputFormat": "yaml", "cloudConfigPath": wanted})
            .to_string(),
        )
        .await
        .text();
    std::fs::write(&path, format!("#cloud-config\n{body}")).unwrap();
    let out = run(Command::new("cloud-init")
        .args(["schema", "--config-file"])
        .arg(&path));
    assert!(out.contains("Valid cloud-config"), "{out}");
    let files = yaml(&body)["write_files"].clone();
    let paths: Vec<&str> = files
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, [wanted]);
    // The checker is real: a broken document fails it.
    std::fs::write(&path, "#cloud-config\nwrite_files: 5\n").unwrap();
    let out = Command::new("cloud-init")
        .args(["schema", "--config-file"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
}
