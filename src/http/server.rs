//! The listeners' server loop, with the limits a slow or hostile client meets (the same ones
//! nginx, Envoy and Go's `http.Server` put there): at most `max_connections` open at once (past
//! that, accepting pauses: the kernel's backlog holds new clients until a slot frees, and a warning
//! says so), a TLS handshake within `handshake_timeout`, every request head within
//! `header_timeout` (which also closes an idle keep-alive connection after that long), and a first
//! request within `header_timeout` of connecting on HTTP/2 too. Request bodies are bounded by the
//! router ([`super::limits`]).
//!
//! Shutdown: the listener closes at the signal (connections already in the backlog are still
//! taken), HTTP/1 responses say `Connection: close` ([`super::drain`]), and after `linger` every
//! connection without a request in flight closes at once — a client that has half-sent its
//! request head no longer holds the process — while the requests in flight finish.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{Router, extract::Request};
use futures::FutureExt;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
    service::TowerToHyperService,
};
use tokio::{net::TcpListener, sync::Semaphore, task::JoinSet};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::{Instrument, debug, info_span, warn};

/// The limits of one listener.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub handshake_timeout: Duration,
    /// HTTP/2 streams one connection may have open at once.
    pub max_streams: u32,
    /// Largest request head (HTTP/1 line and headers; HTTP/2 header list).
    pub max_header_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 4096,
            header_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            max_streams: 100,
            max_header_bytes: 64 * 1024,
        }
    }
}

/// Counts what the limits turned away, for the metrics and the tests.
#[derive(Debug, Default)]
pub struct Refusals {
    pub at_capacity: AtomicU64,
    pub handshake_timeouts: AtomicU64,
    pub idle_closed: AtomicU64,
}

/// Serves `router` on `listener` (TLS when `tls` is given) until `shutdown`, then drains: see the
/// module's documentation. Returns once every connection has ended.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    router: Router,
    limits: Limits,
    linger: Duration,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_counting(
        listener,
        tls,
        router,
        limits,
        linger,
        shutdown,
        Arc::new(Refusals::default()),
    )
    .await
}

pub async fn serve_counting(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    router: Router,
    limits: Limits,
    linger: Duration,
    shutdown: CancellationToken,
    refusals: Arc<Refusals>,
) -> std::io::Result<()> {
    let local = listener.local_addr()?;
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let acceptor = tls.map(TlsAcceptor::from);
    // Fires `linger` after the signal: connections without a request in flight close then.
    let closing = CancellationToken::new();
    {
        let (shutdown, closing) = (shutdown.clone(), closing.clone());
        tokio::spawn(async move {
            shutdown.cancelled().await;
            tokio::time::sleep(linger).await;
            closing.cancel();
        });
    }
    let mut connections = JoinSet::new();
    let mut last_full_warning: Option<tokio::time::Instant> = None;
    loop {
        // A free slot first: at capacity, the backlog holds new clients.
        let permit = if let Ok(p) = slots.clone().try_acquire_owned() {
            p
        } else {
            refusals.at_capacity.fetch_add(1, Ordering::Relaxed);
            crate::metrics::http_connection_refused("at_capacity");
            if last_full_warning.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
                warn!(%local, max = limits.max_connections, "connection limit reached; new connections wait");
                last_full_warning = Some(tokio::time::Instant::now());
            }
            tokio::select! {
                p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
                _ = shutdown.cancelled() => break,
            }
        };
        let accepted = if shutdown.is_cancelled() {
            // Connections already waiting in the backlog are served rather than dropped unread.
            match listener.accept().now_or_never() {
                Some(r) => r,
                None => break,
            }
        } else {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => continue,
                r = listener.accept() => r,
            }
        };
        let (tcp, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors and similar: back off instead of spinning.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let (router, limits, acceptor, closing, refusals) = (
            router.clone(),
            limits.clone(),
            acceptor.clone(),
            closing.clone(),
            refusals.clone(),
        );
        connections.spawn(
            async move {
                let _permit = permit;
                match acceptor {
                    None => {
                        serve_connection(tcp, peer, router, &limits, closing, &refusals, false)
                            .await
                    }
                    Some(acceptor) => {
                        match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp))
                            .await
                        {
                            Ok(Ok(tls)) => {
                                // The verifier checked any certificate presented; its presence
                                // is the verification.
                                let verified = tls
                                    .get_ref()
                                    .1
                                    .peer_certificates()
                                    .is_some_and(|c| !c.is_empty());
                                serve_connection(
                                    tls, peer, router, &limits, closing, &refusals, verified,
                                )
                                .await
                            }
                            Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake failed"),
                            Err(_) => {
                                refusals.handshake_timeouts.fetch_add(1, Ordering::Relaxed);
                                crate::metrics::http_connection_refused("handshake_timeout");
                                debug!(%peer, "TLS handshake timed out");
                            }
                        }
                    }
                }
            }
            .instrument(info_span!("connection", %peer)),
        );
        // Reap the finished ones so the set does not grow with the connections served.
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    debug!(%local, "stopped accepting connections");
    while connections.join_next().await.is_some() {}
    Ok(())
}

async fn serve_connection<I>(
    io: I,
    peer: SocketAddr,
    router: Router,
    limits: &Limits,
    closing: CancellationToken,
    refusals: &Refusals,
    verified_client: bool,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // Requests of this connection still being answered, and whether it has had one yet.
    let in_flight = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(AtomicU64::new(0));
    let service = {
        let (in_flight, seen) = (in_flight.clone(), seen.clone());
        TowerToHyperService::new(tower::service_fn(
            move |mut req: Request<hyper::body::Incoming>| {
                seen.fetch_add(1, Ordering::Relaxed);
                // The router counts the request as in flight once its body has arrived
                // (super::limits), until its response is sent.
                req.extensions_mut().insert(Activity(in_flight.clone()));
                if verified_client {
                    req.extensions_mut().insert(super::VerifiedClient);
                }
                router.clone().oneshot(req.map(axum::body::Body::new))
            },
        ))
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .keep_alive_interval(Some(Duration::from_secs(20)))
        .keep_alive_timeout(Duration::from_secs(10));
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    let first_request_deadline = tokio::time::sleep(limits.header_timeout);
    let mut first_request_deadline = std::pin::pin!(first_request_deadline);
    let mut closing_seen = false;
    // Armed until it fires once: `select!` evaluates a branch's condition only when it is entered,
    // and it is entered again only when a branch completes, so a condition on `seen` would keep the
    // deadline armed for a connection's whole life and close a busy one after `header_timeout`.
    let mut awaiting_first_request = true;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = &mut first_request_deadline, if awaiting_first_request => {
                awaiting_first_request = false;
                if seen.load(Ordering::Relaxed) > 0 {
                    continue;
                }
                // HTTP/1 has its header timeout; this also bounds an HTTP/2 connection that
                // never sends a request.
                refusals.idle_closed.fetch_add(1, Ordering::Relaxed);
                crate::metrics::http_connection_refused("no_request");
                debug!(%peer, "no request within the header timeout; closing");
                return;
            }
            _ = closing.cancelled(), if !closing_seen => {
                closing_seen = true;
                if in_flight.load(Ordering::Acquire) == 0 {
                    // Idle or half-sent: nothing of the client's is lost by closing now.
                    return;
                }
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// The count of a connection's requests in flight, in each of its requests' extensions.
#[derive(Clone, Debug)]
pub struct Activity(Arc<AtomicUsize>);

impl Activity {
    /// This request is in flight until the guard is dropped.
    pub fn begin(&self) -> InFlight {
        self.0.fetch_add(1, Ordering::AcqRel);
        InFlight(self.0.clone())
    }
}

/// One request being answered on a connection, until dropped.
#[derive(Debug)]
pub struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
