//! Sharing a primary Service's address: naming the primary, refusing chains and port clashes
//! (compared by protocol and port, so TCP/53 and UDP/53 can share; the message names the port only,
//! as upstream's), a network other than the primary's load balancer's, and refusing to delete a
//! primary that secondaries still use.

use k8s_openapi::api::core::v1::Service;

use super::{
    GuestError,
    mapping::{self, service_key},
};
use crate::crd::{LoadBalancer, keys};

/// The primary named by a secondary's annotation: `<ns>/<name>`, or a bare name in the secondary's
/// own namespace (as the documentation shows).
pub(crate) fn primary_ref(
    value: &str,
    secondary_namespace: &str,
) -> Result<(String, String), GuestError> {
    let v = value.trim();
    let (ns, name) = match v.split_once('/') {
        Some((ns, name)) => (ns, name),
        None => (secondary_namespace, v),
    };
    let valid = |s: &str| crate::validation::dns1123_subdomain(s).is_ok();
    if ns.is_empty() || name.is_empty() || !valid(ns) || !valid(name) {
        return Err(GuestError::InvalidPrimaryName(value.to_string()));
    }
    Ok((ns.to_string(), name.to_string()))
}

/// The label value that marks a secondary of `ns/name`: `<ns>.<name>`.
pub(crate) fn primary_label_value(namespace: &str, name: &str) -> String {
    format!("{namespace}.{name}")
}

/// The (protocol, port) pairs a Service exposes; the protocol defaults to TCP.
pub fn ports(svc: &Service) -> Vec<(String, i32)> {
    svc.spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .map(|ps| {
            ps.iter()
                .map(|p| (p.protocol.clone().unwrap_or_else(|| "TCP".into()), p.port))
                .collect()
        })
        .unwrap_or_default()
}

/// Checks that `secondary` may share `primary`'s address, given the other secondaries of that
/// primary, and returns the address.
pub fn check(
    primary: &Service,
    secondary: &Service,
    other_secondaries: &[&Service],
) -> Result<String, GuestError> {
    let p = service_key(primary);
    let is_secondary = primary
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::SVC_PRIMARY))
        .is_some_and(|v| !v.is_empty());
    if is_secondary {
        return Err(GuestError::NotPrimary(p));
    }
    let ip = mapping::ingress_ip(primary).ok_or_else(|| GuestError::PrimaryWithoutIp(p.clone()))?;
    let dual = primary
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|i| i.len() > 1);
    if dual {
        return Err(GuestError::DualStackPrimary {
            primary: p,
            secondary: service_key(secondary),
        });
    }
    let mine = ports(secondary);
    for other in std::iter::once(primary).chain(other_secondaries.iter().copied()) {
        if service_key(other) == service_key(secondary) {
            continue;
        }
        if let Some((_, port)) = ports(other).into_iter().find(|used| mine.contains(used)) {
            return Err(GuestError::PortInUse {
                primary: p.clone(),
                secondary: service_key(secondary),
                port: port.to_string(),
                used_by: service_key(other),
            });
        }
    }
    Ok(ip)
}

/// A secondary's network must be the one its primary's load balancer (`primary_lb`, if it exists)
/// was made on, as upstream's checkNetworkChanged has it: skipped while the secondary names none and
/// the load balancer has one (the secondary gets the primary's).
pub(crate) fn check_network(
    secondary: &Service,
    primary_lb: Option<&LoadBalancer>,
) -> Result<(), GuestError> {
    let Some(lb) = primary_lb else {
        return Ok(());
    };
    let mine = mapping::annotation(secondary, keys::SVC_NETWORK).unwrap_or_default();
    let theirs = lb
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::ANNOTATION_SERVICE_NETWORK))
        .map(String::as_str)
        .unwrap_or_default();
    if mine == theirs || (mine.is_empty() && !theirs.is_empty()) {
        return Ok(());
    }
    Err(GuestError::NetworkChanged {
        service: service_key(secondary),
        lb: format!(
            "{}/{}",
            lb.metadata.namespace.as_deref().unwrap_or_default(),
            lb.metadata.name.as_deref().unwrap_or_default()
        ),
        service_network: mine.into(),
        lb_network: theirs.into(),
    })
}

/// Refuses to delete a primary while secondaries use it.
pub(crate) fn check_primary_deletion(
    primary: &Service,
    secondaries: &[&Service],
) -> Result<(), GuestError> {
    if secondaries.is_empty() {
        return Ok(());
    }
    let mut users: Vec<String> = secondaries.iter().map(|s| service_key(s)).collect();
    users.sort();
    Err(GuestError::PrimaryInUse {
        primary: service_key(primary),
        users,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_svc(
        ns: &str,
        name: &str,
        ports: &[(&str, i32)],
        primary: Option<&str>,
        ip: Option<&str>,
    ) -> Service {
        let mut annotations = serde_json::Map::new();
        if let Some(p) = primary {
            annotations.insert(keys::SVC_PRIMARY.into(), p.into());
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": name, "annotations": annotations},
            "spec": {"type": "LoadBalancer", "ports": ports.iter().map(|(proto, port)| serde_json::json!({"protocol": proto, "port": port})).collect::<Vec<_>>()},
            "status": {"loadBalancer": {"ingress": ip.map(|ip| vec![serde_json::json!({"ip": ip})]).unwrap_or_default()}},
        }))
        .unwrap()
    }

    #[test]
    fn primary_names() {
        assert_eq!(
            primary_ref("ns1/web", "other").unwrap(),
            ("ns1".into(), "web".into())
        );
        assert_eq!(
            primary_ref("web", "ns2").unwrap(),
            ("ns2".into(), "web".into())
        );
        for bad in ["", "/web", "ns1/", "ns1/a/b", "Bad/x"] {
            assert_eq!(
                primary_ref(bad, "ns").unwrap_err().to_string(),
                format!("invalid service name {bad}")
            );
        }
        assert_eq!(primary_label_value("ns1", "web"), "ns1.web");
    }

    #[test]
    fn sharing_rules() {
        let primary = mk_svc("d", "dns", &[("TCP", 53)], None, Some("10.0.0.5"));
        let udp = mk_svc("d", "dns-udp", &[("UDP", 53)], Some("d/dns"), None);
        assert_eq!(
            check(&primary, &udp, &[]).unwrap(),
            "10.0.0.5",
            "same port, other protocol"
        );
        let tcp = mk_svc("d", "dns-tcp", &[("TCP", 53)], Some("d/dns"), None);
        // pkg/cloud-controller-manager/loadbalancer.go (checkPortOverlap): "port %d has been used in
        // service %s/%s", the number alone.
        assert_eq!(
            check(&primary, &tcp, &[]).unwrap_err().to_string(),
            "check port overlap failed, primary service: d/dns, secondary service: d/dns-tcp, error: port 53 has been used in service d/dns"
        );
        let web = mk_svc("d", "web", &[("TCP", 80)], Some("d/dns"), None);
        let web2 = mk_svc("d", "web2", &[("TCP", 80)], Some("d/dns"), None);
        assert!(
            matches!(check(&primary, &web2, &[&web]), Err(GuestError::PortInUse { used_by, .. }) if used_by == "d/web")
        );
        // A secondary re-checked against the list that contains itself does not clash with itself.
        assert!(check(&primary, &web, &[&web]).is_ok());
        assert_eq!(
            check(&web, &web2, &[]).unwrap_err().to_string(),
            "service d/web is not a primary service"
        );
        let no_ip = mk_svc("d", "p", &[("TCP", 1)], None, None);
        assert_eq!(
            check(&no_ip, &web, &[]).unwrap_err().to_string(),
            "primary service d/p has no ingress IP"
        );
        // pkg/cloud-controller-manager/loadbalancer.go (checkNetworkChanged, secondary): against the
        // primary's load balancer's lb-network annotation, with the load balancer in the message.
        let mk_lb = |network: &str| -> LoadBalancer {
            serde_json::from_value(serde_json::json!({
                "metadata": {"namespace": "gc-ns", "name": "gc1-d-dns-12345678",
                    "annotations": {keys::ANNOTATION_SERVICE_NETWORK: network}},
                "spec": {},
            }))
            .unwrap()
        };
        assert!(
            check_network(&web, None).is_ok(),
            "no load balancer: skipped"
        );
        assert!(
            check_network(&web, Some(&mk_lb("default/vlan1"))).is_ok(),
            "none named: skipped"
        );
        assert!(check_network(&web, Some(&mk_lb(""))).is_ok());
        let mut vlan = web.clone();
        vlan.metadata
            .annotations
            .get_or_insert_default()
            .insert(keys::SVC_NETWORK.into(), "default/vlan1".into());
        assert!(check_network(&vlan, Some(&mk_lb("default/vlan1"))).is_ok());
        assert_eq!(
            check_network(&vlan, Some(&mk_lb("")))
                .unwrap_err()
                .to_string(),
            "network annotation of service d/web is not same as the load balancer gc-ns/gc1-d-dns-12345678, service: 'default/vlan1', lb: ''"
        );
        assert_eq!(
            check_network(&vlan, Some(&mk_lb("default/vlan2")))
                .unwrap_err()
                .to_string(),
            "network annotation of service d/web is not same as the load balancer gc-ns/gc1-d-dns-12345678, service: 'default/vlan1', lb: 'default/vlan2'"
        );
        assert!(check_primary_deletion(&primary, &[]).is_ok());
        assert_eq!(
            check_primary_deletion(&primary, &[&web, &udp])
                .unwrap_err()
                .to_string(),
            "could not delete load balancer for service d/dns: service d/dns is still used by other services [d/dns-udp d/web]"
        );
    }
}
