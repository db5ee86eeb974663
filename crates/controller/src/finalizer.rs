//! The finalizer that brackets a reconcile, kube-runtime's `finalizer()` on the store port: a
//! reconcile is one closure with two arms, [`Event::Apply`] and [`Event::Cleanup`], and the
//! finalizer is added before the first apply, so that a deletion always finds it and cleans up.
//! Cleanup must tolerate apply never having run.
//!
//! Two differences from kube-runtime's, both so that a reconcile does in one pass what it would
//! otherwise do in two:
//! - After adding the finalizer, the same pass applies (on the object as written) instead of
//!   waiting for the write's own event.
//! - The cleanup arm takes the finalizer off itself, through the [`Release`] it is handed, once it
//!   is done (and may change more of the object in the same write); a cleanup that must wait (an
//!   IP pool that still holds addresses, a primary Service still shared) returns without it, and the
//!   finalizer stays.

use std::sync::Arc;

use crate::runner::Action;

use super::modify::{Modified, Target, modify};
use crate::store::{Api, Object, StoreError};

/// What a reconcile is asked to do.
pub enum Event<K> {
    /// The object is wanted and carries the finalizer (added just now if it lacked it).
    Apply(K),
    /// The object is being deleted, or is no longer wanted, and still carries the finalizer.
    Cleanup(K, Release<K>),
}

/// Adding or removing a finalizer failed.
#[derive(Debug, thiserror::Error)]
pub enum FinalizerError {
    #[error("cannot add finalizer {finalizer} to {object}: {source}")]
    Add {
        finalizer: &'static str,
        object: String,
        source: StoreError,
    },
    #[error("cannot remove finalizer {finalizer} from {object}: {source}")]
    Remove {
        finalizer: &'static str,
        object: String,
        source: StoreError,
    },
}

impl FinalizerError {
    pub fn store_error(&self) -> &StoreError {
        match self {
            FinalizerError::Add { source, .. } | FinalizerError::Remove { source, .. } => source,
        }
    }

    /// The object moved on meanwhile (more often than the retries allowed for).
    pub fn is_conflict(&self) -> bool {
        matches!(self.store_error(), StoreError::Conflict { .. })
    }
}

/// Whether `obj` carries `finalizer`.
pub fn has<K: Object>(obj: &K, finalizer: &str) -> bool {
    obj.meta()
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == finalizer))
}

/// `<kind> <namespace>/<name>` (or `<kind> <name>`), for messages.
fn describe<K: Object>(api: &Api<K>, obj: &K) -> String {
    let meta = obj.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    match meta.namespace.as_deref().filter(|n| !n.is_empty()) {
        Some(namespace) => format!("{} {namespace}/{name}", api.kind()),
        None => format!("{} {name}", api.kind()),
    }
}

/// Takes the finalizer off once a cleanup is done; handed to [`Event::Cleanup`].
#[must_use = "a cleanup that does not release its object keeps the finalizer on it"]
pub struct Release<K> {
    api: Api<K>,
    finalizer: &'static str,
}

impl<K: Object> Release<K> {
    /// Takes the finalizer off `obj` (again on the stored object after a conflict).
    pub async fn release(self, obj: &K) -> Result<(), FinalizerError> {
        self.release_with(obj, |_| false).await.map(drop)
    }

    /// Takes the finalizer off `obj` and makes `also`'s changes in the same write. Returns the
    /// object as written (`None`: it is gone) and whether this call wrote it (`false`: a newer
    /// version had neither the finalizer nor anything `also` would change).
    pub async fn release_with(
        self,
        obj: &K,
        also: impl Fn(&mut K) -> bool,
    ) -> Result<Option<Modified<K>>, FinalizerError> {
        let finalizer = self.finalizer;
        modify(&self.api, obj, Target::Object, |o| {
            let mut changed = false;
            if let Some(f) = o.meta_mut().finalizers.as_mut() {
                let before = f.len();
                f.retain(|x| x != finalizer);
                changed = f.len() != before;
            }
            also(o) | changed
        })
        .await
        .map_err(|source| FinalizerError::Remove {
            finalizer,
            object: describe(&self.api, obj),
            source,
        })
    }
}

/// Runs `reconcile` for `obj` under `finalizer` (the store write of the finalizer goes through
/// `api`): [`Event::Apply`] while the object lives, [`Event::Cleanup`] once it is being deleted.
pub async fn finalizer<K, E, Fut>(
    api: &Api<K>,
    finalizer: &'static str,
    obj: Arc<K>,
    reconcile: impl FnOnce(Event<K>) -> Fut,
) -> Result<Action, E>
where
    K: Object,
    E: From<FinalizerError>,
    Fut: Future<Output = Result<Action, E>>,
{
    finalizer_when(api, finalizer, obj, |_| true, reconcile).await
}

/// As [`finalizer`], for objects that can stop being wanted while they live (a Service that is no
/// longer of type LoadBalancer, a VM that is no longer a guest cluster's): one that is not
/// `wanted` is cleaned up as if it were being deleted, and never gets the finalizer.
pub async fn finalizer_when<K, E, Fut>(
    api: &Api<K>,
    finalizer: &'static str,
    obj: Arc<K>,
    wanted: impl Fn(&K) -> bool,
    reconcile: impl FnOnce(Event<K>) -> Fut,
) -> Result<Action, E>
where
    K: Object,
    E: From<FinalizerError>,
    Fut: Future<Output = Result<Action, E>>,
{
    let live = |o: &K| o.meta().deletion_timestamp.is_none() && wanted(o);
    let mut obj = Arc::unwrap_or_clone(obj);
    if live(&obj) && !has(&obj, finalizer) {
        // Durable before apply makes anything, so that a deletion always cleans it up. A newer
        // version that is no longer live does not get it.
        // Boxed: this write happens once in an object's life, and inline its future would make
        // every reconcile's future, and so every one in flight, larger by a copy of it.
        let added = Box::pin(modify(api, &obj, Target::Object, |o| {
            if !live(o) || has(o, finalizer) {
                return false;
            }
            o.meta_mut()
                .finalizers
                .get_or_insert_default()
                .push(finalizer.into());
            true
        }))
        .await
        .map_err(|source| FinalizerError::Add {
            finalizer,
            object: describe(api, &obj),
            source,
        })?;
        match added {
            Some(Modified { object, .. }) => obj = object,
            None => return Ok(Action::await_change()),
        }
    }
    match (live(&obj), has(&obj, finalizer)) {
        (true, true) => reconcile(Event::Apply(obj)).await,
        (false, true) => {
            let release = Release {
                api: api.clone(),
                finalizer,
            };
            reconcile(Event::Cleanup(obj, release)).await
        }
        // Gone past this finalizer already, or never had it: nothing to clean up.
        (_, false) => Ok(Action::await_change()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{
        ObjectStore, Preconditions,
        embedded::{Durability, EmbeddedStore},
    };
    use k8s_openapi::api::core::v1::ConfigMap;

    const NAME: &str = "example.com/test";

    #[derive(Debug, thiserror::Error)]
    #[error(transparent)]
    struct TestError(#[from] FinalizerError);

    fn mk_config_map(name: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some("default".into());
        cm
    }

    async fn mk_api() -> (tempfile::TempDir, Api<ConfigMap>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn ObjectStore> = EmbeddedStore::open(dir.path(), Durability::Normal)
            .await
            .expect("opens");
        (dir, Api::new(store))
    }

    /// Creates `name`, then writes a newer version; returns the first (a stale copy).
    async fn mk_stale(api: &Api<ConfigMap>, name: &str) -> ConfigMap {
        let created = api.create(&mk_config_map(name)).await.expect("creates");
        let mut newer = created.clone();
        newer.data = Some([("k".to_string(), "v".to_string())].into());
        api.replace(&newer).await.expect("updates");
        created
    }

    /// Which arm ran, on which version of the object.
    async fn run(
        api: &Api<ConfigMap>,
        obj: ConfigMap,
        release: bool,
    ) -> Option<(&'static str, ConfigMap)> {
        let seen = std::sync::Mutex::new(None);
        finalizer::<_, TestError, _>(api, NAME, Arc::new(obj), |event| async {
            match event {
                Event::Apply(o) => *seen.lock().expect("lock") = Some(("apply", o)),
                Event::Cleanup(o, r) => {
                    if release {
                        r.release(&o).await?;
                    }
                    *seen.lock().expect("lock") = Some(("cleanup", o));
                }
            }
            Ok(Action::await_change())
        })
        .await
        .expect("reconciles");
        seen.into_inner().expect("lock")
    }

    #[tokio::test]
    async fn apply_after_the_finalizer_and_cleanup_before_it_goes() {
        let (_dir, api) = mk_api().await;
        // A stale copy: the finalizer is added to the stored version, and apply sees that one.
        let stale = mk_stale(&api, "a").await;
        let (arm, applied) = run(&api, stale, false).await.expect("ran");
        assert_eq!(arm, "apply");
        assert!(has(&applied, NAME));
        assert!(applied.data.is_some(), "applied the stored version");

        api.delete("default", "a", &Preconditions::default())
            .await
            .expect("marks for deletion");
        let deleting = api.get("default", "a").await.expect("reads").expect("held");
        // A cleanup that does not release keeps the object.
        let (arm, _) = run(&api, deleting.clone(), false).await.expect("ran");
        assert_eq!(arm, "cleanup");
        assert!(api.get("default", "a").await.expect("reads").is_some());
        let (arm, _) = run(&api, deleting.clone(), true).await.expect("ran");
        assert_eq!(arm, "cleanup");
        assert!(api.get("default", "a").await.expect("reads").is_none());
        // Nothing left to clean up: no arm runs.
        let mut released = deleting;
        released.metadata.finalizers = None;
        assert!(run(&api, released, true).await.is_none());
    }

    #[tokio::test]
    async fn modify_retries_on_the_stored_version_and_stops_at_another_uid() {
        let (_dir, api) = mk_api().await;
        let stale = mk_stale(&api, "b").await;
        let set = |o: &mut ConfigMap| {
            let data = o.data.get_or_insert_default();
            data.insert("x".into(), "y".into()).is_none()
        };
        let modified = modify(&api, &stale, Target::Object, set)
            .await
            .expect("writes")
            .expect("exists");
        assert!(modified.written);
        assert_eq!(modified.object.data.as_ref().map(|d| d.len()), Some(2));
        // Nothing to change: nothing written.
        let again = modify(&api, &modified.object, Target::Object, set)
            .await
            .expect("reads")
            .expect("exists");
        assert!(!again.written);
        // Recreated under the same name: not the object the change was meant for.
        api.delete("default", "b", &Preconditions::default())
            .await
            .expect("deletes");
        api.create(&mk_config_map("b")).await.expect("recreates");
        let clear = |o: &mut ConfigMap| o.data.take().is_some();
        assert!(
            modify(&api, &modified.object, Target::Object, clear)
                .await
                .expect("reads")
                .is_none()
        );
    }
}
