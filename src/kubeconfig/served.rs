//! GET: the kubeconfig of an account that POST made, and the cache of what GET rendered.
//!
//! A kubeconfig is a pure function of the account's four objects (ServiceAccount, token Secret,
//! RoleBinding, ClusterRoleBinding), the server URL and this service's settings, except that a
//! token with an end stops being served when its end comes. So each rendered kubeconfig is kept
//! with the uid and resourceVersion of the four objects it was made from, the server URL and the
//! token's end. A GET still reads the four objects from the store every time; when all four are
//! the very versions an entry was made from, it serves the entry (after checking the end against
//! the clock), and otherwise it judges and renders them afresh. Any write (a rotation, a
//! revocation, an edited binding, a Secret recreated) changes a uid or a resourceVersion, so no
//! entry outlives the objects it describes. Only successes are kept.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock},
};

use bytes::Bytes;

use k8s_openapi::api::{
    core::v1::{Secret, ServiceAccount},
    rbac::v1::{ClusterRoleBinding, RoleBinding},
};
use serde_json::Value;
use tracing::debug;

use super::{
    naming::AccountNames,
    objects::{self, SecretCheck},
    render,
    request::{AccountRequest, OutputFormat},
    service::{
        CloudConfig, CloudConfigError, GET_CRB, GET_RB, GET_SA, judge_cluster_role_binding,
        judge_role_binding, store_err, uid_of,
    },
};
use crate::{
    store::{Kind, Object, StoreError},
    sync::lock,
};

/// How many accounts' kubeconfigs are kept; past that the cache starts over (a guest cluster
/// reads its own account, so a few thousand entries cover any real installation).
const CAPACITY: usize = 4096;

/// One stored object version: what the store changes on every write of it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Version {
    uid: String,
    resource_version: String,
}

impl Version {
    fn of(v: &Value) -> Option<Version> {
        let meta = v.get("metadata")?;
        Some(Version {
            uid: meta.get("uid")?.as_str()?.to_string(),
            resource_version: meta.get("resourceVersion")?.as_str()?.to_string(),
        })
    }

    fn is(&self, v: &Value) -> bool {
        let meta = v.get("metadata");
        let field = |f: &str| meta.and_then(|m| m.get(f)).and_then(Value::as_str);
        field("uid") == Some(self.uid.as_str())
            && field("resourceVersion") == Some(self.resource_version.as_str())
    }
}

/// A rendered kubeconfig and what it was made from.
struct Served {
    service_account: Version,
    /// The token Secret's name, as the ServiceAccount version above names it.
    secret_name: String,
    secret: Version,
    role_binding: Version,
    cluster_role_binding: Version,
    server: String,
    /// When the token stops working, if it has an end.
    end: Option<time::OffsetDateTime>,
    kubeconfig: Arc<Rendered>,
}

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
    entries: Mutex<HashMap<(String, String), Arc<Served>>>,
}

impl ServedCache {
    fn get(&self, names: &AccountNames) -> Option<Arc<Served>> {
        // Keyed by owned strings; a lookup builds the key once (no allocation-free borrow of a
        // tuple of Strings).
        let key = (names.namespace.clone(), names.service_account.clone());
        lock(&self.entries).get(&key).cloned()
    }

    /// Drops an account's entry (revoked, or found gone), so its token is not kept in memory
    /// longer than needed. Correctness never depends on it: an entry is only served while the
    /// objects it was made from are there unchanged.
    pub(super) fn forget(&self, namespace: &str, service_account: &str) {
        lock(&self.entries).remove(&(namespace.to_string(), service_account.to_string()));
    }

    fn put(&self, names: &AccountNames, served: Served) {
        let mut entries = lock(&self.entries);
        if entries.len() >= CAPACITY {
            entries.clear();
        }
        entries.insert(
            (names.namespace.clone(), names.service_account.clone()),
            Arc::new(served),
        );
    }
}

fn decode<K: Object>(v: &Value, step: &'static str) -> Result<K, CloudConfigError> {
    serde_json::from_value(v.clone()).map_err(|e| CloudConfigError::Store {
        step,
        source: StoreError::Undecodable {
            kind: K::kind(&()).to_lowercase(),
            name: crate::store::object_key(v).1,
            reason: e.to_string(),
        },
    })
}

impl CloudConfig {
    async fn read_shared<K: Object>(
        &self,
        namespace: &str,
        name: &str,
        step: &'static str,
    ) -> Result<Option<Arc<Value>>, CloudConfigError> {
        self.store
            .get_shared(&Kind::of::<K>(), namespace, name)
            .await
            .map_err(store_err(step))
    }

    /// GET: the kubeconfig of an account that POST made; creates nothing.
    pub async fn fetch(&self, req: &AccountRequest) -> Result<Arc<Rendered>, CloudConfigError> {
        let names = AccountNames::new(&req.namespace, &req.service_account);
        self.check_cluster_roles().await?;
        let server = self.server_url().await?;
        let ns = names.namespace.as_str();
        let not_found = |step, message| CloudConfigError::NotFound { step, message };

        let sa_value = self
            .read_shared::<ServiceAccount>(ns, &names.service_account, GET_SA)
            .await?
            .ok_or_else(|| {
                self.served.forget(ns, &names.service_account);
                not_found(
                    GET_SA,
                    format!("serviceaccounts \"{}\" not found", names.service_account),
                )
            })?;
        let cached = self
            .served
            .get(&names)
            .filter(|c| c.server == server && c.service_account.is(&sa_value));
        let (sa, secret_name) = match &cached {
            Some(c) => (None, c.secret_name.clone()),
            None => {
                let sa: ServiceAccount = decode(&sa_value, GET_SA)?;
                let secret = objects::current_token_secret(&sa, &names);
                (Some(sa), secret)
            }
        };
        let names = names.with_secret(secret_name);
        let secret_value = self
            .read_shared::<Secret>(ns, &names.secret, GET_SA)
            .await?
            .ok_or_else(|| not_found(GET_SA, format!("secrets \"{}\" not found", names.secret)))?;
        let rb_value = self
            .read_shared::<RoleBinding>(ns, &names.binding, GET_RB)
            .await?;
        let crb_value = self
            .read_shared::<ClusterRoleBinding>("", &names.binding, GET_CRB)
            .await?;
        if let (Some(c), Some(rb), Some(crb)) = (&cached, &rb_value, &crb_value)
            && c.secret.is(&secret_value)
            && c.role_binding.is(rb)
            && c.cluster_role_binding.is(crb)
            && c.end
                .is_none_or(|end| end > time::OffsetDateTime::now_utc())
        {
            return Ok(c.kubeconfig.clone());
        }

        // Judged and rendered afresh.
        let sa = match sa {
            Some(sa) => sa,
            None => decode(&sa_value, GET_SA)?,
        };
        let sa_uid = uid_of(&sa)?;
        let secret: Secret = decode(&secret_value, GET_SA)?;
        match objects::check_secret(&secret, &names, Some(&sa_uid)) {
            SecretCheck::Ours if objects::has_ended(&secret) => {
                return Err(not_found(
                    GET_SA,
                    format!(
                        "the token in secret \"{}\" has ended (expirationSeconds or a rotation's grace); POST issues a new one",
                        names.secret
                    ),
                ));
            }
            SecretCheck::Ours => {}
            SecretCheck::Foreign(message) => {
                return Err(CloudConfigError::Foreign {
                    step: GET_SA,
                    message,
                });
            }
            SecretCheck::Stale => {
                return Err(CloudConfigError::Foreign {
                    step: GET_SA,
                    message: format!(
                        "secret {ns}/{} holds the token of an earlier serviceAccount {}; POST to replace it",
                        names.secret, names.service_account
                    ),
                });
            }
        }
        let rb: Option<RoleBinding> = rb_value.as_deref().map(|v| decode(v, GET_RB)).transpose()?;
        judge_role_binding(rb.as_ref(), &names, &sa_uid)?;
        let crb: Option<ClusterRoleBinding> = crb_value
            .as_deref()
            .map(|v| decode(v, GET_CRB))
            .transpose()?;
        judge_cluster_role_binding(crb.as_ref(), &names, &sa_uid)?;
        let kubeconfig = Arc::new(Rendered::new(self.build(&names, &server, &secret)?));
        // Debug, not info: reads are frequent and change nothing (creations are logged at info).
        debug!(namespace = %ns, service_account = %names.service_account,
            "kubeconfig for service account {ns}/{} is fetched", names.service_account);
        if let (
            Some(service_account),
            Some(secret_version),
            Some(role_binding),
            Some(cluster_role_binding),
        ) = (
            Version::of(&sa_value),
            Version::of(&secret_value),
            rb_value.as_deref().and_then(Version::of),
            crb_value.as_deref().and_then(Version::of),
        ) {
            self.served.put(
                &names,
                Served {
                    service_account,
                    secret_name: names.secret.clone(),
                    secret: secret_version,
                    role_binding,
                    cluster_role_binding,
                    server,
                    end: objects::expires_at(&secret),
                    kubeconfig: kubeconfig.clone(),
                },
            );
        }
        Ok(kubeconfig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_object(uid: &str, rv: &str) -> Value {
        serde_json::json!({"metadata": {"name": "x", "uid": uid, "resourceVersion": rv}})
    }

    #[test]
    fn a_version_is_its_uid_and_resource_version() {
        let v = Version::of(&mk_object("u1", "7")).unwrap();
        assert!(v.is(&mk_object("u1", "7")));
        assert!(!v.is(&mk_object("u1", "8")), "a later write of the object");
        assert!(!v.is(&mk_object("u2", "7")), "another object of the name");
        assert!(!v.is(&serde_json::json!({"metadata": {"name": "x"}})));
        assert_eq!(
            Version::of(&serde_json::json!({"metadata": {"uid": "u"}})),
            None
        );
    }
}
