//! Whether a kind's `status` is a subresource on the API server we talk to, found by discovery
//! rather than assumed, and the writes that keep the port's status semantics either way.
//!
//! The port promises, for a kind whose [`Kind::status_subresource`] is set, that `replace` keeps the
//! stored status and `replace_status` changes nothing else. Harvester installs its IPPool and
//! LoadBalancer CRDs without a status subresource (load-balancer-harvester `crds/`, `subresources:
//! {}`), and Helm never upgrades CRDs, so on a real cluster the `/status` endpoint of those kinds
//! answers 404 — exactly what a missing object answers. Here the shape is read from discovery (the
//! `<plural>/status` entry of the group's resource list, which every authenticated client may read)
//! and kept per resource; a write that contradicts the remembered shape (a 404 from `/status`, or a
//! status the server dropped) reads it again, so a CRD swapped under a running service is followed.
//!
//! Without the subresource both writes are JSON patches of the main resource: `replace_status` adds
//! `/status` and nothing else, `replace` adds every other top-level field and leaves `/status` as
//! stored. The object's `resourceVersion` travels in the patch, which the API server treats as a
//! precondition, so both stay optimistic-concurrency writes in one request.

use std::{collections::HashMap, sync::Mutex};

use kube::Client;
use serde_json::{Value, json};
use tracing::info;

use crate::Kind;

/// How a served resource takes its status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusShape {
    /// `<plural>/status` is served: status is written there and ignored elsewhere.
    Subresource,
    /// No status subresource: status is a field of the object like any other.
    Field,
}

/// A kind the API server does not serve, or serves in a shape the service cannot work with.
#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    #[error(
        "the API server does not serve {plural}.{group}/{version}: the CustomResourceDefinition {plural}.{group} is not installed or does not serve {version} (install deploy/crds or Harvester's own)"
    )]
    NotServed {
        group: String,
        version: String,
        plural: String,
    },
    #[error("cannot discover {api_version}: {source}")]
    Discovery {
        api_version: String,
        source: kube::Error,
    },
}

/// The shapes seen so far, by resource.
#[derive(Default)]
pub(crate) struct Shapes {
    known: Mutex<HashMap<(String, String), StatusShape>>,
}

fn key(kind: &Kind) -> (String, String) {
    (kind.api_version.to_string(), kind.plural.to_string())
}

impl Shapes {
    /// The remembered shape, discovered on first use.
    pub async fn get(&self, client: &Client, kind: &Kind) -> Result<StatusShape, ShapeError> {
        let remembered = self
            .known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key(kind))
            .copied();
        match remembered {
            Some(shape) => Ok(shape),
            None => self.rediscover(client, kind).await,
        }
    }

    /// Reads the shape from discovery again and remembers it.
    pub(crate) async fn rediscover(
        &self,
        client: &Client,
        kind: &Kind,
    ) -> Result<StatusShape, ShapeError> {
        let shape = discover(client, kind).await?;
        let previous = self
            .known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key(kind), shape);
        if previous.is_some_and(|p| p != shape) {
            info!(
                resource = %format!("{}.{}", kind.plural, kind.group),
                ?shape,
                "the status subresource of a kind changed; writing status accordingly"
            );
        }
        Ok(shape)
    }
}

/// Asks the API server how it serves `kind`.
pub(crate) async fn discover(client: &Client, kind: &Kind) -> Result<StatusShape, ShapeError> {
    let not_served = || ShapeError::NotServed {
        group: kind.group.to_string(),
        version: kind.version.to_string(),
        plural: kind.plural.to_string(),
    };
    let listed = if kind.group.is_empty() {
        client.list_core_api_resources(&kind.version).await
    } else {
        client.list_api_group_resources(&kind.api_version).await
    };
    let resources = match listed {
        Ok(list) => list.resources,
        Err(kube::Error::Api(s)) if s.code == 404 => return Err(not_served()),
        Err(source) => {
            return Err(ShapeError::Discovery {
                api_version: kind.api_version.to_string(),
                source,
            });
        }
    };
    shape_of(resources.iter().map(|r| r.name.as_str()), &kind.plural).ok_or_else(not_served)
}

/// The shape from a group version's resource names; `None` when `plural` is not among them.
fn shape_of<'a>(
    mut names: impl Iterator<Item = &'a str> + Clone,
    plural: &str,
) -> Option<StatusShape> {
    let status = format!("{plural}/status");
    if !names.clone().any(|n| n == plural) {
        return None;
    }
    Some(if names.any(|n| n == status) {
        StatusShape::Subresource
    } else {
        StatusShape::Field
    })
}

/// The `resourceVersion` op that makes a patch conditional, when the object carries one.
fn precondition(object: &Value) -> Option<Value> {
    object
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .filter(|rv| !rv.is_empty())
        .map(|rv| json!({"op": "add", "path": "/metadata/resourceVersion", "value": rv}))
}

/// A JSON patch that writes `object`'s status and nothing else (a missing status is written as
/// an empty one: a patch cannot remove a field it does not know is there).
pub(crate) fn status_patch(object: &Value) -> Value {
    let status = object.get("status").cloned().unwrap_or_else(|| json!({}));
    let mut ops: Vec<Value> = precondition(object).into_iter().collect();
    ops.push(json!({"op": "add", "path": "/status", "value": status}));
    Value::Array(ops)
}

/// A JSON patch that writes everything of `object` but its status, as a replace of a kind with a
/// status subresource would.
pub(crate) fn replace_patch(object: &Value) -> Value {
    let mut ops: Vec<Value> = precondition(object).into_iter().collect();
    if let Some(fields) = object.as_object() {
        for (field, value) in fields {
            if matches!(field.as_str(), "status" | "apiVersion" | "kind") {
                continue;
            }
            ops.push(json!({"op": "add", "path": format!("/{}", escape(field)), "value": value}));
        }
    }
    Value::Array(ops)
}

/// JSON pointer escaping of one reference token (RFC 6901).
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// Whether the server kept the status that was sent: a server whose kind gained a status
/// subresource since it was discovered drops it from a write of the main resource.
pub(crate) fn status_kept(sent: &Value, written: &Value) -> bool {
    let empty = json!({});
    let sent = sent.get("status").unwrap_or(&empty);
    let written = written.get("status").unwrap_or(&empty);
    sent == written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_follows_the_status_entry() {
        let with = ["ippools", "ippools/status", "loadbalancers"];
        assert_eq!(
            shape_of(with.into_iter(), "ippools"),
            Some(StatusShape::Subresource)
        );
        assert_eq!(
            shape_of(with.into_iter(), "loadbalancers"),
            Some(StatusShape::Field)
        );
        assert_eq!(shape_of(with.into_iter(), "widgets"), None);
        // A status entry without its resource is not a served kind.
        assert_eq!(shape_of(["widgets/status"].into_iter(), "widgets"), None);
    }

    #[test]
    fn status_patch_is_conditional_and_touches_only_status() {
        let obj = json!({
            "apiVersion": "v1", "kind": "X",
            "metadata": {"name": "a", "resourceVersion": "7"},
            "spec": {"x": 1},
            "status": {"y": 2}
        });
        assert_eq!(
            status_patch(&obj),
            json!([
                {"op": "add", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "add", "path": "/status", "value": {"y": 2}}
            ])
        );
        let unconditional = json!({"metadata": {"name": "a"}});
        assert_eq!(
            status_patch(&unconditional),
            json!([{"op": "add", "path": "/status", "value": {}}])
        );
    }

    #[test]
    fn replace_patch_leaves_status_alone() {
        let obj = json!({
            "apiVersion": "v1", "kind": "X",
            "metadata": {"name": "a", "resourceVersion": "7", "finalizers": ["f"]},
            "spec": {"x": 1},
            "status": {"y": 2},
            "a/b~c": true
        });
        let patch = replace_patch(&obj);
        let ops = patch.as_array().expect("ops");
        assert_eq!(
            ops[0],
            json!({"op": "add", "path": "/metadata/resourceVersion", "value": "7"})
        );
        let paths: Vec<&str> = ops
            .iter()
            .map(|o| o["path"].as_str().expect("path"))
            .collect();
        assert!(paths.contains(&"/metadata") && paths.contains(&"/spec"));
        assert!(paths.contains(&"/a~1b~0c"), "{paths:?}");
        assert!(!paths.iter().any(|p| p.starts_with("/status")), "{paths:?}");
    }

    #[test]
    fn a_dropped_status_is_noticed() {
        let sent = json!({"status": {"address": "10.0.0.1"}});
        assert!(status_kept(&sent, &sent));
        assert!(!status_kept(&sent, &json!({"status": {}})));
        assert!(!status_kept(&sent, &json!({})));
        assert!(status_kept(&json!({}), &json!({"status": {}})));
    }
}
