//! A primary Service's own LoadBalancers: one per address family it asks for, created or brought to
//! their plans, and the addresses written back once they have them.

use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::ObjectRef;
use tracing::info;

use super::{
    Action, Ctx, SyncError, WAIT_RECHECK, missing, reason, report_address, retain, write_back,
};
use crate::{
    controller::{Target, events::EventType, modify},
    crd::{LoadBalancer, keys},
    store::{Preconditions, StoreError},
    {
        decide::{
            empty_label, judge_slot, lb_name_of, lb_names_of, new_lb, not_ready_message,
            set_annotation, slot_names, update_lb,
        },
        dhcp,
        mapping::{self, LbPlan},
    },
};

/// A primary: its LoadBalancers (one per address family it asks for, see
/// [`mapping::addressing`]), and once they have addresses, the addresses written back in the
/// order of its families. `RequireDualStack` waits for every family; `PreferDualStack` takes those
/// there are.
pub(super) async fn primary(
    svc: &Service,
    key: &str,
    interface: Option<String>,
    ctx: &Ctx,
) -> Result<Action, SyncError> {
    lb_name_of(&ctx.cluster.cluster, svc).ok_or(missing("metadata.uid"))?;
    let addressing = match mapping::addressing(svc) {
        Ok(addressing) => addressing,
        Err(e) => return Ok(ctx.refuse(svc, key, e.to_string())),
    };
    let names = slot_names(&ctx.cluster.cluster, svc, &addressing);
    // The LoadBalancer of a family the Service no longer asks for goes (its finalizer releases
    // the address); the first one is never among them.
    for stale in lb_names_of(&ctx.cluster.cluster, svc)
        .unwrap_or_default()
        .into_iter()
        .skip(1)
        .filter(|n| !names.contains(n))
    {
        delete_own_lb(ctx, key, &stale).await?;
    }
    let mut lbs = Vec::with_capacity(names.len());
    for (index, slot) in addressing.slots.iter().enumerate() {
        match ensure_slot(svc, key, ctx, index, slot).await? {
            Ok(found) => lbs.push(found),
            Err(action) => return Ok(action),
        }
    }
    if let Some((lb, plan, lb_key)) = lbs.first() {
        report_address(lb, plan, lb_key, ctx).await?;
    }
    let mut ips = Vec::with_capacity(lbs.len());
    let mut waiting = None;
    for (lb, plan, _) in &lbs {
        let ip = lb
            .status
            .as_ref()
            .map(|s| s.allocated_address.ip.clone())
            .unwrap_or_default();
        let refused = not_ready_message(lb);
        if ip.is_empty() {
            if waiting.is_none() {
                waiting = Some((plan.ipam.clone(), refused));
            }
            continue;
        }
        if let Some(message) = refused {
            // It keeps its address, and refuses what the Service asks now (a requested address
            // that is held or outside its pools).
            ctx.report(svc, key, EventType::Warning, reason::SYNC_FAILED, message);
        }
        ips.push(ip);
    }
    if let Some((ipam, refused)) = &waiting
        && (ips.is_empty() || addressing.require_all)
    {
        // Still waiting: the LoadBalancer's next change brings this Service back. Nothing is
        // deleted on a timeout (upstream's delete/recreate churn).
        if let Some(message) = refused {
            let prefix = if addressing.require_all && !ips.is_empty() {
                "RequireDualStack: "
            } else {
                ""
            };
            let message = format!("{prefix}ip is not allocated, mode: {ipam}, message: {message}");
            ctx.report(svc, key, EventType::Warning, reason::SYNC_FAILED, message);
        }
        return Ok(Action::requeue(WAIT_RECHECK));
    }
    let joined = ips.join(",");
    let lease = lbs.first().and_then(|(_, plan, _)| plan.dhcp.clone());
    let ingress: Vec<&str> = ips
        .iter()
        .map(String::as_str)
        .filter(|ip| *ip != keys::DHCP_ADDRESS)
        .collect();
    let written = write_back(svc, key, ctx, &ingress, |s| {
        let mut changed = set_annotation(s, keys::KUBE_VIP_IPS, &joined);
        if let Some(i) = &interface {
            changed |= set_annotation(s, keys::KUBE_VIP_INTERFACE, i);
        }
        // In the same write as the DHCP mark, so kube-vip starts its lease with them.
        if let Some(record) = &lease {
            changed |= dhcp::write_back(s, record);
        }
        // As upstream: a primary-service label left from a time as a secondary is emptied (not
        // removed); none is added.
        changed | empty_label(s, keys::SVC_PRIMARY)
    })
    .await?;
    if written {
        let lb_keys: Vec<&str> = lbs.iter().map(|(_, _, k)| k.as_str()).collect();
        info!(service = %key, lb = %lb_keys.join(","), ip = %joined, "service has its address");
        let message = match lb_keys.as_slice() {
            [one] => format!("Ensured load balancer {one} with address {joined}"),
            many => format!(
                "Ensured load balancers {} with addresses {joined}",
                many.join(",")
            ),
        };
        ctx.report(svc, key, EventType::Normal, reason::ENSURED, message);
    }
    if waiting.is_some() {
        // PreferDualStack with a family still to come: its LoadBalancer's change brings it.
        return Ok(Action::requeue(WAIT_RECHECK));
    }
    Ok(Action::await_change())
}

/// Creates or updates the LoadBalancer of one slot of a primary Service: `Ok(Err(action))` when the
/// Service cannot go on now (refused, or that LoadBalancer is going).
async fn ensure_slot(
    svc: &Service,
    key: &str,
    ctx: &Ctx,
    index: usize,
    slot: &mapping::Slot,
) -> Result<Result<(LoadBalancer, LbPlan, String), Action>, SyncError> {
    let lb_name = mapping::slot_lb_name(&ctx.cluster.cluster, svc, index, slot.family);
    let lb_key = ctx.lb_ref(&lb_name);
    let cached = ctx.lb_as_known(&lb_name);
    if cached
        .as_ref()
        .is_some_and(|lb| lb.metadata.deletion_timestamp.is_some())
    {
        // Its deletion (by hand, or by a garbage collection racing a recreated Service) finishes
        // first; the LoadBalancer's Delete event brings this Service back.
        return Ok(Err(Action::requeue(WAIT_RECHECK)));
    }
    // A DHCP Service about to get its LoadBalancer takes the lease record a deleted Service of its
    // name left.
    let donors = if cached.is_none() && index == 0 && mapping::service_ipam(svc) == "dhcp" {
        retain::donors(ctx, svc)
    } else {
        Vec::new()
    };
    let carried = donors.first().and_then(|d| retain::record_of(d));
    let plan = match judge_slot(
        svc,
        &ctx.cluster,
        cached.as_deref(),
        index,
        slot,
        carried.as_ref(),
    ) {
        Ok(plan) => plan,
        Err(e) => return Ok(Err(ctx.refuse(svc, key, e.to_string()))),
    };
    let lb = match write_lb(svc, key, ctx, cached.as_deref(), &plan).await? {
        Ok(lb) => lb,
        Err(action) => return Ok(Err(action)),
    };
    if let (Some(record), Some(donor)) = (&carried, donors.first()) {
        let from = ctx.lb_ref(donor.metadata.name.as_deref().unwrap_or_default());
        info!(service = %key, lb = %lb_key, %from, "took the DHCP lease record of a deleted service of this name");
        ctx.report(
            svc,
            key,
            EventType::Normal,
            reason::ENSURED,
            format!(
                "Took the DHCP lease record of load balancer {from} (MAC address {}{}) for load balancer {lb_key}",
                record.mac.as_deref().unwrap_or_default(),
                record
                    .leased
                    .as_deref()
                    .map(|a| format!(", leased address {a}"))
                    .unwrap_or_default()
            ),
        );
        retain::release(ctx, key, &donors).await?;
    }
    Ok(Ok((lb, plan, lb_key)))
}

/// Creates the LoadBalancer of `plan` (or brings `cached` to it) for Service `svc`:
/// `Ok(Err(action))` when the Service cannot go on now (admission refused it, or it was deleted
/// meanwhile).
pub(super) async fn write_lb(
    svc: &Service,
    key: &str,
    ctx: &Ctx,
    cached: Option<&LoadBalancer>,
    plan: &LbPlan,
) -> Result<Result<LoadBalancer, Action>, SyncError> {
    let lb_name = &plan.name;
    let lb_key = ctx.lb_ref(lb_name);
    let write_failed = |source| SyncError::WriteLoadBalancer {
        lb: lb_key.clone(),
        source,
    };
    // The LoadBalancer as the store answered, and whether it is newer than the cache may be.
    let lb = match cached {
        None => match ctx.lbs.create(&new_lb(plan)).await {
            Ok(lb) => {
                info!(service = %key, lb = %lb_key, ipam = %plan.ipam, "created load balancer");
                Some((lb, true))
            }
            Err(e) if e.is_already_exists() => {
                // Made by an earlier pass the cache does not show yet: update it instead. What
                // is read here is newer than the cache too.
                let fresh = ctx
                    .lbs
                    .get(ctx.lb_namespace(), lb_name)
                    .await
                    .map_err(write_failed)?;
                match fresh {
                    Some(fresh) => modify(&ctx.lbs, &fresh, Target::Object, |l| update_lb(l, plan))
                        .await
                        .map_err(write_failed)?
                        .map(|m| (m.object, true)),
                    None => None,
                }
            }
            Err(source @ (StoreError::Invalid { .. } | StoreError::Refused { .. })) => {
                return Ok(Err(ctx.refuse(svc, key, write_failed(source).to_string())));
            }
            Err(e) => return Err(write_failed(e)),
        },
        Some(lb) => match modify(&ctx.lbs, lb, Target::Object, |l| update_lb(l, plan)).await {
            // Only a version this call wrote is one the watch may not have delivered yet.
            Ok(lb) => lb.map(|m| (m.object, m.written)),
            Err(source @ (StoreError::Invalid { .. } | StoreError::Refused { .. })) => {
                return Ok(Err(ctx.refuse(svc, key, write_failed(source).to_string())));
            }
            Err(e) => return Err(write_failed(e)),
        },
    };
    match lb {
        Some((lb, fresh)) => {
            if fresh {
                ctx.knows_lb(lb.clone());
            }
            Ok(Ok(lb))
        }
        // Deleted meanwhile: its Delete event brings this Service back.
        None => {
            ctx.forget_lb(lb_name);
            Ok(Err(Action::requeue(WAIT_RECHECK)))
        }
    }
}

/// Deletes one of the Service's own LoadBalancers, if the cache shows it.
pub(super) async fn delete_own_lb(ctx: &Ctx, key: &str, name: &str) -> Result<bool, SyncError> {
    if ctx
        .lb_cache
        .get(&ObjectRef::new(name).within(ctx.lb_namespace()))
        .is_none()
    {
        return Ok(false);
    }
    let deleted = ctx.delete_lb(name, &Preconditions::default()).await?;
    if deleted {
        info!(service = %key, lb = %ctx.lb_ref(name), "deleted a load balancer the service no longer needs");
    }
    Ok(deleted)
}
