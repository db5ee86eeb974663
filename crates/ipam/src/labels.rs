//! Pools by Service labels: the IPPool annotation `loadbalancer.harvesterhci.io/serviceSelector`, a
//! Kubernetes label selector in the string form `kubectl -l` takes (`app=web,tier in (a,b),!canary`),
//! matched against the labels of the guest Service a LoadBalancer serves (or the LoadBalancer's own,
//! for one made on Harvester). Ours, not upstream's: upstream's controller ignores the annotation.
//!
//! The grammar and the semantics are Kubernetes' (`k8s.io/apimachinery/pkg/labels`): terms joined by
//! commas, all of which must hold; `key=value` (or `==`), `key!=value` (true when the key is absent),
//! `key in (v1,v2)`, `key notin (v1,v2)` (true when the key is absent), `key` (exists) and `!key`
//! (does not exist). Keys are qualified names (`prefix/name`), values label values, checked as the
//! API server checks them. Kubernetes' `key>1` and `key<1` are refused: a LabelSelector (the
//! structured form MetalLB's `serviceSelectors` and Cilium's `serviceSelector` take) has no such
//! operator. The empty string selects everything.

use std::collections::BTreeMap;
use std::fmt;

/// The pool annotation holding the selector.
pub const SERVICE_SELECTOR: &str = "loadbalancer.harvesterhci.io/serviceSelector";

/// A refused selector: the annotation's value and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {SERVICE_SELECTOR} {selector:?} is not a label selector: {reason}")]
pub struct SelectorError {
    pub selector: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Term {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed selector: every term must hold. The empty selector selects every set of labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceSelector {
    terms: Vec<Term>,
}

impl ServiceSelector {
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let refuse = |reason: String| SelectorError {
            selector: text.into(),
            reason,
        };
        Parser {
            tokens: lex(text),
            at: 0,
        }
        .selector()
        .map_err(refuse)
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.terms.iter().all(|term| match term {
            Term::Equals(k, v) => labels.get(k) == Some(v),
            Term::NotEquals(k, v) => labels.get(k) != Some(v),
            Term::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Term::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Term::Exists(k) => labels.contains_key(k),
            Term::DoesNotExist(k) => !labels.contains_key(k),
        })
    }
}

/// The canonical string form (what `parse` reads back to the same selector).
impl fmt::Display for ServiceSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, term) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match term {
                Term::Equals(k, v) => write!(f, "{k}={v}")?,
                Term::NotEquals(k, v) => write!(f, "{k}!={v}")?,
                Term::In(k, vs) => write!(f, "{k} in ({})", vs.join(","))?,
                Term::NotIn(k, vs) => write!(f, "{k} notin ({})", vs.join(","))?,
                Term::Exists(k) => f.write_str(k)?,
                Term::DoesNotExist(k) => write!(f, "!{k}")?,
            }
        }
        Ok(())
    }
}

/// Labels as messages print them: `app=web,tier=front`, or `(none)`.
pub fn labels_text(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return "(none)".into();
    }
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// A run of characters that are neither blanks nor operators; `in` and `notin` included (they
    /// are keywords only after a key).
    Word(String),
    Not,
    NotEquals,
    Equals,
    Open,
    Close,
    Comma,
    /// `>` or `<`: Kubernetes' numeric comparisons.
    Compare(char),
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Word(w) => write!(f, "{w:?}"),
            Token::Not => f.write_str("'!'"),
            Token::NotEquals => f.write_str("'!='"),
            Token::Equals => f.write_str("'='"),
            Token::Open => f.write_str("'('"),
            Token::Close => f.write_str("')'"),
            Token::Comma => f.write_str("','"),
            Token::Compare(c) => write!(f, "'{c}'"),
        }
    }
}

fn lex(text: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let token = match c {
            c if c.is_whitespace() => continue,
            '!' if chars.peek() == Some(&'=') => {
                chars.next();
                Token::NotEquals
            }
            '!' => Token::Not,
            '=' => {
                if chars.peek() == Some(&'=') {
                    chars.next();
                }
                Token::Equals
            }
            '(' => Token::Open,
            ')' => Token::Close,
            ',' => Token::Comma,
            '<' | '>' => Token::Compare(c),
            c => {
                let mut word = String::from(c);
                while let Some(&next) = chars.peek() {
                    if next.is_whitespace() || "!=(),<>".contains(next) {
                        break;
                    }
                    word.push(next);
                    chars.next();
                }
                Token::Word(word)
            }
        };
        tokens.push(token);
    }
    tokens
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        token
    }

    fn selector(&mut self) -> Result<ServiceSelector, String> {
        let mut terms = Vec::new();
        if self.tokens.is_empty() {
            return Ok(ServiceSelector { terms });
        }
        loop {
            terms.push(self.term()?);
            match self.next() {
                None => return Ok(ServiceSelector { terms }),
                Some(Token::Comma) if self.peek().is_none() => {
                    return Err("a ',' must be followed by another requirement".into());
                }
                Some(Token::Comma) => {}
                Some(other) => return Err(format!("found {other}, expected ',' or the end")),
            }
        }
    }

    fn term(&mut self) -> Result<Term, String> {
        match self.next() {
            Some(Token::Not) => {
                let key = self.key()?;
                Ok(Term::DoesNotExist(key))
            }
            Some(Token::Word(word)) => {
                let key = valid_key(&word)?;
                match self.peek() {
                    None | Some(Token::Comma) => Ok(Term::Exists(key)),
                    Some(Token::Equals) => {
                        self.next();
                        Ok(Term::Equals(key, self.value()?))
                    }
                    Some(Token::NotEquals) => {
                        self.next();
                        Ok(Term::NotEquals(key, self.value()?))
                    }
                    Some(Token::Word(op)) if op == "in" || op == "notin" => {
                        let notin = op == "notin";
                        self.next();
                        let values = self.set()?;
                        Ok(if notin {
                            Term::NotIn(key, values)
                        } else {
                            Term::In(key, values)
                        })
                    }
                    Some(Token::Compare(c)) => Err(format!(
                        "operator '{c}' of {key:?} is not supported: a pool's selector takes =, ==, !=, in, notin, a key (exists) and !key (does not exist)"
                    )),
                    Some(other) => Err(format!(
                        "found {other} after {key:?}, expected =, ==, !=, in, notin, ',' or the end"
                    )),
                }
            }
            Some(other) => Err(format!("found {other}, expected a label key or '!'")),
            None => Err("expected a label key or '!' at the end".into()),
        }
    }

    fn key(&mut self) -> Result<String, String> {
        match self.next() {
            Some(Token::Word(word)) => valid_key(&word),
            Some(other) => Err(format!("found {other}, expected a label key")),
            None => Err("expected a label key at the end".into()),
        }
    }

    /// The value after `=` or `!=`: a word, or the empty value before a ',' or the end.
    fn value(&mut self) -> Result<String, String> {
        match self.peek() {
            None | Some(Token::Comma) => Ok(String::new()),
            Some(Token::Word(_)) => match self.next() {
                Some(Token::Word(word)) => valid_value(&word),
                _ => unreachable!("peeked a word"),
            },
            Some(other) => Err(format!("found {other}, expected a label value")),
        }
    }

    /// `( v1, v2 )`. As Kubernetes reads it: an empty element is the empty value, and `()` is the
    /// set of the empty value.
    fn set(&mut self) -> Result<Vec<String>, String> {
        match self.next() {
            Some(Token::Open) => {}
            Some(other) => return Err(format!("found {other}, expected '(' to open a set")),
            None => return Err("expected '(' to open a set at the end".into()),
        }
        let mut values: Vec<String> = Vec::new();
        let mut push = |value: String| {
            if !values.contains(&value) {
                values.push(value);
            }
        };
        let mut expect_value = true;
        loop {
            match self.next() {
                Some(Token::Close) => {
                    if expect_value {
                        push(String::new());
                    }
                    break;
                }
                Some(Token::Comma) => {
                    if expect_value {
                        push(String::new());
                    }
                    expect_value = true;
                }
                Some(Token::Word(word)) if expect_value => {
                    push(valid_value(&word)?);
                    expect_value = false;
                }
                Some(other) => return Err(format!("found {other} in a set, expected ',' or ')'")),
                None => return Err("a set is not closed with ')'".into()),
            }
        }
        Ok(values)
    }
}

/// A label key as the API server checks it: an optional DNS subdomain prefix and `/`, then a name of
/// at most 63 characters.
fn valid_key(key: &str) -> Result<String, String> {
    let invalid = |why: &str| Err(format!("invalid label key {key:?}: {why}"));
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() || prefix.len() > 253 {
            return invalid("the prefix must be a DNS subdomain of 1 to 253 characters");
        }
        let dns_label_ok = prefix.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
        if !dns_label_ok {
            return invalid(
                "the prefix must be lower-case alphanumerics, '-' and '.', each part starting and ending with an alphanumeric",
            );
        }
    }
    if name.is_empty() {
        return invalid("the name part must not be empty");
    }
    if !name_like(name) {
        return invalid(
            "the name part must be at most 63 alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric",
        );
    }
    Ok(key.into())
}

/// A label value: empty, or at most 63 alphanumerics, '-', '_' or '.', starting and ending with an
/// alphanumeric.
fn valid_value(value: &str) -> Result<String, String> {
    if value.is_empty() || name_like(value) {
        Ok(value.into())
    } else {
        Err(format!(
            "invalid label value {value:?}: at most 63 alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
        ))
    }
}

fn name_like(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
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

    fn mk_selector(text: &str) -> ServiceSelector {
        ServiceSelector::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    fn reason(text: &str) -> String {
        ServiceSelector::parse(text).expect_err("refused").reason
    }

    #[test]
    fn every_operator_matches_as_kubernetes_does() {
        let labels = mk_labels(&[
            ("app", "web"),
            ("tier", "front"),
            ("example.com/team", "a"),
            ("empty", ""),
        ]);
        for yes in [
            "",
            "  ",
            "app=web",
            "app==web",
            "app!=db",
            "missing!=x",
            "app in (web,db)",
            "app in ( db , web )",
            "app notin (db)",
            "missing notin (x)",
            "tier",
            "!missing",
            "example.com/team=a",
            "app=web,tier in (front),!canary",
            "empty=",
            "empty in ()",
            "empty in (x,)",
            "app in (in,notin,web)",
        ] {
            assert!(mk_selector(yes).matches(&labels), "{yes:?} should match");
        }
        for no in [
            "app=db",
            "app!=web",
            "app in (db)",
            "app notin (web)",
            "missing",
            "missing in (x)",
            "missing=",
            "!app",
            "app=web,canary",
            "app=web,tier=back",
        ] {
            assert!(!mk_selector(no).matches(&labels), "{no:?} should not match");
        }
        assert!(mk_selector("").matches(&BTreeMap::new()));
        assert!(mk_selector("").is_empty());
    }

    #[test]
    fn the_canonical_form_reads_back_the_same() {
        for text in [
            "app=web",
            "app==web",
            "a!=b",
            "a in (x, y)",
            "a notin (x)",
            "a",
            "!a",
            "a=b,c in (d),!e",
            "e=",
            "e in (,x)",
        ] {
            let selector = mk_selector(text);
            assert_eq!(mk_selector(&selector.to_string()), selector, "{text:?}");
        }
        assert_eq!(
            mk_selector(" app == web , tier in (a, b) ,! canary ").to_string(),
            "app=web,tier in (a,b),!canary"
        );
    }

    #[test]
    fn malformed_selectors_say_what_is_wrong() {
        assert_eq!(reason("app in (a"), "a set is not closed with ')'");
        assert_eq!(
            reason("app in a"),
            "found \"a\", expected '(' to open a set"
        );
        assert_eq!(reason("=x"), "found '=', expected a label key or '!'");
        assert_eq!(
            reason("a)"),
            "found ')' after \"a\", expected =, ==, !=, in, notin, ',' or the end"
        );
        assert_eq!(
            reason("app=web,"),
            "a ',' must be followed by another requirement"
        );
        assert_eq!(reason(",app"), "found ',', expected a label key or '!'");
        assert_eq!(reason("!"), "expected a label key at the end");
        assert_eq!(reason("app=web=x"), "found '=', expected ',' or the end");
        assert_eq!(reason("app=(x)"), "found '(', expected a label value");
        assert_eq!(
            reason("replicas>1"),
            "operator '>' of \"replicas\" is not supported: a pool's selector takes =, ==, !=, in, notin, a key (exists) and !key (does not exist)"
        );
        assert_eq!(
            reason("app in (a b)"),
            "found \"b\" in a set, expected ',' or ')'"
        );
        assert_eq!(
            reason("app web"),
            "found \"web\" after \"app\", expected =, ==, !=, in, notin, ',' or the end"
        );
    }

    #[test]
    fn keys_and_values_follow_the_api_servers_rules() {
        let long = "a".repeat(64);
        assert!(reason(&format!("{long}=x")).starts_with(&format!("invalid label key \"{long}\"")));
        assert!(
            reason(&format!("a={long}")).starts_with(&format!("invalid label value \"{long}\""))
        );
        for bad_key in [
            "-a",
            "a-",
            "Example.com/a",
            "/a",
            "a/",
            "a/b/c",
            "ex_ample.com/a",
            "a.b./c",
        ] {
            assert!(
                reason(&format!("{bad_key}=x")).starts_with("invalid label key"),
                "{bad_key:?}"
            );
        }
        for bad_value in ["-x", "x-", "x/y", "é"] {
            assert!(
                reason(&format!("a={bad_value}")).starts_with("invalid label value"),
                "{bad_value:?}"
            );
        }
        for good in [
            "a.b-c_d=E.f-G_h",
            "example.com/a=1",
            "a-b.example.com/Name_1=x",
            &format!("{}=x", "a".repeat(63)),
        ] {
            mk_selector(good);
        }
        let e = ServiceSelector::parse("a=é").expect_err("refused");
        assert_eq!(
            e.to_string(),
            "annotation loadbalancer.harvesterhci.io/serviceSelector \"a=é\" is not a label selector: invalid label value \"é\": at most 63 alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
        );
    }

    #[test]
    fn labels_print_sorted_or_as_none() {
        assert_eq!(labels_text(&BTreeMap::new()), "(none)");
        assert_eq!(
            labels_text(&mk_labels(&[("tier", "front"), ("app", "web")])),
            "app=web,tier=front"
        );
    }
}
