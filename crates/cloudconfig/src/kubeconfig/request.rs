//! Parsing and validation of a cloud-config request, with the leniency Harvester's clients rely on:
//! the JSON body is read like Go's `encoding/json` decoder (first value only, case-insensitive field
//! names, unknown fields ignored, `null` as empty), the GET query like `url.ParseQuery`.

use std::{fmt, time::Duration};

use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;

use crate::validation;

pub(crate) const CLOUDPROVIDER_ROLE: &str = "harvesterhci.io:cloudprovider";
pub(crate) const CSI_DRIVER_ROLE: &str = "harvesterhci.io:csi-driver";

/// What the response body carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// The kubeconfig text as a JSON string (`application/json`).
    Kubeconfig,
    /// Cloud-init user data (`outputFormat=yaml`).
    CloudInit,
}

/// A validated request for the cloud-config of one service account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountRequest {
    pub namespace: String,
    pub service_account: String,
    pub output: OutputFormat,
    /// `expirationSeconds`: a new token stops working this long after it is issued (none: never,
    /// as Harvester's).
    pub expiration: Option<Duration>,
    /// `gracePeriod` (rotate only): how long the replaced token keeps working; `None` for the
    /// service's default.
    pub grace: Option<Duration>,
    /// `cloudConfigPath`: the one path the cloud-init output writes the kubeconfig to, instead of
    /// Harvester's two.
    pub cloud_config_path: Option<String>,
}

/// The shortest `expirationSeconds`: the sweeper's precision is about a second, and a shorter
/// lifetime cannot be used before it ends.
pub(crate) const MIN_EXPIRATION: Duration = Duration::from_secs(10);
/// The longest `expirationSeconds` (ten years) and `gracePeriod` accepted at all; the service's
/// `--max-rotation-grace` bounds the grace further.
pub(crate) const MAX_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// The longest `cloudConfigPath` (Linux's PATH_MAX).
pub(crate) const MAX_PATH: usize = 4096;

/// A request that cannot be served; the message keeps Harvester's wording.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("fail to decode request: {reason}")]
pub struct RequestError {
    pub reason: String,
}

fn err(reason: impl Into<String>) -> RequestError {
    RequestError {
        reason: reason.into(),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Namespace,
    ServiceAccountName,
    ClusterRoleName,
    CsiClusterRoleName,
    OutputFormat,
    ExpirationSeconds,
    GracePeriod,
    CloudConfigPath,
}

impl Field {
    const ALL: [(Field, &'static str); 8] = [
        (Field::Namespace, "namespace"),
        (Field::ServiceAccountName, "serviceAccountName"),
        (Field::ClusterRoleName, "clusterRoleName"),
        (Field::CsiClusterRoleName, "csiClusterRoleName"),
        (Field::OutputFormat, "outputFormat"),
        (Field::ExpirationSeconds, "expirationSeconds"),
        (Field::GracePeriod, "gracePeriod"),
        (Field::CloudConfigPath, "cloudConfigPath"),
    ];

    /// An exact name wins; otherwise names match case-insensitively, as Go's decoder does.
    fn lookup(key: &str) -> Option<(Field, &'static str)> {
        Field::ALL
            .iter()
            .find(|(_, n)| *n == key)
            .or_else(|| Field::ALL.iter().find(|(_, n)| n.eq_ignore_ascii_case(key)))
            .copied()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Fields {
    namespace: String,
    service_account: String,
    cluster_role: String,
    csi_cluster_role: String,
    output_format: String,
    /// Our fields, as given (text: a query's value, or a JSON number or string).
    expiration_seconds: Option<String>,
    grace_period: Option<String>,
    cloud_config_path: Option<String>,
}

impl Fields {
    fn set(&mut self, field: Field, value: String) {
        match field {
            Field::Namespace => self.namespace = value,
            Field::ServiceAccountName => self.service_account = value,
            Field::ClusterRoleName => self.cluster_role = value,
            Field::CsiClusterRoleName => self.csi_cluster_role = value,
            Field::OutputFormat => self.output_format = value,
            Field::ExpirationSeconds => self.expiration_seconds = Some(value),
            Field::GracePeriod => self.grace_period = Some(value),
            Field::CloudConfigPath => self.cloud_config_path = Some(value),
        }
    }
}

fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The first JSON value of a body, read without failing on what Go would accept.
enum Decoded {
    Fields(Fields),
    /// The first field whose value is not a string (Go reports the first type error).
    WrongFieldType {
        field: &'static str,
        found: &'static str,
        want: &'static str,
    },
    NotAnObject(&'static str),
}

impl<'de> Deserialize<'de> for Decoded {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Decoded;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Decoded, A::Error> {
                let mut fields = Fields::default();
                let mut type_error = None;
                while let Some(key) = map.next_key::<String>()? {
                    let value: Value = map.next_value()?;
                    let Some((field, name)) = Field::lookup(&key) else {
                        continue;
                    };
                    match value {
                        Value::String(s) if field != Field::ExpirationSeconds => {
                            fields.set(field, s)
                        }
                        // Our two durations: a number of seconds (gracePeriod also a string).
                        Value::Number(n)
                            if matches!(field, Field::ExpirationSeconds | Field::GracePeriod) =>
                        {
                            fields.set(field, n.to_string())
                        }
                        // Go leaves a string field untouched for a JSON null.
                        Value::Null => {}
                        other => {
                            // Go names the field by its tag, upstream's is `csiclusterRoleName`.
                            let tag = if field == Field::CsiClusterRoleName {
                                "csiclusterRoleName"
                            } else {
                                name
                            };
                            let want = match field {
                                Field::ExpirationSeconds => "int64",
                                Field::GracePeriod => "int64 or duration string",
                                _ => "string",
                            };
                            type_error.get_or_insert((tag, go_type(&other), want));
                        }
                    }
                }
                Ok(match type_error {
                    Some((field, found, want)) => Decoded::WrongFieldType { field, found, want },
                    None => Decoded::Fields(fields),
                })
            }
            fn visit_unit<E>(self) -> Result<Decoded, E> {
                Ok(Decoded::Fields(Fields::default()))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Decoded, E> {
                Ok(Decoded::NotAnObject("bool"))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Decoded, E> {
                Ok(Decoded::NotAnObject("number"))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Decoded, E> {
                Ok(Decoded::NotAnObject("number"))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Decoded, E> {
                Ok(Decoded::NotAnObject("number"))
            }
            fn visit_str<E>(self, _: &str) -> Result<Decoded, E> {
                Ok(Decoded::NotAnObject("string"))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Decoded, A::Error> {
                while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                Ok(Decoded::NotAnObject("array"))
            }
        }
        d.deserialize_any(V)
    }
}

impl AccountRequest {
    /// A request for the raw kubeconfig of `service_account` in `namespace`, validated as the API
    /// validates it.
    pub fn new(namespace: &str, service_account: &str) -> Result<Self, RequestError> {
        validate(Fields {
            namespace: namespace.into(),
            service_account: service_account.into(),
            ..Default::default()
        })
    }
}

/// Parses a POST body.
pub fn from_json(body: &[u8]) -> Result<AccountRequest, RequestError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(err("EOF: the request body is empty; send a JSON object"));
    }
    let first = serde_json::Deserializer::from_slice(body)
        .into_iter::<Decoded>()
        .next();
    let fields = match first {
        Some(Ok(Decoded::Fields(f))) => f,
        Some(Ok(Decoded::WrongFieldType { field, found, want })) => {
            return Err(err(format!(
                "json: cannot unmarshal {found} into Go struct field req.{field} of type {want}"
            )));
        }
        Some(Ok(Decoded::NotAnObject(found))) => {
            return Err(err(format!(
                "json: cannot unmarshal {found} into Go value of type kubeconfig.req"
            )));
        }
        Some(Err(e)) if e.is_eof() => {
            return Err(err(format!(
                "unexpected EOF: the JSON body is incomplete ({e})"
            )));
        }
        Some(Err(e)) => return Err(err(format!("the body is not valid JSON: {e}"))),
        None => return Err(err("EOF: the request body is empty; send a JSON object")),
    };
    validate(fields)
}

/// Parses a GET query string (everything after `?`) as upstream reads it (Go's `URL.Query()`,
/// harvester `pkg/api/kubeconfig/generate_handler.go` `decodeGetRequest`): a pair Go cannot parse
/// (a `;` in it, a bad `%` escape) is dropped rather than failing the request, the first value of a
/// repeated name wins, and `clusterRoleName`/`csiClusterRoleName` are ignored (upstream forces the
/// cloud-provider role on GET). Unlike upstream (`Query().Get` is exact), names also match
/// case-insensitively when no exact one is given.
pub fn from_query(query: Option<&str>) -> Result<AccountRequest, RequestError> {
    let mut exact: Vec<Option<String>> = vec![None; Field::ALL.len()];
    let mut folded: Vec<Option<String>> = vec![None; Field::ALL.len()];
    for pair in query.unwrap_or_default().split('&') {
        if pair.is_empty() || pair.contains(';') {
            continue;
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (Some(k), Some(v)) = (unescape(k), unescape(v)) else {
            continue;
        };
        let Some((field, name)) = Field::lookup(&k) else {
            continue;
        };
        if matches!(field, Field::ClusterRoleName | Field::CsiClusterRoleName) {
            continue;
        }
        let idx = Field::ALL
            .iter()
            .position(|(f, _)| *f == field)
            .unwrap_or(0);
        // The first value of a repeated parameter wins.
        let slot = if k == name {
            &mut exact[idx]
        } else {
            &mut folded[idx]
        };
        slot.get_or_insert(v);
    }
    let mut fields = Fields::default();
    for (i, (field, _)) in Field::ALL.iter().enumerate() {
        if let Some(v) = exact[i].take().or_else(|| folded[i].take()) {
            fields.set(*field, v);
        }
    }
    validate(fields)
}

/// `url.QueryUnescape`: `+` is a space, `%XX` a byte; `None` for a malformed escape. Bytes that are
/// not UTF-8 are kept as replacement characters (a name made of them fails validation).
fn unescape(s: &str) -> Option<String> {
    query_unescape(s).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// The bytes of `url.QueryUnescape`: `+` is a space, `%XX` a byte; `None` for a malformed escape.
pub(crate) fn query_unescape(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = b
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    Some(out)
}

fn shown(v: &str) -> String {
    const MAX: usize = 80;
    if v.chars().count() <= MAX {
        v.to_string()
    } else {
        format!("{}…", v.chars().take(MAX).collect::<String>())
    }
}

fn validate(f: Fields) -> Result<AccountRequest, RequestError> {
    if f.namespace.is_empty() || f.service_account.is_empty() {
        return Err(err(
            "invalid request: namespace and serviceAccountName cannot be empty",
        ));
    }
    if !f.cluster_role.is_empty() && f.cluster_role != CLOUDPROVIDER_ROLE {
        return Err(err(format!(
            "invalid request: clusterRoleName can only be {CLOUDPROVIDER_ROLE}"
        )));
    }
    if !f.csi_cluster_role.is_empty() && f.csi_cluster_role != CSI_DRIVER_ROLE {
        return Err(err(format!(
            "invalid request: csiClusterRoleName can only be {CSI_DRIVER_ROLE}"
        )));
    }
    validation::dns1123_label(&f.namespace).map_err(|e| {
        err(format!(
            "invalid request: namespace {:?} is not a valid namespace name: {e}",
            shown(&f.namespace)
        ))
    })?;
    validation::dns1123_subdomain(&f.service_account).map_err(|e| {
        err(format!(
            "invalid request: serviceAccountName {:?} is not a valid service account name: {e}",
            shown(&f.service_account)
        ))
    })?;
    let expiration = f
        .expiration_seconds
        .as_deref()
        .map(|v| {
            let secs = v
                .parse::<u64>()
                .ok()
                .map(Duration::from_secs)
                .filter(|d| (MIN_EXPIRATION..=MAX_LIFETIME).contains(d));
            secs.ok_or_else(|| {
                err(format!(
                    "invalid request: expirationSeconds {:?} must be a whole number of seconds from {} to {}",
                    shown(v),
                    MIN_EXPIRATION.as_secs(),
                    MAX_LIFETIME.as_secs()
                ))
            })
        })
        .transpose()?;
    let grace = f
        .grace_period
        .as_deref()
        .map(|v| {
            parse_duration(v)
                .filter(|d| *d <= MAX_LIFETIME)
                .ok_or_else(|| {
                    err(format!(
                        "invalid request: gracePeriod {:?} must be a number of seconds or a duration such as \"90s\", \"30m\" or \"1h30m\"",
                        shown(v)
                    ))
                })
        })
        .transpose()?;
    let cloud_config_path = f
        .cloud_config_path
        .map(|p| check_path(&p).map(|()| p))
        .transpose()?;
    Ok(AccountRequest {
        namespace: f.namespace,
        service_account: f.service_account,
        // Exactly `yaml`, case-sensitive, as upstream; anything else is the raw kubeconfig.
        output: if f.output_format == "yaml" {
            OutputFormat::CloudInit
        } else {
            OutputFormat::Kubeconfig
        },
        expiration,
        grace,
        cloud_config_path,
    })
}

/// A number of seconds, or a Go-style duration of `h`, `m` and `s` parts (`1h30m`, `90s`).
fn parse_duration(v: &str) -> Option<Duration> {
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let mut total: u64 = 0;
    let mut digits = String::new();
    let mut parts = 0;
    for c in v.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
        let n: u64 = digits.parse().ok()?;
        total = total.checked_add(n.checked_mul(unit)?)?;
        digits.clear();
        parts += 1;
    }
    (digits.is_empty() && parts > 0).then(|| Duration::from_secs(total))
}

/// YAML's printable set (YAML 1.1 and 1.2, as PyYAML checks it).
fn yaml_printable(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{7E}' | '\u{85}' | '\u{A0}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// One of Unicode's 66 noncharacters.
fn noncharacter(c: char) -> bool {
    let v = u32::from(c);
    (0xFDD0..=0xFDEF).contains(&v) || v & 0xFFFE == 0xFFFE
}

/// `cloudConfigPath`: absolute, normalised (no `.` or `..` part, no empty part, no trailing
/// `/`), printable without spaces (cloud-init writes it as given), at most [`MAX_PATH`] bytes.
fn check_path(p: &str) -> Result<(), RequestError> {
    let bad = |why: &str| {
        Err(err(format!(
            "invalid request: cloudConfigPath {:?} {why}",
            shown(p)
        )))
    };
    if p.is_empty() {
        return bad("is empty; leave it out for Harvester's two paths");
    }
    if !p.starts_with('/') {
        return bad("is not an absolute path");
    }
    if p.len() > MAX_PATH {
        return bad(&format!("is longer than {MAX_PATH} bytes"));
    }
    if p.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return bad("has a space or a control character");
    }
    // cloud-init reads its user data with PyYAML, which refuses what YAML does not call printable
    // (U+FFFE and U+FFFF among them) in any scalar; the other Unicode noncharacters are no one's
    // file name either.
    if let Some(c) = p.chars().find(|&c| !yaml_printable(c) || noncharacter(c)) {
        return bad(&format!(
            "has U+{:04X}, which cloud-init's YAML cannot carry",
            u32::from(c)
        ));
    }
    if p == "/" || p.ends_with('/') {
        return bad("names a directory, not a file");
    }
    if p[1..]
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return bad("is not normalised (an empty, \".\" or \"..\" part)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_ok(ns: &str, sa: &str, output: OutputFormat) -> Result<AccountRequest, RequestError> {
        Ok(AccountRequest {
            namespace: ns.into(),
            service_account: sa.into(),
            output,
            expiration: None,
            grace: None,
            cloud_config_path: None,
        })
    }

    fn reason(r: Result<AccountRequest, RequestError>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn lifecycle_fields() {
        let body = |extra: &str| {
            format!(r#"{{"namespace":"a","serviceAccountName":"b"{extra}}}"#).into_bytes()
        };
        let ok = from_json(&body(
            r#","expirationSeconds":3600,"gracePeriod":"1h30m","cloudConfigPath":"/opt/rke2/cfg""#,
        ))
        .unwrap();
        assert_eq!(ok.expiration, Some(Duration::from_secs(3600)));
        assert_eq!(ok.grace, Some(Duration::from_secs(5400)));
        assert_eq!(ok.cloud_config_path.as_deref(), Some("/opt/rke2/cfg"));
        assert_eq!(
            from_json(&body(r#","gracePeriod":0"#)).unwrap().grace,
            Some(Duration::ZERO)
        );
        assert_eq!(
            from_json(&body(r#","gracePeriod":"90s""#)).unwrap().grace,
            Some(Duration::from_secs(90))
        );
        let cases = [
            (
                r#","expirationSeconds":"60""#,
                "json: cannot unmarshal string into Go struct field req.expirationSeconds of type int64",
            ),
            (
                r#","expirationSeconds":9"#,
                "expirationSeconds \"9\" must be a whole number of seconds from 10",
            ),
            (
                r#","expirationSeconds":-60"#,
                "expirationSeconds \"-60\" must be",
            ),
            (
                r#","expirationSeconds":1.5"#,
                "expirationSeconds \"1.5\" must be",
            ),
            (
                r#","gracePeriod":"1d""#,
                "gracePeriod \"1d\" must be a number of seconds or a duration",
            ),
            (
                r#","gracePeriod":true"#,
                "cannot unmarshal bool into Go struct field req.gracePeriod",
            ),
            (r#","cloudConfigPath":"""#, "cloudConfigPath \"\" is empty"),
            (r#","cloudConfigPath":"etc/cfg""#, "is not an absolute path"),
            (r#","cloudConfigPath":"/etc/""#, "names a directory"),
            (
                r#","cloudConfigPath":"/etc/../root/cfg""#,
                "is not normalised",
            ),
            (r#","cloudConfigPath":"/etc//cfg""#, "is not normalised"),
            (
                r#","cloudConfigPath":"/etc/cfg\uffff""#,
                "has U+FFFF, which cloud-init's YAML cannot carry",
            ),
            (
                r#","cloudConfigPath":"/etc/\ufffecfg""#,
                "has U+FFFE, which cloud-init's YAML cannot carry",
            ),
            (
                r#","cloudConfigPath":"/etc/\ufdd0""#,
                "has U+FDD0, which cloud-init's YAML cannot carry",
            ),
            (
                r#","cloudConfigPath":"/etc/\ud83f\udfff""#,
                "has U+1FFFF, which cloud-init's YAML cannot carry",
            ),
            (
                r#","cloudConfigPath":"/etc/a b""#,
                "has a space or a control character",
            ),
            (
                r#","cloudConfigPath":7"#,
                "cannot unmarshal number into Go struct field req.cloudConfigPath of type string",
            ),
        ];
        for (extra, want) in cases {
            let got = reason(from_json(&body(extra)));
            assert!(got.contains(want), "{extra}: {got}");
        }
        // The query reads them too (a GET's cloud-init output honours the path).
        let q = from_query(Some(
            "namespace=a&serviceAccountName=b&cloudConfigPath=%2Fopt%2Fcfg",
        ))
        .unwrap();
        assert_eq!(q.cloud_config_path.as_deref(), Some("/opt/cfg"));
        assert!(
            reason(from_query(Some(
                "namespace=a&serviceAccountName=b&cloudConfigPath="
            )))
            .contains("is empty")
        );
    }

    #[test]
    fn dashboard_body() {
        let body = br#"{"csiClusterRoleName":"harvesterhci.io:csi-driver","clusterRoleName":"harvesterhci.io:cloudprovider","namespace":"default","serviceAccountName":"gc4"}"#;
        assert_eq!(
            from_json(body),
            mk_ok("default", "gc4", OutputFormat::Kubeconfig)
        );
    }

    #[test]
    fn lenient_json() {
        use OutputFormat::*;
        let cases: &[(&[u8], Result<AccountRequest, RequestError>)] = &[
            (br#"{"Namespace":"a","SERVICEACCOUNTNAME":"b"}"#, mk_ok("a", "b", Kubeconfig)),
            (br#"{"namespace":"a","serviceAccountName":"b","x":[1,{"y":2}]}"#, mk_ok("a", "b", Kubeconfig)),
            (br#"{"namespace":"a","serviceAccountName":"b"} trailing garbage"#, mk_ok("a", "b", Kubeconfig)),
            (br#"{"namespace":"a","serviceAccountName":"b"}{"namespace":"c"}"#, mk_ok("a", "b", Kubeconfig)),
            (br#"{"namespace":"a","serviceAccountName":"b","outputFormat":"yaml"}"#, mk_ok("a", "b", CloudInit)),
            (br#"{"namespace":"a","serviceAccountName":"b","outputFormat":"YAML"}"#, mk_ok("a", "b", Kubeconfig)),
            (br#"{"namespace":"a","serviceAccountName":"b","clusterRoleName":null}"#, mk_ok("a", "b", Kubeconfig)),
            (br#"{"namespace":"a","serviceAccountName":"b","csiclusterRoleName":"harvesterhci.io:csi-driver"}"#, mk_ok("a", "b", Kubeconfig)),
            // The exact name wins over a case-insensitive one, whatever the order.
            (br#"{"NAMESPACE":"x","namespace":"a","serviceAccountName":"b"}"#, mk_ok("a", "b", Kubeconfig)),
        ];
        for (body, want) in cases {
            assert_eq!(&from_json(body), want, "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn json_errors_keep_upstream_wording() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "fail to decode request: EOF"),
            (b"  \n", "fail to decode request: EOF"),
            (
                b"null",
                "fail to decode request: invalid request: namespace and serviceAccountName cannot be empty",
            ),
            (
                b"{}",
                "fail to decode request: invalid request: namespace and serviceAccountName cannot be empty",
            ),
            (
                br#"{"namespace":1,"serviceAccountName":"b"}"#,
                "fail to decode request: json: cannot unmarshal number into Go struct field req.namespace of type string",
            ),
            (
                br#"{"namespace":"a","serviceAccountName":true}"#,
                "fail to decode request: json: cannot unmarshal bool into Go struct field req.serviceAccountName of type string",
            ),
            (
                br#"[1,2]"#,
                "fail to decode request: json: cannot unmarshal array into Go value of type kubeconfig.req",
            ),
            (
                br#""x""#,
                "fail to decode request: json: cannot unmarshal string into Go value of type kubeconfig.req",
            ),
            (
                br#"{"namespace":"a","#,
                "fail to decode request: unexpected EOF",
            ),
            (
                br#"{namespace:"a"}"#,
                "fail to decode request: the body is not valid JSON",
            ),
            (
                br#"{"namespace":"a","serviceAccountName":"b","clusterRoleName":"admin"}"#,
                "fail to decode request: invalid request: clusterRoleName can only be harvesterhci.io:cloudprovider",
            ),
            (
                br#"{"namespace":"a","serviceAccountName":"b","csiClusterRoleName":"admin"}"#,
                "fail to decode request: invalid request: csiClusterRoleName can only be harvesterhci.io:csi-driver",
            ),
            (
                br#"{"namespace":"Bad_NS","serviceAccountName":"b"}"#,
                "fail to decode request: invalid request: namespace \"Bad_NS\" is not a valid namespace name: a lowercase RFC 1123 label",
            ),
            (
                br#"{"namespace":"a","serviceAccountName":"b/c"}"#,
                "fail to decode request: invalid request: serviceAccountName \"b/c\" is not a valid service account name: a lowercase RFC 1123 subdomain",
            ),
            (
                b"{\"namespace\":\"\xff\"}",
                "fail to decode request: the body is not valid JSON",
            ),
        ];
        for (body, want) in cases {
            let got = reason(from_json(body));
            assert!(
                got.starts_with(want),
                "{}: {got}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn query_strings() {
        use OutputFormat::*;
        assert_eq!(
            from_query(Some("namespace=a&serviceAccountName=b")),
            mk_ok("a", "b", Kubeconfig)
        );
        assert_eq!(
            from_query(Some("NAMESPACE=a&serviceaccountname=b&outputFormat=yaml")),
            mk_ok("a", "b", CloudInit)
        );
        assert_eq!(
            from_query(Some("namespace=a&namespace=z&serviceAccountName=b")),
            mk_ok("a", "b", Kubeconfig)
        );
        assert_eq!(
            from_query(Some("Namespace=z&namespace=a&serviceAccountName=b")),
            mk_ok("a", "b", Kubeconfig)
        );
        assert_eq!(
            from_query(Some("namespace=%61&serviceAccountName=b&&x")),
            mk_ok("a", "b", Kubeconfig)
        );
        assert!(
            reason(from_query(None)).ends_with("namespace and serviceAccountName cannot be empty")
        );
        // Go's URL.Query() drops what it cannot parse: a bad escape or a `;` loses that pair only.
        assert!(
            reason(from_query(Some("namespace=%zz&serviceAccountName=b")))
                .ends_with("namespace and serviceAccountName cannot be empty")
        );
        assert_eq!(
            from_query(Some("namespace=a&serviceAccountName=b&foo=%zz&x=1;2")),
            mk_ok("a", "b", Kubeconfig)
        );
        // GET ignores the role names, as upstream forces them.
        assert_eq!(
            from_query(Some(
                "namespace=a&serviceAccountName=b&clusterRoleName=x&csiClusterRoleName=y"
            )),
            mk_ok("a", "b", Kubeconfig)
        );
        assert!(
            reason(from_query(Some("namespace=%ff&serviceAccountName=b")))
                .contains("is not a valid namespace name")
        );
        assert!(
            reason(from_query(Some("namespace=a+b&serviceAccountName=b")))
                .contains("namespace \"a b\"")
        );
        assert!(
            reason(from_query(Some("namespace=a;serviceAccountName=b")))
                .ends_with("namespace and serviceAccountName cannot be empty")
        );
    }
}
