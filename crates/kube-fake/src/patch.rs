//! Patch application: JSON merge patch (RFC 7386), strategic merge patch (merge patch plus merge-key
//! lists and `$patch`/`$deleteFromPrimitiveList`/`$setElementOrder`/`$retainKeys` directives for the
//! fields our resources use), JSON patch (RFC 6902), and an approximation of server-side apply that
//! tracks each apply manager's field set in `metadata.managedFields`.

use serde_json::{Map, Value, json};

/// Why a patch could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The patch document is not of the expected shape.
    #[error("{0}")]
    Malformed(String),
    /// A JSON patch operation failed (missing path, failed `test`).
    #[error("{0}")]
    Apply(String),
    /// Server-side apply found fields owned by another manager with different values.
    #[error("{0}")]
    Conflict(String),
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// The merge key of a list field under strategic merge patch, for the fields of the resources served.
fn merge_key(field: &str, sample: Option<&Value>) -> Option<&'static str> {
    match field {
        "ports" => Some(
            if sample.is_some_and(|s| s.get("containerPort").is_some()) {
                "containerPort"
            } else {
                "port"
            },
        ),
        "containers" | "initContainers" | "env" | "volumes" | "imagePullSecrets" | "secrets"
        | "webhooks" | "matchConditions" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "conditions" => Some("type"),
        "ownerReferences" => Some("uid"),
        _ => None,
    }
}

/// Lists of scalars whose strategic-merge strategy is `merge` (union) rather than replace.
fn is_primitive_merge_list(field: &str) -> bool {
    field == "finalizers"
}

/// Strategic merge patch, close enough to the real one for the objects the fake serves.
pub fn strategic_merge(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    match p.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut replaced = p.clone();
            replaced.remove("$patch");
            *target = Value::Object(replaced);
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Null;
            return Ok(());
        }
        _ => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else {
        return Ok(());
    };
    if let Some(Value::Array(keep)) = p.get("$retainKeys") {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        t.retain(|k, _| keep.contains(&k.as_str()) || p.contains_key(k));
    }
    for (k, v) in p {
        if k == "$patch" || k == "$retainKeys" || k.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(del)) = (t.get_mut(field), v) {
                list.retain(|x| !del.contains(x));
            }
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match v {
            Value::Array(items) => {
                let existing = t.get_mut(k);
                match (existing, merge_key(k, items.first())) {
                    (Some(Value::Array(cur)), Some(key)) => merge_keyed_list(cur, items, key)?,
                    (Some(Value::Array(cur)), None) if is_primitive_merge_list(k) => {
                        for item in items {
                            if !cur.contains(item) {
                                cur.push(item.clone());
                            }
                        }
                    }
                    _ => {
                        let cleaned: Vec<Value> = items
                            .iter()
                            .filter(|i| i.get("$patch").and_then(Value::as_str) != Some("delete"))
                            .cloned()
                            .collect();
                        t.insert(k.clone(), Value::Array(cleaned));
                    }
                }
            }
            Value::Object(_) => {
                let slot = t.entry(k.clone()).or_insert(Value::Null);
                strategic_merge(slot, v)?;
                if slot.is_null() {
                    t.remove(k);
                }
            }
            other => {
                t.insert(k.clone(), other.clone());
            }
        }
    }
    if let Some(order) = p
        .iter()
        .find_map(|(k, v)| k.strip_prefix("$setElementOrder/").map(|f| (f, v)))
    {
        reorder(t, order.0, order.1);
    }
    Ok(())
}

fn reorder(t: &mut Map<String, Value>, field: &str, order: &Value) {
    let (Some(Value::Array(list)), Value::Array(order)) = (t.get_mut(field), order) else {
        return;
    };
    let Some(key) = merge_key(field, list.first()) else {
        return;
    };
    let mut sorted: Vec<Value> = Vec::with_capacity(list.len());
    for o in order {
        if let Some(pos) = list.iter().position(|x| x.get(key) == o.get(key)) {
            sorted.push(list.remove(pos));
        }
    }
    sorted.append(list);
    *list = sorted;
}

fn merge_keyed_list(cur: &mut Vec<Value>, items: &[Value], key: &str) -> Result<(), PatchError> {
    for item in items {
        let Some(k) = item.get(key) else {
            return Err(PatchError::Malformed(format!(
                "map: {item} does not contain declared merge key: {key}"
            )));
        };
        let pos = cur.iter().position(|c| c.get(key) == Some(k));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                cur.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge(&mut cur[i], item)?,
            (None, false) => cur.push(item.clone()),
        }
    }
    Ok(())
}

/// RFC 6902 JSON patch, atomic. Like the real server (evanphx/json-patch), a `test` for `null`
/// succeeds on a missing path: kube-runtime's finalizer helper relies on it to add the first finalizer.
pub fn json_patch(target: &mut Value, ops: &Value) -> Result<(), PatchError> {
    let patch: json_patch::Patch =
        serde_json::from_value(ops.clone()).map_err(|e| PatchError::Malformed(e.to_string()))?;
    let mut doc = target.clone();
    for op in patch.0 {
        if let json_patch::PatchOperation::Test(t) = &op
            && t.value.is_null()
            && doc.pointer(t.path.as_str()).is_none_or(Value::is_null)
        {
            continue;
        }
        json_patch::patch(&mut doc, &[op]).map_err(|e| PatchError::Apply(e.to_string()))?;
    }
    *target = doc;
    Ok(())
}

const UNTRACKED_META: [&str; 9] = [
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "deletionTimestamp",
    "selfLink",
];

/// The field set (`fieldsV1`) that an applied configuration claims: objects recurse, anything else
/// (including lists, treated atomically) is a leaf.
pub fn field_set(applied: &Value) -> Value {
    fn walk(v: &Value, top: bool, meta: bool) -> Value {
        match v {
            Value::Object(m) => {
                let mut out = Map::new();
                for (k, child) in m {
                    if top && (k == "apiVersion" || k == "kind") {
                        continue;
                    }
                    if meta && UNTRACKED_META.contains(&k.as_str()) {
                        continue;
                    }
                    out.insert(format!("f:{k}"), walk(child, false, top && k == "metadata"));
                }
                Value::Object(out)
            }
            _ => json!({}),
        }
    }
    walk(applied, true, false)
}

/// All leaf paths of a field set, as lists of plain keys.
fn leaf_paths(set: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    if let Value::Object(m) = set {
        if m.is_empty() {
            out.push(prefix.clone());
            return;
        }
        for (k, v) in m {
            prefix.push(k.trim_start_matches("f:").to_string());
            leaf_paths(v, prefix, out);
            prefix.pop();
        }
    }
}

fn set_contains(set: &Value, path: &[String]) -> bool {
    let mut cur = set;
    for p in path {
        match cur.get(format!("f:{p}")) {
            Some(next) => cur = next,
            None => return false,
        }
    }
    true
}

fn get_path<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, p| cur.get(p))
}

fn remove_path(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for p in parents {
        match cur.get_mut(p) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Value::Object(m) = cur {
        m.remove(last);
    }
}

fn remove_from_set(set: &mut Value, path: &[String]) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    let key = format!("f:{first}");
    if let Value::Object(m) = set {
        if rest.is_empty() {
            m.remove(&key);
        } else if let Some(child) = m.get_mut(&key) {
            remove_from_set(child, rest);
            if child.as_object().is_some_and(Map::is_empty) {
                m.remove(&key);
            }
        }
    }
}

/// Whether forcing moved fields away from other managers (their sets differ from the stored ones).
fn force_took_ownership(live: &Value, managed: &[Value]) -> bool {
    let stored = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    stored.as_slice() != managed
}

fn apply_merge(target: &mut Value, applied: &Value) {
    match applied {
        Value::Object(a) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in a {
                    apply_merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Server-side apply of `applied` by `manager` onto `live` (the current object, already carrying its
/// managedFields). Fields this manager applied before but no longer applies are removed unless another
/// apply manager owns them; a field owned by another apply manager with a different value is a conflict
/// unless `force`, which takes ownership.
pub fn server_side_apply(
    live: &Value,
    applied: &Value,
    manager: &str,
    force: bool,
    api_version: &str,
    subresource: Option<&str>,
    now: &str,
) -> Result<Value, PatchError> {
    let mut result = live.clone();
    let mut managed: Vec<Value> = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let new_set = field_set(applied);
    let mut new_leaves = Vec::new();
    leaf_paths(&new_set, &mut Vec::new(), &mut new_leaves);

    let is_mine = |m: &Value| {
        m.get("manager").and_then(Value::as_str) == Some(manager)
            && m.get("operation").and_then(Value::as_str) == Some("Apply")
            && m.get("subresource").and_then(Value::as_str) == subresource
    };
    let mut conflicts = Vec::new();
    for other in managed
        .iter_mut()
        .filter(|m| !is_mine(m) && m.get("operation").and_then(Value::as_str) == Some("Apply"))
    {
        let other_name = other
            .get("manager")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let other_version = other
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let Some(other_set) = other.get_mut("fieldsV1") else {
            continue;
        };
        for leaf in &new_leaves {
            if set_contains(other_set, leaf) && get_path(live, leaf) != get_path(applied, leaf) {
                if force {
                    remove_from_set(other_set, leaf);
                } else {
                    conflicts.push(format!(
                        "conflict with \"{other_name}\" using {other_version}: .{}",
                        leaf.join(".")
                    ));
                }
            }
        }
    }
    if !conflicts.is_empty() {
        let n = conflicts.len();
        let noun = if n == 1 { "conflict" } else { "conflicts" };
        return Err(PatchError::Conflict(format!(
            "Apply failed with {n} {noun}: {}",
            conflicts.join("\n")
        )));
    }

    if let Some(old) = managed
        .iter()
        .find(|m| is_mine(m))
        .and_then(|m| m.get("fieldsV1"))
    {
        let mut old_leaves = Vec::new();
        leaf_paths(old, &mut Vec::new(), &mut old_leaves);
        for leaf in old_leaves {
            let still_mine = set_contains(&new_set, &leaf);
            let owned_elsewhere = managed
                .iter()
                .filter(|m| !is_mine(m))
                .filter_map(|m| m.get("fieldsV1"))
                .any(|s| set_contains(s, &leaf));
            if !still_mine && !owned_elsewhere {
                remove_path(&mut result, &leaf);
            }
        }
    }
    let mut body = applied.clone();
    if let Value::Object(m) = &mut body {
        m.remove("apiVersion");
        m.remove("kind");
        if let Some(Value::Object(meta)) = m.get_mut("metadata") {
            for k in UNTRACKED_META {
                meta.remove(k);
            }
        }
    }
    apply_merge(&mut result, &body);

    // Like the real field manager, an apply that changes neither the object nor this manager's
    // field set leaves managedFields (and their timestamps) alone, so the write stays a no-op.
    let unchanged_set = managed
        .iter()
        .find(|m| is_mine(m))
        .and_then(|m| m.get("fieldsV1"))
        == Some(&new_set);
    let mut before = live.clone();
    let mut after = result.clone();
    for v in [&mut before, &mut after] {
        if let Some(Value::Object(meta)) = v.get_mut("metadata") {
            meta.remove("managedFields");
        }
    }
    if unchanged_set && before == after && !force_took_ownership(live, &managed) {
        return Ok(live.clone());
    }

    managed.retain(|m| !is_mine(m));
    managed.retain(|m| {
        m.get("fieldsV1")
            .is_none_or(|s| s.as_object().is_none_or(|o| !o.is_empty()))
    });
    let mut entry = json!({
        "manager": manager,
        "operation": "Apply",
        "apiVersion": api_version,
        "time": now,
        "fieldsType": "FieldsV1",
        "fieldsV1": new_set,
    });
    if let (Some(sub), Value::Object(e)) = (subresource, &mut entry) {
        e.insert("subresource".into(), json!(sub));
    }
    managed.push(entry);
    if let Some(Value::Object(meta)) = result.get_mut("metadata") {
        meta.insert("managedFields".into(), Value::Array(managed));
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_patch_test_null_passes_on_missing_path_and_is_atomic() {
        let mut t = json!({"metadata": {"name": "x"}});
        let add = json!([{"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["f"]}]);
        assert!(json_patch(&mut t, &add).is_ok());
        assert_eq!(t.pointer("/metadata/finalizers"), Some(&json!(["f"])));
        let failing = json!([{"op": "add", "path": "/metadata/x", "value": 1},
            {"op": "test", "path": "/metadata/name", "value": "y"}]);
        assert!(json_patch(&mut t, &failing).is_err());
        assert_eq!(t.pointer("/metadata/x"), None);
    }

    #[test]
    fn merge_patch_removes_nulls_and_replaces_lists() {
        let mut t = json!({"a": 1, "b": {"c": 2, "d": 3}, "l": [1, 2]});
        merge_patch(&mut t, &json!({"a": null, "b": {"c": 5}, "l": [3]}));
        assert_eq!(t, json!({"b": {"c": 5, "d": 3}, "l": [3]}));
    }

    #[test]
    fn strategic_merge_merges_webhooks_by_name() {
        let mut t = json!({"webhooks": [{"name": "a.x.io", "sideEffects": "None", "rules": [{"scope": "*"}]}]});
        let p = json!({"$setElementOrder/webhooks": [{"name": "a.x.io"}],
            "webhooks": [{"name": "a.x.io", "rules": [{"resources": ["pods"]}]}]});
        assert!(strategic_merge(&mut t, &p).is_ok());
        assert_eq!(
            t,
            json!({"webhooks": [{"name": "a.x.io", "sideEffects": "None", "rules": [{"resources": ["pods"]}]}]})
        );
    }

    #[test]
    fn strategic_merge_merges_ports_by_key_and_drops_directives() {
        let mut t = json!({"spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443}]}});
        let p = json!({"spec": {"$setElementOrder/ports": [{"port": 443}, {"port": 80}],
            "ports": [{"port": 80, "targetPort": 8080}]}});
        strategic_merge(&mut t, &p).ok();
        assert_eq!(
            t,
            json!({"spec": {"ports": [{"port": 443}, {"port": 80, "name": "http", "targetPort": 8080}]}})
        );
    }

    #[test]
    fn strategic_merge_unions_finalizers_and_deletes_from_primitive_list() {
        let mut t = json!({"metadata": {"finalizers": ["a", "b"]}});
        strategic_merge(&mut t, &json!({"metadata": {"finalizers": ["c"], "$deleteFromPrimitiveList/finalizers": ["a"]}})).ok();
        assert_eq!(t, json!({"metadata": {"finalizers": ["b", "c"]}}));
    }

    #[test]
    fn apply_removes_fields_the_manager_dropped() {
        let live = json!({"metadata": {"name": "x", "labels": {"a": "1"}}, "data": {"k": "v"}});
        let first = server_side_apply(
            &live,
            &json!({"metadata": {"name": "x", "labels": {"a": "1", "b": "2"}}}),
            "m",
            false,
            "v1",
            None,
            "t",
        )
        .unwrap_or_default();
        let second = server_side_apply(
            &first,
            &json!({"metadata": {"name": "x", "labels": {"a": "1"}}}),
            "m",
            false,
            "v1",
            None,
            "t",
        )
        .unwrap_or_default();
        assert_eq!(second.pointer("/metadata/labels"), Some(&json!({"a": "1"})));
        assert_eq!(second.pointer("/data/k"), Some(&json!("v")));
        let third = server_side_apply(
            &second,
            &json!({"metadata": {"name": "x", "labels": {"a": "1"}}}),
            "m",
            false,
            "v1",
            None,
            "later",
        )
        .unwrap_or_default();
        assert_eq!(
            third, second,
            "an identical apply keeps managedFields timestamps"
        );
    }

    #[test]
    fn apply_conflicts_with_another_manager_unless_forced() {
        let live = json!({"metadata": {"name": "x"}});
        let a = server_side_apply(
            &live,
            &json!({"data": {"k": "a"}}),
            "one",
            false,
            "v1",
            None,
            "t",
        )
        .unwrap_or_default();
        let conflict = server_side_apply(
            &a,
            &json!({"data": {"k": "b"}}),
            "two",
            false,
            "v1",
            None,
            "t",
        );
        assert!(matches!(conflict, Err(PatchError::Conflict(_))));
        let forced = server_side_apply(
            &a,
            &json!({"data": {"k": "b"}}),
            "two",
            true,
            "v1",
            None,
            "t",
        )
        .unwrap_or_default();
        assert_eq!(forced.pointer("/data/k"), Some(&json!("b")));
    }
}
