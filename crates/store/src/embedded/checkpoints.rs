//! WAL checkpoints off the commit path.
//!
//! SQLite checkpoints automatically inside the commit that takes the write-ahead log past 1,000
//! pages: that commit copies the log into the database file and, as `synchronous = NORMAL` asks,
//! fsyncs it, while every write queued behind it waits (18% of the writer thread's time under the
//! POST load of `benches/http_load.rs`). Here the writer's own automatic checkpoint is only a
//! backstop far out ([`BACKSTOP_PAGES`]), and a task checkpoints (`PASSIVE`: it never waits for the
//! writer, nor the writer for it) on a reading connection of the pool, on its own SQLite worker
//! thread, once writes have become durable and at most every [`INTERVAL`].
//!
//! Durability is unchanged: a checkpoint copies only committed frames, and with `NORMAL` SQLite
//! syncs the log before copying it, whichever connection checkpoints.

use std::{sync::Arc, time::Duration};

use sqlx::sqlite::SqliteConnectOptions;
use tracing::warn;

use super::EmbeddedStore;

/// The writer checkpoints itself only past this many pages of log (64 MiB of 4 KiB pages): should
/// the task fall behind, the log stays bounded.
pub(super) const BACKSTOP_PAGES: u32 = 16_384;

/// The least time between two checkpoints.
pub(super) const INTERVAL: Duration = Duration::from_millis(250);

/// The writer's connection options: `options` with the automatic checkpoint moved out to
/// [`BACKSTOP_PAGES`].
pub(super) fn writer_options(options: SqliteConnectOptions) -> SqliteConnectOptions {
    options.pragma("wal_autocheckpoint", BACKSTOP_PAGES.to_string())
}

/// Starts the checkpointer of `store`; it ends with the store.
pub(super) fn start(store: &Arc<EmbeddedStore>) {
    store.spawn_rounds(
        store.checkpoint_wanted.clone(),
        INTERVAL,
        tracing::info_span!("wal_checkpointer"),
        |store| async move {
            if store.pool.is_closed() {
                return false;
            }
            if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                .execute(&store.pool)
                .await
                && !store.pool.is_closed()
            {
                warn!(error = %e, "checkpoint of the write-ahead log failed; the writer checkpoints past its backstop");
            }
            true
        },
    );
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use serde_json::json;
    use sqlx::{Connection, SqliteConnection};

    use super::*;
    use crate::{Kind, ObjectStore, embedded::Durability};

    /// What the database file holds without its log: a connection that opens it `immutable`
    /// ignores the write-ahead log, so it sees checkpointed rows only.
    async fn checkpointed_rows(dir: &std::path::Path) -> i64 {
        let url = format!(
            "sqlite://{}?immutable=1&mode=ro",
            dir.join(super::super::sql::DB_FILE).display()
        );
        let mut conn = SqliteConnection::connect(&url).await.unwrap();
        // No table yet: the schema itself is still only in the log.
        let n = sqlx::query_scalar("SELECT count(*) FROM objects")
            .fetch_one(&mut conn)
            .await
            .unwrap_or(0);
        conn.close().await.unwrap();
        n
    }

    /// A few small writes, far below the 1,000 pages at which SQLite would checkpoint inside a
    /// commit, reach the database file anyway: the checkpointer copies them, while the store is
    /// open. And the writer's own checkpoint has moved out to the backstop.
    #[tokio::test]
    async fn durable_writes_are_checkpointed_off_the_commit_path() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), Durability::Full)
            .await
            .unwrap();
        let kind = Kind::of::<k8s_openapi::api::core::v1::ConfigMap>();
        for i in 0..5 {
            store
                .create(
                    &kind,
                    json!({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": format!("cm-{i}"), "namespace": "ns"}}),
                )
                .await
                .unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while checkpointed_rows(dir.path()).await < 5 {
            assert!(
                Instant::now() < deadline,
                "the writes never reached the database file"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let writer_pages: i64 = {
            let mut writer = store.writer.lock().await;
            sqlx::query_scalar("PRAGMA wal_autocheckpoint")
                .fetch_one(writer.as_mut().unwrap())
                .await
                .unwrap()
        };
        assert_eq!(writer_pages, i64::from(BACKSTOP_PAGES));
        store.close().await;
    }
}
