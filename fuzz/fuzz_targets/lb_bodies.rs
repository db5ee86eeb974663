//! IPPool and LoadBalancer request bodies (`/v1/harvester/loadbalancer.harvesterhci.io.*`): reading
//! arbitrary bytes never panics, and what is read goes through the mutators and the admission checks
//! (the same pure functions the API and the webhooks use) without panicking. The first byte chooses
//! the kind.
#![no_main]

use harvester_cloud::{
    http::rest::{
        Writable,
        kinds::{IpPools, LoadBalancers},
    },
    ipam::{self, PoolAllocator},
    lb::admission::{checks, network},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    if which % 2 == 0 {
        let Ok(mut pool) = IpPools::decode(body) else {
            return;
        };
        network::mutate_pool(&mut pool, i64::from(which));
        // The pool as admission sees it, its annotations (skipAddresses, serviceSelector) included.
        let entry = pool.entry();
        let accepted = ipam::validate_create(&entry, &[]).is_ok();
        // An accepted pool's ranges must build an allocator whose counts add up.
        if accepted && let Ok(allocator) = PoolAllocator::new(entry.name, &pool.spec.ranges) {
            assert_eq!(allocator.available() + allocator.in_use(), allocator.total());
        }
    } else {
        let Ok(mut lb) = LoadBalancers::decode(body) else {
            return;
        };
        checks::mutate_lb(&mut lb, None, &[]);
        let _ = checks::validate_lb_create(&lb, &[]);
        let _ = checks::validate_lb_update(&lb, &lb);
    }
});
