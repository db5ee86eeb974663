//! Networks: the guest's NAD-to-interface mapping (which host interface kube-vip announces on), and
//! the Harvester side's choice of network for a LoadBalancer whose annotation is empty.

use std::collections::BTreeMap;

use super::{GuestError, keys};

/// The interface kube-vip should use for `network`, from the guest's `harvester-nad-mapping`
/// ConfigMap (`mapping` is its `interface-nad-mapping` value; `None` when the ConfigMap does not
/// exist, in which case the Service passes through).
pub fn service_interface(
    mapping: Option<Option<&str>>,
    network: &str,
    service: &str,
) -> Result<Option<String>, GuestError> {
    if network.is_empty() {
        return Ok(None);
    }
    let Some(mapping) = mapping else {
        return Ok(None);
    };
    let map: BTreeMap<String, String> = mapping
        .filter(|m| !m.trim().is_empty())
        .and_then(|m| serde_json::from_str(m).ok())
        .unwrap_or_default();
    if map.is_empty() {
        return Err(GuestError::NadMappingEmpty);
    }
    map.get(network)
        .cloned()
        .map(Some)
        .ok_or_else(|| GuestError::NetworkNotInNadMapping {
            network: network.into(),
            service: service.into(),
        })
}

/// A VirtualMachineInstance as network resolution sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VmiView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// `spec.networks[].multus.networkName`, in order.
    pub multus_networks: Vec<String>,
}

/// Harvester's `findNetwork` (v1.9): the LoadBalancer's network when its annotation is empty, first
/// found wins. `vmis` are those in the LoadBalancer's namespace.
pub fn find_network(lb_annotations: &BTreeMap<String, String>, vmis: &[VmiView]) -> String {
    let get = |k: &str| lb_annotations.get(k).filter(|v| !v.is_empty()).cloned();
    if let Some(n) = get(keys::LB_NETWORK) {
        return n;
    }
    if let Some(n) = get(keys::LB_MANAGEMENT_NETWORK) {
        return n;
    }
    let Some(cluster) = get(keys::LB_CLUSTER) else {
        return String::new();
    };
    let first_network = |pred: &dyn Fn(&VmiView) -> bool| {
        vmis.iter()
            .filter(|v| pred(v))
            .find_map(|v| v.multus_networks.first().cloned())
    };
    first_network(&|v| v.labels.get(keys::VMI_GUEST_CLUSTER) == Some(&cluster))
        .or_else(|| {
            first_network(&|v| {
                v.labels.get(keys::VMI_CREATOR).map(String::as_str)
                    == Some(keys::DOCKER_MACHINE_DRIVER)
                    && v.name.starts_with(&cluster)
            })
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_vmi(name: &str, labels: &[(&str, &str)], nets: &[&str]) -> VmiView {
        VmiView {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            multus_networks: nets.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn mk_ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn nad_mapping() {
        let m = r#"{"default/mgmt-vlan1":"enp1s0"}"#;
        assert_eq!(
            service_interface(Some(Some(m)), "default/mgmt-vlan1", "d/s").unwrap(),
            Some("enp1s0".into())
        );
        assert_eq!(service_interface(None, "default/x", "d/s").unwrap(), None);
        assert_eq!(service_interface(Some(Some(m)), "", "d/s").unwrap(), None);
        assert_eq!(
            service_interface(Some(Some("{}")), "default/x", "d/s")
                .unwrap_err()
                .to_string(),
            "there is no common NAD mapping: kube-system/harvester-nad-mapping is empty"
        );
        assert_eq!(
            service_interface(Some(None), "default/x", "d/s").unwrap_err(),
            GuestError::NadMappingEmpty
        );
        assert_eq!(
            service_interface(Some(Some(m)), "default/other", "d/s")
                .unwrap_err()
                .to_string(),
            "network default/other not found in NAD mapping for service d/s"
        );
    }

    #[test]
    fn resolution_order() {
        let vmis = [
            mk_vmi(
                "x-legacy-1",
                &[(keys::VMI_CREATOR, keys::DOCKER_MACHINE_DRIVER)],
                &["default/legacy"],
            ),
            mk_vmi(
                "other",
                &[(keys::VMI_GUEST_CLUSTER, "gc2")],
                &["default/gc2-net"],
            ),
            mk_vmi(
                "gc1-pool-a",
                &[(keys::VMI_GUEST_CLUSTER, "gc1")],
                &["default/gc1-net", "default/second"],
            ),
            mk_vmi(
                "gc3-pool",
                &[(keys::VMI_CREATOR, keys::DOCKER_MACHINE_DRIVER)],
                &["default/gc3-legacy"],
            ),
        ];
        let find = |a: &[(&str, &str)]| find_network(&mk_ann(a), &vmis);
        assert_eq!(
            find(&[
                (keys::LB_NETWORK, "default/explicit"),
                (keys::LB_MANAGEMENT_NETWORK, "default/m")
            ]),
            "default/explicit"
        );
        assert_eq!(
            find(&[
                (keys::LB_NETWORK, ""),
                (keys::LB_MANAGEMENT_NETWORK, "default/m")
            ]),
            "default/m"
        );
        assert_eq!(find(&[]), "");
        assert_eq!(find(&[(keys::LB_CLUSTER, "gc1")]), "default/gc1-net");
        assert_eq!(find(&[(keys::LB_CLUSTER, "gc3")]), "default/gc3-legacy");
        assert_eq!(find(&[(keys::LB_CLUSTER, "nobody")]), "");
    }
}
