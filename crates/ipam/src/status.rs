//! The IPPool `status` as stored (camelCase JSON), and the conversion between it and a live
//! [`PoolAllocator`].
//!
//! The status is the only durable state, so [`PoolAllocator::from_status`] must rebuild exactly what
//! was held: after a restart no held address may be handed out again. Entries the allocator cannot
//! interpret are kept verbatim rather than dropped, so writing the status back never loses an
//! allocation.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::addr::{from_key, key, parse_ip};
use super::allocator::{Addrs, PoolAllocator, PoolError};
use super::range::RangeSet;
use super::spec::{RangeSpec, null_as_default};

/// The pool's allocation state: who holds which address, and who held the released ones.
// `IPPool.status`. `total` and `available` are `int64` in the CRD; a pool larger than that (an
// IPv6 `/64` has 2^64-2 usable addresses) reports `i64::MAX`. The allocator itself counts in `u128`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = required_counters)]
pub struct PoolStatus {
    #[serde(default, deserialize_with = "null_as_default")]
    pub total: i64,
    #[serde(default, deserialize_with = "null_as_default")]
    pub available: i64,
    // Empty when nothing was ever allocated.
    #[serde(default, deserialize_with = "null_as_default")]
    pub last_allocated: String,
    /// IP -> `<lbNamespace>/<lbName>`.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub allocated: BTreeMap<String, String>,
    /// Released IP -> its last `<lbNamespace>/<lbName>`.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub allocated_history: BTreeMap<String, String>,
    // Owned by the pool reconciler; the allocator never reads or writes them.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditions: Vec<Condition>,
}

/// Upstream's status fields `total`, `available` and `lastAllocated` are required; they are read
/// leniently here (a status written by hand may lack them), so the schema says so explicitly.
fn required_counters(schema: &mut schemars::Schema) {
    schema.insert(
        "required".into(),
        serde_json::json!(["available", "lastAllocated", "total"]),
    );
}

/// A status condition; the only type is `Ready`.
// wrangler's generic condition, as IPPools and LoadBalancers both carry it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(default, deserialize_with = "null_as_default")]
    pub r#type: String,
    /// `True`, `False` or `Unknown`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub status: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub last_update_time: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub last_transition_time: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub reason: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub message: String,
}

fn saturating_i64(value: u128) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl PoolAllocator {
    /// Rebuilds a pool from its spec ranges and stored status, as upstream's pool controller does on
    /// start and on a range change: `total`/`available` are recomputed and history outside the ranges
    /// is pruned. Held entries are all kept, even those outside the ranges (see
    /// [`PoolAllocator::strays`]); only invalid ranges are an error.
    pub fn from_status(
        name: &str,
        ranges: &[RangeSpec],
        status: &PoolStatus,
    ) -> Result<Self, PoolError> {
        let ranges = RangeSet::parse(ranges).map_err(|source| PoolError::ParseRanges {
            pool: name.into(),
            source,
        })?;
        let mut pool = PoolAllocator::empty(name, ranges);

        let mut held: Vec<(u128, &str, &str)> = Vec::with_capacity(status.allocated.len());
        for (ip, id) in &status.allocated {
            match parse_ip(ip).map(key) {
                Some(value) => held.push((value, ip, id)),
                None => {
                    pool.foreign.insert(ip.clone(), id.clone());
                }
            }
        }
        // The map is sorted as text; sorting as numbers lets the trees be bulk-built and the runs
        // be found in one pass. A stable sort keeps the text order between two spellings of one
        // address, so which one is kept does not vary between runs.
        held.sort_by_key(|&(value, _, _)| value);

        let mut ids: HashMap<Arc<str>, Addrs> = HashMap::with_capacity(held.len());
        let mut by_ip: Vec<(u128, Arc<str>)> = Vec::with_capacity(held.len());
        let mut runs: Vec<(u128, u128)> = Vec::new();
        for (value, text, id) in held {
            if by_ip.last().is_some_and(|(last, _)| *last == value) {
                // Two spellings of one address (`10.0.0.1` and `::ffff:10.0.0.1`): keep the second
                // verbatim so it is neither lost nor counted twice.
                pool.foreign.insert(text.into(), id.into());
                continue;
            }
            let key = match ids.get_key_value(id) {
                Some((key, _)) => key.clone(),
                None => Arc::from(id),
            };
            ids.entry(key.clone())
                .and_modify(|values| values.insert(value))
                .or_insert(Addrs::One(value));
            by_ip.push((value, key));
            match runs.last_mut() {
                Some((_, end)) if end.checked_add(1) == Some(value) => *end = value,
                _ => runs.push((value, value)),
            }
        }
        pool.in_use = by_ip
            .iter()
            .filter(|(v, _)| pool.ranges.usable_value(*v))
            .count() as u128;
        pool.by_ip = by_ip.into_iter().collect();
        pool.by_id = ids;
        pool.runs = runs.into_iter().collect();

        for (ip, id) in &status.allocated_history {
            let Some(value) = parse_ip(ip).map(key) else {
                continue;
            };
            if !pool.ranges.usable_value(value) || pool.by_ip.contains_key(&value) {
                continue;
            }
            if pool.history.contains_key(&value) {
                continue;
            }
            let key = match (
                pool.by_id.get_key_value(id.as_str()),
                pool.history_by_id.get_key_value(id.as_str()),
            ) {
                (Some((key, _)), _) | (None, Some((key, _))) => key.clone(),
                (None, None) => Arc::from(id.as_str()),
            };
            pool.history_by_id
                .entry(key.clone())
                .and_modify(|values| values.insert(value))
                .or_insert(Addrs::One(value));
            pool.history.insert(value, key);
        }

        pool.last_allocated = parse_ip(&status.last_allocated).map(key);
        Ok(pool)
    }

    /// The status to store, with no conditions.
    pub fn status(&self) -> PoolStatus {
        let mut status = PoolStatus::default();
        self.write_status(&mut status);
        status
    }

    /// Overwrites everything in `status` but the conditions.
    pub fn write_status(&self, status: &mut PoolStatus) {
        let text = |value: u128| from_key(value).to_string();
        self.write_counters(status);
        status.allocated = self
            .by_ip
            .iter()
            .map(|(v, id)| (text(*v), id.to_string()))
            .chain(self.foreign.iter().map(|(ip, id)| (ip.clone(), id.clone())))
            .collect();
        status.allocated_history = self
            .history
            .iter()
            .map(|(v, id)| (text(*v), id.to_string()))
            .collect();
    }

    /// `total`, `available` and `lastAllocated`.
    pub(crate) fn write_counters(&self, status: &mut PoolStatus) {
        status.total = saturating_i64(self.total());
        status.available = saturating_i64(self.available());
        status.last_allocated = self
            .last_allocated
            .map(|value| from_key(value).to_string())
            .unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    fn mk_range(subnet: &str, start: &str, end: &str) -> RangeSpec {
        RangeSpec {
            range_start: start.into(),
            range_end: end.into(),
            subnet: subnet.into(),
            gateway: String::new(),
        }
    }

    fn mk_status(allocated: &[(&str, &str)], history: &[(&str, &str)], last: &str) -> PoolStatus {
        PoolStatus {
            last_allocated: last.into(),
            allocated: allocated
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            allocated_history: history
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            ..PoolStatus::default()
        }
    }

    fn mk_ip(text: &str) -> IpAddr {
        text.parse().expect("valid ip")
    }

    #[test]
    fn status_json_matches_the_crd_shape() {
        let json = r#"{"total":253,"available":252,"lastAllocated":"192.168.0.2","allocated":{"192.168.0.2":"default/lb1"},"allocatedHistory":{"192.168.0.3":"default/lb0"},"conditions":[{"type":"Ready","status":"True","lastUpdateTime":"2026-01-01T00:00:00Z"}]}"#;
        let status: PoolStatus = serde_json::from_str(json).expect("valid json");
        assert_eq!(status.conditions[0].r#type, "Ready");
        assert_eq!(serde_json::to_string(&status).expect("serialises"), json);
        let empty: PoolStatus = serde_json::from_str(r#"{"allocated":null}"#).expect("valid json");
        assert_eq!(
            serde_json::to_string(&empty).expect("serialises"),
            r#"{"total":0,"available":0,"lastAllocated":""}"#
        );
    }

    #[test]
    fn restart_never_hands_out_a_held_address() {
        let ranges = [mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.14")];
        let status = mk_status(
            &[
                ("10.0.0.10", "ns/a"),
                ("10.0.0.11", "ns/b"),
                ("10.0.0.13", "ns/c"),
            ],
            &[("10.0.0.12", "ns/old")],
            "10.0.0.13",
        );
        let mut pool = PoolAllocator::from_status("p", &ranges, &status).expect("restores");
        assert_eq!((pool.total(), pool.available()), (5, 2));
        assert_eq!(pool.allocate("ns/a").expect("held").ip, mk_ip("10.0.0.10"));
        assert_eq!(pool.allocate("ns/d").expect("fresh").ip, mk_ip("10.0.0.14"));
        assert_eq!(pool.allocate("ns/e").expect("fresh").ip, mk_ip("10.0.0.12"));
        assert!(pool.allocate("ns/f").is_err());
    }

    #[test]
    fn round_trip_is_identity_and_recomputes_counts() {
        let ranges = [mk_range("10.0.0.0/24", "", "")];
        let mut pool = PoolAllocator::new("p", &ranges).expect("valid");
        for i in 0..20 {
            pool.allocate(&format!("ns/lb{i}")).expect("allocates");
        }
        for i in (0..20).step_by(3) {
            pool.release(&format!("ns/lb{i}"));
        }
        let status = pool.status();
        assert_eq!((status.total, status.available), (253, 253 - 13));
        let rebuilt = PoolAllocator::from_status("p", &ranges, &status).expect("restores");
        assert_eq!(rebuilt, pool);
        assert_eq!(rebuilt.status(), status);
    }

    #[test]
    fn history_outside_the_ranges_or_held_is_pruned() {
        let ranges = [mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.20")];
        let status = mk_status(
            &[("10.0.0.10", "ns/a")],
            &[
                ("10.0.0.10", "ns/x"),
                ("10.0.0.1", "ns/gw"),
                ("10.0.9.9", "ns/out"),
                ("junk", "ns/j"),
                ("10.0.0.15", "ns/b"),
            ],
            "",
        );
        let pool = PoolAllocator::from_status("p", &ranges, &status).expect("restores");
        assert_eq!(
            pool.status().allocated_history,
            BTreeMap::from([("10.0.0.15".to_string(), "ns/b".to_string())])
        );
        assert_eq!(pool.last_allocated(), None);
    }

    #[test]
    fn strays_are_kept_held_but_not_counted() {
        let ranges = [mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.12")];
        let status = mk_status(
            &[
                ("10.0.0.10", "ns/a"),
                ("10.0.0.99", "ns/out"),
                ("fd00::1", "ns/v6"),
                ("bogus", "ns/bogus"),
            ],
            &[],
            "10.0.0.10",
        );
        let mut pool = PoolAllocator::from_status("p", &ranges, &status).expect("restores");
        assert_eq!((pool.total(), pool.available()), (3, 2));
        assert_eq!(pool.strays().len(), 3);
        assert_eq!(pool.holder(mk_ip("10.0.0.99")), Some("ns/out"));
        // Written back verbatim.
        assert_eq!(pool.status().allocated, status.allocated);
        // A range change cannot strand them further, and they block shrinking.
        let err = pool
            .resize(&[mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.20")])
            .expect_err("strays");
        assert_eq!(err.to_string(), "allocated IP 10.0.0.99 is excluded");
        // An id holding only a stray gets an address in range (as upstream), and releasing frees both.
        assert_eq!(
            pool.allocate("ns/out").expect("fresh").ip,
            mk_ip("10.0.0.11")
        );
        assert_eq!(pool.release("ns/out").len(), 2);
        pool.release("ns/v6");
        pool.release("ns/bogus");
        assert!(pool.strays().is_empty());
        assert_eq!(pool.status().allocated.len(), 1);
    }

    #[test]
    fn two_spellings_of_one_address_are_not_lost() {
        let ranges = [mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.12")];
        let status = mk_status(
            &[("10.0.0.10", "ns/a"), ("::ffff:10.0.0.10", "ns/b")],
            &[],
            "",
        );
        let pool = PoolAllocator::from_status("p", &ranges, &status).expect("restores");
        assert_eq!(pool.in_use(), 1);
        assert_eq!(pool.status().allocated, status.allocated);
    }

    #[test]
    fn huge_pools_saturate_the_int64_counters() {
        let ranges = [mk_range("2001:db8::/64", "", "")];
        let mut pool = PoolAllocator::new("p", &ranges).expect("valid");
        pool.allocate("ns/a").expect("allocates");
        let status = pool.status();
        assert_eq!((status.total, status.available), (i64::MAX, i64::MAX));
        assert_eq!(status.last_allocated, "2001:db8::2");
    }
}
