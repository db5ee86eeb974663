//! Reading and writing IPPools and LoadBalancers on behalf of API callers: bodies are read as the
//! API server reads them, and written through the admitted store ([`AdmittedStore`]), which mutates
//! and validates them as Harvester's webhooks would, with Kubernetes' optimistic concurrency (a stale
//! `metadata.resourceVersion` is a conflict).
//!
//! Writes never touch `status` (it is a subresource, owned by the reconcilers). A PUT without a
//! resourceVersion replaces whatever is stored, as `kubectl replace --force`-less clients expect; the
//! admitted store then judges exactly the version that is replaced, and makes the write conditional
//! on it.

use std::sync::Arc;

use serde_json::Value;

use super::admission::{Admission, AdmitError, AdmittedStore, store::admission_error};
use crate::{
    crd::{IPPool, LoadBalancer, lb_api, pool_api},
    store::{Api, Deleted, LabelSelector, ObjectList, ObjectStore, Preconditions, StoreError},
};

/// A request about an IPPool or LoadBalancer that could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("fail to decode {kind}: {reason}")]
    Decode { kind: &'static str, reason: String },
    #[error("the {field} of the object ({body}) does not match the {field} on the URL ({url})")]
    Mismatch {
        field: &'static str,
        body: String,
        url: String,
    },
    #[error("{kind} {name}: metadata.namespace: Required value")]
    MissingNamespace { kind: &'static str, name: String },
    #[error("{kind} \"{name}\" not found")]
    NotFound { kind: &'static str, name: String },
    #[error(transparent)]
    Admission(#[from] AdmitError),
    #[error("cannot {action} {kind} {name}: {source}")]
    Store {
        action: &'static str,
        kind: &'static str,
        name: String,
        source: Box<StoreError>,
    },
}

const POOL: &str = "ippool";
const LB: &str = "loadbalancer";

/// What a body must say about itself, if it says anything: `apiVersion` and `kind`.
struct Expect {
    kind: &'static str,
    type_kind: &'static str,
    /// Enumerated `spec` fields and their allowed values (`""` meaning unset), as the CRD's schema
    /// enforces them on Kubernetes.
    enums: &'static [(&'static str, &'static [&'static str])],
}

const POOL_BODY: Expect = Expect {
    kind: POOL,
    type_kind: "IPPool",
    enums: &[],
};
const LB_BODY: Expect = Expect {
    kind: LB,
    type_kind: "LoadBalancer",
    enums: &[
        ("workloadType", &["", "vm", "cluster"]),
        ("ipam", &["", "pool", "dhcp"]),
    ],
};

/// An IPPool request body, read as the HTTP API reads it (before admission).
pub fn decode_pool(body: &[u8]) -> Result<IPPool, ObjectError> {
    decode(&POOL_BODY, body)
}

/// A LoadBalancer request body, read as the HTTP API reads it (before admission).
pub fn decode_lb(body: &[u8]) -> Result<LoadBalancer, ObjectError> {
    decode(&LB_BODY, body)
}

fn decode<T: serde::de::DeserializeOwned>(expect: &Expect, body: &[u8]) -> Result<T, ObjectError> {
    let kind = expect.kind;
    let invalid = |reason: String| ObjectError::Decode { kind, reason };
    let mut value: Value = serde_json::from_slice(body).map_err(|e| invalid(e.to_string()))?;
    let Some(fields) = value.as_object_mut() else {
        return Err(invalid("the body must be a JSON object".into()));
    };
    // The status is the reconciler's: whatever a client sends there is ignored, as a status
    // subresource does.
    fields.remove("status");
    let api_version = crate::crd::GROUP.to_string() + "/v1beta1";
    for (field, want) in [
        ("apiVersion", api_version.as_str()),
        ("kind", expect.type_kind),
    ] {
        match fields.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == want => {}
            Some(other) => {
                return Err(invalid(format!("{field} must be {want:?}, not {other}")));
            }
        }
    }
    for (field, allowed) in expect.enums {
        match fields.get("spec").and_then(|s| s.get(*field)) {
            None | Some(Value::Null) => {}
            Some(Value::String(v)) if allowed.contains(&v.as_str()) => {}
            Some(other) => {
                let supported: Vec<String> = allowed
                    .iter()
                    .filter(|a| !a.is_empty())
                    .map(|a| format!("{a:?}"))
                    .collect();
                return Err(invalid(format!(
                    "spec.{field}: Unsupported value: {other}: supported values: {}",
                    supported.join(", ")
                )));
            }
        }
    }
    serde_json::from_value(value).map_err(|e| invalid(e.to_string()))
}

/// A listed collection's items as `K`s (those that decode: one broken object is logged and left
/// out, see [`crate::store::decode_listed`]), with the revision to watch from.
pub(crate) fn decode_list<K: serde::de::DeserializeOwned>(
    list: ObjectList,
    kind: &crate::store::Kind,
) -> Result<(Vec<K>, String), ObjectError> {
    let items = crate::store::decode_listed(kind, list.items);
    Ok((items, list.resource_version))
}

/// A namespaced body's namespace and name, as the URL says: filled in when missing, refused when
/// they differ.
pub(crate) fn key_from_url(
    meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    namespace: &str,
    name: &str,
) -> Result<(), ObjectError> {
    for (field, slot, url) in [
        ("namespace", &mut meta.namespace, namespace),
        ("name", &mut meta.name, name),
    ] {
        match slot.as_deref() {
            None | Some("") => *slot = Some(url.into()),
            Some(v) if v != url => {
                return Err(ObjectError::Mismatch {
                    field,
                    body: v.into(),
                    url: url.into(),
                });
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// IPPools and LoadBalancers through the admitted store.
#[derive(Clone)]
pub struct Objects {
    store: Arc<AdmittedStore>,
    pools: Api<IPPool>,
    lbs: Api<LoadBalancer>,
}

impl Objects {
    pub fn new(store: Arc<AdmittedStore>) -> Self {
        let writer: Arc<dyn ObjectStore> = store.clone();
        Objects {
            pools: pool_api(writer.clone()),
            lbs: lb_api(writer),
            store,
        }
    }

    /// The checks the store runs, for the admission webhooks.
    pub fn admission(&self) -> &Admission {
        self.store.admission()
    }

    /// A failed store call: admission's refusal (or failure to decide) as such, a missing object as
    /// not found, anything else as the store's.
    fn store_err(
        action: &'static str,
        kind: &'static str,
        name: &str,
    ) -> impl FnOnce(StoreError) -> ObjectError {
        let name = name.to_string();
        move |e| match admission_error(e) {
            Ok(refusal) => ObjectError::Admission(refusal),
            Err(StoreError::NotFound { .. }) => ObjectError::NotFound { kind, name },
            Err(source) => ObjectError::Store {
                action,
                kind,
                name,
                source: Box::new(source),
            },
        }
    }

    // --- IPPools ---------------------------------------------------------------------------------

    pub async fn list_pools(&self) -> Result<(Vec<IPPool>, String), ObjectError> {
        let list = self
            .store
            .list(self.pools.kind(), None, &LabelSelector::everything())
            .await
            .map_err(Self::store_err("list", POOL, ""))?;
        decode_list(list, self.pools.kind())
    }

    pub async fn get_pool(&self, name: &str) -> Result<IPPool, ObjectError> {
        self.pools
            .get("", name)
            .await
            .map_err(Self::store_err("get", POOL, name))?
            .ok_or_else(|| ObjectError::NotFound {
                kind: POOL,
                name: name.into(),
            })
    }

    pub async fn create_pool(&self, body: &[u8]) -> Result<IPPool, ObjectError> {
        let pool: IPPool = decode(&POOL_BODY, body)?;
        let name = pool.name().to_string();
        self.pools
            .create(&pool)
            .await
            .map_err(Self::store_err("create", POOL, &name))
    }

    pub async fn update_pool(&self, name: &str, body: &[u8]) -> Result<IPPool, ObjectError> {
        let mut pool: IPPool = decode(&POOL_BODY, body)?;
        match pool.metadata.name.as_deref() {
            None | Some("") => pool.metadata.name = Some(name.into()),
            Some(n) if n != name => {
                return Err(ObjectError::Mismatch {
                    field: "name",
                    body: n.into(),
                    url: name.into(),
                });
            }
            Some(_) => {}
        }
        self.pools
            .replace(&pool)
            .await
            .map_err(Self::store_err("update", POOL, name))
    }

    pub async fn delete_pool(&self, name: &str) -> Result<Value, ObjectError> {
        let deleted = self
            .pools
            .delete("", name, &Preconditions::default())
            .await
            .map_err(Self::store_err("delete", POOL, name))?;
        Ok(match deleted {
            Deleted::Gone(v) | Deleted::Pending(v) => v,
        })
    }

    // --- LoadBalancers ---------------------------------------------------------------------------

    pub async fn list_lbs(
        &self,
        namespace: Option<&str>,
    ) -> Result<(Vec<LoadBalancer>, String), ObjectError> {
        let list = self
            .store
            .list(self.lbs.kind(), namespace, &LabelSelector::everything())
            .await
            .map_err(Self::store_err("list", LB, namespace.unwrap_or_default()))?;
        decode_list(list, self.lbs.kind())
    }

    pub async fn get_lb(&self, namespace: &str, name: &str) -> Result<LoadBalancer, ObjectError> {
        self.lbs
            .get(namespace, name)
            .await
            .map_err(Self::store_err("get", LB, name))?
            .ok_or_else(|| ObjectError::NotFound {
                kind: LB,
                name: name.into(),
            })
    }

    /// What this service reported about a LoadBalancer (`Allocated`, `PoolExhausted`, …), oldest
    /// first, and the list's resourceVersion; `NotFound` when the LoadBalancer does not exist.
    pub async fn lb_events(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<(Vec<k8s_openapi::api::core::v1::Event>, String), ObjectError> {
        let lb = self.get_lb(namespace, name).await?;
        crate::controller::events::about(self.store.as_ref(), &lb)
            .await
            .map_err(Self::store_err("list the events of", LB, name))
    }

    pub async fn create_lb(&self, body: &[u8]) -> Result<LoadBalancer, ObjectError> {
        let lb: LoadBalancer = decode(&LB_BODY, body)?;
        if lb
            .metadata
            .namespace
            .as_deref()
            .unwrap_or_default()
            .is_empty()
        {
            return Err(ObjectError::MissingNamespace {
                kind: LB,
                name: lb.metadata.name.clone().unwrap_or_default(),
            });
        }
        let name = lb.metadata.name.clone().unwrap_or_default();
        self.lbs
            .create(&lb)
            .await
            .map_err(Self::store_err("create", LB, &name))
    }

    pub async fn update_lb(
        &self,
        namespace: &str,
        name: &str,
        body: &[u8],
    ) -> Result<LoadBalancer, ObjectError> {
        let mut lb: LoadBalancer = decode(&LB_BODY, body)?;
        key_from_url(&mut lb.metadata, namespace, name)?;
        self.lbs
            .replace(&lb)
            .await
            .map_err(Self::store_err("update", LB, name))
    }

    pub async fn delete_lb(&self, namespace: &str, name: &str) -> Result<Value, ObjectError> {
        let deleted = self
            .lbs
            .delete(namespace, name, &Preconditions::default())
            .await
            .map_err(Self::store_err("delete", LB, name))?;
        Ok(match deleted {
            Deleted::Gone(v) | Deleted::Pending(v) => v,
        })
    }
}
