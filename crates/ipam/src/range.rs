//! Ranges and range sets: defaults, validation with the upstream messages, usable-address counts.
//!
//! A range is built from a [`RangeSpec`] exactly as Harvester's `MakeRange` does (defaults from the
//! subnet, each explicit address checked, reversed bounds swapped). A [`RangeSet`] is a pool's ranges in
//! spec order, which is also the round-robin order; its ranges never overlap, and may be of both
//! families (as upstream's may).

use std::fmt;
use std::net::IpAddr;

use super::addr::{Cidr, Family, IPV4_KEYS, from_key, key, parse_ip};
use super::skip::Skip;
use super::spec::RangeSpec;

/// Why a pool's ranges are not acceptable. The texts are the upstream ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error("range can't be empty")]
    Empty,
    #[error("invalid CIDR address: {subnet}, a valid example is 192.168.1.0/24")]
    Subnet { subnet: String },
    #[error("invalid range start {value}: {source}")]
    Start { value: String, source: BoundError },
    #[error("invalid range end {value}: {source}")]
    End { value: String, source: BoundError },
    #[error("invalid gateway {value}: {source}")]
    Gateway { value: String, source: BoundError },
    #[error("there are overlaps between range {first} and {second}")]
    Overlap { first: String, second: String },
    /// Not an upstream check: Go reads these addresses as IPv4 (`net.IP.To4`), so upstream mixes
    /// them up with the IPv4 addresses they map.
    #[error("range {range} of subnet {subnet} holds IPv4-mapped addresses (::ffff:0:0/96)")]
    Ipv4Mapped { range: String, subnet: String },
    /// Not an upstream check: upstream accepts such a range (an IPv6 /127, whose only host address
    /// is its gateway) and reports the pool Ready with nothing to give.
    #[error("range {subnet} has no address to allocate (its only one is the gateway)")]
    NoAddress { subnet: String },
}

/// Why an explicit `rangeStart`, `rangeEnd` or `gateway` is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundError {
    #[error("invalid IP {ip}")]
    Invalid { ip: String },
    #[error("IP {ip} is out of subnet {subnet}")]
    OutOfSubnet { ip: String, subnet: String },
    #[error("IP {ip} is the network address")]
    Network { ip: String },
    #[error("IP {ip} is the broadcast address")]
    Broadcast { ip: String },
}

/// One validated range: `[start, end]` inside `subnet`, with an optional gateway that is never handed
/// out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpRange {
    subnet: Cidr,
    start: u128,
    end: u128,
    gateway: Option<u128>,
}

impl IpRange {
    pub fn parse(spec: &RangeSpec) -> Result<Self, RangeError> {
        let subnet = Cidr::parse(&spec.subnet).ok_or_else(|| RangeError::Subnet {
            subnet: spec.subnet.clone(),
        })?;
        let (default_start, default_end, default_gateway) = if subnet.is_point() {
            (subnet.network(), subnet.network(), None)
        } else {
            let first = subnet.network() + 1;
            let last = match subnet.family() {
                // The broadcast address is not a host address.
                Family::V4 => subnet.last() - 1,
                Family::V6 => subnet.last(),
            };
            (first, last, Some(first))
        };

        let start = match bound(&spec.range_start, &subnet) {
            Ok(value) => value.unwrap_or(default_start),
            Err(source) => {
                return Err(RangeError::Start {
                    value: spec.range_start.clone(),
                    source,
                });
            }
        };
        let end = match bound(&spec.range_end, &subnet) {
            Ok(value) => value.unwrap_or(default_end),
            Err(source) => {
                return Err(RangeError::End {
                    value: spec.range_end.clone(),
                    source,
                });
            }
        };
        let gateway = match bound(&spec.gateway, &subnet) {
            Ok(Some(value)) => Some(value),
            Ok(None) => default_gateway,
            Err(source) => {
                return Err(RangeError::Gateway {
                    value: spec.gateway.clone(),
                    source,
                });
            }
        };
        // As upstream's MakeRange: a start after the end is read as the range between them.
        let (start, end) = if start > end {
            (end, start)
        } else {
            (start, end)
        };
        let range = IpRange {
            subnet,
            start,
            end,
            gateway,
        };
        if subnet.family() == Family::V6 && start <= IPV4_KEYS.1 && IPV4_KEYS.0 <= end {
            return Err(RangeError::Ipv4Mapped {
                range: range.to_string(),
                subnet: subnet.to_string(),
            });
        }
        if range.size() == 0 {
            return Err(RangeError::NoAddress {
                subnet: spec.subnet.clone(),
            });
        }
        Ok(range)
    }

    pub fn family(&self) -> Family {
        self.subnet.family()
    }

    pub fn subnet(&self) -> Cidr {
        self.subnet
    }

    pub fn start(&self) -> IpAddr {
        from_key(self.start)
    }

    pub fn end(&self) -> IpAddr {
        from_key(self.end)
    }

    pub fn gateway(&self) -> Option<IpAddr> {
        self.gateway.map(from_key)
    }

    /// Addresses this range can hand out: its length, less the gateway when it lies inside.
    pub fn size(&self) -> u128 {
        // A range never contains `::` (it would be a network address), so the length fits.
        let len = self.end - self.start + 1;
        len - u128::from(self.gateway_inside().is_some())
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.contains_value(key(ip))
    }

    /// Ranges of two families never overlap: their keys lie apart.
    pub fn overlaps(&self, other: &IpRange) -> bool {
        self.start <= other.end && other.start <= self.end
    }

    pub(crate) fn bounds(&self) -> (u128, u128) {
        (self.start, self.end)
    }

    pub(crate) fn contains_value(&self, value: u128) -> bool {
        self.start <= value && value <= self.end
    }

    /// The gateway, when it is one of this range's addresses and so must be skipped.
    pub(crate) fn gateway_inside(&self) -> Option<u128> {
        self.gateway.filter(|gw| self.contains_value(*gw))
    }

    /// How many of the addresses this range can hand out `skip` leaves out (the gateway is not
    /// one of them: it is never handed out anyway).
    pub fn skipped(&self, skip: Skip) -> u128 {
        let gateway = self
            .gateway_inside()
            .filter(|gw| skip.skips(&self.subnet, *gw));
        skip.count(&self.subnet, self.start, self.end) - u128::from(gateway.is_some())
    }
}

impl fmt::Display for IpRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.start(), self.end())
    }
}

/// Checks one explicit address in the upstream order. `Ok(None)` means "not given".
fn bound(text: &str, subnet: &Cidr) -> Result<Option<u128>, BoundError> {
    if text.is_empty() {
        return Ok(None);
    }
    let ip = parse_ip(text).ok_or_else(|| BoundError::Invalid { ip: text.into() })?;
    let value = key(ip);
    if !subnet.contains(value) {
        return Err(BoundError::OutOfSubnet {
            ip: text.into(),
            subnet: subnet.to_string(),
        });
    }
    // As upstream's parseIP, for both families: the single address of a /32 is its network address
    // (it is usable only as the default), and an IPv6 subnet's last address is refused as its
    // "broadcast" address although it is the default range end.
    if value == subnet.network() {
        return Err(BoundError::Network { ip: text.into() });
    }
    if value == subnet.last() {
        return Err(BoundError::Broadcast { ip: text.into() });
    }
    Ok(Some(value))
}

/// A pool's ranges in spec order (the round-robin order), non-overlapping, and the addresses of
/// them the pool skips ([`Skip`]; none unless [`RangeSet::with_skip`] says so).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSet {
    ranges: Vec<IpRange>,
    /// `(start, index into ranges)`, ascending, to find an address's range in O(log R).
    by_start: Vec<(u128, usize)>,
    total: u128,
    skip: Skip,
    /// How many of the `total` addresses `skip` leaves out.
    skipped: u128,
}

impl RangeSet {
    pub fn parse(specs: &[RangeSpec]) -> Result<Self, RangeError> {
        let ranges = specs
            .iter()
            .map(IpRange::parse)
            .collect::<Result<Vec<_>, _>>()?;
        if ranges.is_empty() {
            return Err(RangeError::Empty);
        }
        // Report the first pair in spec order, as upstream's nested loop does.
        for (i, a) in ranges.iter().enumerate() {
            if let Some(b) = ranges[i + 1..].iter().find(|b| a.overlaps(b)) {
                return Err(RangeError::Overlap {
                    first: a.to_string(),
                    second: b.to_string(),
                });
            }
        }
        let mut by_start: Vec<(u128, usize)> = ranges
            .iter()
            .enumerate()
            .map(|(i, r)| (r.start, i))
            .collect();
        by_start.sort_unstable();
        let total = ranges
            .iter()
            .map(IpRange::size)
            .fold(0u128, u128::saturating_add);
        Ok(RangeSet {
            ranges,
            by_start,
            total,
            skip: Skip::NONE,
            skipped: 0,
        })
    }

    /// The same ranges, skipping what `skip` says.
    pub fn with_skip(mut self, skip: Skip) -> Self {
        self.set_skip(skip);
        self
    }

    /// Skips what `skip` says (instead of what it skipped).
    pub fn set_skip(&mut self, skip: Skip) {
        self.skip = skip;
        self.skipped = self
            .ranges
            .iter()
            .map(|r| r.skipped(skip))
            .fold(0u128, u128::saturating_add);
    }

    pub fn skip(&self) -> Skip {
        self.skip
    }

    pub fn ranges(&self) -> &[IpRange] {
        &self.ranges
    }

    /// The number of addresses in the ranges that are not a gateway (the status `total`, as
    /// upstream counts it: skipped addresses included).
    pub fn total(&self) -> u128 {
        self.total
    }

    /// The number of addresses the pool hands out: [`total`](Self::total) less the skipped ones.
    pub fn capacity(&self) -> u128 {
        self.total - self.skipped
    }

    /// Whether `ip` lies in a range and is skipped.
    pub fn is_skipped(&self, ip: IpAddr) -> bool {
        let value = key(ip);
        self.range_of(value)
            .is_some_and(|r| self.skip.skips(&r.subnet, value))
    }

    /// The first range that has nothing left to hand out once the skipped addresses are left out.
    pub fn starved(&self) -> Option<&IpRange> {
        self.ranges
            .iter()
            .find(|r| r.size() == r.skipped(self.skip))
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.find(key(ip)).is_some()
    }

    /// In a range and not that range's gateway.
    pub fn is_usable(&self, ip: IpAddr) -> bool {
        self.usable_value(key(ip))
    }

    /// Whether any range of `self` overlaps any range of `other` (ranges of other families never do).
    pub fn overlaps(&self, other: &RangeSet) -> bool {
        // Both lists are sorted and internally disjoint, so a merge walk finds any intersection.
        let (mut i, mut j) = (0, 0);
        while let (Some(&(_, a)), Some(&(_, b))) = (self.by_start.get(i), other.by_start.get(j)) {
            let (a, b) = (&self.ranges[a], &other.ranges[b]);
            if a.overlaps(b) {
                return true;
            }
            if a.end < b.end {
                i += 1;
            } else {
                j += 1;
            }
        }
        false
    }

    /// The index of the range holding `value`.
    pub(crate) fn find(&self, value: u128) -> Option<usize> {
        let after = self.by_start.partition_point(|&(start, _)| start <= value);
        let &(_, index) = self.by_start.get(after.checked_sub(1)?)?;
        self.ranges[index].contains_value(value).then_some(index)
    }

    pub(crate) fn usable_value(&self, value: u128) -> bool {
        self.find(value)
            .is_some_and(|i| self.ranges[i].gateway_inside() != Some(value))
    }

    /// Usable, and not skipped: an address the pool may hand out now.
    pub(crate) fn allocatable_value(&self, value: u128) -> bool {
        self.find(value).is_some_and(|i| {
            let range = &self.ranges[i];
            range.gateway_inside() != Some(value) && !self.skip.skips(&range.subnet, value)
        })
    }

    /// Whether `value`, an address of range `index`, is skipped.
    pub(crate) fn skips_in(&self, index: usize, value: u128) -> bool {
        self.skip.skips(&self.ranges[index].subnet, value)
    }

    /// The range and gateway an address is handed out with.
    pub(crate) fn range_of(&self, value: u128) -> Option<&IpRange> {
        self.find(value).map(|i| &self.ranges[i])
    }
}

impl fmt::Display for RangeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, range) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{range}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_range(subnet: &str, start: &str, end: &str, gateway: &str) -> RangeSpec {
        RangeSpec {
            range_start: start.into(),
            range_end: end.into(),
            subnet: subnet.into(),
            gateway: gateway.into(),
        }
    }

    fn mk_subnet(subnet: &str) -> RangeSpec {
        mk_range(subnet, "", "", "")
    }

    fn total(specs: &[RangeSpec]) -> u128 {
        RangeSet::parse(specs).expect("valid ranges").total()
    }

    fn err(spec: RangeSpec) -> String {
        IpRange::parse(&spec)
            .expect_err("invalid range")
            .to_string()
    }

    #[test]
    fn a_range_with_nothing_to_allocate_is_refused() {
        let spec = RangeSpec {
            subnet: "2001:db8::/127".into(),
            ..Default::default()
        };
        assert_eq!(
            IpRange::parse(&spec),
            Err(RangeError::NoAddress {
                subnet: "2001:db8::/127".into()
            })
        );
        // A /31 or a /32 of IPv4 still has its address (upstream's point-to-point rule).
        for subnet in ["10.0.0.7/32", "2001:db8::5/128"] {
            let spec = RangeSpec {
                subnet: subnet.into(),
                ..Default::default()
            };
            assert!(IpRange::parse(&spec).is_ok(), "{subnet}");
        }
    }

    #[test]
    fn totals_table_from_the_reference() {
        let net = "192.168.0.0/24";
        assert_eq!(total(&[mk_subnet(net)]), 253);
        assert_eq!(
            total(&[mk_range(net, "192.168.0.1", "192.168.0.10", "192.168.0.11")]),
            10
        );
        assert_eq!(
            total(&[mk_range(net, "192.168.0.1", "192.168.0.10", "")]),
            9
        );
        assert_eq!(total(&[mk_range(net, "192.168.0.251", "", "")]), 4);
        assert_eq!(total(&[mk_range(net, "", "192.168.0.10", "")]), 9);
    }

    #[test]
    fn defaults_follow_the_subnet() {
        let r = IpRange::parse(&mk_subnet("192.168.100.0/24")).expect("valid");
        assert_eq!(r.to_string(), "192.168.100.1-192.168.100.254");
        assert_eq!(
            r.gateway().map(|g| g.to_string()).as_deref(),
            Some("192.168.100.1")
        );

        let r = IpRange::parse(&mk_range(
            "192.168.100.0/24",
            "192.168.100.30",
            "192.168.100.40",
            "",
        ))
        .expect("valid");
        assert_eq!(r.to_string(), "192.168.100.30-192.168.100.40");
        assert_eq!(
            r.gateway().map(|g| g.to_string()).as_deref(),
            Some("192.168.100.1")
        );
        assert_eq!(r.size(), 11);

        // IPv6 has no broadcast address, so the last address is a host.
        let r = IpRange::parse(&mk_subnet("fd00::/120")).expect("valid");
        assert_eq!(r.to_string(), "fd00::1-fd00::ff");
        assert_eq!(r.size(), 254);
    }

    #[test]
    fn point_subnets_are_one_address_without_gateway() {
        let r = IpRange::parse(&mk_subnet("192.168.100.10/32")).expect("valid");
        assert_eq!(r.to_string(), "192.168.100.10-192.168.100.10");
        assert_eq!(r.gateway(), None);
        assert_eq!(r.size(), 1);

        let r = IpRange::parse(&mk_subnet("fd00::7/128")).expect("valid");
        assert_eq!(r.to_string(), "fd00::7-fd00::7");
        assert_eq!(r.size(), 1);

        // pkg/ipam/allocator.go (parseIP): naming the one address explicitly is refused as the
        // network address, for every bound, as upstream refuses it.
        assert_eq!(
            err(mk_range("192.168.100.10/32", "192.168.100.10", "", "")),
            "invalid range start 192.168.100.10: IP 192.168.100.10 is the network address"
        );
        assert_eq!(
            err(mk_range("192.168.100.10/32", "", "192.168.100.10", "")),
            "invalid range end 192.168.100.10: IP 192.168.100.10 is the network address"
        );
        assert_eq!(
            err(mk_range("192.168.100.10/32", "", "", "192.168.100.10")),
            "invalid gateway 192.168.100.10: IP 192.168.100.10 is the network address"
        );
        assert_eq!(
            err(mk_range("fd00::7/128", "fd00::7", "", "")),
            "invalid range start fd00::7: IP fd00::7 is the network address"
        );
        assert_eq!(
            err(mk_range("192.168.100.10/32", "192.168.101.10", "", "")),
            "invalid range start 192.168.101.10: IP 192.168.101.10 is out of subnet 192.168.100.10/32"
        );
    }

    #[test]
    fn reversed_bounds_are_swapped() {
        let set = RangeSet::parse(&[mk_range(
            "192.168.0.0/24",
            "192.168.0.20",
            "192.168.0.10",
            "",
        )])
        .expect("valid");
        assert_eq!(set.to_string(), "192.168.0.10-192.168.0.20");
    }

    #[test]
    fn range_set_strings_from_upstream_tests() {
        let cases: [(&[RangeSpec], Option<&str>); 6] = [
            (
                &[mk_range(
                    "192.168.0.0/24",
                    "192.168.0.10",
                    "192.168.0.20",
                    "",
                )],
                Some("192.168.0.10-192.168.0.20"),
            ),
            (
                &[mk_subnet("192.168.0.0/24")],
                Some("192.168.0.1-192.168.0.254"),
            ),
            (
                &[
                    mk_range("192.168.0.0/24", "192.168.0.10", "192.168.0.20", ""),
                    mk_subnet("192.168.10.0/24"),
                ],
                Some("192.168.0.10-192.168.0.20,192.168.10.1-192.168.10.254"),
            ),
            (
                &[mk_range(
                    "192.168.0.0/24",
                    "192.168.0.20",
                    "192.168.0.10",
                    "",
                )],
                Some("192.168.0.10-192.168.0.20"),
            ),
            (&[mk_range("", "192.168.0.1", "192.168.0.10", "")], None),
            (&[mk_range("192.168.10.0/24", "192.168.0.10", "", "")], None),
        ];
        for (specs, want) in cases {
            let got = RangeSet::parse(specs).map(|s| s.to_string()).ok();
            assert_eq!(got.as_deref(), want, "{specs:?}");
        }
    }

    #[test]
    fn error_messages_are_the_upstream_ones() {
        let net = "192.168.0.0/24";
        assert_eq!(
            err(mk_subnet("192.168.0.0")),
            "invalid CIDR address: 192.168.0.0, a valid example is 192.168.1.0/24"
        );
        assert_eq!(
            err(mk_range(net, "192.168.0.x", "", "")),
            "invalid range start 192.168.0.x: invalid IP 192.168.0.x"
        );
        assert_eq!(
            err(mk_range(net, "", "10.0.0.1", "")),
            "invalid range end 10.0.0.1: IP 10.0.0.1 is out of subnet 192.168.0.0/24"
        );
        assert_eq!(
            err(mk_range(net, "192.168.0.0", "", "")),
            "invalid range start 192.168.0.0: IP 192.168.0.0 is the network address"
        );
        assert_eq!(
            err(mk_range(net, "", "192.168.0.255", "")),
            "invalid range end 192.168.0.255: IP 192.168.0.255 is the broadcast address"
        );
        assert_eq!(
            err(mk_range(net, "", "", "192.168.0.255")),
            "invalid gateway 192.168.0.255: IP 192.168.0.255 is the broadcast address"
        );
        assert_eq!(
            err(mk_range(net, "", "", "fd00::1")),
            "invalid gateway fd00::1: IP fd00::1 is out of subnet 192.168.0.0/24"
        );
        // pkg/ipam/allocator.go (parseIP, broadcastIP): IPv6's last address is refused by name too,
        // although it is the default range end.
        assert_eq!(
            err(mk_range("fd00::/120", "", "fd00::ff", "")),
            "invalid range end fd00::ff: IP fd00::ff is the broadcast address"
        );
        assert_eq!(
            IpRange::parse(&mk_subnet("fd00::/120"))
                .expect("valid")
                .to_string(),
            "fd00::1-fd00::ff"
        );
        // The start is checked before the end, and the end before the gateway.
        assert_eq!(
            err(mk_range(net, "a", "b", "c")),
            "invalid range start a: invalid IP a"
        );
        assert_eq!(
            err(mk_range(net, "", "b", "c")),
            "invalid range end b: invalid IP b"
        );
    }

    #[test]
    fn set_level_errors() {
        assert_eq!(
            RangeSet::parse(&[]).expect_err("empty").to_string(),
            "range can't be empty"
        );
        let overlap = RangeSet::parse(&[
            mk_subnet("192.168.100.0/24"),
            mk_range("192.168.100.0/24", "192.168.100.10", "192.168.100.20", ""),
        ])
        .expect_err("overlap");
        assert_eq!(
            overlap.to_string(),
            "there are overlaps between range 192.168.100.1-192.168.100.254 and 192.168.100.10-192.168.100.20"
        );
    }

    // pkg/ipam/rangeset.go (LBRangesToAllocatorRangeSet) builds a set of any ranges, and the CNI
    // range set it makes walks them in order whatever their family.
    #[test]
    fn a_set_may_mix_families() {
        let set = RangeSet::parse(&[
            mk_range("192.168.100.0/24", "192.168.100.10", "192.168.100.11", ""),
            mk_range("fd00::/120", "fd00::10", "fd00::11", ""),
        ])
        .expect("mixed families");
        assert_eq!(
            set.to_string(),
            "192.168.100.10-192.168.100.11,fd00::10-fd00::11"
        );
        assert_eq!(set.total(), 4);
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        assert!(set.contains(ip("192.168.100.10")) && set.contains(ip("fd00::11")));
        assert!(!set.contains(ip("fd00::12")) && !set.contains(ip("192.168.100.12")));
        let v6 = RangeSet::parse(&[mk_subnet("fd00::/120")]).expect("valid");
        let v4 = RangeSet::parse(&[mk_subnet("192.168.100.0/24")]).expect("valid");
        assert!(set.overlaps(&v6) && set.overlaps(&v4) && !v4.overlaps(&v6));
    }

    #[test]
    fn ipv6_ranges_over_ipv4_mapped_addresses_are_refused() {
        assert!(matches!(
            IpRange::parse(&mk_subnet("::ffff:0:0/96")),
            Err(RangeError::Ipv4Mapped { .. })
        ));
        assert!(matches!(
            IpRange::parse(&mk_subnet("::/64")),
            Err(RangeError::Ipv4Mapped { .. })
        ));
        // The same subnet, with a range short of the block, is fine.
        assert!(IpRange::parse(&mk_range("::/64", "::10", "::20", "")).is_ok());
        // An IPv4 address never lies in an IPv6 subnet.
        assert_eq!(
            err(mk_range("::/64", "10.0.0.1", "", "")),
            "invalid range start 10.0.0.1: IP 10.0.0.1 is out of subnet ::/64"
        );
    }

    #[test]
    fn sets_overlap_only_within_a_family() {
        let a = RangeSet::parse(&[
            mk_range("192.168.100.0/24", "192.168.100.10", "192.168.100.20", ""),
            mk_range("192.168.100.0/24", "192.168.100.30", "192.168.100.40", ""),
        ])
        .expect("valid");
        let whole = RangeSet::parse(&[mk_subnet("192.168.100.0/24")]).expect("valid");
        let gap = RangeSet::parse(&[mk_range(
            "192.168.100.0/24",
            "192.168.100.50",
            "192.168.100.60",
            "",
        )])
        .expect("valid");
        let between = RangeSet::parse(&[mk_range(
            "192.168.100.0/24",
            "192.168.100.21",
            "192.168.100.29",
            "",
        )])
        .expect("valid");
        let v6 = RangeSet::parse(&[mk_subnet("fd00::/64")]).expect("valid");
        assert!(a.overlaps(&whole) && whole.overlaps(&a));
        assert!(!a.overlaps(&gap) && !a.overlaps(&between) && !between.overlaps(&a));
        assert!(!a.overlaps(&v6));
    }

    #[test]
    fn usable_excludes_the_gateway_and_outside() {
        let set = RangeSet::parse(&[mk_range("10.0.0.0/24", "10.0.0.1", "10.0.0.5", "10.0.0.3")])
            .expect("valid");
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        assert!(set.is_usable(ip("10.0.0.1")));
        assert!(set.contains(ip("10.0.0.3")) && !set.is_usable(ip("10.0.0.3")));
        assert!(!set.contains(ip("10.0.0.6")));
        assert!(!set.contains(ip("::a00:1")));
        assert_eq!(set.total(), 4);
    }

    #[test]
    fn a_slash_64_counts_without_enumerating() {
        let set = RangeSet::parse(&[mk_subnet("2001:db8::/64")]).expect("valid");
        assert_eq!(set.total(), (1u128 << 64) - 2);
    }

    #[test]
    fn odd_small_subnets_follow_the_rules_literally() {
        // /30: .1 is the gateway, .2 the only host.
        assert_eq!(total(&[mk_subnet("192.168.0.0/30")]), 1);
        // /31: start .1 and end .0 swap; the default gateway .1 lies inside.
        assert_eq!(total(&[mk_subnet("192.168.0.0/31")]), 1);
        // /127: one address, which is the default gateway: nothing to allocate, refused (upstream
        // accepts it and reports the pool Ready with a total of 0).
        assert!(matches!(
            IpRange::parse(&mk_subnet("fd00::/127")),
            Err(RangeError::NoAddress { .. })
        ));
    }
}
