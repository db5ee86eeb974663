//! Label selectors (`=`, `==`, `!=`, `in`, `notin`, exists, `!`exists, `<`, `>`) and field selectors
//! (`metadata.name`, `metadata.namespace` and the few per-type fields the real server supports).

use serde_json::Value;

use crate::status::{ApiError, FieldError};

/// One parsed label requirement.
#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
    Gt(String, i64),
    Lt(String, i64),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<Requirement>);

fn split_top_level(s: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c);
            }
            ')' => {
                depth -= 1;
                cur.push(c);
            }
            ',' if depth == 0 => parts.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    parts.push(cur);
    parts
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 317
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn parse_err(req: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!("unable to parse requirement: {why}: {req:?}"))
}

fn parse_requirement(raw: &str) -> Result<Requirement, ApiError> {
    let req = raw.trim();
    if let Some(key) = req.strip_prefix('!') {
        let key = key.trim();
        return if valid_key(key) {
            Ok(Requirement::NotExists(key.into()))
        } else {
            Err(parse_err(req, "invalid label key"))
        };
    }
    for (op, neg) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((k, v)) = req.split_once(op) {
            let (k, v) = (k.trim(), v.trim());
            if !valid_key(k) {
                return Err(parse_err(req, "invalid label key"));
            }
            if !valid_value(v) {
                return Err(parse_err(req, "invalid label value"));
            }
            return Ok(if neg {
                Requirement::NotEquals(k.into(), v.into())
            } else {
                Requirement::Equals(k.into(), v.into())
            });
        }
    }
    for (op, gt) in [(">", true), ("<", false)] {
        if let Some((k, v)) = req.split_once(op) {
            let k = k.trim();
            let n: i64 = v.trim().parse().map_err(|_| {
                parse_err(
                    req,
                    "for 'Gt', 'Lt' operators, the value must be an integer",
                )
            })?;
            return Ok(if gt {
                Requirement::Gt(k.into(), n)
            } else {
                Requirement::Lt(k.into(), n)
            });
        }
    }
    if let Some(pos) = req.find(|c: char| c.is_whitespace() || c == '(') {
        let key = req[..pos].trim();
        let rest = req[pos..].trim_start();
        let (neg, after) = if let Some(a) = rest.strip_prefix("notin") {
            (true, a)
        } else if let Some(a) = rest.strip_prefix("in") {
            (false, a)
        } else {
            return Err(parse_err(req, "found unexpected token"));
        };
        let inner = after
            .trim()
            .strip_prefix('(')
            .and_then(|s| s.strip_suffix(')'))
            .ok_or_else(|| parse_err(req, "expected a parenthesized list of values"))?;
        if !valid_key(key) {
            return Err(parse_err(req, "invalid label key"));
        }
        let values: Vec<String> = inner
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect();
        if values.iter().any(|v| !valid_value(v)) {
            return Err(parse_err(req, "invalid label value"));
        }
        return Ok(if neg {
            Requirement::NotIn(key.into(), values)
        } else {
            Requirement::In(key.into(), values)
        });
    }
    if valid_key(req) {
        Ok(Requirement::Exists(req.into()))
    } else {
        Err(parse_err(req, "invalid label key"))
    }
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        if s.trim().is_empty() {
            return Ok(Self::default());
        }
        split_top_level(s)
            .iter()
            .map(|r| parse_requirement(r))
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    /// A `metav1.LabelSelector` object (`matchLabels` and `matchExpressions` with `In`, `NotIn`,
    /// `Exists`, `DoesNotExist`), as webhooks' namespace and object selectors carry it; null and `{}`
    /// match everything. `Err` carries the field errors, with paths under `path`.
    pub fn from_object(sel: &Value, path: &str) -> Result<Self, Vec<FieldError>> {
        let mut reqs = Vec::new();
        let mut errs = Vec::new();
        if let Some(labels) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in labels {
                reqs.push(Requirement::Equals(
                    k.clone(),
                    v.as_str().unwrap_or_default().to_string(),
                ));
            }
        }
        let exprs = sel
            .get("matchExpressions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for (i, e) in exprs.iter().enumerate() {
            let key = e
                .get("key")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let values: Vec<String> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            let at = format!("{path}.matchExpressions[{i}]");
            let op = e
                .get("operator")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let needs_values = matches!(op, "In" | "NotIn");
            if needs_values && values.is_empty() {
                errs.push(FieldError::required(
                    format!("{at}.values"),
                    "must be specified when `operator` is 'In' or 'NotIn'",
                ));
            } else if matches!(op, "Exists" | "DoesNotExist") && !values.is_empty() {
                errs.push(FieldError::forbidden(
                    format!("{at}.values"),
                    "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                ));
            }
            match op {
                "In" => reqs.push(Requirement::In(key, values)),
                "NotIn" => reqs.push(Requirement::NotIn(key, values)),
                "Exists" => reqs.push(Requirement::Exists(key)),
                "DoesNotExist" => reqs.push(Requirement::NotExists(key)),
                other => errs.push(FieldError::invalid(
                    format!("{at}.operator"),
                    &Value::String(other.to_string()),
                    "not a valid selector operator",
                )),
            }
        }
        if errs.is_empty() {
            Ok(Self(reqs))
        } else {
            Err(errs)
        }
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        self.matches_labels(obj.pointer("/metadata/labels"))
    }

    /// Whether a label map (`None` when there is none) satisfies every requirement.
    pub fn matches_labels(&self, labels: Option<&Value>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
            Requirement::Gt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x > *n),
            Requirement::Lt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x < *n),
        })
    }
}

/// A parsed field selector over a fixed set of supported field paths.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses `fieldSelector`, rejecting fields the resource does not support as the real server does.
    /// `extra` lists the per-type fields beyond `metadata.name` and `metadata.namespace`.
    pub fn parse(s: &str, extra: &[&str]) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        for raw in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, neg, value) = if let Some((f, v)) = raw.split_once("!=") {
                (f, true, v)
            } else if let Some((f, v)) = raw.split_once("==") {
                (f, false, v)
            } else if let Some((f, v)) = raw.split_once('=') {
                (f, false, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{raw}'"
                )));
            };
            let field = field.trim();
            if field != "metadata.name" && field != "metadata.namespace" && !extra.contains(&field)
            {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            terms.push((field.to_string(), neg, value.trim().to_string()));
        }
        Ok(Self(terms))
    }

    /// Whether the object satisfies every term; a missing field reads as the empty string.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(field, neg, want)| {
            let path = match field.as_str() {
                "source" => "/source/component".to_string(),
                f => format!("/{}", f.replace('.', "/")),
            };
            let got = match obj.pointer(&path) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (got == *want) != *neg
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mk_obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn label_operators() {
        let o = mk_obj(json!({"app": "web", "tier": "front", "n": "5"}));
        for (sel, want) in [
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app in (web, db)", true),
            ("app notin (web)", false),
            ("missing notin (x)", true),
            ("tier", true),
            ("!tier", false),
            ("!missing", true),
            ("app=web,tier=back", false),
            ("app in (web,db),tier in (front)", true),
            ("n>4", true),
            ("n<5", false),
            ("", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).map(|s| s.matches(&o)).ok(),
                Some(want),
                "{sel}"
            );
        }
    }

    #[test]
    fn label_selector_objects() {
        let sel = json!({"matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["back"]},
                                 {"key": "skip", "operator": "DoesNotExist"}]});
        let parsed = LabelSelector::from_object(&sel, "s").ok();
        let m = |labels: Value| parsed.as_ref().map(|s| s.matches(&mk_obj(labels)));
        assert_eq!(m(json!({"app": "web"})), Some(true));
        assert_eq!(m(json!({"app": "web", "tier": "back"})), Some(false));
        assert_eq!(m(json!({"app": "web", "skip": ""})), Some(false));
        assert_eq!(m(json!({"app": "db"})), Some(false));
        let all = LabelSelector::from_object(&Value::Null, "s").ok();
        assert_eq!(all.map(|s| s.matches(&mk_obj(Value::Null))), Some(true));
        let bad = json!({"matchExpressions": [{"key": "a", "operator": "Foo"}]});
        let errs = LabelSelector::from_object(&bad, "webhooks[0].objectSelector").err();
        assert_eq!(
            errs.map(|e| e.iter().map(|f| format!("{}: {}", f.field, f.message)).collect::<Vec<_>>()),
            Some(vec![
                "webhooks[0].objectSelector.matchExpressions[0].operator: Invalid value: \"Foo\": not a valid selector operator".to_string()
            ])
        );
    }

    #[test]
    fn bad_label_selector_is_bad_request() {
        let err = LabelSelector::parse("app in web").err().map(|e| e.code);
        assert_eq!(err, Some(400));
    }

    #[test]
    fn field_selectors() {
        let o = mk_obj(json!({}));
        assert!(
            FieldSelector::parse("metadata.name=a", &[])
                .map(|f| f.matches(&o))
                .unwrap_or(false)
        );
        assert!(
            FieldSelector::parse("metadata.namespace!=x", &[])
                .map(|f| f.matches(&o))
                .unwrap_or(false)
        );
        assert_eq!(
            FieldSelector::parse("spec.x=a", &[])
                .err()
                .map(|e| e.message),
            Some("field label not supported: spec.x".into())
        );
    }
}
