//! A Service sharing an address by a sharing key ([`crate::sharing`]): its group judged as a whole,
//! the group's LoadBalancer created or brought to the members' ports, the address written back to the
//! Service; and leaving a group (a key changed or dropped, a Service deleted or no longer a load
//! balancer), which deletes the group's LoadBalancer, releasing the address, when no Service of the
//! group is left.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::ObjectRef;
use tracing::info;

use super::{
    Action, Ctx, SyncError, WAIT_RECHECK,
    primary::{delete_own_lb, write_lb},
    reason, write_back,
};
use crate::{
    controller::{Target, events::EventType, modify},
    crd::keys,
    decide::{
        is_load_balancer, lb_names_of, not_ready_message, remove_annotation, set_annotation,
        set_ingress,
    },
    mapping::{annotation, service_key},
    naming::shared_load_balancer_name,
    sharing::{self, Candidate, GroupLb, SharingKey},
    store::Preconditions,
    sync::lock,
    validation::go_quote,
};

/// The name of the group LoadBalancer a Service's record names (it was admitted to that group).
pub(super) fn recorded_group(svc: &Service) -> Option<String> {
    annotation(svc, keys::SVC_SHARED_LOAD_BALANCER)
        .filter(|v| !v.is_empty())
        .map(String::from)
}

impl Ctx {
    fn group_lock(&self, lb_name: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.share_lock(&format!("sharing-group:{lb_name}"))
    }

    /// The Services of group `key` in `namespace`, as the cache has them, but `current` as given (the
    /// version being reconciled), or without the Service of key `except`.
    fn group_services(
        &self,
        namespace: &str,
        key: &str,
        current: Option<&Service>,
        except: Option<&str>,
    ) -> Vec<Arc<Service>> {
        let current_key = current.map(service_key);
        let mut found: Vec<Arc<Service>> = self
            .svc_cache
            .state()
            .into_iter()
            .filter(|s| {
                let k = service_key(s);
                s.metadata.namespace.as_deref() == Some(namespace)
                    && Some(&k) != current_key.as_ref()
                    && Some(k.as_str()) != except
            })
            .filter(|s| is_candidate(s, key))
            .collect();
        if let Some(c) = current.filter(|c| is_candidate(c, key)) {
            found.push(Arc::new(c.clone()));
        }
        found
    }

    /// Whether this process admitted Service `key` (of UID `uid`) to group `lb_name`, or its record
    /// says it was.
    fn is_admitted(&self, svc: &Service, lb_name: &str) -> bool {
        if recorded_group(svc).as_deref() == Some(lb_name) {
            return true;
        }
        lock(&self.members).get(&service_key(svc))
            == Some(&(lb_name.to_string(), svc.metadata.uid.clone()))
    }

    fn admit_member(&self, svc: &Service, lb_name: &str) {
        lock(&self.members).insert(
            service_key(svc),
            (lb_name.to_string(), svc.metadata.uid.clone()),
        );
    }

    pub(super) fn forget_member(&self, key: &str) {
        lock(&self.members).remove(key);
    }
}

/// A Service of type LoadBalancer, not being deleted, giving sharing key `key`.
fn is_candidate(svc: &Service, key: &str) -> bool {
    is_load_balancer(svc)
        && svc.metadata.deletion_timestamp.is_none()
        && sharing::sharing_key(svc)
            .ok()
            .flatten()
            .is_some_and(|k| k.value == key)
}

/// A Service giving a sharing key: admitted to its group (the group's LoadBalancer made or brought to
/// the members' ports, the address written back once there is one), or refused with an Event and no
/// address.
pub(super) async fn member(
    svc: &Service,
    key: &str,
    sharing: SharingKey,
    interface: Option<String>,
    ctx: &Ctx,
) -> Result<Action, SyncError> {
    let namespace = svc.metadata.namespace.clone().unwrap_or_default();
    let group = shared_load_balancer_name(&ctx.cluster.cluster, &namespace, &sharing.value);
    let quoted = go_quote(&sharing.value);
    if sharing::asks_cross_namespace(svc) {
        ctx.report(
            svc,
            &format!("{key}#cross-namespace"),
            EventType::Warning,
            reason::CROSS_NAMESPACE_IGNORED,
            format!(
                "service {key}: {} is not honoured: services share an address by sharing key {quoted} only within their namespace",
                keys::CILIUM_SHARING_CROSS_NAMESPACE
            ),
        );
    }
    // A group it was admitted to before (its key changed): left first.
    let mut current = svc.clone();
    if let Some(old) = recorded_group(svc).filter(|old| *old != group) {
        current = leave(&current, key, &old, ctx).await?;
    }
    let svc = &current;
    let group_lock = ctx.group_lock(&group);
    let held = group_lock.lock().await;
    let cached = ctx.lb_as_known(&group);
    if cached
        .as_ref()
        .is_some_and(|lb| lb.metadata.deletion_timestamp.is_some())
    {
        // The last member went and the address is being released; its Delete event brings this
        // Service back to make the group's LoadBalancer again.
        return Ok(Action::requeue(WAIT_RECHECK));
    }
    let services = ctx.group_services(&namespace, &sharing.value, Some(svc), None);
    let candidates: Vec<Candidate<'_>> = services
        .iter()
        .map(|s| Candidate {
            svc: s,
            admitted: ctx.is_admitted(s, &group),
            secondaries: ctx
                .secondaries_of(
                    &namespace,
                    s.metadata.name.as_deref().unwrap_or_default(),
                    "",
                )
                .iter()
                .map(|s| service_key(s))
                .collect(),
        })
        .collect();
    let view = cached.as_deref().map(GroupLb::of);
    let decision = sharing::decide(&sharing, &candidates, view.as_ref());
    if let Some(refusal) = decision.refused.get(key) {
        ctx.forget_member(key);
        drop(held);
        withdraw(svc, key, ctx).await?;
        return Ok(ctx.refuse(svc, key, refusal.to_string()));
    }
    let Some(reference) = decision.members.first().copied() else {
        // Not refused, so a member: there is a first one.
        return Ok(Action::requeue(WAIT_RECHECK));
    };
    let plan = match sharing::plan(&ctx.cluster, &sharing, &decision, reference) {
        Ok(plan) => plan,
        Err(e) => return Ok(ctx.refuse(svc, key, e.to_string())),
    };
    ctx.admit_member(svc, &group);
    let lb = match write_lb(svc, key, ctx, cached.as_deref(), &plan).await? {
        Ok(lb) => lb,
        Err(action) => {
            ctx.forget_member(key);
            return Ok(action);
        }
    };
    drop(held);
    // Its own LoadBalancers, from a time it had its own address, go (their finalizers release
    // those addresses).
    for own in lb_names_of(&ctx.cluster.cluster, svc).unwrap_or_default() {
        delete_own_lb(ctx, key, &own).await?;
    }
    let lb_key = ctx.lb_ref(&group);
    let ip = lb
        .status
        .as_ref()
        .map(|s| s.allocated_address.ip.clone())
        .unwrap_or_default();
    let refused = not_ready_message(&lb);
    if ip.is_empty() {
        if let Some(message) = refused {
            let message = format!(
                "ip is not allocated, mode: {}, message: {message}",
                plan.ipam
            );
            ctx.report(svc, key, EventType::Warning, reason::SYNC_FAILED, message);
        }
        return Ok(Action::requeue(WAIT_RECHECK));
    }
    if let Some(message) = refused {
        // The group keeps its address and refuses what it asks now (a requested address held by
        // another load balancer, or outside its pools).
        ctx.report(svc, key, EventType::Warning, reason::SYNC_FAILED, message);
    }
    let written = write_back(svc, key, ctx, &[ip.as_str()], |s| {
        let mut changed = set_annotation(s, keys::KUBE_VIP_IPS, &ip);
        changed |= match &interface {
            Some(i) => set_annotation(s, keys::KUBE_VIP_INTERFACE, i),
            None => remove_annotation(s, keys::KUBE_VIP_INTERFACE),
        };
        changed | set_annotation(s, keys::SVC_SHARED_LOAD_BALANCER, &group)
    })
    .await?;
    if written {
        info!(service = %key, lb = %lb_key, %ip, key = %sharing.value, "service shares its group's address");
        ctx.report(
            svc,
            key,
            EventType::Normal,
            reason::ENSURED,
            format!(
                "Ensured load balancer {lb_key} with address {ip} shared by sharing key {quoted}"
            ),
        );
    }
    Ok(Action::await_change())
}

/// A Service that is no longer a member of the group it was admitted to loses what was written for
/// it (the address, the interface, its record, its ingress). Returns the Service as it is now.
pub(super) async fn withdraw(svc: &Service, key: &str, ctx: &Ctx) -> Result<Service, SyncError> {
    if recorded_group(svc).is_none() {
        return Ok(svc.clone());
    }
    let failed = |source| SyncError::WriteService {
        service: key.into(),
        source,
    };
    let mut current = svc.clone();
    if let Some(cleared) = modify(&ctx.services, svc, Target::Status, |s| set_ingress(s, &[]))
        .await
        .map_err(failed)?
    {
        current = cleared.object;
    }
    if let Some(stripped) = modify(&ctx.services, &current, Target::Object, |s| {
        remove_annotation(s, keys::KUBE_VIP_IPS)
            | remove_annotation(s, keys::KUBE_VIP_INTERFACE)
            | remove_annotation(s, keys::SVC_SHARED_LOAD_BALANCER)
    })
    .await
    .map_err(failed)?
    {
        current = stripped.object;
    }
    info!(service = %key, "service no longer shares its group's address");
    Ok(current)
}

/// Service `svc` leaves the group whose LoadBalancer is `lb_name` (its key changed or went): it
/// loses the address, and the group's LoadBalancer goes when no other Service gives the key. Returns
/// the Service as it is now.
pub(super) async fn leave(
    svc: &Service,
    key: &str,
    lb_name: &str,
    ctx: &Ctx,
) -> Result<Service, SyncError> {
    ctx.forget_member(key);
    let current = withdraw(svc, key, ctx).await?;
    release_if_empty(key, lb_name, ctx).await?;
    Ok(current)
}

/// Deletes group LoadBalancer `lb_name` when no Service but `leaving` gives its key any more.
/// Returns whether it deleted it.
pub(super) async fn release_if_empty(
    leaving: &str,
    lb_name: &str,
    ctx: &Ctx,
) -> Result<bool, SyncError> {
    let group_lock = ctx.group_lock(lb_name);
    let _held = group_lock.lock().await;
    let Some(lb) = ctx
        .lb_cache
        .get(&ObjectRef::new(lb_name).within(ctx.lb_namespace()))
    else {
        return Ok(false);
    };
    let Some((namespace, key)) = sharing::group_of(&ctx.cluster, &lb) else {
        return Ok(false);
    };
    if lb.metadata.deletion_timestamp.is_some()
        || !ctx
            .group_services(&namespace, &key, None, Some(leaving))
            .is_empty()
    {
        return Ok(false);
    }
    let preconditions = Preconditions {
        uid: lb.metadata.uid.clone(),
        resource_version: None,
    };
    let deleted = ctx.delete_lb(lb_name, &preconditions).await?;
    if deleted {
        info!(service = %leaving, lb = %ctx.lb_ref(lb_name), "the last service of the sharing group went: deleted its load balancer");
    }
    Ok(deleted)
}

/// The group LoadBalancers a Service going away (or no longer a load balancer) may leave without
/// members: the one its record names and the one of the key it gives.
pub(super) fn groups_of(ctx: &Ctx, svc: &Service) -> Vec<String> {
    let mut groups: Vec<String> = recorded_group(svc).into_iter().collect();
    if let Ok(Some(k)) = sharing::sharing_key(svc) {
        let namespace = svc.metadata.namespace.as_deref().unwrap_or_default();
        groups.push(shared_load_balancer_name(
            &ctx.cluster.cluster,
            namespace,
            &k.value,
        ));
    }
    groups.sort();
    groups.dedup();
    groups
}

/// Whether a group LoadBalancer is left over: no Service gives its key any more. Checked on the
/// cache first, then on a fresh list (the cache may lag).
pub(super) async fn group_is_leftover(
    ctx: &Ctx,
    namespace: &str,
    key: &str,
) -> Result<bool, SyncError> {
    if !ctx.group_services(namespace, key, None, None).is_empty() {
        return Ok(false);
    }
    let fresh = ctx
        .services
        .list(Some(namespace), &crate::store::LabelSelector::everything())
        .await
        .map_err(|source| SyncError::Read {
            what: format!("services in {namespace}"),
            source,
        })?;
    Ok(!fresh.iter().any(|s| is_candidate(s, key)))
}
