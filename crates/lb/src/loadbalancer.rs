//! The LoadBalancer reconciler: finalizer first, then an idempotent apply (take an address from a pool,
//! or mark DHCP) and a cleanup that releases the address and tolerates allocation never having run.
//!
//! The pool is the source of truth: every pass asks the pool task for the address the load balancer
//! holds (a no-op when it already holds one), so a status that disagrees with the pool after a crash
//! is corrected from the pool rather than trusted. The pool status is written before the
//! LoadBalancer's, so a crash in between leaves an address held by its owner, which the next pass
//! finds again.
//!
//! Differences from upstream, on purpose: an empty `spec.ipam` is pool everywhere, including the
//! release on deletion (upstream leaks it); a load balancer refused by an exhausted pool is woken by
//! the pool's next release instead of backing off; Events are emitted; the Ready condition carries a
//! reason (`NoMatchedIPPool`, `PoolExhausted`, `AllocationFailed`, `RequestedAddressTaken`,
//! `RequestedAddressUnavailable`) next to upstream's message; a deletion whose pool is already gone
//! completes instead of blocking on "fail to get allocator". Beyond upstream: a requested address
//! (`loadbalancer.harvesterhci.io/requestedIP`) and an address family (`…/ipFamily`), and an
//! `AddressAllocated` condition that says when the current address was allocated.

use std::{net::IpAddr, sync::Arc, time::Duration};

use crate::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tracing::{debug, info, trace, warn};

use super::{
    LbCtx,
    pools::{PoolOp, PoolOpError, PoolReply, Want, set_condition, set_ready},
    sharing, vm,
};

mod shared;
use crate::{
    controller::{
        Event, FinalizerError,
        events::{EventType, reason},
        finalizer,
    },
    crd::{
        AllocatedAddress, LB_FINALIZER, LoadBalancer, LoadBalancerStatus,
        keys::{CONDITION_ADDRESS_ALLOCATED, DHCP_ADDRESS, SKIP_ADDRESSES},
    },
    ipam::{PoolEntry, PoolIndex, PoolPlan, RangeSet, SelectError, WorkloadType, plan_pool},
    store::StoreError,
};

/// Fallback re-check of a load balancer waiting for a pool to free an address; the event
/// normally comes first.
const EXHAUSTED_RECHECK: Duration = Duration::from_secs(60);

/// A failed reconcile of one LoadBalancer (the controller retries it with back-off).
#[derive(Debug, thiserror::Error)]
pub enum LbError {
    #[error("load balancer has no {field}")]
    MissingField { field: &'static str },
    #[error(transparent)]
    Finalizer(#[from] FinalizerError),
    #[error("cannot read load balancer {key}: {source}")]
    Read { key: String, source: StoreError },
    #[error("cannot write the status of load balancer {key}: {source}")]
    WriteStatus { key: String, source: StoreError },
    #[error("load balancer {key}: fail to release ip {ip}, error: {source}")]
    Release {
        key: String,
        ip: String,
        source: PoolOpError,
    },
    #[error("load balancer {key}: {source}")]
    Allocate { key: String, source: PoolOpError },
    #[error(transparent)]
    Vm(#[from] super::vm::VmError),
    #[error("the reconciler is stopping")]
    Stopping,
}

impl LbError {
    /// A conflict only means the object moved on; the next event brings the new version.
    pub fn is_conflict(&self) -> bool {
        match self {
            LbError::Finalizer(e) => e.is_conflict(),
            LbError::WriteStatus { source, .. } => matches!(source, StoreError::Conflict { .. }),
            LbError::Vm(e) => e.is_conflict(),
            _ => false,
        }
    }
}

pub use super::refusal::Refusal;

pub async fn reconcile(lb: Arc<LoadBalancer>, ctx: Arc<LbCtx>) -> Result<Action, LbError> {
    let namespace = lb.metadata.namespace.clone().ok_or(LbError::MissingField {
        field: "metadata.namespace",
    })?;
    let name = lb.metadata.name.clone().ok_or(LbError::MissingField {
        field: "metadata.name",
    })?;
    let key = format!("{namespace}/{name}");
    trace!(lb = %key, deleting = lb.metadata.deletion_timestamp.is_some(), resource_version = lb.metadata.resource_version.as_deref().unwrap_or_default(), "reconcile");
    let action = match reconcile_once(lb, &key, &ctx).await {
        Err(e) if e.is_conflict() => {
            // The cached copy was stale, typically just behind this controller's own last write:
            // once more on the stored object instead of backing off.
            let fresh = ctx
                .lbs
                .get(&namespace, &name)
                .await
                .map_err(|source| LbError::Read {
                    key: key.clone(),
                    source,
                })?;
            match fresh {
                None => Action::await_change(),
                // Boxed: rare, and inline a second reconcile's worth of future in every one.
                Some(fresh) => Box::pin(reconcile_once(Arc::new(fresh), &key, &ctx)).await?,
            }
        }
        other => other?,
    };
    ctx.backoff.succeeded(&key);
    Ok(action)
}

async fn reconcile_once(lb: Arc<LoadBalancer>, key: &str, ctx: &LbCtx) -> Result<Action, LbError> {
    finalizer(&ctx.lbs, LB_FINALIZER, lb, |event| async move {
        match event {
            Event::Apply(lb) => apply(lb, key, ctx).await,
            // The deletion path is boxed (as are the VM parts, the finalizer's one-time write and
            // the conflict retry): inline, its futures would size every reconcile's future, and
            // the controller holds up to `--lb-concurrency` of them (see
            // `tests::a_reconcile_in_flight_is_small`).
            Event::Cleanup(lb, release) => {
                Box::pin(cleanup(&lb, key, ctx)).await?;
                Box::pin(release.release(&lb)).await?;
                ctx.forget_applied(key);
                Ok(Action::await_change())
            }
        }
    })
    .await
}

async fn apply(mut lb: LoadBalancer, key: &str, ctx: &LbCtx) -> Result<Action, LbError> {
    ctx.applied_at(key, &lb);
    let current = lb.status.clone().unwrap_or_default();
    let mut status = current.clone();
    let mut shared_with = None;
    // Boxed: not live while the address is allocated, so apply's own future need not hold it.
    let outcome = match Box::pin(shared::apply(&lb, key, &mut status, ctx)).await? {
        shared::Shared::Served { outcome, holder } => {
            shared_with = holder;
            Ok(outcome)
        }
        shared::Shared::NotShared if lb.is_dhcp() => {
            dhcp(&lb, key, &mut status, ctx).await.map(|()| Ok(None))
        }
        shared::Shared::NotShared => pool(&lb, key, &mut status, ctx).await,
    };
    let mut outcome = outcome?;
    let mut deferred = None;
    if let Ok(recheck) = &outcome
        && lb.workload_type() == WorkloadType::Vm
    {
        // The address is there: the Service, the backends and their health (upstream's order).
        // Boxed, as is the VM cleanup: their futures are the largest of a reconcile's, and
        // inline they would make every one of the `--lb-concurrency` reconciles in flight as
        // large, VM load balancer or not (see `tests::a_reconcile_in_flight_is_small`).
        match Box::pin(vm::ensure(&lb, key, &mut status, ctx)).await? {
            vm::Outcome::Ready => {}
            vm::Outcome::Refused(refusal) => outcome = Err(refusal),
            vm::Outcome::Deferred(wait) => deferred = Some(recheck.map_or(wait, |r| r.min(wait))),
        }
    }
    let (action, refusal) = match (outcome, deferred) {
        // Not decidable yet: Ready stays as it is.
        (Ok(_), Some(wait)) => (Action::requeue(wait), None),
        (Ok(recheck), None) => {
            set_ready(&mut status.conditions, true, "", "");
            (
                recheck.map_or_else(Action::await_change, Action::requeue),
                None,
            )
        }
        (Err(refusal), _) => {
            set_ready(
                &mut status.conditions,
                false,
                refusal.reason,
                &refusal.message,
            );
            let action = refusal
                .recheck
                .map_or_else(Action::await_change, Action::requeue);
            (action, Some(refusal))
        }
    };
    if status == current {
        return Ok(action);
    }
    // Written from this copy itself rather than a clone (every reconcile holds it in its future,
    // and the clone was a deep one): what follows reads only its metadata.
    lb.status = Some(status.clone());
    if let Err(source) = ctx.lbs.replace_status(&lb).await {
        if source.is_not_found() {
            return Ok(Action::await_change());
        }
        return Err(LbError::WriteStatus {
            key: key.into(),
            source,
        });
    }
    let (was, now) = (&current.allocated_address, &status.allocated_address);
    if let Some(holder) = shared_with.filter(|_| was != now && !now.ip.is_empty()) {
        info!(lb = %key, ip = %now.ip, %holder, "shares its group's address");
        ctx.events.record(
            &lb,
            EventType::Normal,
            sharing::SHARED,
            format!(
                "shares {} (IP pool {}) with load balancer {holder}",
                now.ip, now.ip_pool
            ),
        );
    } else if was != now && !now.ip.is_empty() {
        let message = if now.ip_pool.is_empty() {
            format!("{} marks the address for DHCP in the guest", now.ip)
        } else {
            format!("allocated {} from IP pool {}", now.ip, now.ip_pool)
        };
        info!(lb = %key, ip = %now.ip, pool = %now.ip_pool, "allocated address");
        ctx.events
            .record(&lb, EventType::Normal, reason::ALLOCATED, message);
    }
    if let Some(refusal) = refusal {
        debug!(lb = %key, reason = refusal.reason, message = %refusal.message, "no address");
        ctx.events
            .record(&lb, EventType::Warning, refusal.reason, refusal.message);
    }
    Ok(action)
}

/// DHCP: the guest's kube-vip leases the address; the controller only marks it `0.0.0.0`, after
/// releasing a pool address the object may still hold from before.
async fn dhcp(
    lb: &LoadBalancer,
    key: &str,
    status: &mut LoadBalancerStatus,
    ctx: &LbCtx,
) -> Result<(), LbError> {
    let old = status.allocated_address.ip_pool.clone();
    if !old.is_empty() {
        release_from(lb, key, &old, ctx).await?;
        status.address.clear();
    }
    let want = AllocatedAddress {
        ip: DHCP_ADDRESS.into(),
        ..AllocatedAddress::default()
    };
    if status.allocated_address != want {
        status.allocated_address = want;
    }
    mark_allocated(&mut status.conditions, None);
    Ok(())
}

/// Pool IPAM (also for an empty `spec.ipam`). The outer error is a failure to retry; the inner one a
/// refusal to report on the object.
///
/// A requested address (`loadbalancer.harvesterhci.io/requestedIP`) is taken from the first pool
/// selection allows for this load balancer whose ranges hold it ([`PoolIndex::eligible`]), and from
/// no other: held by another load balancer or outside every such pool, the load balancer is refused
/// and gets nothing else. A load balancer that holds an address and asks for another moves only once
/// the new one is its own (in another pool, the old one is released after).
pub(crate) async fn pool(
    lb: &LoadBalancer,
    key: &str,
    status: &mut LoadBalancerStatus,
    ctx: &LbCtx,
) -> Result<Result<Option<Duration>, Refusal>, LbError> {
    let waiter = ObjectRef::from_obj(lb);
    let (requested, family) = match lb.address_request() {
        Ok(request) => request,
        Err(message) => {
            return Ok(Err(Refusal::new(
                reason::REQUESTED_ADDRESS_UNAVAILABLE,
                message,
                None,
            )));
        }
    };
    if let PoolPlan::Release { pool } =
        plan_pool(&status.allocated_address.ip_pool, &lb.spec.ip_pool)
    {
        let pool = pool.to_string();
        release_from(lb, key, &pool, ctx).await?;
        status.allocated_address = AllocatedAddress::default();
        status.address.clear();
        mark_allocated(&mut status.conditions, None);
    }
    let held = status.allocated_address.ip_pool.clone();
    let (chosen, want) = match requested {
        Some(ip) if !held.is_empty() && status.allocated_address.ip == ip.to_string() => {
            (held.clone(), Want::Exactly(ip))
        }
        Some(ip) => match pool_holding(lb, ip, ctx) {
            Ok(pool) => (pool, Want::Exactly(ip)),
            Err(refusal) => return Ok(Err(refusal)),
        },
        None if !held.is_empty() => (held.clone(), Want::Any(family)),
        None => match select(lb, ctx).await? {
            Ok(pool) => (pool, Want::Any(family)),
            Err(e) => {
                return Ok(Err(ctx.unmatched(
                    waiter,
                    reason::NO_MATCHED_IP_POOL,
                    e.to_string(),
                )));
            }
        },
    };
    let op = PoolOp::Allocate {
        id: lb.applicant(),
        want,
        waiter: waiter.clone(),
    };
    match ctx.pools.call(&chosen, op).await {
        Ok(PoolReply::Allocated(a)) => {
            if !held.is_empty() && held != chosen {
                // Moved to a requested address of another pool: the old one goes now that the new
                // one is held (a crash in between leaves both to the owner; the next pass releases).
                release_from(lb, key, &held, ctx).await?;
            }
            let ip = a.ip.to_string();
            mark_allocated(
                &mut status.conditions,
                Some(&format!("{ip} from IP pool {chosen}")),
            );
            status.allocated_address = AllocatedAddress {
                ip_pool: chosen,
                ip: ip.clone(),
                mask: a.mask.to_string(),
                gateway: a.gateway.map(|g| g.to_string()).unwrap_or_default(),
            };
            status.address = ip;
            Ok(Ok(None))
        }
        Ok(other) => {
            warn!(lb = %key, reply = ?other, "unexpected reply to an allocation");
            Ok(Ok(Some(Duration::from_secs(1))))
        }
        Err(e) if e.is_exhausted() => Ok(Err(Refusal {
            reason: reason::POOL_EXHAUSTED,
            message: e.to_string(),
            recheck: Some(EXHAUSTED_RECHECK),
        })),
        Err(e) if e.holder().is_some() => {
            let holder = e.holder().unwrap_or_default();
            let ip = requested.map(|ip| ip.to_string()).unwrap_or_default();
            let keeps = if held.is_empty() {
                String::new()
            } else {
                format!("; keeps {}", status.allocated_address.ip)
            };
            Ok(Err(Refusal {
                reason: reason::REQUESTED_ADDRESS_TAKEN,
                message: format!(
                    "requested address {ip} is held by {holder} in IP pool {chosen}{keeps}"
                ),
                // The pool's next release wakes it; this is a fallback.
                recheck: Some(EXHAUSTED_RECHECK),
            }))
        }
        // Woken by the pool's next change.
        Err(
            e @ (PoolOpError::Missing { .. }
            | PoolOpError::Deleting { .. }
            | PoolOpError::InvalidSkip { .. }),
        ) => Ok(Err(ctx.unmatched(
            waiter,
            reason::ALLOCATION_FAILED,
            e.to_string(),
        ))),
        // The pool began skipping it after the check above read the cache.
        Err(e) if e.is_skipped() => Ok(Err(ctx.unmatched(
            waiter,
            reason::REQUESTED_ADDRESS_UNAVAILABLE,
            e.to_string(),
        ))),
        Err(e @ PoolOpError::Pool(_)) => Ok(Err(Refusal {
            reason: reason::ALLOCATION_FAILED,
            message: e.to_string(),
            recheck: None,
        })),
        Err(source) => Err(LbError::Allocate {
            key: key.into(),
            source,
        }),
    }
}

/// The `AddressAllocated` condition: when the current address was allocated (`None`: there is none).
/// A new address starts the condition afresh, so its transition time is the allocation's.
pub(crate) fn mark_allocated(conditions: &mut Vec<crate::ipam::Condition>, message: Option<&str>) {
    let kind = CONDITION_ADDRESS_ALLOCATED;
    match message {
        None => conditions.retain(|c| c.r#type != kind),
        Some(message) => {
            conditions.retain(|c| c.r#type != kind || c.message == message);
            set_condition(conditions, kind, "True", "", message);
        }
    }
}

/// The pool a requested address comes from: the first pool selection allows whose ranges hold it.
fn pool_holding(lb: &LoadBalancer, ip: IpAddr, ctx: &LbCtx) -> Result<String, Refusal> {
    let waiter = ObjectRef::from_obj(lb);
    let pools = ctx.pool_cache.state();
    let entries: Vec<PoolEntry<'_>> = pools.iter().map(|p| p.entry()).collect();
    let eligible = match PoolIndex::new(&entries).eligible(&lb.request()) {
        Ok(eligible) => eligible,
        Err(e) => {
            return Err(ctx.unmatched(
                waiter,
                reason::REQUESTED_ADDRESS_UNAVAILABLE,
                format!("requested address {ip}: {e}"),
            ));
        }
    };
    let ranges_of = |name: &str| {
        let entry = entries.iter().find(|p| p.name == name)?;
        let ranges = RangeSet::parse(&entry.spec.ranges).ok()?;
        Some((entry, ranges))
    };
    let holding = eligible
        .iter()
        .find_map(|name| ranges_of(name).filter(|(_, r)| r.contains(ip)));
    if let Some((entry, ranges)) = holding {
        // An address the pool skips is refused here, before the pool task, like any address the
        // load balancer may not have; unless the pool holds it for this very load balancer (held
        // from before the pool skipped it): the pool task keeps that.
        let skip = entry.options.skip().unwrap_or_default();
        let own = || {
            ctx.pools.holds(
                &ctx.pool_cache,
                entry.name,
                &ip.to_string(),
                &lb.applicant(),
            )
        };
        if ranges.with_skip(skip).is_skipped(ip) && !own() {
            return Err(ctx.unmatched(
                waiter,
                reason::REQUESTED_ADDRESS_UNAVAILABLE,
                format!(
                    "requested address {ip} is skipped by IP pool {} (annotation {SKIP_ADDRESSES}: {skip})",
                    entry.name
                ),
            ));
        }
        return Ok(entry.name.to_string());
    }
    Err(ctx.unmatched(
        waiter,
        reason::REQUESTED_ADDRESS_UNAVAILABLE,
        format!(
            "requested address {ip} is not in any IP pool this load balancer may use (eligible: {})",
            eligible.join(", ")
        ),
    ))
}

/// Chooses the pool from the cached pools (the controller starts once that cache has its first
/// list).
async fn select(lb: &LoadBalancer, ctx: &LbCtx) -> Result<Result<String, SelectError>, LbError> {
    Ok(ctx
        .selections
        .select(&lb.request(), &ctx.pool_cache)
        .map_err(|e| *e))
}

/// Releases `lb`'s address in `pool`; a pool that no longer exists holds nothing.
pub(crate) async fn release_from(
    lb: &LoadBalancer,
    key: &str,
    pool: &str,
    ctx: &LbCtx,
) -> Result<Vec<IpAddr>, LbError> {
    let op = PoolOp::Release { id: lb.applicant() };
    match ctx.pools.call(pool, op).await {
        Ok(PoolReply::Released(ips)) => {
            for ip in &ips {
                info!(lb = %key, %ip, %pool, "released address");
                ctx.events.record(
                    lb,
                    EventType::Normal,
                    reason::RELEASED,
                    format!("released {ip} to IP pool {pool}"),
                );
            }
            Ok(ips)
        }
        Ok(_) | Err(PoolOpError::Missing { .. }) => Ok(Vec::new()),
        Err(source) => Err(LbError::Release {
            key: key.into(),
            ip: lb
                .status
                .as_ref()
                .map(|s| s.allocated_address.ip.clone())
                .unwrap_or_default(),
            source,
        }),
    }
}

/// Deletion: release the address (wherever the load balancer holds one: its status may predate a
/// crash), then let the object go.
async fn cleanup(lb: &LoadBalancer, key: &str, ctx: &LbCtx) -> Result<(), LbError> {
    // The Service goes first, so kube-vip stops announcing the address before it is free again.
    if lb.workload_type() == WorkloadType::Vm {
        Box::pin(vm::cleanup(lb, key, ctx)).await?;
    }
    // A sharing group's address it holds stays with the group's next member.
    shared::hand_over_on_deletion(lb, key, ctx).await?;
    let recorded = lb
        .status
        .as_ref()
        .map(|s| s.allocated_address.ip_pool.clone())
        .unwrap_or_default();
    // Every pool it could hold an address in: all pools listed since this process started (the
    // cache has had its first list before this controller started), every pool this process
    // allocated from, and the recorded one. The status alone is not enough: a crash between the
    // pool's write and the load balancer's leaves an address the status does not mention.
    let mut pools: std::collections::BTreeSet<String> = ctx
        .pool_cache
        .state()
        .iter()
        .map(|p| p.name().to_string())
        .collect();
    pools.extend(ctx.pools.known());
    if !recorded.is_empty() {
        pools.insert(recorded);
    }
    for pool in &pools {
        release_from(lb, key, pool, ctx).await?;
    }
    shared::gone(lb, ctx).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `f` returns: what `size_of_val(&f(a, b))` says, read from the type
    /// alone, so no context needs building and nothing runs.
    fn future_size<A, B, F: Future>(_: impl FnOnce(A, B) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// The controller holds up to `--lb-concurrency` of these at once, each as large as the
    /// largest state of any path through it. With the VM parts, the deletion path, the one-time
    /// finalizer write and the conflict retry inline it was 11,664 bytes (test profile); with
    /// those boxed, 5,912: the apply path's own, which every reconcile in flight needs anyway.
    #[test]
    fn a_reconcile_in_flight_is_small() {
        let size = future_size(reconcile);
        assert!(size <= 6656, "a reconcile's future is {size} bytes");
    }
}
