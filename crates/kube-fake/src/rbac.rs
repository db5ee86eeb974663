//! RBAC evaluation over the stored Role, ClusterRole, RoleBinding and ClusterRoleBinding objects:
//! the authorizer of every request, SubjectAccessReview and friends, and the escalation checks on
//! role and binding writes. The default roles seeded at start mirror the real bootstrap policy.

use serde_json::{Value, json};

use crate::auth::Identity;
use crate::store::Store;

/// The RBAC API group.
pub const RBAC: &str = "rbac.authorization.k8s.io";

/// What a request wants to do, as the real RequestInfo resolver describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    /// get, list, watch, create, update, patch, delete, deletecollection, bind, escalate, impersonate...
    pub verb: String,
    /// API group of the resource.
    pub group: String,
    /// Plural resource.
    pub resource: String,
    /// Subresource, or empty.
    pub subresource: String,
    /// Object name, or empty.
    pub name: String,
    /// Namespace, or empty for cluster scope.
    pub namespace: String,
    /// For non-resource requests: the URL path.
    pub path: Option<String>,
}

/// An authorization decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Allowed or not (RBAC never denies explicitly: "no opinion" is a no).
    pub allowed: bool,
    /// `RBAC: allowed by ...` when allowed, empty otherwise.
    pub reason: String,
}

fn strs(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn has(list: &[&str], item: &str) -> bool {
    list.iter().any(|x| *x == "*" || *x == item)
}

fn resource_matches(rule_resources: &[&str], resource: &str, sub: &str) -> bool {
    let combined = if sub.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}/{sub}")
    };
    rule_resources.iter().any(|r| {
        *r == "*"
            || *r == combined
            || (!sub.is_empty()
                && r.len() == sub.len() + 2
                && r.starts_with("*/")
                && r.ends_with(sub))
    })
}

/// Whether one PolicyRule allows the attributes.
pub fn rule_allows(rule: &Value, a: &Attributes) -> bool {
    if !has(&strs(rule.get("verbs")), &a.verb) {
        return false;
    }
    match &a.path {
        Some(path) => strs(rule.get("nonResourceURLs")).iter().any(|u| {
            *u == "*" || u == path || (u.ends_with('*') && path.starts_with(&u[..u.len() - 1]))
        }),
        None => {
            let names = strs(rule.get("resourceNames"));
            has(&strs(rule.get("apiGroups")), &a.group)
                && resource_matches(&strs(rule.get("resources")), &a.resource, &a.subresource)
                && (names.is_empty() || names.contains(&a.name.as_str()))
        }
    }
}

fn subject_matches(subject: &Value, id: &Identity, binding_ns: &str) -> Option<String> {
    let kind = subject.get("kind").and_then(Value::as_str)?;
    let name = subject.get("name").and_then(Value::as_str)?;
    match kind {
        "User" if id.username == name => Some(format!("User \"{name}\"")),
        "Group" if id.groups.iter().any(|g| g == name) => Some(format!("Group \"{name}\"")),
        "ServiceAccount" => {
            let ns = subject
                .get("namespace")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .unwrap_or(binding_ns);
            (id.username == format!("system:serviceaccount:{ns}:{name}"))
                .then(|| format!("ServiceAccount \"{name}/{ns}\""))
        }
        _ => None,
    }
}

/// A binding that applies to the identity, with the rules of its role.
struct Applied {
    describe: String,
    rules: Vec<Value>,
}

fn role_rules(store: &Store, role_ref: &Value, binding_ns: &str) -> Option<(String, Vec<Value>)> {
    let kind = role_ref.get("kind").and_then(Value::as_str)?;
    let name = role_ref.get("name").and_then(Value::as_str)?;
    let key = match kind {
        "ClusterRole" => (
            RBAC.to_string(),
            "clusterroles".to_string(),
            String::new(),
            name.to_string(),
        ),
        "Role" if !binding_ns.is_empty() => (
            RBAC.to_string(),
            "roles".to_string(),
            binding_ns.to_string(),
            name.to_string(),
        ),
        _ => return None,
    };
    let role = store.get(&key)?;
    let rules = role
        .get("rules")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    Some((format!("{kind} \"{name}\""), rules))
}

fn applicable(store: &Store, id: &Identity, namespace: &str) -> Vec<Applied> {
    let mut out = Vec::new();
    let mut scan = |plural: &str, ns: Option<&str>| {
        for (key, binding) in store.list(RBAC, plural, ns) {
            let binding_ns = key.2.as_str();
            let subjects = binding
                .get("subjects")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let Some(who) = subjects
                .iter()
                .find_map(|s| subject_matches(s, id, binding_ns))
            else {
                continue;
            };
            let Some(role_ref) = binding.get("roleRef") else {
                continue;
            };
            let Some((role, rules)) = role_rules(store, role_ref, binding_ns) else {
                continue;
            };
            let describe = if binding_ns.is_empty() {
                format!("ClusterRoleBinding \"{}\" of {role} to {who}", key.3)
            } else {
                format!(
                    "RoleBinding \"{}/{}\" of {role} to {who}",
                    key.3, binding_ns
                )
            };
            out.push(Applied { describe, rules });
        }
    };
    scan("clusterrolebindings", None);
    if !namespace.is_empty() {
        scan("rolebindings", Some(namespace));
    }
    out
}

/// Evaluates the attributes for the identity: `system:masters` is always allowed (the real
/// server's privileged-group authorizer runs before RBAC), everyone else by the stored RBAC objects.
pub fn authorize(store: &Store, id: &Identity, a: &Attributes) -> Decision {
    if id.is_master() {
        return Decision {
            allowed: true,
            reason: String::new(),
        };
    }
    let ns = if a.path.is_some() {
        ""
    } else {
        a.namespace.as_str()
    };
    for applied in applicable(store, id, ns) {
        if applied.rules.iter().any(|r| rule_allows(r, a)) {
            return Decision {
                allowed: true,
                reason: format!("RBAC: allowed by {}", applied.describe),
            };
        }
    }
    Decision {
        allowed: false,
        reason: String::new(),
    }
}

/// All rules that apply to the identity in a namespace (SelfSubjectRulesReview).
pub fn rules_for(store: &Store, id: &Identity, namespace: &str) -> Vec<Value> {
    applicable(store, id, namespace)
        .into_iter()
        .flat_map(|a| a.rules)
        .collect()
}

/// The real server's forbidden reason text.
pub fn forbidden_reason(id: &Identity, a: &Attributes) -> String {
    match &a.path {
        Some(path) => format!("User \"{}\" cannot {} path \"{path}\"", id.username, a.verb),
        None => {
            let res = if a.subresource.is_empty() {
                a.resource.clone()
            } else {
                format!("{}/{}", a.resource, a.subresource)
            };
            let scope = if a.namespace.is_empty() {
                "at the cluster scope".to_string()
            } else {
                format!("in the namespace \"{}\"", a.namespace)
            };
            format!(
                "User \"{}\" cannot {} resource \"{res}\" in API group \"{}\" {scope}",
                id.username, a.verb, a.group
            )
        }
    }
}

/// The rules of `wanted` that the identity does not hold itself in `namespace` (empty = cluster-wide),
/// expanded to one entry per verb/group/resource/name like the real escalation check reports.
pub fn not_covered(store: &Store, id: &Identity, wanted: &[Value], namespace: &str) -> Vec<String> {
    let mut missing = Vec::new();
    for rule in wanted {
        let verbs = strs(rule.get("verbs"));
        let urls = strs(rule.get("nonResourceURLs"));
        for verb in &verbs {
            for url in &urls {
                let a = Attributes {
                    verb: verb.to_string(),
                    path: Some(url.to_string()),
                    ..Default::default()
                };
                if !authorize(store, id, &a).allowed {
                    missing.push(format!(
                        "{{NonResourceURLs:[\"{url}\"], Verbs:[\"{verb}\"]}}"
                    ));
                }
            }
        }
        let groups = strs(rule.get("apiGroups"));
        let resources = strs(rule.get("resources"));
        let names = strs(rule.get("resourceNames"));
        let name_list: Vec<&str> = if names.is_empty() {
            vec![""]
        } else {
            names.clone()
        };
        for group in &groups {
            for resource in &resources {
                let (res, sub) = resource.split_once('/').unwrap_or((resource, ""));
                for verb in &verbs {
                    for name in &name_list {
                        let a = Attributes {
                            verb: verb.to_string(),
                            group: group.to_string(),
                            resource: res.to_string(),
                            subresource: sub.to_string(),
                            name: name.to_string(),
                            namespace: namespace.to_string(),
                            path: None,
                        };
                        if !authorize(store, id, &a).allowed {
                            let n = if name.is_empty() {
                                String::new()
                            } else {
                                format!(", ResourceNames:[\"{name}\"]")
                            };
                            missing.push(format!(
                                "{{APIGroups:[\"{group}\"], Resources:[\"{resource}\"]{n}, Verbs:[\"{verb}\"]}}"
                            ));
                        }
                    }
                }
            }
        }
    }
    missing
}

/// The escalation-prevention message.
pub fn escalation_message(id: &Identity, missing: &[String]) -> String {
    let groups: Vec<String> = id.groups.iter().map(|g| format!("\"{g}\"")).collect();
    format!(
        "user \"{}\" (groups=[{}]) is attempting to grant RBAC permissions not currently held:\n{}",
        id.username,
        groups.join(" "),
        missing.join("\n")
    )
}

/// The bootstrap ClusterRoles and ClusterRoleBindings seeded at start, as `(plural, object)`.
pub fn bootstrap_policy() -> Vec<(&'static str, Value)> {
    let meta = |name: &str| {
        json!({"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
               "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}})
    };
    let role = |name: &str, rules: Value| json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta(name), "rules": rules});
    let binding = |name: &str, role: &str, groups: &[&str]| {
        let subjects: Vec<Value> = groups
            .iter()
            .map(|g| json!({"apiGroup": RBAC, "kind": "Group", "name": g}))
            .collect();
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": meta(name),
               "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": role}, "subjects": subjects})
    };
    vec![
        (
            "clusterroles",
            role(
                "cluster-admin",
                json!([
            {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
            {"nonResourceURLs": ["*"], "verbs": ["*"]}]),
            ),
        ),
        (
            "clusterroles",
            role(
                "system:discovery",
                json!([{"nonResourceURLs": [
            "/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*", "/readyz",
            "/version", "/version/"], "verbs": ["get"]}]),
            ),
        ),
        (
            "clusterroles",
            role(
                "system:public-info-viewer",
                json!([{"nonResourceURLs": [
            "/healthz", "/livez", "/readyz", "/version", "/version/"], "verbs": ["get"]}]),
            ),
        ),
        (
            "clusterroles",
            role(
                "system:basic-user",
                json!([
            {"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], "verbs": ["create"]},
            {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]}]),
            ),
        ),
        (
            "clusterroles",
            role(
                "system:auth-delegator",
                json!([
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
            {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}]),
            ),
        ),
        (
            "clusterrolebindings",
            binding("cluster-admin", "cluster-admin", &["system:masters"]),
        ),
        (
            "clusterrolebindings",
            binding(
                "system:discovery",
                "system:discovery",
                &["system:authenticated"],
            ),
        ),
        (
            "clusterrolebindings",
            binding(
                "system:public-info-viewer",
                "system:public-info-viewer",
                &["system:authenticated", "system:unauthenticated"],
            ),
        ),
        (
            "clusterrolebindings",
            binding(
                "system:basic-user",
                "system:basic-user",
                &["system:authenticated"],
            ),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_attrs(verb: &str, group: &str, resource: &str, sub: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            name: name.into(),
            namespace: "ns".into(),
            path: None,
        }
    }

    #[test]
    fn rule_matching() {
        let rule = json!({"apiGroups": [""], "resources": ["secrets", "*/status"], "verbs": ["get"], "resourceNames": ["a"]});
        assert!(rule_allows(&rule, &mk_attrs("get", "", "secrets", "", "a")));
        assert!(!rule_allows(
            &rule,
            &mk_attrs("get", "", "secrets", "", "b")
        ));
        assert!(!rule_allows(&rule, &mk_attrs("get", "", "secrets", "", "")));
        assert!(rule_allows(
            &rule,
            &mk_attrs("get", "", "services", "status", "a")
        ));
        assert!(!rule_allows(
            &rule,
            &mk_attrs("list", "", "secrets", "", "a")
        ));
        let star = json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]});
        assert!(rule_allows(
            &star,
            &mk_attrs("escalate", "rbac.authorization.k8s.io", "roles", "", "")
        ));
        let url = json!({"nonResourceURLs": ["/apis/*"], "verbs": ["get"]});
        let a = Attributes {
            verb: "get".into(),
            path: Some("/apis/x".into()),
            ..Default::default()
        };
        assert!(rule_allows(&url, &a));
    }
}
