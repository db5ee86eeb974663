//! GET: the kubeconfig of an account that POST made, and the cache of what GET rendered.
//!
//! A kubeconfig is a pure function of the account's four objects (ServiceAccount, token Secret,
//! RoleBinding, ClusterRoleBinding), the server URL and this service's settings, except that a
//! token with an end stops being served when its end comes. So each rendered kubeconfig is kept
//! with the uid and resourceVersion of the four objects it was made from, the server URL and the
//! token's end. A GET reads the four objects from the store; when all four are the very versions
//! an entry was made from, it serves the entry (after checking the end against the clock), and
//! otherwise it judges and renders them afresh. Any write (a rotation, a revocation, an edited
//! binding, a Secret recreated) changes a uid or a resourceVersion, so no entry outlives the
//! objects it describes. Only successes are kept.
//!
//! Where the store keeps write counters of kinds (the embedded backend), an entry also keeps the
//! counters of the four kinds as they were before its objects were read, and while none of them has
//! moved (no ServiceAccount, Secret, RoleBinding or ClusterRoleBinding of any account written
//! since), GET serves it without reading the objects at all: they are still those versions. On
//! the Kubernetes backend, each GET reads them from the API server.

use std::sync::{Arc, atomic::Ordering};

use k8s_openapi::api::{
    core::v1::{Secret, ServiceAccount},
    rbac::v1::{ClusterRoleBinding, RoleBinding},
};
use serde_json::Value;
use tracing::debug;

use super::{
    naming::AccountNames,
    objects::{self, SecretCheck},
    rendered::{Rendered, Served, Version, Writes},
    request::AccountRequest,
    service::{
        CloudConfig, CloudConfigError, GET_CRB, GET_RB, GET_SA, judge_cluster_role_binding,
        judge_role_binding, store_err, uid_of,
    },
};
use crate::store::{Kind, Object, StoreError};

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

    /// The write counters of the four kinds a kubeconfig is made of, where the store keeps them
    /// (taken from the store on first use).
    fn kind_writes(&self) -> Option<Writes> {
        let counters = self.kind_writes.get_or_init(|| {
            let counter = |kind: Kind| self.store.write_counter(&kind);
            Some([
                counter(Kind::of::<ServiceAccount>())?,
                counter(Kind::of::<Secret>())?,
                counter(Kind::of::<RoleBinding>())?,
                counter(Kind::of::<ClusterRoleBinding>())?,
            ])
        });
        counters
            .as_ref()
            .map(|c| c.each_ref().map(|c| c.load(Ordering::Acquire)))
    }

    /// GET: the kubeconfig of an account that POST made; creates nothing.
    pub async fn fetch(&self, req: &AccountRequest) -> Result<Arc<Rendered>, CloudConfigError> {
        self.check_cluster_roles().await?;
        let server = self.server_url().await?;
        // Counted before anything is read: a write after this moves them, and the entry put
        // below with them is not served again.
        let writes = self.kind_writes();
        // Looked up once: served as it is below, or checked against the objects read after.
        let entry = self.served.get(&req.namespace, &req.service_account);
        if let Some(c) = &entry
            && writes.is_some()
            && c.writes == writes
            && c.server == server
            && c.end
                .is_none_or(|end| end > time::OffsetDateTime::now_utc())
        {
            // No ServiceAccount, Secret or binding of any account was written since the entry
            // was made from its four objects: they are as they were.
            return Ok(c.kubeconfig.clone());
        }
        let names = AccountNames::new(&req.namespace, &req.service_account);
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
        let cached = entry.filter(|c| c.server == server && c.service_account.is(&sa_value));
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
                    writes,
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
