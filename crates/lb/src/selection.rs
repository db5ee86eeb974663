//! Pool selection, remembered per request while the pool cache stays the same.
//!
//! Choosing a pool reads every cached pool: building the selection index from them cost each
//! reconcile time in proportion to the number of pools (5% of the CPU converging 100,000
//! LoadBalancers over 100 pools), for an answer that only changes when a pool does. Load balancers
//! asking alike (same namespace, network, project, cluster, family and labels) share the answer
//! while every cached pool is at the version it was read at: a digest of the cache's names, uids
//! and resourceVersions, taken from the same read of the cache as the answer, tells.

use std::{
    collections::HashMap,
    hash::{DefaultHasher, Hash, Hasher},
    sync::{Arc, Mutex},
};

use kube::runtime::reflector::Store;

use crate::{
    crd::IPPool,
    ipam::{LbRequest, PoolEntry, PoolIndex, SelectError},
    sync::lock,
};

/// The most answers remembered (distinct requests for one state of the pool cache); past it the
/// memo starts afresh.
const REMEMBERED: usize = 4096;

#[derive(Default)]
pub struct Selections {
    memo: Mutex<Memo>,
}

#[derive(Default)]
struct Memo {
    /// The digest of the pool cache the answers were read from.
    pools: Option<u64>,
    chosen: HashMap<LbRequest, Result<String, SelectError>>,
}

/// Which pools, at which versions: changes whenever a pool is added, removed or written. A pool
/// without a resourceVersion (never stored) counts by its content.
fn digest(pools: &[Arc<IPPool>]) -> u64 {
    // Order-free: the cache lists its pools in no particular order.
    pools
        .iter()
        .map(|p| {
            let mut h = DefaultHasher::new();
            p.metadata.name.hash(&mut h);
            p.metadata.uid.hash(&mut h);
            match &p.metadata.resource_version {
                Some(rv) => rv.hash(&mut h),
                None => serde_json::to_string(p.as_ref())
                    .unwrap_or_default()
                    .hash(&mut h),
            }
            h.finish()
        })
        .fold(pools.len() as u64, u64::wrapping_add)
}

impl Selections {
    /// The pool `request` gets from the pools in `pools`.
    pub fn select(
        &self,
        request: &LbRequest,
        pools: &Store<IPPool>,
    ) -> Result<String, Box<SelectError>> {
        let state = pools.state();
        let version = digest(&state);
        {
            let memo = lock(&self.memo);
            if memo.pools == Some(version)
                && let Some(chosen) = memo.chosen.get(request)
            {
                return chosen.clone().map_err(Box::new);
            }
        }
        let entries: Vec<PoolEntry<'_>> = state.iter().map(|p| p.entry()).collect();
        let chosen = PoolIndex::new(&entries)
            .select(request)
            .map(|s| s.pool.to_string());
        let mut memo = lock(&self.memo);
        if memo.pools != Some(version) || memo.chosen.len() >= REMEMBERED {
            memo.pools = Some(version);
            memo.chosen.clear();
        }
        memo.chosen.insert(request.clone(), chosen.clone());
        chosen.map_err(Box::new)
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::{reflector::store::Writer, watcher::Event};

    use super::*;
    use crate::ipam::{PoolSpec, RangeSpec, Selector, Tuple};

    fn pool(name: &str, namespace: &str, priority: u32, version: &str) -> IPPool {
        let mut pool = IPPool::new(
            name,
            crate::crd::IPPoolSpec {
                pool: PoolSpec {
                    ranges: vec![RangeSpec {
                        subnet: "10.0.0.0/24".into(),
                        ..Default::default()
                    }],
                    selector: Selector {
                        priority,
                        scope: vec![Tuple {
                            project: "*".into(),
                            namespace: namespace.into(),
                            guest_cluster: "*".into(),
                        }],
                        ..Default::default()
                    },
                    ..Default::default()
                },
            },
        );
        pool.metadata.resource_version = Some(version.into());
        pool
    }

    fn request(namespace: &str) -> LbRequest {
        LbRequest {
            lb_namespace: namespace.into(),
            ..Default::default()
        }
    }

    #[test]
    fn answers_follow_every_change_of_the_pool_cache() {
        let mut writer = Writer::<IPPool>::default();
        let pools = writer.as_reader();
        writer.apply_watcher_event(&Event::Apply(pool("low", "a", 1, "1")));
        let selections = Selections::default();
        assert_eq!(
            selections.select(&request("a"), &pools).as_deref(),
            Ok("low")
        );
        assert!(selections.select(&request("b"), &pools).is_err());
        // Remembered: the same answer while the cache is the same.
        assert_eq!(lock(&selections.memo).chosen.len(), 2);
        assert_eq!(
            selections.select(&request("a"), &pools).as_deref(),
            Ok("low")
        );

        // A better pool, and one for `b`: every request is chosen afresh.
        writer.apply_watcher_event(&Event::Apply(pool("high", "a", 9, "2")));
        writer.apply_watcher_event(&Event::Apply(pool("other", "b", 1, "3")));
        assert_eq!(
            selections.select(&request("a"), &pools).as_deref(),
            Ok("high")
        );
        assert_eq!(
            selections.select(&request("b"), &pools).as_deref(),
            Ok("other")
        );
        // A pool written again (its scope moved to `b`, where it now ranks first).
        writer.apply_watcher_event(&Event::Apply(pool("high", "b", 9, "4")));
        assert_eq!(
            selections.select(&request("a"), &pools).as_deref(),
            Ok("low")
        );
        assert_eq!(
            selections.select(&request("b"), &pools).as_deref(),
            Ok("high")
        );
        // And removed.
        writer.apply_watcher_event(&Event::Delete(pool("high", "b", 9, "4")));
        assert_eq!(
            selections.select(&request("b"), &pools).as_deref(),
            Ok("other")
        );
    }

    #[test]
    fn pools_never_stored_count_by_their_content() {
        let mut writer = Writer::<IPPool>::default();
        let pools = writer.as_reader();
        let mut unstored = pool("p", "a", 1, "");
        unstored.metadata.resource_version = None;
        writer.apply_watcher_event(&Event::Apply(unstored.clone()));
        let selections = Selections::default();
        assert_eq!(selections.select(&request("a"), &pools).as_deref(), Ok("p"));
        unstored.spec.pool.selector.scope[0].namespace = "b".into();
        writer.apply_watcher_event(&Event::Apply(unstored));
        assert!(selections.select(&request("a"), &pools).is_err());
        assert_eq!(selections.select(&request("b"), &pools).as_deref(), Ok("p"));
    }
}
