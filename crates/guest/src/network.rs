//! The guest's NAD-to-interface mapping: which host interface kube-vip announces a Service's
//! address on. (Which network a LoadBalancer takes its address from, when the Service names none,
//! is the Harvester side's choice: upstream's findNetwork, in the load balancer's admission.)

use std::collections::BTreeMap;

use super::GuestError;

/// The interface kube-vip should use for `network`, from the guest's `harvester-nad-mapping`
/// ConfigMap (`mapping` is its `interface-nad-mapping` value; `None` when the ConfigMap does not
/// exist, in which case the Service passes through).
pub(crate) fn service_interface(
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
