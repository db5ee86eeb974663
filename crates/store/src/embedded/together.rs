//! Several objects created in one write: an owner and the dependents made from it, committed in
//! one transaction, so they are there together or not at all (a new cloud-config account's four
//! objects: one commit and one writer turn instead of four).

use serde_json::Value;

use super::{
    Ack, EmbeddedStore,
    semantics::{checked_key, meta_mut, row_of, stamp_created, validate_new_meta},
};
use crate::{ChangeType, Dependents, Kind, StoreError};

impl EmbeddedStore {
    pub(super) async fn create_all(
        &self,
        owner_kind: &Kind,
        mut owner: Value,
        dependents: Dependents,
    ) -> Result<Vec<Value>, StoreError> {
        let mut objects = Vec::new();
        let key = checked_key(owner_kind, &mut owner)?;
        validate_new_meta(owner_kind, &key.1, &owner)?;
        let uid = uuid::Uuid::new_v4().to_string();
        meta_mut(owner_kind, &mut owner)?.insert("uid".into(), Value::from(uid.clone()));
        for (kind, mut object) in dependents(&owner)? {
            let key = checked_key(&kind, &mut object)?;
            validate_new_meta(&kind, &key.1, &object)?;
            let uid = uuid::Uuid::new_v4().to_string();
            meta_mut(&kind, &mut object)?.insert("uid".into(), Value::from(uid.clone()));
            // Signed before the write takes the writer, as a single create's token is.
            let minted = (kind.api_version == "v1" && kind.kind == "Secret")
                .then(|| self.premint(&object, Some(&owner)))
                .flatten();
            objects.push((kind, object, key, uid, minted));
        }
        let owner_kind = owner_kind.clone();
        self.write_as(Ack::Stored, move |state| {
            let taken = |kind: &Kind, (namespace, name): &(String, String)| {
                state
                    .get(&kind.api_version, &kind.kind, namespace, name)
                    .is_some()
                    .then(|| StoreError::AlreadyExists {
                        kind: kind.singular(),
                        name: name.clone(),
                    })
            };
            if let Some(e) = taken(&owner_kind, &key) {
                return Err(e);
            }
            for (kind, _, key, _, _) in &objects {
                if let Some(e) = taken(kind, key) {
                    return Err(e);
                }
            }
            let mut rv = state.rv + 1;
            stamp_created(&owner_kind, &mut owner, &uid, rv)?;
            let mut rows = vec![row_of(
                &owner_kind,
                &key.0,
                &key.1,
                &uid,
                rv,
                ChangeType::Added,
                owner.clone(),
            )];
            let mut out = vec![owner.clone()];
            for (kind, mut object, (namespace, name), uid, minted) in objects {
                rv += 1;
                stamp_created(&kind, &mut object, &uid, rv)?;
                if kind.api_version == "v1" && kind.kind == "Secret" {
                    self.fill_token(state, Some(&owner), &mut object, minted)?;
                }
                // Its owner is the object created with it; one that names only owners that
                // exist nowhere would be collected, so it is refused instead.
                let refs_owner = object
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .is_some_and(|refs| {
                        refs.iter()
                            .any(|r| r.get("uid").and_then(Value::as_str) == Some(uid_of(&owner)))
                    });
                if !refs_owner && super::semantics::orphaned(state, &object) {
                    return Err(StoreError::Invalid {
                        kind: kind.singular(),
                        name,
                        reason: "none of its owners exists".into(),
                    });
                }
                rows.push(row_of(
                    &kind,
                    &namespace,
                    &name,
                    &uid,
                    rv,
                    ChangeType::Added,
                    object.clone(),
                ));
                out.push(object);
            }
            Ok((rows, out))
        })
        .await
    }
}

fn uid_of(v: &Value) -> &str {
    v.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
}
