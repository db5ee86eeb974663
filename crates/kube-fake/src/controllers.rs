//! The controllers a real control plane runs that tests depend on: the service-account token
//! controller, the namespace lifecycle controller, CRD instance cleanup, and a simple ownerReference
//! garbage collector (background, foreground and orphan propagation).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use tracing::{Instrument, debug, info, info_span};

use crate::auth::{TokenKind, mint_jwt};
use crate::ops::{self, WriteCtx};
use crate::state::{Inner, Shared, TokenMode};
use crate::store::Key;

/// Runs the controllers until shutdown.
pub fn spawn(shared: Arc<Shared>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(
        async move {
            let mut shutdown = shared.shutdown.clone();
            loop {
                let next = {
                    let mut inner = shared.lock();
                    tick(&mut inner, &shared.info.ca_pem)
                };
                let wait = next.unwrap_or(Duration::from_secs(1));
                tokio::select! {
                    _ = shared.wake.notified() => {}
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.changed() => break,
                }
            }
        }
        .instrument(info_span!("controllers")),
    )
}

/// One pass over all controllers; returns how long until a token becomes due, if any is pending.
pub fn tick(inner: &mut Inner, ca_pem: &str) -> Option<Duration> {
    let ctx = ops::system_ctx(ca_pem);
    let next = token_controller(inner, &ctx);
    if inner.scan_deletions || !inner.gc_queue.is_empty() {
        inner.scan_deletions = false;
        // A few rounds let cascades (namespace -> objects -> dependents) settle in one tick.
        for _ in 0..4 {
            let busy = namespaces_and_crds(inner, &ctx) | garbage_collect(inner, &ctx);
            if !busy {
                break;
            }
        }
    }
    next
}

fn token_controller(inner: &mut Inner, ctx: &WriteCtx) -> Option<Duration> {
    let TokenMode::After(delay) = inner.token_mode else {
        inner.pending_tokens.clear();
        return None;
    };
    let now = tokio::time::Instant::now();
    let mut due = Vec::new();
    let mut next: Option<Duration> = None;
    for (key, created) in &inner.pending_tokens {
        let at = *created + delay;
        if at <= now {
            due.push(key.clone());
        } else {
            let left = at - now;
            next = Some(next.map_or(left, |n| n.min(left)));
        }
    }
    for key in due {
        inner.pending_tokens.remove(&key);
        fill_token(inner, &key, ctx);
    }
    next
}

fn fill_token(inner: &mut Inner, key: &Key, ctx: &WriteCtx) {
    let Some(secret) = inner.store.get(key).cloned() else {
        return;
    };
    if secret.pointer("/data/token").is_some() {
        return;
    }
    let ns = key.2.clone();
    let sa_name = secret
        .pointer("/metadata/annotations/kubernetes.io~1service-account.name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let wanted_uid = secret
        .pointer("/metadata/annotations/kubernetes.io~1service-account.uid")
        .and_then(Value::as_str)
        .map(str::to_string);
    let sa_uid = inner
        .store
        .get(&(
            String::new(),
            "serviceaccounts".into(),
            ns.clone(),
            sa_name.clone(),
        ))
        .and_then(|sa| sa.pointer("/metadata/uid"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let sa_uid = match (sa_uid, wanted_uid) {
        (Some(actual), Some(wanted)) if actual != wanted => None,
        (actual, _) => actual,
    };
    let Some(sa_uid) = sa_uid else {
        // The real tokens controller deletes token Secrets whose ServiceAccount is gone or replaced.
        info!(namespace = %ns, secret = %key.3, serviceaccount = %sa_name, "deleting token secret of missing service account");
        if let Some(rt) = ops::type_for_storage(inner, "", "secrets") {
            let _ = ops::delete(inner, &rt, key, &json!({}), ctx);
        }
        return;
    };
    let token = mint_jwt(&json!({
        "iss": "kubernetes/serviceaccount",
        "kubernetes.io/serviceaccount/namespace": ns,
        "kubernetes.io/serviceaccount/secret.name": key.3,
        "kubernetes.io/serviceaccount/service-account.name": sa_name,
        "kubernetes.io/serviceaccount/service-account.uid": sa_uid,
        "sub": format!("system:serviceaccount:{ns}:{sa_name}"),
    }));
    inner.tokens.insert(
        token.clone(),
        TokenKind::Legacy {
            namespace: ns.clone(),
            secret: key.3.clone(),
            sa_name: sa_name.clone(),
            sa_uid: sa_uid.clone(),
        },
    );
    let ca = ctx.ca_pem.clone();
    let result = ops::modify(inner, key, ctx, |s| {
        s["data"] = json!({
            "token": STANDARD.encode(&token),
            "ca.crt": STANDARD.encode(&ca),
            "namespace": STANDARD.encode(&ns),
        });
        s["metadata"]["annotations"]["kubernetes.io/service-account.uid"] = json!(sa_uid);
    });
    match result {
        Ok(()) => info!(namespace = %key.2, secret = %key.3, "filled service account token"),
        Err(e) => debug!(error = %e, "token fill failed"),
    }
}

fn deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp").is_some()
}

fn has_finalizer(obj: &Value, f: &str) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|x| x == f))
}

fn delete_keys(inner: &mut Inner, keys: Vec<Key>, ctx: &WriteCtx) {
    for k in keys {
        if let Some(rt) = ops::type_for_storage(inner, &k.0, &k.1) {
            let _ = ops::delete(inner, &rt, &k, &json!({}), ctx);
        }
    }
}

/// Namespace content deletion and CRD instance cleanup; true when something changed.
fn namespaces_and_crds(inner: &mut Inner, ctx: &WriteCtx) -> bool {
    let mut busy = false;
    let terminating: Vec<Key> = inner
        .store
        .list("", "namespaces", None)
        .into_iter()
        .filter(|(_, o)| deleting(o))
        .map(|(k, _)| k.clone())
        .collect();
    for ns_key in terminating {
        inner.scan_deletions = true;
        let ns = ns_key.3.clone();
        let content: Vec<(Key, bool)> = inner
            .store
            .all()
            .filter(|(k, _)| k.2 == ns)
            .map(|(k, o)| (k.clone(), deleting(o)))
            .collect();
        if content.is_empty() {
            // The namespace controller's /finalize: clear spec.finalizers, then the object goes
            // once metadata.finalizers are empty too.
            let Some(mut obj) = inner.store.get(&ns_key).cloned() else {
                continue;
            };
            let user_finalizers = obj
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty());
            if user_finalizers {
                if obj
                    .pointer("/spec/finalizers")
                    .and_then(Value::as_array)
                    .is_some_and(|a| !a.is_empty())
                {
                    obj["spec"]["finalizers"] = json!([]);
                    inner.store.put(ns_key.clone(), obj);
                    busy = true;
                }
            } else if let Some(gone) = inner.store.remove(&ns_key) {
                info!(namespace = %ns, "namespace finalized");
                if let Some(uid) = gone.pointer("/metadata/uid").and_then(Value::as_str) {
                    inner.gc_queue.push((uid.to_string(), false, String::new()));
                }
                busy = true;
            }
        } else {
            let todo: Vec<Key> = content
                .into_iter()
                .filter(|(_, d)| !d)
                .map(|(k, _)| k)
                .collect();
            busy |= !todo.is_empty();
            delete_keys(inner, todo, ctx);
        }
    }
    let crds: Vec<(Key, Value)> = inner
        .store
        .list("apiextensions.k8s.io", "customresourcedefinitions", None)
        .into_iter()
        .filter(|(_, o)| {
            deleting(o) && has_finalizer(o, "customresourcecleanup.apiextensions.k8s.io")
        })
        .map(|(k, o)| (k.clone(), o.clone()))
        .collect();
    for (crd_key, crd) in crds {
        inner.scan_deletions = true;
        let group = crd
            .pointer("/spec/group")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let plural = crd
            .pointer("/spec/names/plural")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let instances: Vec<(Key, bool)> = inner
            .store
            .list(&group, &plural, None)
            .into_iter()
            .map(|(k, o)| (k.clone(), deleting(o)))
            .collect();
        if instances.is_empty() {
            let _ = ops::remove_finalizer(
                inner,
                &crd_key,
                "customresourcecleanup.apiextensions.k8s.io",
                ctx,
            );
            busy = true;
        } else {
            let todo: Vec<Key> = instances
                .into_iter()
                .filter(|(_, d)| !d)
                .map(|(k, _)| k)
                .collect();
            busy |= !todo.is_empty();
            delete_keys(inner, todo, ctx);
        }
    }
    busy
}

fn owner_uids(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Dependents of an owner that the real collector can resolve: a namespaced owner only owns objects
/// in its own namespace, and never cluster-scoped ones.
fn dependents(
    inner: &Inner,
    uid: &str,
    owner_namespaced: bool,
    owner_ns: &str,
) -> Vec<(Key, Value)> {
    inner
        .store
        .all()
        .filter(|(k, o)| {
            owner_uids(o).iter().any(|u| u == uid)
                && (!owner_namespaced || (!k.2.is_empty() && k.2 == owner_ns))
        })
        .map(|(k, o)| (k.clone(), o.clone()))
        .collect()
}

/// Garbage collection after deletions, plus foreground and orphan propagation; true when busy.
fn garbage_collect(inner: &mut Inner, ctx: &WriteCtx) -> bool {
    let mut busy = false;
    let queue = std::mem::take(&mut inner.gc_queue);
    if !queue.is_empty() {
        let live: HashSet<String> = inner
            .store
            .all()
            .filter_map(|(_, o)| {
                o.pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .collect();
        for (uid, namespaced, ns) in queue {
            let doomed: Vec<Key> = dependents(inner, &uid, namespaced, &ns)
                .into_iter()
                .filter(|(_, o)| !deleting(o) && owner_uids(o).iter().all(|u| !live.contains(u)))
                .map(|(k, _)| k)
                .collect();
            for k in &doomed {
                info!(namespace = %k.2, name = %k.3, resource = %k.1, owner = %uid, "garbage collecting dependent");
            }
            busy |= !doomed.is_empty();
            delete_keys(inner, doomed, ctx);
        }
    }
    let owners: Vec<(Key, Value)> = inner
        .store
        .all()
        .filter(|(_, o)| {
            deleting(o) && (has_finalizer(o, "foregroundDeletion") || has_finalizer(o, "orphan"))
        })
        .map(|(k, o)| (k.clone(), o.clone()))
        .collect();
    for (key, owner) in owners {
        inner.scan_deletions = true;
        let uid = owner
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let namespaced = !key.2.is_empty();
        let deps = dependents(inner, &uid, namespaced, &key.2);
        if has_finalizer(&owner, "orphan") {
            for (k, _) in &deps {
                let _ = ops::modify(inner, k, ctx, |o| {
                    if let Some(Value::Array(refs)) = o.pointer_mut("/metadata/ownerReferences") {
                        refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid.as_str()));
                    }
                });
            }
            let _ = ops::remove_finalizer(inner, &key, "orphan", ctx);
            busy = true;
        } else if deps.is_empty() {
            let _ = ops::remove_finalizer(inner, &key, "foregroundDeletion", ctx);
            busy = true;
        } else {
            let todo: Vec<Key> = deps
                .into_iter()
                .filter(|(_, o)| !deleting(o))
                .map(|(k, _)| k)
                .collect();
            busy |= !todo.is_empty();
            delete_keys(inner, todo, ctx);
        }
    }
    busy
}
