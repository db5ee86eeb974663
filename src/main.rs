//! The `harvester-cloud` binary: parses the command line and runs it ([`harvester_cloud::app::run`]).

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    harvester_cloud::app::run(harvester_cloud::config::Cli::parse()).await
}
