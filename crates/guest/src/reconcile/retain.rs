//! The LoadBalancer of a deleted DHCP Service, kept for a while for its lease record
//! ([`super::super::dhcp`]): a Service recreated under the same name takes the record (the new
//! LoadBalancer is made with it, and the kept one is deleted then), else it is deleted once its
//! time is up (`cloudprovider.harvesterhci.io/dhcpRetainedUntil`). A DHCP LoadBalancer holds no
//! pool address, so keeping it holds nothing but the record; one whose record a recreated Service
//! would get anyway (no lease, no host name, the MAC address made from its name) is deleted at once
//! as before.

use std::{sync::Arc, time::Duration};

use k8s_openapi::{
    api::core::v1::Service,
    jiff::{SignedDuration, Timestamp, Unit},
};
use tracing::info;

use super::{Ctx, SyncError};
use crate::{
    controller::{Target, modify},
    crd::{
        LoadBalancer,
        dhcp::{self as record, DhcpRecord},
        keys,
    },
    decide::service_of,
    dhcp,
    mapping::{annotation, service_key},
    store::{Preconditions, StoreError},
};

/// What becomes of a LoadBalancer whose Service is gone.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Deleted now.
    Delete,
    /// Kept for its record: marked now, looked at again after this long.
    Retire,
    /// Kept for its record until then: looked at again after this long.
    Keep(Duration),
}

/// A LoadBalancer's lease record, if it has a readable one.
pub(super) fn record_of(lb: &LoadBalancer) -> Option<DhcpRecord> {
    let annotations = lb.metadata.annotations.clone().unwrap_or_default();
    record::record_of(&annotations.into_iter().collect())
        .ok()
        .filter(|r| !r.is_empty())
}

fn lb_annotation<'a>(lb: &'a LoadBalancer, key: &str) -> Option<&'a str> {
    lb.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// Whether a DHCP LoadBalancer's record is worth keeping after its Service ([`dhcp::worth_keeping`]);
/// never with no retention.
pub(super) fn worth_keeping(ctx: &Ctx, lb: &LoadBalancer) -> bool {
    if ctx.record_retention().is_zero() {
        return false;
    }
    let (Some(svc), Some(r)) = (service_of(&ctx.cluster, lb), record_of(lb)) else {
        return false;
    };
    lb.is_dhcp()
        && dhcp::worth_keeping(
            &r,
            &ctx.cluster.identity,
            svc.namespace.as_deref().unwrap_or_default(),
            &svc.name,
        )
}

/// What to do with a left-over LoadBalancer (its Service gone or recreated) at `now`.
pub(super) fn verdict(ctx: &Ctx, lb: &LoadBalancer, now: Timestamp) -> Verdict {
    if !lb.is_dhcp() {
        return Verdict::Delete;
    }
    match lb_annotation(lb, keys::ANNOTATION_DHCP_RETAINED_UNTIL) {
        // An unreadable time (admission refuses one) counts as up.
        Some(until) => match record::retained_until(until) {
            Ok(until) if until > now => {
                Verdict::Keep(until.duration_since(now).unsigned_abs() + Duration::from_secs(1))
            }
            _ => Verdict::Delete,
        },
        None if worth_keeping(ctx, lb) => Verdict::Retire,
        None => Verdict::Delete,
    }
}

/// Marks a LoadBalancer as kept until `now` plus the retention; `false` when it is gone.
pub(super) async fn retire(ctx: &Ctx, lb: &LoadBalancer) -> Result<bool, SyncError> {
    let until = Timestamp::now()
        .checked_add(
            SignedDuration::try_from(ctx.record_retention()).unwrap_or(SignedDuration::MAX),
        )
        .unwrap_or(Timestamp::MAX)
        .round(Unit::Second)
        .unwrap_or(Timestamp::MAX)
        .to_string();
    let name = lb.metadata.name.as_deref().unwrap_or_default();
    let written = modify(&ctx.lbs, lb, Target::Object, |l| {
        let a = l.metadata.annotations.get_or_insert_default();
        if a.contains_key(keys::ANNOTATION_DHCP_RETAINED_UNTIL) {
            return false;
        }
        a.insert(keys::ANNOTATION_DHCP_RETAINED_UNTIL.into(), until.clone());
        true
    })
    .await
    .map_err(|source| SyncError::WriteLoadBalancer {
        lb: ctx.lb_ref(name),
        source,
    })?;
    if written.as_ref().is_some_and(|m| m.written) {
        info!(lb = %ctx.lb_ref(name), %until, "kept the load balancer of a deleted service for its DHCP lease record");
    }
    Ok(written.is_some())
}

/// The LoadBalancers a DHCP Service about to get its LoadBalancer may take a record from: this
/// cluster's, made for a Service of its namespace and name with another UID (deleted, whether or
/// not the collector looked at it yet), DHCP, on the Service's network, with a record. The most
/// recent first.
pub(super) fn donors(ctx: &Ctx, svc: &Service) -> Vec<Arc<LoadBalancer>> {
    let me = service_key(svc);
    let network = annotation(svc, keys::SVC_NETWORK).unwrap_or_default();
    let uid = svc.metadata.uid.as_deref().unwrap_or_default();
    let mut found: Vec<Arc<LoadBalancer>> = ctx
        .lb_cache
        .state()
        .into_iter()
        .filter(|lb| {
            service_of(&ctx.cluster, lb).is_some_and(|r| {
                r.name == svc.metadata.name.as_deref().unwrap_or_default()
                    && format!("{}/{}", r.namespace.as_deref().unwrap_or_default(), r.name) == me
            }) && lb.metadata.deletion_timestamp.is_none()
                && lb.is_dhcp()
                && lb_annotation(lb, keys::ANNOTATION_SERVICE_UID).is_some_and(|u| u != uid)
                && lb_annotation(lb, keys::ANNOTATION_SERVICE_NETWORK).unwrap_or_default()
                    == network
                && record_of(lb).is_some()
        })
        .collect();
    found.sort_by(|a, b| {
        b.metadata
            .creation_timestamp
            .cmp(&a.metadata.creation_timestamp)
    });
    found
}

/// Deletes the LoadBalancers whose record Service `key` took (only those very objects).
pub(super) async fn release(
    ctx: &Ctx,
    key: &str,
    donors: &[Arc<LoadBalancer>],
) -> Result<(), SyncError> {
    for lb in donors {
        let name = lb.metadata.name.as_deref().unwrap_or_default();
        let preconditions = Preconditions {
            uid: lb.metadata.uid.clone(),
            resource_version: None,
        };
        ctx.forget_lb(name);
        match ctx
            .lbs
            .delete(ctx.lb_namespace(), name, &preconditions)
            .await
        {
            Ok(_) => {
                info!(service = %key, lb = %ctx.lb_ref(name), "deleted the load balancer whose DHCP lease record the service took")
            }
            Err(e) if e.is_not_found() || matches!(e, StoreError::Conflict { .. }) => {}
            Err(source) => {
                return Err(SyncError::DeleteLoadBalancer {
                    lb: ctx.lb_ref(name),
                    source,
                });
            }
        }
    }
    Ok(())
}

/// The retention, for an Event's message: `10m`, `90s`.
pub(super) fn shown(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        s if s >= 3600 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s >= 60 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}
