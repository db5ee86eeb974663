//! The embedded store's durable side: opening (and migrating) the SQLite file, loading every
//! object into the memory index on start, and committing a batch of writes' rows in one transaction.

use std::{path::Path, str::FromStr, sync::Arc, time::Duration};

use futures::StreamExt;
use serde_json::Value;
use sqlx::{
    Row, SqliteConnection,
    sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
    },
};

use super::{
    OpenError,
    held::{Held, NotAnObject},
    state::{Ident, Row as StateRow, State, Stored},
};
use crate::{ChangeType, StoreError};

/// Opens the database file of a data directory for maintenance commands (tokens), without the
/// exclusive lock and the object index that `serve` holds.
pub async fn open_pool(data_dir: &Path) -> Result<SqlitePool, OpenError> {
    create_data_dir(data_dir)?;
    let path = data_dir.join(DB_FILE);
    prepare_database_file(data_dir, false)?;
    migrated_pool(&path, &options(&path, SqliteSynchronous::Full), 2).await
}

pub(super) const DB_FILE: &str = "harvester-cloud.db";

/// What in a data directory says an earlier start used it (besides the database).
const PRIOR_STATE: &[&str] = &["admin-token", "tls", "admin-tokens.changed"];

/// Checks the database file before SQLite opens it, and makes it private. A missing database in
/// a directory an earlier start used, or an empty (zero-length) one, is refused: SQLite would
/// silently start a new store, and the service a new signing key and admin token, over what was
/// lost. `reinitialize` starts anew on purpose instead.
pub(super) fn prepare_database_file(data_dir: &Path, reinitialize: bool) -> Result<(), OpenError> {
    let path = data_dir.join(DB_FILE);
    let existing = std::fs::metadata(&path).ok();
    let problem = match &existing {
        Some(m) if m.len() > 0 => None,
        Some(_) => Some("is empty (zero bytes)".to_string()),
        None => {
            let evidence: Vec<&str> = PRIOR_STATE
                .iter()
                .copied()
                .filter(|f| data_dir.join(f).exists())
                .collect();
            (!evidence.is_empty()).then(|| {
                format!(
                    "is missing, but {} holds {} from an earlier start",
                    data_dir.display(),
                    evidence.join(", ")
                )
            })
        }
    };
    if let Some(problem) = problem {
        if !reinitialize {
            return Err(OpenError::LostDatabase {
                path: path.clone(),
                problem,
            });
        }
        tracing::warn!(path = %path.display(), %problem, "--reinitialize: starting with an empty store");
        for suffix in ["", "-wal", "-shm"] {
            let f = data_dir.join(format!("{DB_FILE}{suffix}"));
            if f.exists() {
                std::fs::remove_file(&f).map_err(|source| OpenError::CreateDir {
                    path: f.clone(),
                    source,
                })?;
            }
        }
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        // The database holds the signing key and every issued token: readable by its owner only.
        // SQLite gives its -wal and -shm files the database's mode.
        if !path.exists() {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|source| OpenError::CreateDir {
                    path: path.clone(),
                    source,
                })?;
        }
        for suffix in ["", "-wal", "-shm"] {
            let f = data_dir.join(format!("{DB_FILE}{suffix}"));
            if f.exists() {
                let _ = std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600));
            }
        }
    }
    Ok(())
}

/// A pool of `connections` on the database at `path`, migrated to the current schema.
pub(super) async fn migrated_pool(
    path: &Path,
    options: &SqliteConnectOptions,
    connections: u32,
) -> Result<SqlitePool, OpenError> {
    let pool = SqlitePoolOptions::new()
        .max_connections(connections)
        .connect_with(options.clone())
        .await
        .map_err(|source| OpenError::Open {
            path: path.to_path_buf(),
            source,
        })?;
    migrate(&pool, path).await?;
    Ok(pool)
}

pub(super) fn create_data_dir(data_dir: &Path) -> Result<(), OpenError> {
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
///
/// `temp_store = memory`: a commit's multi-row upsert changes many rows inside the transaction, so
/// SQLite keeps a statement journal of the pages it changes (to undo the statement alone should it
/// fail halfway), and past 64 KiB it spilled that journal to a temporary file: writing it was 6.6%
/// of the server's CPU under POST load. In memory it costs a copy of those pages, as large as one
/// commit's rows. Lists are served from memory; the store's few SQL sorts (at open) follow an index
/// or are small, so no other temporary table grows with the data.
pub(super) fn options(path: &Path, synchronous: SqliteSynchronous) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(synchronous)
        .busy_timeout(Duration::from_secs(10))
        .pragma("temp_store", "memory")
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

const DELETE_ROW: &str =
    "DELETE FROM objects WHERE api_version = ? AND kind = ? AND namespace = ? AND name = ?;";
/// The most rows of one upsert: 7 values each, far below SQLite's 32,766 variables per statement.
const UPSERT_ROWS: usize = 512;
const UPSERT_HEAD: &str =
    "INSERT INTO objects (api_version, kind, namespace, name, uid, resource_version, body) VALUES ";
const UPSERT_VALUES: &str = "(?, ?, ?, ?, ?, ?, ?)";
const UPSERT_TAIL: &str = " ON CONFLICT (api_version, kind, namespace, name)
     DO UPDATE SET uid = excluded.uid, resource_version = excluded.resource_version, body = excluded.body;";

/// Stores the objects of `pending` (consecutive whole rows of a batch) with one multi-row upsert:
/// SQLite applies its rows in order, so a later row of the same object wins, as one statement per
/// row would; and it parses one statement instead of one per row (SQL parsing was 5% of the
/// server's CPU under POST load, every commit's text being new).
fn flush_upserts<'a>(
    sql: &mut String,
    statements: &mut Vec<(&'a StateRow, Binds<'a>)>,
    pending: &mut Vec<(&'a StateRow, &'a str)>,
) {
    if pending.is_empty() {
        return;
    }
    sql.push_str(UPSERT_HEAD);
    for (i, (row, body)) in pending.drain(..).enumerate() {
        if i > 0 {
            sql.push(',');
        }
        sql.push_str(UPSERT_VALUES);
        statements.push((row, Binds::Whole(body)));
    }
    sql.push_str(UPSERT_TAIL);
}

const DROP_PATCHES: &str =
    "DELETE FROM status_patches WHERE api_version = ? AND kind = ? AND namespace = ? AND name = ?;";
const INSERT_PATCH: &str =
    "INSERT INTO status_patches (api_version, kind, namespace, name, resource_version, patch)
     VALUES (?, ?, ?, ?, ?, ?);";

/// What a deletion counts for in the history's size (its object is not serialised).
const DELETED_BYTES: usize = 1024;

/// The most rows a commit's SQL may write and still be kept prepared for the next commit of the
/// same shape.
const KEPT_PREPARED: usize = 8;

/// A statement's values, bound in order.
enum Binds<'a> {
    Key,
    Whole(&'a str),
    Patch(&'a str),
}

/// Each row's object as stored whole (`None` for a deletion or a status patch).
pub(super) fn encode(rows: &[StateRow]) -> Result<Vec<Option<String>>, StoreError> {
    rows.iter()
        .map(|row| match (&row.stored, row.change) {
            (Stored::Whole, ChangeType::Added | ChangeType::Modified) => {
                serde_json::to_string(&*row.object)
                    .map(Some)
                    .map_err(StoreError::backend)
            }
            _ => Ok(None),
        })
        .collect()
}

/// What a row [`encode`]d to `body` counts for in the history's size.
pub(super) fn stored_size(row: &StateRow, body: &Option<String>) -> usize {
    match (&row.stored, body) {
        // As the history counts it: about the object's size, not the patch's.
        (
            Stored::Patch {
                patch,
                object_bytes,
            },
            _,
        ) => object_bytes + patch.len(),
        (Stored::Whole, Some(body)) => body.len(),
        (Stored::Whole, None) => DELETED_BYTES,
    }
}

/// Stores `rows` (with their `bodies` from [`encode`]) and the new resourceVersion in one
/// transaction, sent to SQLite as one multi-statement query: one round trip to the connection's
/// worker for however many writes the batch holds, instead of one per statement; consecutive whole
/// rows go in one multi-row upsert ([`flush_upserts`]). Rows are stored in order, so a later row
/// of the same object wins. `poisoned` (fault injection) makes the
/// transaction fail after its rows are written, as a full disk would, and be rolled back.
pub(super) async fn commit(
    conn: &mut SqliteConnection,
    rows: &[&StateRow],
    bodies: &[Option<String>],
    last_rv: u64,
    poisoned: bool,
) -> Result<(), StoreError> {
    let mut sql = String::with_capacity(64 + rows.len() * 64);
    sql.push_str("BEGIN IMMEDIATE;");
    let mut statements = Vec::with_capacity(rows.len());
    let mut pending: Vec<(&StateRow, &str)> = Vec::new();
    for (row, body) in rows.iter().zip(bodies) {
        match &row.stored {
            Stored::Whole => {
                // A deletion ends the run of upserts, so that statements stay in the rows' order.
                if body.is_none() {
                    flush_upserts(&mut sql, &mut statements, &mut pending);
                }
                // Whatever was patched of the object before is in this row (a new object has
                // nothing patched: its name's last object, if any, was deleted).
                if row.change != ChangeType::Added {
                    sql.push_str(DROP_PATCHES);
                    statements.push((*row, Binds::Key));
                }
                match body {
                    None => {
                        sql.push_str(DELETE_ROW);
                        statements.push((*row, Binds::Key));
                    }
                    Some(body) => {
                        pending.push((*row, body.as_str()));
                        if pending.len() == UPSERT_ROWS {
                            flush_upserts(&mut sql, &mut statements, &mut pending);
                        }
                    }
                }
            }
            Stored::Patch { patch, .. } => {
                flush_upserts(&mut sql, &mut statements, &mut pending);
                sql.push_str(INSERT_PATCH);
                statements.push((*row, Binds::Patch(patch)));
            }
        }
    }
    flush_upserts(&mut sql, &mut statements, &mut pending);
    sql.push_str("UPDATE meta SET value = ? WHERE key = 'resource_version';");
    if poisoned {
        // The meta row is there already: a constraint failure inside the transaction.
        sql.push_str("INSERT INTO meta (key, value) VALUES ('resource_version', '');");
    }
    sql.push_str("COMMIT;");
    // Built only from the constant statements above; every value is a bind, consumed in order
    // across the statements.
    // Kept prepared only when small: the text differs with the batch's rows, and with every batch
    // kept the connection's statement cache held up to a hundred large batches' prepared
    // statements (72 MB of SQLite's memory at the peak of a 20,000 LoadBalancer convergence),
    // where a small batch's text (one request's objects) comes back again and again.
    let keep = statements.len() <= KEPT_PREPARED;
    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).persistent(keep);
    for (row, binds) in statements {
        q = q
            .bind(row.api_version.as_str())
            .bind(row.kind.as_str())
            .bind(row.namespace.as_str())
            .bind(row.name.as_str());
        match binds {
            Binds::Key => {}
            Binds::Whole(body) => q = q.bind(row.uid.as_str()).bind(row.rv as i64).bind(body),
            Binds::Patch(patch) => q = q.bind(row.rv as i64).bind(patch),
        }
    }
    let result = q.bind(last_rv.to_string()).execute(&mut *conn).await;
    if let Err(e) = result {
        // A statement failed inside the transaction: undo whatever ran before it.
        let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
        if poisoned {
            return Err(StoreError::backend(std::io::Error::other(
                "database or disk is full (injected)",
            )));
        }
        return Err(StoreError::backend(e));
    }
    Ok(())
}

pub(super) async fn load(pool: &SqlitePool) -> Result<State, StoreError> {
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
        let (held, owners) = match Held::loaded(body) {
            Ok(loaded) => loaded,
            Err(NotAnObject(e)) => {
                // One corrupt row must not keep the service down: it stays in the file, out of
                // the index, and the log says which.
                let (kind, namespace, name): (String, String, String) =
                    (row.get("kind"), row.get("namespace"), row.get("name"));
                tracing::error!(%kind, %namespace, %name, error = %e, "a stored object is not JSON; leaving it out");
                continue;
            }
        };
        let (api_version, kind, namespace, name, uid): (String, String, String, String, String) = (
            row.get("api_version"),
            row.get("kind"),
            row.get("namespace"),
            row.get("name"),
            row.get("uid"),
        );
        let id = Ident {
            api_version: &api_version,
            kind: &kind,
            namespace: &namespace,
            name: &name,
            uid: &uid,
        };
        state.insert_loaded_text(id, held, owners);
    }
    drop(rows);
    load_patches(pool, &mut state).await?;
    Ok(state)
}

/// Applies the stored status patches to the objects just loaded, in resourceVersion order.
async fn load_patches(pool: &SqlitePool, state: &mut State) -> Result<(), StoreError> {
    let mut rows = sqlx::query(
        "SELECT api_version, kind, namespace, name, resource_version, patch FROM status_patches
         ORDER BY api_version, kind, namespace, name, resource_version",
    )
    .fetch(pool);
    while let Some(row) = rows.next().await {
        let row = row.map_err(StoreError::backend)?;
        let (api_version, kind, namespace, name): (String, String, String, String) = (
            row.get("api_version"),
            row.get("kind"),
            row.get("namespace"),
            row.get("name"),
        );
        let rv: i64 = row.get("resource_version");
        let text: String = row.get("patch");
        let Some(current) = state.get(&api_version, &kind, &namespace, &name) else {
            // Its object was left out (not JSON) or is gone: nothing to apply it to.
            tracing::error!(%kind, %namespace, %name, "a status patch of an object not loaded; leaving it out");
            continue;
        };
        let patch: Value = match serde_json::from_str(&text) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(%kind, %namespace, %name, error = %e, "a stored status patch is not JSON; leaving it out");
                continue;
            }
        };
        let mut object = (*current).clone();
        crate::merge_into_status(&mut object, &patch);
        super::semantics::set_rv(&mut object, rv as u64);
        let uid = super::semantics::meta_str(&object, "uid").unwrap_or_default();
        let bytes = if state.patches(&uid).count > 0 {
            0
        } else {
            super::patch::json_len(&current)
        };
        state.insert_loaded(StateRow {
            api_version,
            kind,
            namespace,
            name,
            uid: uid.clone(),
            rv: rv as u64,
            change: ChangeType::Added,
            object: Arc::new(object),
            stored: Stored::Whole,
        });
        state.loaded_patch(&uid, bytes, text.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use sqlx::Connection;

    use super::*;

    fn row(name: &str, rv: u64, change: ChangeType, stored: Stored) -> StateRow {
        StateRow {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            rv,
            change,
            object: Arc::new(
                json!({"metadata": {"name": name, "resourceVersion": rv.to_string()}}),
            ),
            stored,
        }
    }

    /// Every connection keeps its temporary files, the statement journal of a commit's multi-row
    /// upsert among them, in memory.
    #[tokio::test]
    async fn statement_journals_stay_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let opts = options(&dir.path().join(DB_FILE), SqliteSynchronous::Normal);
        let writer = crate::embedded::checkpoints::writer_options(opts.clone());
        for opts in [opts, writer] {
            let mut conn = SqliteConnection::connect_with(&opts).await.unwrap();
            let mode: i64 = sqlx::query_scalar("PRAGMA temp_store")
                .fetch_one(&mut conn)
                .await
                .unwrap();
            assert_eq!(mode, 2, "MEMORY");
        }
    }

    /// One batch, in order: objects created, one of them written twice more (the last write wins,
    /// as it would statement by statement), a status patch between whole writes, a deletion
    /// between upserts, and more rows than one upsert takes.
    #[tokio::test]
    async fn a_batch_is_stored_row_by_row_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(DB_FILE);
        let opts = options(&path, SqliteSynchronous::Normal);
        let pool = migrated_pool(&path, &opts, 1).await.unwrap();
        let mut conn = SqliteConnection::connect_with(&opts).await.unwrap();

        let patch = || Stored::Patch {
            object_bytes: 100,
            patch: r#"{"status":{"n":1}}"#.into(),
        };
        let mut rows = vec![
            row("a", 1, ChangeType::Added, Stored::Whole),
            row("b", 2, ChangeType::Added, Stored::Whole),
            row("a", 3, ChangeType::Modified, Stored::Whole),
            row("b", 4, ChangeType::Modified, patch()),
            row("a", 5, ChangeType::Modified, Stored::Whole),
            row("c", 6, ChangeType::Added, Stored::Whole),
            row("c", 7, ChangeType::Deleted, Stored::Whole),
            row("d", 8, ChangeType::Added, Stored::Whole),
        ];
        for i in 0..UPSERT_ROWS + 3 {
            rows.push(row(
                &format!("many-{i}"),
                9 + i as u64,
                ChangeType::Added,
                Stored::Whole,
            ));
        }
        let bodies = encode(&rows).unwrap();
        let refs: Vec<&StateRow> = rows.iter().collect();
        commit(&mut conn, &refs, &bodies, 9 + UPSERT_ROWS as u64 + 2, false)
            .await
            .unwrap();

        let stored: Vec<(String, i64)> = sqlx::query_as(
            "SELECT name, resource_version FROM objects WHERE name NOT LIKE 'many-%' ORDER BY name",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        assert_eq!(
            stored,
            vec![("a".into(), 5), ("b".into(), 2), ("d".into(), 8)]
        );
        let many: i64 = sqlx::query_scalar("SELECT count(*) FROM objects WHERE name LIKE 'many-%'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(many, UPSERT_ROWS as i64 + 3);
        let patches: Vec<(String, i64)> =
            sqlx::query_as("SELECT name, resource_version FROM status_patches")
                .fetch_all(&mut conn)
                .await
                .unwrap();
        assert_eq!(patches, vec![("b".into(), 4)]);
        let body: String = sqlx::query_scalar("SELECT body FROM objects WHERE name = 'a'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap(),
            *rows[4].object
        );
        let rv: String =
            sqlx::query_scalar("SELECT value FROM meta WHERE key = 'resource_version'")
                .fetch_one(&mut conn)
                .await
                .unwrap();
        assert_eq!(rv, (9 + UPSERT_ROWS + 2).to_string());
        conn.close().await.unwrap();
        pool.close().await;
    }
}
