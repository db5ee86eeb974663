//! A VirtualMachineInstance as KubeVirt's CRD judges it where load balancers and guest clusters
//! read it: `spec.domain.devices` is required, `status.interfaces[]` has KubeVirt's types, and a
//! field an interface does not have is dropped, as the API server prunes it (so `ip` is not an
//! address here: KubeVirt's is `ipAddress`). The HTTP API reads VMI bodies with [`from_json`] on
//! the embedded backend, where no API server holds KubeVirt's CRD.

use serde_json::{Map, Value};

use crate::crd::kinds::VirtualMachineInstance;

/// Why a VMI body is not one KubeVirt's CRD admits.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InvalidVmi(pub String);

/// A VMI, read as the API server reads it under KubeVirt's CRD, from the fields of a JSON object
/// whose `apiVersion` and `kind` (if any) were checked: `metadata` and `spec.domain.devices`
/// objects, and a `status` (if any) whose interfaces have KubeVirt's fields and types.
pub fn from_json(mut fields: Map<String, Value>) -> Result<VirtualMachineInstance, InvalidVmi> {
    // As the contract says (and a Kubernetes API server answers a body without it).
    if !matches!(fields.get("metadata"), Some(Value::Object(_))) {
        return Err(InvalidVmi("metadata is required (an object)".into()));
    }
    // A null counts as absent, as the API server drops nulls of fields that are not nullable.
    if fields.get("status") == Some(&Value::Null) {
        fields.remove("status");
    }
    check_spec(fields.get("spec")).map_err(InvalidVmi)?;
    if let Some(status) = fields.get_mut("status") {
        check_status(status).map_err(InvalidVmi)?;
    }
    serde_json::from_value(Value::Object(fields)).map_err(|e| InvalidVmi(e.to_string()))
}

/// KubeVirt's schema requires `spec`, its `domain` and the domain's `devices` (objects).
fn check_spec(spec: Option<&Value>) -> Result<(), String> {
    let mut at = String::from("spec");
    let mut v = spec;
    for next in ["domain", "devices", ""] {
        match v {
            Some(Value::Object(o)) if !next.is_empty() => {
                v = o.get(next);
                at = format!("{at}.{next}");
            }
            Some(Value::Object(_)) => return Ok(()),
            None | Some(Value::Null) => return Err(format!("{at} is required (an object)")),
            Some(other) => return Err(format!("{at} must be an object, not {other}")),
        }
    }
    Ok(())
}

/// The fields of KubeVirt's `VirtualMachineInstanceNetworkInterface` that are strings.
const INTERFACE_STRINGS: &[&str] = &[
    "name",
    "interfaceName",
    "ipAddress",
    "mac",
    "podInterfaceName",
    "infoSource",
    "linkState",
];

/// The parts of a VMI's status that load balancers and guest clusters read have KubeVirt's types;
/// an interface's fields KubeVirt does not have are dropped.
fn check_status(status: &mut Value) -> Result<(), String> {
    let string = |v: Option<&Value>, at: &str| match v {
        None | Some(Value::Null | Value::String(_)) => Ok(()),
        Some(other) => Err(format!("{at} must be a string, not {other}")),
    };
    let Some(status) = status.as_object_mut() else {
        return Err(format!("status must be an object, not {status}"));
    };
    string(status.get("phase"), "status.phase")?;
    let Some(interfaces) = status.get_mut("interfaces") else {
        return Ok(());
    };
    if interfaces.is_null() {
        status.remove("interfaces");
        return Ok(());
    }
    let interfaces = interfaces
        .as_array_mut()
        .ok_or("status.interfaces must be an array")?;
    for (i, iface) in interfaces.iter_mut().enumerate() {
        let at = |f: &str| format!("status.interfaces[{i}].{f}");
        let Some(iface) = iface.as_object_mut() else {
            return Err(format!("status.interfaces[{i}] must be an object"));
        };
        iface.retain(|f, v| {
            !v.is_null()
                && (INTERFACE_STRINGS.contains(&f.as_str())
                    || f == "ipAddresses"
                    || f == "queueCount")
        });
        for f in INTERFACE_STRINGS {
            string(iface.get(*f), &at(f))?;
        }
        if let Some(all) = iface.get("ipAddresses") {
            let ok = all
                .as_array()
                .is_some_and(|a| a.iter().all(Value::is_string));
            if !ok {
                return Err(format!("{} must be an array of strings", at("ipAddresses")));
            }
        }
        if let Some(q) = iface.get("queueCount")
            && q.as_i64().and_then(|q| i32::try_from(q).ok()).is_none()
        {
            return Err(format!(
                "{} must be a 32-bit integer, not {q}",
                at("queueCount")
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(body: &[u8]) -> Result<VirtualMachineInstance, InvalidVmi> {
        match serde_json::from_slice(body).expect("JSON") {
            Value::Object(fields) => from_json(fields),
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn vmi_bodies_are_read_as_kubevirts_crd_reads_them() {
        let vmi = read(
            br#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance",
                 "metadata":{"name":"vm1","namespace":"default","labels":{"app":"web"}},
                 "spec":{"domain":{"devices":{}}},
                 "status":{"phase":"Running","interfaces":[{"name":"default","ipAddress":"10.0.0.1",
                     "ipAddresses":["10.0.0.1","fd00::1"],"queueCount":2,"ip":"10.0.0.2"}]}}"#,
        )
        .expect("decodes");
        assert_eq!(vmi.metadata.name.as_deref(), Some("vm1"));
        // `ip` is not KubeVirt's: pruned, as the API server prunes it.
        assert_eq!(
            vmi.rest.get("status"),
            Some(
                &serde_json::json!({"phase": "Running", "interfaces": [{"name": "default",
                "ipAddress": "10.0.0.1", "ipAddresses": ["10.0.0.1", "fd00::1"], "queueCount": 2}]})
            )
        );
        // Bodies that are not JSON objects, or of another kind, are the HTTP layer's to refuse
        // (`http::rest::body`), before they get here.
        for bad in [
            &br#"{"metadata":{"name":"x"}}"#[..],
            br#"{"metadata":{"name":"x"},"spec":null}"#,
            br#"{"metadata":{"name":"x"},"spec":3}"#,
            br#"{"metadata":{"name":"x"},"spec":{}}"#,
            br#"{"metadata":{"name":"x"},"spec":{"domain":{}}}"#,
            br#"{"metadata":{"name":"x"},"spec":{"domain":{"devices":[]}}}"#,
            br#"{"metadata":{"name":"x"},"spec":{"domain":{"devices":{}}},"status":"up"}"#,
            br#"{"metadata":{"labels":{"a":1}},"spec":{"domain":{"devices":{}}}}"#,
            br#"{"metadata":{"name":"x"},"spec":{"domain":{"devices":{}}},"status":{"interfaces":{}}}"#,
            br#"{"metadata":{"name":"x"},"spec":{"domain":{"devices":{}}},"status":{"interfaces":[{"ipAddress":5}]}}"#,
            br#"{"metadata":{"name":"x"},"spec":{"domain":{"devices":{}}},"status":{"interfaces":[{"ipAddresses":"a"}]}}"#,
            br#"{"metadata":{"name":"x"},"spec":{"domain":{"devices":{}}},"status":{"interfaces":[{"queueCount":"2"}]}}"#,
            br#"{"metadata":{"name":"x"},"spec":{"domain":{"devices":{}}},"status":{"interfaces":[{"queueCount":4294967296}]}}"#,
        ] {
            assert!(read(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let vmi =
            read(br#"{"metadata":{"name":"x"},"spec":{"domain":{"devices":{}}},"status":null}"#)
                .expect("ok");
        assert_eq!(vmi.rest.get("status"), None);
    }
}
