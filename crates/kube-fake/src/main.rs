//! `fake-apiserver`: parse the flags, then run the fake until killed.

#![forbid(unsafe_code)]

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match kube_fake::cli::run(kube_fake::cli::Args::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "fake-apiserver failed");
            std::process::ExitCode::FAILURE
        }
    }
}
