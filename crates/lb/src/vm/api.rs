//! What the HTTP API offers about VM load balancers on the embedded backend, where no KubeVirt or
//! Kubernetes API is there to ask: VirtualMachineInstances, written by whatever runs the VMs (as
//! KubeVirt writes them: the object with its `status`, KubeVirt's VMI CRD having no status
//! subresource), and the Services and EndpointSlices the reconciler made, to read.
//!
//! A VMI body is the Kubernetes object, judged as KubeVirt's CRD judges it where load balancers
//! and guest clusters read it: `spec.domain.devices` is required, `status.interfaces[]` has
//! KubeVirt's types, and a field an interface does not have is dropped, as the API server prunes
//! it (so `ip` is not an address here either: KubeVirt's is `ipAddress`). Failures are
//! [`ObjectError`]s, as for IPPools and LoadBalancers.

use std::sync::Arc;

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use serde_json::Value;

use crate::{
    crd::kinds::{VirtualMachineInstance, vmi_kind},
    objects::{ObjectError, decode_list, key_from_url},
    store::{Api, Deleted, Kind, LabelSelector, Object, ObjectStore, Preconditions, StoreError},
};

const VMI: &str = "virtualmachineinstance";
const SERVICE: &str = "service";
const SLICE: &str = "endpointslice";
const VMI_API_VERSION: &str = "kubevirt.io/v1";
const VMI_KIND: &str = "VirtualMachineInstance";

/// VMIs, Services and EndpointSlices of the embedded store.
#[derive(Clone)]
pub struct VmObjects {
    store: Arc<dyn ObjectStore>,
    vmis: Api<VirtualMachineInstance>,
    services: Api<Service>,
    slices: Api<EndpointSlice>,
}

fn store_err(
    action: &'static str,
    kind: &'static str,
    name: &str,
) -> impl FnOnce(StoreError) -> ObjectError {
    let name = name.to_string();
    move |e| match e {
        StoreError::NotFound { .. } => ObjectError::NotFound { kind, name },
        source => ObjectError::Store {
            action,
            kind,
            name,
            source: Box::new(source),
        },
    }
}

/// A VMI body, read as the API server reads it under KubeVirt's CRD: a JSON object, of this kind
/// if it says, with `spec.domain.devices`, and a `status` (if any) whose interfaces have KubeVirt's
/// fields and types.
fn decode_vmi(body: &[u8]) -> Result<VirtualMachineInstance, ObjectError> {
    let invalid = |reason: String| ObjectError::Decode { kind: VMI, reason };
    let mut value: Value = serde_json::from_slice(body).map_err(|e| invalid(e.to_string()))?;
    let fields = value
        .as_object_mut()
        .ok_or_else(|| invalid("the body must be a JSON object".into()))?;
    for (field, want) in [("apiVersion", VMI_API_VERSION), ("kind", VMI_KIND)] {
        match fields.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == want => {}
            Some(other) => return Err(invalid(format!("{field} must be {want:?}, not {other}"))),
        }
    }
    // As the contract says (and a Kubernetes API server answers a body without it).
    if !matches!(fields.get("metadata"), Some(Value::Object(_))) {
        return Err(invalid("metadata is required (an object)".into()));
    }
    // A null counts as absent, as the API server drops nulls of fields that are not nullable.
    if fields.get("status") == Some(&Value::Null) {
        fields.remove("status");
    }
    check_spec(fields.get("spec")).map_err(invalid)?;
    if let Some(status) = fields.get_mut("status") {
        check_status(status).map_err(invalid)?;
    }
    serde_json::from_value(value).map_err(|e| invalid(e.to_string()))
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

impl VmObjects {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        VmObjects {
            vmis: Api::with_kind(store.clone(), vmi_kind()),
            services: Api::new(store.clone()),
            slices: Api::new(store.clone()),
            store,
        }
    }

    async fn list<K: Object>(
        &self,
        kind: &Kind,
        what: &'static str,
        namespace: Option<&str>,
    ) -> Result<(Vec<K>, String), ObjectError> {
        let list = self
            .store
            .list(kind, namespace, &LabelSelector::everything())
            .await
            .map_err(store_err("list", what, namespace.unwrap_or_default()))?;
        decode_list(list, kind)
    }

    async fn get<K: Object>(
        api: &Api<K>,
        what: &'static str,
        namespace: &str,
        name: &str,
    ) -> Result<K, ObjectError> {
        api.get(namespace, name)
            .await
            .map_err(store_err("get", what, name))?
            .ok_or_else(|| ObjectError::NotFound {
                kind: what,
                name: name.into(),
            })
    }

    // --- VirtualMachineInstances -----------------------------------------------------------------

    pub async fn list_vmis(
        &self,
        namespace: Option<&str>,
    ) -> Result<(Vec<VirtualMachineInstance>, String), ObjectError> {
        self.list(self.vmis.kind(), VMI, namespace).await
    }

    pub async fn get_vmi(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<VirtualMachineInstance, ObjectError> {
        Self::get(&self.vmis, VMI, namespace, name).await
    }

    pub async fn create_vmi(&self, body: &[u8]) -> Result<VirtualMachineInstance, ObjectError> {
        let vmi = decode_vmi(body)?;
        let name = vmi.metadata.name.clone().unwrap_or_default();
        if vmi.metadata.namespace.as_deref().is_none_or(str::is_empty) {
            return Err(ObjectError::MissingNamespace { kind: VMI, name });
        }
        self.vmis
            .create(&vmi)
            .await
            .map_err(store_err("create", VMI, &name))
    }

    pub async fn replace_vmi(
        &self,
        namespace: &str,
        name: &str,
        body: &[u8],
    ) -> Result<VirtualMachineInstance, ObjectError> {
        let mut vmi = decode_vmi(body)?;
        key_from_url(&mut vmi.metadata, namespace, name)?;
        self.vmis
            .replace(&vmi)
            .await
            .map_err(store_err("update", VMI, name))
    }

    pub async fn delete_vmi(&self, namespace: &str, name: &str) -> Result<Value, ObjectError> {
        let deleted = self
            .vmis
            .delete(namespace, name, &Preconditions::default())
            .await
            .map_err(store_err("delete", VMI, name))?;
        Ok(match deleted {
            Deleted::Gone(v) | Deleted::Pending(v) => v,
        })
    }

    // --- The reconciler's Services and EndpointSlices --------------------------------------------

    pub async fn list_services(
        &self,
        namespace: Option<&str>,
    ) -> Result<(Vec<Service>, String), ObjectError> {
        self.list(self.services.kind(), SERVICE, namespace).await
    }

    pub async fn get_service(&self, namespace: &str, name: &str) -> Result<Service, ObjectError> {
        Self::get(&self.services, SERVICE, namespace, name).await
    }

    pub async fn list_slices(
        &self,
        namespace: Option<&str>,
    ) -> Result<(Vec<EndpointSlice>, String), ObjectError> {
        self.list(self.slices.kind(), SLICE, namespace).await
    }

    pub async fn get_slice(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<EndpointSlice, ObjectError> {
        Self::get(&self.slices, SLICE, namespace, name).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmi_bodies_are_read_as_kubevirts_crd_reads_them() {
        let vmi = decode_vmi(
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
        for bad in [
            &br#"[]"#[..],
            br#"{"kind":"Pod","metadata":{"name":"x"},"spec":{"domain":{"devices":{}}}}"#,
            br#"{"metadata":{"name":"x"}}"#,
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
            assert!(
                matches!(decode_vmi(bad), Err(ObjectError::Decode { .. })),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let vmi = decode_vmi(
            br#"{"metadata":{"name":"x"},"spec":{"domain":{"devices":{}}},"status":null}"#,
        )
        .expect("ok");
        assert_eq!(vmi.rest.get("status"), None);
    }
}
