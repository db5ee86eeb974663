//! `GET /openapi.json`: the HTTP contract, `openapi/openapi.yaml`, as JSON. The YAML is compiled
//! into the binary and converted once, on first request, so the served document cannot drift from
//! the file the contract tests check.

use std::sync::LazyLock;

use axum::{
    body::Bytes,
    http::{HeaderValue, header},
    response::{IntoResponse, Response},
};

pub const OPENAPI_PATH: &str = "/openapi.json";

const SPEC_YAML: &str = include_str!("../../openapi/openapi.yaml");

/// The spec as JSON, or why the YAML does not convert (a unit test keeps that from shipping).
fn convert() -> Result<Bytes, String> {
    let value: serde_json::Value =
        yaml_serde::from_str(SPEC_YAML).map_err(|e| format!("openapi.yaml is not YAML: {e}"))?;
    serde_json::to_vec(&value)
        .map(Bytes::from)
        .map_err(|e| format!("openapi.yaml does not convert to JSON: {e}"))
}

static SPEC_JSON: LazyLock<Result<Bytes, String>> = LazyLock::new(convert);

pub async fn openapi_json() -> Result<Response, super::ApiError> {
    let body = SPEC_JSON
        .as_ref()
        .map_err(|reason| super::ApiError::Unavailable {
            what: "the OpenAPI document",
            reason: reason.clone(),
        })?;
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.clone(),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compiled_in_spec_converts() {
        let json: serde_json::Value = serde_json::from_slice(&convert().unwrap()).unwrap();
        assert_eq!(json["openapi"], "3.0.3");
        assert!(json["paths"][OPENAPI_PATH]["get"].is_object());
    }
}
