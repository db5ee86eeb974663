//! Guest-cluster cleanup: when the VMs of a guest cluster that Rancher is removing go away, the
//! cluster's `workloadType: cluster` LoadBalancers in that namespace are deleted (their finalizer then
//! releases the addresses), as Harvester's VM controller does; and the cloud-config account issued
//! for the cluster is revoked (which upstream never does, harvester/harvester#11549), unless
//! `--keep-accounts-of-removed-clusters`. Rancher's dashboard names that account after the guest
//! cluster (`serviceAccountName` = the cluster's name, in its VMs' namespace); only one this service
//! issued (our managed-by label) is touched.
//!
//! A finalizer on the guest cluster's VMs makes sure the deletion is seen even if this service was
//! down when it happened. Unlike upstream (whose OnRemove handler puts it on every VM), only VMs made
//! by Rancher's node driver for a guest cluster get it, since no other VM can trigger a cleanup.

use std::sync::Arc;

use crate::controller::Action;
use tracing::info;

use super::CleanupCtx;
use crate::{
    controller::{Event, FinalizerError, events::EventType, finalizer_when},
    crd::{VM_FINALIZER, keys::LABEL_GUEST_CLUSTER, kinds::VirtualMachine},
    store::{Api, LabelSelector, Preconditions, StoreError},
};

/// A failed reconcile of one VirtualMachine.
#[derive(Debug, thiserror::Error)]
pub enum GuestCleanupError {
    #[error("virtual machine has no {field}")]
    MissingField { field: &'static str },
    #[error(transparent)]
    Finalizer(#[from] FinalizerError),
    #[error("list lb from {namespace} failed, error: {source}")]
    ListLoadBalancers {
        namespace: String,
        source: StoreError,
    },
    #[error("cannot delete load balancer {namespace}/{name} of guest cluster {cluster}: {source}")]
    DeleteLoadBalancer {
        namespace: String,
        name: String,
        cluster: String,
        source: StoreError,
    },
    #[error(transparent)]
    RevokeAccount(Box<dyn std::error::Error + Send + Sync>),
}

/// The Event on a VM whose guest cluster's cloud-config account was revoked.
pub(crate) const REASON_ACCOUNT_REVOKED: &str = "CloudConfigAccountRevoked";

impl GuestCleanupError {
    pub fn is_conflict(&self) -> bool {
        matches!(self, GuestCleanupError::Finalizer(e) if e.is_conflict())
    }
}

pub async fn reconcile(
    vm: Arc<VirtualMachine>,
    ctx: Arc<CleanupCtx>,
) -> Result<Action, GuestCleanupError> {
    let namespace = vm
        .metadata
        .namespace
        .clone()
        .ok_or(GuestCleanupError::MissingField {
            field: "metadata.namespace",
        })?;
    let name = vm
        .metadata
        .name
        .clone()
        .ok_or(GuestCleanupError::MissingField {
            field: "metadata.name",
        })?;
    let key = format!("{namespace}/{name}");
    let api = Api::<VirtualMachine>::new(ctx.store.clone());
    // Only a guest cluster's VMs can trigger a cleanup; one that is no longer one (or never was,
    // but has the finalizer from upstream's controller) just lets go.
    let is_guest_vm = |vm: &VirtualMachine| vm.guest_cluster().is_some();
    let action = finalizer_when(&api, VM_FINALIZER, vm, is_guest_vm, |event| async {
        match event {
            Event::Apply(_) => Ok::<_, GuestCleanupError>(Action::await_change()),
            Event::Cleanup(vm, release) => {
                if let Some(cluster) = vm.guest_cluster()
                    && vm.metadata.deletion_timestamp.is_some()
                    && vm.guest_cluster_removing()
                {
                    delete_cluster_lbs(&ctx, &namespace, cluster, &key).await?;
                    revoke_cluster_account(&ctx, &vm, &namespace, cluster, &key).await?;
                }
                release.release(&vm).await?;
                Ok(Action::await_change())
            }
        }
    })
    .await?;
    ctx.backoff.succeeded(&format!("vm/{key}"));
    Ok(action)
}

/// Deletes the cluster-type load balancers of `cluster` in `namespace`; VM-type ones and those of
/// other clusters are never touched. Every deletion is attempted; the last failure is returned.
async fn delete_cluster_lbs(
    ctx: &CleanupCtx,
    namespace: &str,
    cluster: &str,
    vm: &str,
) -> Result<(), GuestCleanupError> {
    let lbs = ctx
        .lbs
        .list(
            Some(namespace),
            &LabelSelector::from_labels([(LABEL_GUEST_CLUSTER, cluster)]),
        )
        .await
        .map_err(|source| GuestCleanupError::ListLoadBalancers {
            namespace: namespace.into(),
            source,
        })?;
    let mut deleted = 0;
    let mut last_error = None;
    for lb in lbs.iter().filter(|lb| lb.spec.workload_type == "cluster") {
        if lb.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = lb.metadata.name.clone().unwrap_or_default();
        match ctx
            .lbs
            .delete(namespace, &name, &Preconditions::default())
            .await
        {
            Ok(_) => deleted += 1,
            Err(e) if e.is_not_found() => {}
            Err(source) => {
                last_error = Some(GuestCleanupError::DeleteLoadBalancer {
                    namespace: namespace.into(),
                    name,
                    cluster: cluster.into(),
                    source,
                })
            }
        }
    }
    if deleted > 0 {
        info!(%vm, %cluster, deleted, "guest cluster is being removed; deleted its load balancers");
    }
    match last_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Revokes the cloud-config account of `cluster` in `namespace` if this service issued it; the
/// first of the cluster's VMs to go does it, the others find nothing left.
async fn revoke_cluster_account(
    ctx: &CleanupCtx,
    vm: &VirtualMachine,
    namespace: &str,
    cluster: &str,
    key: &str,
) -> Result<(), GuestCleanupError> {
    let Some(accounts) = &ctx.accounts else {
        return Ok(());
    };
    let Some(revocation) = accounts
        .revoke_of_cluster(namespace, cluster)
        .await
        .map_err(GuestCleanupError::RevokeAccount)?
    else {
        return Ok(());
    };
    if revocation.deleted.is_empty() {
        return Ok(());
    }
    crate::metrics::accounts_cleaned_up();
    info!(vm = %key, %cluster, %namespace, deleted = ?revocation.deleted, kept = revocation.kept.len(),
        "guest cluster is being removed; revoked its cloud-config account");
    let mut message = format!(
        "guest cluster {cluster} is being removed: revoked its cloud-config account {namespace}/{cluster} (deleted {})",
        revocation.deleted.join(", ")
    );
    for (object, reason) in &revocation.kept {
        message.push_str(&format!("; kept {object}: {reason}"));
    }
    ctx.events
        .record(vm, EventType::Normal, REASON_ACCOUNT_REVOKED, message);
    Ok(())
}
