//! The IPPool reconciler: finalizer, then a sync of the pool task (rebuild the allocator from the
//! stored status, recompute `total` and `available`, prune the history to the ranges, `Ready`), the
//! `manuallyReleaseIP` annotation, and waking load balancers that found no pool.
//!
//! On deletion the pool keeps its finalizer while it still holds addresses (upstream drops the
//! allocator at once and its load balancers can then never release): it goes once the last one is
//! released.

use std::sync::Arc;

use kube::runtime::controller::Action;
use tracing::{info, warn};

use super::{
    Shared,
    pools::{ManualRequest, PoolOp, PoolOpError, PoolReply},
};
use crate::{
    crd::{IPPool, POOL_FINALIZER},
    ipam::{MANUALLY_RELEASE_IP, ManualRelease},
    store::StoreError,
};

/// A failed reconcile of one IPPool.
#[derive(Debug, thiserror::Error)]
pub enum PoolReconcileError {
    #[error("IP pool has no metadata.name")]
    MissingName,
    #[error("cannot update IP pool {pool}: {source}")]
    Write { pool: String, source: StoreError },
    #[error("cannot read {what} for IP pool {pool}: {source}")]
    Read {
        pool: String,
        what: &'static str,
        source: StoreError,
    },
    #[error(transparent)]
    Pool(#[from] PoolOpError),
}

impl PoolReconcileError {
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            PoolReconcileError::Write {
                source: StoreError::Conflict { .. },
                ..
            }
        )
    }
}

fn has_finalizer(pool: &IPPool) -> bool {
    pool.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == POOL_FINALIZER))
}

pub async fn reconcile(pool: Arc<IPPool>, ctx: Arc<Shared>) -> Result<Action, PoolReconcileError> {
    let name = pool
        .metadata
        .name
        .clone()
        .ok_or(PoolReconcileError::MissingName)?;
    let write_err = |source| PoolReconcileError::Write {
        pool: name.clone(),
        source,
    };
    if pool.is_deleting() {
        if !has_finalizer(&pool) {
            return Ok(Action::await_change());
        }
        match ctx.pools.call(&name, PoolOp::Finalize).await {
            Ok(PoolReply::Empty) | Err(PoolOpError::Missing { .. }) => {
                let mut next = (*pool).clone();
                if let Some(f) = next.metadata.finalizers.as_mut() {
                    f.retain(|x| x != POOL_FINALIZER);
                }
                match ctx.pools_api.replace(&next).await {
                    Ok(_) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(write_err(e)),
                }
                ctx.pools.forget(&name);
                info!(pool = %name, "IP pool deleted");
            }
            Ok(PoolReply::NotEmpty(held)) => {
                // The release of the last address writes the status, which brings the pool back here.
                info!(pool = %name, held, "IP pool is being deleted; waiting for its addresses to be released");
            }
            Ok(other) => warn!(pool = %name, reply = ?other, "unexpected reply to a finalize"),
            Err(e) => return Err(e.into()),
        }
        ctx.succeeded(&name);
        return Ok(Action::await_change());
    }

    if !has_finalizer(&pool) {
        let mut next = (*pool).clone();
        next.metadata
            .finalizers
            .get_or_insert_default()
            .push(POOL_FINALIZER.into());
        match ctx.pools_api.replace(&next).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => return Ok(Action::await_change()),
            Err(e) => return Err(write_err(e)),
        }
    }

    let annotation = pool
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(MANUALLY_RELEASE_IP))
        .cloned();
    let manual_release = match annotation.as_deref().map(ManualRelease::parse) {
        None => None,
        Some(Err(e)) => {
            warn!(pool = %name, error = %e, "ignoring the manual release annotation");
            None
        }
        Some(Ok(request)) => {
            let (namespace, lb) = request.load_balancer();
            let exists = ctx
                .lbs
                .get(namespace, lb)
                .await
                .map_err(|source| PoolReconcileError::Read {
                    pool: name.clone(),
                    what: "the load balancer of a manual release",
                    source,
                })?
                .is_some();
            Some(ManualRequest {
                request,
                load_balancer_exists: exists,
            })
        }
    };
    let reply = ctx
        .pools
        .call(&name, PoolOp::Sync { manual_release })
        .await?;
    if let PoolReply::Synced {
        manual: Some(outcome),
        ..
    } = &reply
    {
        info!(pool = %name, annotation = annotation.as_deref().unwrap_or_default(), outcome = ?outcome, "manual release");
    }
    if annotation.is_some() {
        // The annotation is always removed afterwards, whatever the outcome (as upstream).
        let fresh =
            ctx.pools_api
                .get("", &name)
                .await
                .map_err(|source| PoolReconcileError::Read {
                    pool: name.clone(),
                    what: "the pool",
                    source,
                })?;
        if let Some(mut fresh) = fresh {
            if let Some(a) = fresh.metadata.annotations.as_mut() {
                a.remove(MANUALLY_RELEASE_IP);
            }
            match ctx.pools_api.replace(&fresh).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(write_err(e)),
            }
        }
    }
    // A new or changed pool may be the one that unmatched load balancers are waiting for.
    ctx.pools_changed();
    ctx.succeeded(&name);
    Ok(Action::await_change())
}
