//! The `fake-apiserver` command: serve until killed and publish an admin kubeconfig atomically
//! (temp file then rename) once the server is ready.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::info;

use crate::server::{FakeApiServer, FakeError};

/// Command-line flags of `fake-apiserver`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "fake-apiserver",
    about = "A small Kubernetes API server fake for tests"
)]
pub struct Args {
    /// Address to listen on; port 0 picks a free port (the kubeconfig carries the real one).
    #[arg(long, env = "FAKE_APISERVER_LISTEN", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Where to write the admin kubeconfig once the server is ready.
    #[arg(long, env = "FAKE_APISERVER_KUBECONFIG")]
    pub write_kubeconfig: Option<PathBuf>,
    /// Delay before the token controller fills service-account token Secrets, in milliseconds.
    #[arg(long, env = "FAKE_APISERVER_TOKEN_DELAY_MS", default_value_t = 50)]
    pub token_delay_ms: u64,
    /// Never fill service-account token Secrets.
    #[arg(long, env = "FAKE_APISERVER_NEVER_FILL_TOKENS")]
    pub never_fill_tokens: bool,
    /// Use this admin token instead of a random one.
    #[arg(long, env = "FAKE_APISERVER_ADMIN_TOKEN")]
    pub admin_token: Option<String>,
}

fn write_atomically(path: &Path, contents: &str) -> Result<(), FakeError> {
    let err = |source| FakeError::WriteKubeconfig {
        path: path.display().to_string(),
        source,
    };
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "kubeconfig".into());
    let tmp = path.with_file_name(format!(".{file_name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, contents).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

async fn terminated() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Runs the server until SIGINT or SIGTERM.
pub async fn run(args: Args) -> Result<(), FakeError> {
    let mut builder = FakeApiServer::builder()
        .listen(args.listen)
        .token_delay(Duration::from_millis(args.token_delay_ms));
    if args.never_fill_tokens {
        builder = builder.never_fill_tokens();
    }
    if let Some(t) = args.admin_token {
        builder = builder.admin_token(t);
    }
    let handle = builder.start().await?;
    if let Some(path) = &args.write_kubeconfig {
        write_atomically(path, &handle.kubeconfig_yaml())?;
        info!(path = %path.display(), url = %handle.base_url(), "wrote admin kubeconfig");
    }
    terminated().await;
    info!("shutting down");
    handle.shutdown().await;
    Ok(())
}
