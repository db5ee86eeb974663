//! The manual's commands: every code block of `README.md` and `docs/src` whose info string is `sh`
//! is run, and every other block says what it is.
//!
//! A page's `sh` blocks run in order in one `bash` (`set -euo pipefail`), as a reader types them
//! into one terminal: in a temporary directory, with this build's `harvester-cloud` first on `PATH`
//! and a fresh embedded `serve` started for the page on loopback, its data directory at `./data`.
//! The pages say `127.0.0.1:8443` and `127.0.0.1:9090` (the defaults a reader has); the test puts
//! the server's own addresses there. `sh,needs-cluster` (a Harvester or guest cluster) and
//! `sh,slow` (a build, a bench, the whole suite, or a server that does not end) are not run; they,
//! `yaml`, `json` and `text` are the only other info strings a block may have, and a non-`sh` block
//! may not hold a line that starts like a command, so a command cannot slip out of the test by its
//! label.

use std::{
    fs::File,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_harvester-cloud");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Run by this test.
const RUN: &str = "sh";
/// Commands this test does not run: the only escapes.
const NOT_RUN: [&str; 2] = ["sh,needs-cluster", "sh,slow"];
/// Blocks that are not commands.
const NOT_COMMANDS: [&str; 3] = ["yaml", "json", "text"];
/// How a line of a command starts; none of them may begin a line of a block that is not run as one.
const COMMAND_WORDS: [&str; 13] = [
    "curl",
    "kubectl",
    "helm",
    "harvester-cloud",
    "cargo",
    "scripts/",
    "git",
    "mdbook",
    "sqlite3",
    "openssl",
    "go",
    "jq",
    "$",
];
/// The longest a page's commands may take (they wait for reconcilers, which take milliseconds).
const PAGE_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, PartialEq)]
struct Block {
    /// 1-based line of the opening fence.
    line: usize,
    info: String,
    body: String,
}

/// The fenced code blocks of a markdown text (``` or ~~~, possibly indented in a list item; the
/// indentation of the fence is taken off the block's lines).
fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(String, usize, Block)> = None;
    for (i, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let fence: String = trimmed
            .chars()
            .take_while(|&c| c == '`' || c == '~')
            .collect();
        let is_fence = fence.len() >= 3 && fence.chars().all(|c| c == fence.as_bytes()[0] as char);
        match &mut open {
            None if is_fence => {
                let block = Block {
                    line: i + 1,
                    info: trimmed[fence.len()..].trim().to_string(),
                    body: String::new(),
                };
                open = Some((fence, indent, block));
            }
            None => {}
            Some((opening, _, _))
                if is_fence
                    && fence.starts_with(opening.as_str())
                    && trimmed[fence.len()..].trim().is_empty() =>
            {
                let (_, _, block) = open.take().expect("a block is open");
                out.push(block);
            }
            Some((_, indent, block)) => {
                let leading = line.len() - line.trim_start().len();
                block.body.push_str(&line[leading.min(*indent)..]);
                block.body.push('\n');
            }
        }
    }
    assert!(open.is_none(), "a code block is never closed");
    out
}

/// README.md and every page of docs/src, as paths relative to the repository.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("reads {}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let root = Path::new(ROOT);
    let mut out = vec![root.join("README.md")];
    walk(&root.join("docs/src"), &mut out);
    out.into_iter()
        .map(|p| p.strip_prefix(root).expect("under the root").to_path_buf())
        .collect()
}

fn read(page: &Path) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(page))
        .unwrap_or_else(|e| panic!("reads {}: {e}", page.display()))
}

#[test]
fn the_fence_parser_reads_info_strings_and_bodies() {
    let md = "# T\n\n```sh\necho a\n```\n\n- item:\n\n  ```sh,slow\n  cargo bench\n  ```\n\n\
              ````text\n```sh\nnot a fence here\n```\n````\n";
    assert_eq!(
        blocks(md),
        [
            Block {
                line: 3,
                info: "sh".into(),
                body: "echo a\n".into()
            },
            Block {
                line: 9,
                info: "sh,slow".into(),
                body: "cargo bench\n".into()
            },
            Block {
                line: 13,
                info: "text".into(),
                body: "```sh\nnot a fence here\n```\n".into()
            },
        ]
    );
}

#[test]
fn every_code_block_says_what_it_is() {
    let mut problems = Vec::new();
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for page in pages() {
        for block in blocks(&read(&page)) {
            let at = format!("{}:{}", page.display(), block.line);
            *counts.entry(block.info.clone()).or_default() += 1;
            if block.info == RUN {
                continue;
            }
            if !NOT_RUN.contains(&block.info.as_str())
                && !NOT_COMMANDS.contains(&block.info.as_str())
            {
                problems.push(format!(
                    "{at}: the info string {:?} is none of {RUN:?} (run by this test), {NOT_RUN:?} \
                     (commands not run) or {NOT_COMMANDS:?}",
                    block.info
                ));
            }
            if NOT_RUN.contains(&block.info.as_str()) && block.body.trim().is_empty() {
                problems.push(format!("{at}: an empty {:?} block", block.info));
            }
            if NOT_COMMANDS.contains(&block.info.as_str()) {
                for line in block.body.lines() {
                    let first = line.split_whitespace().next().unwrap_or("");
                    if COMMAND_WORDS
                        .iter()
                        .any(|w| first == *w || (w.ends_with('/') && first.starts_with(w)))
                    {
                        problems.push(format!(
                            "{at}: {line:?} is a command in a {:?} block: fence it `sh` (run by \
                             this test) or {NOT_RUN:?}",
                            block.info
                        ));
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The pages hold blocks of each kind: a parser that found none would pass the above.
    for info in [RUN, NOT_RUN[0], NOT_RUN[1], "yaml", "text"] {
        assert!(
            counts.get(info).is_some_and(|&n| n > 0),
            "no {info:?} block in {counts:?}"
        );
    }
    assert!(counts[RUN] >= 10, "{counts:?}");
}

#[test]
fn the_readme_is_a_door() {
    let readme = read(Path::new("README.md"));
    let lines = readme.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines: at most 200, the rest belongs in the manual (docs/src)"
    );
}

/// A `serve` on a fresh embedded store in `dir/data`, on free loopback ports.
struct Server {
    child: Child,
    api: String,
    metrics: String,
}

impl Server {
    fn start(dir: &Path) -> Server {
        let mut command = Command::new(BIN);
        clear_our_environment(&mut command);
        let mut child = command
            .current_dir(dir)
            .args(["--data-dir", "data", "--log-format", "json", "serve"])
            .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawns harvester-cloud serve");
        let (tx, lines) = mpsc::channel();
        let stderr = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut server = Server {
            child,
            api: String::new(),
            metrics: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.api.is_empty() || server.metrics.is_empty() {
            let line = lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("the server says where it listens");
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            let message = v["message"].as_str().unwrap_or("");
            let address = v["address"].as_str().unwrap_or("").to_string();
            if message.starts_with("listening") {
                server.api = address;
            } else if message == "serving metrics" {
                server.metrics = address;
            }
        }
        server
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

/// A page's environment must not leak into the commands (a `HARVESTER_CLOUD_*` flag of the machine
/// running the tests would change what they do).
fn clear_our_environment(command: &mut Command) {
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("HARVESTER_CLOUD_") {
            command.env_remove(name);
        }
    }
}

/// Runs a page's `sh` blocks; the error is what failed, with the end of the output.
fn run_page(page: &Path, runnable: &[Block]) -> Result<(), String> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let server = Server::start(dir.path());
    let mut script = String::from("set -euo pipefail\n");
    for block in runnable {
        let body = block
            .body
            .replace("127.0.0.1:8443", &server.api)
            .replace("127.0.0.1:9090", &server.metrics);
        script.push_str(&format!(
            "printf '\\n>>> %s\\n' '{}:{}' >&2\n{body}\n",
            page.display(),
            block.line
        ));
    }
    let bin_dir = Path::new(BIN).parent().expect("the binary's directory");
    let path = std::env::join_paths(std::iter::once(bin_dir.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .expect("a PATH");
    let log_path = dir.path().join("commands.log");
    let log = File::create(&log_path).expect("creates the log");
    let mut command = Command::new("bash");
    clear_our_environment(&mut command);
    use std::os::unix::process::CommandExt;
    let mut child = command
        .args(["-c", &script])
        .current_dir(dir.path())
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("the log again"))
        .stderr(log)
        // Its own process group, so that a timeout ends the commands it started as well.
        .process_group(0)
        .spawn()
        .expect("spawns bash");
    let deadline = Instant::now() + PAGE_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waits for bash") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(server);
    if status.is_some_and(|s| s.success()) {
        return Ok(());
    }
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    let failing = output
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(">>> "))
        .unwrap_or("the first block");
    // The end of the output, each line cut short (kubeconfigs and cloud-init are long).
    let mut tail: Vec<String> = output
        .lines()
        .rev()
        .take(30)
        .map(|l| l.chars().take(200).collect())
        .collect();
    tail.reverse();
    Err(format!(
        "{}: the block at {failing} {}; the end of the output:\n{}",
        page.display(),
        match status {
            Some(s) => format!("failed ({s})"),
            None => format!("did not finish within {PAGE_TIMEOUT:?}"),
        },
        tail.join("\n")
    ))
}

#[test]
fn every_sh_block_runs() {
    let mut failures = Vec::new();
    let mut ran = 0;
    for page in pages() {
        let runnable: Vec<Block> = blocks(&read(&page))
            .into_iter()
            .filter(|b| b.info == RUN)
            .collect();
        if runnable.is_empty() {
            continue;
        }
        ran += runnable.len();
        if let Err(failure) = run_page(&page, &runnable) {
            failures.push(failure);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(ran >= 10, "only {ran} blocks ran");
}
