//! A cloud-config token's life after POST: rotation with a grace period, expiry, and the sweeper
//! that ends both.
//!
//! Every token is a `kubernetes.io/service-account-token` Secret of the account, filled by the
//! token controller (Kubernetes', or the embedded store's), so the API server (or the embedded
//! verifier) stops accepting it the moment its Secret is deleted. A token with an end carries it in
//! [`objects::EXPIRES_AT_ANNOTATION`]; the sweeper deletes each such Secret when its end comes. A
//! rotation makes a new token Secret, points the ServiceAccount at it
//! ([`objects::TOKEN_SECRET_ANNOTATION`]) and gives the one it replaces an end `gracePeriod` away;
//! tokens replaced before that are deleted at once, so only the newest two ever work.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{
    naming::{AccountNames, safe_concat_name},
    objects::{self, SecretCheck},
    request::AccountRequest,
    service::{CloudConfig, CloudConfigError, ROTATE, store_err, uid_of},
};
use crate::store::{LabelSelector, Preconditions, StoreError};

/// The longest the sweeper sleeps between looks (it also wakes when a token with an end is made
/// here, and at the next end it knows of). Another replica's new tokens are seen within this.
pub const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// How often a rotation retries marking the replaced Secret when someone else writes it meanwhile.
const RETIRE_TRIES: usize = 5;

fn managed() -> LabelSelector {
    LabelSelector::from_labels([(objects::MANAGED_BY_LABEL, objects::MANAGED_BY)])
}

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
                    "serviceaccount \"{}\" not found; POST /v1/harvester/kubeconfig issues its first cloud-config",
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

        // The new token.
        let suffix = crate::validation::random_alnum(5);
        let new_names =
            base.with_secret(safe_concat_name(&[&base.service_account, "token", &suffix]));
        let mut new = objects::token_secret(&new_names, &sa_uid);
        let now = OffsetDateTime::now_utc();
        if let Some(lifetime) = req.expiration {
            objects::set_lifetime(&mut new, lifetime, now);
        }
        let mut created = Vec::new();
        let issued = async {
            self.create_or_get(&secrets, &new, &mut created)
                .await
                .map_err(store_err(ROTATE))?;
            let secret = self.wait_for_token(&new_names, ROTATE).await?;
            let kubeconfig = self.build(&new_names, &server, &secret)?;
            // The switch: a concurrent rotation that switched first makes this one a conflict.
            let mut sa = sa.clone();
            sa.metadata
                .annotations
                .get_or_insert_default()
                .insert(
                    objects::TOKEN_SECRET_ANNOTATION.into(),
                    new_names.secret.clone(),
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

        // The old ones: the replaced token gets its grace, older ones (and a replaced one with no
        // grace) stop now.
        for secret in old {
            let name = secret.metadata.name.clone().unwrap_or_default();
            if name == new_names.secret {
                continue;
            }
            let keep = name == current.secret && !grace.is_zero();
            let result = if keep {
                self.retire(secret, now, now + grace).await
            } else {
                let pre = Preconditions {
                    uid: secret.metadata.uid.clone(),
                    ..Default::default()
                };
                match secrets.delete(ns, &name, &pre).await {
                    Ok(_) => Ok(()),
                    Err(e) if e.is_not_found() => Ok(()),
                    Err(e) => Err(e),
                }
            };
            if let Err(e) = result {
                // The new token is in place; an old one still working would be the leak the
                // rotation was for, so say so rather than answer as if all was done.
                return Err(CloudConfigError::Store {
                    step: "the new token is issued, but an old token Secret could not be ended; rotate again",
                    source: e,
                });
            }
        }
        self.sweep_now.notify_one();
        info!(namespace = %ns, service_account = %base.service_account, secret = %new_names.secret,
            replaced = %current.secret, grace_seconds = grace.as_secs(),
            "kubeconfig for service account {ns}/{} is rotated", base.service_account);
        Ok(kubeconfig)
    }

    /// Gives a replaced token Secret its end, re-reading it when someone else wrote it meanwhile.
    async fn retire(
        &self,
        mut secret: Secret,
        now: OffsetDateTime,
        until: OffsetDateTime,
    ) -> Result<(), StoreError> {
        let api = self.api::<Secret>();
        let ns = secret.metadata.namespace.clone().unwrap_or_default();
        let name = secret.metadata.name.clone().unwrap_or_default();
        for _ in 0..RETIRE_TRIES {
            objects::set_retiring(&mut secret, now, until);
            match api.replace(&secret).await {
                Ok(_) => return Ok(()),
                Err(StoreError::Conflict { .. }) => match api.get(&ns, &name).await? {
                    Some(fresh) => secret = fresh,
                    None => return Ok(()),
                },
                Err(e) if e.is_not_found() => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Conflict {
            kind: "secret".into(),
            name,
        })
    }

    /// One pass of the sweeper: deletes every token Secret of ours whose end has come; returns
    /// how long until the next end it knows of.
    pub async fn sweep(&self) -> Result<Option<Duration>, StoreError> {
        let api = self.api::<Secret>();
        let now = OffsetDateTime::now_utc();
        let mut next: Option<Duration> = None;
        for secret in api.list(None, &managed()).await? {
            let Some(end) = objects::expires_at(&secret) else {
                continue;
            };
            if end > now {
                let left = Duration::try_from(end - now).unwrap_or_default();
                next = Some(next.map_or(left, |n| n.min(left)));
                continue;
            }
            let ns = secret.metadata.namespace.clone().unwrap_or_default();
            let name = secret.metadata.name.clone().unwrap_or_default();
            let rotated = secret
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(objects::ROTATED_AT_ANNOTATION));
            let pre = Preconditions {
                uid: secret.metadata.uid.clone(),
                ..Default::default()
            };
            match api.delete(&ns, &name, &pre).await {
                Ok(_) => {
                    let event = if rotated { "retired" } else { "expired" };
                    crate::metrics::kubeconfig_token(event);
                    let sa = secret
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(objects::SA_NAME_ANNOTATION))
                        .cloned()
                        .unwrap_or_default();
                    info!(namespace = %ns, secret = %name, service_account = %sa, %event,
                        "a cloud-config token of service account {ns}/{sa} ended ({event}); its Secret is deleted");
                }
                // Gone, or replaced by another Secret of the name: nothing of ours to end.
                Err(e) if e.is_not_found() || matches!(e, StoreError::Conflict { .. }) => {}
                Err(e) => {
                    warn!(namespace = %ns, secret = %name, error = %e, "cannot delete an ended cloud-config token Secret yet; retrying");
                    next = Some(Duration::from_secs(1));
                }
            }
        }
        Ok(next)
    }

    /// Runs [`CloudConfig::sweep`] until `stop`: at the next end it knows of, when a token with an
    /// end is issued here, and at least every [`SWEEP_EVERY`].
    pub async fn run_sweeper(self: Arc<Self>, stop: CancellationToken) {
        loop {
            let wait = match self.sweep().await {
                Ok(next) => next.map_or(SWEEP_EVERY, |n| n.min(SWEEP_EVERY)),
                Err(e) => {
                    warn!(error = %e, "cannot list cloud-config token Secrets; retrying");
                    Duration::from_secs(5)
                }
            };
            // A little past the end, so the end has come when we look.
            let wait = wait + Duration::from_millis(50);
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
                () = self.sweep_now.notified() => {}
            }
        }
    }
}
