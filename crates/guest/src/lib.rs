//! Guest-cluster load balancing, the Harvester Cloud Provider's side: how a guest `Service` of type
//! LoadBalancer maps to a Harvester LoadBalancer (naming, annotations, labels, IPAM mode, network),
//! how a secondary service shares a primary's address, and what is written back to the Service.
//!
//! [`nad`] keeps the guest's NAD mapping ConfigMap from the cluster's VMIs on Harvester (the
//! reconciler runs it alongside).
//!
//! `mapping`, `naming`, `network`, `share`, [`dhcp`], [`decide`] and [`index`] are pure domain code: callers
//! bring the objects and apply the plans. [`reconcile`] is the reconciler that applies them between
//! a guest cluster's store port and Harvester's (its steps only: the decisions are [`decide`]'s,
//! which [`admit`] shares to refuse up front what the reconciler would refuse of a Service written
//! over HTTP); [`clusters`] keeps the guest clusters of the embedded backend (and shows
//! each as its own store port); `harvester-cloud ccm` (the binary's `cli::ccm`) runs the
//! reconciler inside a guest cluster.
#![forbid(unsafe_code)]

// The crates below this one, under the names the modules use.
use harvester_cloud_api as crd;
use harvester_cloud_controller as controller;
use harvester_cloud_ipam as ipam;
use harvester_cloud_metrics as metrics;
use harvester_cloud_store as store;
use harvester_cloud_store::sync;
use harvester_cloud_store::validation;

pub mod admit;
pub mod clusters;
pub mod decide;
pub mod dhcp;
pub mod index;
pub mod mapping;
pub mod nad;
pub mod naming;
pub mod network;
pub mod reconcile;
pub mod share;
pub mod sharing;

/// Why a guest Service cannot be served. Messages keep the upstream cloud provider's wording.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum GuestError {
    #[error(
        "network annotation of service {service} is not same as the load balancer {lb}, service: '{service_network}', lb: '{lb_network}'"
    )]
    NetworkChanged {
        service: String,
        lb: String,
        service_network: String,
        lb_network: String,
    },
    #[error(
        "ipam annotation of service {service} is not same as the load balancer {lb}, service: '{service_ipam}', lb: '{lb_ipam}'; the IPAM mode of a load balancer cannot change: create a new service instead"
    )]
    IpamChanged {
        service: String,
        lb: String,
        service_ipam: String,
        lb_ipam: String,
    },
    /// Ours: the IPAM annotation names no mode. Upstream copies it into the LoadBalancer, whose
    /// CRD schema refuses it; said here, before any LoadBalancer is written.
    #[error(
        "service {service}: annotation cloudprovider.harvesterhci.io/ipam is {value}: supported values: \"pool\", \"dhcp\""
    )]
    InvalidIpam {
        service: String,
        /// Quoted (Go's `%q`), so a value with markup or control characters reads as one.
        value: String,
    },
    #[error("there is no common NAD mapping: kube-system/harvester-nad-mapping is empty")]
    NadMappingEmpty,
    #[error("network {network} not found in NAD mapping for service {service}")]
    NetworkNotInNadMapping { network: String, service: String },
    #[error("invalid service name {0}")]
    InvalidPrimaryName(String),
    #[error("service {0} is not a primary service")]
    NotPrimary(String),
    #[error("primary service {0} has no ingress IP")]
    PrimaryWithoutIp(String),
    /// Upstream's wording of its Service cache's NotFound: `get service <ns>/<name> failed:
    /// service "<name>" not found`.
    #[error("get service {namespace}/{name} failed: service \"{name}\" not found")]
    PrimaryNotFound { namespace: String, name: String },
    #[error(
        "check port overlap failed, primary service: {primary}, secondary service: {secondary}, error: port {port} has been used in service {used_by}"
    )]
    PortInUse {
        primary: String,
        secondary: String,
        port: String,
        used_by: String,
    },
    #[error("could not delete load balancer for service {primary}: service {primary} is still used by other services [{}]", users.join(" "))]
    PrimaryInUse { primary: String, users: Vec<String> },
    /// Ours: the addresses or families a Service asks for cannot be served as asked.
    #[error("service {service}: {reason}")]
    AddressRequest { service: String, reason: String },
    /// Ours: a Service's sharing key annotations (ours and the aliases) name different keys.
    #[error("service {service}: the sharing key annotations disagree: {values}")]
    SharingKeysDisagree { service: String, values: String },
    /// Ours: a Service names a primary and a sharing key.
    #[error(
        "service {service}: annotations cloudprovider.harvesterhci.io/primary-service and {key_annotation} are both set: a service shares an address either with a primary service or by a sharing key, not both"
    )]
    PrimaryAndSharingKey {
        service: String,
        key_annotation: String,
    },
    /// Ours: a Service that cannot be a member of a sharing group at all (`reason` says why).
    #[error("service {service} cannot share an address by sharing key {key}: {reason}")]
    NotShareable {
        service: String,
        /// Quoted (Go's `%q`).
        key: String,
        reason: String,
    },
    /// Ours: a Service's (protocol, port)s clash with those the group's members hold.
    #[error("service {service} cannot share the address of sharing key {key}: {clashes}")]
    SharingPortsClash {
        service: String,
        key: String,
        /// `TCP/80 is held by service <ns>/<name>`, joined by `; `.
        clashes: String,
        /// The holders, `<ns>/<name>`, sorted.
        holders: Vec<String>,
    },
    /// Ours: a Service asks for something of the group's address (its IPAM mode, network, the
    /// address itself or its family) that a member admitted before it asks otherwise.
    #[error("service {service} cannot share the address of sharing key {key}: {disagreement}")]
    SharingTermsDisagree {
        service: String,
        key: String,
        /// `its <what> is <mine>, and service <holder>'s is <theirs>`.
        disagreement: String,
        /// The member whose terms it disagrees with, `<ns>/<name>`.
        holder: String,
    },
    /// Ours: a Service asks for an address other than the one its group holds.
    #[error(
        "service {service} cannot share the address of sharing key {key}: it asks for {requested}, and the group's load balancer {lb} holds {address}"
    )]
    SharingAddressDisagrees {
        service: String,
        key: String,
        requested: String,
        address: String,
        lb: String,
    },
    /// Ours: a secondary names a primary that shares its address by a sharing key.
    #[error(
        "service {primary} shares an address by sharing key {key} and cannot be a primary service: give service {secondary} the sharing key instead"
    )]
    PrimarySharesByKey {
        primary: String,
        secondary: String,
        key: String,
    },
    /// Ours: a DHCP Service's lease annotation (kube-vip's) that kube-vip could not lease with.
    #[error("service {service}: {detail}")]
    DhcpAnnotation { service: String, detail: String },
    /// Ours: a dual-stack primary's two addresses are not shared.
    #[error(
        "primary service {primary} is dual-stack; sharing its addresses is not supported: give service {secondary} its own load balancer"
    )]
    DualStackPrimary { primary: String, secondary: String },
}
