//! A cloud-config token's life after POST: rotation with a grace period and expiry ([`super::sweep`]
//! ends both).
//!
//! Every token is a `kubernetes.io/service-account-token` Secret of the account, filled by the
//! token controller (Kubernetes', or the embedded store's), so the API server (or the embedded
//! verifier) stops accepting it the moment its Secret is deleted. A token with an end carries it in
//! [`objects::EXPIRES_AT_ANNOTATION`]; the sweeper deletes each such Secret when its end comes.
//!
//! A rotation is several writes, and the process may stop after any of them; each state between
//! two of them has at most two working tokens of the account, and the sweeper takes every one of
//! them to exactly one once the ends pass:
//! 1. the tokens already replaced (in their grace) are deleted: only the current one works;
//! 2. the new token Secret is made with a provisional end ([`objects::PROVISIONAL_UNTIL_ANNOTATION`],
//!    a little past the longest a rotation waits for its token): if the rotation stops here, the
//!    sweeper deletes it then;
//! 3. the switch: the ServiceAccount names the new Secret ([`objects::TOKEN_SECRET_ANNOTATION`]) and,
//!    in the same write, the one it replaces and the end of its grace
//!    ([`objects::REPLACED_TOKEN_ANNOTATION`]);
//! 4. the new Secret's provisional end is removed, the replaced one is marked with its end, and any
//!    other token of the account is deleted (the sweeper does the same for a rotation that stopped).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use time::OffsetDateTime;
use tracing::info;

use super::{
    naming::{AccountNames, safe_concat_name},
    objects::{self, SecretCheck},
    request::AccountRequest,
    service::{CloudConfig, CloudConfigError, ROTATE, store_err, uid_of},
    sweep::managed,
};
use crate::store::{Preconditions, StoreError};

/// How often a rotation retries marking a Secret when someone else writes it meanwhile.
const MARK_TRIES: usize = 5;

/// How much longer than the wait for its token a new token's provisional end is.
const PROVISIONAL_SLACK: Duration = Duration::from_secs(30);

/// The least time a new token's provisional end must still be away for the switch to go ahead:
/// the sweeper (of any replica) deletes a token that is not current once that end has come, so the
/// switch must land well before it, clocks a little apart included.
const SWITCH_MARGIN: Duration = Duration::from_secs(15);

impl CloudConfig {
    /// The account's token Secrets: ours by label, of its ServiceAccount by name (tokens of an
    /// earlier ServiceAccount of the name too, for revocation to remove).
    pub(super) async fn token_secrets(
        &self,
        names: &AccountNames,
    ) -> Result<Vec<Secret>, StoreError> {
        let secrets = self
            .api::<Secret>()
            .list(Some(&names.namespace), &managed())
            .await?;
        Ok(secrets
            .into_iter()
            .filter(|s| objects::is_token_of(s, &names.service_account))
            .collect())
    }

    /// Rotate: a new token for an existing account, returned as its kubeconfig; the token it
    /// replaces works for `req.grace` more (the service's default when not given), any older one
    /// stops now.
    pub async fn rotate(&self, req: &AccountRequest) -> Result<String, CloudConfigError> {
        let grace = req.grace.unwrap_or(self.settings.default_grace);
        if grace > self.settings.max_grace {
            return Err(CloudConfigError::Invalid {
                step: ROTATE,
                message: format!(
                    "gracePeriod {}s is longer than this service allows ({}s, --max-rotation-grace)",
                    grace.as_secs(),
                    self.settings.max_grace.as_secs()
                ),
            });
        }
        let base = AccountNames::new(&req.namespace, &req.service_account);
        self.check_cluster_roles().await?;
        let server = self.server_url().await?;
        let ns = base.namespace.as_str();
        let sas = self.api::<ServiceAccount>();
        let secrets = self.api::<Secret>();

        let sa = sas
            .get(ns, &base.service_account)
            .await
            .map_err(store_err(ROTATE))?
            .ok_or_else(|| CloudConfigError::NotFound {
                step: ROTATE,
                message: format!(
                    "serviceaccounts \"{}\" not found; POST /v1/harvester/kubeconfig issues its first cloud-config",
                    base.service_account
                ),
            })?;
        let sa_uid = uid_of(&sa)?;
        let current = base.with_secret(objects::current_token_secret(&sa, &base));
        let replaced = secrets
            .get(ns, &current.secret)
            .await
            .map_err(store_err(ROTATE))?;
        let replaced = match replaced {
            Some(s) => match objects::check_secret(&s, &current, Some(&sa_uid)) {
                SecretCheck::Ours => Some(s),
                // An earlier account's token: nothing of this account to keep in a grace.
                SecretCheck::Stale => None,
                SecretCheck::Foreign(message) => {
                    return Err(CloudConfigError::Foreign {
                        step: ROTATE,
                        message,
                    });
                }
            },
            None => None,
        };
        if !objects::is_managed(&sa.metadata) && replaced.is_none() {
            return Err(CloudConfigError::Foreign {
                step: ROTATE,
                message: format!(
                    "serviceaccount {ns}/{} is not a cloud-config account (no managed-by label and no cloud-config token Secret)",
                    base.service_account
                ),
            });
        }
        self.check_bindings(&base, &sa_uid).await?;
        // The tokens this rotation may end, read after the ServiceAccount: any token made later is
        // a concurrent rotation's, which either loses the switch (it read the ServiceAccount before
        // this one switched it) or comes after this one, and is never this one's to end. Ending
        // whatever was there at clean-up time deleted a newer rotation's fresh current token.
        let old = self.token_secrets(&base).await.map_err(store_err(ROTATE))?;
        let now = OffsetDateTime::now_utc();

        // 1. The tokens already replaced end first, so that the new one is never a third that
        // works. A replaced token is never current again, whoever switches meanwhile; any other
        // token may be current by now (a concurrent rotation's switch) and waits for this one's.
        let recorded = objects::replaced_token(&sa).map(|(name, _)| name.to_string());
        let mut ended = Vec::new();
        for secret in &old {
            let name = secret.metadata.name.clone().unwrap_or_default();
            if name != current.secret
                && (objects::is_retired(secret) || recorded.as_deref() == Some(name.as_str()))
            {
                self.end_token(secret).await.map_err(store_err(ROTATE))?;
                ended.push(name);
            }
        }

        // 2. The new token, provisional until the switch.
        let suffix = crate::validation::random_alnum(5);
        let new_names =
            base.with_secret(safe_concat_name(&[&base.service_account, "token", &suffix]));
        let mut new = objects::token_secret(&new_names, &sa_uid);
        if let Some(lifetime) = req.expiration {
            objects::set_lifetime(&mut new, lifetime, now);
        }
        let provisional_until = now + self.settings.token_timeout + PROVISIONAL_SLACK;
        objects::set_provisional(&mut new, provisional_until);
        let grace_until = now + grace;
        let mut created = Vec::new();
        let issued = async {
            self.create_or_get(&secrets, &new, &mut created)
                .await
                .map_err(store_err(ROTATE))?;
            let secret = self.wait_for_token(&new_names, ROTATE).await?;
            let kubeconfig = self.build(&new_names, &server, &secret)?;
            if provisional_until - OffsetDateTime::now_utc() < SWITCH_MARGIN {
                // The sweeper may take the new token for one that never became current.
                return Err(CloudConfigError::TokenTimeout {
                    namespace: ns.to_string(),
                    name: new_names.secret.clone(),
                    timeout: self.settings.token_timeout,
                });
            }
            // 3. The switch, with the grace of the token it replaces: a concurrent rotation that
            // switched first makes this one a conflict.
            let mut sa = sa.clone();
            sa.metadata
                .annotations
                .get_or_insert_default()
                .insert(
                    objects::TOKEN_SECRET_ANNOTATION.into(),
                    new_names.secret.clone(),
                );
            let keeps_grace = replaced.is_some() && !grace.is_zero();
            objects::set_replaced(
                &mut sa,
                keeps_grace.then_some((current.secret.as_str(), grace_until)),
            );
            sas.replace(&sa).await.map_err(|e| match e {
                StoreError::Conflict { .. } => CloudConfigError::Foreign {
                    step: ROTATE,
                    message: format!(
                        "serviceaccount {ns}/{} changed while its token was rotated (another rotation?); retry",
                        base.service_account
                    ),
                },
                e => store_err(ROTATE)(e),
            })?;
            // The new Secret was created buffered.
            self.store.sync().await.map_err(store_err(ROTATE))?;
            Ok::<_, CloudConfigError>(kubeconfig)
        }
        .await;
        let kubeconfig = match issued {
            Ok(k) => k,
            Err(e) => {
                self.roll_back(created).await;
                return Err(e);
            }
        };
        crate::metrics::kubeconfig_token("issued");
        crate::metrics::kubeconfig_token("rotated");

        // 4. The new token is current: its provisional end goes (the sweeper would remove it too,
        // and never ends the current token). The replaced token gets its grace, any other token
        // of the account stops now: none of them can be current, as this rotation's switch came
        // after it read them.
        let finished = async {
            self.mark(ns, &new_names.secret, objects::clear_provisional)
                .await?;
            for secret in &old {
                let name = secret.metadata.name.clone().unwrap_or_default();
                if name == new_names.secret || ended.contains(&name) {
                    continue;
                }
                if name == current.secret && !grace.is_zero() {
                    self.mark(ns, &name, |s| {
                        objects::set_retiring(s, now, grace_until);
                        true
                    })
                    .await?;
                } else {
                    self.end_token(secret).await?;
                }
            }
            Ok::<_, StoreError>(())
        }
        .await;
        if let Err(e) = finished {
            // The new token is in place; an old one still working would be the leak the
            // rotation was for, so say so rather than answer as if all was done (the sweeper
            // finishes it meanwhile).
            return Err(CloudConfigError::Store {
                step: "the new token is issued, but an old token Secret could not be ended; rotate again",
                source: e,
            });
        }
        self.sweep_now.notify_one();
        info!(namespace = %ns, service_account = %base.service_account, secret = %new_names.secret,
            replaced = %current.secret, grace_seconds = grace.as_secs(),
            "kubeconfig for service account {ns}/{} is rotated", base.service_account);
        Ok(kubeconfig)
    }

    /// Deletes a token Secret (that one, by its UID), if it is still there.
    async fn end_token(&self, secret: &Secret) -> Result<(), StoreError> {
        let pre = Preconditions {
            uid: secret.metadata.uid.clone(),
            ..Default::default()
        };
        let ns = secret.metadata.namespace.as_deref().unwrap_or_default();
        let name = secret.metadata.name.as_deref().unwrap_or_default();
        match self.api::<Secret>().delete(ns, name, &pre).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Changes a token Secret as `change` says (which returns whether it changed anything),
    /// reading it again when someone else (its token controller, the sweeper) wrote it meanwhile.
    async fn mark(
        &self,
        namespace: &str,
        name: &str,
        change: impl Fn(&mut Secret) -> bool,
    ) -> Result<(), StoreError> {
        let api = self.api::<Secret>();
        for _ in 0..MARK_TRIES {
            let Some(mut secret) = api.get(namespace, name).await? else {
                return Ok(());
            };
            if !change(&mut secret) {
                return Ok(());
            }
            match api.replace(&secret).await {
                Ok(_) => return Ok(()),
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) if e.is_not_found() => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Conflict {
            kind: "secret".into(),
            name: name.into(),
        })
    }
}
