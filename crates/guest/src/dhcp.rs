//! Stable DHCP leases for a guest Service: which MAC address, leased address and host name its
//! kube-vip leases with, and what is written back onto the Service so that kube-vip asks for the
//! same lease again after the Service was recreated, lost its annotations or moved to another node.
//!
//! kube-vip reads `kube-vip.io/hwaddr`, `kube-vip.io/requestedIP` and
//! `kube-vip.io/loadbalancerHostname` when it starts serving a DHCP Service, and writes the first two
//! once it has a lease (see the manual's "Stable DHCP leases"). The record on the LoadBalancer
//! (`cloudprovider.harvesterhci.io/dhcp…`, [`crate::crd::dhcp`]) is kept from them; for each part
//! the Service's own value wins, then the LoadBalancer's record, then one carried over from the
//! LoadBalancer of a deleted Service of the same name; a Service with no MAC address anywhere gets
//! one made from its identity ([`generated_mac`]), so its lease is stable from the first one.

use k8s_openapi::api::core::v1::Service;
use sha2::{Digest, Sha256};

use super::GuestError;
use crate::crd::{
    dhcp::{self as record, DhcpRecord},
    keys,
};

// This module is below `mapping` and `decide` (the plan calls it), so it reads and writes the
// Service's annotations itself.
fn annotation<'a>(svc: &'a Service, key: &str) -> Option<&'a str> {
    svc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn set_annotation(svc: &mut Service, key: &str, value: &str) -> bool {
    let a = svc.metadata.annotations.get_or_insert_default();
    if a.get(key).map(String::as_str) == Some(value) {
        return false;
    }
    a.insert(key.into(), value.into());
    true
}

fn service_key(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or_default(),
        svc.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The MAC address a Service gets when none is named or recorded: locally administered, unicast,
/// and the same whenever guest cluster `identity` has Service `namespace/name`, so a Service
/// recreated under its name leases with it again even without a record (and two Services, or two
/// guest clusters, do not share one: 46 bits of a SHA-256).
pub fn generated_mac(identity: &str, namespace: &str, name: &str) -> String {
    let digest = Sha256::digest(format!("{identity}/{namespace}/{name}").as_bytes());
    let mut b = [0u8; 6];
    b.copy_from_slice(&digest[..6]);
    // Locally administered (bit 1 set), unicast (bit 0 clear): no vendor's, and never multicast.
    b[0] = (b[0] | 0x02) & 0xfe;
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// What a DHCP Service says of its lease: each annotation kube-vip reads, checked; `hostname` is
/// `Some(None)` when the Service says "no host name" (an empty value), `None` when it says nothing.
struct Asked {
    mac: Option<String>,
    leased: Option<String>,
    hostname: Option<Option<String>>,
}

fn asked(svc: &Service) -> Result<Asked, GuestError> {
    let refuse = |key: &str, value: &str, reason: String| GuestError::DhcpAnnotation {
        service: service_key(svc),
        detail: record::refusal(key, value, &reason),
    };
    let given = |key: &str| annotation(svc, key).filter(|v| !v.is_empty());
    let mac = match given(keys::KUBE_VIP_HWADDR) {
        Some(v) => Some(record::parse_mac(v).map_err(|e| refuse(keys::KUBE_VIP_HWADDR, v, e))?),
        None => None,
    };
    let leased = match given(keys::KUBE_VIP_REQUESTED_IP) {
        Some(v) => {
            Some(record::parse_leased(v).map_err(|e| refuse(keys::KUBE_VIP_REQUESTED_IP, v, e))?)
        }
        None => None,
    };
    let hostname = match annotation(svc, keys::KUBE_VIP_HOSTNAME) {
        None => None,
        Some("") => Some(None),
        Some(v) => {
            record::check_hostname(v).map_err(|e| refuse(keys::KUBE_VIP_HOSTNAME, v, e))?;
            Some(Some(v.to_string()))
        }
    };
    Ok(Asked {
        mac,
        leased,
        hostname,
    })
}

/// The record of a DHCP Service's LoadBalancer: what the Service says, else what the LoadBalancer
/// recorded (`existing`), else what a deleted Service of the same name left (`carried`); the MAC
/// address, else [`generated_mac`] of `identity`. Refuses a Service whose annotations kube-vip
/// could not lease with (nothing of them is recorded then).
pub(crate) fn plan(
    svc: &Service,
    identity: &str,
    existing: Option<&DhcpRecord>,
    carried: Option<&DhcpRecord>,
) -> Result<DhcpRecord, GuestError> {
    let asked = asked(svc)?;
    let kept = |part: fn(&DhcpRecord) -> &Option<String>| {
        existing
            .and_then(|r| part(r).clone())
            .or_else(|| carried.and_then(|r| part(r).clone()))
    };
    let mac = asked.mac.or_else(|| kept(|r| &r.mac)).unwrap_or_else(|| {
        generated_mac(
            identity,
            svc.metadata.namespace.as_deref().unwrap_or_default(),
            svc.metadata.name.as_deref().unwrap_or_default(),
        )
    });
    Ok(DhcpRecord {
        mac: Some(mac),
        leased: asked.leased.or_else(|| kept(|r| &r.leased)),
        hostname: match asked.hostname {
            Some(said) => said,
            None => kept(|r| &r.hostname),
        },
    })
}

/// Writes onto the Service each part of `record` it lacks (an empty `kube-vip.io/hwaddr` or
/// `kube-vip.io/requestedIP`, as kube-vip treats them, counts as lacking; an empty host name is the
/// Service's own "none" and stays); a value the Service has is its own and stays as it is. Says
/// whether anything changed.
pub(crate) fn write_back(svc: &mut Service, record: &DhcpRecord) -> bool {
    let mut changed = false;
    for (key, value, empty_is_none) in [
        (keys::KUBE_VIP_HWADDR, &record.mac, false),
        (keys::KUBE_VIP_REQUESTED_IP, &record.leased, false),
        (keys::KUBE_VIP_HOSTNAME, &record.hostname, true),
    ] {
        let current = annotation(svc, key);
        let lacking = match current {
            None => true,
            Some("") => !empty_is_none,
            Some(_) => false,
        };
        if let (true, Some(v)) = (lacking, value) {
            changed |= set_annotation(svc, key, v);
        }
    }
    changed
}

/// Whether a LoadBalancer's record says more than a recreated Service would get anyway (its
/// [`generated_mac`] alone): a lease, a host name, or a MAC address of its own. Only then is the
/// LoadBalancer of a deleted Service kept for a while.
pub(crate) fn worth_keeping(
    record: &DhcpRecord,
    identity: &str,
    namespace: &str,
    name: &str,
) -> bool {
    record.leased.is_some()
        || record.hostname.is_some()
        || record
            .mac
            .as_deref()
            .is_some_and(|m| m != generated_mac(identity, namespace, name))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn mk_svc(annotations: &[(&str, &str)]) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "default", "name": "web", "uid": "u1",
                "annotations": annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()},
            "spec": {"type": "LoadBalancer"},
        }))
        .expect("service")
    }

    fn mk_record(mac: &str, leased: Option<&str>, hostname: Option<&str>) -> DhcpRecord {
        DhcpRecord {
            mac: Some(mac.into()),
            leased: leased.map(String::from),
            hostname: hostname.map(String::from),
        }
    }

    #[test]
    fn generated_macs_are_stable_unicast_and_local() {
        let a = generated_mac("cluster-uid", "default", "web");
        assert_eq!(a, generated_mac("cluster-uid", "default", "web"));
        assert_eq!(record::parse_mac(&a).as_deref(), Ok(a.as_str()));
        let first = u8::from_str_radix(&a[..2], 16).expect("hex");
        assert_eq!(first & 0x03, 0x02, "locally administered unicast: {a}");
        assert_ne!(a, generated_mac("cluster-uid", "default", "api"));
        assert_ne!(a, generated_mac("other-cluster", "default", "web"));
        assert_ne!(a, generated_mac("cluster-uid", "other", "web"));
        // Known answers: a change of the derivation would move every Service's lease, so it is
        // pinned (the second is the manual's example).
        assert_eq!(
            generated_mac("cluster-uid", "default", "web"),
            "ae:ad:82:c3:f3:66"
        );
        assert_eq!(
            generated_mac("embedded:default/my-cluster", "default", "leased"),
            "ba:17:9d:69:f2:36"
        );
    }

    #[test]
    fn the_service_wins_then_the_record_then_the_carried_one_then_the_generated_mac() {
        let generated = generated_mac("id", "default", "web");
        let bare = mk_svc(&[]);
        assert_eq!(
            plan(&bare, "id", None, None),
            Ok(mk_record(&generated, None, None))
        );
        let existing = mk_record("02:00:00:00:00:01", Some("10.0.0.5"), Some("web-lb"));
        let carried = mk_record("02:00:00:00:00:02", Some("10.0.0.6"), Some("old-lb"));
        assert_eq!(
            plan(&bare, "id", Some(&existing), Some(&carried)),
            Ok(existing.clone())
        );
        assert_eq!(plan(&bare, "id", None, Some(&carried)), Ok(carried.clone()));
        // As kube-vip writes them (v1.2.3: an upper-case generated MAC is written back lower case).
        let leased = mk_svc(&[
            (keys::KUBE_VIP_HWADDR, "00:00:6C:AA:BB:CC"),
            (keys::KUBE_VIP_REQUESTED_IP, "10.0.0.9"),
        ]);
        assert_eq!(
            plan(&leased, "id", Some(&existing), None),
            Ok(mk_record(
                "00:00:6c:aa:bb:cc",
                Some("10.0.0.9"),
                Some("web-lb")
            ))
        );
        // An empty host name is the Service's "none"; empty kube-vip values are no values.
        let cleared = mk_svc(&[(keys::KUBE_VIP_HOSTNAME, ""), (keys::KUBE_VIP_HWADDR, "")]);
        assert_eq!(
            plan(&cleared, "id", Some(&existing), None),
            Ok(mk_record("02:00:00:00:00:01", Some("10.0.0.5"), None))
        );
    }

    #[test]
    fn what_kube_vip_could_not_lease_with_is_refused_and_not_recorded() {
        for (key, value, reason) in [
            (
                keys::KUBE_VIP_HWADDR,
                "ff:ff:ff:ff:ff:ff",
                "the broadcast MAC address; the lease needs a unicast address",
            ),
            (
                keys::KUBE_VIP_REQUESTED_IP,
                "10.0.0.1,10.0.0.2",
                "two addresses of one family (10.0.0.1 and 10.0.0.2); a lease has one per family",
            ),
        ] {
            let svc = mk_svc(&[(key, value)]);
            assert_eq!(
                plan(&svc, "id", None, None)
                    .expect_err("refused")
                    .to_string(),
                format!("service default/web: annotation {key} is \"{value}\": {reason}")
            );
        }
        let svc = mk_svc(&[(keys::KUBE_VIP_HOSTNAME, "web.example.com")]);
        assert!(matches!(
            plan(&svc, "id", None, None),
            Err(GuestError::DhcpAnnotation { .. })
        ));
    }

    #[test]
    fn only_what_the_service_lacks_is_written_back() {
        let record = mk_record("02:00:00:00:00:01", Some("10.0.0.5"), Some("web-lb"));
        let mut svc = mk_svc(&[(keys::KUBE_VIP_HWADDR, "00:00:6c:aa:bb:cc")]);
        assert!(write_back(&mut svc, &record));
        assert_eq!(
            annotation(&svc, keys::KUBE_VIP_HWADDR),
            Some("00:00:6c:aa:bb:cc")
        );
        assert_eq!(
            annotation(&svc, keys::KUBE_VIP_REQUESTED_IP),
            Some("10.0.0.5")
        );
        assert_eq!(annotation(&svc, keys::KUBE_VIP_HOSTNAME), Some("web-lb"));
        assert!(!write_back(&mut svc, &record));
        let mut none = mk_svc(&[(keys::KUBE_VIP_HOSTNAME, ""), (keys::KUBE_VIP_HWADDR, "")]);
        assert!(write_back(&mut none, &record));
        assert_eq!(annotation(&none, keys::KUBE_VIP_HOSTNAME), Some(""));
        assert_eq!(
            annotation(&none, keys::KUBE_VIP_HWADDR),
            Some("02:00:00:00:00:01")
        );
    }

    #[test]
    fn a_record_is_worth_keeping_when_a_recreated_service_would_not_get_it_anyway() {
        let generated = generated_mac("id", "default", "web");
        assert!(!worth_keeping(
            &mk_record(&generated, None, None),
            "id",
            "default",
            "web"
        ));
        assert!(worth_keeping(
            &mk_record(&generated, Some("10.0.0.5"), None),
            "id",
            "default",
            "web"
        ));
        assert!(worth_keeping(
            &mk_record(&generated, None, Some("web-lb")),
            "id",
            "default",
            "web"
        ));
        assert!(worth_keeping(
            &mk_record("00:00:6c:aa:bb:cc", None, None),
            "id",
            "default",
            "web"
        ));
        assert!(!worth_keeping(
            &DhcpRecord::default(),
            "id",
            "default",
            "web"
        ));
    }
}
