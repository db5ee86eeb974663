//! A private network namespace for tests whose peers need addresses of their own: kube-apiserver
//! refuses loopback addresses in EndpointSlices, so VM load balancer backends listen on
//! documentation addresses ([`BACKENDS`], 203.0.113.0/24) on the `lo` of a namespace the test
//! creates, never on the machine's interfaces.
//!
//! A test cannot move its runtime's threads into a namespace, so it runs itself again inside one:
//! [`rerun`] starts `unshare --net --pid --fork --kill-child --mount-proc` (with
//! `--map-root-user` unless root), which brings `lo` up with the addresses and execs this test
//! binary for that one test. Everything the inner run starts (its control plane, see
//! [`control_plane`]) lives in the new PID namespace, which the kernel empties when the inner test
//! exits, however it exits; the network namespace goes with its last process. The outer test waits,
//! fails if the inner one failed, and removes the working directory.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use super::control_plane::{self, ControlPlane};

/// Set inside the namespace, to the run's working directory.
pub const ENV: &str = "HARVESTER_CLOUD_NETNS_DIR";
/// The backends' addresses on the namespace's `lo`.
pub const BACKENDS: [&str; 3] = ["203.0.113.2", "203.0.113.3", "203.0.113.4"];
/// How long an inner run may take (a control plane start included).
const LIMIT: Duration = Duration::from_secs(15 * 60);

/// Whether this process is the inner run.
pub fn inside() -> bool {
    std::env::var_os(ENV).is_some()
}

/// The inner run's working directory (removed by the outer run).
pub fn work_dir() -> PathBuf {
    PathBuf::from(std::env::var_os(ENV).expect("inside the test's network namespace"))
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// Runs the test `name` (as libtest names it, `module::case`) again, alone, inside a new network
/// namespace, and fails if it fails.
pub async fn rerun(name: &str) {
    let dir = tempfile::tempdir().expect("a working directory");
    let exe = std::env::current_exe().expect("the test binary");
    let script = format!(
        "set -eu\nip link set lo up\nfor a in {}; do ip addr add \"$a/32\" dev lo; done\nexec \"$0\" --exact \"$1\" --nocapture",
        BACKENDS.join(" ")
    );
    let mut cmd = tokio::process::Command::new("unshare");
    if !is_root() {
        cmd.arg("--map-root-user");
    }
    cmd.args([
        "--net",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
        "sh",
        "-c",
        &script,
    ])
    .arg(&exe)
    .arg(name)
    .env(ENV, dir.path())
    .env_remove(control_plane::ENV)
    // A dropped outer test kills unshare, and with it (`--kill-child`) the whole namespace.
    .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run unshare (util-linux) for {name}: {e}"));
    let status = tokio::time::timeout(LIMIT, child.wait())
        .await
        .unwrap_or_else(|_| panic!("{name} did not finish in its network namespace in {LIMIT:?}"))
        .expect("waits for unshare");
    assert!(
        status.success(),
        "{name} failed in its network namespace ({status})"
    );
}

/// Inside: a control plane of the namespace's own on its loopback (`scripts/control-plane.sh up`),
/// leased like one of `HARVESTER_CLOUD_CONTROL_PLANES`. It dies with the namespace.
pub async fn control_plane() -> ControlPlane {
    let dir = work_dir().join("control-plane");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/control-plane.sh");
    let out = tokio::process::Command::new(&script)
        .arg("up")
        .arg(&dir)
        .output()
        .await
        .expect("runs scripts/control-plane.sh");
    assert!(
        out.status.success(),
        "scripts/control-plane.sh up failed in the test's network namespace:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ControlPlane::lease_at(&dir).await
}
