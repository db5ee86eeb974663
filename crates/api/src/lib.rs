//! The `loadbalancer.harvesterhci.io/v1beta1` custom resources, LoadBalancer (namespaced) and IPPool
//! (cluster-scoped), as kube-derive types with every field, printer column and short name of Harvester's
//! CRDs, their finalizers, and ([`keys`]) every annotation and label key of Harvester's.
//!
//! One deliberate difference: both CRDs declare the status subresource (upstream has none, so every
//! status write upstream is a full-object update that conflicts with spec edits). Objects written
//! without it, by upstream controllers or clients that put `status` in a plain update, still decode:
//! every field reads `null` or absence as empty, as Go clients write them.
//!
//! An IPPool's spec and status are the IPAM engine's own wire types ([`crate::ipam::PoolSpec`],
//! embedded, and [`crate::ipam::PoolStatus`]), which know nothing of Kubernetes: there is one model of
//! a pool, not a copy here and conversions.
#![forbid(unsafe_code)]

// The crates below this one, under the names the modules use.
use harvester_cloud_ipam as ipam;
use harvester_cloud_store as store;

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    ipam::{Condition, spec::null_as_default},
    store::{Kind, Object},
};

pub mod dhcp;
pub mod keys;
pub mod kinds;

use keys::{ANNOTATION_CLUSTER, ANNOTATION_NAMESPACE, ANNOTATION_NETWORK, ANNOTATION_PROJECT};

/// The API group of both resources.
pub const GROUP: &str = "loadbalancer.harvesterhci.io";

/// Finalizer of the load balancer controller on LoadBalancers (upstream's name, so that objects
/// finalized by Harvester's own controller are released by this one).
pub const LB_FINALIZER: &str = "wrangler.cattle.io/harvester-lb-controller";
/// Finalizer of the IPAM controller on IPPools.
pub const POOL_FINALIZER: &str = "wrangler.cattle.io/harvester-ipam-controller";
/// Finalizer of the guest-cluster cleanup on guest-cluster VirtualMachines.
pub const VM_FINALIZER: &str = "wrangler.cattle.io/harvester-lb-vm-controller";

/// What a load balancer asks for: how its address is obtained and, for VMs, its listeners.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "loadbalancer.harvesterhci.io",
    version = "v1beta1",
    kind = "LoadBalancer",
    namespaced,
    status = "LoadBalancerStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "lb",
    shortname = "lbs",
    doc = "A virtual IP for VMs (workloadType vm) or for a guest cluster's Service (workloadType cluster).",
    printcolumn = r#"{"name":"DESCRIPTION","type":"string","jsonPath":".spec.description"}"#,
    printcolumn = r#"{"name":"WORKLOADTYPE","type":"string","jsonPath":".spec.workloadType"}"#,
    printcolumn = r#"{"name":"IPAM","type":"string","jsonPath":".spec.ipam"}"#,
    printcolumn = r#"{"name":"ADDRESS","type":"string","jsonPath":".status.address"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerSpec {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub description: String,
    /// `vm` or `cluster`; empty means `vm`.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    #[schemars(extend("enum" = ["vm", "cluster"]))]
    pub workload_type: String,
    /// `pool` or `dhcp`; anything but `dhcp` (including empty) takes an address from a pool.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    #[schemars(extend("enum" = ["pool", "dhcp"]))]
    pub ipam: String,
    /// An explicit pool name; no matching is done when set.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub ip_pool: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub listeners: Vec<Listener>,
    /// Each key is an `In` requirement on VMI labels; all keys are ANDed.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub backend_server_selector: BTreeMap<String, Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
}

/// A port of a VM load balancer and the backend port it forwards to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Listener {
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    pub port: i32,
    pub protocol: String,
    pub backend_port: i32,
}

impl Listener {
    pub fn new(name: &str, port: i32, protocol: &str, backend_port: i32) -> Self {
        Listener {
            name: name.into(),
            port,
            protocol: protocol.into(),
            backend_port,
        }
    }

    /// The protocol as Kubernetes takes it: an empty one is TCP (upstream's CRD and webhook accept
    /// an empty protocol, and a Service port without one is TCP).
    pub fn effective_protocol(&self) -> &str {
        if self.protocol.is_empty() {
            "TCP"
        } else {
            &self.protocol
        }
    }
}

/// How a VM load balancer probes its backends (TCP on a listener's backend port).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheck {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "is_zero"
    )]
    #[schemars(schema_with = "uint_schema")]
    pub port: u64,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "is_zero"
    )]
    #[schemars(schema_with = "uint_schema")]
    pub success_threshold: u64,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "is_zero"
    )]
    #[schemars(schema_with = "uint_schema")]
    pub failure_threshold: u64,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "is_zero"
    )]
    #[schemars(schema_with = "uint_schema")]
    pub period_seconds: u64,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "is_zero"
    )]
    #[schemars(schema_with = "uint_schema")]
    pub timeout_seconds: u64,
}

/// The load balancer's address and readiness.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerStatus {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub backend_servers: Vec<String>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "AllocatedAddress::is_empty"
    )]
    pub allocated_address: AllocatedAddress,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub address: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditions: Vec<Condition>,
}

/// Where the address came from (`ip` is 0.0.0.0 for DHCP).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllocatedAddress {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub ip_pool: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub ip: String,
    /// Dotted netmask for IPv4.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub mask: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub gateway: String,
}

impl AllocatedAddress {
    pub fn is_empty(&self) -> bool {
        self == &AllocatedAddress::default()
    }
}

/// Address ranges and the selector of load balancers that may use them.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "loadbalancer.harvesterhci.io",
    version = "v1beta1",
    kind = "IPPool",
    plural = "ippools",
    status = "ipam::PoolStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "pool",
    shortname = "pools",
    doc = "Address ranges that LoadBalancers take their addresses from, and who holds which address.",
    printcolumn = r#"{"name":"DESCRIPTION","type":"string","jsonPath":".spec.description"}"#,
    printcolumn = r#"{"name":"RANGES","type":"string","jsonPath":".spec.ranges"}"#,
    printcolumn = r#"{"name":"Priority","type":"string","jsonPath":".spec.selector.priority"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct IPPoolSpec {
    // The IPAM engine's wire type, embedded as it is: one model of a pool's spec.
    #[serde(flatten)]
    pub pool: ipam::PoolSpec,
}

impl std::ops::Deref for IPPoolSpec {
    type Target = ipam::PoolSpec;

    fn deref(&self) -> &ipam::PoolSpec {
        &self.pool
    }
}

impl std::ops::DerefMut for IPPoolSpec {
    fn deref_mut(&mut self) -> &mut ipam::PoolSpec {
        &mut self.pool
    }
}

impl From<ipam::PoolSpec> for IPPoolSpec {
    fn from(pool: ipam::PoolSpec) -> Self {
        IPPoolSpec { pool }
    }
}

/// Go's `uint`: an unsigned integer without a format Kubernetes would not know.
fn uint_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "integer", "minimum": 0})
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// The store descriptor of LoadBalancers: status written apart from the object (a subresource on
/// the embedded store; on Kubernetes, as the installed CRD allows).
pub fn lb_kind() -> Kind {
    Kind::of::<LoadBalancer>().with_status_subresource()
}

/// The store descriptor of IPPools: status written apart from the object, as for LoadBalancers.
pub fn pool_kind() -> Kind {
    Kind::of::<IPPool>().with_status_subresource()
}

/// Typed store access to LoadBalancers.
pub fn lb_api(
    store: std::sync::Arc<dyn crate::store::ObjectStore>,
) -> crate::store::Api<LoadBalancer> {
    crate::store::Api::with_kind(store, lb_kind())
}

/// Typed store access to IPPools.
pub fn pool_api(store: std::sync::Arc<dyn crate::store::ObjectStore>) -> crate::store::Api<IPPool> {
    crate::store::Api::with_kind(store, pool_kind())
}

impl LoadBalancer {
    /// The IPAM applicant id: `<namespace>/<name>`.
    pub fn applicant(&self) -> String {
        format!(
            "{}/{}",
            self.metadata.namespace.as_deref().unwrap_or_default(),
            self.metadata.name.as_deref().unwrap_or_default()
        )
    }

    pub fn is_dhcp(&self) -> bool {
        self.spec.ipam == "dhcp"
    }

    pub fn workload_type(&self) -> ipam::WorkloadType {
        ipam::WorkloadType::parse(&self.spec.workload_type)
    }

    fn annotation(&self, key: &str) -> String {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .cloned()
            .unwrap_or_default()
    }

    /// The address asked for (`loadbalancer.harvesterhci.io/requestedIP`); `Err` names a value that
    /// is not an IP address.
    pub fn requested_ip(&self) -> Result<Option<std::net::IpAddr>, String> {
        let text = self.annotation(keys::ANNOTATION_REQUESTED_IP);
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        text.parse::<std::net::IpAddr>()
            .map(|ip| Some(ip.to_canonical()))
            .map_err(|_| {
                format!(
                    "annotation {} {text:?} is not an IP address",
                    keys::ANNOTATION_REQUESTED_IP
                )
            })
    }

    /// The family asked for (`loadbalancer.harvesterhci.io/ipFamily`, `IPv4` or `IPv6`); `Err` names
    /// another value.
    pub(crate) fn ip_family(&self) -> Result<Option<ipam::Family>, String> {
        match self.annotation(keys::ANNOTATION_IP_FAMILY).trim() {
            "" => Ok(None),
            "IPv4" => Ok(Some(ipam::Family::V4)),
            "IPv6" => Ok(Some(ipam::Family::V6)),
            other => Err(format!(
                "annotation {} {other:?} is neither IPv4 nor IPv6",
                keys::ANNOTATION_IP_FAMILY
            )),
        }
    }

    /// The requested address and the family the address must have: the requested address's, else
    /// the annotated family. `Err` when either annotation is invalid or the two disagree.
    pub fn address_request(
        &self,
    ) -> Result<(Option<std::net::IpAddr>, Option<ipam::Family>), String> {
        let ip = self.requested_ip()?;
        let family = self.ip_family()?;
        match (ip, family) {
            (Some(ip), Some(f)) if ipam::Family::of(ip) != f => Err(format!(
                "requested address {ip} is not an {f} address, as annotation {} asks",
                keys::ANNOTATION_IP_FAMILY
            )),
            (Some(ip), _) => Ok((Some(ip), Some(ipam::Family::of(ip)))),
            (None, family) => Ok((None, family)),
        }
    }

    /// The labels pools' service selectors are matched against: the guest Service's, which the
    /// cloud provider carries in the annotation `cloudprovider.harvesterhci.io/serviceLabels`,
    /// else (a LoadBalancer made on Harvester, or by upstream's cloud provider) the
    /// LoadBalancer's own. `Err` names an annotation that is not a JSON object of strings.
    pub fn selector_labels(&self) -> Result<BTreeMap<String, String>, String> {
        let carried = self
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(keys::ANNOTATION_SERVICE_LABELS));
        match carried {
            None => Ok(self.metadata.labels.clone().unwrap_or_default()),
            Some(text) => serde_json::from_str(text).map_err(|e| {
                format!(
                    "annotation {} is not a JSON object of label values: {e}",
                    keys::ANNOTATION_SERVICE_LABELS
                )
            }),
        }
    }

    /// What pool selection reads of this load balancer.
    pub fn request(&self) -> ipam::LbRequest {
        ipam::LbRequest {
            lb_namespace: self.metadata.namespace.clone().unwrap_or_default(),
            ip_pool: self.spec.ip_pool.clone(),
            workload_type: self.workload_type(),
            network: self.annotation(ANNOTATION_NETWORK),
            project: self.annotation(ANNOTATION_PROJECT),
            namespace: self.annotation(ANNOTATION_NAMESPACE),
            cluster: self.annotation(ANNOTATION_CLUSTER),
            family: self.address_request().ok().and_then(|(_, f)| f),
            // Admission refuses an annotation that does not read; one written past it matches
            // only selectors that accept no labels.
            labels: self.selector_labels().unwrap_or_default(),
        }
    }
}

impl IPPool {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// The pool as pool selection and admission see it.
    pub fn entry(&self) -> ipam::PoolEntry<'_> {
        ipam::PoolEntry {
            name: self.name(),
            spec: &self.spec.pool,
            deleting: self.is_deleting(),
            options: ipam::PoolOptions {
                skip_addresses: self.annotation(keys::SKIP_ADDRESSES),
                service_selector: self.annotation(keys::SERVICE_SELECTOR),
            },
        }
    }

    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// An annotation's value, empty when absent.
    fn annotation(&self, key: &str) -> &str {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map_or("", String::as_str)
    }

    /// What the pool skips (`loadbalancer.harvesterhci.io/skipAddresses`); `Err` when the
    /// annotation names something unknown.
    pub fn skip(&self) -> Result<ipam::Skip, ipam::SkipError> {
        ipam::Skip::parse(self.annotation(keys::SKIP_ADDRESSES))
    }

    /// `status.allocated`, empty when there is no status.
    pub fn allocated(&self) -> BTreeMap<String, String> {
        self.status
            .as_ref()
            .map(|s| s.allocated.clone())
            .unwrap_or_default()
    }
}

/// The two CustomResourceDefinitions, LoadBalancer first.
///
/// Both are shipped without a status subresource, as Harvester installs them (load-balancer-harvester
/// `crds/`): the kinds are Harvester's, Helm never upgrades CRDs, and Harvester's own controller
/// writes status with a plain update, which a status subresource would drop, so a cluster could not
/// switch back. The service finds the shape by discovery and writes status either way
/// (`store::kubernetes`).
pub fn crds() -> Vec<CustomResourceDefinition> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceSubresources;
    use kube::CustomResourceExt;
    let mut crds = vec![LoadBalancer::crd(), IPPool::crd()];
    for version in crds.iter_mut().flat_map(|c| c.spec.versions.iter_mut()) {
        version.subresources = Some(CustomResourceSubresources::default());
    }
    crds
}

/// The file name a CRD is shipped under in `deploy/crds/`.
pub fn crd_file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

/// Errors rendering the CRDs.
#[derive(Debug, thiserror::Error)]
pub enum RenderCrdError {
    #[error("cannot render CustomResourceDefinition {name} as YAML: {source}")]
    Yaml {
        name: String,
        source: yaml_serde::Error,
    },
}

/// One CRD as YAML.
pub fn crd_yaml(crd: &CustomResourceDefinition) -> Result<String, RenderCrdError> {
    yaml_serde::to_string(crd).map_err(|source| RenderCrdError::Yaml {
        name: crd.metadata.name.clone().unwrap_or_default(),
        source,
    })
}

/// Both CRDs as one multi-document YAML stream (what `harvester-cloud crds` prints).
pub fn crds_yaml() -> Result<String, RenderCrdError> {
    let docs: Result<Vec<String>, _> = crds().iter().map(crd_yaml).collect();
    Ok(docs?
        .iter()
        .map(|d| format!("---\n{d}"))
        .collect::<String>())
}

/// Compile-time check that both types can live in the store.
const _: fn() = || {
    fn object<K: Object>() {}
    object::<LoadBalancer>();
    object::<IPPool>();
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_objects_without_subresource_decode() {
        // As written by Harvester's controller with a full update: status included, nulls for empty
        // slices, no allocatedAddress on a DHCP-less pool LB yet.
        let lb: LoadBalancer = serde_json::from_value(serde_json::json!({
            "apiVersion": "loadbalancer.harvesterhci.io/v1beta1",
            "kind": "LoadBalancer",
            "metadata": {"name": "lb1", "namespace": "default"},
            "spec": {"ipam": "pool", "listeners": null, "backendServerSelector": null,
                     "workloadType": "cluster"},
            "status": {"allocatedAddress": {"ipPool": "p", "ip": "192.168.0.2",
                       "mask": "255.255.255.0", "gateway": "192.168.0.1"},
                       "conditions": [{"type": "Ready", "status": "True",
                                       "lastUpdateTime": "2023-03-20T12:26:45Z"}],
                       "backendServers": null}
        }))
        .expect("decodes");
        assert_eq!(lb.applicant(), "default/lb1");
        let status = lb.status.expect("status");
        assert_eq!(status.allocated_address.ip, "192.168.0.2");
        assert_eq!(status.conditions[0].status, "True");

        let pool: IPPool = serde_json::from_value(serde_json::json!({
            "apiVersion": "loadbalancer.harvesterhci.io/v1beta1",
            "kind": "IPPool",
            "metadata": {"name": "p"},
            "spec": {"ranges": [{"subnet": "192.168.0.0/24"}], "selector": {"scope": null}},
            "status": {"total": 253, "available": 252, "lastAllocated": "192.168.0.2",
                       "allocated": {"192.168.0.2": "default/lb1"}, "allocatedHistory": null}
        }))
        .expect("decodes");
        assert_eq!(pool.status.as_ref().expect("status").allocated.len(), 1);
        assert_eq!(pool.spec.ranges[0].subnet, "192.168.0.0/24");
    }

    #[test]
    fn crds_carry_upstream_names_columns_and_no_status_subresource() {
        let crds = crds();
        let lb = &crds[0];
        assert_eq!(
            lb.metadata.name.as_deref(),
            Some("loadbalancers.loadbalancer.harvesterhci.io")
        );
        assert_eq!(lb.spec.scope, "Namespaced");
        assert_eq!(
            lb.spec.names.short_names,
            Some(vec!["lb".into(), "lbs".into()])
        );
        let version = &lb.spec.versions[0];
        assert_eq!(version.name, "v1beta1");
        assert!(version.storage && version.served);
        let columns: Vec<(&str, &str)> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| (c.name.as_str(), c.json_path.as_str()))
            .collect();
        assert_eq!(
            columns,
            [
                ("DESCRIPTION", ".spec.description"),
                ("WORKLOADTYPE", ".spec.workloadType"),
                ("IPAM", ".spec.ipam"),
                ("ADDRESS", ".status.address"),
                ("AGE", ".metadata.creationTimestamp")
            ]
        );
        // Harvester's shape: `subresources: {}`.
        for crd in &crds {
            for v in &crd.spec.versions {
                assert_eq!(
                    v.subresources,
                    Some(Default::default()),
                    "{:?}",
                    crd.metadata.name
                );
            }
        }

        let pool = &crds[1];
        assert_eq!(
            pool.metadata.name.as_deref(),
            Some("ippools.loadbalancer.harvesterhci.io")
        );
        assert_eq!(pool.spec.scope, "Cluster");
        assert_eq!(
            pool.spec.names.short_names,
            Some(vec!["pool".into(), "pools".into()])
        );
        let schema = serde_json::to_value(&pool.spec.versions[0].schema).expect("schema");
        let spec = &schema["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["required"], serde_json::json!(["ranges"]));
        assert_eq!(
            spec["properties"]["ranges"]["items"]["required"],
            serde_json::json!(["subnet"])
        );
        let status = &schema["openAPIV3Schema"]["properties"]["status"];
        assert_eq!(
            status["required"],
            serde_json::json!(["available", "lastAllocated", "total"])
        );
    }
}
