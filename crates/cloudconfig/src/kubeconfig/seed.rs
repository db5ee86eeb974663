//! What a Harvester cluster has that the embedded store must provide for the cloud-config API:
//! the two ClusterRoles its bindings refer to (with the rules the Harvester chart ships, reference
//! §15), and the `vip` ConfigMap the kubeconfigs' server address comes from.

use std::sync::Arc;

use k8s_openapi::{
    api::{
        core::v1::ConfigMap,
        rbac::v1::{ClusterRole, PolicyRule},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use tracing::info;

use super::{
    objects::{MANAGED_BY, MANAGED_BY_LABEL},
    request::{CLOUDPROVIDER_ROLE, CSI_DRIVER_ROLE},
};
use crate::store::{Api, ObjectStore, StoreError};

/// The VIP kubeconfigs point at when none was ever given.
const DEFAULT_VIP: &str = "127.0.0.1";

/// Seeding the store failed.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    #[error("cannot seed ClusterRole {name}: {source}")]
    Role {
        name: &'static str,
        source: StoreError,
    },
    #[error("cannot seed ConfigMap {namespace}/vip: {source}")]
    Vip {
        namespace: String,
        source: StoreError,
    },
}

/// Creates the ClusterRoles unless they exist, and the `vip` ConfigMap in `harvester_namespace`:
/// `vip` when given, else whatever it already says, else `127.0.0.1`.
pub async fn seed(
    store: &Arc<dyn ObjectStore>,
    harvester_namespace: &str,
    vip: Option<&str>,
) -> Result<(), SeedError> {
    let roles = Api::<ClusterRole>::new(store.clone());
    for (name, rules) in [
        (CLOUDPROVIDER_ROLE, cloudprovider_rules()),
        (CSI_DRIVER_ROLE, csi_driver_rules()),
    ] {
        let role = ClusterRole {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string())].into()),
                ..Default::default()
            },
            rules: Some(rules),
            ..Default::default()
        };
        match roles.create(&role).await {
            Ok(_) => info!(role = name, "seeded cluster role"),
            Err(e) if e.is_already_exists() => {}
            Err(source) => return Err(SeedError::Role { name, source }),
        }
    }

    let vip_error = |source| SeedError::Vip {
        namespace: harvester_namespace.into(),
        source,
    };
    let cms = Api::<ConfigMap>::new(store.clone());
    let current = cms
        .get(harvester_namespace, "vip")
        .await
        .map_err(vip_error)?;
    let want = match (vip, &current) {
        (Some(vip), _) => vip.to_string(),
        (None, Some(_)) => return Ok(()),
        (None, None) => {
            info!(
                vip = DEFAULT_VIP,
                "no --vip given: kubeconfigs will point at https://127.0.0.1:6443"
            );
            DEFAULT_VIP.to_string()
        }
    };
    let mut cm = current.clone().unwrap_or_else(|| ConfigMap {
        metadata: ObjectMeta {
            name: Some("vip".into()),
            namespace: Some(harvester_namespace.into()),
            ..Default::default()
        },
        ..Default::default()
    });
    cm.data.get_or_insert_default().insert("ip".into(), want);
    if current.is_some() {
        cms.replace(&cm).await.map_err(vip_error)?;
    } else {
        cms.create(&cm).await.map_err(vip_error)?;
    }
    Ok(())
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let v = |xs: &[&str]| Some(xs.iter().map(|s| s.to_string()).collect());
    PolicyRule {
        api_groups: v(groups),
        resources: v(resources),
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// The rules of `harvesterhci.io:cloudprovider`, as shipped by the Harvester chart (reference §15).
pub fn cloudprovider_rules() -> Vec<PolicyRule> {
    let read = ["get", "list", "watch"];
    vec![
        rule(
            &["loadbalancer.harvesterhci.io"],
            &["loadbalancers"],
            &["*"],
        ),
        rule(
            &["kubevirt.io"],
            &["virtualmachines", "virtualmachineinstances"],
            &read,
        ),
        rule(
            &["subresources.kubevirt.io"],
            &[
                "virtualmachines/addvolume",
                "virtualmachines/removevolume",
                "virtualmachineinstances/guestosinfo",
            ],
            &["update"],
        ),
        rule(&[""], &["pods"], &read),
        rule(&[""], &["persistentvolumeclaims"], &["*"]),
    ]
}

/// The rules of `harvesterhci.io:csi-driver`, as shipped by the Harvester chart (reference §15).
pub fn csi_driver_rules() -> Vec<PolicyRule> {
    let read = ["get", "list", "watch"];
    vec![
        rule(
            &["storage.k8s.io"],
            &["storageclasses", "volumeattachments"],
            &read,
        ),
        rule(
            &["harvesterhci.io"],
            &["networkfilesystems", "volumeremotes"],
            &["*"],
        ),
        rule(&["longhorn.io"], &["volumes"], &read),
        rule(&["snapshot.storage.k8s.io"], &["*"], &["*"]),
        rule(&["kubevirt.io"], &["virtualmachines"], &["patch"]),
    ]
}
