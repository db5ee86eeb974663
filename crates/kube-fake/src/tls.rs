//! The test PKI: a throwaway CA and a serving certificate for `127.0.0.1`, `::1` and `localhost`,
//! with a rustls server configuration on the `ring` provider that offers HTTP/2 and HTTP/1.1.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Why the PKI could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// rcgen failed to generate or sign.
    #[error("generating the test certificates: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls rejected the configuration.
    #[error("building the TLS server configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The generated PKI.
#[derive(Debug, Clone)]
pub struct Pki {
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// The server configuration presenting the serving certificate.
    pub server_config: Arc<rustls::ServerConfig>,
}

/// Generates a CA and a serving certificate signed by it.
pub fn generate() -> Result<Pki, TlsError> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "kube-fake-ca");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let mut params = CertificateParams::new(vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ])?;
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![
                CertificateDer::from(cert.der().to_vec()),
                CertificateDer::from(ca_cert.der().to_vec()),
            ],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Pki {
        ca_pem: ca_cert.pem(),
        server_config: Arc::new(config),
    })
}
