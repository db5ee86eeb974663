//! Server-side `Table` rendering (what `kubectl get` asks for) and `PartialObjectMetadata`, with the
//! real server's columns for the built-in types and the additionalPrinterColumns of custom resources.

use serde_json::{Value, json};

use crate::clock;
use crate::registry::{Behaviour, PrinterColumn, ResourceType};

/// How much of each object a Table row carries (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    /// No object.
    None,
    /// PartialObjectMetadata (the default).
    Metadata,
    /// The full object.
    Object,
}

fn col(name: &str, ty: &str, format: &str, priority: i64) -> PrinterColumn {
    PrinterColumn {
        name: name.into(),
        type_: ty.into(),
        json_path: format.into(),
        priority,
        description: String::new(),
    }
}

fn age(obj: &Value) -> Value {
    obj.pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(clock::parse)
        .map(|t| json!(clock::human_duration(clock::now_unix() - t)))
        .unwrap_or_else(|| json!("<unknown>"))
}

fn s(obj: &Value, ptr: &str) -> String {
    obj.pointer(ptr)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn none_if_empty(v: String) -> Value {
    if v.is_empty() {
        json!("<none>")
    } else {
        json!(v)
    }
}

fn service_ports(obj: &Value) -> String {
    let ports = obj
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let parts: Vec<String> = ports
        .iter()
        .map(|p| {
            let port = p.get("port").map(|v| v.to_string()).unwrap_or_default();
            let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
            match p.get("nodePort") {
                Some(np) => format!("{port}:{np}/{proto}"),
                None => format!("{port}/{proto}"),
            }
        })
        .collect();
    if parts.is_empty() {
        "<none>".into()
    } else {
        parts.join(",")
    }
}

fn external_ip(obj: &Value) -> String {
    match obj.pointer("/spec/type").and_then(Value::as_str) {
        Some("LoadBalancer") => {
            let ips: Vec<String> = obj
                .pointer("/status/loadBalancer/ingress")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|i| {
                            i.get("ip")
                                .or_else(|| i.get("hostname"))
                                .and_then(Value::as_str)
                        })
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            if ips.is_empty() {
                "<pending>".into()
            } else {
                ips.join(",")
            }
        }
        Some("ExternalName") => s(obj, "/spec/externalName"),
        _ => "<none>".into(),
    }
}

fn subjects_of(obj: &Value, kind: &str) -> Value {
    let list: Vec<String> = obj
        .get("subjects")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter(|x| x.get("kind").and_then(Value::as_str) == Some(kind))
                .map(|x| {
                    let name = x.get("name").and_then(Value::as_str).unwrap_or_default();
                    match (kind, x.get("namespace").and_then(Value::as_str)) {
                        ("ServiceAccount", Some(ns)) => format!("{ns}/{name}"),
                        _ => name.to_string(),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    json!(list.join(", "))
}

/// Columns and per-object cells for a built-in type.
/// Renders the cells of one object.
type CellsFn = fn(&Value) -> Vec<Value>;

fn builtin_columns(rt: &ResourceType) -> (Vec<PrinterColumn>, CellsFn) {
    let name = col("Name", "string", "name", 0);
    match (rt.behaviour, rt.plural.as_str()) {
        (Behaviour::Namespace, _) => (
            vec![
                name,
                col("Status", "string", "", 0),
                col("Age", "string", "", 0),
            ],
            |o| {
                vec![
                    json!(s(o, "/metadata/name")),
                    json!(s(o, "/status/phase")),
                    age(o),
                ]
            },
        ),
        (Behaviour::ServiceAccount, _) => (
            vec![
                name,
                col("Secrets", "string", "", 0),
                col("Age", "string", "", 0),
            ],
            |o| {
                let n = o
                    .get("secrets")
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len);
                vec![json!(s(o, "/metadata/name")), json!(n), age(o)]
            },
        ),
        (Behaviour::Secret, _) => (
            vec![
                name,
                col("Type", "string", "", 0),
                col("Data", "string", "", 0),
                col("Age", "string", "", 0),
            ],
            |o| {
                let n = o
                    .get("data")
                    .and_then(Value::as_object)
                    .map_or(0, |m| m.len());
                vec![
                    json!(s(o, "/metadata/name")),
                    json!(s(o, "/type")),
                    json!(n),
                    age(o),
                ]
            },
        ),
        (Behaviour::Plain, "configmaps") => (
            vec![
                name,
                col("Data", "string", "", 0),
                col("Age", "string", "", 0),
            ],
            |o| {
                let n = o
                    .get("data")
                    .and_then(Value::as_object)
                    .map_or(0, |m| m.len())
                    + o.get("binaryData")
                        .and_then(Value::as_object)
                        .map_or(0, |m| m.len());
                vec![json!(s(o, "/metadata/name")), json!(n), age(o)]
            },
        ),
        (Behaviour::Plain, "leases") => (
            vec![
                name,
                col("Holder", "string", "", 0),
                col("Age", "string", "", 0),
            ],
            |o| {
                vec![
                    json!(s(o, "/metadata/name")),
                    json!(s(o, "/spec/holderIdentity")),
                    age(o),
                ]
            },
        ),
        (Behaviour::Service, _) => (
            vec![
                name,
                col("Type", "string", "", 0),
                col("Cluster-IP", "string", "", 0),
                col("External-IP", "string", "", 0),
                col("Port(s)", "string", "", 0),
                col("Age", "string", "", 0),
                col("Selector", "string", "", 1),
            ],
            |o| {
                let selector: Vec<String> = o
                    .pointer("/spec/selector")
                    .and_then(Value::as_object)
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                            .collect()
                    })
                    .unwrap_or_default();
                vec![
                    json!(s(o, "/metadata/name")),
                    json!(s(o, "/spec/type")),
                    none_if_empty(s(o, "/spec/clusterIP")),
                    json!(external_ip(o)),
                    json!(service_ports(o)),
                    age(o),
                    none_if_empty(selector.join(",")),
                ]
            },
        ),
        (Behaviour::CoreEvent | Behaviour::EventsV1, _) => (
            vec![
                col("Last Seen", "string", "", 0),
                col("Type", "string", "", 0),
                col("Reason", "string", "", 0),
                col("Object", "string", "", 0),
                col("Message", "string", "", 0),
            ],
            |o| {
                let when = [
                    "/lastTimestamp",
                    "/deprecatedLastTimestamp",
                    "/eventTime",
                    "/metadata/creationTimestamp",
                ]
                .iter()
                .find_map(|p| o.pointer(p).and_then(Value::as_str).and_then(clock::parse))
                .map(|t| clock::human_duration(clock::now_unix() - t))
                .unwrap_or_else(|| "<unknown>".into());
                let obj = o
                    .get("involvedObject")
                    .or_else(|| o.get("regarding"))
                    .cloned()
                    .unwrap_or_default();
                let object = format!(
                    "{}/{}",
                    obj.get("kind")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_lowercase(),
                    obj.get("name").and_then(Value::as_str).unwrap_or_default()
                );
                let msg = o
                    .get("message")
                    .or_else(|| o.get("note"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                vec![
                    json!(when),
                    json!(s(o, "/type")),
                    json!(s(o, "/reason")),
                    json!(object),
                    json!(msg),
                ]
            },
        ),
        (Behaviour::Binding, _) => (
            vec![
                name,
                col("Role", "string", "", 0),
                col("Age", "string", "", 0),
                col("Users", "string", "", 1),
                col("Groups", "string", "", 1),
                col("ServiceAccounts", "string", "", 1),
            ],
            |o| {
                let role = format!("{}/{}", s(o, "/roleRef/kind"), s(o, "/roleRef/name"));
                vec![
                    json!(s(o, "/metadata/name")),
                    json!(role),
                    age(o),
                    subjects_of(o, "User"),
                    subjects_of(o, "Group"),
                    subjects_of(o, "ServiceAccount"),
                ]
            },
        ),
        (Behaviour::WebhookConfig, _) => (
            vec![
                name,
                col("Webhooks", "integer", "", 0),
                col("Age", "string", "", 0),
            ],
            |o| {
                let n = o
                    .get("webhooks")
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len);
                vec![json!(s(o, "/metadata/name")), json!(n), age(o)]
            },
        ),
        (Behaviour::Role | Behaviour::Crd, _) => {
            (vec![name, col("Created At", "date", "", 0)], |o| {
                vec![
                    json!(s(o, "/metadata/name")),
                    json!(s(o, "/metadata/creationTimestamp")),
                ]
            })
        }
        _ => (vec![name, col("Age", "string", "", 0)], |o| {
            vec![json!(s(o, "/metadata/name")), age(o)]
        }),
    }
}

/// Evaluates the simple JSONPath subset printer columns use.
pub fn json_path(obj: &Value, path: &str) -> Option<Value> {
    let mut cur = vec![obj.clone()];
    let mut rest = path
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim_start_matches('$');
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let field = &r[..end];
            cur = cur.iter().filter_map(|v| v.get(field).cloned()).collect();
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            let inner = &r[..end];
            rest = &r[end + 1..];
            if let Some(filter) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                let (field, want) = filter.split_once("==")?;
                let want = want.trim().trim_matches('"').trim_matches('\'');
                cur = cur
                    .iter()
                    .filter_map(Value::as_array)
                    .flatten()
                    .filter(|e| e.get(field.trim()).and_then(Value::as_str) == Some(want))
                    .cloned()
                    .collect();
            } else if inner == "*" {
                cur = cur
                    .iter()
                    .filter_map(Value::as_array)
                    .flatten()
                    .cloned()
                    .collect();
            } else {
                let i: usize = inner.parse().ok()?;
                cur = cur.iter().filter_map(|v| v.get(i).cloned()).collect();
            }
        } else {
            return None;
        }
    }
    cur.into_iter().next()
}

fn custom_cell(obj: &Value, c: &PrinterColumn) -> Value {
    let Some(v) = json_path(obj, &c.json_path) else {
        return Value::Null;
    };
    match c.type_.as_str() {
        "date" => v
            .as_str()
            .and_then(clock::parse)
            .map(|t| json!(clock::human_duration(clock::now_unix() - t)))
            .unwrap_or(Value::Null),
        "string" => match v {
            Value::String(_) => v,
            other => json!(other.to_string()),
        },
        _ => v,
    }
}

/// The PartialObjectMetadata of an object.
pub fn partial_metadata(obj: &Value, meta_version: &str) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": format!("meta.k8s.io/{meta_version}"),
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// A Table of objects (already in the requested version).
pub fn render(
    rt: &ResourceType,
    version: &str,
    objects: &[Value],
    list_meta: Value,
    include: IncludeObject,
    meta_version: &str,
) -> Value {
    let (columns, rows): (Vec<PrinterColumn>, Vec<Vec<Value>>) =
        if rt.behaviour == Behaviour::Custom {
            let mut cols = vec![col("Name", "string", "name", 0)];
            cols.extend(rt.columns(version).iter().cloned());
            let rows = objects
                .iter()
                .map(|o| {
                    let mut cells = vec![json!(s(o, "/metadata/name"))];
                    cells.extend(rt.columns(version).iter().map(|c| custom_cell(o, c)));
                    cells
                })
                .collect();
            (cols, rows)
        } else {
            let (cols, cells) = builtin_columns(rt);
            (cols, objects.iter().map(cells).collect())
        };
    let defs: Vec<Value> = columns
        .iter()
        .map(|c| {
            let ty = if c.type_ == "date" { "string" } else { c.type_.as_str() };
            let format = if c.json_path == "name" { "name" } else { "" };
            json!({"name": c.name, "type": ty, "format": format, "description": c.description, "priority": c.priority})
        })
        .collect();
    let rows: Vec<Value> = rows
        .into_iter()
        .zip(objects)
        .map(|(cells, o)| match include {
            IncludeObject::None => json!({"cells": cells}),
            IncludeObject::Metadata => {
                json!({"cells": cells, "object": partial_metadata(o, meta_version)})
            }
            IncludeObject::Object => json!({"cells": cells, "object": o}),
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": format!("meta.k8s.io/{meta_version}"),
        "metadata": list_meta,
        "columnDefinitions": defs,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_path_subset() {
        let o = json!({"status": {"conditions": [{"type": "A", "status": "False"}, {"type": "Ready", "status": "True"}]},
            "spec": {"ips": ["1.2.3.4"]}});
        assert_eq!(
            json_path(&o, ".status.conditions[?(@.type==\"Ready\")].status"),
            Some(json!("True"))
        );
        assert_eq!(json_path(&o, ".spec.ips[0]"), Some(json!("1.2.3.4")));
        assert_eq!(json_path(&o, ".spec.missing"), None);
    }
}
