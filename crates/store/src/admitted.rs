//! [`Admitted`]: a store behind admission, as the Kubernetes API server puts writes behind its
//! webhooks. A domain says which kinds it judges and how ([`Admit`]); this decorator decides what
//! is judged: the object as the store will keep it, never a writer's claim about it.
//!
//! - A create is judged without a status (the store drops it: a subresource) and without deletion
//!   marks (a body may not claim to be "being deleted").
//! - An update is judged with the stored status and deletion marks, against the very version it
//!   replaces: an update without a resourceVersion is made conditional on the version judged.
//! - A delete (of a kind whose deletes are judged) is judged against the stored object and made
//!   conditional on its uid and version, so a change since makes it a conflict.
//! - Status writes (the webhooks do not watch the status subresource), reads and watches pass
//!   straight through, as do the kinds the domain does not judge.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use serde_json::{Map, Value};

use crate::{
    ChangeStream, Deleted, Kind, LabelSelector, ObjectList, ObjectStore, Preconditions, StoreError,
    object_key,
};

/// What a domain's admission does with writes; [`Admitted`] calls it with the objects as the store
/// will keep them.
#[async_trait]
pub trait Admit: Send + Sync + 'static {
    /// Whether creates and updates of `kind` are judged.
    fn judges(&self, kind: &Kind) -> bool;

    /// Whether deletes of `kind` are judged (none by default).
    fn judges_delete(&self, _kind: &Kind) -> bool {
        false
    }

    /// The object to create, mutated, or the refusal. `object` has no status and no deletion marks.
    async fn create(&self, kind: &Kind, object: Value) -> Result<Value, StoreError>;

    /// The update of `current` (as stored) to `object`, mutated, or the refusal. `object` carries
    /// the stored status and deletion marks, and the version it replaces.
    async fn update(&self, kind: &Kind, current: Value, object: Value)
    -> Result<Value, StoreError>;

    /// Whether `current` (as stored) may be deleted.
    async fn delete(&self, _kind: &Kind, _current: &Value) -> Result<(), StoreError> {
        Ok(())
    }
}

/// A store behind admission: see the module's documentation.
pub struct Admitted<A> {
    inner: Arc<dyn ObjectStore>,
    admission: A,
}

impl<A: Admit> Admitted<A> {
    /// `inner` behind `admission`.
    pub fn new(inner: Arc<dyn ObjectStore>, admission: A) -> Self {
        Admitted { inner, admission }
    }

    /// The admission, for the webhooks that run the same steps on writes made elsewhere.
    pub fn admission(&self) -> &A {
        &self.admission
    }

    /// The store behind admission.
    pub fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    async fn stored(&self, kind: &Kind, namespace: &str, name: &str) -> Result<Value, StoreError> {
        self.inner
            .get(kind, namespace, name)
            .await?
            .ok_or_else(|| StoreError::NotFound {
                kind: kind.singular(),
                name: name.to_string(),
            })
    }
}

const DELETION_MARKS: [&str; 2] = ["deletionTimestamp", "deletionGracePeriodSeconds"];

fn metadata(object: &mut Value) -> Option<&mut Map<String, Value>> {
    object.get_mut("metadata").and_then(Value::as_object_mut)
}

/// `object` as the store will keep it on a create: no status, no deletion marks.
fn as_created(mut object: Value) -> Value {
    if let Some(fields) = object.as_object_mut() {
        fields.remove("status");
    }
    if let Some(meta) = metadata(&mut object) {
        for mark in DELETION_MARKS {
            meta.remove(mark);
        }
    }
    object
}

/// `object` as the store will keep it when it replaces `current`: the stored status and deletion
/// marks, and conditional on `current`'s version when it names none.
fn as_replacing(mut object: Value, current: &Value) -> Value {
    let stored_meta = current.get("metadata");
    if let Some(fields) = object.as_object_mut() {
        match current.get("status") {
            Some(status) if !status.is_null() => {
                fields.insert("status".into(), status.clone());
            }
            _ => {
                fields.remove("status");
            }
        }
    }
    if let Some(meta) = metadata(&mut object) {
        for mark in DELETION_MARKS {
            match stored_meta
                .and_then(|m| m.get(mark))
                .filter(|v| !v.is_null())
            {
                Some(v) => meta.insert(mark.into(), v.clone()),
                None => meta.remove(mark),
            };
        }
        let unversioned = meta
            .get("resourceVersion")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty);
        if unversioned && let Some(rv) = stored_meta.and_then(|m| m.get("resourceVersion")) {
            meta.insert("resourceVersion".into(), rv.clone());
        }
    }
    object
}

#[async_trait]
impl<A: Admit> ObjectStore for Admitted<A> {
    async fn get(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, StoreError> {
        self.inner.get(kind, namespace, name).await
    }

    async fn list(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        selector: &LabelSelector,
    ) -> Result<ObjectList, StoreError> {
        self.inner.list(kind, namespace, selector).await
    }

    async fn list_each(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        selector: &LabelSelector,
        visit: &mut (dyn FnMut(Value) + Send),
    ) -> Result<String, StoreError> {
        self.inner.list_each(kind, namespace, selector, visit).await
    }

    async fn create(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        let object = if self.admission.judges(kind) {
            self.admission.create(kind, as_created(object)).await?
        } else {
            object
        };
        self.inner.create(kind, object).await
    }

    /// Waits for the inner store's buffered writes ([`Self::create_each`] passes some on).
    async fn sync(&self) -> Result<(), StoreError> {
        self.inner.sync().await
    }

    /// Objects of a judged kind are each admitted and created in turn; others go to the inner
    /// store together.
    async fn create_each(
        &self,
        kind: &Kind,
        objects: Vec<Value>,
    ) -> Vec<Result<Value, StoreError>> {
        if !self.admission.judges(kind) {
            return self.inner.create_each(kind, objects).await;
        }
        // Buffered as each of them: admitted, and created durably (`create_buffered` is `create`
        // here).
        crate::create_in_turn(self, kind, objects).await
    }

    async fn replace(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        if !self.admission.judges(kind) {
            return self.inner.replace(kind, object).await;
        }
        let (namespace, name) = object_key(&object);
        let current = self.stored(kind, &namespace, &name).await?;
        let object = as_replacing(object, &current);
        let object = self.admission.update(kind, current, object).await?;
        self.inner.replace(kind, object).await
    }

    /// Status writes are not admitted (the webhooks do not watch the status subresource).
    async fn replace_status(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        self.inner.replace_status(kind, object).await
    }

    /// Not admitted either: a status write.
    async fn merge_status(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        resource_version: &str,
        patch: &Value,
    ) -> Result<String, StoreError> {
        self.inner
            .merge_status(kind, namespace, name, resource_version, patch)
            .await
    }

    async fn merge_status_planned(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        resource_version: &str,
        patch: &Value,
        planned: &(dyn for<'v> Fn(&'v str) + Send + Sync),
    ) -> Result<String, StoreError> {
        self.inner
            .merge_status_planned(kind, namespace, name, resource_version, patch, planned)
            .await
    }

    async fn delete(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<Deleted, StoreError> {
        if !self.admission.judges_delete(kind) {
            return self
                .inner
                .delete(kind, namespace, name, preconditions)
                .await;
        }
        let current = self.stored(kind, namespace, name).await?;
        self.admission.delete(kind, &current).await?;
        // Conditional on the version just judged: a change since (an address allocated) makes
        // this a conflict instead of deleting what was not judged.
        let stored = |field: &str| {
            current
                .get("metadata")
                .and_then(|m| m.get(field))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let judged = Preconditions {
            uid: preconditions.uid.clone().or_else(|| stored("uid")),
            resource_version: preconditions
                .resource_version
                .clone()
                .or_else(|| stored("resourceVersion")),
        };
        self.inner.delete(kind, namespace, name, &judged).await
    }

    async fn watch(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        resource_version: &str,
    ) -> Result<ChangeStream, StoreError> {
        self.inner.watch(kind, namespace, resource_version).await
    }

    async fn wait_for_token(
        &self,
        namespace: &str,
        secret_name: &str,
        timeout: Duration,
    ) -> Result<Value, StoreError> {
        self.inner
            .wait_for_token(namespace, secret_name, timeout)
            .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Judges ConfigMaps: refuses those named `bad-…`, labels the others.
    struct Judge;

    #[async_trait]
    impl Admit for Judge {
        fn judges(&self, kind: &Kind) -> bool {
            kind.kind == "ConfigMap"
        }

        async fn create(&self, kind: &Kind, mut object: Value) -> Result<Value, StoreError> {
            let name = object_key(&object).1;
            if name.starts_with("bad-") {
                return Err(StoreError::Invalid {
                    kind: kind.singular(),
                    name,
                    reason: "refused".into(),
                });
            }
            object["metadata"]["labels"] = json!({"admitted": "yes"});
            Ok(object)
        }

        async fn update(
            &self,
            _kind: &Kind,
            _current: Value,
            object: Value,
        ) -> Result<Value, StoreError> {
            Ok(object)
        }
    }

    /// `create_each` admits each object of a judged kind (a refused one refused alone, the
    /// others as admission mutated them), and passes the kinds it does not judge through.
    #[tokio::test]
    async fn objects_created_each_are_each_admitted() {
        let dir = tempfile::tempdir().unwrap();
        let inner =
            crate::embedded::EmbeddedStore::open(dir.path(), crate::embedded::Durability::Full)
                .await
                .unwrap();
        let store = Admitted::new(inner, Judge);
        let object = |kind: &str, name: &str| json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": "ns"}});
        let cms = store
            .create_each(
                &Kind::of::<k8s_openapi::api::core::v1::ConfigMap>(),
                vec![object("ConfigMap", "good"), object("ConfigMap", "bad-one")],
            )
            .await;
        assert_eq!(
            cms[0].as_ref().unwrap()["metadata"]["labels"]["admitted"],
            "yes"
        );
        assert!(
            matches!(&cms[1], Err(StoreError::Invalid { .. })),
            "{:?}",
            cms[1]
        );
        let events = store
            .create_each(
                &Kind::of::<k8s_openapi::api::core::v1::Event>(),
                vec![object("Event", "bad-but-not-judged")],
            )
            .await;
        assert!(
            events[0].as_ref().unwrap()["metadata"]
                .get("labels")
                .is_none()
        );
        store.sync().await.unwrap();
    }

    #[test]
    fn a_create_is_judged_without_status_or_deletion_marks() {
        let got = as_created(json!({
            "metadata": {"name": "a", "deletionTimestamp": "2026-01-01T00:00:00Z",
                         "deletionGracePeriodSeconds": 0},
            "spec": {"x": 1}, "status": {"claimed": true}
        }));
        assert_eq!(got, json!({"metadata": {"name": "a"}, "spec": {"x": 1}}));
    }

    #[test]
    fn an_update_is_judged_with_what_is_stored_and_pinned_to_it() {
        let current = json!({
            "metadata": {"name": "a", "resourceVersion": "7",
                         "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"held": ["10.0.0.9"]}
        });
        let body = json!({"metadata": {"name": "a", "deletionGracePeriodSeconds": 30},
                          "status": {"held": []}});
        assert_eq!(
            as_replacing(body, &current),
            json!({"metadata": {"name": "a", "resourceVersion": "7",
                                "deletionTimestamp": "2026-01-01T00:00:00Z"},
                   "status": {"held": ["10.0.0.9"]}})
        );
        // A version the writer names is kept (a conflict if stale); a stored object without a
        // status leaves none.
        let body = json!({"metadata": {"name": "a", "resourceVersion": "3"}, "status": {"x": 1}});
        let current = json!({"metadata": {"name": "a", "resourceVersion": "7"}, "status": null});
        assert_eq!(
            as_replacing(body, &current),
            json!({"metadata": {"name": "a", "resourceVersion": "3"}})
        );
    }
}
