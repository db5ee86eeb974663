//! The binary as an operator runs it: `serve` over HTTPS with its generated CA, the first admin
//! token, `token create|list|revoke`, the data-directory lock, a clean stop on SIGTERM, and the
//! command lines the interop harness and the benches run it with.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_harvester-cloud");

struct Server {
    child: Child,
    url: String,
    lines: mpsc::Receiver<String>,
}

impl Server {
    /// Starts `serve` on a free port and waits for its "listening" log line.
    fn start(data_dir: &Path, extra: &[&str]) -> Server {
        let mut child = Command::new(BIN)
            .args(["--data-dir"])
            .arg(data_dir)
            .args([
                "--log-format",
                "json",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
                "--vip",
                "10.0.0.1",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn harvester-cloud");
        let (tx, lines) = mpsc::channel();
        let stderr = child.stderr.take();
        std::thread::spawn(move || {
            for line in stderr
                .into_iter()
                .flat_map(|s| BufReader::new(s).lines().map_while(Result::ok))
            {
                let _ = tx.send(line);
            }
        });
        // Owned by `Server` from here on, so a failed wait below still kills the process.
        let mut server = Server {
            child,
            url: String::new(),
            lines,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = server
                .lines
                .recv_timeout(left)
                .expect("server logs that it listens");
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"));
            if v["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("listening"))
            {
                server.url = v["url"].as_str().expect("url field").to_string();
                return server;
            }
        }
    }

    fn stop(mut self) -> Vec<String> {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "exit after SIGTERM: {status}");
        // Everything it wrote: the reader ends at the pipe's end, which may come after the exit.
        let mut lines = Vec::new();
        loop {
            match self.lines.recv_timeout(Duration::from_secs(30)) {
                Ok(line) => lines.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => return lines,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("the log pipe stayed open after the exit: {lines:?}")
                }
            }
        }
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

fn client(data_dir: &Path) -> reqwest::Client {
    let ca = std::fs::read(data_dir.join("tls/ca.crt")).unwrap();
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .build()
        .unwrap()
}

fn token_cmd(data_dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("--data-dir")
        .arg(data_dir)
        .arg("token")
        .args(args)
        .output()
        .unwrap()
}

#[tokio::test]
async fn serve_over_https_with_tokens_lock_and_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data, &[]);
    assert!(
        server.url.starts_with("https://127.0.0.1:"),
        "{}",
        server.url
    );

    let admin = std::fs::read_to_string(data.join("admin-token"))
        .unwrap()
        .trim()
        .to_string();
    let http = client(&data);
    let post = |token: String| {
        let http = http.clone();
        let url = format!("{}/v1/harvester/kubeconfig", server.url);
        async move {
            http.post(url)
                .bearer_auth(token)
                .body(r#"{"namespace":"default","serviceAccountName":"gc4"}"#)
                .send()
                .await
                .unwrap()
        }
    };
    let r = post(admin.clone()).await;
    assert_eq!(r.status(), 200);
    let kubeconfig: String = r.json().await.unwrap();
    assert!(kubeconfig.contains("server: https://10.0.0.1:6443\n"));

    // A second server cannot open the same data directory.
    let out = Command::new(BIN)
        .arg("--data-dir")
        .arg(&data)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("in use by another harvester-cloud process")
    );

    // token create / list / revoke while the server runs.
    let out = token_cmd(&data, &["create", "--ttl", "1h", "--description", "ci"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let created = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let name = created.split(':').next().unwrap().to_string();
    assert!(name.starts_with("token-") && name.len() == 11, "{created}");
    assert_eq!(post(created.clone()).await.status(), 200);
    let list = String::from_utf8(token_cmd(&data, &["list"]).stdout).unwrap();
    assert!(
        list.contains(&name) && list.contains("active") && list.contains("ci"),
        "{list}"
    );
    assert!(
        !list.contains(created.split(':').nth(1).unwrap()),
        "list never shows secrets"
    );
    let out = token_cmd(&data, &["revoke", &name]);
    assert!(out.status.success());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(post(created.clone()).await.status(), 401);
    let list = String::from_utf8(token_cmd(&data, &["list"]).stdout).unwrap();
    assert!(
        list.lines()
            .any(|l| l.contains(&name) && l.contains("revoked")),
        "{list}"
    );
    let out = token_cmd(&data, &["revoke", "token-nope0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("token token-nope0 not found"));

    let logs = server.stop();
    assert!(logs.iter().any(|l| l.contains("\"stopped\"")), "{logs:?}");
    // Secrets never reach the logs.
    for l in &logs {
        assert!(
            !l.contains(admin.split(':').nth(1).unwrap())
                && !l.contains(created.split(':').nth(1).unwrap())
        );
    }

    // A restarted process serves the same account and accepts the same admin token.
    let server = Server::start(&data, &[]);
    let http = client(&data);
    let r = http
        .get(format!(
            "{}/v1/harvester/kubeconfig?namespace=default&serviceAccountName=gc4",
            server.url
        ))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<String>().await.unwrap(), kubeconfig);
    server.stop();
}

#[tokio::test]
async fn plain_http_mode() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--http"]);
    assert!(server.url.starts_with("http://127.0.0.1:"));
    let r = reqwest::get(format!("{}/healthz", server.url))
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "ok");
    server.stop();
}

/// `token create --ttl` refuses what cannot make a usable token (zero), or a date (a hundred
/// years and more), with a message and exit status 2-ish instead of a panic.
#[test]
fn token_ttls_out_of_range_are_refused_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // A first token command creates the database.
    assert!(token_cmd(&data, &["list"]).status.success());
    for (ttl, says) in [
        ("0s", "a token must live longer than zero"),
        ("3000000d", "at most 36500 days"),
    ] {
        let out = token_cmd(&data, &["create", "--ttl", ttl]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--ttl {ttl} was accepted");
        assert_ne!(
            out.status.code(),
            Some(101),
            "--ttl {ttl} panicked: {stderr}"
        );
        assert!(stderr.contains(says), "--ttl {ttl}: {stderr}");
    }
    let list = String::from_utf8(token_cmd(&data, &["list"]).stdout).unwrap();
    assert_eq!(list.lines().count(), 1, "no token was created: {list}");
}

/// The database and its WAL files are private (they hold the signing key and every token); and
/// a database that is missing or empty in a data directory used before is a refused start that
/// says what to do, not a silent new store, until `--reinitialize` asks for one.
#[test]
fn the_database_is_private_and_a_lost_one_is_not_replaced_silently() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let serve = |extra: &[&str]| {
        Command::new(BIN)
            .arg("--data-dir")
            .arg(&data)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mode = |name: &str| {
        std::fs::metadata(data.join(name))
            .map(|m| m.permissions().mode() & 0o777)
            .ok()
    };
    // A first start, stopped once it listens.
    let mut child = serve(&[]);
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    while !lines
        .next()
        .expect("the server logs")
        .unwrap()
        .contains("listening")
    {}
    for name in [
        "harvester-cloud.db",
        "harvester-cloud.db-wal",
        "harvester-cloud.db-shm",
    ] {
        if let Some(m) = mode(name) {
            assert_eq!(m, 0o600, "{name} is {m:o}");
        }
    }
    assert_eq!(mode("harvester-cloud.db"), Some(0o600));
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(child.wait().unwrap().success());
    let token = std::fs::read_to_string(data.join("admin-token")).unwrap();

    for lose in ["truncate", "remove"] {
        match lose {
            "truncate" => std::fs::write(data.join("harvester-cloud.db"), b"").unwrap(),
            _ => std::fs::remove_file(data.join("harvester-cloud.db")).unwrap(),
        }
        for suffix in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(data.join(format!("harvester-cloud.db{suffix}")));
        }
        let out = serve(&[]).wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{lose}: the server started on a lost database"
        );
        assert!(stderr.contains("--reinitialize"), "{lose}: {stderr}");
        assert!(
            stderr.contains(if lose == "truncate" {
                "is empty"
            } else {
                "is missing"
            }),
            "{lose}: {stderr}"
        );
        assert_eq!(
            std::fs::read_to_string(data.join("admin-token")).unwrap(),
            token,
            "{lose}: the admin token was overwritten"
        );
        // Token commands refuse it too.
        let out = token_cmd(&data, &["list"]);
        assert!(!out.status.success());
    }
    // Asked for, a new store: a new admin token.
    let mut child = serve(&["--reinitialize"]);
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    while !lines
        .next()
        .expect("the server logs")
        .unwrap()
        .contains("listening")
    {}
    assert_ne!(
        std::fs::read_to_string(data.join("admin-token")).unwrap(),
        token
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// A server whose port is taken fails before it creates anything in a fresh data directory.
#[test]
fn a_taken_port_fails_before_anything_is_written() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = Command::new(BIN)
        .arg("--data-dir")
        .arg(&data)
        .args([
            "serve",
            "--listen",
            &addr,
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot listen on"));
    for f in ["admin-token", "harvester-cloud.db", "tls"] {
        assert!(!data.join(f).exists(), "{f} was created");
    }
}

/// The manual's configuration page, `docs/src/configuration.md`, is what `config-reference` prints
/// from the clap definitions that `--help` is made of; and each command's section names exactly
/// the flags and environment variables its `--help` names.
#[test]
fn the_configuration_page_is_what_the_binary_prints() {
    const PAGE: &str = "docs/src/configuration.md";
    const REGENERATE: &str = "cargo run -- config-reference > docs/src/configuration.md";
    let out = Command::new(BIN).arg("config-reference").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8(out.stdout).unwrap();
    let page = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(PAGE)).unwrap();
    if page != printed {
        let first = page
            .lines()
            .zip(printed.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(page.lines().count().min(printed.lines().count()));
        panic!(
            "{PAGE} is not what `harvester-cloud config-reference` prints (first difference at line \
             {}: page {:?}, binary {:?}); regenerate it with `{REGENERATE}`",
            first + 1,
            page.lines().nth(first),
            printed.lines().nth(first)
        );
    }

    let section = |title: &str| -> String {
        let heading = format!("\n## {title}\n");
        let start = page
            .find(&heading)
            .unwrap_or_else(|| panic!("{PAGE} has no section {title}"));
        let rest = &page[start + heading.len()..];
        rest[..rest.find("\n## ").unwrap_or(rest.len())].to_string()
    };
    let every_command = section("Every command");
    // "- **`--flag`, `-s`**, env `ENV`, default …: …" → the long flags and environment variables.
    let named = |text: &str| -> std::collections::BTreeSet<String> {
        let mut out = std::collections::BTreeSet::new();
        for item in text.lines().filter_map(|l| l.strip_prefix("- **")) {
            let (names, rest) = item.split_once("**").expect("an item's names end in **");
            out.extend(
                names
                    .split(", ")
                    .map(|n| n.trim_matches('`').to_string())
                    .filter(|n| n.starts_with("--")),
            );
            if let Some(env) = rest.strip_prefix(", env `") {
                out.insert(env.split('`').next().unwrap().to_string());
            }
        }
        out
    };
    for command in [
        "serve",
        "token create",
        "token list",
        "token revoke",
        "crds",
        "kubeconfig generate",
        "kubeconfig list",
        "kubeconfig rotate",
        "kubeconfig revoke",
        "ccm",
    ] {
        let out = Command::new(BIN)
            .args(command.split(' '))
            .arg("--help")
            .output()
            .unwrap();
        assert!(out.status.success(), "{command} --help");
        let help = String::from_utf8(out.stdout).unwrap();
        let mut in_help = std::collections::BTreeSet::new();
        for line in help.lines() {
            let line = line.trim_start();
            let flag = line.strip_prefix("-").and_then(|l| {
                let l = l.split_once(", -").map_or(l, |(_, long)| long);
                l.strip_prefix('-')
            });
            if let Some(flag) = flag {
                let name: String = flag
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                if name != "help" && name != "version" && !name.is_empty() {
                    in_help.insert(format!("--{name}"));
                }
            }
            // `[env: NAME=]` on a line of its own (long help) or at the end of one (short).
            for (_, env) in line
                .match_indices("[env: ")
                .map(|(i, _)| line.split_at(i + 6))
            {
                in_help.insert(env.split('=').next().unwrap().to_string());
            }
        }
        let on_page: std::collections::BTreeSet<String> =
            named(&section(&format!("`harvester-cloud {command}`")))
                .union(&named(&every_command))
                .cloned()
                .collect();
        assert_eq!(
            in_help, on_page,
            "`harvester-cloud {command} --help` and its section of {PAGE} name different flags; \
             regenerate the page with `{REGENERATE}`"
        );
    }
}

/// The command lines the interop harness and the benches run this binary with
/// (`scripts/interop/peers.json`) are ones it accepts: a renamed flag fails here, not in a run
/// that needs upstream's checkouts.
#[test]
fn the_peers_command_lines_parse() {
    use clap::Parser;
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/interop/peers.json"
    ))
    .expect("reads peers.json");
    let peers: Value = serde_json::from_str(&text).expect("JSON");
    for name in ["ours-serve", "ours-ccm"] {
        let argv: Vec<String> = peers[name]["argv"]
            .as_array()
            .unwrap_or_else(|| panic!("{name} has an argv"))
            .iter()
            .map(|a| {
                let a = a.as_str().expect("a string");
                match a {
                    "{ours}" => "harvester-cloud".to_string(),
                    _ => a.replace("{port}", "0").replace("{metrics_port}", "0"),
                }
            })
            .map(|a| a.replace(['{', '}'], ""))
            .collect();
        if let Err(e) = harvester_cloud::config::Cli::try_parse_from(&argv) {
            panic!("{name}: {argv:?} is refused: {e}");
        }
    }
}
