//! The HTTP contract: `openapi/openapi.yaml` and the router declare the same paths and methods, the
//! router really serves exactly those, and every error the API can return is documented.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use axum::{
    body::Body,
    http::{Method, StatusCode},
};
use serde_json::Value;
use support::{Backend, EmbeddedBackend};

const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

fn spec() -> Value {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.yaml"))
            .unwrap();
    yaml_serde::from_str(&text).expect("openapi.yaml is YAML")
}

fn spec_routes(spec: &Value) -> BTreeMap<String, BTreeSet<String>> {
    spec["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .map(|(path, item)| {
            let methods = item
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| METHODS.contains(&k.as_str()))
                .map(|k| k.to_uppercase())
                .collect();
            (path.clone(), methods)
        })
        .collect()
}

/// Fills `{param}` segments so a path can be requested.
fn concrete(path: &str) -> String {
    path.split('/')
        .map(|seg| if seg.starts_with('{') { "x" } else { seg })
        .collect::<Vec<_>>()
        .join("/")
}

#[tokio::test]
async fn router_and_spec_declare_the_same_routes() {
    let b = EmbeddedBackend::start().await;
    let (_, table) = harvester_cloud::http::build(b.app.service.state.clone());
    let declared: BTreeMap<String, BTreeSet<String>> = table
        .iter()
        .map(|r| {
            // axum writes parameters as `{name}` too.
            (
                r.path.to_string(),
                r.methods.iter().map(|m| m.to_string()).collect(),
            )
        })
        .collect();
    assert_eq!(
        declared,
        spec_routes(&spec()),
        "router (left) and openapi.yaml (right) differ"
    );
}

#[tokio::test]
async fn router_serves_exactly_the_documented_methods() {
    let b = EmbeddedBackend::start().await;
    let token = b.admin_token();
    for (path, methods) in spec_routes(&spec()) {
        let uri = concrete(&path);
        for m in METHODS {
            let method = Method::from_bytes(m.to_uppercase().as_bytes()).unwrap();
            let r = b
                .call(method.clone(), &uri, Some(&token), Body::empty())
                .await;
            let refused = r.status == StatusCode::METHOD_NOT_ALLOWED;
            let unrouted = r.status == StatusCode::NOT_FOUND && r.text().contains("no route for");
            if methods.contains(&m.to_uppercase()) {
                assert!(
                    !refused && !unrouted,
                    "{method} {uri} is documented but not served: {} {}",
                    r.status,
                    r.text()
                );
            } else {
                assert_eq!(
                    r.status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {uri} is served but not documented"
                );
            }
        }
    }
}

fn resolve<'a>(spec: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let pointer = r.trim_start_matches('#');
            spec.pointer(pointer)
                .unwrap_or_else(|| panic!("dangling $ref {r}"))
        }
        None => v,
    }
}

#[test]
fn every_operation_documents_its_errors_in_the_error_shape() {
    let spec = spec();
    let error_schema = &spec["components"]["schemas"]["Error"];
    let props: BTreeSet<&str> = error_schema["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(props, BTreeSet::from(["type", "status", "code", "message"]));
    for (path, item) in spec["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if !METHODS.contains(&method.as_str()) {
                continue;
            }
            let responses = op["responses"]
                .as_object()
                .unwrap_or_else(|| panic!("{method} {path}: responses"));
            assert!(
                responses.contains_key("405"),
                "{method} {path} must document 405"
            );
            let secured = op
                .get("security")
                .is_none_or(|s| s.as_array().is_some_and(|a| !a.is_empty()));
            if secured {
                assert!(
                    responses.contains_key("401"),
                    "{method} {path} is authenticated and must document 401"
                );
            }
            // What the request limits answer on any route (http::limits).
            for code in ["414", "431"] {
                assert!(
                    responses.contains_key(code),
                    "{method} {path} must document {code}"
                );
            }
            // A POST or PUT reads a body, unless all it does is redirect.
            let redirects = responses.keys().any(|c| c.starts_with('3'));
            let reads_body = op.get("requestBody").is_some();
            if method == "post" || method == "put" {
                assert!(
                    reads_body || redirects,
                    "{method} {path} must declare its requestBody"
                );
            }
            if reads_body {
                for code in ["400", "408"] {
                    assert!(
                        responses.contains_key(code),
                        "{method} {path} reads a body and must document {code}"
                    );
                }
            }
            if method == "post" && reads_body {
                for code in ["413", "422"] {
                    assert!(
                        responses.contains_key(code),
                        "{method} {path} takes a body and must document {code}"
                    );
                }
            }
            for (code, resp) in responses {
                if code.starts_with('4') || code.starts_with('5') {
                    let resp = resolve(&spec, resp);
                    let schema = &resp["content"]["application/json"]["schema"];
                    assert_eq!(
                        schema["$ref"], "#/components/schemas/Error",
                        "{method} {path} {code} must use the Error shape"
                    );
                }
            }
        }
    }
}

#[tokio::test]
async fn get_parameters_match_what_the_handler_reads() {
    let spec = spec();
    let params: BTreeSet<&str> = spec["paths"]["/v1/harvester/kubeconfig"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    let body: BTreeSet<&str> = spec["components"]["schemas"]["KubeconfigRequest"]["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(params, body, "GET takes the same fields as the POST body");
    // And the handler reads each of them: a bad value of each required one is rejected by name,
    // `outputFormat` selects the output, and the role names are ignored as the contract says.
    let b = EmbeddedBackend::start().await;
    for (p, query) in [
        ("namespace", "namespace=Not_Valid&serviceAccountName=b"),
        (
            "serviceAccountName",
            "namespace=a&serviceAccountName=Not_Valid",
        ),
    ] {
        let m = b
            .get(query)
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        assert!(m.contains(p), "{m}");
    }
    b.post(r#"{"namespace":"a","serviceAccountName":"b"}"#)
        .await
        .kubeconfig();
    let yaml = b
        .get("namespace=a&serviceAccountName=b&outputFormat=yaml")
        .await;
    assert_eq!(yaml.content_type(), "application/x-yaml; charset=utf-8");
    let get = &spec["paths"]["/v1/harvester/kubeconfig"]["get"]["parameters"];
    for p in ["clusterRoleName", "csiClusterRoleName"] {
        let doc = get
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == p)
            .unwrap();
        assert!(
            doc["description"].as_str().unwrap().contains("ignored"),
            "{p}"
        );
        b.get(&format!("namespace=a&serviceAccountName=b&{p}=x"))
            .await
            .kubeconfig();
    }
}
