//! Pool selection, remembered per request while the pool cache stays the same.
//!
//! Choosing a pool reads every cached pool: building the selection index from them cost each
//! reconcile time in proportion to the number of pools (5% of the CPU converging 100,000
//! LoadBalancers over 100 pools), for an answer that only changes when a pool does. Load balancers
//! asking alike (same namespace, network, project, cluster, family and labels) share the answer
//! while what selection reads of every cached pool is as it was: a digest of it, taken from the
//! same read of the cache as the answer, tells (not the pools' resourceVersions, which every
//! allocation round moves).

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
    /// The pools of the cache last read, each with its [`entry_digest`]: a pool the cache still
    /// holds as the same `Arc` (it is immutable, and held here its address cannot be reused) is
    /// not hashed again, so a read of an unchanged cache costs a pointer comparison per pool.
    seen: Vec<(Arc<IPPool>, u64)>,
}

/// What selection reads of a cached pool (its [`PoolEntry`]: name, spec, deletion and the
/// annotations it honours), and nothing else: an allocation round writes a pool's status, and
/// with it its resourceVersion, several times a second while load balancers are converging, and
/// none of that changes an answer.
fn entry_digest(pool: &IPPool) -> u64 {
    let entry = pool.entry();
    let mut h = DefaultHasher::new();
    entry.name.hash(&mut h);
    entry.spec.hash(&mut h);
    entry.deleting.hash(&mut h);
    entry.options.skip_addresses.hash(&mut h);
    entry.options.service_selector.hash(&mut h);
    h.finish()
}

/// The digest of the cache's `pools`, order-free (the cache lists its pools in no particular
/// order), reusing the digests of the pools `seen` last time at the same place, and remembering
/// these for the next time.
fn digest(seen: &mut Vec<(Arc<IPPool>, u64)>, pools: &[Arc<IPPool>]) -> u64 {
    seen.truncate(pools.len());
    let mut total = pools.len() as u64;
    for (i, pool) in pools.iter().enumerate() {
        let digest = match seen.get(i) {
            Some((last, digest)) if Arc::ptr_eq(last, pool) => *digest,
            _ => {
                let digest = entry_digest(pool);
                let fresh = (pool.clone(), digest);
                match seen.get_mut(i) {
                    Some(slot) => *slot = fresh,
                    None => seen.push(fresh),
                }
                digest
            }
        };
        total = total.wrapping_add(digest);
    }
    total
}

impl Selections {
    /// The pool `request` gets from the pools in `pools`.
    pub fn select(
        &self,
        request: &LbRequest,
        pools: &Store<IPPool>,
    ) -> Result<String, Box<SelectError>> {
        let state = pools.state();
        let version;
        {
            let mut memo = lock(&self.memo);
            version = digest(&mut memo.seen, &state);
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

    /// An allocation round's status write (a new resourceVersion, a new status) leaves the answers
    /// remembered; what selection reads (here the deletion and the service selector) does not.
    #[test]
    fn status_writes_keep_the_answers_and_selection_inputs_do_not() {
        let mut writer = Writer::<IPPool>::default();
        let pools = writer.as_reader();
        writer.apply_watcher_event(&Event::Apply(pool("p", "a", 1, "1")));
        let selections = Selections::default();
        assert_eq!(selections.select(&request("a"), &pools).as_deref(), Ok("p"));
        let remembered = lock(&selections.memo).pools;

        let mut written = pool("p", "a", 1, "2");
        written.status = Some(crate::ipam::PoolStatus {
            allocated: [("10.0.0.1".to_string(), "ns/lb".to_string())].into(),
            ..Default::default()
        });
        writer.apply_watcher_event(&Event::Apply(written.clone()));
        assert_eq!(selections.select(&request("a"), &pools).as_deref(), Ok("p"));
        assert_eq!(lock(&selections.memo).pools, remembered);
        assert_eq!(lock(&selections.memo).chosen.len(), 1);
        // The written pool is the one hashed, and held, now.
        let held = lock(&selections.memo).seen.clone();
        assert_eq!(held.len(), 1);
        assert!(Arc::ptr_eq(&held[0].0, &pools.state()[0]));

        // Only load balancers labelled `tier=web` from now on.
        written.metadata.resource_version = Some("3".into());
        written.metadata.annotations = Some(
            [(
                crate::crd::keys::SERVICE_SELECTOR.to_string(),
                "tier=web".to_string(),
            )]
            .into(),
        );
        writer.apply_watcher_event(&Event::Apply(written.clone()));
        assert!(selections.select(&request("a"), &pools).is_err());
        assert_ne!(lock(&selections.memo).pools, remembered);

        // Deleting: offered to no new load balancer.
        written.metadata.annotations = None;
        written.metadata.resource_version = Some("4".into());
        written.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        writer.apply_watcher_event(&Event::Apply(written));
        assert!(selections.select(&request("a"), &pools).is_err());
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
