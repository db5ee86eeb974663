//! The router served on connections that arrive through the Rancher aggregation tunnel
//! ([`crate::tunnel`]): HTTP/1, as Rancher's proxy speaks it, each request marked [`ViaTunnel`] so
//! that authentication may take the caller's identity from Rancher's `Impersonate-*` headers
//! there, and only there.

use std::time::Duration;

use axum::{Extension, Router};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, debug_span};

use crate::tunnel::{Accept, TunnelStream};

/// How long Rancher may take to send a request's head on a tunnelled connection.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Marks a request that came through the tunnel (set by [`acceptor`], never by a client).
#[derive(Clone, Copy, Debug)]
pub struct ViaTunnel;

/// Serves `router` on every tunnelled connection until it closes or `shutdown` (then in-flight
/// requests finish and the connection closes).
pub fn acceptor(router: Router, shutdown: CancellationToken) -> Accept {
    let router = router.layer(Extension(ViaTunnel));
    std::sync::Arc::new(move |stream: TunnelStream| {
        let id = stream.id();
        let service = TowerToHyperService::new(router.clone());
        let shutdown = shutdown.clone();
        tokio::spawn(
            async move {
                let mut builder = hyper::server::conn::http1::Builder::new();
                builder
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .keep_alive(true);
                let conn = builder.serve_connection(TokioIo::new(stream), service);
                let mut conn = std::pin::pin!(conn);
                let result = tokio::select! {
                    r = conn.as_mut() => r,
                    _ = shutdown.cancelled() => {
                        conn.as_mut().graceful_shutdown();
                        conn.await
                    }
                };
                if let Err(e) = result {
                    debug!(error = %e, "tunnelled connection ended with an error");
                }
            }
            .instrument(debug_span!("tunnel_conn", conn = id)),
        );
    })
}
