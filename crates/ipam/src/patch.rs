//! Writing a pool's status by what changed. The allocator journals the addresses each operation
//! touches; [`PoolAllocator::patch_status`] brings a status written earlier up to date from the
//! journal alone and returns the same change as a JSON merge patch (RFC 7386) of `status`. A store
//! then writes what an allocation round changed instead of every address of the pool, and the
//! status it keeps is the one [`PoolAllocator::write_status`] would have written whole.

use serde_json::{Map, Value};

use super::addr::from_key;
use super::allocator::PoolAllocator;
use super::status::PoolStatus;

impl PoolAllocator {
    /// Starts journaling: the status just written whole from this allocator is what is stored.
    pub fn start_journal(&mut self) {
        self.journal.start();
    }

    /// Brings `status` (what [`Self::write_status`] wrote when the journal started, with every
    /// patch since applied) up to date with the operations since, and returns them as a merge
    /// patch of the status: the counters and `lastAllocated` always, each changed address of
    /// `allocated` and `allocatedHistory`, and a map that emptied as `null` (a status written
    /// whole leaves an empty map out). `None` when the journal was never started or was lost:
    /// write the status whole, then [`Self::start_journal`] again.
    pub fn patch_status(&mut self, status: &mut PoolStatus) -> Option<Value> {
        let touched = self.journal.take()?;
        let mut allocated = Map::new();
        let mut history = Map::new();
        for value in touched {
            let ip = from_key(value).to_string();
            sync_entry(
                &mut status.allocated,
                &mut allocated,
                &ip,
                self.by_ip.get(&value).map(|id| &**id),
            );
            sync_entry(
                &mut status.allocated_history,
                &mut history,
                &ip,
                self.history.get(&value).map(|id| &**id),
            );
        }
        let before = (
            status.total,
            status.available,
            std::mem::take(&mut status.last_allocated),
        );
        self.write_counters(status);
        let mut patch = Map::new();
        if before
            != (
                status.total,
                status.available,
                status.last_allocated.clone(),
            )
        {
            patch.insert("total".into(), status.total.into());
            patch.insert("available".into(), status.available.into());
            patch.insert("lastAllocated".into(), status.last_allocated.clone().into());
        }
        for (field, entries, now_empty) in [
            ("allocated", allocated, status.allocated.is_empty()),
            (
                "allocatedHistory",
                history,
                status.allocated_history.is_empty(),
            ),
        ] {
            if !entries.is_empty() {
                let entries = if now_empty {
                    Value::Null
                } else {
                    Value::Object(entries)
                };
                patch.insert(field.into(), entries);
            }
        }
        Some(Value::Object(patch))
    }
}

/// Sets `ip`'s entry of `map` to `holder`, recording the change (a removal as `null`) in `patch`.
fn sync_entry(
    map: &mut std::collections::BTreeMap<String, String>,
    patch: &mut Map<String, Value>,
    ip: &str,
    holder: Option<&str>,
) {
    match holder {
        Some(id) if map.get(ip).map(String::as_str) != Some(id) => {
            map.insert(ip.to_string(), id.to_string());
            patch.insert(ip.to_string(), Value::from(id));
        }
        Some(_) => {}
        None => {
            if map.remove(ip).is_some() {
                patch.insert(ip.to_string(), Value::Null);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::RangeSpec;

    fn mk_ranges() -> Vec<RangeSpec> {
        vec![RangeSpec {
            range_start: "10.0.0.10".into(),
            range_end: "10.0.0.12".into(),
            subnet: "10.0.0.0/24".into(),
            gateway: String::new(),
        }]
    }

    fn mk_pool() -> PoolAllocator {
        PoolAllocator::new("p", &mk_ranges()).expect("valid")
    }

    fn merged(mut stored: Value, patch: &Value) -> Value {
        json_patch::merge(&mut stored, patch);
        stored
    }

    #[test]
    fn a_patch_carries_what_changed_and_matches_a_whole_write() {
        let mut pool = mk_pool();
        pool.allocate("ns/a").expect("allocates");
        let mut status = pool.status();
        let stored = serde_json::to_value(&status).expect("serialises");
        pool.start_journal();
        pool.allocate("ns/b").expect("allocates");
        pool.release("ns/a");
        let patch = pool.patch_status(&mut status).expect("journaled");
        assert_eq!(
            patch,
            serde_json::json!({
                "total": 3, "available": 2, "lastAllocated": "10.0.0.11",
                "allocated": {"10.0.0.10": null, "10.0.0.11": "ns/b"},
                "allocatedHistory": {"10.0.0.10": "ns/a"},
            })
        );
        assert_eq!(status, pool.status());
        assert_eq!(
            merged(stored, &patch),
            serde_json::to_value(pool.status()).expect("serialises")
        );
    }

    #[test]
    fn an_emptied_map_is_removed_as_a_whole_write_leaves_it_out() {
        let mut pool = mk_pool();
        pool.allocate("ns/a").expect("allocates");
        let mut status = pool.status();
        let stored = serde_json::to_value(&status).expect("serialises");
        pool.start_journal();
        pool.release("ns/a");
        pool.allocate("ns/a")
            .expect("gets its address back from the history");
        pool.release("ns/a");
        pool.allocate("ns/a").expect("again");
        let patch = pool.patch_status(&mut status).expect("journaled");
        // Held again: the history entry went; the map it leaves empty is removed.
        assert_eq!(patch["allocatedHistory"], Value::Null);
        let stored = merged(stored, &patch);
        assert_eq!(
            stored,
            serde_json::to_value(pool.status()).expect("serialises")
        );
        assert!(stored.get("allocatedHistory").is_none());
    }

    #[test]
    fn no_journal_means_a_whole_write() {
        let mut pool = mk_pool();
        let mut status = pool.status();
        assert!(pool.patch_status(&mut status).is_none(), "never started");
        pool.start_journal();
        assert_eq!(
            pool.patch_status(&mut status),
            Some(serde_json::json!({})),
            "nothing changed"
        );
        let restored = PoolStatus {
            allocated: [("not-an-ip".to_string(), "ns/x".to_string())].into(),
            ..status.clone()
        };
        let mut pool = PoolAllocator::from_status("p", &mk_ranges(), &restored).expect("rebuilds");
        pool.start_journal();
        pool.release("ns/x");
        assert!(
            pool.patch_status(&mut status).is_none(),
            "a verbatim entry changed: lost"
        );
    }
}
