//! Request bodies of the REST layer: read whole up to [`limits::OBJECT_BODY`], then as the API
//! server reads an object of a kind before its schema (a JSON object, of the kind if it says which),
//! and its key checked against the URL's.

use axum::{body::Bytes, extract::rejection::BytesRejection};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::RestError;
use crate::{
    http::{ApiError, body_bytes, limits},
    store::Kind,
};

/// The body of a write, whole.
pub fn read(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body_bytes(body, limits::OBJECT_BODY)
}

/// The fields of a body that is a JSON object of `kind` (its `apiVersion` and `kind`, when it
/// says, are the kind's). `name` is the kind as messages name it.
pub fn object(
    body: &[u8],
    kind: &Kind,
    name: &'static str,
) -> Result<Map<String, Value>, RestError> {
    let invalid = |reason: String| RestError::Decode { kind: name, reason };
    let value: Value = serde_json::from_slice(body).map_err(|e| invalid(e.to_string()))?;
    let Value::Object(fields) = value else {
        return Err(invalid("the body must be a JSON object".into()));
    };
    for (field, want) in [
        ("apiVersion", kind.api_version.as_ref()),
        ("kind", kind.kind.as_ref()),
    ] {
        match fields.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == want => {}
            Some(other) => return Err(invalid(format!("{field} must be {want:?}, not {other}"))),
        }
    }
    Ok(fields)
}

/// The object the fields make.
pub fn typed<T: DeserializeOwned>(
    fields: Map<String, Value>,
    name: &'static str,
) -> Result<T, RestError> {
    serde_json::from_value(Value::Object(fields)).map_err(|e| RestError::Decode {
        kind: name,
        reason: e.to_string(),
    })
}

/// A body's namespace (when the kind has one) and name, as the URL says: filled in when missing,
/// refused when they differ. `noun` names the body in the refusal.
pub fn key_from_url(
    meta: &mut ObjectMeta,
    namespace: Option<&str>,
    name: &str,
    noun: &'static str,
) -> Result<(), RestError> {
    let namespace = namespace.map(|url| ("namespace", &mut meta.namespace, url));
    for (field, slot, url) in namespace
        .into_iter()
        .chain([("name", &mut meta.name, name)])
    {
        match slot.as_deref() {
            None | Some("") => *slot = Some(url.into()),
            Some(v) if v != url => {
                return Err(RestError::Mismatch {
                    noun,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::kinds::vmi_kind;

    #[test]
    fn bodies_are_objects_of_their_kind() {
        let kind = vmi_kind();
        let fields = object(
            br#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance","metadata":{}}"#,
            &kind,
            "virtualmachineinstance",
        )
        .expect("an object of the kind");
        assert!(fields.contains_key("metadata"));
        assert!(object(br#"{"kind":null,"metadata":{}}"#, &kind, "vmi").is_ok());
        for (bad, message) in [
            (
                &br#"[]"#[..],
                "fail to decode vmi: the body must be a JSON object",
            ),
            (
                br#"{"kind":"Pod","metadata":{"name":"x"},"spec":{"domain":{"devices":{}}}}"#,
                "fail to decode vmi: kind must be \"VirtualMachineInstance\", not \"Pod\"",
            ),
            (
                br#"{"apiVersion":"v1"}"#,
                "fail to decode vmi: apiVersion must be \"kubevirt.io/v1\", not \"v1\"",
            ),
        ] {
            assert_eq!(
                object(bad, &kind, "vmi").expect_err("refused").to_string(),
                message
            );
        }
        assert!(matches!(
            object(b"{", &kind, "vmi"),
            Err(RestError::Decode { .. })
        ));
    }

    #[test]
    fn keys_come_from_the_url() {
        let mut meta = ObjectMeta::default();
        key_from_url(&mut meta, Some("ns"), "n", "object").expect("filled in");
        assert_eq!(meta.namespace.as_deref(), Some("ns"));
        assert_eq!(meta.name.as_deref(), Some("n"));
        key_from_url(&mut meta, Some("ns"), "n", "object").expect("the same");
        let mut cluster_scoped = ObjectMeta {
            namespace: Some("kept".into()),
            ..ObjectMeta::default()
        };
        key_from_url(&mut cluster_scoped, None, "n", "object").expect("no namespace compared");
        assert_eq!(cluster_scoped.namespace.as_deref(), Some("kept"));
        let refused = key_from_url(&mut meta, Some("other"), "m", "service")
            .expect_err("the namespace differs first");
        assert_eq!(
            refused.to_string(),
            "the namespace of the service (ns) does not match the namespace on the URL (other)"
        );
    }
}
