//! The admission chain of object writes. When admission webhooks are configured, a create, update
//! (PUT, patch, server-side apply) or delete is prepared under the store lock, then the lock is
//! released and the matching webhooks are called with an `AdmissionReview` (admission.k8s.io/v1)
//! as the real server calls them: mutating webhooks first, in order of configuration name and
//! webhook order, their JSON patches applied; then validating webhooks on the final object. The
//! write is committed under the lock only if the object did not change meanwhile; otherwise it is
//! prepared and admitted again, as the real server's `GuaranteedUpdate` retries. Without any
//! webhook configuration a write runs under one lock as before.

use serde_json::{Map, Value, json};
use tracing::{debug, warn};

use crate::ops::{self, Deleted, PatchType, Plan, WriteCtx};
use crate::patch;
use crate::registry::{Behaviour, ResourceType};
use crate::selector::LabelSelector;
use crate::state::{Inner, Shared};
use crate::status::ApiError;
use crate::store::Key;
use crate::webhook_client::{self, ServiceMap};
use crate::webhooks::{self, Attributes, Webhook};

/// How often a write is prepared again after its object changed while webhooks were called.
const ATTEMPTS: usize = 5;

/// One object write as the API handler received it.
#[derive(Debug, Clone)]
pub enum Write {
    /// POST.
    Create {
        /// Namespace of the path.
        namespace: Option<String>,
        /// The object.
        body: Value,
        /// `fieldManager`, empty when not given.
        manager: String,
    },
    /// PUT (of the object or its status).
    Update {
        /// Namespace of the path.
        namespace: String,
        /// Name of the path.
        name: String,
        /// The object.
        body: Value,
        /// `status`, when the subresource was written.
        subresource: Option<String>,
        /// `fieldManager`, empty when not given.
        manager: String,
    },
    /// PATCH (any patch type, including server-side apply).
    Patch {
        /// Namespace of the path.
        namespace: String,
        /// Name of the path.
        name: String,
        /// Patch flavour.
        ptype: PatchType,
        /// The patch.
        body: Value,
        /// `status`, when the subresource was patched.
        subresource: Option<String>,
        /// `fieldManager`.
        manager: String,
        /// `force` (apply).
        force: bool,
    },
    /// DELETE of one object (also each object of a deletecollection).
    Delete {
        /// Which object.
        key: Key,
        /// DeleteOptions.
        options: Value,
    },
}

impl Write {
    fn subresource(&self) -> &str {
        match self {
            Write::Update { subresource, .. } | Write::Patch { subresource, .. } => {
                subresource.as_deref().unwrap_or_default()
            }
            _ => "",
        }
    }

    fn manager(&self) -> &str {
        match self {
            Write::Create { manager, .. }
            | Write::Update { manager, .. }
            | Write::Patch { manager, .. } => manager,
            Write::Delete { .. } => "",
        }
    }
}

/// What a write did.
#[derive(Debug, Clone)]
enum Outcome {
    Written(Value, bool),
    Deleted(Deleted),
}

/// A write prepared under the lock.
#[derive(Debug, Clone)]
enum Prepared {
    Write(Plan),
    Delete { key: Key, obj: Value },
}

impl Prepared {
    fn operation(&self) -> &'static str {
        match self {
            Prepared::Write(Plan::Create { .. }) => "CREATE",
            Prepared::Write(Plan::Update { .. }) => "UPDATE",
            Prepared::Delete { .. } => "DELETE",
        }
    }

    fn key(&self) -> &Key {
        match self {
            Prepared::Write(Plan::Create { key, .. } | Plan::Update { key, .. })
            | Prepared::Delete { key, .. } => key,
        }
    }

    /// The stored object the write started from (updates and deletes).
    fn base(&self) -> Option<&Value> {
        match self {
            Prepared::Write(Plan::Update { old, .. }) => Some(old),
            Prepared::Delete { obj, .. } => Some(obj),
            Prepared::Write(Plan::Create { .. }) => None,
        }
    }
}

/// Whether writes of this type currently go through webhooks (any configuration is stored).
pub fn enabled(inner: &Inner, rt: &ResourceType) -> bool {
    !webhooks::is_exempt(rt)
        && [webhooks::MUTATING, webhooks::VALIDATING].iter().any(|p| {
            !inner
                .store
                .list(crate::registry::ADMISSION_REGISTRATION, p, None)
                .is_empty()
        })
}

/// Creates, updates or patches an object through admission; returns it and whether it was created.
pub async fn write(
    shared: &Shared,
    rt: &ResourceType,
    version: &str,
    req: Write,
    ctx: &WriteCtx,
) -> Result<(Value, bool), ApiError> {
    match run(shared, rt, version, &req, ctx).await? {
        Outcome::Written(obj, created) => Ok((obj, created)),
        Outcome::Deleted(_) => Err(ApiError::internal("a write ended as a delete")),
    }
}

/// Deletes an object through admission.
pub async fn delete(
    shared: &Shared,
    rt: &ResourceType,
    version: &str,
    key: Key,
    options: Value,
    ctx: &WriteCtx,
) -> Result<Deleted, ApiError> {
    match run(shared, rt, version, &Write::Delete { key, options }, ctx).await? {
        Outcome::Deleted(d) => Ok(d),
        Outcome::Written(..) => Err(ApiError::internal("a delete ended as a write")),
    }
}

/// A write without webhooks: prepared and stored at once.
fn direct(
    inner: &mut Inner,
    rt: &ResourceType,
    version: &str,
    req: &Write,
    ctx: &WriteCtx,
) -> Result<Outcome, ApiError> {
    let prepared = prepare(inner, rt, version, req, ctx)?;
    store(inner, rt, version, req, prepared, ctx)
}

/// Stores a prepared write or delete.
fn store(
    inner: &mut Inner,
    rt: &ResourceType,
    version: &str,
    req: &Write,
    prepared: Prepared,
    ctx: &WriteCtx,
) -> Result<Outcome, ApiError> {
    Ok(match prepared {
        Prepared::Write(plan) => {
            let (obj, created) = ops::commit(inner, rt, version, plan, ctx)?;
            Outcome::Written(obj, created)
        }
        Prepared::Delete { key, obj } => {
            let options = match req {
                Write::Delete { options, .. } => options.clone(),
                _ => json!({}),
            };
            Outcome::Deleted(ops::commit_delete(inner, rt, &key, obj, &options, ctx)?)
        }
    })
}

fn prepare(
    inner: &mut Inner,
    rt: &ResourceType,
    version: &str,
    req: &Write,
    ctx: &WriteCtx,
) -> Result<Prepared, ApiError> {
    Ok(match req.clone() {
        Write::Create {
            namespace, body, ..
        } => {
            let (key, obj) =
                ops::prepare_create(inner, rt, version, namespace.as_deref(), body, ctx)?;
            Prepared::Write(Plan::Create { key, obj })
        }
        Write::Update {
            namespace,
            name,
            body,
            subresource,
            ..
        } => Prepared::Write(ops::prepare_update(
            inner,
            rt,
            version,
            &namespace,
            &name,
            body,
            subresource.as_deref(),
            ctx,
        )?),
        Write::Patch {
            namespace,
            name,
            ptype,
            body,
            subresource,
            manager,
            force,
        } => Prepared::Write(ops::prepare_patch(
            inner,
            rt,
            version,
            &namespace,
            &name,
            ptype,
            &body,
            subresource.as_deref(),
            &manager,
            force,
            ctx,
        )?),
        Write::Delete { key, options } => {
            let obj = ops::prepare_delete(inner, rt, &key, &options)?;
            Prepared::Delete { key, obj }
        }
    })
}

fn rv(obj: Option<&Value>) -> Option<&str> {
    obj?.pointer("/metadata/resourceVersion")?.as_str()
}

/// Whether the object a prepared write started from is still the stored one.
fn unchanged(inner: &Inner, prepared: &Prepared) -> bool {
    match prepared.base() {
        Some(base) => rv(inner.store.get(prepared.key())) == rv(Some(base)),
        None => true,
    }
}

/// What webhooks see of a prepared create: the object before the system fields a real server sets
/// after mutating admission (uid, creationTimestamp, generation, a generated name).
fn creation_view(rt: &ResourceType, version: &str, obj: &Value, req: &Write) -> Value {
    let mut v = ops::to_version(rt, version, obj);
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for f in ["uid", "creationTimestamp", "generation"] {
            meta.remove(f);
        }
        if request_name(req).is_empty() {
            meta.remove("name");
        }
    }
    v
}

/// The name the request carried (empty for a POST with generateName).
fn request_name(req: &Write) -> String {
    match req {
        Write::Create { body, .. } => body
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        Write::Update { name, .. } | Write::Patch { name, .. } => name.clone(),
        Write::Delete { key, .. } => key.3.clone(),
    }
}

fn labels_of(obj: Option<&Value>) -> Option<&Value> {
    obj?.pointer("/metadata/labels")
}

/// Everything a review needs besides the object, fixed for one attempt.
struct Request<'a> {
    rt: &'a ResourceType,
    version: &'a str,
    operation: &'static str,
    subresource: &'a str,
    name: String,
    namespace: String,
    namespace_labels: Option<Value>,
    options: Value,
    ctx: &'a WriteCtx,
}

impl Request<'_> {
    fn attributes(&self) -> Attributes<'_> {
        Attributes {
            operation: self.operation,
            group: &self.rt.group,
            version: self.version,
            resource: &self.rt.plural,
            subresource: self.subresource,
            namespace: &self.namespace,
        }
    }

    /// The real `ShouldCallHook`: rules, then the namespace selector (skipped for cluster-scoped
    /// objects other than namespaces, whose own labels count unless deleting), then the object
    /// selector on the new or the old object.
    fn should_call(&self, hook: &Webhook, object: Option<&Value>, old: Option<&Value>) -> bool {
        let attrs = self.attributes();
        if !hook.rules_match(&attrs) {
            return false;
        }
        let namespace_ok = if attrs.is_namespace() {
            let labels = if self.operation == "DELETE" {
                labels_of(old)
            } else {
                labels_of(object)
            };
            hook.namespace_selector.matches_labels(labels)
        } else if self.namespace.is_empty() {
            true
        } else {
            hook.namespace_selector
                .matches_labels(self.namespace_labels.as_ref())
        };
        let selects = |sel: &LabelSelector, o: Option<&Value>| o.is_some_and(|o| sel.matches(o));
        let object_ok =
            selects(&hook.object_selector, object) || selects(&hook.object_selector, old);
        namespace_ok && object_ok
    }

    fn review(&self, uid: &str, object: Option<&Value>, old: Option<&Value>) -> Value {
        let kind = json!({"group": self.rt.group, "version": self.version, "kind": self.rt.kind});
        let resource =
            json!({"group": self.rt.group, "version": self.version, "resource": self.rt.plural});
        let mut request = Map::new();
        request.insert("uid".into(), json!(uid));
        request.insert("kind".into(), kind.clone());
        request.insert("resource".into(), resource.clone());
        if !self.subresource.is_empty() {
            request.insert("subResource".into(), json!(self.subresource));
        }
        request.insert("requestKind".into(), kind);
        request.insert("requestResource".into(), resource);
        if !self.subresource.is_empty() {
            request.insert("requestSubResource".into(), json!(self.subresource));
        }
        if !self.name.is_empty() {
            request.insert("name".into(), json!(self.name));
        }
        if !self.namespace.is_empty() {
            request.insert("namespace".into(), json!(self.namespace));
        }
        request.insert("operation".into(), json!(self.operation));
        request.insert("userInfo".into(), self.ctx.id.to_json());
        request.insert("object".into(), object.cloned().unwrap_or(Value::Null));
        request.insert("oldObject".into(), old.cloned().unwrap_or(Value::Null));
        request.insert("dryRun".into(), json!(self.ctx.dry_run));
        request.insert("options".into(), self.options.clone());
        json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request})
    }
}

fn options(req: &Write, operation: &str, ctx: &WriteCtx) -> Value {
    let mut o = match req {
        Write::Delete { options, .. } => options.as_object().cloned().unwrap_or_default(),
        _ => Map::new(),
    };
    let kind = match operation {
        "CREATE" => "CreateOptions",
        "UPDATE" => "UpdateOptions",
        _ => "DeleteOptions",
    };
    o.insert("kind".into(), json!(kind));
    o.insert("apiVersion".into(), json!("meta.k8s.io/v1"));
    if !req.manager().is_empty() {
        o.insert("fieldManager".into(), json!(req.manager()));
    }
    if ctx.dry_run {
        o.insert("dryRun".into(), json!(["All"]));
    }
    Value::Object(o)
}

/// A webhook's answer.
enum Verdict {
    /// Allowed, with a JSON patch when the webhook sent one.
    Allowed(Option<Value>),
    /// Denied, as the Status the caller gets.
    Denied(ApiError),
}

fn group_version_kind(review: &Value) -> String {
    let av = review
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let (group, version) = av.rsplit_once('/').unwrap_or(("", av));
    let kind = review
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    format!("{group}/{version}, Kind={kind}")
}

/// The real `VerifyAdmissionResponse` for v1 reviews, then the patch decoding of the mutating
/// dispatcher. `Err` is a failure to call (subject to `failurePolicy`).
fn verdict(hook: &Webhook, uid: &str, body: &[u8]) -> Result<Verdict, String> {
    let invalid = |why: String| format!("received invalid webhook response: {why}");
    let review: Value = serde_json::from_slice(body).map_err(|e| {
        format!("failed to call webhook: couldn't get version/kind; json parse error: {e}")
    })?;
    let Some(response) = review.get("response").filter(|r| r.is_object()) else {
        return Err(invalid("webhook response was absent".into()));
    };
    let got_uid = response
        .get("uid")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if got_uid != uid {
        return Err(invalid(format!(
            "expected response.uid={uid:?}, got {got_uid:?}"
        )));
    }
    let gvk = group_version_kind(&review);
    if gvk != "admission.k8s.io/v1, Kind=AdmissionReview" {
        return Err(invalid(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {gvk}"
        )));
    }
    let patch = response
        .get("patch")
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty());
    let patch_type = response.get("patchType").filter(|p| !p.is_null());
    if hook.mutating {
        match (patch, patch_type) {
            (Some(_), None) => {
                return Err(invalid(
                    "webhook returned response.patch but not response.patchType".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "webhook returned response.patchType but not response.patch".into(),
                ));
            }
            _ => {}
        }
    } else if patch.is_some() {
        return Err(invalid(
            "validating webhook may not return response.patch".into(),
        ));
    } else if patch_type.is_some() {
        return Err(invalid(
            "validating webhook may not return response.patchType".into(),
        ));
    }
    if response.get("allowed").and_then(Value::as_bool) != Some(true) {
        return Ok(Verdict::Denied(ApiError::webhook_denied(
            &hook.name,
            response.get("status"),
        )));
    }
    let Some(patch) = patch else {
        return Ok(Verdict::Allowed(None));
    };
    let bytes =
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, patch).map_err(|e| {
            format!("failed to call webhook: illegal base64 data in response.patch: {e}")
        })?;
    let ops: Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("received undecodable patch in webhook response: {e}"))?;
    if !ops.is_array() {
        return Err(format!(
            "received undecodable patch in webhook response: {ops} is not a JSON patch"
        ));
    }
    let pt = patch_type.and_then(Value::as_str).unwrap_or_default();
    if pt != "JSONPatch" {
        return Err(format!("unsupported patch type {pt:?}"));
    }
    Ok(Verdict::Allowed(
        ops.as_array()
            .filter(|a| !a.is_empty())
            .map(|_| ops.clone()),
    ))
}

/// Calls one webhook. `Ok(None)` when the call failed and the webhook fails open.
async fn call(
    hook: &Webhook,
    services: &ServiceMap,
    req: &Request<'_>,
    object: Option<&Value>,
    old: Option<&Value>,
) -> Result<Option<Verdict>, ApiError> {
    if req.ctx.dry_run && !matches!(hook.side_effects.as_str(), "None" | "NoneOnDryRun") {
        return Err(ApiError::bad_request(format!(
            "admission webhook {:?} does not support dry run",
            hook.name
        )));
    }
    let uid = uuid::Uuid::new_v4().to_string();
    let result = if hook.review_versions.iter().any(|v| v == "v1") {
        let review = req.review(&uid, object, old);
        match webhook_client::post(hook, services, &review).await {
            Ok(body) => verdict(hook, &uid, &body),
            Err(e) => Err(e.to_string()),
        }
    } else {
        Err("could not create admission objects: webhook does not accept known AdmissionReview versions (v1, v1beta1); kube-fake sends only v1".into())
    };
    match result {
        Ok(v) => Ok(Some(v)),
        Err(reason) if hook.ignore_failures => {
            warn!(webhook = %hook.name, %reason, "failed calling webhook, failing open");
            Ok(None)
        }
        Err(reason) => {
            warn!(webhook = %hook.name, %reason, "failed calling webhook, failing closed");
            Err(ApiError::internal_error(format!(
                "failed calling webhook {:?}: {reason}",
                hook.name
            )))
        }
    }
}

async fn run(
    shared: &Shared,
    rt: &ResourceType,
    version: &str,
    req: &Write,
    ctx: &WriteCtx,
) -> Result<Outcome, ApiError> {
    for attempt in 0..ATTEMPTS {
        let (hooks, services, prepared, namespace_labels) = {
            let mut inner = shared.lock();
            let hooks = if webhooks::is_exempt(rt) {
                Vec::new()
            } else {
                webhooks::load(&inner)
            };
            if hooks.is_empty() {
                return direct(&mut inner, rt, version, req, ctx);
            }
            let prepared = prepare(&mut inner, rt, version, req, ctx)?;
            let key = prepared.key();
            let namespace_labels = (rt.namespaced && !key.2.is_empty())
                .then(|| {
                    inner
                        .store
                        .get(&(
                            String::new(),
                            "namespaces".into(),
                            String::new(),
                            key.2.clone(),
                        ))
                        .and_then(|ns| ns.pointer("/metadata/labels").cloned())
                })
                .flatten();
            (
                hooks,
                inner.webhook_services.clone(),
                prepared,
                namespace_labels,
            )
        };
        if let Some(outcome) = admit(
            shared,
            rt,
            version,
            req,
            ctx,
            &hooks,
            &services,
            prepared,
            namespace_labels,
        )
        .await?
        {
            return Ok(outcome);
        }
        debug!(attempt, resource = %rt.plural, "object changed during admission, retrying");
    }
    let name = match req {
        Write::Update { name, .. } | Write::Patch { name, .. } => name.clone(),
        Write::Delete { key, .. } => key.3.clone(),
        Write::Create { .. } => String::new(),
    };
    Err(ApiError::conflict_modified(&rt.plural, &rt.group, &name))
}

/// One admission attempt; `Ok(None)` when the object changed meanwhile and the write must be
/// prepared again.
#[allow(clippy::too_many_arguments)]
async fn admit(
    shared: &Shared,
    rt: &ResourceType,
    version: &str,
    req: &Write,
    ctx: &WriteCtx,
    hooks: &[Webhook],
    services: &ServiceMap,
    prepared: Prepared,
    namespace_labels: Option<Value>,
) -> Result<Option<Outcome>, ApiError> {
    let key = prepared.key().clone();
    let operation = prepared.operation();
    // The real RequestInfo puts a Namespace's own name in the namespace of requests naming it.
    let namespace = if rt.namespaced {
        key.2.clone()
    } else if rt.behaviour == Behaviour::Namespace && !matches!(req, Write::Create { .. }) {
        key.3.clone()
    } else {
        String::new()
    };
    let request = Request {
        rt,
        version,
        operation,
        subresource: req.subresource(),
        name: request_name(req),
        namespace,
        namespace_labels,
        options: options(req, operation, ctx),
        ctx,
    };
    let old = prepared.base().map(|o| ops::to_version(rt, version, o));
    let initial = match &prepared {
        Prepared::Write(Plan::Create { obj, .. }) => Some(creation_view(rt, version, obj, req)),
        Prepared::Write(Plan::Update { new, .. }) => Some(ops::to_version(rt, version, new)),
        Prepared::Delete { .. } => None,
    };

    let mut object = initial.clone();
    for hook in hooks.iter().filter(|h| h.mutating) {
        if !request.should_call(hook, object.as_ref(), old.as_ref()) {
            continue;
        }
        match call(hook, services, &request, object.as_ref(), old.as_ref()).await? {
            None | Some(Verdict::Allowed(None)) => {}
            Some(Verdict::Denied(e)) => return Err(e),
            Some(Verdict::Allowed(Some(ops_json))) => {
                let Some(obj) = object.as_mut() else {
                    return Err(ApiError::internal_error(format!(
                        "admission webhook {:?} attempted to modify the object, which is not supported for this operation",
                        hook.name
                    )));
                };
                patch::json_patch(obj, &ops_json).map_err(|e| {
                    ApiError::internal_error(match e {
                        patch::PatchError::Malformed(m)
                        | patch::PatchError::Apply(m)
                        | patch::PatchError::Conflict(m) => m,
                    })
                })?;
            }
        }
    }

    let validating: Vec<&Webhook> = hooks.iter().filter(|h| !h.mutating).collect();
    let prepared = if object != initial {
        let mut inner = shared.lock();
        if !unchanged(&inner, &prepared) {
            return Ok(None);
        }
        let mutated = object.unwrap_or_default();
        match prepared {
            Prepared::Write(Plan::Create { key, .. }) => {
                let ns = rt.namespaced.then_some(key.2.as_str());
                let (key, obj) = ops::prepare_create(&mut inner, rt, version, ns, mutated, ctx)?;
                Prepared::Write(Plan::Create { key, obj })
            }
            Prepared::Write(Plan::Update { key, old, .. }) => {
                let sub = Some(request.subresource).filter(|s| !s.is_empty());
                let new = ops::prepare_finish(
                    &mut inner,
                    rt,
                    version,
                    &key,
                    &old,
                    ops::to_storage(rt, mutated),
                    sub,
                    ctx,
                )?;
                Prepared::Write(Plan::Update { key, old, new })
            }
            d @ Prepared::Delete { .. } => d,
        }
    } else {
        prepared
    };

    if !validating.is_empty() {
        let object = match &prepared {
            Prepared::Write(Plan::Create { obj, .. } | Plan::Update { new: obj, .. }) => {
                Some(ops::to_version(rt, version, obj))
            }
            Prepared::Delete { .. } => None,
        };
        for hook in validating {
            if !request.should_call(hook, object.as_ref(), old.as_ref()) {
                continue;
            }
            if let Some(Verdict::Denied(e)) =
                call(hook, services, &request, object.as_ref(), old.as_ref()).await?
            {
                return Err(e);
            }
        }
    }

    let mut inner = shared.lock();
    if !unchanged(&inner, &prepared) {
        return Ok(None);
    }
    store(&mut inner, rt, version, req, prepared, ctx).map(Some)
}
