//! The LoadBalancer reconciler's side of sharing an address by a sharing key ([`crate::sharing`]):
//! a member judged with its group (read fresh from the store) and served as the holder (allocating
//! as any load balancer does) or as a sharer (the holder's address), or refused with no address;
//! the group's address handed to the next member when its holder goes.

use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use tracing::info;

use super::{LbError, Refusal, mark_allocated, pool, release_from};
use crate::{
    LbCtx,
    controller::events::EventType,
    crd::{AllocatedAddress, LoadBalancer, LoadBalancerStatus},
    ipam::{PoolEntry, PoolIndex},
    pools::{PoolOp, PoolReply},
    sharing::{HANDED_OVER, Held, SHARING_REFUSED, decide, group_id, ports, sharing_key},
    store::{LabelSelector, validation::go_quote},
    sync::lock,
};

/// Fallback re-check of a refused member; a member's change normally wakes it first.
const REFUSED_RECHECK: Duration = Duration::from_secs(60);

/// The members of group `key` in `namespace`, read fresh: LoadBalancers giving the key and not
/// being deleted, with `current` as given (the version being reconciled) and without `except`.
async fn members(
    ctx: &LbCtx,
    namespace: &str,
    key: &str,
    current: Option<&LoadBalancer>,
    except: Option<&str>,
) -> Result<Vec<LoadBalancer>, LbError> {
    let mut all = with_key(ctx, namespace, key, current, except).await?;
    all.retain(|lb| lb.metadata.deletion_timestamp.is_none());
    Ok(all)
}

/// The LoadBalancers giving group `key`'s key in `namespace`, being deleted or not (one being
/// deleted still holds the group's address until its deletion hands it over), with `current` as
/// given and without `except`.
async fn with_key(
    ctx: &LbCtx,
    namespace: &str,
    key: &str,
    current: Option<&LoadBalancer>,
    except: Option<&str>,
) -> Result<Vec<LoadBalancer>, LbError> {
    let listed = ctx
        .lbs
        .list(Some(namespace), &LabelSelector::everything())
        .await
        .map_err(|source| LbError::Read {
            key: format!("load balancers in {namespace}"),
            source,
        })?;
    let skip = current.map(LoadBalancer::applicant);
    let mut found: Vec<LoadBalancer> = listed
        .into_iter()
        .filter(|lb| {
            let me = lb.applicant();
            Some(&me) != skip.as_ref()
                && Some(me.as_str()) != except
                && sharing_key(lb).ok().flatten().as_deref() == Some(key)
        })
        .collect();
    if let Some(c) = current {
        found.push(c.clone());
    }
    Ok(found)
}

/// The group's address among `members`: the one this process last allocated or handed over (while
/// its holder is a member), else the member the pool (as cached) names for its own address.
fn held_address(ctx: &LbCtx, group: &str, members: &[LoadBalancer]) -> Option<Held> {
    let is_member = |who: &str| members.iter().any(|m| m.applicant() == who);
    if let Some(h) = lock(&ctx.sharing.held).get(group).cloned()
        && is_member(&h.holder)
    {
        return Some(h);
    }
    members.iter().find_map(|m| {
        let address = m.status.as_ref()?.allocated_address.clone();
        if address.ip_pool.is_empty() || address.ip.is_empty() {
            return None;
        }
        ctx.pools
            .holds(
                &ctx.pool_cache,
                &address.ip_pool,
                &address.ip,
                &m.applicant(),
            )
            .then(|| Held {
                holder: m.applicant(),
                address,
            })
    })
}

/// The pools a load balancer may use.
fn eligible(ctx: &LbCtx, lb: &LoadBalancer) -> Result<Vec<String>, String> {
    let pools = ctx.pool_cache.state();
    let entries: Vec<PoolEntry<'_>> = pools.iter().map(|p| p.entry()).collect();
    PoolIndex::new(&entries)
        .eligible(&lb.request())
        .map(|e| e.iter().map(|s| s.to_string()).collect())
        .map_err(|e| e.to_string())
}

/// What [`apply`] did.
pub enum Shared {
    /// No key: the load balancer is served on its own.
    NotShared,
    /// Served (or refused) as a member of its group; `holder` is the member whose address it
    /// shares (none when it is the holder).
    Served {
        outcome: Result<Option<Duration>, Refusal>,
        holder: Option<String>,
    },
}

/// A load balancer giving a sharing key: admitted to its group (the holder allocates as any load
/// balancer does; the others take the holder's address) or refused, with no address.
pub async fn apply(
    lb: &LoadBalancer,
    key: &str,
    status: &mut LoadBalancerStatus,
    ctx: &LbCtx,
) -> Result<Shared, LbError> {
    let me = lb.applicant();
    let namespace = lb.metadata.namespace.clone().unwrap_or_default();
    let current = sharing_key(lb);
    // The address of a group it no longer gives the key of goes to that group's next member
    // (it keeps the address when it was the last).
    if let Some((old, address)) = holding(ctx, lb)
        && current.as_ref().ok().and_then(|k| k.as_deref()) != Some(old.as_str())
        && hand_over(lb, key, ctx, &old, &address).await?
    {
        status.allocated_address = AllocatedAddress::default();
        status.address.clear();
        mark_allocated(&mut status.conditions, None);
    }
    let sharing = match current {
        Ok(Some(k)) => k,
        Ok(None) => {
            forget_asked(ctx, &me);
            return Ok(Shared::NotShared);
        }
        Err(message) => {
            give_up(lb, key, status, ctx).await?;
            return Ok(Shared::Served {
                outcome: Err(Refusal::new(
                    SHARING_REFUSED,
                    message,
                    Some(REFUSED_RECHECK),
                )),
                holder: None,
            });
        }
    };
    let group = group_id(&namespace, &sharing);
    let group_lock = ctx.sharing.lock(&group);
    let _held = group_lock.lock().await;
    let mut members = with_key(ctx, &namespace, &sharing, Some(lb), None).await?;
    // A holder being deleted still holds the address (its deletion hands it over): the others
    // keep sharing it meanwhile rather than take another.
    let held = held_address(ctx, &group, &members);
    members.retain(|m| m.metadata.deletion_timestamp.is_none());
    let refs: Vec<&LoadBalancer> = members.iter().collect();
    let decision = decide(&sharing, &refs, held.as_ref(), |m| eligible(ctx, m));
    let before = status.allocated_address.clone();
    let mut holder = None;
    let served = if let Some(message) = decision.refused.get(&me) {
        give_up(lb, key, status, ctx).await?;
        Err(Refusal::new(
            SHARING_REFUSED,
            message.clone(),
            Some(REFUSED_RECHECK),
        ))
    } else {
        match held.filter(|h| h.holder != me) {
            // A sharer: the holder's address; anything of its own goes.
            Some(h) => {
                let own = status.allocated_address.ip_pool.clone();
                if !own.is_empty() && status.allocated_address != h.address {
                    release_from(lb, key, &own, ctx).await?;
                }
                status.allocated_address = h.address.clone();
                status.address = h.address.ip.clone();
                mark_allocated(
                    &mut status.conditions,
                    Some(&format!(
                        "{} from IP pool {} (shared by key {} with {})",
                        h.address.ip,
                        h.address.ip_pool,
                        go_quote(&sharing),
                        h.holder
                    )),
                );
                holder = Some(h.holder);
                Ok(None)
            }
            // The holder, or the first member of a group without an address: as any load
            // balancer. A status left from sharing an address that is no one's now is not its own.
            None => {
                let pool_holds_it = |address: &AllocatedAddress| {
                    ctx.pools
                        .holds(&ctx.pool_cache, &address.ip_pool, &address.ip, &me)
                };
                if !status.allocated_address.ip_pool.is_empty()
                    && !pool_holds_it(&status.allocated_address)
                    && lock(&ctx.sharing.held)
                        .get(&group)
                        .is_none_or(|h| h.holder != me)
                {
                    status.allocated_address = AllocatedAddress::default();
                    status.address.clear();
                }
                let outcome = pool(lb, key, status, ctx).await?;
                if outcome.is_ok() && !status.allocated_address.ip.is_empty() {
                    lock(&ctx.sharing.held).insert(
                        group.clone(),
                        Held {
                            holder: me.clone(),
                            address: status.allocated_address.clone(),
                        },
                    );
                }
                outcome
            }
        }
    };
    // The others look again when what this one holds or asks changed (a refused one may fit now).
    let asked = (sharing.clone(), ports(lb), lb.spec.ip_pool.clone());
    let changed_ask = lock(&ctx.sharing.asked).insert(me.clone(), asked.clone()) != Some(asked);
    if changed_ask || before != status.allocated_address {
        wake_others(ctx, &members, &me);
    }
    Ok(Shared::Served {
        outcome: served,
        holder,
    })
}

fn forget_asked(ctx: &LbCtx, me: &str) {
    lock(&ctx.sharing.asked).remove(me);
}

fn wake_others(ctx: &LbCtx, members: &[LoadBalancer], me: &str) {
    for m in members.iter().filter(|m| m.applicant() != me) {
        let _ = ctx.unmatched.wake.send(ObjectRef::from_obj(m));
    }
}

/// A member refused, or going: no address for it. The group's address, if it holds it, goes to the
/// next member in the same pool round; anything else it holds is released.
async fn give_up(
    lb: &LoadBalancer,
    key: &str,
    status: &mut LoadBalancerStatus,
    ctx: &LbCtx,
) -> Result<(), LbError> {
    if let Some((group_key, address)) = holding(ctx, lb) {
        hand_over(lb, key, ctx, &group_key, &address).await?;
    }
    let own = status.allocated_address.ip_pool.clone();
    if !own.is_empty() {
        release_from(lb, key, &own, ctx).await?;
    }
    status.allocated_address = AllocatedAddress::default();
    status.address.clear();
    mark_allocated(&mut status.conditions, None);
    Ok(())
}

/// The group `lb` holds the address of, by key, and the address: as this process allocated or
/// handed it over, else as its status says and the pool (as cached) confirms.
fn holding(ctx: &LbCtx, lb: &LoadBalancer) -> Option<(String, AllocatedAddress)> {
    let me = lb.applicant();
    let namespace = lb.metadata.namespace.clone().unwrap_or_default();
    let remembered = lock(&ctx.sharing.held)
        .iter()
        .find(|(g, h)| h.holder == me && g.starts_with(&format!("{namespace}/")))
        .map(|(g, h)| (g.clone(), h.address.clone()));
    if let Some((group, address)) = remembered {
        let key = group
            .split_once('/')
            .map(|(_, k)| k.to_string())
            .unwrap_or_default();
        return Some((key, address));
    }
    let key = sharing_key(lb).ok().flatten()?;
    let address = lb.status.as_ref()?.allocated_address.clone();
    ctx.pools
        .holds(&ctx.pool_cache, &address.ip_pool, &address.ip, &me)
        .then_some((key, address))
}

/// Hands `address`, which `lb` holds for group `group_key` of its namespace, to the group's next
/// admitted member, in one pool round; returns whether it did (`false`: no other member, or the pool
/// no longer names `lb`). Run on deletion before the release, on a refusal, and when the key changes.
pub async fn hand_over(
    lb: &LoadBalancer,
    key: &str,
    ctx: &LbCtx,
    group_key: &str,
    address: &AllocatedAddress,
) -> Result<bool, LbError> {
    let me = lb.applicant();
    let namespace = lb.metadata.namespace.clone().unwrap_or_default();
    let group = group_id(&namespace, group_key);
    let Ok(ip) = address.ip.parse() else {
        return Ok(false);
    };
    let others = members(ctx, &namespace, group_key, None, Some(&me)).await?;
    let refs: Vec<&LoadBalancer> = others.iter().collect();
    let held = Held {
        holder: me.clone(),
        address: address.clone(),
    };
    let decision = decide(group_key, &refs, Some(&held), |m| eligible(ctx, m));
    let Some(next) = decision.admitted.first() else {
        lock(&ctx.sharing.held).remove(&group);
        return Ok(false);
    };
    let op = PoolOp::Handover {
        from: me.clone(),
        to: next.clone(),
        ip,
    };
    match ctx.pools.call(&address.ip_pool, op).await {
        Ok(PoolReply::Allocated(_)) => {
            let message = format!(
                "handed {} (IP pool {}) over to load balancer {next}, which shares it by key {}",
                address.ip,
                address.ip_pool,
                go_quote(group_key)
            );
            info!(lb = %key, ip = %address.ip, to = %next, "handed the group's address over");
            ctx.events
                .record(lb, EventType::Normal, HANDED_OVER, message);
            lock(&ctx.sharing.held).insert(
                group,
                Held {
                    holder: next.clone(),
                    address: address.clone(),
                },
            );
            wake_others(ctx, &others, &me);
            Ok(true)
        }
        // The pool no longer names it (the cache lagged a hand-over): nothing to hand.
        Ok(_) => Ok(false),
        Err(source) => Err(LbError::Allocate {
            key: key.into(),
            source,
        }),
    }
}

/// On deletion, before the release: the group's address, if `lb` holds it, goes to the next member.
pub async fn hand_over_on_deletion(
    lb: &LoadBalancer,
    key: &str,
    ctx: &LbCtx,
) -> Result<bool, LbError> {
    match holding(ctx, lb) {
        Some((group_key, address)) => hand_over(lb, key, ctx, &group_key, &address).await,
        None => Ok(false),
    }
}

/// A member is gone: the others look again (one refused for clashing with it may fit now).
pub async fn gone(lb: &LoadBalancer, ctx: &LbCtx) -> Result<(), LbError> {
    let me = lb.applicant();
    forget_asked(ctx, &me);
    let Some(sharing) = sharing_key(lb).ok().flatten() else {
        return Ok(());
    };
    let namespace = lb.metadata.namespace.clone().unwrap_or_default();
    let others = members(ctx, &namespace, &sharing, None, Some(&me)).await?;
    if others.is_empty() {
        lock(&ctx.sharing.held).remove(&group_id(&namespace, &sharing));
    }
    wake_others(ctx, &others, &me);
    Ok(())
}
