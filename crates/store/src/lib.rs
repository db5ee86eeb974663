//! The store port: Kubernetes-shaped objects with resourceVersion, optimistic concurrency and a change
//! feed, behind one trait that both backends implement (embedded SQLite, and later the Kubernetes API).
//!
//! The port speaks JSON objects plus a [`Kind`] descriptor so it stays object-safe; [`Api`] is the typed
//! facade that domain code uses.
#![forbid(unsafe_code)]

pub mod issuer;
pub mod sync;
pub mod validation;

// The crates below this one, under the names the modules use.
use harvester_cloud_metrics as metrics;

pub mod admitted;
pub mod cluster_view;
pub mod embedded;
pub mod kubernetes;
pub mod selector;
pub mod watcher;

use std::{any::TypeId, borrow::Cow, fmt, sync::Arc, time::Duration};

use async_trait::async_trait;
use futures::stream::BoxStream;
use k8s_openapi::NamespaceResourceScope;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

pub use selector::LabelSelector;

/// Identifies a resource type: its group, version, kind, plural and scope, as a Kubernetes client
/// would need them to build a URL.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Kind {
    pub group: Cow<'static, str>,
    pub version: Cow<'static, str>,
    pub api_version: Cow<'static, str>,
    pub kind: Cow<'static, str>,
    pub plural: Cow<'static, str>,
    pub namespaced: bool,
    /// Whether `status` is a subresource: plain replaces keep the stored status.
    pub status_subresource: bool,
    /// How Kubernetes validates names of this kind.
    pub names: NameRule,
}

/// Kubernetes' name validation differs per kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NameRule {
    /// RFC 1123 subdomain: most kinds.
    Subdomain,
    /// Any URL path segment: RBAC roles and bindings (`harvesterhci.io:cloudprovider`).
    PathSegment,
}

impl NameRule {
    pub fn check(self, name: &str) -> Result<(), String> {
        match self {
            NameRule::Subdomain => crate::validation::dns1123_subdomain(name),
            NameRule::PathSegment => crate::validation::path_segment_name(name),
        }
    }
}

/// Built-in kinds whose `status` is a subresource. Custom resources say so themselves
/// ([`Kind::with_status_subresource`]).
const CORE_STATUS_SUBRESOURCE: &[&str] = &[
    "Service",
    "Namespace",
    "Pod",
    "Node",
    "PersistentVolumeClaim",
];

impl Kind {
    /// The descriptor of a k8s-openapi or kube-derive type.
    pub fn of<K: Object>() -> Kind {
        let group = K::group(&());
        let kind = K::kind(&());
        Kind {
            status_subresource: group.is_empty()
                && CORE_STATUS_SUBRESOURCE.contains(&kind.as_ref()),
            names: if group == "rbac.authorization.k8s.io" {
                NameRule::PathSegment
            } else {
                NameRule::Subdomain
            },
            version: K::version(&()),
            api_version: K::api_version(&()),
            plural: K::plural(&()),
            namespaced: TypeId::of::<K::Scope>() == TypeId::of::<NamespaceResourceScope>(),
            group,
            kind,
        }
    }

    pub fn with_status_subresource(mut self) -> Kind {
        self.status_subresource = true;
        self
    }

    /// Lower-case kind, as Kubernetes-style messages use it (`serviceaccount "x" not found`).
    pub fn singular(&self) -> String {
        self.kind.to_lowercase()
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.singular())
    }
}

/// Any typed object the store can hold: k8s-openapi types and kube-derive custom resources.
pub trait Object:
    kube::Resource<DynamicType = (), Scope: 'static>
    + Serialize
    + DeserializeOwned
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<T> Object for T where
    T: kube::Resource<DynamicType = (), Scope: 'static>
        + Serialize
        + DeserializeOwned
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// Failures of store operations, with Kubernetes' reasons.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{kind} \"{name}\" not found")]
    NotFound { kind: String, name: String },
    #[error("{kind} \"{name}\" already exists")]
    AlreadyExists { kind: String, name: String },
    #[error(
        "Operation cannot be fulfilled on {kind} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
    )]
    Conflict { kind: String, name: String },
    #[error("{kind} \"{name}\" is invalid: {reason}")]
    Invalid {
        kind: String,
        name: String,
        reason: String,
    },
    /// A write that an admission decorator of the store refused; `source` is the refusal, which
    /// the writer may recover by downcasting. Named as the API server names a webhook's denial.
    #[error("{kind} \"{name}\" is invalid: {source}")]
    Refused {
        kind: String,
        name: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A stored object that does not decode as its kind: the store's fault, not the writer's.
    #[error("stored {kind} \"{name}\" does not decode: {reason}")]
    Undecodable {
        kind: String,
        name: String,
        reason: String,
    },
    #[error("the requested resource version is too old")]
    Gone,
    #[error("the service's own identity is not allowed to do this: {message}")]
    Forbidden { message: String },
    #[error("timed out waiting for the token of secret {namespace}/{name}")]
    TokenTimeout { namespace: String, name: String },
    #[error("store backend failed: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl StoreError {
    pub fn backend(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreError::Backend(Box::new(e))
    }
    pub fn is_not_found(&self) -> bool {
        matches!(self, StoreError::NotFound { .. })
    }
    pub fn is_already_exists(&self) -> bool {
        matches!(self, StoreError::AlreadyExists { .. })
    }
}

/// Conditions a delete must meet, as Kubernetes `DeleteOptions.preconditions`.
#[derive(Clone, Debug, Default)]
pub struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// What a delete did: objects with finalizers are only marked for deletion.
#[derive(Clone, Debug)]
pub enum Deleted {
    Gone(Value),
    Pending(Value),
}

/// A list and the resourceVersion to watch from so that no change is missed.
#[derive(Clone, Debug)]
pub struct ObjectList {
    pub items: Vec<Value>,
    pub resource_version: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeType {
    Added,
    Modified,
    Deleted,
}

/// One entry of the change feed.
#[derive(Clone, Debug)]
pub struct Change {
    pub change: ChangeType,
    pub api_version: String,
    pub kind: String,
    pub object: Arc<Value>,
    pub resource_version: u64,
}

pub type ChangeStream = BoxStream<'static, Result<Change, StoreError>>;

/// What [`ObjectStore::create_together`] creates after an owner: made from the owner as it will
/// be stored (its uid set).
pub type Dependents =
    Box<dyn FnOnce(&Value) -> Result<Vec<(Kind, Value)>, StoreError> + Send + 'static>;

/// The port. Namespaces of cluster-scoped kinds are `""`.
#[async_trait]
pub trait ObjectStore: Send + Sync + 'static {
    async fn get(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, StoreError>;
    /// [`Self::get`] for a reader that only looks: the embedded backend hands out the object it
    /// holds instead of a deep copy (GET's cache compares the versions of four objects per request).
    async fn get_shared(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Value>>, StoreError> {
        Ok(self.get(kind, namespace, name).await?.map(Arc::new))
    }
    /// A counter of the writes of `kind` (creations, replacements, status writes, deletions):
    /// the backend moves it before a reader can see the write, so a reader that made something of
    /// objects of a few kinds may reuse it for as long as none of their counters has moved since
    /// before it read them. `None` from a backend that keeps none (the default).
    fn write_counter(&self, kind: &Kind) -> Option<Arc<std::sync::atomic::AtomicU64>> {
        let _ = kind;
        None
    }
    async fn list(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        selector: &LabelSelector,
    ) -> Result<ObjectList, StoreError>;
    /// [`Self::list`], each object handed to `visit` in turn instead of all of them collected
    /// first, so that a caller keeping a decoded copy of each (a watcher filling its cache) never
    /// holds every object twice. Answers the list's resourceVersion. What was visited counts only
    /// once this answers `Ok`: on an error the caller drops it.
    async fn list_each(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        selector: &LabelSelector,
        visit: &mut (dyn FnMut(Value) + Send),
    ) -> Result<String, StoreError> {
        let list = self.list(kind, namespace, selector).await?;
        list.items.into_iter().for_each(visit);
        Ok(list.resource_version)
    }
    /// Creates the object; `AlreadyExists` when the name is taken.
    async fn create(&self, kind: &Kind, object: Value) -> Result<Value, StoreError>;
    /// [`Self::create`], answered once the object is stored, perhaps before it is durable: a
    /// caller that makes several objects for one request creates them so and then calls
    /// [`Self::sync`] once, before it acknowledges the request. Readers and watchers still only
    /// ever see durable objects. By default (a backend whose every write is durable when
    /// answered) the same as `create`.
    async fn create_buffered(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        self.create(kind, object).await
    }
    /// Creates each of `objects` (all of `kind`) as [`Self::create_buffered`] would, in order and
    /// each on its own: one refused does not stop the others. Answers each one's result, in
    /// order (where the backend writes them as one and that write fails, each planned in it
    /// fails). For a writer of many small objects that need not exist together (Events): the
    /// embedded backend plans and commits them as one write. By default one create after another.
    async fn create_each(
        &self,
        kind: &Kind,
        objects: Vec<Value>,
    ) -> Vec<Result<Value, StoreError>> {
        create_in_turn(self, kind, objects).await
    }
    /// Creates `owner` and the objects `dependents` makes once the owner's uid is known, in one
    /// step: all of them or none (`AlreadyExists` if any name is taken). Buffered as
    /// [`Self::create_buffered`] is. `Ok(None)` from a backend that cannot (the default): the
    /// caller creates them one by one. Returns the owner, then the dependents, as stored.
    async fn create_together(
        &self,
        owner_kind: &Kind,
        owner: Value,
        dependents: Dependents,
    ) -> Result<Option<Vec<Value>>, StoreError> {
        let _ = (owner_kind, owner, dependents);
        Ok(None)
    }
    /// Waits until every write this store has answered so far is durable (after
    /// [`Self::create_buffered`]); fails if that can no longer be promised.
    async fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }
    /// Replaces the object; `Conflict` when its resourceVersion is stale. A replace that changes nothing
    /// returns the stored object and emits no change.
    async fn replace(&self, kind: &Kind, object: Value) -> Result<Value, StoreError>;
    /// Replaces only `status` (the status subresource).
    async fn replace_status(&self, kind: &Kind, object: Value) -> Result<Value, StoreError>;
    /// Merges `patch`, a JSON merge patch (RFC 7386), into the `status` of the object if it is at
    /// `resource_version` (the status subresource): `Conflict` when it is at another, `NotFound`
    /// when it is gone. Returns the resourceVersion it is at afterwards (unchanged when the patch
    /// changes nothing). For a writer that keeps a large status current by itself (an IP pool's
    /// allocations): what it sends is what changed, and the embedded backend stores no more.
    /// By default a read, the merge, and [`Self::replace_status`].
    async fn merge_status(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        resource_version: &str,
        patch: &Value,
    ) -> Result<String, StoreError> {
        let not_found = || StoreError::NotFound {
            kind: kind.singular(),
            name: name.to_string(),
        };
        let mut object = self
            .get(kind, namespace, name)
            .await?
            .ok_or_else(not_found)?;
        if object
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            != Some(resource_version)
        {
            return Err(StoreError::Conflict {
                kind: kind.singular(),
                name: name.to_string(),
            });
        }
        if !merge_changes(object.get("status").unwrap_or(&Value::Null), patch) {
            return Ok(resource_version.to_string());
        }
        merge_into_status(&mut object, patch);
        let written = self.replace_status(kind, object).await?;
        Ok(written
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string())
    }
    /// [`Self::merge_status`], calling `planned` with the resourceVersion the write is to have
    /// before any watch can deliver that version, on a backend that can (the embedded one); else
    /// once it is written. A version handed to `planned` whose write then fails is not used by
    /// another write while the store stays open. Not called when the patch changes nothing.
    async fn merge_status_planned(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        resource_version: &str,
        patch: &Value,
        planned: &(dyn for<'v> Fn(&'v str) + Send + Sync),
    ) -> Result<String, StoreError> {
        let written = self
            .merge_status(kind, namespace, name, resource_version, patch)
            .await?;
        if written != resource_version {
            planned(&written);
        }
        Ok(written)
    }
    async fn delete(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<Deleted, StoreError>;
    /// Changes after `resource_version` (`Gone` if that is older than the retained history).
    async fn watch(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        resource_version: &str,
    ) -> Result<ChangeStream, StoreError>;
    /// Waits until the service-account token Secret carries `token` and `ca.crt`.
    async fn wait_for_token(
        &self,
        namespace: &str,
        secret_name: &str,
        timeout: Duration,
    ) -> Result<Value, StoreError>;
    /// Cheap check that the backend answers (readiness).
    async fn ping(&self) -> Result<(), StoreError>;
}

/// [`ObjectStore::create_each`] one [`ObjectStore::create_buffered`] after another: for a store
/// that cannot write them as one, or objects it must write one by one.
pub async fn create_in_turn<S: ObjectStore + ?Sized>(
    store: &S,
    kind: &Kind,
    objects: Vec<Value>,
) -> Vec<Result<Value, StoreError>> {
    let mut out = Vec::with_capacity(objects.len());
    for object in objects {
        out.push(store.create_buffered(kind, object).await);
    }
    out
}

/// Whether merging `patch` (RFC 7386) into `target` changes it; looks only at what the patch names.
pub fn merge_changes(target: &Value, patch: &Value) -> bool {
    let Some(entries) = patch.as_object() else {
        return target != patch;
    };
    let Some(fields) = target.as_object() else {
        // A non-object becomes an object (an empty patch makes it `{}`).
        return true;
    };
    entries
        .iter()
        .any(|(key, value)| match (fields.get(key), value) {
            (None, Value::Null) => false,
            (None, _) => true,
            (Some(_), Value::Null) => true,
            (Some(current), value) => merge_changes(current, value),
        })
}

/// Merges `patch` (RFC 7386) into `object`'s `status`, created if missing.
pub(crate) fn merge_into_status(object: &mut Value, patch: &Value) {
    if let Some(fields) = object.as_object_mut() {
        json_patch::merge(fields.entry("status").or_insert(Value::Null), patch);
    }
}

/// Typed access to one kind, like `kube::Api`.
pub struct Api<K> {
    store: Arc<dyn ObjectStore>,
    kind: Kind,
    _k: std::marker::PhantomData<fn() -> K>,
}

impl<K> Clone for Api<K> {
    fn clone(&self) -> Self {
        Api {
            store: self.store.clone(),
            kind: self.kind.clone(),
            _k: std::marker::PhantomData,
        }
    }
}

fn decode<K: Object>(kind: &Kind, v: Value) -> Result<K, StoreError> {
    let (namespace, name) = object_key(&v);
    serde_json::from_value(v).map_err(|e| StoreError::Undecodable {
        kind: kind.singular(),
        name: if namespace.is_empty() {
            name
        } else {
            format!("{namespace}/{name}")
        },
        reason: e.to_string(),
    })
}

/// The objects of a list that decode; each one that does not is logged and left out, so one
/// broken object does not hide the others.
pub fn decode_listed<K: serde::de::DeserializeOwned>(kind: &Kind, items: Vec<Value>) -> Vec<K> {
    items
        .into_iter()
        .filter_map(|v| {
            let (namespace, name) = object_key(&v);
            match serde_json::from_value(v) {
                Ok(k) => Some(k),
                Err(e) => {
                    tracing::error!(kind = %kind.kind, %namespace, %name, error = %e, "a stored object does not decode; leaving it out of the list");
                    None
                }
            }
        })
        .collect()
}

fn encode<K: Object>(kind: &Kind, obj: &K) -> Result<Value, StoreError> {
    let mut v = serde_json::to_value(obj).map_err(|e| StoreError::Invalid {
        kind: kind.singular(),
        name: obj.meta().name.clone().unwrap_or_default(),
        reason: e.to_string(),
    })?;
    if let Some(m) = v.as_object_mut() {
        m.insert("apiVersion".into(), Value::from(kind.api_version.as_ref()));
        m.insert("kind".into(), Value::from(kind.kind.as_ref()));
    }
    Ok(v)
}

/// `obj` as the store port takes it: its kind, and its JSON with `apiVersion` and `kind`.
pub fn to_stored<K: Object>(obj: &K) -> Result<(Kind, Value), StoreError> {
    let kind = Kind::of::<K>();
    let v = encode(&kind, obj)?;
    Ok((kind, v))
}

impl<K: Object> Api<K> {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self::with_kind(store, Kind::of::<K>())
    }

    pub fn with_kind(store: Arc<dyn ObjectStore>, kind: Kind) -> Self {
        Api {
            store,
            kind,
            _k: std::marker::PhantomData,
        }
    }

    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    pub async fn get(&self, namespace: &str, name: &str) -> Result<Option<K>, StoreError> {
        match self.store.get(&self.kind, namespace, name).await? {
            Some(v) => decode(&self.kind, v).map(Some),
            None => Ok(None),
        }
    }

    pub async fn list(
        &self,
        namespace: Option<&str>,
        selector: &LabelSelector,
    ) -> Result<Vec<K>, StoreError> {
        let list = self.store.list(&self.kind, namespace, selector).await?;
        Ok(decode_listed(&self.kind, list.items))
    }

    pub async fn create(&self, obj: &K) -> Result<K, StoreError> {
        let v = self
            .store
            .create(&self.kind, encode(&self.kind, obj)?)
            .await?;
        decode(&self.kind, v)
    }

    /// See [`ObjectStore::create_buffered`].
    pub async fn create_buffered(&self, obj: &K) -> Result<K, StoreError> {
        let v = self
            .store
            .create_buffered(&self.kind, encode(&self.kind, obj)?)
            .await?;
        decode(&self.kind, v)
    }

    pub async fn replace(&self, obj: &K) -> Result<K, StoreError> {
        let v = self
            .store
            .replace(&self.kind, encode(&self.kind, obj)?)
            .await?;
        decode(&self.kind, v)
    }

    pub async fn replace_status(&self, obj: &K) -> Result<K, StoreError> {
        let v = self
            .store
            .replace_status(&self.kind, encode(&self.kind, obj)?)
            .await?;
        decode(&self.kind, v)
    }

    pub async fn delete(
        &self,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<Deleted, StoreError> {
        self.store
            .delete(&self.kind, namespace, name, preconditions)
            .await
    }
}

/// The namespace/name key of an object, `""` namespace for cluster-scoped ones.
pub fn object_key(v: &Value) -> (String, String) {
    let meta = v.get("metadata");
    let field = |f: &str| {
        meta.and_then(|m| m.get(f))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (field("namespace"), field("name"))
}
