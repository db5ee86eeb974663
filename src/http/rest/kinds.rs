//! The kinds the REST layer serves, and their routes:
//!
//! - IPPools and LoadBalancers (`/v1/harvester/loadbalancer.harvesterhci.io.<plural>`, steve's
//!   shape), written through the admitted store, which mutates and validates them as Harvester's
//!   webhooks would; bodies are read as the CRDs' schemas read them, and `status` (the
//!   reconcilers') is ignored. Plus who holds a pool's addresses, and a LoadBalancer's Events.
//! - On the embedded backend, where no KubeVirt or Kubernetes API is there to ask: VMIs, written
//!   with their `status` as KubeVirt writes them (its VMI CRD has no status subresource), and the
//!   Services and EndpointSlices the VM load balancer reconciler made, read only. On Kubernetes
//!   these live in the cluster's API, and every route answers 404.
//! - Guest clusters' Services and Events (embedded backend, core/v1's shape): Services created or
//!   replaced with PUT, refused up front when the guest reconciler would refuse them
//!   ([`crate::guest::admit`]); and deleting a whole guest cluster.

use std::sync::Arc;

use axum::{
    Json,
    extract::State,
    routing::{delete, get},
};
use k8s_openapi::{
    api::{
        core::v1::{Event, Service},
        discovery::v1::EndpointSlice,
    },
    apimachinery::pkg::util::intstr::IntOrString,
};
use serde_json::Value;

use super::{
    Action, At, BadPath, DeleteAnswer, Loc, Place, Resource, RestError, Scope, Shape, Writable,
    body, create, fetch, list, list_objects, put, replace,
};
use crate::{
    auth,
    crd::{
        IPPool, LoadBalancer,
        kinds::{VirtualMachineInstance, vmi_kind},
        lb_kind, pool_kind,
    },
    guest::{
        admit,
        clusters::{self, ClusterDeletion, ClusterKey, ClusterStore},
    },
    http::{Admin, ApiError, AppState, Caller, Routes, objects},
    lb::{owners, vm::vmi},
    store::{Kind, ObjectStore},
};

pub const POOLS_PATH: &str = "/v1/harvester/loadbalancer.harvesterhci.io.ippools";
pub const POOL_PATH: &str = "/v1/harvester/loadbalancer.harvesterhci.io.ippools/{name}";
pub const POOL_ADDRESSES_PATH: &str =
    "/v1/harvester/loadbalancer.harvesterhci.io.ippools/{name}/addresses";
pub const LBS_PATH: &str = "/v1/harvester/loadbalancer.harvesterhci.io.loadbalancers";
pub const LBS_NAMESPACE_PATH: &str =
    "/v1/harvester/loadbalancer.harvesterhci.io.loadbalancers/{namespace}";
pub const LB_PATH: &str =
    "/v1/harvester/loadbalancer.harvesterhci.io.loadbalancers/{namespace}/{name}";
pub const LB_EVENTS_PATH: &str =
    "/v1/harvester/loadbalancer.harvesterhci.io.loadbalancers/{namespace}/{name}/events";
pub const VMIS_PATH: &str = "/v1/harvester/kubevirt.io.virtualmachineinstances";
pub const VMIS_NAMESPACE_PATH: &str =
    "/v1/harvester/kubevirt.io.virtualmachineinstances/{namespace}";
pub const VMI_PATH: &str = "/v1/harvester/kubevirt.io.virtualmachineinstances/{namespace}/{name}";
pub const SERVICES_PATH: &str = "/v1/harvester/services";
pub const SERVICES_NAMESPACE_PATH: &str = "/v1/harvester/services/{namespace}";
pub const SERVICE_PATH: &str = "/v1/harvester/services/{namespace}/{name}";
pub const SLICES_PATH: &str = "/v1/harvester/discovery.k8s.io.endpointslices";
pub const SLICES_NAMESPACE_PATH: &str = "/v1/harvester/discovery.k8s.io.endpointslices/{namespace}";
pub const SLICE_PATH: &str = "/v1/harvester/discovery.k8s.io.endpointslices/{namespace}/{name}";
pub const GUEST_CLUSTER_PATH: &str = "/v1/harvester/guestclusters/{namespace}/{cluster}";
pub const GUEST_SERVICES_PATH: &str = "/v1/harvester/guestclusters/{namespace}/{cluster}/services";
pub const GUEST_EVENTS_PATH: &str = "/v1/harvester/guestclusters/{namespace}/{cluster}/events";
pub const GUEST_SERVICE_PATH: &str =
    "/v1/harvester/guestclusters/{namespace}/{cluster}/services/{svcNamespace}/{svcName}";

/// Every route of the kinds here.
pub(in crate::http) fn routes(routes: Routes) -> Routes {
    use super::{delete as remove, get as one};
    routes
        .add(
            POOLS_PATH,
            &["GET", "POST"],
            objects(get(list::<IpPools>).post(create::<IpPools>)),
        )
        .add(
            POOL_PATH,
            &["GET", "PUT", "DELETE"],
            objects(
                get(one::<IpPools>)
                    .put(replace::<IpPools>)
                    .delete(remove::<IpPools>),
            ),
        )
        .add(POOL_ADDRESSES_PATH, &["GET"], get(pool_addresses))
        .add(
            LBS_PATH,
            &["GET", "POST"],
            objects(get(list::<LoadBalancers>).post(create::<LoadBalancers>)),
        )
        .add(LBS_NAMESPACE_PATH, &["GET"], get(list::<LoadBalancers>))
        .add(
            LB_PATH,
            &["GET", "PUT", "DELETE"],
            objects(
                get(one::<LoadBalancers>)
                    .put(replace::<LoadBalancers>)
                    .delete(remove::<LoadBalancers>),
            ),
        )
        .add(LB_EVENTS_PATH, &["GET"], get(lb_events))
        .add(
            VMIS_PATH,
            &["GET", "POST"],
            objects(get(list::<Vmis>).post(create::<Vmis>)),
        )
        .add(VMIS_NAMESPACE_PATH, &["GET"], get(list::<Vmis>))
        .add(
            VMI_PATH,
            &["GET", "PUT", "DELETE"],
            objects(get(one::<Vmis>).put(replace::<Vmis>).delete(remove::<Vmis>)),
        )
        .add(SERVICES_PATH, &["GET"], get(list::<VmServices>))
        .add(SERVICES_NAMESPACE_PATH, &["GET"], get(list::<VmServices>))
        .add(SERVICE_PATH, &["GET"], get(one::<VmServices>))
        .add(SLICES_PATH, &["GET"], get(list::<EndpointSlices>))
        .add(SLICES_NAMESPACE_PATH, &["GET"], get(list::<EndpointSlices>))
        .add(SLICE_PATH, &["GET"], get(one::<EndpointSlices>))
        .add(GUEST_SERVICES_PATH, &["GET"], get(list::<GuestServices>))
        .add(GUEST_EVENTS_PATH, &["GET"], get(list::<GuestEvents>))
        .add(
            GUEST_SERVICE_PATH,
            &["GET", "PUT", "DELETE"],
            objects(
                get(one::<GuestServices>)
                    .put(put::<GuestServices>)
                    .delete(remove::<GuestServices>),
            ),
        )
        .add(GUEST_CLUSTER_PATH, &["DELETE"], delete(delete_cluster))
}

// --- IPPools and LoadBalancers ---------------------------------------------------------------

pub struct IpPools;
pub struct LoadBalancers;

impl Resource for IpPools {
    type Object = IPPool;
    const NAME: &'static str = "ippool";
    const SHAPE: Shape = Shape::Steve("loadbalancer.harvesterhci.io.ippool");

    fn kind() -> Kind {
        pool_kind()
    }

    fn scope(state: &AppState, _at: &Loc) -> Result<Scope, ApiError> {
        Ok(Scope::host(state.admitted.clone()))
    }
}

impl Writable for IpPools {
    fn decode(body: &[u8]) -> Result<IPPool, RestError> {
        crd_body::<Self>(body, &[])
    }
}

impl Resource for LoadBalancers {
    type Object = LoadBalancer;
    const NAME: &'static str = "loadbalancer";
    const SHAPE: Shape = Shape::Steve("loadbalancer.harvesterhci.io.loadbalancer");

    fn kind() -> Kind {
        lb_kind()
    }

    fn scope(state: &AppState, _at: &Loc) -> Result<Scope, ApiError> {
        Ok(Scope::host(state.admitted.clone()))
    }

    /// Knob: no namespace of an invalid name exists, so there is no such collection either (404).
    fn list_namespace(at: &Loc) -> Result<Option<String>, ApiError> {
        match &at.namespace {
            Some(namespace) if crate::validation::dns1123_label(namespace).is_err() => {
                Err(ApiError::NotFound {
                    path: format!("{LBS_PATH}/{namespace}"),
                })
            }
            namespace => Ok(namespace.clone()),
        }
    }
}

impl Writable for LoadBalancers {
    fn decode(body: &[u8]) -> Result<LoadBalancer, RestError> {
        crd_body::<Self>(
            body,
            &[
                ("workloadType", &["", "vm", "cluster"]),
                ("ipam", &["", "pool", "dhcp"]),
            ],
        )
    }
}

/// A body of one of our CRDs, read as the API server reads it (before admission): `status` is
/// ignored, as a status subresource's is, and the enumerated `spec` fields (`enums`, `""` meaning
/// unset) take only their values, as the CRD's schema says.
fn crd_body<R: Resource>(body: &[u8], enums: &[(&str, &[&str])]) -> Result<R::Object, RestError> {
    let mut fields = body::object(body, &R::kind(), R::NAME)?;
    fields.remove("status");
    for (field, allowed) in enums {
        match fields.get("spec").and_then(|s| s.get(*field)) {
            None | Some(Value::Null) => {}
            Some(Value::String(v)) if allowed.contains(&v.as_str()) => {}
            Some(other) => {
                let supported: Vec<String> = allowed
                    .iter()
                    .filter(|a| !a.is_empty())
                    .map(|a| format!("{a:?}"))
                    .collect();
                return Err(RestError::Decode {
                    kind: R::NAME,
                    reason: format!(
                        "spec.{field}: Unsupported value: {other}: supported values: {}",
                        supported.join(", ")
                    ),
                });
            }
        }
    }
    body::typed(fields, R::NAME)
}

/// Who holds each of the pool's addresses ([`owners`]): the pool, then one list of every
/// LoadBalancer to join it with.
async fn pool_addresses(
    State(state): State<AppState>,
    admin: Admin,
    At(at, _): At<IpPools>,
) -> Result<Json<owners::PoolAddresses>, ApiError> {
    // `Admin` checked `get` on the pool; the answer also tells the labels of LoadBalancers in every
    // namespace, so a Kubernetes user must be allowed to list those too.
    let list_lbs = auth::Action::Object {
        verb: "list",
        resource: "loadbalancers",
        namespace: None,
    };
    Caller(admin.0).authorize(&state, list_lbs).await?;
    let scope = IpPools::scope(&state, &at)?;
    let (namespace, name) = IpPools::key(&at)?;
    let pool = fetch::<IpPools>(&scope, &namespace, &name).await?;
    let (lbs, _) = list_objects::<LoadBalancers>(&scope, None).await?;
    Ok(Json(owners::addresses(&pool, &lbs)))
}

/// What the reconciler reported about one LoadBalancer (`Allocated`, `PoolExhausted`, …), oldest
/// first, as a core/v1 EventList; 404 when the LoadBalancer does not exist.
async fn lb_events(
    State(state): State<AppState>,
    _admin: Admin,
    At(at, _): At<LoadBalancers>,
) -> Result<Json<Value>, ApiError> {
    let scope = LoadBalancers::scope(&state, &at)?;
    let (namespace, name) = LoadBalancers::key(&at)?;
    let lb = fetch::<LoadBalancers>(&scope, &namespace, &name).await?;
    let (events, revision) = crate::controller::events::about(scope.store.as_ref(), &lb)
        .await
        .map_err(scope.failed::<LoadBalancers>(
            Action::Read("list the events of"),
            &namespace,
            &name,
        ))?;
    Shape::CoreV1("Event").list(&events, revision)
}

// --- The embedded backend's VMIs, and the VM load balancers' Services and EndpointSlices -------

pub struct Vmis;
pub struct VmServices;
pub struct EndpointSlices;

/// The embedded store, where it keeps `what`.
fn embedded(state: &AppState, what: &'static str) -> Result<Scope, ApiError> {
    state
        .vms
        .clone()
        .map(Scope::host)
        .ok_or(ApiError::EmbeddedOnly { what })
}

impl Resource for Vmis {
    type Object = VirtualMachineInstance;
    const NAME: &'static str = "virtualmachineinstance";
    const SHAPE: Shape = Shape::Steve("kubevirt.io.virtualmachineinstance");
    const BAD_PATH: BadPath = BadPath::Plain;

    fn kind() -> Kind {
        vmi_kind()
    }

    fn scope(state: &AppState, _at: &Loc) -> Result<Scope, ApiError> {
        embedded(state, "VirtualMachineInstances")
    }
}

impl Writable for Vmis {
    /// As KubeVirt's CRD reads it ([`vmi`]), `status` included.
    fn decode(body: &[u8]) -> Result<VirtualMachineInstance, RestError> {
        let fields = body::object(body, &Self::kind(), Self::NAME)?;
        vmi::from_json(fields).map_err(|e| RestError::Decode {
            kind: Self::NAME,
            reason: e.0,
        })
    }
}

impl Resource for VmServices {
    type Object = Service;
    const NAME: &'static str = "service";
    const SHAPE: Shape = Shape::Steve("service");
    const BAD_PATH: BadPath = BadPath::Plain;

    fn scope(state: &AppState, _at: &Loc) -> Result<Scope, ApiError> {
        embedded(state, "Services")
    }
}

impl Resource for EndpointSlices {
    type Object = EndpointSlice;
    const NAME: &'static str = "endpointslice";
    const SHAPE: Shape = Shape::Steve("discovery.k8s.io.endpointslice");
    const BAD_PATH: BadPath = BadPath::Plain;

    fn scope(state: &AppState, _at: &Loc) -> Result<Scope, ApiError> {
        embedded(state, "EndpointSlices")
    }
}

// --- Guest clusters -------------------------------------------------------------------------

/// The guest clusters of the embedded backend: the store that keeps them, and Harvester's store
/// port for their LoadBalancers (behind the same admission as the API's).
#[derive(Clone)]
pub struct GuestClusters {
    store: Arc<dyn ObjectStore>,
    harvester: Arc<dyn ObjectStore>,
}

impl GuestClusters {
    pub fn new(store: Arc<dyn ObjectStore>, harvester: Arc<dyn ObjectStore>) -> Self {
        GuestClusters { store, harvester }
    }

    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    pub fn harvester(&self) -> &Arc<dyn ObjectStore> {
        &self.harvester
    }
}

pub struct GuestServices;
pub struct GuestEvents;

/// The guest cluster the URL names (both names RFC 1123 labels).
fn guest_cluster(at: &Loc) -> Result<ClusterKey, RestError> {
    Ok(ClusterKey::new(
        at.namespace.as_deref().unwrap_or_default(),
        at.cluster.as_deref().unwrap_or_default(),
    )?)
}

/// The guest cluster's store port, where this backend keeps guest clusters.
fn guest_scope(state: &AppState, at: &Loc) -> Result<Scope, ApiError> {
    let guests = state.guests.as_ref().ok_or(ApiError::NoGuestClusters)?;
    let key = guest_cluster(at)?;
    Ok(Scope {
        store: Arc::new(ClusterStore::new(guests.store().clone(), key.clone())),
        place: Place::Guest(key),
    })
}

impl Resource for GuestServices {
    type Object = Service;
    const NAME: &'static str = "service";
    const SHAPE: Shape = Shape::CoreV1("Service");
    const STRICT_LIST: bool = true;
    const DELETED: DeleteAnswer = DeleteAnswer::Decoded;

    fn scope(state: &AppState, at: &Loc) -> Result<Scope, ApiError> {
        guest_scope(state, at)
    }

    /// Kubernetes' rules: Service names are RFC 1035 labels, namespaces RFC 1123 labels.
    fn key(at: &Loc) -> Result<(String, String), RestError> {
        let namespace = at.svc_namespace.clone().unwrap_or_default();
        let name = at.svc_name.clone().unwrap_or_default();
        crate::validation::dns1123_label(&namespace).map_err(|reason| RestError::InvalidName {
            kind: Self::NAME,
            field: "namespace",
            value: namespace.clone(),
            reason,
        })?;
        if !crate::guest::naming::is_dns1035_label(&name) {
            return Err(RestError::InvalidName {
                kind: Self::NAME,
                field: "name",
                value: name,
                reason: "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')".into(),
            });
        }
        Ok((namespace, name))
    }

    fn list_namespace(_at: &Loc) -> Result<Option<String>, ApiError> {
        Ok(None)
    }
}

impl Writable for GuestServices {
    fn decode(body: &[u8]) -> Result<Service, RestError> {
        service_body(body)
    }

    /// What the reconciler would refuse, decided now on the stored objects.
    async fn check(state: &AppState, scope: &Scope, svc: &Service) -> Result<(), RestError> {
        // A guest Service's scope is always a guest cluster of this backend's.
        let (Place::Guest(key), Some(guests)) = (&scope.place, &state.guests) else {
            return Ok(());
        };
        admit::check_write(&scope.store, &guests.harvester, key, svc)
            .await
            .map_err(scope.place.check_failed(Self::NAME))
    }

    fn keep_status(svc: &mut Service, current: &Service) {
        svc.status = current.status.clone();
    }
}

impl Resource for GuestEvents {
    type Object = Event;
    const NAME: &'static str = "event";
    const SHAPE: Shape = Shape::CoreV1("Event");
    const STRICT_LIST: bool = true;

    fn scope(state: &AppState, at: &Loc) -> Result<Scope, ApiError> {
        guest_scope(state, at)
    }

    fn list_namespace(_at: &Loc) -> Result<Option<String>, ApiError> {
        Ok(None)
    }

    /// What the reconciler reports about the cluster's Services, oldest first.
    fn arrange(events: &mut [Event]) {
        crate::controller::events::oldest_first(events);
    }
}

/// Deletes a whole guest cluster ([`clusters::delete_cluster`]); 404 when it has nothing.
async fn delete_cluster(
    State(state): State<AppState>,
    _admin: Admin,
    At(at, _): At<GuestServices>,
) -> Result<Json<ClusterDeletion>, ApiError> {
    let guests = state.guests.as_ref().ok_or(ApiError::NoGuestClusters)?;
    let key = guest_cluster(&at)?;
    let deleted = clusters::delete_cluster(&guests.store, &guests.harvester, &key)
        .await
        .map_err(|e| RestError::DeleteCluster(Box::new(e)))?;
    if deleted.is_empty() {
        return Err(RestError::ClusterNotFound(key.to_string()).into());
    }
    Ok(Json(deleted))
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

/// A Service body, read and validated as the API server reads one: `status` (the reconciler's, a
/// status subresource) and the server's metadata ignored, the type and ports checked.
fn service_body(body: &[u8]) -> Result<Service, RestError> {
    const NAME: &str = GuestServices::NAME;
    let invalid = |reason: String| RestError::Decode { kind: NAME, reason };
    let mut fields = body::object(body, &Kind::of::<Service>(), NAME)?;
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
    let svc: Service = body::typed(fields, NAME)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(svc_namespace: &str, svc_name: &str) -> Loc {
        Loc {
            svc_namespace: Some(svc_namespace.into()),
            svc_name: Some(svc_name.into()),
            ..Loc::default()
        }
    }

    #[test]
    fn bodies() {
        let svc = service_body(
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
            assert_eq!(
                service_body(body).expect_err("refused").to_string(),
                message
            );
        }
        assert!(GuestServices::key(&at("default", "web")).is_ok());
        assert!(GuestServices::key(&at("default", "1web")).is_err());
        assert!(GuestServices::key(&at("Default", "web")).is_err());
    }

    #[test]
    fn crd_bodies() {
        let lb = LoadBalancers::decode(
            br#"{"apiVersion":"loadbalancer.harvesterhci.io/v1beta1","kind":"LoadBalancer",
                 "metadata":{"name":"lb"},"spec":{"ipam":"dhcp"},"status":{"address":"10.0.0.1"}}"#,
        )
        .expect("decodes");
        assert!(lb.status.is_none(), "status is the reconciler's");
        assert_eq!(
            LoadBalancers::decode(br#"{"spec":{"ipam":"static"}}"#)
                .expect_err("refused")
                .to_string(),
            "fail to decode loadbalancer: spec.ipam: Unsupported value: \"static\": supported values: \"pool\", \"dhcp\""
        );
        assert_eq!(
            IpPools::decode(br#"{"kind":"LoadBalancer"}"#)
                .expect_err("refused")
                .to_string(),
            "fail to decode ippool: kind must be \"IPPool\", not \"LoadBalancer\""
        );
    }
}
