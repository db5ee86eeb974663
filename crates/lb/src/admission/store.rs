//! The store port as writers see it: [`AdmittedStore`] admits every write of a LoadBalancer or an
//! IPPool the way the Kubernetes API server does when Harvester's webhooks are installed, before the
//! store it wraps keeps it. Creates and updates are mutated and validated, IPPool deletes are
//! validated; a refusal is an error carrying the webhook's message. Other kinds, status writes (the
//! webhooks do not watch the status subresource) and reads pass straight through.
//!
//! The decorator is the store's ([`crate::store::admitted`]: it judges the object as the store will
//! keep it, never a writer's claim about it); this is what [`Admission`] does with what it is given.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

use super::{Admission, AdmitError, NetworkCheck};
use crate::{
    crd::{IPPool, LoadBalancer, lb_kind, pool_kind},
    store::{
        Kind, ObjectStore, StoreError,
        admitted::{Admit, Admitted},
        object_key,
    },
};

/// A store behind admission.
pub type AdmittedStore = Admitted<Admission>;

/// `inner` behind admission; what the checks read comes from `inner` too.
pub fn admitted(inner: Arc<dyn ObjectStore>, networks: NetworkCheck) -> AdmittedStore {
    Admitted::new(inner.clone(), Admission::new(inner, networks))
}

/// The kinds admission judges.
#[derive(Clone, Copy)]
enum Judged {
    LoadBalancer,
    Pool,
}

fn judged(kind: &Kind) -> Option<Judged> {
    let is = |other: Kind| kind.api_version == other.api_version && kind.kind == other.kind;
    if is(lb_kind()) {
        Some(Judged::LoadBalancer)
    } else if is(pool_kind()) {
        Some(Judged::Pool)
    } else {
        None
    }
}

/// The admission error behind an error of an [`AdmittedStore`], if that is what it is: a refusal
/// ([`StoreError::Refused`]) or a failure to decide (a [`StoreError::Backend`] error).
pub fn admission_error(e: StoreError) -> Result<AdmitError, StoreError> {
    match e {
        StoreError::Refused { kind, name, source } => source
            .downcast::<AdmitError>()
            .map(|e| *e)
            .map_err(|source| StoreError::Refused { kind, name, source }),
        StoreError::Backend(source) => source
            .downcast::<AdmitError>()
            .map(|e| *e)
            .map_err(StoreError::Backend),
        other => Err(other),
    }
}

/// A refusal is `Refused`, named as the API server names a webhook's denial; a failure to decide
/// (what the checks read could not be read) is a backend failure.
fn refused(kind: &Kind, name: Option<&str>, e: AdmitError) -> StoreError {
    if e.is_rejection() {
        StoreError::Refused {
            kind: kind.singular(),
            name: name.unwrap_or_default().to_string(),
            source: Box::new(e),
        }
    } else {
        StoreError::Backend(Box::new(e))
    }
}

fn decode<K: DeserializeOwned>(kind: &Kind, object: Value) -> Result<K, StoreError> {
    let name = object_key(&object).1;
    serde_json::from_value(object).map_err(|e| StoreError::Invalid {
        kind: kind.singular(),
        name,
        reason: e.to_string(),
    })
}

fn encode<K: Serialize>(kind: &Kind, object: &K) -> Result<Value, StoreError> {
    let mut value = serde_json::to_value(object).map_err(StoreError::backend)?;
    if let Some(fields) = value.as_object_mut() {
        fields.insert("apiVersion".into(), Value::from(kind.api_version.as_ref()));
        fields.insert("kind".into(), Value::from(kind.kind.as_ref()));
    }
    Ok(value)
}

#[async_trait]
impl Admit for Admission {
    fn judges(&self, kind: &Kind) -> bool {
        judged(kind).is_some()
    }

    fn judges_delete(&self, kind: &Kind) -> bool {
        matches!(judged(kind), Some(Judged::Pool))
    }

    async fn create(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        match judged(kind) {
            None => Ok(object),
            Some(Judged::LoadBalancer) => {
                let mut lb: LoadBalancer = decode(kind, object)?;
                self.admit_lb_create(&mut lb)
                    .await
                    .map_err(|e| refused(kind, lb.metadata.name.as_deref(), e))?;
                encode(kind, &lb)
            }
            Some(Judged::Pool) => {
                let mut pool: IPPool = decode(kind, object)?;
                self.admit_pool_create(&mut pool)
                    .await
                    .map_err(|e| refused(kind, pool.metadata.name.as_deref(), e))?;
                encode(kind, &pool)
            }
        }
    }

    async fn update(
        &self,
        kind: &Kind,
        current: Value,
        object: Value,
    ) -> Result<Value, StoreError> {
        let name = object_key(&object).1;
        match judged(kind) {
            None => Ok(object),
            Some(Judged::LoadBalancer) => {
                let current: LoadBalancer = decode(kind, current)?;
                let mut lb: LoadBalancer = decode(kind, object)?;
                self.admit_lb_update(&current, &mut lb)
                    .await
                    .map_err(|e| refused(kind, Some(&name), e))?;
                encode(kind, &lb)
            }
            Some(Judged::Pool) => {
                let current: IPPool = decode(kind, current)?;
                let mut pool: IPPool = decode(kind, object)?;
                self.admit_pool_update(&current, &mut pool)
                    .await
                    .map_err(|e| refused(kind, Some(&name), e))?;
                encode(kind, &pool)
            }
        }
    }

    async fn delete(&self, kind: &Kind, current: &Value) -> Result<(), StoreError> {
        let current: IPPool = decode(kind, current.clone())?;
        self.admit_pool_delete(&current)
            .map_err(|e| refused(kind, current.metadata.name.as_deref(), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        crd::{keys::ANNOTATION_NETWORK, kinds::VirtualMachineInstance, lb_api, pool_api},
        ipam::{PoolSpec, RangeSpec},
        store::{
            Api, Preconditions,
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
        let store: Arc<dyn ObjectStore> = Arc::new(admitted(inner.clone(), NetworkCheck::Skip));
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
        let refused = lbs.replace(&dhcp).await.expect_err("refused");
        assert_eq!(
            refused.to_string(),
            "loadbalancer \"lb\" is invalid: update loadbalancer default/lb failed: can't change the IPAM from pool to dhcp"
        );
        // The writer can tell the refusal apart, with the webhook's own message.
        let e = admission_error(refused).expect("an admission refusal");
        assert!(e.is_rejection());
        assert_eq!(
            e.to_string(),
            "update loadbalancer default/lb failed: can't change the IPAM from pool to dhcp"
        );
    }

    fn finalizers(lb: &LoadBalancer) -> Vec<String> {
        lb.metadata.finalizers.clone().unwrap_or_default()
    }

    #[tokio::test]
    async fn live_load_balancers_carry_the_reconcilers_finalizer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let inner: Arc<dyn ObjectStore> = EmbeddedStore::open(dir.path(), Durability::Normal)
            .await
            .expect("opens");
        let lbs = lb_api(Arc::new(admitted(inner.clone(), NetworkCheck::Skip)));
        let mut lb: LoadBalancer = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "lb", "namespace": "default", "finalizers": ["example.com/keep"]},
            "spec": {"workloadType": "cluster", "ipam": "pool"}
        }))
        .expect("lb");
        // On create, beside what the writer put there.
        let created = lbs.create(&lb).await.expect("creates");
        assert_eq!(
            finalizers(&created),
            ["example.com/keep", crate::crd::LB_FINALIZER]
        );
        // An update that would drop it (a writer's copy from before) keeps it, once.
        lb = created.clone();
        lb.metadata.finalizers = None;
        let updated = lbs.replace(&lb).await.expect("replaces");
        assert_eq!(finalizers(&updated), [crate::crd::LB_FINALIZER]);
        let again = lbs.replace(&updated).await.expect("replaces");
        assert_eq!(finalizers(&again), [crate::crd::LB_FINALIZER]);
        // Once it is being deleted, taking it off sticks.
        lbs.delete("default", "lb", &Preconditions::default())
            .await
            .expect("deletes");
        let mut deleting = lbs
            .get("default", "lb")
            .await
            .expect("reads")
            .expect("kept");
        assert!(deleting.metadata.deletion_timestamp.is_some());
        deleting.metadata.finalizers = None;
        lbs.replace(&deleting).await.expect("releases");
        assert!(lbs.get("default", "lb").await.expect("reads").is_none());
    }

    #[tokio::test]
    async fn pools_are_judged_as_stored() {
        let dir = tempfile::tempdir().expect("tempdir");
        let inner: Arc<dyn ObjectStore> = EmbeddedStore::open(dir.path(), Durability::Normal)
            .await
            .expect("opens");
        let admitted: Arc<dyn ObjectStore> = Arc::new(admitted(inner.clone(), NetworkCheck::Skip));
        let pools = pool_api(admitted);
        let mut pool = IPPool::new(
            "p",
            PoolSpec {
                ranges: vec![RangeSpec {
                    subnet: "10.0.0.0/24".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }
            .into(),
        );
        let created = pools.create(&pool).await.expect("creates");
        // Mutated: the mutator's labels.
        let labels = created.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels[crate::crd::keys::LABEL_VID], "0");
        // An address held, as the status says (written past admission, as the reconciler does).
        let mut held = created.clone();
        held.status = Some(crate::ipam::PoolStatus {
            allocated: [("10.0.0.9".to_string(), "default/lb".to_string())].into(),
            ..Default::default()
        });
        pool_api(inner.clone())
            .replace_status(&held)
            .await
            .expect("writes the status");
        // Shrinking past it is refused, whatever status the writer sends; so is deleting the pool.
        pool = created.clone();
        pool.metadata.resource_version = None;
        pool.status = None;
        pool.spec.ranges[0].range_start = "10.0.0.10".into();
        let e = pools.replace(&pool).await.expect_err("refused");
        assert!(admission_error(e).expect("a refusal").is_rejection());
        let e = pools
            .delete("", "p", &Preconditions::default())
            .await
            .expect_err("refused");
        assert!(admission_error(e).expect("a refusal").is_rejection());
        assert!(pools.get("", "p").await.expect("reads").is_some());
    }
}

#[cfg(test)]
mod network_tests {
    use super::*;
    use crate::ipam::{PoolSpec, RangeSpec, Selector};
    use crate::store::embedded::{Durability, EmbeddedStore};
    use crate::{
        crd::{keys::LABEL_VID, kinds::NetworkAttachmentDefinition},
        store::Api,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn mk_pool(name: &str, network: &str) -> IPPool {
        IPPool {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: PoolSpec {
                ranges: vec![RangeSpec {
                    subnet: "10.0.0.0/24".into(),
                    ..Default::default()
                }],
                selector: Selector {
                    network: network.into(),
                    ..Default::default()
                },
                ..Default::default()
            }
            .into(),
            status: None,
        }
    }

    #[tokio::test]
    async fn networks_are_looked_up_only_where_they_exist() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn ObjectStore> = EmbeddedStore::open(dir.path(), Durability::Normal)
            .await
            .expect("opens");
        let nad: NetworkAttachmentDefinition = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "vlan10", "namespace": "default",
                         "labels": {"network.harvesterhci.io/vlan-id": "10"}},
            "spec": {"config": "{}"}
        }))
        .expect("nad");
        Api::<NetworkAttachmentDefinition>::new(store.clone())
            .create(&nad)
            .await
            .expect("creates");

        let kube = Admission::new(store.clone(), NetworkCheck::Require);
        let mut pool = mk_pool("p", "default/vlan10");
        kube.admit_pool_create(&mut pool).await.expect("admitted");
        assert_eq!(
            pool.metadata.labels.as_ref().expect("labels")[LABEL_VID],
            "10"
        );
        let mut unknown = mk_pool("q", "default/vlan99");
        let e = kube
            .admit_pool_create(&mut unknown)
            .await
            .expect_err("refused");
        assert_eq!(
            e.to_string(),
            "can't create IP pool q because network-attachment-definitions.k8s.cni.cncf.io \"vlan99\" not found"
        );
        assert!(e.is_rejection());

        let embedded = Admission::new(store, NetworkCheck::Skip);
        let mut unknown = mk_pool("q", "default/vlan99");
        embedded
            .admit_pool_create(&mut unknown)
            .await
            .expect("admitted without a lookup");
        assert_eq!(
            unknown.metadata.labels.as_ref().expect("labels")[LABEL_VID],
            "0"
        );
    }
}
