//! The in-memory index of the embedded store: every object by kind, namespace and name, a uid index
//! for the garbage collector, the last resourceVersion and the retained change history.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::Arc,
};

use serde_json::Value;

use super::history::History;
pub(crate) use super::history::Retained;
use crate::{Change, ChangeType};

/// One object write, as stored in SQLite and applied to the index.
#[derive(Clone, Debug)]
pub struct Row {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub rv: u64,
    pub change: ChangeType,
    pub object: Arc<Value>,
    /// How the write is stored.
    pub stored: Stored,
}

/// How a write reaches the database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stored {
    /// The whole object (or its deletion), which supersedes the status patches stored of it.
    Whole,
    /// A merge patch of the object's status ([`crate::ObjectStore::merge_status`]), stored beside
    /// the last whole object, which was `object_bytes` long.
    Patch { patch: String, object_bytes: usize },
}

/// The status patches stored of an object since it was last stored whole.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Patches {
    pub count: usize,
    /// The size of the object's last whole row.
    pub object_bytes: usize,
    /// The size of the patches since.
    pub patch_bytes: usize,
}

type Names = BTreeMap<String, Arc<Value>>;
type Namespaces = BTreeMap<String, Names>;

#[derive(Default)]
pub struct State {
    /// apiVersion → kind → namespace → name → object.
    objects: HashMap<String, HashMap<String, Namespaces>>,
    /// uid → (apiVersion, kind, namespace, name).
    uids: HashMap<String, (String, String, String, String)>,
    /// owner uid → dependents' uids.
    dependents: HashMap<String, Vec<String>>,
    /// uid → the status patches stored of it since it was stored whole.
    patches: HashMap<String, Patches>,
    pub rv: u64,
    /// Committed changes not yet known to be on disk, in resourceVersion order.
    pub unpublished: VecDeque<Retained>,
    /// Published changes retained for watches that resume from an older resourceVersion.
    pub history: History,
}

fn owner_uids(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

impl State {
    pub fn new(rv: u64) -> Self {
        State {
            rv,
            history: History::new(rv),
            ..Default::default()
        }
    }

    pub fn len(&self) -> usize {
        self.uids.len()
    }

    pub fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<Value>> {
        self.objects
            .get(api_version)?
            .get(kind)?
            .get(namespace)?
            .get(name)
            .cloned()
    }

    pub fn iter<'a>(
        &'a self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
    ) -> Box<dyn Iterator<Item = &'a Arc<Value>> + 'a> {
        let Some(namespaces) = self.objects.get(api_version).and_then(|k| k.get(kind)) else {
            return Box::new(std::iter::empty());
        };
        match namespace {
            Some(ns) => match namespaces.get(ns) {
                Some(names) => Box::new(names.values()),
                None => Box::new(std::iter::empty()),
            },
            None => Box::new(namespaces.values().flat_map(|n| n.values())),
        }
    }

    /// The status patches stored of the object `uid` since it was stored whole.
    pub(crate) fn patches(&self, uid: &str) -> Patches {
        self.patches.get(uid).copied().unwrap_or_default()
    }

    /// Counts a status patch of `uid` read from the database at open.
    pub(crate) fn loaded_patch(&mut self, uid: &str, object_bytes: usize, patch_bytes: usize) {
        let log = self.patches.entry(uid.to_string()).or_insert(Patches {
            object_bytes,
            ..Patches::default()
        });
        log.count += 1;
        log.patch_bytes += patch_bytes;
    }

    pub(crate) fn has_uid(&self, uid: &str) -> bool {
        self.uids.contains_key(uid)
    }

    /// Objects that name `uid` as an owner, with their apiVersion and kind.
    pub(crate) fn dependents_of(&self, uid: &str) -> Vec<(String, String, Arc<Value>)> {
        self.dependents
            .get(uid)
            .into_iter()
            .flatten()
            .filter_map(|dep| {
                let (api_version, kind, ns, name) = self.uids.get(dep)?;
                let obj = self.get(api_version, kind, ns, name)?;
                Some((api_version.clone(), kind.clone(), obj))
            })
            .collect()
    }

    /// Adds an object read from the database at open.
    pub(crate) fn insert_loaded(&mut self, row: Row) {
        self.put(&row);
    }

    fn put(&mut self, row: &Row) {
        if let Some(old) = self.get(&row.api_version, &row.kind, &row.namespace, &row.name) {
            self.unindex_owners(&old, &row.uid);
        }
        for owner in owner_uids(&row.object) {
            self.dependents
                .entry(owner)
                .or_default()
                .push(row.uid.clone());
        }
        self.uids.insert(
            row.uid.clone(),
            (
                row.api_version.clone(),
                row.kind.clone(),
                row.namespace.clone(),
                row.name.clone(),
            ),
        );
        self.objects
            .entry(row.api_version.clone())
            .or_default()
            .entry(row.kind.clone())
            .or_default()
            .entry(row.namespace.clone())
            .or_default()
            .insert(row.name.clone(), row.object.clone());
    }

    fn unindex_owners(&mut self, obj: &Value, uid: &str) {
        for owner in owner_uids(obj) {
            if let Some(deps) = self.dependents.get_mut(&owner) {
                deps.retain(|d| d != uid);
                if deps.is_empty() {
                    self.dependents.remove(&owner);
                }
            }
        }
    }

    /// Applies a committed write (its object `bytes` long as stored) and queues its change for
    /// publication once durable.
    pub fn apply(&mut self, row: Row, bytes: usize) {
        match &row.stored {
            Stored::Patch {
                patch,
                object_bytes,
            } => {
                let log = self.patches.entry(row.uid.clone()).or_default();
                log.count += 1;
                log.object_bytes = *object_bytes;
                log.patch_bytes += patch.len();
            }
            Stored::Whole => {
                self.patches.remove(&row.uid);
            }
        }
        match row.change {
            ChangeType::Deleted => {
                if let Some(names) = self
                    .objects
                    .get_mut(&row.api_version)
                    .and_then(|k| k.get_mut(&row.kind))
                    .and_then(|n| n.get_mut(&row.namespace))
                    && let Some(old) = names.remove(&row.name)
                {
                    self.unindex_owners(&old, &row.uid);
                }
                self.uids.remove(&row.uid);
            }
            ChangeType::Added | ChangeType::Modified => self.put(&row),
        }
        self.rv = self.rv.max(row.rv);
        let change = Change {
            change: row.change,
            api_version: row.api_version,
            kind: row.kind,
            object: row.object,
            resource_version: row.rv,
        };
        self.unpublished.push_back(Retained { change, bytes });
    }
}
