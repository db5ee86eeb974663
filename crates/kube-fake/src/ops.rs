//! Object writes with the real server's semantics: create (generateName, uid, creationTimestamp,
//! namespaces that must exist), update and patch (optimistic concurrency, no-op writes, status
//! subresource, generation), delete (finalizers, deletionTimestamp, propagation), plus the
//! type-specific admission of the built-in types and the schema pruning of custom resources.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rand::Rng;
use serde_json::{Map, Value, json};

use crate::auth::Identity;
use crate::clock;
use crate::patch::{self, PatchError};
use crate::rbac::{self, Attributes, RBAC};
use crate::registry::{self, Behaviour, ResourceType};
use crate::state::{Inner, TokenMode};
use crate::status::{ApiError, FieldError};
use crate::store::Key;

/// Who writes, and how.
#[derive(Debug, Clone)]
pub struct WriteCtx {
    /// The caller (escalation checks).
    pub id: Identity,
    /// `dryRun=All`: validate and answer, store nothing.
    pub dry_run: bool,
    /// The CA PEM, for `kube-root-ca.crt`.
    pub ca_pem: String,
}

/// The patch flavours of the `Content-Type` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json`.
    Merge,
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/json-patch+json`.
    Json,
    /// `application/apply-patch+yaml`.
    Apply,
}

/// The outcome of a delete.
#[derive(Debug, Clone)]
pub enum Deleted {
    /// Removed now; the last state.
    Gone(Value),
    /// Waiting for finalizers; the object with its deletionTimestamp.
    Pending(Value),
}

const EVENT_RENAMES: [(&str, &str); 7] = [
    ("message", "note"),
    ("involvedObject", "regarding"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

fn rename_keys(obj: &mut Value, to_v1: bool) {
    if let Value::Object(m) = obj {
        for (core, v1) in EVENT_RENAMES {
            let (from, to) = if to_v1 { (core, v1) } else { (v1, core) };
            if let Some(v) = m.remove(from) {
                m.insert(to.into(), v);
            }
        }
    }
}

/// Converts a request body to the storage shape.
pub fn to_storage(rt: &ResourceType, mut obj: Value) -> Value {
    if rt.behaviour == Behaviour::EventsV1 {
        rename_keys(&mut obj, false);
        if let Value::Object(m) = &mut obj {
            m.insert("apiVersion".into(), json!("v1"));
            m.insert("kind".into(), json!("Event"));
        }
    }
    obj
}

/// Converts a stored object to the representation of `version` of `rt`.
pub fn to_version(rt: &ResourceType, version: &str, stored: &Value) -> Value {
    let mut obj = stored.clone();
    if rt.behaviour == Behaviour::EventsV1 {
        rename_keys(&mut obj, true);
    }
    if let Value::Object(m) = &mut obj {
        let mut out = Map::new();
        out.insert("kind".into(), json!(rt.kind));
        out.insert("apiVersion".into(), json!(rt.api_version(version)));
        for (k, v) in std::mem::take(m) {
            if k != "kind" && k != "apiVersion" {
                out.insert(k, v);
            }
        }
        *m = out;
    }
    obj
}

/// The storage key of an object of `rt`.
pub fn key_of(rt: &ResourceType, namespace: &str, name: &str) -> Key {
    let ns = if rt.namespaced { namespace } else { "" };
    (
        rt.storage.0.clone(),
        rt.storage.1.clone(),
        ns.to_string(),
        name.to_string(),
    )
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = json!({});
    }
    let slot = &mut obj["metadata"];
    if !slot.is_object() {
        *slot = json!({});
    }
    slot.as_object_mut()
        .expect("metadata was just made an object")
}

/// Drops the metadata fields Go's `omitempty` would not store: empty finalizers, labels,
/// annotations and ownerReferences. Clients (kube-runtime's finalizer helper) rely on a missing
/// `finalizers` reading as null.
fn normalize_meta(obj: &mut Value) {
    if let Some(Value::Object(meta)) = obj.get_mut("metadata") {
        for field in [
            "finalizers",
            "labels",
            "annotations",
            "ownerReferences",
            "managedFields",
        ] {
            let empty = match meta.get(field) {
                Some(Value::Array(a)) => a.is_empty(),
                Some(Value::Object(m)) => m.is_empty(),
                Some(Value::Null) => true,
                _ => false,
            };
            if empty {
                meta.remove(field);
            }
        }
    }
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

fn finalizers(obj: &Value) -> Vec<String> {
    crate::strings(obj.pointer("/metadata/finalizers"))
}

fn check_type_meta(rt: &ResourceType, version: &str, obj: &Value) -> Result<(), ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request is not a JSON object",
        ));
    }
    let want = rt.api_version(version);
    if let Some(av) = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        && av != want
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({want})"
        )));
    }
    if let Some(kind) = obj
        .get("kind")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        && kind != rt.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            rt.kind
        )));
    }
    for field in ["labels", "annotations"] {
        if let Some(m) = obj.pointer(&format!("/metadata/{field}"))
            && !(m.is_null()
                || m.as_object()
                    .is_some_and(|m| m.values().all(Value::is_string)))
        {
            return Err(ApiError::bad_request(format!(
                "json: cannot unmarshal {field} into Go struct field ObjectMeta.metadata.{field} of type map[string]string"
            )));
        }
    }
    Ok(())
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn name_problem(rt: &ResourceType, name: &str) -> Option<String> {
    match rt.behaviour {
        Behaviour::Role | Behaviour::Binding => {
            if name == "." || name == ".." {
                Some(format!("may not be '{name}'"))
            } else if name.contains('/') || name.contains('%') {
                Some("may not contain '/' or '%'".into())
            } else {
                None
            }
        }
        Behaviour::Namespace | Behaviour::Service => (!is_dns_label(name)).then(|| {
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')".to_string()
        }),
        _ => (name.len() > 253 || !name.split('.').all(is_dns_label)).then(|| {
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".to_string()
        }),
    }
}

fn generate_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

fn new_uid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The type of a storage location (the canonical one, not an alias such as events.k8s.io).
pub fn type_for_storage(inner: &Inner, group: &str, plural: &str) -> Option<ResourceType> {
    inner
        .types
        .iter()
        .find(|t| {
            t.storage.0 == group && t.storage.1 == plural && t.behaviour != Behaviour::EventsV1
        })
        .cloned()
}

/// A write computed under the lock, with the built-in admission done, but not yet stored: the
/// admission chain sends it to webhooks with the lock released, then commits it.
#[derive(Debug, Clone)]
pub enum Plan {
    /// A create of `obj` (storage shape) under `key`.
    Create {
        /// Where it goes.
        key: Key,
        /// The object to store.
        obj: Value,
    },
    /// An update from `old` (as stored now) to `new` (storage shape, old resourceVersion).
    Update {
        /// Which object.
        key: Key,
        /// The stored object the update starts from.
        old: Value,
        /// The object to store.
        new: Value,
    },
}

/// Creates an object.
pub fn create(
    inner: &mut Inner,
    rt: &ResourceType,
    version: &str,
    namespace: Option<&str>,
    body: Value,
    ctx: &WriteCtx,
) -> Result<Value, ApiError> {
    let (key, obj) = prepare_create(inner, rt, version, namespace, body, ctx)?;
    commit_create(inner, rt, version, key, obj, ctx)
}

/// Everything a create does before storing: names, namespace checks, system metadata and the
/// type's own admission. Returns the storage key and object.
pub fn prepare_create(
    inner: &mut Inner,
    rt: &ResourceType,
    version: &str,
    namespace: Option<&str>,
    body: Value,
    ctx: &WriteCtx,
) -> Result<(Key, Value), ApiError> {
    check_type_meta(rt, version, &body)?;
    let mut obj = to_storage(rt, body);
    let ns = if rt.namespaced {
        let path_ns = namespace.unwrap_or_default();
        match meta_str(&obj, "namespace").filter(|n| !n.is_empty()) {
            Some(n) if !path_ns.is_empty() && n != path_ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            Some(n) => n.to_string(),
            None => path_ns.to_string(),
        }
    } else {
        String::new()
    };
    let meta = meta_mut(&mut obj);
    if meta
        .get("resourceVersion")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
    {
        return Err(ApiError::bad_request(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    let name = match (
        meta.get("name").and_then(Value::as_str),
        meta.get("generateName").and_then(Value::as_str),
    ) {
        (Some(n), _) if !n.is_empty() => n.to_string(),
        (_, Some(g)) if !g.is_empty() => format!("{g}{}", generate_suffix()),
        _ => {
            return Err(ApiError::invalid(
                &rt.kind,
                &rt.group,
                "",
                &[FieldError::required(
                    "metadata.name",
                    "name or generateName is required",
                )],
            ));
        }
    };
    if let Some(problem) = name_problem(rt, &name) {
        return Err(ApiError::invalid(
            &rt.kind,
            &rt.group,
            &name,
            &[FieldError::invalid("metadata.name", &json!(name), &problem)],
        ));
    }
    if rt.namespaced {
        if ns.is_empty() {
            return Err(ApiError::bad_request(
                "the server could not find the requested resource",
            ));
        }
        match inner.store.get(&(
            String::new(),
            "namespaces".into(),
            String::new(),
            ns.clone(),
        )) {
            None => return Err(ApiError::not_found("namespaces", "", &ns)),
            Some(n) if n.pointer("/metadata/deletionTimestamp").is_some() => {
                let mut e = ApiError::forbidden(
                    &rt.plural,
                    &rt.group,
                    &name,
                    &format!(
                        "unable to create new content in namespace {ns} because it is being terminated"
                    ),
                );
                if let Some(d) = e.details.as_mut() {
                    d.insert(
                        "causes".into(),
                        json!([{"reason": "NamespaceTerminating", "message": format!("namespace {ns} is being terminated"), "field": "metadata.namespace"}]),
                    );
                }
                return Err(e);
            }
            Some(_) => {}
        }
    }
    let meta = meta_mut(&mut obj);
    meta.insert("name".into(), json!(name));
    if rt.namespaced {
        meta.insert("namespace".into(), json!(ns));
    } else {
        meta.remove("namespace");
    }
    meta.insert("uid".into(), json!(new_uid()));
    meta.insert("creationTimestamp".into(), json!(clock::now()));
    meta.remove("deletionTimestamp");
    meta.remove("deletionGracePeriodSeconds");
    meta.remove("selfLink");
    if rt.generation {
        meta.insert("generation".into(), json!(1));
    } else {
        meta.remove("generation");
    }
    if rt.has_status(version)
        && rt.behaviour == Behaviour::Custom
        && let Value::Object(m) = &mut obj
    {
        m.remove("status");
    }
    admit(inner, rt, version, &ns, &name, None, &mut obj, ctx)?;
    normalize_meta(&mut obj);
    Ok((key_of(rt, &ns, &name), obj))
}

/// Stores a prepared create (or answers it, for a dry run).
pub fn commit_create(
    inner: &mut Inner,
    rt: &ResourceType,
    version: &str,
    key: Key,
    obj: Value,
    ctx: &WriteCtx,
) -> Result<Value, ApiError> {
    if inner.store.get(&key).is_some() {
        return Err(ApiError::already_exists(&rt.plural, &rt.group, &key.3));
    }
    if ctx.dry_run {
        return Ok(to_version(rt, version, &obj));
    }
    let stored = inner.store.put(key.clone(), obj);
    tracing::debug!(resource = %rt.plural, namespace = %key.2, name = %key.3, "created");
    after_create(inner, rt, &key, &stored, ctx);
    Ok(to_version(rt, version, &stored))
}

/// Stores a prepared write; returns the object and whether it was created.
pub fn commit(
    inner: &mut Inner,
    rt: &ResourceType,
    version: &str,
    plan: Plan,
    ctx: &WriteCtx,
) -> Result<(Value, bool), ApiError> {
    match plan {
        Plan::Create { key, obj } => {
            commit_create(inner, rt, version, key, obj, ctx).map(|v| (v, true))
        }
        Plan::Update { key, old, new } => {
            commit_update(inner, rt, version, key, old, new, ctx).map(|v| (v, false))
        }
    }
}

/// Everything a PUT does before storing (a create when the type creates on update).
#[allow(clippy::too_many_arguments)]
pub fn prepare_update(
    inner: &mut Inner,
    rt: &ResourceType,
    version: &str,
    namespace: &str,
    name: &str,
    body: Value,
    subresource: Option<&str>,
    ctx: &WriteCtx,
) -> Result<Plan, ApiError> {
    check_type_meta(rt, version, &body)?;
    let mut new = to_storage(rt, body);
    match meta_str(&new, "name") {
        Some(n) if n != name => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        _ => {
            meta_mut(&mut new).insert("name".into(), json!(name));
        }
    }
    let key = key_of(rt, namespace, name);
    let Some(old) = inner.store.get(&key).cloned() else {
        if rt.create_on_update && subresource.is_none() {
            if let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("resourceVersion");
            }
            let (key, obj) = prepare_create(
                inner,
                rt,
                version,
                Some(namespace),
                to_version(rt, version, &new),
                ctx,
            )?;
            return Ok(Plan::Create { key, obj });
        }
        return Err(ApiError::not_found(&rt.plural, &rt.group, name));
    };
    match meta_str(&new, "resourceVersion").filter(|s| !s.is_empty()) {
        Some(rv) if Some(rv) != meta_str(&old, "resourceVersion") => {
            return Err(ApiError::conflict_modified(&rt.plural, &rt.group, name));
        }
        None if !rt.unconditional_update => {
            return Err(ApiError::invalid(
                &rt.kind,
                &rt.group,
                name,
                &[FieldError::invalid(
                    "metadata.resourceVersion",
                    &json!("0x0"),
                    "must be specified for an update",
                )],
            ));
        }
        _ => {}
    }
    let new = prepare_finish(inner, rt, version, &key, &old, new, subresource, ctx)?;
    Ok(Plan::Update { key, old, new })
}

fn strip_for_generation(obj: &Value, drop_status: bool) -> Value {
    let mut c = obj.clone();
    if let Value::Object(m) = &mut c {
        m.remove("metadata");
        if drop_status {
            m.remove("status");
        }
    }
    c
}

#[allow(clippy::too_many_arguments)]
fn finish_update(
    inner: &mut Inner,
    rt: &ResourceType,
    version: &str,
    key: Key,
    old: Value,
    new: Value,
    subresource: Option<&str>,
    ctx: &WriteCtx,
) -> Result<Value, ApiError> {
    let new = prepare_finish(inner, rt, version, &key, &old, new, subresource, ctx)?;
    commit_update(inner, rt, version, key, old, new, ctx)
}

/// The part of an update after the body is known: the status subresource split, system metadata
/// carried over from `old`, the finalizer rule of terminating objects, the type's admission and
/// generation. Returns the object to store (with `old`'s resourceVersion).
#[allow(clippy::too_many_arguments)]
pub fn prepare_finish(
    inner: &mut Inner,
    rt: &ResourceType,
    version: &str,
    key: &Key,
    old: &Value,
    mut new: Value,
    subresource: Option<&str>,
    ctx: &WriteCtx,
) -> Result<Value, ApiError> {
    let name = key.3.clone();
    match subresource {
        Some("status") => {
            let mut merged = old.clone();
            if let Value::Object(m) = &mut merged {
                match new.get("status") {
                    Some(s) => m.insert("status".into(), s.clone()),
                    None => m.remove("status"),
                };
            }
            if let Some(rv) = new.pointer("/metadata/resourceVersion").cloned() {
                meta_mut(&mut merged).insert("resourceVersion".into(), rv);
            }
            new = merged;
        }
        Some(_) => return Err(ApiError::path_not_found()),
        None if rt.has_status(version) => {
            if let Value::Object(m) = &mut new {
                match old.get("status") {
                    Some(s) => m.insert("status".into(), s.clone()),
                    None => m.remove("status"),
                };
            }
        }
        None => {}
    }
    {
        let old_meta = old.get("metadata").cloned().unwrap_or_else(|| json!({}));
        let meta = meta_mut(&mut new);
        for field in [
            "uid",
            "creationTimestamp",
            "namespace",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            match old_meta.get(field) {
                Some(v) => meta.insert(field.into(), v.clone()),
                None => meta.remove(field),
            };
        }
        if !meta.contains_key("managedFields")
            && let Some(mf) = old_meta.get("managedFields")
        {
            meta.insert("managedFields".into(), mf.clone());
        }
        meta.remove("selfLink");
    }
    if old.pointer("/metadata/deletionTimestamp").is_some() {
        let before = finalizers(old);
        let added: Vec<String> = finalizers(&new)
            .into_iter()
            .filter(|f| !before.contains(f))
            .collect();
        if !added.is_empty() {
            return Err(ApiError::invalid(
                &rt.kind,
                &rt.group,
                &name,
                &[FieldError::forbidden(
                    "metadata.finalizers",
                    &format!(
                        "no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                    ),
                )],
            ));
        }
    }
    admit(inner, rt, version, &key.2, &name, Some(old), &mut new, ctx)?;
    normalize_meta(&mut new);
    if rt.generation {
        let drop_status = rt.has_status(version);
        if strip_for_generation(old, drop_status) != strip_for_generation(&new, drop_status) {
            let g = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(&mut new).insert("generation".into(), json!(g + 1));
        }
    }
    if let Some(rv) = old.pointer("/metadata/resourceVersion").cloned() {
        meta_mut(&mut new).insert("resourceVersion".into(), rv);
    }
    Ok(new)
}

/// Stores a prepared update: nothing for a no-op, the answer alone for a dry run, removal when the
/// last finalizer of a terminating object went.
pub fn commit_update(
    inner: &mut Inner,
    rt: &ResourceType,
    version: &str,
    key: Key,
    old: Value,
    new: Value,
    ctx: &WriteCtx,
) -> Result<Value, ApiError> {
    if new == old {
        return Ok(to_version(rt, version, &old));
    }
    if ctx.dry_run {
        return Ok(to_version(rt, version, &new));
    }
    let deleting = new.pointer("/metadata/deletionTimestamp").is_some();
    let ns_pending = rt.behaviour == Behaviour::Namespace
        && new
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
    if deleting && finalizers(&new).is_empty() && !ns_pending {
        inner.store.put(key.clone(), new);
        let gone = inner.store.remove(&key).unwrap_or_default();
        after_delete(inner, rt, &key, &gone, ctx);
        return Ok(to_version(rt, version, &gone));
    }
    let stored = inner.store.put(key.clone(), new);
    after_update(inner, rt, &stored);
    Ok(to_version(rt, version, &stored))
}

fn patch_error(rt: &ResourceType, name: &str, e: PatchError) -> ApiError {
    match e {
        PatchError::Malformed(m) => ApiError::bad_request(m),
        PatchError::Apply(m) => ApiError {
            code: 422,
            reason: "Invalid".into(),
            message: m,
            details: Some(
                [
                    ("name".to_string(), json!(name)),
                    ("kind".to_string(), json!(rt.kind)),
                ]
                .into_iter()
                .collect(),
            ),
        },
        PatchError::Conflict(m) => {
            let causes: Vec<Value> = m
                .lines()
                .filter_map(|l| {
                    let field = l.rsplit_once(": ").map(|(_, f)| f)?;
                    let msg = l.trim_start_matches(|c| c != 'c').to_string();
                    Some(json!({"reason": "FieldManagerConflict", "message": msg, "field": field}))
                })
                .collect();
            ApiError {
                code: 409,
                reason: "Conflict".into(),
                message: m,
                details: Some(
                    [("causes".to_string(), Value::Array(causes))]
                        .into_iter()
                        .collect(),
                ),
            }
        }
    }
}

/// Everything a patch does before storing (a create for server-side apply of a missing object).
#[allow(clippy::too_many_arguments)]
pub fn prepare_patch(
    inner: &mut Inner,
    rt: &ResourceType,
    version: &str,
    namespace: &str,
    name: &str,
    ptype: PatchType,
    body: &Value,
    subresource: Option<&str>,
    manager: &str,
    force: bool,
    ctx: &WriteCtx,
) -> Result<Plan, ApiError> {
    let key = key_of(rt, namespace, name);
    let now = clock::now();
    let api_version = rt.api_version(version);
    let Some(old) = inner.store.get(&key).cloned() else {
        if ptype == PatchType::Apply && subresource.is_none() {
            if body
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .is_some_and(|n| n != name)
            {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({}) does not match the name on the URL ({name})",
                    body.pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                )));
            }
            let base = json!({"metadata": {"name": name}});
            let mut obj =
                patch::server_side_apply(&base, body, manager, force, &api_version, None, &now)
                    .map_err(|e| patch_error(rt, name, e))?;
            obj["apiVersion"] = json!(api_version);
            obj["kind"] = json!(rt.kind);
            let (key, obj) = prepare_create(inner, rt, version, Some(namespace), obj, ctx)?;
            return Ok(Plan::Create { key, obj });
        }
        return Err(ApiError::not_found(&rt.plural, &rt.group, name));
    };
    let current = to_version(rt, version, &old);
    let patched = match ptype {
        PatchType::Merge => {
            let mut c = current;
            patch::merge_patch(&mut c, body);
            c
        }
        PatchType::Strategic => {
            let mut c = current;
            patch::strategic_merge(&mut c, body).map_err(|e| patch_error(rt, name, e))?;
            c
        }
        PatchType::Json => {
            let mut c = current;
            patch::json_patch(&mut c, body).map_err(|e| patch_error(rt, name, e))?;
            c
        }
        PatchType::Apply => {
            let applied_name = body.pointer("/metadata/name").and_then(Value::as_str);
            if applied_name.is_some_and(|n| n != name) {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({}) does not match the name on the URL ({name})",
                    applied_name.unwrap_or_default()
                )));
            }
            patch::server_side_apply(
                &current,
                body,
                manager,
                force,
                &api_version,
                subresource,
                &now,
            )
            .map_err(|e| patch_error(rt, name, e))?
        }
    };
    check_type_meta(rt, version, &patched)?;
    if meta_str(&patched, "name").is_some_and(|n| n != name) {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            meta_str(&patched, "name").unwrap_or_default()
        )));
    }
    let new = to_storage(rt, patched);
    if meta_str(&new, "resourceVersion") != meta_str(&old, "resourceVersion") {
        return Err(ApiError::conflict_modified(&rt.plural, &rt.group, name));
    }
    let new = prepare_finish(inner, rt, version, &key, &old, new, subresource, ctx)?;
    Ok(Plan::Update { key, old, new })
}

/// Deletes an object: at once, or by setting deletionTimestamp while finalizers remain.
pub fn delete(
    inner: &mut Inner,
    rt: &ResourceType,
    key: &Key,
    options: &Value,
    ctx: &WriteCtx,
) -> Result<Deleted, ApiError> {
    let obj = prepare_delete(inner, rt, key, options)?;
    commit_delete(inner, rt, key, obj, options, ctx)
}

/// The checks of a delete (existence, preconditions); returns the object as stored now.
pub fn prepare_delete(
    inner: &Inner,
    rt: &ResourceType,
    key: &Key,
    options: &Value,
) -> Result<Value, ApiError> {
    let name = key.3.clone();
    let Some(obj) = inner.store.get(key).cloned() else {
        return Err(ApiError::not_found(&rt.plural, &rt.group, &name));
    };
    if let Some(uid) = options
        .pointer("/preconditions/uid")
        .and_then(Value::as_str)
    {
        let actual = meta_str(&obj, "uid").unwrap_or_default();
        if uid != actual {
            return Err(ApiError::conflict(
                &rt.plural,
                &rt.group,
                &name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"
                ),
            ));
        }
    }
    if let Some(rv) = options
        .pointer("/preconditions/resourceVersion")
        .and_then(Value::as_str)
    {
        let actual = meta_str(&obj, "resourceVersion").unwrap_or_default();
        if rv != actual {
            return Err(ApiError::conflict(
                &rt.plural,
                &rt.group,
                &name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {actual}"
                ),
            ));
        }
    }
    Ok(obj)
}

/// Carries out a checked delete of `obj` (as stored now).
pub fn commit_delete(
    inner: &mut Inner,
    rt: &ResourceType,
    key: &Key,
    obj: Value,
    options: &Value,
    ctx: &WriteCtx,
) -> Result<Deleted, ApiError> {
    let policy = options
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .unwrap_or_else(|| {
            if options.get("orphanDependents").and_then(Value::as_bool) == Some(true) {
                "Orphan"
            } else {
                "Background"
            }
        });
    let already = obj.pointer("/metadata/deletionTimestamp").is_some();
    let mut fins = finalizers(&obj);
    if !already {
        match policy {
            "Foreground" => fins.push("foregroundDeletion".into()),
            "Orphan" => fins.push("orphan".into()),
            _ => {}
        }
    }
    let is_ns = rt.behaviour == Behaviour::Namespace;
    if !fins.is_empty() || is_ns {
        if already {
            return Ok(Deleted::Pending(obj));
        }
        let mut pending = obj.clone();
        let meta = meta_mut(&mut pending);
        meta.insert("deletionTimestamp".into(), json!(clock::now()));
        meta.insert("deletionGracePeriodSeconds".into(), json!(0));
        if fins.is_empty() {
            meta.remove("finalizers");
        } else {
            meta.insert("finalizers".into(), json!(fins));
        }
        if is_ns {
            pending["status"] = json!({"phase": "Terminating"});
        }
        if ctx.dry_run {
            return Ok(Deleted::Pending(pending));
        }
        let stored = inner.store.put(key.clone(), pending);
        inner.scan_deletions = true;
        return Ok(Deleted::Pending(stored));
    }
    if ctx.dry_run {
        return Ok(Deleted::Gone(obj));
    }
    let gone = inner.store.remove(key).unwrap_or_default();
    after_delete(inner, rt, key, &gone, ctx);
    Ok(Deleted::Gone(gone))
}

/// The identity controllers write as.
pub fn system_ctx(ca_pem: &str) -> WriteCtx {
    WriteCtx {
        id: Identity::user("system:kube-controller-manager", &["system:masters"]),
        dry_run: false,
        ca_pem: ca_pem.to_string(),
    }
}

/// Applies `change` to a stored object as a controller would with an update (same no-op, finalizer
/// and deletion semantics as an API update).
pub fn modify(
    inner: &mut Inner,
    key: &Key,
    ctx: &WriteCtx,
    change: impl FnOnce(&mut Value),
) -> Result<(), ApiError> {
    let Some(rt) = type_for_storage(inner, &key.0, &key.1) else {
        return Ok(());
    };
    let Some(old) = inner.store.get(key).cloned() else {
        return Ok(());
    };
    let mut new = old.clone();
    change(&mut new);
    let version = rt.preferred().to_string();
    finish_update(inner, &rt, &version, key.clone(), old, new, None, ctx).map(|_| ())
}

/// Removes one finalizer from a stored object.
pub fn remove_finalizer(
    inner: &mut Inner,
    key: &Key,
    finalizer: &str,
    ctx: &WriteCtx,
) -> Result<(), ApiError> {
    modify(inner, key, ctx, |obj| {
        if let Some(Value::Array(f)) = obj.pointer_mut("/metadata/finalizers") {
            f.retain(|x| x.as_str() != Some(finalizer));
        }
    })
}

#[allow(clippy::too_many_arguments)]
fn ensure_authorized_escalation(
    inner: &Inner,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    verb: &str,
    target_plural: &str,
    target_name: &str,
    wanted: &[Value],
    id: &Identity,
) -> Result<(), ApiError> {
    if id.is_master() {
        return Ok(());
    }
    let attrs = Attributes {
        verb: verb.into(),
        group: RBAC.into(),
        resource: target_plural.into(),
        name: target_name.into(),
        namespace: ns.into(),
        ..Default::default()
    };
    if rbac::authorize(&inner.store, id, &attrs).allowed {
        return Ok(());
    }
    let missing = rbac::not_covered(&inner.store, id, wanted, ns);
    if missing.is_empty() {
        return Ok(());
    }
    Err(ApiError::forbidden(
        &rt.plural,
        &rt.group,
        name,
        &rbac::escalation_message(id, &missing),
    ))
}

#[allow(clippy::too_many_arguments)]
fn admit(
    inner: &mut Inner,
    rt: &ResourceType,
    version: &str,
    ns: &str,
    name: &str,
    old: Option<&Value>,
    obj: &mut Value,
    ctx: &WriteCtx,
) -> Result<(), ApiError> {
    match rt.behaviour {
        Behaviour::Namespace => {
            match old {
                None => {
                    obj["spec"] = json!({"finalizers": ["kubernetes"]});
                    obj["status"] = json!({"phase": "Active"});
                }
                Some(o) => obj["spec"] = o.get("spec").cloned().unwrap_or_else(|| json!({})),
            }
            let meta = meta_mut(obj);
            let labels = meta.entry("labels").or_insert_with(|| json!({}));
            if let Value::Object(l) = labels {
                l.insert("kubernetes.io/metadata.name".into(), json!(name));
            }
        }
        Behaviour::Secret => admit_secret(rt, name, old, obj)?,
        Behaviour::Service => admit_service(inner, rt, name, old, obj)?,
        Behaviour::Crd => admit_crd(rt, name, old, obj)?,
        Behaviour::WebhookConfig => crate::webhooks::admit_config(rt, name, obj)?,
        Behaviour::Role => {
            let rules = obj
                .get("rules")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let plural = if rt.namespaced {
                "roles"
            } else {
                "clusterroles"
            };
            ensure_authorized_escalation(
                inner, rt, ns, name, "escalate", plural, name, &rules, &ctx.id,
            )?;
        }
        Behaviour::Binding => {
            let Some(role_ref) = obj.get("roleRef").cloned().filter(Value::is_object) else {
                return Err(ApiError::invalid(
                    &rt.kind,
                    &rt.group,
                    name,
                    &[FieldError::required("roleRef.name", "")],
                ));
            };
            if let Some(o) = old
                && o.get("roleRef") != Some(&role_ref)
            {
                return Err(ApiError::invalid(
                    &rt.kind,
                    &rt.group,
                    name,
                    &[FieldError::invalid(
                        "roleRef",
                        &role_ref,
                        "cannot change roleRef",
                    )],
                ));
            }
            let role_kind = role_ref
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let role_name = role_ref
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            if role_name.is_empty() {
                return Err(ApiError::invalid(
                    &rt.kind,
                    &rt.group,
                    name,
                    &[FieldError::required("roleRef.name", "")],
                ));
            }
            let (plural, role_key) = match role_kind {
                "ClusterRole" => (
                    "clusterroles",
                    (
                        RBAC.to_string(),
                        "clusterroles".to_string(),
                        String::new(),
                        role_name.clone(),
                    ),
                ),
                "Role" if rt.namespaced => (
                    "roles",
                    (
                        RBAC.to_string(),
                        "roles".to_string(),
                        ns.to_string(),
                        role_name.clone(),
                    ),
                ),
                other => {
                    return Err(ApiError::invalid(
                        &rt.kind,
                        &rt.group,
                        name,
                        &[FieldError::not_supported(
                            "roleRef.kind",
                            &json!(other),
                            if rt.namespaced {
                                &["Role", "ClusterRole"]
                            } else {
                                &["ClusterRole"]
                            },
                        )],
                    ));
                }
            };
            if !ctx.id.is_master() {
                let rules = inner
                    .store
                    .get(&role_key)
                    .and_then(|r| r.get("rules"))
                    .and_then(Value::as_array)
                    .cloned();
                let bind_ok = rbac::authorize(
                    &inner.store,
                    &ctx.id,
                    &Attributes {
                        verb: "bind".into(),
                        group: RBAC.into(),
                        resource: plural.into(),
                        name: role_name.clone(),
                        namespace: ns.into(),
                        ..Default::default()
                    },
                )
                .allowed;
                if !bind_ok {
                    let Some(rules) = rules else {
                        return Err(ApiError::forbidden(
                            &rt.plural,
                            &rt.group,
                            name,
                            &format!("{plural}.{RBAC} \"{role_name}\" not found"),
                        ));
                    };
                    ensure_authorized_escalation(
                        inner, rt, ns, name, "bind", plural, &role_name, &rules, &ctx.id,
                    )?;
                }
            }
        }
        Behaviour::Custom => {
            if let Some(schema) = rt.schema(version).cloned() {
                prune_and_default(obj, &schema, true);
            }
        }
        _ => {}
    }
    Ok(())
}

fn admit_secret(
    rt: &ResourceType,
    name: &str,
    old: Option<&Value>,
    obj: &mut Value,
) -> Result<(), ApiError> {
    if let Some(Value::Object(sd)) = obj.as_object_mut().and_then(|m| m.remove("stringData")) {
        let data = obj
            .as_object_mut()
            .map(|m| m.entry("data").or_insert_with(|| json!({})));
        if let Some(Value::Object(d)) = data {
            for (k, v) in sd {
                d.insert(k, json!(STANDARD.encode(v.as_str().unwrap_or_default())));
            }
        }
    }
    if let Some(Value::Object(d)) = obj.get("data") {
        for (k, v) in d {
            if v.as_str().is_none_or(|s| STANDARD.decode(s).is_err()) {
                return Err(ApiError::bad_request(format!(
                    "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data at key {k:?}"
                )));
            }
        }
    }
    if obj
        .get("type")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        obj["type"] = json!(
            old.and_then(|o| o.get("type"))
                .cloned()
                .unwrap_or_else(|| json!("Opaque"))
        );
    }
    let ty = obj.get("type").cloned().unwrap_or_default();
    if let Some(o) = old
        && o.get("type") != Some(&ty)
    {
        return Err(ApiError::invalid(
            &rt.kind,
            &rt.group,
            name,
            &[FieldError::invalid("type", &ty, "field is immutable")],
        ));
    }
    if ty == "kubernetes.io/service-account-token"
        && obj
            .pointer("/metadata/annotations/kubernetes.io~1service-account.name")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    {
        return Err(ApiError::invalid(
            &rt.kind,
            &rt.group,
            name,
            &[FieldError::required(
                "metadata.annotations[kubernetes.io/service-account.name]",
                "",
            )],
        ));
    }
    Ok(())
}

fn admit_service(
    inner: &mut Inner,
    rt: &ResourceType,
    name: &str,
    old: Option<&Value>,
    obj: &mut Value,
) -> Result<(), ApiError> {
    if !obj.get("spec").is_some_and(Value::is_object) {
        obj["spec"] = json!({});
    }
    let old_spec = old
        .and_then(|o| o.get("spec"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return Ok(());
    };
    let ty = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP")
        .to_string();
    if !["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"].contains(&ty.as_str()) {
        return Err(ApiError::invalid(
            &rt.kind,
            &rt.group,
            name,
            &[FieldError::not_supported(
                "spec.type",
                &json!(ty),
                &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"],
            )],
        ));
    }
    spec.insert("type".into(), json!(ty));
    if ty == "ExternalName" {
        return Ok(());
    }
    let ports = spec
        .get("ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let headless = spec.get("clusterIP").and_then(Value::as_str) == Some("None");
    if ports.is_empty() && !headless {
        return Err(ApiError::invalid(
            &rt.kind,
            &rt.group,
            name,
            &[FieldError::required("spec.ports", "")],
        ));
    }
    let old_ip = old_spec
        .get("clusterIP")
        .and_then(Value::as_str)
        .map(str::to_string);
    let ip = match (
        spec.get("clusterIP")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty()),
        old_ip,
    ) {
        (Some(new), Some(old)) if new != old => {
            return Err(ApiError::invalid(
                &rt.kind,
                &rt.group,
                name,
                &[FieldError::invalid(
                    "spec.clusterIP",
                    &json!(new),
                    "field is immutable",
                )],
            ));
        }
        (Some(new), _) => new.to_string(),
        (None, Some(old)) => old,
        (None, None) => {
            let n = inner.next_cluster_ip;
            inner.next_cluster_ip += 1;
            format!("10.43.{}.{}", (n >> 8) & 0xff, n & 0xff)
        }
    };
    spec.insert("clusterIP".into(), json!(ip));
    spec.insert("clusterIPs".into(), json!([ip]));
    spec.entry("sessionAffinity").or_insert(json!("None"));
    spec.entry("ipFamilies").or_insert(json!(["IPv4"]));
    spec.entry("ipFamilyPolicy").or_insert(json!("SingleStack"));
    spec.entry("internalTrafficPolicy")
        .or_insert(json!("Cluster"));
    let needs_node_ports = ty == "NodePort" || ty == "LoadBalancer";
    if needs_node_ports {
        spec.entry("externalTrafficPolicy")
            .or_insert(json!("Cluster"));
    }
    if ty == "LoadBalancer" {
        spec.entry("allocateLoadBalancerNodePorts")
            .or_insert(json!(true));
    }
    let old_ports = old_spec
        .get("ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut out = Vec::new();
    for (i, mut p) in ports.into_iter().enumerate() {
        let Some(port) = p.get("port").and_then(Value::as_i64) else {
            return Err(ApiError::invalid(
                &rt.kind,
                &rt.group,
                name,
                &[FieldError::required(format!("spec.ports[{i}].port"), "")],
            ));
        };
        if !(1..=65535).contains(&port) {
            return Err(ApiError::invalid(
                &rt.kind,
                &rt.group,
                name,
                &[FieldError::invalid(
                    format!("spec.ports[{i}].port"),
                    &json!(port),
                    "must be between 1 and 65535, inclusive",
                )],
            ));
        }
        if p.get("protocol").is_none() {
            p["protocol"] = json!("TCP");
        }
        if p.get("targetPort").is_none() {
            p["targetPort"] = json!(port);
        }
        if needs_node_ports && p.get("nodePort").is_none() {
            let reuse = old_ports
                .iter()
                .find(|o| o.get("port") == p.get("port") && o.get("protocol") == p.get("protocol"))
                .and_then(|o| o.get("nodePort"))
                .cloned();
            let np = reuse.unwrap_or_else(|| {
                let n = inner.next_node_port;
                inner.next_node_port = if n >= 32767 { 30000 } else { n + 1 };
                json!(n)
            });
            p["nodePort"] = np;
        }
        out.push(p);
    }
    spec.insert("ports".into(), Value::Array(out));
    if old.is_none() {
        obj["status"] = json!({"loadBalancer": {}});
    }
    Ok(())
}

fn admit_crd(
    rt: &ResourceType,
    name: &str,
    old: Option<&Value>,
    obj: &mut Value,
) -> Result<(), ApiError> {
    let group = obj
        .pointer("/spec/group")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let plural = obj
        .pointer("/spec/names/plural")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let kind = obj
        .pointer("/spec/names/kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let scope = obj.pointer("/spec/scope").cloned().unwrap_or(Value::Null);
    let mut errs = Vec::new();
    if group.is_empty() {
        errs.push(FieldError::required("spec.group", ""));
    }
    if plural.is_empty() {
        errs.push(FieldError::required("spec.names.plural", ""));
    }
    if kind.is_empty() {
        errs.push(FieldError::required("spec.names.kind", ""));
    }
    if name != format!("{plural}.{group}") {
        errs.push(FieldError::invalid(
            "metadata.name",
            &json!(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    if scope != "Namespaced" && scope != "Cluster" {
        errs.push(FieldError::not_supported(
            "spec.scope",
            &scope,
            &["Cluster", "Namespaced"],
        ));
    }
    let versions = obj
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let storage: Vec<String> = versions
        .iter()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .filter_map(|v| v.get("name").and_then(Value::as_str).map(str::to_string))
        .collect();
    if versions.is_empty() {
        errs.push(FieldError::required(
            "spec.versions",
            "must have exactly one version marked as storage version",
        ));
    } else if storage.len() != 1 {
        errs.push(FieldError::invalid(
            "spec.versions",
            &json!(
                versions
                    .iter()
                    .filter_map(|v| v.get("name"))
                    .collect::<Vec<_>>()
            ),
            "must have exactly one version marked as storage version",
        ));
    }
    if let Some(o) = old
        && o.pointer("/spec/scope") != Some(&scope)
    {
        errs.push(FieldError::invalid(
            "spec.scope",
            &scope,
            "field is immutable",
        ));
    }
    if !errs.is_empty() {
        return Err(ApiError::invalid(&rt.kind, &rt.group, name, &errs));
    }
    let mut accepted = obj
        .pointer("/spec/names")
        .cloned()
        .unwrap_or_else(|| json!({}));
    if accepted.get("singular").is_none() {
        accepted["singular"] = json!(kind.to_lowercase());
    }
    if accepted.get("listKind").is_none() {
        accepted["listKind"] = json!(format!("{kind}List"));
    }
    obj["spec"]["names"] = accepted.clone();
    let mut stored_versions: Vec<Value> = old
        .and_then(|o| o.pointer("/status/storedVersions"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for s in storage {
        if !stored_versions.contains(&json!(s)) {
            stored_versions.push(json!(s));
        }
    }
    let since = old
        .and_then(|o| o.pointer("/status/conditions/0/lastTransitionTime"))
        .cloned()
        .unwrap_or_else(|| json!(clock::now()));
    obj["status"] = json!({
        "acceptedNames": accepted,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "lastTransitionTime": since, "reason": "NoConflicts", "message": "no conflicts found"},
            {"type": "Established", "status": "True", "lastTransitionTime": since, "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"}
        ],
        "storedVersions": stored_versions,
    });
    if old.is_none() {
        let meta = meta_mut(obj);
        let fins = meta.entry("finalizers").or_insert_with(|| json!([]));
        if let Value::Array(f) = fins
            && !f.contains(&json!("customresourcecleanup.apiextensions.k8s.io"))
        {
            f.push(json!("customresourcecleanup.apiextensions.k8s.io"));
        }
    }
    Ok(())
}

/// Structural-schema pruning and defaulting of a custom resource, as the real server does on write.
pub fn prune_and_default(v: &mut Value, schema: &Value, top: bool) {
    let preserve = schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true);
    let embedded = schema
        .get("x-kubernetes-embedded-resource")
        .and_then(Value::as_bool)
        == Some(true);
    match v {
        Value::Object(m) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            if let Some(props) = props {
                for (k, s) in props {
                    if !m.contains_key(k)
                        && let Some(d) = s.get("default")
                    {
                        m.insert(k.clone(), d.clone());
                    }
                }
            }
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let keep_meta =
                    (top || embedded) && (k == "apiVersion" || k == "kind" || k == "metadata");
                if keep_meta {
                    continue;
                }
                let child_schema = props.and_then(|p| p.get(&k)).or(additional);
                match (child_schema, m.get_mut(&k)) {
                    (Some(s), Some(child)) => prune_and_default(child, s, false),
                    (None, _)
                        if !preserve
                            && (props.is_some() || additional.is_none())
                            && schema.get("additionalProperties") != Some(&Value::Bool(true)) =>
                    {
                        m.remove(&k);
                    }
                    _ => {}
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for i in items {
                    prune_and_default(i, item_schema, false);
                }
            }
        }
        _ => {}
    }
}

fn after_create(inner: &mut Inner, rt: &ResourceType, key: &Key, stored: &Value, ctx: &WriteCtx) {
    match rt.behaviour {
        Behaviour::Namespace => {
            let sys = WriteCtx {
                id: Identity::user("system:kube-controller-manager", &["system:masters"]),
                dry_run: false,
                ca_pem: ctx.ca_pem.clone(),
            };
            let ns = key.3.clone();
            if let Some(sa) = type_for_storage(inner, "", "serviceaccounts") {
                let _ = create(
                    inner,
                    &sa,
                    "v1",
                    Some(&ns),
                    json!({"metadata": {"name": "default"}}),
                    &sys,
                );
            }
            if let Some(cm) = type_for_storage(inner, "", "configmaps") {
                let body = json!({"metadata": {"name": "kube-root-ca.crt", "annotations": {
                    "kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
                    "data": {"ca.crt": ctx.ca_pem}});
                let _ = create(inner, &cm, "v1", Some(&ns), body, &sys);
            }
        }
        Behaviour::Secret
            if stored.get("type").and_then(Value::as_str)
                == Some("kubernetes.io/service-account-token")
                && stored.pointer("/data/token").is_none()
                && inner.token_mode != TokenMode::Never =>
        {
            inner
                .pending_tokens
                .insert(key.clone(), tokio::time::Instant::now());
        }
        Behaviour::Crd => {
            if let Some(name) = meta_str(stored, "name") {
                let name = name.to_string();
                inner.register_crd(&name, registry::from_crd(stored));
            }
        }
        _ => {}
    }
}

fn after_update(inner: &mut Inner, rt: &ResourceType, stored: &Value) {
    if rt.behaviour == Behaviour::Crd
        && let Some(name) = meta_str(stored, "name")
    {
        let name = name.to_string();
        inner.register_crd(&name, registry::from_crd(stored));
    }
}

fn after_delete(inner: &mut Inner, rt: &ResourceType, key: &Key, gone: &Value, ctx: &WriteCtx) {
    if let Some(uid) = meta_str(gone, "uid") {
        inner
            .gc_queue
            .push((uid.to_string(), rt.namespaced, key.2.clone()));
    }
    match rt.behaviour {
        Behaviour::Crd => inner.register_crd(&key.3, None),
        Behaviour::Secret => {
            inner.pending_tokens.remove(key);
        }
        Behaviour::ServiceAccount => {
            let sa_uid = meta_str(gone, "uid").unwrap_or_default().to_string();
            let doomed: Vec<Key> = inner
                .store
                .list("", "secrets", Some(&key.2))
                .into_iter()
                .filter(|(_, s)| {
                    s.get("type").and_then(Value::as_str)
                        == Some("kubernetes.io/service-account-token")
                        && s.pointer("/metadata/annotations/kubernetes.io~1service-account.name")
                            .and_then(Value::as_str)
                            == Some(key.3.as_str())
                        && s.pointer("/metadata/annotations/kubernetes.io~1service-account.uid")
                            .and_then(Value::as_str)
                            .is_none_or(|u| u == sa_uid)
                })
                .map(|(k, _)| k.clone())
                .collect();
            if let Some(secret_rt) = type_for_storage(inner, "", "secrets") {
                for k in doomed {
                    let _ = delete(inner, &secret_rt, &k, &json!({}), ctx);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pruning_drops_unknown_fields_and_applies_defaults() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer", "default": 3}}},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}});
        let mut obj = json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "n"},
            "spec": {"a": "1", "junk": true}, "status": {"anything": 1}, "extra": 1});
        prune_and_default(&mut obj, &schema, true);
        assert_eq!(
            obj,
            json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "n"},
            "spec": {"a": "1", "b": 3}, "status": {"anything": 1}})
        );
    }

    #[test]
    fn event_conversion_round_trips() {
        let types = registry::builtins();
        let v1 = types.iter().find(|t| t.behaviour == Behaviour::EventsV1);
        let Some(v1) = v1 else { return };
        let stored = to_storage(
            v1,
            json!({"note": "hi", "regarding": {"name": "x"}, "reason": "R"}),
        );
        assert_eq!(stored.get("message"), Some(&json!("hi")));
        let back = to_version(v1, "v1", &stored);
        assert_eq!(back.get("note"), Some(&json!("hi")));
        assert_eq!(back.get("apiVersion"), Some(&json!("events.k8s.io/v1")));
    }
}
