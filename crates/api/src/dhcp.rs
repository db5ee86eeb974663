//! The DHCP lease record of a guest Service's LoadBalancer: the MAC address the guest's kube-vip
//! leases with, the address(es) it leased and the host name it sends, as kube-vip writes and reads
//! them on the Service (`kube-vip.io/hwaddr`, `kube-vip.io/requestedIP`,
//! `kube-vip.io/loadbalancerHostname`) and as the cloud provider records them on the LoadBalancer
//! (`cloudprovider.harvesterhci.io/dhcp…`). The checks here are the one judgement of both sides:
//! the guest reconciler refuses a Service whose values kube-vip could not lease with, and
//! Harvester's LoadBalancer admission refuses a record that would be written back as such.

use std::{collections::BTreeMap, net::IpAddr};

use crate::{
    keys::{
        ANNOTATION_DHCP_HOSTNAME, ANNOTATION_DHCP_LEASED_IP, ANNOTATION_DHCP_MAC,
        ANNOTATION_DHCP_RETAINED_UNTIL,
    },
    store::validation::{dns1123_label, go_quote},
};

/// A MAC address kube-vip can give the macvlan interface it leases on, in the form kube-vip writes
/// (Go's `net.HardwareAddr.String()`: six lowercase hex pairs joined by `:`).
///
/// Read as Go's `net.ParseMAC` reads the 48-bit forms kube-vip accepts (`00:00:5e:00:53:01`,
/// `00-00-5E-00-53-01`, `0000.5e00.5301`); the 64- and 160-bit forms `net.ParseMAC` also takes are
/// no Ethernet address, and a multicast (broadcast included) or all-zero address is refused: the
/// kernel gives no macvlan such an address, so kube-vip would never get a lease.
pub fn parse_mac(value: &str) -> Result<String, String> {
    let malformed = || {
        "not a MAC address: six hex pairs, as in 02:00:5e:10:00:01 (or 02-00-5E-10-00-01, 0200.5e10.0001)"
            .to_string()
    };
    let b = value.as_bytes();
    // Groups of two hex digits joined by `:` or `-`, or of four joined by `.`; one separator
    // throughout (another leaves a longer group).
    let (sep, width) = match (b.get(2), b.get(4)) {
        (Some(&sep @ (b':' | b'-')), _) => (sep, 2),
        (_, Some(b'.')) => (b'.', 4),
        _ => return Err(malformed()),
    };
    let mut bytes = Vec::new();
    for group in b.split(|c| *c == sep) {
        if group.len() != width {
            return Err(malformed());
        }
        for pair in group.chunks(2) {
            // Hex digits only (`from_str_radix` alone would take a sign).
            let byte = std::str::from_utf8(pair)
                .ok()
                .filter(|p| p.bytes().all(|c| c.is_ascii_hexdigit()))
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(malformed)?;
            bytes.push(byte);
        }
    }
    match bytes.as_slice() {
        b if b.len() == 8 || b.len() == 20 => Err(format!(
            "a {}-bit hardware address; kube-vip's macvlan interface takes a 48-bit Ethernet address",
            b.len() * 8
        )),
        b if b.len() != 6 => Err(malformed()),
        b if b.iter().all(|x| *x == 0) => {
            Err("the all-zero MAC address; the lease needs a unicast address".to_string())
        }
        b if b.iter().all(|x| *x == 0xff) => {
            Err("the broadcast MAC address; the lease needs a unicast address".to_string())
        }
        b if b[0] & 1 == 1 => Err(format!(
            "a multicast MAC address (the low bit of the first octet, {:02x}, is set); the lease needs a unicast address",
            b[0]
        )),
        b => Ok(b
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect::<Vec<_>>()
            .join(":")),
    }
}

/// The address(es) a lease gave, as kube-vip writes `kube-vip.io/requestedIP` (v1.0.3 and later:
/// `<IPv4>`, `<IPv6>` or `<IPv4>,<IPv6>`; earlier versions one address): at most one per family,
/// neither unspecified nor multicast (`0.0.0.0` is the DHCP mark, never a lease). Returned in
/// kube-vip's order, IPv4 first, each in its canonical form.
pub fn parse_leased(value: &str) -> Result<String, String> {
    let parts: Vec<&str> = value.split(',').map(str::trim).collect();
    if parts.len() > 2 {
        return Err("more than two addresses; a lease has one IPv4 and one IPv6 at most".into());
    }
    let mut v4 = None;
    let mut v6 = None;
    for part in parts {
        let ip = part
            .parse::<IpAddr>()
            .map_err(|_| format!("{} is not an IP address", go_quote(part)))?
            .to_canonical();
        if ip.is_unspecified() || ip.is_multicast() {
            return Err(format!("{ip} is not an address a DHCP server leases"));
        }
        let slot = if ip.is_ipv4() { &mut v4 } else { &mut v6 };
        if let Some(other) = slot.replace(ip) {
            return Err(format!(
                "two addresses of one family ({other} and {ip}); a lease has one per family"
            ));
        }
    }
    Ok([v4, v6]
        .into_iter()
        .flatten()
        .map(|ip| ip.to_string())
        .collect::<Vec<_>>()
        .join(","))
}

/// The host name kube-vip sends in its DHCP requests (option 12, and as the client identifier): an
/// RFC 1123 label, so that every DHCP server and DNS zone takes it.
pub fn check_hostname(value: &str) -> Result<(), String> {
    dns1123_label(value)
}

/// A LoadBalancer's DHCP lease record (each part when recorded).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DhcpRecord {
    /// Normalised as kube-vip writes it.
    pub mac: Option<String>,
    /// `<IPv4>`, `<IPv6>` or `<IPv4>,<IPv6>`.
    pub leased: Option<String>,
    pub hostname: Option<String>,
}

impl DhcpRecord {
    pub fn is_empty(&self) -> bool {
        self.mac.is_none() && self.leased.is_none() && self.hostname.is_none()
    }

    /// The record as LoadBalancer annotations.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        [
            (ANNOTATION_DHCP_MAC, &self.mac),
            (ANNOTATION_DHCP_LEASED_IP, &self.leased),
            (ANNOTATION_DHCP_HOSTNAME, &self.hostname),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.clone().map(|v| (k.to_string(), v)))
        .collect()
    }
}

/// Why an annotation of the record is refused: the key, the value (Go-quoted) and the reason.
pub fn refusal(key: &str, value: &str, reason: &str) -> String {
    format!("annotation {key} is {}: {reason}", go_quote(value))
}

/// The record in a LoadBalancer's annotations, each part checked as the guest checks what kube-vip
/// wrote; an empty value is no record. The retention mark must be an RFC 3339 time.
pub fn record_of(annotations: &BTreeMap<String, String>) -> Result<DhcpRecord, String> {
    let get = |k: &str| annotations.get(k).filter(|v| !v.is_empty());
    let mut record = DhcpRecord::default();
    if let Some(v) = get(ANNOTATION_DHCP_MAC) {
        record.mac = Some(parse_mac(v).map_err(|e| refusal(ANNOTATION_DHCP_MAC, v, &e))?);
    }
    if let Some(v) = get(ANNOTATION_DHCP_LEASED_IP) {
        record.leased =
            Some(parse_leased(v).map_err(|e| refusal(ANNOTATION_DHCP_LEASED_IP, v, &e))?);
    }
    if let Some(v) = get(ANNOTATION_DHCP_HOSTNAME) {
        check_hostname(v).map_err(|e| refusal(ANNOTATION_DHCP_HOSTNAME, v, &e))?;
        record.hostname = Some(v.clone());
    }
    if let Some(v) = get(ANNOTATION_DHCP_RETAINED_UNTIL) {
        retained_until(v).map_err(|e| refusal(ANNOTATION_DHCP_RETAINED_UNTIL, v, &e))?;
    }
    Ok(record)
}

/// The time until which a LoadBalancer whose Service is gone is kept for its DHCP record.
pub fn retained_until(value: &str) -> Result<k8s_openapi::jiff::Timestamp, String> {
    value
        .parse::<k8s_openapi::jiff::Timestamp>()
        .map_err(|_| "not an RFC 3339 time, as in 2026-01-02T15:04:05Z".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_read_as_go_reads_them_and_are_written_as_kube_vip_writes_them() {
        for ok in [
            "00:00:6c:12:34:56",
            // kube-vip's own generated prefix, upper case as its GenerateMac formats it.
            "00:00:6C:12:34:56",
            "00-00-6C-12-34-56",
            "0000.6c12.3456",
        ] {
            assert_eq!(parse_mac(ok).as_deref(), Ok("00:00:6c:12:34:56"), "{ok}");
        }
        assert_eq!(
            parse_mac("02:aa:bb:cc:dd:ee").as_deref(),
            Ok("02:aa:bb:cc:dd:ee")
        );
        for malformed in [
            "",
            "00:00:6c:12:34",
            "00:00:6c:12:34:5",
            "00:00:6c:12:34:567",
            "00:00-6c:12:34:56",
            "00:00:6c:12:34:5g",
            "00:00:6c:12:34:+5",
            "0000.6c12.345",
            "00006c123456",
            " 00:00:6c:12:34:56",
        ] {
            assert!(
                parse_mac(malformed)
                    .expect_err(malformed)
                    .starts_with("not a MAC address"),
                "{malformed}"
            );
        }
        assert_eq!(
            parse_mac("00:00:00:00:00:00").expect_err("zero"),
            "the all-zero MAC address; the lease needs a unicast address"
        );
        assert_eq!(
            parse_mac("FF:FF:FF:FF:FF:FF").expect_err("broadcast"),
            "the broadcast MAC address; the lease needs a unicast address"
        );
        assert_eq!(
            parse_mac("01:00:5e:00:00:01").expect_err("multicast"),
            "a multicast MAC address (the low bit of the first octet, 01, is set); the lease needs a unicast address"
        );
        assert_eq!(
            parse_mac("00:00:00:00:fe:80:00:00").expect_err("EUI-64"),
            "a 64-bit hardware address; kube-vip's macvlan interface takes a 48-bit Ethernet address"
        );
    }

    #[test]
    fn leased_addresses_are_kube_vip_s_list() {
        assert_eq!(parse_leased("192.168.1.20").as_deref(), Ok("192.168.1.20"));
        assert_eq!(parse_leased("fd00::20").as_deref(), Ok("fd00::20"));
        // pkg/services/services.go (updateStatus, v1.0.3 and later): IPv4 first, then IPv6.
        assert_eq!(
            parse_leased("fd00::20,192.168.1.20").as_deref(),
            Ok("192.168.1.20,fd00::20")
        );
        assert_eq!(
            parse_leased("192.168.1.20,192.168.1.21").expect_err("two v4"),
            "two addresses of one family (192.168.1.20 and 192.168.1.21); a lease has one per family"
        );
        assert_eq!(
            parse_leased("0.0.0.0").expect_err("the mark"),
            "0.0.0.0 is not an address a DHCP server leases"
        );
        assert_eq!(
            parse_leased("a,b,c").expect_err("three"),
            "more than two addresses; a lease has one IPv4 and one IPv6 at most"
        );
        assert_eq!(
            parse_leased("lease").expect_err("text"),
            "\"lease\" is not an IP address"
        );
        assert!(parse_leased("").is_err());
    }

    #[test]
    fn records_are_read_from_annotations_and_checked() {
        let annotations = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let record = record_of(&annotations(&[
            (ANNOTATION_DHCP_MAC, "02-00-5E-10-00-01"),
            (ANNOTATION_DHCP_LEASED_IP, "192.168.1.20"),
            (ANNOTATION_DHCP_HOSTNAME, "web-lb"),
            (ANNOTATION_DHCP_RETAINED_UNTIL, "2026-01-02T15:04:05Z"),
        ]))
        .expect("valid");
        assert_eq!(
            record,
            DhcpRecord {
                mac: Some("02:00:5e:10:00:01".into()),
                leased: Some("192.168.1.20".into()),
                hostname: Some("web-lb".into()),
            }
        );
        assert_eq!(record.annotations().len(), 3);
        assert!(
            record_of(&annotations(&[(ANNOTATION_DHCP_MAC, "")]))
                .expect("empty is none")
                .is_empty()
        );
        assert_eq!(
            record_of(&annotations(&[(ANNOTATION_DHCP_HOSTNAME, "Web_LB")])).expect_err("label"),
            format!(
                "annotation {ANNOTATION_DHCP_HOSTNAME} is \"Web_LB\": {}",
                dns1123_label("Web_LB").expect_err("not a label")
            )
        );
        assert_eq!(
            record_of(&annotations(&[(ANNOTATION_DHCP_RETAINED_UNTIL, "soon")])).expect_err("time"),
            format!(
                "annotation {ANNOTATION_DHCP_RETAINED_UNTIL} is \"soon\": not an RFC 3339 time, as in 2026-01-02T15:04:05Z"
            )
        );
    }
}
