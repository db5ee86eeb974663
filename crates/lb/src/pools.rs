//! The per-pool allocation service: one task per IPPool owns that pool's [`PoolAllocator`] and is the
//! only writer of its status, so every allocation and release of a pool is serialised in-process (the
//! "lock per pool" upstream lacks).
//!
//! Requests are combined: while one status write is in flight, the requests that arrive meanwhile
//! queue, and the next round applies them all to the allocator and writes the status once. Replies go
//! out only after the write is acknowledged, so an address is never reported before it is durable in
//! the pool. Every write is conditional on the resourceVersion the task last read or wrote; on a
//! conflict (another replica, a hand edit) the task re-reads the pool, rebuilds the allocator from its
//! status and applies the round again. Allocation and release are idempotent, so re-applying is safe.
//!
//! A load balancer refused because the pool is exhausted, or because the address it asks for is
//! held, is remembered by the task that refused it; the first release of that pool wakes every such
//! waiter.
//!
//! A pool whose usage reaches 90% gets a Warning Event (once per crossing), and its
//! `ippool_usage_ratio` metric follows every durable change.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    sync::{Arc, Mutex},
};

use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::{
    controller::events::{EventType, Recorder, reason},
    crd::{IPPool, LoadBalancer, pool_api},
    ipam::{
        self, AllocateError, Allocation, Condition, Family, ManualRelease, ManualReleaseOutcome,
        PoolAllocator, PoolError, PoolStatus,
    },
    store::{Api, ObjectStore, StoreError},
    sync::lock,
};

mod known;
use known::Known;

/// Requests applied in one round (and one status write) at most.
const ROUND: usize = 1024;
/// Rounds retried after conflicting writes before the requests fail.
const ATTEMPTS: usize = 10;
/// The share of a pool's addresses in use at which it gets a Warning Event.
pub(crate) const USAGE_WARNING: f64 = 0.9;

/// What an allocation asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Any address; of this family only, when one is given.
    Any(Option<Family>),
    /// Exactly this address. An id holding another address of the pool moves to it only when it is
    /// free.
    Exactly(IpAddr),
}
/// A busy pool writes its status at most once per this much time per held entry, waiting
/// [`MAX_PAUSE`] at most: each write copies the whole status (and every version is a new object in
/// the store and its watchers), so without pacing, many pools with a few requests each write
/// thousands of entries per allocation; paced, their rounds are fewer and larger. A pool written a
/// while ago (a lone request) is not held back.
const PAUSE_PER_ENTRY: std::time::Duration = std::time::Duration::from_micros(250);
const MAX_PAUSE: std::time::Duration = std::time::Duration::from_millis(250);

/// What a pool task is asked to do.
#[derive(Debug)]
pub enum PoolOp {
    /// Give `id` an address; `waiter` is woken when the pool frees one, if it is exhausted now.
    Allocate {
        id: String,
        want: Want,
        waiter: ObjectRef<LoadBalancer>,
    },
    /// Release whatever `id` holds into the history.
    Release { id: String },
    /// `ip`, held by `from`, goes to `to` in the same round ([`crate::sharing::hand_over_in`]).
    Handover {
        from: String,
        to: String,
        ip: IpAddr,
    },
    /// The pool object changed: rebuild from the stored pool, apply a manual release, and set the
    /// counters and the Ready condition.
    Sync {
        manual_release: Option<ManualRequest>,
    },
    /// The pool is being deleted: succeeds only when it holds nothing (then the task stops).
    Finalize,
}

/// A manual release and whether its LoadBalancer still exists.
#[derive(Debug, Clone)]
pub struct ManualRequest {
    pub request: ManualRelease,
    pub load_balancer_exists: bool,
}

/// The answer to a [`PoolOp`].
#[derive(Debug, Clone)]
pub enum PoolReply {
    Allocated(Allocation),
    Released(Vec<IpAddr>),
    Synced {
        total: i64,
        available: i64,
        manual: Option<ManualReleaseOutcome>,
    },
    /// The pool holds nothing and may go.
    Empty,
    /// The pool still holds this many addresses.
    NotEmpty(usize),
}

/// A failed pool operation.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PoolOpError {
    /// Upstream's text for a pool it has no allocator for.
    #[error("fail to get allocator {pool}")]
    Missing { pool: String },
    #[error("IP pool {pool} is being deleted")]
    Deleting { pool: String },
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// Ours: the pool's `skipAddresses` annotation does not read (admission refuses it; this one
    /// was written past admission, e.g. while upstream's webhook ran): no new address until it
    /// is fixed.
    #[error("invalid annotation of IP pool {pool}: {source}")]
    InvalidSkip {
        pool: String,
        source: crate::ipam::SkipError,
    },
    #[error("fail to update IP pool {pool}: {source}")]
    Write {
        pool: String,
        source: Arc<StoreError>,
    },
    #[error("fail to read IP pool {pool}: {source}")]
    Read {
        pool: String,
        source: Arc<StoreError>,
    },
    #[error("IP pool {pool} changed concurrently {ATTEMPTS} times in a row")]
    Contended { pool: String },
    #[error("the allocator of IP pool {pool} stopped")]
    Stopped { pool: String },
}

impl PoolOpError {
    pub fn is_exhausted(&self) -> bool {
        matches!(
            self,
            PoolOpError::Pool(PoolError::Allocate {
                source: AllocateError::Exhausted { .. },
                ..
            })
        )
    }

    /// Whether the pool skips the requested address.
    pub fn is_skipped(&self) -> bool {
        matches!(
            self,
            PoolOpError::Pool(PoolError::Allocate {
                source: AllocateError::Skipped { .. },
                ..
            })
        )
    }

    /// The applicant holding a requested address, when that is why the request failed.
    pub fn holder(&self) -> Option<&str> {
        match self {
            PoolOpError::Pool(PoolError::Allocate {
                source: AllocateError::Taken { holder, .. },
                ..
            }) => Some(holder),
            _ => None,
        }
    }
}

struct Request {
    op: PoolOp,
    reply: oneshot::Sender<Result<PoolReply, PoolOpError>>,
}

/// Where woken load balancers go (the LB controller's `reconcile_on` stream).
pub type Wake = mpsc::UnboundedSender<ObjectRef<LoadBalancer>>;

/// The pool tasks, started on first use.
pub struct Pools {
    store: Arc<dyn ObjectStore>,
    tasks: Mutex<HashMap<String, mpsc::UnboundedSender<Request>>>,
    /// The versions each task last wrote its pool at, and what it holds.
    known: Arc<Known>,
    wake: Wake,
    events: Recorder,
    stop: CancellationToken,
}

impl Pools {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        wake: Wake,
        events: Recorder,
        stop: CancellationToken,
    ) -> Self {
        Pools {
            store,
            tasks: Mutex::new(HashMap::new()),
            known: Arc::default(),
            wake,
            events,
            stop,
        }
    }

    /// Whether `pool` is, exactly, a version its task wrote (one of the last few): such a
    /// change (a status write of an allocation round) is already known to the task and calls for
    /// no pool reconcile.
    pub fn wrote(&self, pool: &IPPool) -> bool {
        pool.metadata
            .resource_version
            .as_deref()
            .is_some_and(|version| self.known.wrote(pool.name(), version))
    }

    /// What the pool watch decodes ([`known`]): not the versions a task wrote while its view of
    /// the pool stands.
    pub fn screen(&self) -> crate::store::watcher::Screen {
        let known = self.known.clone();
        Arc::new(move |seen| known.screen(seen))
    }

    /// Whether `pool` holds `ip` for `who` as stored: as its task last read or wrote it while no
    /// later version was seen, else as `cache` has it.
    pub fn holds(&self, cache: &Store<IPPool>, pool: &str, ip: &str, who: &str) -> bool {
        self.known.holds(pool, ip, who).unwrap_or_else(|| {
            cache.get(&ObjectRef::new(pool)).is_some_and(|p| {
                p.status
                    .as_ref()
                    .is_some_and(|s| s.allocated.get(ip).is_some_and(|id| id == who))
            })
        })
    }

    fn sender(&self, pool: &str) -> mpsc::UnboundedSender<Request> {
        let mut tasks = lock(&self.tasks);
        if let Some(tx) = tasks.get(pool).filter(|tx| !tx.is_closed()) {
            return tx.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let task = PoolTask {
            name: pool.to_string(),
            store: self.store.clone(),
            api: pool_api(self.store.clone()),
            loaded: None,
            waiters: HashSet::new(),
            wake: self.wake.clone(),
            events: self.events.clone(),
            crowded: false,
            known: self.known.clone(),
        };
        tokio::spawn(
            task.run(rx, self.stop.clone())
                .instrument(info_span!("pool", pool = %pool)),
        );
        tasks.insert(pool.to_string(), tx.clone());
        tx
    }

    /// Runs `op` on `pool`'s task.
    pub async fn call(&self, pool: &str, op: PoolOp) -> Result<PoolReply, PoolOpError> {
        let stopped = || PoolOpError::Stopped { pool: pool.into() };
        let (reply, rx) = oneshot::channel();
        self.sender(pool)
            .send(Request { op, reply })
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    /// The pools that have (or had) a task in this process.
    pub fn known(&self) -> Vec<String> {
        lock(&self.tasks).keys().cloned().collect()
    }

    /// Forgets a pool's task (after the pool is gone).
    pub fn forget(&self, pool: &str) {
        lock(&self.tasks).remove(pool);
        self.known.forget(pool);
    }
}

/// The pool as last read or written, and the allocator built from it.
struct Loaded {
    pool: IPPool,
    /// `Err` when the ranges do not parse: nothing can be allocated, the status says why.
    allocator: Result<PoolAllocator, PoolError>,
    /// The pool's `skipAddresses` annotation does not read (written past admission): no new
    /// address is handed out, the status says why; releases and the addresses held go on.
    blocked: Option<PoolOpError>,
    /// The stored status is exactly what a sync would write (this task wrote it, or a sync found
    /// nothing to change), so a sync of the same version has nothing to do.
    synced: bool,
}

struct PoolTask {
    name: String,
    store: Arc<dyn ObjectStore>,
    api: Api<IPPool>,
    loaded: Option<Loaded>,
    waiters: HashSet<ObjectRef<LoadBalancer>>,
    wake: Wake,
    events: Recorder,
    /// The pool's usage was at or above [`USAGE_WARNING`] after the last durable change (and the
    /// Warning Event said so).
    crowded: bool,
    known: Arc<Known>,
}

/// The outcome of applying one round, before the write.
struct Applied {
    replies: Vec<Result<PoolReply, PoolOpError>>,
    /// A sync ran: once its status is stored, the pool is synced.
    synced: bool,
    /// The status to write, if it changed.
    status: Option<StatusWrite>,
    freed: bool,
    stop_after: bool,
}

/// How a round's status reaches the store.
enum StatusWrite {
    /// Written whole: after a (re)load, a sync, or an allocator that journals nothing.
    Whole(PoolStatus),
    /// Only what the round changed, as a merge patch of the status the task last wrote (which the
    /// task's copy of the pool already holds patched): an allocation round costs what it changed,
    /// not every address of the pool.
    Patch(serde_json::Value),
}

impl PoolTask {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Request>, stop: CancellationToken) {
        let mut batch = Vec::with_capacity(ROUND);
        let mut last_round: Option<std::time::Instant> = None;
        loop {
            let received = tokio::select! {
                _ = stop.cancelled() => 0,
                n = rx.recv_many(&mut batch, ROUND) => n,
            };
            if received == 0 {
                break;
            }
            if let Some(pause) = self.pause(last_round)
                && batch.len() < ROUND
            {
                tokio::select! {
                    _ = stop.cancelled() => {},
                    _ = tokio::time::sleep(pause) => {},
                }
                while batch.len() < ROUND
                    && let Ok(r) = rx.try_recv()
                {
                    batch.push(r);
                }
            }
            last_round = Some(std::time::Instant::now());
            let stop_after = self.round(&mut batch).await;
            batch.clear();
            if stop_after {
                debug!("pool is gone; allocator stopped");
                crate::metrics::remove_pool(&self.name);
                self.known.forget(&self.name);
                break;
            }
        }
    }

    /// How long the next round waits for more requests: the time a status of this size may be
    /// written again after the last round began, less what has passed since.
    fn pause(&self, last_round: Option<std::time::Instant>) -> Option<std::time::Duration> {
        let status = self.loaded.as_ref()?.pool.status.as_ref()?;
        let entries = status.allocated.len() + status.allocated_history.len();
        let interval = PAUSE_PER_ENTRY
            .saturating_mul(u32::try_from(entries).unwrap_or(u32::MAX))
            .min(MAX_PAUSE);
        interval
            .checked_sub(last_round?.elapsed())
            .filter(|p| !p.is_zero())
    }

    /// Reads the pool; rebuilds the allocator from its status unless the pool is exactly the one the
    /// allocator was built from or last wrote (same resourceVersion).
    async fn load(&mut self) -> Result<(), PoolOpError> {
        let mark = self.known.mark(&self.name);
        let pool = self
            .api
            .get("", &self.name)
            .await
            .map_err(|e| PoolOpError::Read {
                pool: self.name.clone(),
                source: Arc::new(e),
            })?
            .ok_or_else(|| PoolOpError::Missing {
                pool: self.name.clone(),
            })?;
        if let Some(version) = pool.metadata.resource_version.as_deref() {
            self.known
                .read(&self.name, mark, version, pool.status.as_ref());
        }
        if let Some(loaded) = &self.loaded
            && loaded.pool.metadata.resource_version.is_some()
            && loaded.pool.metadata.resource_version == pool.metadata.resource_version
        {
            return Ok(());
        }
        let none = PoolStatus::default();
        let status = pool.status.as_ref().unwrap_or(&none);
        let mut allocator = PoolAllocator::from_status(&self.name, &pool.spec.ranges, status);
        // What the pool skips comes with the pool object, so a change of the annotation (a new
        // resourceVersion) rebuilds the allocator too.
        let blocked = match pool.skip() {
            Ok(skip) => {
                if let Ok(a) = allocator.as_mut() {
                    a.set_skip(skip);
                }
                None
            }
            Err(source) => Some(PoolOpError::InvalidSkip {
                pool: self.name.clone(),
                source,
            }),
        };
        self.loaded = Some(Loaded {
            pool,
            allocator,
            blocked,
            synced: false,
        });
        Ok(())
    }

    /// Applies and writes one batch; true when the task should stop.
    async fn round(&mut self, batch: &mut Vec<Request>) -> bool {
        // A sync (and a finalize) reads the pool afresh: it is how a spec change or a deletion
        // reaches the allocator.
        let mut fresh = batch
            .iter()
            .any(|r| matches!(r.op, PoolOp::Sync { .. } | PoolOp::Finalize));
        for _ in 0..ATTEMPTS {
            if (fresh || self.loaded.is_none())
                && let Err(e) = self.load().await
            {
                let gone = matches!(e, PoolOpError::Missing { .. });
                self.loaded = None;
                for r in batch.drain(..) {
                    let _ = r.reply.send(Err(e.clone()));
                }
                return gone;
            }
            fresh = false;
            let applied = self.apply(batch);
            let Some(status) = applied.status else {
                if applied.synced
                    && let Some(loaded) = self.loaded.as_mut()
                {
                    loaded.synced = true;
                }
                self.finish(batch, applied.replies, applied.freed);
                return applied.stop_after;
            };
            let before = self
                .loaded
                .as_ref()
                .and_then(|l| l.pool.metadata.resource_version.clone());
            let mark = self.known.mark(&self.name);
            let (written, patch) = match status {
                StatusWrite::Whole(status) => (self.write_whole(status).await, None),
                StatusWrite::Patch(patch) => (self.write_patch(&patch).await, Some(patch)),
            };
            match written {
                Ok(resource_version) => {
                    if let Some(loaded) = self.loaded.as_mut() {
                        // The same version back: the store found nothing to change, and that
                        // version is not the task's own.
                        if before.as_ref() != Some(&resource_version) {
                            self.known.written(
                                &self.name,
                                mark,
                                before.as_deref(),
                                &resource_version,
                                patch.as_ref(),
                                loaded.pool.status.as_ref(),
                            );
                        }
                        loaded.pool.metadata.resource_version = Some(resource_version);
                        loaded.synced |= applied.synced;
                    }
                    self.finish(batch, applied.replies, applied.freed);
                    return applied.stop_after;
                }
                Err(StoreError::Conflict { .. }) => {
                    debug!("pool changed concurrently; re-reading it");
                    self.loaded = None;
                }
                Err(e) => {
                    // A 404 is "gone" only if the pool is: a server without the status endpoint,
                    // or one a CRD swap is changing, answers a write with 404 too, and reading
                    // that as gone would let a release go ahead that was never written (a leaked
                    // address).
                    let gone =
                        e.is_not_found() && matches!(self.api.get("", &self.name).await, Ok(None));
                    warn!(error = %e, gone, "cannot write the pool status");
                    // The allocator may be ahead of the store now: rebuild it next time.
                    self.loaded = None;
                    let e = if gone {
                        PoolOpError::Missing {
                            pool: self.name.clone(),
                        }
                    } else {
                        PoolOpError::Write {
                            pool: self.name.clone(),
                            source: Arc::new(e),
                        }
                    };
                    for r in batch.drain(..) {
                        let _ = r.reply.send(Err(e.clone()));
                    }
                    return gone;
                }
            }
        }
        let e = PoolOpError::Contended {
            pool: self.name.clone(),
        };
        for r in batch.drain(..) {
            let _ = r.reply.send(Err(e.clone()));
        }
        false
    }

    /// Writes `status` whole; returns the new resourceVersion. On success the task's pool holds
    /// it and the allocator journals from it. The written object is not decoded back: it is the
    /// one just sent, and a pool holds thousands of entries.
    async fn write_whole(&mut self, status: PoolStatus) -> Result<String, StoreError> {
        let Some(loaded) = self.loaded.as_mut() else {
            return Err(self.not_loaded());
        };
        // The pool without its old status: copying that only to replace it would cost as much
        // as the write.
        let old = loaded.pool.status.take();
        let mut next = loaded.pool.clone();
        loaded.pool.status = old;
        next.status = Some(status);
        let value = serde_json::to_value(&next).map_err(|e| StoreError::Invalid {
            kind: "ippool".into(),
            name: self.name.clone(),
            reason: e.to_string(),
        })?;
        let written = self.store.replace_status(self.api.kind(), value).await?;
        if let Some(loaded) = self.loaded.as_mut() {
            loaded.pool = next;
            if let Ok(allocator) = loaded.allocator.as_mut() {
                allocator.start_journal();
            }
        }
        Ok(written
            .pointer("/metadata/resourceVersion")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_string())
    }

    /// Writes a round's merge patch of the status, conditional on the version the task last read
    /// or wrote; returns the new resourceVersion.
    async fn write_patch(&self, patch: &serde_json::Value) -> Result<String, StoreError> {
        let Some(loaded) = self.loaded.as_ref() else {
            return Err(self.not_loaded());
        };
        let version = loaded
            .pool
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
        // The new version is known for the task's own before the watch can deliver it.
        let planned = |v: &str| self.known.planned(&self.name, v);
        self.store
            .merge_status_planned(self.api.kind(), "", &self.name, &version, patch, &planned)
            .await
    }

    /// The task lost its pool between applying a round and writing it: a conflict, so that the
    /// round re-reads the pool and applies again.
    fn not_loaded(&self) -> StoreError {
        StoreError::Conflict {
            kind: "ippool".into(),
            name: self.name.clone(),
        }
    }

    fn finish(
        &mut self,
        batch: &mut Vec<Request>,
        replies: Vec<Result<PoolReply, PoolOpError>>,
        freed: bool,
    ) {
        for (r, reply) in batch.drain(..).zip(replies) {
            let _ = r.reply.send(reply);
        }
        // Counts as durable now: this runs after the status write (or when nothing changed).
        if let Some(Loaded {
            allocator: Ok(a),
            pool,
            ..
        }) = &self.loaded
        {
            let (total, in_use) = (a.total() as f64, a.in_use() as f64);
            crate::metrics::set_pool_addresses(&self.name, total, a.available() as f64, in_use);
            let crowded = total > 0.0 && in_use / total >= USAGE_WARNING;
            if crowded && !self.crowded {
                let message = format!(
                    "IP pool {} is {:.0}% used: {} of {} addresses allocated, {} available",
                    self.name,
                    100.0 * in_use / total,
                    a.in_use(),
                    a.total(),
                    a.available()
                );
                warn!(%message, "IP pool nearly full");
                self.events
                    .record(pool, EventType::Warning, reason::POOL_NEARLY_FULL, message);
            }
            self.crowded = crowded;
        }
        if freed && !self.waiters.is_empty() {
            info!(
                waiters = self.waiters.len(),
                "addresses freed; waking waiting load balancers"
            );
            for waiter in self.waiters.drain() {
                let _ = self.wake.send(waiter);
            }
        }
    }

    /// Applies the batch to the allocator; the status is `Some` only when it must be written.
    fn apply(&mut self, batch: &[Request]) -> Applied {
        let name = self.name.clone();
        let mut replies = Vec::with_capacity(batch.len());
        let mut freed = false;
        // Whether the allocator moved: only then (or on a sync) is the status rebuilt, which costs
        // a pass over every held address.
        let mut changed = false;
        let mut stop_after = false;
        let mut ready: Option<Result<(), String>> = None;
        let Some(loaded) = self.loaded.as_mut() else {
            return Applied {
                replies: batch
                    .iter()
                    .map(|_| Err(PoolOpError::Missing { pool: name.clone() }))
                    .collect(),
                synced: false,
                status: None,
                freed,
                stop_after,
            };
        };
        let deleting = loaded.pool.is_deleting();
        let blocked = loaded.blocked.clone();
        for r in batch {
            let reply = match (&r.op, &mut loaded.allocator) {
                (PoolOp::Sync { .. }, Err(e)) => {
                    ready = Some(Err(e.to_string()));
                    Ok(PoolReply::Synced {
                        total: 0,
                        available: 0,
                        manual: None,
                    })
                }
                (PoolOp::Finalize, Err(_)) => {
                    let held = loaded.pool.allocated().len();
                    stop_after = held == 0;
                    Ok(if held == 0 {
                        PoolReply::Empty
                    } else {
                        PoolReply::NotEmpty(held)
                    })
                }
                (_, Err(e)) => Err(PoolOpError::Pool(e.clone())),
                (PoolOp::Allocate { id, want, waiter }, Ok(allocator)) => {
                    let keeps = match want {
                        Want::Any(_) => allocator.address_of(id).is_some(),
                        Want::Exactly(ip) => allocator.holder(*ip) == Some(id.as_str()),
                    };
                    if deleting && !keeps {
                        Err(PoolOpError::Deleting { pool: name.clone() })
                    } else if let Some(e) = blocked.clone().filter(|_| !keeps) {
                        Err(e)
                    } else {
                        let result = match want {
                            Want::Any(family) => allocator.allocate_family(id, *family),
                            Want::Exactly(ip) => allocator.request_ip(id, *ip),
                        };
                        match result {
                            Ok(a) => {
                                self.waiters.remove(waiter);
                                changed |= a.origin != ipam::Origin::Held;
                                Ok(PoolReply::Allocated(a))
                            }
                            Err(e) => {
                                let e = PoolOpError::Pool(e);
                                if e.is_exhausted() || e.holder().is_some() {
                                    self.waiters.insert(waiter.clone());
                                }
                                Err(e)
                            }
                        }
                    }
                }
                (PoolOp::Handover { from, to, ip }, Ok(allocator)) => {
                    match crate::sharing::hand_over_in(allocator, from, to, *ip) {
                        None => Ok(PoolReply::Released(Vec::new())),
                        Some(moved) => {
                            (changed, freed) = (true, freed | moved.is_err());
                            moved.map(PoolReply::Allocated).map_err(PoolOpError::Pool)
                        }
                    }
                }
                (PoolOp::Release { id }, Ok(allocator)) => {
                    let released = allocator.release(id);
                    freed |= !released.is_empty();
                    changed |= !released.is_empty();
                    Ok(PoolReply::Released(released))
                }
                (PoolOp::Sync { manual_release }, Ok(allocator)) => {
                    let manual = manual_release
                        .as_ref()
                        .map(|m| allocator.manual_release(&m.request, m.load_balancer_exists));
                    freed |= matches!(manual, Some(ManualReleaseOutcome::Released));
                    // A grown pool (or one that skips less) may serve waiters; waking them
                    // costs little.
                    freed |= allocator.free() > 0;
                    if !loaded.synced || manual.is_some() {
                        ready = Some(blocked.as_ref().map_or(Ok(()), |e| Err(e.to_string())));
                    }
                    Ok(PoolReply::Synced {
                        total: i64::try_from(allocator.total()).unwrap_or(i64::MAX),
                        available: i64::try_from(allocator.available()).unwrap_or(i64::MAX),
                        manual,
                    })
                }
                (PoolOp::Finalize, Ok(allocator)) => {
                    let held = allocator.in_use() as usize + allocator.strays().len();
                    stop_after = held == 0 && deleting;
                    Ok(if held == 0 {
                        PoolReply::Empty
                    } else {
                        PoolReply::NotEmpty(held)
                    })
                }
            };
            replies.push(reply);
        }

        let synced = ready.is_some();
        if !changed && ready.is_none() {
            return Applied {
                replies,
                synced,
                status: None,
                freed,
                stop_after,
            };
        }
        // An allocation round on a status the task wrote: only what changed.
        if ready.is_none()
            && let (Ok(allocator), Some(status)) =
                (loaded.allocator.as_mut(), loaded.pool.status.as_mut())
            && let Some(patch) = allocator.patch_status(status)
        {
            return Applied {
                replies,
                synced,
                status: Some(StatusWrite::Patch(patch)),
                freed,
                stop_after,
            };
        }
        // Built afresh rather than from a copy of the stored status: the allocator rewrites all
        // but the conditions, and a copy of thousands of entries per round would cost as much.
        let current = loaded.pool.status.as_ref();
        let mut status = match &loaded.allocator {
            Ok(allocator) => {
                let mut status = PoolStatus {
                    conditions: current.map(|c| c.conditions.clone()).unwrap_or_default(),
                    ..PoolStatus::default()
                };
                allocator.write_status(&mut status);
                status
            }
            Err(_) => current.cloned().unwrap_or_default(),
        };
        if let Some(ready) = ready {
            let (ok, message) = match ready {
                Ok(()) => (true, String::new()),
                Err(message) => (false, message),
            };
            set_ready(&mut status.conditions, ok, "", &message);
        }
        let unchanged = match current {
            Some(current) => status == *current,
            None => status == PoolStatus::default(),
        };
        Applied {
            replies,
            synced,
            status: (!unchanged).then_some(StatusWrite::Whole(status)),
            freed,
            stop_after,
        }
    }
}

/// The current time as conditions carry it.
pub fn now_rfc3339() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Sets the `Ready` condition; times move only when something about it changes (as wrangler does),
/// so that an unchanged condition does not cause a write.
pub(crate) fn set_ready(conditions: &mut Vec<Condition>, ok: bool, reason: &str, message: &str) {
    set_condition(
        conditions,
        "Ready",
        if ok { "True" } else { "False" },
        reason,
        message,
    );
}

/// Sets the condition of type `kind` (`status` one of `True`, `False`, `Unknown`), moving its times
/// only when something about it changes.
pub(crate) fn set_condition(
    conditions: &mut Vec<Condition>,
    kind: &str,
    status: &str,
    reason: &str,
    message: &str,
) {
    let at = conditions.iter().position(|c| c.r#type == kind);
    let condition = match at {
        Some(i) => &mut conditions[i],
        None => {
            conditions.push(Condition {
                r#type: kind.into(),
                ..Condition::default()
            });
            let last = conditions.len() - 1;
            &mut conditions[last]
        }
    };
    if condition.status == status && condition.reason == reason && condition.message == message {
        return;
    }
    let now = now_rfc3339();
    if condition.status != status {
        condition.last_transition_time = now.clone();
    }
    condition.status = status.into();
    condition.reason = reason.into();
    condition.message = message.into();
    condition.last_update_time = now;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        crd::{IPPool, pool_api, pool_kind},
        ipam::{PoolSpec, RangeSpec},
        store::{
            embedded::{Durability, EmbeddedStore},
            watcher::screened_watcher,
        },
    };

    /// The pool "p" (10.9.0.0/24) on a fresh embedded store, and the pool tasks.
    struct OnePool {
        _dir: tempfile::TempDir,
        store: Arc<dyn ObjectStore>,
        api: Api<IPPool>,
        pools: Arc<Pools>,
        stop: CancellationToken,
        _woken: mpsc::UnboundedReceiver<ObjectRef<LoadBalancer>>,
    }

    type Watch = std::pin::Pin<
        Box<
            dyn futures::Stream<
                    Item = Result<
                        kube::runtime::watcher::Event<IPPool>,
                        kube::runtime::watcher::Error,
                    >,
                > + Send,
        >,
    >;

    impl OnePool {
        /// The pool watch as the controller runs it (screened, into a cache), listed: it watches
        /// from the list when next polled.
        async fn listed_watch(&self) -> (Store<IPPool>, Watch) {
            use futures::StreamExt;
            use kube::runtime::{reflector, watcher::Event};
            let (cache, writer) = reflector::store::<IPPool>();
            let mut watch: Watch = Box::pin(reflector::reflector(
                writer,
                screened_watcher::<IPPool>(
                    self.store.clone(),
                    pool_kind(),
                    None,
                    Some(self.pools.screen()),
                ),
            ));
            while !matches!(watch.next().await, Some(Ok(Event::InitDone))) {}
            (cache, watch)
        }
    }

    /// Any address for the load balancer `default/lb<i>`.
    fn allocation(i: usize) -> PoolOp {
        PoolOp::Allocate {
            id: format!("default/lb{i}"),
            want: Want::Any(None),
            waiter: ObjectRef::new(&format!("lb{i}")).within("default"),
        }
    }

    async fn one_pool() -> OnePool {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> = EmbeddedStore::open(dir.path(), Durability::Normal)
            .await
            .unwrap();
        let api = pool_api(store.clone());
        let pool = IPPool {
            metadata: kube::api::ObjectMeta {
                name: Some("p".into()),
                ..Default::default()
            },
            spec: PoolSpec {
                ranges: vec![RangeSpec {
                    subnet: "10.9.0.0/24".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }
            .into(),
            status: None,
        };
        api.create(&pool).await.unwrap();
        let stop = CancellationToken::new();
        let (wake, woken) = mpsc::unbounded_channel();
        let pools = Arc::new(Pools::new(
            store.clone(),
            wake,
            Recorder::start(store.clone(), "test", stop.clone()),
            stop.clone(),
        ));
        OnePool {
            _dir: dir,
            store,
            api,
            pools,
            stop,
            _woken: woken,
        }
    }

    /// Every version an allocation round wrote is known as the task's own, not only the last: the
    /// pool watch delivers a version after the next round may have been written, and an earlier
    /// own version taken for someone else's change costs a reconcile and a read of the whole pool.
    #[tokio::test]
    async fn earlier_versions_a_task_wrote_are_its_own() {
        let OnePool {
            api, pools, stop, ..
        } = one_pool().await;
        let mut versions = Vec::new();
        for i in 0..5 {
            pools.call("p", allocation(i)).await.unwrap();
            versions.push(api.get("", "p").await.unwrap().unwrap());
        }
        for v in &versions {
            assert!(pools.wrote(v), "{:?}", v.metadata.resource_version);
        }
        // A version someone else wrote is not the task's.
        let mut theirs = versions.last().unwrap().clone();
        theirs
            .metadata
            .labels
            .get_or_insert_default()
            .insert("by".into(), "someone".into());
        let theirs = api.replace(&theirs).await.unwrap();
        assert!(!pools.wrote(&theirs));
        stop.cancel();
    }

    /// On the real store and its watch: the task's own status writes reach the pool cache
    /// undecoded only while its view answers for them; someone else's change takes the view down
    /// and the cache answers, until the task writes again.
    #[tokio::test]
    async fn own_writes_skip_the_cache_and_the_view_answers_for_them() {
        use futures::StreamExt;
        use kube::runtime::{reflector, watcher::Event};

        let fixture = one_pool().await;
        let (cache, mut watch) = fixture.listed_watch().await;
        let OnePool {
            api, pools, stop, ..
        } = fixture;
        let allocate = |i: usize| pools.call("p", allocation(i));
        let ip = |reply| match reply {
            Ok(PoolReply::Allocated(a)) => a.ip.to_string(),
            other => panic!("{other:?}"),
        };
        let mut ips = Vec::new();
        for i in 0..4 {
            ips.push(ip(allocate(i).await));
        }
        pools
            .call(
                "p",
                PoolOp::Release {
                    id: "default/lb3".into(),
                },
            )
            .await
            .unwrap();
        let nothing = reflector::store::<IPPool>().0;
        // Answered by the view: an empty cache has nothing to say.
        assert!(pools.holds(&nothing, "p", &ips[0], "default/lb0"));
        assert!(pools.holds(&nothing, "p", &ips[2], "default/lb2"));
        assert!(!pools.holds(&nothing, "p", &ips[2], "default/lb0"));
        assert!(!pools.holds(&nothing, "p", &ips[3], "default/lb3"));

        // Someone else's change: the watch yields it, and none of the task's versions before it.
        let mut theirs = api.get("", "p").await.unwrap().unwrap();
        theirs
            .metadata
            .labels
            .get_or_insert_default()
            .insert("by".into(), "someone".into());
        let theirs = api.replace(&theirs).await.unwrap();
        let mut seen = Vec::new();
        loop {
            match watch.next().await {
                Some(Ok(Event::Apply(p))) => {
                    let version = p.metadata.resource_version.clone().unwrap();
                    seen.push(version.clone());
                    if Some(&version) == theirs.metadata.resource_version.as_ref() {
                        break;
                    }
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(seen, [theirs.metadata.resource_version.clone().unwrap()]);
        // The view is down: the cache answers (and has every address, from their version).
        assert!(!pools.holds(&nothing, "p", &ips[0], "default/lb0"));
        assert!(pools.holds(&cache, "p", &ips[0], "default/lb0"));
        assert!(!pools.holds(&cache, "p", &ips[3], "default/lb3"));

        // The task's next write conflicts, reads their version, and stands its view again; that
        // write is left out of the watch again.
        ips.push(ip(allocate(4).await));
        assert!(pools.holds(&nothing, "p", &ips[4], "default/lb4"));
        assert!(pools.holds(&nothing, "p", &ips[1], "default/lb1"));
        let mut again = api.get("", "p").await.unwrap().unwrap();
        again
            .metadata
            .labels
            .get_or_insert_default()
            .insert("by".into(), "again".into());
        let again = api.replace(&again).await.unwrap();
        match watch.next().await {
            Some(Ok(Event::Apply(p))) => {
                assert_eq!(p.metadata.resource_version, again.metadata.resource_version);
            }
            other => panic!("{other:?}"),
        }
        assert!(pools.holds(&cache, "p", &ips[4], "default/lb4"));
        stop.cancel();
    }

    /// As the controller runs it: the pool watch polled all along, on another worker thread, while
    /// the task writes. Each patch's version is told to the task as the store plans the write, so
    /// the watch, however early it looks, knows it for the task's own: of the task's versions only
    /// the first (written whole, after the task's first read, and told after the write) may reach
    /// the cache.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watch_running_alongside_knows_each_patch_for_the_task_s_own() {
        use futures::StreamExt;
        use kube::runtime::watcher::Event;

        let fixture = one_pool().await;
        let (_cache, mut watch) = fixture.listed_watch().await;
        let OnePool {
            api, pools, stop, ..
        } = fixture;
        let (seen_tx, mut seen) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(event) = watch.next().await {
                if let Ok(Event::Apply(p)) = event {
                    let _ = seen_tx.send(p.metadata.resource_version.unwrap_or_default());
                }
            }
        });
        let mut own = Vec::new();
        for i in 0..40 {
            pools.call("p", allocation(i)).await.unwrap();
            own.push(api.get("", "p").await.unwrap().unwrap());
        }
        let mut theirs = own.last().unwrap().clone();
        theirs
            .metadata
            .labels
            .get_or_insert_default()
            .insert("by".into(), "someone".into());
        let theirs = api.replace(&theirs).await.unwrap();
        let theirs = theirs.metadata.resource_version.unwrap();
        let mut decoded = Vec::new();
        while decoded.last() != Some(&theirs) {
            decoded.push(seen.recv().await.unwrap());
        }
        let first = own[0].metadata.resource_version.clone().unwrap();
        let later: Vec<&String> = decoded
            .iter()
            .filter(|v| **v != first && **v != theirs)
            .collect();
        assert!(later.is_empty(), "{later:?} of {decoded:?}");
        assert!(own.iter().all(|p| pools.wrote(p)));
        stop.cancel();
    }

    #[test]
    fn ready_condition_moves_only_on_change() {
        let mut conditions = Vec::new();
        set_ready(&mut conditions, false, "PoolExhausted", "full");
        let first = conditions.clone();
        assert_eq!(first[0].status, "False");
        assert!(!first[0].last_transition_time.is_empty());
        set_ready(&mut conditions, false, "PoolExhausted", "full");
        assert_eq!(conditions, first);
        set_ready(&mut conditions, true, "", "");
        assert_eq!(conditions.len(), 1);
        assert_eq!(
            (
                conditions[0].status.as_str(),
                conditions[0].message.as_str()
            ),
            ("True", "")
        );
    }
}
