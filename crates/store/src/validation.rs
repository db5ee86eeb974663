//! Kubernetes name rules (RFC 1123 labels and subdomains), label keys and values (qualified names)
//! with the API server's own wording, so a rejected name reads the same here as from `kubectl`;
//! Go's quoting of the values those messages show; and the random suffixes of generated names.

use rand::Rng;

pub(crate) const DNS1123_LABEL_MAX: usize = 63;
pub(crate) const DNS1123_SUBDOMAIN_MAX: usize = 253;

const LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const SUBDOMAIN_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";

fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Checks an RFC 1123 label (namespaces, most names); returns the API server's message on failure.
pub fn dns1123_label(s: &str) -> Result<(), String> {
    if s.len() > DNS1123_LABEL_MAX {
        return Err(format!(
            "must be no more than {DNS1123_LABEL_MAX} characters"
        ));
    }
    if !is_label(s) {
        return Err(format!(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '{LABEL_FMT}')"
        ));
    }
    Ok(())
}

/// Checks an RFC 1123 subdomain (service accounts, secrets, bindings).
pub fn dns1123_subdomain(s: &str) -> Result<(), String> {
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        return Err(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX} characters"
        ));
    }
    if s.is_empty() || !s.split('.').all(is_label) {
        return Err(format!(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '{SUBDOMAIN_FMT}')"
        ));
    }
    Ok(())
}

/// Checks a name that only has to be a usable URL path segment (RBAC objects, e.g.
/// `harvesterhci.io:cloudprovider`).
pub(crate) fn path_segment_name(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("name or generateName is required".into());
    }
    if s == "." || s == ".." {
        return Err(format!("may not be '{s}'"));
    }
    for bad in ["/", "%"] {
        if s.contains(bad) {
            return Err(format!("may not contain '{bad}'"));
        }
    }
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        return Err(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX} characters"
        ));
    }
    Ok(())
}

/// The label key's name part (apimachinery `content.labelKeyFmt`).
const LABEL_KEY_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_KEY_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_MAX: usize = 63;

/// apimachinery's `RegexError`: the message, its examples and the regex.
fn regex_error(msg: &str, re: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{msg} (regex used for validation is '{re}')");
    }
    let examples: Vec<String> = examples.iter().map(|e| format!("'{e}', ")).collect();
    format!(
        "{msg} (e.g. {}regex used for validation is '{re}')",
        examples.join(" or ")
    )
}

/// `^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`
fn is_label_key_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// The messages of apimachinery's `content.IsDNS1123Subdomain` (label key prefixes: lengths in
/// bytes, and every failed rule, where [`dns1123_subdomain`] keeps the name rules' wording).
fn content_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        errs.push(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX} bytes"
        ));
    }
    if s.is_empty() || !s.split('.').all(is_label) {
        errs.push(regex_error(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

/// Checks a qualified name (label and annotation keys, finalizer names): every message
/// apimachinery's `IsQualifiedName` gives, in its order; empty when valid.
pub(crate) fn qualified_name(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts[..] {
        [name] => name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(
                    content_subdomain(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            name
        }
        _ => {
            errs.push(format!(
                "a valid label key {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(LABEL_KEY_MSG, LABEL_KEY_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".into());
    } else if name.len() > LABEL_VALUE_MAX {
        errs.push(format!(
            "name part must be no more than {LABEL_VALUE_MAX} bytes"
        ));
    }
    if !is_label_key_name(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                LABEL_KEY_MSG,
                LABEL_KEY_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

/// Checks a label value: every message apimachinery's `IsValidLabelValue` gives; empty when valid.
pub fn label_value(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > LABEL_VALUE_MAX {
        errs.push(format!("must be no more than {LABEL_VALUE_MAX} bytes"));
    }
    if !value.is_empty() && !is_label_key_name(value) {
        errs.push(regex_error(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            &format!("({LABEL_KEY_FMT})?"),
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// Go's `%q` of a string (`strconv.Quote`), as the API server shows a refused value. Go keeps what
/// `unicode.IsPrint` accepts; without Unicode's category tables this escapes the controls, every
/// space but U+0020, the format characters Kubernetes users meet (soft hyphen, zero-width and
/// direction marks, BOM), surrogates, private use and noncharacters; an unassigned code point is
/// kept where Go would escape it.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if !go_printable(c) => {
                if (c as u32) < 0x10000 {
                    out.push_str(&format!("\\u{:04x}", c as u32));
                } else {
                    out.push_str(&format!("\\U{:08x}", c as u32));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn go_printable(c: char) -> bool {
    let u = c as u32;
    if c == ' ' {
        return true;
    }
    !(c.is_control()
        || c.is_whitespace()
        || matches!(u, 0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x180e
            | 0x200b..=0x200f | 0x202a..=0x202e | 0x2060..=0x2064 | 0x2066..=0x206f
            | 0xfeff | 0xfff9..=0xfffb | 0xe000..=0xf8ff | 0xf0000..=0x10ffff
            | 0xfdd0..=0xfdef)
        || u & 0xfffe == 0xfffe)
}

/// A string as Go's `encoding/json` writes it (it escapes `<`, `>` and `&` for HTML, and U+2028
/// and U+2029), for messages that show a refused value as JSON.
pub fn go_json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The alphabet of generated name suffixes (`generateName`, token names): `[a-z0-9]`.
pub const NAME_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// `n` random characters from `[a-z0-9]`, as Kubernetes appends them to a `generateName`.
pub fn random_alnum(n: usize) -> String {
    random_from(NAME_ALPHABET, n)
}

/// `n` random characters from `alphabet` (ASCII).
pub fn random_from(alphabet: &[u8], n: usize) -> String {
    let mut rng = rand::rng();
    (0..n)
        .map(|_| alphabet[rng.random_range(0..alphabet.len())] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        for ok in ["a", "gc-test", "0", "a1-b2", &"x".repeat(63)] {
            assert!(dns1123_label(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"x".repeat(64), "ä"] {
            assert!(dns1123_label(bad).is_err(), "{bad}");
        }
        assert_eq!(
            dns1123_label(&"x".repeat(64)).unwrap_err(),
            "must be no more than 63 characters"
        );
    }

    #[test]
    fn path_segments() {
        assert!(path_segment_name("harvesterhci.io:cloudprovider").is_ok());
        for bad in ["", ".", "..", "a/b", "a%b"] {
            assert!(path_segment_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn subdomains() {
        for ok in [
            "a",
            "a.b",
            "harvester-cloud-provider",
            "a-1.b-2.c",
            &"x".repeat(253),
        ] {
            assert!(dns1123_subdomain(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".a",
            "a.",
            "a..b",
            "A.b",
            "a_b",
            "a b",
            &"x".repeat(254),
        ] {
            assert!(dns1123_subdomain(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn qualified_names_as_apimachinery() {
        for ok in [
            "a",
            "app.kubernetes.io/name",
            "cloudprovider.harvesterhci.io/cluster",
            "A_b.C-1",
            &"x".repeat(63),
            &format!("{}/x", "a".repeat(253)),
        ] {
            assert!(qualified_name(ok).is_empty(), "{ok}");
        }
        let name_part = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
        assert_eq!(qualified_name("a b"), [name_part]);
        assert_eq!(
            qualified_name(""),
            ["name part must be non-empty", name_part]
        );
        assert_eq!(qualified_name("/x"), ["prefix part must be non-empty"]);
        assert_eq!(
            qualified_name(&"x".repeat(64)),
            ["name part must be no more than 63 bytes"]
        );
        assert_eq!(
            qualified_name("Example.com/x"),
            [
                "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            ]
        );
        assert_eq!(qualified_name("a/b/c").len(), 1);
        assert!(qualified_name("a/b/c")[0].starts_with("a valid label key must consist"));
    }

    #[test]
    fn label_values_as_apimachinery() {
        for ok in ["", "a", "My_value.1", &"x".repeat(63)] {
            assert!(label_value(ok).is_empty(), "{ok}");
        }
        assert_eq!(
            label_value("<b> x"),
            [
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
            ]
        );
        assert_eq!(
            label_value(&"x".repeat(64)),
            ["must be no more than 63 bytes"]
        );
        assert_eq!(label_value(&format!("-{}", "x".repeat(63))).len(), 2);
    }

    #[test]
    fn quoting_as_go() {
        assert_eq!(go_quote("<b> x"), "\"<b> x\"");
        assert_eq!(
            go_quote("a\"b\\c\n\u{0}\u{7f}"),
            "\"a\\\"b\\\\c\\n\\x00\\x7f\""
        );
        assert_eq!(go_quote("‹img é›"), "\"‹img é›\"");
        assert_eq!(
            go_quote("\u{200b}\u{a0}\u{feff}"),
            "\"\\u200b\\u00a0\\ufeff\""
        );
        assert_eq!(go_quote("\u{10ffff}"), "\"\\U0010ffff\"");
        assert_eq!(
            go_json_string("<a&b>\u{1}"),
            "\"\\u003ca\\u0026b\\u003e\\u0001\""
        );
    }
}
