//! Issuing cloud-configs: ensuring an account's objects (POST), reading them back (GET), and turning
//! its token into a kubeconfig. Backend-neutral: everything goes through the store port.
//!
//! POST checks every existing object before it creates anything, so a conflict leaves nothing
//! behind; if a later step still fails, the objects this request created are removed again.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    core::v1::{ConfigMap, Secret, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding},
};
use tracing::{Instrument, info, warn};

use super::{
    naming::AccountNames,
    objects::{self, SecretCheck},
    render,
    request::{AccountRequest, CLOUDPROVIDER_ROLE, CSI_DRIVER_ROLE},
};
use crate::{
    store::{Api, Kind, Object, ObjectStore, Preconditions, StoreError},
    sync::lock,
};

/// Where the kubeconfig's server and CA come from, and how long to wait for a token.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Namespace of the `vip` ConfigMap.
    pub harvester_namespace: String,
    /// Used verbatim instead of the VIP when set.
    pub server_url: Option<String>,
    /// Used instead of the token Secret's `ca.crt` when set.
    pub cluster_ca: Option<Vec<u8>>,
    pub token_timeout: Duration,
    /// How long a rotated token keeps working when the request gives no `gracePeriod`.
    pub default_grace: Duration,
    /// The longest `gracePeriod` a rotation may ask for.
    pub max_grace: Duration,
}

impl Settings {
    /// A rotated token's default grace: an hour, for the guest cluster's nodes to take the new one.
    pub const DEFAULT_GRACE: Duration = Duration::from_secs(3600);
    /// The longest grace by default: a day.
    pub const MAX_GRACE: Duration = Duration::from_secs(24 * 3600);
}

/// Why a cloud-config could not be issued. Messages keep Harvester's wording and are safe to return,
/// except `Store` whose source is for the log.
#[derive(Debug, thiserror::Error)]
pub enum CloudConfigError {
    /// Upstream wraps its cache's NotFound: `clusterRole X is not found: clusterroles.rbac… "X" not
    /// found` (wrangler's cache names the resource in the plural, as the API server does).
    #[error(
        "clusterRole {name} is not found: clusterroles.rbac.authorization.k8s.io \"{name}\" not found"
    )]
    ClusterRoleNotFound { name: String },
    #[error("failed to get server url: {reason}")]
    ServerUrl { reason: String },
    #[error("{step}: {message}")]
    NotFound { step: &'static str, message: String },
    #[error("{step}: {message}")]
    Foreign { step: &'static str, message: String },
    #[error(
        "fail to create serviceAccount: timeout while waiting for secret {namespace}/{name}: its token was not issued within {timeout:?}"
    )]
    TokenTimeout {
        namespace: String,
        name: String,
        timeout: Duration,
    },
    #[error("fail to generate kubeconfig: {reason}")]
    Generate { reason: String },
    /// A request that is well-formed but cannot be served as asked (422).
    #[error("{step}: {message}")]
    Invalid { step: &'static str, message: String },
    #[error("{step}: {source}")]
    Store {
        step: &'static str,
        #[source]
        source: StoreError,
    },
}

const CREATE_SA: &str = "fail to create serviceAccount";
const CREATE_RB: &str = "fail to create roleBinding";
const CREATE_CRB: &str = "fail to create clusterRoleBinding";
pub(super) const GET_SA: &str = "fail to get serviceAccount";
pub(super) const GET_RB: &str = "fail to get roleBinding";
pub(super) const GET_CRB: &str = "fail to get clusterRoleBinding";
pub(super) const ROTATE: &str = "fail to rotate the token of serviceAccount";

pub(super) fn store_err(step: &'static str) -> impl FnOnce(StoreError) -> CloudConfigError {
    move |source| CloudConfigError::Store { step, source }
}

pub(super) fn uid_of<K: Object>(obj: &K) -> Result<String, CloudConfigError> {
    obj.meta()
        .uid
        .clone()
        .ok_or_else(|| CloudConfigError::Store {
            step: CREATE_SA,
            source: StoreError::Invalid {
                kind: K::kind(&()).to_lowercase(),
                name: obj.meta().name.clone().unwrap_or_default(),
                reason: "metadata.uid is missing".into(),
            },
        })
}

/// An object this request created, to remove again if the request fails.
pub(super) struct Created {
    pub(super) kind: Kind,
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) uid: Option<String>,
}

pub struct CloudConfig {
    pub(super) store: Arc<dyn ObjectStore>,
    pub(super) settings: Settings,
    /// Woken when a token with an end is issued, so the sweeper looks again at once.
    pub(super) sweep_now: tokio::sync::Notify,
    /// When the ClusterRoles were last seen to exist.
    roles_seen: Mutex<Option<Instant>>,
    /// The server URL from the `vip` ConfigMap, and when it was read.
    vip_url: Mutex<Option<(Instant, String)>>,
    /// What GET rendered, by the versions of the objects it was made from.
    pub(super) served: super::rendered::ServedCache,
    /// The store's write counters of the four kinds of an account, if it keeps them.
    pub(super) kind_writes: std::sync::OnceLock<Option<[Arc<std::sync::atomic::AtomicU64>; 4]>>,
}

/// How long a positive answer about the ClusterRoles or the VIP is reused. Both change rarely, and
/// on the Kubernetes backend each check is an API request.
const LOOKUP_TTL: Duration = Duration::from_secs(5);

/// How long a rollback that the store refuses is retried.
const ROLLBACK_RETRY_FOR: Duration = Duration::from_secs(30 * 60);

/// One pass of a rollback, newest first; returns what could not be deleted (oldest first).
async fn roll_back_once(store: &Arc<dyn ObjectStore>, created: Vec<Created>) -> Vec<Created> {
    let mut left = Vec::new();
    for c in created.into_iter().rev() {
        let pre = Preconditions {
            uid: c.uid.clone(),
            ..Default::default()
        };
        match store.delete(&c.kind, &c.namespace, &c.name, &pre).await {
            Ok(_) => {
                info!(kind = %c.kind, namespace = %c.namespace, name = %c.name, "rolled back object of a failed request")
            }
            // Gone, or another object of that name by now: nothing of ours to remove.
            Err(e) if e.is_not_found() || matches!(e, StoreError::Conflict { .. }) => {}
            Err(e) => {
                warn!(kind = %c.kind, namespace = %c.namespace, name = %c.name, error = %e, "cannot roll back object of a failed request yet; retrying");
                left.push(c);
            }
        }
    }
    left.reverse();
    left
}

impl CloudConfig {
    pub fn new(store: Arc<dyn ObjectStore>, settings: Settings) -> Self {
        CloudConfig {
            store,
            settings,
            roles_seen: Mutex::new(None),
            vip_url: Mutex::new(None),
            served: Default::default(),
            kind_writes: Default::default(),
            sweep_now: tokio::sync::Notify::new(),
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub(super) fn api<K: Object>(&self) -> Api<K> {
        Api::new(self.store.clone())
    }

    pub(super) async fn check_cluster_roles(&self) -> Result<(), CloudConfigError> {
        if lock(&self.roles_seen).is_some_and(|at| at.elapsed() < LOOKUP_TTL) {
            return Ok(());
        }
        let roles = self.api::<ClusterRole>();
        for name in [CLOUDPROVIDER_ROLE, CSI_DRIVER_ROLE] {
            let found = roles
                .get("", name)
                .await
                .map_err(store_err("fail to get clusterRole"))?;
            if found.is_none() {
                return Err(CloudConfigError::ClusterRoleNotFound { name: name.into() });
            }
        }
        *lock(&self.roles_seen) = Some(Instant::now());
        Ok(())
    }

    /// `https://<vip>:6443` from the `vip` ConfigMap, or the configured URL.
    pub async fn server_url(&self) -> Result<String, CloudConfigError> {
        if let Some(url) = &self.settings.server_url {
            return Ok(url.clone());
        }
        if let Some((at, url)) = &*lock(&self.vip_url)
            && at.elapsed() < LOOKUP_TTL
        {
            return Ok(url.clone());
        }
        let ns = &self.settings.harvester_namespace;
        let reason = |reason: String| CloudConfigError::ServerUrl { reason };
        let cm = self
            .api::<ConfigMap>()
            .get(ns, "vip")
            .await
            .map_err(|e| reason(format!("cannot read configmap {ns}/vip: {e}")))?
            // Upstream's words (a cache's NotFound), harvester pkg/api/kubeconfig getServerURL.
            .ok_or_else(|| reason("configmaps \"vip\" not found".into()))?;
        // Upstream decodes the data with mapstructure, which matches the key `ip` whatever its
        // case; an exact `ip` wins.
        let data = cm.data.unwrap_or_default();
        let vip = data
            .get("ip")
            .or_else(|| {
                data.iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case("ip"))
                    .map(|(_, v)| v)
            })
            // A missing key is an empty VIP to upstream, so the same "invalid vip".
            .ok_or_else(|| {
                reason(format!(
                    "invalid vip  (configmap {ns}/vip has no key \"ip\")"
                ))
            })?;
        let url = vip_url(vip).map_err(reason)?;
        *lock(&self.vip_url) = Some((Instant::now(), url.clone()));
        Ok(url)
    }

    /// POST: ensures the account's objects and returns its kubeconfig.
    pub async fn ensure(&self, req: &AccountRequest) -> Result<String, CloudConfigError> {
        let names = AccountNames::new(&req.namespace, &req.service_account);
        self.check_cluster_roles().await?;
        let server = self.server_url().await?;
        let mut created = Vec::new();
        let mut result = self
            .ensure_objects(&names, &server, req.expiration, &mut created)
            .await;
        if result.is_ok() {
            // The objects were created buffered: one wait for the disk covers all of them, and
            // nothing is acknowledged before it.
            if let Err(e) = self.store.sync().await {
                result = Err(store_err(CREATE_SA)(e));
            }
        }
        if result.is_err() {
            self.roll_back(created).await;
        } else {
            info!(namespace = %names.namespace, service_account = %names.service_account,
                "kubeconfig for service account {}/{} is created", names.namespace, names.service_account);
        }
        result
    }

    async fn ensure_objects(
        &self,
        names: &AccountNames,
        server: &str,
        expiration: Option<Duration>,
        created: &mut Vec<Created>,
    ) -> Result<String, CloudConfigError> {
        let (sas, secrets) = (self.api::<ServiceAccount>(), self.api::<Secret>());
        let (rbs, crbs) = (self.api::<RoleBinding>(), self.api::<ClusterRoleBinding>());
        let ns = names.namespace.as_str();

        // Check everything that exists before writing anything.
        let sa = sas
            .get(ns, &names.service_account)
            .await
            .map_err(store_err(CREATE_SA))?;
        let sa_uid = sa.as_ref().and_then(|s| s.metadata.uid.clone());
        // After a rotation the account's token is in the Secret its ServiceAccount names.
        let names = &match &sa {
            Some(sa) => names.with_secret(objects::current_token_secret(sa, names)),
            None => names.clone(),
        };
        let secret = secrets
            .get(ns, &names.secret)
            .await
            .map_err(store_err(CREATE_SA))?;
        let secret_check = secret
            .as_ref()
            .map(|s| objects::check_secret(s, names, sa_uid.as_deref()));
        if let Some(SecretCheck::Foreign(message)) = &secret_check {
            return Err(CloudConfigError::Foreign {
                step: CREATE_SA,
                message: message.clone(),
            });
        }
        // A token past its end (the sweeper has not deleted it yet) is replaced like a stale one.
        let secret_check = match (&secret, secret_check) {
            (Some(s), Some(SecretCheck::Ours)) if objects::has_ended(s) => Some(SecretCheck::Stale),
            (_, check) => check,
        };
        if let (Some(SecretCheck::Ours), Some(secret)) = (&secret_check, &secret) {
            objects::check_lifetime(secret, expiration).map_err(|message| {
                CloudConfigError::Foreign {
                    step: CREATE_SA,
                    message,
                }
            })?;
        }
        let rb = rbs
            .get(ns, &names.binding)
            .await
            .map_err(store_err(CREATE_RB))?;
        if let Some(rb) = &rb {
            objects::check_role_binding(rb, names, sa_uid.as_deref()).map_err(|message| {
                CloudConfigError::Foreign {
                    step: CREATE_RB,
                    message,
                }
            })?;
        }
        let crb = crbs
            .get("", &names.binding)
            .await
            .map_err(store_err(CREATE_CRB))?;
        if let Some(crb) = &crb {
            objects::check_cluster_role_binding(crb, names, sa_uid.as_deref()).map_err(
                |message| CloudConfigError::Foreign {
                    step: CREATE_CRB,
                    message,
                },
            )?;
        }

        if sa.is_none()
            && secret.is_none()
            && rb.is_none()
            && crb.is_none()
            && self
                .create_fresh(names, expiration, created)
                .await
                .map_err(store_err(CREATE_SA))?
        {
            let secret = self.wait_for_token(names, CREATE_SA).await?;
            return self.build(names, server, &secret);
        }
        let sa = match sa {
            Some(sa) => sa,
            None => self
                .create_or_get(&sas, &objects::service_account(names), created)
                .await
                .map_err(store_err(CREATE_SA))?,
        };
        let sa_uid = uid_of(&sa)?;
        // The Secret was judged before the ServiceAccount was known when there was none yet: a
        // concurrent request may have made both since, and its Secret is then ours, not stale.
        let secret_check = match (&secret, secret_check) {
            (Some(s), Some(SecretCheck::Stale)) if !objects::has_ended(s) => {
                Some(objects::check_secret(s, names, Some(&sa_uid)))
            }
            (_, check) => check,
        };

        match secret_check {
            Some(SecretCheck::Ours) => {}
            Some(SecretCheck::Stale) => {
                // A token of an earlier service account of this name: it would not authenticate.
                let old_uid = secret.as_ref().and_then(|s| s.metadata.uid.clone());
                match secrets
                    .delete(
                        ns,
                        &names.secret,
                        &Preconditions {
                            uid: old_uid,
                            ..Default::default()
                        },
                    )
                    .await
                {
                    Ok(_) => {}
                    Err(e) if e.is_not_found() || matches!(e, StoreError::Conflict { .. }) => {}
                    Err(e) => return Err(store_err(CREATE_SA)(e)),
                }
                self.ensure_secret(&secrets, names, &sa_uid, expiration, created)
                    .await?;
            }
            Some(SecretCheck::Foreign(_)) | None => {
                self.ensure_secret(&secrets, names, &sa_uid, expiration, created)
                    .await?;
            }
        }
        if rb.is_none() {
            let rb = self
                .create_or_get(&rbs, &objects::role_binding(names, &sa_uid), created)
                .await
                .map_err(store_err(CREATE_RB))?;
            objects::check_role_binding(&rb, names, Some(&sa_uid)).map_err(|message| {
                CloudConfigError::Foreign {
                    step: CREATE_RB,
                    message,
                }
            })?;
        }
        if crb.is_none() {
            let crb = self
                .create_or_get(
                    &crbs,
                    &objects::cluster_role_binding(names, &sa_uid),
                    created,
                )
                .await
                .map_err(store_err(CREATE_CRB))?;
            objects::check_cluster_role_binding(&crb, names, Some(&sa_uid)).map_err(|message| {
                CloudConfigError::Foreign {
                    step: CREATE_CRB,
                    message,
                }
            })?;
        }

        let secret = self.wait_for_token(names, CREATE_SA).await?;
        self.build(names, server, &secret)
    }

    /// The token Secret once its token is in it.
    pub(super) async fn wait_for_token(
        &self,
        names: &AccountNames,
        step: &'static str,
    ) -> Result<Secret, CloudConfigError> {
        let secret = self
            .store
            .wait_for_token(&names.namespace, &names.secret, self.settings.token_timeout)
            .await
            .map_err(|e| match e {
                StoreError::TokenTimeout { namespace, name } => CloudConfigError::TokenTimeout {
                    namespace,
                    name,
                    timeout: self.settings.token_timeout,
                },
                e => store_err(step)(e),
            })?;
        serde_json::from_value(secret).map_err(|e| CloudConfigError::Generate {
            reason: format!("secret {} does not decode: {e}", names.secret),
        })
    }

    async fn ensure_secret(
        &self,
        secrets: &Api<Secret>,
        names: &AccountNames,
        sa_uid: &str,
        expiration: Option<Duration>,
        created: &mut Vec<Created>,
    ) -> Result<(), CloudConfigError> {
        let mut new = objects::token_secret(names, sa_uid);
        if let Some(lifetime) = expiration {
            objects::set_lifetime(&mut new, lifetime, time::OffsetDateTime::now_utc());
        }
        let before = created.len();
        let secret = self
            .create_or_get(secrets, &new, created)
            .await
            .map_err(store_err(CREATE_SA))?;
        if created.len() > before {
            crate::metrics::kubeconfig_token("issued");
            if expiration.is_some() {
                self.sweep_now.notify_one();
            }
        }
        match objects::check_secret(&secret, names, Some(sa_uid)) {
            SecretCheck::Ours => Ok(()),
            SecretCheck::Foreign(message) => Err(CloudConfigError::Foreign {
                step: CREATE_SA,
                message,
            }),
            SecretCheck::Stale => Err(CloudConfigError::Foreign {
                step: CREATE_SA,
                message: format!(
                    "secret {}/{} was recreated concurrently for another serviceAccount {}; retry",
                    names.namespace, names.secret, names.service_account
                ),
            }),
        }
    }

    /// Creates `obj`; if another request created it first, returns that one. The create is
    /// buffered ([`ObjectStore::create_buffered`]): the caller syncs the store before it answers.
    pub(super) async fn create_or_get<K: Object>(
        &self,
        api: &Api<K>,
        obj: &K,
        created: &mut Vec<Created>,
    ) -> Result<K, StoreError> {
        let meta = obj.meta();
        let (ns, name) = (
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        );
        match api.create_buffered(obj).await {
            Ok(new) => {
                created.push(Created {
                    kind: api.kind().clone(),
                    namespace: ns,
                    name,
                    uid: new.meta().uid.clone(),
                });
                Ok(new)
            }
            Err(e) if e.is_already_exists() => {
                api.get(&ns, &name).await?.ok_or(StoreError::Conflict {
                    kind: api.kind().singular(),
                    name,
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Removes what a failed request created, newest first. What cannot be removed now (the store
    /// is failing, as the write that failed the request was) is retried in the background with a
    /// back-off, so a failed request leaves nothing behind once the store works again.
    pub(super) async fn roll_back(&self, created: Vec<Created>) {
        let left = roll_back_once(&self.store, created).await;
        if left.is_empty() {
            return;
        }
        let store = self.store.clone();
        tokio::spawn(
            async move {
                let mut left = left;
                let mut wait = Duration::from_millis(250);
                let give_up = Instant::now() + ROLLBACK_RETRY_FOR;
                while !left.is_empty() {
                    if Instant::now() > give_up {
                        for c in &left {
                            tracing::error!(kind = %c.kind, namespace = %c.namespace, name = %c.name, "gave up rolling back an object of a failed request; delete it, or DELETE the account");
                        }
                        return;
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(30));
                    left = roll_back_once(&store, left).await;
                }
            }
            .instrument(tracing::info_span!("rollback")),
        );
    }

    /// GET's checks of the two bindings: there, owned by the ServiceAccount, and binding what
    /// POST binds.
    pub(super) async fn check_bindings(
        &self,
        names: &AccountNames,
        sa_uid: &str,
    ) -> Result<(), CloudConfigError> {
        let ns = names.namespace.as_str();
        let rb = self
            .api::<RoleBinding>()
            .get(ns, &names.binding)
            .await
            .map_err(store_err(GET_RB))?;
        judge_role_binding(rb.as_ref(), names, sa_uid)?;
        let crb = self
            .api::<ClusterRoleBinding>()
            .get("", &names.binding)
            .await
            .map_err(store_err(GET_CRB))?;
        judge_cluster_role_binding(crb.as_ref(), names, sa_uid)
    }

    pub(super) fn build(
        &self,
        names: &AccountNames,
        server: &str,
        secret: &Secret,
    ) -> Result<String, CloudConfigError> {
        let generate = |reason: String| CloudConfigError::Generate { reason };
        let ca = match &self.settings.cluster_ca {
            Some(ca) => ca.clone(),
            None => objects::secret_data(secret, "ca.crt").ok_or_else(|| {
                generate(format!("ca.crt is not found in secret {}", names.secret))
            })?,
        };
        let token = objects::secret_data(secret, "token")
            .ok_or_else(|| generate(format!("token is not found in secret {}", names.secret)))?;
        let token = String::from_utf8(token)
            .map_err(|_| generate(format!("token in secret {} is not text", names.secret)))?;
        Ok(render::kubeconfig(server, &ca, &names.namespace, &token))
    }
}

/// `https://` + host:port of the VIP, IPv6 in brackets; the VIP must be an IP address.
pub fn vip_url(vip: &str) -> Result<String, String> {
    let ip: std::net::IpAddr = vip
        .trim()
        .parse()
        .map_err(|_| format!("invalid vip {vip}"))?;
    Ok(format!("https://{}", SocketAddr::new(ip, 6443)))
}

/// GET's verdict on the RoleBinding: missing is upstream's NotFound; not the ServiceAccount's, or
/// binding something else, is refused.
pub(super) fn judge_role_binding(
    rb: Option<&RoleBinding>,
    names: &AccountNames,
    sa_uid: &str,
) -> Result<(), CloudConfigError> {
    let rb = rb.ok_or_else(|| CloudConfigError::NotFound {
        step: GET_RB,
        message: format!(
            "rolebindings.rbac.authorization.k8s.io \"{}\" not found",
            names.binding
        ),
    })?;
    objects::check_served_role_binding(rb, names, sa_uid).map_err(|message| {
        CloudConfigError::Foreign {
            step: GET_RB,
            message,
        }
    })
}

/// GET's verdict on the ClusterRoleBinding, as [`judge_role_binding`]'s.
pub(super) fn judge_cluster_role_binding(
    crb: Option<&ClusterRoleBinding>,
    names: &AccountNames,
    sa_uid: &str,
) -> Result<(), CloudConfigError> {
    let crb = crb.ok_or_else(|| CloudConfigError::NotFound {
        step: GET_CRB,
        message: format!(
            "clusterrolebindings.rbac.authorization.k8s.io \"{}\" not found",
            names.binding
        ),
    })?;
    objects::check_served_cluster_role_binding(crb, names, sa_uid).map_err(|message| {
        CloudConfigError::Foreign {
            step: GET_CRB,
            message,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vip_urls() {
        assert_eq!(
            vip_url("192.168.1.10").unwrap(),
            "https://192.168.1.10:6443"
        );
        assert_eq!(
            vip_url("2001:db8::1").unwrap(),
            "https://[2001:db8::1]:6443"
        );
        assert_eq!(vip_url("not-an-ip").unwrap_err(), "invalid vip not-an-ip");
    }
}
