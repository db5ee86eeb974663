//! A small Kubernetes API server fake for tests: real API semantics (discovery, canonical Status
//! errors, resourceVersion and optimistic concurrency, patches and server-side apply, status
//! subresource, watch with replay, finalizers, CRDs, the token controller, TokenRequest, TokenReview,
//! RBAC evaluated from stored objects, and admission webhooks called over HTTPS) over HTTPS with
//! bearer-token authentication.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kube_fake::FakeError> {
//! let fake = kube_fake::FakeApiServer::builder().start().await?;
//! let kubeconfig = fake.kubeconfig_yaml();
//! # drop(kubeconfig);
//! fake.shutdown().await;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

pub mod admission;
pub mod api;
pub mod auth;
pub mod cli;
pub mod clock;
pub mod controllers;
pub mod discovery;
pub mod ops;
pub mod patch;
pub mod proto;
pub mod rbac;
pub mod registry;
pub mod selector;
pub mod server;
pub mod state;
pub mod status;
pub mod store;
pub mod table;
pub mod tls;
pub mod watch;
pub mod webhook_client;
pub mod webhooks;

pub use server::{FakeApiServer, FakeApiServerBuilder, FakeError, FakeHandle, kubeconfig};

/// The strings of a JSON array (other items skipped); empty when `v` is absent or not an array.
pub(crate) fn strings(v: Option<&serde_json::Value>) -> Vec<String> {
    v.and_then(serde_json::Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(serde_json::Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}
pub use state::RequestRecord;
