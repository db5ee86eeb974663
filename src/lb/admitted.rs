//! A store port that admits LoadBalancer writes the way the Kubernetes API server does when
//! Harvester's webhooks are installed: every create and update of a LoadBalancer is mutated and
//! validated ([`Admission`]) before it is stored, and a refusal is an `Invalid` error carrying the
//! webhook's message. Every other kind, and every read, passes straight through.
//!
//! The guest-cluster reconciler writes LoadBalancers through a store port; on the embedded backend
//! this is that port, so its LoadBalancers get the same namespace, project and network annotations
//! (findNetwork) and the same checks as those made through the HTTP API or, on Kubernetes, by the
//! upstream cloud provider.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use serde_json::Value;

use super::admission::{Admission, AdmitError};
use crate::{
    crd::{LoadBalancer, lb_kind},
    store::{
        ChangeStream, Deleted, Kind, LabelSelector, ObjectList, ObjectStore, Preconditions,
        StoreError,
    },
};

pub struct AdmittedStore {
    admission: Admission,
}

impl AdmittedStore {
    pub fn new(admission: Admission) -> Self {
        AdmittedStore { admission }
    }

    fn inner(&self) -> &Arc<dyn ObjectStore> {
        self.admission.store()
    }

    fn is_lb(kind: &Kind) -> bool {
        let lb = lb_kind();
        kind.api_version == lb.api_version && kind.kind == lb.kind
    }
}

fn decode(kind: &Kind, object: Value) -> Result<LoadBalancer, StoreError> {
    let name = crate::store::object_key(&object).1;
    serde_json::from_value(object).map_err(|e| StoreError::Invalid {
        kind: kind.singular(),
        name,
        reason: e.to_string(),
    })
}

fn encode(kind: &Kind, lb: &LoadBalancer) -> Result<Value, StoreError> {
    let mut value = serde_json::to_value(lb).map_err(StoreError::backend)?;
    if let Some(fields) = value.as_object_mut() {
        fields.insert("apiVersion".into(), Value::from(kind.api_version.as_ref()));
        fields.insert("kind".into(), Value::from(kind.kind.as_ref()));
    }
    Ok(value)
}

/// A refusal becomes `Invalid` with the webhook's message (as the API server reports a denial); a
/// failure to decide keeps its store error.
fn refused(kind: &Kind, lb: &LoadBalancer, e: AdmitError) -> StoreError {
    match e {
        AdmitError::Read { source, .. } => source,
        other => StoreError::Invalid {
            kind: kind.singular(),
            name: lb.metadata.name.clone().unwrap_or_default(),
            reason: other.to_string(),
        },
    }
}

#[async_trait]
impl ObjectStore for AdmittedStore {
    async fn get(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, StoreError> {
        self.inner().get(kind, namespace, name).await
    }

    async fn list(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        selector: &LabelSelector,
    ) -> Result<ObjectList, StoreError> {
        self.inner().list(kind, namespace, selector).await
    }

    async fn create(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        if !Self::is_lb(kind) {
            return self.inner().create(kind, object).await;
        }
        let mut lb = decode(kind, object)?;
        self.admission
            .mutate_lb(&mut lb)
            .await
            .map_err(|e| refused(kind, &lb, e))?;
        self.admission
            .validate_lb_create(&lb)
            .await
            .map_err(|e| refused(kind, &lb, e))?;
        self.inner().create(kind, encode(kind, &lb)?).await
    }

    async fn replace(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        if !Self::is_lb(kind) {
            return self.inner().replace(kind, object).await;
        }
        let mut lb = decode(kind, object)?;
        let (namespace, name) = (
            lb.metadata.namespace.clone().unwrap_or_default(),
            lb.metadata.name.clone().unwrap_or_default(),
        );
        let current = self
            .inner()
            .get(kind, &namespace, &name)
            .await?
            .ok_or_else(|| StoreError::NotFound {
                kind: kind.singular(),
                name: name.clone(),
            })?;
        let current = decode(kind, current)?;
        self.admission
            .mutate_lb(&mut lb)
            .await
            .map_err(|e| refused(kind, &lb, e))?;
        self.admission
            .validate_lb_update(&current, &lb)
            .map_err(|e| refused(kind, &lb, e))?;
        self.inner().replace(kind, encode(kind, &lb)?).await
    }

    /// Status writes are not admitted (the webhooks do not watch the status subresource).
    async fn replace_status(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        self.inner().replace_status(kind, object).await
    }

    async fn delete(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<Deleted, StoreError> {
        self.inner()
            .delete(kind, namespace, name, preconditions)
            .await
    }

    async fn watch(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        resource_version: &str,
    ) -> Result<ChangeStream, StoreError> {
        self.inner().watch(kind, namespace, resource_version).await
    }

    async fn wait_for_token(
        &self,
        namespace: &str,
        secret_name: &str,
        timeout: Duration,
    ) -> Result<Value, StoreError> {
        self.inner()
            .wait_for_token(namespace, secret_name, timeout)
            .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.inner().ping().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        controller::kinds::VirtualMachineInstance,
        crd::{keys::ANNOTATION_NETWORK, lb_api},
        lb::admission::NetworkCheck,
        store::{
            Api,
            embedded::{Durability, EmbeddedStore},
        },
    };

    #[tokio::test]
    async fn load_balancer_writes_are_mutated_and_validated() {
        let dir = tempfile::tempdir().expect("tempdir");
        let inner: Arc<dyn ObjectStore> = EmbeddedStore::open(dir.path(), Durability::Normal)
            .await
            .expect("opens");
        let vmi: VirtualMachineInstance = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gc1-node", "namespace": "default",
                         "labels": {"guestcluster.harvesterhci.io/name": "gc1"}},
            "spec": {"networks": [{"name": "nic", "multus": {"networkName": "default/vlan10"}}]}
        }))
        .expect("vmi");
        Api::<VirtualMachineInstance>::new(inner.clone())
            .create(&vmi)
            .await
            .expect("creates");
        let store: Arc<dyn ObjectStore> = Arc::new(AdmittedStore::new(Admission::new(
            inner.clone(),
            NetworkCheck::Skip,
        )));
        let lbs = lb_api(store);
        let lb: LoadBalancer = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "lb", "namespace": "default",
                         "annotations": {"loadbalancer.harvesterhci.io/cluster": "gc1"}},
            "spec": {"workloadType": "cluster", "ipam": "pool"}
        }))
        .expect("lb");
        let created = lbs.create(&lb).await.expect("creates");
        let annotations = created.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(annotations[ANNOTATION_NETWORK], "default/vlan10");
        let mut dhcp = created.clone();
        dhcp.spec.ipam = "dhcp".into();
        assert_eq!(
            lbs.replace(&dhcp).await.expect_err("refused").to_string(),
            "loadbalancer \"lb\" is invalid: update loadbalancer default/lb failed: can't change the IPAM from pool to dhcp"
        );
    }
}
