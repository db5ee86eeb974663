//! Leader election for the reconcilers: only the leader writes, every replica serves the HTTP API.
//!
//! [`LeaderElector`] is the seam: the embedded backend (one process owns the data directory) uses
//! [`AlwaysLeader`]; several replicas on one Kubernetes API use [`LeaseElector`], client-go's
//! algorithm on a `coordination.k8s.io/v1` Lease written through the store port. Expiry is judged by
//! the local clock from when this replica last saw the Lease change (as client-go does), so clock skew
//! between replicas does not matter.
//!
//! Leadership is a hint, not a lock: a replica that lost the Lease may still finish a write it had
//! started. That is safe because every IPPool status write is conditional on the resourceVersion the
//! writer read, so a deposed leader's allocation conflicts instead of handing out an address twice.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::{
    store::{Api, ObjectStore, StoreError},
    sync::lock,
};

/// Leadership while it lasts: `lost` is cancelled when it ends (a failed renewal, or release).
/// Dropping it stops the renewals without giving the Lease up, as a crash would: the Lease then
/// expires.
pub struct Leadership {
    pub lost: CancellationToken,
    renewer: Option<tokio::task::JoinHandle<()>>,
    /// Gives the Lease up, so that another replica takes over at once.
    release: Option<Box<dyn FnOnce() -> futures::future::BoxFuture<'static, ()> + Send>>,
}

impl Leadership {
    /// Leadership that is never lost.
    pub fn forever() -> Self {
        Leadership {
            lost: CancellationToken::new(),
            renewer: None,
            release: None,
        }
    }

    /// Gives leadership up (on shutdown, or after `lost`).
    pub async fn release(mut self) {
        self.stop_renewing();
        if let Some(release) = self.release.take() {
            release().await;
        }
    }

    fn stop_renewing(&mut self) {
        self.lost.cancel();
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.stop_renewing();
    }
}

/// Decides which replica runs the reconcilers.
#[async_trait]
pub trait LeaderElector: Send + Sync + 'static {
    /// Waits until this replica leads; `None` if `shutdown` came first.
    async fn acquire(&self, shutdown: &CancellationToken) -> Option<Leadership>;
}

/// The only replica: the embedded backend's data directory is locked by one process.
pub struct AlwaysLeader;

#[async_trait]
impl LeaderElector for AlwaysLeader {
    async fn acquire(&self, shutdown: &CancellationToken) -> Option<Leadership> {
        (!shutdown.is_cancelled()).then(Leadership::forever)
    }
}

/// Runs `work` whenever this replica leads, until `shutdown`. Each run gets a token that is
/// cancelled when leadership is lost or at shutdown; leadership is given up once the run returns, and
/// then awaited again (unless shutting down). `what` names the work in the log.
pub async fn lead<F, Fut>(
    elector: &dyn LeaderElector,
    shutdown: &CancellationToken,
    what: &str,
    identity: &str,
    mut work: F,
) where
    F: FnMut(CancellationToken) -> Fut,
    Fut: Future<Output = ()>,
{
    loop {
        let Some(leadership) = elector.acquire(shutdown).await else {
            return;
        };
        info!(%identity, "leading: starting the {what}");
        let stop = CancellationToken::new();
        let watcher_task = {
            let (stop, lost, shutdown) = (stop.clone(), leadership.lost.clone(), shutdown.clone());
            tokio::spawn(
                async move {
                    tokio::select! {
                        _ = lost.cancelled() => {},
                        _ = shutdown.cancelled() => {},
                        _ = stop.cancelled() => {},
                    }
                    stop.cancel();
                }
                .instrument(info_span!("leadership")),
            )
        };
        work(stop.clone()).await;
        stop.cancel();
        let _ = watcher_task.await;
        leadership.release().await;
        if shutdown.is_cancelled() {
            info!("{what} stopped");
            return;
        }
        warn!("lost leadership: {what} stopped; waiting to lead again");
    }
}

/// Timing of [`LeaseElector`] (client-go's defaults: 15 s, 10 s, 2 s).
#[derive(Clone, Debug)]
pub struct LeaseTiming {
    /// How long a Lease that is not renewed keeps others out.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up leading.
    pub renew_deadline: Duration,
    /// Pause between attempts to acquire or renew.
    pub retry_period: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        LeaseTiming {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Lease-based election through the store port.
pub struct LeaseElector {
    inner: Arc<LeaseInner>,
}

struct LeaseInner {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    timing: LeaseTiming,
    /// The Lease as last seen (resourceVersion) and when this replica saw it change.
    observed: Mutex<Option<(String, Instant)>>,
}

/// A failed attempt to read or write the Lease.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LeaseError {
    #[error("cannot read lease {namespace}/{name}: {source}")]
    Read {
        namespace: String,
        name: String,
        source: StoreError,
    },
    #[error("cannot write lease {namespace}/{name}: {source}")]
    Write {
        namespace: String,
        name: String,
        source: StoreError,
    },
}

impl LeaseElector {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        namespace: &str,
        name: &str,
        identity: &str,
        timing: LeaseTiming,
    ) -> Self {
        LeaseElector {
            inner: Arc::new(LeaseInner {
                api: Api::new(store),
                namespace: namespace.into(),
                name: name.into(),
                identity: identity.into(),
                timing,
                observed: Mutex::new(None),
            }),
        }
    }
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

impl LeaseInner {
    fn read_error(&self, source: StoreError) -> LeaseError {
        LeaseError::Read {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        }
    }

    fn write_error(&self, source: StoreError) -> LeaseError {
        LeaseError::Write {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        }
    }

    /// One round of client-go's tryAcquireOrRenew: true when this replica holds the Lease after it.
    async fn try_acquire_or_renew(&self) -> Result<bool, LeaseError> {
        let now = MicroTime(Timestamp::now());
        let current = self
            .api
            .get(&self.namespace, &self.name)
            .await
            .map_err(|e| self.read_error(e))?;
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(seconds(self.timing.lease_duration)),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&lease).await {
                Ok(created) => {
                    self.observe(&created);
                    Ok(true)
                }
                Err(e) if e.is_already_exists() => Ok(false),
                Err(e) => Err(self.write_error(e)),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let seen_at = self.observe(&lease);
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map(Duration::from_secs)
            .unwrap_or(self.timing.lease_duration);
        if !holder.is_empty() && holder != self.identity && seen_at.elapsed() < duration {
            return Ok(false);
        }
        let mut next = spec;
        if holder != self.identity {
            next.acquire_time = Some(now.clone());
            next.lease_transitions = Some(next.lease_transitions.unwrap_or(0) + 1);
        }
        next.holder_identity = Some(self.identity.clone());
        next.lease_duration_seconds = Some(seconds(self.timing.lease_duration));
        next.renew_time = Some(now);
        lease.spec = Some(next);
        match self.api.replace(&lease).await {
            Ok(updated) => {
                self.observe(&updated);
                Ok(true)
            }
            Err(StoreError::Conflict { .. }) => Ok(false),
            Err(e) => Err(self.write_error(e)),
        }
    }

    /// Records the Lease's version; returns when this replica first saw that version.
    fn observe(&self, lease: &Lease) -> Instant {
        let rv = lease.metadata.resource_version.clone().unwrap_or_default();
        let mut observed = lock(&self.observed);
        match &*observed {
            Some((seen, at)) if *seen == rv => *at,
            _ => {
                let now = Instant::now();
                *observed = Some((rv, now));
                now
            }
        }
    }

    /// Gives the Lease up if this replica still holds it (client-go's ReleaseOnCancel).
    async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get(&self.namespace, &self.name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(&self.identity) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self.api.replace(&lease).await {
            Ok(_) => info!(lease = %self.name, "released leadership"),
            Err(e) => warn!(lease = %self.name, error = %e, "cannot release the lease"),
        }
    }

    /// Renews until a renewal has failed for `renew_deadline`, or `stop`.
    async fn renew(self: Arc<Self>, lost: CancellationToken) {
        let mut last_renewed = Instant::now();
        loop {
            tokio::select! {
                _ = lost.cancelled() => return,
                _ = tokio::time::sleep(self.timing.retry_period) => {}
            }
            match self.try_acquire_or_renew().await {
                Ok(true) => last_renewed = Instant::now(),
                Ok(false) => {
                    warn!(lease = %self.name, "another replica holds the lease; stopping");
                    lost.cancel();
                    return;
                }
                Err(e) => warn!(lease = %self.name, error = %e, "lease renewal failed"),
            }
            if last_renewed.elapsed() >= self.timing.renew_deadline {
                warn!(lease = %self.name, "could not renew the lease in time; stopping");
                lost.cancel();
                return;
            }
        }
    }
}

#[async_trait]
impl LeaderElector for LeaseElector {
    async fn acquire(&self, shutdown: &CancellationToken) -> Option<Leadership> {
        let inner = &self.inner;
        loop {
            match inner.try_acquire_or_renew().await {
                Ok(true) => break,
                Ok(false) => debug!(lease = %inner.name, "lease held by another replica"),
                Err(e) => warn!(lease = %inner.name, error = %e, "cannot acquire the lease"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = tokio::time::sleep(inner.timing.retry_period) => {}
            }
        }
        info!(lease = %inner.name, identity = %inner.identity, "acquired leadership");
        let lost = CancellationToken::new();
        let renewer = tokio::spawn(
            inner
                .clone()
                .renew(lost.clone())
                .instrument(info_span!("lease_renewer", lease = %inner.name)),
        );
        let releaser = inner.clone();
        Some(Leadership {
            lost,
            renewer: Some(renewer),
            release: Some(Box::new(move || {
                Box::pin(async move { releaser.release().await })
            })),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::{Durability, EmbeddedStore};

    fn fast() -> LeaseTiming {
        LeaseTiming {
            lease_duration: Duration::from_secs(1),
            renew_deadline: Duration::from_millis(800),
            retry_period: Duration::from_millis(50),
        }
    }

    #[tokio::test]
    async fn one_leader_at_a_time_and_release_hands_over() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = EmbeddedStore::open(dir.path(), Durability::Normal)
            .await
            .expect("opens");
        let store: Arc<dyn ObjectStore> = store;
        let a = LeaseElector::new(store.clone(), "kube-system", "lb", "a", fast());
        let b = LeaseElector::new(store.clone(), "kube-system", "lb", "b", fast());
        let shutdown = CancellationToken::new();
        let leading = a.acquire(&shutdown).await.expect("a leads");
        // b cannot take a held, renewed lease.
        assert!(!b.inner.try_acquire_or_renew().await.expect("reads"));
        let waiting = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { b.acquire(&shutdown).await.is_some() }
        });
        leading.release().await;
        assert!(waiting.await.expect("joins"), "b leads after a released");
        let lease = Api::<Lease>::new(store)
            .get("kube-system", "lb")
            .await
            .expect("reads")
            .expect("exists");
        let spec = lease.spec.expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("b"));
        assert_eq!(spec.lease_transitions, Some(1));
    }

    #[tokio::test]
    async fn an_unrenewed_lease_expires() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = EmbeddedStore::open(dir.path(), Durability::Normal)
            .await
            .expect("opens");
        let store: Arc<dyn ObjectStore> = store;
        let a = LeaseElector::new(store.clone(), "kube-system", "lb", "a", fast());
        assert!(a.inner.try_acquire_or_renew().await.expect("acquires"));
        // `a` stops renewing (as if killed); `b` takes over once the lease duration has passed.
        let b = LeaseElector::new(store, "kube-system", "lb", "b", fast());
        let shutdown = CancellationToken::new();
        let leading = b.acquire(&shutdown).await.expect("b leads");
        assert!(!leading.lost.is_cancelled());
        // And `a`, renewing now, finds it has lost.
        assert!(!a.inner.try_acquire_or_renew().await.expect("reads"));
    }
}
