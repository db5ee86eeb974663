//! The cloud-config API's domain: request parsing, object naming and shape, issuance, and the
//! byte-exact output formats Harvester v1.9 clients expect; what the embedded store is seeded with
//! for it ([`seed`]), and `harvester-cloud kubeconfig generate` ([`cli`]).

pub mod accounts;
mod fresh;
pub mod lifecycle;
pub mod naming;
pub mod objects;
pub mod render;
pub mod rendered;
pub mod request;
pub mod revoke;
pub mod seed;
pub mod served;
pub mod service;
pub mod sweep;

pub use rendered::Rendered;
pub use request::{AccountRequest, OutputFormat, RequestError};
pub use revoke::{Kept, Revocation};
pub use service::{CloudConfig, CloudConfigError, Settings};
