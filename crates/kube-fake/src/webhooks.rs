//! Admission webhook configurations (admissionregistration.k8s.io/v1): the defaulting and validation
//! the real registry applies when one is written, and the parsed form the admission chain matches
//! requests against (rules, scope, namespace and object selectors).

use std::time::Duration;

use serde_json::{Value, json};

use crate::registry::{ADMISSION_REGISTRATION, ResourceType};
use crate::selector::LabelSelector;
use crate::state::Inner;
use crate::status::{ApiError, FieldError};

/// Plural of MutatingWebhookConfiguration.
pub const MUTATING: &str = "mutatingwebhookconfigurations";
/// Plural of ValidatingWebhookConfiguration.
pub const VALIDATING: &str = "validatingwebhookconfigurations";

/// Where a webhook is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Client {
    /// `clientConfig.url` (https, validated on write).
    Url(String),
    /// `clientConfig.service`.
    Service {
        /// Service namespace.
        namespace: String,
        /// Service name.
        name: String,
        /// Service port (default 443).
        port: u16,
        /// URL path, empty for `/`.
        path: String,
    },
}

/// One rule of a webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// `CREATE`, `UPDATE`, `DELETE`, `CONNECT` or `*`.
    pub operations: Vec<String>,
    /// API groups or `*`.
    pub api_groups: Vec<String>,
    /// API versions or `*`.
    pub api_versions: Vec<String>,
    /// `res`, `res/sub`, `*`, `*/sub`, `res/*`, `*/*`.
    pub resources: Vec<String>,
    /// `Cluster`, `Namespaced` or `*`.
    pub scope: String,
}

/// What a rule is matched against: one write request.
#[derive(Debug, Clone, Copy)]
pub struct Attributes<'a> {
    /// `CREATE`, `UPDATE` or `DELETE`.
    pub operation: &'a str,
    /// Group of the resource.
    pub group: &'a str,
    /// Version of the request.
    pub version: &'a str,
    /// Plural resource.
    pub resource: &'a str,
    /// Subresource, empty for the main resource.
    pub subresource: &'a str,
    /// The admission namespace: the object's namespace, or for a Namespace its own name.
    pub namespace: &'a str,
}

impl Attributes<'_> {
    /// Whether the request is about a Namespace object itself.
    pub fn is_namespace(&self) -> bool {
        self.group.is_empty() && self.version == "v1" && self.resource == "namespaces"
    }
}

fn exact_or_wildcard(items: &[String], requested: &str) -> bool {
    items.iter().any(|i| i == "*" || i == requested)
}

impl Rule {
    /// The real `rules.Matcher`: scope, operation, group, version, and resource with subresource
    /// (`*` alone never matches a subresource).
    pub fn matches(&self, a: &Attributes<'_>) -> bool {
        let scope = match self.scope.as_str() {
            "Namespaced" => !a.is_namespace() && !a.namespace.is_empty(),
            "Cluster" => a.is_namespace() || a.namespace.is_empty(),
            _ => true,
        };
        let resource = self.resources.iter().any(|r| {
            let (res, sub) = r.split_once('/').unwrap_or((r, ""));
            (res == "*" || res == a.resource) && (sub == "*" || sub == a.subresource)
        });
        scope
            && exact_or_wildcard(&self.operations, a.operation)
            && exact_or_wildcard(&self.api_groups, a.group)
            && exact_or_wildcard(&self.api_versions, a.version)
            && resource
    }
}

/// One webhook of a stored configuration, parsed.
#[derive(Debug, Clone)]
pub struct Webhook {
    /// From a MutatingWebhookConfiguration.
    pub mutating: bool,
    /// Name of the configuration.
    pub configuration: String,
    /// Name of the webhook (what errors quote).
    pub name: String,
    /// Where to send the review.
    pub client: Client,
    /// `clientConfig.caBundle`, base64 of PEM, as stored.
    pub ca_bundle: String,
    /// Rules.
    pub rules: Vec<Rule>,
    /// `failurePolicy: Ignore`.
    pub ignore_failures: bool,
    /// Selects namespaces by their labels.
    pub namespace_selector: LabelSelector,
    /// Selects objects (new or old) by their labels.
    pub object_selector: LabelSelector,
    /// `sideEffects` (decides whether dry-run requests may be sent).
    pub side_effects: String,
    /// `timeoutSeconds` (default 10).
    pub timeout: Duration,
    /// `admissionReviewVersions`.
    pub review_versions: Vec<String>,
}

impl Webhook {
    /// Whether any rule matches the request.
    pub fn rules_match(&self, a: &Attributes<'_>) -> bool {
        self.rules.iter().any(|r| r.matches(a))
    }
}

fn str_of<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or_default()
}

fn parse_webhook(mutating: bool, configuration: &str, w: &Value) -> Option<Webhook> {
    let client = if let Some(url) = w.pointer("/clientConfig/url").and_then(Value::as_str) {
        Client::Url(url.to_string())
    } else {
        let svc = w.pointer("/clientConfig/service")?;
        Client::Service {
            namespace: str_of(svc, "/namespace").to_string(),
            name: str_of(svc, "/name").to_string(),
            port: svc
                .get("port")
                .and_then(Value::as_u64)
                .and_then(|p| u16::try_from(p).ok())
                .unwrap_or(443),
            path: str_of(svc, "/path").to_string(),
        }
    };
    let rules = w
        .get("rules")
        .and_then(Value::as_array)
        .map(|rs| {
            rs.iter()
                .map(|r| Rule {
                    operations: crate::strings(r.get("operations")),
                    api_groups: crate::strings(r.get("apiGroups")),
                    api_versions: crate::strings(r.get("apiVersions")),
                    resources: crate::strings(r.get("resources")),
                    scope: r
                        .get("scope")
                        .and_then(Value::as_str)
                        .unwrap_or("*")
                        .to_string(),
                })
                .collect()
        })
        .unwrap_or_default();
    Some(Webhook {
        mutating,
        configuration: configuration.to_string(),
        name: str_of(w, "/name").to_string(),
        client,
        ca_bundle: str_of(w, "/clientConfig/caBundle").to_string(),
        rules,
        ignore_failures: str_of(w, "/failurePolicy") == "Ignore",
        namespace_selector: LabelSelector::from_object(
            w.get("namespaceSelector").unwrap_or(&Value::Null),
            "",
        )
        .ok()?,
        object_selector: LabelSelector::from_object(
            w.get("objectSelector").unwrap_or(&Value::Null),
            "",
        )
        .ok()?,
        side_effects: str_of(w, "/sideEffects").to_string(),
        timeout: Duration::from_secs(
            w.get("timeoutSeconds")
                .and_then(Value::as_u64)
                .unwrap_or(10)
                .clamp(1, 30),
        ),
        review_versions: crate::strings(w.get("admissionReviewVersions")),
    })
}

/// Every stored webhook: the mutating ones first, each kind in order of configuration name, then
/// of the webhook within its configuration (the real server's order).
pub fn load(inner: &Inner) -> Vec<Webhook> {
    let mut out = Vec::new();
    for (plural, mutating) in [(MUTATING, true), (VALIDATING, false)] {
        for (key, cfg) in inner.store.list(ADMISSION_REGISTRATION, plural, None) {
            for w in cfg
                .get("webhooks")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                // Validation on write keeps unparseable webhooks out of the store.
                if let Some(hook) = parse_webhook(mutating, &key.3, w) {
                    out.push(hook);
                }
            }
        }
    }
    out
}

/// Whether writes of this type skip webhooks: the webhook configurations themselves, as the real
/// server exempts them so that a broken webhook can always be removed.
pub fn is_exempt(rt: &ResourceType) -> bool {
    rt.group == ADMISSION_REGISTRATION
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

fn validate_url(url: &str, path: &str, errs: &mut Vec<FieldError>) {
    const FORM: &str = "; desired format: https://host[/path]";
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    if scheme != "https" {
        errs.push(FieldError::invalid(
            path,
            &json!(scheme),
            &format!("'https' is the only allowed URL scheme{FORM}"),
        ));
    }
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host.is_empty() {
        errs.push(FieldError::invalid(
            path,
            &json!(""),
            &format!("host must be specified{FORM}"),
        ));
    }
    if host.contains('@') {
        errs.push(FieldError::invalid(
            path,
            &json!(host.split('@').next().unwrap_or_default()),
            "user information is not permitted in the URL",
        ));
    }
    if let Some((_, frag)) = rest.split_once('#') {
        errs.push(FieldError::invalid(
            path,
            &json!(frag),
            "fragments are not permitted in the URL",
        ));
    }
    if let Some((_, query)) = rest.split('#').next().unwrap_or_default().split_once('?') {
        errs.push(FieldError::invalid(
            path,
            &json!(query),
            "query parameters are not permitted in the URL",
        ));
    }
}

fn validate_service(svc: &Value, path: &str, errs: &mut Vec<FieldError>) {
    if str_of(svc, "/name").is_empty() {
        errs.push(FieldError::required(
            format!("{path}.name"),
            "service name is required",
        ));
    }
    if str_of(svc, "/namespace").is_empty() {
        errs.push(FieldError::required(
            format!("{path}.namespace"),
            "service namespace is required",
        ));
    }
    if let Some(p) = svc.get("path").and_then(Value::as_str)
        && !p.starts_with('/')
    {
        errs.push(FieldError::invalid(
            format!("{path}.path"),
            &json!(p),
            "must start with a '/'",
        ));
    }
    if let Some(port) = svc.get("port")
        && !port.as_u64().is_some_and(|p| (1..=65535).contains(&p))
    {
        errs.push(FieldError::invalid(
            format!("{path}.port"),
            port,
            "port is not valid: must be between 1 and 65535, inclusive",
        ));
    }
}

fn check_enum(w: &Value, field: &str, path: &str, supported: &[&str], errs: &mut Vec<FieldError>) {
    if let Some(v) = w.get(field)
        && !v.as_str().is_some_and(|s| supported.contains(&s))
    {
        errs.push(FieldError::not_supported(
            format!("{path}.{field}"),
            v,
            supported,
        ));
    }
}

fn validate_webhook(w: &Value, mutating: bool, path: &str, errs: &mut Vec<FieldError>) {
    let name = str_of(w, "/name");
    if name.is_empty() {
        errs.push(FieldError::required(format!("{path}.name"), ""));
    } else if !is_dns_subdomain(name) {
        errs.push(FieldError::invalid(
            format!("{path}.name"),
            &json!(name),
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        ));
    } else if name.split('.').count() < 3 {
        errs.push(FieldError::invalid(
            format!("{path}.name"),
            &json!(name),
            "should be a domain with at least three segments separated by dots",
        ));
    }
    for (i, rule) in w
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = format!("{path}.rules[{i}]");
        let ops = crate::strings(rule.get("operations"));
        if ops.is_empty() {
            errs.push(FieldError::required(format!("{at}.operations"), ""));
        }
        if ops.len() > 1 && ops.iter().any(|o| o == "*") {
            errs.push(FieldError::invalid(
                format!("{at}.operations"),
                &json!(ops),
                "if '*' is present, must not specify other operations",
            ));
        }
        for (j, op) in ops.iter().enumerate() {
            const OPS: [&str; 5] = ["*", "CONNECT", "CREATE", "DELETE", "UPDATE"];
            if !OPS.contains(&op.as_str()) {
                errs.push(FieldError::not_supported(
                    format!("{at}.operations[{j}]"),
                    &json!(op),
                    &OPS,
                ));
            }
        }
        for field in ["apiGroups", "apiVersions", "resources"] {
            if crate::strings(rule.get(field)).is_empty() {
                errs.push(FieldError::required(format!("{at}.{field}"), ""));
            }
        }
        check_enum(rule, "scope", &at, &["*", "Cluster", "Namespaced"], errs);
    }
    check_enum(w, "failurePolicy", path, &["Fail", "Ignore"], errs);
    check_enum(w, "matchPolicy", path, &["Equivalent", "Exact"], errs);
    if w.get("sideEffects").is_none_or(Value::is_null) {
        errs.push(FieldError::required(
            format!("{path}.sideEffects"),
            "must specify one of None, NoneOnDryRun",
        ));
    } else {
        check_enum(w, "sideEffects", path, &["None", "NoneOnDryRun"], errs);
    }
    if let Some(t) = w.get("timeoutSeconds")
        && !t.as_i64().is_some_and(|t| (1..=30).contains(&t))
    {
        errs.push(FieldError::invalid(
            format!("{path}.timeoutSeconds"),
            t,
            "the timeout value must be between 1 and 30 seconds",
        ));
    }
    for field in ["namespaceSelector", "objectSelector"] {
        if let Some(sel) = w.get(field)
            && let Err(e) = LabelSelector::from_object(sel, &format!("{path}.{field}"))
        {
            errs.extend(e);
        }
    }
    if mutating {
        check_enum(w, "reinvocationPolicy", path, &["IfNeeded", "Never"], errs);
    }
    let cc = w.get("clientConfig").cloned().unwrap_or(Value::Null);
    let url = cc.get("url").filter(|v| !v.is_null());
    let svc = cc.get("service").filter(|v| !v.is_null());
    match (url, svc) {
        (Some(u), None) => validate_url(
            u.as_str().unwrap_or_default(),
            &format!("{path}.clientConfig.url"),
            errs,
        ),
        (None, Some(s)) => validate_service(s, &format!("{path}.clientConfig.service"), errs),
        _ => errs.push(FieldError::required(
            format!("{path}.clientConfig"),
            "exactly one of url or service is required",
        )),
    }
    if let Some(b) = cc.get("caBundle").and_then(Value::as_str)
        && base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b).is_err()
    {
        errs.push(FieldError::invalid(
            format!("{path}.clientConfig.caBundle"),
            &json!(b),
            "illegal base64 data",
        ));
    }
    let versions = crate::strings(w.get("admissionReviewVersions"));
    if versions.is_empty() {
        errs.push(FieldError::required(
            format!("{path}.admissionReviewVersions"),
            "must specify one of v1, v1beta1",
        ));
    } else if !versions.iter().any(|v| v == "v1" || v == "v1beta1") {
        errs.push(FieldError::invalid(
            format!("{path}.admissionReviewVersions"),
            &json!(versions),
            "must include at least one of v1, v1beta1",
        ));
    }
    // The fake has no CEL: a webhook whose matchConditions it would ignore is refused rather than
    // called for requests a real server would not send it.
    if w.get("matchConditions")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
    {
        errs.push(FieldError::forbidden(
            format!("{path}.matchConditions"),
            "matchConditions are not supported by kube-fake",
        ));
    }
}

fn default_webhook(w: &mut Value, mutating: bool) {
    let Some(m) = w.as_object_mut() else {
        return;
    };
    m.entry("failurePolicy").or_insert(json!("Fail"));
    m.entry("matchPolicy").or_insert(json!("Equivalent"));
    m.entry("namespaceSelector").or_insert(json!({}));
    m.entry("objectSelector").or_insert(json!({}));
    m.entry("timeoutSeconds").or_insert(json!(10));
    if mutating {
        m.entry("reinvocationPolicy").or_insert(json!("Never"));
    }
    if let Some(Value::Array(rules)) = m.get_mut("rules") {
        for r in rules.iter_mut().filter_map(Value::as_object_mut) {
            r.entry("scope").or_insert(json!("*"));
        }
    }
    if let Some(svc) = m
        .get_mut("clientConfig")
        .and_then(|c| c.get_mut("service"))
        .and_then(Value::as_object_mut)
    {
        svc.entry("port").or_insert(json!(443));
    }
}

/// Defaults and validates a webhook configuration on write, as the real registry does.
pub fn admit_config(rt: &ResourceType, name: &str, obj: &mut Value) -> Result<(), ApiError> {
    let mutating = rt.plural == MUTATING;
    let mut errs = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    if let Some(Value::Array(hooks)) = obj.get_mut("webhooks") {
        for (i, w) in hooks.iter_mut().enumerate() {
            default_webhook(w, mutating);
            let path = format!("webhooks[{i}]");
            validate_webhook(w, mutating, &path, &mut errs);
            let hook_name = str_of(w, "/name").to_string();
            if !hook_name.is_empty() {
                if seen.contains(&hook_name) {
                    errs.push(FieldError {
                        reason: "FieldValueDuplicate",
                        field: format!("{path}.name"),
                        message: format!("Duplicate value: {}", json!(hook_name)),
                    });
                } else {
                    seen.push(hook_name);
                }
            }
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(&rt.kind, &rt.group, name, &errs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_rule(ops: &[&str], resources: &[&str], scope: &str) -> Rule {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect();
        Rule {
            operations: v(ops),
            api_groups: v(&[""]),
            api_versions: v(&["v1"]),
            resources: v(resources),
            scope: scope.into(),
        }
    }

    fn mk_attrs<'a>(op: &'a str, resource: &'a str, sub: &'a str, ns: &'a str) -> Attributes<'a> {
        Attributes {
            operation: op,
            group: "",
            version: "v1",
            resource,
            subresource: sub,
            namespace: ns,
        }
    }

    #[test]
    fn resources_and_subresources_match_like_the_real_matcher() {
        let a = mk_attrs("UPDATE", "services", "", "default");
        let status = mk_attrs("UPDATE", "services", "status", "default");
        for (resources, main, sub) in [
            (&["services"][..], true, false),
            (&["*"][..], true, false),
            (&["services/status"][..], false, true),
            (&["*/status"][..], false, true),
            // As in the real matcher's code, `res/*` also matches the resource itself.
            (&["services/*"][..], true, true),
            (&["*/*"][..], true, true),
            (&["secrets"][..], false, false),
        ] {
            let r = mk_rule(&["*"], resources, "*");
            assert_eq!(
                (r.matches(&a), r.matches(&status)),
                (main, sub),
                "{resources:?}"
            );
        }
        assert!(!mk_rule(&["CREATE"], &["services"], "*").matches(&a));
    }

    #[test]
    fn scope_treats_namespaces_as_cluster_scoped() {
        let ns = mk_attrs("CREATE", "namespaces", "", "team");
        let cm = mk_attrs("CREATE", "configmaps", "", "team");
        let cluster = mk_attrs("CREATE", "clusterthings", "", "");
        let rule = |scope| mk_rule(&["CREATE"], &["*"], scope);
        assert!(rule("Cluster").matches(&ns) && !rule("Namespaced").matches(&ns));
        assert!(!rule("Cluster").matches(&cm) && rule("Namespaced").matches(&cm));
        assert!(rule("Cluster").matches(&cluster) && !rule("Namespaced").matches(&cluster));
    }

    #[test]
    fn configurations_are_defaulted_and_validated() {
        let types = crate::registry::builtins();
        let Some(rt) = types.iter().find(|t| t.plural == VALIDATING) else {
            panic!("validating configurations are served");
        };
        let mut ok = json!({"webhooks": [{"name": "a.b.example.com", "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "rules": [{"operations": ["CREATE"], "apiGroups": [""],
            "apiVersions": ["v1"], "resources": ["configmaps"]}],
            "clientConfig": {"service": {"namespace": "ns", "name": "svc"}}}]});
        assert!(admit_config(rt, "cfg", &mut ok).is_ok());
        assert_eq!(
            ok.pointer("/webhooks/0/failurePolicy"),
            Some(&json!("Fail"))
        );
        assert_eq!(ok.pointer("/webhooks/0/timeoutSeconds"), Some(&json!(10)));
        assert_eq!(ok.pointer("/webhooks/0/rules/0/scope"), Some(&json!("*")));
        assert_eq!(
            ok.pointer("/webhooks/0/clientConfig/service/port"),
            Some(&json!(443))
        );
        let mut bad = json!({"webhooks": [{"name": "short", "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": "http://x/y"}}]});
        let msg = admit_config(rt, "cfg", &mut bad).err().map(|e| e.message);
        assert_eq!(
            msg.as_deref(),
            Some(
                "ValidatingWebhookConfiguration.admissionregistration.k8s.io \"cfg\" is invalid: [webhooks[0].name: Invalid value: \"short\": should be a domain with at least three segments separated by dots, webhooks[0].sideEffects: Required value: must specify one of None, NoneOnDryRun, webhooks[0].clientConfig.url: Invalid value: \"http\": 'https' is the only allowed URL scheme; desired format: https://host[/path]]"
            )
        );
    }
}
