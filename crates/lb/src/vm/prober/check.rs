//! One probe of one backend.
//!
//! TCP is upstream's half-open check (tcp-shaker): the SYN is answered, the handshake is never
//! completed towards the backend's application, so it accepts nothing and logs nothing. Delayed
//! acknowledgements (`TCP_QUICKACK` off) keep the kernel from sending the handshake's last ACK
//! before the socket is closed, and a zero linger makes that close a reset; nor does the probe
//! leave a TIME_WAIT socket behind, which thousands of probes a second would pile up.
//!
//! HTTP(S) is ours: a `GET` of the path with `Connection: close` (the backend closes, as the
//! kubelet's probes let it), healthy when the status is expected. HTTPS does not verify the
//! backend's certificate (the kubelet's probes do not either: a VM's certificate names its service,
//! not its address), only that the handshake is signed by the key of the certificate presented.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::Empty;
use hyper::{Request, header};
use hyper_util::rt::TokioIo;
use rustls::{
    DigitallySignedStruct, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::WebPkiSupportedAlgorithms,
    pki_types::{CertificateDer, ServerName, UnixTime},
};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::TlsConnector;

use crate::vm::health::{Check, HttpCheck};

/// Sent as `User-Agent`, so a backend's log says who asks.
const USER_AGENT: &str = concat!("harvester-cloud-prober/", env!("CARGO_PKG_VERSION"));

/// Why a probe failed; its text is what Events and conditions show.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("no answer from {addr} within {after:?}")]
    Timeout { addr: SocketAddr, after: Duration },
    #[error("TLS handshake with {addr} failed: {source}")]
    Tls {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("TLS is not available to the prober: {reason}")]
    NoTls { reason: String },
    #[error("HTTP request to {addr} failed: {source}")]
    Http {
        addr: SocketAddr,
        source: hyper::Error,
    },
    #[error("cannot build the request to {addr}: {reason}")]
    Request { addr: SocketAddr, reason: String },
    #[error("{addr} closed the connection before answering")]
    Closed { addr: SocketAddr },
    #[error("{addr} answered {path} with HTTP {status}, expected {expected}")]
    Status {
        addr: SocketAddr,
        path: String,
        status: u16,
        expected: String,
    },
}

/// Probes `addr` once, within `timeout`.
pub async fn probe(
    addr: SocketAddr,
    check: &Check,
    timeout: Duration,
    tls: &Tls,
) -> Result<(), ProbeError> {
    let attempt = async {
        match check {
            Check::Tcp => half_open(addr).await,
            Check::Http(http) => get(addr, http, tls).await,
        }
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .map_err(|_| ProbeError::Timeout {
            addr,
            after: timeout,
        })?
}

async fn half_open(addr: SocketAddr) -> Result<(), ProbeError> {
    let connect = |source| ProbeError::Connect { addr, source };
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(connect)?;
    let sock = socket2::SockRef::from(&socket);
    #[cfg(any(target_os = "linux", target_os = "android"))]
    sock.set_tcp_quickack(false).map_err(connect)?;
    sock.set_linger(Some(Duration::ZERO)).map_err(connect)?;
    let stream = socket.connect(addr).await.map_err(connect)?;
    // Closed with a zero linger: a reset, before the delayed ACK would have completed the handshake.
    drop(stream);
    Ok(())
}

async fn get(addr: SocketAddr, check: &HttpCheck, tls: &Tls) -> Result<(), ProbeError> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|source| ProbeError::Connect { addr, source })?;
    let _ = tcp.set_nodelay(true);
    let status = if check.tls {
        let connector = tls.connector()?;
        let stream = connector
            .connect(ServerName::IpAddress(addr.ip().into()), tcp)
            .await
            .map_err(|source| ProbeError::Tls { addr, source })?;
        request(TokioIo::new(stream), addr, &check.path).await?
    } else {
        request(TokioIo::new(tcp), addr, &check.path).await?
    };
    if check.accepts(status) {
        Ok(())
    } else {
        Err(ProbeError::Status {
            addr,
            path: check.path.clone(),
            status,
            expected: check.expected(),
        })
    }
}

/// Sends `GET path` on a fresh connection and returns the answer's status.
async fn request<T>(io: T, addr: SocketAddr, path: &str) -> Result<u16, ProbeError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let http = |source| ProbeError::Http { addr, source };
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(io)
        .await
        .map_err(http)?;
    let req = Request::get(path)
        .header(header::HOST, addr.to_string())
        .header(header::USER_AGENT, USER_AGENT)
        .header(header::CONNECTION, "close")
        .body(Empty::new())
        .map_err(|e| ProbeError::Request {
            addr,
            reason: e.to_string(),
        })?;
    // The connection is driven here, next to the request, rather than by a task of its own. The
    // verdict is the status line: the body is never read, and the connection is dropped (closed)
    // as soon as the head is in. Waiting for the connection to end would wait for a body nobody
    // reads, which stalls once it fills the socket's buffers (a backend's 8 KiB page timed out).
    let mut send = std::pin::pin!(sender.send_request(req));
    let mut conn = std::pin::pin!(conn);
    let answer = tokio::select! {
        biased;
        answer = &mut send => answer,
        // The connection ended first: its answer, or why there is none, is with the request.
        _ = &mut conn => send.await,
    };
    match answer {
        Ok(response) => Ok(response.status().as_u16()),
        Err(e) if e.is_canceled() || e.is_incomplete_message() => Err(ProbeError::Closed { addr }),
        Err(e) => Err(http(e)),
    }
}

/// The TLS client of HTTPS probes, built on first use.
#[derive(Default)]
pub struct Tls {
    connector: std::sync::OnceLock<Result<TlsConnector, String>>,
}

impl Tls {
    fn connector(&self) -> Result<&TlsConnector, ProbeError> {
        self.connector
            .get_or_init(build_connector)
            .as_ref()
            .map_err(|reason| ProbeError::NoTls {
                reason: reason.clone(),
            })
    }
}

fn build_connector() -> Result<TlsConnector, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Arc::new(AnyCertificate(provider.signature_verification_algorithms));
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// Accepts any certificate, but checks the handshake's signature with its key.
#[derive(Debug)]
struct AnyCertificate(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::health::StatusRange;

    const WAIT: Duration = Duration::from_secs(5);

    fn mk_http(path: &str, tls: bool) -> Check {
        Check::Http(HttpCheck {
            tls,
            path: path.into(),
            expect: vec![StatusRange {
                low: 200,
                high: 299,
            }],
        })
    }

    /// A port nothing listens on (bound, then closed).
    async fn closed_port() -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        l.local_addr().expect("addr")
    }

    #[tokio::test]
    async fn tcp_probe_is_half_open_and_fails_on_a_closed_port() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let addr = listener.local_addr().expect("addr");
        let tls = Tls::default();
        for _ in 0..5 {
            probe(addr, &Check::Tcp, WAIT, &tls).await.expect("healthy");
        }
        // The handshakes were never completed: nothing reached the application.
        let accepted = tokio::time::timeout(Duration::from_millis(300), listener.accept()).await;
        assert!(accepted.is_err(), "the probe completed a connection");
        drop(listener);
        let err = probe(addr, &Check::Tcp, WAIT, &tls)
            .await
            .expect_err("closed");
        assert!(matches!(err, ProbeError::Connect { .. }), "{err}");
        let err = probe(closed_port().await, &Check::Tcp, WAIT, &tls)
            .await
            .expect_err("closed");
        assert!(err.to_string().starts_with("cannot connect to 127.0.0.1:"));
    }

    /// An HTTP server answering `/ok` with 200 and anything else with 503, over TLS when given a
    /// configuration.
    async fn serve(tls: Option<Arc<rustls::ServerConfig>>) -> SocketAddr {
        use hyper::{Response, body::Incoming, service::service_fn};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let tls = tls.clone();
                tokio::spawn(async move {
                    let svc = service_fn(|req: Request<Incoming>| async move {
                        let path = req.uri().path();
                        // `/ok/<n>`: 200 with an n-byte body.
                        let size: Option<usize> =
                            path.strip_prefix("/ok/").and_then(|n| n.parse().ok());
                        let status = if path == "/ok" || size.is_some() {
                            200
                        } else {
                            503
                        };
                        let body = match size {
                            Some(n) => Bytes::from(vec![b'x'; n]),
                            None => Bytes::from_static(b"hi"),
                        };
                        Response::builder()
                            .status(status)
                            .body(http_body_util::Full::new(body))
                    });
                    let http = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    );
                    match tls {
                        Some(config) => {
                            let acceptor = tokio_rustls::TlsAcceptor::from(config);
                            if let Ok(stream) = acceptor.accept(tcp).await {
                                let _ = http.serve_connection(TokioIo::new(stream), svc).await;
                            }
                        }
                        None => {
                            let _ = http.serve_connection(TokioIo::new(tcp), svc).await;
                        }
                    }
                });
            }
        });
        addr
    }

    fn self_signed() -> Arc<rustls::ServerConfig> {
        let key = rcgen::KeyPair::generate().expect("a key");
        let cert = rcgen::CertificateParams::new(vec!["backend.example".to_string()])
            .expect("params")
            .self_signed(&key)
            .expect("a certificate");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .expect("a TLS config");
        Arc::new(config)
    }

    #[tokio::test]
    async fn http_probe_reads_the_status_over_http_and_https() {
        let tls = Tls::default();
        for secure in [false, true] {
            let addr = serve(secure.then(self_signed)).await;
            probe(addr, &mk_http("/ok", secure), WAIT, &tls)
                .await
                .unwrap_or_else(|e| panic!("healthy (tls {secure}): {e}"));
            let err = probe(addr, &mk_http("/sick", secure), WAIT, &tls)
                .await
                .expect_err("503");
            assert_eq!(
                err.to_string(),
                format!("{addr} answered /sick with HTTP 503, expected 200-299")
            );
        }
        // HTTPS to a plain HTTP server, and HTTP to a dead port.
        let plain = serve(None).await;
        let err = probe(plain, &mk_http("/ok", true), WAIT, &tls)
            .await
            .expect_err("not TLS");
        assert!(matches!(err, ProbeError::Tls { .. }), "{err}");
        let err = probe(closed_port().await, &mk_http("/ok", false), WAIT, &tls)
            .await
            .expect_err("closed");
        assert!(matches!(err, ProbeError::Connect { .. }), "{err}");
    }

    /// The verdict is the status line whatever the body: a page larger than the socket buffers
    /// stalled a probe that waited for the connection to end without reading it.
    #[tokio::test]
    async fn healthy_whatever_the_body_size() {
        let tls = Tls::default();
        for secure in [false, true] {
            let addr = serve(secure.then(self_signed)).await;
            for size in [0, 8 * 1024, 64 * 1024, 1024 * 1024] {
                probe(addr, &mk_http(&format!("/ok/{size}"), secure), WAIT, &tls)
                    .await
                    .unwrap_or_else(|e| panic!("healthy with {size} B (tls {secure}): {e}"));
            }
        }
    }

    #[tokio::test]
    async fn a_silent_backend_times_out() {
        // Accepts, then never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let addr = listener.local_addr().expect("addr");
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((c, _)) = listener.accept().await {
                open.push(c);
            }
        });
        let err = probe(
            addr,
            &mk_http("/ok", false),
            Duration::from_millis(200),
            &Tls::default(),
        )
        .await
        .expect_err("silent");
        assert!(matches!(err, ProbeError::Timeout { .. }), "{err}");
        held.abort();
    }
}
