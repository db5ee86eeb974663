//! Acceptance scenarios borrowed from peer allocators (MetalLB, kube-vip-cloud-provider), run against
//! this allocator. Where the peer behaves differently on purpose, the test says which way we go.

use std::net::IpAddr;

use super::allocator::{AllocateError, Origin, PoolAllocator, PoolError};
use super::spec::RangeSpec;

fn mk_range(subnet: &str, start: &str, end: &str, gateway: &str) -> RangeSpec {
    RangeSpec {
        range_start: start.into(),
        range_end: end.into(),
        subnet: subnet.into(),
        gateway: gateway.into(),
    }
}

fn mk_pool(ranges: &[RangeSpec]) -> PoolAllocator {
    PoolAllocator::new("peer", ranges).expect("valid ranges")
}

/// A pool of exactly four usable addresses, 10.0.0.1-10.0.0.4 (the gateway sits outside).
fn mk_four() -> PoolAllocator {
    mk_pool(&[mk_range(
        "10.0.0.0/24",
        "10.0.0.1",
        "10.0.0.4",
        "10.0.0.254",
    )])
}

fn mk_ip(text: &str) -> IpAddr {
    text.parse().expect("valid ip")
}

fn is_exhausted(result: Result<super::allocator::Allocation, PoolError>) -> bool {
    matches!(
        result,
        Err(PoolError::Allocate {
            source: AllocateError::Exhausted { .. },
            ..
        })
    )
}

#[test]
fn metallb_1_reallocating_a_holder_returns_the_same_address() {
    let mut pool = mk_four();
    let first = pool.allocate("default/svc").expect("allocates");
    for _ in 0..3 {
        let again = pool.allocate("default/svc").expect("idempotent");
        assert_eq!((again.ip, again.origin), (first.ip, Origin::Held));
    }
    assert_eq!(pool.available(), 3);
}

#[test]
fn metallb_2_a_held_address_is_not_taken_until_freed() {
    let mut pool = mk_four();
    let held = pool.allocate("default/a").expect("allocates").ip;
    assert!(pool.allocate_ip("default/b", held).is_err());
    pool.release("default/a");
    assert_eq!(
        pool.allocate_ip("default/b", held).expect("now free").ip,
        held
    );
    // The former holder then gets a fresh address, not an error.
    assert_ne!(pool.allocate("default/a").expect("fresh").ip, held);
}

#[test]
fn metallb_5_four_addresses_serve_four_then_fail_then_recover() {
    let mut pool = mk_four();
    for i in 1..=4 {
        pool.allocate(&format!("default/svc{i}")).expect("fits");
    }
    assert!(is_exhausted(pool.allocate("default/svc5")));
    assert!(is_exhausted(pool.allocate("default/svc6")));
    let freed = pool.release("default/svc2");
    assert_eq!(freed, vec![mk_ip("10.0.0.2")]);
    assert_eq!(
        pool.allocate("default/svc5").expect("after release").ip,
        mk_ip("10.0.0.2")
    );
    assert!(is_exhausted(pool.allocate("default/svc6")));
}

#[test]
fn metallb_6_reload_expand_shrink_split() {
    let mut pool = mk_pool(&[mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.13", "")]);
    let a = pool.allocate("ns/a").expect("allocates").ip;
    let b = pool.allocate("ns/b").expect("allocates").ip;

    // Expanding keeps allocations.
    pool.resize(&[mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.30", "")])
        .expect("expands");
    assert_eq!(
        (pool.holder(a), pool.holder(b)),
        (Some("ns/a"), Some("ns/b"))
    );

    // Shrinking while the allocations stay inside keeps them.
    pool.resize(&[mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.11", "")])
        .expect("shrinks around allocations");
    assert_eq!(pool.available(), 0);

    // Shrinking below an allocation: MetalLB unassigns it; we refuse, as Harvester's webhook does.
    let err = pool
        .resize(&[mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.10", "")])
        .expect_err("refused");
    assert_eq!(err.to_string(), "allocated IP 10.0.0.11 is excluded");

    // Splitting into several ranges that still cover the allocations keeps them.
    pool.resize(&[
        mk_range("10.0.0.0/24", "10.0.0.11", "10.0.0.12", ""),
        mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.10", ""),
    ])
    .expect("splits");
    assert_eq!(
        (pool.holder(a), pool.holder(b)),
        (Some("ns/a"), Some("ns/b"))
    );
    assert_eq!(pool.allocate("ns/c").expect("fits").ip, mk_ip("10.0.0.12"));
}

#[test]
fn metallb_reassign_after_release_regrabs_from_history() {
    let mut pool = mk_pool(&[mk_range("10.0.0.0/24", "", "", "")]);
    let ip = pool.allocate("default/svc").expect("allocates").ip;
    for i in 0..10 {
        pool.allocate(&format!("default/other{i}"))
            .expect("allocates");
    }
    pool.release("default/svc");
    let again = pool.allocate("default/svc").expect("re-grabs");
    assert_eq!((again.ip, again.origin), (ip, Origin::History));
}

#[test]
fn kube_vip_1_overlapping_ranges_are_refused_not_merged() {
    let err = PoolAllocator::new(
        "p",
        &[
            mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.20", ""),
            mk_range("10.0.0.0/24", "10.0.0.15", "10.0.0.25", ""),
        ],
    )
    .expect_err("overlap");
    assert_eq!(
        err.to_string(),
        "invalid ranges for IP pool p: there are overlaps between range 10.0.0.10-10.0.0.20 and 10.0.0.15-10.0.0.25"
    );
}

#[test]
fn kube_vip_2_ipv6_works() {
    let mut pool = mk_pool(&[mk_range("fd00:10::/120", "", "", "")]);
    assert_eq!(pool.total(), 254);
    let got = pool.allocate("default/v6").expect("allocates");
    assert_eq!(got.ip, mk_ip("fd00:10::2"));
    assert_eq!(got.gateway, Some(mk_ip("fd00:10::1")));
    assert_eq!(got.prefix_len, 120);
    assert_eq!(got.mask, mk_ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00"));
}

#[test]
fn kube_vip_3_a_slash_30_works() {
    // .1 is the default gateway and .3 the broadcast address: one address to hand out.
    let mut pool = mk_pool(&[mk_range("192.168.0.0/30", "", "", "")]);
    assert_eq!(pool.allocate("a").expect("fits").ip, mk_ip("192.168.0.2"));
    assert!(is_exhausted(pool.allocate("b")));
    // Moving the gateway to .2 hands out .1 instead.
    let mut pool = mk_pool(&[mk_range("192.168.0.0/30", "", "", "192.168.0.2")]);
    assert_eq!(pool.allocate("a").expect("fits").ip, mk_ip("192.168.0.1"));
    assert!(is_exhausted(pool.allocate("b")));
    // Two /30s side by side give one address each.
    let pool = mk_pool(&[
        mk_range("192.168.0.0/30", "", "", "192.168.0.2"),
        mk_range("192.168.0.4/30", "", "", "192.168.0.5"),
    ]);
    assert_eq!(pool.total(), 2);
}

#[test]
fn kube_vip_4_host_bits_in_the_subnet_are_masked() {
    // kube-vip hands out .1 for 192.168.0.10/24; here .1 is the gateway, so the first host is .2.
    let mut pool = mk_pool(&[mk_range("192.168.0.10/24", "", "", "")]);
    assert_eq!(pool.allocate("a").expect("fits").ip, mk_ip("192.168.0.2"));
    let mut pool = mk_pool(&[mk_range("192.168.0.10/24", "", "", "192.168.0.254")]);
    assert_eq!(pool.allocate("a").expect("fits").ip, mk_ip("192.168.0.1"));
}

#[test]
fn kube_vip_5_a_full_pool_says_so() {
    let mut pool = mk_pool(&[mk_range("192.168.0.10/32", "", "", "")]);
    assert_eq!(pool.allocate("a").expect("fits").ip, mk_ip("192.168.0.10"));
    let err = pool.allocate("b").expect_err("full");
    assert_eq!(
        err.to_string(),
        "fail to get ip from pool peer, error: no IP addresses available in range set: 192.168.0.10-192.168.0.10"
    );
}
