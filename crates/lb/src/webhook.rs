//! Admission webhooks for the Kubernetes backend: `AdmissionReview` (admission.k8s.io/v1) in and out,
//! running the same [`Admission`] checks as the HTTP API.
//!
//! - [`validate`]: the ValidatingAdmissionWebhook (IPPool create/update/delete, LoadBalancer
//!   create/update), with upstream's messages.
//! - [`mutate`]: the MutatingAdmissionWebhook (IPPool labels, LoadBalancer annotations, health-check
//!   defaults and the reconciler's finalizer), answering with a JSON Patch.
//!
//! Requests for other kinds or operations are allowed unchanged, so a broad webhook rule cannot block
//! unrelated writes.

use kube::core::{
    DynamicObject,
    admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation},
};
use serde::de::DeserializeOwned;
use tracing::{debug, warn};

use super::admission::{Admission, AdmitError};
use crate::crd::{GROUP, IPPool, LoadBalancer};

/// Why a review was refused or could not be decided.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReviewError {
    #[error("the admission request has no {field}")]
    Missing { field: &'static str },
    #[error("cannot decode the {kind} of the admission request: {source}")]
    Decode {
        kind: &'static str,
        source: serde_json::Error,
    },
    #[error(transparent)]
    Admission(#[from] AdmitError),
    #[error("cannot compute the patch: {source}")]
    Patch { source: serde_json::Error },
}

fn object<T: DeserializeOwned>(
    kind: &'static str,
    field: &'static str,
    object: &Option<DynamicObject>,
) -> Result<T, ReviewError> {
    let object = object.as_ref().ok_or(ReviewError::Missing { field })?;
    let value =
        serde_json::to_value(object).map_err(|source| ReviewError::Decode { kind, source })?;
    serde_json::from_value(value).map_err(|source| ReviewError::Decode { kind, source })
}

fn ours(req: &AdmissionRequest<DynamicObject>) -> Option<&str> {
    (req.kind.group == GROUP).then_some(req.kind.kind.as_str())
}

async fn check(
    admission: &Admission,
    req: &AdmissionRequest<DynamicObject>,
) -> Result<(), ReviewError> {
    let Some(kind) = ours(req) else {
        return Ok(());
    };
    match (kind, &req.operation) {
        ("LoadBalancer", Operation::Create) => {
            let lb: LoadBalancer = object("loadbalancer", "object", &req.object)?;
            admission.validate_lb_create(&lb).await?;
        }
        ("LoadBalancer", Operation::Update) => {
            let old: LoadBalancer = object("loadbalancer", "oldObject", &req.old_object)?;
            let new: LoadBalancer = object("loadbalancer", "object", &req.object)?;
            admission.validate_lb_update(&old, &new)?;
        }
        ("IPPool", Operation::Create) => {
            let mut pool: IPPool = object("ippool", "object", &req.object)?;
            admission.admit_pool_create(&mut pool).await?;
        }
        ("IPPool", Operation::Update) => {
            let old: IPPool = object("ippool", "oldObject", &req.old_object)?;
            let mut new: IPPool = object("ippool", "object", &req.object)?;
            admission.admit_pool_update(&old, &mut new).await?;
        }
        ("IPPool", Operation::Delete) => {
            let old: IPPool = object("ippool", "oldObject", &req.old_object)?;
            admission.admit_pool_delete(&old)?;
        }
        _ => {}
    }
    Ok(())
}

/// Kubernetes' status code for a refusal, and for a failure to decide.
fn deny(resp: AdmissionResponse, e: &ReviewError) -> AdmissionResponse {
    let refused = match e {
        ReviewError::Admission(a) => a.is_rejection(),
        ReviewError::Missing { .. } | ReviewError::Decode { .. } => true,
        ReviewError::Patch { .. } => false,
    };
    if !refused {
        warn!(error = %e, "admission could not be decided");
    }
    let mut resp = resp.deny(e);
    resp.result.code = if refused { 400 } else { 500 };
    resp.result.reason = if refused {
        "BadRequest"
    } else {
        "InternalError"
    }
    .into();
    resp
}

/// Answers a ValidatingAdmissionWebhook review.
pub async fn validate(
    admission: &Admission,
    review: AdmissionReview<DynamicObject>,
) -> AdmissionReview<DynamicObject> {
    let req: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(req) => req,
        Err(e) => return AdmissionResponse::invalid(e).into_review(),
    };
    let resp = AdmissionResponse::from(&req);
    match check(admission, &req).await {
        Ok(()) => resp.into_review(),
        Err(e) => {
            debug!(kind = %req.kind.kind, name = %req.name, error = %e, "admission refused");
            deny(resp, &e).into_review()
        }
    }
}

async fn patch(
    admission: &Admission,
    req: &AdmissionRequest<DynamicObject>,
) -> Result<Option<json_patch::Patch>, ReviewError> {
    let Some(kind) = ours(req) else {
        return Ok(None);
    };
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return Ok(None);
    }
    let before = req
        .object
        .as_ref()
        .ok_or(ReviewError::Missing { field: "object" })
        .and_then(|o| serde_json::to_value(o).map_err(|source| ReviewError::Patch { source }))?;
    let after = match kind {
        "LoadBalancer" => {
            let mut lb: LoadBalancer = object("loadbalancer", "object", &req.object)?;
            admission.mutate_lb(&mut lb).await?;
            serde_json::to_value(&lb)
        }
        "IPPool" => {
            let mut pool: IPPool = object("ippool", "object", &req.object)?;
            admission
                .mutate_pool(&mut pool, matches!(req.operation, Operation::Create))
                .await?;
            serde_json::to_value(&pool)
        }
        _ => return Ok(None),
    }
    .map_err(|source| ReviewError::Patch { source })?;
    // Only what the mutation changed: the typed round trip may also drop unknown fields or nulls,
    // which must not be patched away.
    let changed = |p: &str| before.pointer(p) != after.pointer(p);
    let ops: Vec<json_patch::PatchOperation> = [
        "/metadata/labels",
        "/metadata/annotations",
        "/metadata/finalizers",
        "/spec/healthCheck",
    ]
    .into_iter()
    .filter(|p| changed(p))
    .filter_map(|p| {
        let value = after.pointer(p)?.clone();
        Some(json_patch::PatchOperation::Add(json_patch::AddOperation {
            path: json_patch::jsonptr::PointerBuf::parse(p).ok()?,
            value,
        }))
    })
    .collect();
    Ok((!ops.is_empty()).then_some(json_patch::Patch(ops)))
}

/// Answers a MutatingAdmissionWebhook review.
pub async fn mutate(
    admission: &Admission,
    review: AdmissionReview<DynamicObject>,
) -> AdmissionReview<DynamicObject> {
    let req: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(req) => req,
        Err(e) => return AdmissionResponse::invalid(e).into_review(),
    };
    let resp = AdmissionResponse::from(&req);
    match patch(admission, &req).await {
        Ok(None) => resp.into_review(),
        Ok(Some(p)) => match resp.clone().with_patch(p) {
            Ok(resp) => resp.into_review(),
            Err(e) => {
                warn!(error = %e, "cannot serialise the patch");
                resp.into_review()
            }
        },
        Err(e) => deny(resp, &e).into_review(),
    }
}
