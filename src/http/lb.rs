//! The admission webhooks of IPPools and LoadBalancers, which the Kubernetes API server calls
//! (the REST routes of those kinds are [`super::rest::kinds`]'s).

use axum::{
    Json,
    body::Bytes,
    extract::{State, rejection::BytesRejection},
};
use kube::core::{DynamicObject, admission::AdmissionReview};
use serde_json::Value;

use super::{ApiError, AppState, body_bytes};
use crate::lb::webhook;

pub const VALIDATION_PATH: &str = "/v1/webhook/validation";
pub const MUTATION_PATH: &str = "/v1/webhook/mutation";

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
        Ok(review) => webhook::validate(state.admitted.admission(), review).await,
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
        Ok(review) => webhook::mutate(state.admitted.admission(), review).await,
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
