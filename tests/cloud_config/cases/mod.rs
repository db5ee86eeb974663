//! The cases `suite!` runs on every backend (see main.rs), one module per topic.

use crate::*;

mod accounts;
mod http;
mod kubeconfig;
mod rotation;

pub use accounts::*;
pub use http::*;
pub use kubeconfig::*;
pub use rotation::*;

pub fn token_of(kubeconfig: &str) -> String {
    yaml(kubeconfig)["users"][0]["user"]["token"]
        .as_str()
        .expect("a token")
        .to_string()
}

/// How many token Secrets of the ServiceAccount `sa` there are in `ns`.
async fn token_secrets<B: Backend>(b: &B, ns: &str, sa: &str) -> usize {
    b.store()
        .list(
            &Kind::of::<Secret>(),
            Some(ns),
            &LabelSelector::everything(),
        )
        .await
        .unwrap()
        .items
        .iter()
        .filter(|s| s["metadata"]["annotations"]["kubernetes.io/service-account.name"] == sa)
        .count()
}

async fn rotate<B: Backend>(b: &B, body: Value) -> Reply {
    let t = b.admin_token();
    b.call(
        Method::POST,
        "/v1/harvester/kubeconfig/rotate",
        Some(&t),
        body.to_string(),
    )
    .await
}

/// The sweeper, as every replica runs it, for as long as the guard lives.
fn sweeper<B: Backend>(b: &B) -> tokio_util::sync::DropGuard {
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(b.cloud_config().run_sweeper(stop.clone()));
    stop.drop_guard()
}
