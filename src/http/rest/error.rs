//! Why a REST request about an object could not be served ([`RestError`]), and how a failed store
//! call becomes one ([`Place::failed`]). `http::error` decides the status codes.
//!
//! Where the objects live sets the wording: objects of the host (Harvester's) are spoken of as
//! the host's API did (`loadbalancer "x" not found`, the store's own words for a conflict); those
//! of a guest cluster as Kubernetes speaks of them, naming the cluster (`service ns/x not found in
//! guest cluster ns/c`, `Operation cannot be fulfilled on services "x"`). The two came from two
//! facades and are kept as they were.

use crate::{
    guest::{GuestError, admit, clusters},
    lb::admission::{AdmitError, store::admission_error},
    store::StoreError,
};

/// A store call of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    List,
    Get,
    Create,
    Update,
    Delete,
    /// Another read the request needed (`list the events of`).
    Read(&'static str),
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Action::List => "list",
            Action::Get => "get",
            Action::Create => "create",
            Action::Update => "update",
            Action::Delete => "delete",
            Action::Read(what) => what,
        })
    }
}

/// Where a request's objects live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// The host's own store (behind admission for IPPools and LoadBalancers).
    Host,
    /// A guest cluster of the embedded backend.
    Guest(clusters::ClusterKey),
}

/// A request about an object that could not be served.
#[derive(Debug, thiserror::Error)]
pub enum RestError {
    #[error("fail to decode {kind}: {reason}")]
    Decode { kind: &'static str, reason: String },
    /// A guest cluster of an invalid name.
    #[error(transparent)]
    ClusterName(#[from] clusters::ClusterNameError),
    /// An object name on the URL that no object of the kind can have.
    #[error("invalid {kind} {field} {value:?}: {reason}")]
    InvalidName {
        kind: &'static str,
        field: &'static str,
        value: String,
        reason: String,
    },
    /// `noun` is how the body is named: `object` on the host, the kind in a guest cluster.
    #[error("the {field} of the {noun} ({body}) does not match the {field} on the URL ({url})")]
    Mismatch {
        noun: &'static str,
        field: &'static str,
        body: String,
        url: String,
    },
    #[error("{kind} {name}: metadata.namespace: Required value")]
    MissingNamespace { kind: &'static str, name: String },
    #[error("{}", not_found(kind, namespace, name, cluster.as_ref()))]
    NotFound {
        kind: &'static str,
        namespace: String,
        name: String,
        cluster: Option<clusters::ClusterKey>,
    },
    #[error("guest cluster {0} not found")]
    ClusterNotFound(String),
    /// Kubernetes' conflict, naming the resource (`services`).
    #[error(
        "Operation cannot be fulfilled on {resource} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
    )]
    Conflict { resource: String, name: String },
    /// The host's admission refused the write (or could not decide).
    #[error(transparent)]
    Admission(#[from] AdmitError),
    /// The guest reconciler would refuse the write.
    #[error(transparent)]
    Refused(#[from] GuestError),
    #[error("cannot {action} {kind} {name}{}: {source}", of_cluster(cluster.as_ref()))]
    Store {
        action: Action,
        kind: &'static str,
        name: String,
        cluster: Option<clusters::ClusterKey>,
        source: Box<StoreError>,
    },
    /// A stored object that does not decode: the server's fault, not the request's.
    #[error("stored {kind} cannot be read: {reason}")]
    Stored {
        kind: String,
        reason: String,
        cluster: Option<clusters::ClusterKey>,
    },
    #[error(transparent)]
    DeleteCluster(Box<clusters::DeleteClusterError>),
}

fn not_found(
    kind: &str,
    namespace: &str,
    name: &str,
    cluster: Option<&clusters::ClusterKey>,
) -> String {
    match cluster {
        None => format!("{kind} \"{name}\" not found"),
        Some(cluster) => format!("{kind} {namespace}/{name} not found in guest cluster {cluster}"),
    }
}

fn of_cluster(cluster: Option<&clusters::ClusterKey>) -> String {
    cluster.map_or_else(String::new, |c| format!(" of guest cluster {c}"))
}

impl RestError {
    /// The store error behind a failure, if that is what it is.
    pub fn store_error(&self) -> Option<&StoreError> {
        match self {
            RestError::Store { source, .. } => Some(source),
            RestError::DeleteCluster(e) => match e.as_ref() {
                clusters::DeleteClusterError::List { source, .. }
                | clusters::DeleteClusterError::Delete { source, .. } => Some(source),
            },
            _ => None,
        }
    }

    /// What a client is told of a failure that is the server's: the detail goes to the log only.
    pub fn internal_summary(&self) -> String {
        const SEE_LOG: &str = "internal error, see the server log";
        match self {
            RestError::Store {
                action,
                kind,
                name,
                cluster: None,
                ..
            } => format!("cannot {action} {kind} {name}: {SEE_LOG}"),
            RestError::Store {
                cluster: Some(_), ..
            }
            | RestError::Stored {
                cluster: Some(_), ..
            }
            | RestError::DeleteCluster(_) => format!("guest cluster request failed: {SEE_LOG}"),
            RestError::Admission(_) => format!("admission could not be decided: {SEE_LOG}"),
            _ => SEE_LOG.into(),
        }
    }
}

impl Place {
    /// The guest cluster, if the objects live in one.
    pub fn cluster(&self) -> Option<&clusters::ClusterKey> {
        match self {
            Place::Host => None,
            Place::Guest(key) => Some(key),
        }
    }

    /// How a request body is named in messages.
    pub fn noun(&self, kind: &'static str) -> &'static str {
        match self {
            Place::Host => "object",
            Place::Guest(_) => kind,
        }
    }

    pub fn not_found(&self, kind: &'static str, namespace: &str, name: &str) -> RestError {
        RestError::NotFound {
            kind,
            namespace: namespace.into(),
            name: name.into(),
            cluster: self.cluster().cloned(),
        }
    }

    /// A failed store call about the object `namespace/name` of `kind` (`resource` is its plural),
    /// as a [`RestError`]. On the host: admission's refusal (or failure to decide) as such, and a
    /// missing object as not found whatever the call. In a guest cluster: a stale replace or a
    /// create of an existing object as Kubernetes' conflict, a replace or delete of a missing
    /// object as not found.
    pub fn failed(
        &self,
        action: Action,
        kind: &'static str,
        resource: &str,
        namespace: &str,
        name: &str,
    ) -> impl FnOnce(StoreError) -> RestError + use<> {
        let place = self.clone();
        let (resource, namespace, name) = (
            resource.to_string(),
            namespace.to_string(),
            name.to_string(),
        );
        move |e| {
            let e = match place {
                Place::Host => match admission_error(e) {
                    Ok(refusal) => return RestError::Admission(refusal),
                    Err(StoreError::NotFound { .. }) => {
                        return place.not_found(kind, &namespace, &name);
                    }
                    Err(e) => e,
                },
                Place::Guest(_) => match (action, e) {
                    (Action::Update, StoreError::Conflict { .. })
                    | (Action::Create, StoreError::AlreadyExists { .. }) => {
                        return RestError::Conflict { resource, name };
                    }
                    (Action::Update | Action::Delete, StoreError::NotFound { .. }) => {
                        return place.not_found(kind, &namespace, &name);
                    }
                    (_, e) => e,
                },
            };
            RestError::Store {
                action,
                kind,
                name,
                cluster: place.cluster().cloned(),
                source: Box::new(e),
            }
        }
    }

    /// The guest reconciler's refusal of a write, or its failure to read what it decides on.
    pub fn check_failed(
        &self,
        kind: &'static str,
    ) -> impl FnOnce(admit::CheckError) -> RestError + use<> {
        let cluster = self.cluster().cloned();
        move |e| match e {
            admit::CheckError::Refused(refusal) => RestError::Refused(refusal),
            admit::CheckError::Read {
                action,
                service,
                source,
            } => RestError::Store {
                action: Action::Read(action),
                kind,
                name: service,
                cluster,
                source: Box::new(source),
            },
        }
    }
}
