//! Which addresses the prober connects to: those that can be a VM's.
//!
//! A VMI's addresses are what its guest agent reports (KubeVirt writes them into
//! `status.interfaces`), so a tenant picks them. Probing whatever is reported, and showing what
//! answered in conditions and Events, made the prober a port scanner of the host it runs on and an
//! HTTP-status oracle for its neighbours. So an address no VM can have on a network the load
//! balancer reaches is refused before any connection: loopback (`127.0.0.0/8`, `::1`), link-local
//! (`169.254.0.0/16`, `fe80::/10`: node-local services such as a cloud's metadata endpoint),
//! unspecified and "this network" (`0.0.0.0/8`, `::`), multicast (`224.0.0.0/4`, `ff00::/8`) and
//! the limited broadcast `255.255.255.255`, in any spelling (IPv4-mapped IPv6 such as
//! `::ffff:127.0.0.1` is judged as the IPv4 address it is). kube-apiserver refuses most of these in
//! an EndpointSlice for the same reason (`ValidateEndpointIP`).
//!
//! `--probe-allow-cidr` ([`AddressPolicy::allowing`]) lets an operator probe some of them anyway,
//! e.g. loopback backends in local development; by default all are refused.

use std::net::{IpAddr, Ipv4Addr};

use crate::ipam::{Cidr, addr::key};

/// The kind of address the prober refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Special {
    Loopback,
    LinkLocal,
    Unspecified,
    ThisNetwork,
    Multicast,
    Broadcast,
}

impl Special {
    fn describe(self) -> &'static str {
        match self {
            Special::Loopback => "loopback",
            Special::LinkLocal => "link-local",
            Special::Unspecified => "unspecified",
            Special::ThisNetwork => "in 0.0.0.0/8 (this network)",
            Special::Multicast => "multicast",
            Special::Broadcast => "the broadcast address",
        }
    }
}

/// A target the prober did not connect to, and why; its text is what conditions and Events show.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("address {ip} is {}; not probed", kind.describe())]
pub struct Refused {
    pub ip: IpAddr,
    pub kind: Special,
}

/// What `ip` is, if it is an address the prober refuses by default.
pub(crate) fn classify(ip: IpAddr) -> Option<Special> {
    match ip.to_canonical() {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            if v6.is_loopback() {
                Some(Special::Loopback)
            } else if v6.is_unspecified() {
                Some(Special::Unspecified)
            } else if v6.is_unicast_link_local() {
                Some(Special::LinkLocal)
            } else if first & 0xff00 == 0xff00 {
                Some(Special::Multicast)
            } else {
                None
            }
        }
    }
}

fn classify_v4(v4: Ipv4Addr) -> Option<Special> {
    if v4.is_loopback() {
        Some(Special::Loopback)
    } else if v4.is_unspecified() {
        Some(Special::Unspecified)
    } else if v4.octets()[0] == 0 {
        Some(Special::ThisNetwork)
    } else if v4.is_link_local() {
        Some(Special::LinkLocal)
    } else if v4.is_multicast() {
        Some(Special::Multicast)
    } else if v4.is_broadcast() {
        Some(Special::Broadcast)
    } else {
        None
    }
}

/// Which addresses are probed: every address but the special ones, except those the operator
/// allowed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    allowed: Vec<Cidr>,
}

impl AddressPolicy {
    /// Also probes the special addresses within `allowed` (`--probe-allow-cidr`).
    pub fn allowing(allowed: Vec<Cidr>) -> Self {
        AddressPolicy { allowed }
    }

    /// `Err` when `ip` must not be probed.
    pub fn check(&self, ip: IpAddr) -> Result<(), Refused> {
        let Some(kind) = classify(ip) else {
            return Ok(());
        };
        let k = key(ip.to_canonical());
        if self.allowed.iter().any(|c| c.contains(k)) {
            return Ok(());
        }
        Err(Refused { ip, kind })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_ip(text: &str) -> IpAddr {
        text.parse().expect("an address")
    }

    #[test]
    fn special_addresses_are_classified_in_every_spelling() {
        for (text, kind) in [
            ("127.0.0.1", Special::Loopback),
            ("127.255.0.9", Special::Loopback),
            ("::1", Special::Loopback),
            ("::ffff:127.0.0.1", Special::Loopback),
            ("169.254.169.254", Special::LinkLocal),
            ("::ffff:169.254.1.1", Special::LinkLocal),
            ("fe80::1", Special::LinkLocal),
            ("febf::1", Special::LinkLocal),
            ("0.0.0.0", Special::Unspecified),
            ("::", Special::Unspecified),
            ("::ffff:0.0.0.0", Special::Unspecified),
            ("0.1.2.3", Special::ThisNetwork),
            ("224.0.0.1", Special::Multicast),
            ("239.255.255.250", Special::Multicast),
            ("ff02::1", Special::Multicast),
            ("ff05::2", Special::Multicast),
            ("::ffff:224.0.0.251", Special::Multicast),
            ("255.255.255.255", Special::Broadcast),
            ("::ffff:255.255.255.255", Special::Broadcast),
        ] {
            assert_eq!(classify(mk_ip(text)), Some(kind), "{text}");
        }
    }

    #[test]
    fn addresses_a_vm_can_have_are_probed() {
        for text in [
            "10.0.2.15",
            "192.168.100.20",
            "172.16.0.1",
            "203.0.113.2",
            "1.1.1.1",
            "100.64.0.1",
            "223.255.255.254",
            "240.0.0.1",
            "fd00:10:244::5",
            "2001:db8::1",
            "fec0::1",
            "::ffff:10.0.0.1",
        ] {
            assert_eq!(classify(mk_ip(text)), None, "{text}");
            assert_eq!(AddressPolicy::default().check(mk_ip(text)), Ok(()));
        }
    }

    #[test]
    fn refusals_say_what_and_the_allow_list_lets_some_through() {
        let policy = AddressPolicy::default();
        let refused = policy.check(mk_ip("127.0.0.1")).expect_err("loopback");
        assert_eq!(
            refused.to_string(),
            "address 127.0.0.1 is loopback; not probed"
        );
        assert_eq!(
            policy
                .check(mk_ip("::ffff:169.254.169.254"))
                .expect_err("link-local")
                .to_string(),
            "address ::ffff:169.254.169.254 is link-local; not probed"
        );
        let cidr = |t: &str| Cidr::parse(t).expect("a CIDR");
        let dev = AddressPolicy::allowing(vec![cidr("127.0.0.0/8"), cidr("::1/128")]);
        assert_eq!(dev.check(mk_ip("127.1.0.7")), Ok(()));
        assert_eq!(dev.check(mk_ip("::ffff:127.0.0.1")), Ok(()));
        assert_eq!(dev.check(mk_ip("::1")), Ok(()));
        assert!(dev.check(mk_ip("169.254.169.254")).is_err());
        assert!(dev.check(mk_ip("0.0.0.0")).is_err());
    }
}
