//! VM load balancers' objects in steve's shape, on the embedded backend: KubeVirt
//! VirtualMachineInstances (listed, created, read, replaced with their status, deleted), and the
//! Services and EndpointSlices the reconciler makes for VM load balancers (read only). On
//! Kubernetes these live in the cluster's API, and every route answers 404.

use axum::{
    Json,
    body::Bytes,
    extract::{Path, State, rejection::BytesRejection},
    response::Response,
};
use serde_json::Value;

use super::{
    Admin, ApiError, AppState, body_bytes,
    lb::{collection, created, resource, resource_value},
};
use crate::lb::vm::api::VmObjects;

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

/// steve's type names.
const VMI_TYPE: &str = "kubevirt.io.virtualmachineinstance";
const SERVICE_TYPE: &str = "service";
const SLICE_TYPE: &str = "discovery.k8s.io.endpointslice";

fn vms<'a>(state: &'a AppState, what: &'static str) -> Result<&'a VmObjects, ApiError> {
    state.vms.as_ref().ok_or(ApiError::EmbeddedOnly { what })
}

const VMIS: &str = "VirtualMachineInstances";
const SERVICES: &str = "Services";
const SLICES: &str = "EndpointSlices";

pub async fn list_vmis(
    State(state): State<AppState>,
    _admin: Admin,
) -> Result<Json<Value>, ApiError> {
    let (items, revision) = vms(&state, VMIS)?.list_vmis(None).await?;
    collection(VMI_TYPE, &items, revision)
}

pub async fn list_vmis_in(
    State(state): State<AppState>,
    _admin: Admin,
    Path(namespace): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let (items, revision) = vms(&state, VMIS)?.list_vmis(Some(&namespace)).await?;
    collection(VMI_TYPE, &items, revision)
}

pub async fn create_vmi(
    State(state): State<AppState>,
    _admin: Admin,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(body, super::limits::OBJECT_BODY)?;
    let vmi = vms(&state, VMIS)?.create_vmi(&body).await?;
    Ok(created(resource(VMI_TYPE, &vmi)?))
}

pub async fn get_vmi(
    State(state): State<AppState>,
    _admin: Admin,
    Path((namespace, name)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let vmi = vms(&state, VMIS)?.get_vmi(&namespace, &name).await?;
    Ok(Json(resource(VMI_TYPE, &vmi)?))
}

pub async fn update_vmi(
    State(state): State<AppState>,
    _admin: Admin,
    Path((namespace, name)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body_bytes(body, super::limits::OBJECT_BODY)?;
    let vmi = vms(&state, VMIS)?
        .replace_vmi(&namespace, &name, &body)
        .await?;
    Ok(Json(resource(VMI_TYPE, &vmi)?))
}

pub async fn delete_vmi(
    State(state): State<AppState>,
    _admin: Admin,
    Path((namespace, name)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let deleted = vms(&state, VMIS)?.delete_vmi(&namespace, &name).await?;
    Ok(Json(resource_value(VMI_TYPE, deleted)))
}

pub async fn list_services(
    State(state): State<AppState>,
    _admin: Admin,
) -> Result<Json<Value>, ApiError> {
    let (items, revision) = vms(&state, SERVICES)?.list_services(None).await?;
    collection(SERVICE_TYPE, &items, revision)
}

pub async fn list_services_in(
    State(state): State<AppState>,
    _admin: Admin,
    Path(namespace): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let (items, revision) = vms(&state, SERVICES)?
        .list_services(Some(&namespace))
        .await?;
    collection(SERVICE_TYPE, &items, revision)
}

pub async fn get_service(
    State(state): State<AppState>,
    _admin: Admin,
    Path((namespace, name)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let svc = vms(&state, SERVICES)?
        .get_service(&namespace, &name)
        .await?;
    Ok(Json(resource(SERVICE_TYPE, &svc)?))
}

pub async fn list_slices(
    State(state): State<AppState>,
    _admin: Admin,
) -> Result<Json<Value>, ApiError> {
    let (items, revision) = vms(&state, SLICES)?.list_slices(None).await?;
    collection(SLICE_TYPE, &items, revision)
}

pub async fn list_slices_in(
    State(state): State<AppState>,
    _admin: Admin,
    Path(namespace): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let (items, revision) = vms(&state, SLICES)?.list_slices(Some(&namespace)).await?;
    collection(SLICE_TYPE, &items, revision)
}

pub async fn get_slice(
    State(state): State<AppState>,
    _admin: Admin,
    Path((namespace, name)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let slice = vms(&state, SLICES)?.get_slice(&namespace, &name).await?;
    Ok(Json(resource(SLICE_TYPE, &slice)?))
}
