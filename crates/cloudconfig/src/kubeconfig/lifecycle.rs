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
//! 0. the claim: the ServiceAccount, written on the version the rotation read, records that a
//!    rotation holds the account until the new token's provisional end
//!    ([`objects::ROTATING_UNTIL_ANNOTATION`]); a rotation that finds a live claim, or loses the
//!    race to write one, is a conflict at once, before it made anything. So at most one rotation
//!    of an account is between its claim and its switch (the claim of one that stopped lapses);
//! 1. every token but the current one is deleted (the one replaced, in its grace, and any a
//!    stopped rotation left): only the current one works;
//! 2. the new token Secret is made with a provisional end ([`objects::PROVISIONAL_UNTIL_ANNOTATION`],
//!    a little past the longest a rotation waits for its token): if the rotation stops here, the
//!    sweeper deletes it then;
//! 3. the switch: the ServiceAccount names the new Secret ([`objects::TOKEN_SECRET_ANNOTATION`]) and,
//!    in the same write, the one it replaces and the end of its grace
//!    ([`objects::REPLACED_TOKEN_ANNOTATION`]), and the claim goes; written on the version the
//!    claim wrote, so nobody wrote the account in between;
//! 4. the new Secret's provisional end is removed, the replaced one is marked with its end, and any
//!    other token of the account is deleted (the sweeper does the same for a rotation that stopped).
//!
//! A rotation that fails before its switch deletes its new Secret and gives up its claim.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use time::OffsetDateTime;
use tracing::{info, warn};

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
        let now = OffsetDateTime::now_utc();
        let provisional_until = now + self.settings.token_timeout + PROVISIONAL_SLACK;

        // 0. The claim: from here to the switch, no other rotation of the account runs.
        let claimed = self.claim(&sa, &base, provisional_until, now).await?;
        let grace_until = now + grace;
        let mut created = Vec::new();
        let mut switched = false;
        // Set while the switch may have landed without this rotation knowing (an error other than
        // a conflict, or a failed sync after it).
        let mut switch_unsure = false;
        let issued = async {
            // The tokens this rotation may end, read under the claim: a token made later is
            // a rotation's whose claim lapsed, which can no longer switch.
            let old = self.token_secrets(&base).await.map_err(store_err(ROTATE))?;

            // 1. Every token but the current one ends first, so that the new one is never a third
            // that works: the one replaced (in its grace), and any a rotation left that stopped
            // before its switch. Under the claim none of them can become current.
            let mut ended = Vec::new();
            for secret in &old {
                let name = secret.metadata.name.clone().unwrap_or_default();
                if name != current.secret {
                    self.end_token(secret).await.map_err(store_err(ROTATE))?;
                    ended.push(name);
                }
            }

            // 2. The new token, provisional until the switch; not made once the claim is near
            // its end (the sweeper may take it for one that never became current, and another
            // rotation may claim the account).
            let suffix = crate::validation::random_alnum(5);
            let new_names =
                base.with_secret(safe_concat_name(&[&base.service_account, "token", &suffix]));
            let mut new = objects::token_secret(&new_names, &sa_uid);
            if let Some(lifetime) = req.expiration {
                objects::set_lifetime(&mut new, lifetime, now);
            }
            objects::set_provisional(&mut new, provisional_until);
            let too_late = || {
                (provisional_until - OffsetDateTime::now_utc() < SWITCH_MARGIN).then(|| {
                    CloudConfigError::TokenTimeout {
                        namespace: ns.to_string(),
                        name: new_names.secret.clone(),
                        timeout: self.settings.token_timeout,
                    }
                })
            };
            if let Some(e) = too_late() {
                return Err(e);
            }
            self.create_or_get(&secrets, &new, &mut created)
                .await
                .map_err(store_err(ROTATE))?;
            let secret = self.wait_for_token(&new_names, ROTATE).await?;
            let kubeconfig = self.build(&new_names, &server, &secret)?;
            if let Some(e) = too_late() {
                return Err(e);
            }
            // 3. The switch, with the grace of the token it replaces, and the claim's end: its
            // precondition (the version the claim wrote) proves nobody wrote the account since.
            let mut sa = claimed.clone();
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
            objects::set_rotating(&mut sa, None);
            switch_unsure = true;
            sas.replace(&sa).await.map_err(|e| match e {
                StoreError::Conflict { .. } => {
                    // Refused: the switch did not land.
                    switch_unsure = false;
                    CloudConfigError::Foreign {
                        step: ROTATE,
                        message: format!(
                            "serviceaccount {ns}/{} changed while its token was rotated (the rotation took past its claim, or someone else wrote it); retry",
                            base.service_account
                        ),
                    }
                }
                e => store_err(ROTATE)(e),
            })?;
            switched = true;
            // The new Secret was created buffered.
            self.store.sync().await.map_err(store_err(ROTATE))?;
            Ok::<_, CloudConfigError>((kubeconfig, new_names, old, ended))
        }
        .await;
        let (kubeconfig, new_names, old, ended) = match issued {
            Ok(issued) => issued,
            Err(e) => {
                if switch_unsure {
                    // The new token may be current: deleting it would leave the account with
                    // none (GET 404). It keeps its provisional end, so the sweeper deletes it then
                    // unless the switch landed, and otherwise clears that end.
                    warn!(namespace = %ns, service_account = %base.service_account, error = %e,
                        "the switch of a rotation may have landed; its new token is left to the sweeper");
                } else {
                    self.roll_back(created).await;
                }
                if !switched {
                    self.release(&claimed).await;
                }
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

    /// Claims the account for one rotation until `until`: one write of its ServiceAccount, on the
    /// version `sa` was read at. A live claim of another rotation, or a lost race to write one,
    /// is a conflict that says to retry. Returns the ServiceAccount as the claim wrote it.
    async fn claim(
        &self,
        sa: &ServiceAccount,
        names: &AccountNames,
        until: OffsetDateTime,
        now: OffsetDateTime,
    ) -> Result<ServiceAccount, CloudConfigError> {
        let under_way = |until: Option<OffsetDateTime>| CloudConfigError::Foreign {
            step: ROTATE,
            message: format!(
                "a rotation of serviceaccount {}/{} is under way{}; retry",
                names.namespace,
                names.service_account,
                until.map_or_else(
                    || " (it claimed the account as this one began)".to_string(),
                    |t| format!(" (until {} at the latest)", objects::rfc3339(t))
                ),
            ),
        };
        if let Some(held) = objects::rotating_until(sa).filter(|t| *t > now) {
            return Err(under_way(Some(held)));
        }
        let mut claimed = sa.clone();
        objects::set_rotating(&mut claimed, Some(until));
        match self.api::<ServiceAccount>().replace(&claimed).await {
            Ok(claimed) => Ok(claimed),
            Err(StoreError::Conflict { .. }) => Err(under_way(None)),
            Err(e) => {
                // The claim may have landed all the same (a reply lost): if the account carries
                // this rotation's claim (its deadline is to the nanosecond, so it is this one's),
                // give it up, or every rotation of the account waits for it to lapse.
                let mine = claimed
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(objects::ROTATING_UNTIL_ANNOTATION).cloned());
                if let Ok(Some(now)) = self
                    .api::<ServiceAccount>()
                    .get(&names.namespace, &names.service_account)
                    .await
                    && now
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(objects::ROTATING_UNTIL_ANNOTATION).cloned())
                        == mine
                {
                    self.release(&now).await;
                }
                Err(store_err(ROTATE)(e))
            }
        }
    }

    /// Gives up the claim of a rotation that failed before its switch, so the next one need not
    /// wait for its end; only if nobody wrote the ServiceAccount since (else the claim is not
    /// ours to remove, or is gone). When this fails too, the claim lapses at its end.
    async fn release(&self, claimed: &ServiceAccount) {
        let mut sa = claimed.clone();
        objects::set_rotating(&mut sa, None);
        match self.api::<ServiceAccount>().replace(&sa).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() || matches!(e, StoreError::Conflict { .. }) => {}
            Err(e) => {
                warn!(namespace = sa.metadata.namespace.as_deref().unwrap_or_default(),
                    service_account = sa.metadata.name.as_deref().unwrap_or_default(), error = %e,
                    "cannot give up the claim of a failed rotation; it lapses at its end");
            }
        }
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
