//! harvester-cloud: cloud-config API and load balancers for guest Kubernetes clusters on SUSE
//! Virtualization (Harvester).
//!
//! This crate is the binary's: the wiring (`app`), the listeners (`http`, `tunnel`), the command
//! line (`cli`, `config`) and the certificates. The domains and the ports below them are crates of
//! their own (`crates/`), re-exported here under the module names they had, so the binary, the
//! tests and the benches name them one way.
#![forbid(unsafe_code)]

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
