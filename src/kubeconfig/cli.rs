//! `harvester-cloud kubeconfig generate`: ensures a guest cluster's service account in a Harvester
//! cluster through the Kubernetes API, as the cloud-config API would, and prints its cloud config and
//! cloud-init user data (the replacement for `generate_addon.sh`).

use std::{sync::Arc, time::Duration};

use super::{AccountRequest, CloudConfig, CloudConfigError, RequestError, Settings, render};
use crate::{
    config::{KubeArgs, KubeConfigError},
    store::{ObjectStore, kubernetes::KubeStore},
};

/// `kubeconfig generate` failed.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Config(#[from] KubeConfigError),
    #[error("cannot build a Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error(transparent)]
    Issue(#[from] CloudConfigError),
}

/// Ensures `namespace/service_account` on the cluster `kube` reaches and prints what it needs.
pub async fn generate(
    service_account: &str,
    namespace: &str,
    kube: &KubeArgs,
    server_url: Option<String>,
    token_timeout: Duration,
) -> Result<(), GenerateError> {
    let req = AccountRequest::new(namespace, service_account)?;
    let config = kube.client_config().await?;
    // As generate_addon.sh did: the kubeconfig points where your own kubeconfig points.
    let server = server_url.unwrap_or_else(|| {
        config
            .cluster_url
            .to_string()
            .trim_end_matches('/')
            .to_string()
    });
    let client = kube::Client::try_from(config).map_err(GenerateError::Client)?;
    let store: Arc<dyn ObjectStore> = Arc::new(KubeStore::new(client));
    let cloud_config = CloudConfig::new(
        store,
        Settings {
            harvester_namespace: "harvester-system".into(),
            server_url: Some(server),
            cluster_ca: None,
            token_timeout,
            default_grace: Settings::DEFAULT_GRACE,
            max_grace: Settings::MAX_GRACE,
        },
    );
    let kubeconfig = cloud_config.ensure(&req).await?;
    print!(
        "########## cloud config ############\n{kubeconfig}\n{}",
        render::cloud_init(&kubeconfig, None)
    );
    Ok(())
}
