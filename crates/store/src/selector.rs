//! Kubernetes label selectors: parsing the string form (`a=b,c!=d,e in (f,g),!h`) and matching labels.

use std::collections::BTreeMap;

use serde_json::Value;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A conjunction of label requirements; the empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid label selector {selector:?}: {reason}")]
pub struct SelectorError {
    pub selector: String,
    pub reason: String,
}

impl LabelSelector {
    pub fn everything() -> Self {
        Self::default()
    }

    /// Selects objects whose labels include all of `labels`.
    pub fn from_labels<'a>(labels: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        LabelSelector {
            requirements: labels
                .into_iter()
                .map(|(k, v)| Requirement::Equals(k.to_string(), v.to_string()))
                .collect(),
        }
    }

    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let err = |reason: &str| SelectorError {
            selector: s.to_string(),
            reason: reason.to_string(),
        };
        let mut requirements = Vec::new();
        for term in split_terms(s).map_err(&err)? {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let req = if let Some(key) = term.strip_prefix('!') {
                Requirement::DoesNotExist(valid_key(key.trim()).map_err(&err)?)
            } else if let Some((k, v)) = term.split_once("!=") {
                Requirement::NotEquals(valid_key(k.trim()).map_err(&err)?, v.trim().into())
            } else if let Some((k, v)) = term.split_once("==") {
                Requirement::Equals(valid_key(k.trim()).map_err(&err)?, v.trim().into())
            } else if let Some((k, v)) = term.split_once('=') {
                Requirement::Equals(valid_key(k.trim()).map_err(&err)?, v.trim().into())
            } else if let Some((k, set)) = split_set(term, " notin ") {
                Requirement::NotIn(valid_key(k).map_err(&err)?, parse_set(set).map_err(&err)?)
            } else if let Some((k, set)) = split_set(term, " in ") {
                Requirement::In(valid_key(k).map_err(&err)?, parse_set(set).map_err(&err)?)
            } else {
                Requirement::Exists(valid_key(term).map_err(&err)?)
            };
            requirements.push(req);
        }
        Ok(LabelSelector { requirements })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        })
    }

    /// Matches the `metadata.labels` of a JSON object.
    pub(crate) fn matches_object(&self, object: &Value) -> bool {
        if self.requirements.is_empty() {
            return true;
        }
        let labels: BTreeMap<String, String> = object
            .pointer("/metadata/labels")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        self.matches(&labels)
    }
}

impl std::fmt::Display for LabelSelector {
    /// The string form Kubernetes accepts in `labelSelector`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let terms: Vec<String> = self
            .requirements
            .iter()
            .map(|r| match r {
                Requirement::Equals(k, v) => format!("{k}={v}"),
                Requirement::NotEquals(k, v) => format!("{k}!={v}"),
                Requirement::In(k, vs) => format!("{k} in ({})", vs.join(",")),
                Requirement::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
                Requirement::Exists(k) => k.clone(),
                Requirement::DoesNotExist(k) => format!("!{k}"),
            })
            .collect();
        f.write_str(&terms.join(","))
    }
}

/// Splits on commas that are not inside a `( … )` set.
fn split_terms(s: &str) -> Result<Vec<&str>, &'static str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err("unbalanced parentheses");
                }
            }
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unbalanced parentheses");
    }
    out.push(&s[start..]);
    Ok(out)
}

fn split_set<'a>(term: &'a str, op: &str) -> Option<(&'a str, &'a str)> {
    term.split_once(op).map(|(k, v)| (k.trim(), v.trim()))
}

fn parse_set(set: &str) -> Result<Vec<String>, &'static str> {
    let inner = set
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or("a set must be written as (a,b)")?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

fn valid_key(k: &str) -> Result<String, &'static str> {
    if k.is_empty() || k.chars().any(|c| c.is_whitespace() || "()!=,".contains(c)) {
        return Err("a label key must be non-empty and contain no spaces or operators");
    }
    Ok(k.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_and_matches_every_operator() {
        let l = mk_labels(&[("app", "web"), ("tier", "front")]);
        let yes = [
            "",
            "app=web",
            "app==web",
            "app!=db",
            "app in (web, db)",
            "app notin (db)",
            "tier",
            "!missing",
            "app=web,tier in (front)",
            "missing notin (x)",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&l), "{s}");
        }
        let no = [
            "app=db",
            "app!=web",
            "app in (db)",
            "app notin (web)",
            "missing",
            "!app",
        ];
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&l), "{s}");
        }
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "",
            "a=b",
            "a!=b",
            "a in (x,y)",
            "a notin (x)",
            "a",
            "!a",
            "a=b,c in (d)",
        ] {
            let sel = LabelSelector::parse(s).unwrap();
            assert_eq!(LabelSelector::parse(&sel.to_string()).unwrap(), sel, "{s}");
        }
    }

    #[test]
    fn rejects_malformed_selectors() {
        for s in ["app in (a", "a)", "=x", "app in a,b"] {
            assert!(LabelSelector::parse(s).is_err(), "{s}");
        }
    }
}
