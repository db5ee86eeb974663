//! The embedded backend: Kubernetes object semantics on a SQLite file.
//!
//! SQLite is the durable copy; an in-memory index of every object serves reads (as an informer cache
//! would), so reads never touch the database. Writes are serialised through one connection: each write
//! is one transaction that stores the rows and the new resourceVersion, and only after it commits is
//! the memory index updated. The data directory is locked so that exactly one process owns the index.
//!
//! Durability uses group commit: transactions commit to the WAL without waiting for the disk, and a
//! syncer fsyncs the WAL once for every write that committed meanwhile. A write is acknowledged, a
//! read returns an object, and a watch sees a change only once that change is on disk; so however
//! many requests write at once, each pays one shared fsync rather than one each.

mod state;

use std::{
    path::{Path, PathBuf},
    str::FromStr,
    sync::{Arc, RwLock},
    time::Duration,
};

use async_trait::async_trait;
use base64::{Engine, engine::general_purpose::STANDARD as B64};
use futures::StreamExt;
use serde_json::{Map, Value, json};
use sqlx::{
    Connection, Row, SqliteConnection,
    sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
    },
};
use tokio::sync::{Mutex, Notify, broadcast, watch};
use tracing::{Instrument, info};

use self::state::{Row as StateRow, State};
use super::{
    Change, ChangeStream, ChangeType, Deleted, Kind, LabelSelector, ObjectList, ObjectStore,
    Preconditions, StoreError,
};
use crate::{issuer::Issuer, validation};

/// How many changes are kept for watches that resume from an older resourceVersion.
const HISTORY: usize = 100_000;
const SA_TOKEN_TYPE: &str = "kubernetes.io/service-account-token";
const SA_NAME_ANNOTATION: &str = "kubernetes.io/service-account.name";
const SA_UID_ANNOTATION: &str = "kubernetes.io/service-account.uid";

/// How hard SQLite works to make a commit durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Durability {
    /// fsync on every commit: a committed write survives power loss.
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
}

/// The service-account token controller of the embedded backend: it fills token Secrets on creation.
pub struct TokenController {
    pub issuer: Arc<Issuer>,
    /// PEM bytes placed in each token Secret's `ca.crt`.
    pub ca_pem: Vec<u8>,
}

pub struct EmbeddedStore {
    path: PathBuf,
    pool: SqlitePool,
    /// The only connection that writes; `None` once closed.
    writer: Mutex<Option<SqliteConnection>>,
    state: RwLock<State>,
    changes: broadcast::Sender<Change>,
    durability: Durability,
    /// The last resourceVersion known to be on disk (and published to watchers).
    durable: watch::Sender<u64>,
    /// Wakes the syncer after a commit.
    sync_wanted: Arc<Notify>,
    /// Set when an fsync failed: nothing can be promised durable any more.
    sync_failed: std::sync::atomic::AtomicBool,
    wal_path: PathBuf,
    token_controller: RwLock<Option<Arc<TokenController>>>,
    _lock: std::fs::File,
}

/// Opens the database file of a data directory for maintenance commands (tokens), without the
/// exclusive lock and the object index that `serve` holds.
pub async fn open_pool(data_dir: &Path) -> Result<SqlitePool, OpenError> {
    create_data_dir(data_dir)?;
    let path = data_dir.join("harvester-cloud.db");
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options(&path, SqliteSynchronous::Full))
        .await
        .map_err(|source| OpenError::Open {
            path: path.clone(),
            source,
        })?;
    migrate(&pool, &path).await?;
    Ok(pool)
}

fn create_data_dir(data_dir: &Path) -> Result<(), OpenError> {
    std::fs::create_dir_all(data_dir).map_err(|source| OpenError::CreateDir {
        path: data_dir.to_path_buf(),
        source,
    })?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // The directory holds the signing key and token hashes: keep other users out.
        let _ = std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o700));
    }
    Ok(())
}

/// Connection options. `SqliteSynchronous::Full` makes SQLite fsync inside every commit; the store
/// instead commits with `Normal` and lets its syncer fsync the WAL once per group of commits.
fn options(path: &Path, synchronous: SqliteSynchronous) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(synchronous)
        .busy_timeout(Duration::from_secs(10))
}

async fn migrate(pool: &SqlitePool, path: &Path) -> Result<(), OpenError> {
    sqlx::migrate!("./migrations")
        .run(pool)
        .await
        .map_err(|source| OpenError::Migrate {
            path: path.to_path_buf(),
            source,
        })
}

impl EmbeddedStore {
    /// Opens (creating if needed) the store in `data_dir` and loads every object into memory.
    pub async fn open(data_dir: &Path, durability: Durability) -> Result<Arc<Self>, OpenError> {
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

        let path = data_dir.join("harvester-cloud.db");
        let opts = options(&path, SqliteSynchronous::Normal);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(opts.clone())
            .await
            .map_err(|source| OpenError::Open {
                path: path.clone(),
                source,
            })?;
        migrate(&pool, &path).await?;
        let writer = SqliteConnection::connect_with(&opts)
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
            state: RwLock::new(state),
            changes,
            durability,
            durable,
            sync_wanted: Arc::new(Notify::new()),
            sync_failed: std::sync::atomic::AtomicBool::new(false),
            wal_path,
            token_controller: RwLock::new(None),
            _lock: lock,
        });
        let weak = Arc::downgrade(&store);
        let wake = store.sync_wanted.clone();
        tokio::spawn(
            async move {
                loop {
                    {
                        // Only a weak reference between rounds, so dropping the store ends the task.
                        let Some(store) = weak.upgrade() else { return };
                        while *store.durable.borrow() < store.read().rv
                            && !store.sync_failed.load(std::sync::atomic::Ordering::SeqCst)
                        {
                            store.sync_round().await;
                        }
                    }
                    // A notification sent while syncing leaves a permit, so none is lost.
                    wake.notified().await;
                }
            }
            .instrument(tracing::info_span!("wal_syncer")),
        );
        Ok(store)
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
    /// them durable.
    fn publish(&self, target: u64) {
        let ready: Vec<Change> = {
            let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
            let mut ready = Vec::new();
            while state
                .unpublished
                .front()
                .is_some_and(|c| c.resource_version <= target)
            {
                if let Some(c) = state.unpublished.pop_front() {
                    state.history.push_back(c.clone());
                    ready.push(c);
                }
            }
            while state.history.len() > HISTORY {
                state.history.pop_front();
            }
            ready
        };
        for c in ready {
            // A send error only means nobody watches right now.
            let _ = self.changes.send(c);
        }
        self.durable.send_if_modified(|d| {
            let moved = *d < target;
            *d = (*d).max(target);
            moved
        });
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
                return Err(StoreError::backend(std::io::Error::other(
                    "the store is closed",
                )));
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
        if let Some(conn) = self.writer.lock().await.take() {
            let _ = conn.close().await;
        }
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

    /// Runs one write: `plan` sees the current state (stable: writers are serialised) and returns the
    /// rows to store; they are committed in one transaction, then applied to memory and published.
    async fn write<T>(
        &self,
        plan: impl FnOnce(&State) -> Result<(Vec<StateRow>, T), StoreError>,
    ) -> Result<T, StoreError> {
        if self.sync_failed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::backend(std::io::Error::other(
                "the write-ahead log could not be synced to disk; restart the service",
            )));
        }
        let mut guard = self.writer.lock().await;
        let conn = guard
            .as_mut()
            .ok_or_else(|| StoreError::backend(std::io::Error::other("the store is closed")))?;
        let (rows, out) = {
            let state = self.read();
            plan(&state)?
        };
        if rows.is_empty() {
            return Ok(out);
        }
        let last_rv = rows.iter().map(|r| r.rv).max().unwrap_or_default();
        commit(conn, &rows, last_rv).await?;

        {
            let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
            for row in rows {
                state.apply(row);
            }
        }
        if self.durability == Durability::Normal {
            // Published in commit order: the writer lock is still held.
            self.publish(last_rv);
            return Ok(out);
        }
        // Let the next writer commit while this one waits for the shared fsync.
        drop(guard);
        self.sync_wanted.notify_one();
        self.await_durable(last_rv).await?;
        Ok(out)
    }

    fn token_controller(&self) -> Option<Arc<TokenController>> {
        self.token_controller
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Fills a service-account token Secret as Kubernetes' token controller would.
    fn fill_token(&self, state: &State, secret: &mut Value) -> Result<(), StoreError> {
        if secret.get("type").and_then(Value::as_str) != Some(SA_TOKEN_TYPE) {
            return Ok(());
        }
        let Some(controller) = self.token_controller() else {
            return Ok(());
        };
        let (namespace, name) = super::object_key(secret);
        let annotation = |k: &str| {
            secret
                .pointer(&format!("/metadata/annotations/{}", k.replace('/', "~1")))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let Some(sa_name) = annotation(SA_NAME_ANNOTATION) else {
            return Ok(());
        };
        let Some(sa) = state.get("v1", "ServiceAccount", &namespace, &sa_name) else {
            // Kubernetes leaves such a Secret unfilled (and later removes it); so do we.
            return Ok(());
        };
        let sa_uid = sa
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if annotation(SA_UID_ANNOTATION).is_some_and(|u| u != sa_uid) {
            return Ok(());
        }
        let secret_uid = secret
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let token = controller
            .issuer
            .mint_secret_token(&namespace, &sa_name, &sa_uid, &name, &secret_uid)
            .map_err(|e| StoreError::Invalid {
                kind: "secret".into(),
                name: name.clone(),
                reason: format!("cannot mint service-account token: {e}"),
            })?;
        let obj = secret
            .as_object_mut()
            .ok_or_else(|| not_an_object("secret", &name))?;
        let meta = obj
            .entry("metadata")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .ok_or_else(|| not_an_object("secret", &name))?;
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .ok_or_else(|| not_an_object("secret", &name))?;
        annotations.insert(SA_UID_ANNOTATION.into(), Value::from(sa_uid));
        let data = obj
            .entry("data")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .ok_or_else(|| not_an_object("secret", &name))?;
        data.insert("token".into(), Value::from(B64.encode(token)));
        data.insert("ca.crt".into(), Value::from(B64.encode(&controller.ca_pem)));
        data.insert("namespace".into(), Value::from(B64.encode(&namespace)));
        Ok(())
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        // Lets the syncer task notice that the store is gone.
        self.sync_wanted.notify_one();
    }
}

const DELETE_ROW: &str =
    "DELETE FROM objects WHERE api_version = ? AND kind = ? AND namespace = ? AND name = ?;";
const UPSERT_ROW: &str = "INSERT INTO objects (api_version, kind, namespace, name, uid, resource_version, body)
     VALUES (?, ?, ?, ?, ?, ?, ?)
     ON CONFLICT (api_version, kind, namespace, name)
     DO UPDATE SET uid = excluded.uid, resource_version = excluded.resource_version, body = excluded.body;";

/// Stores `rows` and the new resourceVersion in one transaction, sent to SQLite as one
/// multi-statement query: one round trip to the connection's worker instead of one per statement,
/// which is most of a small write's cost.
async fn commit(
    conn: &mut SqliteConnection,
    rows: &[StateRow],
    last_rv: u64,
) -> Result<(), StoreError> {
    let mut sql = String::from("BEGIN IMMEDIATE;");
    let mut bodies = Vec::with_capacity(rows.len());
    for row in rows {
        match row.change {
            ChangeType::Deleted => {
                sql.push_str(DELETE_ROW);
                bodies.push(None);
            }
            ChangeType::Added | ChangeType::Modified => {
                sql.push_str(UPSERT_ROW);
                bodies.push(Some(
                    serde_json::to_string(&*row.object).map_err(StoreError::backend)?,
                ));
            }
        }
    }
    sql.push_str("UPDATE meta SET value = ? WHERE key = 'resource_version'; COMMIT;");
    // Built only from the constant statements above; every value is a bind, consumed in order
    // across the statements.
    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
    for (row, body) in rows.iter().zip(bodies) {
        q = q
            .bind(row.api_version.as_str())
            .bind(row.kind.as_str())
            .bind(row.namespace.as_str())
            .bind(row.name.as_str());
        if let Some(body) = body {
            q = q.bind(row.uid.as_str()).bind(row.rv as i64).bind(body);
        }
    }
    let result = q.bind(last_rv.to_string()).execute(&mut *conn).await;
    if let Err(e) = result {
        // A statement failed inside the transaction: undo whatever ran before it.
        let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
        return Err(StoreError::backend(e));
    }
    Ok(())
}

fn not_an_object(kind: &str, name: &str) -> StoreError {
    StoreError::Invalid {
        kind: kind.into(),
        name: name.into(),
        reason: "the object and its metadata must be JSON objects".into(),
    }
}

async fn load(pool: &SqlitePool) -> Result<State, StoreError> {
    let rv: String = sqlx::query_scalar("SELECT value FROM meta WHERE key = 'resource_version'")
        .fetch_one(pool)
        .await
        .map_err(StoreError::backend)?;
    let mut state = State::new(u64::from_str(&rv).map_err(StoreError::backend)?);
    let mut rows = sqlx::query(
        "SELECT api_version, kind, namespace, name, uid, resource_version, body FROM objects",
    )
    .fetch(pool);
    while let Some(row) = rows.next().await {
        let row = row.map_err(StoreError::backend)?;
        let body: String = row.get("body");
        let object: Value = serde_json::from_str(&body).map_err(StoreError::backend)?;
        let rv: i64 = row.get("resource_version");
        state.insert_loaded(StateRow {
            api_version: row.get("api_version"),
            kind: row.get("kind"),
            namespace: row.get("namespace"),
            name: row.get("name"),
            uid: row.get("uid"),
            rv: rv as u64,
            change: ChangeType::Added,
            object: Arc::new(object),
        });
    }
    Ok(state)
}

fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    now.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn meta_mut<'a>(kind: &Kind, obj: &'a mut Value) -> Result<&'a mut Map<String, Value>, StoreError> {
    let name = super::object_key(obj).1;
    obj.as_object_mut()
        .and_then(|o| {
            o.entry("metadata")
                .or_insert_with(|| json!({}))
                .as_object_mut()
        })
        .ok_or_else(|| not_an_object(&kind.singular(), &name))
}

fn meta_str(obj: &Value, field: &str) -> Option<String> {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The object without the fields the server owns, to detect writes that change nothing.
fn comparable(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        m.remove("managedFields");
    }
    v
}

fn invalid(kind: &Kind, name: &str, reason: impl Into<String>) -> StoreError {
    StoreError::Invalid {
        kind: kind.singular(),
        name: name.to_string(),
        reason: reason.into(),
    }
}

fn not_found(kind: &Kind, name: &str) -> StoreError {
    StoreError::NotFound {
        kind: kind.singular(),
        name: name.to_string(),
    }
}

fn conflict(kind: &Kind, name: &str) -> StoreError {
    StoreError::Conflict {
        kind: kind.singular(),
        name: name.to_string(),
    }
}

fn row_of(
    kind: &Kind,
    namespace: &str,
    name: &str,
    uid: &str,
    rv: u64,
    change: ChangeType,
    object: Value,
) -> StateRow {
    StateRow {
        api_version: kind.api_version.to_string(),
        kind: kind.kind.to_string(),
        namespace: namespace.to_string(),
        name: name.to_string(),
        uid: uid.to_string(),
        rv,
        change,
        object: Arc::new(object),
    }
}

fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("resourceVersion".into(), Value::from(rv.to_string()));
    }
}

/// Checks the key of an incoming object and returns (namespace, name).
fn checked_key(kind: &Kind, obj: &mut Value) -> Result<(String, String), StoreError> {
    let meta = meta_mut(kind, obj)?;
    let name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if name.is_empty() {
        return Err(invalid(
            kind,
            "",
            "metadata.name: Required value: name or generateName is required",
        ));
    }
    kind.names.check(&name).map_err(|e| {
        invalid(
            kind,
            &name,
            format!("metadata.name: Invalid value: \"{name}\": {e}"),
        )
    })?;
    let namespace = if kind.namespaced {
        let ns = meta
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if ns.is_empty() {
            return Err(invalid(kind, &name, "metadata.namespace: Required value"));
        }
        validation::dns1123_label(&ns).map_err(|e| {
            invalid(
                kind,
                &name,
                format!("metadata.namespace: Invalid value: \"{ns}\": {e}"),
            )
        })?;
        ns
    } else {
        meta.remove("namespace");
        String::new()
    };
    Ok((namespace, name))
}

impl EmbeddedStore {
    /// The rows that delete `root` and, like Kubernetes' garbage collector, its dependents whose
    /// owners are all gone. Objects with finalizers are only marked for deletion.
    fn plan_delete(&self, state: &State, kind: &Kind, root: &Value, rv: &mut u64) -> Vec<StateRow> {
        let mut rows = Vec::new();
        let mut gone_uids = Vec::new();
        let mut queue: Vec<(String, String, Value)> = vec![(
            kind.api_version.to_string(),
            kind.kind.to_string(),
            root.clone(),
        )];
        while let Some((api_version, k, obj)) = queue.pop() {
            let (namespace, name) = super::object_key(&obj);
            let uid = meta_str(&obj, "uid").unwrap_or_default();
            let row_kind = |rv: u64, change, object| StateRow {
                api_version: api_version.clone(),
                kind: k.clone(),
                namespace: namespace.clone(),
                name: name.clone(),
                uid: uid.clone(),
                rv,
                change,
                object: Arc::new(object),
            };
            if !finalizers(&obj).is_empty() {
                if meta_str(&obj, "deletionTimestamp").is_none() {
                    let mut marked = obj.clone();
                    *rv += 1;
                    if let Some(m) = marked.get_mut("metadata").and_then(Value::as_object_mut) {
                        m.insert("deletionTimestamp".into(), Value::from(now_rfc3339()));
                        m.insert("deletionGracePeriodSeconds".into(), Value::from(0));
                    }
                    set_rv(&mut marked, *rv);
                    rows.push(row_kind(*rv, ChangeType::Modified, marked));
                }
                continue;
            }
            *rv += 1;
            let mut last = obj.clone();
            set_rv(&mut last, *rv);
            rows.push(row_kind(*rv, ChangeType::Deleted, last));
            gone_uids.push(uid.clone());
            for (dep_api, dep_kind, dep) in state.dependents_of(&uid) {
                let all_owners_gone = dep
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .is_some_and(|refs| {
                        refs.iter().all(|r| {
                            let owner = r.get("uid").and_then(Value::as_str).unwrap_or_default();
                            gone_uids.iter().any(|g| g == owner) || !state.has_uid(owner)
                        })
                    });
                let dep_uid = meta_str(&dep, "uid").unwrap_or_default();
                let already = rows
                    .iter()
                    .any(|r| r.uid == dep_uid && r.change == ChangeType::Deleted);
                if all_owners_gone && !already {
                    queue.push((dep_api, dep_kind, (*dep).clone()));
                }
            }
        }
        rows
    }
}

#[async_trait]
impl ObjectStore for EmbeddedStore {
    async fn get(
        &self,
        kind: &Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, StoreError> {
        let namespace = if kind.namespaced { namespace } else { "" };
        let found = self
            .read()
            .get(&kind.api_version, &kind.kind, namespace, name)
            .map(|v| (*v).clone());
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

    async fn list(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        selector: &LabelSelector,
    ) -> Result<ObjectList, StoreError> {
        let (items, rv) = {
            let state = self.read();
            let items: Vec<Value> = state
                .iter(
                    &kind.api_version,
                    &kind.kind,
                    namespace.filter(|_| kind.namespaced),
                )
                .filter(|v| selector.matches_object(v))
                .map(|v| (**v).clone())
                .collect();
            (items, state.rv)
        };
        if rv > *self.durable.borrow() {
            self.await_durable(rv).await?;
        }
        Ok(ObjectList {
            items,
            resource_version: rv.to_string(),
        })
    }

    async fn create(&self, kind: &Kind, mut object: Value) -> Result<Value, StoreError> {
        // generateName: Kubernetes appends five random characters.
        {
            let meta = meta_mut(kind, &mut object)?;
            let has_name = meta
                .get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
            if !has_name && let Some(prefix) = meta.get("generateName").and_then(Value::as_str) {
                let name = format!("{prefix}{}", crate::validation::random_alnum(5));
                meta.insert("name".into(), Value::from(name));
            }
        }
        let (namespace, name) = checked_key(kind, &mut object)?;
        self.write(|state| {
            if state
                .get(&kind.api_version, &kind.kind, &namespace, &name)
                .is_some()
            {
                return Err(StoreError::AlreadyExists {
                    kind: kind.singular(),
                    name: name.clone(),
                });
            }
            let rv = state.rv + 1;
            let uid = uuid::Uuid::new_v4().to_string();
            {
                let meta = meta_mut(kind, &mut object)?;
                meta.insert("uid".into(), Value::from(uid.clone()));
                meta.insert("creationTimestamp".into(), Value::from(now_rfc3339()));
                meta.insert("generation".into(), Value::from(1));
                meta.remove("deletionTimestamp");
                meta.remove("deletionGracePeriodSeconds");
                meta.insert("resourceVersion".into(), Value::from(rv.to_string()));
            }
            if kind.status_subresource
                && let Some(o) = object.as_object_mut()
            {
                o.remove("status");
            }
            if kind.api_version == "v1" && kind.kind == "Secret" {
                self.fill_token(state, &mut object)?;
            }
            let row = row_of(
                kind,
                &namespace,
                &name,
                &uid,
                rv,
                ChangeType::Added,
                object.clone(),
            );
            Ok((vec![row], object))
        })
        .await
    }

    async fn replace(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        self.replace_impl(kind, object, false).await
    }

    async fn replace_status(&self, kind: &Kind, object: Value) -> Result<Value, StoreError> {
        self.replace_impl(kind, object, true).await
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
            // Every change since the store was opened is in the history until trimmed, and every
            // change consumes one resourceVersion, so the history covers exactly (front - 1, rv].
            let covered_from = state
                .history
                .front()
                .map(|c| c.resource_version - 1)
                .unwrap_or(*self.durable.borrow());
            if since < covered_from {
                return Err(StoreError::Gone);
            }
            let replay: Vec<Change> = state
                .history
                .iter()
                .filter(|c| c.resource_version > since)
                .cloned()
                .collect();
            (replay, self.changes.subscribe())
        };
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
        let live = tokio_stream::wrappers::BroadcastStream::new(rx).filter_map(move |r| {
            let out = match r {
                Ok(c) if matches2(&c) => Some(Ok(c)),
                Ok(_) => None,
                // A watcher that fell behind must relist, as after a 410 from Kubernetes.
                Err(_) => Some(Err(StoreError::Gone)),
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

impl EmbeddedStore {
    async fn replace_impl(
        &self,
        kind: &Kind,
        mut object: Value,
        status_only: bool,
    ) -> Result<Value, StoreError> {
        let (namespace, name) = checked_key(kind, &mut object)?;
        self.write(|state| {
            let current = state
                .get(&kind.api_version, &kind.kind, &namespace, &name)
                .ok_or_else(|| not_found(kind, &name))?;
            let want_rv = meta_str(&object, "resourceVersion").filter(|s| !s.is_empty());
            if want_rv.is_some() && want_rv != meta_str(&current, "resourceVersion") {
                return Err(conflict(kind, &name));
            }
            let want_uid = meta_str(&object, "uid").filter(|s| !s.is_empty());
            if want_uid.is_some() && want_uid != meta_str(&current, "uid") {
                return Err(conflict(kind, &name));
            }
            let mut next = if status_only {
                let mut next = (*current).clone();
                if let Some(o) = next.as_object_mut() {
                    match object.get("status") {
                        Some(s) => o.insert("status".into(), s.clone()),
                        None => o.remove("status"),
                    };
                }
                next
            } else {
                let mut next = object.clone();
                if kind.status_subresource
                    && let Some(o) = next.as_object_mut() {
                        match current.get("status") {
                            Some(s) => o.insert("status".into(), s.clone()),
                            None => o.remove("status"),
                        };
                    }
                // Server-owned metadata is kept from the stored object.
                let cur_meta = current.get("metadata").cloned().unwrap_or_else(|| json!({}));
                let meta = meta_mut(kind, &mut next)?;
                for f in ["uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"] {
                    match cur_meta.get(f) {
                        Some(v) => meta.insert(f.into(), v.clone()),
                        None => meta.remove(f),
                    };
                }
                if current.get("spec") != next.get("spec") {
                    let generation = cur_meta.get("generation").and_then(Value::as_i64).unwrap_or(0);
                    meta_mut(kind, &mut next)?.insert("generation".into(), Value::from(generation + 1));
                }
                next
            };
            if comparable(&next) == comparable(&current) {
                return Ok((Vec::new(), (*current).clone()));
            }
            let terminating = meta_str(&current, "deletionTimestamp").is_some();
            if terminating {
                let before = finalizers(&current);
                if finalizers(&next).iter().any(|f| !before.contains(f)) {
                    return Err(invalid(kind, &name, "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted"));
                }
            }
            let uid = meta_str(&current, "uid").unwrap_or_default();
            if terminating && finalizers(&next).is_empty() {
                let mut rv = state.rv;
                let rows = self.plan_delete(state, kind, &next, &mut rv);
                let last = rows.first().map(|r| (*r.object).clone()).unwrap_or(next);
                return Ok((rows, last));
            }
            let rv = state.rv + 1;
            set_rv(&mut next, rv);
            let row = row_of(kind, &namespace, &name, &uid, rv, ChangeType::Modified, next.clone());
            Ok((vec![row], next))
        })
        .await
    }
}
