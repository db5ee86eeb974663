//! The IPPool and LoadBalancer API in the shape of Rancher's steve API, which the Harvester UI
//! speaks (`/v1/harvester/<group>.<plural>`): objects are the Kubernetes objects plus `id`
//! (`name` or `namespace/name`) and `type`; a collection is
//! `{"type":"collection","resourceType":…,"revision":…,"data":[…]}`. Plus the admission webhook
//! endpoints that the Kubernetes API server calls.

use axum::{
    Json,
    body::Bytes,
    extract::{State, rejection::BytesRejection},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use kube::core::{DynamicObject, admission::AdmissionReview};
use serde::Serialize;
use serde_json::{Map, Value};

use super::{Admin, ApiError, AppState, Caller, body_bytes, path::ApiPath};
use crate::{
    auth,
    lb::{owners, webhook},
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
pub const VALIDATION_PATH: &str = "/v1/webhook/validation";
pub const MUTATION_PATH: &str = "/v1/webhook/mutation";

/// steve's type names.
const POOL_TYPE: &str = "loadbalancer.harvesterhci.io.ippool";
const LB_TYPE: &str = "loadbalancer.harvesterhci.io.loadbalancer";

/// An object as steve returns it: `id` and `type` first, then the Kubernetes object.
pub(super) fn resource<T: Serialize>(type_: &'static str, object: &T) -> Result<Value, ApiError> {
    let value = serde_json::to_value(object).map_err(|e| ApiError::Encode {
        what: type_,
        reason: e.to_string(),
    })?;
    Ok(resource_value(type_, value))
}

pub(super) fn resource_value(type_: &'static str, value: Value) -> Value {
    let (namespace, name) = crate::store::object_key(&value);
    let id = if namespace.is_empty() {
        name
    } else {
        format!("{namespace}/{name}")
    };
    let mut out = Map::new();
    out.insert("id".into(), Value::from(id));
    out.insert("type".into(), Value::from(type_));
    if let Value::Object(fields) = value {
        out.extend(fields);
    }
    Value::Object(out)
}

pub(super) fn collection<T: Serialize>(
    type_: &'static str,
    items: &[T],
    revision: String,
) -> Result<Json<Value>, ApiError> {
    let data = items
        .iter()
        .map(|i| resource(type_, i))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(serde_json::json!({
        "type": "collection",
        "resourceType": type_,
        "revision": revision,
        "data": data,
    })))
}

pub(super) fn created(value: Value) -> Response {
    (StatusCode::CREATED, Json(value)).into_response()
}

pub async fn list_pools(
    State(state): State<AppState>,
    _admin: Admin,
) -> Result<Json<Value>, ApiError> {
    let (pools, revision) = state.objects.list_pools().await?;
    collection(POOL_TYPE, &pools, revision)
}

pub async fn create_pool(
    State(state): State<AppState>,
    _admin: Admin,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(body, super::limits::OBJECT_BODY)?;
    let pool = state.objects.create_pool(&body).await?;
    Ok(created(resource(POOL_TYPE, &pool)?))
}

pub async fn get_pool(
    State(state): State<AppState>,
    _admin: Admin,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    let pool = state.objects.get_pool(&name).await?;
    Ok(Json(resource(POOL_TYPE, &pool)?))
}

/// Who holds each of the pool's addresses ([`owners`]): the pool, then one list of every
/// LoadBalancer to join it with.
pub async fn pool_addresses(
    State(state): State<AppState>,
    admin: Admin,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<owners::PoolAddresses>, ApiError> {
    // `Admin` checked `get` on the pool; the answer also tells the labels of LoadBalancers in every
    // namespace, so a Kubernetes user must be allowed to list those too.
    let list_lbs = auth::Action::Object {
        verb: "list",
        resource: "loadbalancers",
        namespace: None,
    };
    Caller(admin.0).authorize(&state, list_lbs).await?;
    let pool = state.objects.get_pool(&name).await?;
    let (lbs, _) = state.objects.list_lbs(None).await?;
    Ok(Json(owners::addresses(&pool, &lbs)))
}

pub async fn update_pool(
    State(state): State<AppState>,
    _admin: Admin,
    ApiPath(name): ApiPath<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body_bytes(body, super::limits::OBJECT_BODY)?;
    let pool = state.objects.update_pool(&name, &body).await?;
    Ok(Json(resource(POOL_TYPE, &pool)?))
}

pub async fn delete_pool(
    State(state): State<AppState>,
    _admin: Admin,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    let deleted = state.objects.delete_pool(&name).await?;
    Ok(Json(resource_value(POOL_TYPE, deleted)))
}

pub async fn list_lbs(
    State(state): State<AppState>,
    _admin: Admin,
) -> Result<Json<Value>, ApiError> {
    let (lbs, revision) = state.objects.list_lbs(None).await?;
    collection(LB_TYPE, &lbs, revision)
}

pub async fn list_lbs_in(
    State(state): State<AppState>,
    _admin: Admin,
    ApiPath(namespace): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    // No namespace of an invalid name exists, so there is no such collection either.
    if crate::validation::dns1123_label(&namespace).is_err() {
        return Err(ApiError::NotFound {
            path: format!("{LBS_PATH}/{namespace}"),
        });
    }
    let (lbs, revision) = state.objects.list_lbs(Some(&namespace)).await?;
    collection(LB_TYPE, &lbs, revision)
}

pub async fn create_lb(
    State(state): State<AppState>,
    _admin: Admin,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(body, super::limits::OBJECT_BODY)?;
    let lb = state.objects.create_lb(&body).await?;
    Ok(created(resource(LB_TYPE, &lb)?))
}

pub async fn get_lb(
    State(state): State<AppState>,
    _admin: Admin,
    ApiPath((namespace, name)): ApiPath<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let lb = state.objects.get_lb(&namespace, &name).await?;
    Ok(Json(resource(LB_TYPE, &lb)?))
}

pub async fn update_lb(
    State(state): State<AppState>,
    _admin: Admin,
    ApiPath((namespace, name)): ApiPath<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body_bytes(body, super::limits::OBJECT_BODY)?;
    let lb = state.objects.update_lb(&namespace, &name, &body).await?;
    Ok(Json(resource(LB_TYPE, &lb)?))
}

pub async fn delete_lb(
    State(state): State<AppState>,
    _admin: Admin,
    ApiPath((namespace, name)): ApiPath<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let deleted = state.objects.delete_lb(&namespace, &name).await?;
    Ok(Json(resource_value(LB_TYPE, deleted)))
}

/// What the reconciler reported about one LoadBalancer, oldest first (a core/v1 EventList).
pub async fn list_lb_events(
    State(state): State<AppState>,
    _admin: Admin,
    ApiPath((namespace, name)): ApiPath<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let (events, revision) = state.objects.lb_events(&namespace, &name).await?;
    super::guest::core_v1_list(&events, "Event", revision)
}

/// An AdmissionReview: a body that is not one (not JSON, another kind or version, a `request` that
/// is not an object) is a 422; a review whose request cannot be read is answered with a refusal, as
/// the API server expects an answer to every review.
fn review(
    body: Result<Bytes, BytesRejection>,
) -> Result<Result<AdmissionReview<DynamicObject>, AdmissionReview<DynamicObject>>, ApiError> {
    let body = body_bytes(body, super::limits::REVIEW_BODY)?;
    let bad = |reason: String| ApiError::BadReview { reason };
    let value: Value = serde_json::from_slice(&body).map_err(|e| bad(e.to_string()))?;
    let fields = value
        .as_object()
        .ok_or_else(|| bad("the body must be a JSON object".into()))?;
    for (field, want) in [
        ("apiVersion", "admission.k8s.io/v1"),
        ("kind", "AdmissionReview"),
    ] {
        if fields.get(field).and_then(Value::as_str) != Some(want) {
            return Err(bad(format!("{field} must be {want:?}")));
        }
    }
    if fields.get("request").is_some_and(|r| !r.is_object()) {
        return Err(bad("request must be an object".into()));
    }
    Ok(serde_json::from_value(value).map_err(|e| {
        kube::core::admission::AdmissionResponse::invalid(format!(
            "cannot read the admission request: {e}"
        ))
        .into_review()
    }))
}

/// The ValidatingAdmissionWebhook. The API server authenticates itself by TLS only, so there is no
/// bearer token; the endpoint only answers questions and changes nothing.
/// Refuses an admission review from a caller the webhooks do not answer ([`super::WebhookAccess`]).
fn webhook_allowed(
    state: &AppState,
    verified: Option<&super::VerifiedClient>,
) -> Result<(), ApiError> {
    match state.webhooks {
        super::WebhookAccess::Open => Ok(()),
        super::WebhookAccess::ClientCertificate if verified.is_some() => Ok(()),
        super::WebhookAccess::ClientCertificate => Err(ApiError::WebhookClient),
        super::WebhookAccess::Off => Err(ApiError::NoWebhooks),
    }
}

pub async fn validation(
    State(state): State<AppState>,
    verified: Option<axum::Extension<super::VerifiedClient>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<AdmissionReview<DynamicObject>>, ApiError> {
    webhook_allowed(&state, verified.as_deref())?;
    Ok(Json(match review(body)? {
        Ok(review) => webhook::validate(state.objects.admission(), review).await,
        Err(refusal) => refusal,
    }))
}

/// The MutatingAdmissionWebhook (labels, annotations and defaults, as a JSON Patch).
pub async fn mutation(
    State(state): State<AppState>,
    verified: Option<axum::Extension<super::VerifiedClient>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    webhook_allowed(&state, verified.as_deref())?;
    let answer = match review(body)? {
        Ok(review) => webhook::mutate(state.objects.admission(), review).await,
        Err(refusal) => refusal,
    };
    let mut value = serde_json::to_value(&answer).map_err(|e| ApiError::Encode {
        what: "admission review",
        reason: e.to_string(),
    })?;
    // kube-core serialises the patch bytes as a JSON array; Kubernetes documents (and Go writes)
    // `[]byte` as base64, so send that.
    if let Some(patch) = value.pointer_mut("/response/patch")
        && let Some(bytes) = patch.as_array().map(|a| {
            a.iter()
                .filter_map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
                .collect::<Vec<u8>>()
        })
    {
        use base64::Engine;
        *patch = Value::from(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    Ok(Json(value))
}
