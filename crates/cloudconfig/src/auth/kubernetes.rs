//! Authentication on the Kubernetes backend, tried in order:
//!
//! 1. Rancher API tokens `token-xxxxx:secret`: the `tokens.management.cattle.io` object of that name,
//!    its secret verified against Rancher's stored formats (plain or hashed), refused when expired or
//!    disabled, and its user required to be a Rancher administrator (a GlobalRoleBinding to `admin`, or
//!    to `restricted-admin` when allowed). These are the tokens of the Rancher that runs in this
//!    cluster.
//! 2. Tokens of an external Rancher, `name:secret`, mirrored into this cluster as
//!    `clusterauthtokens.cluster.cattle.io` in `cattle-system` (Rancher does so when the cluster's
//!    authorized cluster endpoint is on), verified as rancher/kube-api-auth verifies them: enabled,
//!    not past `expiresAt`, the secret against the hash in the Secret `cattle-system/<name>` (key
//!    `hash`; older Rancher kept it in the object's `hash`), the user's ClusterUserAttribute
//!    enabled and its groups the user's groups. The user is then a Kubernetes user like a
//!    TokenReview's: every action is checked with SubjectAccessReviews.
//! 3. Any other bearer token: a TokenReview, after which every action is checked with a
//!    SubjectAccessReview per permission it needs.
//!
//! Results are cached briefly, keyed by a SHA-256 of the token, never by the token itself.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{
    Client,
    api::{Api, ApiResource, DynamicObject, ListParams, PostParams},
};
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tracing::debug;

use crate::sync::lock;

use super::{Action, AuthError, Authenticator, Credential, Identity, Principal, hash};

const RANCHER_GROUP: &str = "management.cattle.io";
const CLUSTER_GROUP: &str = "cluster.cattle.io";
/// Where Rancher mirrors cluster auth tokens and user attributes into a downstream cluster.
const CATTLE_SYSTEM: &str = "cattle-system";
const HASHED_ANNOTATION: &str = "authn.management.cattle.io/token-hashed";
/// How long a positive answer (an identity, an allowed permission) is reused.
const POSITIVE_TTL: Duration = Duration::from_secs(10);
/// How long a refusal is reused: short, so a fix (a new binding, a new token) shows quickly.
const NEGATIVE_TTL: Duration = Duration::from_secs(2);
const CACHE_MAX: usize = 10_000;

fn rancher(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: RANCHER_GROUP.into(),
        version: "v3".into(),
        api_version: format!("{RANCHER_GROUP}/v3"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

type Key = [u8; 32];

fn key_of(parts: &[&str]) -> Key {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    h.finalize().into()
}

/// A small expiring map; answers are cloned out.
struct Cache<V> {
    entries: Mutex<HashMap<Key, (Instant, Duration, V)>>,
}

impl<V: Clone> Cache<V> {
    fn new() -> Self {
        Cache {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, key: &Key) -> Option<V> {
        let entries = lock(&self.entries);
        entries
            .get(key)
            .filter(|(at, ttl, _)| at.elapsed() < *ttl)
            .map(|(_, _, v)| v.clone())
    }

    fn put(&self, key: Key, ttl: Duration, value: V) {
        let mut entries = lock(&self.entries);
        if entries.len() >= CACHE_MAX {
            entries.retain(|_, (at, ttl, _)| at.elapsed() < *ttl);
        }
        entries.insert(key, (Instant::now(), ttl, value));
    }
}

fn cattle_cluster(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: CLUSTER_GROUP.into(),
        version: "v3".into(),
        api_version: format!("{CLUSTER_GROUP}/v3"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// A cached refusal, re-created as an `AuthError` on each use.
#[derive(Clone)]
enum Refusal {
    Invalid,
    Expired(String),
    Disabled(String),
    UserDisabled(String),
    NotAdmin(String, String),
}

impl From<Refusal> for AuthError {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::Invalid => AuthError::Invalid,
            Refusal::Expired(name) => AuthError::Expired { name },
            Refusal::Disabled(name) => AuthError::Disabled { name },
            Refusal::UserDisabled(user) => AuthError::UserDisabled { user },
            Refusal::NotAdmin(user, roles) => AuthError::NotAdmin { user, roles },
        }
    }
}

pub struct KubeAuthenticator {
    client: Client,
    admin_roles: Vec<&'static str>,
    identities: Cache<Result<Principal, Refusal>>,
    decisions: Cache<bool>,
}

impl KubeAuthenticator {
    /// `allow_restricted_admin`: also accept Rancher's `restricted-admin` global role.
    pub fn new(client: Client, allow_restricted_admin: bool) -> Self {
        let mut admin_roles = vec!["admin"];
        if allow_restricted_admin {
            admin_roles.push("restricted-admin");
        }
        KubeAuthenticator {
            client,
            admin_roles,
            identities: Cache::new(),
            decisions: Cache::new(),
        }
    }

    /// `None` when this cluster's Rancher has no Token of that name.
    async fn rancher_token(
        &self,
        name: &str,
        secret: &str,
    ) -> Result<Option<Result<Principal, Refusal>>, AuthError> {
        let tokens: Api<DynamicObject> =
            Api::all_with(self.client.clone(), &rancher("Token", "tokens"));
        let Some(token) = tokens.get_opt(name).await.map_err(AuthError::backend)? else {
            return Ok(None);
        };
        Ok(Some(self.verify_rancher_token(name, secret, &token).await?))
    }

    async fn verify_rancher_token(
        &self,
        name: &str,
        secret: &str,
        token: &DynamicObject,
    ) -> Result<Result<Principal, Refusal>, AuthError> {
        let field = |f: &str| token.data.get(f).cloned().unwrap_or(Value::Null);
        let stored = field("token").as_str().unwrap_or_default().to_string();
        let hashed = token
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(HASHED_ANNOTATION))
            .is_some_and(|v| v == "true");
        let matches = if hashed {
            verified(secret, &stored).await?
        } else {
            !stored.is_empty() && bool::from(stored.as_bytes().ct_eq(secret.as_bytes()))
        };
        if !matches {
            return Ok(Err(Refusal::Invalid));
        }
        // Only after the secret matched does the answer say anything about the token.
        if field("enabled").as_bool() == Some(false) {
            return Ok(Err(Refusal::Disabled(name.into())));
        }
        if token_expired(token) {
            return Ok(Err(Refusal::Expired(name.into())));
        }
        let user = field("userId").as_str().unwrap_or_default().to_string();
        if user.is_empty() {
            return Ok(Err(Refusal::Invalid));
        }
        let grbs: Api<DynamicObject> = Api::all_with(
            self.client.clone(),
            &rancher("GlobalRoleBinding", "globalrolebindings"),
        );
        let bindings = grbs
            .list(&ListParams::default())
            .await
            .map_err(AuthError::backend)?;
        let admin = bindings.items.iter().any(|b| {
            b.data.get("userName").and_then(Value::as_str) == Some(user.as_str())
                && b.data
                    .get("globalRoleName")
                    .and_then(Value::as_str)
                    .is_some_and(|r| self.admin_roles.contains(&r))
        });
        if !admin {
            return Ok(Err(Refusal::NotAdmin(user, self.admin_roles.join(" or "))));
        }
        Ok(Ok(Principal {
            name: user,
            identity: Identity::Admin,
        }))
    }

    /// `None` when Rancher mirrored no ClusterAuthToken of that name into this cluster.
    async fn cluster_auth_token(
        &self,
        name: &str,
        secret: &str,
    ) -> Result<Option<Result<Principal, Refusal>>, AuthError> {
        // kube-api-auth accepts Rancher's `ext/` token names too.
        let name = name.strip_prefix("ext/").unwrap_or(name);
        if crate::validation::dns1123_subdomain(name).is_err() {
            return Ok(None);
        }
        let tokens: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            CATTLE_SYSTEM,
            &cattle_cluster("ClusterAuthToken", "clusterauthtokens"),
        );
        let Some(token) = tokens.get_opt(name).await.map_err(AuthError::backend)? else {
            return Ok(None);
        };
        let field = |f: &str| token.data.get(f).cloned().unwrap_or(Value::Null);
        let mut stored = field("hash").as_str().unwrap_or_default().to_string();
        if stored.is_empty() {
            let secrets: Api<k8s_openapi::api::core::v1::Secret> =
                Api::namespaced(self.client.clone(), CATTLE_SYSTEM);
            if let Some(s) = secrets.get_opt(name).await.map_err(AuthError::backend)? {
                stored = s
                    .data
                    .and_then(|d| {
                        d.get("hash")
                            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                    })
                    .unwrap_or_default();
            }
        }
        if stored.is_empty() || !verified(secret, &stored).await? {
            return Ok(Some(Err(Refusal::Invalid)));
        }
        // Only after the secret matched does the answer say anything about the token.
        if field("enabled").as_bool() != Some(true) {
            return Ok(Some(Err(Refusal::Disabled(name.into()))));
        }
        if let Some(at) = field("expiresAt").as_str().filter(|s| !s.is_empty()) {
            let parsed =
                time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339);
            if parsed.is_err() || parsed.is_ok_and(|t| t <= time::OffsetDateTime::now_utc()) {
                return Ok(Some(Err(Refusal::Expired(name.into()))));
            }
        }
        let user = field("userName").as_str().unwrap_or_default().to_string();
        if user.is_empty() || crate::validation::dns1123_subdomain(&user).is_err() {
            return Ok(Some(Err(Refusal::Invalid)));
        }
        let attributes: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            CATTLE_SYSTEM,
            &cattle_cluster("ClusterUserAttribute", "clusteruserattributes"),
        );
        let Some(attribute) = attributes
            .get_opt(&user)
            .await
            .map_err(AuthError::backend)?
        else {
            return Ok(Some(Err(Refusal::UserDisabled(user))));
        };
        if attribute.data.get("enabled").and_then(Value::as_bool) != Some(true) {
            return Ok(Some(Err(Refusal::UserDisabled(user))));
        }
        let mut groups: Vec<String> = attribute
            .data
            .get("groups")
            .and_then(Value::as_array)
            .map(|g| {
                g.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        // As kube-apiserver adds it to every authenticated user.
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".into());
        }
        Ok(Some(Ok(Principal {
            name: user.clone(),
            identity: Identity::User {
                username: user,
                uid: String::new(),
                groups,
                extra: Default::default(),
            },
        })))
    }

    async fn token_review(&self, token: &str) -> Result<Result<Principal, Refusal>, AuthError> {
        let reviews: Api<TokenReview> = Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        let result = reviews
            .create(&PostParams::default(), &review)
            .await
            .map_err(AuthError::backend)?;
        let status = result.status.unwrap_or_default();
        match (status.authenticated, status.user) {
            (Some(true), Some(user)) => {
                let username = user.username.unwrap_or_default();
                Ok(Ok(Principal {
                    name: username.clone(),
                    identity: Identity::User {
                        username,
                        uid: user.uid.unwrap_or_default(),
                        groups: user.groups.unwrap_or_default(),
                        extra: user.extra.unwrap_or_default().into_iter().collect(),
                    },
                }))
            }
            _ => {
                debug!(
                    error = status.error.unwrap_or_default(),
                    "token review refused the token"
                );
                Ok(Err(Refusal::Invalid))
            }
        }
    }
}

/// Whether `secret` matches a stored Rancher hash; a busy slow lane (a flood of scrypt checks) is
/// a failure to decide, not a refusal.
async fn verified(secret: &str, stored: &str) -> Result<bool, AuthError> {
    match hash::verify_async(secret, stored).await {
        Ok(matches) => Ok(matches),
        Err(hash::VerifyError::Hash(_)) => Ok(false),
        Err(e @ hash::VerifyError::Busy) => Err(AuthError::Busy(e.to_string())),
    }
}

/// Rancher marks expiry three ways: `expired`, an `expiresAt` in the past, or `ttl` (ms) elapsed since
/// creation.
fn token_expired(token: &DynamicObject) -> bool {
    let now = time::OffsetDateTime::now_utc();
    if token.data.get("expired").and_then(Value::as_bool) == Some(true) {
        return true;
    }
    let parse = |s: &str| {
        time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()
    };
    if let Some(at) = token
        .data
        .get("expiresAt")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        // An unreadable expiry is treated as expired rather than as eternal.
        return parse(at).is_none_or(|at| at <= now);
    }
    let ttl_ms = token.data.get("ttl").and_then(Value::as_i64).unwrap_or(0);
    if ttl_ms > 0 {
        let created = token
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_second());
        return created.is_none_or(|c| c.saturating_add(ttl_ms / 1000) <= now.unix_timestamp());
    }
    false
}

#[async_trait]
impl Authenticator for KubeAuthenticator {
    async fn authenticate(&self, credential: &Credential) -> Result<Principal, AuthError> {
        let key = key_of(&["identity", &credential.secret_text()]);
        if let Some(cached) = self.identities.get(&key) {
            return cached.map_err(AuthError::from);
        }
        let answer = match credential {
            Credential::Api(t) => {
                let found = if t.has_rancher_name() {
                    self.rancher_token(&t.name, &t.secret).await?
                } else {
                    None
                };
                match found {
                    Some(answer) => answer,
                    None => match self.cluster_auth_token(&t.name, &t.secret).await? {
                        Some(answer) => answer,
                        // Neither Rancher's: maybe the cluster knows it.
                        None if t.has_rancher_name() => Err(Refusal::Invalid),
                        None => self.token_review(&t.expose()).await?,
                    },
                }
            }
            Credential::Bearer(b) => self.token_review(b).await?,
        };
        let ttl = if answer.is_ok() {
            POSITIVE_TTL
        } else {
            NEGATIVE_TTL
        };
        self.identities.put(key, ttl, answer.clone());
        answer.map_err(AuthError::from)
    }

    async fn authorize(&self, principal: &Principal, action: &Action<'_>) -> Result<(), AuthError> {
        let Identity::User {
            username,
            uid,
            groups,
            extra,
        } = &principal.identity
        else {
            return Ok(());
        };
        let reviews: Api<SubjectAccessReview> = Api::all(self.client.clone());
        for p in action.permissions() {
            let extras = serde_json::to_string(extra).unwrap_or_default();
            let key = key_of(&[
                "decision",
                username,
                uid,
                &groups.join(","),
                &extras,
                p.verb,
                p.group,
                p.resource,
                p.namespace.unwrap_or(""),
            ]);
            let allowed = match self.decisions.get(&key) {
                Some(allowed) => allowed,
                None => {
                    let review = SubjectAccessReview {
                        spec: SubjectAccessReviewSpec {
                            user: Some(username.clone()),
                            uid: Some(uid.clone()).filter(|u| !u.is_empty()),
                            groups: Some(groups.clone()),
                            extra: Some(extra.clone().into_iter().collect()),
                            resource_attributes: Some(ResourceAttributes {
                                verb: Some(p.verb.into()),
                                group: Some(p.group.into()),
                                resource: Some(p.resource.into()),
                                namespace: p.namespace.map(str::to_string),
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                        ..Default::default()
                    };
                    let result = reviews
                        .create(&PostParams::default(), &review)
                        .await
                        .map_err(AuthError::backend)?;
                    let allowed = result.status.is_some_and(|s| s.allowed);
                    self.decisions.put(
                        key,
                        if allowed { POSITIVE_TTL } else { NEGATIVE_TTL },
                        allowed,
                    );
                    allowed
                }
            };
            if !allowed {
                return Err(AuthError::Forbidden {
                    user: username.clone(),
                    verb: p.verb.into(),
                    group: p.group.into(),
                    resource: p.resource.into(),
                    namespace: p.namespace.map(str::to_string),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_token(data: Value, created: &str) -> DynamicObject {
        let mut obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "management.cattle.io/v3", "kind": "Token",
            "metadata": {"name": "token-abcde", "creationTimestamp": created},
        }))
        .unwrap();
        obj.data = data;
        obj
    }

    #[test]
    fn expiry_rules() {
        let recent = time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap();
        assert!(!token_expired(&mk_token(serde_json::json!({}), &recent)));
        assert!(token_expired(&mk_token(
            serde_json::json!({"expired": true}),
            &recent
        )));
        assert!(token_expired(&mk_token(
            serde_json::json!({"expiresAt": "2000-01-01T00:00:00Z"}),
            &recent
        )));
        assert!(!token_expired(&mk_token(
            serde_json::json!({"expiresAt": "2999-01-01T00:00:00Z"}),
            &recent
        )));
        assert!(token_expired(&mk_token(
            serde_json::json!({"expiresAt": "garbage"}),
            &recent
        )));
        assert!(token_expired(&mk_token(
            serde_json::json!({"ttl": 1000}),
            "2000-01-01T00:00:00Z"
        )));
        assert!(!token_expired(&mk_token(
            serde_json::json!({"ttl": 3_600_000}),
            &recent
        )));
        assert!(!token_expired(&mk_token(
            serde_json::json!({"ttl": 0}),
            "2000-01-01T00:00:00Z"
        )));
    }

    #[test]
    fn cache_keys_do_not_contain_the_token() {
        let k = key_of(&["identity", "token-abcde:secret"]);
        assert_ne!(k, key_of(&["identity", "token-abcde:secreT"]));
        assert!(!k.windows(6).any(|w| w == b"secret"));
    }
}
