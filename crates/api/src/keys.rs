//! Harvester's annotation and label keys, each string defined once: those of LoadBalancers and
//! IPPools, those the guest cloud provider reads and writes on guest Services (and for the guest's
//! kube-vip), and those other Harvester components put on VMs, VMIs and VM networks.

// --- On LoadBalancers ----------------------------------------------------------------------------

/// The VM network addresses come from (`namespace/name`); pool selection reads it, the mutator
/// fills it (findNetwork), the cloud provider writes it on create only.
pub const ANNOTATION_NETWORK: &str = "loadbalancer.harvesterhci.io/network";
pub const ANNOTATION_PROJECT: &str = "loadbalancer.harvesterhci.io/project";
pub const ANNOTATION_NAMESPACE: &str = "loadbalancer.harvesterhci.io/namespace";
pub const ANNOTATION_CLUSTER: &str = "loadbalancer.harvesterhci.io/cluster";
/// Ours, not upstream's: the one address a LoadBalancer asks for. It is given when it lies in a pool
/// that selection allows for the LoadBalancer and is free; otherwise the LoadBalancer is not Ready
/// and gets nothing else. The guest cloud provider writes it from a Service's `spec.loadBalancerIP`
/// or a user's `kube-vip.io/loadbalancerIPs`. Upstream's controller ignores it.
pub const ANNOTATION_REQUESTED_IP: &str = "loadbalancer.harvesterhci.io/requestedIP";
/// Ours, not upstream's: the address family a LoadBalancer's address comes from, `IPv4` or `IPv6`
/// (the guest cloud provider writes it on the LoadBalancers of a dual-stack Service, one per
/// family): only pools with ranges of that family are considered.
pub const ANNOTATION_IP_FAMILY: &str = "loadbalancer.harvesterhci.io/ipFamily";
/// Ours, not upstream's: a LoadBalancer status condition whose `lastTransitionTime` is when its
/// current address was allocated (message `<ip> from IP pool <pool>`). Upstream's controller only
/// reads the `Ready` condition.
pub const CONDITION_ADDRESS_ALLOCATED: &str = "AddressAllocated";
/// Written by the guest cloud provider: the guest cluster's management network.
pub const ANNOTATION_MANAGEMENT_NETWORK: &str = "cloudprovider.harvesterhci.io/managementNetwork";
/// The guest Service's network as first seen, so that a later change is refused.
pub const ANNOTATION_SERVICE_NETWORK: &str = "cloudprovider.harvesterhci.io/lb-network";
/// Ours, not upstream's: the UID of the guest Service a LoadBalancer serves, so that one whose
/// Service was recreated (a new UID) is garbage-collected instead of leaking.
pub const ANNOTATION_SERVICE_UID: &str = "cloudprovider.harvesterhci.io/serviceUID";
/// Ours, not upstream's: the labels of the guest Service a LoadBalancer serves, as a JSON object
/// (`{"app":"web"}`), written by the guest cloud provider on every sync, so that pools' service
/// selectors ([`SERVICE_SELECTOR`]) can match them. An annotation rather than a copy of the labels:
/// a Service's label keys would collide with Harvester's own on the LoadBalancer. Upstream's
/// controller ignores it.
pub const ANNOTATION_SERVICE_LABELS: &str = "cloudprovider.harvesterhci.io/serviceLabels";
/// Ours, not upstream's: the identity of the guest cluster that made a LoadBalancer (the UID of
/// its `kube-system` Namespace), so that two guest clusters sharing a name and a Harvester
/// namespace never collect each other's.
pub const ANNOTATION_GUEST_CLUSTER_ID: &str = "cloudprovider.harvesterhci.io/clusterID";

/// Ours, not upstream's: on the LoadBalancer a guest cluster's sharing group holds its address with
/// (made by the cloud provider, one per guest cluster, namespace and key), the sharing key of its
/// members. Such a LoadBalancer belongs to no one Service: its `serviceName` label is absent and its
/// listeners are its members' ports (named `<service>-<protocol>-<port>`, the port's holder).
pub const ANNOTATION_SHARING_GROUP: &str = "cloudprovider.harvesterhci.io/sharing-group";
/// Ours, not upstream's: a LoadBalancer's sharing key on Harvester. LoadBalancers of one namespace
/// with the same key share one pool address when their listeners' (protocol, port)s do not clash;
/// MetalLB's and Cilium's key annotations are accepted as aliases. Upstream's controller ignores it.
pub const ANNOTATION_SHARING_KEY: &str = "loadbalancer.harvesterhci.io/sharing-key";
/// Ours, not upstream's: the DHCP lease record of a guest Service's LoadBalancer (`spec.ipam:
/// dhcp`), kept by the guest cloud provider from what the guest's kube-vip wrote on the Service
/// ([`KUBE_VIP_HWADDR`], [`KUBE_VIP_REQUESTED_IP`]) and what the Service asks for
/// ([`KUBE_VIP_HOSTNAME`]), and written back onto a Service that lacks them (recreated, or its
/// annotations lost) so that kube-vip leases the same address again. The MAC address of the lease,
/// as kube-vip writes it (`00:00:6c:12:34:56`). Upstream's controllers ignore all four.
pub const ANNOTATION_DHCP_MAC: &str = "cloudprovider.harvesterhci.io/dhcpMACAddress";
/// The address(es) kube-vip leased: `<IPv4>`, `<IPv6>` or `<IPv4>,<IPv6>`.
pub const ANNOTATION_DHCP_LEASED_IP: &str = "cloudprovider.harvesterhci.io/dhcpLeasedIP";
/// The host name kube-vip sends with its DHCP requests.
pub const ANNOTATION_DHCP_HOSTNAME: &str = "cloudprovider.harvesterhci.io/dhcpHostname";
/// Set on a LoadBalancer whose Service was deleted, while its record waits for a Service
/// recreated under the same name (RFC 3339): the guest cloud provider deletes it at that time, or
/// once such a Service took the record.
pub const ANNOTATION_DHCP_RETAINED_UNTIL: &str = "cloudprovider.harvesterhci.io/dhcpRetainedUntil";

/// Ours, not upstream's: the HTTP(S) health check of a VM load balancer, an annotation because
/// Harvester's CRD (the one its chart installs, which Helm never upgrades) prunes any field of
/// `spec.healthCheck` it does not know, while annotations survive every schema and upstream's
/// controller ignores them. The path (`/healthz`) turns the TCP probe of `spec.healthCheck.port`
/// into an HTTP GET of it.
pub const ANNOTATION_HEALTH_CHECK_HTTP_PATH: &str =
    "loadbalancer.harvesterhci.io/healthCheckHTTPPath";
/// `HTTP` (the default) or `HTTPS` (the certificate is not verified, as the kubelet's probes do).
pub const ANNOTATION_HEALTH_CHECK_HTTP_SCHEME: &str =
    "loadbalancer.harvesterhci.io/healthCheckHTTPScheme";
/// The answers that count as healthy: codes and ranges, `200-399` (the default) or `200,204`.
pub const ANNOTATION_HEALTH_CHECK_HTTP_STATUS: &str =
    "loadbalancer.harvesterhci.io/healthCheckHTTPExpectedStatus";

/// A guest cluster's LoadBalancers: the cluster name.
pub const LABEL_GUEST_CLUSTER: &str = "cloudprovider.harvesterhci.io/cluster";
/// A guest cluster's LoadBalancers: the namespace and name of the Service they serve.
pub const LABEL_SERVICE_NAMESPACE: &str = "cloudprovider.harvesterhci.io/serviceNamespace";
pub const LABEL_SERVICE_NAME: &str = "cloudprovider.harvesterhci.io/serviceName";

/// `allocatedAddress.ip` of a DHCP load balancer: the guest's kube-vip obtains the lease.
pub const DHCP_ADDRESS: &str = "0.0.0.0";

// --- On the Services and EndpointSlices of VM load balancers -----------------------------------

/// Marks the Service and EndpointSlice a VM load balancer owns (value `"true"`).
pub const LABEL_SERVICE_LB: &str = "loadbalancer.harvesterhci.io/servicelb";
/// Kubernetes' link from an EndpointSlice to its Service.
pub const LABEL_SERVICE_NAME_K8S: &str = "kubernetes.io/service-name";

// --- On IPPools ----------------------------------------------------------------------------------

/// Set by the mutator: the VLAN ID of the pool's network.
pub const LABEL_VID: &str = "loadbalancer.harvesterhci.io/vid";
/// Set by the mutator: whether the pool's scope is global (`*`/`*`/`*`).
pub const LABEL_GLOBAL_POOL: &str = "loadbalancer.harvesterhci.io/global-ip-pool";
/// The manual release of a leaked address; the IPAM engine parses its value (and names it in its
/// messages), so it is defined there.
pub use crate::ipam::MANUALLY_RELEASE_IP;
/// Ours, not upstream's (upstream's controller ignores it): a label selector
/// (`app=web,tier in (a,b)`) over the Service labels of the load balancers the pool serves
/// ([`crate::ipam::labels`]). Defined in the IPAM engine, which parses it.
pub use crate::ipam::SERVICE_SELECTOR;
/// Ours, not upstream's (upstream's controller ignores it): the addresses of its ranges a pool
/// never hands out, `firstLast` and/or `dot0And255` ([`crate::ipam::skip`]). Defined in the IPAM
/// engine, which parses it and names it in its messages.
pub use crate::ipam::SKIP_ADDRESSES;

// --- On guest Services (the cloud provider's) ----------------------------------------------------

/// The IPAM mode (`pool` or `dhcp`).
pub const SVC_IPAM: &str = "cloudprovider.harvesterhci.io/ipam";
/// The Harvester network (`namespace/name` of a NetworkAttachmentDefinition).
pub const SVC_NETWORK: &str = "cloudprovider.harvesterhci.io/network";
pub const SVC_PROJECT: &str = "cloudprovider.harvesterhci.io/project";
pub const SVC_NAMESPACE: &str = "cloudprovider.harvesterhci.io/namespace";
/// On a secondary Service (annotation): the primary it shares an address with. As a label, its
/// value is `<ns>.<name>` of the primary (empty on a primary).
pub const SVC_PRIMARY: &str = "cloudprovider.harvesterhci.io/primary-service";

/// Ours, not upstream's: a guest Service's sharing key. Services of type LoadBalancer of one
/// namespace with the same key share one address when their (protocol, port)s do not clash, with
/// no primary: the address belongs to a LoadBalancer of the group ([`ANNOTATION_SHARING_GROUP`]) and
/// stays while one of them remains. Upstream's cloud provider ignores it.
pub const SVC_SHARING_KEY: &str = "cloudprovider.harvesterhci.io/sharing-key";
/// MetalLB's sharing key, accepted as an alias of [`SVC_SHARING_KEY`] (on guest Services) and of
/// [`ANNOTATION_SHARING_KEY`] (on LoadBalancers).
pub const METALLB_SHARING_KEY: &str = "metallb.io/allow-shared-ip";
/// MetalLB's sharing key before its API group moved, accepted as the same alias.
pub const METALLB_LEGACY_SHARING_KEY: &str = "metallb.universe.tf/allow-shared-ip";
/// Cilium LB-IPAM's sharing key, accepted as the same alias.
pub const CILIUM_SHARING_KEY: &str = "lbipam.cilium.io/sharing-key";
/// Cilium LB-IPAM's opt-in to sharing across namespaces. Not honoured: a sharing group is the
/// Services (or LoadBalancers) of one namespace; one that sets it is told so in a Warning Event.
pub const CILIUM_SHARING_CROSS_NAMESPACE: &str = "lbipam.cilium.io/sharing-cross-namespace";
/// Ours, not upstream's: written by the cloud provider on a guest Service admitted to a sharing
/// group, the name of the group's LoadBalancer (so that a Service changing or dropping its key
/// leaves its old group, and admitted members keep their ports over newcomers).
pub const SVC_SHARED_LOAD_BALANCER: &str = "cloudprovider.harvesterhci.io/shared-load-balancer";

/// Written for the guest's kube-vip: the address(es) to announce, and the interface.
pub const KUBE_VIP_IPS: &str = "kube-vip.io/loadbalancerIPs";
pub const KUBE_VIP_INTERFACE: &str = "kube-vip.io/serviceInterface";
/// kube-vip's own, on a DHCP Service (`kube-vip.io/loadbalancerIPs: 0.0.0.0`): the MAC address of
/// the macvlan interface it leases on, and the address(es) it leased. kube-vip reads both when it
/// starts serving the Service (a new Service, another node, a restart): the MAC for the interface,
/// the address for an INIT-REBOOT request of that address; and writes both once it has a lease.
pub const KUBE_VIP_HWADDR: &str = "kube-vip.io/hwaddr";
pub const KUBE_VIP_REQUESTED_IP: &str = "kube-vip.io/requestedIP";
/// kube-vip's own (v0.6.4 and later), set by the Service's owner: the host name kube-vip sends
/// with its DHCP requests (option 12, and as the client identifier). kube-vip never writes it.
pub const KUBE_VIP_HOSTNAME: &str = "kube-vip.io/loadbalancerHostname";

/// The guest's NAD-to-interface mapping ConfigMap (`kube-system/harvester-nad-mapping`) and its key.
pub const NAD_MAPPING_NAMESPACE: &str = "kube-system";
pub const NAD_MAPPING_NAME: &str = "harvester-nad-mapping";
pub const NAD_MAPPING_KEY: &str = "interface-nad-mapping";

// --- On VMs, VMIs and VM networks ----------------------------------------------------------------

/// A guest cluster's VMs and VMIs: the cluster name.
pub const LABEL_GUEST_CLUSTER_NAME: &str = "guestcluster.harvesterhci.io/name";
/// VMs made by Rancher's node driver carry [`NODE_DRIVER`] here.
pub const LABEL_CREATOR: &str = "harvesterhci.io/creator";
pub const NODE_DRIVER: &str = "docker-machine-driver-harvester";
/// Set by Rancher's cleanup on the VMs of a guest cluster being removed.
pub const ANNOTATION_REMOVE_ALL_PVCS: &str = "harvesterhci.io/removeAllPersistentVolumeClaims";
/// A NetworkAttachmentDefinition's VLAN ID.
pub const LABEL_VLAN_ID: &str = "network.harvesterhci.io/vlan-id";

/// The label on every object this service makes (its value [`MANAGED_BY`]).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The value of [`MANAGED_BY_LABEL`] on objects this service makes.
pub const MANAGED_BY: &str = "harvester-cloud";
