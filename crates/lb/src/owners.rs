//! Who holds each address of an IPPool (`GET …/ippools/{name}/addresses`): the pool's
//! `status.allocated` and `status.allocatedHistory`, each allocated entry joined with the
//! LoadBalancer it names (its guest cluster and guest Service, and when it got the address).
//!
//! Pure: the caller reads the pool and one list of LoadBalancers; nothing here does I/O. The pool
//! status is the truth: an entry whose LoadBalancer is gone is listed with `exists: false` (a leak,
//! which the `manuallyReleaseIP` annotation releases), never dropped.
//!
//! The figures are what the pool hands out: for a pool that skips addresses (annotation
//! `loadbalancer.harvesterhci.io/skipAddresses`), the skipped ones are counted neither in `total`
//! nor in `available`, where the status keeps upstream's counts.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
};

use serde::Serialize;
use time::{OffsetDateTime, format_description::well_known::Rfc3339};

use crate::{
    crd::{
        IPPool, LoadBalancer,
        keys::{LABEL_GUEST_CLUSTER, LABEL_SERVICE_NAME, LABEL_SERVICE_NAMESPACE},
    },
    ipam::{PoolAllocator, PoolStatus, WorkloadType},
};

/// steve's type name of the answer.
pub(crate) const ADDRESSES_TYPE: &str = "loadbalancer.harvesterhci.io.ippool.addresses";

/// The LoadBalancer condition saying which address it was given and when
/// (`message: "<ip> from IP pool <pool>"`, `lastTransitionTime`: the allocation). Upstream's
/// controller and older versions of ours write none; their addresses have no allocation time.
pub use crate::crd::keys::CONDITION_ADDRESS_ALLOCATED as ADDRESS_ALLOCATED;

/// The owners of a pool's addresses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolAddresses {
    #[serde(rename = "type")]
    pub type_: &'static str,
    pub pool: String,
    /// The addresses the pool hands out, and those of them nobody holds: `status.total` and
    /// `status.available` as the reconciler counted them (0 without a status), less the addresses
    /// the pool skips.
    pub total: i64,
    pub available: i64,
    /// `status.allocated`, by address (IPv4 before IPv6), then the keys that are no address.
    pub addresses: Vec<Address>,
    /// `status.allocatedHistory`, in the same order.
    pub history: Vec<Released>,
}

/// One allocated address and its holder. `None` serialises as `null`: the fields are always there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Address {
    pub ip: String,
    /// `<namespace>/<name>`, as the pool status names it.
    pub load_balancer: String,
    /// Whether that LoadBalancer exists.
    pub exists: bool,
    /// A guest load balancer's cluster (label `cloudprovider.harvesterhci.io/cluster`).
    pub guest_cluster: Option<String>,
    /// A guest load balancer's Service, `<namespace>/<name>` (labels
    /// `cloudprovider.harvesterhci.io/serviceNamespace` and `…/serviceName`).
    pub service: Option<String>,
    /// When the address was allocated (RFC 3339), from the LoadBalancer's [`ADDRESS_ALLOCATED`]
    /// condition about this address.
    pub allocated: Option<String>,
}

/// A released address kept for its last holder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Released {
    pub ip: String,
    pub load_balancer: String,
}

/// The owners of `pool`'s addresses, joined with `lbs` (every LoadBalancer; others are ignored).
pub fn addresses(pool: &IPPool, lbs: &[LoadBalancer]) -> PoolAddresses {
    let by_id: HashMap<String, &LoadBalancer> = lbs.iter().map(|lb| (lb.applicant(), lb)).collect();
    let no_status = PoolStatus::default();
    let status = pool.status.as_ref().unwrap_or(&no_status);
    let addresses = in_address_order(&status.allocated)
        .map(|(ip, holder)| {
            let lb = by_id.get(holder).copied();
            let (guest_cluster, service) = lb.map(guest_of).unwrap_or_default();
            Address {
                ip: ip.clone(),
                load_balancer: holder.clone(),
                exists: lb.is_some(),
                guest_cluster,
                service,
                allocated: lb.and_then(|lb| allocated_at(lb, ip)),
            }
        })
        .collect();
    let history = in_address_order(&status.allocated_history)
        .map(|(ip, holder)| Released {
            ip: ip.clone(),
            load_balancer: holder.clone(),
        })
        .collect();
    let (total, available) = counts(pool, status);
    PoolAddresses {
        type_: ADDRESSES_TYPE,
        pool: pool.name().to_string(),
        total,
        available,
        addresses,
        history,
    }
}

/// The status's counters, or for a pool that skips addresses, the addresses it hands out and
/// those of them nobody holds (recounted from the ranges and the status; an address held from
/// before the pool skipped it counts in neither).
fn counts(pool: &IPPool, status: &PoolStatus) -> (i64, i64) {
    let skip = match pool.skip() {
        Ok(skip) if !skip.is_none() => skip,
        // Nothing skipped, or an annotation the reconciler refuses too (the pool is not Ready).
        _ => return (status.total, status.available),
    };
    match PoolAllocator::from_status(pool.name(), &pool.spec.ranges, status) {
        Ok(mut allocator) => {
            allocator.set_skip(skip);
            let count = |n: u128| i64::try_from(n).unwrap_or(i64::MAX);
            (count(allocator.capacity()), count(allocator.free()))
        }
        Err(_) => (status.total, status.available),
    }
}

/// The entries by address (IPv4 before IPv6, each numerically), then the keys that are no address
/// (hand edits) in text order; text breaks ties between spellings of one address.
fn in_address_order(
    entries: &BTreeMap<String, String>,
) -> impl Iterator<Item = (&String, &String)> {
    let mut sorted: Vec<(Option<IpAddr>, &String, &String)> = entries
        .iter()
        .map(|(ip, holder)| (ip.parse().ok(), ip, holder))
        .collect();
    sorted.sort_by(|(a, a_text, _), (b, b_text, _)| {
        // `None` last: an address before anything that is not one.
        (a.is_none(), a, a_text).cmp(&(b.is_none(), b, b_text))
    });
    sorted.into_iter().map(|(_, ip, holder)| (ip, holder))
}

/// A guest load balancer's cluster and Service; `None` for a VM load balancer, and for a label
/// that is missing or empty.
fn guest_of(lb: &LoadBalancer) -> (Option<String>, Option<String>) {
    if lb.workload_type() != WorkloadType::Cluster {
        return (None, None);
    }
    let label = |key: &str| {
        lb.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(key))
            .filter(|v| !v.is_empty())
            .cloned()
    };
    let service = match (label(LABEL_SERVICE_NAMESPACE), label(LABEL_SERVICE_NAME)) {
        (Some(namespace), Some(name)) => Some(format!("{namespace}/{name}")),
        _ => None,
    };
    (label(LABEL_GUEST_CLUSTER), service)
}

/// When `lb` got `ip`: the transition time of its [`ADDRESS_ALLOCATED`] condition, if that is True,
/// is about this address (its message starts with the address and a space: `10.0.0.5` is not
/// `10.0.0.50`) and carries an RFC 3339 time.
fn allocated_at(lb: &LoadBalancer, ip: &str) -> Option<String> {
    let condition = lb
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.r#type == ADDRESS_ALLOCATED)?;
    let about_ip = condition
        .message
        .strip_prefix(ip)
        .is_some_and(|rest| rest.starts_with(' '));
    let time = &condition.last_transition_time;
    (condition.status == "True" && about_ip && OffsetDateTime::parse(time, &Rfc3339).is_ok())
        .then(|| time.clone())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ipam::Condition;

    fn mk_pool(name: &str, allocated: &[(&str, &str)], history: &[(&str, &str)]) -> IPPool {
        let map = |entries: &[(&str, &str)]| {
            entries
                .iter()
                .map(|(ip, lb)| (ip.to_string(), lb.to_string()))
                .collect()
        };
        let mut pool = IPPool::new(name, Default::default());
        pool.status = Some(PoolStatus {
            total: 11,
            available: 11 - allocated.len() as i64,
            allocated: map(allocated),
            allocated_history: map(history),
            ..Default::default()
        });
        pool
    }

    fn mk_lb(namespace: &str, name: &str) -> LoadBalancer {
        let mut lb = LoadBalancer::new(name, Default::default());
        lb.metadata.namespace = Some(namespace.into());
        lb
    }

    fn mk_guest_lb(namespace: &str, name: &str, labels: &[(&str, &str)]) -> LoadBalancer {
        let mut lb = mk_lb(namespace, name);
        lb.spec.workload_type = "cluster".into();
        lb.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        lb
    }

    fn mk_condition(type_: &str, status: &str, message: &str, time: &str) -> Condition {
        Condition {
            r#type: type_.into(),
            status: status.into(),
            message: message.into(),
            last_transition_time: time.into(),
            ..Default::default()
        }
    }

    fn with_conditions(mut lb: LoadBalancer, conditions: Vec<Condition>) -> LoadBalancer {
        lb.status.get_or_insert_default().conditions = conditions;
        lb
    }

    fn guest_labels<'a>(cluster: &'a str, ns: &'a str, svc: &'a str) -> [(&'a str, &'a str); 3] {
        [
            (LABEL_GUEST_CLUSTER, cluster),
            (LABEL_SERVICE_NAMESPACE, ns),
            (LABEL_SERVICE_NAME, svc),
        ]
    }

    #[test]
    fn joins_each_address_with_its_load_balancer() {
        let pool = mk_pool(
            "p",
            &[
                ("10.0.0.10", "default/vm"),
                ("10.0.0.11", "guests/gc1-lb"),
                ("10.0.0.12", "default/ghost"),
            ],
            &[("10.0.0.13", "default/old")],
        );
        let lbs = [
            mk_lb("default", "vm"),
            mk_guest_lb(
                "guests",
                "gc1-lb",
                &guest_labels("gc1", "kube-system", "ingress"),
            ),
            mk_lb("default", "unrelated"),
        ];
        let got = addresses(&pool, &lbs);
        assert_eq!(got.pool, "p");
        assert_eq!((got.total, got.available), (11, 8));
        let mk =
            |ip: &str, lb: &str, exists, cluster: Option<&str>, service: Option<&str>| Address {
                ip: ip.into(),
                load_balancer: lb.into(),
                exists,
                guest_cluster: cluster.map(Into::into),
                service: service.map(Into::into),
                allocated: None,
            };
        assert_eq!(
            got.addresses,
            [
                mk("10.0.0.10", "default/vm", true, None, None),
                mk(
                    "10.0.0.11",
                    "guests/gc1-lb",
                    true,
                    Some("gc1"),
                    Some("kube-system/ingress")
                ),
                mk("10.0.0.12", "default/ghost", false, None, None),
            ]
        );
        assert_eq!(
            got.history,
            [Released {
                ip: "10.0.0.13".into(),
                load_balancer: "default/old".into()
            }]
        );
    }

    #[test]
    fn vm_load_balancers_have_no_guest_even_with_the_labels() {
        let mut vm = mk_guest_lb("default", "vm", &guest_labels("gc1", "ns", "svc"));
        vm.spec.workload_type = "vm".into();
        let got = addresses(&mk_pool("p", &[("10.0.0.10", "default/vm")], &[]), &[vm]);
        assert_eq!(got.addresses[0].guest_cluster, None);
        assert_eq!(got.addresses[0].service, None);
    }

    #[test]
    fn missing_or_empty_guest_labels_are_null() {
        let lbs = [
            mk_guest_lb("default", "only-cluster", &[(LABEL_GUEST_CLUSTER, "gc1")]),
            mk_guest_lb("default", "empty", &guest_labels("", "ns", "")),
            mk_guest_lb("default", "none", &[]),
        ];
        let pool = mk_pool(
            "p",
            &[
                ("10.0.0.1", "default/only-cluster"),
                ("10.0.0.2", "default/empty"),
                ("10.0.0.3", "default/none"),
            ],
            &[],
        );
        let got: Vec<(Option<String>, Option<String>)> = addresses(&pool, &lbs)
            .addresses
            .into_iter()
            .map(|a| (a.guest_cluster, a.service))
            .collect();
        assert_eq!(
            got,
            [(Some("gc1".into()), None), (None, None), (None, None)]
        );
    }

    #[test]
    fn addresses_sort_numerically_ipv4_first_then_what_is_no_address() {
        let ips = [
            "10.0.0.9",
            "10.0.0.10",
            "9.255.255.255",
            "2001:db8::10",
            "2001:db8::9",
            "::1",
            "10.0.0.100",
            "not-an-ip",
            "010.0.0.1",
            "",
        ];
        let entries: Vec<(&str, &str)> = ips.iter().map(|ip| (*ip, "default/x")).collect();
        let got = addresses(&mk_pool("p", &entries, &entries), &[]);
        let order = [
            "9.255.255.255",
            "10.0.0.9",
            "10.0.0.10",
            "10.0.0.100",
            "::1",
            "2001:db8::9",
            "2001:db8::10",
            "",
            "010.0.0.1",
            "not-an-ip",
        ];
        let listed: Vec<&str> = got.addresses.iter().map(|a| a.ip.as_str()).collect();
        assert_eq!(listed, order);
        let listed: Vec<&str> = got.history.iter().map(|a| a.ip.as_str()).collect();
        assert_eq!(listed, order);
    }

    #[test]
    fn allocation_time_comes_from_the_condition_about_this_address() {
        let at = "2026-12-01T16:44:23Z";
        let cases = [
            (
                vec![mk_condition(
                    ADDRESS_ALLOCATED,
                    "True",
                    "10.0.0.5 from IP pool p",
                    at,
                )],
                Some(at),
            ),
            // Another condition type, a False one, another address that starts alike, no space, a
            // time that is not RFC 3339, no time.
            (
                vec![mk_condition("Ready", "True", "10.0.0.5 from IP pool p", at)],
                None,
            ),
            (
                vec![mk_condition(
                    ADDRESS_ALLOCATED,
                    "False",
                    "10.0.0.5 from IP pool p",
                    at,
                )],
                None,
            ),
            (
                vec![mk_condition(
                    ADDRESS_ALLOCATED,
                    "True",
                    "10.0.0.50 from IP pool p",
                    at,
                )],
                None,
            ),
            (
                vec![mk_condition(ADDRESS_ALLOCATED, "True", "10.0.0.5", at)],
                None,
            ),
            (
                vec![mk_condition(
                    ADDRESS_ALLOCATED,
                    "True",
                    "10.0.0.5 from IP pool p",
                    "yesterday",
                )],
                None,
            ),
            (
                vec![mk_condition(
                    ADDRESS_ALLOCATED,
                    "True",
                    "10.0.0.5 from IP pool p",
                    "",
                )],
                None,
            ),
            (vec![], None),
        ];
        let pool = mk_pool("p", &[("10.0.0.5", "default/lb")], &[]);
        for (conditions, want) in cases {
            let lb = with_conditions(mk_lb("default", "lb"), conditions.clone());
            let got = addresses(&pool, &[lb]);
            assert_eq!(
                got.addresses[0].allocated.as_deref(),
                want,
                "{conditions:?}"
            );
        }
    }

    #[test]
    fn a_pool_that_skips_addresses_counts_only_what_it_hands_out() {
        // 10.0.0.254 to 10.0.1.1: four addresses, of which dot0And255 skips .255 and 1.0; one
        // of those is held from before the pool skipped it.
        let mut pool = mk_pool(
            "p",
            &[("10.0.0.254", "default/a"), ("10.0.0.255", "default/b")],
            &[("10.0.1.0", "default/old")],
        );
        pool.spec.pool.ranges = vec![crate::ipam::RangeSpec {
            subnet: "10.0.0.0/16".into(),
            range_start: "10.0.0.254".into(),
            range_end: "10.0.1.1".into(),
            ..Default::default()
        }];
        let status = pool.status.as_mut().expect("status");
        (status.total, status.available) = (4, 2);
        let got = addresses(&pool, &[]);
        assert_eq!((got.total, got.available), (4, 2), "nothing skipped yet");
        pool.metadata.annotations = Some(
            [(
                crate::crd::keys::SKIP_ADDRESSES.to_string(),
                "dot0And255".to_string(),
            )]
            .into(),
        );
        let got = addresses(&pool, &[]);
        assert_eq!((got.total, got.available), (2, 1));
        // Every held address is listed, skipped or not.
        assert_eq!(got.addresses.len(), 2);
        // An annotation that does not read: the status's counters (the pool is not Ready).
        pool.metadata.annotations = Some(
            [(
                crate::crd::keys::SKIP_ADDRESSES.to_string(),
                "dot0".to_string(),
            )]
            .into(),
        );
        assert_eq!(
            (addresses(&pool, &[]).total, addresses(&pool, &[]).available),
            (4, 2)
        );
    }

    #[test]
    fn a_pool_without_status_holds_nothing() {
        let pool = IPPool::new("fresh", Default::default());
        let got = addresses(&pool, &[mk_lb("default", "lb")]);
        assert_eq!((got.total, got.available), (0, 0));
        assert!(got.addresses.is_empty() && got.history.is_empty());
    }

    #[test]
    fn the_answer_has_every_field_with_nulls() {
        let lb = with_conditions(
            mk_guest_lb("default", "lb", &guest_labels("gc1", "ns", "svc")),
            vec![mk_condition(
                ADDRESS_ALLOCATED,
                "True",
                "2001:db8::5 from IP pool p6",
                "2026-12-01T16:44:23Z",
            )],
        );
        let pool = mk_pool(
            "p6",
            &[
                ("2001:db8::5", "default/lb"),
                ("2001:db8::6", "default/gone"),
            ],
            &[("2001:db8::7", "default/gone")],
        );
        assert_eq!(
            serde_json::to_value(addresses(&pool, &[lb])).expect("serialises"),
            json!({
                "type": "loadbalancer.harvesterhci.io.ippool.addresses",
                "pool": "p6",
                "total": 11,
                "available": 9,
                "addresses": [
                    {"ip": "2001:db8::5", "loadBalancer": "default/lb", "exists": true,
                     "guestCluster": "gc1", "service": "ns/svc",
                     "allocated": "2026-12-01T16:44:23Z"},
                    {"ip": "2001:db8::6", "loadBalancer": "default/gone", "exists": false,
                     "guestCluster": null, "service": null, "allocated": null}
                ],
                "history": [{"ip": "2001:db8::7", "loadBalancer": "default/gone"}]
            })
        );
    }
}
