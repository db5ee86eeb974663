//! The accounts this service issued, as `GET /v1/harvester/kubeconfigs` and `harvester-cloud
//! kubeconfig list` show them (never a token value), and the revocation of the accounts of a guest
//! cluster that Rancher removed.
//!
//! An account is a ServiceAccount with our managed-by label; one that anybody else made is never
//! listed nor revoked here. Its guest cluster is known when Rancher made it: the dashboard names the
//! account after the guest cluster (`serviceAccountName` = the cluster's name, in the namespace of
//! its VMs), and Rancher's node driver labels those VMs with the cluster's name.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use k8s_openapi::api::{
    core::v1::{Secret, ServiceAccount},
    rbac::v1::{ClusterRoleBinding, RoleBinding},
};
use serde::{Deserialize, Serialize};

use super::{
    CloudConfig, CloudConfigError, Revocation, Settings,
    naming::AccountNames,
    objects::{self, EXPIRES_AT_ANNOTATION, MANAGED_BY, MANAGED_BY_LABEL, ROTATED_AT_ANNOTATION},
};
use crate::{
    crd::kinds::VirtualMachine,
    store::{Api, Kind, LabelSelector, ObjectStore, StoreError, decode_listed},
};

/// Accounts per page when the caller names no `limit`, and the most it may ask for.
pub(crate) const DEFAULT_LIMIT: usize = 1000;
pub const MAX_LIMIT: usize = 1000;

/// The `kind` of every token listed: a token Secret the token controller fills.
pub(crate) const TOKEN_KIND: &str = "service-account-token";

/// Why the accounts could not be listed or revoked.
#[derive(Debug, thiserror::Error)]
pub enum AccountsError {
    /// A query parameter that cannot be used; the message names it.
    #[error("invalid query: {reason}")]
    Query { reason: String },
    #[error("cannot list the cloud-config accounts: {source}")]
    List {
        #[source]
        source: StoreError,
    },
    #[error("cannot revoke account {namespace}/{service_account}: {source}")]
    Revoke {
        namespace: String,
        service_account: String,
        #[source]
        source: Box<CloudConfigError>,
    },
}

/// What to list: `?namespace=&limit=&continue=`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListQuery {
    pub namespace: Option<String>,
    pub limit: Option<usize>,
    /// The `continue` token of the previous page.
    pub continue_token: Option<String>,
}

impl ListQuery {
    /// Reads a query string; parameters it does not know are ignored, as steve ignores them.
    pub fn parse(query: Option<&str>) -> Result<Self, AccountsError> {
        let bad = |reason: String| AccountsError::Query { reason };
        let mut out = ListQuery::default();
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v).ok_or_else(|| bad(format!("{k} is not valid UTF-8")))?;
            match k {
                "namespace" if out.namespace.is_none() => {
                    crate::validation::dns1123_label(&v)
                        .map_err(|e| bad(format!("namespace {v:?}: {e}")))?;
                    out.namespace = Some(v);
                }
                "limit" if out.limit.is_none() => {
                    let n: usize = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or_else(|| {
                            bad(format!(
                                "limit {v:?} must be a whole number from 1 to {MAX_LIMIT}"
                            ))
                        })?;
                    out.limit = Some(n);
                }
                "continue" if out.continue_token.is_none() && !v.is_empty() => {
                    out.continue_token = Some(v);
                }
                _ => {}
            }
        }
        Ok(out)
    }
}

/// A query value, decoded as Go's `url.QueryUnescape` and required to be UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    String::from_utf8(super::request::query_unescape(s)?).ok()
}

/// Where the next page starts: after this account. Opaque to clients (base64url of JSON).
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
struct Continue {
    #[serde(rename = "n")]
    namespace: String,
    #[serde(rename = "s")]
    service_account: String,
}

impl Continue {
    fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).unwrap_or_default())
    }

    fn decode(token: &str) -> Option<Continue> {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(token).ok()?).ok()
    }
}

/// One binding of an account: its name, whether it exists, and whether it is the account's (owned
/// by the ServiceAccount and binding its role to it alone, as GET requires).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BindingState {
    pub name: String,
    pub exists: bool,
    pub ours: bool,
    /// Why an existing binding is not the account's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bindings {
    pub role_binding: BindingState,
    pub cluster_role_binding: BindingState,
}

/// One token of an account: its Secret, never its value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenInfo {
    pub secret: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    /// The token the account's kubeconfig carries now.
    pub current: bool,
    /// When it stops working (RFC 3339); absent: never. For a token a rotation made and has not
    /// made current yet, the end it has unless the rotation makes it current.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// When a rotation replaced it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotated_at: Option<String>,
    pub kind: String,
}

/// One account this service issued.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Account {
    pub namespace: String,
    pub service_account: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    pub bindings: Bindings,
    pub tokens: Vec<TokenInfo>,
    /// The Rancher guest cluster it was issued for, when its VMs say so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_cluster: Option<String>,
}

/// One page of accounts, ordered by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountPage {
    pub accounts: Vec<Account>,
    /// The store's revision of the ServiceAccounts listed.
    pub revision: String,
    pub limit: usize,
    /// The token of the next page, when there is one.
    pub continue_token: Option<String>,
}

/// Whether a ServiceAccount is an account this service issued.
pub(crate) fn is_ours(sa: &ServiceAccount) -> bool {
    objects::is_managed(&sa.metadata)
}

fn ours() -> LabelSelector {
    LabelSelector::from_labels([(MANAGED_BY_LABEL, MANAGED_BY)])
}

fn timestamp(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<String> {
    meta.creation_timestamp.as_ref().map(|t| t.0.to_string())
}

/// The accounts' read model and the revocation of a removed guest cluster's accounts.
#[derive(Clone)]
pub struct Accounts {
    store: Arc<dyn ObjectStore>,
}

impl Accounts {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Accounts { store }
    }

    /// One page of the accounts this service issued.
    pub async fn list(&self, query: &ListQuery) -> Result<AccountPage, AccountsError> {
        let list_err = |source| AccountsError::List { source };
        let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
        let after = match &query.continue_token {
            Some(token) => Some(Continue::decode(token).ok_or_else(|| AccountsError::Query {
                reason: "continue is not a token this service gave".into(),
            })?),
            None => None,
        };
        let kind = Kind::of::<ServiceAccount>();
        let listed = self
            .store
            .list(&kind, query.namespace.as_deref(), &ours())
            .await
            .map_err(list_err)?;
        let mut sas: Vec<ServiceAccount> = decode_listed(&kind, listed.items);
        // The selector is the store's; the label is checked again so nothing else ever shows.
        sas.retain(is_ours);
        let key = |sa: &ServiceAccount| {
            (
                sa.metadata.namespace.clone().unwrap_or_default(),
                sa.metadata.name.clone().unwrap_or_default(),
            )
        };
        sas.sort_by_key(key);
        if let Some(after) = &after {
            let after = (after.namespace.clone(), after.service_account.clone());
            sas.retain(|sa| key(sa) > after);
        }
        let more = sas.len() > limit;
        sas.truncate(limit);
        let continue_token = more.then(|| {
            let (namespace, service_account) = sas.last().map(key).unwrap_or_default();
            Continue {
                namespace,
                service_account,
            }
            .encode()
        });

        // One list of token Secrets and of VMs per namespace on the page.
        let mut tokens: BTreeMap<String, Vec<Secret>> = BTreeMap::new();
        let mut clusters: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for sa in &sas {
            let ns = key(sa).0;
            if tokens.contains_key(&ns) {
                continue;
            }
            let secrets = Api::<Secret>::new(self.store.clone())
                .list(Some(&ns), &ours())
                .await
                .map_err(list_err)?;
            tokens.insert(ns.clone(), secrets);
            clusters.insert(ns.clone(), self.guest_clusters_in(&ns).await?);
        }
        let mut accounts = Vec::with_capacity(sas.len());
        for sa in &sas {
            let (ns, name) = key(sa);
            let secrets = tokens.get(&ns).map(Vec::as_slice).unwrap_or_default();
            let in_ns = clusters.get(&ns).map(Vec::as_slice).unwrap_or_default();
            accounts.push(self.account(sa, &ns, &name, secrets, in_ns).await?);
        }
        Ok(AccountPage {
            accounts,
            revision: listed.resource_version,
            limit,
            continue_token,
        })
    }

    /// The guest clusters whose VMs Rancher's node driver made in `namespace`.
    async fn guest_clusters_in(&self, namespace: &str) -> Result<Vec<String>, AccountsError> {
        match Api::<VirtualMachine>::new(self.store.clone())
            .list(Some(namespace), &LabelSelector::everything())
            .await
        {
            Ok(vms) => Ok(vms
                .iter()
                .filter_map(|vm| vm.guest_cluster().map(str::to_string))
                .collect()),
            // No VirtualMachine kind here (no KubeVirt): no guest clusters.
            Err(e) if e.is_not_found() => Ok(Vec::new()),
            Err(source) => Err(AccountsError::List { source }),
        }
    }

    async fn account(
        &self,
        sa: &ServiceAccount,
        namespace: &str,
        name: &str,
        secrets: &[Secret],
        guest_clusters: &[String],
    ) -> Result<Account, AccountsError> {
        let list_err = |source| AccountsError::List { source };
        let names = AccountNames::new(namespace, name);
        let uid = sa.metadata.uid.clone().unwrap_or_default();
        let rb = Api::<RoleBinding>::new(self.store.clone())
            .get(namespace, &names.binding)
            .await
            .map_err(list_err)?;
        let crb = Api::<ClusterRoleBinding>::new(self.store.clone())
            .get("", &names.binding)
            .await
            .map_err(list_err)?;
        let state = |verdict: Option<Result<(), String>>| match verdict {
            None => BindingState {
                name: names.binding.clone(),
                exists: false,
                ours: false,
                reason: None,
            },
            Some(verdict) => BindingState {
                name: names.binding.clone(),
                exists: true,
                ours: verdict.is_ok(),
                reason: verdict.err(),
            },
        };
        let bindings = Bindings {
            role_binding: state(rb.map(|rb| objects::check_served_role_binding(&rb, &names, &uid))),
            cluster_role_binding: state(
                crb.map(|crb| objects::check_served_cluster_role_binding(&crb, &names, &uid)),
            ),
        };
        let current = objects::current_token_secret(sa, &names);
        let mut tokens: Vec<TokenInfo> = secrets
            .iter()
            .filter(|s| objects::is_managed(&s.metadata) && objects::is_token_of(s, name))
            .map(|s| {
                let secret = s.metadata.name.clone().unwrap_or_default();
                TokenInfo {
                    current: secret == current,
                    created: timestamp(&s.metadata),
                    // A rotation's new token that is not current yet ends with its rotation's
                    // provisional end, unless the rotation makes it current before.
                    expires_at: annotation(s, EXPIRES_AT_ANNOTATION)
                        .or_else(|| {
                            (secret != current)
                                .then(|| annotation(s, objects::PROVISIONAL_UNTIL_ANNOTATION))
                                .flatten()
                        })
                        .map(str::to_string),
                    rotated_at: annotation(s, ROTATED_AT_ANNOTATION).map(str::to_string),
                    kind: TOKEN_KIND.into(),
                    secret,
                }
            })
            .collect();
        // The current token first, then the newest.
        tokens.sort_by(|a, b| {
            b.current
                .cmp(&a.current)
                .then_with(|| b.created.cmp(&a.created))
                .then_with(|| a.secret.cmp(&b.secret))
        });
        Ok(Account {
            namespace: namespace.into(),
            service_account: name.into(),
            created: timestamp(&sa.metadata),
            bindings,
            tokens,
            guest_cluster: guest_clusters
                .iter()
                .any(|c| c == name)
                .then(|| name.to_string()),
        })
    }

    /// Revokes the account issued for guest cluster `cluster` in `namespace` (the ServiceAccount
    /// named after the cluster), if this service issued it. `None`: there is none of ours.
    pub async fn revoke_of_cluster(
        &self,
        namespace: &str,
        cluster: &str,
    ) -> Result<Option<Revocation>, AccountsError> {
        let revoke_err = |source| AccountsError::Revoke {
            namespace: namespace.into(),
            service_account: cluster.into(),
            source: Box::new(source),
        };
        let sa = Api::<ServiceAccount>::new(self.store.clone())
            .get(namespace, cluster)
            .await
            .map_err(|source| {
                revoke_err(CloudConfigError::Store {
                    step: "fail to get serviceAccount",
                    source,
                })
            })?;
        match sa {
            Some(sa) if is_ours(&sa) => {}
            // None, or someone else's of that name: not ours to touch.
            _ => return Ok(None),
        }
        // Revocation reads none of the settings, which are about rendering kubeconfigs.
        let cloud_config = CloudConfig::new(
            self.store.clone(),
            Settings {
                harvester_namespace: String::new(),
                server_url: None,
                cluster_ca: None,
                token_timeout: Duration::ZERO,
                default_grace: Settings::DEFAULT_GRACE,
                max_grace: Settings::MAX_GRACE,
            },
        );
        cloud_config
            .revoke(namespace, cluster)
            .await
            .map(Some)
            .map_err(revoke_err)
    }
}

fn annotation<'a>(s: &'a Secret, key: &str) -> Option<&'a str> {
    s.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries() {
        assert_eq!(ListQuery::parse(None).unwrap(), ListQuery::default());
        let q = ListQuery::parse(Some("namespace=gc-test&limit=2&continue=abc&x=y")).unwrap();
        assert_eq!(q.namespace.as_deref(), Some("gc-test"));
        assert_eq!(q.limit, Some(2));
        assert_eq!(q.continue_token.as_deref(), Some("abc"));
        for bad in [
            "limit=0",
            "limit=1001",
            "limit=x",
            "namespace=Not_A_Name",
            "namespace=%zz",
        ] {
            assert!(ListQuery::parse(Some(bad)).is_err(), "{bad}");
        }
        assert_eq!(
            ListQuery::parse(Some("namespace=a%2Db"))
                .unwrap()
                .namespace
                .as_deref(),
            Some("a-b")
        );
    }

    #[test]
    fn continue_tokens_round_trip() {
        let c = Continue {
            namespace: "ns".into(),
            service_account: "sa".into(),
        };
        assert_eq!(Continue::decode(&c.encode()), Some(c));
        assert_eq!(Continue::decode("not a token"), None);
    }
}
