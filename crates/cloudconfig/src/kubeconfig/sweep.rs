//! The sweeper: ends cloud-config tokens whose time is up, and finishes what a rotation that
//! stopped half-way (a crash, a lost connection to the store) left, so that every state a rotation
//! can stop in holds at most two working tokens of an account and, once the ends pass, one.
//!
//! What a token Secret is follows from it and its ServiceAccount, read in that order (a token a
//! rotation makes current has lost its provisional end only after the switch, so a Secret read
//! without one whose account does not name it was not current when the account was read either):
//! - an end ([`objects::EXPIRES_AT_ANNOTATION`]) that has come: deleted, current or not;
//! - the current token: never ended otherwise; a provisional end left on it (the rotation stopped
//!   after its switch) is removed;
//! - another one with a provisional end: a rotation in progress, or one that never switched;
//!   deleted when that end comes;
//! - another one that the ServiceAccount records as replaced, without an end (the rotation
//!   stopped after its switch, before it marked it): given the recorded end;
//! - another one without any end: nobody's token (left by a crash before rotations recorded all
//!   this); deleted.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{naming::AccountNames, objects, service::CloudConfig};
use crate::store::{LabelSelector, Preconditions, StoreError};

/// The longest the sweeper sleeps between looks (it also wakes when a token with an end is made
/// here, and at the next end it knows of). Another replica's new tokens are seen within this.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(30);

pub(super) fn managed() -> LabelSelector {
    LabelSelector::from_labels([(objects::MANAGED_BY_LABEL, objects::MANAGED_BY)])
}

/// Why a token ended, as the `kubeconfig_tokens_total` metric counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// Its own lifetime (`expirationSeconds`) ended.
    Expired,
    /// A rotation replaced it and its grace ended.
    Retired,
    /// A rotation made it and never made it current, or nobody's token it is.
    Abandoned,
}

impl Ended {
    fn event(self) -> &'static str {
        match self {
            Ended::Expired => "expired",
            Ended::Retired => "retired",
            Ended::Abandoned => "abandoned",
        }
    }
}

/// What the sweeper does with one token Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// It works on; its end, if it has one, is when to look again.
    Keep(Option<OffsetDateTime>),
    /// It is current and still carries its rotation's provisional end: remove that.
    Confirm,
    /// A replaced token its rotation did not mark: it works until the recorded end.
    Retire(OffsetDateTime),
    /// Delete it now.
    End(Ended),
}

/// The sweeper's judgement of `secret`, given its ServiceAccount as read after it (`None`: there
/// is none).
pub(super) fn judge(secret: &Secret, sa: Option<&ServiceAccount>, now: OffsetDateTime) -> Verdict {
    let name = secret.metadata.name.as_deref().unwrap_or_default();
    let end = objects::expires_at(secret);
    if end.is_some_and(|e| e <= now) {
        return Verdict::End(if objects::is_retired(secret) {
            Ended::Retired
        } else {
            Ended::Expired
        });
    }
    let provisional = objects::provisional_until(secret);
    let current = sa.is_some_and(|sa| {
        let names = AccountNames::new(
            secret.metadata.namespace.as_deref().unwrap_or_default(),
            sa.metadata.name.as_deref().unwrap_or_default(),
        );
        objects::current_token_secret(sa, &names) == name
    });
    if current {
        return match provisional {
            Some(_) => Verdict::Confirm,
            None => Verdict::Keep(end),
        };
    }
    match (end, provisional) {
        (_, Some(p)) if p <= now => Verdict::End(Ended::Abandoned),
        (Some(e), p) => Verdict::Keep(Some(p.map_or(e, |p| p.min(e)))),
        (None, Some(p)) => Verdict::Keep(Some(p)),
        (None, None) => match sa.and_then(objects::replaced_token) {
            Some((replaced, until)) if replaced == name && until > now => Verdict::Retire(until),
            Some((replaced, _)) if replaced == name => Verdict::End(Ended::Retired),
            _ => Verdict::End(Ended::Abandoned),
        },
    }
}

impl CloudConfig {
    /// The ServiceAccounts of `secrets`, read now: ours in one list, any other by name.
    async fn accounts_of(
        &self,
        secrets: &[Secret],
    ) -> Result<BTreeMap<(String, String), ServiceAccount>, StoreError> {
        let key = |ns: Option<&str>, name: Option<&str>| {
            (
                ns.unwrap_or_default().to_string(),
                name.unwrap_or_default().to_string(),
            )
        };
        let sas = self.api::<ServiceAccount>();
        let mut found: BTreeMap<_, _> = sas
            .list(None, &managed())
            .await?
            .into_iter()
            .map(|sa| {
                (
                    key(
                        sa.metadata.namespace.as_deref(),
                        sa.metadata.name.as_deref(),
                    ),
                    sa,
                )
            })
            .collect();
        for secret in secrets {
            let Some(sa_name) = secret
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(objects::SA_NAME_ANNOTATION))
            else {
                continue;
            };
            let k = key(secret.metadata.namespace.as_deref(), Some(sa_name));
            if found.contains_key(&k) {
                continue;
            }
            if let Some(sa) = sas.get(&k.0, &k.1).await? {
                found.insert(k, sa);
            }
        }
        Ok(found)
    }

    /// One pass of the sweeper (see the module's documentation); returns how long until the next
    /// end it knows of.
    pub async fn sweep(&self) -> Result<Option<Duration>, StoreError> {
        let api = self.api::<Secret>();
        // The Secrets first, then their ServiceAccounts: see the module's documentation.
        let mut secrets = api.list(None, &managed()).await?;
        // Only token Secrets: anything else with our label is not the sweeper's to end.
        secrets.retain(|s| {
            s.type_.as_deref() == Some(objects::SA_TOKEN_TYPE)
                && s.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(objects::SA_NAME_ANNOTATION))
        });
        let now = OffsetDateTime::now_utc();
        // Only a Secret without an end that has come needs its account judged.
        let open: Vec<Secret> = secrets
            .iter()
            .filter(|s| !objects::has_ended(s))
            .cloned()
            .collect();
        let accounts = if open.is_empty() {
            BTreeMap::new()
        } else {
            self.accounts_of(&open).await?
        };
        let mut next: Option<Duration> = None;
        let mut at = |t: OffsetDateTime| {
            let left = Duration::try_from(t - now).unwrap_or_default();
            next = Some(next.map_or(left, |n: Duration| n.min(left)));
        };
        let soon = now + Duration::from_secs(1);
        for mut secret in secrets {
            let ns = secret.metadata.namespace.clone().unwrap_or_default();
            let name = secret.metadata.name.clone().unwrap_or_default();
            let sa_name = secret
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(objects::SA_NAME_ANNOTATION))
                .cloned()
                .unwrap_or_default();
            let sa = accounts.get(&(ns.clone(), sa_name.clone()));
            let result = match judge(&secret, sa, now) {
                Verdict::Keep(end) => {
                    if let Some(end) = end {
                        at(end);
                    }
                    Ok(())
                }
                Verdict::Confirm => {
                    objects::clear_provisional(&mut secret);
                    let end = objects::expires_at(&secret);
                    api.replace(&secret).await.map(|_| {
                        if let Some(end) = end {
                            at(end);
                        }
                        info!(namespace = %ns, secret = %name, service_account = %sa_name,
                            "a rotation stopped after it made this cloud-config token current; the token is kept");
                    })
                }
                Verdict::Retire(until) => {
                    objects::set_retiring(&mut secret, now, until);
                    api.replace(&secret).await.map(|_| {
                        at(until);
                        info!(namespace = %ns, secret = %name, service_account = %sa_name, %until,
                            "a rotation stopped before it gave the token it replaced its grace; it works until then");
                    })
                }
                Verdict::End(why) => {
                    let pre = Preconditions {
                        uid: secret.metadata.uid.clone(),
                        ..Default::default()
                    };
                    api.delete(&ns, &name, &pre).await.map(|_| {
                        let event = why.event();
                        crate::metrics::kubeconfig_token(event);
                        info!(namespace = %ns, secret = %name, service_account = %sa_name, %event,
                            "a cloud-config token of service account {ns}/{sa_name} ended ({event}); its Secret is deleted");
                    })
                }
            };
            match result {
                Ok(()) => {}
                // Gone, or written by someone else meanwhile (a rotation finishing, another
                // replica): judged again on the next pass.
                Err(e) if e.is_not_found() => {}
                Err(StoreError::Conflict { .. }) => at(soon),
                Err(e) => {
                    warn!(namespace = %ns, secret = %name, error = %e, "cannot finish a cloud-config token Secret yet; retrying");
                    at(soon);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap as Map;

    fn mk_now() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap()
    }

    fn mk_secret(name: &str, annotations: &[(&str, OffsetDateTime)]) -> Secret {
        let names = AccountNames::new("ns", "sa").with_secret(name.into());
        let mut s = objects::token_secret(&names, "u");
        let a = s.metadata.annotations.get_or_insert_default();
        for (k, t) in annotations {
            a.insert((*k).into(), objects::rfc3339(*t));
        }
        s
    }

    fn mk_sa(current: Option<&str>, replaced: Option<(&str, OffsetDateTime)>) -> ServiceAccount {
        let mut sa = objects::service_account(&AccountNames::new("ns", "sa"));
        if let Some(c) = current {
            sa.metadata.annotations = Some(Map::from([(
                objects::TOKEN_SECRET_ANNOTATION.to_string(),
                c.to_string(),
            )]));
        }
        objects::set_replaced(&mut sa, replaced);
        sa
    }

    const EXPIRES: &str = objects::EXPIRES_AT_ANNOTATION;
    const PROVISIONAL: &str = objects::PROVISIONAL_UNTIL_ANNOTATION;

    #[test]
    fn the_current_token_is_never_ended_but_by_its_own_end() {
        let now = mk_now();
        let later = now + time::Duration::minutes(1);
        let before = now - time::Duration::minutes(1);
        let sa = mk_sa(Some("c"), None);
        assert_eq!(
            judge(&mk_secret("c", &[]), Some(&sa), now),
            Verdict::Keep(None)
        );
        assert_eq!(
            judge(&mk_secret("c", &[(EXPIRES, later)]), Some(&sa), now),
            Verdict::Keep(Some(later))
        );
        // A provisional end that has come does not end a token once it is current.
        assert_eq!(
            judge(&mk_secret("c", &[(PROVISIONAL, before)]), Some(&sa), now),
            Verdict::Confirm
        );
        assert_eq!(
            judge(&mk_secret("c", &[(EXPIRES, before)]), Some(&sa), now),
            Verdict::End(Ended::Expired)
        );
        // Without the annotation, Harvester's name is the current one.
        let plain = mk_sa(None, None);
        assert_eq!(
            judge(&mk_secret("sa-token", &[]), Some(&plain), now),
            Verdict::Keep(None)
        );
    }

    #[test]
    fn other_tokens_end_when_their_rotation_says_or_at_once() {
        let now = mk_now();
        let later = now + time::Duration::minutes(1);
        let before = now - time::Duration::minutes(1);
        let sa = mk_sa(Some("c"), Some(("a", later)));
        // A rotation in progress, and one that never switched.
        assert_eq!(
            judge(&mk_secret("d", &[(PROVISIONAL, later)]), Some(&sa), now),
            Verdict::Keep(Some(later))
        );
        assert_eq!(
            judge(&mk_secret("d", &[(PROVISIONAL, before)]), Some(&sa), now),
            Verdict::End(Ended::Abandoned)
        );
        // The replaced token its rotation did not mark gets the recorded grace.
        assert_eq!(
            judge(&mk_secret("a", &[]), Some(&sa), now),
            Verdict::Retire(later)
        );
        let over = mk_sa(Some("c"), Some(("a", before)));
        assert_eq!(
            judge(&mk_secret("a", &[]), Some(&over), now),
            Verdict::End(Ended::Retired)
        );
        // Nobody's token: no end, not current, not the replaced one.
        assert_eq!(
            judge(&mk_secret("x", &[]), Some(&sa), now),
            Verdict::End(Ended::Abandoned)
        );
        assert_eq!(
            judge(&mk_secret("x", &[]), None, now),
            Verdict::End(Ended::Abandoned)
        );
        // A token in its grace keeps it.
        assert_eq!(
            judge(&mk_secret("b", &[(EXPIRES, later)]), Some(&sa), now),
            Verdict::Keep(Some(later))
        );
    }
}
