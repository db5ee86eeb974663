//! Canonical `Status` failure bodies, shaped exactly like the real API server's
//! (`k8s.io/apimachinery/pkg/api/errors`): kind Status, apiVersion v1, status Failure, message,
//! reason, details {name, group, kind, causes}, code.

use std::borrow::Cow;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

/// A resource name qualified with its group, as the real server prints it (`leases.coordination.k8s.io`).
pub fn qualified(resource: &str, group: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

/// One field-level validation failure (a `StatusCause`).
#[derive(Debug, Clone)]
pub struct FieldError {
    /// `FieldValueRequired`, `FieldValueInvalid`, `FieldValueForbidden`, ...
    pub reason: &'static str,
    /// The path of the field, e.g. `metadata.name`.
    pub field: String,
    /// The message after the field path, e.g. `Required value`.
    pub message: String,
}

impl FieldError {
    /// `field: Required value[: detail]`.
    pub fn required(field: impl Into<String>, detail: &str) -> Self {
        let message = if detail.is_empty() {
            "Required value".to_string()
        } else {
            format!("Required value: {detail}")
        };
        Self {
            reason: "FieldValueRequired",
            field: field.into(),
            message,
        }
    }

    /// `field: Invalid value: <json value>: detail`.
    pub fn invalid(field: impl Into<String>, value: &Value, detail: &str) -> Self {
        Self {
            reason: "FieldValueInvalid",
            field: field.into(),
            message: format!("Invalid value: {value}: {detail}"),
        }
    }

    /// `field: Forbidden: detail`.
    pub fn forbidden(field: impl Into<String>, detail: &str) -> Self {
        Self {
            reason: "FieldValueForbidden",
            field: field.into(),
            message: format!("Forbidden: {detail}"),
        }
    }

    /// `field: Unsupported value: <json value>: supported values: "a", "b"`.
    pub fn not_supported(field: impl Into<String>, value: &Value, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
        Self {
            reason: "FieldValueNotSupported",
            field: field.into(),
            message: format!(
                "Unsupported value: {value}: supported values: {}",
                list.join(", ")
            ),
        }
    }
}

/// A failed API request, rendered as a canonical `Status` body.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason} ({code}): {message}")]
pub struct ApiError {
    /// HTTP status code, repeated in the body.
    pub code: u16,
    /// Machine-readable reason (`NotFound`, `Conflict`, ...); empty is omitted from the body, as a
    /// webhook's denial without a reason is.
    pub reason: Cow<'static, str>,
    /// Human-readable message, byte-compatible with the real server where it matters.
    pub message: String,
    /// `details`, or `None` when the real server omits it.
    pub details: Option<Map<String, Value>>,
}

fn details(name: &str, group: &str, kind: &str) -> Map<String, Value> {
    let mut d = Map::new();
    if !name.is_empty() {
        d.insert("name".into(), json!(name));
    }
    if !group.is_empty() {
        d.insert("group".into(), json!(group));
    }
    if !kind.is_empty() {
        d.insert("kind".into(), json!(kind));
    }
    d
}

impl ApiError {
    /// `secrets "x" not found`.
    pub fn not_found(resource: &str, group: &str, name: &str) -> Self {
        Self {
            code: 404,
            reason: Cow::Borrowed("NotFound"),
            message: format!("{} \"{name}\" not found", qualified(resource, group)),
            details: Some(details(name, group, resource)),
        }
    }

    /// The mux 404 for an unknown path or resource.
    pub fn path_not_found() -> Self {
        Self {
            code: 404,
            reason: Cow::Borrowed("NotFound"),
            message: "the server could not find the requested resource".into(),
            details: Some(Map::new()),
        }
    }

    /// `secrets "x" already exists`.
    pub fn already_exists(resource: &str, group: &str, name: &str) -> Self {
        Self {
            code: 409,
            reason: Cow::Borrowed("AlreadyExists"),
            message: format!("{} \"{name}\" already exists", qualified(resource, group)),
            details: Some(details(name, group, resource)),
        }
    }

    /// The optimistic-concurrency failure of a write with a stale resourceVersion.
    pub fn conflict_modified(resource: &str, group: &str, name: &str) -> Self {
        Self::conflict(
            resource,
            group,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// `Operation cannot be fulfilled on secrets "x": <why>`.
    pub fn conflict(resource: &str, group: &str, name: &str, why: &str) -> Self {
        Self {
            code: 409,
            reason: Cow::Borrowed("Conflict"),
            message: format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(resource, group)
            ),
            details: Some(details(name, group, resource)),
        }
    }

    /// `Secret "x" is invalid: field: message` (422), with one cause per field error.
    pub fn invalid(kind: &str, group: &str, name: &str, errors: &[FieldError]) -> Self {
        let rendered: Vec<String> = errors
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect();
        let summary = if rendered.len() == 1 {
            rendered[0].clone()
        } else {
            format!("[{}]", rendered.join(", "))
        };
        let mut d = details(name, group, kind);
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({"reason": e.reason, "message": e.message, "field": e.field}))
            .collect();
        d.insert("causes".into(), Value::Array(causes));
        Self {
            code: 422,
            reason: Cow::Borrowed("Invalid"),
            message: format!(
                "{} \"{name}\" is invalid: {summary}",
                qualified(kind, group)
            ),
            details: Some(d),
        }
    }

    /// `secrets "x" is forbidden: <why>`, or `secrets is forbidden: ...` without a name.
    pub fn forbidden(resource: &str, group: &str, name: &str, why: &str) -> Self {
        let subject = qualified(resource, group);
        let message = match (subject.is_empty(), name.is_empty()) {
            (true, _) => format!("forbidden: {why}"),
            (false, true) => format!("{subject} is forbidden: {why}"),
            (false, false) => format!("{subject} \"{name}\" is forbidden: {why}"),
        };
        Self {
            code: 403,
            reason: Cow::Borrowed("Forbidden"),
            message,
            details: Some(details(name, group, resource)),
        }
    }

    /// The authentication failure.
    pub fn unauthorized() -> Self {
        Self {
            code: 401,
            reason: Cow::Borrowed("Unauthorized"),
            message: "Unauthorized".into(),
            details: None,
        }
    }

    /// `<verb> is not supported on resources of kind "<resource>"`.
    pub fn method_not_supported(resource: &str, group: &str, verb: &str) -> Self {
        Self {
            code: 405,
            reason: Cow::Borrowed("MethodNotAllowed"),
            message: format!(
                "{verb} is not supported on resources of kind \"{}\"",
                qualified(resource, group)
            ),
            details: Some(details("", group, resource)),
        }
    }

    /// The watch/list failure for a resourceVersion older than the retained history.
    pub fn expired(requested: u64, oldest: u64) -> Self {
        Self {
            code: 410,
            reason: Cow::Borrowed("Expired"),
            message: format!("too old resource version: {requested} ({oldest})"),
            details: None,
        }
    }

    /// 410 Gone with a custom message.
    pub fn gone(message: impl Into<String>) -> Self {
        Self {
            code: 410,
            reason: Cow::Borrowed("Gone"),
            message: message.into(),
            details: None,
        }
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            code: 400,
            reason: Cow::Borrowed("BadRequest"),
            message: message.into(),
            details: None,
        }
    }

    /// 415 for a request body in a format this server does not decode.
    pub fn unsupported_media_type(content_type: &str, accepted: &[&str]) -> Self {
        Self {
            code: 415,
            reason: Cow::Borrowed("UnsupportedMediaType"),
            message: format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
            details: Some(details("", "", "")).map(|mut d| {
                d.insert(
                    "causes".into(),
                    json!([{"reason": "UnexpectedServerResponse", "message": content_type}]),
                );
                d
            }),
        }
    }

    /// 406 when the client accepts none of the media types we serve.
    pub fn not_acceptable() -> Self {
        Self {
            code: 406,
            reason: Cow::Borrowed("NotAcceptable"),
            message:
                "only the following media types are accepted: application/json, application/yaml"
                    .into(),
            details: None,
        }
    }

    /// 500 with a message (the fake has no internals worth hiding, but keeps it short).
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            code: 500,
            reason: Cow::Borrowed("InternalError"),
            message: message.into(),
            details: None,
        }
    }

    /// The real server's `NewInternalError(err)`: `Internal error occurred: <err>`, with the error as
    /// the one cause (what a webhook that could not be called turns into under `failurePolicy: Fail`).
    pub fn internal_error(err: impl Into<String>) -> Self {
        let err = err.into();
        let mut d = Map::new();
        d.insert("causes".into(), json!([{"message": err}]));
        Self {
            code: 500,
            reason: Cow::Borrowed("InternalError"),
            message: format!("Internal error occurred: {err}"),
            details: Some(d),
        }
    }

    /// A webhook's refusal, as `ToStatusErr` of the v1.32 webhook plugin builds it from the
    /// response's `status`: the webhook's own code (400 when below 400), reason and details are kept,
    /// and the message says which webhook denied the request.
    pub fn webhook_denied(webhook: &str, result: Option<&Value>) -> Self {
        let field = |f: &str| {
            result
                .and_then(|r| r.get(f))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let (message, reason) = (field("message"), field("reason"));
        let denied_by = format!("admission webhook {webhook:?} denied the request");
        let message = if !message.is_empty() {
            format!("{denied_by}: {message}")
        } else if !reason.is_empty() {
            format!("{denied_by}: {reason}")
        } else {
            format!("{denied_by} without explanation")
        };
        let code = result
            .and_then(|r| r.get("code"))
            .and_then(Value::as_i64)
            .filter(|c| (400..=999).contains(c))
            .unwrap_or(400);
        Self {
            code: u16::try_from(code).unwrap_or(400),
            reason: Cow::Owned(reason),
            message,
            details: result
                .and_then(|r| r.get("details"))
                .and_then(Value::as_object)
                .cloned(),
        }
    }

    /// The `Status` JSON body.
    pub fn body(&self) -> Value {
        let mut status = Map::new();
        status.insert("kind".into(), json!("Status"));
        status.insert("apiVersion".into(), json!("v1"));
        status.insert("metadata".into(), json!({}));
        status.insert("status".into(), json!("Failure"));
        status.insert("message".into(), json!(self.message));
        if !self.reason.is_empty() {
            status.insert("reason".into(), json!(self.reason));
        }
        if let Some(d) = &self.details {
            status.insert("details".into(), Value::Object(d.clone()));
        }
        status.insert("code".into(), json!(self.code));
        Value::Object(status)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = self.body().to_string();
        (
            code,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    }
}

/// The `Status` Success body the real server returns for an immediate delete of a built-in object.
pub fn success_deleted(resource: &str, group: &str, name: &str, uid: &str) -> Value {
    let mut d = details(name, group, resource);
    if !uid.is_empty() {
        d.insert("uid".into(), json!(uid));
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": d})
}
