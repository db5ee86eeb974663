//! The HTTPS client the admission chain calls webhooks with: one POST per review over a fresh
//! HTTP/1.1 connection, TLS verified against the webhook's `caBundle` for the server name the real
//! server would use (`<service>.<namespace>.svc`, or the URL's host), bounded by the webhook's
//! timeout. Failures come back as the text after `failed calling webhook "<name>": `, shaped like
//! the real server's (`failed to call webhook: Post "<url>?timeout=10s": <cause>`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tracing::{Instrument, debug, info_span};

use crate::webhooks::{Client, Webhook};

/// The largest webhook response read.
const MAX_RESPONSE: usize = 3 * 1024 * 1024;

/// Service references the fake resolves: `(namespace, name)` to the address to connect to.
pub type ServiceMap = HashMap<(String, String), SocketAddr>;

/// Why a webhook could not be called; the texts are the real server's reasons (what follows
/// `failed calling webhook "<name>": `).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The caBundle holds no usable PEM certificate.
    #[error(
        "could not get REST client: unable to load root certificates: unable to parse bytes as PEM block"
    )]
    RootCertificates,
    /// The TLS client could not be configured.
    #[error("could not get REST client: {0}")]
    ClientConfig(String),
    /// The review could not be encoded.
    #[error("could not create admission objects: {0}")]
    Encode(String),
    /// The service reference has no address in the fake's service map.
    #[error("failed to call webhook: Post \"{url}\": service \"{service}\" not found")]
    ResolveService {
        /// The URL of the call.
        url: String,
        /// The service name.
        service: String,
    },
    /// Connecting, the TLS handshake or the HTTP exchange failed.
    #[error("failed to call webhook: Post \"{url}\": {cause}")]
    Post {
        /// The URL of the call.
        url: String,
        /// Go's wording of the cause where known.
        cause: String,
    },
    /// The webhook answered with a non-2xx status.
    #[error("failed to call webhook: {0}")]
    Answer(String),
    /// No answer within `timeoutSeconds`.
    #[error("failed to call webhook: Post \"{url}\": context deadline exceeded")]
    Timeout {
        /// The URL of the call.
        url: String,
    },
}

/// Where one webhook call goes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Endpoint {
    /// The URL as errors print it, with the `timeout` parameter.
    url: String,
    /// Host and port to connect to, when not a resolved service.
    host: String,
    port: u16,
    /// A resolved service address.
    addr: Option<SocketAddr>,
    /// The TLS server name (SNI and certificate verification).
    server_name: String,
    /// Path and query of the request.
    target: String,
    /// The `Host` header.
    authority: String,
}

fn timeout_param(t: Duration) -> String {
    format!("timeout={}s", t.as_secs().max(1))
}

fn endpoint(hook: &Webhook, services: &ServiceMap) -> Result<Endpoint, CallError> {
    let q = timeout_param(hook.timeout);
    match &hook.client {
        Client::Url(url) => {
            let rest = url.strip_prefix("https://").unwrap_or(url);
            let (authority, path) = match rest.find('/') {
                Some(i) => (&rest[..i], &rest[i..]),
                None => (rest, ""),
            };
            let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
                let (h, tail) = v6.split_once(']').unwrap_or((v6, ""));
                (
                    h.to_string(),
                    tail.strip_prefix(':').and_then(|p| p.parse().ok()),
                )
            } else {
                match authority.rsplit_once(':') {
                    Some((h, p)) => (h.to_string(), p.parse().ok()),
                    None => (authority.to_string(), None),
                }
            };
            let path = if path.is_empty() { "/" } else { path };
            Ok(Endpoint {
                url: format!("{url}?{q}"),
                server_name: host.clone(),
                host,
                port: port.unwrap_or(443),
                addr: None,
                target: format!("{path}?{q}"),
                authority: authority.to_string(),
            })
        }
        Client::Service {
            namespace,
            name,
            port,
            path,
        } => {
            let server_name = format!("{name}.{namespace}.svc");
            let authority = format!("{server_name}:{port}");
            let url = format!("https://{authority}{path}?{q}");
            let Some(addr) = services.get(&(namespace.clone(), name.clone())) else {
                return Err(CallError::ResolveService {
                    url,
                    service: name.clone(),
                });
            };
            let path = if path.is_empty() { "/" } else { path.as_str() };
            Ok(Endpoint {
                url,
                host: server_name.clone(),
                port: *port,
                addr: Some(*addr),
                server_name,
                target: format!("{path}?{q}"),
                authority,
            })
        }
    }
}

fn tls_config(ca_bundle: &str) -> Result<rustls::ClientConfig, CallError> {
    let mut roots = rustls::RootCertStore::empty();
    if !ca_bundle.is_empty() {
        let pem = STANDARD
            .decode(ca_bundle)
            .map_err(|_| CallError::RootCertificates)?;
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<_, _>>()
            .map_err(|_| CallError::RootCertificates)?;
        if certs.is_empty() {
            return Err(CallError::RootCertificates);
        }
        for c in certs {
            roots.add(c).map_err(|_| CallError::RootCertificates)?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| CallError::ClientConfig(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Go's wording for the TLS failures tests provoke; anything else keeps rustls' text.
fn tls_cause(e: &std::io::Error) -> String {
    use rustls::{CertificateError, Error};
    let inner = e.get_ref().and_then(|i| i.downcast_ref::<Error>()).cloned();
    match inner {
        // A CA with the issuer's name but another key fails on the signature; Go reports both as
        // an unknown authority.
        Some(Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        )) => {
            "tls: failed to verify certificate: x509: certificate signed by unknown authority"
                .into()
        }
        Some(Error::InvalidCertificate(CertificateError::NotValidForNameContext {
            expected,
            presented,
        })) => format!(
            "tls: failed to verify certificate: x509: certificate is valid for {}, not {}",
            presented
                .iter()
                .map(|p| bare_name(p))
                .collect::<Vec<_>>()
                .join(", "),
            expected.to_str()
        ),
        Some(Error::InvalidCertificate(CertificateError::NotValidForName)) => {
            "tls: failed to verify certificate: x509: certificate is not valid for the requested name".into()
        }
        Some(other) => format!("tls: {other}"),
        None => format!("remote error: {e}"),
    }
}

/// `DnsName("a.b")` or `IpAddress(1.2.3.4)` as rustls presents names, bare.
fn bare_name(presented: &str) -> &str {
    let inner = presented
        .split_once('(')
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .unwrap_or(presented);
    inner.trim_matches('"')
}

fn dial_cause(addr: &str, e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => {
            format!("dial tcp {addr}: connect: connection refused")
        }
        _ => format!("dial tcp {addr}: {e}"),
    }
}

fn response_cause(code: u16, body: &[u8]) -> String {
    if let Ok(status) = serde_json::from_slice::<serde_json::Value>(body)
        && status.get("kind").and_then(|k| k.as_str()) == Some("Status")
        && let Some(m) = status.get("message").and_then(|m| m.as_str())
    {
        return m.to_string();
    }
    match code {
        404 => "the server could not find the requested resource".into(),
        500..=599 => format!(
            "an error on the server ({:?}) has prevented the request from succeeding",
            String::from_utf8_lossy(&body[..body.len().min(1024)]).trim()
        ),
        _ => format!(
            "the server responded with the status code {code} but did not return more information"
        ),
    }
}

async fn exchange(
    ep: &Endpoint,
    config: rustls::ClientConfig,
    body: Vec<u8>,
) -> Result<Bytes, CallError> {
    let post = |cause: String| CallError::Post {
        url: ep.url.clone(),
        cause,
    };
    let tcp = match ep.addr {
        Some(addr) => TcpStream::connect(addr)
            .await
            .map_err(|e| post(dial_cause(&addr.to_string(), &e)))?,
        None => TcpStream::connect((ep.host.as_str(), ep.port))
            .await
            .map_err(|e| post(dial_cause(&format!("{}:{}", ep.host, ep.port), &e)))?,
    };
    let name = ServerName::try_from(ep.server_name.clone()).map_err(|e| {
        post(format!(
            "tls: invalid server name {:?}: {e}",
            ep.server_name
        ))
    })?;
    let tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| post(tls_cause(&e)))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| post(e.to_string()))?;
    tokio::spawn(
        async move {
            if let Err(e) = conn.await {
                debug!(error = %e, "webhook connection ended with error");
            }
        }
        .instrument(info_span!("webhook-connection")),
    );
    let request = hyper::Request::post(ep.target.as_str())
        .header(hyper::header::HOST, ep.authority.as_str())
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::ACCEPT, "application/json, */*")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| post(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| post(e.to_string()))?;
    let code = response.status().as_u16();
    let bytes = http_body_util::Limited::new(response.into_body(), MAX_RESPONSE)
        .collect()
        .await
        .map_err(|e| post(e.to_string()))?
        .to_bytes();
    if !(200..300).contains(&code) {
        return Err(CallError::Answer(response_cause(code, &bytes)));
    }
    Ok(bytes)
}

/// POSTs a review to a webhook and returns the response body.
pub async fn post(
    hook: &Webhook,
    services: &ServiceMap,
    review: &serde_json::Value,
) -> Result<Bytes, CallError> {
    let ep = endpoint(hook, services)?;
    let config = tls_config(&hook.ca_bundle)?;
    let body = serde_json::to_vec(review).map_err(|e| CallError::Encode(e.to_string()))?;
    match tokio::time::timeout(hook.timeout, exchange(&ep, config, body)).await {
        Ok(result) => result,
        Err(_) => Err(CallError::Timeout { url: ep.url }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::LabelSelector;

    fn mk_hook(client: Client) -> Webhook {
        Webhook {
            mutating: false,
            configuration: "c".into(),
            name: "h.example.com".into(),
            client,
            ca_bundle: String::new(),
            rules: vec![],
            ignore_failures: false,
            namespace_selector: LabelSelector::default(),
            object_selector: LabelSelector::default(),
            side_effects: "None".into(),
            timeout: Duration::from_secs(10),
            review_versions: vec!["v1".into()],
        }
    }

    #[test]
    fn url_endpoints_use_the_url_host_as_server_name() {
        let ep = endpoint(
            &mk_hook(Client::Url("https://[::1]:8443/validate".into())),
            &ServiceMap::new(),
        );
        assert_eq!(
            ep.map(|e| (e.url, e.server_name, e.port, e.target)),
            Ok((
                "https://[::1]:8443/validate?timeout=10s".to_string(),
                "::1".to_string(),
                8443,
                "/validate?timeout=10s".to_string()
            ))
        );
    }

    #[test]
    fn service_endpoints_resolve_through_the_map() {
        let svc = Client::Service {
            namespace: "ns".into(),
            name: "hook".into(),
            port: 443,
            path: "/mutate".into(),
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], 9443));
        let mut services = ServiceMap::new();
        assert_eq!(
            endpoint(&mk_hook(svc.clone()), &services)
                .err()
                .map(|e| e.to_string()),
            Some(
                "failed to call webhook: Post \"https://hook.ns.svc:443/mutate?timeout=10s\": service \"hook\" not found"
                    .to_string()
            )
        );
        services.insert(("ns".into(), "hook".into()), addr);
        let ep = endpoint(&mk_hook(svc), &services);
        assert_eq!(
            ep.map(|e| (e.addr, e.server_name, e.authority)),
            Ok((
                Some(addr),
                "hook.ns.svc".to_string(),
                "hook.ns.svc:443".to_string()
            ))
        );
    }
}
