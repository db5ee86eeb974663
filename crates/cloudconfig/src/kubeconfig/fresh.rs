//! POST of an account none of whose objects exists yet (the usual case): its ServiceAccount, token
//! Secret and two bindings asked of the store in one step, where the backend can (the embedded
//! store commits them in one transaction: there together or not at all). Otherwise, or when a
//! concurrent request made one of them meanwhile, POST creates them one by one.

use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use serde_json::Value;

use super::{
    naming::AccountNames,
    objects,
    service::{CloudConfig, Created},
};
use crate::store::{Kind, StoreError, to_stored};

impl CloudConfig {
    /// Creates the four objects together; `Ok(false)` when the backend cannot or a name is taken
    /// by now (the caller goes on one by one), and then nothing was created.
    pub(super) async fn create_fresh(
        &self,
        names: &AccountNames,
        expiration: Option<Duration>,
        created: &mut Vec<Created>,
    ) -> Result<bool, StoreError> {
        let (sa_kind, sa) = to_stored(&objects::service_account(names))?;
        let made_of = names.clone();
        let dependents = Box::new(move |sa: &Value| {
            let sa_uid = sa
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let mut secret = objects::token_secret(&made_of, sa_uid);
            if let Some(lifetime) = expiration {
                objects::set_lifetime(&mut secret, lifetime, time::OffsetDateTime::now_utc());
            }
            Ok(vec![
                to_stored(&secret)?,
                to_stored(&objects::role_binding(&made_of, sa_uid))?,
                to_stored(&objects::cluster_role_binding(&made_of, sa_uid))?,
            ])
        });
        let stored = match self.store.create_together(&sa_kind, sa, dependents).await {
            Ok(Some(stored)) => stored,
            Ok(None) => return Ok(false),
            Err(e) if e.is_already_exists() => return Ok(false),
            Err(e) => return Err(e),
        };
        for object in &stored {
            let (namespace, name) = crate::store::object_key(object);
            created.push(Created {
                kind: kind_of(object),
                namespace,
                name,
                uid: object
                    .pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            });
        }
        crate::metrics::kubeconfig_token("issued");
        if expiration.is_some() {
            self.sweep_now.notify_one();
        }
        Ok(true)
    }
}

/// The kind of one of the four objects, from its `kind`.
fn kind_of(object: &Value) -> Kind {
    use k8s_openapi::api::{
        core::v1::Secret,
        rbac::v1::{ClusterRoleBinding, RoleBinding},
    };
    match object.get("kind").and_then(Value::as_str) {
        Some("Secret") => Kind::of::<Secret>(),
        Some("RoleBinding") => Kind::of::<RoleBinding>(),
        Some("ClusterRoleBinding") => Kind::of::<ClusterRoleBinding>(),
        _ => Kind::of::<ServiceAccount>(),
    }
}
