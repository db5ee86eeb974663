//! Poison-tolerant locking for the process's small shared maps (caches, counters, indexes).
//!
//! A panic while one of these locks is held leaves data that is still usable (every writer keeps it
//! consistent between statements), so the next holder takes it as it is instead of panicking too.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking over a lock a panicking holder left poisoned.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
