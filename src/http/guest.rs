//! Guest clusters' Services (embedded backend): core/v1 Services of a guest cluster, created or
//! replaced with PUT, read, deleted, listed as a ServiceList; their Events as an EventList; and
//! deleting a whole guest cluster.
//! The reconciler gives each Service of type LoadBalancer its address; GET shows it (annotation
//! `kube-vip.io/loadbalancerIPs`, `status.loadBalancer.ingress`).

use axum::{
    Json,
    body::Bytes,
    extract::{State, rejection::BytesRejection},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use k8s_openapi::api::core::v1::Service;
use serde_json::Value;

use super::{Admin, ApiError, AppState, body_bytes, path::ApiPath};
use crate::guest::{api::GuestClusters, clusters::ClusterDeletion};

pub const CLUSTER_PATH: &str = "/v1/harvester/guestclusters/{namespace}/{cluster}";
pub const SERVICES_PATH: &str = "/v1/harvester/guestclusters/{namespace}/{cluster}/services";
pub const EVENTS_PATH: &str = "/v1/harvester/guestclusters/{namespace}/{cluster}/events";
pub const SERVICE_PATH: &str =
    "/v1/harvester/guestclusters/{namespace}/{cluster}/services/{svcNamespace}/{svcName}";

fn guests(state: &AppState) -> Result<&GuestClusters, ApiError> {
    state.guests.as_ref().ok_or(ApiError::NoGuestClusters)
}

/// A core/v1 object as a Kubernetes client reads it (`apiVersion` and `kind` included).
fn core_v1<K: serde::Serialize>(obj: &K, kind: &'static str) -> Result<Value, ApiError> {
    let mut value = serde_json::to_value(obj).map_err(|e| ApiError::Encode {
        what: kind,
        reason: e.to_string(),
    })?;
    if let Some(fields) = value.as_object_mut() {
        fields.insert("apiVersion".into(), Value::from("v1"));
        fields.insert("kind".into(), Value::from(kind));
    }
    Ok(value)
}

fn service(svc: &Service) -> Result<Value, ApiError> {
    core_v1(svc, "Service")
}

/// A core/v1 list (`ServiceList`, `EventList`).
pub(super) fn core_v1_list<K: serde::Serialize>(
    items: &[K],
    kind: &'static str,
    revision: String,
) -> Result<Json<Value>, ApiError> {
    let items = items
        .iter()
        .map(|i| core_v1(i, kind))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(serde_json::json!({
        "apiVersion": "v1",
        "kind": format!("{kind}List"),
        "metadata": {"resourceVersion": revision},
        "items": items,
    })))
}

pub async fn list_services(
    State(state): State<AppState>,
    _admin: Admin,
    ApiPath((namespace, cluster)): ApiPath<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let (items, revision) = guests(&state)?.list_services(&namespace, &cluster).await?;
    core_v1_list(&items, "Service", revision)
}

/// The guest cluster's Events (what the reconciler reports about its Services: addresses ensured,
/// refusals with upstream's messages, a primary's deletion waiting for its secondaries), oldest first.
pub async fn list_events(
    State(state): State<AppState>,
    _admin: Admin,
    ApiPath((namespace, cluster)): ApiPath<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let (items, revision) = guests(&state)?.list_events(&namespace, &cluster).await?;
    core_v1_list(&items, "Event", revision)
}

pub async fn get_service(
    State(state): State<AppState>,
    _admin: Admin,
    ApiPath((namespace, cluster, svc_namespace, name)): ApiPath<(String, String, String, String)>,
) -> Result<Json<Value>, ApiError> {
    let svc = guests(&state)?
        .get_service(&namespace, &cluster, &svc_namespace, &name)
        .await?;
    Ok(Json(service(&svc)?))
}

pub async fn put_service(
    State(state): State<AppState>,
    _admin: Admin,
    ApiPath((namespace, cluster, svc_namespace, name)): ApiPath<(String, String, String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(body, super::limits::OBJECT_BODY)?;
    let put = guests(&state)?
        .put_service(&namespace, &cluster, &svc_namespace, &name, &body)
        .await?;
    let status = if put.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(service(&put.service)?)).into_response())
}

pub async fn delete_service(
    State(state): State<AppState>,
    _admin: Admin,
    ApiPath((namespace, cluster, svc_namespace, name)): ApiPath<(String, String, String, String)>,
) -> Result<Response, ApiError> {
    let deleted = guests(&state)?
        .delete_service(&namespace, &cluster, &svc_namespace, &name)
        .await?;
    // Gone at once (200), or marked for deletion until its load balancer is released (202).
    let status = if deleted.gone {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(service(&deleted.service)?)).into_response())
}

pub async fn delete_cluster(
    State(state): State<AppState>,
    _admin: Admin,
    ApiPath((namespace, cluster)): ApiPath<(String, String)>,
) -> Result<Json<ClusterDeletion>, ApiError> {
    Ok(Json(
        guests(&state)?.delete_cluster(&namespace, &cluster).await?,
    ))
}
