//! Unit tests of the allocator: allocation order, release into the history, resizing, strays.

use super::*;

fn mk_range(subnet: &str, start: &str, end: &str, gateway: &str) -> RangeSpec {
    RangeSpec {
        range_start: start.into(),
        range_end: end.into(),
        subnet: subnet.into(),
        gateway: gateway.into(),
    }
}

fn mk_pool(ranges: &[RangeSpec]) -> PoolAllocator {
    PoolAllocator::new("pool1", ranges).expect("valid ranges")
}

fn mk_ip(text: &str) -> IpAddr {
    text.parse().expect("valid ip")
}

fn alloc(pool: &mut PoolAllocator, id: &str) -> String {
    pool.allocate(id).expect("allocates").ip.to_string()
}

#[test]
fn round_robin_starts_at_range_start_and_skips_the_gateway() {
    let mut pool = mk_pool(&[mk_range("192.168.0.0/24", "", "192.168.0.4", "")]);
    assert_eq!(alloc(&mut pool, "default/a"), "192.168.0.2");
    assert_eq!(alloc(&mut pool, "default/b"), "192.168.0.3");
    assert_eq!(alloc(&mut pool, "default/c"), "192.168.0.4");
    assert_eq!(pool.available(), 0);
    let err = pool.allocate("default/d").expect_err("exhausted");
    assert_eq!(
        err.to_string(),
        "fail to get ip from pool pool1, error: no IP addresses available in range set: 192.168.0.1-192.168.0.4"
    );
}

#[test]
fn round_robin_continues_after_last_allocated_and_wraps() {
    let mut pool = mk_pool(&[mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.13", "")]);
    assert_eq!(alloc(&mut pool, "ns/a"), "10.0.0.10");
    assert_eq!(alloc(&mut pool, "ns/b"), "10.0.0.11");
    pool.release("ns/a");
    // Not .10 again: the cursor is after .11.
    assert_eq!(alloc(&mut pool, "ns/c"), "10.0.0.12");
    assert_eq!(alloc(&mut pool, "ns/d"), "10.0.0.13");
    // Wraps to the start and finds the released .10 (history of another id is not protected).
    assert_eq!(alloc(&mut pool, "ns/e"), "10.0.0.10");
    assert_eq!(pool.history_of("ns/a"), Vec::<IpAddr>::new());
}

#[test]
fn last_allocated_itself_is_tried_last() {
    let mut pool = mk_pool(&[mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.12", "")]);
    for id in ["ns/a", "ns/b", "ns/c"] {
        alloc(&mut pool, id);
    }
    // Cursor at .12; free .12 and .10: the scan after .12 wraps to .10 before .12.
    pool.release("ns/c");
    pool.release("ns/a");
    assert_eq!(alloc(&mut pool, "ns/x"), "10.0.0.10");
    assert_eq!(alloc(&mut pool, "ns/y"), "10.0.0.12");
}

#[test]
fn ranges_are_walked_in_spec_order_not_address_order() {
    let mut pool = mk_pool(&[
        mk_range("10.0.1.0/24", "10.0.1.5", "10.0.1.6", ""),
        mk_range("10.0.0.0/24", "10.0.0.5", "10.0.0.6", ""),
    ]);
    let got: Vec<String> = ["a", "b", "c", "d"]
        .iter()
        .map(|id| alloc(&mut pool, id))
        .collect();
    assert_eq!(got, ["10.0.1.5", "10.0.1.6", "10.0.0.5", "10.0.0.6"]);
}

#[test]
fn only_a_range_s_own_gateway_is_skipped() {
    // The first range's gateway (.1) lies in the second range, where it is an ordinary address,
    // as in upstream's per-range iterator and per-range total.
    let mut pool = mk_pool(&[
        mk_range("10.0.0.0/24", "10.0.0.20", "10.0.0.20", ""),
        mk_range("10.0.0.0/24", "10.0.0.1", "10.0.0.2", "10.0.0.2"),
    ]);
    assert_eq!(pool.total(), 2);
    assert_eq!(alloc(&mut pool, "a"), "10.0.0.20");
    assert_eq!(alloc(&mut pool, "b"), "10.0.0.1");
    assert!(pool.allocate("c").is_err());
}

#[test]
fn history_gives_the_same_address_back() {
    let mut pool = mk_pool(&[mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.20", "")]);
    assert_eq!(alloc(&mut pool, "default/lb1"), "10.0.0.10");
    assert_eq!(alloc(&mut pool, "default/lb2"), "10.0.0.11");
    assert_eq!(pool.release("default/lb1"), vec![mk_ip("10.0.0.10")]);
    assert_eq!(pool.history_of("default/lb1"), vec![mk_ip("10.0.0.10")]);
    let again = pool.allocate("default/lb1").expect("allocates");
    assert_eq!(
        (again.ip, again.origin),
        (mk_ip("10.0.0.10"), Origin::History)
    );
    assert!(pool.history_of("default/lb1").is_empty());
    assert_eq!(pool.last_allocated(), Some(mk_ip("10.0.0.10")));
}

#[test]
fn holding_id_gets_its_address_back_without_error() {
    let mut pool = mk_pool(&[mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.20", "")]);
    let first = pool.allocate("default/lb1").expect("allocates");
    let again = pool.allocate("default/lb1").expect("idempotent");
    assert_eq!((again.ip, again.origin), (first.ip, Origin::Held));
    assert_eq!(pool.in_use(), 1);
}

#[test]
fn unusable_history_falls_back_to_a_fresh_address() {
    let mut pool = mk_pool(&[mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.20", "")]);
    alloc(&mut pool, "ns/a");
    let b = alloc(&mut pool, "ns/b");
    pool.release("ns/b");
    // Shrink the pool so that .11 is gone; the history entry goes with it.
    pool.resize(&[
        mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.10", ""),
        mk_range("10.0.1.0/24", "10.0.1.10", "10.0.1.20", ""),
    ])
    .expect("resizes");
    assert_eq!(b, "10.0.0.11");
    assert!(pool.history_of("ns/b").is_empty());
    let again = pool.allocate("ns/b").expect("fresh");
    assert_eq!(
        (again.ip.to_string().as_str(), again.origin),
        ("10.0.1.10", Origin::Fresh)
    );
}

#[test]
fn requested_addresses_fail_clearly() {
    let mut pool = mk_pool(&[mk_range("10.0.0.0/24", "10.0.0.1", "10.0.0.20", "")]);
    let cause = |pool: &mut PoolAllocator, id: &str, ip: &str| match pool.allocate_ip(id, mk_ip(ip))
    {
        Err(PoolError::Allocate { source, .. }) => source.to_string(),
        other => panic!("expected an allocation error, got {other:?}"),
    };
    assert_eq!(
        cause(&mut pool, "ns/a", "10.0.0.30"),
        "10.0.0.30 not in range set 10.0.0.1-10.0.0.20"
    );
    assert_eq!(
        cause(&mut pool, "ns/a", "fd00::1"),
        "fd00::1 not in range set 10.0.0.1-10.0.0.20"
    );
    assert_eq!(
        cause(&mut pool, "ns/a", "10.0.0.1"),
        "requested ip 10.0.0.1 is subnet's gateway"
    );
    let got = pool.allocate_ip("ns/a", mk_ip("10.0.0.7")).expect("free");
    assert_eq!(got.origin, Origin::Requested);
    assert_eq!(got.mask.to_string(), "255.255.255.0");
    assert_eq!(got.gateway, Some(mk_ip("10.0.0.1")));
    assert_eq!(
        cause(&mut pool, "ns/b", "10.0.0.7"),
        "requested IP address 10.0.0.7 is not available in range set 10.0.0.1-10.0.0.20"
    );
    assert_eq!(
        pool.allocate_ip("ns/a", mk_ip("10.0.0.7"))
            .expect("held")
            .origin,
        Origin::Held
    );
    assert_eq!(
        cause(&mut pool, "ns/a", "10.0.0.8"),
        "10.0.0.7 has been allocated to ns/a, duplicate allocation is not allowed"
    );
    // The cursor follows requested addresses too, as upstream's Reserve does.
    assert_eq!(alloc(&mut pool, "ns/c"), "10.0.0.8");
}

#[test]
fn resize_grows_keeps_and_refuses_to_strand() {
    let mut pool = mk_pool(&[mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.11", "")]);
    alloc(&mut pool, "a");
    alloc(&mut pool, "b");
    assert!(pool.allocate("c").is_err());
    pool.resize(&[mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.20", "")])
        .expect("grows");
    assert_eq!((pool.total(), pool.available()), (11, 9));
    assert_eq!(alloc(&mut pool, "c"), "10.0.0.12");
    let err = pool
        .resize(&[mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.11", "")])
        .expect_err("would strand .12");
    assert_eq!(err.to_string(), "allocated IP 10.0.0.12 is excluded");
    let err = pool
        .resize(&[mk_range(
            "10.0.0.0/24",
            "10.0.0.10",
            "10.0.0.20",
            "10.0.0.11",
        )])
        .expect_err("would make .11 the gateway");
    assert_eq!(err.to_string(), "allocated IP 10.0.0.11 is excluded");
    let err = pool.resize(&[]).expect_err("empty");
    assert_eq!(
        err.to_string(),
        "invalid ranges for IP pool pool1: range can't be empty"
    );
    // A failed resize changes nothing.
    assert_eq!((pool.total(), pool.available()), (11, 8));
}

#[test]
fn ipv6_slash_64_allocates_near_the_top_of_the_space() {
    let mut pool = mk_pool(&[mk_range(
        "2001:db8::/64",
        "2001:db8::ffff:ffff:ffff:fffe",
        "",
        "",
    )]);
    assert_eq!(pool.total(), 2);
    assert_eq!(alloc(&mut pool, "a"), "2001:db8::ffff:ffff:ffff:fffe");
    assert_eq!(alloc(&mut pool, "b"), "2001:db8::ffff:ffff:ffff:ffff");
    assert!(pool.allocate("c").is_err());

    let mut top = mk_pool(&[mk_range(
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120",
        "",
        "",
        "",
    )]);
    let mut last = String::new();
    for i in 0..254 {
        last = alloc(&mut top, &format!("ns/{i}"));
    }
    assert_eq!(last, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff");
    assert!(top.allocate("ns/full").is_err());
    top.release("ns/7");
    assert_eq!(
        alloc(&mut top, "ns/again"),
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff09"
    );
}

#[test]
fn addrs_stay_sorted_and_collapse_back_to_one() {
    let mut addrs = Addrs::One(5);
    addrs.insert(5);
    assert_eq!(addrs, Addrs::One(5));
    addrs.insert(3);
    addrs.insert(9);
    assert_eq!(addrs.as_slice(), [3, 5, 9]);
    assert!(!addrs.remove(5));
    assert!(!addrs.remove(3));
    assert_eq!(addrs, Addrs::One(9));
    assert!(!addrs.remove(1));
    assert!(addrs.remove(9));
}

#[test]
fn runs_coalesce_and_split() {
    let mut pool = mk_pool(&[mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.20", "")]);
    for id in ["a", "b", "c", "d"] {
        alloc(&mut pool, id);
    }
    assert_eq!(pool.runs.len(), 1);
    pool.release("b");
    assert_eq!(pool.runs.len(), 2);
    alloc(&mut pool, "b");
    assert_eq!(pool.runs.len(), 1);
}

// pkg/ipam/rangeset.go and the CNI host-local iterator it drives: the ranges of a pool are walked
// in spec order whatever their family, and the scan wraps from the last range to the first.
#[test]
fn a_pool_of_both_families_is_walked_in_spec_order_and_wraps() {
    let mut pool = mk_pool(&[
        mk_range("fd00::/120", "fd00::10", "fd00::11", ""),
        mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.10", ""),
    ]);
    assert_eq!(pool.total(), 3);
    assert_eq!(alloc(&mut pool, "ns/a"), "fd00::10");
    assert_eq!(alloc(&mut pool, "ns/b"), "fd00::11");
    let v4 = pool.allocate("ns/c").expect("allocates");
    assert_eq!(
        (v4.ip.to_string(), v4.mask.to_string(), v4.prefix_len),
        ("10.0.0.10".to_string(), "255.255.255.0".to_string(), 24)
    );
    assert_eq!(v4.gateway, Some(mk_ip("10.0.0.1")));
    pool.release("ns/a");
    // After the IPv4 range, the scan wraps to the IPv6 one.
    assert_eq!(alloc(&mut pool, "ns/d"), "fd00::10");
    assert_eq!(pool.holder(mk_ip("10.0.0.10")), Some("ns/c"));
    // IPv4-mapped text names the IPv4 address, as Go's net.ParseIP reads it.
    assert_eq!(pool.holder(mk_ip("::ffff:10.0.0.10")), Some("ns/c"));
    assert_eq!(pool.holder(mk_ip("::a00:a")), None);

    // The status keeps both families, and reads back to the same pool.
    let mut status = crate::status::PoolStatus::default();
    pool.write_status(&mut status);
    assert_eq!(
        status.allocated.get("10.0.0.10").map(String::as_str),
        Some("ns/c")
    );
    assert_eq!(
        status.allocated.get("fd00::11").map(String::as_str),
        Some("ns/b")
    );
    assert_eq!(status.last_allocated, "fd00::10");
    let specs = [
        mk_range("fd00::/120", "fd00::10", "fd00::11", ""),
        mk_range("10.0.0.0/24", "10.0.0.10", "10.0.0.10", ""),
    ];
    let restored = PoolAllocator::from_status("pool1", &specs, &status).expect("restores");
    assert_eq!(restored.in_use(), 3);
    assert_eq!(restored.available(), 0);
    assert!(restored.strays().is_empty());
}

// pkg/webhook/ippool/validator.go (checkAllocated) lets an update make an allocated address the
// gateway; the holder keeps it. Upstream's pool controller then reports `available` as
// total - len(allocated) (pkg/controller/ippool/controller.go), which can go negative; ours counts
// only held addresses the pool could hand out, and lists the gateway one as a stray.
#[test]
fn an_allocated_address_that_became_the_gateway_stays_held() {
    let status = crate::status::PoolStatus {
        allocated: [
            ("10.0.0.10".to_string(), "ns/a".to_string()),
            ("10.0.0.11".to_string(), "ns/b".to_string()),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    };
    let specs = [mk_range(
        "10.0.0.0/24",
        "10.0.0.10",
        "10.0.0.11",
        "10.0.0.10",
    )];
    let mut pool = PoolAllocator::from_status("pool1", &specs, &status).expect("restores");
    assert_eq!((pool.total(), pool.in_use(), pool.available()), (1, 1, 0));
    assert_eq!(pool.holder(mk_ip("10.0.0.10")), Some("ns/a"));
    assert_eq!(
        pool.strays(),
        vec![("10.0.0.10".to_string(), "ns/a".to_string())]
    );
    assert!(pool.allocate("ns/c").is_err(), "nothing left to hand out");
}

#[test]
fn a_requested_address_moves_only_onto_a_free_one() {
    let mut pool = mk_pool(&[mk_range("192.168.0.0/24", "", "192.168.0.20", "")]);
    let a = pool
        .request_ip("default/a", mk_ip("192.168.0.10"))
        .expect("free");
    assert_eq!((a.ip, a.origin), (mk_ip("192.168.0.10"), Origin::Requested));
    assert_eq!(alloc(&mut pool, "default/b"), "192.168.0.11");
    // Held by another: refused, and the mover keeps what it has.
    let err = pool
        .request_ip("default/a", mk_ip("192.168.0.11"))
        .expect_err("held");
    assert!(matches!(
        err,
        PoolError::Allocate {
            source: AllocateError::Taken { ref holder, .. },
            ..
        } if holder == "default/b"
    ));
    assert_eq!(pool.address_of("default/a"), Some(mk_ip("192.168.0.10")));
    // Free: it moves, and the old address goes into its history.
    pool.request_ip("default/a", mk_ip("192.168.0.15"))
        .expect("free");
    assert_eq!(pool.address_of("default/a"), Some(mk_ip("192.168.0.15")));
    assert_eq!(pool.holder(mk_ip("192.168.0.10")), None);
    assert_eq!(pool.history_of("default/a"), vec![mk_ip("192.168.0.10")]);
    assert_eq!(pool.in_use(), 2);
    // Another id's history is free to ask for.
    pool.request_ip("default/c", mk_ip("192.168.0.10"))
        .expect("history is no hold");
    assert_eq!(pool.holder(mk_ip("192.168.0.10")), Some("default/c"));
    assert!(pool.history_of("default/a").is_empty());
}

#[test]
fn a_family_takes_only_ranges_of_that_family() {
    let mut pool = mk_pool(&[
        mk_range("192.168.0.0/24", "192.168.0.10", "192.168.0.11", ""),
        mk_range("fd00::/64", "fd00::10", "fd00::11", ""),
    ]);
    let six = pool
        .allocate_family("default/six", Some(Family::V6))
        .expect("an IPv6 address");
    assert_eq!(six.ip, mk_ip("fd00::10"));
    let four = pool
        .allocate_family("default/four", Some(Family::V4))
        .expect("an IPv4 address");
    assert_eq!(four.ip, mk_ip("192.168.0.10"));
    pool.allocate_family("default/six2", Some(Family::V6))
        .expect("the last IPv6 address");
    let err = pool
        .allocate_family("default/six3", Some(Family::V6))
        .expect_err("no IPv6 address left");
    assert!(
        err.to_string().contains("no IP addresses available"),
        "{err}"
    );
    // The IPv4 range still has one.
    assert_eq!(
        pool.allocate_family("default/four2", None)
            .expect("any family")
            .ip,
        mk_ip("192.168.0.11")
    );
}

// --- Pools that skip addresses (ours) -------------------------------------------------------------

fn mk_skipping(ranges: &[RangeSpec], skip: &str) -> PoolAllocator {
    let mut pool = mk_pool(ranges);
    pool.set_skip(Skip::parse(skip).expect("valid skip"));
    pool
}

#[test]
fn dot0_and_255_are_never_handed_out() {
    let mut pool = mk_skipping(
        &[mk_range("10.0.0.0/23", "10.0.0.253", "10.0.1.2", "")],
        "dot0And255",
    );
    // Upstream's counts: six addresses, none a gateway (10.0.0.1 lies outside the range).
    assert_eq!((pool.total(), pool.available()), (6, 6));
    assert_eq!((pool.capacity(), pool.free()), (4, 4));
    let got: Vec<String> = ["a", "b", "c", "d"]
        .iter()
        .map(|id| alloc(&mut pool, id))
        .collect();
    assert_eq!(got, ["10.0.0.253", "10.0.0.254", "10.0.1.1", "10.0.1.2"]);
    assert_eq!((pool.available(), pool.free()), (2, 0));
    let err = pool.allocate("e").expect_err("nothing left to hand out");
    assert_eq!(
        err.to_string(),
        "fail to get ip from pool pool1, error: no IP addresses available in range set: 10.0.0.253-10.0.1.2"
    );
    // The status is what upstream's controller writes for the same allocations.
    let plain = {
        let mut plain = mk_pool(&[mk_range("10.0.0.0/23", "10.0.0.253", "10.0.1.2", "")]);
        for (id, ip) in ["a", "b", "c", "d"].iter().zip(&got) {
            plain.request_ip(id, mk_ip(ip)).expect("free");
        }
        plain
    };
    assert_eq!(pool.status(), plain.status());
}

#[test]
fn first_last_skips_the_last_address_of_an_ipv6_subnet() {
    let mut pool = mk_skipping(&[mk_range("fd00::/126", "fd00::2", "", "")], "firstLast");
    // fd00::2 and fd00::3 (the subnet's last address, the default end); the gateway fd00::1 is
    // outside the range.
    assert_eq!((pool.total(), pool.capacity()), (2, 1));
    assert_eq!(alloc(&mut pool, "a"), "fd00::2");
    assert!(pool.allocate("b").is_err());
    let err = pool.request_ip("b", mk_ip("fd00::3")).expect_err("skipped");
    assert_eq!(
        err.to_string(),
        "fail to get ip from pool pool1, error: requested IP address fd00::3 is skipped by the pool's annotation loadbalancer.harvesterhci.io/skipAddresses: firstLast"
    );
    // A /31 is point to point: both its addresses are hosts.
    let mut p2p = mk_skipping(&[mk_range("10.0.0.4/31", "", "", "")], "firstLast");
    assert_eq!(p2p.capacity(), p2p.total());
    assert_eq!(alloc(&mut p2p, "a"), "10.0.0.4");
}

#[test]
fn an_address_held_before_the_pool_skipped_it_stays_held_and_is_not_handed_out_again() {
    let mut pool = mk_pool(&[mk_range("10.0.0.0/16", "10.0.0.254", "10.0.1.1", "")]);
    assert_eq!(alloc(&mut pool, "ns/a"), "10.0.0.254");
    assert_eq!(alloc(&mut pool, "ns/b"), "10.0.0.255");
    assert_eq!(alloc(&mut pool, "ns/c"), "10.0.1.0");
    let before = pool.status();
    pool.set_skip(Skip::parse("dot0And255").expect("valid"));
    // Nothing churns: each id keeps its address, asked for as any or exactly.
    assert_eq!(alloc(&mut pool, "ns/b"), "10.0.0.255");
    let held = pool.request_ip("ns/c", mk_ip("10.0.1.0")).expect("kept");
    assert_eq!(held.origin, Origin::Held);
    assert_eq!(pool.status(), before);
    assert_eq!((pool.total(), pool.available()), (4, 1));
    assert_eq!((pool.capacity(), pool.free()), (2, 1));
    // Another id may not take a skipped address, held or not.
    let err = pool
        .request_ip("ns/d", mk_ip("10.0.0.255"))
        .expect_err("skipped");
    assert!(matches!(
        err,
        PoolError::Allocate {
            source: AllocateError::Skipped { .. },
            ..
        }
    ));
    // Released, a skipped address goes to the history (as upstream keeps it) but its last holder
    // gets a fresh address.
    pool.release("ns/b");
    assert_eq!(pool.history_of("ns/b"), vec![mk_ip("10.0.0.255")]);
    assert_eq!((pool.available(), pool.free()), (2, 1));
    assert_eq!(alloc(&mut pool, "ns/b"), "10.0.1.1");
    assert_eq!((pool.capacity(), pool.free()), (2, 0));
    pool.release("ns/c");
    assert_eq!((pool.available(), pool.free()), (2, 0));
    assert!(pool.allocate("ns/e").is_err());
    // Rebuilt from its status with the same skip, the pool is the same.
    let mut rebuilt = PoolAllocator::from_status(
        "pool1",
        &[mk_range("10.0.0.0/16", "10.0.0.254", "10.0.1.1", "")],
        &pool.status(),
    )
    .expect("restores");
    rebuilt.set_skip(pool.skip());
    assert_eq!(rebuilt, pool);
}

#[test]
fn resizing_keeps_what_the_pool_skips() {
    let mut pool = mk_skipping(
        &[mk_range("10.0.0.0/16", "10.0.0.250", "10.0.0.254", "")],
        "dot0And255",
    );
    assert_eq!(pool.capacity(), 5);
    pool.resize(&[mk_range("10.0.0.0/16", "10.0.0.250", "10.0.1.5", "")])
        .expect("grows");
    assert_eq!((pool.total(), pool.capacity()), (12, 10));
    assert_eq!(pool.skip().to_string(), "dot0And255");
}
