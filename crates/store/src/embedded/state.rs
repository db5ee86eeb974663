//! The in-memory index of the embedded store: every object by kind, namespace and name, a uid index
//! for the garbage collector, the last resourceVersion and the retained change history.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use serde_json::Value;

pub(crate) use super::history::Retained;
use super::{held::Held, history::History};
use crate::ChangeType;

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

impl Row {
    pub fn ident(&self) -> Ident<'_> {
        Ident {
            api_version: &self.api_version,
            kind: &self.kind,
            namespace: &self.namespace,
            name: &self.name,
            uid: &self.uid,
        }
    }
}

/// Which object a row is: where it is kept, and its uid.
pub struct Ident<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
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

type Names = BTreeMap<String, Held>;
type Namespaces = BTreeMap<String, Names>;

/// Where an object with a uid is, and the owners it names (kept here so that replacing or
/// deleting it need not parse it).
struct Located {
    api_version: String,
    kind: String,
    namespace: String,
    name: String,
    owners: Vec<String>,
}

#[derive(Default)]
pub struct State {
    /// apiVersion → kind → namespace → name → object.
    objects: HashMap<String, HashMap<String, Namespaces>>,
    /// uid → where its object is.
    uids: HashMap<String, Located>,
    /// owner uid → dependents' uids.
    dependents: HashMap<String, Vec<String>>,
    /// uid → the status patches stored of it since it was stored whole.
    patches: HashMap<String, Patches>,
    pub rv: u64,
    /// Committed changes not yet known to be on disk, in resourceVersion order: each with its
    /// object's tree, which the watchers are sent.
    pub unpublished: VecDeque<(Arc<Value>, Retained)>,
    /// Published changes retained for watches that resume from an older resourceVersion.
    pub history: History,
    /// apiVersion → kind → the resourceVersion of its last write, for the kinds a reader asked
    /// to follow ([`crate::ObjectStore::write_counter`]).
    counters: HashMap<String, HashMap<String, Arc<AtomicU64>>>,
}

/// How many times its stored size a tree weighs in the history's bound (a `serde_json::Value`
/// takes five to ten times the memory of its text).
const TREE_WEIGHT: usize = 6;

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

    pub(super) fn held(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Option<&Held> {
        self.objects
            .get(api_version)?
            .get(kind)?
            .get(namespace)?
            .get(name)
    }

    /// The object, parsed from its text.
    pub fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<Value>> {
        self.held(api_version, kind, namespace, name)
            .map(Held::value)
    }

    /// The object, its tree kept for the next read of the same version.
    pub fn get_shared(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<Value>> {
        self.held(api_version, kind, namespace, name)
            .map(Held::shared)
    }

    /// Whether an object has this name (without parsing it).
    pub fn contains(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> bool {
        self.held(api_version, kind, namespace, name).is_some()
    }

    /// The objects of a kind (in one namespace or all), as held.
    pub fn iter_held<'a>(
        &'a self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
    ) -> Box<dyn Iterator<Item = &'a Held> + 'a> {
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

    /// The counter of the writes of a kind: the resourceVersion of its last write since the
    /// counter was made (0 before any).
    pub(crate) fn counter(&mut self, api_version: &str, kind: &str) -> Arc<AtomicU64> {
        self.counters
            .entry(api_version.to_string())
            .or_default()
            .entry(kind.to_string())
            .or_default()
            .clone()
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
                let at = self.uids.get(dep)?;
                let obj = self.get(&at.api_version, &at.kind, &at.namespace, &at.name)?;
                Some((at.api_version.clone(), at.kind.clone(), obj))
            })
            .collect()
    }

    /// Adds an object read from the database at open: its tree (one with status patches applied).
    pub(crate) fn insert_loaded(&mut self, row: Row) {
        let owners = owner_uids(&row.object);
        self.put(row.ident(), Held::Tree(row.object.clone()), owners);
    }

    /// Adds an object read from the database at open: its text, checked, and the owners it names.
    pub(crate) fn insert_loaded_text(&mut self, id: Ident, held: Held, owners: Vec<String>) {
        self.put(id, held, owners);
    }

    fn put(&mut self, id: Ident, held: Held, owners: Vec<String>) {
        self.unindex_owners(id.uid);
        for owner in &owners {
            self.dependents
                .entry(owner.clone())
                .or_default()
                .push(id.uid.to_string());
        }
        self.uids.insert(
            id.uid.to_string(),
            Located {
                api_version: id.api_version.to_string(),
                kind: id.kind.to_string(),
                namespace: id.namespace.to_string(),
                name: id.name.to_string(),
                owners,
            },
        );
        let names = self
            .objects
            .entry(id.api_version.to_string())
            .or_default()
            .entry(id.kind.to_string())
            .or_default()
            .entry(id.namespace.to_string())
            .or_default();
        match names.get_mut(id.name) {
            Some(slot) => *slot = held,
            None => {
                names.insert(id.name.to_string(), held);
            }
        }
    }

    /// Takes `uid` out of the dependents of the owners its object named.
    fn unindex_owners(&mut self, uid: &str) {
        let Some(at) = self.uids.get(uid) else {
            return;
        };
        for owner in &at.owners {
            if let Some(deps) = self.dependents.get_mut(owner) {
                deps.retain(|d| d != uid);
                if deps.is_empty() {
                    self.dependents.remove(owner);
                }
            }
        }
    }

    /// Applies a committed write (`body` its object's text as stored whole, `None` for a deletion
    /// or a status patch; `bytes` its size as the history counts it) and queues its change for
    /// publication once durable.
    pub fn apply(&mut self, row: Row, body: Option<String>, bytes: usize) {
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
        let held = match body {
            Some(json) => Held::written(json),
            None => Held::Tree(row.object.clone()),
        };
        match row.change {
            ChangeType::Deleted => {
                if let Some(names) = self
                    .objects
                    .get_mut(&row.api_version)
                    .and_then(|k| k.get_mut(&row.kind))
                    .and_then(|n| n.get_mut(&row.namespace))
                {
                    names.remove(&row.name);
                }
                self.unindex_owners(&row.uid);
                self.uids.remove(&row.uid);
            }
            ChangeType::Added | ChangeType::Modified => {
                let owners = owner_uids(&row.object);
                self.put(row.ident(), held.clone(), owners);
            }
        }
        self.rv = self.rv.max(row.rv);
        // Raised while the write lock is held: a reader that sees the counter unmoved since
        // before it read has read nothing this write changed.
        if let Some(counter) = self
            .counters
            .get(&row.api_version)
            .and_then(|k| k.get(&row.kind))
        {
            counter.store(row.rv, Ordering::Release);
        }
        let weight = if held.is_tree() {
            bytes * TREE_WEIGHT
        } else {
            bytes
        };
        let retained = Retained {
            change: row.change,
            api_version: row.api_version,
            kind: row.kind,
            resource_version: row.rv,
            object: held,
            bytes: weight,
        };
        self.unpublished.push_back((row.object, retained));
    }
}
