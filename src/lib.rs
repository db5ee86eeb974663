//! harvester-cloud: cloud-config API and load balancers for guest Kubernetes clusters on SUSE
//! Virtualization (Harvester).
#![forbid(unsafe_code)]

pub mod app;
pub mod auth;
pub mod certs;
pub mod cli;
pub mod config;
pub mod controller;
pub mod crd;
pub mod guest;
pub mod http;
pub mod ipam;
pub mod issuer;
pub mod kubeconfig;
pub mod lb;
pub mod metrics;
pub mod reference;
pub mod store;
pub mod sync;
pub mod tunnel;
pub mod validation;
