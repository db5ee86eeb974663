//! What the reconciler would refuse of a guest Service about to be written, decided up front on
//! the stored objects (the guest cluster's NAD mapping and Services, Harvester's LoadBalancers),
//! with the same decisions ([`super::decide`]) and upstream's messages: so that a client writing
//! guest Services through the HTTP API learns at once what a Kubernetes user learns from an
//! Event, and the Service is left as it was.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Service};

use super::{
    GuestError,
    clusters::ClusterKey,
    decide::{
        is_load_balancer, judge_network, judge_primary, judge_secondary, lb_name_of, primary_of,
    },
    mapping::{annotation, service_key},
    naming, share,
    sharing::{self, Candidate, GroupLb},
};
use crate::{
    crd::{LoadBalancer, keys, lb_api},
    store::{Api, LabelSelector, ObjectStore, StoreError},
};

/// Why a Service may not be written as it is.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The reconciler would refuse it.
    #[error(transparent)]
    Refused(#[from] GuestError),
    /// What the decision needs could not be read (`action` is the store call: `get`, `list`).
    #[error("cannot {action} what service {service} depends on: {source}")]
    Read {
        action: &'static str,
        service: String,
        source: StoreError,
    },
}

/// Refuses `svc` (as it is about to be written into the guest cluster `guest`, of `key`) when
/// the reconciler would; `harvester` holds the LoadBalancers. Services that are not load
/// balancers are never refused.
pub async fn check_write(
    guest: &Arc<dyn ObjectStore>,
    harvester: &Arc<dyn ObjectStore>,
    key: &ClusterKey,
    svc: &Service,
) -> Result<(), CheckError> {
    if !is_load_balancer(svc) {
        return Ok(());
    }
    let svc_key = service_key(svc);
    let read = |action: &'static str| {
        let service = svc_key.clone();
        move |source| CheckError::Read {
            action,
            service,
            source,
        }
    };
    let network = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::SVC_NETWORK))
        .filter(|n| !n.is_empty());
    let nad = match network {
        Some(_) => Api::<ConfigMap>::new(guest.clone())
            .get(keys::NAD_MAPPING_NAMESPACE, keys::NAD_MAPPING_NAME)
            .await
            .map_err(read("get"))?
            .map(|cm| cm.data.and_then(|mut d| d.remove(keys::NAD_MAPPING_KEY))),
        None => None,
    };
    judge_network(svc, nad.as_ref().map(|m| m.as_deref()))?;
    let ctx = key.context();
    let lbs = lb_api(harvester.clone());
    let lb_of = async |s: &Service| -> Result<Option<LoadBalancer>, CheckError> {
        match lb_name_of(&ctx.cluster, s) {
            Some(lb_name) => lbs
                .get(&ctx.lb_namespace, &lb_name)
                .await
                .map_err(read("get")),
            None => Ok(None),
        }
    };
    if let Some(key) = sharing::sharing_key(svc)? {
        let namespace = svc.metadata.namespace.clone().unwrap_or_default();
        let group = naming::shared_load_balancer_name(&ctx.cluster, &namespace, &key.value);
        let services = Api::<Service>::new(guest.clone());
        let listed = services
            .list(Some(&namespace), &LabelSelector::everything())
            .await
            .map_err(read("list"))?;
        let stored = listed.iter().find(|s| service_key(s) == svc_key);
        let recorded =
            |s: &Service| annotation(s, keys::SVC_SHARED_LOAD_BALANCER) == Some(group.as_str());
        // Who names whom as primary (a member may not be one).
        let secondaries = |s: &Service| -> Vec<String> {
            let name = s.metadata.name.as_deref().unwrap_or_default();
            listed
                .iter()
                .filter(|o| {
                    o.metadata.deletion_timestamp.is_none()
                        && primary_of(o).ok().flatten()
                            == Some((namespace.clone(), name.to_string()))
                })
                .map(service_key)
                .collect()
        };
        let mut candidates: Vec<Candidate<'_>> = listed
            .iter()
            .filter(|s| {
                service_key(s) != svc_key
                    && is_load_balancer(s)
                    && s.metadata.deletion_timestamp.is_none()
                    && sharing::sharing_key(s)
                        .ok()
                        .flatten()
                        .is_some_and(|k| k.value == key.value)
            })
            .map(|s| Candidate {
                svc: s,
                admitted: recorded(s),
                secondaries: secondaries(s),
            })
            .collect();
        // The Service as it is to be written, admitted as far as the stored one was.
        let mut incoming = svc.clone();
        if incoming.metadata.creation_timestamp.is_none() {
            incoming.metadata.creation_timestamp =
                stored.and_then(|s| s.metadata.creation_timestamp.clone());
        }
        candidates.push(Candidate {
            svc: &incoming,
            admitted: stored.is_some_and(recorded),
            secondaries: secondaries(svc),
        });
        let lb = lbs
            .get(&ctx.lb_namespace, &group)
            .await
            .map_err(read("get"))?;
        let view = lb.as_ref().map(GroupLb::of);
        let decision = sharing::decide(&key, &candidates, view.as_ref());
        if let Some(refusal) = decision.refused.get(&svc_key) {
            return Err(refusal.clone().into());
        }
        return Ok(());
    }
    match primary_of(svc)? {
        Some((pns, pname)) => {
            let services = Api::<Service>::new(guest.clone());
            let primary = services.get(&pns, &pname).await.map_err(read("get"))?;
            let primary_lb = match &primary {
                Some(p) => lb_of(p).await?,
                None => None,
            };
            let label_value = share::primary_label_value(&pns, &pname);
            let others: Vec<Service> = services
                .list(
                    None,
                    &LabelSelector::from_labels([(keys::SVC_PRIMARY, label_value.as_str())]),
                )
                .await
                .map_err(read("list"))?
                .into_iter()
                .filter(|s| {
                    s.metadata.deletion_timestamp.is_none()
                        && service_key(s) != service_key(svc)
                        && primary_of(s).ok().flatten() == Some((pns.clone(), pname.clone()))
                })
                .collect();
            let refs: Vec<&Service> = others.iter().collect();
            judge_secondary(
                svc,
                (&pns, &pname),
                primary.as_ref(),
                primary_lb.as_ref(),
                &refs,
            )?;
        }
        None => {
            let existing = lb_of(svc).await?;
            judge_primary(svc, &ctx, existing.as_ref())?;
        }
    }
    Ok(())
}
