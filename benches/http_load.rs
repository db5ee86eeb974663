//! HTTP load against one release-built server on the embedded backend, in one run:
//! `GET /healthz`, `GET /v1/harvester/kubeconfig` for an existing account, and `POST` for new
//! accounts. Run with `cargo bench --bench http_load` (options after `--`: `--seconds N`,
//! `--connections N`, `--rounds N`: `/healthz` and GET alternate in N phases of seconds/N each; `--only healthz|get|post`:
//! that scenario alone, to profile it; `HTTP_LOAD_SECONDS` in the environment sets the seconds too, as the test
//! script's short smoke run does; `HTTP_LOAD_SERVER` runs another build's binary instead). Prints requests/s, latency percentiles and the server's CPU per request for each scenario, and the
//! ratios the manual reports (docs/src/performance.md); it fails only when a request fails, never on a figure.
//!
//! The load generator is a minimal hyper HTTP/1.1 client (one task per keep-alive connection) so
//! that it takes as little of the machine's CPU as possible from the server.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

#[path = "support/usage.rs"]
#[allow(dead_code)]
mod usage;

use http_body_util::{BodyExt, Full};
use hyper::{Request, body::Bytes, header::HeaderValue};
use tokio::net::TcpStream;

struct Server {
    child: Child,
    addr: String,
    token: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server() -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    // Another build's binary, to compare two builds on the same machine in the same hour.
    let binary = std::env::var("HTTP_LOAD_SERVER")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_harvester-cloud").to_string());
    let mut child = Command::new(binary)
        .arg("--data-dir")
        .arg(dir.path())
        .args([
            "--log-format",
            "json",
            "--log",
            "info",
            "serve",
            "--http",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn server");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let addr = loop {
        let line = lines.next().expect("server exited").expect("read log");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if v["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("listening"))
        {
            break v["address"].as_str().expect("address").to_string();
        }
    };
    // Keep draining the log so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    let token = std::fs::read_to_string(dir.path().join("admin-token"))
        .expect("admin token")
        .trim()
        .to_string();
    Server {
        child,
        addr,
        token,
        _dir: dir,
    }
}

#[derive(Clone, Copy)]
enum Scenario {
    Healthz,
    GetKubeconfig,
    PostNewAccounts,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Healthz => "GET /healthz",
            Scenario::GetKubeconfig => "GET /v1/harvester/kubeconfig (existing account)",
            Scenario::PostNewAccounts => "POST /v1/harvester/kubeconfig (new account each)",
        }
    }

    fn request(self, auth: &HeaderValue, seq: u64, worker: usize) -> Request<Full<Bytes>> {
        match self {
            Scenario::Healthz => Request::get("/healthz")
                .header("host", "bench")
                .body(Full::default()),
            Scenario::GetKubeconfig => {
                Request::get("/v1/harvester/kubeconfig?namespace=bench&serviceAccountName=existing")
                    .header("host", "bench")
                    .header("authorization", auth.clone())
                    .body(Full::default())
            }
            Scenario::PostNewAccounts => {
                let body =
                    format!(r#"{{"namespace":"bench","serviceAccountName":"sa-{worker}-{seq}"}}"#);
                Request::post("/v1/harvester/kubeconfig")
                    .header("host", "bench")
                    .header("authorization", auth.clone())
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body)))
            }
        }
        .expect("request")
    }
}

struct Outcome {
    requests: u64,
    errors: u64,
    elapsed: Duration,
    latencies_us: Vec<u64>,
}

async fn run(
    addr: &str,
    token: &str,
    scenario: Scenario,
    connections: usize,
    duration: Duration,
) -> Outcome {
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for worker in 0..connections {
        let (addr, token, errors) = (addr.to_string(), token.to_string(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let stream = TcpStream::connect(&addr).await.expect("connect");
            stream.set_nodelay(true).ok();
            let io = hyper_util::rt::TokioIo::new(stream);
            let (mut send, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .expect("handshake");
            tokio::spawn(conn);
            // Made once: the load generator shares the server's cores, so its own work per
            // request is kept small.
            let auth = HeaderValue::from_str(&format!("Bearer {token}")).expect("header value");
            let mut latencies = Vec::with_capacity(100_000);
            let mut seq = 0u64;
            while Instant::now() < deadline {
                let req = scenario.request(&auth, seq, worker);
                seq += 1;
                let t = Instant::now();
                let failure = match send.send_request(req).await {
                    Ok(resp) => {
                        let status = resp.status();
                        match resp.into_body().collect().await {
                            Ok(_) if status.is_success() => None,
                            Ok(body) => Some(format!(
                                "{status}: {}",
                                String::from_utf8_lossy(&body.to_bytes())
                            )),
                            Err(e) => Some(format!("{status}, body: {e}")),
                        }
                    }
                    Err(e) => Some(format!("request: {e}")),
                };
                latencies.push(t.elapsed().as_micros() as u64);
                if let Some(failure) = failure
                    && errors.fetch_add(1, Ordering::Relaxed) < 3
                {
                    eprintln!("{}: {failure}", scenario.name());
                }
            }
            latencies
        }));
    }
    let mut latencies_us = Vec::new();
    for t in tasks {
        latencies_us.extend(t.await.expect("worker"));
    }
    latencies_us.sort_unstable();
    Outcome {
        requests: latencies_us.len() as u64,
        errors: errors.load(Ordering::Relaxed),
        elapsed: start.elapsed(),
        latencies_us,
    }
}

/// What one scenario did, over one phase or several.
#[derive(Default)]
struct Phase {
    requests: u64,
    elapsed: Duration,
    /// The server's CPU time, in seconds.
    cpu: f64,
    latencies_us: Vec<u64>,
}

impl Phase {
    fn add(&mut self, other: Phase) {
        self.requests += other.requests;
        self.elapsed += other.elapsed;
        self.cpu += other.cpu;
        self.latencies_us.extend(other.latencies_us);
        self.latencies_us.sort_unstable();
    }

    fn print(&self, scenario: Scenario) {
        println!(
            "{:<52} {:>9.0} req/s   p50 {:>7.2} ms   p99 {:>7.2} ms   server CPU {:>6.1} us/req",
            scenario.name(),
            self.requests as f64 / self.elapsed.as_secs_f64(),
            pct(&self.latencies_us, 0.50),
            pct(&self.latencies_us, 0.99),
            self.cpu * 1e6 / self.requests.max(1) as f64,
        );
    }
}

/// Runs one phase of `scenario`, which must not fail, and takes the server's CPU over it: what a
/// shared machine's neighbours change least.
async fn measure(
    server: &Server,
    scenario: Scenario,
    connections: usize,
    duration: Duration,
) -> Phase {
    let before = usage::usage(server.child.id()).cpu;
    let o = run(&server.addr, &server.token, scenario, connections, duration).await;
    let cpu = usage::usage(server.child.id()).cpu - before;
    assert_eq!(o.errors, 0, "{} had errors", scenario.name());
    Phase {
        requests: o.requests,
        elapsed: o.elapsed,
        cpu,
        latencies_us: o.latencies_us,
    }
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs it briefly as a smoke test.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let seconds = std::env::var("HTTP_LOAD_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let seconds = if smoke { 1 } else { arg("--seconds", seconds) };
    let connections = arg("--connections", 32) as usize;
    let rounds = arg("--rounds", if smoke { 1 } else { 5 }).max(1);
    let only = std::env::args()
        .skip_while(|a| a != "--only")
        .nth(1)
        .map(|s| match s.as_str() {
            "healthz" => Scenario::Healthz,
            "get" => Scenario::GetKubeconfig,
            "post" => Scenario::PostNewAccounts,
            other => panic!("--only takes healthz, get or post, not {other}"),
        });
    let server = start_server();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        // The account GET reads.
        let o = run(&server.addr, &server.token, Scenario::PostNewAccounts, 1, Duration::from_millis(1)).await;
        assert_eq!(o.errors, 0, "warm-up POST failed");
        let stream = TcpStream::connect(&server.addr).await.expect("connect");
        let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.expect("handshake");
        tokio::spawn(conn);
        let req = Request::post("/v1/harvester/kubeconfig")
            .header("host", "bench")
            .header("authorization", format!("Bearer {}", server.token))
            .body(Full::new(Bytes::from(r#"{"namespace":"bench","serviceAccountName":"existing"}"#)))
            .expect("request");
        assert!(send.send_request(req).await.expect("POST").status().is_success());

        println!("harvester-cloud HTTP load: {connections} connections, {seconds} s per scenario, plain HTTP, embedded store (durability full), load generator on 1 thread of the same machine");
        // `/healthz` and GET alternate in `rounds` short phases, so a neighbour's load that comes
        // or goes during the run weighs on both alike; the ratio reported is the median of the
        // rounds' (each round is one `/healthz` phase and the GET phase right after it).
        // `--only healthz|get|post`: that scenario alone, for `seconds` (to profile one path).
        if let Some(only) = only {
            let phase = measure(&server, only, connections, Duration::from_secs(seconds)).await;
            phase.print(only);
            return;
        }
        let round = Duration::from_secs_f64(seconds as f64 / rounds as f64);
        let mut totals = [Phase::default(), Phase::default()];
        let mut ratios = Vec::new();
        for _ in 0..rounds {
            let mut rate = [0.0; 2];
            for (i, scenario) in [Scenario::Healthz, Scenario::GetKubeconfig].into_iter().enumerate() {
                let phase = measure(&server, scenario, connections, round).await;
                rate[i] = phase.requests as f64 / phase.elapsed.as_secs_f64();
                totals[i].add(phase);
            }
            ratios.push(rate[1] / rate[0]);
        }
        totals[0].print(Scenario::Healthz);
        totals[1].print(Scenario::GetKubeconfig);
        let post = measure(&server, Scenario::PostNewAccounts, connections, Duration::from_secs(seconds)).await;
        post.print(Scenario::PostNewAccounts);
        ratios.sort_by(f64::total_cmp);
        println!(
            "GET kubeconfig / healthz = {:.0}% (target >= 75%; median of {} adjacent rounds, {:.0}% to {:.0}%);  POST new accounts = {:.0}/s (target >= 2,000/s; Harvester: <= 1/s per request)",
            100.0 * ratios[ratios.len() / 2],
            ratios.len(),
            100.0 * ratios[0],
            100.0 * ratios[ratios.len() - 1],
            post.requests as f64 / post.elapsed.as_secs_f64(),
        );
    });
}
