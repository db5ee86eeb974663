//! Admission of LoadBalancers and IPPools: upstream's mutating and validating webhooks, with their
//! messages, as a property of the store. Every writer goes through one path:
//!
//! - [`AdmittedStore`], the store port as writers see it (wrapped once, in `app.rs`): the HTTP API
//!   ([`super::objects`]) and the guest reconciler write through it, and every create or update of
//!   a LoadBalancer or IPPool, and every IPPool delete, is mutated and judged there, on the object
//!   as the store will keep it;
//! - the admission webhooks ([`super::webhook`]), which the Kubernetes API server calls for writes
//!   made to it directly, run the same [`Admission`] steps.
//!
//! The checks themselves are pure functions ([`checks`]; IPPool checks are
//! [`crate::ipam::admission`]); [`Admission`] gathers what they read (other pools, VMs, VMIs, the
//! namespace, the VM network) through the store port.
//!
//! Deliberate differences from upstream:
//! - The network of a pool is checked for existence (and its VLAN ID read) only where VM networks
//!   exist ([`NetworkCheck::Require`], the Kubernetes backend); the embedded backend has none, but
//!   refuses a network that is not `namespace/name` as upstream does.
//! - A live LoadBalancer is given the reconciler's finalizer ([`LB_FINALIZER`]) on create, and on
//!   an update that would leave it without one ([`claim`]): the reconciler's first write is then
//!   its status, not a PUT of the finalizer alone (one API request fewer per LoadBalancer). The
//!   name is the one upstream's controller puts there itself (wrangler's `OnRemove` adds
//!   `wrangler.cattle.io/harvester-lb-controller` unless it is present), so either controller
//!   finds its own finalizer and releases it; the reconciler still adds it where admission did
//!   not run (objects from before, or a cluster without the webhook).
//! - The cluster-type mutator needs the LoadBalancer's Namespace for the Rancher project; where the
//!   Namespace does not exist (the embedded backend keeps none) the project annotation is left as the
//!   caller wrote it instead of failing the request.

pub mod checks;
pub mod network;
pub mod store;

pub use store::{AdmittedStore, admitted};

use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;

use self::{
    checks::{LbAdmissionError, is_cluster, mutate_lb, validate_lb_create, validate_lb_update},
    network::{NetworkError, NetworkRejection, mutate_pool},
};
use crate::{
    crd::{
        IPPool, LB_FINALIZER, LoadBalancer,
        keys::{LABEL_CREATOR, NODE_DRIVER},
        kinds::{NetworkAttachmentDefinition, VirtualMachine, VirtualMachineInstance},
        pool_api,
    },
    ipam::{self, PoolEntry},
    store::{Api, LabelSelector, ObjectStore, StoreError},
};

/// A refused or failed admission.
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    #[error(transparent)]
    LoadBalancer(#[from] LbAdmissionError),
    #[error(transparent)]
    Pool(Box<ipam::AdmissionError>),
    #[error(transparent)]
    Network(#[from] NetworkError),
    /// Reading what the checks need failed; nothing was decided.
    #[error("cannot read {what} for admission: {source}")]
    Read {
        what: &'static str,
        source: StoreError,
    },
}

impl From<ipam::AdmissionError> for AdmitError {
    fn from(e: ipam::AdmissionError) -> Self {
        AdmitError::Pool(Box::new(e))
    }
}

impl AdmitError {
    /// A refusal (as opposed to a failure to decide).
    pub fn is_rejection(&self) -> bool {
        !matches!(self, AdmitError::Read { .. })
    }
}

/// Puts the reconciler's finalizer on `lb` if it is live and lacks it; says whether it did. A
/// LoadBalancer being deleted is left alone: its finalizers are only ever taken off.
pub fn claim(lb: &mut LoadBalancer) -> bool {
    if lb.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let finalizers = lb.metadata.finalizers.get_or_insert_default();
    if finalizers.iter().any(|f| f == LB_FINALIZER) {
        return false;
    }
    finalizers.push(LB_FINALIZER.into());
    true
}

/// Whether a pool's `selector.network` must name an existing NetworkAttachmentDefinition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetworkCheck {
    /// Kubernetes backend: VM networks exist, and a pool on an unknown one is refused (as upstream).
    Require,
    /// Embedded backend: there are no VM networks to look up; any name is accepted (VLAN ID 0).
    Skip,
}

/// Admission with what the checks read, through the store port.
#[derive(Clone)]
pub struct Admission {
    store: Arc<dyn ObjectStore>,
    networks: NetworkCheck,
}

impl Admission {
    pub fn new(store: Arc<dyn ObjectStore>, networks: NetworkCheck) -> Self {
        Admission { store, networks }
    }

    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    async fn read<T>(
        &self,
        what: &'static str,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, AdmitError> {
        f.await.map_err(|source| AdmitError::Read { what, source })
    }

    async fn vmis(&self, namespace: &str) -> Result<Vec<VirtualMachineInstance>, AdmitError> {
        let api = Api::<VirtualMachineInstance>::new(self.store.clone());
        self.read(
            "virtual machine instances",
            api.list(Some(namespace), &LabelSelector::everything()),
        )
        .await
    }

    /// Mutates a LoadBalancer as upstream's mutating webhook does.
    pub async fn mutate_lb(&self, lb: &mut LoadBalancer) -> Result<(), AdmitError> {
        let namespace = lb.metadata.namespace.clone().unwrap_or_default();
        let (ns, vmis) = if is_cluster(lb) {
            let api = Api::<Namespace>::new(self.store.clone());
            let ns = self.read("namespace", api.get("", &namespace)).await?;
            let vmis = match checks::named_network(lb) {
                checks::Named::Discover(_) => self.vmis(&namespace).await?,
                checks::Named::Network(_) => Vec::new(),
            };
            (ns, vmis)
        } else {
            (None, Vec::new())
        };
        mutate_lb(lb, ns.as_ref(), &vmis);
        claim(lb);
        Ok(())
    }

    /// Mutates and validates a new LoadBalancer.
    pub(crate) async fn admit_lb_create(&self, lb: &mut LoadBalancer) -> Result<(), AdmitError> {
        self.mutate_lb(lb).await?;
        self.validate_lb_create(lb).await
    }

    /// Mutates and validates a changed LoadBalancer; `old` is the stored one.
    pub(crate) async fn admit_lb_update(
        &self,
        old: &LoadBalancer,
        new: &mut LoadBalancer,
    ) -> Result<(), AdmitError> {
        self.mutate_lb(new).await?;
        self.validate_lb_update(old, new)
    }

    /// Validates a new LoadBalancer (after mutation).
    pub async fn validate_lb_create(&self, lb: &LoadBalancer) -> Result<(), AdmitError> {
        let vms = if is_cluster(lb) {
            let api = Api::<VirtualMachine>::new(self.store.clone());
            let namespace = lb.metadata.namespace.clone().unwrap_or_default();
            self.read(
                "virtual machines",
                api.list(
                    Some(&namespace),
                    &LabelSelector::from_labels([(LABEL_CREATOR, NODE_DRIVER)]),
                ),
            )
            .await?
        } else {
            Vec::new()
        };
        Ok(validate_lb_create(lb, &vms)?)
    }

    pub fn validate_lb_update(
        &self,
        old: &LoadBalancer,
        new: &LoadBalancer,
    ) -> Result<(), AdmitError> {
        Ok(validate_lb_update(old, new)?)
    }

    async fn pools(&self) -> Result<Vec<IPPool>, AdmitError> {
        self.read(
            "IP pools",
            pool_api(self.store.clone()).list(None, &LabelSelector::everything()),
        )
        .await
    }

    /// The VLAN ID of a pool's network: a network that is not `namespace/name` is refused on both
    /// backends; where networks exist, so is an unknown one, or one whose VLAN ID does not read.
    async fn vid(&self, pool: &IPPool, create: bool) -> Result<i64, AdmitError> {
        let refused = |source| AdmitError::from(NetworkError::new(pool.name(), create, source));
        let Some((namespace, name)) =
            network::network_ref(&pool.spec.selector.network).map_err(refused)?
        else {
            return Ok(0);
        };
        if self.networks == NetworkCheck::Skip {
            return Ok(0);
        }
        let api = Api::<NetworkAttachmentDefinition>::new(self.store.clone());
        let nad = if namespace.is_empty() || name.is_empty() {
            None
        } else {
            self.read("network attachment definition", api.get(namespace, name))
                .await?
        };
        match nad {
            Some(nad) => network::vlan_id(&nad).map_err(refused),
            None => Err(refused(NetworkRejection::NotFound(name.into()))),
        }
    }

    /// Sets the labels of upstream's IPPool mutator (refusing an unknown network where networks
    /// exist); `create` picks the message's verb.
    pub async fn mutate_pool(&self, pool: &mut IPPool, create: bool) -> Result<(), AdmitError> {
        let vid = self.vid(pool, create).await?;
        mutate_pool(pool, vid);
        Ok(())
    }

    /// Mutates and validates a new pool.
    pub(crate) async fn admit_pool_create(&self, pool: &mut IPPool) -> Result<(), AdmitError> {
        let vid = self.vid(pool, true).await?;
        mutate_pool(pool, vid);
        let others = self.pools().await?;
        let entries: Vec<PoolEntry<'_>> = others.iter().map(IPPool::entry).collect();
        let me = PoolEntry {
            deleting: false,
            ..pool.entry()
        };
        Ok(ipam::validate_create(&me, &entries)?)
    }

    /// Mutates and validates a changed pool; `old` is the stored one (its status says what is held).
    pub(crate) async fn admit_pool_update(
        &self,
        old: &IPPool,
        new: &mut IPPool,
    ) -> Result<(), AdmitError> {
        if new.is_deleting() {
            return Ok(());
        }
        let vid = self.vid(new, false).await?;
        mutate_pool(new, vid);
        let others = self.pools().await?;
        let entries: Vec<PoolEntry<'_>> = others.iter().map(IPPool::entry).collect();
        let me = PoolEntry {
            deleting: false,
            ..new.entry()
        };
        Ok(ipam::validate_update(&me, &old.allocated(), &entries)?)
    }

    /// Refuses to delete a pool that still holds addresses.
    pub(crate) fn admit_pool_delete(&self, pool: &IPPool) -> Result<(), AdmitError> {
        Ok(ipam::validate_delete(pool.name(), &pool.allocated())?)
    }
}
