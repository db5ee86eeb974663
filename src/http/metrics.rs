//! What the API records into [`crate::metrics`]: every request by method, route template and
//! status (a middleware), and the outcome of each cloud-config request by operation and reason.

use std::time::Instant;

use axum::{
    extract::{MatchedPath, Request},
    middleware::Next,
    response::Response,
};

use super::ApiError;
use crate::{
    kubeconfig::{CloudConfigError, OutputFormat},
    metrics,
};

/// Counts and times a request. Added with `Router::layer`, so it runs after routing and sees the
/// matched route template (`/v1/harvester/kubeconfig`), never the raw path a caller made up.
pub async fn track(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string());
    let started = Instant::now();
    let response = next.run(request).await;
    metrics::observe_http(
        method.as_str(),
        route.as_deref(),
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

/// Which cloud-config call a request made.
#[derive(Clone, Copy, Debug)]
pub enum Operation {
    /// POST: ensure the account and return its cloud-config.
    Create,
    /// GET: return the cloud-config of an existing account.
    Get,
    /// POST .../rotate: a new token for an existing account.
    Rotate,
}

impl Operation {
    fn label(self) -> &'static str {
        match self {
            Operation::Create => "create",
            Operation::Get => "get",
            Operation::Rotate => "rotate",
        }
    }
}

/// A short, fixed label for why a cloud-config request failed.
fn failure_reason(e: &ApiError) -> &'static str {
    use CloudConfigError as C;
    match e {
        ApiError::Request(_) => "invalid_request",
        ApiError::PayloadTooLarge { .. } => "body_too_large",
        ApiError::BadBody { .. } | ApiError::RequestTimeout { .. } => "unreadable_body",
        ApiError::UriTooLong { .. } | ApiError::HeadersTooLarge { .. } => "request_too_large",
        ApiError::CloudConfig(e) => match e {
            C::ClusterRoleNotFound { .. } => "cluster_role_not_found",
            C::Invalid { .. } => "invalid_request",
            C::ServerUrl { .. } => "server_url",
            C::NotFound { .. } => "not_found",
            C::Foreign { .. } => "conflict",
            C::TokenTimeout { .. } => "token_timeout",
            C::Generate { .. } => "generate",
            C::Store { .. } => "store",
        },
        ApiError::Unauthorized(_) => "unauthorized",
        ApiError::MethodNotAllowed { .. }
        | ApiError::NotFound { .. }
        | ApiError::NoAsset { .. }
        | ApiError::NoIssuer
        | ApiError::Unavailable { .. }
        | ApiError::Rest(_)
        | ApiError::Accounts(_)
        | ApiError::Encode { .. }
        | ApiError::BadReview { .. }
        | ApiError::NoGuestClusters
        | ApiError::WebhookClient
        | ApiError::NoWebhooks
        | ApiError::EmbeddedOnly { .. } => "other",
    }
}

/// Records the outcome of one cloud-config request and passes it on.
pub fn cloud_config<T>(
    operation: Operation,
    output: impl FnOnce(&T) -> OutputFormat,
    result: Result<T, ApiError>,
) -> Result<T, ApiError> {
    match &result {
        Ok(v) => metrics::cloud_config_issued(
            operation.label(),
            match output(v) {
                OutputFormat::Kubeconfig => "kubeconfig",
                OutputFormat::CloudInit => "cloud-init",
            },
        ),
        Err(e) => metrics::cloud_config_failed(operation.label(), failure_reason(e)),
    }
    result
}
