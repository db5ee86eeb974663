//! A controller measured as a process of its own, ours and upstream's alike, for the Kubernetes
//! benches that put them side by side (`kube_lb_converge --upstream-controller`,
//! `kube_guest_converge`): the peers' command lines (`scripts/interop/peers.json`, the list the
//! interop harness runs them from), the process's CPU time and peak RSS (`/proc/<pid>`), an
//! audited identity of its own on a control plane, Harvester's own CRDs, the harness's guest seed
//! and kube-vip stand-in (`scripts/interop/kube.py`, run as it is), and the figures each side
//! reports and their ratios.

use std::{
    collections::{BTreeMap, HashMap},
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use serde_json::{Value, json};

use crate::support::{
    control_plane::{Audited, ControlPlane},
    eventually, kube_env,
};
pub use crate::usage::{Usage, usage};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The value after `name` on the bench's command line, if given.
pub fn flag(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|a| a == name)?;
    let value = args.get(at + 1).cloned();
    assert!(value.is_some(), "{name} needs a value");
    value
}

/// Whether more than one control plane was given: then each side runs on one of its own, and
/// the first keeps its lease until the second is done (a second lease of the same one would wait
/// for it, and then reset what the first left).
pub fn control_planes() -> usize {
    std::env::var(crate::support::control_plane::ENV)
        .unwrap_or_default()
        .split(':')
        .filter(|s| !s.is_empty())
        .count()
}

/// The command of peer `name` of `scripts/interop/peers.json`, its `{key}`s filled from `values`.
pub fn command(name: &str, values: &[(&str, &str)]) -> Command {
    let path = root().join("scripts/interop/peers.json");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reads {}: {e}", path.display()));
    let peers: Value = serde_json::from_str(&text).expect("peers.json is JSON");
    let spec = &peers[name];
    assert!(spec.is_object(), "no peer {name} in {}", path.display());
    let fill = |v: &Value| {
        let mut s = v.as_str().expect("a string").to_string();
        for (k, v) in values {
            s = s.replace(&format!("{{{k}}}"), v);
        }
        assert!(!s.contains('{'), "peer {name}: no value for a key of {s}");
        s
    };
    let argv: Vec<String> = spec["argv"]
        .as_array()
        .expect("argv")
        .iter()
        .map(fill)
        .collect();
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    for (k, v) in spec["env"].as_object().expect("env") {
        cmd.env(k, fill(v));
    }
    cmd
}

/// A process this bench started, its output in `<dir>/<name>.log`; stopped by its own pid
/// (SIGTERM, then killed), and killed if the bench ends first.
pub struct Peer {
    pub name: String,
    pub log: PathBuf,
    child: Child,
}

impl Peer {
    pub fn start(name: &str, mut cmd: Command, dir: &Path) -> Peer {
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log).expect("creates the log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("the log"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("starts {name} ({cmd:?}): {e}"));
        Peer {
            name: name.into(),
            log,
            child,
        }
    }

    pub fn usage(&self) -> Usage {
        usage(self.child.id())
    }

    /// Fails the bench, with the end of its log, if the process has exited.
    pub fn assert_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!("{} exited ({status}):\n{}", self.name, tail.join("\n"));
        }
    }

    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Lines of its log that report an error (`level=error`, `ERROR`, klog's `E1203`, …).
    pub fn error_lines(&self) -> usize {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        log.lines()
            .filter(|l| {
                l.contains("level=error")
                    || l.contains("ERROR")
                    || (l.starts_with('E') && l[1..].starts_with(|c: char| c.is_ascii_digit()))
            })
            .count()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `creates` (each says whether its object was created), 32 at a time; every one must be.
pub async fn create_all(what: &str, creates: impl Iterator<Item = impl Future<Output = bool>>) {
    let created: Vec<bool> = futures::stream::iter(creates)
        .buffer_unordered(32)
        .collect()
        .await;
    let failed = created.iter().filter(|c| !**c).count();
    assert_eq!(
        failed,
        0,
        "{failed} of {} {what}s not created",
        created.len()
    );
}

/// A ServiceAccount `ns/name` bound to `cluster-admin`, and a kubeconfig file of its token in
/// `dir`, for a peer whose chart's RBAC is not part of this repository: it runs with every
/// permission, as the harness runs it with the admin's, but under a name the audit log records
/// (the admin's requests are not audited). Returns the user and the kubeconfig's path.
pub async fn admin_account(
    cp: &ControlPlane,
    ns: &str,
    name: &str,
    dir: &Path,
) -> (String, PathBuf) {
    let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}});
    kube_env::apply(&cp.admin, &sa, "serviceaccounts").await;
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("bench-{ns}-{name}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]
    });
    kube_env::apply(&cp.admin, &binding, "clusterrolebindings").await;
    let token = cp.service_account_token(ns, name).await;
    let path = dir.join(format!("{ns}-{name}.kubeconfig"));
    std::fs::write(&path, cp.kubeconfig_for_token(&token, ns)).expect("writes a kubeconfig");
    (format!("system:serviceaccount:{ns}:{name}"), path)
}

/// Harvester's own LoadBalancer and IPPool CRDs, as load-balancer-harvester's `crds/` holds them
/// (the only ones upstream's full-object status updates work on, docs/src/interop.md), in place
/// of ours; the next lease's seed puts ours back.
pub async fn harvester_crds(cp: &ControlPlane, dir: &Path) {
    let mut names = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reads {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("reads a CRD");
        for doc in yaml_serde::Deserializer::from_str(&text) {
            let crd: Value = serde::Deserialize::deserialize(doc).expect("a CRD");
            if crd["kind"] != "CustomResourceDefinition" {
                continue;
            }
            kube_env::apply(&cp.admin, &crd, "customresourcedefinitions").await;
            names.push(crd["metadata"]["name"].as_str().expect("named").to_string());
        }
    }
    assert_eq!(
        names.len(),
        2,
        "the IPPool and LoadBalancer CRDs in {}",
        dir.display()
    );
    let api: Api<CustomResourceDefinition> = Api::all(cp.admin.clone());
    for name in names {
        eventually(&format!("{name} established"), async || {
            let crd = api.get_opt(&name).await.ok()??;
            let established = crd
                .status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            established.then_some(())
        })
        .await;
    }
}

fn kube_py(args: &[&str]) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg(root().join("scripts/interop/kube.py")).args(args);
    cmd
}

/// The harness's guest cluster seed (`seed_guest`: namespaces, one Ready node).
pub fn seed_guest(cp: &ControlPlane) {
    let dir = cp.dir.display().to_string();
    let out = kube_py(&["seed-guest", &dir])
        .output()
        .expect("runs kube.py");
    assert!(
        out.status.success(),
        "kube.py seed-guest: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The harness's kube-vip stand-in on `cp` (`guest` or `harvester` side), as the admin.
pub fn kube_vip(cp: &ControlPlane, side: &str, dir: &Path) -> Peer {
    let cpdir = cp.dir.display().to_string();
    Peer::start(
        &format!("kube-vip-{side}"),
        kube_py(&["kube-vip", &cpdir, side]),
        dir,
    )
}

/// The API requests of some users: in all, by verb and resource, and by response status.
#[derive(Debug, Default)]
pub struct Requests {
    pub total: usize,
    pub by_kind: BTreeMap<String, usize>,
    pub by_code: BTreeMap<u16, usize>,
}

impl Requests {
    /// Adds `other`'s, its kinds named with `on` (the cluster they were made on).
    pub fn add(&mut self, on: &str, other: Requests) {
        self.total += other.total;
        for (kind, n) in other.by_kind {
            *self.by_kind.entry(format!("{on}: {kind}")).or_default() += n;
        }
        for (code, n) in other.by_code {
            *self.by_code.entry(code).or_default() += n;
        }
    }
}

pub fn requests(audit: &[Audited], users: &[&str]) -> Requests {
    let mut out = Requests::default();
    for r in audit.iter().filter(|r| users.contains(&r.user.as_str())) {
        out.total += 1;
        *out.by_kind
            .entry(format!("{} {}", r.verb, r.resource))
            .or_default() += 1;
        *out.by_code.entry(r.code).or_default() += 1;
    }
    out
}

/// Addresses held by more than one object (a bug wherever it happens), and how many objects hold
/// them.
pub fn duplicates<'a>(addresses: impl IntoIterator<Item = &'a str>) -> (usize, usize) {
    let mut holders: HashMap<&str, usize> = HashMap::new();
    for a in addresses {
        *holders.entry(a).or_default() += 1;
    }
    let shared: Vec<usize> = holders.into_values().filter(|n| *n > 1).collect();
    (shared.len(), shared.iter().sum())
}

/// Polls `count` (every 250 ms) until it reaches `n` or `limit` has passed since `started`,
/// failing if `peer` exits; returns the last count, the time taken and the peer's usage then.
pub async fn converge(
    peer: &mut Peer,
    n: usize,
    limit: Duration,
    started: Instant,
    mut count: impl AsyncFnMut() -> usize,
) -> (usize, Duration, Usage) {
    let mut last_said = Instant::now();
    loop {
        let done = count().await;
        let took = started.elapsed();
        let used = peer.usage();
        if done >= n || took >= limit {
            return (done, took, used);
        }
        peer.assert_alive();
        if last_said.elapsed() >= Duration::from_secs(30) {
            eprintln!(
                "  {}: {done}/{n} after {:.0} s",
                peer.name,
                took.as_secs_f64()
            );
            last_said = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What one side did.
#[derive(Debug)]
pub struct Figures {
    pub who: String,
    /// How many objects it had to serve, and how many it served.
    pub n: usize,
    pub done: usize,
    /// Until the last was served, or until the limit ran out.
    pub took: Duration,
    pub usage: Usage,
    pub requests: Requests,
    /// Addresses held by more than one object, and how many objects hold them.
    pub duplicates: (usize, usize),
    pub error_lines: usize,
}

impl Figures {
    /// Prints the side's figures; `unit` names one object ("LoadBalancer", "Service").
    pub fn print(&self, unit: &str) {
        let n = self.n as f64;
        let outcome = if self.done == self.n {
            format!("all {} in {:.2} s", self.n, self.took.as_secs_f64())
        } else {
            format!(
                "{} of {} after {:.0} s (the limit)",
                self.done,
                self.n,
                self.took.as_secs_f64()
            )
        };
        println!("  {}: {outcome}", self.who);
        let served = self.done.max(1) as f64;
        println!(
            "    CPU {:.2} s ({:.2} ms per {unit} served), peak RSS {:.0} MiB, {} log lines reporting an error",
            self.usage.cpu,
            1000.0 * self.usage.cpu / served,
            self.usage.peak_rss_mib,
            self.error_lines
        );
        println!(
            "    API requests: {} ({:.2} per {unit}); by status: {}",
            self.requests.total,
            self.requests.total as f64 / n,
            self.requests
                .by_code
                .iter()
                .map(|(c, k)| format!("{c}: {k}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for (what, k) in &self.requests.by_kind {
            println!("      {what:<32} {k:>6} ({:.2} per {unit})", *k as f64 / n);
        }
        println!(
            "    addresses held by more than one {unit}: {} ({} {unit}s)",
            self.duplicates.0, self.duplicates.1
        );
    }
}

/// The two sides in a table, with upstream's figure over ours.
pub fn print_ratios(ours: &Figures, theirs: &Figures, unit: &str) {
    let per = |f: &Figures, v: f64| v / f.n as f64;
    // Time to all served; of a side that did not finish, only that it is longer than the limit
    // is known (upstream's allocator slows as a pool fills, so its rate so far would flatter it).
    let to_all = |f: &Figures| {
        let t = f.took.as_secs_f64();
        (t, if f.done == f.n { "" } else { "> " })
    };
    let (to, tt) = (to_all(ours), to_all(theirs));
    let (ro, rt) = (
        per(ours, ours.requests.total as f64),
        per(theirs, theirs.requests.total as f64),
    );
    let throttled = |f: &Figures| f.requests.by_code.get(&429).copied().unwrap_or(0);
    println!("  | figure | ours | upstream's | upstream's / ours |");
    println!("  |---|---|---|---|");
    println!(
        "  | {unit}s served | {}/{} | {}/{} | |",
        ours.done, ours.n, theirs.done, theirs.n
    );
    // The ratio is a bound when only upstream's time is.
    let bound = if to.1.is_empty() { tt.1 } else { "" };
    println!(
        "  | time to all served | {}{:.2} s | {}{:.1} s | {bound}{:.0}× |",
        to.1,
        to.0,
        tt.1,
        tt.0,
        tt.0 / to.0
    );
    println!(
        "  | served per second | {:.1} | {:.2} | {:.4}× |",
        ours.done as f64 / ours.took.as_secs_f64(),
        theirs.done as f64 / theirs.took.as_secs_f64(),
        (theirs.done as f64 / theirs.took.as_secs_f64())
            / (ours.done as f64 / ours.took.as_secs_f64())
    );
    println!(
        "  | CPU | {:.2} s | {:.2} s | {:.2}× |",
        ours.usage.cpu,
        theirs.usage.cpu,
        theirs.usage.cpu / ours.usage.cpu
    );
    println!(
        "  | CPU per {unit} served | {:.2} ms | {:.2} ms | {:.1}× |",
        1000.0 * ours.usage.cpu / ours.done.max(1) as f64,
        1000.0 * theirs.usage.cpu / theirs.done.max(1) as f64,
        (theirs.usage.cpu / theirs.done.max(1) as f64) / (ours.usage.cpu / ours.done.max(1) as f64)
    );
    println!(
        "  | peak RSS | {:.0} MiB | {:.0} MiB | {:.2}× |",
        ours.usage.peak_rss_mib,
        theirs.usage.peak_rss_mib,
        theirs.usage.peak_rss_mib / ours.usage.peak_rss_mib
    );
    println!(
        "  | API requests per {unit} | {ro:.2} | {rt:.2} | {:.2}× |",
        rt / ro
    );
    let (so, st) = (
        ours.requests.total as f64 / ours.done.max(1) as f64,
        theirs.requests.total as f64 / theirs.done.max(1) as f64,
    );
    println!(
        "  | API requests per {unit} served | {so:.2} | {st:.2} | {:.2}× |",
        st / so
    );
    println!(
        "  | answered 429 | {} | {} | |",
        throttled(ours),
        throttled(theirs)
    );
    println!(
        "  | addresses held twice or more | {} | {} | |",
        ours.duplicates.0, theirs.duplicates.0
    );
    println!(
        "  | log lines reporting an error | {} | {} | |",
        ours.error_lines, theirs.error_lines
    );
}
