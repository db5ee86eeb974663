//! The `loadbalancer.harvesterhci.io/v1beta1` custom resources, LoadBalancer (namespaced) and IPPool
//! (cluster-scoped), as kube-derive types with every field, printer column and short name of Harvester's
//! CRDs, their finalizers, and ([`keys`]) every annotation and label key of Harvester's.
//!
//! One deliberate difference: both CRDs declare the status subresource (upstream has none, so every
//! status write upstream is a full-object update that conflicts with spec edits). Objects written
//! without it, by upstream controllers or clients that put `status` in a plain update, still decode:
//! every field reads `null` or absence as empty, as Go clients write them.
//!
//! The IPAM engine has its own wire types ([`crate::ipam::PoolSpec`], [`crate::ipam::PoolStatus`]) and
//! knows nothing of Kubernetes; the conversions between them live here.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use crate::{
    ipam,
    store::{Kind, Object},
};

pub mod keys;

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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Listener {
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    pub port: i32,
    pub protocol: String,
    pub backend_port: i32,
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

/// A status condition; the only type is `Ready`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(default, deserialize_with = "null_as_default")]
    pub r#type: String,
    /// `True`, `False` or `Unknown`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub status: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub last_update_time: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub last_transition_time: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub reason: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub message: String,
}

/// Address ranges and the selector of load balancers that may use them.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "loadbalancer.harvesterhci.io",
    version = "v1beta1",
    kind = "IPPool",
    plural = "ippools",
    status = "IPPoolStatus",
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
#[serde(rename_all = "camelCase")]
pub struct IPPoolSpec {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub description: String,
    /// The address ranges (at least one).
    // `null` reads as empty so that validation can name the problem.
    #[serde(deserialize_with = "null_as_default")]
    pub ranges: Vec<Range>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub selector: Selector,
}

/// A range of a subnet; an empty start, end or gateway takes the subnet's default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Range {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub range_start: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub range_end: String,
    #[serde(deserialize_with = "null_as_default")]
    pub subnet: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub gateway: String,
}

/// `spec.selector`: which load balancers may use the pool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Selector {
    /// Among matching pools the highest wins.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "is_zero_u32"
    )]
    #[schemars(schema_with = "uint32_schema")]
    pub priority: u32,
    /// `namespace/name` of a VM network (NetworkAttachmentDefinition), or empty.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub network: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub scope: Vec<Tuple>,
}

/// One scope entry; `*` matches anything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Tuple {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub project: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub namespace: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub guest_cluster: String,
}

/// The pool's allocation state: who holds which address, and who held the released ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = pool_status_required)]
pub struct IPPoolStatus {
    #[serde(default, deserialize_with = "null_as_default")]
    pub total: i64,
    #[serde(default, deserialize_with = "null_as_default")]
    pub available: i64,
    #[serde(default, deserialize_with = "null_as_default")]
    pub last_allocated: String,
    /// IP -> `<lbNamespace>/<lbName>`.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub allocated: BTreeMap<String, String>,
    /// Released IP -> its last `<lbNamespace>/<lbName>`.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub allocated_history: BTreeMap<String, String>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditions: Vec<Condition>,
}

/// Upstream's status fields `total`, `available` and `lastAllocated` are required; they are read
/// leniently here (a status written by hand may lack them), so the schema says so explicitly.
fn pool_status_required(schema: &mut schemars::Schema) {
    schema.insert(
        "required".into(),
        serde_json::json!(["available", "lastAllocated", "total"]),
    );
}

/// Go's `uint`: an unsigned integer without a format Kubernetes would not know.
fn uint_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "integer", "minimum": 0})
}

/// Go's `uint32`, as controller-gen describes it.
fn uint32_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "integer", "format": "int32", "minimum": 0})
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

fn is_zero_u32(value: &u32) -> bool {
    *value == 0
}

/// Go clients write `null` for empty slices and maps; read it as the empty value.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// The store descriptor of LoadBalancers (with the status subresource).
pub fn lb_kind() -> Kind {
    Kind::of::<LoadBalancer>().with_status_subresource()
}

/// The store descriptor of IPPools (with the status subresource).
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
        }
    }
}

impl From<&Range> for ipam::RangeSpec {
    fn from(r: &Range) -> Self {
        ipam::RangeSpec {
            range_start: r.range_start.clone(),
            range_end: r.range_end.clone(),
            subnet: r.subnet.clone(),
            gateway: r.gateway.clone(),
        }
    }
}

impl From<&IPPoolSpec> for ipam::PoolSpec {
    fn from(spec: &IPPoolSpec) -> Self {
        ipam::PoolSpec {
            description: spec.description.clone(),
            ranges: spec.ranges.iter().map(Into::into).collect(),
            selector: ipam::Selector {
                priority: spec.selector.priority,
                network: spec.selector.network.clone(),
                scope: spec
                    .selector
                    .scope
                    .iter()
                    .map(|t| ipam::Tuple {
                        project: t.project.clone(),
                        namespace: t.namespace.clone(),
                        guest_cluster: t.guest_cluster.clone(),
                    })
                    .collect(),
            },
        }
    }
}

impl From<&IPPoolStatus> for ipam::PoolStatus {
    fn from(s: &IPPoolStatus) -> Self {
        ipam::PoolStatus {
            total: s.total,
            available: s.available,
            last_allocated: s.last_allocated.clone(),
            allocated: s.allocated.clone(),
            allocated_history: s.allocated_history.clone(),
            // The allocator never reads conditions.
            conditions: Vec::new(),
        }
    }
}

impl IPPool {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn ipam_spec(&self) -> ipam::PoolSpec {
        (&self.spec).into()
    }

    pub fn ranges(&self) -> Vec<ipam::RangeSpec> {
        self.spec.ranges.iter().map(Into::into).collect()
    }

    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// `status.allocated`, empty when there is no status.
    pub fn allocated(&self) -> BTreeMap<String, String> {
        self.status
            .as_ref()
            .map(|s| s.allocated.clone())
            .unwrap_or_default()
    }
}

impl IPPoolStatus {
    /// Overwrites everything but the conditions with the allocator's state.
    pub fn set_allocation(&mut self, allocator: &ipam::PoolAllocator) {
        let mut s = ipam::PoolStatus::default();
        allocator.write_status(&mut s);
        self.total = s.total;
        self.available = s.available;
        self.last_allocated = s.last_allocated;
        self.allocated = s.allocated;
        self.allocated_history = s.allocated_history;
    }
}

/// The two CustomResourceDefinitions, LoadBalancer first.
pub fn crds() -> Vec<CustomResourceDefinition> {
    use kube::CustomResourceExt;
    vec![LoadBalancer::crd(), IPPool::crd()]
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
        let status = ipam::PoolStatus::from(pool.status.as_ref().expect("status"));
        assert_eq!(status.allocated.len(), 1);
        assert_eq!(pool.ipam_spec().ranges[0].subnet, "192.168.0.0/24");
    }

    #[test]
    fn crds_carry_upstream_names_columns_and_the_status_subresource() {
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
        assert!(
            version
                .subresources
                .as_ref()
                .is_some_and(|s| s.status.is_some())
        );

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
