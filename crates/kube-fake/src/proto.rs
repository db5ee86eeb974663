//! Decoding of Kubernetes protobuf request bodies for the few kinds that kubectl's typed commands
//! send as protobuf (`create token`, `auth can-i`, `auth whoami`, `create serviceaccount|namespace|
//! configmap|secret|role|rolebinding|clusterrole|clusterrolebinding`). Every other protobuf body is
//! answered 415 by the caller. Responses are always JSON, which clients accept.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};

use crate::clock;

/// The four-byte prefix of Kubernetes protobuf bodies.
pub const MAGIC: &[u8] = b"k8s\x00";

/// Why a protobuf body could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// The bytes are not a well-formed protobuf envelope.
    #[error("malformed protobuf body: {0}")]
    Malformed(&'static str),
    /// The kind is not one this fake decodes.
    #[error("protobuf bodies of kind {0:?} are not supported")]
    Unsupported(String),
}

enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn varint(buf: &[u8], pos: &mut usize) -> Result<u64, ProtoError> {
    let mut out = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf
            .get(*pos)
            .ok_or(ProtoError::Malformed("truncated varint"))?;
        *pos += 1;
        out |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(out);
        }
    }
    Err(ProtoError::Malformed("varint too long"))
}

fn fields(buf: &[u8]) -> Result<Vec<(u64, Wire<'_>)>, ProtoError> {
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < buf.len() {
        let tag = varint(buf, &mut pos)?;
        let (no, wt) = (tag >> 3, tag & 7);
        match wt {
            0 => out.push((no, Wire::Varint(varint(buf, &mut pos)?))),
            2 => {
                let len = usize::try_from(varint(buf, &mut pos)?)
                    .map_err(|_| ProtoError::Malformed("length"))?;
                let end = pos
                    .checked_add(len)
                    .filter(|e| *e <= buf.len())
                    .ok_or(ProtoError::Malformed("truncated field"))?;
                out.push((no, Wire::Bytes(&buf[pos..end])));
                pos = end;
            }
            1 => pos += 8,
            5 => pos += 4,
            _ => return Err(ProtoError::Malformed("unsupported wire type")),
        }
    }
    Ok(out)
}

#[derive(Clone, Copy)]
enum Ty {
    Str,
    Int,
    Bool,
    Bytes,
    Time,
    StrMap,
    BytesMap,
    Msg(&'static [F]),
}

#[derive(Clone, Copy)]
struct F(u64, &'static str, Ty, bool);

const OWNER_REF: &[F] = &[
    F(1, "kind", Ty::Str, false),
    F(3, "name", Ty::Str, false),
    F(4, "uid", Ty::Str, false),
    F(5, "apiVersion", Ty::Str, false),
    F(6, "controller", Ty::Bool, false),
    F(7, "blockOwnerDeletion", Ty::Bool, false),
];
const META: &[F] = &[
    F(1, "name", Ty::Str, false),
    F(2, "generateName", Ty::Str, false),
    F(3, "namespace", Ty::Str, false),
    F(5, "uid", Ty::Str, false),
    F(6, "resourceVersion", Ty::Str, false),
    F(7, "generation", Ty::Int, false),
    F(8, "creationTimestamp", Ty::Time, false),
    F(11, "labels", Ty::StrMap, false),
    F(12, "annotations", Ty::StrMap, false),
    F(13, "ownerReferences", Ty::Msg(OWNER_REF), true),
    F(14, "finalizers", Ty::Str, true),
];
const RESOURCE_ATTRS: &[F] = &[
    F(1, "namespace", Ty::Str, false),
    F(2, "verb", Ty::Str, false),
    F(3, "group", Ty::Str, false),
    F(4, "version", Ty::Str, false),
    F(5, "resource", Ty::Str, false),
    F(6, "subresource", Ty::Str, false),
    F(7, "name", Ty::Str, false),
];
const NON_RESOURCE_ATTRS: &[F] = &[F(1, "path", Ty::Str, false), F(2, "verb", Ty::Str, false)];
const SSAR_SPEC: &[F] = &[
    F(1, "resourceAttributes", Ty::Msg(RESOURCE_ATTRS), false),
    F(
        2,
        "nonResourceAttributes",
        Ty::Msg(NON_RESOURCE_ATTRS),
        false,
    ),
];
const SSRR_SPEC: &[F] = &[F(1, "namespace", Ty::Str, false)];
const BOUND_REF: &[F] = &[
    F(1, "kind", Ty::Str, false),
    F(2, "apiVersion", Ty::Str, false),
    F(3, "name", Ty::Str, false),
    F(4, "uid", Ty::Str, false),
];
const TOKEN_SPEC: &[F] = &[
    F(1, "audiences", Ty::Str, true),
    F(3, "boundObjectRef", Ty::Msg(BOUND_REF), false),
    F(4, "expirationSeconds", Ty::Int, false),
];
const OBJECT_REF: &[F] = &[
    F(1, "kind", Ty::Str, false),
    F(2, "namespace", Ty::Str, false),
    F(3, "name", Ty::Str, false),
    F(4, "uid", Ty::Str, false),
    F(5, "apiVersion", Ty::Str, false),
];
const LOCAL_REF: &[F] = &[F(1, "name", Ty::Str, false)];
const NS_SPEC: &[F] = &[F(1, "finalizers", Ty::Str, true)];
const RULE: &[F] = &[
    F(1, "verbs", Ty::Str, true),
    F(2, "apiGroups", Ty::Str, true),
    F(3, "resources", Ty::Str, true),
    F(4, "resourceNames", Ty::Str, true),
    F(5, "nonResourceURLs", Ty::Str, true),
];
const SUBJECT: &[F] = &[
    F(1, "kind", Ty::Str, false),
    F(2, "apiGroup", Ty::Str, false),
    F(3, "name", Ty::Str, false),
    F(4, "namespace", Ty::Str, false),
];
const ROLE_REF: &[F] = &[
    F(1, "apiGroup", Ty::Str, false),
    F(2, "kind", Ty::Str, false),
    F(3, "name", Ty::Str, false),
];

fn schema_for(kind: &str) -> Option<&'static [F]> {
    const M: F = F(1, "metadata", Ty::Msg(META), false);
    Some(match kind {
        "SelfSubjectAccessReview" => &[M, F(2, "spec", Ty::Msg(SSAR_SPEC), false)],
        "SelfSubjectRulesReview" => &[M, F(2, "spec", Ty::Msg(SSRR_SPEC), false)],
        "SelfSubjectReview" => &[M],
        "TokenRequest" => &[M, F(2, "spec", Ty::Msg(TOKEN_SPEC), false)],
        "ServiceAccount" => &[
            M,
            F(2, "secrets", Ty::Msg(OBJECT_REF), true),
            F(3, "imagePullSecrets", Ty::Msg(LOCAL_REF), true),
            F(4, "automountServiceAccountToken", Ty::Bool, false),
        ],
        "Namespace" => &[M, F(2, "spec", Ty::Msg(NS_SPEC), false)],
        "ConfigMap" => &[
            M,
            F(2, "data", Ty::StrMap, false),
            F(3, "binaryData", Ty::BytesMap, false),
            F(4, "immutable", Ty::Bool, false),
        ],
        "Secret" => &[
            M,
            F(2, "data", Ty::BytesMap, false),
            F(3, "type", Ty::Str, false),
            F(4, "stringData", Ty::StrMap, false),
            F(5, "immutable", Ty::Bool, false),
        ],
        "Role" | "ClusterRole" => &[M, F(2, "rules", Ty::Msg(RULE), true)],
        "RoleBinding" | "ClusterRoleBinding" => &[
            M,
            F(2, "subjects", Ty::Msg(SUBJECT), true),
            F(3, "roleRef", Ty::Msg(ROLE_REF), false),
        ],
        _ => return None,
    })
}

fn utf8(b: &[u8]) -> Result<String, ProtoError> {
    String::from_utf8(b.to_vec()).map_err(|_| ProtoError::Malformed("invalid UTF-8"))
}

fn scalar(ty: Ty, w: &Wire<'_>) -> Result<Value, ProtoError> {
    Ok(match (ty, w) {
        (Ty::Str, Wire::Bytes(b)) => json!(utf8(b)?),
        (Ty::Bytes, Wire::Bytes(b)) => json!(STANDARD.encode(b)),
        (Ty::Int, Wire::Varint(v)) => json!(*v as i64),
        (Ty::Bool, Wire::Varint(v)) => json!(*v != 0),
        (Ty::Time, Wire::Bytes(b)) => {
            let secs = fields(b)?.iter().find_map(|(n, w)| match (n, w) {
                (1, Wire::Varint(v)) => Some(*v as i64),
                _ => None,
            });
            json!(clock::rfc3339(secs.unwrap_or(0)))
        }
        (Ty::Msg(schema), Wire::Bytes(b)) => decode_message(b, schema)?,
        _ => return Err(ProtoError::Malformed("wire type does not match the field")),
    })
}

fn decode_message(buf: &[u8], schema: &[F]) -> Result<Value, ProtoError> {
    let mut out = Map::new();
    for (no, w) in fields(buf)? {
        let Some(F(_, name, ty, repeated)) = schema.iter().find(|f| f.0 == no).copied() else {
            continue;
        };
        match ty {
            Ty::StrMap | Ty::BytesMap => {
                let Wire::Bytes(entry) = w else {
                    return Err(ProtoError::Malformed("map entry"));
                };
                let mut k = String::new();
                let mut v = Value::Null;
                for (n, ew) in fields(entry)? {
                    match (n, ew) {
                        (1, Wire::Bytes(b)) => k = utf8(b)?,
                        (2, ew) => {
                            v = scalar(
                                if matches!(ty, Ty::StrMap) {
                                    Ty::Str
                                } else {
                                    Ty::Bytes
                                },
                                &ew,
                            )?
                        }
                        _ => {}
                    }
                }
                let m = out.entry(name).or_insert_with(|| json!({}));
                m[k] = if v.is_null() { json!("") } else { v };
            }
            _ if repeated => {
                let v = scalar(ty, &w)?;
                if let Value::Array(a) = out.entry(name).or_insert_with(|| json!([])) {
                    a.push(v);
                }
            }
            _ => {
                out.insert(name.into(), scalar(ty, &w)?);
            }
        }
    }
    Ok(Value::Object(out))
}

/// Decodes a `k8s\0`-prefixed `runtime.Unknown` envelope into the JSON form of its object.
pub fn decode(body: &[u8]) -> Result<Value, ProtoError> {
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or(ProtoError::Malformed("missing k8s magic prefix"))?;
    let mut api_version = String::new();
    let mut kind = String::new();
    let mut raw: &[u8] = &[];
    for (no, w) in fields(envelope)? {
        match (no, w) {
            (1, Wire::Bytes(tm)) => {
                for (n, tw) in fields(tm)? {
                    match (n, tw) {
                        (1, Wire::Bytes(b)) => api_version = utf8(b)?,
                        (2, Wire::Bytes(b)) => kind = utf8(b)?,
                        _ => {}
                    }
                }
            }
            (2, Wire::Bytes(b)) => raw = b,
            _ => {}
        }
    }
    let schema = schema_for(&kind).ok_or_else(|| ProtoError::Unsupported(kind.clone()))?;
    let mut obj = decode_message(raw, schema)?;
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(kind);
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_len(no: u64, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![((no << 3) | 2) as u8, payload.len() as u8];
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn decodes_a_self_subject_access_review() {
        let attrs = [mk_len(2, b"list"), mk_len(5, b"secrets"), mk_len(1, b"ns")].concat();
        let spec = mk_len(1, &attrs);
        let raw = [mk_len(1, &[]), mk_len(2, &spec)].concat();
        let tm = [
            mk_len(1, b"authorization.k8s.io/v1"),
            mk_len(2, b"SelfSubjectAccessReview"),
        ]
        .concat();
        let body = [MAGIC.to_vec(), mk_len(1, &tm), mk_len(2, &raw)].concat();
        let v = decode(&body).ok();
        assert_eq!(
            v.as_ref()
                .and_then(|v| v.pointer("/spec/resourceAttributes")),
            Some(&json!({"verb": "list", "resource": "secrets", "namespace": "ns"}))
        );
    }

    #[test]
    fn unknown_kinds_are_unsupported() {
        let tm = [mk_len(1, b"apps/v1"), mk_len(2, b"Deployment")].concat();
        let body = [MAGIC.to_vec(), mk_len(1, &tm)].concat();
        assert!(matches!(decode(&body), Err(ProtoError::Unsupported(_))));
    }
}
