//! Address arithmetic: IPv4 and IPv6 addresses as integers, and CIDR parsing.
//!
//! Every address is carried as a `u128` key in one space for both families, as Go's 16-byte
//! `net.IP` carries it: an IPv6 address is its own value, an IPv4 address the value of its
//! IPv4-mapped form (`::ffff:a.b.c.d`). One code path serves both families, a pool may mix them (as
//! upstream's may), and a `/64` costs no more than a `/24`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The address family of a subnet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    pub fn bits(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// The keys of IPv4 addresses: the IPv4-mapped block `::ffff:0:0/96`.
pub(crate) const IPV4_KEYS: (u128, u128) = (0xffff_0000_0000, 0xffff_ffff_ffff);

/// The family of the address a key stands for.
pub(crate) fn family_of(key: u128) -> Family {
    if (IPV4_KEYS.0..=IPV4_KEYS.1).contains(&key) {
        Family::V4
    } else {
        Family::V6
    }
}

/// An address's key.
pub fn key(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The address of a key: IPv4 for the IPv4-mapped block, as Go prints a 16-byte `net.IP`.
pub(crate) fn from_key(key: u128) -> IpAddr {
    Ipv6Addr::from(key).to_canonical()
}

/// Parses an address the way the status maps and specs write it. IPv4-mapped IPv6 text
/// (`::ffff:10.0.0.1`) is read as the IPv4 address, as Go's `net.ParseIP` does.
pub(crate) fn parse_ip(text: &str) -> Option<IpAddr> {
    text.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// A subnet in CIDR notation, kept masked (`192.168.0.5/24` is `192.168.0.0/24`) like Go's
/// `net.ParseCIDR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    family: Family,
    /// The key of the network address.
    network: u128,
    prefix: u8,
}

impl Cidr {
    pub fn parse(text: &str) -> Option<Self> {
        let (ip, prefix) = text.split_once('/')?;
        if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        // Canonicalising here would turn `::ffff:a.b.c.d/120` into an IPv4 address with an IPv6
        // prefix, so only the plain forms are accepted.
        let ip: IpAddr = ip.parse().ok()?;
        let prefix: u8 = prefix.parse().ok()?;
        let family = Family::of(ip);
        if prefix > family.bits() {
            return None;
        }
        let mut cidr = Cidr {
            family,
            network: 0,
            prefix,
        };
        cidr.network = key(ip) & cidr.mask();
        Some(cidr)
    }

    pub fn family(&self) -> Family {
        self.family
    }

    pub(crate) fn prefix_len(&self) -> u8 {
        self.prefix
    }

    pub(crate) fn host_mask(&self) -> u128 {
        let host_bits = u32::from(self.family.bits() - self.prefix);
        if host_bits >= 128 {
            u128::MAX
        } else {
            (1u128 << host_bits) - 1
        }
    }

    /// The mask over the key: for IPv4 it also covers the IPv4-mapped prefix, so that only keys of
    /// the subnet's family can match.
    pub(crate) fn mask(&self) -> u128 {
        !self.host_mask()
    }

    pub(crate) fn network(&self) -> u128 {
        self.network
    }

    /// The highest address of the subnet: the broadcast address for IPv4.
    pub(crate) fn last(&self) -> u128 {
        self.network | self.host_mask()
    }

    /// A `/32` or `/128`: a single address.
    pub(crate) fn is_point(&self) -> bool {
        self.prefix == self.family.bits()
    }

    pub fn contains(&self, key: u128) -> bool {
        family_of(key) == self.family && key & self.mask() == self.network
    }

    /// The netmask as an address (`255.255.255.0`, `ffff:ffff:ffff:ffff::`).
    pub fn netmask(&self) -> IpAddr {
        self.render(self.mask())
    }

    /// A key as an address of this subnet's family.
    fn render(&self, value: u128) -> IpAddr {
        match self.family {
            Family::V4 => IpAddr::V4(Ipv4Addr::from((value & 0xffff_ffff) as u32)),
            Family::V6 => IpAddr::V6(Ipv6Addr::from(value)),
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.render(self.network), self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_is_masked_and_printed_like_go() {
        let cidr = Cidr::parse("192.168.0.5/24").expect("valid");
        assert_eq!(cidr.to_string(), "192.168.0.0/24");
        assert_eq!(cidr.netmask().to_string(), "255.255.255.0");
        assert_eq!(cidr.last(), key("192.168.0.255".parse().expect("ip")));
        assert_eq!(from_key(cidr.last()).to_string(), "192.168.0.255");
        assert!(
            !cidr.contains(key("::c0a8:1".parse().expect("ip"))),
            "not IPv6"
        );
    }

    #[test]
    fn cidr_rejects_malformed_text() {
        for bad in [
            "",
            "192.168.0.0",
            "192.168.0.0/",
            "192.168.0.0/33",
            "192.168.0.0/+8",
            "x/8",
            "::/129",
        ] {
            assert!(Cidr::parse(bad).is_none(), "{bad} should not parse");
        }
    }

    #[test]
    fn cidr_handles_whole_space_prefixes() {
        let v6 = Cidr::parse("::/0").expect("valid");
        assert_eq!(v6.mask(), 0);
        assert_eq!(v6.last(), u128::MAX);
        let v4 = Cidr::parse("0.0.0.0/0").expect("valid");
        assert_eq!(from_key(v4.last()).to_string(), "255.255.255.255");
        assert_eq!(v4.netmask().to_string(), "0.0.0.0");
        assert!(!v4.contains(key("2001:db8::1".parse().expect("ip"))));
        assert!(
            !v6.contains(key("10.0.0.1".parse().expect("ip"))),
            "an IPv6 subnet holds no IPv4 address"
        );
        assert_eq!(
            Cidr::parse("10.0.0.1/32")
                .expect("valid")
                .netmask()
                .to_string(),
            "255.255.255.255"
        );
    }

    #[test]
    fn mapped_ipv6_text_reads_as_ipv4() {
        assert_eq!(
            parse_ip("::ffff:10.0.0.1"),
            Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)))
        );
        assert_eq!(parse_ip("010.0.0.1"), None);
    }
}
