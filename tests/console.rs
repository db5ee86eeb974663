//! The web console on the Kubernetes backend, as a smoke test: `tests/ui/kube-smoke.mjs` starts
//! the real binary with `serve --backend kube` on a real control plane (the service holding the
//! chart's RBAC, signed in with a Rancher admin's token) and drives Debian's chromium through it.
//! Afterwards the API server's audit log must show nothing of the service's refused: the chart's
//! RBAC covers what the console asks for. The embedded-store browser tests are `scripts/ui-test.sh`.

mod support;

use std::path::Path;

use support::{Backend, KubeBackend, kube_env};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_works_on_the_kubernetes_backend() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert!(
        root.join("tests/ui/node_modules/playwright-core").is_dir(),
        "tests/ui/node_modules is missing: npm ci --prefix tests/ui (scripts/test-tools.sh does)"
    );
    let b = KubeBackend::start().await;
    let probe = b.cp.refusal_probe(&[kube_env::SERVICE_USER]);
    let out = tokio::process::Command::new("node")
        .arg("tests/ui/kube-smoke.mjs")
        .current_dir(root)
        .env("HARVESTER_CLOUD_BIN", env!("CARGO_BIN_EXE_harvester-cloud"))
        .env("CONSOLE_KUBECONFIG", b.service_kubeconfig())
        .env("CONSOLE_TOKEN", b.admin_token())
        .kill_on_drop(true)
        .output()
        .await
        .expect("node runs (scripts/test-tools.sh installs it)");
    assert!(
        out.status.success(),
        "the console's smoke test failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    probe.assert_none_refused();
}
