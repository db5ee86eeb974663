use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    harvester_cloud::app::run(harvester_cloud::config::Cli::parse()).await
}
