//! The one place that decides status codes. Errors are JSON in Rancher's API error shape,
//! `{"type":"error","status":<n>,"code":"<Code>","message":"…"}`; 5xx bodies never carry internals
//! (those go to the log, inside the request's span).

use axum::{
    Json,
    http::{HeaderValue, Method, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::Serialize;
use tracing::{error, warn};

use super::rest::RestError;
use crate::{
    auth::AuthError,
    kubeconfig::{CloudConfigError, RequestError, accounts::AccountsError},
    store::StoreError,
};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Unauthorized(#[from] AuthError),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    CloudConfig(#[from] CloudConfigError),
    #[error(transparent)]
    Accounts(Box<AccountsError>),
    #[error("request body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("the request body did not arrive within {after:?}")]
    RequestTimeout { after: std::time::Duration },
    #[error("the request target is longer than {limit} bytes")]
    UriTooLong { limit: usize },
    #[error("the request's header fields are larger than {limit} bytes")]
    HeadersTooLarge { limit: usize },
    #[error("cannot read the request body: {reason}")]
    BadBody { reason: String },
    #[error("method {method} is not allowed on {path}; allowed: {}", allowed.join(", "))]
    MethodNotAllowed {
        method: Method,
        path: String,
        allowed: Vec<&'static str>,
    },
    #[error("no route for {path}")]
    NotFound { path: String },
    #[error("the console has no file {path}")]
    NoAsset { path: String },
    #[error("this backend does not issue service-account tokens; ask the cluster's own issuer")]
    NoIssuer,
    #[error("{what} is not available: {reason}")]
    Unavailable { what: &'static str, reason: String },
    #[error(transparent)]
    Rest(Box<RestError>),
    #[error("cannot encode {what}: {reason}")]
    Encode { what: &'static str, reason: String },
    #[error("fail to decode the admission review: {reason}")]
    BadReview { reason: String },
    #[error(
        "guest clusters are kept on the embedded backend only; on Kubernetes, run `harvester-cloud ccm` in the guest cluster"
    )]
    NoGuestClusters,
    #[error(
        "admission reviews are answered for the API server only: present a client certificate signed by the service's --webhook-client-ca"
    )]
    WebhookClient,
    #[error(
        "no admission webhooks here: the embedded store admits every write itself, and no API server calls them"
    )]
    NoWebhooks,
    #[error(
        "{what} are kept on the embedded backend only; on Kubernetes, read them from the cluster's API"
    )]
    EmbeddedOnly { what: &'static str },
}

impl From<AccountsError> for ApiError {
    fn from(e: AccountsError) -> Self {
        ApiError::Accounts(Box::new(e))
    }
}

impl From<RestError> for ApiError {
    fn from(e: RestError) -> Self {
        ApiError::Rest(Box::new(e))
    }
}

#[derive(Serialize)]
struct Body<'a> {
    #[serde(rename = "type")]
    type_: &'static str,
    status: u16,
    code: &'a str,
    message: String,
}

/// The error shape for a status, code and message.
pub fn error_response(status: StatusCode, code: &str, message: String) -> Response {
    let body = Body {
        type_: "error",
        status: status.as_u16(),
        code,
        message,
    };
    (status, Json(body)).into_response()
}

fn store_status(e: &StoreError) -> (StatusCode, &'static str) {
    match e {
        StoreError::NotFound { .. } => (StatusCode::NOT_FOUND, "NotFound"),
        StoreError::AlreadyExists { .. } | StoreError::Conflict { .. } => {
            (StatusCode::CONFLICT, "Conflict")
        }
        StoreError::Invalid { .. } | StoreError::Refused { .. } => {
            (StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent")
        }
        StoreError::TokenTimeout { .. } => (StatusCode::GATEWAY_TIMEOUT, "GatewayTimeout"),
        // Forbidden here means the service's own account lacks a permission: a deployment fault,
        // not the caller's.
        StoreError::Gone
        | StoreError::Backend(_)
        | StoreError::Forbidden { .. }
        | StoreError::Undecodable { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "ServerError"),
    }
}

impl ApiError {
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        use CloudConfigError as C;
        match self {
            ApiError::Unauthorized(AuthError::Backend(_)) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "ServerError")
            }
            ApiError::Unauthorized(AuthError::Busy(_)) => {
                (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable")
            }
            ApiError::Unauthorized(e) if e.is_forbidden() => {
                (StatusCode::FORBIDDEN, "PermissionDenied")
            }
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "Unauthorized"),
            ApiError::Request(_) => (StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent"),
            ApiError::CloudConfig(e) => match e {
                C::ClusterRoleNotFound { .. } | C::Invalid { .. } => {
                    (StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent")
                }
                C::ServerUrl { .. } | C::Generate { .. } => {
                    (StatusCode::INTERNAL_SERVER_ERROR, "ServerError")
                }
                C::NotFound { .. } => (StatusCode::NOT_FOUND, "NotFound"),
                C::Foreign { .. } => (StatusCode::CONFLICT, "Conflict"),
                C::TokenTimeout { .. } => (StatusCode::GATEWAY_TIMEOUT, "GatewayTimeout"),
                C::Store { source, .. } => store_status(source),
            },
            ApiError::Accounts(e) => match e.as_ref() {
                AccountsError::Query { .. } => {
                    (StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent")
                }
                AccountsError::List { source } => store_status(source),
                AccountsError::Revoke { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "ServerError"),
            },
            ApiError::PayloadTooLarge { .. } => {
                (StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge")
            }
            ApiError::BadBody { .. } => (StatusCode::BAD_REQUEST, "InvalidBodyContent"),
            ApiError::RequestTimeout { .. } => (StatusCode::REQUEST_TIMEOUT, "RequestTimeout"),
            ApiError::UriTooLong { .. } => (StatusCode::URI_TOO_LONG, "RequestURITooLong"),
            ApiError::HeadersTooLarge { .. } => (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "RequestHeaderFieldsTooLarge",
            ),
            ApiError::MethodNotAllowed { .. } => {
                (StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed")
            }
            ApiError::NotFound { .. } | ApiError::NoAsset { .. } | ApiError::NoIssuer => {
                (StatusCode::NOT_FOUND, "NotFound")
            }
            ApiError::Unavailable { .. } => (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable"),
            ApiError::Rest(e) => match e.as_ref() {
                RestError::Decode { .. }
                | RestError::ClusterName(_)
                | RestError::InvalidName { .. }
                | RestError::Mismatch { .. }
                | RestError::MissingNamespace { .. }
                | RestError::Refused(_) => (StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent"),
                RestError::NotFound { .. } | RestError::ClusterNotFound(_) => {
                    (StatusCode::NOT_FOUND, "NotFound")
                }
                RestError::Conflict { .. } => (StatusCode::CONFLICT, "Conflict"),
                RestError::Admission(a) if a.is_rejection() => {
                    (StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent")
                }
                RestError::Admission(_) | RestError::Stored { .. } => {
                    (StatusCode::INTERNAL_SERVER_ERROR, "ServerError")
                }
                RestError::Store { .. } | RestError::DeleteCluster(_) => e
                    .store_error()
                    .map(store_status)
                    .unwrap_or((StatusCode::INTERNAL_SERVER_ERROR, "ServerError")),
            },
            ApiError::Encode { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "ServerError"),
            ApiError::BadReview { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent"),
            ApiError::NoGuestClusters | ApiError::NoWebhooks | ApiError::EmbeddedOnly { .. } => {
                (StatusCode::NOT_FOUND, "NotFound")
            }
            ApiError::WebhookClient => (StatusCode::FORBIDDEN, "PermissionDenied"),
        }
    }

    /// What the client is told. Store failures behind a 5xx are summarised; the detail is logged.
    fn public_message(&self) -> String {
        match self {
            ApiError::CloudConfig(CloudConfigError::Store { step, source })
                if store_status(source).0.is_server_error()
                    && !matches!(source, StoreError::TokenTimeout { .. }) =>
            {
                format!("{step}: internal error, see the server log")
            }
            ApiError::Accounts(e) => match e.as_ref() {
                AccountsError::List { source } if store_status(source).0.is_server_error() => {
                    "cannot list the cloud-config accounts: internal error, see the server log"
                        .into()
                }
                AccountsError::Revoke { .. } => {
                    "cannot revoke the account: internal error, see the server log".into()
                }
                other => other.to_string(),
            },
            ApiError::Unauthorized(AuthError::Backend(_)) => {
                "authentication failed: internal error, see the server log".into()
            }
            ApiError::Unavailable { what, .. } => format!("{what} is not available"),
            ApiError::Rest(e) if self.status_and_code().0.is_server_error() => e.internal_summary(),
            ApiError::Rest(e) => match e.store_error() {
                Some(source) => source.to_string(),
                None => e.to_string(),
            },
            ApiError::Encode { .. } => "internal error, see the server log".into(),
            other => other.to_string(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        if status.is_server_error() {
            error!(status = status.as_u16(), error = %self, source = ?std::error::Error::source(&self), "request failed");
        } else if let ApiError::Unauthorized(e) = &self {
            warn!(reason = e.reason(), "authentication failed");
        }
        let mut response = error_response(status, code, self.public_message());
        match &self {
            ApiError::Unauthorized(_) if status == StatusCode::UNAUTHORIZED => {
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"harvester-cloud\""),
                );
            }
            ApiError::Unauthorized(AuthError::Busy(_)) => {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            ApiError::MethodNotAllowed { allowed, .. } => {
                if let Ok(v) = HeaderValue::from_str(&allowed.join(", ")) {
                    response.headers_mut().insert(header::ALLOW, v);
                }
            }
            _ => {}
        }
        response
    }
}
