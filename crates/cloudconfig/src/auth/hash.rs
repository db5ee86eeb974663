//! Rancher's stored token hash formats, so a token's secret is never stored or compared in clear.
//!
//! - `$1:<salt hex>:<n>:<r>:<p>:<key>`: scrypt with N = 2^n.
//! - `$2:<salt>:<key>`: SHA-256 over the salt bytes followed by the secret.
//! - `$3:1:<salt>:<key>`: SHA3-512 over the salt bytes followed by the secret (what we write).
//!
//! Salts and keys are unpadded standard base64 except the scrypt salt. Comparison is constant-time.
//!
//! scrypt is slow on purpose (tens of milliseconds with Rancher's parameters), so [`verify_async`]
//! runs it on the blocking pool, at most [`slow_slots`] at once and with a bounded queue: a flood of
//! wrong secrets for a `$1` token waits for, or is refused by, those few slots, while every other
//! request (`/healthz`, other tokens) keeps the async workers.

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
    format!("$3:1:{}:{}", B64.encode(salt), B64.encode(key.as_ref()))
}

fn sha3_512(salt: &[u8], secret: &str) -> impl AsRef<[u8]> {
    Sha3_512::new()
        .chain_update(salt)
        .chain_update(secret.as_bytes())
        .finalize()
}

fn sha256(salt: &[u8], secret: &str) -> impl AsRef<[u8]> {
    Sha256::new()
        .chain_update(salt)
        .chain_update(secret.as_bytes())
        .finalize()
}

fn b64(s: &str, what: &'static str) -> Result<Vec<u8>, HashError> {
    B64.decode(s.trim_end_matches('='))
        .map_err(|_| HashError::Malformed(what))
}

fn equal(a: &[u8], b: &[u8]) -> bool {
    // An empty key never matches, whatever the secret.
    !b.is_empty() && a.ct_eq(b).into()
}

const MAX_SCRYPT_LOG_N: u8 = 20;
const MAX_SCRYPT_RP: u32 = 64;
/// Checks waiting for a slot past which more are refused at once.
const SLOW_QUEUE: usize = 256;

#[derive(Debug, thiserror::Error)]
pub(crate) enum VerifyError {
    #[error(transparent)]
    Hash(#[from] HashError),
    /// Too many slow checks are waiting already.
    #[error("too many token checks are waiting; try again")]
    Busy,
}

/// How many scrypt checks may run at once: half the machine's cores, at least one.
pub(crate) fn slow_slots() -> usize {
    std::thread::available_parallelism()
        .map(|n| (n.get() / 2).max(1))
        .unwrap_or(1)
}

struct SlowLane {
    slots: tokio::sync::Semaphore,
    waiting: std::sync::atomic::AtomicUsize,
}

static SLOW: std::sync::LazyLock<SlowLane> = std::sync::LazyLock::new(|| SlowLane {
    slots: tokio::sync::Semaphore::new(slow_slots()),
    waiting: std::sync::atomic::AtomicUsize::new(0),
});

/// [`verify`] for async callers: cheap formats inline, scrypt on the blocking pool within the slow
/// lane's slots (or [`VerifyError::Busy`] when its queue is full).
pub(crate) async fn verify_async(secret: &str, hash: &str) -> Result<bool, VerifyError> {
    if !hash.starts_with("$1:") {
        return Ok(verify(secret, hash)?);
    }
    use std::sync::atomic::Ordering;
    let lane = &*SLOW;
    if lane.waiting.fetch_add(1, Ordering::AcqRel) >= SLOW_QUEUE {
        lane.waiting.fetch_sub(1, Ordering::AcqRel);
        return Err(VerifyError::Busy);
    }
    let permit = lane.slots.acquire().await;
    lane.waiting.fetch_sub(1, Ordering::AcqRel);
    let _permit = permit.map_err(|_| VerifyError::Busy)?;
    let (secret, hash) = (secret.to_string(), hash.to_string());
    tokio::task::spawn_blocking(move || verify(&secret, &hash))
        .await
        .map_err(|_| VerifyError::Busy)?
        .map_err(VerifyError::Hash)
}

/// Whether `secret` matches the stored `hash`.
pub fn verify(secret: &str, hash: &str) -> Result<bool, HashError> {
    Ok(StoredHash::parse(hash)?.verify(secret))
}

/// A stored hash taken apart once (format, salt, key, parameters), so that checking a presented
/// secret is only the hash function and the comparison: a caller that checks many secrets against
/// the same few records (the embedded backend's admin tokens) parses each record when it reads it.
#[derive(Clone, Debug)]
pub enum StoredHash {
    /// `$3:1`.
    Sha3 { salt: Vec<u8>, key: Vec<u8> },
    /// `$2`.
    Sha256 { salt: Vec<u8>, key: Vec<u8> },
    /// `$1`; `params` is `None` for an empty key, which matches nothing.
    Scrypt {
        salt: Vec<u8>,
        params: Option<scrypt::Params>,
        key: Vec<u8>,
    },
}

impl StoredHash {
    pub fn parse(hash: &str) -> Result<StoredHash, HashError> {
        let parts: Vec<&str> = hash.split(':').collect();
        match parts.as_slice() {
            ["$3", "1", salt, key] => Ok(StoredHash::Sha3 {
                salt: b64(salt, "salt")?,
                key: b64(key, "key")?,
            }),
            ["$3", ..] => Err(HashError::UnsupportedFormat),
            ["$2", salt, key] => Ok(StoredHash::Sha256 {
                salt: b64(salt, "salt")?,
                key: b64(key, "key")?,
            }),
            ["$1", salt, n, r, p, key] => {
                let salt = hex::decode(salt).map_err(|_| HashError::Malformed("salt"))?;
                let key = b64(key, "key")?;
                let parse =
                    |s: &str, what| s.parse::<u32>().map_err(|_| HashError::Malformed(what));
                let (n, r, p) = (parse(n, "n")?, parse(r, "r")?, parse(p, "p")?);
                let log_n = u8::try_from(n).map_err(|_| HashError::Malformed("n"))?;
                // Rancher writes N = 2^15, r = 8, p = 1; far larger is a stored denial of service.
                if log_n > MAX_SCRYPT_LOG_N || r.saturating_mul(p) > MAX_SCRYPT_RP {
                    return Err(HashError::Malformed("scrypt parameters too large"));
                }
                let params = if key.is_empty() {
                    None
                } else {
                    Some(
                        scrypt::Params::new(log_n, r, p, key.len())
                            .map_err(|_| HashError::Malformed("scrypt parameters"))?,
                    )
                };
                Ok(StoredHash::Scrypt { salt, params, key })
            }
            _ => Err(HashError::UnsupportedFormat),
        }
    }

    /// Whether `secret` matches, compared in constant time.
    pub fn verify(&self, secret: &str) -> bool {
        match self {
            StoredHash::Sha3 { salt, key } => equal(sha3_512(salt, secret).as_ref(), key),
            StoredHash::Sha256 { salt, key } => equal(sha256(salt, secret).as_ref(), key),
            StoredHash::Scrypt { params: None, .. } => false,
            StoredHash::Scrypt {
                salt,
                params: Some(params),
                key,
            } => {
                let mut out = vec![0u8; key.len()];
                // The output length is the one the parameters were checked with.
                scrypt::scrypt(secret.as_bytes(), salt, params, &mut out).is_ok()
                    && equal(&out, key)
            }
        }
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
            B64.encode(sha256(salt, "abc").as_ref())
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

    /// A flood of scrypt checks does not hold the async workers: on a single-threaded runtime,
    /// another task runs while the checks are still pending (were they inline, it could only run
    /// after every one of them).
    #[test]
    fn scrypt_checks_leave_the_runtime_free() {
        let salt = [9u8; 16];
        let params = scrypt::Params::new(8, 8, 1, 32).unwrap();
        let mut key = [0u8; 32];
        scrypt::scrypt(b"right", &salt, &params, &mut key).unwrap();
        let stored = format!("$1:{}:8:8:1:{}", hex::encode(salt), B64.encode(key));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let pending = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(16));
            let mut checks = Vec::new();
            for _ in 0..16 {
                let (stored, pending) = (stored.clone(), pending.clone());
                checks.push(tokio::spawn(async move {
                    let r = verify_async("wrong", &stored).await;
                    pending.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    r
                }));
            }
            let seen = {
                let pending = pending.clone();
                tokio::spawn(async move { pending.load(std::sync::atomic::Ordering::SeqCst) })
            }
            .await
            .unwrap();
            assert!(seen > 0, "another task ran only after every scrypt check");
            for c in checks {
                assert!(matches!(c.await.unwrap(), Ok(false)));
            }
            assert!(matches!(verify_async("right", &stored).await, Ok(true)));
        });
    }

    #[test]
    fn huge_scrypt_parameters_are_refused() {
        let h = format!(
            "$1:{}:30:8:1:{}",
            hex::encode([1u8; 8]),
            B64.encode([0u8; 32])
        );
        assert_eq!(
            verify("x", &h),
            Err(HashError::Malformed("scrypt parameters too large"))
        );
    }

    #[test]
    fn empty_key_never_matches_and_bad_formats_fail() {
        assert_eq!(verify("", "$2:c2FsdA:"), Ok(false));
        assert_eq!(verify("x", "plain"), Err(HashError::UnsupportedFormat));
        assert_eq!(verify("x", "$3:2:a:b"), Err(HashError::UnsupportedFormat));
        assert_eq!(verify("x", "$2:!!:a"), Err(HashError::Malformed("salt")));
    }
}
