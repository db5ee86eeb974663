//! What one request may be, checked before any handler sees it: the target at most
//! [`MAX_URI`] bytes (414), the header fields at most [`MAX_HEADERS`] bytes (431), and the body
//! read whole within [`BODY_TIMEOUT`] (408) and no larger than the largest route limit (413);
//! each route then takes at most its own limit ([`KUBECONFIG_BODY`], [`OBJECT_BODY`],
//! [`REVIEW_BODY`]). A client-sent `X-Request-Id` is kept only when it is a short token of safe
//! characters; otherwise the request gets a generated one, so no client text reaches the logs
//! through it.

use std::time::Duration;

use axum::{
    body::Body,
    extract::Request,
    http::{HeaderValue, Method},
    middleware::Next,
    response::{IntoResponse, Response},
};
use http_body_util::{BodyExt, Limited};

use super::ApiError;

/// The cloud-config routes: Harvester's clients send a few hundred bytes.
pub const KUBECONFIG_BODY: usize = 64 * 1024;
/// IPPools, LoadBalancers and guest Services: an IPPool with a few thousand ranges, or one sent
/// back whole with a status of thousands of allocations.
pub const OBJECT_BODY: usize = 2 * 1024 * 1024;
/// Admission reviews: kube-apiserver sends the object and the old object, each up to etcd's
/// 1.5 MiB, with the request's metadata.
pub const REVIEW_BODY: usize = 8 * 1024 * 1024;
/// The whole body must arrive within this (a client that drips it holds nothing longer).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
pub const MAX_URI: usize = 8 * 1024;
pub const MAX_HEADERS: usize = 32 * 1024;
/// A client's request id is kept only up to this long.
const MAX_REQUEST_ID: usize = 128;

/// The request checks of this module, as a middleware.
pub async fn bounded(request: Request, next: Next) -> Response {
    let uri_len = request
        .uri()
        .path_and_query()
        .map_or(0, |p| p.as_str().len());
    if uri_len > MAX_URI {
        return ApiError::UriTooLong { limit: MAX_URI }.into_response();
    }
    let header_bytes: usize = request
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    if header_bytes > MAX_HEADERS {
        return ApiError::HeadersTooLarge { limit: MAX_HEADERS }.into_response();
    }
    let (parts, body) = request.into_parts();
    let bodyless = matches!(parts.method, Method::GET | Method::HEAD | Method::DELETE)
        && parts
            .headers
            .get(axum::http::header::CONTENT_LENGTH)
            .is_none_or(|v| v == "0")
        && !parts
            .headers
            .contains_key(axum::http::header::TRANSFER_ENCODING);
    let body = if bodyless {
        body
    } else {
        match tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, REVIEW_BODY).collect()).await {
            Err(_) => {
                return ApiError::RequestTimeout {
                    after: BODY_TIMEOUT,
                }
                .into_response();
            }
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                return ApiError::PayloadTooLarge { limit: REVIEW_BODY }.into_response();
            }
            Ok(Err(e)) => {
                return ApiError::BadBody {
                    reason: e.to_string(),
                }
                .into_response();
            }
            Ok(Ok(collected)) => Body::from(collected.to_bytes()),
        }
    };
    // From here the request counts as in flight on its connection until its response is sent: a
    // shutdown lets it finish, where a request still arriving is cut (nothing of it was served).
    let guard = parts
        .extensions
        .get::<super::server::Activity>()
        .map(super::server::Activity::begin);
    let response = next.run(Request::from_parts(parts, body)).await;
    match guard {
        None => response,
        Some(guard) => response.map(|b| {
            Body::new(Guarded {
                inner: b,
                _guard: guard,
            })
        }),
    }
}

/// A response body that keeps its request in flight until it is sent (or dropped).
struct Guarded {
    inner: Body,
    _guard: super::server::InFlight,
}

impl http_body::Body for Guarded {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Whether a client's `X-Request-Id` may be used as the request's id: up to 128 characters of
/// letters, digits and `-_.:` (a UUID, a trace id, a short tag).
pub fn acceptable_request_id(value: &HeaderValue) -> bool {
    let b = value.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_REQUEST_ID
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b':'))
}

/// Drops a client's `X-Request-Id` that is not [`acceptable_request_id`], so one is generated.
pub async fn sanitize_request_id(mut request: Request, next: Next) -> Response {
    if let Some(v) = request.headers().get("x-request-id")
        && !acceptable_request_id(v)
    {
        request.headers_mut().remove("x-request-id");
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids() {
        for ok in [
            "0b5f1b2c-3d4e-4f60-8a9b-0c1d2e3f4a5b",
            "trace:abc.DEF_12",
            &"a".repeat(128),
        ] {
            assert!(
                acceptable_request_id(&HeaderValue::from_str(ok).unwrap()),
                "{ok}"
            );
        }
        for bad in [
            "",
            "}{\"level\":\"INFO\"",
            "id with spaces",
            &"a".repeat(129),
            "caf\u{e9}",
        ] {
            let Ok(v) = HeaderValue::from_bytes(bad.as_bytes()) else {
                continue;
            };
            assert!(!acceptable_request_id(&v), "{bad:?}");
        }
    }
}
