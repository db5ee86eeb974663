//! Kubernetes' object semantics for the embedded store's writes, as the API server applies them:
//! metadata checks (names here, the rest in [`super::objectmeta`]), server-owned fields kept on update, `generation` bumped by spec changes, the
//! status subresource, finalizers and graceful deletion, and the garbage collection of dependents
//! whose owners are gone.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::{
    EmbeddedStore,
    overlay::View,
    state::{Row as StateRow, Stored},
};
use crate::{
    validation, {ChangeType, Kind, StoreError},
};

pub(super) fn not_an_object(kind: &str, name: &str) -> StoreError {
    StoreError::Invalid {
        kind: kind.into(),
        name: name.into(),
        reason: "the object and its metadata must be JSON objects".into(),
    }
}

pub(super) fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    now.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

pub(super) fn meta_mut<'a>(
    kind: &Kind,
    obj: &'a mut Value,
) -> Result<&'a mut Map<String, Value>, StoreError> {
    let name = crate::object_key(obj).1;
    obj.as_object_mut()
        .and_then(|o| {
            o.entry("metadata")
                .or_insert_with(|| json!({}))
                .as_object_mut()
        })
        .ok_or_else(|| not_an_object(&kind.singular(), &name))
}

pub(super) fn meta_str(obj: &Value, field: &str) -> Option<String> {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .map(str::to_string)
}

pub(super) fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Metadata fields the server owns, ignored when telling whether a write changes anything.
const SERVER_OWNED: [&str; 2] = ["resourceVersion", "managedFields"];

/// Whether `a` and `b` are equal but for the metadata fields the server owns, to detect writes that
/// change nothing. Compared in place: copies of both to strip those fields (a pool status holds
/// thousands of entries) cost more than the comparison.
pub(super) fn same_but_server_fields(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    a.len() == b.len()
        && a.iter().all(|(k, v)| match b.get(k) {
            None => false,
            Some(w) if k == "metadata" => same_metadata(v, w),
            Some(w) => v == w,
        })
}

fn same_metadata(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    let relevant = |(k, _): &(&String, &Value)| !SERVER_OWNED.contains(&k.as_str());
    a.iter().filter(relevant).count() == b.iter().filter(relevant).count()
        && a.iter().filter(relevant).all(|(k, v)| b.get(k) == Some(v))
}

pub(super) fn invalid(kind: &Kind, name: &str, reason: impl Into<String>) -> StoreError {
    StoreError::Invalid {
        kind: kind.singular(),
        name: name.to_string(),
        reason: reason.into(),
    }
}

pub(super) fn not_found(kind: &Kind, name: &str) -> StoreError {
    StoreError::NotFound {
        kind: kind.singular(),
        name: name.to_string(),
    }
}

pub(super) fn conflict(kind: &Kind, name: &str) -> StoreError {
    StoreError::Conflict {
        kind: kind.singular(),
        name: name.to_string(),
    }
}

pub(super) fn row_of(
    kind: &Kind,
    namespace: &str,
    name: &str,
    uid: &str,
    rv: u64,
    change: ChangeType,
    object: Value,
) -> StateRow {
    StateRow {
        api_version: kind.api_version.to_string(),
        kind: kind.kind.to_string(),
        namespace: namespace.to_string(),
        name: name.to_string(),
        uid: uid.to_string(),
        rv,
        change,
        object: Arc::new(object),
        stored: Stored::Whole,
    }
}

pub(super) fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("resourceVersion".into(), Value::from(rv.to_string()));
    }
}

/// Checks the key of an incoming object and returns (namespace, name).
pub(super) fn checked_key(kind: &Kind, obj: &mut Value) -> Result<(String, String), StoreError> {
    let meta = meta_mut(kind, obj)?;
    let name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if name.is_empty() {
        return Err(invalid(
            kind,
            "",
            "metadata.name: Required value: name or generateName is required",
        ));
    }
    kind.names.check(&name).map_err(|e| {
        invalid(
            kind,
            &name,
            format!("metadata.name: Invalid value: \"{name}\": {e}"),
        )
    })?;
    let namespace = if kind.namespaced {
        let ns = meta
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if ns.is_empty() {
            return Err(invalid(kind, &name, "metadata.namespace: Required value"));
        }
        validation::dns1123_label(&ns).map_err(|e| {
            invalid(
                kind,
                &name,
                format!("metadata.namespace: Invalid value: \"{ns}\": {e}"),
            )
        })?;
        ns
    } else {
        meta.remove("namespace");
        String::new()
    };
    Ok((namespace, name))
}

/// Judges the metadata of an object being created as kube-apiserver does.
pub(super) fn validate_new_meta(kind: &Kind, name: &str, object: &Value) -> Result<(), StoreError> {
    meta_rules(kind)(object, None).map_err(|reason| invalid(kind, name, reason))
}

/// kube-apiserver's metadata rules for `kind`: a built-in kind's or a custom resource's.
fn meta_rules(kind: &Kind) -> fn(&Value, Option<&Value>) -> Result<(), String> {
    if super::objectmeta::is_builtin_group(&kind.group) {
        super::objectmeta::validate_builtin
    } else {
        super::objectmeta::validate
    }
}

/// Gives an object being created what the store sets: its uid, creation time, generation and
/// resourceVersion, no deletion marks, and no status when that is a subresource.
pub(super) fn stamp_created(
    kind: &Kind,
    object: &mut Value,
    uid: &str,
    rv: u64,
) -> Result<(), StoreError> {
    let meta = meta_mut(kind, object)?;
    meta.insert("uid".into(), Value::from(uid));
    meta.insert("creationTimestamp".into(), Value::from(now_rfc3339()));
    meta.insert("generation".into(), Value::from(1));
    meta.remove("deletionTimestamp");
    meta.remove("deletionGracePeriodSeconds");
    meta.insert("resourceVersion".into(), Value::from(rv.to_string()));
    if kind.status_subresource
        && let Some(o) = object.as_object_mut()
    {
        o.remove("status");
    }
    Ok(())
}

/// Whether `obj` names owners and none of them exists: Kubernetes' garbage collector deletes
/// such a dependent.
pub(super) fn orphaned(state: &View, obj: &Value) -> bool {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| {
            !refs.is_empty()
                && refs.iter().all(|r| {
                    !state.has_uid(r.get("uid").and_then(Value::as_str).unwrap_or_default())
                })
        })
}

impl EmbeddedStore {
    /// The rows that delete `root` and, like Kubernetes' garbage collector, its dependents whose
    /// owners are all gone. Objects with finalizers are only marked for deletion.
    pub(super) fn plan_delete(
        &self,
        state: &View,
        kind: &Kind,
        root: &Value,
        rv: &mut u64,
    ) -> Vec<StateRow> {
        let mut rows = Vec::new();
        let mut gone_uids = Vec::new();
        let mut queue: Vec<(String, String, Value)> = vec![(
            kind.api_version.to_string(),
            kind.kind.to_string(),
            root.clone(),
        )];
        while let Some((api_version, k, obj)) = queue.pop() {
            let (namespace, name) = crate::object_key(&obj);
            let uid = meta_str(&obj, "uid").unwrap_or_default();
            let row_kind = |rv: u64, change, object| StateRow {
                api_version: api_version.clone(),
                kind: k.clone(),
                namespace: namespace.clone(),
                name: name.clone(),
                uid: uid.clone(),
                rv,
                change,
                object: Arc::new(object),
                stored: Stored::Whole,
            };
            if !finalizers(&obj).is_empty() {
                if meta_str(&obj, "deletionTimestamp").is_none() {
                    let mut marked = obj.clone();
                    *rv += 1;
                    if let Some(m) = marked.get_mut("metadata").and_then(Value::as_object_mut) {
                        m.insert("deletionTimestamp".into(), Value::from(now_rfc3339()));
                        m.insert("deletionGracePeriodSeconds".into(), Value::from(0));
                    }
                    set_rv(&mut marked, *rv);
                    rows.push(row_kind(*rv, ChangeType::Modified, marked));
                }
                continue;
            }
            *rv += 1;
            let mut last = obj.clone();
            set_rv(&mut last, *rv);
            rows.push(row_kind(*rv, ChangeType::Deleted, last));
            gone_uids.push(uid.clone());
            for (dep_api, dep_kind, dep) in state.dependents_of(&uid) {
                let all_owners_gone = dep
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .is_some_and(|refs| {
                        refs.iter().all(|r| {
                            let owner = r.get("uid").and_then(Value::as_str).unwrap_or_default();
                            gone_uids.iter().any(|g| g == owner) || !state.has_uid(owner)
                        })
                    });
                let dep_uid = meta_str(&dep, "uid").unwrap_or_default();
                let already = rows
                    .iter()
                    .any(|r| r.uid == dep_uid && r.change == ChangeType::Deleted);
                if all_owners_gone && !already {
                    queue.push((dep_api, dep_kind, (*dep).clone()));
                }
            }
        }
        rows
    }
}

impl EmbeddedStore {
    pub(super) async fn replace_impl(
        &self,
        kind: &Kind,
        mut object: Value,
        status_only: bool,
    ) -> Result<Value, StoreError> {
        let (namespace, name) = checked_key(kind, &mut object)?;
        self.write(|state| {
            let current = state
                .get(&kind.api_version, &kind.kind, &namespace, &name)
                .ok_or_else(|| not_found(kind, &name))?;
            let want_rv = meta_str(&object, "resourceVersion").filter(|s| !s.is_empty());
            if want_rv.is_some() && want_rv != meta_str(&current, "resourceVersion") {
                return Err(conflict(kind, &name));
            }
            let want_uid = meta_str(&object, "uid").filter(|s| !s.is_empty());
            if want_uid.is_some() && want_uid != meta_str(&current, "uid") {
                return Err(conflict(kind, &name));
            }
            let mut next = if status_only {
                // The stored object with the new status, moved in: copying the old status only to
                // replace it would cost as much as the write.
                let status = object.as_object_mut().and_then(|o| o.remove("status"));
                match current.as_object() {
                    Some(fields) => {
                        let mut next: Map<String, Value> = fields
                            .iter()
                            .filter(|(k, _)| *k != "status")
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect();
                        if let Some(s) = status {
                            next.insert("status".into(), s);
                        }
                        Value::Object(next)
                    }
                    None => (*current).clone(),
                }
            } else {
                let mut next = object;
                if kind.status_subresource
                    && let Some(o) = next.as_object_mut()
                {
                    match current.get("status") {
                        Some(s) => o.insert("status".into(), s.clone()),
                        None => o.remove("status"),
                    };
                }
                // Server-owned metadata is kept from the stored object.
                let cur_meta = current
                    .get("metadata")
                    .cloned()
                    .unwrap_or_else(|| json!({}));
                let meta = meta_mut(kind, &mut next)?;
                for f in [
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "generation",
                ] {
                    match cur_meta.get(f) {
                        Some(v) => meta.insert(f.into(), v.clone()),
                        None => meta.remove(f),
                    };
                }
                if current.get("spec") != next.get("spec") {
                    let generation = cur_meta
                        .get("generation")
                        .and_then(Value::as_i64)
                        .unwrap_or(0);
                    meta_mut(kind, &mut next)?
                        .insert("generation".into(), Value::from(generation + 1));
                }
                next
            };
            if !status_only {
                // A status write keeps the stored metadata: nothing of it to judge.
                meta_rules(kind)(&next, Some(&current))
                    .map_err(|reason| invalid(kind, &name, reason))?;
            }
            if same_but_server_fields(&next, &current) {
                return Ok((Vec::new(), (*current).clone()));
            }
            let terminating = meta_str(&current, "deletionTimestamp").is_some();
            if terminating {
                let before = finalizers(&current);
                super::objectmeta::no_new_finalizers(&finalizers(&next), &before)
                    .map_err(|reason| invalid(kind, &name, reason))?;
            }
            let uid = meta_str(&current, "uid").unwrap_or_default();
            if terminating && finalizers(&next).is_empty() {
                let mut rv = state.rv;
                let rows = self.plan_delete(state, kind, &next, &mut rv);
                let last = rows.first().map(|r| (*r.object).clone()).unwrap_or(next);
                return Ok((rows, last));
            }
            let rv = state.rv + 1;
            set_rv(&mut next, rv);
            let row = row_of(
                kind,
                &namespace,
                &name,
                &uid,
                rv,
                ChangeType::Modified,
                next.clone(),
            );
            let mut rows = vec![row];
            if orphaned(state, &next) {
                let mut after = rv;
                rows.extend(self.plan_delete(state, kind, &next, &mut after));
            }
            Ok((rows, next))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::same_but_server_fields;
    use serde_json::json;

    #[test]
    fn writes_that_change_nothing_but_server_fields_are_the_same() {
        let a = json!({"metadata": {"name": "a", "resourceVersion": "1", "managedFields": []}, "spec": {"x": 1}});
        let b = json!({"metadata": {"name": "a", "resourceVersion": "2"}, "spec": {"x": 1}});
        assert!(same_but_server_fields(&a, &b));
        let c = json!({"metadata": {"name": "a", "resourceVersion": "2"}, "spec": {"x": 2}});
        assert!(!same_but_server_fields(&a, &c));
        let d = json!({"metadata": {"name": "a", "labels": {"l": "v"}}, "spec": {"x": 1}});
        assert!(!same_but_server_fields(&a, &d));
        let e = json!({"metadata": {"name": "a"}, "spec": {"x": 1}, "status": {}});
        assert!(!same_but_server_fields(&a, &e));
        // A metadata of server fields only is still a metadata, as a missing one is not.
        let f = json!({"metadata": {"resourceVersion": "1"}});
        assert!(same_but_server_fields(&f, &json!({"metadata": {}})));
        assert!(!same_but_server_fields(&f, &json!({})));
    }
}
