//! POST and GET read the same fields the same way: for any field values (and any letter case of
//! the field names), the JSON body and the percent-encoded query give the same request or the same
//! error.
#![no_main]

use arbitrary::Arbitrary;
use harvester_cloud::kubeconfig::request;
use libfuzzer_sys::fuzz_target;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};

mod oracle;

#[derive(Arbitrary, Debug)]
struct Fields {
    /// Values of namespace, serviceAccountName, clusterRoleName, csiClusterRoleName, outputFormat.
    values: [Option<String>; 5],
    /// One bit per field: send its name upper-cased (names match case-insensitively).
    upper: u8,
}

const NAMES: [&str; 5] = [
    "namespace",
    "serviceAccountName",
    "clusterRoleName",
    "csiClusterRoleName",
    "outputFormat",
];

fuzz_target!(|f: Fields| {
    let mut body = serde_json::Map::new();
    let mut query = Vec::new();
    for (i, (name, value)) in NAMES.iter().zip(&f.values).enumerate() {
        let Some(value) = value else { continue };
        let name = if f.upper & (1 << i) != 0 {
            name.to_uppercase()
        } else {
            name.to_string()
        };
        body.insert(name.clone(), value.clone().into());
        query.push(format!(
            "{name}={}",
            utf8_percent_encode(value, NON_ALPHANUMERIC)
        ));
    }
    let body = serde_json::Value::Object(body).to_string();
    let query = query.join("&");
    let from_body = request::from_json(body.as_bytes());
    let from_query = request::from_query(Some(&query));
    assert_eq!(from_body, from_query, "body {body} / query {query}");
    if let Ok(req) = &from_body {
        oracle::check_accepted(req);
    }
});
