//! The cloud-config domain: issuing service-account kubeconfigs (raw or as cloud-init user
//! data) and the admin tokens that guard the API.
#![forbid(unsafe_code)]

// The crates below this one, under the names the modules use.
use harvester_cloud_api as crd;
use harvester_cloud_metrics as metrics;
use harvester_cloud_store as store;
use harvester_cloud_store::issuer;
use harvester_cloud_store::sync;
use harvester_cloud_store::validation;

pub mod auth;
pub mod kubeconfig;
