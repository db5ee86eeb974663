//! Status merge patches on the embedded store ([`crate::ObjectStore::merge_status`]): the object in
//! memory is patched whole, as watchers and readers see objects, while the database stores the
//! patch beside the object's last whole row. Every [`MAX_PATCHES`] patches of one object, or once
//! they would outweigh it, the object is stored whole again and its patches dropped, so that opening
//! the store replays a bounded number of them per object.

use serde_json::Value;

use super::{
    EmbeddedStore,
    semantics::{conflict, meta_str, not_found, row_of, set_rv},
    state::Stored,
};
use crate::{ChangeType, Kind, StoreError, merge_changes, merge_into_status};

/// Patches of one object stored before it is stored whole again.
const MAX_PATCHES: usize = 64;

/// How many bytes `object` takes as JSON, without keeping them.
pub(super) fn json_len(object: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing into a counter cannot fail, nor can serialising a `Value`.
    let _ = serde_json::to_writer(&mut count, object);
    count.0
}

impl EmbeddedStore {
    pub(super) async fn merge_status_impl(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        resource_version: &str,
        patch: &Value,
        planned: &(dyn for<'v> Fn(&'v str) + Send + Sync),
    ) -> Result<String, StoreError> {
        let namespace = if kind.namespaced { namespace } else { "" };
        let text = serde_json::to_string(patch).map_err(StoreError::backend)?;
        self.write(|state| {
            let current = state
                .get(&kind.api_version, &kind.kind, namespace, name)
                .ok_or_else(|| not_found(kind, name))?;
            if meta_str(&current, "resourceVersion").as_deref() != Some(resource_version) {
                return Err(conflict(kind, name));
            }
            if !merge_changes(current.get("status").unwrap_or(&Value::Null), patch) {
                return Ok((Vec::new(), resource_version.to_string()));
            }
            let uid = meta_str(&current, "uid").unwrap_or_default();
            let mut next = (*current).clone();
            merge_into_status(&mut next, patch);
            let rv = state.rv + 1;
            set_rv(&mut next, rv);
            let mut row = row_of(kind, namespace, name, &uid, rv, ChangeType::Modified, next);
            let stored = state.patches(&uid);
            let object_bytes = if stored.count == 0 {
                json_len(&current)
            } else {
                stored.object_bytes
            };
            // Stored whole again (as any other write stores it) once the patches would be many,
            // or outweigh the object: opening the store replays them.
            if stored.count < MAX_PATCHES && stored.patch_bytes + text.len() < object_bytes {
                row.stored = Stored::Patch {
                    object_bytes,
                    patch: text,
                };
            }
            // Under the writer's plan lock: no watch has this version yet, and should the
            // write fail, the version is not handed out again ([`super::overlay::Overlay::clear`]).
            let rv = rv.to_string();
            planned(&rv);
            Ok((vec![row], rv))
        })
        .await
    }
}
