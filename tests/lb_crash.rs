//! Crash safety of allocation: the real binary is killed with SIGKILL again and again while 500
//! LoadBalancers are created, deleted and re-created through the HTTP API. After the last restart the
//! reconcilers must converge to a state where no address is held twice, none is leaked, every live
//! LoadBalancer has exactly the address its pool holds for it, and exactly the live ones (all of
//! them VM load balancers) have a Service and an EndpointSlice.

mod support;

use std::{
    collections::{BTreeSet, HashMap},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use serde_json::{Value, json};
use support::{
    binary::BIN,
    lb::{LBS, POOLS},
};

const LOAD_BALANCERS: usize = 500;
const WORKERS: usize = 16;
/// Operations the workers finish in each life of the service before it may be killed again (of
/// about 720 in all).
const PROGRESS_PER_LIFE: usize = 4;
/// A guard against a hang, not a performance bound.
const PATIENCE: Duration = Duration::from_secs(120);

struct Service {
    data_dir: PathBuf,
    port: u16,
    child: Option<Child>,
    starts: usize,
}

impl Service {
    fn spawn(&mut self) {
        self.starts += 1;
        let log = std::fs::File::create(self.data_dir.join(format!("run-{}.log", self.starts)))
            .expect("log file");
        let child = Command::new(BIN)
            .args([
                "--data-dir",
                &self.data_dir.display().to_string(),
                "--log",
                "info",
                "serve",
                "--http",
                "--listen",
                &format!("127.0.0.1:{}", self.port),
                // Not the default 9090: another test's service (or one left behind) may hold it.
                "--metrics-listen",
                "127.0.0.1:0",
                "--vip",
                "127.0.0.1",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starts the binary");
        self.child = Some(child);
    }

    /// SIGKILL: no shutdown path runs.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("kills");
            child.wait().expect("reaps");
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("binds")
        .local_addr()
        .expect("addr")
        .port()
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    /// One request; `None` when the service is down (connection refused or reset).
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Option<(u16, Value)> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .timeout(Duration::from_secs(10));
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.ok()?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.ok()?;
        // `/readyz` answers plain text.
        Some((
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    }

    /// Retries while the service is down or failing (5xx) until one of `done` comes back.
    async fn until(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        done: &[u16],
    ) -> (u16, Value) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some((status, value)) = self.send(method.clone(), path, body).await {
                if done.contains(&status) {
                    return (status, value);
                }
                assert!(
                    status >= 500 || status == 409,
                    "{method} {path}: {status} {value}"
                );
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{method} {path} never succeeded"
            );
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }
}

fn lb(i: usize) -> Value {
    json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1",
        "kind": "LoadBalancer",
        "metadata": {"name": format!("lb{i}"), "namespace": "default"},
        "spec": {"ipam": "pool", "listeners": [{"name": "http", "port": 80, "protocol": "TCP", "backendPort": 8080}]}
    })
}

/// Creates `lb<i>`; an earlier attempt whose answer was lost in a crash may have created it already,
/// and an earlier incarnation may still be terminating (then wait for it to go).
async fn create(client: &Client, i: usize) {
    loop {
        let (status, _) = client
            .until(reqwest::Method::POST, LBS, Some(&lb(i)), &[201, 409])
            .await;
        if status == 201 {
            return;
        }
        let (status, current) = client
            .until(
                reqwest::Method::GET,
                &format!("{LBS}/default/lb{i}"),
                None,
                &[200, 404],
            )
            .await;
        if status == 200 && current["metadata"]["deletionTimestamp"].is_null() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

async fn delete(client: &Client, i: usize) {
    client
        .until(
            reqwest::Method::DELETE,
            &format!("{LBS}/default/lb{i}"),
            None,
            &[200, 404],
        )
        .await;
}

async fn wait_ready(client: &Client) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while client
        .send(reqwest::Method::GET, "/readyz", None)
        .await
        .is_none()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the service did not come up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn read_token(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("admin-token"))
        .expect("admin token")
        .trim()
        .to_string()
}

/// The final state, or why it is not final yet.
fn check(pools: &Value, lbs: &Value, expected: &BTreeSet<String>) -> Result<(), String> {
    let lbs: HashMap<String, &Value> = lbs["data"]
        .as_array()
        .ok_or("no lb data")?
        .iter()
        .map(|l| (l["id"].as_str().unwrap_or_default().to_string(), l))
        .collect();
    let live: BTreeSet<String> = lbs.keys().cloned().collect();
    if &live != expected {
        return Err(format!(
            "{} load balancers, expected {}",
            live.len(),
            expected.len()
        ));
    }
    let mut reported: HashMap<(String, String), String> = HashMap::new();
    for (id, lb) in &lbs {
        if !lb["metadata"]["deletionTimestamp"].is_null() {
            return Err(format!("{id} is still terminating"));
        }
        // A VM load balancer without backends is not Ready (upstream's "no running backend
        // servers") once its address and Service are in place: its allocation is final.
        let ready = lb["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter().any(|c| {
                c["type"] == "Ready" && (c["status"] == "True" || c["reason"] == "NoBackendServers")
            })
        });
        let address = &lb["status"]["allocatedAddress"];
        let (Some(pool), Some(ip)) = (address["ipPool"].as_str(), address["ip"].as_str()) else {
            return Err(format!("{id} has no address yet"));
        };
        if !ready {
            return Err(format!("{id} is not ready"));
        }
        if let Some(other) = reported.insert((pool.into(), ip.into()), id.clone()) {
            panic!("{ip} of {pool} is reported by both {other} and {id}");
        }
    }
    let mut held = 0;
    for p in pools["data"].as_array().ok_or("no pool data")? {
        let name = p["id"].as_str().unwrap_or_default();
        let status = &p["status"];
        let allocated = status["allocated"].as_object().cloned().unwrap_or_default();
        for (ip, holder) in &allocated {
            held += 1;
            match reported.get(&(name.to_string(), ip.clone())) {
                Some(id) if Some(id.as_str()) == holder.as_str() => {}
                Some(id) => panic!("{ip} of {name} is held for {holder} but reported by {id}"),
                None if lbs.contains_key(holder.as_str().unwrap_or_default()) => {
                    return Err(format!("{holder} holds {ip} but does not report it yet"));
                }
                None => return Err(format!("{ip} of {name} is held by {holder}, which is gone")),
            }
        }
        let total = status["total"].as_i64().unwrap_or_default();
        if status["available"].as_i64() != Some(total - allocated.len() as i64) {
            return Err(format!("pool {name} counters are stale: {status}"));
        }
    }
    if held != reported.len() {
        return Err(format!(
            "{} addresses reported, {held} held",
            reported.len()
        ));
    }
    Ok(())
}

/// The Services and EndpointSlices of the VM load balancers: exactly one of each per live load
/// balancer (none left of a deleted one), the Service asking for its address.
fn check_services(services: &Value, slices: &Value, lbs: &Value) -> Result<(), String> {
    let ids = |list: &Value| -> BTreeSet<String> {
        list["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| o["id"].as_str().map(str::to_string))
            .collect()
    };
    let live = ids(lbs);
    for (what, list) in [("Services", services), ("EndpointSlices", slices)] {
        let have = ids(list);
        if have != live {
            let extra: Vec<_> = have.difference(&live).collect();
            let missing: Vec<_> = live.difference(&have).collect();
            return Err(format!("{what}: extra {extra:?}, missing {missing:?}"));
        }
    }
    for svc in services["data"].as_array().into_iter().flatten() {
        let id = svc["id"].as_str().unwrap_or_default();
        let lb = lbs["data"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["id"] == id)
            .ok_or_else(|| format!("no load balancer {id}"))?;
        if svc["spec"]["loadBalancerIP"] != lb["status"]["allocatedAddress"]["ip"] {
            return Err(format!("the Service {id} asks for another address"));
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_during_churn_loses_and_duplicates_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let mut service = Service {
        data_dir: dir.path().to_path_buf(),
        port,
        child: None,
        starts: 0,
    };
    service.spawn();
    let base = format!("http://127.0.0.1:{port}");
    let probe = Client {
        http: reqwest::Client::new(),
        base: base.clone(),
        token: String::new(),
    };
    wait_ready(&probe).await;
    let client = Arc::new(Client {
        http: reqwest::Client::new(),
        base,
        token: read_token(dir.path()),
    });
    let pool = json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1",
        "kind": "IPPool",
        "metadata": {"name": "pool1"},
        "spec": {"ranges": [{"subnet": "10.0.0.0/22"}],
                 "selector": {"scope": [{"project": "*", "namespace": "*", "guestCluster": "*"}]}}
    });
    client
        .until(reqwest::Method::POST, POOLS, Some(&pool), &[201])
        .await;

    // Every third load balancer is deleted again, and every ninth then created once more (it must get
    // its old address back from the history, if nobody took it meanwhile).
    let expected: BTreeSet<String> = (0..LOAD_BALANCERS)
        .filter(|i| i % 3 != 0 || i % 9 == 0)
        .map(|i| format!("default/lb{i}"))
        .collect();
    let working = Arc::new(AtomicBool::new(true));
    // Operations the workers have finished: the killer lets each life of the service finish a few,
    // so that the churn ends. A kill at a fixed pace alone could starve it: on a busy machine, a
    // debug build's start and its reconcilers' first pass can take longer than the pace, and
    // then a deletion (which waits for its reconcile) is interrupted again and again (one run made
    // 900 restarts in six minutes, where others finish in one).
    let finished = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let client = client.clone();
        let finished = finished.clone();
        workers.push(tokio::spawn(async move {
            for i in (w..LOAD_BALANCERS).step_by(WORKERS) {
                create(&client, i).await;
                finished.fetch_add(1, Ordering::SeqCst);
                if i % 3 == 0 {
                    delete(&client, i).await;
                    finished.fetch_add(1, Ordering::SeqCst);
                    if i % 9 == 0 {
                        create(&client, i).await;
                        finished.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }));
    }
    let killer = {
        let working = working.clone();
        let client = client.clone();
        tokio::spawn(async move {
            let mut kills = 0;
            while working.load(Ordering::SeqCst) || kills < 5 {
                let before = finished.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(rand::random_range(50..250))).await;
                while working.load(Ordering::SeqCst)
                    && finished.load(Ordering::SeqCst) < before + PROGRESS_PER_LIFE
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                service.kill();
                kills += 1;
                service.spawn();
                wait_ready(&client).await;
            }
            (service, kills)
        })
    };
    for w in workers {
        w.await.expect("worker");
    }
    working.store(false, Ordering::SeqCst);
    let (mut service, kills) = killer.await.expect("killer");
    // One more crash once the last request is in, so the final state is rebuilt from disk.
    service.kill();
    service.spawn();
    wait_ready(&client).await;

    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut last;
    loop {
        let (_, pools) = client
            .until(reqwest::Method::GET, POOLS, None, &[200])
            .await;
        let (_, lbs) = client.until(reqwest::Method::GET, LBS, None, &[200]).await;
        let (_, services) = client
            .until(reqwest::Method::GET, "/v1/harvester/services", None, &[200])
            .await;
        let (_, slices) = client
            .until(
                reqwest::Method::GET,
                "/v1/harvester/discovery.k8s.io.endpointslices",
                None,
                &[200],
            )
            .await;
        match check(&pools, &lbs, &expected).and_then(|()| check_services(&services, &slices, &lbs))
        {
            Ok(()) => break,
            Err(why) => last = why,
        }
        if tokio::time::Instant::now() >= deadline {
            // What the last life of the service logged: the temporary directory goes with the
            // test, so a failure in CI keeps only what is printed.
            let log = service.data_dir.join(format!("run-{}.log", service.starts));
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!(
                "the last {} lines of {}:\n{}",
                lines.len().min(80),
                log.display(),
                lines[lines.len().saturating_sub(80)..].join("\n")
            );
            panic!("no convergence after {kills} kills: {last}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(kills >= 5, "the service was killed {kills} times");
    eprintln!(
        "converged after {kills} SIGKILLs ({} starts)",
        service.starts
    );
}
