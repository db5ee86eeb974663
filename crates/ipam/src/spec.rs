//! The IPPool `spec` as it travels on the wire: ranges and selector, in the CRD's camelCase JSON.
//!
//! Field order, names and omission rules follow the upstream Go types so a pool written by Harvester
//! round-trips unchanged. These are the IPPool CRD's own types (the CRD module's `IPPoolSpec` embeds
//! them), so their doc comments and schema attributes are the CRD's published schema; nothing here
//! validates.

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

/// `IPPool.spec`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolSpec {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub description: String,
    /// The address ranges (at least one).
    // Required, but `null` reads as empty so that validation can name the problem.
    #[serde(deserialize_with = "null_as_default")]
    pub ranges: Vec<RangeSpec>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub selector: Selector,
}

/// A range of a subnet; an empty start, end or gateway takes the subnet's default.
// The defaults are [`crate::IpRange`]'s.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RangeSpec {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub range_start: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub range_end: String,
    #[serde(deserialize_with = "null_as_default")]
    pub subnet: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub gateway: String,
}

/// `spec.selector`: which load balancers may use the pool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Selector {
    /// Among matching pools the highest wins.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "is_zero"
    )]
    #[schemars(schema_with = "uint32_schema")]
    pub priority: u32,
    /// `namespace/name` of a VM network (NetworkAttachmentDefinition), or empty.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub network: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub scope: Vec<Tuple>,
}

/// One scope entry; `*` matches anything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Tuple {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub project: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub namespace: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub guest_cluster: String,
}

/// The wildcard of scope tuples and requirements.
pub const ALL: &str = "*";

impl Selector {
    /// A global pool has exactly one scope tuple `*`/`*`/`*`, whatever its network; this is what the
    /// upstream mutator turns into the `global-ip-pool=true` label.
    pub fn is_global(&self) -> bool {
        matches!(self.scope.as_slice(), [t] if t.project == ALL && t.namespace == ALL && t.guest_cluster == ALL)
    }
}

/// The address families a pool's ranges cover (a pool may mix them, as upstream's may).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Families {
    pub v4: bool,
    pub v6: bool,
}

impl Families {
    pub fn contains(self, family: super::Family) -> bool {
        match family {
            super::Family::V4 => self.v4,
            super::Family::V6 => self.v6,
        }
    }

    /// Whether two pools could serve a load balancer of the same family.
    pub(crate) fn intersects(self, other: Families) -> bool {
        (self.v4 && other.v4) || (self.v6 && other.v6)
    }

    /// `None` asks for no family in particular, which any pool serves.
    pub fn serves(self, family: Option<super::Family>) -> bool {
        family.is_none_or(|f| self.contains(f))
    }
}

impl PoolSpec {
    /// The families of the ranges whose subnet parses (admission refuses the others).
    pub fn families(&self) -> Families {
        let mut families = Families::default();
        for range in &self.ranges {
            match super::Cidr::parse(&range.subnet).map(|c| c.family()) {
                Some(super::Family::V4) => families.v4 = true,
                Some(super::Family::V6) => families.v6 = true,
                None => {}
            }
        }
        families
    }
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

/// Go's `uint32`, as controller-gen describes it.
fn uint32_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "integer", "format": "int32", "minimum": 0})
}

/// Go clients write `null` for empty slices and maps; read it as the empty value. (The CRD types
/// read every field this way.)
pub fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_round_trips_the_upstream_json_shape() {
        let json = r#"{"ranges":[{"rangeStart":"192.168.0.10","subnet":"192.168.0.0/24"}],"selector":{"priority":3,"network":"default/vlan10","scope":[{"project":"*","namespace":"default","guestCluster":"*"}]}}"#;
        let spec: PoolSpec = serde_json::from_str(json).expect("valid json");
        assert_eq!(spec.ranges[0].range_start, "192.168.0.10");
        assert_eq!(spec.selector.scope[0].guest_cluster, "*");
        assert_eq!(serde_json::to_string(&spec).expect("serialises"), json);
    }

    #[test]
    fn nulls_and_missing_fields_read_as_empty() {
        let spec: PoolSpec =
            serde_json::from_str(r#"{"ranges":null,"selector":{"scope":null,"priority":null}}"#)
                .expect("valid json");
        assert!(spec.ranges.is_empty());
        assert_eq!(spec.selector, Selector::default());
        assert_eq!(
            serde_json::to_string(&spec).expect("serialises"),
            r#"{"ranges":[],"selector":{}}"#
        );
    }

    #[test]
    fn global_means_exactly_one_all_wildcard_tuple() {
        let all = Tuple {
            project: ALL.into(),
            namespace: ALL.into(),
            guest_cluster: ALL.into(),
        };
        let mut selector = Selector {
            scope: vec![all.clone()],
            network: "default/vlan10".into(),
            ..Selector::default()
        };
        assert!(selector.is_global());
        selector.scope.push(all);
        assert!(!selector.is_global());
        selector.scope.truncate(1);
        selector.scope[0].project = "p".into();
        assert!(!selector.is_global());
    }
}
