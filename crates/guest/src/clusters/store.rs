//! [`ClusterStore`]: one guest cluster of the embedded store as a store port of its own, as if it
//! were that cluster's API server. Objects are kept under the internal kinds of [`super::GROUP`],
//! named `<cluster>.<namespace>.<name>`, with their cluster, namespace and name in the owner field.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ClusterKey, OWNER_FIELD, internal_kind};
use crate::store::{
    Change, ChangeStream, Deleted, Kind, LabelSelector, ObjectList, ObjectStore, Preconditions,
    StoreError,
};

/// Whose a stored guest object is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Owner {
    pub(super) cluster: String,
    namespace: String,
    name: String,
}

/// One guest cluster of the embedded store as a store port of its own (namespaced kinds only).
pub struct ClusterStore {
    inner: Arc<dyn ObjectStore>,
    key: ClusterKey,
}

impl ClusterStore {
    pub fn new(inner: Arc<dyn ObjectStore>, key: ClusterKey) -> Self {
        ClusterStore { inner, key }
    }

    pub fn key(&self) -> &ClusterKey {
        &self.key
    }

    fn record_name(&self, namespace: &str, name: &str) -> String {
        format!("{}.{namespace}.{name}", self.key.cluster)
    }

    fn check_kind(kind: &Kind) -> Result<Kind, StoreError> {
        if !kind.namespaced {
            return Err(StoreError::Invalid {
                kind: kind.singular(),
                name: String::new(),
                reason: "guest clusters keep namespaced objects only".into(),
            });
        }
        Ok(internal_kind(kind))
    }

    /// The stored form of a guest object.
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
        meta.insert("namespace".into(), Value::from(self.key.namespace.clone()));
        meta.insert("name".into(), Value::from(record_name));
        let owner = Owner {
            cluster: self.key.cluster.clone(),
            namespace,
            name,
        };
        if let Some(fields) = object.as_object_mut() {
            fields.insert(
                OWNER_FIELD.into(),
                serde_json::to_value(&owner).map_err(StoreError::backend)?,
            );
        }
        Ok((object, owner))
    }

    /// The guest object of a stored one, if it is this cluster's.
    fn guest_object(&self, kind: &Kind, mut record: Value) -> Option<Value> {
        let owner: Owner = record
            .as_object_mut()?
            .remove(OWNER_FIELD)
            .and_then(|o| serde_json::from_value(o).ok())?;
        if owner.cluster != self.key.cluster {
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
        let (_, name) = crate::store::object_key(&record);
        self.guest_object(kind, record)
            .ok_or_else(|| StoreError::NotFound {
                kind: kind.singular(),
                name,
            })
    }
}

/// The same error with the guest object's name instead of the stored one.
fn guest_error(e: StoreError, name: &str) -> StoreError {
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
impl ObjectStore for ClusterStore {
    async fn get(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, StoreError> {
        let ik = Self::check_kind(kind)?;
        let found = self
            .inner
            .get(&ik, &self.key.namespace, &self.record_name(namespace, name))
            .await
            .map_err(|e| guest_error(e, name))?;
        Ok(found.and_then(|r| self.guest_object(kind, r)))
    }

    async fn list(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        selector: &LabelSelector,
    ) -> Result<ObjectList, StoreError> {
        let ik = Self::check_kind(kind)?;
        let list = self
            .inner
            .list(&ik, Some(&self.key.namespace), selector)
            .await?;
        let items = list
            .items
            .into_iter()
            .filter_map(|r| self.guest_object(kind, r))
            .filter(|v| namespace.is_none_or(|ns| crate::store::object_key(v).0 == ns))
            .collect();
        Ok(ObjectList {
            items,
            resource_version: list.resource_version,
        })
    }

    async fn create(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        let ik = Self::check_kind(kind)?;
        let (record, owner) = self.stored_object(kind, object)?;
        let created = self
            .inner
            .create(&ik, record)
            .await
            .map_err(|e| guest_error(e, &owner.name))?;
        self.decoded(kind, created)
    }

    async fn replace(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        let ik = Self::check_kind(kind)?;
        let (record, owner) = self.stored_object(kind, object)?;
        let replaced = self
            .inner
            .replace(&ik, record)
            .await
            .map_err(|e| guest_error(e, &owner.name))?;
        self.decoded(kind, replaced)
    }

    async fn replace_status(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        let ik = Self::check_kind(kind)?;
        let (record, owner) = self.stored_object(kind, object)?;
        let replaced = self
            .inner
            .replace_status(&ik, record)
            .await
            .map_err(|e| guest_error(e, &owner.name))?;
        self.decoded(kind, replaced)
    }

    async fn delete(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<Deleted, StoreError> {
        let ik = Self::check_kind(kind)?;
        let deleted = self
            .inner
            .delete(
                &ik,
                &self.key.namespace,
                &self.record_name(namespace, name),
                preconditions,
            )
            .await
            .map_err(|e| guest_error(e, name))?;
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
        let ik = Self::check_kind(kind)?;
        let changes = self
            .inner
            .watch(&ik, Some(&self.key.namespace), resource_version)
            .await?;
        let view = ClusterStore {
            inner: self.inner.clone(),
            key: self.key.clone(),
        };
        let kind = kind.clone();
        let namespace = namespace.map(str::to_string);
        Ok(changes
            .filter_map(move |c| {
                let out = match c {
                    Ok(c) => view
                        .guest_object(&kind, (*c.object).clone())
                        .filter(|v| {
                            namespace
                                .as_deref()
                                .is_none_or(|ns| crate::store::object_key(v).0 == ns)
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
