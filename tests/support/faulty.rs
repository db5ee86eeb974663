//! Stores that wrap the real one, for the rotation crash and race tests.
//!
//! [`KillAfter`] stops after its N-th write, as a process killed between two writes does: the N
//! writes before happened, the next never returns (a test drops the operation then), and nothing
//! after it happens. The real servers cannot inject faults, so this is the one home-made part of
//! the crash tests; everything before the kill point and after the restart is the real store.
//! [`Observed`] lets a test look at the store after every write, before the next one.

use std::{
    ops::Deref,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use async_trait::async_trait;
use futures::future::BoxFuture;
use harvester_cloud::store::{
    ChangeStream, Deleted, Dependents, Kind, LabelSelector, ObjectList, ObjectStore, Preconditions,
    StoreError,
};
use serde_json::Value;

/// What a wrapping store does around each write (create, replace, delete); reads, watches and the
/// rest go straight to the real store.
pub trait WriteHook: Send + Sync + 'static {
    /// Runs `op`, the write to the real store, or not, as the hook decides.
    fn write<'a, T: Send + 'a>(
        &'a self,
        op: BoxFuture<'a, Result<T, StoreError>>,
    ) -> BoxFuture<'a, Result<T, StoreError>>;
}

/// The real store `inner` with `hook` around its writes; derefs to the hook, for its counters.
pub struct Hooked<H> {
    inner: Arc<dyn ObjectStore>,
    hook: H,
}

impl<H> Hooked<H> {
    fn new(inner: Arc<dyn ObjectStore>, hook: H) -> Arc<Self> {
        Arc::new(Hooked { inner, hook })
    }
}

impl<H> Deref for Hooked<H> {
    type Target = H;
    fn deref(&self) -> &H {
        &self.hook
    }
}

fn injected() -> StoreError {
    StoreError::Backend("injected: the store is unreachable".into())
}

/// Lets `writes` writes through; what happens to the next depends on how it was made
/// ([`KillAfter::new`], [`KillAfter::failing`], [`KillAfter::landing`]).
pub struct KillAfter {
    writes: usize,
    /// The write past the kill point fails at once instead of hanging, and the ones after it pass.
    fails: bool,
    /// The write past the kill point is made, and then reported failed (a reply lost on the way
    /// back); the ones after it pass.
    lands: bool,
    made: AtomicUsize,
    killed: tokio::sync::Notify,
}

impl KillAfter {
    fn make(
        inner: Arc<dyn ObjectStore>,
        writes: usize,
        fails: bool,
        lands: bool,
    ) -> Arc<Hooked<Self>> {
        Hooked::new(
            inner,
            KillAfter {
                writes,
                fails,
                lands,
                made: AtomicUsize::new(0),
                killed: tokio::sync::Notify::new(),
            },
        )
    }

    /// Forwards to `inner` until `writes` writes were made; the next one hangs for ever.
    pub fn new(inner: Arc<dyn ObjectStore>, writes: usize) -> Arc<Hooked<Self>> {
        Self::make(inner, writes, false, false)
    }

    /// As [`KillAfter::new`], but the write after `writes` writes fails (as a store that is
    /// briefly unreachable refuses it) and the process lives on: later writes pass.
    pub fn failing(inner: Arc<dyn ObjectStore>, writes: usize) -> Arc<Hooked<Self>> {
        Self::make(inner, writes, true, false)
    }

    /// As [`KillAfter::failing`], but the write after `writes` writes is made before it is
    /// reported failed: the caller cannot know whether it landed.
    pub fn landing(inner: Arc<dyn ObjectStore>, writes: usize) -> Arc<Hooked<Self>> {
        Self::make(inner, writes, true, true)
    }

    /// Resolves once a write past the kill point was attempted.
    pub async fn killed(&self) {
        self.killed.notified().await;
    }

    /// How many writes went through.
    pub fn writes_made(&self) -> usize {
        self.made.load(Ordering::SeqCst).min(self.writes)
    }

    /// Whether a write past the kill point was attempted.
    pub fn reached(&self) -> bool {
        self.made.load(Ordering::SeqCst) > self.writes
    }
}

impl WriteHook for KillAfter {
    fn write<'a, T: Send + 'a>(
        &'a self,
        op: BoxFuture<'a, Result<T, StoreError>>,
    ) -> BoxFuture<'a, Result<T, StoreError>> {
        Box::pin(async move {
            let n = self.made.fetch_add(1, Ordering::SeqCst);
            if self.fails {
                if n == self.writes {
                    self.killed.notify_one();
                    if self.lands {
                        op.await?;
                    }
                    return Err(injected());
                }
            } else if n >= self.writes {
                // notify_one keeps a permit for a waiter that is not waiting yet.
                self.killed.notify_one();
                std::future::pending::<()>().await;
            }
            op.await
        })
    }
}

/// What [`Observed`] runs after each write, with the writes held until it returns.
pub type Check =
    Box<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync>;

/// Forwards to `inner`, one write at a time, and runs `check` after each write before the next
/// one starts: `check` sees every state the writes through this store leave, none skipped (the
/// writes of others, as a token controller filling a Secret, are not held).
pub struct Observed {
    writing: tokio::sync::Mutex<()>,
    check: Check,
}

impl Observed {
    pub fn new(inner: Arc<dyn ObjectStore>, check: Check) -> Arc<Hooked<Self>> {
        Hooked::new(
            inner,
            Observed {
                writing: tokio::sync::Mutex::new(()),
                check,
            },
        )
    }
}

impl WriteHook for Observed {
    fn write<'a, T: Send + 'a>(
        &'a self,
        op: BoxFuture<'a, Result<T, StoreError>>,
    ) -> BoxFuture<'a, Result<T, StoreError>> {
        Box::pin(async move {
            let _one = self.writing.lock().await;
            let out = op.await;
            (self.check)().await;
            out
        })
    }
}

#[async_trait]
impl<H: WriteHook> ObjectStore for Hooked<H> {
    async fn get(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, StoreError> {
        self.inner.get(kind, namespace, name).await
    }

    async fn get_shared(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Value>>, StoreError> {
        self.inner.get_shared(kind, namespace, name).await
    }

    async fn list(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        selector: &LabelSelector,
    ) -> Result<ObjectList, StoreError> {
        self.inner.list(kind, namespace, selector).await
    }

    async fn create(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        self.hook.write(self.inner.create(kind, object)).await
    }

    async fn create_buffered(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        self.hook
            .write(self.inner.create_buffered(kind, object))
            .await
    }

    async fn create_together(
        &self,
        owner_kind: &Kind,
        owner: Value,
        dependents: Dependents,
    ) -> Result<Option<Vec<Value>>, StoreError> {
        self.hook
            .write(self.inner.create_together(owner_kind, owner, dependents))
            .await
    }

    async fn sync(&self) -> Result<(), StoreError> {
        self.inner.sync().await
    }

    async fn replace(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        self.hook.write(self.inner.replace(kind, object)).await
    }

    async fn replace_status(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        self.hook
            .write(self.inner.replace_status(kind, object))
            .await
    }

    async fn merge_status(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        resource_version: &str,
        patch: &Value,
    ) -> Result<String, StoreError> {
        self.hook
            .write(
                self.inner
                    .merge_status(kind, namespace, name, resource_version, patch),
            )
            .await
    }

    async fn delete(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<Deleted, StoreError> {
        self.hook
            .write(self.inner.delete(kind, namespace, name, preconditions))
            .await
    }

    async fn watch(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        resource_version: &str,
    ) -> Result<ChangeStream, StoreError> {
        self.inner.watch(kind, namespace, resource_version).await
    }

    async fn wait_for_token(
        &self,
        namespace: &str,
        secret_name: &str,
        timeout: std::time::Duration,
    ) -> Result<Value, StoreError> {
        self.inner
            .wait_for_token(namespace, secret_name, timeout)
            .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }
}
