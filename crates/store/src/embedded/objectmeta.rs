//! kube-apiserver's `ValidateObjectMeta` for the embedded store's writes: label keys and values,
//! annotation keys and their total size, ownerReferences' shape and finalizer names, refused with
//! the API server's messages (apimachinery `pkg/api/validation/objectmeta.go`), so a client gets
//! the same 422 from either backend.
//!
//! One difference, on purpose: an update is judged on what it adds. A label, annotation key,
//! ownerReference or finalizer that the stored object already has is not judged again, so an
//! object stored before these checks existed can still be updated (its finalizers removed) and
//! deleted. Kubernetes never stored such an object, so nothing it allows is refused here.

use serde_json::{Map, Value};

use crate::validation::{go_json_string, go_quote, label_value, qualified_name};

/// apimachinery `TotalAnnotationSizeLimitB`: keys and values together, in bytes.
pub(crate) const ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;

const ORPHAN: &str = "orphan";
const FOREGROUND: &str = "foregroundDeletion";

/// Field errors in apimachinery's rendering (`field.Error.Error()`), in the order found.
#[derive(Default)]
struct Errors(Vec<String>);

impl Errors {
    fn invalid(&mut self, field: &str, value: &str, detail: &str) {
        self.0.push(format!(
            "{field}: Invalid value: {}: {detail}",
            go_quote(value)
        ));
    }
    fn invalid_json(&mut self, field: &str, json: &str, detail: &str) {
        self.0
            .push(format!("{field}: Invalid value: {json}: {detail}"));
    }
    fn push(&mut self, message: String) {
        self.0.push(message);
    }

    /// As `ErrorList.ToAggregate().Error()`: duplicates dropped, one message bare, several in
    /// brackets.
    fn aggregate(self) -> Option<String> {
        let mut seen: Vec<String> = Vec::new();
        for m in self.0 {
            if !seen.contains(&m) {
                seen.push(m);
            }
        }
        match seen.len() {
            0 => None,
            1 => seen.pop(),
            _ => Some(format!("[{}]", seen.join(", "))),
        }
    }
}

/// The metadata of `object` as kube-apiserver validates it on create (`old` is `None`) or update
/// (`old` is the stored object); the message of the refusal, without the `Kind "name" is
/// invalid: ` framing.
pub fn validate(object: &Value, old: Option<&Value>) -> Result<(), String> {
    judge(object, old, false)
}

/// [`validate`] for a built-in kind (core, RBAC, discovery, coordination, events): what the core
/// API group's `ValidateObjectMeta` adds, a refusal of each added finalizer name that has no
/// domain and is none of `kubernetes`, `orphan` and `foregroundDeletion`. For a custom resource
/// kube-apiserver only warns of such a name (apiextensions' strategy), so [`validate`] takes it.
pub(crate) fn validate_builtin(object: &Value, old: Option<&Value>) -> Result<(), String> {
    judge(object, old, true)
}

/// Whether kube-apiserver validates `group`'s objects as a built-in kind: a group without a dot or
/// under `k8s.io` (a CRD's group must have a dot, and `*.k8s.io` is reserved to Kubernetes).
pub(crate) fn is_builtin_group(group: &str) -> bool {
    !group.contains('.') || group.ends_with(".k8s.io")
}

fn metadata(v: Option<&Value>) -> Option<&Map<String, Value>> {
    v.and_then(|v| v.get("metadata")).and_then(Value::as_object)
}

fn judge(object: &Value, old: Option<&Value>, builtin: bool) -> Result<(), String> {
    // Borrowed, not copied: this runs on every write, and annotations may hold 256 KiB.
    let empty = Map::new();
    let new = metadata(Some(object)).unwrap_or(&empty);
    let old = metadata(old).unwrap_or(&empty);
    let mut errs = Errors::default();
    labels(new, old, &mut errs);
    annotations(new, old, &mut errs);
    owner_references(new, old, &mut errs);
    finalizers(new, old, &mut errs);
    if builtin {
        kube_finalizer_names(new, old, &mut errs);
    }
    match errs.aggregate() {
        None => Ok(()),
        Some(m) => Err(m),
    }
}

/// A map-of-strings field (`labels`, `annotations`), or the message saying it is not one.
fn string_map<'a>(
    meta: &'a Map<String, Value>,
    field: &str,
) -> Result<Vec<(&'a str, &'a str)>, String> {
    match meta.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.as_str(), s.as_str())),
                Value::Null => Ok((k.as_str(), "")),
                other => Err(format!(
                    "metadata.{field}: Invalid value: {other}: must be a string"
                )),
            })
            .collect(),
        Some(other) => Err(format!(
            "metadata.{field}: Invalid value: {other}: must be a map of strings"
        )),
    }
}

fn labels(new: &Map<String, Value>, old: &Map<String, Value>, errs: &mut Errors) {
    let (items, before) = match (string_map(new, "labels"), string_map(old, "labels")) {
        (Err(m), _) => return errs.push(m),
        (Ok(items), before) => (items, before.unwrap_or_default()),
    };
    for (k, v) in items {
        if before.contains(&(k, v)) {
            continue;
        }
        for msg in qualified_name(k) {
            errs.invalid("metadata.labels", k, &msg);
        }
        for msg in label_value(v) {
            errs.invalid("metadata.labels", v, &msg);
        }
    }
}

fn annotations(new: &Map<String, Value>, old: &Map<String, Value>, errs: &mut Errors) {
    let (items, before) = match (
        string_map(new, "annotations"),
        string_map(old, "annotations"),
    ) {
        (Err(m), _) => return errs.push(m),
        (Ok(items), before) => (items, before.unwrap_or_default()),
    };
    for (k, _) in &items {
        if before.iter().any(|(b, _)| b == k) {
            continue;
        }
        // As upstream: a qualified name, except that case does not matter.
        for msg in qualified_name(&k.to_lowercase()) {
            errs.invalid("metadata.annotations", k, &msg);
        }
    }
    let size = |items: &[(&str, &str)]| items.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    let total = size(&items);
    if total > ANNOTATIONS_MAX_BYTES && total > size(&before) {
        errs.push(format!(
            "metadata.annotations: Too long: may not be more than {ANNOTATIONS_MAX_BYTES} bytes"
        ));
    }
}

/// The string fields of an ownerReference, `""` when absent (as Go decodes them).
fn ref_str<'a>(r: &'a Value, field: &str) -> &'a str {
    r.get(field).and_then(Value::as_str).unwrap_or_default()
}

fn ref_controller(r: &Value) -> bool {
    r.get("controller").and_then(Value::as_bool) == Some(true)
}

/// An ownerReference as Go's `encoding/json` writes `metav1.OwnerReference` (field order, and the
/// two optional booleans only when set).
fn ref_json(r: &Value) -> String {
    let mut out = format!(
        "{{\"apiVersion\":{},\"kind\":{},\"name\":{},\"uid\":{}",
        go_json_string(ref_str(r, "apiVersion")),
        go_json_string(ref_str(r, "kind")),
        go_json_string(ref_str(r, "name")),
        go_json_string(ref_str(r, "uid")),
    );
    for f in ["controller", "blockOwnerDeletion"] {
        if let Some(b) = r.get(f).and_then(Value::as_bool) {
            out.push_str(&format!(",\"{f}\":{b}"));
        }
    }
    out.push('}');
    out
}

fn owner_references(new: &Map<String, Value>, old: &Map<String, Value>, errs: &mut Errors) {
    const FIELD: &str = "metadata.ownerReferences";
    let refs = match new.get("ownerReferences") {
        None | Some(Value::Null) => return,
        Some(Value::Array(refs)) => refs,
        Some(other) => {
            return errs.push(format!("{FIELD}: Invalid value: {other}: must be a list"));
        }
    };
    let before: &[Value] = old
        .get("ownerReferences")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut first_controller: Option<String> = None;
    let mut controllers = 0;
    for r in refs {
        if !r.is_object() {
            errs.push(format!("{FIELD}: Invalid value: {r}: must be an object"));
            continue;
        }
        if !before.contains(r) {
            owner_reference(r, errs);
        }
        if ref_controller(r) {
            controllers += 1;
            let this = format!("{}/{}", ref_str(r, "kind"), ref_str(r, "name"));
            match &first_controller {
                None => first_controller = Some(this),
                Some(first) => {
                    let before_count = before.iter().filter(|r| ref_controller(r)).count();
                    if controllers > before_count.max(1) {
                        let all: Vec<String> = refs.iter().map(ref_json).collect();
                        errs.invalid_json(
                            FIELD,
                            &format!("[{}]", all.join(",")),
                            &format!("Only one reference can have Controller set to true. Found \"true\" in references for {first} and {this}"),
                        );
                    }
                }
            }
        }
    }
}

/// apimachinery `validateOwnerReference`.
fn owner_reference(r: &Value, errs: &mut Errors) {
    const FIELD: &str = "metadata.ownerReferences";
    let api_version = ref_str(r, "apiVersion");
    // schema.FromAPIVersionAndKind: "group/version", or a bare version; anything else (or an
    // empty version after the slash) leaves the version empty.
    let (group, version) = match api_version.split('/').collect::<Vec<_>>()[..] {
        [v] => ("", v),
        [g, v] => (g, v),
        _ => ("", ""),
    };
    let kind = ref_str(r, "kind");
    if version.is_empty() {
        errs.invalid(
            &format!("{FIELD}.apiVersion"),
            api_version,
            "version must not be empty",
        );
    }
    if kind.is_empty() {
        errs.invalid(&format!("{FIELD}.kind"), kind, "must not be empty");
    }
    for f in ["name", "uid"] {
        let v = ref_str(r, f);
        if v.is_empty() {
            errs.invalid(&format!("{FIELD}.{f}"), v, "must not be empty");
        }
    }
    // BannedOwners: an Event cannot own anything.
    if group.is_empty() && version == "v1" && kind == "Event" {
        errs.invalid_json(
            FIELD,
            &ref_json(r),
            "/v1, Kind=Event is disallowed from being an owner",
        );
    }
}

fn finalizers(new: &Map<String, Value>, old: &Map<String, Value>, errs: &mut Errors) {
    const FIELD: &str = "metadata.finalizers";
    let names: Vec<&str> = match new.get("finalizers") {
        None | Some(Value::Null) => return,
        Some(Value::Array(a)) => {
            let mut names = Vec::with_capacity(a.len());
            for v in a {
                match v.as_str() {
                    Some(s) => names.push(s),
                    None => {
                        return errs.push(format!("{FIELD}: Invalid value: {v}: must be a string"));
                    }
                }
            }
            names
        }
        Some(other) => {
            return errs.push(format!("{FIELD}: Invalid value: {other}: must be a list"));
        }
    };
    let before: Vec<&str> = old
        .get("finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for f in &names {
        if before.contains(f) {
            continue;
        }
        for msg in qualified_name(f) {
            errs.invalid(FIELD, f, &msg);
        }
    }
    let both = |l: &[&str]| l.contains(&ORPHAN) && l.contains(&FOREGROUND);
    if both(&names) && !both(&before) {
        let all: Vec<String> = names.iter().map(|f| go_json_string(f)).collect();
        errs.invalid_json(
            FIELD,
            &format!("[{}]", all.join(",")),
            &format!("finalizer {ORPHAN} and {FOREGROUND} cannot be both set"),
        );
    }
}

/// The core API group's `validateKubeFinalizerName`, on each added finalizer, with its index.
fn kube_finalizer_names(new: &Map<String, Value>, old: &Map<String, Value>, errs: &mut Errors) {
    const STANDARD: [&str; 3] = ["kubernetes", ORPHAN, FOREGROUND];
    let list = |m: &Map<String, Value>| -> Vec<String> {
        m.get("finalizers")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let before = list(old);
    for (i, f) in list(new).iter().enumerate() {
        if before.contains(f) || f.contains('/') || STANDARD.contains(&f.as_str()) {
            continue;
        }
        errs.invalid(
            &format!("metadata.finalizers[{i}]"),
            f,
            "name is neither a standard finalizer name nor is it fully qualified",
        );
    }
}

/// apimachinery `ValidateNoNewFinalizers`: the refusal of finalizers added to an object being
/// deleted.
pub(crate) fn no_new_finalizers(new: &[String], old: &[String]) -> Result<(), String> {
    let mut extra: Vec<&String> = new.iter().filter(|f| !old.contains(f)).collect();
    if extra.is_empty() {
        return Ok(());
    }
    extra.sort();
    extra.dedup();
    let list: Vec<String> = extra.iter().map(|f| go_quote(f)).collect();
    Err(format!(
        "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
        list.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mk_obj(meta: Value) -> Value {
        let mut m = json!({"name": "a", "namespace": "ns1"});
        if let (Some(m), Some(extra)) = (m.as_object_mut(), meta.as_object()) {
            m.extend(extra.clone());
        }
        json!({"metadata": m})
    }

    #[test]
    fn labels_keys_and_values() {
        assert!(validate(&mk_obj(json!({"labels": {"a": "", "b/c": "x"}})), None).is_ok());
        let err = validate(&mk_obj(json!({"labels": {"l": "<b> x"}})), None).unwrap_err();
        assert!(
            err.starts_with("metadata.labels: Invalid value: \"<b> x\": a valid label"),
            "{err}"
        );
        // A key and a value both wrong: two errors, in brackets.
        let err = validate(&mk_obj(json!({"labels": {"a b": "-"}})), None).unwrap_err();
        assert!(
            err.starts_with("[metadata.labels: Invalid value: \"a b\": name part"),
            "{err}"
        );
    }

    #[test]
    fn annotations_keys_case_and_size() {
        assert!(
            validate(
                &mk_obj(json!({"annotations": {"Example.COM/Key": "<anything>"}})),
                None
            )
            .is_ok()
        );
        let at_limit = "v".repeat(ANNOTATIONS_MAX_BYTES - 1);
        assert!(validate(&mk_obj(json!({"annotations": {"k": at_limit}})), None).is_ok());
        let over = "v".repeat(ANNOTATIONS_MAX_BYTES);
        assert_eq!(
            validate(&mk_obj(json!({"annotations": {"k": over}})), None).unwrap_err(),
            "metadata.annotations: Too long: may not be more than 262144 bytes"
        );
    }

    #[test]
    fn owner_references_shape_and_one_controller() {
        let ok = json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "u"});
        assert!(validate(&mk_obj(json!({"ownerReferences": [ok]})), None).is_ok());
        assert_eq!(
            validate(&mk_obj(json!({"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "o"}]})), None).unwrap_err(),
            "metadata.ownerReferences.uid: Invalid value: \"\": must not be empty"
        );
        assert_eq!(
            validate(&mk_obj(json!({"ownerReferences": [{"apiVersion": "a/b/c", "kind": "K", "name": "o", "uid": "u"}]})), None).unwrap_err(),
            "metadata.ownerReferences.apiVersion: Invalid value: \"a/b/c\": version must not be empty"
        );
        let c = |n: &str| json!({"apiVersion": "v1", "kind": "K", "name": n, "uid": n, "controller": true});
        let err =
            validate(&mk_obj(json!({"ownerReferences": [c("a"), c("b")]})), None).unwrap_err();
        assert_eq!(
            err,
            "metadata.ownerReferences: Invalid value: [{\"apiVersion\":\"v1\",\"kind\":\"K\",\"name\":\"a\",\"uid\":\"a\",\"controller\":true},{\"apiVersion\":\"v1\",\"kind\":\"K\",\"name\":\"b\",\"uid\":\"b\",\"controller\":true}]: Only one reference can have Controller set to true. Found \"true\" in references for K/a and K/b"
        );
    }

    #[test]
    fn finalizer_names() {
        assert!(
            validate(
                &mk_obj(json!({"finalizers": ["example.com/x", "kubernetes", "plain"]})),
                None
            )
            .is_ok()
        );
        assert!(
            validate(&mk_obj(json!({"finalizers": ["bad name"]})), None)
                .unwrap_err()
                .starts_with("metadata.finalizers: Invalid value: \"bad name\": name part")
        );
        assert_eq!(
            validate(&mk_obj(json!({"finalizers": [ORPHAN, FOREGROUND]})), None).unwrap_err(),
            "metadata.finalizers: Invalid value: [\"orphan\",\"foregroundDeletion\"]: finalizer orphan and foregroundDeletion cannot be both set"
        );
    }

    #[test]
    fn updates_judge_what_they_add() {
        // Stored before these checks: kept as is, but nothing new of the same kind gets in.
        let old =
            mk_obj(json!({"labels": {"l": "<b>"}, "finalizers": ["bad name", "example.com/f"]}));
        let mut removed = old.clone();
        removed["metadata"]["finalizers"] = json!(["bad name"]);
        assert!(validate(&removed, Some(&old)).is_ok());
        let mut added = old.clone();
        added["metadata"]["labels"]["m"] = json!("<i>");
        assert!(
            validate(&added, Some(&old))
                .unwrap_err()
                .contains("\"<i>\"")
        );
    }
}
