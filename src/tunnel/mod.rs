//! The Rancher aggregation tunnel: a remotedialer client (the protocol of rancher/remotedialer,
//! which Rancher's steve aggregation speaks) that dials the URL Rancher writes into an
//! APIService's Secret, presents the token from it, and serves the HTTP requests Rancher sends back
//! through it. This module owns the protocol and the connection's life (dial over TLS verified
//! with the Secret's CA, serve, reconnect with back-off); what is served on each tunnelled
//! connection is the acceptor's business ([`session::Accept`]), and where the endpoint comes from
//! is [`rancher`]'s.

pub mod rancher;
pub mod session;
pub mod stats;
pub mod wire;

use std::{sync::Arc, time::Duration};

use thiserror::Error;
use tokio::{net::TcpStream, sync::watch};
use tokio_rustls::TlsConnector;
use tokio_tungstenite::{
    WebSocketStream, client_async_with_config,
    tungstenite::{self, client::IntoClientRequest, http::HeaderValue, protocol::WebSocketConfig},
};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

pub use session::{Accept, Limits, TunnelStream};
pub use stats::Stats;

/// How long a dial (TCP, TLS and the WebSocket handshake) may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// Back-off between failed attempts: doubling from the first to the last.
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A session that lasted this long resets the back-off.
const STABLE: Duration = Duration::from_secs(30);
/// Largest WebSocket message accepted from the peer (a Data frame is a few KiB).
const MAX_MESSAGE: usize = 4 << 20;

/// Where to dial and how to prove who we are: the contents of the APIService's Secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `https://rancher.example/v3/connect` (or `wss://`).
    pub url: String,
    pub token: String,
    /// PEM; empty means the system's roots.
    pub ca_pem: Vec<u8>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &self.url)
            .field("token", &"<redacted>")
            .field("ca_pem", &format!("{} bytes", self.ca_pem.len()))
            .finish()
    }
}

#[derive(Debug, Error)]
pub enum TunnelError {
    #[error("invalid tunnel URL {url}: {why}")]
    Url { url: String, why: String },
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("invalid CA in the APIService secret: {0}")]
    Ca(String),
    #[error("TLS handshake with {host} failed: {source}")]
    Tls {
        host: String,
        source: std::io::Error,
    },
    #[error("WebSocket handshake failed: {0}")]
    Handshake(tungstenite::Error),
    #[error("the server refused the tunnel: HTTP {0}")]
    Refused(u16),
    #[error("dialing took longer than {0:?}")]
    DialTimeout(Duration),
    #[error("socket error: {0}")]
    Socket(tungstenite::Error),
    #[error("malformed frame: {0}")]
    Frame(wire::WireError),
    #[error("the peer sent a text message")]
    TextMessage,
    #[error("the peer closed the tunnel")]
    Closed,
    #[error("nothing heard from the peer for {0:?}")]
    Silent(Duration),
}

/// A stream the tunnel runs over: TLS to a Rancher server, or plain TCP for an `http://` URL.
pub trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static {}
impl<T> Io for T where T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static {}

fn tls_config(ca_pem: &[u8]) -> Result<rustls::ClientConfig, TunnelError> {
    let mut roots = rustls::RootCertStore::empty();
    if ca_pem.iter().any(|b| !b.is_ascii_whitespace()) {
        let mut reader = std::io::BufReader::new(ca_pem);
        let mut found = 0;
        for cert in rustls_pemfile::certs(&mut reader) {
            let cert = cert.map_err(|e| TunnelError::Ca(e.to_string()))?;
            roots
                .add(cert)
                .map_err(|e| TunnelError::Ca(e.to_string()))?;
            found += 1;
        }
        if found == 0 {
            return Err(TunnelError::Ca("no PEM certificate".into()));
        }
    } else {
        let native = rustls_native_certs::load_native_certs();
        for cert in native.certs {
            let _ = roots.add(cert);
        }
    }
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| TunnelError::Ca(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth())
}

/// Dials `endpoint` and completes the WebSocket handshake with its token.
pub async fn dial(endpoint: &Endpoint) -> Result<WebSocketStream<Box<dyn Io>>, TunnelError> {
    tokio::time::timeout(DIAL_TIMEOUT, dial_inner(endpoint))
        .await
        .map_err(|_| TunnelError::DialTimeout(DIAL_TIMEOUT))?
}

async fn dial_inner(endpoint: &Endpoint) -> Result<WebSocketStream<Box<dyn Io>>, TunnelError> {
    let bad = |why: &str| TunnelError::Url {
        url: endpoint.url.clone(),
        why: why.to_string(),
    };
    // Rancher writes an https:// URL; steve turns it into wss:// the same way.
    let ws_url = if let Some(rest) = endpoint.url.strip_prefix("https://") {
        format!("wss://{rest}")
    } else if let Some(rest) = endpoint.url.strip_prefix("http://") {
        format!("ws://{rest}")
    } else {
        endpoint.url.clone()
    };
    let uri: tungstenite::http::Uri = ws_url.parse().map_err(|_| bad("not a URL"))?;
    let secure = match uri.scheme_str() {
        Some("wss") => true,
        Some("ws") => false,
        _ => return Err(bad("not an http(s) or ws(s) URL")),
    };
    let host = uri
        .host()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| bad("no host"))?;
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(bad("credentials in the URL"));
    }
    let port = uri.port_u16().unwrap_or(if secure { 443 } else { 80 });
    let bare_host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let addr = format!("{host}:{port}");
    let tcp = TcpStream::connect(&addr)
        .await
        .map_err(|source| TunnelError::Connect {
            addr: addr.clone(),
            source,
        })?;
    let _ = tcp.set_nodelay(true);
    let io: Box<dyn Io> = if secure {
        let config = tls_config(&endpoint.ca_pem)?;
        let name = rustls::pki_types::ServerName::try_from(bare_host.clone())
            .map_err(|_| bad("invalid host name"))?;
        let tls = TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|source| TunnelError::Tls {
                host: bare_host.clone(),
                source,
            })?;
        Box::new(tls)
    } else {
        Box::new(tcp)
    };
    let mut request = ws_url
        .as_str()
        .into_client_request()
        .map_err(|e| bad(&e.to_string()))?;
    let bearer = HeaderValue::from_str(&format!("Bearer {}", endpoint.token))
        .map_err(|_| bad("the token is not a valid header value"))?;
    request.headers_mut().insert("authorization", bearer);
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    match client_async_with_config(request, io, Some(config)).await {
        Ok((ws, _)) => Ok(ws),
        Err(tungstenite::Error::Http(resp)) => Err(TunnelError::Refused(resp.status().as_u16())),
        Err(e) => Err(TunnelError::Handshake(e)),
    }
}

/// Keeps a tunnel up to whatever endpoint `endpoints` holds, until `stop`: dials, serves the
/// session, and on any failure dials again after a back-off; a new endpoint (the Secret changed)
/// replaces the session at once. `None` means there is nothing to dial yet.
pub async fn run(
    mut endpoints: watch::Receiver<Option<Endpoint>>,
    accept: Accept,
    limits: Limits,
    stats: Arc<Stats>,
    stop: CancellationToken,
) {
    use std::sync::atomic::Ordering;
    let mut backoff = BACKOFF_FIRST;
    loop {
        let endpoint = endpoints.borrow_and_update().clone();
        let Some(endpoint) = endpoint else {
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = endpoints.changed() => if changed.is_err() { return } else { continue },
            }
        };
        let span = info_span!("tunnel", url = %endpoint.url);
        let session_stop = stop.child_token();
        let attempt = async {
            let started = tokio::time::Instant::now();
            let ws = dial(&endpoint).await?;
            info!("tunnel connected");
            // Connected until this guard goes: when the session ends, and also when the attempt
            // is dropped because the Secret changed (code after `serve` would not run then).
            let connected = Connected::new(&stats);
            stats.sessions_total.fetch_add(1, Ordering::Relaxed);
            let result = session::serve(
                ws,
                accept.clone(),
                limits.clone(),
                stats.clone(),
                session_stop.clone(),
            )
            .await;
            drop(connected);
            session::log_end(&result);
            if result.is_err() {
                // A session that ends in an error is a failure as a refused dial is.
                stats.failures_total.fetch_add(1, Ordering::Relaxed);
                crate::metrics::tunnel_failed();
            }
            Ok::<_, TunnelError>(started.elapsed())
        }
        .instrument(span.clone());
        let outcome = tokio::select! {
            r = attempt => Some(r),
            changed = endpoints.changed() => {
                session_stop.cancel();
                if changed.is_err() {
                    return;
                }
                let _enter = span.enter();
                info!("the APIService secret changed: reconnecting");
                backoff = BACKOFF_FIRST;
                None
            }
        };
        if stop.is_cancelled() {
            return;
        }
        match outcome {
            None => continue,
            Some(Ok(lasted)) if lasted >= STABLE => backoff = BACKOFF_FIRST,
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                stats.failures_total.fetch_add(1, Ordering::Relaxed);
                crate::metrics::tunnel_failed();
                let _enter = span.enter();
                warn!(error = %e, retry_in = ?backoff, "tunnel dial failed");
            }
        }
        let jitter = Duration::from_millis(rand::random::<u64>() % 250);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(backoff + jitter) => {}
            changed = endpoints.changed() => {
                if changed.is_err() {
                    return;
                }
                // New credentials: dial with them now, from the first back-off on.
                backoff = BACKOFF_FIRST;
                continue;
            }
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// The tunnel's connected state (the stats and the gauge) for as long as it lives.
struct Connected<'a>(&'a Stats);

impl<'a> Connected<'a> {
    fn new(stats: &'a Stats) -> Self {
        stats
            .connected
            .store(true, std::sync::atomic::Ordering::Relaxed);
        crate::metrics::set_tunnel_connected(true);
        Connected(stats)
    }
}

impl Drop for Connected<'_> {
    fn drop(&mut self) {
        self.0
            .connected
            .store(false, std::sync::atomic::Ordering::Relaxed);
        crate::metrics::set_tunnel_connected(false);
    }
}
