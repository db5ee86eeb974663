//! The Kubernetes backend of the store port: every operation is a request to the API server (in
//! cluster or through `--kubeconfig`), so state lives in etcd and replicas share it.
//!
//! Objects cross the port as JSON; here they travel as `DynamicObject`s addressed by the kind's
//! group, version and plural, which works for built-in kinds and custom resources alike.

mod pacing;
mod status;

use std::time::Duration;

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};
use kube::{
    Client,
    api::{
        Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
        Preconditions as KubePreconditions, WatchEvent, WatchParams,
    },
    core::Status,
};
use serde_json::Value;
use tracing::{debug, warn};

pub use pacing::{Pacing, PacingLayer, paced_client};
pub use status::{ShapeError, StatusShape};

use super::{
    Change, ChangeStream, ChangeType, Deleted, Kind, LabelSelector, ObjectList, ObjectStore,
    Preconditions, StoreError,
};

/// How long one watch request lasts before it is renewed (the API server caps it anyway).
const WATCH_TIMEOUT_SECS: u32 = 290;

pub struct KubeStore {
    client: Client,
    /// Whether each kind with port-level status semantics has a status subresource here.
    shapes: status::Shapes,
}

impl KubeStore {
    pub fn new(client: Client) -> Self {
        KubeStore {
            client,
            shapes: status::Shapes::default(),
        }
    }

    /// Checks that the API server serves `kind` and says how it takes its status; a start calls
    /// it for the kinds it reconciles, so a missing CRD is an error naming it, not a stream of
    /// 404s later.
    pub async fn require(&self, kind: &Kind) -> Result<StatusShape, ShapeError> {
        self.shapes.rediscover(&self.client, kind).await
    }

    /// The status shape of a kind that has port-level status semantics, read from discovery.
    async fn shape(&self, kind: &Kind) -> Result<StatusShape, StoreError> {
        self.shapes
            .get(&self.client, kind)
            .await
            .map_err(StoreError::backend)
    }

    async fn rediscover(&self, kind: &Kind) -> Result<StatusShape, StoreError> {
        self.shapes
            .rediscover(&self.client, kind)
            .await
            .map_err(StoreError::backend)
    }

    /// A JSON patch of the main resource (the writes of a kind without a status subresource).
    async fn json_patch(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        patch: Value,
    ) -> Result<Value, StoreError> {
        let patch: json_patch::Patch =
            serde_json::from_value(patch).map_err(StoreError::backend)?;
        let patched = self
            .api(kind, Some(namespace))
            .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
            .map_err(|e| map_err(kind, name, e))?;
        to_value(patched)
    }

    /// `replace_status` without a status subresource: a patch of `/status` alone, conditional on
    /// the object's resourceVersion. A server that dropped the status has gained the subresource
    /// since it was discovered: the write goes there instead.
    async fn patch_status(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        object: Value,
    ) -> Result<Value, StoreError> {
        let written = self
            .json_patch(kind, namespace, name, status::status_patch(&object))
            .await?;
        if status::status_kept(&object, &written) {
            return Ok(written);
        }
        match self.rediscover(kind).await? {
            StatusShape::Subresource => {
                self.put_status(kind, namespace, name, &to_dynamic(kind, object)?)
                    .await
            }
            // The server pruned or defaulted part of it: what it kept is the status now.
            StatusShape::Field => Ok(written),
        }
    }

    /// A PUT of `/status`. The object is borrowed, so a caller that may need it after a failure
    /// keeps it without a copy made for every write.
    async fn put_status(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        object: &DynamicObject,
    ) -> Result<Value, StoreError> {
        let written = self
            .api(kind, Some(namespace))
            .replace_status(name, &PostParams::default(), object)
            .await
            .map_err(|e| map_err(kind, name, e))?;
        to_value(written)
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    fn api(&self, kind: &Kind, namespace: Option<&str>) -> Api<DynamicObject> {
        let ar = ApiResource {
            group: kind.group.to_string(),
            version: kind.version.to_string(),
            api_version: kind.api_version.to_string(),
            kind: kind.kind.to_string(),
            plural: kind.plural.to_string(),
        };
        match namespace {
            Some(ns) if kind.namespaced => Api::namespaced_with(self.client.clone(), ns, &ar),
            _ => Api::all_with(self.client.clone(), &ar),
        }
    }
}

/// Translates an API error into the port's vocabulary, keeping the server's own names (a missing
/// namespace reports the namespace, not the object).
fn map_err(kind: &Kind, name: &str, e: kube::Error) -> StoreError {
    match e {
        kube::Error::Api(status) => map_status(kind, name, &status),
        other => StoreError::backend(other),
    }
}

fn map_status(kind: &Kind, name: &str, s: &Status) -> StoreError {
    let detail_kind = s
        .details
        .as_ref()
        .map(|d| d.kind.trim_end_matches('s').to_string())
        .filter(|k| !k.is_empty())
        .unwrap_or_else(|| kind.singular());
    let detail_name = s
        .details
        .as_ref()
        .map(|d| d.name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| name.to_string());
    match (s.code, s.reason.as_str()) {
        (404, _) => StoreError::NotFound {
            kind: detail_kind,
            name: detail_name,
        },
        (409, "AlreadyExists") => StoreError::AlreadyExists {
            kind: detail_kind,
            name: detail_name,
        },
        (409, _) => StoreError::Conflict {
            kind: kind.singular(),
            name: name.to_string(),
        },
        (410, _) => StoreError::Gone,
        (422, _) | (400, "BadRequest") => StoreError::Invalid {
            kind: kind.singular(),
            name: name.to_string(),
            reason: s.message.clone(),
        },
        (403, _) => StoreError::Forbidden {
            message: s.message.clone(),
        },
        _ => StoreError::Backend(format!("{} ({})", s.message, s.code).into()),
    }
}

fn to_dynamic(kind: &Kind, object: Value) -> Result<DynamicObject, StoreError> {
    let name = super::object_key(&object).1;
    serde_json::from_value(object).map_err(|e| StoreError::Invalid {
        kind: kind.singular(),
        name,
        reason: format!("not a Kubernetes object: {e}"),
    })
}

fn to_value(obj: DynamicObject) -> Result<Value, StoreError> {
    serde_json::to_value(obj).map_err(StoreError::backend)
}

fn rv_number(obj: &Value) -> u64 {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn token_ready(secret: &Value) -> bool {
    secret
        .pointer("/data/token")
        .is_some_and(|v| v.as_str().is_some_and(|s| !s.is_empty()))
        && secret
            .pointer("/data/ca.crt")
            .is_some_and(|v| v.as_str().is_some_and(|s| !s.is_empty()))
}

#[async_trait]
impl ObjectStore for KubeStore {
    async fn get(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, StoreError> {
        match self.api(kind, Some(namespace)).get_opt(name).await {
            Ok(Some(obj)) => to_value(obj).map(Some),
            Ok(None) => Ok(None),
            Err(e) => Err(map_err(kind, name, e)),
        }
    }

    async fn list(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        selector: &LabelSelector,
    ) -> Result<ObjectList, StoreError> {
        let mut lp = ListParams::default();
        let sel = selector.to_string();
        if !sel.is_empty() {
            lp = lp.labels(&sel);
        }
        let api = self.api(kind, namespace);
        let list = api.list(&lp).await.map_err(|e| map_err(kind, "", e))?;
        let resource_version = list.metadata.resource_version.clone().unwrap_or_default();
        let items = list
            .items
            .into_iter()
            .map(to_value)
            .collect::<Result<_, _>>()?;
        Ok(ObjectList {
            items,
            resource_version,
        })
    }

    async fn create(&self, kind: &Kind, mut object: Value) -> Result<Value, StoreError> {
        let (namespace, name) = super::object_key(&object);
        // A create never sets a status where status is a subresource; without one on this
        // server, the port's promise is kept here.
        if kind.status_subresource
            && let Some(fields) = object.as_object_mut()
        {
            fields.remove("status");
        }
        let obj = to_dynamic(kind, object)?;
        let created = self
            .api(kind, Some(&namespace))
            .create(&PostParams::default(), &obj)
            .await
            .map_err(|e| map_err(kind, &name, e))?;
        to_value(created)
    }

    async fn replace(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        let (namespace, name) = super::object_key(&object);
        if kind.status_subresource && self.shape(kind).await? == StatusShape::Field {
            return self
                .json_patch(kind, &namespace, &name, status::replace_patch(&object))
                .await;
        }
        let obj = to_dynamic(kind, object)?;
        let replaced = self
            .api(kind, Some(&namespace))
            .replace(&name, &PostParams::default(), &obj)
            .await
            .map_err(|e| map_err(kind, &name, e))?;
        to_value(replaced)
    }

    async fn replace_status(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        let (namespace, name) = super::object_key(&object);
        if !kind.status_subresource {
            // The status is part of the object for the port as for the server.
            return self.replace(kind, object).await;
        }
        match self.shape(kind).await? {
            StatusShape::Field => self.patch_status(kind, &namespace, &name, object).await,
            StatusShape::Subresource => {
                // Converted once and lent to the PUT: the fallback below is rare, and turns the
                // same object back into JSON only when it is taken (it reads the status and the
                // resourceVersion, which the conversion keeps as they were).
                let object = to_dynamic(kind, object)?;
                match self.put_status(kind, &namespace, &name, &object).await {
                    // A missing `/status` answers as a missing object does: ask discovery which
                    // it was before anyone reads it as "gone".
                    Err(e) if e.is_not_found() => match self.rediscover(kind).await? {
                        StatusShape::Field => {
                            warn!(
                                resource = %format!("{}.{}", kind.plural, kind.group),
                                "the status subresource is gone; writing status in the object"
                            );
                            self.patch_status(kind, &namespace, &name, to_value(object)?)
                                .await
                        }
                        StatusShape::Subresource => Err(e),
                    },
                    other => other,
                }
            }
        }
    }

    /// A merge patch conditional on the resourceVersion, of `/status` or, for a kind without the
    /// subresource here, of the object.
    async fn merge_status(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        resource_version: &str,
        patch: &Value,
    ) -> Result<String, StoreError> {
        let body = serde_json::json!({
            "metadata": {"resourceVersion": resource_version},
            "status": patch,
        });
        let api = self.api(kind, Some(namespace));
        let params = PatchParams::default();
        let merge = Patch::Merge(&body);
        let subresource =
            kind.status_subresource && self.shape(kind).await? == StatusShape::Subresource;
        let written = if subresource {
            match api.patch_status(name, &params, &merge).await {
                // A missing `/status` answers as a missing object does (see `replace_status`).
                Err(kube::Error::Api(s))
                    if s.code == 404 && self.rediscover(kind).await? == StatusShape::Field =>
                {
                    api.patch(name, &params, &merge).await
                }
                other => other,
            }
        } else {
            match api.patch(name, &params, &merge).await {
                // A server that dropped the status has gained the subresource since it was
                // discovered (a CRD swapped under the service): the patch goes there instead.
                Ok(written)
                    if kind.status_subresource
                        && crate::merge_changes(
                            written.data.get("status").unwrap_or(&Value::Null),
                            patch,
                        )
                        && self.rediscover(kind).await? == StatusShape::Subresource =>
                {
                    api.patch_status(name, &params, &merge).await
                }
                // Otherwise what the server kept (pruned or defaulted) is the status now.
                other => other,
            }
        };
        let written = written.map_err(|e| map_err(kind, name, e))?;
        Ok(written.metadata.resource_version.unwrap_or_default())
    }

    async fn delete(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<Deleted, StoreError> {
        let dp = DeleteParams {
            preconditions: (preconditions.uid.is_some()
                || preconditions.resource_version.is_some())
            .then(|| KubePreconditions {
                uid: preconditions.uid.clone(),
                resource_version: preconditions.resource_version.clone(),
            }),
            ..Default::default()
        };
        let api = self.api(kind, Some(namespace));
        match api
            .delete(name, &dp)
            .await
            .map_err(|e| map_err(kind, name, e))?
        {
            either::Either::Left(obj) => {
                let v = to_value(obj)?;
                let pending = v.pointer("/metadata/deletionTimestamp").is_some()
                    && v.pointer("/metadata/finalizers")
                        .and_then(Value::as_array)
                        .is_some_and(|f| !f.is_empty());
                Ok(if pending {
                    Deleted::Pending(v)
                } else {
                    Deleted::Gone(v)
                })
            }
            either::Either::Right(_) => Ok(Deleted::Gone(Value::Null)),
        }
    }

    async fn watch(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        resource_version: &str,
    ) -> Result<ChangeStream, StoreError> {
        let api = self.api(kind, namespace);
        let wp = WatchParams::default().timeout(WATCH_TIMEOUT_SECS);
        let kind_c = kind.clone();
        let events = api
            .watch(&wp, resource_version)
            .await
            .map_err(|e| map_err(kind, "", e))?;
        let api_version = kind.api_version.to_string();
        let kind_name = kind.kind.to_string();
        let stream = events
            .map_err(move |e| map_err(&kind_c, "", e))
            .try_filter_map(move |ev| {
                let (api_version, kind_name) = (api_version.clone(), kind_name.clone());
                async move {
                    let (change, obj) = match ev {
                        WatchEvent::Added(o) => (ChangeType::Added, o),
                        WatchEvent::Modified(o) => (ChangeType::Modified, o),
                        WatchEvent::Deleted(o) => (ChangeType::Deleted, o),
                        WatchEvent::Bookmark(_) => return Ok(None),
                        WatchEvent::Error(e) if e.code == 410 => return Err(StoreError::Gone),
                        WatchEvent::Error(e) => {
                            return Err(StoreError::Backend(
                                format!("watch failed: {} ({})", e.message, e.code).into(),
                            ));
                        }
                    };
                    let object = to_value(obj)?;
                    Ok(Some(Change {
                        change,
                        api_version,
                        kind: kind_name,
                        resource_version: rv_number(&object),
                        object: std::sync::Arc::new(object),
                    }))
                }
            });
        Ok(stream.boxed())
    }

    /// Checks at once, then watches the Secret until its token is filled in; a Secret that is not
    /// visible yet (or is recreated) is waited for rather than failed on.
    async fn wait_for_token(
        &self,
        namespace: &str,
        secret_name: &str,
        timeout: Duration,
    ) -> Result<Value, StoreError> {
        let kind = Kind::of::<k8s_openapi::api::core::v1::Secret>();
        let api = self.api(&kind, Some(namespace));
        let field = format!("metadata.name={secret_name}");
        let wait = async {
            loop {
                let list = api
                    .list(&ListParams::default().fields(&field))
                    .await
                    .map_err(|e| map_err(&kind, secret_name, e))?;
                for item in list.items {
                    let v = to_value(item)?;
                    if token_ready(&v) {
                        return Ok(v);
                    }
                }
                let rv = list.metadata.resource_version.unwrap_or_default();
                let wp = WatchParams::default()
                    .fields(&field)
                    .timeout(WATCH_TIMEOUT_SECS);
                let mut events = api
                    .watch(&wp, &rv)
                    .await
                    .map_err(|e| map_err(&kind, secret_name, e))?
                    .boxed();
                while let Some(ev) = events.next().await {
                    match ev {
                        Ok(WatchEvent::Added(o)) | Ok(WatchEvent::Modified(o)) => {
                            let v = to_value(o)?;
                            if token_ready(&v) {
                                return Ok(v);
                            }
                        }
                        Ok(_) => {}
                        // The watch expired or failed: list again.
                        Err(e) => {
                            debug!(error = %e, "token watch ended; listing again");
                            break;
                        }
                    }
                }
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::TokenTimeout {
                namespace: namespace.to_string(),
                name: secret_name.to_string(),
            }),
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.client
            .apiserver_version()
            .await
            .map(|_| ())
            .map_err(StoreError::backend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::response::StatusDetails;

    fn mk_status(code: u16, reason: &str, kind: &str, name: &str) -> Status {
        Status::failure("msg", reason)
            .with_code(code)
            .with_details(StatusDetails {
                name: name.into(),
                kind: kind.into(),
                group: String::new(),
                uid: String::new(),
                causes: Vec::new(),
                retry_after_seconds: 0,
            })
    }

    #[test]
    fn api_errors_map_to_the_port() {
        let k = Kind::of::<k8s_openapi::api::core::v1::ServiceAccount>();
        assert!(matches!(
            map_status(&k, "sa", &mk_status(404, "NotFound", "namespaces", "gc-test")),
            StoreError::NotFound { kind, name } if kind == "namespace" && name == "gc-test"
        ));
        assert!(matches!(
            map_status(&k, "sa", &mk_status(409, "AlreadyExists", "", "")),
            StoreError::AlreadyExists { .. }
        ));
        assert!(matches!(
            map_status(&k, "sa", &mk_status(409, "Conflict", "", "")),
            StoreError::Conflict { .. }
        ));
        assert!(matches!(
            map_status(&k, "sa", &mk_status(422, "Invalid", "", "")),
            StoreError::Invalid { .. }
        ));
        assert!(matches!(
            map_status(&k, "sa", &mk_status(403, "Forbidden", "", "")),
            StoreError::Forbidden { .. }
        ));
        assert!(matches!(
            map_status(&k, "sa", &mk_status(410, "Expired", "", "")),
            StoreError::Gone
        ));
        assert!(matches!(
            map_status(&k, "sa", &mk_status(500, "InternalError", "", "")),
            StoreError::Backend(_)
        ));
    }
}
