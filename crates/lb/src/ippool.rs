//! The IPPool reconciler: finalizer, then a sync of the pool task (rebuild the allocator from the
//! stored status, recompute `total` and `available`, prune the history to the ranges, `Ready`), the
//! `manuallyReleaseIP` annotation, and waking load balancers that found no pool.
//!
//! On deletion the pool keeps its finalizer while it still holds addresses (upstream drops the
//! allocator at once and its load balancers can then never release): it goes once the last one is
//! released.

use std::sync::Arc;

use crate::controller::Action;
use tracing::{info, warn};

use super::{
    PoolCtx,
    pools::{ManualRequest, PoolOp, PoolOpError, PoolReply},
};
use crate::{
    controller::{Event, FinalizerError, Release, Target, finalizer, modify},
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
    #[error(transparent)]
    Finalizer(#[from] FinalizerError),
}

impl PoolReconcileError {
    pub fn is_conflict(&self) -> bool {
        match self {
            PoolReconcileError::Write { source, .. } => {
                matches!(source, StoreError::Conflict { .. })
            }
            PoolReconcileError::Finalizer(e) => e.is_conflict(),
            _ => false,
        }
    }
}

pub async fn reconcile(pool: Arc<IPPool>, ctx: Arc<PoolCtx>) -> Result<Action, PoolReconcileError> {
    let name = pool
        .metadata
        .name
        .clone()
        .ok_or(PoolReconcileError::MissingName)?;
    let action = finalizer(&ctx.pools_api, POOL_FINALIZER, pool, |event| async {
        match event {
            Event::Apply(pool) => apply(&pool, &name, &ctx).await,
            Event::Cleanup(pool, release) => cleanup(&pool, release, &name, &ctx).await,
        }
    })
    .await?;
    ctx.backoff.succeeded(&name);
    Ok(action)
}

/// Deletion: the pool goes once it holds no address; until then the release of its last one (which
/// writes the status) brings it back here.
async fn cleanup(
    pool: &IPPool,
    release: Release<IPPool>,
    name: &str,
    ctx: &PoolCtx,
) -> Result<Action, PoolReconcileError> {
    match ctx.pools.call(name, PoolOp::Finalize).await {
        Ok(PoolReply::Empty) | Err(PoolOpError::Missing { .. }) => {
            release.release(pool).await?;
            ctx.pools.forget(name);
            info!(pool = %name, "IP pool deleted");
        }
        Ok(PoolReply::NotEmpty(held)) => {
            info!(pool = %name, held, "IP pool is being deleted; waiting for its addresses to be released");
        }
        Ok(other) => warn!(pool = %name, reply = ?other, "unexpected reply to a finalize"),
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

async fn apply(pool: &IPPool, name: &str, ctx: &PoolCtx) -> Result<Action, PoolReconcileError> {
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
                    pool: name.into(),
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
        .call(name, PoolOp::Sync { manual_release })
        .await?;
    if let PoolReply::Synced {
        manual: Some(outcome),
        ..
    } = &reply
    {
        info!(pool = %name, annotation = annotation.as_deref().unwrap_or_default(), outcome = ?outcome, "manual release");
    }
    if annotation.is_some() {
        // The annotation is always removed afterwards, whatever the outcome (as upstream). Read
        // afresh: the sync has just written the status.
        let fresh =
            ctx.pools_api
                .get("", name)
                .await
                .map_err(|source| PoolReconcileError::Read {
                    pool: name.into(),
                    what: "the pool",
                    source,
                })?;
        if let Some(fresh) = fresh {
            modify(&ctx.pools_api, &fresh, Target::Object, |p| {
                p.metadata
                    .annotations
                    .as_mut()
                    .is_some_and(|a| a.remove(MANUALLY_RELEASE_IP).is_some())
            })
            .await
            .map_err(|source| PoolReconcileError::Write {
                pool: name.into(),
                source,
            })?;
        }
    }
    // A new or changed pool may be the one that unmatched load balancers are waiting for.
    ctx.pools_changed();
    Ok(Action::await_change())
}
