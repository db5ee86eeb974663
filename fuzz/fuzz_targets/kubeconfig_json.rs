//! `POST /v1/harvester/kubeconfig` bodies: `request::from_json` on arbitrary bytes never panics,
//! and what it accepts is valid and reads back the same (see `oracle.rs`).
#![no_main]

use harvester_cloud::kubeconfig::request;
use libfuzzer_sys::fuzz_target;

mod oracle;

fuzz_target!(|body: &[u8]| {
    if let Ok(req) = request::from_json(body) {
        oracle::check_accepted(&req);
    }
});
