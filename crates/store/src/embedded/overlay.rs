//! Writes planned but not yet committed, and the view a write's plan sees: the committed index
//! with those writes on top. Group commit plans a write while earlier ones are still on their
//! way to SQLite, so each plan must see the writes queued before it (a second create of a name is
//! refused, an update sees the version just made), while readers keep seeing the committed index
//! only: a write that then fails to commit was never shown to anyone.

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
};

use serde_json::Value;

use super::state::{Patches, Row, State, Stored};
use crate::ChangeType;

/// apiVersion, kind, namespace, name.
type Key = (String, String, String, String);

fn key_of(row: &Row) -> Key {
    (
        row.api_version.clone(),
        row.kind.clone(),
        row.namespace.clone(),
        row.name.clone(),
    )
}

fn owner_uids(obj: &Value) -> impl Iterator<Item = &str> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("uid").and_then(Value::as_str))
}

/// What one queued row put in the indexes, to take it out again once committed.
struct Entry {
    key: Key,
    uid: String,
    rv: u64,
    owners: Vec<String>,
    /// A status patch's object and patch sizes; `None` for a row stored whole.
    patch: Option<(usize, usize)>,
}

/// The queued writes' rows, indexed as [`State`] indexes committed ones. Each index entry carries
/// the resourceVersion of the row that made it, so that committing a row removes its entries only
/// when no later queued row has replaced them.
#[derive(Default)]
pub(super) struct Overlay {
    entries: VecDeque<Entry>,
    /// The object at a key, `None` once deleted.
    objects: HashMap<Key, (u64, Option<Arc<Value>>)>,
    /// Whether a uid exists.
    uids: HashMap<String, (u64, bool)>,
    /// owner uid → keys of queued objects that name it.
    owners: HashMap<String, Vec<(u64, Key)>>,
    /// The last resourceVersion queued.
    rv: u64,
}

impl Overlay {
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Puts a planned write's rows on top (in resourceVersion order).
    pub fn push(&mut self, rows: &[Row]) {
        for row in rows {
            let key = key_of(row);
            let present = row.change != ChangeType::Deleted;
            let owners: Vec<String> = if present {
                owner_uids(&row.object).map(str::to_string).collect()
            } else {
                Vec::new()
            };
            for owner in &owners {
                self.owners
                    .entry(owner.clone())
                    .or_default()
                    .push((row.rv, key.clone()));
            }
            self.objects
                .insert(key.clone(), (row.rv, present.then(|| row.object.clone())));
            self.uids.insert(row.uid.clone(), (row.rv, present));
            self.rv = self.rv.max(row.rv);
            let patch = match &row.stored {
                Stored::Patch {
                    patch,
                    object_bytes,
                } => Some((*object_bytes, patch.len())),
                Stored::Whole => None,
            };
            self.entries.push_back(Entry {
                key,
                uid: row.uid.clone(),
                rv: row.rv,
                owners,
                patch,
            });
        }
    }

    /// Takes out the rows up to `rv`, now in the committed index.
    pub fn committed(&mut self, rv: u64) {
        while self.entries.front().is_some_and(|e| e.rv <= rv) {
            let Some(e) = self.entries.pop_front() else {
                break;
            };
            if self.objects.get(&e.key).is_some_and(|(at, _)| *at == e.rv) {
                self.objects.remove(&e.key);
            }
            if self.uids.get(&e.uid).is_some_and(|(at, _)| *at == e.rv) {
                self.uids.remove(&e.uid);
            }
            for owner in e.owners {
                if let Some(keys) = self.owners.get_mut(&owner) {
                    keys.retain(|(at, _)| *at != e.rv);
                    if keys.is_empty() {
                        self.owners.remove(&owner);
                    }
                }
            }
        }
    }

    /// Forgets every queued row: they failed to commit.
    pub fn clear(&mut self) {
        // The versions of failed writes are not handed out again: a writer may have been told
        // one before its write failed (`merge_status_planned`), and must not see it on another
        // object's change.
        *self = Overlay {
            rv: self.rv,
            ..Overlay::default()
        };
    }
}

/// The state a write's plan sees: the committed index with the queued writes on top.
pub(super) struct View<'a> {
    base: &'a State,
    overlay: &'a Overlay,
    /// The last resourceVersion handed out, committed or queued.
    pub rv: u64,
}

impl<'a> View<'a> {
    pub fn new(base: &'a State, overlay: &'a Overlay) -> Self {
        View {
            base,
            overlay,
            rv: base.rv.max(overlay.rv),
        }
    }

    /// A queued row's object at this key (`Some(None)` once deleted), `None` when no queued row
    /// has the key.
    fn queued(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Option<&Option<Arc<Value>>> {
        if self.overlay.is_empty() {
            return None;
        }
        let key = (
            api_version.to_string(),
            kind.to_string(),
            namespace.to_string(),
            name.to_string(),
        );
        self.overlay.objects.get(&key).map(|(_, object)| object)
    }

    pub fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<Value>> {
        match self.queued(api_version, kind, namespace, name) {
            Some(object) => object.clone(),
            None => self.base.get(api_version, kind, namespace, name),
        }
    }

    /// Whether an object has this name (without parsing a committed one).
    pub fn contains(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> bool {
        match self.queued(api_version, kind, namespace, name) {
            Some(object) => object.is_some(),
            None => self.base.contains(api_version, kind, namespace, name),
        }
    }

    pub fn has_uid(&self, uid: &str) -> bool {
        match self.overlay.uids.get(uid) {
            Some((_, present)) => *present,
            None => self.base.has_uid(uid),
        }
    }

    /// The status patches stored of the object `uid` since it was stored whole, counting the
    /// queued rows as [`State::apply`] will.
    pub fn patches(&self, uid: &str) -> Patches {
        let mut patches = self.base.patches(uid);
        for e in self.overlay.entries.iter().filter(|e| e.uid == uid) {
            match e.patch {
                Some((object_bytes, patch_bytes)) => {
                    patches.count += 1;
                    patches.object_bytes = object_bytes;
                    patches.patch_bytes += patch_bytes;
                }
                None => patches = Patches::default(),
            }
        }
        patches
    }

    /// Objects that name `uid` as an owner, with their apiVersion and kind.
    pub fn dependents_of(&self, uid: &str) -> Vec<(String, String, Arc<Value>)> {
        let committed = self.base.dependents_of(uid);
        if self.overlay.is_empty() {
            return committed;
        }
        // Every object that names the owner now is among these keys: a queued row replaced the
        // committed one (then it is listed under the owner if it still names it) or did not.
        let mut keys: Vec<Key> = committed
            .into_iter()
            .map(|(api_version, kind, obj)| {
                let (namespace, name) = crate::object_key(&obj);
                (api_version, kind, namespace, name)
            })
            .collect();
        for (_, key) in self.overlay.owners.get(uid).into_iter().flatten() {
            if !keys.contains(key) {
                keys.push(key.clone());
            }
        }
        keys.into_iter()
            .filter_map(|(api_version, kind, namespace, name)| {
                let obj = self.get(&api_version, &kind, &namespace, &name)?;
                let names_owner = owner_uids(&obj).any(|o| o == uid);
                names_owner.then_some((api_version, kind, obj))
            })
            .collect()
    }
}
