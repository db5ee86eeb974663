//! `harvester-cloud ccm`: the guest-Service reconciler ([`crate::guest::reconcile`]) inside a guest
//! cluster, as the Harvester Cloud Provider's load balancing runs there. Guest Services come from the
//! guest cluster's API (in cluster, or `--kubeconfig`); LoadBalancers go to Harvester through the
//! cloud-config kubeconfig that Harvester's (or this service's) cloud-config API issued, in the
//! namespace of its current context.
//!
//! With `--leader-elect` (the default) only the holder of a Lease in the guest cluster reconciles,
//! so a Deployment with several replicas is safe; SIGTERM stops the reconciler cleanly and gives the
//! Lease up. Metrics (the leader gauge, the guest-Service reconciles) are served on
//! `--metrics-listen`.

use std::{path::Path, sync::Arc};

use k8s_openapi::api::core::v1::Namespace;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};

use crate::guest::{
    mapping::{GuestContext, normalize_management_network},
    naming::{cluster_name_is_default, load_balancer_namespace},
    reconcile::{self, Ports},
};
use crate::{
    config::{CcmArgs, KubeArgs, KubeConfigError},
    controller::leader::{AlwaysLeader, LeaderElector, LeaseElector, LeaseTiming, lead},
    store::{Api, ObjectStore, kubernetes::KubeStore},
};

/// The Namespace whose UID is the guest cluster's identity.
const IDENTITY_NAMESPACE: &str = "kube-system";

/// Upstream's warning for a cluster name that is not unique.
pub const CLUSTER_NAME_WARNING: &str = "The --cluster-name is empty or default; please ensure a unique name is set to avoid resource conflicts.";

/// Why the ccm could not start.
#[derive(Debug, thiserror::Error)]
pub enum CcmError {
    #[error("cannot read --cloud-config {path}: {source}")]
    ReadCloudConfig {
        path: String,
        source: kube::config::KubeconfigError,
    },
    #[error("cannot read --kubeconfig {path}: {source}")]
    ReadKubeconfig {
        path: String,
        source: kube::config::KubeconfigError,
    },
    #[error("cannot find the guest cluster's API (in cluster, or KUBECONFIG): {0}")]
    InferConfig(#[from] kube::config::InferConfigError),
    #[error("cannot build a Kubernetes client for {what}: {source}")]
    Client {
        what: &'static str,
        source: kube::Error,
    },
    #[error("cannot listen on --metrics-listen {address}: {source}")]
    Listen {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot reach {what}: {source}")]
    Unreachable {
        what: &'static str,
        source: crate::store::StoreError,
    },
    /// The guest cluster's identity is the UID of its `kube-system` Namespace; without it the ccm
    /// could not tell its LoadBalancers from another guest cluster's of the same name.
    #[error(
        "cannot read the guest cluster's identity (the uid of namespace kube-system): {reason}"
    )]
    Identity { reason: String },
}

/// The cloud-config: a client for Harvester and the LoadBalancer namespace (its current context's
/// namespace, `default` if none).
pub async fn cloud_config(path: &Path) -> Result<(kube::Config, String), CcmError> {
    let read = |source| CcmError::ReadCloudConfig {
        path: path.display().to_string(),
        source,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(read)?;
    let namespace = kubeconfig
        .current_context
        .as_deref()
        .and_then(|current| kubeconfig.contexts.iter().find(|c| c.name == current))
        .and_then(|c| c.context.as_ref())
        .and_then(|c| c.namespace.clone());
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(read)?;
    Ok((config, load_balancer_namespace(namespace.as_deref())))
}

/// The guest cluster's API: `--kubeconfig` (and `--context`), else in cluster or the usual files.
async fn guest_config(args: &KubeArgs) -> Result<kube::Config, CcmError> {
    args.client_config().await.map_err(|e| match e {
        KubeConfigError::Read { path, source } => CcmError::ReadKubeconfig { path, source },
        KubeConfigError::Context { source, .. } => CcmError::ReadKubeconfig {
            path: "$KUBECONFIG".into(),
            source,
        },
        KubeConfigError::Infer(e) => CcmError::InferConfig(e),
    })
}

async fn store(config: kube::Config, what: &'static str) -> Result<Arc<KubeStore>, CcmError> {
    let client =
        kube::Client::try_from(config).map_err(|source| CcmError::Client { what, source })?;
    let store = Arc::new(KubeStore::new(client));
    store
        .ping()
        .await
        .map_err(|source| CcmError::Unreachable { what, source })?;
    Ok(store)
}

/// The guest cluster's identity: the UID of its `kube-system` Namespace, which every cluster has
/// from its first start to its end, and no other cluster shares.
pub async fn guest_identity(guest: &Arc<dyn ObjectStore>) -> Result<String, CcmError> {
    let namespace = Api::<Namespace>::new(guest.clone())
        .get("", IDENTITY_NAMESPACE)
        .await
        .map_err(|e| CcmError::Identity {
            reason: e.to_string(),
        })?
        .ok_or_else(|| CcmError::Identity {
            reason: format!("namespace \"{IDENTITY_NAMESPACE}\" not found"),
        })?;
    namespace
        .metadata
        .uid
        .filter(|u| !u.is_empty())
        .ok_or_else(|| CcmError::Identity {
            reason: "it has no metadata.uid".into(),
        })
}

/// Runs until `shutdown`.
pub async fn run(args: &CcmArgs, shutdown: CancellationToken) -> Result<(), CcmError> {
    if cluster_name_is_default(&args.cluster_name) {
        warn!(cluster = %args.cluster_name, "{CLUSTER_NAME_WARNING}");
    }
    let metrics_listener = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .map_err(|source| CcmError::Listen {
            address: args.metrics_listen,
            source,
        })?;
    let (harvester_config, lb_namespace) = cloud_config(&args.cloud_config).await?;
    let harvester_url = harvester_config.cluster_url.to_string();
    let harvester: Arc<dyn ObjectStore> = store(harvester_config, "Harvester").await?;
    let guest: Arc<dyn ObjectStore> =
        store(guest_config(&args.kube).await?, "the guest cluster").await?;
    let identity = guest_identity(&guest).await?;
    let context = GuestContext {
        cluster: args.cluster_name.clone(),
        identity,
        lb_namespace,
        management_network: normalize_management_network(args.management_network.as_deref()),
    };
    info!(cluster = %context.cluster, identity = %context.identity, harvester = %harvester_url, lb_namespace = %context.lb_namespace, management_network = context.management_network.as_deref().unwrap_or_default(), "guest cluster load balancing");
    let settings = reconcile::Settings {
        concurrency: args.concurrency.max(1),
        // The guest's API server expires Events itself (and the ccm needs no right to delete them).
        prune_events: false,
        dhcp_record_retention: args.dhcp_record_retention,
        ..Default::default()
    };
    let elector: Arc<dyn LeaderElector> = if args.leader_elect {
        Arc::new(LeaseElector::new(
            guest.clone(),
            &args.lease_namespace,
            &args.lease_name,
            &settings.identity,
            LeaseTiming::default(),
        ))
    } else {
        Arc::new(AlwaysLeader)
    };
    let ports = Ports { guest, harvester };
    let metrics = tokio::spawn(
        crate::http::metrics_listener::serve(metrics_listener, shutdown.clone())
            .instrument(tracing::info_span!("metrics")),
    );
    lead(
        elector.as_ref(),
        &shutdown,
        "guest service reconciler",
        &settings.identity.clone(),
        |stop| {
            let reconciler = reconcile::run(ports.clone(), context.clone(), settings.clone(), stop);
            async move {
                crate::metrics::set_leader(true);
                reconciler.await;
                crate::metrics::set_leader(false);
            }
        },
    )
    .await;
    match metrics.await {
        Ok(Err(e)) => warn!(error = %e, "the metrics listener failed"),
        Err(e) => warn!(error = %e, "the metrics listener panicked"),
        Ok(Ok(())) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_cloud_config_names_the_namespace() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cloud-config");
        let kubeconfig = |namespace: &str| {
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: default\n  cluster:\n    server: https://10.0.0.1:6443\n    insecure-skip-tls-verify: true\nusers:\n- name: default\n  user:\n    token: abc\ncontexts:\n- name: default\n  context:\n    cluster: default\n    user: default\n{namespace}current-context: default\n"
            )
        };
        std::fs::write(&path, kubeconfig("    namespace: gc-ns\n")).expect("writes");
        let (config, namespace) = cloud_config(&path).await.expect("reads");
        assert_eq!(namespace, "gc-ns");
        assert_eq!(config.cluster_url.to_string(), "https://10.0.0.1:6443/");
        std::fs::write(&path, kubeconfig("")).expect("writes");
        assert_eq!(cloud_config(&path).await.expect("reads").1, "default");
        assert!(cluster_name_is_default("kubernetes") && cluster_name_is_default(""));
        assert!(!cluster_name_is_default("gc1"));
    }
}
