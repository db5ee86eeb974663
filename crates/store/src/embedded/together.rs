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

impl EmbeddedStore {
    /// [`crate::ObjectStore::create_each`]: the objects that pass the checks a create makes are
    /// planned in order and committed in one write (answered once stored, as
    /// [`crate::ObjectStore::create_buffered`] is); each refused one gets its own error.
    pub(super) async fn create_each_impl(
        &self,
        kind: &Kind,
        objects: Vec<Value>,
    ) -> Vec<Result<Value, StoreError>> {
        // A token Secret is signed before its write takes the writer: one create each.
        if kind.api_version == "v1" && kind.kind == "Secret" {
            return crate::create_in_turn(self, kind, objects).await;
        }
        // Each object's answer, in the objects' order: the refused ones' now, the others' once
        // their write is answered.
        let mut out: Vec<Option<Result<Value, StoreError>>> = Vec::with_capacity(objects.len());
        let mut named = Vec::with_capacity(objects.len());
        for (i, mut object) in objects.into_iter().enumerate() {
            match super::named_new(kind, &mut object) {
                Ok(key) => {
                    named.push((i, object, key));
                    out.push(None);
                }
                Err(e) => out.push(Some(Err(e))),
            }
        }
        let kind = kind.clone();
        let planned = self
            .write_as(Ack::Stored, move |state| {
                // Names planned in this batch: a later object of the same name is refused, even
                // when the first was deleted in it for naming no owner that exists (Events, the
                // batches' objects, have no owners).
                let mut taken = std::collections::HashSet::new();
                let mut rows = Vec::with_capacity(named.len());
                let mut answers = Vec::with_capacity(named.len());
                let mut rv = state.rv;
                for (i, object, (namespace, name, uid)) in named {
                    let fresh = !state.contains(&kind.api_version, &kind.kind, &namespace, &name)
                        && taken.insert((namespace.clone(), name.clone()));
                    if !fresh {
                        answers.push((
                            i,
                            Err(StoreError::AlreadyExists {
                                kind: kind.singular(),
                                name,
                            }),
                        ));
                        continue;
                    }
                    let key = (namespace.as_str(), name.as_str(), uid.as_str());
                    match self.plan_created(state, &kind, key, object, &mut rv, |_| Ok(())) {
                        Ok((planned, object)) => {
                            rows.extend(planned);
                            answers.push((i, Ok(object)));
                        }
                        Err(e) => answers.push((i, Err(e))),
                    }
                }
                Ok((rows, answers))
            })
            .await;
        match planned {
            Ok(answers) => {
                for (i, answer) in answers {
                    out[i] = Some(answer);
                }
            }
            Err(e) => {
                // The write failed as a whole (the store closed, the commit failed): every
                // object planned in it shares the error, a refusal planned on writes that failed
                // with it too (as a single create's).
                let why = super::writer::backend_message(&e);
                for answer in out.iter_mut().filter(|a| a.is_none()) {
                    *answer = Some(Err(StoreError::backend(std::io::Error::other(why.clone()))));
                }
            }
        }
        out.into_iter()
            .map(|answer| answer.expect("every object is answered"))
            .collect()
    }
}

fn uid_of(v: &Value) -> &str {
    v.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
}
