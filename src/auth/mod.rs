//! Authentication of API callers: admin tokens (`token-xxxxx:secret`) checked against stored hashes.
//!
//! Backends provide an [`Authenticator`]; the HTTP layer only sees a [`Principal`] or an [`AuthError`].

pub mod embedded;
pub mod hash;
pub mod token;

use async_trait::async_trait;

pub use token::ApiToken;

/// Who made a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// The token name (never its secret), or the user it belongs to.
    pub name: String,
}

/// Why a request was not authenticated. Messages are safe to return to the client.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("must authenticate: no bearer token in the Authorization header")]
    Missing,
    #[error("must authenticate: the Authorization header is not a token-xxxxx:secret bearer token")]
    Malformed,
    #[error("invalid token")]
    Invalid,
    #[error("token {name} is expired")]
    Expired { name: String },
    #[error("token {name} is revoked")]
    Revoked { name: String },
    #[error("authentication backend failed: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl AuthError {
    /// A short label for logs and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::Missing => "missing",
            AuthError::Malformed => "malformed",
            AuthError::Invalid => "invalid",
            AuthError::Expired { .. } => "expired",
            AuthError::Revoked { .. } => "revoked",
            AuthError::Backend(_) => "backend",
        }
    }
}

#[async_trait]
pub trait Authenticator: Send + Sync + 'static {
    async fn authenticate(&self, token: &ApiToken) -> Result<Principal, AuthError>;
}
