//! Byte-exact output of the cloud-config API: the kubeconfig text (as client-go writes it through
//! sigs.k8s.io/yaml), the cloud-init `write_files` user data, and the raw body as a Go-encoded JSON
//! string. Templates live in `templates/`.

use base64::{Engine, engine::general_purpose::STANDARD as B64};

const KUBECONFIG_TEMPLATE: &str = include_str!("../../templates/kubeconfig.yaml");
const CLOUD_INIT_TEMPLATE: &str = include_str!("../../templates/cloud-init.yaml");

/// Fills `{{name}}` placeholders. A line whose placeholder value is empty is dropped, as an empty
/// field is omitted from the JSON that client-go turns into YAML.
fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len() + 256);
    'lines: for line in template.split_inclusive('\n') {
        let mut line = line.to_string();
        for (name, value) in values {
            let placeholder = format!("{{{{{name}}}}}");
            if line.contains(&placeholder) {
                if value.is_empty() {
                    continue 'lines;
                }
                line = line.replace(&placeholder, value);
            }
        }
        out.push_str(&line);
    }
    out
}

/// The kubeconfig of a service account: cluster, user and context all named `default`.
pub fn kubeconfig(server: &str, ca: &[u8], namespace: &str, token: &str) -> String {
    // Empty fields are omitted (client-go's omitempty), so an empty CA drops its line.
    let ca_data = if ca.is_empty() {
        String::new()
    } else {
        yaml_scalar(&B64.encode(ca))
    };
    fill(
        KUBECONFIG_TEMPLATE,
        &[
            ("ca_data", &ca_data),
            ("server", &yaml_scalar(server)),
            ("namespace", &yaml_scalar(namespace)),
            ("token", &yaml_scalar(token)),
        ],
    )
}

/// Cloud-init user data writing the kubeconfig to both the legacy and the RKE2 path (Harvester's
/// output, byte for byte), or to `path` alone (a request's `cloudConfigPath`).
pub fn cloud_init(kubeconfig: &str, path: Option<&str>) -> String {
    let content = B64.encode(kubeconfig);
    let Some(path) = path else {
        return fill(CLOUD_INIT_TEMPLATE, &[("content", &content)]);
    };
    // The template's first entry, with the path replaced: the same header, the same fields.
    let mut out = String::new();
    let mut entries = 0;
    for line in CLOUD_INIT_TEMPLATE.split_inclusive('\n') {
        if line.starts_with("- ") {
            entries += 1;
        }
        if entries > 1 {
            break;
        }
        if line.trim_start().starts_with("path: ") {
            out.push_str(&format!("  path: {}\n", yaml_scalar(path)));
        } else {
            out.push_str(&line.replace("{{content}}", &content));
        }
    }
    out
}

/// Go's `encoding/json` string encoding (the body of a served kubeconfig is one).
pub use crate::validation::go_json_string;

/// A YAML scalar as go-yaml v2 emits a string in block context: plain when that reads back as the
/// same string, double-quoted when plain text would resolve to another type (`123`, `true`, `null`,
/// `2024-01-02`), single-quoted when the characters rule out plain style.
pub(crate) fn yaml_scalar(s: &str) -> String {
    if resolves_to_non_string(s) || is_base60_float(s) {
        return double_quoted(s);
    }
    if plain_allowed(s) {
        return s.to_string();
    }
    if s.chars().any(|c| c.is_control()) {
        return double_quoted(s);
    }
    format!("'{}'", s.replace('\'', "''"))
}

fn double_quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\x{:02X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// go-yaml v2 `resolve("", s) != strTag`.
fn resolves_to_non_string(s: &str) -> bool {
    const MAP: &[&str] = &[
        "y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON", "n", "N", "no",
        "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF", "", "~", "null", "Null",
        "NULL", ".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf",
        "-.Inf", "-.INF", "<<",
    ];
    let Some(first) = s.bytes().next() else {
        return true;
    };
    let hint = match first {
        b'+' | b'-' => 'S',
        b'0'..=b'9' => 'D',
        b'y' | b'Y' | b'n' | b'N' | b't' | b'T' | b'f' | b'F' | b'o' | b'O' | b'~' | b'<' => 'M',
        b'.' => '.',
        _ => return false,
    };
    if MAP.contains(&s) {
        return true;
    }
    match hint {
        '.' => go_parse_float(s),
        'D' | 'S' => {
            if is_timestamp(s) {
                return true;
            }
            let plain = s.replace('_', "");
            go_parse_int_base0(&plain)
                || (is_yaml_style_float(&plain) && go_parse_float(&plain))
                || plain
                    .strip_prefix("0b")
                    .or_else(|| plain.strip_prefix("-0b"))
                    .is_some_and(|b| !b.is_empty() && b.bytes().all(|c| c == b'0' || c == b'1'))
        }
        _ => false,
    }
}

/// `strconv.ParseInt(s, 0, 64)` or `ParseUint` succeeds (ignoring range, which only matters for
/// digit strings that the float rule then catches anyway).
fn go_parse_int_base0(s: &str) -> bool {
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (digits, radix) = if let Some(r) = unsigned
        .strip_prefix("0x")
        .or_else(|| unsigned.strip_prefix("0X"))
    {
        (r, 16)
    } else if let Some(r) = unsigned
        .strip_prefix("0o")
        .or_else(|| unsigned.strip_prefix("0O"))
    {
        (r, 8)
    } else if let Some(r) = unsigned
        .strip_prefix("0b")
        .or_else(|| unsigned.strip_prefix("0B"))
    {
        (r, 2)
    } else if unsigned.len() > 1 && unsigned.starts_with('0') {
        (&unsigned[1..], 8)
    } else {
        (unsigned, 10)
    };
    !digits.is_empty() && digits.chars().all(|c| c.is_digit(radix))
}

/// `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`
fn is_yaml_style_float(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let mantissa_ok = if let Some(frac) = mantissa.strip_prefix('.') {
        !frac.is_empty() && frac.bytes().all(|c| c.is_ascii_digit())
    } else {
        let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        !int.is_empty()
            && int.bytes().all(|c| c.is_ascii_digit())
            && frac.bytes().all(|c| c.is_ascii_digit())
    };
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['+', '-']).unwrap_or(e);
        !e.is_empty() && e.bytes().all(|c| c.is_ascii_digit())
    });
    mantissa_ok && exponent_ok
}

/// `strconv.ParseFloat(s, 64)` succeeds, for the inputs that reach it (already float-shaped, or
/// starting with '.').
fn go_parse_float(s: &str) -> bool {
    s.parse::<f64>().is_ok()
}

/// go-yaml v2 `parseTimestamp`: four digits and '-', then one of its layouts. Only the date-only
/// and date-time layouts can match names; they are checked structurally.
fn is_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = b.iter().take_while(|c| c.is_ascii_digit()).count();
    if digits != 4 || b.get(4) != Some(&b'-') {
        return false;
    }
    let rest = &s[5..];
    let (date, time) = match rest.find(['T', 't', ' ']) {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let Some((month, day)) = date.split_once('-') else {
        return false;
    };
    let num = |x: &str, max: u32| {
        (1..=2).contains(&x.len())
            && x.bytes().all(|c| c.is_ascii_digit())
            && x.parse::<u32>().is_ok_and(|v| v >= 1 && v <= max)
    };
    let year: i32 = s[..4].parse().unwrap_or(0);
    let Ok(m) = month.parse::<u8>() else {
        return false;
    };
    let max_day = time::Month::try_from(m)
        .map(|m| m.length(year) as u32)
        .unwrap_or(0);
    if !num(month, 12) || !num(day, max_day) {
        return false;
    }
    // A date-time needs `15:4:5` at least; anything after the date that is not that fails the parse.
    time.is_none_or(|t| {
        let hms: Vec<&str> = t.splitn(3, ':').collect();
        hms.len() == 3
            && hms[..2]
                .iter()
                .all(|p| (1..=2).contains(&p.len()) && p.bytes().all(|c| c.is_ascii_digit()))
    })
}

fn is_base60_float(s: &str) -> bool {
    // ^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$
    let t = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (head, frac) = match t.split_once('.') {
        Some((h, f)) => (h, Some(f)),
        None => (t, None),
    };
    let mut parts = head.split(':');
    let first = parts.next().unwrap_or_default();
    let rest: Vec<&str> = parts.collect();
    !rest.is_empty()
        && first.bytes().next().is_some_and(|c| c.is_ascii_digit())
        && first.bytes().all(|c| c.is_ascii_digit() || c == b'_')
        && rest.iter().all(|p| {
            let b = p.as_bytes();
            match b.len() {
                1 => b[0].is_ascii_digit(),
                2 => (b'0'..=b'5').contains(&b[0]) && b[1].is_ascii_digit(),
                _ => false,
            }
        })
        && frac.is_none_or(|f| f.bytes().all(|c| c.is_ascii_digit() || c == b'_'))
}

/// libyaml's `analyze_scalar` for a block-context plain scalar, for printable text.
fn plain_allowed(s: &str) -> bool {
    let b = s.as_bytes();
    if b.is_empty() || b[0] == b' ' || b[b.len() - 1] == b' ' {
        return false;
    }
    if s.chars().any(|c| c.is_control() || c == '\u{FEFF}') {
        return false;
    }
    if s.starts_with("---") || s.starts_with("...") {
        return false;
    }
    let followed_by_blank = |i: usize| matches!(b.get(i + 1), None | Some(b' '));
    for (i, &c) in b.iter().enumerate() {
        if i == 0 {
            match c {
                b'#' | b',' | b'[' | b']' | b'{' | b'}' | b'&' | b'*' | b'!' | b'|' | b'>'
                | b'\'' | b'"' | b'%' | b'@' | b'`' => return false,
                b'?' | b':' | b'-' if followed_by_blank(i) => return false,
                _ => {}
            }
        } else {
            match c {
                b':' if followed_by_blank(i) => return false,
                b'#' if b[i - 1] == b' ' => return false,
                _ => {}
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    const WORKED_B64: &str = "YXBpVmVyc2lvbjogdjEKY2x1c3RlcnM6Ci0gY2x1c3RlcjoKICAgIGNlcnRpZmljYXRlLWF1dGhvcml0eS1kYXRhOiBkR1Z6ZEMxallRPT0KICAgIHNlcnZlcjogaHR0cHM6Ly8xOTIuMTY4LjEuMTA6NjQ0MwogIG5hbWU6IGRlZmF1bHQKY29udGV4dHM6Ci0gY29udGV4dDoKICAgIGNsdXN0ZXI6IGRlZmF1bHQKICAgIG5hbWVzcGFjZTogZ2MtdGVzdAogICAgdXNlcjogZGVmYXVsdAogIG5hbWU6IGRlZmF1bHQKY3VycmVudC1jb250ZXh0OiBkZWZhdWx0CmtpbmQ6IENvbmZpZwp1c2VyczoKLSBuYW1lOiBkZWZhdWx0CiAgdXNlcjoKICAgIHRva2VuOiB0ZXN0LXRva2VuCg==";

    fn mk_worked_example() -> String {
        kubeconfig(
            "https://192.168.1.10:6443",
            b"test-ca",
            "gc-test",
            "test-token",
        )
    }

    fn sha256_hex(s: &str) -> String {
        hex::encode(Sha256::digest(s.as_bytes()))
    }

    #[test]
    fn a_cloud_config_path_gives_one_entry_at_that_path() {
        let k = mk_worked_example();
        let b64 = B64.encode(&k);
        let body = cloud_init(&k, Some("/opt/rke2/etc/config-files/cloud-provider-config"));
        assert_eq!(
            body,
            format!(
                "########## cloud-init user data ############\nwrite_files:\n- encoding: b64\n  content: {b64}\n  owner: root:root\n  path: /opt/rke2/etc/config-files/cloud-provider-config\n  permissions: '0644'\n"
            )
        );
        // A path YAML would read as something else is quoted.
        assert!(cloud_init(&k, Some("/a: b#c")).contains("  path: '/a: b#c'\n"));
        // Without one, both of Harvester's paths.
        let both = cloud_init(&k, None);
        assert_eq!(both.matches("path: ").count(), 2);
        assert!(both.contains("path: /etc/kubernetes/cloud-config\n"));
    }

    #[test]
    fn worked_example_kubeconfig_is_byte_exact() {
        let k = mk_worked_example();
        assert_eq!(k.len(), 325);
        assert_eq!(B64.encode(&k), WORKED_B64);
    }

    #[test]
    fn worked_example_raw_body_is_byte_exact() {
        let body = go_json_string(&mk_worked_example());
        assert_eq!(body.len(), 345);
        assert!(body.starts_with("\"apiVersion: v1\\nclusters:\\n- cluster:\\n    certificate-authority-data: dGVzdC1jYQ==\\n"));
        assert!(body.ends_with("token: test-token\\n\""));
        assert_eq!(
            sha256_hex(&body),
            "676ca85077cc4e34f259aeb63e2c4087247deb15b5fe7c897955568ea821b55d"
        );
    }

    #[test]
    fn worked_example_cloud_init_is_byte_exact() {
        let body = cloud_init(&mk_worked_example(), None);
        assert_eq!(body.len(), 1174);
        assert_eq!(
            sha256_hex(&body),
            "849a96966f2b38bcff290ecc733ba8a3e2e141a4ca634605b864b158318fb1d5"
        );
        assert_eq!(body.matches(WORKED_B64).count(), 2);
    }

    #[test]
    fn empty_ca_omits_the_field() {
        let k = kubeconfig("https://x:6443", b"", "ns", "t");
        assert!(!k.contains("certificate-authority-data"));
        assert!(k.contains("    server: https://x:6443\n"));
    }

    #[test]
    fn go_json_escaping() {
        assert_eq!(go_json_string("a\"b\\c\n\r\t"), r#""a\"b\\c\n\r\t""#);
        assert_eq!(go_json_string("<>&"), r#""\u003c\u003e\u0026""#);
        assert_eq!(
            go_json_string("\u{2028}\u{2029}\u{1}"),
            r#""\u2028\u2029\u0001""#
        );
        assert_eq!(go_json_string("é"), "\"é\"");
    }

    #[test]
    fn yaml_scalars_quote_like_go_yaml() {
        let plain = [
            "gc-test",
            "default",
            "a1",
            "x-2024",
            "abc-1e5",
            "https://192.168.1.10:6443",
            "https://[2001:db8::1]:6443",
            "eyJhbGciOi.J9-x_y",
            "dGVzdC1jYQ==",
            "0x",
            "1-2",
            "2024-13-01",
            "2024-02-30",
            "20240-01-01",
        ];
        for s in plain {
            assert_eq!(yaml_scalar(s), s, "{s}");
        }
        let double = [
            "123",
            "0123",
            "08",
            "0x1f",
            "0o17",
            "0b101",
            "1e5",
            "1e-5",
            "12.5",
            "y",
            "n",
            "yes",
            "no",
            "on",
            "off",
            "true",
            "false",
            "null",
            "",
            "~",
            "2024-01-02",
            "2024-1-2",
            "1:20",
            ".5",
        ];
        for s in double {
            assert_eq!(yaml_scalar(s), format!("\"{s}\""), "{s}");
        }
        assert_eq!(yaml_scalar("a: b"), "'a: b'");
        assert_eq!(yaml_scalar("#x"), "'#x'");
        assert_eq!(yaml_scalar("a #b"), "'a #b'");
        assert_eq!(yaml_scalar("it's: x"), "'it''s: x'");
        assert_eq!(yaml_scalar("- x"), "'- x'");
    }
}
