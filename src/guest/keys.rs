//! Annotation and label keys of the cloud provider, the guest's kube-vip, and the Harvester side.

/// On the guest Service: the IPAM mode (`pool` or `dhcp`).
pub const SVC_IPAM: &str = "cloudprovider.harvesterhci.io/ipam";
/// On the guest Service: the Harvester network (`ns/name` of a NetworkAttachmentDefinition).
pub const SVC_NETWORK: &str = "cloudprovider.harvesterhci.io/network";
pub const SVC_PROJECT: &str = "cloudprovider.harvesterhci.io/project";
pub const SVC_NAMESPACE: &str = "cloudprovider.harvesterhci.io/namespace";
/// On a secondary guest Service (annotation): the primary it shares an address with. As a label,
/// its value is `<ns>.<name>` of the primary.
pub const SVC_PRIMARY: &str = "cloudprovider.harvesterhci.io/primary-service";

pub const KUBE_VIP_IPS: &str = "kube-vip.io/loadbalancerIPs";
pub const KUBE_VIP_INTERFACE: &str = "kube-vip.io/serviceInterface";

/// On the LoadBalancer: the network used for allocation (written on create only).
pub const LB_NETWORK: &str = "loadbalancer.harvesterhci.io/network";
/// On the LoadBalancer: the service's network as first seen, to refuse changes.
pub const LB_SERVICE_NETWORK: &str = "cloudprovider.harvesterhci.io/lb-network";
pub const LB_PROJECT: &str = "loadbalancer.harvesterhci.io/project";
pub const LB_NAMESPACE: &str = "loadbalancer.harvesterhci.io/namespace";
pub const LB_CLUSTER: &str = "loadbalancer.harvesterhci.io/cluster";
pub const LB_MANAGEMENT_NETWORK: &str = "cloudprovider.harvesterhci.io/managementNetwork";
/// On the LoadBalancer (ours, not upstream's): the UID of the Service it serves, so a LoadBalancer
/// whose Service was recreated with a new UID can be garbage-collected instead of leaking.
pub const LB_SERVICE_UID: &str = "cloudprovider.harvesterhci.io/serviceUID";

/// Labels on the LoadBalancer.
pub const LABEL_CLUSTER: &str = "cloudprovider.harvesterhci.io/cluster";
pub const LABEL_SERVICE_NAMESPACE: &str = "cloudprovider.harvesterhci.io/serviceNamespace";
pub const LABEL_SERVICE_NAME: &str = "cloudprovider.harvesterhci.io/serviceName";

/// The guest's NAD-to-interface mapping ConfigMap (`kube-system/harvester-nad-mapping`) and its key.
pub const NAD_MAPPING_NAMESPACE: &str = "kube-system";
pub const NAD_MAPPING_NAME: &str = "harvester-nad-mapping";
pub const NAD_MAPPING_KEY: &str = "interface-nad-mapping";

/// VMI labels used to find a guest cluster's network on the Harvester side.
pub const VMI_GUEST_CLUSTER: &str = "guestcluster.harvesterhci.io/name";
pub const VMI_CREATOR: &str = "harvesterhci.io/creator";
pub const DOCKER_MACHINE_DRIVER: &str = "docker-machine-driver-harvester";

/// DHCP load balancers report this address; the guest's kube-vip obtains the lease.
pub const DHCP_ADDRESS: &str = "0.0.0.0";
