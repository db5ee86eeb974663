//! HTTPS for `axum::serve`: a listener that completes TLS handshakes off the accept loop (a slow or
//! silent client cannot stall other connections) and hands finished streams to the server.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use tokio::{net::TcpListener, sync::mpsc};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tracing::{Instrument, debug, info_span, warn};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const PENDING: usize = 256;

pub struct TlsListener {
    local: SocketAddr,
    rx: mpsc::Receiver<(TlsStream<tokio::net::TcpStream>, SocketAddr)>,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let acceptor = TlsAcceptor::from(config);
        let (tx, rx) = mpsc::channel(PENDING);
        tokio::spawn(
            async move {
                loop {
                    let (stream, peer) = tokio::select! {
                        // The server stopped accepting (shutdown): stop too.
                        _ = tx.closed() => return,
                        r = tcp.accept() => match r {
                            Ok(x) => x,
                            Err(e) => {
                                // Out of file descriptors and similar: back off instead of spinning.
                                warn!(error = %e, "accept failed");
                                tokio::time::sleep(Duration::from_millis(50)).await;
                                continue;
                            }
                        },
                    };
                    let _ = stream.set_nodelay(true);
                    let (acceptor, tx) = (acceptor.clone(), tx.clone());
                    tokio::spawn(
                        async move {
                            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream))
                                .await
                            {
                                Ok(Ok(tls)) => {
                                    let _ = tx.send((tls, peer)).await;
                                }
                                Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake failed"),
                                Err(_) => debug!(%peer, "TLS handshake timed out"),
                            }
                        }
                        .instrument(info_span!("tls_handshake")),
                    );
                }
            }
            .instrument(info_span!("tls_accept", %local)),
        );
        Ok(TlsListener { local, rx })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(conn) => conn,
            // The accept task only ends once this listener is dropped; never resolve meanwhile.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// A rustls server config for a PEM certificate chain and key, offering HTTP/2 and HTTP/1.1.
pub fn server_config(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<rustls::ServerConfig>, String> {
    let certs = rustls_pemfile::certs(&mut &cert_pem[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cannot read certificates: {e}"))?;
    if certs.is_empty() {
        return Err("no certificate found in the PEM file".into());
    }
    let key = rustls_pemfile::private_key(&mut &key_pem[..])
        .map_err(|e| format!("cannot read private key: {e}"))?
        .ok_or("no private key found in the PEM file")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("certificate and key do not match or are unsupported: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
