//! Rancher's stored token hash formats, so a token's secret is never stored or compared in clear.
//!
//! - `$1:<salt hex>:<n>:<r>:<p>:<key>`: scrypt with N = 2^n.
//! - `$2:<salt>:<key>`: SHA-256 over the salt bytes followed by the secret.
//! - `$3:1:<salt>:<key>`: SHA3-512 over the salt bytes followed by the secret (what we write).
//!
//! Salts and keys are unpadded standard base64 except the scrypt salt. Comparison is constant-time.

use base64::{Engine, engine::general_purpose::STANDARD_NO_PAD as B64};
use rand::RngCore;
use sha2::{Digest, Sha256};
use sha3::Sha3_512;
use subtle::ConstantTimeEq;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HashError {
    #[error("unsupported token hash format")]
    UnsupportedFormat,
    #[error("malformed token hash: {0}")]
    Malformed(&'static str),
}

/// Hashes a secret in the `$3:1` format with a fresh 16-byte salt.
pub fn hash_secret(secret: &str) -> String {
    let mut salt = [0u8; 16];
    rand::rng().fill_bytes(&mut salt);
    let key = sha3_512(&salt, secret);
    format!("$3:1:{}:{}", B64.encode(salt), B64.encode(key))
}

fn sha3_512(salt: &[u8], secret: &str) -> Vec<u8> {
    let mut h = Sha3_512::new();
    h.update(salt);
    h.update(secret.as_bytes());
    h.finalize().to_vec()
}

fn sha256(salt: &[u8], secret: &str) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(salt);
    h.update(secret.as_bytes());
    h.finalize().to_vec()
}

fn b64(s: &str, what: &'static str) -> Result<Vec<u8>, HashError> {
    B64.decode(s.trim_end_matches('='))
        .map_err(|_| HashError::Malformed(what))
}

fn equal(a: &[u8], b: &[u8]) -> bool {
    // An empty key never matches, whatever the secret.
    !b.is_empty() && a.ct_eq(b).into()
}

/// Whether `secret` matches the stored `hash`.
pub fn verify(secret: &str, hash: &str) -> Result<bool, HashError> {
    let parts: Vec<&str> = hash.split(':').collect();
    match parts.as_slice() {
        ["$3", "1", salt, key] => {
            let (salt, key) = (b64(salt, "salt")?, b64(key, "key")?);
            Ok(equal(&sha3_512(&salt, secret), &key))
        }
        ["$3", ..] => Err(HashError::UnsupportedFormat),
        ["$2", salt, key] => {
            let (salt, key) = (b64(salt, "salt")?, b64(key, "key")?);
            Ok(equal(&sha256(&salt, secret), &key))
        }
        ["$1", salt, n, r, p, key] => {
            let salt = hex::decode(salt).map_err(|_| HashError::Malformed("salt"))?;
            let key = b64(key, "key")?;
            let parse = |s: &str, what| s.parse::<u32>().map_err(|_| HashError::Malformed(what));
            let (n, r, p) = (parse(n, "n")?, parse(r, "r")?, parse(p, "p")?);
            let log_n = u8::try_from(n).map_err(|_| HashError::Malformed("n"))?;
            if key.is_empty() {
                return Ok(false);
            }
            let params = scrypt::Params::new(log_n, r, p, key.len())
                .map_err(|_| HashError::Malformed("scrypt parameters"))?;
            let mut out = vec![0u8; key.len()];
            scrypt::scrypt(secret.as_bytes(), &salt, &params, &mut out)
                .map_err(|_| HashError::Malformed("scrypt key length"))?;
            Ok(equal(&out, &key))
        }
        _ => Err(HashError::UnsupportedFormat),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha3_round_trip() {
        let h = hash_secret("s3cret");
        assert!(h.starts_with("$3:1:"));
        assert_eq!(verify("s3cret", &h), Ok(true));
        assert_eq!(verify("s3creT", &h), Ok(false));
        assert_ne!(hash_secret("s3cret"), h, "salted");
    }

    #[test]
    fn sha256_format() {
        let salt = b"saltsalt";
        let h = format!(
            "$2:{}:{}",
            B64.encode(salt),
            B64.encode(sha256(salt, "abc"))
        );
        assert_eq!(verify("abc", &h), Ok(true));
        assert_eq!(verify("abd", &h), Ok(false));
    }

    #[test]
    fn scrypt_format() {
        // Small parameters keep the test fast; the format is what matters.
        let salt = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let params = scrypt::Params::new(4, 8, 1, 32).unwrap();
        let mut key = [0u8; 32];
        scrypt::scrypt(b"abc", &salt, &params, &mut key).unwrap();
        let h = format!("$1:{}:4:8:1:{}", hex::encode(salt), B64.encode(key));
        assert_eq!(verify("abc", &h), Ok(true));
        assert_eq!(verify("abd", &h), Ok(false));
    }

    #[test]
    fn empty_key_never_matches_and_bad_formats_fail() {
        assert_eq!(verify("", "$2:c2FsdA:"), Ok(false));
        assert_eq!(verify("x", "plain"), Err(HashError::UnsupportedFormat));
        assert_eq!(verify("x", "$3:2:a:b"), Err(HashError::UnsupportedFormat));
        assert_eq!(verify("x", "$2:!!:a"), Err(HashError::Malformed("salt")));
    }
}
