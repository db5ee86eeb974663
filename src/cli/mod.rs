//! The command-line entry points other than `serve`: `harvester-cloud kubeconfig …` (an HTTP client
//! of this service or a direct client of Kubernetes), `harvester-cloud token …` (the embedded
//! backend's admin tokens) and `harvester-cloud ccm` (the guest reconciler inside a guest cluster).

pub mod ccm;
pub mod kubeconfig;
pub mod token;
