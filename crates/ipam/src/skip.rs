//! Pools that skip addresses: the IPPool annotation `loadbalancer.harvesterhci.io/skipAddresses`,
//! addresses of the pool's ranges that it never hands out. Ours, not upstream's (upstream's
//! controller ignores the annotation); the models are MetalLB's `avoidBuggyIPs` and Cilium
//! LB-IPAM's `allowFirstLastIPs`.
//!
//! The value is a comma-separated list of:
//!
//! - `firstLast`: the first and the last address of each range's subnet. An IPv4 subnet's network
//!   and broadcast addresses are never handed out anyway, so this matters for IPv6, whose last
//!   address is a range's default end. A point-to-point subnet (an IPv4 /31 or /32, an IPv6 /127 or
//!   /128) is exempt: its addresses are its hosts (RFC 3021), as Cilium exempts them.
//! - `dot0And255`: every IPv4 address ending in `.0` or `.255`, whatever the subnet's size (the
//!   `.0` and `.255` of each /24 inside a /16, say), which some clients and routers mistake for a
//!   network or broadcast address. IPv6 ranges are not affected.
//!
//! The empty value skips nothing; anything else is refused.

use std::fmt;

use super::addr::{Cidr, Family};

/// The pool annotation.
pub const SKIP_ADDRESSES: &str = "loadbalancer.harvesterhci.io/skipAddresses";
/// The value that skips each range's subnet's first and last address.
pub const FIRST_LAST: &str = "firstLast";
/// The value that skips the IPv4 addresses ending in `.0` or `.255`.
pub const DOT0_AND_255: &str = "dot0And255";

/// A refused annotation value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "annotation {SKIP_ADDRESSES} {value:?} names {item:?}, which is not {FIRST_LAST} (each range's subnet's first and last address) or {DOT0_AND_255} (every IPv4 address ending in .0 or .255); the value is a comma-separated list of those"
)]
pub struct SkipError {
    pub value: String,
    pub item: String,
}

/// Which addresses of its ranges a pool skips.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Skip {
    first_last: bool,
    dot0_and_255: bool,
}

impl Skip {
    /// Skips nothing.
    pub const NONE: Skip = Skip {
        first_last: false,
        dot0_and_255: false,
    };

    pub fn parse(value: &str) -> Result<Self, SkipError> {
        let mut skip = Skip::NONE;
        if value.trim().is_empty() {
            return Ok(skip);
        }
        for item in value.split(',').map(str::trim) {
            match item {
                FIRST_LAST => skip.first_last = true,
                DOT0_AND_255 => skip.dot0_and_255 = true,
                other => {
                    return Err(SkipError {
                        value: value.into(),
                        item: other.into(),
                    });
                }
            }
        }
        Ok(skip)
    }

    pub fn is_none(&self) -> bool {
        *self == Skip::NONE
    }

    /// Whether the address `value` (a key) of `subnet` is skipped.
    pub(crate) fn skips(&self, subnet: &Cidr, value: u128) -> bool {
        self.skips_dot(subnet, value) || self.skips_edge(subnet, value)
    }

    fn skips_dot(&self, subnet: &Cidr, value: u128) -> bool {
        // An IPv4 key is `::ffff:a.b.c.d`: its low byte is the address's last octet.
        self.dot0_and_255 && subnet.family() == Family::V4 && matches!(value & 0xff, 0 | 0xff)
    }

    fn skips_edge(&self, subnet: &Cidr, value: u128) -> bool {
        self.first_last
            && subnet.prefix_len() + 1 < subnet.family().bits()
            && (value == subnet.network() || value == subnet.last())
    }

    /// How many addresses of `[lo, hi]` (keys within `subnet`) are skipped; no walk.
    pub(crate) fn count(&self, subnet: &Cidr, lo: u128, hi: u128) -> u128 {
        let mut skipped = 0;
        if self.dot0_and_255 && subnet.family() == Family::V4 {
            // Addresses `<= x` whose low byte is `b`.
            let upto = |x: u128, b: u128| if x < b { 0 } else { (x - b) / 256 + 1 };
            let below = |b: u128| lo.checked_sub(1).map_or(0, |x| upto(x, b));
            skipped += upto(hi, 0) - below(0) + upto(hi, 0xff) - below(0xff);
        }
        if self.first_last {
            let mut edges = vec![subnet.network(), subnet.last()];
            edges.dedup();
            skipped += edges
                .into_iter()
                .filter(|&e| {
                    lo <= e && e <= hi && self.skips_edge(subnet, e) && !self.skips_dot(subnet, e)
                })
                .count() as u128;
        }
        skipped
    }
}

/// The canonical annotation value (empty for [`Skip::NONE`]).
impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let items: Vec<&str> = [
            (self.first_last, FIRST_LAST),
            (self.dot0_and_255, DOT0_AND_255),
        ]
        .into_iter()
        .filter_map(|(on, item)| on.then_some(item))
        .collect();
        f.write_str(&items.join(","))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::addr::key;

    fn mk_skip(value: &str) -> Skip {
        Skip::parse(value).expect("valid")
    }

    fn mk_cidr(text: &str) -> Cidr {
        Cidr::parse(text).expect("valid cidr")
    }

    fn k(ip: &str) -> u128 {
        key(ip.parse().expect("ip"))
    }

    #[test]
    fn values_parse_and_print_canonically() {
        assert_eq!(mk_skip(""), Skip::NONE);
        assert_eq!(mk_skip(" "), Skip::NONE);
        assert!(mk_skip("").is_none());
        assert_eq!(mk_skip("firstLast").to_string(), "firstLast");
        assert_eq!(mk_skip("dot0And255").to_string(), "dot0And255");
        assert_eq!(
            mk_skip(" dot0And255 , firstLast").to_string(),
            "firstLast,dot0And255"
        );
        assert_eq!(mk_skip("firstLast,firstLast").to_string(), "firstLast");
    }

    #[test]
    fn unknown_values_are_refused_by_name() {
        for (value, item) in [
            ("true", "true"),
            ("firstlast", "firstlast"),
            ("firstLast,", ""),
            ("firstLast,,dot0And255", ""),
            ("avoidBuggyIPs", "avoidBuggyIPs"),
        ] {
            assert_eq!(
                Skip::parse(value),
                Err(SkipError {
                    value: value.into(),
                    item: item.into()
                }),
                "{value:?}"
            );
        }
        assert_eq!(
            Skip::parse("yes").expect_err("refused").to_string(),
            "annotation loadbalancer.harvesterhci.io/skipAddresses \"yes\" names \"yes\", which is not firstLast (each range's subnet's first and last address) or dot0And255 (every IPv4 address ending in .0 or .255); the value is a comma-separated list of those"
        );
    }

    #[test]
    fn dot0_and_255_skips_every_ipv4_address_ending_so() {
        let skip = mk_skip("dot0And255");
        let net = mk_cidr("10.0.0.0/16");
        for ip in ["10.0.0.0", "10.0.1.0", "10.0.1.255", "10.0.255.255"] {
            assert!(skip.skips(&net, k(ip)), "{ip}");
        }
        for ip in ["10.0.0.1", "10.0.1.254", "10.0.2.128"] {
            assert!(!skip.skips(&net, k(ip)), "{ip}");
        }
        // Not IPv6, whatever its low byte.
        let v6 = mk_cidr("fd00::/64");
        assert!(!skip.skips(&v6, k("fd00::100")) && !skip.skips(&v6, k("fd00::ff")));
        // .1.0 to .2.255: .1.0, .1.255, .2.0, .2.255.
        assert_eq!(skip.count(&net, k("10.0.1.0"), k("10.0.2.255")), 4);
        assert_eq!(skip.count(&net, k("10.0.1.1"), k("10.0.1.254")), 0);
        assert_eq!(skip.count(&v6, k("fd00::"), k("fd00::ffff")), 0);
    }

    #[test]
    fn first_last_skips_the_subnet_edges_but_not_of_point_to_point_subnets() {
        let skip = mk_skip("firstLast");
        let v6 = mk_cidr("fd00::/120");
        assert!(skip.skips(&v6, k("fd00::")) && skip.skips(&v6, k("fd00::ff")));
        assert!(!skip.skips(&v6, k("fd00::fe")));
        assert_eq!(skip.count(&v6, k("fd00::1"), k("fd00::ff")), 1);
        let v4 = mk_cidr("10.0.0.0/24");
        assert!(skip.skips(&v4, k("10.0.0.255")) && !skip.skips(&v4, k("10.0.1.0")));
        for point in ["10.0.0.4/31", "10.0.0.4/32", "fd00::4/127", "fd00::4/128"] {
            let net = mk_cidr(point);
            assert!(!skip.skips(&net, net.network()), "{point}");
            assert!(!skip.skips(&net, net.last()), "{point}");
            assert_eq!(skip.count(&net, net.network(), net.last()), 0, "{point}");
        }
        // A /30 is not point to point.
        let net = mk_cidr("10.0.0.4/30");
        assert_eq!(skip.count(&net, net.network(), net.last()), 2);
        // Both rules over the same address count it once.
        let both = mk_skip("firstLast,dot0And255");
        assert_eq!(both.count(&v4, k("10.0.0.0"), k("10.0.0.255")), 2);
    }

    proptest! {
        /// The closed-form count is the walk's, for every subnet shape and window.
        #[test]
        fn count_is_the_number_of_skipped_addresses(
            v4 in any::<bool>(),
            prefix in 0u8..=10,
            base in any::<u32>(),
            a in 0u32..2048,
            b in 0u32..2048,
            first_last in any::<bool>(),
            dot in any::<bool>(),
        ) {
            let text = if v4 {
                format!("{}/{}", std::net::Ipv4Addr::from(base), 32 - prefix)
            } else {
                let ip = std::net::Ipv6Addr::from((0xfd00 << 112) | (u128::from(base) << 16));
                format!("{ip}/{}", 128 - prefix)
            };
            let net = mk_cidr(&text);
            let skip = Skip { first_last, dot0_and_255: dot };
            let size = net.last() - net.network();
            let (lo, hi) = (u128::from(a.min(b)).min(size), u128::from(a.max(b)).min(size));
            let (lo, hi) = (net.network() + lo, net.network() + hi);
            let walked = (lo..=hi).filter(|&v| skip.skips(&net, v)).count() as u128;
            prop_assert_eq!(skip.count(&net, lo, hi), walked);
        }
    }
}
