//! Pool selection, remembered per request until the pools change.
//!
//! Choosing a pool reads every cached pool: building the selection index from them cost each
//! reconcile time in proportion to the number of pools (5% of the CPU converging 100,000
//! LoadBalancers over 100 pools), for an answer that only changes when a pool does. Load balancers
//! asking alike (same namespace, network, project, cluster, family and labels) share the answer
//! until the pool cache next changes; the pool watcher reports every change ([`Selections::pools_changed`])
//! once the cache holds it, so an answer is never older than the cache it was read from.

use std::{
    collections::HashMap,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use kube::runtime::reflector::Store;

use crate::{
    crd::IPPool,
    ipam::{LbRequest, PoolEntry, PoolIndex, SelectError},
    sync::lock,
};

/// The most answers remembered (distinct requests between two pool changes); past it the memo
/// starts afresh.
const REMEMBERED: usize = 4096;

#[derive(Default)]
pub struct Selections {
    /// Bumped on every change of the pool cache.
    generation: AtomicU64,
    memo: Mutex<Memo>,
}

#[derive(Default)]
struct Memo {
    /// The pool cache generation the answers were read at.
    generation: u64,
    chosen: HashMap<LbRequest, Result<String, SelectError>>,
}

impl Selections {
    /// The pool cache changed (after the change is in it): what was chosen before is forgotten.
    pub fn pools_changed(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// The pool `request` gets from the pools in `pools`.
    pub fn select(
        &self,
        request: &LbRequest,
        pools: &Store<IPPool>,
    ) -> Result<String, Box<SelectError>> {
        let generation = self.generation.load(Ordering::SeqCst);
        {
            let memo = lock(&self.memo);
            if memo.generation == generation
                && let Some(chosen) = memo.chosen.get(request)
            {
                return chosen.clone().map_err(Box::new);
            }
        }
        // Read after the generation: a change reported since makes this answer one the memo no
        // longer keeps, never a stale one it does.
        let state = pools.state();
        let entries: Vec<PoolEntry<'_>> = state.iter().map(|p| p.entry()).collect();
        let chosen = PoolIndex::new(&entries)
            .select(request)
            .map(|s| s.pool.to_string());
        let mut memo = lock(&self.memo);
        if generation > memo.generation {
            memo.generation = generation;
            memo.chosen.clear();
        }
        if generation == memo.generation {
            if memo.chosen.len() >= REMEMBERED {
                memo.chosen.clear();
            }
            memo.chosen.insert(request.clone(), chosen.clone());
        }
        chosen.map_err(Box::new)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kube::runtime::{reflector::store::Writer, watcher::Event};

    use super::*;
    use crate::ipam::{PoolSpec, RangeSpec, Selector, Tuple};

    fn pool(name: &str, namespace: &str, priority: u32) -> IPPool {
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
        pool.metadata.resource_version = Some("1".into());
        pool
    }

    fn request(namespace: &str) -> LbRequest {
        LbRequest {
            lb_namespace: namespace.into(),
            ..Default::default()
        }
    }

    #[test]
    fn answers_are_kept_until_the_pools_change() {
        let mut writer = Writer::<IPPool>::default();
        let pools = writer.as_reader();
        writer.apply_watcher_event(&Event::Apply(pool("low", "a", 1)));
        let selections = Selections::default();
        assert_eq!(
            selections.select(&request("a"), &pools).as_deref(),
            Ok("low")
        );
        assert!(selections.select(&request("b"), &pools).is_err());

        // A better pool in the cache, not yet reported: the remembered answers stand.
        writer.apply_watcher_event(&Event::Apply(pool("high", "a", 9)));
        writer.apply_watcher_event(&Event::Apply(pool("other", "b", 1)));
        assert_eq!(
            selections.select(&request("a"), &pools).as_deref(),
            Ok("low")
        );
        assert!(selections.select(&request("b"), &pools).is_err());

        // Reported: every request is chosen afresh.
        selections.pools_changed();
        assert_eq!(
            selections.select(&request("a"), &pools).as_deref(),
            Ok("high")
        );
        assert_eq!(
            selections.select(&request("b"), &pools).as_deref(),
            Ok("other")
        );
        writer.apply_watcher_event(&Event::Delete(pool("high", "a", 9)));
        selections.pools_changed();
        assert_eq!(
            selections.select(&request("a"), &pools).as_deref(),
            Ok("low")
        );
    }

    #[test]
    fn an_answer_read_before_a_change_is_not_kept_after_it() {
        let mut writer = Writer::<IPPool>::default();
        let pools = writer.as_reader();
        writer.apply_watcher_event(&Event::Apply(pool("p", "a", 1)));
        let selections = Arc::new(Selections::default());
        // The memo already holds answers of a later generation than the one being stored.
        selections.pools_changed();
        selections.pools_changed();
        {
            let mut memo = lock(&selections.memo);
            memo.generation = 2;
            memo.chosen.insert(request("x"), Ok("kept".into()));
        }
        // An answer computed at generation 1 (simulated by lowering the counter) is not stored.
        selections.generation.store(1, Ordering::SeqCst);
        assert_eq!(selections.select(&request("a"), &pools).as_deref(), Ok("p"));
        let memo = lock(&selections.memo);
        assert_eq!(memo.generation, 2);
        assert!(!memo.chosen.contains_key(&request("a")));
        assert_eq!(
            memo.chosen.get(&request("x")),
            Some(&Ok("kept".to_string()))
        );
    }
}
