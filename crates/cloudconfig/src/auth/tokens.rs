//! Admin API token records of the embedded backend (`admin_tokens` table). Only hashes are stored.

use sqlx::{Row, SqlitePool, sqlite::SqliteRow};
use time::{OffsetDateTime, format_description::well_known::Rfc3339};

use super::{hash, token::ApiToken};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRecord {
    pub name: String,
    pub hash: String,
    pub description: String,
    pub created_at: OffsetDateTime,
    pub expires_at: Option<OffsetDateTime>,
    pub revoked_at: Option<OffsetDateTime>,
}

#[derive(Debug, thiserror::Error)]
pub enum TokenStoreError {
    #[error("token {name} not found")]
    NotFound { name: String },
    #[error("token store failed: {0}")]
    Database(#[from] sqlx::Error),
    #[error("token record {name} has a malformed timestamp")]
    Timestamp { name: String },
}

fn fmt(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}

fn parse(name: &str, s: Option<String>) -> Result<Option<OffsetDateTime>, TokenStoreError> {
    s.map(|s| OffsetDateTime::parse(&s, &Rfc3339))
        .transpose()
        .map_err(|_| TokenStoreError::Timestamp { name: name.into() })
}

fn record(row: SqliteRow) -> Result<TokenRecord, TokenStoreError> {
    let name: String = row.get("name");
    Ok(TokenRecord {
        created_at: parse(&name, Some(row.get("created_at")))?
            .unwrap_or(OffsetDateTime::UNIX_EPOCH),
        expires_at: parse(&name, row.get("expires_at"))?,
        revoked_at: parse(&name, row.get("revoked_at"))?,
        hash: row.get("hash"),
        description: row.get("description"),
        name,
    })
}

impl TokenRecord {
    pub fn status(&self, now: OffsetDateTime) -> &'static str {
        if self.revoked_at.is_some() {
            "revoked"
        } else if self.expires_at.is_some_and(|e| e <= now) {
            "expired"
        } else {
            "active"
        }
    }
}

/// Creates a new token, retrying on the rare name collision, and returns it (the only time the secret
/// exists outside the client).
pub async fn create(
    pool: &SqlitePool,
    description: &str,
    ttl: Option<time::Duration>,
) -> Result<(ApiToken, TokenRecord), TokenStoreError> {
    loop {
        let token = ApiToken::generate();
        let now = OffsetDateTime::now_utc()
            .replace_nanosecond(0)
            .unwrap_or(OffsetDateTime::UNIX_EPOCH);
        let rec = TokenRecord {
            name: token.name.clone(),
            hash: hash::hash_secret(&token.secret),
            description: description.to_string(),
            created_at: now,
            expires_at: ttl.map(|d| now + d),
            revoked_at: None,
        };
        let res = sqlx::query(
            "INSERT INTO admin_tokens (name, hash, description, created_at, expires_at) VALUES (?, ?, ?, ?, ?)
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(&rec.name)
        .bind(&rec.hash)
        .bind(&rec.description)
        .bind(fmt(rec.created_at))
        .bind(rec.expires_at.map(fmt))
        .execute(pool)
        .await?;
        if res.rows_affected() == 1 {
            return Ok((token, rec));
        }
    }
}

/// The file a `token` command writes after it changed the table, beside the database, so that
/// a running server reads the table again at once (it compares the file's content, a stamp that
/// differs at every write, on each request).
pub(crate) const CHANGED_FILE: &str = "admin-tokens.changed";

/// Marks the token table changed (see [`CHANGED_FILE`]); a failure only delays the server's
/// noticing to its next periodic read.
pub fn mark_changed(data_dir: &std::path::Path) {
    // The time, and a random tail should two writes ever read the same clock.
    let stamp = format!(
        "{} {}",
        time::OffsetDateTime::now_utc().unix_timestamp_nanos(),
        crate::validation::random_alnum(8)
    );
    let path = data_dir.join(CHANGED_FILE);
    if let Err(e) = std::fs::write(&path, stamp) {
        tracing::warn!(path = %path.display(), error = %e, "cannot mark the token table changed");
    }
}

pub async fn get(pool: &SqlitePool, name: &str) -> Result<Option<TokenRecord>, TokenStoreError> {
    sqlx::query("SELECT * FROM admin_tokens WHERE name = ?")
        .bind(name)
        .fetch_optional(pool)
        .await?
        .map(record)
        .transpose()
}

pub async fn list(pool: &SqlitePool) -> Result<Vec<TokenRecord>, TokenStoreError> {
    sqlx::query("SELECT * FROM admin_tokens ORDER BY created_at, name")
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(record)
        .collect()
}

pub async fn count(pool: &SqlitePool) -> Result<i64, TokenStoreError> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM admin_tokens")
        .fetch_one(pool)
        .await?)
}

/// Revokes a token; revoking a revoked token is a no-op that succeeds.
pub async fn revoke(pool: &SqlitePool, name: &str) -> Result<TokenRecord, TokenStoreError> {
    let now = OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    sqlx::query("UPDATE admin_tokens SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL")
        .bind(fmt(now))
        .bind(name)
        .execute(pool)
        .await?;
    get(pool, name)
        .await?
        .ok_or_else(|| TokenStoreError::NotFound { name: name.into() })
}
