//! The built binary, run as an operator runs it: [`Server`] is a `serve` process with JSON logs on
//! stderr, read line by line, stopped with SIGTERM (and killed if a test fails first).

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex, mpsc},
    time::Duration,
};

use serde_json::Value;

/// The `harvester-cloud` binary cargo built for this test run.
pub const BIN: &str = env!("CARGO_BIN_EXE_harvester-cloud");

/// A `serve` process with JSON logs, both listeners on free ports.
pub struct Server {
    child: Child,
    /// `https://127.0.0.1:<port>` (or `http://` with `--http`).
    pub url: String,
    pub addr: String,
    pub metrics_url: String,
    lines: mpsc::Receiver<String>,
    /// Every stderr line so far, including those already taken from `lines`.
    all: Arc<Mutex<Vec<String>>>,
}

/// A log line as JSON (the test fails on any other line).
pub fn json(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"))
}

/// A log line's message.
pub fn message(v: &Value) -> &str {
    v["message"].as_str().unwrap_or_default()
}

impl Server {
    /// `serve` on the embedded store in `data_dir` (or as `extra` says), logging JSON at `log`,
    /// with `--vip 10.0.0.1`.
    pub fn start(data_dir: &Path, log: &str, extra: &[&str]) -> Server {
        let mut cmd = Command::new(BIN);
        cmd.arg("--data-dir")
            .arg(data_dir)
            .args(["--log-format", "json", "--log", log, "serve"])
            .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
            .args(["--vip", "10.0.0.1"])
            .args(extra);
        Self::spawn(cmd)
    }

    /// Runs `cmd` (the binary's `serve` with JSON logs and both listeners on free ports) and waits
    /// for the lines that say where it listens.
    pub fn spawn(mut cmd: Command) -> Server {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn harvester-cloud");
        let (tx, lines) = mpsc::channel();
        let all = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take();
        let keep = all.clone();
        std::thread::spawn(move || {
            for line in stderr
                .into_iter()
                .flat_map(|s| BufReader::new(s).lines().map_while(Result::ok))
            {
                keep.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        // Owned by `Server` from here on, so a failed wait below still kills the process.
        let mut server = Server {
            child,
            url: String::new(),
            addr: String::new(),
            metrics_url: String::new(),
            lines,
            all,
        };
        while server.url.is_empty() || server.metrics_url.is_empty() {
            let v = server.next_line("the listening lines");
            if message(&v).starts_with("listening") {
                server.url = v["url"].as_str().expect("url").to_string();
                server.addr = v["address"].as_str().expect("address").to_string();
            } else if message(&v) == "serving metrics" {
                server.metrics_url = v["url"].as_str().expect("url").to_string();
            }
        }
        server
    }

    /// The next log line not yet taken (the test fails after a minute without one).
    pub fn next_line(&self, what: &str) -> Value {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("the server did not log {what}"));
        json(&line)
    }

    /// Waits for a log line that `pred` accepts.
    pub fn wait_for(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        loop {
            let v = self.next_line(what);
            if pred(&v) {
                return v;
            }
        }
    }

    pub fn sigterm(&self) {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
    }

    /// Waits for the process to exit; returns its status and every log line.
    pub fn wait(mut self) -> (ExitStatus, Vec<String>) {
        let status = self.child.wait().unwrap();
        // The reader thread ends at EOF; drain what it still forwards.
        while self.lines.recv_timeout(Duration::from_secs(10)).is_ok() {}
        let lines = self.all.lock().unwrap().clone();
        (status, lines)
    }

    /// SIGTERM, and a clean exit; returns every log line.
    pub fn stop(self) -> Vec<String> {
        self.sigterm();
        let (status, lines) = self.wait();
        assert!(status.success(), "exit after SIGTERM: {status}");
        lines
    }
}

impl Drop for Server {
    /// A failed test must not leave a server running.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// An HTTPS client that trusts the CA `serve` generated in `data_dir`.
pub fn client(data_dir: &Path) -> reqwest::Client {
    let ca = std::fs::read(data_dir.join("tls/ca.crt")).unwrap();
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .build()
        .unwrap()
}
