//! The embedded store's writer: group commit of whole writes. A write is planned by its caller
//! against the committed index plus every write queued before it ([`View`]), then queued; one
//! committer task takes every write queued meanwhile and stores them in ONE SQLite transaction
//! (one BEGIN/COMMIT, one hand-off to sqlx's worker thread), applies them to memory in
//! resourceVersion order, and answers each. Per write, the hand-offs and the transaction's fixed
//! cost were most of a small write's CPU; concurrent writers now share them as they already
//! shared the WAL's fsync.
//!
//! A plan error answers only its caller. If the transaction fails, every write in it, and every
//! write queued behind it (they were planned on top of it), fails with the backend error and
//! nothing of them reaches memory: memory is never ahead of or behind the database. The commit
//! runs in the committer task, so a caller that goes away cannot interrupt it.

use std::{collections::VecDeque, sync::Arc};

use tokio::sync::oneshot;

use super::{
    Ack, Durability, EmbeddedStore, closed,
    overlay::{Overlay, View},
    sql,
    state::Row,
};
use crate::StoreError;

/// What `error` says, for a backend error made of it (a backend error's own message: wrapped
/// again it would read "store backend failed: store backend failed: …").
pub(super) fn backend_message(error: &StoreError) -> String {
    match error {
        StoreError::Backend(source) => source.to_string(),
        other => other.to_string(),
    }
}

/// At most this many writes in one transaction (a write may hold many rows: a batch of
/// [`crate::ObjectStore::create_each`] is one)…
const BATCH_WRITES: usize = 256;
/// …and at most about this many bytes of objects (a batch holds the writer for its whole
/// commit: big objects, an IP pool's status, go in smaller batches).
const BATCH_BYTES: usize = 4 << 20;

/// A planned write waiting for the committer.
struct Job {
    rows: Vec<Row>,
    /// The last resourceVersion of the write (that of the view it read, when it has no rows).
    last_rv: u64,
    /// Fault injection: its transaction fails ([`EmbeddedStore::inject_write_failures`]).
    poisoned: bool,
    done: oneshot::Sender<Result<(), StoreError>>,
}

/// Writes planned and not yet committed.
#[derive(Default)]
pub(super) struct Pending {
    queue: VecDeque<Job>,
    overlay: Overlay,
    /// Set by [`EmbeddedStore::close`]: no more writes.
    closed: bool,
    /// Transactions and writes committed so far (tests, logs).
    pub transactions: u64,
    pub writes: u64,
}

impl Pending {
    /// How many writes wait for the committer.
    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.queue.len()
    }
}

impl EmbeddedStore {
    /// Fault injection (tests, drills): after `after` more writes succeed, the next `count` fail
    /// as a full disk makes them fail: each one's transaction is rolled back, so with it the writes
    /// committed in the same transaction fail too, and the caller gets a backend error. Counted in
    /// writes, in the order they are planned.
    pub fn inject_write_failures(&self, after: usize, count: usize) {
        *crate::sync::lock(&self.faults) = (after, count);
    }

    fn injected_failure(&self) -> bool {
        let mut faults = crate::sync::lock(&self.faults);
        match *faults {
            (0, 0) => false,
            (0, n) => {
                *faults = (0, n - 1);
                true
            }
            (k, n) => {
                *faults = (k - 1, n);
                false
            }
        }
    }

    /// Runs one write: `plan` sees the current state with every write queued before it (stable:
    /// plans are serialised) and returns the rows to store; they are committed with the writes
    /// queued meanwhile, then applied to memory and published.
    pub(super) async fn write<T>(
        &self,
        plan: impl FnOnce(&View) -> Result<(Vec<Row>, T), StoreError>,
    ) -> Result<T, StoreError> {
        self.write_as(Ack::Durable, plan).await
    }

    /// [`Self::write`], answered when `ack` says.
    pub(super) async fn write_as<T>(
        &self,
        ack: Ack,
        plan: impl FnOnce(&View) -> Result<(Vec<Row>, T), StoreError>,
    ) -> Result<T, StoreError> {
        if self.sync_failed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::backend(std::io::Error::other(
                "the write-ahead log could not be synced to disk; restart the service",
            )));
        }
        let (planned, done) = {
            let mut pending = crate::sync::lock(&self.pending);
            if pending.closed {
                return Err(closed());
            }
            let state = self.read();
            let view = View::new(&state, &pending.overlay);
            let view_rv = view.rv;
            let planned = plan(&view);
            drop(state);
            let (rows, answer) = match planned {
                Ok((rows, out)) => (rows, Ok(out)),
                Err(e) => (Vec::new(), Err(e)),
            };
            // An answer read from queued writes (an error, or nothing to change) waits until
            // they are committed: were they to fail, it would have shown what never was.
            if rows.is_empty() && pending.overlay.is_empty() {
                return answer;
            }
            let wrote = !rows.is_empty();
            let last_rv = rows.iter().map(|r| r.rv).max().unwrap_or(view_rv);
            let poisoned = wrote && self.injected_failure();
            pending.overlay.push(&rows);
            let (tx, rx) = oneshot::channel();
            pending.queue.push_back(Job {
                rows,
                last_rv,
                poisoned,
                done: tx,
            });
            (answer, (wrote, rx, last_rv))
        };
        self.commit_wanted.notify_one();
        let (wrote, rx, last_rv) = done;
        rx.await.map_err(|_| closed())??;
        let out = planned?;
        if !wrote || self.durability == Durability::Normal {
            return Ok(out);
        }
        self.sync_wanted.notify_one();
        if ack == Ack::Durable {
            self.await_durable(last_rv).await?;
        }
        Ok(out)
    }

    /// Starts the committer task; it ends once the store is dropped.
    pub(super) fn start_committer(self: &Arc<Self>) {
        self.spawn_rounds(
            self.commit_wanted.clone(),
            std::time::Duration::ZERO,
            tracing::info_span!("committer"),
            |store| async move {
                while store.commit_batch().await {}
                true
            },
        );
    }

    /// Takes the writes queued (up to the batch's bounds), and their objects encoded for SQLite.
    fn take_batch(&self) -> (Vec<Job>, Result<Vec<Option<String>>, StoreError>) {
        let mut jobs = Vec::new();
        let mut bodies = Vec::new();
        let mut bytes = 0;
        while jobs.len() < BATCH_WRITES && bytes < BATCH_BYTES {
            // One at a time, encoded outside the lock that planning writes takes.
            let Some(job) = crate::sync::lock(&self.pending).queue.pop_front() else {
                break;
            };
            let encoded = sql::encode(&job.rows);
            match encoded {
                Ok(encoded) => {
                    bytes += job
                        .rows
                        .iter()
                        .zip(&encoded)
                        .map(|(row, body)| sql::stored_size(row, body))
                        .sum::<usize>();
                    bodies.extend(encoded);
                    jobs.push(job);
                }
                Err(e) => {
                    jobs.push(job);
                    return (jobs, Err(e));
                }
            }
        }
        (jobs, Ok(bodies))
    }

    /// Commits one batch; false when there was none.
    async fn commit_batch(&self) -> bool {
        // Held for the whole batch: `close` waits for it, and takes the connection after.
        let mut writer = self.writer.lock().await;
        let (jobs, bodies) = match self.take_batch() {
            (jobs, _) if jobs.is_empty() => return false,
            (jobs, Ok(bodies)) => (jobs, bodies),
            (jobs, Err(e)) => {
                self.fail_all(jobs, &e);
                return true;
            }
        };
        let last_rv = jobs.iter().map(|j| j.last_rv).max().unwrap_or_default();
        let rows: Vec<&Row> = jobs.iter().flat_map(|j| &j.rows).collect();
        let committed = match writer.as_mut() {
            None => Err(closed()),
            Some(_) if rows.is_empty() => Ok(()),
            Some(conn) => {
                let poisoned = jobs.iter().any(|j| j.poisoned);
                sql::commit(conn, &rows, &bodies, last_rv, poisoned).await
            }
        };
        if let Err(e) = committed {
            self.fail_all(jobs, &e);
            return true;
        }
        let (mut answers, mut writes) = (Vec::with_capacity(jobs.len()), 0);
        {
            let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
            let mut bodies = bodies.into_iter();
            for job in jobs {
                writes += u64::from(!job.rows.is_empty());
                for row in job.rows {
                    let body = bodies.next().flatten();
                    let bytes = sql::stored_size(&row, &body);
                    state.apply(row, body, bytes);
                }
                answers.push(job.done);
            }
        }
        if self.durability == Durability::Normal {
            // Published in commit order: only this task commits.
            self.publish(last_rv);
        }
        {
            // Only now, with memory holding them, do the queued rows leave the overlay: a plan
            // in between sees them in one or the other.
            let mut pending = crate::sync::lock(&self.pending);
            pending.overlay.committed(last_rv);
            pending.transactions += u64::from(writes > 0);
            pending.writes += writes;
        }
        drop(writer);
        for done in answers {
            // The caller may have gone away; its write is committed all the same.
            let _ = done.send(Ok(()));
        }
        true
    }

    /// Fails `jobs` and every write queued behind them with `error`, and forgets them.
    fn fail_all(&self, jobs: Vec<Job>, error: &StoreError) {
        let queued: Vec<Job> = {
            let mut pending = crate::sync::lock(&self.pending);
            pending.overlay.clear();
            pending.queue.drain(..).collect()
        };
        let writes = jobs.len() + queued.len();
        if writes > 0 {
            tracing::error!(%error, writes, "a write to the database failed; failing it and the writes queued with it");
        }
        let message = backend_message(error);
        for job in jobs.into_iter().chain(queued) {
            let _ = job.done.send(Err(StoreError::backend(std::io::Error::other(
                message.clone(),
            ))));
        }
    }

    /// Stops taking writes and closes the writer's connection once the batch in hand is
    /// committed (writes queued behind it fail as the store is closed).
    pub(super) async fn close_writer(&self) {
        crate::sync::lock(&self.pending).closed = true;
        let mut writer = self.writer.lock().await;
        if let Some(conn) = writer.take() {
            let _ = sqlx::Connection::close(conn).await;
        }
        drop(writer);
        self.fail_all(Vec::new(), &closed());
    }
}
