//! Draining on shutdown, kind to HTTP/1 keep-alive clients.
//!
//! Closing every idle keep-alive connection at the signal would make a client that has just
//! written its next request on one see it closed unanswered: harmless (the request was never read)
//! but a failed request all the same. So at the shutdown signal only the listener closes (new
//! connections are refused), connections already open keep being served for a short linger, each
//! HTTP/1 response now carrying `Connection: close` so the client moves off after it; then the
//! server loop ([`super::server`]) closes the connections without a request in flight and lets the
//! requests in flight finish (the caller bounds that with `--shutdown-timeout`, counted from the
//! signal).

use std::time::Duration;

use axum::{
    Router,
    extract::{Request, State},
    http::{HeaderValue, Version, header},
    middleware::Next,
    response::Response,
};
use tokio_util::sync::CancellationToken;

/// How long open connections may still bring requests after the signal. Clients that are sending
/// get their `Connection: close` answer within milliseconds; a connection idle for longer is closed.
pub const LINGER: Duration = Duration::from_secs(1);

/// The shutdown signal, as the router's responses see it.
#[derive(Clone)]
pub struct Drain {
    shutdown: CancellationToken,
}

impl Drain {
    pub fn new(shutdown: CancellationToken) -> Self {
        Drain { shutdown }
    }

    /// `router`, whose HTTP/1 responses say `Connection: close` once the signal has come.
    pub fn router(&self, router: Router) -> Router {
        router.layer(axum::middleware::from_fn_with_state(
            self.shutdown.clone(),
            close_when_draining,
        ))
    }
}

async fn close_when_draining(
    State(shutdown): State<CancellationToken>,
    request: Request,
    next: Next,
) -> Response {
    // HTTP/2 has no Connection header: its graceful shutdown (GOAWAY) tells the client which
    // streams were processed, so nothing is lost there.
    let http1 = request.version() <= Version::HTTP_11;
    let mut response = next.run(request).await;
    if http1 && shutdown.is_cancelled() {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}
