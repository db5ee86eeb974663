//! Rancher's side of the aggregation tunnel in the tests: `tools/rancher-peer`, a small Go program
//! built on `github.com/rancher/remotedialer`'s own server (scripts/go-tool.sh builds and caches
//! it). It accepts the service's tunnel at `/v3/connect` with the token it was given, and proxies
//! `/proxy/...` through the tunnel with Rancher's `Impersonate-*` headers (from the test's
//! `X-Test-User`, `X-Test-Groups` and `X-Test-Extra-*`).

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::OnceLock,
    time::Duration,
};

pub struct Peer {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub addr: String,
    pub token: String,
}

fn binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/go-tool.sh"))
            .arg("rancher-peer")
            .stderr(Stdio::inherit())
            .output()
            .expect("runs scripts/go-tool.sh (Go must be installed)");
        assert!(
            out.status.success(),
            "scripts/go-tool.sh rancher-peer failed"
        );
        PathBuf::from(String::from_utf8(out.stdout).expect("a path").trim())
    })
    .clone()
}

impl Peer {
    /// Starts the peer on a free loopback port, expecting `token` from the tunnel client.
    pub fn start(token: &str) -> Peer {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut peer = Peer {
            child: None,
            dir,
            addr: String::new(),
            token: token.to_string(),
        };
        peer.spawn("127.0.0.1:0");
        peer
    }

    fn spawn(&mut self, listen: &str) {
        let addr_file = self.dir.path().join("addr");
        let _ = std::fs::remove_file(&addr_file);
        let child = Command::new(binary())
            .args(["--listen", listen, "--token", &self.token, "--dir"])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starts rancher-peer");
        self.child = Some(child);
        for _ in 0..500 {
            if let Ok(a) = std::fs::read_to_string(&addr_file)
                && !a.is_empty()
            {
                self.addr = a;
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("rancher-peer did not start");
    }

    /// Kills the peer (as a crash would: no goodbye on the tunnel).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills it and starts it again on the same address with the same certificate.
    pub fn restart(&mut self) {
        self.kill();
        let addr = self.addr.clone();
        // The port is free again once the old process is gone; retry briefly if the kernel
        // still holds it.
        for _ in 0..50 {
            self.spawn(&addr);
            std::thread::sleep(Duration::from_millis(100));
            if self
                .child
                .as_mut()
                .is_some_and(|c| c.try_wait().ok().flatten().is_none())
            {
                return;
            }
        }
        panic!("rancher-peer did not restart on {addr}");
    }

    /// The URL Rancher would write into the APIService's Secret.
    pub fn url(&self) -> String {
        format!("https://{}/v3/connect", self.addr)
    }

    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.dir.path().join("ca.crt")).expect("the peer's CA")
    }

    /// An HTTPS client that trusts the peer.
    pub fn client(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&self.ca_pem()).expect("PEM"))
            .build()
            .expect("a client")
    }

    /// `https://<peer>/proxy<path>`: `path` on the service, through the tunnel.
    pub fn proxy_url(&self, path: &str) -> String {
        format!("https://{}/proxy{path}", self.addr)
    }

    /// Whether the service holds a session with the peer now.
    pub async fn has_session(&self) -> bool {
        match self
            .client()
            .get(format!("https://{}/sessions", self.addr))
            .send()
            .await
        {
            Ok(r) => r.text().await.unwrap_or_default() == "1",
            Err(_) => false,
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.kill();
    }
}
