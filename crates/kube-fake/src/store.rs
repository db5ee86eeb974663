//! The object store: every object as a `serde_json::Value` keyed by storage group, plural, namespace
//! and name, one monotonic resourceVersion counter, a bounded history of change events for watch
//! replay, and a broadcast channel for live watchers.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::broadcast;

/// `(storage group, storage plural, namespace, name)`; the namespace is empty for cluster scope.
pub type Key = (String, String, String, String);

/// The kind of change a watch event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Created.
    Added,
    /// Updated.
    Modified,
    /// Deleted (the object carries the resourceVersion of the deletion).
    Deleted,
}

impl EventType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, retained in history and broadcast to watchers.
#[derive(Debug, Clone)]
pub struct Change {
    /// The resourceVersion this change produced.
    pub rv: u64,
    /// What happened.
    pub kind: EventType,
    /// Which object.
    pub key: Key,
    /// The object after the change (for deletes: its last state).
    pub object: Value,
    /// The object before the change (modifications only), for selector transitions.
    pub old: Option<Value>,
}

/// The stored objects and their change history.
#[derive(Debug)]
pub struct Store {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Arc<Change>>,
    history_limit: usize,
    /// History covers every change with rv greater than this.
    floor: u64,
    tx: broadcast::Sender<Arc<Change>>,
}

fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
    }
}

impl Store {
    /// An empty store retaining at most `history_limit` changes for replay.
    pub fn new(history_limit: usize) -> Self {
        let (tx, _) = broadcast::channel(65_536);
        Self {
            rv: 1,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            history_limit,
            floor: 1,
            tx,
        }
    }

    /// The latest resourceVersion.
    pub fn current_rv(&self) -> u64 {
        self.rv
    }

    /// The oldest resourceVersion a watch can still resume from.
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// One object.
    pub fn get(&self, key: &Key) -> Option<&Value> {
        self.objects.get(key)
    }

    /// Objects of one storage type, optionally in one namespace, in key order.
    pub fn list<'a>(
        &'a self,
        group: &str,
        plural: &str,
        namespace: Option<&str>,
    ) -> Vec<(&'a Key, &'a Value)> {
        let start: Key = (
            group.into(),
            plural.into(),
            namespace.unwrap_or_default().into(),
            String::new(),
        );
        self.objects
            .range(start..)
            .take_while(|(k, _)| {
                k.0 == group && k.1 == plural && namespace.is_none_or(|ns| k.2 == ns)
            })
            .collect()
    }

    /// Every object, for scans by the garbage collector and namespace controller.
    pub fn all(&self) -> impl Iterator<Item = (&Key, &Value)> {
        self.objects.iter()
    }

    fn record(&mut self, change: Change) {
        let change = Arc::new(change);
        self.history.push_back(change.clone());
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.floor = old.rv;
            }
        }
        // No receivers is fine: nobody is watching.
        let _ = self.tx.send(change);
    }

    /// Stores `obj` under `key` with a new resourceVersion and records the change.
    pub fn put(&mut self, key: Key, mut obj: Value) -> Value {
        self.rv += 1;
        set_rv(&mut obj, self.rv);
        let old = self.objects.insert(key.clone(), obj.clone());
        let kind = if old.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.record(Change {
            rv: self.rv,
            kind,
            key,
            object: obj.clone(),
            old,
        });
        obj
    }

    /// Removes an object; the returned last state carries the deletion's resourceVersion.
    pub fn remove(&mut self, key: &Key) -> Option<Value> {
        let mut obj = self.objects.remove(key)?;
        self.rv += 1;
        set_rv(&mut obj, self.rv);
        self.record(Change {
            rv: self.rv,
            kind: EventType::Deleted,
            key: key.clone(),
            object: obj.clone(),
            old: None,
        });
        Some(obj)
    }

    /// A receiver of live changes; take it under the same lock as the replay so nothing is missed.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.tx.subscribe()
    }

    /// Retained changes after `rv` for one storage type, or `Err(floor)` when `rv` is too old.
    pub fn changes_since(
        &self,
        rv: u64,
        group: &str,
        plural: &str,
    ) -> Result<Vec<Arc<Change>>, u64> {
        if rv < self.floor {
            return Err(self.floor);
        }
        Ok(self
            .history
            .iter()
            .filter(|c| c.rv > rv && c.key.0 == group && c.key.1 == plural)
            .cloned()
            .collect())
    }

    /// Drops all retained history, as an etcd compaction would.
    pub fn compact(&mut self) {
        self.history.clear();
        self.floor = self.rv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_key(name: &str) -> Key {
        (
            "".into(),
            "configmaps".into(),
            "default".into(),
            name.into(),
        )
    }

    #[test]
    fn versions_are_monotonic_and_history_is_bounded() {
        let mut s = Store::new(2);
        let a = s.put(mk_key("a"), json!({"metadata": {"name": "a"}}));
        let b = s.put(mk_key("b"), json!({"metadata": {"name": "b"}}));
        assert_eq!(a["metadata"]["resourceVersion"], "2");
        assert_eq!(b["metadata"]["resourceVersion"], "3");
        s.remove(&mk_key("a"));
        assert_eq!(s.current_rv(), 4);
        assert!(s.changes_since(1, "", "configmaps").is_err());
        assert_eq!(s.changes_since(2, "", "configmaps").map(|c| c.len()), Ok(2));
        s.compact();
        assert_eq!(s.changes_since(3, "", "configmaps").err(), Some(4));
    }
}
