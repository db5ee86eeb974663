//! Objects of other projects that the load balancer reads through the store port: KubeVirt
//! VirtualMachines and VirtualMachineInstances, and Multus NetworkAttachmentDefinitions.
//!
//! Only metadata is typed; the rest of each object is kept verbatim, so writing one back (to add or
//! remove a finalizer) loses nothing. On the embedded backend these kinds exist only if someone stores
//! them; every reader treats their absence as "none".

use std::borrow::Cow;

use k8s_openapi::{NamespaceResourceScope, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::keys::{
    ANNOTATION_REMOVE_ALL_PVCS, LABEL_CREATOR, LABEL_GUEST_CLUSTER_NAME, NODE_DRIVER,
};

macro_rules! foreign_kind {
    ($(#[$doc:meta])* $name:ident, $group:literal, $version:literal, $kind:literal, $plural:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
        pub struct $name {
            #[serde(default)]
            pub metadata: ObjectMeta,
            /// Everything but `metadata`, verbatim.
            #[serde(flatten)]
            pub rest: Map<String, Value>,
        }

        impl kube::Resource for $name {
            type DynamicType = ();
            type Scope = NamespaceResourceScope;

            fn kind(_: &()) -> Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> Cow<'_, str> {
                $group.into()
            }
            fn version(_: &()) -> Cow<'_, str> {
                $version.into()
            }
            fn plural(_: &()) -> Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }

        impl $name {
            /// The value at a JSON pointer below the object (`/spec/...`).
            pub fn pointer(&self, pointer: &str) -> Option<&Value> {
                let (first, rest) = pointer.trim_start_matches('/').split_once('/').unwrap_or((pointer.trim_start_matches('/'), ""));
                let top = self.rest.get(first)?;
                if rest.is_empty() { Some(top) } else { top.pointer(&format!("/{rest}")) }
            }

            pub fn label(&self, key: &str) -> Option<&str> {
                self.metadata.labels.as_ref()?.get(key).map(String::as_str)
            }

            pub fn annotation(&self, key: &str) -> Option<&str> {
                self.metadata.annotations.as_ref()?.get(key).map(String::as_str)
            }
        }
    };
}

foreign_kind!(
    /// `kubevirt.io/v1` VirtualMachine.
    VirtualMachine,
    "kubevirt.io",
    "v1",
    "VirtualMachine",
    "virtualmachines"
);
foreign_kind!(
    /// `kubevirt.io/v1` VirtualMachineInstance.
    VirtualMachineInstance,
    "kubevirt.io",
    "v1",
    "VirtualMachineInstance",
    "virtualmachineinstances"
);
foreign_kind!(
    /// `k8s.cni.cncf.io/v1` NetworkAttachmentDefinition (a Harvester VM network).
    NetworkAttachmentDefinition,
    "k8s.cni.cncf.io",
    "v1",
    "NetworkAttachmentDefinition",
    "network-attachment-definitions"
);

impl VirtualMachine {
    /// The guest cluster of a VM made by Rancher's node driver, if it is one.
    pub fn guest_cluster(&self) -> Option<&str> {
        if self.label(LABEL_CREATOR) != Some(NODE_DRIVER) {
            return None;
        }
        self.label(LABEL_GUEST_CLUSTER_NAME)
            .filter(|gc| !gc.is_empty())
    }

    /// Rancher marked this VM's guest cluster as being removed.
    pub fn guest_cluster_removing(&self) -> bool {
        self.annotation(ANNOTATION_REMOVE_ALL_PVCS) == Some("true")
    }
}

/// The store descriptor of VirtualMachineInstances. KubeVirt's VMI CRD has no status subresource
/// (virt-controller and virt-handler write `status` with the object), unlike its VM CRD.
pub fn vmi_kind() -> crate::store::Kind {
    crate::store::Kind::of::<VirtualMachineInstance>()
}

impl VirtualMachineInstance {
    /// The first Multus network of `spec.networks`.
    pub fn first_multus_network(&self) -> Option<&str> {
        self.pointer("/spec/networks")?
            .as_array()?
            .iter()
            .find_map(|n| {
                n.pointer("/multus/networkName")
                    .and_then(Value::as_str)
                    .filter(|name| !name.is_empty())
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_objects_round_trip_and_expose_what_the_lb_reads() {
        let json = serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "gc1-pool1-abc", "namespace": "default"},
            "spec": {"networks": [{"name": "default", "pod": {}},
                                  {"name": "nic-1", "multus": {"networkName": "default/vlan10"}}]}
        });
        let vmi: VirtualMachineInstance = serde_json::from_value(json.clone()).expect("decodes");
        assert_eq!(vmi.first_multus_network(), Some("default/vlan10"));
        assert_eq!(serde_json::to_value(&vmi).expect("encodes"), json);
    }
}
