//! `GET /v1/harvester/kubeconfig` query strings: `request::from_query` on arbitrary text never
//! panics, and what it accepts is valid and reads back the same (see `oracle.rs`).
#![no_main]

use harvester_cloud::kubeconfig::request;
use libfuzzer_sys::fuzz_target;

mod oracle;

fuzz_target!(|query: &str| {
    if let Ok(req) = request::from_query(Some(query)) {
        oracle::check_accepted(&req);
    }
});
