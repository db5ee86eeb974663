//! TLS for the listeners: the rustls server configuration of the serving certificate. The
//! handshake itself happens per connection in the server loop ([`super::server`]), with its
//! timeout, inside the connection limit.

use std::sync::Arc;

/// A rustls server config for a PEM certificate chain and key, offering HTTP/2 and HTTP/1.1.
pub fn server_config(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<rustls::ServerConfig>, String> {
    server_config_with_clients(cert_pem, key_pem, None)
}

/// [`server_config`] that also verifies client certificates against `client_ca_pem` when a client
/// presents one (optional: clients without one are served as before, and the request says which).
pub fn server_config_with_clients(
    cert_pem: &[u8],
    key_pem: &[u8],
    client_ca_pem: Option<&[u8]>,
) -> Result<Arc<rustls::ServerConfig>, String> {
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
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca_pem {
        None => builder.with_no_client_auth(),
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls_pemfile::certs(&mut &pem[..]) {
                let cert = cert.map_err(|e| format!("cannot read the client CA: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("invalid client CA: {e}"))?;
            }
            if roots.is_empty() {
                return Err("no certificate found in the client CA file".into());
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .allow_unauthenticated()
                    .build()
                    .map_err(|e| format!("invalid client CA: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("certificate and key do not match or are unsupported: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
