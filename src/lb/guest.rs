//! Guest-cluster cleanup: when the VMs of a guest cluster that Rancher is removing go away, the
//! cluster's `workloadType: cluster` LoadBalancers in that namespace are deleted (their finalizer then
//! releases the addresses), as Harvester's VM controller does.
//!
//! A finalizer on the guest cluster's VMs makes sure the deletion is seen even if this service was
//! down when it happened. Unlike upstream (whose OnRemove handler puts it on every VM), only VMs made
//! by Rancher's node driver for a guest cluster get it, since no other VM can trigger a cleanup.

use std::sync::Arc;

use kube::runtime::controller::Action;
use tracing::info;

use super::Shared;
use crate::{
    controller::{Event, FinalizerError, finalizer_when, kinds::VirtualMachine},
    crd::{VM_FINALIZER, keys::LABEL_GUEST_CLUSTER},
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
}

impl GuestCleanupError {
    pub fn is_conflict(&self) -> bool {
        matches!(self, GuestCleanupError::Finalizer(e) if e.is_conflict())
    }
}

pub async fn reconcile(
    vm: Arc<VirtualMachine>,
    ctx: Arc<Shared>,
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
    ctx: &Shared,
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
