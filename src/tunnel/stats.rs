//! Counters of the tunnel, read by the metrics endpoint and by tests.

use std::sync::atomic::{AtomicBool, AtomicU64};

#[derive(Debug, Default)]
pub struct Stats {
    /// A session is up.
    pub connected: AtomicBool,
    /// Sessions established since start.
    pub sessions_total: AtomicU64,
    /// Failed dials and sessions that ended with an error.
    pub failures_total: AtomicU64,
    /// Connections open through the tunnel now, and opened since start.
    pub connections: AtomicU64,
    pub connections_total: AtomicU64,
    pub frames_in: AtomicU64,
    pub frames_out: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
}
