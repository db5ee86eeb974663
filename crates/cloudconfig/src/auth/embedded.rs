//! The embedded backend's authenticator: admin tokens from the SQLite `admin_tokens` table.
//!
//! The whole table (a handful of records) is held in memory and read again every second, and at
//! once when `harvester-cloud token` (another process) has changed it: it touches
//! [`tokens::CHANGED_FILE`], whose modification time every check looks at (one `stat`). Every check costs the same whether the name exists or not: the lookup is in memory
//! either way, and an unknown name's secret is verified against a dummy hash of the same format,
//! so the time to refuse says nothing about which token names exist.

use std::{
    collections::HashMap,
    sync::{
        Arc, LazyLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use async_trait::async_trait;
use sqlx::SqlitePool;
use time::OffsetDateTime;

use super::{AuthError, Authenticator, Credential, Identity, Principal, hash};
use crate::auth::tokens::{self, TokenRecord};

const REFRESH: Duration = Duration::from_secs(1);

/// What an unknown name's secret is verified against: the format we write, so the work is the
/// same as for a known name.
static DUMMY_HASH: LazyLock<String> =
    LazyLock::new(|| hash::hash_secret(&crate::validation::random_alnum(32)));

type Snapshot = Arc<HashMap<String, TokenRecord>>;

struct Held {
    read_at: Instant,
    changed: Option<std::time::SystemTime>,
    records: Snapshot,
}

pub struct EmbeddedAuthenticator {
    pool: SqlitePool,
    /// The service-account tokens this store's token controller minted, verified as
    /// kube-apiserver verifies Secret-bound tokens.
    service_accounts: Option<ServiceAccountTokens>,
    changed_file: std::path::PathBuf,
    refresh: Duration,
    snapshot: tokio::sync::Mutex<Option<Held>>,
    reads: AtomicU64,
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
            snapshot: tokio::sync::Mutex::new(None),
            reads: AtomicU64::new(0),
        }
    }

    /// How many times the table was read (tests).
    /// Also accept the service-account tokens `issuer` signs for `store`'s token Secrets.
    pub fn with_service_accounts(
        mut self,
        issuer: Arc<crate::issuer::Issuer>,
        store: Arc<dyn crate::store::ObjectStore>,
    ) -> Self {
        self.service_accounts = Some(ServiceAccountTokens { issuer, store });
        self
    }

    pub fn table_reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    async fn records(&self) -> Result<Snapshot, AuthError> {
        let changed = std::fs::metadata(&self.changed_file)
            .and_then(|m| m.modified())
            .ok();
        let mut current = self.snapshot.lock().await;
        if let Some(held) = current.as_ref()
            && held.read_at.elapsed() < self.refresh
            && held.changed == changed
        {
            return Ok(held.records.clone());
        }
        let records: Snapshot = Arc::new(
            tokens::list(&self.pool)
                .await
                .map_err(|e| AuthError::Backend(Box::new(e)))?
                .into_iter()
                .map(|r| (r.name.clone(), r))
                .collect(),
        );
        self.reads.fetch_add(1, Ordering::Relaxed);
        *current = Some(Held {
            read_at: Instant::now(),
            changed,
            records: records.clone(),
        });
        Ok(records)
    }
}

/// The hash a presented secret is verified against: the record's, or the dummy for an unknown
/// name (then the answer is a refusal whatever the secret).
fn hash_to_check(record: Option<&TokenRecord>) -> &str {
    record.map_or(DUMMY_HASH.as_str(), |r| r.hash.as_str())
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
        let record = records.get(&token.name);
        let matches = hash::verify(&token.secret, hash_to_check(record)).unwrap_or(false);
        // Check the secret before saying anything about the token's state.
        let Some(rec) = record.filter(|_| matches) else {
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
        let dummy = hash_to_check(None);
        let real = hash_to_check(Some(&known));
        let shape = |h: &str| {
            let parts: Vec<usize> = h.split(':').map(str::len).collect();
            (h.split(':').take(2).collect::<Vec<_>>().join(":"), parts)
        };
        assert_eq!(shape(dummy), shape(real));
        assert_eq!(hash::verify("s", dummy), Ok(false));
    }
}
