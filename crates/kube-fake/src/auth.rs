//! Authentication: static user tokens (the admin is in `system:masters`), service-account tokens
//! minted by the token controller (legacy Secret tokens) or by TokenRequest (bound, expiring), and
//! impersonation headers checked against RBAC like the real server.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use serde_json::{Value, json};

/// The audience the API server itself accepts (`--api-audiences`).
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// An authenticated user, as TokenReview reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Identity {
    /// `admin`, `system:serviceaccount:<ns>:<name>`, ...
    pub username: String,
    /// User UID (the ServiceAccount's UID for service accounts).
    pub uid: String,
    /// Groups, always including `system:authenticated` for authenticated users.
    pub groups: Vec<String>,
    /// Extra attributes (credential id of bound tokens).
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Identity {
    /// A plain user with groups (plus `system:authenticated`).
    pub fn user(name: &str, groups: &[&str]) -> Self {
        let mut g: Vec<String> = groups.iter().map(|s| s.to_string()).collect();
        if !g.iter().any(|x| x == "system:authenticated") {
            g.push("system:authenticated".into());
        }
        Self {
            username: name.into(),
            uid: String::new(),
            groups: g,
            extra: BTreeMap::new(),
        }
    }

    /// The identity of a service account.
    pub fn service_account(namespace: &str, name: &str, uid: &str) -> Self {
        Self {
            username: format!("system:serviceaccount:{namespace}:{name}"),
            uid: uid.into(),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
            extra: BTreeMap::new(),
        }
    }

    /// Members of `system:masters` bypass escalation checks, as on the real server.
    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }

    /// The `user` object of TokenReview / SelfSubjectReview status.
    pub fn to_json(&self) -> Value {
        let mut u = json!({"username": self.username, "groups": self.groups});
        if !self.uid.is_empty() {
            u["uid"] = json!(self.uid);
        }
        if !self.extra.is_empty() {
            u["extra"] = json!(self.extra);
        }
        u
    }
}

/// What a known token stands for.
#[derive(Debug, Clone)]
pub enum TokenKind {
    /// A fixed user (the admin, or a test user).
    Static(Identity),
    /// A legacy token stored in a `kubernetes.io/service-account-token` Secret.
    Legacy {
        /// Namespace of the Secret and ServiceAccount.
        namespace: String,
        /// The Secret holding the token.
        secret: String,
        /// ServiceAccount name.
        sa_name: String,
        /// ServiceAccount UID the token was minted for.
        sa_uid: String,
    },
    /// A TokenRequest token.
    Bound {
        /// Namespace of the ServiceAccount.
        namespace: String,
        /// ServiceAccount name.
        sa_name: String,
        /// ServiceAccount UID the token was minted for.
        sa_uid: String,
        /// Expiry, Unix seconds.
        expires: i64,
        /// Audiences the token is valid for.
        audiences: Vec<String>,
        /// The JWT id, reported as the credential id.
        jti: String,
    },
}

/// A JWT-shaped token with the given claims and a random signature; the fake validates tokens by
/// lookup, but clients that decode claims see what a real issuer would put there.
pub fn mint_jwt(claims: &Value) -> String {
    let header = json!({"alg": "RS256", "kid": "kube-fake"});
    let mut sig = [0u8; 32];
    rand::rng().fill_bytes(&mut sig);
    format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string()),
        URL_SAFE_NO_PAD.encode(sig)
    )
}

/// A random opaque token for static users.
pub fn random_token() -> String {
    let mut b = [0u8; 24];
    rand::rng().fill_bytes(&mut b);
    URL_SAFE_NO_PAD.encode(b)
}

/// The bearer token of an `Authorization` header value.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let h = header?.trim();
    let (scheme, token) = h.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}
