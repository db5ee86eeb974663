//! The embedded backend's authenticator: admin tokens from the SQLite `admin_tokens` table.
//!
//! The whole table (a handful of records) is held in memory and read again every second, and at
//! once when `harvester-cloud token` (another process) has changed it: it writes a fresh stamp into
//! [`tokens::CHANGED_FILE`] in place, whose content every check compares (one `pread` of the file
//! held open since the last read: no path to resolve, and exact where a modification time has the
//! granularity of a clock tick; the file is opened again by its path at every read, so a marker
//! replaced by another file is noticed within [`REFRESH`]). Each record's hash is parsed when
//! the table is read, so a check is the hash function and a comparison. Every check costs the same
//! whether the name exists or not: the lookup is in memory either way, and an unknown name's secret
//! is verified against a dummy hash of the same format, so the time to refuse says nothing about
//! which token names exist.

use std::{
    collections::HashMap,
    fs::File,
    path::Path,
    sync::{
        Arc, LazyLock, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use async_trait::async_trait;
use sqlx::SqlitePool;
use time::OffsetDateTime;

use super::{AuthError, Authenticator, Credential, Identity, Principal, hash, hash::StoredHash};
use crate::{
    auth::tokens::{self, TokenRecord},
    sync::lock,
};

const REFRESH: Duration = Duration::from_secs(1);

/// What an unknown name's secret is verified against: the format we write, so the work is the
/// same as for a known name.
static DUMMY_HASH: LazyLock<String> =
    LazyLock::new(|| hash::hash_secret(&crate::validation::random_alnum(32)));
static DUMMY: LazyLock<StoredHash> =
    LazyLock::new(|| StoredHash::parse(&DUMMY_HASH).expect("a hash we wrote parses"));

/// A token record with its hash parsed (`None`: a hash that does not parse, which nothing matches).
struct Entry {
    record: TokenRecord,
    hash: Option<StoredHash>,
}

type Snapshot = Arc<HashMap<String, Entry>>;

struct Held {
    read_at: Instant,
    /// The marker's content before the table was read.
    changed: Option<Stamp>,
    /// The marker, open since that read (`None` when it could not be opened).
    marker: Option<Arc<File>>,
    records: Snapshot,
}

pub struct EmbeddedAuthenticator {
    pool: SqlitePool,
    /// The service-account tokens this store's token controller minted, verified as
    /// kube-apiserver verifies Secret-bound tokens.
    service_accounts: Option<ServiceAccountTokens>,
    changed_file: std::path::PathBuf,
    refresh: Duration,
    /// What a check reads, under a lock held only to copy two pointers out.
    snapshot: Mutex<Option<Held>>,
    /// Held by the one check that reads the table again; the others wait for its result.
    reading: tokio::sync::Mutex<()>,
    reads: AtomicU64,
}

/// The start of the marker's content ([`tokens::mark_changed`] writes a nanosecond stamp).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: usize,
    bytes: [u8; 64],
}

/// The marker's content, through the open file when there is one.
fn stamp(marker: Option<&File>, path: &Path) -> Option<Stamp> {
    use std::{io::Read, os::unix::fs::FileExt};
    let mut bytes = [0u8; 64];
    let len = match marker {
        Some(file) => file.read_at(&mut bytes, 0),
        None => File::open(path).and_then(|mut f| f.read(&mut bytes)),
    }
    .ok()?;
    Some(Stamp { len, bytes })
}

/// Opens the marker, creating it empty when it does not exist yet (creating it changes nothing a
/// writer wrote, and an empty marker differs from any stamp).
fn open_marker(path: &Path) -> Option<Arc<File>> {
    std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)
        .ok()
        .map(Arc::new)
}

impl EmbeddedAuthenticator {
    pub fn new(pool: SqlitePool, data_dir: &std::path::Path) -> Self {
        Self::with_refresh(pool, data_dir, REFRESH)
    }

    /// With another refresh interval (tests).
    pub fn with_refresh(pool: SqlitePool, data_dir: &std::path::Path, refresh: Duration) -> Self {
        EmbeddedAuthenticator {
            pool,
            service_accounts: None,
            changed_file: data_dir.join(tokens::CHANGED_FILE),
            refresh,
            snapshot: Mutex::new(None),
            reading: tokio::sync::Mutex::new(()),
            reads: AtomicU64::new(0),
        }
    }

    /// Also accept the service-account tokens `issuer` signs for `store`'s token Secrets.
    pub fn with_service_accounts(
        mut self,
        issuer: Arc<crate::issuer::Issuer>,
        store: Arc<dyn crate::store::ObjectStore>,
    ) -> Self {
        self.service_accounts = Some(ServiceAccountTokens { issuer, store });
        self
    }

    /// How many times the table was read (tests).
    pub fn table_reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// The held records if they are still current: read within the refresh interval, and the
    /// marker unchanged since.
    fn current(&self) -> Option<Snapshot> {
        let (changed, marker, records) = {
            let held = lock(&self.snapshot);
            let held = held
                .as_ref()
                .filter(|h| h.read_at.elapsed() < self.refresh)?;
            (held.changed, held.marker.clone(), held.records.clone())
        };
        (stamp(marker.as_deref(), &self.changed_file) == changed).then_some(records)
    }

    async fn records(&self) -> Result<Snapshot, AuthError> {
        if let Some(records) = self.current() {
            return Ok(records);
        }
        let _reading = self.reading.lock().await;
        // Read by the check this one waited for.
        if let Some(records) = self.current() {
            return Ok(records);
        }
        // The marker first: a change while the table is read is seen by the next check.
        let marker = open_marker(&self.changed_file);
        let changed = stamp(marker.as_deref(), &self.changed_file);
        let records: Snapshot = Arc::new(
            tokens::list(&self.pool)
                .await
                .map_err(|e| AuthError::Backend(Box::new(e)))?
                .into_iter()
                .map(|record| {
                    let hash = StoredHash::parse(&record.hash).ok();
                    (record.name.clone(), Entry { record, hash })
                })
                .collect(),
        );
        self.reads.fetch_add(1, Ordering::Relaxed);
        *lock(&self.snapshot) = Some(Held {
            read_at: Instant::now(),
            changed,
            marker,
            records: records.clone(),
        });
        Ok(records)
    }
}

/// The hash a presented secret is verified against: the record's, or the dummy for an unknown
/// name or an unparsable hash (then the answer is a refusal whatever the secret).
fn hash_to_check(entry: Option<&Entry>) -> &StoredHash {
    entry.and_then(|e| e.hash.as_ref()).unwrap_or(&DUMMY)
}

/// Verifies a service-account JWT of this store as kube-apiserver verifies a Secret-bound
/// (legacy) token: the signature and `exp`; the Secret it names exists with that UID, holds exactly
/// this token and has not reached its end (a cloud-config's expiry or rotation grace); its
/// ServiceAccount exists with that UID. A deleted Secret is a revoked token at once.
struct ServiceAccountTokens {
    issuer: Arc<crate::issuer::Issuer>,
    store: Arc<dyn crate::store::ObjectStore>,
}

impl ServiceAccountTokens {
    async fn review(&self, token: &str) -> Result<Principal, AuthError> {
        use k8s_openapi::api::core::v1::{Secret, ServiceAccount};

        use crate::{kubeconfig::objects, store::Api};
        let claims = self.issuer.verify(token).map_err(|_| AuthError::Invalid)?;
        let k = &claims.kubernetes;
        let bound = k.secret.as_ref().ok_or(AuthError::Invalid)?;
        let backend = |e: crate::store::StoreError| AuthError::Backend(Box::new(e));
        let secret = Api::<Secret>::new(self.store.clone())
            .get(&k.namespace, &bound.name)
            .await
            .map_err(backend)?
            .filter(|s| s.metadata.uid.as_deref() == Some(bound.uid.as_str()))
            .ok_or(AuthError::Invalid)?;
        let held = objects::secret_data(&secret, "token").unwrap_or_default();
        if !bool::from(subtle::ConstantTimeEq::ct_eq(
            held.as_slice(),
            token.as_bytes(),
        )) {
            return Err(AuthError::Invalid);
        }
        if objects::has_ended(&secret) {
            return Err(AuthError::Expired {
                name: format!("{}/{}", k.namespace, bound.name),
            });
        }
        let sa = Api::<ServiceAccount>::new(self.store.clone())
            .get(&k.namespace, &k.serviceaccount.name)
            .await
            .map_err(backend)?
            .filter(|sa| sa.metadata.uid.as_deref() == Some(k.serviceaccount.uid.as_str()))
            .ok_or(AuthError::Invalid)?;
        let uid = sa.metadata.uid.unwrap_or_default();
        Ok(Principal {
            name: claims.sub.clone(),
            identity: super::Identity::User {
                username: claims.sub,
                uid,
                groups: vec![
                    "system:serviceaccounts".into(),
                    format!("system:serviceaccounts:{}", k.namespace),
                    "system:authenticated".into(),
                ],
                extra: Default::default(),
            },
        })
    }
}

#[async_trait]
impl Authenticator for EmbeddedAuthenticator {
    async fn authenticate(&self, credential: &Credential) -> Result<Principal, AuthError> {
        // This store's own admin tokens, and the service-account tokens it minted.
        let token = match credential {
            Credential::Api(token) => token,
            Credential::Bearer(jwt) => {
                return match &self.service_accounts {
                    Some(tokens) => tokens.review(jwt).await,
                    None => Err(AuthError::Invalid),
                };
            }
        };
        let records = self.records().await?;
        let entry = records.get(&token.name);
        let matches = hash_to_check(entry).verify(&token.secret);
        // Check the secret before saying anything about the token's state.
        let Some(rec) = entry
            .filter(|e| matches && e.hash.is_some())
            .map(|e| &e.record)
        else {
            return Err(AuthError::Invalid);
        };
        if rec.revoked_at.is_some() {
            return Err(AuthError::Revoked {
                name: rec.name.clone(),
            });
        }
        if rec
            .expires_at
            .is_some_and(|e| e <= OffsetDateTime::now_utc())
        {
            return Err(AuthError::Expired {
                name: rec.name.clone(),
            });
        }
        Ok(Principal {
            name: rec.name.clone(),
            identity: Identity::Admin,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_record(name: &str, secret: &str) -> TokenRecord {
        TokenRecord {
            name: name.into(),
            hash: hash::hash_secret(secret),
            description: String::new(),
            created_at: OffsetDateTime::now_utc(),
            expires_at: None,
            revoked_at: None,
        }
    }

    /// An unknown name is checked against a hash of the very format a known name's is, so both
    /// refusals do the same work.
    #[test]
    fn unknown_names_verify_against_a_hash_like_any_other() {
        let known = mk_record("token-abcde", "s");
        let shape = |h: &str| {
            let parts: Vec<usize> = h.split(':').map(str::len).collect();
            (h.split(':').take(2).collect::<Vec<_>>().join(":"), parts)
        };
        assert_eq!(shape(&DUMMY_HASH), shape(&known.hash));
        let entry = Entry {
            hash: StoredHash::parse(&known.hash).ok(),
            record: known,
        };
        assert!(matches!(hash_to_check(None), StoredHash::Sha3 { .. }));
        assert!(!hash_to_check(None).verify("s"));
        assert!(hash_to_check(Some(&entry)).verify("s"));
        // A record whose hash does not parse is checked against the dummy too, and matches nothing.
        let broken = Entry {
            hash: None,
            record: mk_record("token-fghij", "s"),
        };
        assert!(matches!(
            hash_to_check(Some(&broken)),
            StoredHash::Sha3 { .. }
        ));
    }
}
