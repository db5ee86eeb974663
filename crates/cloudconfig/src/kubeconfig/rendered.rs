//! What GET rendered, kept by account: each kubeconfig with the versions of the four objects it
//! was made from (see [`super::served`] for when an entry is served), and its response bodies,
//! each encoded on first use.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock},
};

use bytes::Bytes;
use serde_json::Value;

use super::{naming::AccountNames, render, request::OutputFormat};
use crate::sync::lock;

/// How many accounts' kubeconfigs are kept; past that the cache starts over (a guest cluster
/// reads its own account, so a few thousand entries cover any real installation).
const CAPACITY: usize = 4096;

/// One stored object version: what the store changes on every write of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Version {
    uid: String,
    resource_version: String,
}

impl Version {
    pub(super) fn of(v: &Value) -> Option<Version> {
        let meta = v.get("metadata")?;
        Some(Version {
            uid: meta.get("uid")?.as_str()?.to_string(),
            resource_version: meta.get("resourceVersion")?.as_str()?.to_string(),
        })
    }

    pub(super) fn is(&self, v: &Value) -> bool {
        let meta = v.get("metadata");
        let field = |f: &str| meta.and_then(|m| m.get(f)).and_then(Value::as_str);
        field("uid") == Some(self.uid.as_str())
            && field("resourceVersion") == Some(self.resource_version.as_str())
    }
}

/// A rendered kubeconfig and what it was made from.
pub(super) struct Served {
    pub(super) service_account: Version,
    /// The token Secret's name, as the ServiceAccount version above names it.
    pub(super) secret_name: String,
    pub(super) secret: Version,
    pub(super) role_binding: Version,
    pub(super) cluster_role_binding: Version,
    pub(super) server: String,
    /// The write counters of the four kinds, taken before the objects were read (`None`: the
    /// store keeps none).
    pub(super) writes: Option<Writes>,
    /// When the token stops working, if it has an end.
    pub(super) end: Option<time::OffsetDateTime>,
    pub(super) kubeconfig: Arc<Rendered>,
}

/// The write counters of ServiceAccounts, Secrets, RoleBindings and ClusterRoleBindings
/// ([`crate::store::ObjectStore::write_counter`]).
pub(super) type Writes = [u64; 4];

/// A kubeconfig and the response bodies made of it, each encoded on first use.
pub struct Rendered {
    text: String,
    json: OnceLock<Bytes>,
    cloud_init: OnceLock<Bytes>,
}

impl Rendered {
    pub fn new(text: String) -> Self {
        Rendered {
            text,
            json: OnceLock::new(),
            cloud_init: OnceLock::new(),
        }
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// The response body in `output`: a Go-encoded JSON string, or cloud-init user data writing
    /// it to `path` (Harvester's two paths when `None`).
    pub fn body(&self, output: OutputFormat, path: Option<&str>) -> Bytes {
        match (output, path) {
            (OutputFormat::Kubeconfig, _) => self
                .json
                .get_or_init(|| render::go_json_string(&self.text).into())
                .clone(),
            (OutputFormat::CloudInit, None) => self
                .cloud_init
                .get_or_init(|| render::cloud_init(&self.text, None).into())
                .clone(),
            (OutputFormat::CloudInit, Some(path)) => {
                render::cloud_init(&self.text, Some(path)).into()
            }
        }
    }
}

/// The kubeconfigs GET served, by namespace and ServiceAccount name.
#[derive(Default)]
pub(super) struct ServedCache {
    entries: Mutex<Entries>,
}

/// Namespace → ServiceAccount name → entry (looked up by `&str`, no key built per GET).
#[derive(Default)]
struct Entries {
    accounts: HashMap<String, HashMap<String, Arc<Served>>>,
    len: usize,
}

impl ServedCache {
    pub(super) fn get(&self, namespace: &str, service_account: &str) -> Option<Arc<Served>> {
        lock(&self.entries)
            .accounts
            .get(namespace)?
            .get(service_account)
            .cloned()
    }

    /// Drops an account's entry (revoked, or found gone), so its token is not kept in memory
    /// longer than needed. Correctness never depends on it: an entry is only served while the
    /// objects it was made from are there unchanged.
    pub(super) fn forget(&self, namespace: &str, service_account: &str) {
        let entries = &mut *lock(&self.entries);
        if let Some(accounts) = entries.accounts.get_mut(namespace) {
            if accounts.remove(service_account).is_some() {
                entries.len -= 1;
            }
            if accounts.is_empty() {
                entries.accounts.remove(namespace);
            }
        }
    }

    pub(super) fn put(&self, names: &AccountNames, served: Served) {
        let entries = &mut *lock(&self.entries);
        if entries.len >= CAPACITY {
            *entries = Entries::default();
        }
        let replaced = entries
            .accounts
            .entry(names.namespace.clone())
            .or_default()
            .insert(names.service_account.clone(), Arc::new(served));
        if replaced.is_none() {
            entries.len += 1;
        }
    }
}
