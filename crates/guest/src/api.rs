//! Guest clusters' Services through the HTTP API (embedded backend): reading them, creating or
//! replacing them with Kubernetes' semantics (UIDs assigned on create, a stale resourceVersion is a
//! conflict, `status` and finalizers are the reconciler's), deleting them, and deleting a whole guest
//! cluster.
//!
//! A write that the reconciler would refuse is refused here, synchronously, with the same upstream
//! message (a network or IPAM change, a share-IP rule, a NAD mapping problem), so that an API client
//! learns at once what a Kubernetes user learns from an Event; the Service is then left as it was.

use std::sync::Arc;

use k8s_openapi::{
    api::core::v1::{ConfigMap, Event, Service},
    apimachinery::pkg::util::intstr::IntOrString,
};
use serde_json::Value;

use super::{
    GuestError,
    clusters::{self, ClusterDeletion, ClusterKey, ClusterNameError, ClusterStore},
    decide::{
        is_load_balancer, judge_network, judge_primary, judge_secondary, lb_name_of, primary_of,
    },
    mapping::service_key,
    share,
};
use crate::{
    crd::{LoadBalancer, keys, lb_api},
    store::{Api, Deleted, LabelSelector, ObjectStore, Preconditions, StoreError},
};

/// A request about a guest cluster or its Services that could not be served.
#[derive(Debug, thiserror::Error)]
pub enum GuestApiError {
    #[error(transparent)]
    Name(#[from] ClusterNameError),
    #[error("invalid service {field} {value:?}: {reason}")]
    ServiceName {
        field: &'static str,
        value: String,
        reason: String,
    },
    #[error("fail to decode service: {reason}")]
    Decode { reason: String },
    /// A stored object that does not decode: the server's fault, not the request's.
    #[error("stored {kind} cannot be read: {reason}")]
    Stored { kind: String, reason: String },
    #[error("the {field} of the service ({body}) does not match the {field} on the URL ({url})")]
    Mismatch {
        field: &'static str,
        body: String,
        url: String,
    },
    #[error("service {namespace}/{name} not found in guest cluster {cluster}")]
    NotFound {
        cluster: String,
        namespace: String,
        name: String,
    },
    #[error("guest cluster {0} not found")]
    ClusterNotFound(String),
    #[error(
        "Operation cannot be fulfilled on services \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
    )]
    Conflict { name: String },
    #[error(transparent)]
    Refused(#[from] GuestError),
    #[error("cannot {action} service {name} of guest cluster {cluster}: {source}")]
    Store {
        action: &'static str,
        cluster: String,
        name: String,
        source: Box<StoreError>,
    },
    #[error(transparent)]
    DeleteCluster(Box<clusters::DeleteClusterError>),
}

impl GuestApiError {
    /// The store error behind a failure, if that is what it is.
    pub fn store_error(&self) -> Option<&StoreError> {
        match self {
            GuestApiError::Store { source, .. } => Some(source),
            GuestApiError::DeleteCluster(e) => match e.as_ref() {
                clusters::DeleteClusterError::List { source, .. }
                | clusters::DeleteClusterError::Delete { source, .. } => Some(source),
            },
            _ => None,
        }
    }
}

/// The guest clusters of the embedded store, as the HTTP API serves them.
#[derive(Clone)]
pub struct GuestClusters {
    store: Arc<dyn ObjectStore>,
    harvester: Arc<dyn ObjectStore>,
}

/// The Service as stored, and whether this request created it.
pub struct Put {
    pub service: Service,
    pub created: bool,
}

/// The Service as deleted (or marked for deletion until the reconciler releases it).
pub struct Delete {
    pub service: Service,
    pub gone: bool,
}

/// Fields of `metadata` that only the server sets; a client's values are ignored (and not
/// decoded, so a malformed timestamp is no reason to refuse a write).
const SERVER_METADATA: &[&str] = &[
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "managedFields",
    "selfLink",
];

fn decode(body: &[u8]) -> Result<Service, GuestApiError> {
    let invalid = |reason: String| GuestApiError::Decode { reason };
    let mut value: Value = serde_json::from_slice(body).map_err(|e| invalid(e.to_string()))?;
    let fields = value
        .as_object_mut()
        .ok_or_else(|| invalid("the body must be a JSON object".into()))?;
    for (field, want) in [("apiVersion", "v1"), ("kind", "Service")] {
        match fields.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == want => {}
            Some(other) => return Err(invalid(format!("{field} must be {want:?}, not {other}"))),
        }
    }
    // The status is the reconciler's, as a status subresource's is: ignored.
    fields.remove("status");
    if fields
        .get("metadata")
        .is_some_and(|m| !m.is_object() && !m.is_null())
    {
        return Err(invalid("metadata must be an object".into()));
    }
    if let Some(meta) = fields.get_mut("metadata").and_then(Value::as_object_mut) {
        for f in ["creationTimestamp", "deletionTimestamp"] {
            if meta.get(f).is_some_and(|v| !v.is_string() && !v.is_null()) {
                return Err(invalid(format!("metadata.{f} must be a string")));
            }
        }
        for f in SERVER_METADATA {
            meta.remove(*f);
        }
    }
    let svc: Service = serde_json::from_value(value).map_err(|e| invalid(e.to_string()))?;
    if let Some(t) = svc.spec.as_ref().and_then(|s| s.type_.as_deref())
        && !["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"].contains(&t)
    {
        return Err(invalid(format!(
            "spec.type: Unsupported value: {t:?}: supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\""
        )));
    }
    for p in svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
    {
        if !(1..=65535).contains(&p.port) {
            return Err(invalid(format!(
                "spec.ports.port: Invalid value: {}: must be between 1 and 65535, inclusive",
                p.port
            )));
        }
        if let Some(IntOrString::Int(t)) = &p.target_port
            && !(1..=65535).contains(t)
        {
            return Err(invalid(format!(
                "spec.ports.targetPort: Invalid value: {t}: must be between 1 and 65535, inclusive"
            )));
        }
        if let Some(n) = p.node_port
            && !(0..=65535).contains(&n)
        {
            return Err(invalid(format!(
                "spec.ports.nodePort: Invalid value: {n}: must be between 0 and 65535, inclusive"
            )));
        }
        if let Some(proto) = &p.protocol
            && !["TCP", "UDP", "SCTP"].contains(&proto.as_str())
        {
            return Err(invalid(format!(
                "spec.ports.protocol: Unsupported value: {proto:?}: supported values: \"SCTP\", \"TCP\", \"UDP\""
            )));
        }
    }
    Ok(svc)
}

/// Kubernetes' rules for Service names (RFC 1035 labels) and namespaces (RFC 1123 labels).
fn check_service_names(namespace: &str, name: &str) -> Result<(), GuestApiError> {
    crate::validation::dns1123_label(namespace).map_err(|reason| GuestApiError::ServiceName {
        field: "namespace",
        value: namespace.into(),
        reason,
    })?;
    if !super::naming::is_dns1035_label(name) {
        return Err(GuestApiError::ServiceName {
            field: "name",
            value: name.into(),
            reason: "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')".into(),
        });
    }
    Ok(())
}

impl GuestClusters {
    /// `store` keeps the guest objects; `harvester` is the LoadBalancers' store port (the embedded
    /// store behind admission).
    pub fn new(store: Arc<dyn ObjectStore>, harvester: Arc<dyn ObjectStore>) -> Self {
        GuestClusters { store, harvester }
    }

    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    pub fn harvester(&self) -> &Arc<dyn ObjectStore> {
        &self.harvester
    }

    /// One guest cluster's store port.
    pub fn cluster(&self, namespace: &str, cluster: &str) -> Result<ClusterStore, GuestApiError> {
        Ok(ClusterStore::new(
            self.store.clone(),
            ClusterKey::new(namespace, cluster)?,
        ))
    }

    fn services(view: ClusterStore) -> Api<Service> {
        Api::new(Arc::new(view))
    }

    fn store_err(
        action: &'static str,
        key: &ClusterKey,
        name: &str,
    ) -> impl FnOnce(StoreError) -> GuestApiError {
        let (cluster, name) = (key.to_string(), name.to_string());
        move |source| GuestApiError::Store {
            action,
            cluster,
            name,
            source: Box::new(source),
        }
    }

    /// Every Service of a guest cluster and the list's resourceVersion.
    pub async fn list_services(
        &self,
        namespace: &str,
        cluster: &str,
    ) -> Result<(Vec<Service>, String), GuestApiError> {
        self.list(namespace, cluster).await
    }

    /// The Events of a guest cluster (the reconciler's, about its Services), oldest first.
    pub async fn list_events(
        &self,
        namespace: &str,
        cluster: &str,
    ) -> Result<(Vec<Event>, String), GuestApiError> {
        let (mut events, revision) = self.list::<Event>(namespace, cluster).await?;
        crate::controller::events::oldest_first(&mut events);
        Ok((events, revision))
    }

    /// Every object of a kind in a guest cluster, and the store's revision.
    async fn list<K: crate::store::Object>(
        &self,
        namespace: &str,
        cluster: &str,
    ) -> Result<(Vec<K>, String), GuestApiError> {
        let view = self.cluster(namespace, cluster)?;
        let key = view.key().clone();
        let list = view
            .list(
                &crate::store::Kind::of::<K>(),
                None,
                &LabelSelector::everything(),
            )
            .await
            .map_err(Self::store_err("list", &key, ""))?;
        let items = list
            .items
            .into_iter()
            .map(|v| {
                serde_json::from_value(v).map_err(|e| GuestApiError::Stored {
                    kind: crate::store::Kind::of::<K>().kind.to_string(),
                    reason: e.to_string(),
                })
            })
            .collect::<Result<Vec<K>, _>>()?;
        Ok((items, list.resource_version))
    }

    pub async fn get_service(
        &self,
        namespace: &str,
        cluster: &str,
        svc_namespace: &str,
        name: &str,
    ) -> Result<Service, GuestApiError> {
        let view = self.cluster(namespace, cluster)?;
        check_service_names(svc_namespace, name)?;
        let key = view.key().clone();
        Self::services(view)
            .get(svc_namespace, name)
            .await
            .map_err(Self::store_err("get", &key, name))?
            .ok_or_else(|| GuestApiError::NotFound {
                cluster: key.to_string(),
                namespace: svc_namespace.into(),
                name: name.into(),
            })
    }

    /// Creates or replaces a Service (PUT).
    pub async fn put_service(
        &self,
        namespace: &str,
        cluster: &str,
        svc_namespace: &str,
        name: &str,
        body: &[u8],
    ) -> Result<Put, GuestApiError> {
        let view = self.cluster(namespace, cluster)?;
        check_service_names(svc_namespace, name)?;
        let key = view.key().clone();
        let mut svc = decode(body)?;
        for (field, slot, url) in [
            ("namespace", &mut svc.metadata.namespace, svc_namespace),
            ("name", &mut svc.metadata.name, name),
        ] {
            match slot.as_deref() {
                None | Some("") => *slot = Some(url.into()),
                Some(v) if v != url => {
                    return Err(GuestApiError::Mismatch {
                        field,
                        body: v.into(),
                        url: url.into(),
                    });
                }
                Some(_) => {}
            }
        }
        let guest: Arc<dyn ObjectStore> = Arc::new(view);
        let services = Api::<Service>::new(guest.clone());
        let current = services
            .get(svc_namespace, name)
            .await
            .map_err(Self::store_err("get", &key, name))?;
        match &current {
            Some(current) => {
                // A UID names one incarnation of the Service: another one's is a conflict.
                let uid = svc.metadata.uid.as_deref().filter(|u| !u.is_empty());
                if uid.is_some_and(|u| Some(u) != current.metadata.uid.as_deref()) {
                    return Err(GuestApiError::Conflict { name: name.into() });
                }
                svc.metadata.uid = current.metadata.uid.clone();
                if svc
                    .metadata
                    .resource_version
                    .as_deref()
                    .unwrap_or_default()
                    .is_empty()
                {
                    svc.metadata.resource_version = current.metadata.resource_version.clone();
                }
                // The finalizers are the reconciler's: dropping its own would skip the release.
                svc.metadata.finalizers = current.metadata.finalizers.clone();
                svc.status = current.status.clone();
            }
            None => {
                svc.metadata.uid = None;
                svc.metadata.resource_version = None;
                svc.metadata.finalizers = None;
            }
        }
        self.check(&key, &guest, &svc).await?;
        let written = match current {
            Some(_) => services.replace(&svc).await.map_err(|e| match e {
                StoreError::Conflict { .. } => GuestApiError::Conflict { name: name.into() },
                StoreError::NotFound { .. } => GuestApiError::NotFound {
                    cluster: key.to_string(),
                    namespace: svc_namespace.into(),
                    name: name.into(),
                },
                other => Self::store_err("update", &key, name)(other),
            })?,
            None => services.create(&svc).await.map_err(|e| match e {
                StoreError::AlreadyExists { .. } => GuestApiError::Conflict { name: name.into() },
                other => Self::store_err("create", &key, name)(other),
            })?,
        };
        Ok(Put {
            created: current.is_none(),
            service: written,
        })
    }

    /// What the reconciler would refuse, decided now on the stored objects.
    async fn check(
        &self,
        key: &ClusterKey,
        guest: &Arc<dyn ObjectStore>,
        svc: &Service,
    ) -> Result<(), GuestApiError> {
        if !is_load_balancer(svc) {
            return Ok(());
        }
        let svc_key = service_key(svc);
        let read = |what: &'static str| Self::store_err(what, key, &svc_key);
        let network = svc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(keys::SVC_NETWORK))
            .filter(|n| !n.is_empty());
        let nad = match network {
            Some(_) => Api::<ConfigMap>::new(guest.clone())
                .get(keys::NAD_MAPPING_NAMESPACE, keys::NAD_MAPPING_NAME)
                .await
                .map_err(read("get"))?
                .map(|cm| cm.data.and_then(|mut d| d.remove(keys::NAD_MAPPING_KEY))),
            None => None,
        };
        judge_network(svc, nad.as_ref().map(|m| m.as_deref()))?;
        let ctx = key.context();
        let lbs = lb_api(self.harvester.clone());
        let lb_of = async |s: &Service| -> Result<Option<LoadBalancer>, GuestApiError> {
            match lb_name_of(&ctx.cluster, s) {
                Some(lb_name) => lbs
                    .get(&ctx.lb_namespace, &lb_name)
                    .await
                    .map_err(read("get")),
                None => Ok(None),
            }
        };
        match primary_of(svc)? {
            Some((pns, pname)) => {
                let services = Api::<Service>::new(guest.clone());
                let primary = services.get(&pns, &pname).await.map_err(read("get"))?;
                let primary_lb = match &primary {
                    Some(p) => lb_of(p).await?,
                    None => None,
                };
                let label_value = share::primary_label_value(&pns, &pname);
                let others: Vec<Service> = services
                    .list(
                        None,
                        &LabelSelector::from_labels([(keys::SVC_PRIMARY, label_value.as_str())]),
                    )
                    .await
                    .map_err(read("list"))?
                    .into_iter()
                    .filter(|s| {
                        s.metadata.deletion_timestamp.is_none()
                            && service_key(s) != service_key(svc)
                            && primary_of(s).ok().flatten() == Some((pns.clone(), pname.clone()))
                    })
                    .collect();
                let refs: Vec<&Service> = others.iter().collect();
                judge_secondary(
                    svc,
                    (&pns, &pname),
                    primary.as_ref(),
                    primary_lb.as_ref(),
                    &refs,
                )?;
            }
            None => {
                let existing = lb_of(svc).await?;
                judge_primary(svc, &ctx, existing.as_ref())?;
            }
        }
        Ok(())
    }

    /// Deletes a Service; one whose load balancer must be released first is marked for deletion
    /// and goes once the reconciler has released it.
    pub async fn delete_service(
        &self,
        namespace: &str,
        cluster: &str,
        svc_namespace: &str,
        name: &str,
    ) -> Result<Delete, GuestApiError> {
        let view = self.cluster(namespace, cluster)?;
        check_service_names(svc_namespace, name)?;
        let key = view.key().clone();
        let deleted = Self::services(view)
            .delete(svc_namespace, name, &Preconditions::default())
            .await
            .map_err(|e| match e {
                StoreError::NotFound { .. } => GuestApiError::NotFound {
                    cluster: key.to_string(),
                    namespace: svc_namespace.into(),
                    name: name.into(),
                },
                other => Self::store_err("delete", &key, name)(other),
            })?;
        let (value, gone) = match deleted {
            Deleted::Gone(v) => (v, true),
            Deleted::Pending(v) => (v, false),
        };
        let service = serde_json::from_value(value).map_err(|e| GuestApiError::Stored {
            kind: "Service".into(),
            reason: e.to_string(),
        })?;
        Ok(Delete { service, gone })
    }

    /// Deletes a whole guest cluster ([`clusters::delete_cluster`]); 404 when it has nothing.
    pub async fn delete_cluster(
        &self,
        namespace: &str,
        cluster: &str,
    ) -> Result<ClusterDeletion, GuestApiError> {
        let key = ClusterKey::new(namespace, cluster)?;
        let deleted = clusters::delete_cluster(&self.store, &self.harvester, &key)
            .await
            .map_err(|e| GuestApiError::DeleteCluster(Box::new(e)))?;
        if deleted.is_empty() {
            return Err(GuestApiError::ClusterNotFound(key.to_string()));
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies() {
        let svc = decode(
            br#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"web","creationTimestamp":"not a time"},
                 "spec":{"type":"LoadBalancer","ports":[{"port":80,"protocol":"UDP"}]},
                 "status":{"loadBalancer":{"ingress":[{"ip":"1.2.3.4"}]}}}"#,
        )
        .expect("decodes");
        assert!(svc.status.is_none(), "status is the reconciler's");
        assert!(svc.metadata.creation_timestamp.is_none());
        for (body, message) in [
            (
                &br#"[]"#[..],
                "fail to decode service: the body must be a JSON object",
            ),
            (
                br#"{"kind":"Pod"}"#,
                "fail to decode service: kind must be \"Service\", not \"Pod\"",
            ),
            (
                br#"{"spec":{"ports":[{"port":0}]}}"#,
                "fail to decode service: spec.ports.port: Invalid value: 0: must be between 1 and 65535, inclusive",
            ),
            (
                br#"{"spec":{"ports":[{"port":1,"protocol":"ICMP"}]}}"#,
                "fail to decode service: spec.ports.protocol: Unsupported value: \"ICMP\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
            ),
        ] {
            assert_eq!(decode(body).expect_err("refused").to_string(), message);
        }
        assert!(check_service_names("default", "web").is_ok());
        assert!(check_service_names("default", "1web").is_err());
        assert!(check_service_names("Default", "web").is_err());
    }
}
