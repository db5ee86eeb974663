//! IPPool admission: the upstream validating webhook's checks as pure functions, with its messages.
//!
//! One deliberate difference: range overlap with other pools is only checked between pools on the same
//! network, so identical ranges on different VLANs are possible (upstream compares every pool).
//! Another pool whose own ranges do not parse is skipped rather than blocking every change.
//!
//! The selector rules (one global pool; no two pools of equal priority or scope) hold per network and
//! address family: an IPv4 and an IPv6 pool may share a scope, so that dual-stack load balancers get
//! one address of each family, and a global pool may exist per network (selection prefers the one
//! on the load balancer's network). Upstream allows one global pool in all.
//!
//! Ours: the pool annotations IPAM reads are judged too, since upstream's webhook ignores them: a
//! `skipAddresses` value that names something unknown, or that leaves a range nothing to hand out,
//! and a `serviceSelector` that is not a label selector are refused. Adding `skipAddresses` to a
//! pool whose allocated addresses it skips is fine: they stay held.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::addr::parse_ip;
use super::labels::SelectorError;
use super::range::{RangeError, RangeSet};
use super::select::{PoolEntry, Requirement};
use super::skip::{SKIP_ADDRESSES, Skip, SkipError};
use super::spec::Selector;

/// A rejected IPPool create, update or delete; the texts are the upstream webhook's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    #[error("can't create IP pool {pool} because {source}")]
    Create { pool: String, source: Rejection },
    #[error("can't update IP pool {pool} because {source}")]
    Update { pool: String, source: Rejection },
    #[error("can't delete pool before releasing all the allocated IP")]
    Delete { pool: String },
}

/// Why a pool spec is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error(transparent)]
    Ranges(#[from] RangeError),
    #[error(transparent)]
    SkipAddresses(#[from] SkipError),
    #[error(
        "range {range} has no address left to hand out once annotation {SKIP_ADDRESSES} ({skip}) skips its addresses"
    )]
    Starved { range: String, skip: Skip },
    #[error(transparent)]
    ServiceSelector(#[from] SelectorError),
    #[error("the ranges {ranges} overlap with other pools")]
    OverlapsOtherPool { ranges: String, other: String },
    #[error("invalid ip string {ip}")]
    InvalidAllocated { ip: String },
    #[error("allocated IP {ip} is excluded")]
    ExcludesAllocated { ip: String },
    #[error("there is already a global IP pool: {other}")]
    SecondGlobal { other: String },
    #[error("selector {selector} is invalid: scope overlaps")]
    ScopeOverlaps { selector: String },
    #[error("the priority can't be the same as the pool {other}")]
    SamePriority { other: String },
    #[error(
        "scope selector is same as the pool {other} with priority 0 Project {project} Namespace {namespace} GuestCluster {guest_cluster}, set a different priority or scope"
    )]
    SameScope {
        other: String,
        project: String,
        namespace: String,
        guest_cluster: String,
    },
}

/// Checks a new pool against the existing ones (`others` may include the pool itself; it is skipped by
/// name).
pub fn validate_create(
    pool: &PoolEntry<'_>,
    others: &[PoolEntry<'_>],
) -> Result<(), AdmissionError> {
    check(pool, None, others).map_err(|source| AdmissionError::Create {
        pool: pool.name.into(),
        source,
    })
}

/// Checks a changed pool; `allocated` is its `status.allocated`, which the new ranges must still hold.
pub fn validate_update(
    pool: &PoolEntry<'_>,
    allocated: &BTreeMap<String, String>,
    others: &[PoolEntry<'_>],
) -> Result<(), AdmissionError> {
    check(pool, Some(allocated), others).map_err(|source| AdmissionError::Update {
        pool: pool.name.into(),
        source,
    })
}

/// A pool may only go once nothing is allocated from it.
pub fn validate_delete(
    pool: &str,
    allocated: &BTreeMap<String, String>,
) -> Result<(), AdmissionError> {
    if allocated.is_empty() {
        Ok(())
    } else {
        Err(AdmissionError::Delete { pool: pool.into() })
    }
}

fn check(
    pool: &PoolEntry<'_>,
    allocated: Option<&BTreeMap<String, String>>,
    others: &[PoolEntry<'_>],
) -> Result<(), Rejection> {
    let skip = pool.options.skip()?;
    let ranges = RangeSet::parse(&pool.spec.ranges)?.with_skip(skip);
    if let Some(range) = ranges.starved() {
        return Err(Rejection::Starved {
            range: range.to_string(),
            skip,
        });
    }
    pool.options.service_selector()?;
    // Sorted by name so that the pool named in a message does not depend on list order.
    let mut others: Vec<&PoolEntry<'_>> = others.iter().filter(|o| o.name != pool.name).collect();
    others.sort_by_key(|o| o.name);

    let selector = &pool.spec.selector;
    for other in others
        .iter()
        .filter(|o| o.spec.selector.network == selector.network)
    {
        if RangeSet::parse(&other.spec.ranges).is_ok_and(|theirs| ranges.overlaps(&theirs)) {
            return Err(Rejection::OverlapsOtherPool {
                ranges: ranges.to_string(),
                other: other.name.into(),
            });
        }
    }

    if let Some(allocated) = allocated {
        for ip in allocated.keys() {
            let Some(addr) = parse_ip(ip) else {
                return Err(Rejection::InvalidAllocated { ip: ip.clone() });
            };
            // As upstream's checkAllocated (the CNI range's Contains): the gateway counts as inside,
            // so an update may make an allocated address the gateway; the address stays held.
            if !ranges.contains(addr) {
                return Err(Rejection::ExcludesAllocated { ip: ip.clone() });
            }
        }
    }

    // Only pools that could serve a load balancer of the same family compete with this one.
    let families = pool.spec.families();
    others.retain(|o| o.spec.families().intersects(families));
    if selector.is_global() {
        if let Some(other) = others
            .iter()
            .find(|o| o.spec.selector.is_global() && o.spec.selector.network == selector.network)
        {
            return Err(Rejection::SecondGlobal {
                other: other.name.into(),
            });
        }
        return Ok(());
    }

    for (i, tuple) in selector.scope.iter().enumerate() {
        let later = Selector {
            priority: selector.priority,
            network: selector.network.clone(),
            scope: selector.scope[i + 1..].to_vec(),
        };
        if later.matches(&requirement(&selector.network, tuple)) {
            return Err(Rejection::ScopeOverlaps {
                selector: go_selector(selector),
            });
        }
    }

    for other in others.iter().filter(|o| !o.spec.selector.is_global()) {
        let theirs = &other.spec.selector;
        if theirs.priority != 0 && theirs.priority == selector.priority {
            return Err(Rejection::SamePriority {
                other: other.name.into(),
            });
        }
        if theirs.priority == 0
            && selector.priority == 0
            && let Some(tuple) = selector
                .scope
                .iter()
                .find(|t| theirs.matches(&requirement(&selector.network, t)))
        {
            return Err(Rejection::SameScope {
                other: other.name.into(),
                project: tuple.project.clone(),
                namespace: tuple.namespace.clone(),
                guest_cluster: tuple.guest_cluster.clone(),
            });
        }
    }
    Ok(())
}

fn requirement(network: &str, tuple: &super::spec::Tuple) -> Requirement {
    Requirement {
        network: network.into(),
        project: tuple.project.clone(),
        namespace: tuple.namespace.clone(),
        cluster: tuple.guest_cluster.clone(),
    }
}

/// The selector as Go's `%+v` prints the upstream struct.
fn go_selector(selector: &Selector) -> String {
    let mut out = format!(
        "{{Priority:{} Network:{} Scope:[",
        selector.priority, selector.network
    );
    for (i, t) in selector.scope.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        // Writing to a String cannot fail.
        let _ = write!(
            out,
            "{{Project:{} Namespace:{} GuestCluster:{}}}",
            t.project, t.namespace, t.guest_cluster
        );
    }
    out.push_str("]}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ALL, PoolSpec, RangeSpec, Tuple};

    fn mk_tuple(project: &str, namespace: &str, cluster: &str) -> Tuple {
        Tuple {
            project: project.into(),
            namespace: namespace.into(),
            guest_cluster: cluster.into(),
        }
    }

    fn mk_spec(subnet: &str, network: &str, priority: u32, scope: &[Tuple]) -> PoolSpec {
        PoolSpec {
            description: String::new(),
            ranges: vec![RangeSpec {
                subnet: subnet.into(),
                ..RangeSpec::default()
            }],
            selector: Selector {
                priority,
                network: network.into(),
                scope: scope.to_vec(),
            },
        }
    }

    fn mk_entry<'a>(name: &'a str, spec: &'a PoolSpec) -> PoolEntry<'a> {
        PoolEntry {
            name,
            spec,
            deleting: false,
            options: Default::default(),
        }
    }

    fn create(input: &PoolSpec, cache: &[(&str, &PoolSpec)]) -> Result<(), String> {
        let others: Vec<PoolEntry<'_>> = cache.iter().map(|(n, s)| mk_entry(n, s)).collect();
        validate_create(&mk_entry("input", input), &others).map_err(|e| e.to_string())
    }

    fn all() -> Tuple {
        mk_tuple(ALL, ALL, ALL)
    }

    #[test]
    fn case1_a_second_global_pool_on_the_same_network() {
        let global = mk_spec("192.168.10.0/24", "default/vlan10", 0, &[all()]);
        let input = mk_spec("192.168.11.0/24", "default/vlan10", 0, &[all()]);
        assert_eq!(
            create(&input, &[("global", &global)]),
            Err(
                "can't create IP pool input because there is already a global IP pool: global"
                    .into()
            )
        );
    }

    #[test]
    fn case2_a_global_pool_next_to_a_scoped_one_is_fine() {
        let default = mk_spec(
            "192.168.10.0/24",
            "default/network168",
            0,
            &[mk_tuple(ALL, "default", ALL)],
        );
        let input = mk_spec("192.168.11.0/24", "", 0, &[all()]);
        assert_eq!(create(&input, &[("default", &default)]), Ok(()));
    }

    #[test]
    fn case3_self_overlapping_scope() {
        let input = mk_spec(
            "192.168.11.0/24",
            "default/network168",
            0,
            &[
                mk_tuple("pj1", "ns1", ALL),
                mk_tuple("pj1", "ns2", ALL),
                mk_tuple("pj2", "ns1", "cluster1"),
            ],
        );
        assert_eq!(create(&input, &[]), Ok(()));
    }

    #[test]
    fn case4_self_overlapping_scope_is_refused() {
        let global = mk_spec("192.168.10.0/24", "", 0, &[all()]);
        let input = mk_spec(
            "192.168.11.0/24",
            "default/network168",
            0,
            &[
                mk_tuple("pj1", "ns1", ALL),
                mk_tuple("pj1", ALL, "cluster1"),
            ],
        );
        assert_eq!(
            create(&input, &[("global", &global)]),
            Err("can't create IP pool input because selector {Priority:0 Network:default/network168 Scope:[{Project:pj1 Namespace:ns1 GuestCluster:*} {Project:pj1 Namespace:* GuestCluster:cluster1}]} is invalid: scope overlaps".into())
        );
    }

    #[test]
    fn case5_distinct_non_zero_priorities_are_fine() {
        let pool1 = mk_spec(
            "192.168.10.0/24",
            "default/network168",
            1,
            &[mk_tuple("pj1", ALL, ALL)],
        );
        let input = mk_spec("192.168.11.0/24", "", 2, &[mk_tuple("pj1", ALL, ALL)]);
        assert_eq!(create(&input, &[("pool1", &pool1)]), Ok(()));
    }

    #[test]
    fn case6_equal_non_zero_priority_is_refused() {
        let pool1 = mk_spec("192.168.10.0/24", "default/network168", 1, &[]);
        let input = mk_spec("192.168.11.0/24", "default/network168", 1, &[]);
        assert_eq!(
            create(&input, &[("pool1", &pool1)]),
            Err("can't create IP pool input because the priority can't be the same as the pool pool1".into())
        );
    }

    #[test]
    fn case7_priority_zero_on_another_network_does_not_clash() {
        let default = mk_spec(
            "192.168.10.0/24",
            "default/network168",
            0,
            &[mk_tuple("pj1", "ns1", "cluster1")],
        );
        let input = mk_spec(
            "192.168.11.0/24",
            "",
            0,
            &[
                mk_tuple("pj1", "ns1", "cluster2"),
                mk_tuple("pj1", "ns2", "cluster1"),
                mk_tuple("pj2", ALL, ALL),
            ],
        );
        assert_eq!(create(&input, &[("default", &default)]), Ok(()));
    }

    #[test]
    fn case8_priority_zero_overlap_is_refused() {
        let default = mk_spec("192.168.10.0/24", "", 0, &[mk_tuple("pj1", ALL, ALL)]);
        let input = mk_spec(
            "192.168.11.0/24",
            "",
            0,
            &[mk_tuple("pj1", "ns1", "cluster2")],
        );
        assert_eq!(
            create(&input, &[("default", &default)]),
            Err("can't create IP pool input because scope selector is same as the pool default with priority 0 Project pj1 Namespace ns1 GuestCluster cluster2, set a different priority or scope".into())
        );
    }

    #[test]
    fn case9_one_global_pool_per_network_and_family() {
        // Upstream refuses a second global pool anywhere; here the rule holds per network and
        // family, and selection prefers the global pool of the load balancer's network.
        let global = mk_spec("192.168.10.0/24", "default/vlan10", 0, &[all()]);
        let elsewhere = mk_spec("192.168.20.0/24", "default/vlan20", 0, &[all()]);
        assert_eq!(create(&elsewhere, &[("global", &global)]), Ok(()));
        let same_network = mk_spec("192.168.30.0/24", "default/vlan10", 0, &[all()]);
        assert_eq!(
            create(&same_network, &[("global", &global)]),
            Err(
                "can't create IP pool input because there is already a global IP pool: global"
                    .into()
            )
        );
        // An IPv6 global pool next to the IPv4 one, and an IPv6 pool with the scope and priority
        // of an IPv4 one: one address of each family for the same load balancers.
        let v6 = mk_spec("fd00:10::/64", "default/vlan10", 0, &[all()]);
        assert_eq!(create(&v6, &[("global", &global)]), Ok(()));
        let scoped = mk_spec("192.168.40.0/24", "", 0, &[mk_tuple(ALL, "ns1", ALL)]);
        let scoped_v6 = mk_spec("fd00:40::/64", "", 0, &[mk_tuple(ALL, "ns1", ALL)]);
        assert_eq!(create(&scoped_v6, &[("scoped", &scoped)]), Ok(()));
        let scoped_again = mk_spec("192.168.41.0/24", "", 0, &[mk_tuple(ALL, "ns1", ALL)]);
        assert!(create(&scoped_again, &[("scoped", &scoped)]).is_err());
    }

    #[test]
    fn case10_equal_priority_on_another_network_is_refused() {
        let pool1 = mk_spec("192.168.10.0/24", "default/vlan10", 1, &[]);
        let input = mk_spec("192.168.11.0/24", "default/vlan11", 1, &[]);
        assert_eq!(
            create(&input, &[("pool1", &pool1)]),
            Err("can't create IP pool input because the priority can't be the same as the pool pool1".into())
        );
    }

    #[test]
    fn range_checks_come_first_and_keep_their_messages() {
        let mut input = mk_spec("192.168.11.0/24", "", 0, &[all()]);
        input.ranges.clear();
        assert_eq!(
            create(&input, &[]),
            Err("can't create IP pool input because range can't be empty".into())
        );
        input.ranges = vec![RangeSpec {
            subnet: "192.168.11.0/24".into(),
            range_start: "192.168.11.0".into(),
            ..RangeSpec::default()
        }];
        assert_eq!(
            create(&input, &[]),
            Err("can't create IP pool input because invalid range start 192.168.11.0: IP 192.168.11.0 is the network address".into())
        );
        input.ranges = vec![
            RangeSpec {
                subnet: "192.168.100.0/24".into(),
                ..RangeSpec::default()
            },
            RangeSpec {
                subnet: "192.168.100.0/24".into(),
                range_start: "192.168.100.10".into(),
                range_end: "192.168.100.20".into(),
                ..RangeSpec::default()
            },
        ];
        assert_eq!(
            create(&input, &[]),
            Err("can't create IP pool input because there are overlaps between range 192.168.100.1-192.168.100.254 and 192.168.100.10-192.168.100.20".into())
        );
    }

    #[test]
    fn cross_pool_overlap_only_on_the_same_network() {
        let other = mk_spec(
            "192.168.100.0/24",
            "default/vlan10",
            0,
            &[mk_tuple(ALL, "a", ALL)],
        );
        let mut input = mk_spec(
            "192.168.100.0/24",
            "default/vlan10",
            0,
            &[mk_tuple(ALL, "b", ALL)],
        );
        input.ranges[0].range_start = "192.168.100.50".into();
        input.ranges[0].range_end = "192.168.100.60".into();
        assert_eq!(
            create(&input, &[("other", &other)]),
            Err("can't create IP pool input because the ranges 192.168.100.50-192.168.100.60 overlap with other pools".into())
        );
        // Same addresses on another VLAN are another broadcast domain: allowed (upstream refuses).
        input.selector.network = "default/vlan20".into();
        assert_eq!(create(&input, &[("other", &other)]), Ok(()));
        // The pool itself in the list is not "another pool".
        assert_eq!(create(&other, &[("input", &other)]), Ok(()));
    }

    #[test]
    fn update_refuses_to_strand_allocations() {
        let mut input = mk_spec("192.168.100.0/24", "", 0, &[mk_tuple(ALL, "a", ALL)]);
        let allocated: BTreeMap<String, String> =
            [("192.168.100.30".to_string(), "default/lb".to_string())]
                .into_iter()
                .collect();
        let entry = |spec: &PoolSpec| {
            validate_update(&mk_entry("input", spec), &allocated, &[]).map_err(|e| e.to_string())
        };
        assert_eq!(entry(&input), Ok(()));
        input.ranges[0].range_end = "192.168.100.20".into();
        assert_eq!(
            entry(&input),
            Err(
                "can't update IP pool input because allocated IP 192.168.100.30 is excluded".into()
            )
        );
        // pkg/webhook/ippool/validator.go (checkAllocated, through allocator.RangeSet.Contains):
        // an allocated address that becomes the gateway is still inside.
        input.ranges[0].range_end = String::new();
        input.ranges[0].gateway = "192.168.100.30".into();
        assert_eq!(entry(&input), Ok(()));
        let junk: BTreeMap<String, String> = [("nope".to_string(), "default/lb".to_string())]
            .into_iter()
            .collect();
        assert_eq!(
            validate_update(&mk_entry("input", &input), &junk, &[]).map_err(|e| e.to_string()),
            Err("can't update IP pool input because invalid ip string nope".into())
        );
    }

    #[test]
    fn the_pool_annotations_ipam_reads_are_judged() {
        let spec = mk_spec("10.0.0.0/16", "", 0, &[mk_tuple(ALL, "a", ALL)]);
        let judge = |skip: &str, selector: &str, spec: &PoolSpec| {
            let entry = PoolEntry {
                options: crate::PoolOptions {
                    skip_addresses: skip,
                    service_selector: selector,
                },
                ..mk_entry("input", spec)
            };
            validate_create(&entry, &[]).map_err(|e| e.to_string())
        };
        for (skip, selector) in [
            ("", ""),
            ("firstLast", ""),
            ("dot0And255", "app=web"),
            ("firstLast,dot0And255", "app in (a,b),!canary"),
        ] {
            assert_eq!(
                judge(skip, selector, &spec),
                Ok(()),
                "{skip:?} {selector:?}"
            );
        }
        assert_eq!(
            judge("dot0", "", &spec),
            Err("can't create IP pool input because annotation loadbalancer.harvesterhci.io/skipAddresses \"dot0\" names \"dot0\", which is not firstLast (each range's subnet's first and last address) or dot0And255 (every IPv4 address ending in .0 or .255); the value is a comma-separated list of those".into())
        );
        assert_eq!(
            judge("", "app=", &spec),
            Ok(()),
            "the empty value is a value"
        );
        assert_eq!(
            judge("", "app=web,", &spec),
            Err("can't create IP pool input because annotation loadbalancer.harvesterhci.io/serviceSelector \"app=web,\" is not a label selector: a ',' must be followed by another requirement".into())
        );
        // A range whose only addresses the pool skips.
        let mut dot = mk_spec("10.0.1.0/24", "", 0, &[mk_tuple(ALL, "a", ALL)]);
        dot.ranges.push(RangeSpec {
            subnet: "10.0.2.0/23".into(),
            range_start: "10.0.2.255".into(),
            range_end: "10.0.3.0".into(),
            ..RangeSpec::default()
        });
        assert_eq!(judge("firstLast", "", &dot), Ok(()));
        assert_eq!(
            judge("dot0And255", "", &dot),
            Err("can't create IP pool input because range 10.0.2.255-10.0.3.0 has no address left to hand out once annotation loadbalancer.harvesterhci.io/skipAddresses (dot0And255) skips its addresses".into())
        );
        let v6 = mk_spec("fd00::/127", "", 0, &[mk_tuple(ALL, "a", ALL)]);
        assert!(judge("", "", &v6).is_err(), "nothing to hand out anyway");
        let v6 = PoolSpec {
            ranges: vec![RangeSpec {
                subnet: "fd00::/126".into(),
                range_start: "fd00::2".into(),
                ..RangeSpec::default()
            }],
            ..v6
        };
        // fd00::2 and fd00::3 (the subnet's last), with fd00::1 the gateway outside the range.
        assert_eq!(judge("firstLast", "", &v6), Ok(()));
        // An update that skips an allocated address is fine: it stays held.
        let allocated: BTreeMap<String, String> =
            [("10.0.1.0".to_string(), "default/lb".to_string())].into();
        let entry = PoolEntry {
            options: crate::PoolOptions {
                skip_addresses: "dot0And255",
                service_selector: "",
            },
            ..mk_entry("input", &spec)
        };
        assert_eq!(validate_update(&entry, &allocated, &[]), Ok(()));
    }

    #[test]
    fn delete_needs_an_empty_pool() {
        assert_eq!(validate_delete("p", &BTreeMap::new()), Ok(()));
        let allocated: BTreeMap<String, String> = [("10.0.0.1".to_string(), "ns/lb".to_string())]
            .into_iter()
            .collect();
        assert_eq!(
            validate_delete("p", &allocated).map_err(|e| e.to_string()),
            Err("can't delete pool before releasing all the allocated IP".into())
        );
    }
}
