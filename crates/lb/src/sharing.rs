//! LoadBalancers sharing one pool address by a sharing key (`loadbalancer.harvesterhci.io/sharing-key`,
//! or MetalLB's or Cilium's key as an alias): those of one namespace with the same key share one
//! address when their listeners' (protocol, port)s do not clash.
//!
//! The pool keeps upstream's format, one owner per address: its status names one of the group, the
//! holder; the others (the sharers) carry the same `status.allocatedAddress` and hold nothing in the
//! pool. When the holder goes (deleted, refused, or its key changed), the address is handed to the
//! next member in the same pool round ([`crate::pools::PoolOp::Handover`]), so nobody else can take it in between;
//! the last member's going releases it. Upstream's controller, after a switch back, leaves every
//! member's status alone (its `ipPool` is set), releases nothing for a sharer, and releases the
//! address when the holder the pool names is deleted, although sharers remain (see the manual).
//!
//! This module holds the decisions and what the process remembers of the groups ([`Groups`]); the
//! LoadBalancer reconciler applies them (`loadbalancer::shared`).
//!
//! [`decide`] judges the group as a whole: the holder first, then those sharing the address, then the
//! oldest; a member is admitted when it can share at all (pool IPAM), agrees with the first (workload
//! type, explicit pool, requested address, family), may use the address's pool, and its listeners are
//! free.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
};

use crate::{
    crd::{AllocatedAddress, LoadBalancer, keys},
    ipam::{Allocation, PoolAllocator, PoolError},
    store::validation::go_quote,
    sync::lock,
};

/// Why a load balancer is refused a share (its Ready reason and Event).
pub const SHARING_REFUSED: &str = "SharingRefused";
/// A holder that went handed the group's address to another member (an Event on the one that went).
pub const HANDED_OVER: &str = "AddressHandedOver";
/// A member took its group's address (an Event on it, in place of `Allocated`).
pub const SHARED: &str = "AddressShared";

/// The annotations a LoadBalancer's sharing key is read from: ours first, then MetalLB's (current
/// and legacy) and Cilium's.
pub const KEY_ANNOTATIONS: [&str; 4] = [
    keys::ANNOTATION_SHARING_KEY,
    keys::METALLB_SHARING_KEY,
    keys::METALLB_LEGACY_SHARING_KEY,
    keys::CILIUM_SHARING_KEY,
];

/// A LoadBalancer's sharing key (`None`: none); `Err` when two annotations name different keys.
pub fn sharing_key(lb: &LoadBalancer) -> Result<Option<String>, String> {
    let found: Vec<(&str, &str)> = KEY_ANNOTATIONS
        .iter()
        .filter_map(|a| {
            lb.metadata
                .annotations
                .as_ref()
                .and_then(|m| m.get(*a))
                .map(|v| v.trim())
                .filter(|v| !v.is_empty())
                .map(|v| (*a, v))
        })
        .collect();
    let Some(&(_, first)) = found.first() else {
        return Ok(None);
    };
    if found.iter().any(|(_, v)| *v != first) {
        return Err(format!(
            "load balancer {}: the sharing key annotations disagree: {}",
            lb.applicant(),
            found
                .iter()
                .map(|(a, v)| format!("{a} is {}", go_quote(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(Some(first.to_string()))
}

/// The (protocol, port)s of a LoadBalancer's listeners.
pub(crate) fn ports(lb: &LoadBalancer) -> Vec<(String, i32)> {
    let mut ports: Vec<(String, i32)> = lb
        .spec
        .listeners
        .iter()
        .map(|l| (l.effective_protocol().to_string(), l.port))
        .collect();
    ports.sort();
    ports.dedup();
    ports
}

/// The group's address and its holder (the member the pool names), as the decision sees them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// `namespace/name` of the holder.
    pub holder: String,
    pub address: AllocatedAddress,
}

/// The judgement of a group.
#[derive(Clone, Debug, Default)]
pub struct Decision {
    /// Admitted members (`namespace/name`), in order of precedence.
    pub admitted: Vec<String>,
    /// `namespace/name` → why it is refused.
    pub refused: BTreeMap<String, String>,
}

/// Judges group `key` over its members (the LoadBalancers of one namespace giving the key, not being
/// deleted): `held` is the group's address, if one of them holds it; `eligible` the pools a member
/// may use (`Err`: why none).
pub fn decide(
    key: &str,
    members: &[&LoadBalancer],
    held: Option<&Held>,
    eligible: impl Fn(&LoadBalancer) -> Result<Vec<String>, String>,
) -> Decision {
    let quoted = go_quote(key);
    let mut order: Vec<&LoadBalancer> = members.to_vec();
    let rank = |lb: &LoadBalancer| {
        let me = lb.applicant();
        let status_ip = lb
            .status
            .as_ref()
            .map(|s| s.allocated_address.ip.as_str())
            .unwrap_or_default();
        match held {
            Some(h) if h.holder == me => 0,
            Some(h) if !status_ip.is_empty() && h.address.ip == status_ip => 1,
            _ => 2,
        }
    };
    order.sort_by_key(|lb| {
        let created = lb.metadata.creation_timestamp.as_ref().map(|t| t.0);
        (rank(lb), created.is_none(), created, lb.applicant())
    });
    let mut decision = Decision::default();
    let mut reference: Option<&LoadBalancer> = None;
    let mut taken: BTreeMap<(String, i32), String> = BTreeMap::new();
    for lb in order {
        let me = lb.applicant();
        let cannot = |reason: String| {
            format!("load balancer {me} cannot share an address by sharing key {quoted}: {reason}")
        };
        let disagree = |what: &str, mine: String, theirs: String, other: &str| {
            format!(
                "load balancer {me} cannot share the address of sharing key {quoted}: its {what} is {mine}, and load balancer {other}'s is {theirs}"
            )
        };
        let refusal = if lb.is_dhcp() {
            Some(cannot(
                "its IPAM mode is dhcp: a DHCP lease is held by one load balancer's Service and cannot outlive it, so only pool addresses are shared by key".into(),
            ))
        } else if let Err(e) = lb.address_request() {
            Some(cannot(e))
        } else if let Some(r) = reference {
            let other = r.applicant();
            let quote_or_none = |s: &str| {
                if s.is_empty() {
                    "none".to_string()
                } else {
                    go_quote(s)
                }
            };
            let request = |lb: &LoadBalancer| {
                lb.requested_ip()
                    .ok()
                    .flatten()
                    .map_or_else(|| "none".to_string(), |ip| ip.to_string())
            };
            let family = |lb: &LoadBalancer| {
                lb.address_request()
                    .ok()
                    .and_then(|(_, f)| f)
                    .map_or_else(|| "none".to_string(), |f| f.to_string())
            };
            if lb.workload_type() != r.workload_type() {
                Some(disagree(
                    "workload type",
                    go_quote(&lb.spec.workload_type),
                    go_quote(&r.spec.workload_type),
                    &other,
                ))
            } else if lb.spec.ip_pool != r.spec.ip_pool {
                Some(disagree(
                    "IP pool",
                    quote_or_none(&lb.spec.ip_pool),
                    quote_or_none(&r.spec.ip_pool),
                    &other,
                ))
            } else if request(lb) != request(r) {
                Some(disagree(
                    "requested address",
                    request(lb),
                    request(r),
                    &other,
                ))
            } else if family(lb) != family(r) {
                Some(disagree("IP family", family(lb), family(r), &other))
            } else {
                None
            }
        } else {
            None
        };
        let refusal = refusal.or_else(|| {
            let held = held?;
            if held.holder == me {
                return None;
            }
            match eligible(lb) {
                Ok(pools) if pools.contains(&held.address.ip_pool) => None,
                Ok(pools) => Some(cannot(format!(
                    "the group's address {} is in IP pool {}, which it may not use (eligible: {})",
                    held.address.ip,
                    held.address.ip_pool,
                    pools.join(", ")
                ))),
                Err(e) => Some(cannot(e)),
            }
        });
        let refusal = refusal.or_else(|| {
            let clashes: Vec<String> = ports(lb)
                .iter()
                .filter_map(|p| {
                    taken
                        .get(p)
                        .map(|h| format!("{}/{} is held by load balancer {h}", p.0, p.1))
                })
                .collect();
            (!clashes.is_empty()).then(|| {
                format!(
                    "load balancer {me} cannot share the address of sharing key {quoted}: {}",
                    clashes.join("; ")
                )
            })
        });
        match refusal {
            Some(message) => {
                decision.refused.insert(me, message);
            }
            None => {
                for p in ports(lb) {
                    taken.insert(p, me.clone());
                }
                reference.get_or_insert(lb);
                decision.admitted.push(me);
            }
        }
    }
    decision
}

/// A sharing group's address `ip`, held by `from`, goes to `to` in one pool round (nobody else can
/// take it in between): `None` when `from` does not hold it (nothing happens); the error when `to`
/// cannot take it (it is then free).
pub(crate) fn hand_over_in(
    allocator: &mut PoolAllocator,
    from: &str,
    to: &str,
    ip: std::net::IpAddr,
) -> Option<Result<Allocation, PoolError>> {
    if allocator.holder(ip) != Some(from) {
        return None;
    }
    allocator.release(from);
    Some(allocator.request_ip(to, ip))
}

/// What this process remembers of the groups: their addresses as allocated or handed over here
/// (the pool cache may not show them yet), one lock per group, and what each member last asked.
#[derive(Default)]
pub struct Groups {
    /// `namespace/key` → the group's address and holder.
    pub(crate) held: Mutex<HashMap<String, Held>>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// `namespace/name` → what it asked when last applied.
    pub(crate) asked: Mutex<HashMap<String, Asked>>,
}

/// What a member asks of its group: its key, its listeners' (protocol, port)s and its explicit pool.
pub(crate) type Asked = (String, Vec<(String, i32)>, String);

impl Groups {
    /// The lock of group `namespace/key`: its members are decided one at a time.
    pub(crate) fn lock(&self, group: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.locks)
            .entry(group.to_string())
            .or_default()
            .clone()
    }
}

/// A group's name in [`Groups`]: `namespace/key`.
pub(crate) fn group_id(namespace: &str, key: &str) -> String {
    format!("{namespace}/{key}")
}

#[cfg(test)]
mod tests;
