//! The resource types the fake serves: the built-in ones, and those registered by creating a
//! CustomResourceDefinition. Each type knows its group, served versions, kind, scope, short names,
//! subresources and where its objects are stored.

use std::cmp::Ordering;

use serde_json::{Value, json};

/// Type-specific behaviour on top of the generic object store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Stored as given.
    Plain,
    /// core/v1 Namespace: phase, the `kubernetes` finalizer, content deletion.
    Namespace,
    /// core/v1 ServiceAccount: the `token` subresource.
    ServiceAccount,
    /// core/v1 Secret: `stringData`, service-account token validation.
    Secret,
    /// core/v1 Service: cluster IP and node port allocation, defaults.
    Service,
    /// core/v1 Event (the storage shape of both event APIs).
    CoreEvent,
    /// events.k8s.io/v1 Event, converted to and from the core shape.
    EventsV1,
    /// apiextensions.k8s.io/v1 CustomResourceDefinition: registers types.
    Crd,
    /// rbac Role/ClusterRole: escalation check.
    Role,
    /// rbac RoleBinding/ClusterRoleBinding: bind/escalation check, immutable roleRef.
    Binding,
    /// admissionregistration.k8s.io/v1 Mutating/ValidatingWebhookConfiguration: defaulted and
    /// validated like the real registry; the admission chain reads them.
    WebhookConfig,
    /// An instance of a CustomResourceDefinition.
    Custom,
    /// authentication.k8s.io/v1 TokenReview (create only, not stored).
    TokenReview,
    /// authentication.k8s.io/v1 SelfSubjectReview (create only).
    SelfSubjectReview,
    /// authorization.k8s.io/v1 SubjectAccessReview (create only).
    SubjectAccessReview,
    /// authorization.k8s.io/v1 LocalSubjectAccessReview (create only, namespaced).
    LocalSubjectAccessReview,
    /// authorization.k8s.io/v1 SelfSubjectAccessReview (create only).
    SelfSubjectAccessReview,
    /// authorization.k8s.io/v1 SelfSubjectRulesReview (create only).
    SelfSubjectRulesReview,
}

/// One additional printer column of a custom resource.
#[derive(Debug, Clone, PartialEq)]
pub struct PrinterColumn {
    /// Column header.
    pub name: String,
    /// OpenAPI type (`string`, `integer`, `date`, ...).
    pub type_: String,
    /// Simple JSONPath such as `.spec.ip` or `.status.conditions[?(@.type=="Ready")].status`.
    pub json_path: String,
    /// Display priority; 0 is shown by default.
    pub priority: i64,
    /// Column description.
    pub description: String,
}

/// A served resource type.
#[derive(Debug, Clone)]
pub struct ResourceType {
    /// API group, empty for core.
    pub group: String,
    /// Served versions, the preferred one first.
    pub versions: Vec<String>,
    /// Plural resource name used in paths.
    pub plural: String,
    /// Singular name.
    pub singular: String,
    /// Kind.
    pub kind: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Short names for kubectl.
    pub short_names: Vec<String>,
    /// Categories (`all`, ...).
    pub categories: Vec<String>,
    /// Type-specific behaviour.
    pub behaviour: Behaviour,
    /// Versions with the status subresource.
    pub status_versions: Vec<String>,
    /// Storage location `(group, plural)`, shared by both event APIs.
    pub storage: (String, String),
    /// Printer columns per version (custom resources).
    pub printer_columns: Vec<(String, Vec<PrinterColumn>)>,
    /// OpenAPI v3 schema per version (custom resources), used for pruning and defaulting.
    pub schemas: Vec<(String, Value)>,
    /// Whether `metadata.generation` tracks spec changes.
    pub generation: bool,
    /// Whether PUT on a missing object creates it (the real strategies' `AllowCreateOnUpdate`).
    pub create_on_update: bool,
    /// Whether PUT without resourceVersion is allowed (`AllowUnconditionalUpdate`).
    pub unconditional_update: bool,
    /// The CRD that defines this type, if any.
    pub crd: Option<String>,
}

/// Standard verbs of a stored resource, in discovery order.
pub const STORED_VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

impl ResourceType {
    /// Whether this is a create-only review type that is never stored.
    pub fn is_virtual(&self) -> bool {
        matches!(
            self.behaviour,
            Behaviour::TokenReview
                | Behaviour::SelfSubjectReview
                | Behaviour::SubjectAccessReview
                | Behaviour::LocalSubjectAccessReview
                | Behaviour::SelfSubjectAccessReview
                | Behaviour::SelfSubjectRulesReview
        )
    }

    /// Discovery verbs.
    pub fn verbs(&self) -> Vec<&'static str> {
        if self.is_virtual() {
            vec!["create"]
        } else {
            STORED_VERBS.to_vec()
        }
    }

    /// Whether the given version serves `/status`.
    pub fn has_status(&self, version: &str) -> bool {
        self.status_versions.iter().any(|v| v == version)
    }

    /// `group/version`, or `version` for core.
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    /// The preferred (first served) version.
    pub fn preferred(&self) -> &str {
        self.versions.first().map(String::as_str).unwrap_or("v1")
    }

    /// Printer columns for a version.
    pub fn columns(&self, version: &str) -> &[PrinterColumn] {
        self.printer_columns
            .iter()
            .find(|(v, _)| v == version)
            .map(|(_, c)| c.as_slice())
            .unwrap_or(&[])
    }

    /// Schema for a version.
    pub fn schema(&self, version: &str) -> Option<&Value> {
        self.schemas
            .iter()
            .find(|(v, _)| v == version)
            .map(|(_, s)| s)
    }

    /// Extra field selector labels supported beyond metadata.name/namespace.
    pub fn field_labels(&self) -> &'static [&'static str] {
        match self.behaviour {
            Behaviour::Secret => &["type"],
            Behaviour::Namespace => &["status.phase"],
            Behaviour::CoreEvent | Behaviour::EventsV1 => &[
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            ],
            Behaviour::Service => &["spec.clusterIP", "spec.type"],
            _ => &[],
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn builtin(
    group: &str,
    plural: &str,
    singular: &str,
    kind: &str,
    namespaced: bool,
    short: &[&str],
    behaviour: Behaviour,
    status: bool,
) -> ResourceType {
    let version = "v1".to_string();
    let storage_group = if behaviour == Behaviour::EventsV1 {
        String::new()
    } else {
        group.to_string()
    };
    ResourceType {
        group: group.into(),
        versions: vec![version.clone()],
        plural: plural.into(),
        singular: singular.into(),
        kind: kind.into(),
        namespaced,
        short_names: short.iter().map(|s| s.to_string()).collect(),
        categories: if matches!(behaviour, Behaviour::Service) {
            vec!["all".into()]
        } else {
            vec![]
        },
        behaviour,
        status_versions: if status { vec![version] } else { vec![] },
        storage: (storage_group, plural.into()),
        printer_columns: vec![],
        schemas: vec![],
        generation: matches!(behaviour, Behaviour::Crd | Behaviour::WebhookConfig),
        create_on_update: matches!(
            behaviour,
            Behaviour::CoreEvent | Behaviour::EventsV1 | Behaviour::Role | Behaviour::Binding
        ) || plural == "leases",
        unconditional_update: true,
        crd: None,
    }
}

/// The built-in types, in discovery order.
pub fn builtins() -> Vec<ResourceType> {
    use Behaviour as B;
    let rbac = "rbac.authorization.k8s.io";
    let mut crd = builtin(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "customresourcedefinition",
        "CustomResourceDefinition",
        false,
        &["crd", "crds"],
        B::Crd,
        true,
    );
    crd.categories = vec!["api-extensions".into()];
    let webhook_config = |plural: &str, singular: &str, kind: &str| {
        let mut rt = builtin(
            ADMISSION_REGISTRATION,
            plural,
            singular,
            kind,
            false,
            &[],
            B::WebhookConfig,
            false,
        );
        rt.categories = vec!["api-extensions".into()];
        rt
    };
    vec![
        builtin(
            "",
            "configmaps",
            "configmap",
            "ConfigMap",
            true,
            &["cm"],
            B::Plain,
            false,
        ),
        builtin(
            "",
            "events",
            "event",
            "Event",
            true,
            &["ev"],
            B::CoreEvent,
            false,
        ),
        builtin(
            "",
            "namespaces",
            "namespace",
            "Namespace",
            false,
            &["ns"],
            B::Namespace,
            true,
        ),
        builtin(
            "",
            "secrets",
            "secret",
            "Secret",
            true,
            &[],
            B::Secret,
            false,
        ),
        builtin(
            "",
            "serviceaccounts",
            "serviceaccount",
            "ServiceAccount",
            true,
            &["sa"],
            B::ServiceAccount,
            false,
        ),
        builtin(
            "",
            "services",
            "service",
            "Service",
            true,
            &["svc"],
            B::Service,
            true,
        ),
        crd,
        webhook_config(
            "mutatingwebhookconfigurations",
            "mutatingwebhookconfiguration",
            "MutatingWebhookConfiguration",
        ),
        webhook_config(
            "validatingwebhookconfigurations",
            "validatingwebhookconfiguration",
            "ValidatingWebhookConfiguration",
        ),
        builtin(
            "authentication.k8s.io",
            "selfsubjectreviews",
            "selfsubjectreview",
            "SelfSubjectReview",
            false,
            &[],
            B::SelfSubjectReview,
            false,
        ),
        builtin(
            "authentication.k8s.io",
            "tokenreviews",
            "tokenreview",
            "TokenReview",
            false,
            &[],
            B::TokenReview,
            false,
        ),
        builtin(
            "authorization.k8s.io",
            "localsubjectaccessreviews",
            "localsubjectaccessreview",
            "LocalSubjectAccessReview",
            true,
            &[],
            B::LocalSubjectAccessReview,
            false,
        ),
        builtin(
            "authorization.k8s.io",
            "selfsubjectaccessreviews",
            "selfsubjectaccessreview",
            "SelfSubjectAccessReview",
            false,
            &[],
            B::SelfSubjectAccessReview,
            false,
        ),
        builtin(
            "authorization.k8s.io",
            "selfsubjectrulesreviews",
            "selfsubjectrulesreview",
            "SelfSubjectRulesReview",
            false,
            &[],
            B::SelfSubjectRulesReview,
            false,
        ),
        builtin(
            "authorization.k8s.io",
            "subjectaccessreviews",
            "subjectaccessreview",
            "SubjectAccessReview",
            false,
            &[],
            B::SubjectAccessReview,
            false,
        ),
        builtin(
            rbac,
            "clusterrolebindings",
            "clusterrolebinding",
            "ClusterRoleBinding",
            false,
            &[],
            B::Binding,
            false,
        ),
        builtin(
            rbac,
            "clusterroles",
            "clusterrole",
            "ClusterRole",
            false,
            &[],
            B::Role,
            false,
        ),
        builtin(
            rbac,
            "rolebindings",
            "rolebinding",
            "RoleBinding",
            true,
            &[],
            B::Binding,
            false,
        ),
        builtin(rbac, "roles", "role", "Role", true, &[], B::Role, false),
        builtin(
            "coordination.k8s.io",
            "leases",
            "lease",
            "Lease",
            true,
            &[],
            B::Plain,
            false,
        ),
        builtin(
            "events.k8s.io",
            "events",
            "event",
            "Event",
            true,
            &["ev"],
            B::EventsV1,
            false,
        ),
    ]
}

/// The group of the webhook configurations.
pub const ADMISSION_REGISTRATION: &str = "admissionregistration.k8s.io";

/// The order of the built-in groups in `/apis` (admissionregistration right before apiextensions,
/// as on the real server).
pub const BUILTIN_GROUPS: [&str; 7] = [
    ADMISSION_REGISTRATION,
    "apiextensions.k8s.io",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "rbac.authorization.k8s.io",
    "coordination.k8s.io",
    "events.k8s.io",
];

fn parse_kube_version(v: &str) -> Option<(i64, i64, i64)> {
    let rest = v.strip_prefix('v')?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let major: i64 = digits.parse().ok()?;
    let tail = &rest[digits.len()..];
    if tail.is_empty() {
        return Some((3, major, 0));
    }
    let (level, num) = if let Some(n) = tail.strip_prefix("beta") {
        (2, n)
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (1, n)
    } else {
        return None;
    };
    Some((level, major, num.parse().ok()?))
}

/// Kubernetes version priority: GA before beta before alpha, higher numbers first, others last.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    match (parse_kube_version(a), parse_kube_version(b)) {
        (Some(x), Some(y)) => y.cmp(&x),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

/// Builds the served type of a CustomResourceDefinition object, or `None` when it serves nothing.
pub fn from_crd(crd: &Value) -> Option<ResourceType> {
    let spec = crd.get("spec")?;
    let group = spec.get("group")?.as_str()?.to_string();
    let names = spec.get("names")?;
    let plural = names.get("plural")?.as_str()?.to_string();
    let kind = names.get("kind")?.as_str()?.to_string();
    let singular = names
        .get("singular")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| kind.to_lowercase());
    let mut versions = Vec::new();
    let mut status_versions = Vec::new();
    let mut printer_columns = Vec::new();
    let mut schemas = Vec::new();
    for v in spec.get("versions")?.as_array()? {
        let name = v.get("name").and_then(Value::as_str)?.to_string();
        if !v.get("served").and_then(Value::as_bool).unwrap_or(false) {
            continue;
        }
        if v.pointer("/subresources/status").is_some() {
            status_versions.push(name.clone());
        }
        let cols = v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .map(|cols| {
                cols.iter()
                    .filter_map(|c| {
                        Some(PrinterColumn {
                            name: c.get("name")?.as_str()?.to_string(),
                            type_: c
                                .get("type")
                                .and_then(Value::as_str)
                                .unwrap_or("string")
                                .to_string(),
                            json_path: c.get("jsonPath")?.as_str()?.to_string(),
                            priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                            description: c
                                .get("description")
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .to_string(),
                        })
                    })
                    .collect()
            })
            .unwrap_or_else(|| {
                vec![PrinterColumn {
                    name: "Age".into(),
                    type_: "date".into(),
                    json_path: ".metadata.creationTimestamp".into(),
                    priority: 0,
                    description: String::new(),
                }]
            });
        printer_columns.push((name.clone(), cols));
        if let Some(s) = v.pointer("/schema/openAPIV3Schema") {
            schemas.push((name.clone(), s.clone()));
        }
        versions.push(name);
    }
    if versions.is_empty() {
        return None;
    }
    versions.sort_by(|a, b| compare_versions(a, b));
    Some(ResourceType {
        group: group.clone(),
        versions,
        plural: plural.clone(),
        singular,
        kind,
        namespaced: spec.get("scope").and_then(Value::as_str) != Some("Cluster"),
        short_names: crate::strings(names.get("shortNames")),
        categories: crate::strings(names.get("categories")),
        behaviour: Behaviour::Custom,
        status_versions,
        storage: (group, plural),
        printer_columns,
        schemas,
        generation: true,
        create_on_update: false,
        unconditional_update: false,
        crd: crd
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

/// One entry of an `APIResourceList`.
pub fn discovery_entry(rt: &ResourceType) -> Value {
    let mut e = json!({
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": rt.verbs(),
    });
    if !rt.short_names.is_empty() {
        e["shortNames"] = json!(rt.short_names);
    }
    if !rt.categories.is_empty() {
        e["categories"] = json!(rt.categories);
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_priority() {
        let mut v = vec!["v1alpha1", "v2", "v1beta2", "v1", "foo", "v1beta1", "v10"];
        v.sort_by(|a, b| compare_versions(a, b));
        assert_eq!(
            v,
            vec!["v10", "v2", "v1", "v1beta2", "v1beta1", "v1alpha1", "foo"]
        );
    }

    #[test]
    fn crd_becomes_a_type() {
        let crd = json!({"metadata": {"name": "ippools.loadbalancer.harvesterhci.io"}, "spec": {
            "group": "loadbalancer.harvesterhci.io", "scope": "Cluster",
            "names": {"plural": "ippools", "kind": "IPPool", "shortNames": ["pool"]},
            "versions": [{"name": "v1beta1", "served": true, "storage": true, "subresources": {"status": {}}}]}});
        let rt = from_crd(&crd);
        assert!(
            rt.as_ref().is_some_and(|t| !t.namespaced
                && t.singular == "ippool"
                && t.has_status("v1beta1"))
        );
    }
}
