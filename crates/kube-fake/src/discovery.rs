//! Discovery documents (`/api`, `/apis`, `/apis/<g>`, group-version resource lists, `/version`) and
//! the minimal OpenAPI v3 documents kubectl reads to learn that the server validates fields itself.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::registry::{self, Behaviour, ResourceType, compare_versions};

/// The Kubernetes version the fake claims (kubectl's version dispatcher picks its client by it).
pub const GIT_VERSION: &str = "v1.32.0+kube-fake";

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": GIT_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.23.4",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

/// `/api`.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]
    })
}

/// Every named group with its served versions, preferred first, in `/apis` order.
pub fn groups(types: &[ResourceType]) -> Vec<(String, Vec<String>)> {
    let mut names: Vec<String> = registry::BUILTIN_GROUPS
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut custom: Vec<String> = types
        .iter()
        .filter(|t| !t.group.is_empty() && !names.contains(&t.group))
        .map(|t| t.group.clone())
        .collect();
    custom.sort();
    custom.dedup();
    names.extend(custom);
    names
        .into_iter()
        .filter_map(|g| {
            let mut versions: Vec<String> = types
                .iter()
                .filter(|t| t.group == g)
                .flat_map(|t| t.versions.iter().cloned())
                .collect();
            versions.sort_by(|a, b| compare_versions(a, b));
            versions.dedup();
            (!versions.is_empty()).then_some((g, versions))
        })
        .collect()
}

fn group_doc(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({"name": name, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

/// `/apis`.
pub fn group_list(types: &[ResourceType]) -> Value {
    let groups: Vec<Value> = groups(types).iter().map(|(g, v)| group_doc(g, v)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`, or `None` for an unknown group.
pub fn group(types: &[ResourceType], name: &str) -> Option<Value> {
    let (g, v) = groups(types).into_iter().find(|(g, _)| g == name)?;
    let mut doc = group_doc(&g, &v);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

fn served<'a>(types: &'a [ResourceType], group: &str, version: &str) -> Vec<&'a ResourceType> {
    let mut v: Vec<&ResourceType> = types
        .iter()
        .filter(|t| t.group == group && t.versions.iter().any(|x| x == version))
        .collect();
    v.sort_by(|a, b| a.plural.cmp(&b.plural));
    v
}

/// `/api/v1` or `/apis/<group>/<version>`, or `None` when nothing is served there.
pub fn resource_list(types: &[ResourceType], group: &str, version: &str) -> Option<Value> {
    let served = served(types, group, version);
    if served.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for rt in served {
        resources.push(registry::discovery_entry(rt));
        if rt.has_status(version) {
            resources.push(json!({"name": format!("{}/status", rt.plural), "singularName": "", "namespaced": rt.namespaced,
                "kind": rt.kind, "verbs": ["get", "patch", "update"]}));
        }
        match rt.behaviour {
            Behaviour::ServiceAccount => resources.push(json!({"name": "serviceaccounts/token", "singularName": "",
                "namespaced": true, "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest", "verbs": ["create"]})),
            Behaviour::Namespace => resources.push(json!({"name": "namespaces/finalize", "singularName": "",
                "namespaced": false, "kind": "Namespace", "verbs": ["update"]})),
            _ => {}
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// One OpenAPI v3 document per group-version: the PATCH operation of each kind, with the query
/// parameters (notably `fieldValidation`) and patch content types the server accepts. Create-only
/// review kinds get one too: kubectl only reads it to learn that the server validates fields, and
/// without it falls back to the protobuf-only OpenAPI v2 document.
pub fn openapi_doc(types: &[ResourceType], group: &str, version: &str) -> Option<Value> {
    let served = served(types, group, version);
    if served.is_empty() {
        return None;
    }
    let mut paths = serde_json::Map::new();
    for rt in served {
        let base = format!("/{}", gv_path(group, version));
        let path = if rt.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}/{{name}}", rt.plural)
        } else {
            format!("{base}/{}/{{name}}", rt.plural)
        };
        let q = |name: &str, ty: &str| json!({"name": name, "in": "query", "schema": {"type": ty, "uniqueItems": true}});
        let body = json!({"schema": {"type": "object"}});
        paths.insert(
            path,
            json!({"patch": {
                "operationId": format!("patch{}", rt.kind),
                "parameters": [q("dryRun", "string"), q("fieldManager", "string"), q("fieldValidation", "string"), q("force", "boolean")],
                "requestBody": {"content": {
                    "application/json-patch+json": body, "application/merge-patch+json": body, "application/apply-patch+yaml": body}},
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": rt.kind}
            }}),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": GIT_VERSION},
        "paths": paths,
        "components": {"schemas": {}}
    }))
}

/// `/openapi/v3`: the index of per-group-version documents with content hashes.
pub fn openapi_index(types: &[ResourceType]) -> Value {
    let mut gvs = vec![(String::new(), "v1".to_string())];
    for (g, versions) in groups(types) {
        for v in versions {
            gvs.push((g.clone(), v));
        }
    }
    let mut paths = serde_json::Map::new();
    for (g, v) in gvs {
        let Some(doc) = openapi_doc(types, &g, &v) else {
            continue;
        };
        let hash = hex(&Sha256::digest(doc.to_string().as_bytes()));
        let p = gv_path(&g, &v);
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={hash}")}),
        );
    }
    json!({"paths": paths})
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}
