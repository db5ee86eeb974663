//! The guest reconciler's wiring: the Service and LoadBalancer watches and their caches, the
//! wake-ups they cause (a LoadBalancer's change wakes its Service; the share index wakes the
//! Services that depend on a change; the NAD mapping's change wakes those naming a network), the
//! controller over the reconcile steps of [`super`], and the garbage collector of left-over
//! LoadBalancers.
//!
//! The wake-ups are hand-made trigger streams (`reconcile_on`) rather than declared watches
//! (`watches_stream`): the controller must not start before the LoadBalancer cache is filled too
//! (decisions read it), and a declared watch is polled only by a running controller;
//! the share index must tell a Service's deletion from a change, which a watch's mapper cannot.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::{
    PredicateConfig, WatchStreamExt,
    reflector::{self, ObjectRef},
    watcher::Event as WatchEvent,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use super::{COMPONENT, Ctx, Ports, Settings, SyncError, group, reconcile, retain};
use crate::{
    controller::{Controller, events::Recorder},
    crd::{LoadBalancer, keys, lb_kind},
    store::{Kind, Preconditions, watcher::watcher},
    sync::lock,
    {
        decide::{in_scope, is_leftover, lb_names_of, service_fingerprint, service_of},
        mapping::{GuestContext, annotation, service_key},
        nad,
        naming::shared_load_balancer_name,
        sharing,
    },
};

/// Deletes a LoadBalancer this cluster made whose Service is gone or was recreated, after confirming
/// with fresh reads (the caches may lag). Only a LoadBalancer that records this cluster as its maker
/// is ever collected ([`is_leftover`]): another guest cluster's of the same name, in the same
/// namespace, is not this one's to judge, nor is one upstream's cloud provider made. A DHCP one with
/// a lease record worth keeping is kept a while instead ([`retain`]): the answer is when to look at
/// it again.
async fn collect(ctx: &Ctx, lb_name: &str) -> Result<Option<Duration>, SyncError> {
    let Some(lb) = ctx
        .lb_cache
        .get(&ObjectRef::new(lb_name).within(ctx.lb_namespace()))
    else {
        return Ok(None);
    };
    if lb.metadata.deletion_timestamp.is_some() || lb.spec.workload_type != "cluster" {
        return Ok(None);
    }
    if let Some((namespace, key)) = sharing::group_of(&ctx.cluster, &lb) {
        // A sharing group's: left over once no Service gives its key.
        if group::group_is_leftover(ctx, &namespace, &key).await? {
            group::release_if_empty("", lb_name, ctx).await?;
        }
        return Ok(None);
    }
    let Some(svc_ref) = service_of(&ctx.cluster, &lb) else {
        return Ok(None);
    };
    let svc_ns = svc_ref.namespace.clone().unwrap_or_default();
    if !is_leftover(&ctx.cluster, &lb, ctx.svc_cache.get(&svc_ref).as_deref()) {
        return Ok(None);
    }
    let lb_key = ctx.lb_ref(lb_name);
    let fresh_svc = ctx
        .services
        .get(&svc_ns, &svc_ref.name)
        .await
        .map_err(|source| SyncError::Read {
            what: format!("service {svc_ns}/{}", svc_ref.name),
            source,
        })?;
    let fresh_lb = ctx
        .lbs
        .get(ctx.lb_namespace(), lb_name)
        .await
        .map_err(|source| SyncError::Read {
            what: format!("load balancer {lb_key}"),
            source,
        })?;
    let Some(fresh_lb) = fresh_lb else {
        return Ok(None);
    };
    if !is_leftover(&ctx.cluster, &fresh_lb, fresh_svc.as_ref()) {
        return Ok(None);
    }
    match retain::verdict(ctx, &fresh_lb, k8s_openapi::jiff::Timestamp::now()) {
        retain::Verdict::Keep(after) => return Ok(Some(after)),
        retain::Verdict::Retire => {
            retain::retire(ctx, &fresh_lb).await?;
            return Ok(Some(ctx.record_retention()));
        }
        retain::Verdict::Delete => {}
    }
    let preconditions = Preconditions {
        uid: fresh_lb.metadata.uid.clone(),
        resource_version: None,
    };
    if ctx.delete_lb(lb_name, &preconditions).await? {
        info!(lb = %lb_key, service = %format!("{svc_ns}/{}", svc_ref.name), "deleted a load balancer whose service is gone or was recreated");
    }
    Ok(None)
}

/// Waits until both caches have their first list (or `stop`); false when stopped first.
async fn caches_ready(ctx: &Ctx, stop: &CancellationToken) -> bool {
    tokio::select! {
        ready = async {
            ctx.svc_cache.wait_until_ready().await.is_ok()
                && ctx.lb_cache.wait_until_ready().await.is_ok()
        } => ready,
        _ = stop.cancelled() => false,
    }
}

/// Runs the reconciler of guest cluster `cluster` until `stop`.
pub async fn run(ports: Ports, cluster: GuestContext, settings: Settings, stop: CancellationToken) {
    let (svc_cache, svc_writer) = reflector::store::<Service>();
    let (lb_cache, lb_writer) = reflector::store::<LoadBalancer>();
    let (svc_tx, svc_rx) = mpsc::unbounded_channel::<Service>();
    let (wake_tx, wake_rx) = mpsc::unbounded_channel::<ObjectRef<Service>>();
    let (gc_tx, gc_rx) = mpsc::unbounded_channel::<String>();
    let events = Recorder::start_as(
        ports.guest.clone(),
        COMPONENT,
        &settings.identity,
        settings.prune_events,
        stop.clone(),
    );
    let ctx = Ctx::new(
        &ports,
        cluster.clone(),
        svc_cache.clone(),
        lb_cache,
        events,
        wake_tx.clone(),
    );
    ctx.set_record_retention(settings.dhcp_record_retention);
    // The collector's own later looks (a LoadBalancer kept for its DHCP lease record).
    let gc_later = gc_tx.clone();

    // Services: the cache, the controller's trigger, and the LoadBalancer of one deleted behind the
    // reconciler's back (no finalizer) to garbage-collect.
    let services = {
        let (gc, name, index) = (gc_tx.clone(), cluster.cluster.clone(), ctx.clone());
        reflector::reflector(
            svc_writer,
            watcher::<Service>(ports.guest.clone(), Kind::of::<Service>(), None),
        )
        .take_until(stop.clone().cancelled_owned())
        .inspect(move |e| {
            let woken = match e {
                Ok(WatchEvent::Init) => {
                    lock(&index.share_index).reset();
                    lock(&index.group_index).reset();
                    Vec::new()
                }
                // The first list reconciles every Service anyway.
                Ok(WatchEvent::InitApply(svc)) => {
                    lock(&index.share_index).apply(svc);
                    lock(&index.group_index).apply(svc);
                    Vec::new()
                }
                Ok(WatchEvent::Apply(svc)) => {
                    let mut woken = lock(&index.share_index).apply(svc);
                    let (members, left) = lock(&index.group_index).apply(svc);
                    woken.extend(members);
                    // A group it left (its key changed or went, whatever its record says) may
                    // have no Service left.
                    if let Some((namespace, key)) = left.as_ref().and_then(|g| g.split_once('/')) {
                        let _ = gc.send(shared_load_balancer_name(&name, namespace, key));
                    }
                    woken
                }
                Ok(WatchEvent::Delete(svc)) => {
                    for lb in lb_names_of(&name, svc).unwrap_or_default() {
                        let _ = gc.send(lb);
                    }
                    // Deleted behind the reconciler's back, the last of a sharing group leaves
                    // its LoadBalancer to the garbage collector.
                    for lb in group::groups_of(&index, svc) {
                        let _ = gc.send(lb);
                    }
                    let mut woken = lock(&index.share_index).delete(svc);
                    woken.extend(lock(&index.group_index).delete(svc).0);
                    woken
                }
                _ => Vec::new(),
            };
            for svc in woken {
                let _ = index.wake.send(svc);
            }
        })
        .applied_objects()
        .predicate_filter(service_fingerprint, PredicateConfig::default())
        .for_each(move |r| {
            if let Ok(svc) = r {
                let _ = svc_tx.send(svc);
            }
            std::future::ready(())
        })
    };

    // This cluster's LoadBalancers ([`in_scope`]): the cache; each change wakes its Service and is
    // looked at by the garbage collector. Others stay out of the cache, and one that leaves the
    // scope (another guest cluster of the same name recorded itself on it) leaves the cache.
    let lbs = {
        let (wake, gc, scope, index) = (wake_tx.clone(), gc_tx, cluster.clone(), ctx.clone());
        let mine = cluster.clone();
        reflector::reflector(
            lb_writer,
            watcher::<LoadBalancer>(
                ports.harvester.clone(),
                lb_kind(),
                Some(cluster.lb_namespace.clone()),
            )
            .filter_map(move |e| {
                let scoped = match e {
                    Ok(WatchEvent::InitApply(lb)) if !in_scope(&mine, &lb) => None,
                    Ok(WatchEvent::Apply(lb)) if !in_scope(&mine, &lb) => {
                        Some(Ok(WatchEvent::Delete(lb)))
                    }
                    other => Some(other),
                };
                std::future::ready(scoped)
            }),
        )
        // After the cache has the change: what this process wrote and the cache now shows.
        .inspect({
            let ctx = ctx.clone();
            move |e| {
                if let Ok(e) = e {
                    ctx.lb_event(e);
                }
            }
        })
        .take_until(stop.clone().cancelled_owned())
        .touched_objects()
        .for_each(move |r| {
            if let Ok(lb) = r {
                if let Some(svc) = service_of(&scope, &lb) {
                    let _ = wake.send(svc);
                }
                // A sharing group's wakes its Services.
                if let Some((namespace, key)) = sharing::group_of(&scope, &lb) {
                    let members = lock(&index.group_index).members(&format!("{namespace}/{key}"));
                    for svc in members {
                        let _ = wake.send(svc);
                    }
                }
                if let Some(n) = lb.metadata.name.clone() {
                    let _ = gc.send(n);
                }
            }
            std::future::ready(())
        })
    };

    // The guest's NAD mapping, kept from the cluster's VMIs: a change of what the guest holds wakes
    // the Services that name a network, so one refused for a network the mapping lacked goes on.
    let nad_sync = {
        let (wake, services) = (wake_tx.clone(), svc_cache.clone());
        nad::run(
            ports.guest.clone(),
            ports.harvester.clone(),
            cluster.clone(),
            move || {
                for svc in services.state() {
                    if annotation(&svc, keys::SVC_NETWORK).is_some_and(|n| !n.is_empty()) {
                        let _ = wake.send(ObjectRef::from_obj(&*svc));
                    }
                }
            },
            stop.clone(),
        )
    };

    let controller = {
        let (ctx, stop) = (ctx.clone(), stop.clone());
        async move {
            // Decisions read both caches (share-IP checks, the LoadBalancer), so nothing is decided
            // on a half-filled one.
            if !caches_ready(&ctx, &stop).await {
                return;
            }
            let shutdown = {
                let stop = stop.clone();
                async move { stop.cancelled().await }
            };
            let services =
                UnboundedReceiverStream::new(svc_rx).map(Ok::<_, std::convert::Infallible>);
            Controller::for_stream("service", services, svc_cache)
                .concurrency(settings.concurrency.into())
                .reconcile_on(UnboundedReceiverStream::new(wake_rx))
                .graceful_shutdown_on(shutdown)
                .run(
                    reconcile,
                    |svc, e: &SyncError, ctx: Arc<Ctx>| {
                        let key = service_key(&svc);
                        if e.is_conflict() {
                            debug!(service = %key, error = %e, "service changed meanwhile; retrying");
                        } else {
                            warn!(service = %key, error = %e, "service reconcile failed");
                        }
                        ctx.backoff.failed(&key, e.is_conflict())
                    },
                    ctx,
                )
                .await;
        }
    };

    let gc = {
        let (ctx, stop, later) = (ctx.clone(), stop.clone(), stop.clone());
        async move {
            if !caches_ready(&ctx, &stop).await {
                return;
            }
            let mut requests = std::pin::pin!(
                UnboundedReceiverStream::new(gc_rx).take_until(stop.cancelled_owned())
            );
            while let Some(name) = requests.next().await {
                match collect(&ctx, &name).await {
                    Ok(None) => {}
                    Ok(Some(after)) => {
                        let (again, stop) = (gc_later.clone(), later.clone());
                        let span = info_span!("collect_later", lb = %ctx.lb_ref(&name));
                        tokio::spawn(
                            async move {
                                tokio::select! {
                                    _ = tokio::time::sleep(after) => {
                                        let _ = again.send(name);
                                    }
                                    _ = stop.cancelled() => {}
                                }
                            }
                            .instrument(span),
                        );
                    }
                    Err(e) => {
                        warn!(lb = %ctx.lb_ref(&name), error = %e, "garbage collection failed")
                    }
                }
            }
        }
    };

    info!(cluster = %cluster.cluster, lb_namespace = %cluster.lb_namespace, "guest service reconciler started");
    tokio::join!(
        services.instrument(info_span!("watch", kind = "Service")),
        lbs.instrument(info_span!("watch", kind = "LoadBalancer")),
        controller.instrument(info_span!("controller", kind = "Service")),
        gc.instrument(info_span!("garbage_collector")),
        nad_sync.instrument(info_span!("nad_mapping")),
    );
    debug!(cluster = %cluster.cluster, "guest service reconciler stopped");
}
