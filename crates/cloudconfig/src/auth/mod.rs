//! Authentication and authorization of API callers.
//!
//! Backends provide an [`Authenticator`]: the embedded one knows its own admin tokens; the Kubernetes
//! one checks Rancher API tokens and, for any other bearer token, asks the cluster (TokenReview, then
//! SubjectAccessReview for what the request is about to do). The HTTP layer only sees a
//! [`Principal`] or an [`AuthError`].
//!
//! The embedded backend's admin tokens are records in its database ([`tokens`], hashes only),
//! managed from the command line ([`cli`]).

pub mod embedded;
pub mod hash;
pub mod kubernetes;
pub mod token;
pub mod tokens;

use std::collections::BTreeMap;

use async_trait::async_trait;

pub use token::{ApiToken, Credential};

/// Who made a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// The token name or user name (never a secret), for logs.
    pub name: String,
    pub identity: Identity,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// An administrator: an embedded admin token, or a Rancher global admin.
    Admin,
    /// A Kubernetes user (from TokenReview), whose every action is checked with the cluster's RBAC.
    User {
        username: String,
        uid: String,
        groups: Vec<String>,
        extra: BTreeMap<String, Vec<String>>,
    },
}

/// What a request is about to do, for authorization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action<'a> {
    /// POST: create the account's objects in `namespace`.
    CreateAccount {
        namespace: &'a str,
    },
    /// GET: read the account (its token included).
    ReadAccount {
        namespace: &'a str,
    },
    /// DELETE: remove the account's objects.
    DeleteAccount {
        namespace: &'a str,
    },
    RotateAccount {
        namespace: &'a str,
    },
    /// An IPPool or LoadBalancer route: the one permission the request needs on that resource
    /// (`namespace` `None`: cluster-wide).
    Object {
        verb: &'static str,
        resource: &'static str,
        namespace: Option<&'a str>,
    },
}

/// One permission, as Kubernetes RBAC spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permission<'a> {
    pub verb: &'static str,
    pub group: &'static str,
    pub resource: &'static str,
    /// `None` for cluster-scoped resources.
    pub namespace: Option<&'a str>,
}

impl<'a> Action<'a> {
    /// Everything the action needs, in the order it is checked.
    pub fn permissions(&self) -> Vec<Permission<'a>> {
        let p = |verb, group, resource, namespace| Permission {
            verb,
            group,
            resource,
            namespace,
        };
        const RBAC: &str = "rbac.authorization.k8s.io";
        match *self {
            Action::CreateAccount { namespace } => vec![
                p("create", "", "serviceaccounts", Some(namespace)),
                p("create", "", "secrets", Some(namespace)),
                p("create", RBAC, "rolebindings", Some(namespace)),
                p("create", RBAC, "clusterrolebindings", None),
            ],
            Action::ReadAccount { namespace } => vec![
                p("get", "", "serviceaccounts", Some(namespace)),
                p("get", "", "secrets", Some(namespace)),
            ],
            Action::RotateAccount { namespace } => vec![
                p("create", "", "secrets", Some(namespace)),
                p("update", "", "serviceaccounts", Some(namespace)),
                p("update", "", "secrets", Some(namespace)),
                p("delete", "", "secrets", Some(namespace)),
            ],
            Action::DeleteAccount { namespace } => vec![
                p("delete", "", "serviceaccounts", Some(namespace)),
                p("delete", "", "secrets", Some(namespace)),
                p("delete", RBAC, "rolebindings", Some(namespace)),
                p("delete", RBAC, "clusterrolebindings", None),
            ],
            Action::Object {
                verb,
                resource,
                namespace,
            } => vec![p(verb, "loadbalancer.harvesterhci.io", resource, namespace)],
        }
    }
}

/// Why a request was not authenticated or not allowed. Messages are safe to return to the client.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("must authenticate: no bearer token in the Authorization header")]
    Missing,
    #[error(
        "must authenticate: the Authorization header is not a bearer token or Basic credentials"
    )]
    Malformed,
    #[error("invalid token")]
    Invalid,
    #[error("token {name} is expired")]
    Expired { name: String },
    #[error("token {name} is revoked")]
    Revoked { name: String },
    #[error("token {name} is disabled")]
    Disabled { name: String },
    #[error("user {user:?} is disabled")]
    UserDisabled { user: String },
    #[error("user {user:?} is not a Rancher administrator (no GlobalRoleBinding to {roles})")]
    NotAdmin { user: String, roles: String },
    /// A route only admins use, asked by an authenticated user who is none (a cloud-config
    /// token, on either backend): not a question of Rancher's roles.
    #[error(
        "user {user:?} may not use this route: it is for the service's admin tokens and Rancher administrators"
    )]
    AdminOnly { user: String },
    #[error(
        "user {user:?} cannot {verb} resource {resource:?} in API group {group:?}{}",
        namespace.as_ref().map(|n| format!(" in the namespace {n:?}")).unwrap_or_else(|| " at the cluster scope".into())
    )]
    Forbidden {
        user: String,
        verb: String,
        group: String,
        resource: String,
        namespace: Option<String>,
    },
    /// A request through the Rancher tunnel whose caller could not be identified: 403, not 401, on
    /// that path (the dashboard logs its user out on a 401, and Rancher has authenticated them).
    #[error("the caller Rancher forwarded was not identified: {why}")]
    Unidentified { why: String },
    /// Too many slow token checks are waiting: 503 with a Retry-After.
    #[error("{0}")]
    Busy(String),
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
            AuthError::Disabled { .. } => "disabled",
            AuthError::UserDisabled { .. } => "user_disabled",
            AuthError::NotAdmin { .. } => "not_admin",
            AuthError::AdminOnly { .. } => "admin_only",
            AuthError::Forbidden { .. } => "forbidden",
            AuthError::Unidentified { .. } => "unidentified",
            AuthError::Busy(_) => "busy",
            AuthError::Backend(_) => "backend",
        }
    }

    /// Whether the caller is known but not allowed (403) rather than unknown (401).
    pub fn is_forbidden(&self) -> bool {
        matches!(
            self,
            AuthError::NotAdmin { .. }
                | AuthError::AdminOnly { .. }
                | AuthError::Forbidden { .. }
                | AuthError::Unidentified { .. }
        )
    }

    pub fn backend(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        AuthError::Backend(Box::new(e))
    }

    /// The same refusal as a tunnelled request must see it: never a 401.
    pub fn on_tunnel(self) -> Self {
        if self.is_forbidden() || matches!(self, AuthError::Backend(_) | AuthError::Busy(_)) {
            self
        } else {
            AuthError::Unidentified {
                why: self.to_string(),
            }
        }
    }
}

#[async_trait]
pub trait Authenticator: Send + Sync + 'static {
    async fn authenticate(&self, credential: &Credential) -> Result<Principal, AuthError>;

    /// Whether `principal` may do `action`. Administrators may do everything.
    async fn authorize(&self, principal: &Principal, action: &Action<'_>) -> Result<(), AuthError> {
        match &principal.identity {
            Identity::Admin => Ok(()),
            Identity::User { username, .. } => {
                let first = action.permissions().into_iter().next();
                Err(match first {
                    Some(p) => AuthError::Forbidden {
                        user: username.clone(),
                        verb: p.verb.into(),
                        group: p.group.into(),
                        resource: p.resource.into(),
                        namespace: p.namespace.map(str::to_string),
                    },
                    None => AuthError::Invalid,
                })
            }
        }
    }
}
