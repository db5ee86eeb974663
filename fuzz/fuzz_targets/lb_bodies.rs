//! IPPool and LoadBalancer request bodies (`/v1/harvester/loadbalancer.harvesterhci.io.*`): reading
//! arbitrary bytes never panics, and what is read goes through the mutators and the admission checks
//! (the same pure functions the API and the webhooks use) without panicking. The first byte chooses
//! the kind.
#![no_main]

use harvester_cloud::{
    ipam::{self, PoolAllocator, PoolEntry},
    lb::{admission, objects},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    if which % 2 == 0 {
        let Ok(mut pool) = objects::decode_pool(body) else {
            return;
        };
        admission::mutate_pool(&mut pool, u32::from(which));
        let name = pool.metadata.name.clone().unwrap_or_default();
        let spec = pool.ipam_spec();
        let entry = PoolEntry { name: &name, spec: &spec, deleting: false, options: Default::default() };
        let accepted = ipam::validate_create(&entry, &[]).is_ok();
        // An accepted pool's ranges must build an allocator whose counts add up.
        if accepted && let Ok(allocator) = PoolAllocator::new(&name, &pool.ranges()) {
            assert_eq!(allocator.available() + allocator.in_use(), allocator.total());
        }
    } else {
        let Ok(mut lb) = objects::decode_lb(body) else {
            return;
        };
        admission::mutate_lb(&mut lb, None, &[]);
        let _ = admission::validate_lb_create(&lb, &[]);
        let _ = admission::validate_lb_update(&lb, &lb);
    }
});
