//! An IPPool's VM network, as upstream's IPPool mutator judges it (`pkg/utils/vid.go`, `GetVid`,
//! and `pkg/webhook/ippool/mutator.go`): `selector.network` is `namespace/name` or empty; the VLAN
//! ID is the NetworkAttachmentDefinition's `network.harvesterhci.io/vlan-id` label (an integer as
//! Go's `strconv.Atoi` reads one), else the `vlan` of its CNI config (which must be JSON); and the
//! labels the mutator sets from them.

use serde_json::Value;

use crate::crd::{
    IPPool,
    keys::{LABEL_GLOBAL_POOL, LABEL_VID, LABEL_VLAN_ID},
    kinds::NetworkAttachmentDefinition,
};

/// Why an IPPool's VM network is refused, wrapped as upstream's mutator wraps it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetworkError {
    #[error("can't create IP pool {pool} because {source}")]
    Create {
        pool: String,
        source: NetworkRejection,
    },
    #[error("can't update IP pool {pool} because {source}")]
    Update {
        pool: String,
        source: NetworkRejection,
    },
}

impl NetworkError {
    pub fn new(pool: &str, create: bool, source: NetworkRejection) -> Self {
        let pool = pool.to_string();
        if create {
            NetworkError::Create { pool, source }
        } else {
            NetworkError::Update { pool, source }
        }
    }
}

/// The upstream refusals (but [`NetworkRejection::Config`], whose text upstream takes from Go's JSON
/// decoder).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetworkRejection {
    #[error("invalid network {0}")]
    Format(String),
    #[error("network-attachment-definitions.k8s.cni.cncf.io \"{0}\" not found")]
    NotFound(String),
    #[error("invalid vlan {0}")]
    Vlan(String),
    #[error("the config of network-attachment-definition {network} does not decode: {reason}")]
    Config { network: String, reason: String },
}

/// `selector.network` split into namespace and name: `None` for no network, a refusal unless it
/// has exactly one `/` (either side may be empty: the lookup then finds nothing, as upstream's).
pub(crate) fn network_ref(network: &str) -> Result<Option<(&str, &str)>, NetworkRejection> {
    if network.is_empty() {
        return Ok(None);
    }
    match network.split('/').collect::<Vec<_>>().as_slice() {
        [namespace, name] => Ok(Some((namespace, name))),
        _ => Err(NetworkRejection::Format(network.into())),
    }
}

/// The VLAN ID of a VM network: its label, else its CNI config's `vlan` (0 when the config has
/// none).
pub(crate) fn vlan_id(nad: &NetworkAttachmentDefinition) -> Result<i64, NetworkRejection> {
    if let Some(label) = nad.label(LABEL_VLAN_ID) {
        return atoi(label).ok_or_else(|| NetworkRejection::Vlan(label.into()));
    }
    let config = nad
        .pointer("/spec/config")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let network = format!(
        "{}/{}",
        nad.metadata.namespace.as_deref().unwrap_or_default(),
        nad.metadata.name.as_deref().unwrap_or_default()
    );
    let invalid = |reason: String| NetworkRejection::Config {
        network: network.clone(),
        reason,
    };
    let parsed: Value = serde_json::from_str(config).map_err(|e| invalid(e.to_string()))?;
    let fields = match &parsed {
        Value::Object(fields) => fields,
        // Decoding `null` into a struct leaves it as it is.
        Value::Null => return Ok(0),
        other => return Err(invalid(format!("{other} is not an object"))),
    };
    // Go matches a field name exactly, else case-insensitively.
    let vlan = fields.get("vlan").or_else(|| {
        fields
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("vlan"))
            .map(|(_, v)| v)
    });
    match vlan {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => n
            .as_i64()
            .ok_or_else(|| invalid(format!("vlan {n} overflows an int"))),
        Some(other) => Err(invalid(format!("vlan {other} is not an integer"))),
    }
}

/// Go's `strconv.Atoi`: an optional sign and decimal digits, within 64 bits.
fn atoi(text: &str) -> Option<i64> {
    let digits = text.strip_prefix(['+', '-']).unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Upstream's IPPool mutator: the VLAN ID and global labels.
pub fn mutate_pool(pool: &mut IPPool, vid: i64) {
    if pool.metadata.deletion_timestamp.is_some() {
        return;
    }
    let global = pool.spec.selector.is_global();
    let labels = pool.metadata.labels.get_or_insert_default();
    labels.insert(LABEL_VID.into(), vid.to_string());
    labels.insert(LABEL_GLOBAL_POOL.into(), global.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_nad(labels: serde_json::Value, config: Option<&str>) -> NetworkAttachmentDefinition {
        let mut spec = serde_json::json!({});
        if let Some(c) = config {
            spec["config"] = c.into();
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "vlan10", "namespace": "default", "labels": labels},
            "spec": spec,
        }))
        .expect("nad")
    }

    // pkg/utils/vid.go (GetVid): `strings.Split(network, "/")` must give two fields.
    #[test]
    fn networks_are_namespace_slash_name() {
        assert_eq!(network_ref(""), Ok(None));
        assert_eq!(
            network_ref("default/vlan10"),
            Ok(Some(("default", "vlan10")))
        );
        assert_eq!(network_ref("/vlan10"), Ok(Some(("", "vlan10"))));
        for bad in ["vlan10", "a/b/c", "default/vlan10/"] {
            assert_eq!(
                network_ref(bad).expect_err("refused").to_string(),
                format!("invalid network {bad}")
            );
        }
        assert_eq!(
            NetworkError::new("p", true, NetworkRejection::Format("x".into())).to_string(),
            "can't create IP pool p because invalid network x"
        );
        assert_eq!(
            NetworkError::new("p", false, NetworkRejection::NotFound("vlan9".into())).to_string(),
            "can't update IP pool p because network-attachment-definitions.k8s.cni.cncf.io \"vlan9\" not found"
        );
    }

    // pkg/utils/vid.go (GetVid): the label through strconv.Atoi ("invalid vlan %s"), else the
    // config's vlan through json.Unmarshal into `struct{ VLAN int }`.
    #[test]
    fn the_vlan_id_is_the_label_else_the_config() {
        let label = |v: &str| mk_nad(serde_json::json!({LABEL_VLAN_ID: v}), None);
        assert_eq!(vlan_id(&label("10")), Ok(10));
        assert_eq!(vlan_id(&label("+7")), Ok(7));
        assert_eq!(vlan_id(&label("007")), Ok(7));
        assert_eq!(vlan_id(&label("-3")), Ok(-3));
        for bad in ["", "ten", "1.5", " 5", "5 ", "0x10", "99999999999999999999"] {
            assert_eq!(
                vlan_id(&label(bad)),
                Err(NetworkRejection::Vlan(bad.into())),
                "{bad:?}"
            );
        }
        let config = |c: &str| mk_nad(serde_json::json!({}), Some(c));
        assert_eq!(vlan_id(&config(r#"{"type":"bridge","vlan":10}"#)), Ok(10));
        assert_eq!(vlan_id(&config(r#"{"type":"bridge"}"#)), Ok(0));
        assert_eq!(vlan_id(&config(r#"{"VLAN":12}"#)), Ok(12));
        assert_eq!(vlan_id(&config(r#"{"vlan":null}"#)), Ok(0));
        assert_eq!(vlan_id(&config("null")), Ok(0));
        for bad in [
            "",
            "not json",
            "[1]",
            r#"{"vlan":"10"}"#,
            r#"{"vlan":1.5}"#,
            r#"{"vlan":10.0}"#,
        ] {
            assert!(
                matches!(vlan_id(&config(bad)), Err(NetworkRejection::Config { .. })),
                "{bad:?}"
            );
        }
        assert!(
            matches!(
                vlan_id(&mk_nad(serde_json::json!({}), None)),
                Err(NetworkRejection::Config { .. })
            ),
            "no config at all is no JSON"
        );
    }
}
