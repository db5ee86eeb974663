//! The kinds the service reads and does not own (KubeVirt's VirtualMachine and
//! VirtualMachineInstance, Multus's NetworkAttachmentDefinition, Rancher's Token, GlobalRoleBinding,
//! APIService, ClusterAuthToken and ClusterUserAttribute), as their upstreams define them.
//!
//! `tools/foreign-crds` (built and cached by `scripts/control-plane.sh`, copied into each control
//! plane's `foreign/`) writes their CRDs as upstream's own code makes them, and prints VMs and VMIs
//! built from `kubevirt.io/api`'s Go types and NADs from network-attachment-definition-client's.
//! Tests make their objects of these kinds here rather than writing upstream's JSON by hand: a hand-written fixture agrees with our code by construction, which is
//! how a VMI address read from a field KubeVirt does not have (`ip`) passed every test.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Names the directory `scripts/control-plane.sh foreign` prints, to use instead of the one the
/// control planes carry.
pub const ENV: &str = "HARVESTER_CLOUD_FOREIGN_KINDS";

/// The foreign kinds' directory: `bin/foreign-crds` and `crds/`.
pub fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os(ENV) {
            return PathBuf::from(dir);
        }
        // Every control plane carries a copy (`up` makes it); the embedded-backend tests use the
        // first one's.
        if let Some(cp) = std::env::var(super::control_plane::ENV)
            .ok()
            .and_then(|l| l.split(':').find(|s| !s.is_empty()).map(PathBuf::from))
            && cp.join("foreign/bin/foreign-crds").exists()
        {
            return cp.join("foreign");
        }
        // No control plane: the cache, built first if need be (minutes when cold).
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/control-plane.sh");
        let out = Command::new(script)
            .arg("foreign")
            .output()
            .unwrap_or_else(|e| panic!("cannot run {script} foreign: {e}"));
        assert!(
            out.status.success(),
            "{script} foreign failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).expect("a path").trim())
    })
}

/// The annotation [`crds`] puts on each CRD: a digest of its file, so that a seed applies a CRD
/// only when the control plane does not have that one (an apply of KubeVirt's VM CRD, 0.7 MB of
/// schema, takes seconds, and every lease seeds).
pub const DIGEST: &str = "test.harvester-cloud.io/foreign-crd-digest";

/// The CRDs of `dir` (a control plane's `foreign/`, or [`dir`]), by name, each with its [`DIGEST`].
pub fn crds(dir: &Path) -> Vec<Value> {
    let crds = dir.join("crds");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&crds)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (scripts/control-plane.sh up writes it)",
                crds.display()
            )
        })
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no CRDs in {}", crds.display());
    files
        .iter()
        .map(|f| {
            let text = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            let mut crd: Value =
                serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            let digest: String = Sha256::digest(&text)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            crd["metadata"]["annotations"][DIGEST] = Value::from(digest);
            crd
        })
        .collect()
}

/// A fixture of one of Rancher's kinds, held to Rancher's Go type of that kind: `tools/rancher-crds
/// object` decodes it strictly (an unknown or misspelt field panics here) and returns it as the Go
/// type encodes it. Token and the `cluster.cattle.io` kinds are schemaless as Rancher installs them
/// (norman's catch-all CRDs), so the API server would keep any field a test made up.
pub fn rancher(obj: Value) -> Value {
    tool("rancher-crds", &["object".into()], Some(&obj.to_string()))
}

fn run(args: &[String]) -> Value {
    tool("foreign-crds", args, None)
}

/// Runs `bin/<name>` of the foreign kinds with `args` (and `stdin`), and reads the JSON it prints;
/// a failure panics with what the tool said.
fn tool(name: &str, args: &[String], stdin: Option<&str>) -> Value {
    use std::{io::Write, process::Stdio};
    let path = dir().join("bin").join(name);
    let mut child = Command::new(&path)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    // Dropped at the end of the statement: the tool sees the end of its input.
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.unwrap_or_default().as_bytes())
        .expect("writes the tool's input");
    let out = child.wait_with_output().expect("the tool ends");
    assert!(
        out.status.success(),
        "{name} {args:?} refused {}: {}",
        stdin.unwrap_or("its arguments"),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{name} prints JSON: {e}"))
}

/// A VirtualMachineInstance as KubeVirt writes it, `status` included: by default Running in
/// `default`, with no networks.
#[derive(Clone, Debug)]
pub struct Vmi {
    args: Vec<String>,
}

pub fn vmi(name: &str) -> Vmi {
    Vmi {
        args: vec!["vmi".into(), "-name".into(), name.into()],
    }
}

impl Vmi {
    fn arg(mut self, flag: &str, value: impl Into<String>) -> Self {
        self.args.push(flag.into());
        self.args.push(value.into());
        self
    }

    pub fn namespace(self, ns: &str) -> Self {
        self.arg("-namespace", ns)
    }

    pub fn label(self, key: &str, value: &str) -> Self {
        self.arg("-label", format!("{key}={value}"))
    }

    pub fn phase(self, phase: &str) -> Self {
        self.arg("-phase", phase)
    }

    /// A migration under way (`status.migrationState`, not completed).
    pub fn migrating(mut self) -> Self {
        self.args.push("-migrating".into());
        self
    }

    /// The pod network, and its interface with `ips` (the first is KubeVirt's `ipAddress`) and
    /// guest interface `guest`, when either is given.
    pub fn pod_network(self, ips: &[&str], guest: Option<&str>) -> Self {
        self.network(None, "default", ips, guest)
    }

    /// A Multus network `nad` (`ns/name`, as written) named `name`, and its interface.
    pub fn multus(self, name: &str, nad: &str, ips: &[&str], guest: Option<&str>) -> Self {
        self.network(Some(nad), name, ips, guest)
    }

    fn network(self, nad: Option<&str>, name: &str, ips: &[&str], guest: Option<&str>) -> Self {
        let mut spec = name.to_string();
        if let Some(nad) = nad {
            spec = format!("{spec}={nad}");
        }
        if !ips.is_empty() {
            spec = format!("{spec}:{}", ips.join(","));
        }
        if let Some(guest) = guest {
            spec = format!("{spec}@{guest}");
        }
        self.arg("-interface", spec)
    }

    pub fn build(&self) -> Value {
        run(&self.args)
    }
}

/// A running VirtualMachine as KubeVirt's API has it, in `default` by default.
#[derive(Clone, Debug)]
pub struct Vm {
    args: Vec<String>,
}

pub fn vm(name: &str) -> Vm {
    Vm {
        args: vec!["vm".into(), "-name".into(), name.into()],
    }
}

impl Vm {
    fn arg(mut self, flag: &str, value: impl Into<String>) -> Self {
        self.args.push(flag.into());
        self.args.push(value.into());
        self
    }

    pub fn namespace(self, ns: &str) -> Self {
        self.arg("-namespace", ns)
    }

    pub fn label(self, key: &str, value: &str) -> Self {
        self.arg("-label", format!("{key}={value}"))
    }

    pub fn annotation(self, key: &str, value: &str) -> Self {
        self.arg("-annotation", format!("{key}={value}"))
    }

    pub fn build(&self) -> Value {
        run(&self.args)
    }
}

/// A NetworkAttachmentDefinition (a Harvester VM network), in `default` by default.
#[derive(Clone, Debug)]
pub struct Nad {
    args: Vec<String>,
}

pub fn nad(name: &str) -> Nad {
    Nad {
        args: vec!["nad".into(), "-name".into(), name.into()],
    }
}

impl Nad {
    fn arg(mut self, flag: &str, value: impl Into<String>) -> Self {
        self.args.push(flag.into());
        self.args.push(value.into());
        self
    }

    pub fn namespace(self, ns: &str) -> Self {
        self.arg("-namespace", ns)
    }

    pub fn label(self, key: &str, value: &str) -> Self {
        self.arg("-label", format!("{key}={value}"))
    }

    /// `spec.config`, the CNI configuration as written (not necessarily JSON).
    pub fn config(self, config: &str) -> Self {
        self.arg("-config", config)
    }

    pub fn build(&self) -> Value {
        run(&self.args)
    }
}
