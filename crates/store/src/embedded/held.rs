//! How the index and the history hold an object: as the JSON text SQLite stores, parsed when it is
//! read, rather than as a `serde_json::Value` tree, which takes five to ten times the memory of its
//! text (a map node, a key string and a 32-byte `Value` per field). With 100,000 LoadBalancers the
//! trees of the index and of the versions the history retains were most of the store's memory.
//!
//! An object written whole is stored as text, so its text is at hand. An object last written by a
//! status patch (an IP pool, at every allocation round) has only its patch stored: it stays a tree,
//! as serialising a whole pool at each round would cost what the patch saved. Those are few.
//!
//! Reads that repeat on the same version ([`Held::shared`], the cloud-config GET reading an
//! account's objects) keep the tree once parsed, so a hot object is parsed once per version.

use std::sync::{Arc, OnceLock};

use serde_json::Value;

/// An object as the embedded store holds it.
#[derive(Clone, Debug)]
pub(crate) enum Held {
    /// Its JSON text (as stored), parsed on read.
    Text(Arc<Text>),
    /// A tree: an object last written by a status patch.
    Tree(Arc<Value>),
}

#[derive(Debug)]
pub(crate) struct Text {
    json: Box<str>,
    /// The tree, once [`Held::shared`] parsed it.
    parsed: OnceLock<Arc<Value>>,
}

/// A stored object's text that is not a JSON object.
#[derive(Debug)]
pub(crate) struct NotAnObject(pub String);

/// The owners a stored object names (`metadata.ownerReferences[].uid`), read without building
/// its tree.
#[derive(serde::Deserialize)]
struct Skim {
    #[serde(default)]
    metadata: SkimMeta,
}

#[derive(Default, serde::Deserialize)]
struct SkimMeta {
    #[serde(default, rename = "ownerReferences")]
    owner_references: Vec<SkimOwner>,
}

#[derive(serde::Deserialize)]
struct SkimOwner {
    #[serde(default)]
    uid: Option<String>,
}

impl Held {
    /// Text this process serialised from a tree: it parses back.
    pub fn written(json: String) -> Held {
        Held::Text(Arc::new(Text {
            json: json.into_boxed_str(),
            parsed: OnceLock::new(),
        }))
    }

    /// Text read from the database, checked to be a JSON object; with the owners' uids it names.
    pub fn loaded(json: String) -> Result<(Held, Vec<String>), NotAnObject> {
        if !json.trim_start().starts_with('{') {
            return Err(NotAnObject("not a JSON object".into()));
        }
        let skim: Skim = serde_json::from_str(&json).map_err(|e| NotAnObject(e.to_string()))?;
        let owners = skim
            .metadata
            .owner_references
            .into_iter()
            .filter_map(|o| o.uid)
            .collect();
        Ok((Held::written(json), owners))
    }

    /// The object, parsed afresh unless a shared read kept its tree.
    pub fn value(&self) -> Arc<Value> {
        match self {
            Held::Tree(v) => v.clone(),
            Held::Text(t) => t
                .parsed
                .get()
                .cloned()
                .unwrap_or_else(|| Arc::new(t.parse())),
        }
    }

    /// The object, its tree kept for the next read of this version.
    pub fn shared(&self) -> Arc<Value> {
        match self {
            Held::Tree(v) => v.clone(),
            Held::Text(t) => t.parsed.get_or_init(|| Arc::new(t.parse())).clone(),
        }
    }

    /// Whether this is the tree form (which weighs more than its text).
    pub fn is_tree(&self) -> bool {
        matches!(self, Held::Tree(_))
    }
}

impl Text {
    fn parse(&self) -> Value {
        // Only text this process serialised from a `Value`, or checked at load to parse within the
        // same limits, is ever held: it parses.
        serde_json::from_str(&self.json).expect("the store holds only JSON it wrote or checked")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn text_reads_back_as_the_tree_it_was_written_from() {
        let tree =
            json!({"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"n": 1.5, "m": -3}});
        let held = Held::written(serde_json::to_string(&tree).unwrap());
        assert_eq!(*held.value(), tree);
        // A plain read does not keep the tree; a shared one does, and hands out the same one.
        assert!(!Arc::ptr_eq(&held.value(), &held.value()));
        assert!(Arc::ptr_eq(&held.shared(), &held.shared()));
        assert!(Arc::ptr_eq(&held.shared(), &held.value()));
    }

    #[test]
    fn loaded_text_is_checked_and_its_owners_read() {
        let (held, owners) = Held::loaded(
            json!({"metadata": {"name": "a", "ownerReferences": [
                {"uid": "u1", "kind": "X", "name": "o"}, {"kind": "Y"}, {"uid": "u2"}]}})
            .to_string(),
        )
        .unwrap();
        assert_eq!(owners, ["u1", "u2"]);
        assert_eq!(held.value()["metadata"]["name"], "a");
        let (_, none) = Held::loaded(r#"{"kind": "ConfigMap"}"#.into()).unwrap();
        assert!(none.is_empty());
        for bad in [
            "[1]",
            "{\"a\": ",
            "\"x\"",
            "{\"metadata\": {\"ownerReferences\": 3}}",
        ] {
            assert!(Held::loaded(bad.into()).is_err(), "{bad}");
        }
    }
}
