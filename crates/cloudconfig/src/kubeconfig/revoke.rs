//! DELETE: revoking a cloud-config account, only what is the account's, every token with it.

use k8s_openapi::api::{
    core::v1::{Secret, ServiceAccount},
    rbac::v1::{ClusterRoleBinding, RoleBinding},
};
use tracing::info;

use super::{
    naming::AccountNames,
    objects::{self, SecretCheck},
    service::{CloudConfig, CloudConfigError, store_err},
};
use crate::store::{Object, Preconditions};

const REVOKE: &str = "fail to revoke serviceAccount";

/// What a revocation did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Revocation {
    /// The objects deleted, as `kind namespace/name`.
    pub deleted: Vec<String>,
    /// Objects of the account's names that are not the account's, left alone.
    pub kept: Vec<Kept>,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Kept {
    pub object: String,
    pub reason: String,
}

impl CloudConfig {
    /// DELETE: revokes an account by deleting its bindings, its token Secrets and its ServiceAccount,
    /// in that order (access goes first). Only objects that are the account's are deleted; anything
    /// else of the same name is kept and reported. Deleting an absent account succeeds.
    pub async fn revoke(
        &self,
        namespace: &str,
        service_account: &str,
    ) -> Result<Revocation, CloudConfigError> {
        let names = AccountNames::new(namespace, service_account);
        self.served.forget(namespace, service_account);
        let mut out = Revocation::default();
        let sa = self
            .api::<ServiceAccount>()
            .get(namespace, &names.service_account)
            .await
            .map_err(store_err(REVOKE))?;
        let sa_uid = sa.as_ref().and_then(|s| s.metadata.uid.clone());
        let names = match &sa {
            Some(sa) => names.with_secret(objects::current_token_secret(sa, &names)),
            None => names,
        };
        let ns = names.namespace.as_str();

        let uid = sa_uid.as_deref();
        self.revoke_object::<ClusterRoleBinding>(
            "",
            &names.binding,
            format!("clusterrolebinding {}", names.binding),
            |crb| objects::check_cluster_role_binding(crb, &names, uid),
            &mut out,
        )
        .await?;
        self.revoke_object::<RoleBinding>(
            ns,
            &names.binding,
            format!("rolebinding {ns}/{}", names.binding),
            |rb| objects::check_role_binding(rb, &names, uid),
            &mut out,
        )
        .await?;
        let token_secret_seen = self
            .revoke_object::<Secret>(
                ns,
                &names.secret,
                format!("secret {ns}/{}", names.secret),
                |secret| match objects::check_secret(secret, &names, uid) {
                    SecretCheck::Ours | SecretCheck::Stale => Ok(()),
                    SecretCheck::Foreign(reason) => Err(reason),
                },
                &mut out,
            )
            .await?;
        // The tokens a rotation replaced, still in their grace.
        let others = self
            .token_secrets(&names)
            .await
            .map_err(store_err(REVOKE))?;
        for other in others {
            let name = other.metadata.name.clone().unwrap_or_default();
            if name == names.secret {
                continue;
            }
            let of_name = names.with_secret(name.clone());
            self.revoke_object::<Secret>(
                ns,
                &name,
                format!("secret {ns}/{name}"),
                |secret| match objects::check_secret(secret, &of_name, uid) {
                    SecretCheck::Ours | SecretCheck::Stale => Ok(()),
                    SecretCheck::Foreign(reason) => Err(reason),
                },
                &mut out,
            )
            .await?;
        }
        // A service account is the account's if we labelled it, or if it had the token Secret that
        // Harvester creates for its cloud-config accounts.
        self.revoke_object::<ServiceAccount>(
            ns,
            &names.service_account,
            format!("serviceaccount {ns}/{}", names.service_account),
            |sa| {
                if objects::is_managed(&sa.metadata) || token_secret_seen {
                    Ok(())
                } else {
                    Err("not created by a cloud-config request (no managed-by label and no cloud-config token Secret)".into())
                }
            },
            &mut out,
        )
        .await?;
        info!(namespace = %ns, service_account = %names.service_account, deleted = out.deleted.len(), kept = out.kept.len(),
            "kubeconfig for service account {ns}/{} is revoked", names.service_account);
        Ok(out)
    }

    /// Deletes one object of the account if `verdict` says it is the account's, else records it as
    /// kept. Returns whether it was deleted.
    async fn revoke_object<K: Object>(
        &self,
        namespace: &str,
        name: &str,
        what: String,
        verdict: impl FnOnce(&K) -> Result<(), String>,
        out: &mut Revocation,
    ) -> Result<bool, CloudConfigError> {
        let api = self.api::<K>();
        let Some(obj) = api.get(namespace, name).await.map_err(store_err(REVOKE))? else {
            return Ok(false);
        };
        if let Err(reason) = verdict(&obj) {
            out.kept.push(Kept {
                object: what,
                reason,
            });
            return Ok(false);
        }
        let pre = Preconditions {
            uid: obj.meta().uid.clone(),
            ..Default::default()
        };
        match api.delete(namespace, name, &pre).await {
            Ok(_) => out.deleted.push(what),
            // Gone meanwhile (a concurrent revocation, or the garbage collector): already revoked.
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(store_err(REVOKE)(e)),
        }
        Ok(true)
    }
}
