//! The embedded backend's authenticator: admin tokens from the SQLite `admin_tokens` table.
//!
//! Records are cached for one second so that the hot path does not query SQLite, while a token
//! revoked or created with `harvester-cloud token` (another process) takes effect within that second.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use sqlx::SqlitePool;
use time::OffsetDateTime;

use super::{AuthError, Authenticator, Credential, Identity, Principal, hash};
use crate::{
    auth::tokens::{self, TokenRecord},
    sync::lock,
};

const CACHE_TTL: Duration = Duration::from_secs(1);
const CACHE_MAX: usize = 10_000;

pub struct EmbeddedAuthenticator {
    pool: SqlitePool,
    cache: Mutex<HashMap<String, (Instant, TokenRecord)>>,
}

impl EmbeddedAuthenticator {
    pub fn new(pool: SqlitePool) -> Self {
        EmbeddedAuthenticator {
            pool,
            cache: Mutex::new(HashMap::new()),
        }
    }

    async fn record(&self, name: &str) -> Result<Option<TokenRecord>, AuthError> {
        {
            let cache = lock(&self.cache);
            if let Some((at, rec)) = cache.get(name)
                && at.elapsed() < CACHE_TTL
            {
                return Ok(Some(rec.clone()));
            }
        }
        let rec = tokens::get(&self.pool, name)
            .await
            .map_err(|e| AuthError::Backend(Box::new(e)))?;
        let mut cache = lock(&self.cache);
        if cache.len() >= CACHE_MAX {
            cache.retain(|_, (at, _)| at.elapsed() < CACHE_TTL);
        }
        match &rec {
            // Only known names are cached, so unknown names cannot grow the cache.
            Some(r) => {
                cache.insert(name.to_string(), (Instant::now(), r.clone()));
            }
            None => {
                cache.remove(name);
            }
        }
        Ok(rec)
    }
}

#[async_trait]
impl Authenticator for EmbeddedAuthenticator {
    async fn authenticate(&self, credential: &Credential) -> Result<Principal, AuthError> {
        // Only this store's own admin tokens exist here.
        let Credential::Api(token) = credential else {
            return Err(AuthError::Invalid);
        };
        let Some(rec) = self.record(&token.name).await? else {
            return Err(AuthError::Invalid);
        };
        // Check the secret before saying anything about the token's state.
        if !hash::verify(&token.secret, &rec.hash).unwrap_or(false) {
            return Err(AuthError::Invalid);
        }
        if rec.revoked_at.is_some() {
            return Err(AuthError::Revoked { name: rec.name });
        }
        if rec
            .expires_at
            .is_some_and(|e| e <= OffsetDateTime::now_utc())
        {
            return Err(AuthError::Expired { name: rec.name });
        }
        Ok(Principal {
            name: rec.name,
            identity: Identity::Admin,
        })
    }
}
