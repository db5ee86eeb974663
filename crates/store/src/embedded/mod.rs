//! The embedded backend: Kubernetes object semantics on a SQLite file.
//!
//! SQLite is the durable copy; an in-memory index of every object serves reads (as an informer cache
//! would), so reads never touch the database. Writes are planned one at a time and committed through
//! one connection, the writes queued meanwhile together in one transaction ([`writer`]); only after
//! it commits is the memory index updated. The data directory is locked so that exactly one process
//! owns the index.
//!
//! Durability uses group commit: transactions commit to the WAL without waiting for the disk, and a
//! syncer fsyncs the WAL once for every write that committed meanwhile. A write is acknowledged, a
//! read returns an object, and a watch sees a change only once that change is on disk; so however
//! many requests write at once, each pays one shared fsync rather than one each.

mod checkpoints;
mod held;
mod history;
mod objectmeta;
mod overlay;
mod patch;
mod semantics;
mod sql;
mod state;
mod together;
mod token;
mod writer;
#[cfg(test)]
mod writer_tests;

pub use sql::open_pool;

use self::{
    semantics::{checked_key, conflict, meta_mut, meta_str, not_found, now_rfc3339, row_of},
    sql::{create_data_dir, load, migrated_pool, options},
};

use std::{
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::Duration,
};

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::Value;
use sqlx::{
    Connection, SqliteConnection,
    sqlite::{SqlitePool, SqliteSynchronous},
};
use tokio::sync::{Mutex, Notify, broadcast, watch};
use tracing::{Instrument, info};

use self::state::State;
use super::{
    Change, ChangeStream, ChangeType, Deleted, Dependents, Kind, LabelSelector, ObjectList,
    ObjectStore, Preconditions, StoreError,
};
use crate::issuer::Issuer;

/// How hard SQLite works to make a commit durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Durability {
    /// A write is acknowledged once the WAL is fsynced (one fsync serves the writes committed
    /// together): an acknowledged write survives power loss.
    Full,
    /// fsync at WAL checkpoints: survives a process crash, may lose the last commits on power loss.
    Normal,
}

/// Errors opening the embedded store.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot create data directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot lock {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("data directory {path} is in use by another harvester-cloud process")]
    Locked { path: PathBuf },
    #[error("cannot open database {path}: {source}")]
    Open { path: PathBuf, source: sqlx::Error },
    #[error("cannot migrate database {path}: {source}")]
    Migrate {
        path: PathBuf,
        source: sqlx::migrate::MigrateError,
    },
    #[error("cannot load objects from {path}: {source}")]
    Load { path: PathBuf, source: StoreError },
    #[error(
        "the database {path} {problem}: restore it from a backup, or start with --reinitialize to begin with an empty store (every object, key and token of the old one is lost)"
    )]
    LostDatabase { path: PathBuf, problem: String },
}

/// When a write is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ack {
    /// Once it is on disk (every write of the port but [`ObjectStore::create_buffered`],
    /// [`ObjectStore::create_each`] and [`ObjectStore::create_together`]).
    Durable,
    /// Once it is committed to the WAL; the caller syncs later ([`ObjectStore::sync`]).
    Stored,
}

fn closed() -> StoreError {
    StoreError::backend(std::io::Error::other("the store is closed"))
}

/// The service-account token controller of the embedded backend: it fills token Secrets on creation.
pub struct TokenController {
    pub issuer: Arc<Issuer>,
    /// PEM bytes placed in each token Secret's `ca.crt`.
    pub ca_pem: Vec<u8>,
    /// The annotation of a token Secret that holds its end (RFC 3339), if any: minted into the
    /// token as `exp`. The domain that sets it says which one; the store knows no domain.
    pub end_annotation: Option<&'static str>,
}

pub struct EmbeddedStore {
    path: PathBuf,
    pool: SqlitePool,
    /// The only connection that writes, used by the committer task ([`writer`]); `None` once
    /// closed.
    writer: Mutex<Option<SqliteConnection>>,
    /// Writes planned and waiting for the committer.
    pending: std::sync::Mutex<writer::Pending>,
    /// Wakes the committer after a write is queued.
    commit_wanted: Arc<Notify>,
    state: RwLock<State>,
    changes: broadcast::Sender<Change>,
    durability: Durability,
    /// The last resourceVersion known to be on disk (and published to watchers).
    durable: watch::Sender<u64>,
    /// Wakes the syncer after a commit.
    sync_wanted: Arc<Notify>,
    /// Wakes the checkpointer after changes are durable ([`checkpoints`]).
    checkpoint_wanted: Arc<Notify>,
    /// Set when an fsync failed: nothing can be promised durable any more.
    sync_failed: std::sync::atomic::AtomicBool,
    wal_path: PathBuf,
    token_controller: RwLock<Option<Arc<TokenController>>>,
    /// Fault injection: writes to let through, then writes to fail ([`Self::inject_write_failures`]).
    faults: std::sync::Mutex<(usize, usize)>,
    _lock: std::fs::File,
}

impl EmbeddedStore {
    /// Opens (creating if needed) the store in `data_dir` and loads every object into memory.
    pub async fn open(data_dir: &Path, durability: Durability) -> Result<Arc<Self>, OpenError> {
        Self::open_with(data_dir, durability, false).await
    }

    /// [`Self::open`], and with `reinitialize` a lost or empty database is replaced by a new one
    /// instead of refused.
    pub async fn open_with(
        data_dir: &Path,
        durability: Durability,
        reinitialize: bool,
    ) -> Result<Arc<Self>, OpenError> {
        create_data_dir(data_dir)?;
        let lock_path = data_dir.join("lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|source| OpenError::Lock {
                path: lock_path.clone(),
                source,
            })?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(OpenError::Locked {
                    path: data_dir.to_path_buf(),
                });
            }
            Err(std::fs::TryLockError::Error(source)) => {
                return Err(OpenError::Lock {
                    path: lock_path,
                    source,
                });
            }
        }

        let path = data_dir.join(sql::DB_FILE);
        sql::prepare_database_file(data_dir, reinitialize)?;
        let opts = options(&path, SqliteSynchronous::Normal);
        let pool = migrated_pool(&path, &opts, 4).await?;
        let writer = SqliteConnection::connect_with(&checkpoints::writer_options(opts.clone()))
            .await
            .map_err(|source| OpenError::Open {
                path: path.clone(),
                source,
            })?;
        let state = load(&pool).await.map_err(|source| OpenError::Load {
            path: path.clone(),
            source,
        })?;
        info!(path = %path.display(), objects = state.len(), resource_version = state.rv, "opened embedded store");
        let (changes, _) = broadcast::channel(4096);
        let (durable, _) = watch::channel(state.rv);
        let wal_path = data_dir.join("harvester-cloud.db-wal");
        let store = Arc::new(EmbeddedStore {
            path,
            pool,
            writer: Mutex::new(Some(writer)),
            pending: Default::default(),
            commit_wanted: Arc::new(Notify::new()),
            state: RwLock::new(state),
            changes,
            durability,
            durable,
            sync_wanted: Arc::new(Notify::new()),
            checkpoint_wanted: Arc::new(Notify::new()),
            sync_failed: std::sync::atomic::AtomicBool::new(false),
            wal_path,
            token_controller: RwLock::new(None),
            faults: std::sync::Mutex::new((0, 0)),
            _lock: lock,
        });
        store.start_committer();
        checkpoints::start(&store);
        store.spawn_rounds(
            store.sync_wanted.clone(),
            std::time::Duration::ZERO,
            tracing::info_span!("wal_syncer"),
            |store| async move {
                while *store.durable.borrow() < store.read().rv
                    && !store.sync_failed.load(std::sync::atomic::Ordering::SeqCst)
                {
                    store.sync_round().await;
                }
                true
            },
        );
        Ok(store)
    }

    /// Runs the store's background task `round` each time `wake` is notified (a notification sent
    /// while a round runs leaves a permit, so none is lost), then waits `pause` before waiting for
    /// the next. The task holds only a weak reference between rounds, so dropping the store ends
    /// it; so does a round that returns false.
    fn spawn_rounds<F, Fut>(
        self: &Arc<Self>,
        wake: Arc<Notify>,
        pause: std::time::Duration,
        span: tracing::Span,
        round: F,
    ) where
        F: Fn(Arc<Self>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = bool> + Send,
    {
        let weak = Arc::downgrade(self);
        tokio::spawn(
            async move {
                loop {
                    wake.notified().await;
                    let Some(store) = weak.upgrade() else { return };
                    if !round(store).await {
                        return;
                    }
                    if !pause.is_zero() {
                        tokio::time::sleep(pause).await;
                    }
                }
            }
            .instrument(span),
        );
    }

    /// One group-commit round: makes every committed change durable, then publishes it.
    async fn sync_round(&self) {
        let target = self.read().rv;
        if self.durability == Durability::Full {
            let wal = self.wal_path.clone();
            let synced =
                tokio::task::spawn_blocking(move || std::fs::File::open(&wal)?.sync_data())
                    .await
                    .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            if let Err(e) = synced {
                tracing::error!(error = %e, path = %self.wal_path.display(), "fsync of the write-ahead log failed; refusing further writes");
                self.sync_failed
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                // Wake the waiters so they can fail instead of hanging.
                self.durable.send_modify(|_| {});
                return;
            }
        }
        self.publish(target);
    }

    /// Moves committed changes up to `target` into the history, sends them to watchers, and marks
    /// them durable. Each is sent while the lock that moved it is held: a watch subscribes under
    /// that lock, so every change it can receive live is one its replay of the history lacked.
    fn publish(&self, target: u64) {
        {
            let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
            while state
                .unpublished
                .front()
                .is_some_and(|(_, c)| c.resource_version <= target)
            {
                if let Some((object, retained)) = state.unpublished.pop_front() {
                    // A send error only means nobody watches right now.
                    let _ = self.changes.send(retained.with_object(object));
                    state.history.push(retained);
                }
            }
        }
        self.durable.send_if_modified(|d| {
            let moved = *d < target;
            *d = (*d).max(target);
            moved
        });
        self.checkpoint_wanted.notify_one();
    }

    /// Waits until `rv` is on disk.
    async fn await_durable(&self, rv: u64) -> Result<(), StoreError> {
        let mut rx = self.durable.subscribe();
        loop {
            if self.sync_failed.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(StoreError::backend(std::io::Error::other(
                    "the write-ahead log could not be synced to disk",
                )));
            }
            if *rx.borrow_and_update() >= rv {
                return Ok(());
            }
            self.sync_wanted.notify_one();
            if rx.changed().await.is_err() {
                return Err(closed());
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The service-account signing keys (PKCS#8 PEM, oldest first), creating the first on first use.
    pub async fn signing_keys(&self) -> Result<Vec<String>, StoreError> {
        let keys: Vec<String> =
            sqlx::query_scalar("SELECT private_pem FROM signing_keys ORDER BY created_at, kid")
                .fetch_all(&self.pool)
                .await
                .map_err(StoreError::backend)?;
        if !keys.is_empty() {
            return Ok(keys);
        }
        let pem = crate::issuer::generate_key_pem().map_err(StoreError::backend)?;
        sqlx::query("INSERT INTO signing_keys (kid, private_pem, created_at) VALUES (?, ?, ?)")
            .bind(uuid::Uuid::new_v4().to_string())
            .bind(&pem)
            .bind(now_rfc3339())
            .execute(&self.pool)
            .await
            .map_err(StoreError::backend)?;
        info!("created the service-account token signing key");
        Ok(vec![pem])
    }

    /// Closes the database connections (waits for them to finish).
    pub async fn close(&self) {
        self.close_writer().await;
        self.pool.close().await;
    }

    /// Installs the token controller; token Secrets created afterwards are filled.
    pub fn set_token_controller(&self, controller: Arc<TokenController>) {
        *self
            .token_controller
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(controller);
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates the object, answered when `ack` says.
    async fn create_as(
        &self,
        ack: Ack,
        kind: &Kind,
        mut object: Value,
    ) -> Result<Value, StoreError> {
        let (namespace, name, uid) = named_new(kind, &mut object)?;
        let minted = if kind.api_version == "v1" && kind.kind == "Secret" {
            meta_mut(kind, &mut object)?.insert("uid".into(), Value::from(uid.clone()));
            self.premint(&object, None)
        } else {
            None
        };
        self.write_as(ack, |state| {
            if state.contains(&kind.api_version, &kind.kind, &namespace, &name) {
                return Err(StoreError::AlreadyExists {
                    kind: kind.singular(),
                    name: name.clone(),
                });
            }
            let mut rv = state.rv;
            self.plan_created(
                state,
                kind,
                (&namespace, &name, &uid),
                object,
                &mut rv,
                |object| {
                    if kind.api_version == "v1" && kind.kind == "Secret" {
                        self.fill_token(state, None, object, minted)?;
                    }
                    Ok(())
                },
            )
        })
        .await
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        // Lets the syncer and committer tasks notice that the store is gone.
        self.sync_wanted.notify_one();
        self.commit_wanted.notify_one();
    }
}

impl EmbeddedStore {
    /// Plans the creation of `object` (its key and uid from [`named_new`], its name free) at the
    /// version after `rv`, and moves `rv` past what it planned: its row, and, as Kubernetes'
    /// garbage collector does, the deletion of a dependent none of whose owners exists (after its
    /// creation: watchers see both). `fill` completes the stamped object before it is stored (a
    /// token Secret's token).
    fn plan_created(
        &self,
        state: &overlay::View,
        kind: &Kind,
        (namespace, name, uid): (&str, &str, &str),
        mut object: Value,
        rv: &mut u64,
        fill: impl FnOnce(&mut Value) -> Result<(), StoreError>,
    ) -> Result<(Vec<state::Row>, Value), StoreError> {
        let created = *rv + 1;
        semantics::stamp_created(kind, &mut object, uid, created)?;
        fill(&mut object)?;
        *rv = created;
        let mut rows = vec![row_of(
            kind,
            namespace,
            name,
            uid,
            created,
            ChangeType::Added,
            object.clone(),
        )];
        if semantics::orphaned(state, &object) {
            rows.extend(self.plan_delete(state, kind, &object, rv));
        }
        Ok((rows, object))
    }
}

/// A new object's key and uid: named (`generateName`: Kubernetes appends five random
/// characters), its key and metadata checked.
fn named_new(kind: &Kind, object: &mut Value) -> Result<(String, String, String), StoreError> {
    {
        let meta = meta_mut(kind, object)?;
        let has_name = meta
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        if !has_name && let Some(prefix) = meta.get("generateName").and_then(Value::as_str) {
            let name = format!("{prefix}{}", crate::validation::random_alnum(5));
            meta.insert("name".into(), Value::from(name));
        }
    }
    let (namespace, name) = checked_key(kind, object)?;
    semantics::validate_new_meta(kind, &name, object)?;
    Ok((namespace, name, uuid::Uuid::new_v4().to_string()))
}

#[async_trait]
impl ObjectStore for EmbeddedStore {
    async fn get(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, StoreError> {
        Ok(self
            .get_shared(kind, namespace, name)
            .await?
            .map(|v| (*v).clone()))
    }

    async fn get_shared(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Value>>, StoreError> {
        let namespace = if kind.namespaced { namespace } else { "" };
        let found = self
            .read()
            .get_shared(&kind.api_version, &kind.kind, namespace, name);
        if let Some(v) = &found {
            let rv = meta_str(v, "resourceVersion")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            if rv > *self.durable.borrow() {
                self.await_durable(rv).await?;
            }
        }
        Ok(found)
    }

    fn write_counter(&self, kind: &Kind) -> Option<Arc<std::sync::atomic::AtomicU64>> {
        Some(
            self.state
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .counter(&kind.api_version, &kind.kind),
        )
    }

    async fn list(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        selector: &LabelSelector,
    ) -> Result<ObjectList, StoreError> {
        let mut items = Vec::new();
        let resource_version = self
            .list_each(kind, namespace, selector, &mut |v| items.push(v))
            .await?;
        Ok(ObjectList {
            items,
            resource_version,
        })
    }

    async fn list_each(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        selector: &LabelSelector,
        visit: &mut (dyn FnMut(Value) + Send),
    ) -> Result<String, StoreError> {
        // Only the objects' handles are taken under the lock; they are parsed after it, so writes
        // do not wait on a list of a hundred thousand objects.
        let (held, rv) = {
            let state = self.read();
            let held: Vec<held::Held> = state
                .iter_held(
                    &kind.api_version,
                    &kind.kind,
                    namespace.filter(|_| kind.namespaced),
                )
                .cloned()
                .collect();
            (held, state.rv)
        };
        if rv > *self.durable.borrow() {
            self.await_durable(rv).await?;
        }
        for h in held {
            let v = h.value();
            if selector.matches_object(&v) {
                visit(Arc::unwrap_or_clone(v));
            }
        }
        Ok(rv.to_string())
    }

    async fn create(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        self.create_as(Ack::Durable, kind, object).await
    }

    async fn create_buffered(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        self.create_as(Ack::Stored, kind, object).await
    }

    async fn create_each(
        &self,
        kind: &Kind,
        objects: Vec<Value>,
    ) -> Vec<Result<Value, StoreError>> {
        self.create_each_impl(kind, objects).await
    }

    async fn create_together(
        &self,
        owner_kind: &Kind,
        owner: Value,
        dependents: Dependents,
    ) -> Result<Option<Vec<Value>>, StoreError> {
        self.create_all(owner_kind, owner, dependents)
            .await
            .map(Some)
    }

    async fn sync(&self) -> Result<(), StoreError> {
        let committed = self.read().rv;
        self.await_durable(committed).await
    }

    async fn replace(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        self.replace_impl(kind, object, false).await
    }

    async fn replace_status(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        self.replace_impl(kind, object, true).await
    }

    async fn merge_status(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        resource_version: &str,
        patch: &Value,
    ) -> Result<String, StoreError> {
        self.merge_status_impl(kind, namespace, name, resource_version, patch, &|_| {})
            .await
    }

    async fn merge_status_planned(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        resource_version: &str,
        patch: &Value,
        planned: &(dyn for<'v> Fn(&'v str) + Send + Sync),
    ) -> Result<String, StoreError> {
        self.merge_status_impl(kind, namespace, name, resource_version, patch, planned)
            .await
    }

    async fn delete(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
    ) -> Result<Deleted, StoreError> {
        let namespace = if kind.namespaced { namespace } else { "" };
        self.write(|state| {
            let current = state
                .get(&kind.api_version, &kind.kind, namespace, name)
                .ok_or_else(|| not_found(kind, name))?;
            if let Some(uid) = &preconditions.uid
                && meta_str(&current, "uid").as_ref() != Some(uid)
            {
                return Err(conflict(kind, name));
            }
            if let Some(rv) = &preconditions.resource_version
                && meta_str(&current, "resourceVersion").as_ref() != Some(rv)
            {
                return Err(conflict(kind, name));
            }
            let mut rv = state.rv;
            let rows = self.plan_delete(state, kind, &current, &mut rv);
            let result = match rows.first() {
                Some(r) if r.change == ChangeType::Deleted => Deleted::Gone((*r.object).clone()),
                Some(r) => Deleted::Pending((*r.object).clone()),
                None => Deleted::Pending((*current).clone()),
            };
            Ok((rows, result))
        })
        .await
    }

    async fn watch(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        resource_version: &str,
    ) -> Result<ChangeStream, StoreError> {
        let since: u64 = if resource_version.is_empty() {
            *self.durable.borrow()
        } else {
            resource_version.parse().map_err(|_| StoreError::Gone)?
        };
        let (replay, rx) = {
            let state = self.read();
            let replay = state
                .history
                .since(&kind.api_version, &kind.kind, since)
                .map_err(|_| StoreError::Gone)?;
            (replay, self.changes.subscribe())
        };
        // What the replay ends with is not followed live again.
        let followed_from = replay
            .last()
            .map_or(since, |c| c.resource_version.max(since));
        let kind = kind.clone();
        let namespace = namespace.map(str::to_string);
        let matches = move |c: &Change| {
            c.api_version == kind.api_version
                && c.kind == kind.kind
                && c.resource_version > since
                && namespace
                    .as_deref()
                    .is_none_or(|ns| super::object_key(&c.object).0 == ns)
        };
        let matches2 = matches.clone();
        // A watcher that fell behind the channel ends this watch: it watches again from the last
        // change it saw, which the history replays (a list again only when the history no longer
        // reaches back that far, as after a 410 from Kubernetes).
        let live = tokio_stream::wrappers::BroadcastStream::new(rx)
            .take_while(|r| futures::future::ready(r.is_ok()))
            .filter_map(move |r| {
                let out = match r {
                    Ok(c) if c.resource_version > followed_from && matches2(&c) => Some(Ok(c)),
                    _ => None,
                };
                async move { out }
            });
        let replay = futures::stream::iter(replay.into_iter().filter(matches).map(Ok));
        Ok(replay.chain(live).boxed())
    }

    async fn wait_for_token(
        &self,
        namespace: &str,
        secret_name: &str,
        timeout: Duration,
    ) -> Result<Value, StoreError> {
        let kind = Kind::of::<k8s_openapi::api::core::v1::Secret>();
        let ready =
            |v: &Value| v.pointer("/data/token").is_some() && v.pointer("/data/ca.crt").is_some();
        let mut rx = self.changes.subscribe();
        if let Some(v) = self.get(&kind, namespace, secret_name).await?
            && ready(&v)
        {
            return Ok(v);
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Err(_) => {
                    return Err(StoreError::TokenTimeout {
                        namespace: namespace.into(),
                        name: secret_name.into(),
                    });
                }
                Ok(Ok(c)) => {
                    if c.kind == "Secret"
                        && super::object_key(&c.object) == (namespace.into(), secret_name.into())
                        && ready(&c.object)
                    {
                        return Ok((*c.object).clone());
                    }
                }
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => {
                    if let Some(v) = self.get(&kind, namespace, secret_name).await?
                        && ready(&v)
                    {
                        return Ok(v);
                    }
                }
                Ok(Err(broadcast::error::RecvError::Closed)) => {
                    return Err(StoreError::TokenTimeout {
                        namespace: namespace.into(),
                        name: secret_name.into(),
                    });
                }
            }
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(|_| ())
            .map_err(StoreError::backend)
    }
}
