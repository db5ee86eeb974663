//! [`ClusterView`]: one cluster kept inside this store, shown as a store port of its own, as if it
//! were that cluster's API server. The domain that keeps other clusters' objects here (the guest
//! clusters of the embedded backend) says where ([`ClusterScope`]): which internal kind holds the
//! objects of a kind, in which namespace, and in which field a record names its owner. Records are
//! named `<cluster>.<namespace>.<name>`, with their cluster, namespace and name in the owner field;
//! cluster and namespace are RFC 1123 labels (no dots), so the name is unambiguous and two clusters
//! never collide. Everything else (uid, resourceVersion, finalizers, deletion, the status
//! subresource) is the backing store's own semantics, unchanged.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    Change, ChangeStream, Deleted, Kind, LabelSelector, ObjectList, ObjectStore, Preconditions,
    StoreError,
};

/// Where a domain keeps one cluster's objects in this store.
pub trait ClusterScope: Clone + Send + Sync + 'static {
    /// The cluster's name: the first part of its records' names.
    fn cluster(&self) -> &str;
    /// The namespace of this store that holds the cluster's records.
    fn namespace(&self) -> &str;
    /// The internal kind whose records hold the cluster's objects of `kind` (namespaced).
    fn internal_kind(&self, kind: &Kind) -> Kind;
    /// The field of a record that names its owner ([`Owner`]).
    fn owner_field(&self) -> &'static str;
}

/// Whose a record is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub cluster: String,
    namespace: String,
    name: String,
}

/// One cluster kept in this store as a store port of its own (namespaced kinds only).
pub struct ClusterView<S> {
    inner: Arc<dyn ObjectStore>,
    key: S,
}

impl<S: ClusterScope> ClusterView<S> {
    pub fn new(inner: Arc<dyn ObjectStore>, key: S) -> Self {
        ClusterView { inner, key }
    }

    /// The cluster this view shows.
    pub fn key(&self) -> &S {
        &self.key
    }

    fn record_name(&self, namespace: &str, name: &str) -> String {
        format!("{}.{namespace}.{name}", self.key.cluster())
    }

    fn check_kind(&self, kind: &Kind) -> Result<Kind, StoreError> {
        if !kind.namespaced {
            return Err(StoreError::Invalid {
                kind: kind.singular(),
                name: String::new(),
                reason: "guest clusters keep namespaced objects only".into(),
            });
        }
        Ok(self.key.internal_kind(kind))
    }

    /// The record of a cluster object.
    fn stored_object(&self, kind: &Kind, mut object: Value) -> Result<(Value, Owner), StoreError> {
        let invalid = |name: &str, reason: String| StoreError::Invalid {
            kind: kind.singular(),
            name: name.to_string(),
            reason,
        };
        let meta = object
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| invalid("", "metadata: Required value".into()))?;
        let field = |f: &str| {
            meta.get(f)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let (namespace, name) = (field("namespace"), field("name"));
        if name.is_empty() {
            return Err(invalid("", "metadata.name: Required value".into()));
        }
        kind.names.check(&name).map_err(|e| {
            invalid(
                &name,
                format!("metadata.name: Invalid value: {name:?}: {e}"),
            )
        })?;
        if namespace.is_empty() {
            return Err(invalid(&name, "metadata.namespace: Required value".into()));
        }
        crate::validation::dns1123_label(&namespace).map_err(|e| {
            invalid(
                &name,
                format!("metadata.namespace: Invalid value: {namespace:?}: {e}"),
            )
        })?;
        let record_name = self.record_name(&namespace, &name);
        if record_name.len() > crate::validation::DNS1123_SUBDOMAIN_MAX {
            return Err(invalid(
                &name,
                "metadata.name: Invalid value: too long for a guest cluster object".into(),
            ));
        }
        meta.insert(
            "namespace".into(),
            Value::from(self.key.namespace().to_string()),
        );
        meta.insert("name".into(), Value::from(record_name));
        let owner = Owner {
            cluster: self.key.cluster().to_string(),
            namespace,
            name,
        };
        if let Some(fields) = object.as_object_mut() {
            fields.insert(
                self.key.owner_field().into(),
                serde_json::to_value(&owner).map_err(StoreError::backend)?,
            );
        }
        Ok((object, owner))
    }

    /// The cluster object of a record, if it is this cluster's.
    fn cluster_object(&self, kind: &Kind, mut record: Value) -> Option<Value> {
        let owner: Owner = record
            .as_object_mut()?
            .remove(self.key.owner_field())
            .and_then(|o| serde_json::from_value(o).ok())?;
        if owner.cluster != self.key.cluster() {
            return None;
        }
        let fields = record.as_object_mut()?;
        fields.insert("apiVersion".into(), Value::from(kind.api_version.as_ref()));
        fields.insert("kind".into(), Value::from(kind.kind.as_ref()));
        let meta = fields.get_mut("metadata")?.as_object_mut()?;
        meta.insert("namespace".into(), Value::from(owner.namespace));
        meta.insert("name".into(), Value::from(owner.name));
        Some(record)
    }

    fn decoded(&self, kind: &Kind, record: Value) -> Result<Value, StoreError> {
        let (_, name) = crate::object_key(&record);
        self.cluster_object(kind, record)
            .ok_or_else(|| StoreError::NotFound {
                kind: kind.singular(),
                name,
            })
    }
}

/// The same error with the cluster object's name instead of the stored one.
fn cluster_error(e: StoreError, name: &str) -> StoreError {
    let name = name.to_string();
    match e {
        StoreError::NotFound { kind, .. } => StoreError::NotFound { kind, name },
        StoreError::AlreadyExists { kind, .. } => StoreError::AlreadyExists { kind, name },
        StoreError::Conflict { kind, .. } => StoreError::Conflict { kind, name },
        StoreError::Invalid { kind, reason, .. } => StoreError::Invalid { kind, name, reason },
        StoreError::Refused { kind, source, .. } => StoreError::Refused { kind, name, source },
        other => other,
    }
}

#[async_trait]
impl<S: ClusterScope> ObjectStore for ClusterView<S> {
    async fn get(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, StoreError> {
        let ik = self.check_kind(kind)?;
        let found = self
            .inner
            .get(
                &ik,
                self.key.namespace(),
                &self.record_name(namespace, name),
            )
            .await
            .map_err(|e| cluster_error(e, name))?;
        Ok(found.and_then(|r| self.cluster_object(kind, r)))
    }

    async fn list(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        selector: &LabelSelector,
    ) -> Result<ObjectList, StoreError> {
        let ik = self.check_kind(kind)?;
        let list = self
            .inner
            .list(&ik, Some(self.key.namespace()), selector)
            .await?;
        let items = list
            .items
            .into_iter()
            .filter_map(|r| self.cluster_object(kind, r))
            .filter(|v| namespace.is_none_or(|ns| crate::object_key(v).0 == ns))
            .collect();
        Ok(ObjectList {
            items,
            resource_version: list.resource_version,
        })
    }

    async fn create(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        let ik = self.check_kind(kind)?;
        let (record, owner) = self.stored_object(kind, object)?;
        let created = self
            .inner
            .create(&ik, record)
            .await
            .map_err(|e| cluster_error(e, &owner.name))?;
        self.decoded(kind, created)
    }

    /// Waits for the inner store's buffered writes ([`Self::create_each`] passes some on).
    async fn sync(&self) -> Result<(), StoreError> {
        self.inner.sync().await
    }

    /// Each object mapped to its record as [`Self::create`] maps it (one that does not map is
    /// refused alone); the records are created together in the inner store.
    async fn create_each(
        &self,
        kind: &Kind,
        objects: Vec<Value>,
    ) -> Vec<Result<Value, StoreError>> {
        let mut out: Vec<Option<Result<Value, StoreError>>> = Vec::with_capacity(objects.len());
        let (mut records, mut names) = (Vec::new(), Vec::new());
        for object in objects {
            match self
                .check_kind(kind)
                .and_then(|_| self.stored_object(kind, object))
            {
                Ok((record, owner)) => {
                    records.push(record);
                    names.push((out.len(), owner.name));
                    out.push(None);
                }
                Err(e) => out.push(Some(Err(e))),
            }
        }
        if let Ok(ik) = self.check_kind(kind)
            && !records.is_empty()
        {
            let created = self.inner.create_each(&ik, records).await;
            for ((i, name), created) in names.into_iter().zip(created) {
                out[i] = Some(
                    created
                        .map_err(|e| cluster_error(e, &name))
                        .and_then(|c| self.decoded(kind, c)),
                );
            }
        }
        out.into_iter()
            .map(|answer| answer.expect("every object is answered"))
            .collect()
    }

    async fn replace(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        let ik = self.check_kind(kind)?;
        let (record, owner) = self.stored_object(kind, object)?;
        let replaced = self
            .inner
            .replace(&ik, record)
            .await
            .map_err(|e| cluster_error(e, &owner.name))?;
        self.decoded(kind, replaced)
    }

    async fn replace_status(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        let ik = self.check_kind(kind)?;
        let (record, owner) = self.stored_object(kind, object)?;
        let replaced = self
            .inner
            .replace_status(&ik, record)
            .await
            .map_err(|e| cluster_error(e, &owner.name))?;
        self.decoded(kind, replaced)
    }

    async fn delete(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<Deleted, StoreError> {
        let ik = self.check_kind(kind)?;
        let deleted = self
            .inner
            .delete(
                &ik,
                self.key.namespace(),
                &self.record_name(namespace, name),
                preconditions,
            )
            .await
            .map_err(|e| cluster_error(e, name))?;
        Ok(match deleted {
            Deleted::Gone(v) => Deleted::Gone(self.decoded(kind, v)?),
            Deleted::Pending(v) => Deleted::Pending(self.decoded(kind, v)?),
        })
    }

    async fn watch(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        resource_version: &str,
    ) -> Result<ChangeStream, StoreError> {
        let ik = self.check_kind(kind)?;
        let changes = self
            .inner
            .watch(&ik, Some(self.key.namespace()), resource_version)
            .await?;
        let view = ClusterView {
            inner: self.inner.clone(),
            key: self.key.clone(),
        };
        let kind = kind.clone();
        let namespace = namespace.map(str::to_string);
        Ok(changes
            .filter_map(move |c| {
                let out = match c {
                    Ok(c) => view
                        .cluster_object(&kind, (*c.object).clone())
                        .filter(|v| {
                            namespace
                                .as_deref()
                                .is_none_or(|ns| crate::object_key(v).0 == ns)
                        })
                        .map(|object| {
                            Ok(Change {
                                change: c.change,
                                api_version: kind.api_version.to_string(),
                                kind: kind.kind.to_string(),
                                object: Arc::new(object),
                                resource_version: c.resource_version,
                            })
                        }),
                    Err(e) => Some(Err(e)),
                };
                std::future::ready(out)
            })
            .boxed())
    }

    async fn wait_for_token(
        &self,
        _namespace: &str,
        _secret_name: &str,
        _timeout: Duration,
    ) -> Result<Value, StoreError> {
        Err(StoreError::Forbidden {
            message: "guest clusters of the embedded store keep no service-account tokens".into(),
        })
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }
}
