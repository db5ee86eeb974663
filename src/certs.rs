//! The service's own TLS material: on first start a private CA and a serving certificate signed by it
//! are created in `<data-dir>/tls/` and reused afterwards. Clients trust `ca.crt`; the embedded
//! backend also hands it out as the cluster CA of the kubeconfigs it issues. Or, with `--tls-cert`
//! and `--tls-key`, the operator's own ([`serving`]).

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

use crate::config::ServeArgs;

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("cannot read --{flag} {path}: {source}")]
    Flag {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--tls-cert {path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
}

/// PEM-encoded serving chain and key, and the CA that signs them.
pub struct TlsMaterial {
    pub cert_chain_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub ca_pem: Vec<u8>,
}

fn read(path: &Path) -> Result<Vec<u8>, CertError> {
    std::fs::read(path).map_err(|source| CertError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes a file readable by its owner only, replacing it atomically.
pub fn write_private(path: &Path, contents: &[u8]) -> Result<(), CertError> {
    let err = |source| CertError::Write {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(&tmp).map_err(err)?;
    f.write_all(contents).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

/// Loads the generated material from `dir`, creating it on first use for `hosts` (DNS names or IPs).
pub fn ensure_self_signed(dir: &Path, hosts: &[String]) -> Result<TlsMaterial, CertError> {
    let (ca_path, cert_path, key_path) =
        (dir.join("ca.crt"), dir.join("tls.crt"), dir.join("tls.key"));
    if ca_path.exists() && cert_path.exists() && key_path.exists() {
        return Ok(TlsMaterial {
            cert_chain_pem: read(&cert_path)?,
            key_pem: read(&key_path)?,
            ca_pem: read(&ca_path)?,
        });
    }
    std::fs::create_dir_all(dir).map_err(|source| CertError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    let material = generate(hosts)?;
    // The key first and the CA last: a crash in between leaves no usable-looking partial set.
    write_private(&key_path, &material.key_pem)?;
    write_private(&cert_path, &material.cert_chain_pem)?;
    write_private(&ca_path, &material.ca_pem)?;
    Ok(material)
}

/// A new private CA and a serving certificate for `hosts` signed by it, in memory only (for a
/// process without a writable data directory, such as a replica on the Kubernetes backend).
pub fn generate(hosts: &[String]) -> Result<TlsMaterial, CertError> {
    let ca_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "harvester-cloud CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params.not_before = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    ca_params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(3650);
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);

    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = CertificateParams::new(hosts.to_vec())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "harvester-cloud");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(825);
    let cert = params.signed_by(&key, &issuer)?;

    let material = TlsMaterial {
        cert_chain_pem: format!("{}{}", cert.pem(), ca_cert.pem()).into_bytes(),
        key_pem: key.serialize_pem().into_bytes(),
        ca_pem: ca_cert.pem().into_bytes(),
    };
    Ok(material)
}

/// The serving certificate of `serve`: `--tls-cert` and `--tls-key` when given, else one generated
/// for this host (kept in `<data-dir>/tls` when there is a data directory, in memory otherwise);
/// `None` for plain HTTP (`--http`).
pub fn serving(
    args: &ServeArgs,
    data_dir: Option<&Path>,
) -> Result<Option<TlsMaterial>, CertError> {
    if args.http {
        return Ok(None);
    }
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let read = |flag: &'static str, path: &Path| {
            std::fs::read(path).map_err(|source| CertError::Flag {
                flag,
                path: path.to_path_buf(),
                source,
            })
        };
        let cert_chain_pem = read("tls-cert", cert)?;
        let key_pem = read("tls-key", key)?;
        let ca_pem = last_certificate_pem(&cert_chain_pem)
            .ok_or_else(|| CertError::NoCertificate { path: cert.clone() })?;
        return Ok(Some(TlsMaterial {
            cert_chain_pem,
            key_pem,
            ca_pem,
        }));
    }
    let mut hosts = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    if !args.listen.ip().is_unspecified() && !args.listen.ip().is_loopback() {
        hosts.push(args.listen.ip().to_string());
    }
    if let Ok(pod_ip) = std::env::var("POD_IP") {
        hosts.push(pod_ip);
    }
    Ok(Some(match data_dir {
        Some(dir) => ensure_self_signed(&dir.join("tls"), &hosts)?,
        None => generate(&hosts)?,
    }))
}

/// The last certificate of a PEM chain: for a supplied chain, the one closest to the root.
pub fn last_certificate_pem(chain: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(chain).ok()?;
    let begin = text.rfind("-----BEGIN CERTIFICATE-----")?;
    let end_marker = "-----END CERTIFICATE-----";
    let end = text[begin..].find(end_marker)? + begin + end_marker.len();
    Some(format!("{}\n", &text[begin..end]).into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_once_then_reuses() {
        let dir = tempfile::tempdir().unwrap();
        let hosts = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let a = ensure_self_signed(dir.path(), &hosts).unwrap();
        let b = ensure_self_signed(dir.path(), &hosts).unwrap();
        assert_eq!(a.ca_pem, b.ca_pem);
        assert_eq!(a.key_pem, b.key_pem);
        assert_eq!(last_certificate_pem(&a.cert_chain_pem).unwrap(), a.ca_pem);
        crate::http::tls::server_config(&a.cert_chain_pem, &a.key_pem).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("tls.key"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
