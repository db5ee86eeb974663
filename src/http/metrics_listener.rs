//! The metrics listener (`--metrics-listen`): plain HTTP serving `GET /metrics` only. It is a
//! separate port so that Prometheus can scrape it without an admin token and without the API port
//! exposing anything but the API; it stops on the same shutdown signal as the API.

use axum::{
    Router,
    http::{HeaderValue, StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::info;

pub const METRICS_PATH: &str = "/metrics";

/// The router of the metrics listener.
pub fn router() -> Router {
    Router::new()
        .route(METRICS_PATH, get(metrics))
        .fallback(|| async { (StatusCode::NOT_FOUND, "only /metrics is served here\n") })
}

async fn metrics() -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
        )],
        crate::metrics::encode(),
    )
}

/// Serves `/metrics` on `listener` until `shutdown` is cancelled, with a listener's limits (a few
/// scrapers at once; a request head within 10 s). Scrapes are short, so the stop waits for them.
pub async fn serve(listener: TcpListener, shutdown: CancellationToken) -> std::io::Result<()> {
    let local = listener.local_addr()?;
    info!(address = %local, url = %format!("http://{local}{METRICS_PATH}"), "serving metrics");
    let limits = crate::http::server::Limits {
        max_connections: 64,
        ..Default::default()
    };
    crate::http::server::serve(listener, None, router(), limits, Duration::ZERO, shutdown).await
}
