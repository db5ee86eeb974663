//! harvester-cloud: cloud-config API and load balancers for guest Kubernetes clusters on SUSE
//! Virtualization (Harvester).
//!
//! This crate is the binary's: the wiring (`app`), the listeners (`http`, `tunnel`), the command
//! line (`cli`, `config`) and the certificates. The domains and the ports below them are crates of
//! their own (`crates/`), re-exported here under the module names they had, so the binary, the
//! tests and the benches name them one way.
#![forbid(unsafe_code)]

/// The process's allocator, for the service and for every test and bench that links it: jemalloc
/// rather than glibc's malloc, for Rust's allocations and (unprefixed) SQLite's. The reconcilers,
/// the guest controllers and the embedded store allocate and free many small JSON nodes from
/// several threads; under glibc's allocator about a third of the CPU went to malloc and free, and
/// the more so the larger the heap (consolidating and unlinking chunks, waiting on arena locks), so
/// the CPU per LoadBalancer grew with their number. `benches/lb-results.md` has the profiles and
/// the figures; mimalloc, tried before, raised the peak RSS of the Kubernetes backend, jemalloc
/// does not. Off without the default `jemalloc` feature (the fuzz targets: their sanitizers
/// replace malloc themselves).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

pub mod app;
pub mod certs;
pub mod cli;
pub mod config;
pub mod http;
pub mod reference;
pub mod tunnel;

pub use harvester_cloud_api as crd;
pub use harvester_cloud_cloudconfig::{auth, kubeconfig};
pub use harvester_cloud_controller as controller;
pub use harvester_cloud_guest as guest;
pub use harvester_cloud_ipam as ipam;
pub use harvester_cloud_lb as lb;
pub use harvester_cloud_metrics as metrics;
pub use harvester_cloud_store as store;
pub use harvester_cloud_store::{issuer, sync, validation};
