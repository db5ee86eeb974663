//! What the HTTP API offers about VM load balancers on the embedded backend, where no KubeVirt or
//! Kubernetes API is there to ask: VirtualMachineInstances, written by whatever runs the VMs (as
//! KubeVirt writes them: the object, and `status` through its status subresource), and the Services
//! and EndpointSlices the reconciler made, to read.
//!
//! A VMI body is the Kubernetes object; its `status` is kept as sent (a POST creates the object,
//! then writes the status; a PUT replaces both). Failures are [`ObjectError`]s, as for IPPools and
//! LoadBalancers.

use std::sync::Arc;

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use serde_json::Value;

use crate::{
    controller::kinds::{VirtualMachineInstance, vmi_kind},
    lb::objects::{ObjectError, decode_list, key_from_url},
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

/// A VMI body, read as the API server would: a JSON object, of this kind if it says, with
/// `spec` and `status` objects if present. Returns the object (without status) and the status.
fn decode_vmi(body: &[u8]) -> Result<(VirtualMachineInstance, Option<Value>), ObjectError> {
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
    for field in ["spec", "status"] {
        match fields.get(field) {
            None | Some(Value::Object(_)) => {}
            Some(Value::Null) => {
                fields.remove(field);
            }
            Some(other) => return Err(invalid(format!("{field} must be an object, not {other}"))),
        }
    }
    let status = fields.remove("status");
    if let Some(status) = &status {
        check_status(status).map_err(invalid)?;
    }
    let vmi = serde_json::from_value(value).map_err(|e| invalid(e.to_string()))?;
    Ok((vmi, status))
}

/// The parts of a VMI's status that load balancers read have KubeVirt's types.
fn check_status(status: &Value) -> Result<(), String> {
    let string = |v: Option<&Value>, at: &str| match v {
        None | Some(Value::String(_)) => Ok(()),
        Some(other) => Err(format!("{at} must be a string, not {other}")),
    };
    string(status.get("phase"), "status.phase")?;
    let Some(interfaces) = status.get("interfaces") else {
        return Ok(());
    };
    let interfaces = interfaces
        .as_array()
        .ok_or("status.interfaces must be an array")?;
    for (i, iface) in interfaces.iter().enumerate() {
        let at = |f: &str| format!("status.interfaces[{i}].{f}");
        if !iface.is_object() {
            return Err(format!("status.interfaces[{i}] must be an object"));
        }
        for f in ["name", "interfaceName", "ip"] {
            string(iface.get(f), &at(f))?;
        }
        if let Some(all) = iface.get("ipAddresses") {
            let ok = all
                .as_array()
                .is_some_and(|a| a.iter().all(Value::is_string));
            if !ok {
                return Err(format!("{} must be an array of strings", at("ipAddresses")));
            }
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

    /// Writes the status sent with a VMI (its status subresource), after the object.
    async fn write_status(
        &self,
        mut vmi: VirtualMachineInstance,
        status: Option<Value>,
    ) -> Result<VirtualMachineInstance, ObjectError> {
        let name = vmi.metadata.name.clone().unwrap_or_default();
        if vmi.rest.get("status") == status.as_ref() {
            return Ok(vmi);
        }
        match status {
            Some(s) => vmi.rest.insert("status".into(), s),
            None => vmi.rest.remove("status"),
        };
        self.vmis
            .replace_status(&vmi)
            .await
            .map_err(store_err("update the status of", VMI, &name))
    }

    pub async fn create_vmi(&self, body: &[u8]) -> Result<VirtualMachineInstance, ObjectError> {
        let (vmi, status) = decode_vmi(body)?;
        let name = vmi.metadata.name.clone().unwrap_or_default();
        if vmi.metadata.namespace.as_deref().is_none_or(str::is_empty) {
            return Err(ObjectError::MissingNamespace { kind: VMI, name });
        }
        let created = self
            .vmis
            .create(&vmi)
            .await
            .map_err(store_err("create", VMI, &name))?;
        self.write_status(created, status).await
    }

    pub async fn replace_vmi(
        &self,
        namespace: &str,
        name: &str,
        body: &[u8],
    ) -> Result<VirtualMachineInstance, ObjectError> {
        let (mut vmi, status) = decode_vmi(body)?;
        key_from_url(&mut vmi.metadata, namespace, name)?;
        let replaced = self
            .vmis
            .replace(&vmi)
            .await
            .map_err(store_err("update", VMI, name))?;
        self.write_status(replaced, status).await
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
    fn vmi_bodies_are_read_as_the_api_server_reads_them() {
        let (vmi, status) = decode_vmi(
            br#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance",
                 "metadata":{"name":"vm1","namespace":"default","labels":{"app":"web"}},
                 "spec":{"domain":{}},"status":{"interfaces":[{"ip":"10.0.0.1"}]}}"#,
        )
        .expect("decodes");
        assert_eq!(vmi.metadata.name.as_deref(), Some("vm1"));
        assert!(vmi.rest.get("status").is_none());
        assert_eq!(
            status,
            Some(serde_json::json!({"interfaces": [{"ip": "10.0.0.1"}]}))
        );
        for bad in [
            &br#"[]"#[..],
            br#"{"kind":"Pod","metadata":{"name":"x"}}"#,
            br#"{"metadata":{"name":"x"},"spec":3}"#,
            br#"{"metadata":{"name":"x"},"status":"up"}"#,
            br#"{"metadata":{"labels":{"a":1}}}"#,
            br#"{"metadata":{"name":"x"},"status":{"interfaces":{}}}"#,
            br#"{"metadata":{"name":"x"},"status":{"interfaces":[{"ip":5}]}}"#,
            br#"{"metadata":{"name":"x"},"status":{"interfaces":[{"ipAddresses":"a"}]}}"#,
        ] {
            assert!(
                matches!(decode_vmi(bad), Err(ObjectError::Decode { .. })),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let (_, status) = decode_vmi(br#"{"metadata":{"name":"x"},"status":null}"#).expect("ok");
        assert_eq!(status, None);
    }
}
