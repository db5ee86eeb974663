//! Read-modify-write with conflict retry: every write a reconciler makes to an object it did not
//! create in this pass (a finalizer, an annotation, a status) goes through [`modify`], so a copy
//! that is one version behind (a cache, the object of the event that woke the reconcile) costs a
//! fresh read instead of a failed reconcile.

use crate::store::{Api, Object, StoreError};

/// Writes at most this many times before the last conflict is returned.
const ATTEMPTS: usize = 5;

/// Which part of the object a write replaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The object (a status subresource keeps the stored status).
    Object,
    /// Only the status subresource.
    Status,
}

/// The object as it now is, and whether this call wrote it.
#[derive(Clone, Debug)]
pub struct Modified<K> {
    pub object: K,
    pub written: bool,
}

/// Applies `change` to `obj` and writes it, again on the stored object after a conflict. `change`
/// says whether it changed anything; nothing changed is nothing written (and `written` is false).
/// `None`: the object is gone, or was recreated (the stored one has another UID, so it is not the
/// object `change` was meant for).
pub async fn modify<K: Object>(
    api: &Api<K>,
    obj: &K,
    target: Target,
    change: impl Fn(&mut K) -> bool,
) -> Result<Option<Modified<K>>, StoreError> {
    let meta = obj.meta();
    let (namespace, name) = (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    );
    let mut current = obj.clone();
    let mut attempt = 1;
    loop {
        let mut next = current.clone();
        if !change(&mut next) {
            return Ok(Some(Modified {
                object: current,
                written: false,
            }));
        }
        let written = match target {
            Target::Object => api.replace(&next).await,
            Target::Status => api.replace_status(&next).await,
        };
        match written {
            Ok(object) => {
                return Ok(Some(Modified {
                    object,
                    written: true,
                }));
            }
            Err(e) if e.is_not_found() => return Ok(None),
            Err(StoreError::Conflict { .. }) if attempt < ATTEMPTS => {
                attempt += 1;
                match api.get(&namespace, &name).await? {
                    Some(fresh) if fresh.meta().uid == obj.meta().uid => current = fresh,
                    _ => return Ok(None),
                }
            }
            Err(e) => return Err(e),
        }
    }
}
