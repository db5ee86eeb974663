//! Property test: random pools and random sequences of allocate / request / release / resize /
//! manual release / restart, checked step by step against a naive model of upstream's semantics (a
//! literal address-by-address walk) and against the invariants: no address held twice, never a
//! gateway, never outside the ranges, `available == total - allocated`, and a pool rebuilt from its
//! status equals the live one.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use proptest::prelude::*;

use super::addr::{Family, from_key, key};
use super::allocator::{AllocateError, PoolAllocator, PoolError};
use super::release::{ManualRelease, ManualReleaseOutcome};
use super::spec::RangeSpec;
use super::status::PoolStatus;

/// Every pool lives in one /24-sized block: `10.0.0.0/24`, or the last /120 of the IPv6 space so the
/// arithmetic at `u128::MAX` is exercised.
fn base(family: Family) -> u128 {
    match family {
        Family::V4 => key(std::net::Ipv4Addr::new(10, 0, 0, 0).into()),
        Family::V6 => u128::MAX - 255,
    }
}

fn subnet_text(family: Family) -> String {
    format!("{}/{}", from_key(base(family)), family.bits() - 8)
}

/// Offsets ranges may use: mostly a few addresses at the top of the block, so that pools fill up,
/// wrap and run dry (and IPv6 ranges end at `u128::MAX`), sometimes the whole block.
fn mk_window(family: Family) -> impl Strategy<Value = (u8, u8)> {
    // IPv4 offsets avoid the network (0) and broadcast (255) addresses; IPv6 may use 255.
    let top = if family == Family::V4 { 254u8 } else { 255u8 };
    prop_oneof![
        4 => (2u8..=14).prop_map(move |span| (top - span + 1, top)),
        1 => Just((1u8, top)),
    ]
}

/// A range as offsets in the block; `gateway: None` means the default gateway (offset 1).
#[derive(Debug, Clone)]
struct MkRange {
    start: u8,
    end: u8,
    gateway: Option<u8>,
    reversed: bool,
}

#[derive(Debug, Clone)]
enum Op {
    Allocate(u8),
    Request(u8, u8),
    Release(u8),
    Resize(Vec<MkRange>),
    Manual(u8, u8, bool),
    Restart,
}

fn mk_ranges((low, top): (u8, u8)) -> impl Strategy<Value = Vec<MkRange>> {
    let most = usize::from(top - low).div_ceil(2).clamp(1, 3);
    (1usize..=most)
        .prop_flat_map(move |n| {
            (
                proptest::collection::btree_set(low..=top, 2 * n),
                // An explicit gateway on the last address (IPv6) is refused as its "broadcast".
                proptest::collection::vec(
                    (
                        proptest::option::weighted(0.3, low..=top.min(254)),
                        any::<bool>(),
                    ),
                    n,
                ),
                Just(n),
            )
        })
        .prop_map(|(cuts, extras, _)| {
            let cuts: Vec<u8> = cuts.into_iter().collect();
            cuts.chunks(2)
                .zip(extras)
                .map(|(pair, (gateway, reversed))| MkRange {
                    start: pair[0],
                    end: pair[1],
                    gateway,
                    reversed,
                })
                .collect::<Vec<_>>()
        })
        .prop_shuffle()
}

/// More ids than a small pool has addresses, so ids without history allocate into a fragmented pool.
const IDS: u8 = 24;

fn mk_ops(window: (u8, u8)) -> impl Strategy<Value = Vec<Op>> {
    let near = window.0.saturating_sub(1)..=window.1;
    let op = prop_oneof![
        6 => (0..IDS).prop_map(Op::Allocate),
        2 => (0..IDS, near.clone()).prop_map(|(id, at)| Op::Request(id, at)),
        4 => (0..IDS).prop_map(Op::Release),
        1 => mk_ranges(window).prop_map(Op::Resize),
        1 => (near, 0..IDS, any::<bool>()).prop_map(|(at, id, exists)| Op::Manual(at, id, exists)),
        1 => Just(Op::Restart),
    ];
    proptest::collection::vec(op, 1..80)
}

fn mk_case(family: Family) -> impl Strategy<Value = (Vec<MkRange>, Vec<Op>)> {
    mk_window(family).prop_flat_map(|window| (mk_ranges(window), mk_ops(window)))
}

fn to_specs(family: Family, ranges: &[MkRange]) -> Vec<RangeSpec> {
    let text = |offset: u8| from_key(base(family) + u128::from(offset)).to_string();
    ranges
        .iter()
        .map(|r| {
            let (start, end) = if r.reversed {
                (text(r.end), text(r.start))
            } else {
                (text(r.start), text(r.end))
            };
            // The last IPv6 address may only be the default range end (named, it is refused as the
            // "broadcast" address, as upstream refuses it).
            let (start, end) = if family == Family::V6 && r.end == 255 {
                (text(r.start), String::new())
            } else {
                (start, end)
            };
            RangeSpec {
                range_start: start,
                range_end: end,
                subnet: subnet_text(family),
                gateway: r.gateway.map(text).unwrap_or_default(),
            }
        })
        .collect()
}

fn id(n: u8) -> String {
    format!("ns/lb{n}")
}

/// Upstream's semantics written the obvious way: addresses as offsets, a literal walk.
#[derive(Debug, Clone)]
struct Model {
    /// `(start, end, gateway)` in spec order.
    ranges: Vec<(u8, u8, u8)>,
    held: BTreeMap<u8, String>,
    history: BTreeMap<u8, String>,
    last: Option<u8>,
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Ip(u8),
    Exhausted,
    NotInRange,
    Gateway,
    Taken,
    Duplicate,
}

impl Model {
    fn new(ranges: &[MkRange]) -> Self {
        Model {
            ranges: Self::bounds(ranges),
            held: BTreeMap::new(),
            history: BTreeMap::new(),
            last: None,
        }
    }

    fn bounds(ranges: &[MkRange]) -> Vec<(u8, u8, u8)> {
        ranges
            .iter()
            .map(|r| (r.start, r.end, r.gateway.unwrap_or(1)))
            .collect()
    }

    fn range_of(ranges: &[(u8, u8, u8)], at: u8) -> Option<(u8, u8, u8)> {
        ranges.iter().copied().find(|&(s, e, _)| s <= at && at <= e)
    }

    fn usable_in(ranges: &[(u8, u8, u8)], at: u8) -> bool {
        Self::range_of(ranges, at).is_some_and(|(_, _, gw)| gw != at)
    }

    fn usable(&self, at: u8) -> bool {
        Self::usable_in(&self.ranges, at)
    }

    fn total(&self) -> u128 {
        self.ranges
            .iter()
            .map(|&(s, e, gw)| u128::from(e - s) + 1 - u128::from(s <= gw && gw <= e))
            .sum()
    }

    fn reserve(&mut self, id: &str, at: u8) -> Outcome {
        self.history.remove(&at);
        self.held.insert(at, id.into());
        self.last = Some(at);
        Outcome::Ip(at)
    }

    fn allocate(&mut self, id: &str) -> Outcome {
        if let Some((&at, _)) = self
            .held
            .iter()
            .find(|(at, h)| h.as_str() == id && self.usable(**at))
        {
            return Outcome::Ip(at);
        }
        let remembered = self
            .history
            .iter()
            .find(|(at, h)| h.as_str() == id && self.usable(**at) && !self.held.contains_key(at))
            .map(|(at, _)| *at);
        if let Some(at) = remembered {
            return self.reserve(id, at);
        }
        let order: Vec<(u8, u8)> = self
            .ranges
            .iter()
            .flat_map(|&(s, e, gw)| (s..=e).map(move |a| (a, gw)))
            .collect();
        let begin = self
            .last
            .and_then(|last| order.iter().position(|&(a, _)| a == last))
            .map_or(0, |p| (p + 1) % order.len());
        let found = (0..order.len())
            .map(|k| order[(begin + k) % order.len()])
            .find(|&(a, gw)| a != gw && !self.held.contains_key(&a))
            .map(|(a, _)| a);
        match found {
            Some(at) => self.reserve(id, at),
            None => Outcome::Exhausted,
        }
    }

    fn request(&mut self, id: &str, at: u8) -> Outcome {
        let Some((_, _, gw)) = Self::range_of(&self.ranges, at) else {
            return Outcome::NotInRange;
        };
        if gw == at {
            return Outcome::Gateway;
        }
        match self.held.get(&at) {
            Some(holder) if holder == id => return Outcome::Ip(at),
            Some(_) => return Outcome::Taken,
            None => {}
        }
        if self.held.iter().any(|(a, h)| h == id && self.usable(*a)) {
            return Outcome::Duplicate;
        }
        self.reserve(id, at)
    }

    fn release(&mut self, id: &str) {
        let mine: Vec<u8> = self
            .held
            .iter()
            .filter(|(_, h)| h.as_str() == id)
            .map(|(a, _)| *a)
            .collect();
        for at in mine {
            self.release_at(at);
        }
    }

    fn release_at(&mut self, at: u8) {
        if let Some(holder) = self.held.remove(&at)
            && self.usable(at)
        {
            self.history.insert(at, holder);
        }
    }

    fn resize(&mut self, ranges: &[MkRange]) -> bool {
        let next = Self::bounds(ranges);
        if self.held.keys().any(|&at| !Self::usable_in(&next, at)) {
            return false;
        }
        self.ranges = next;
        let ranges = self.ranges.clone();
        self.history.retain(|at, _| Self::usable_in(&ranges, *at));
        true
    }
}

fn outcome(family: Family, result: Result<super::allocator::Allocation, PoolError>) -> Outcome {
    match result {
        Ok(a) => {
            let (f, value) = (Family::of(a.ip), key(a.ip));
            assert_eq!(f, family);
            Outcome::Ip(u8::try_from(value - base(family)).expect("inside the block"))
        }
        Err(PoolError::Allocate { source, .. }) => match source {
            AllocateError::Exhausted { .. } => Outcome::Exhausted,
            AllocateError::NotInRange { .. } => Outcome::NotInRange,
            AllocateError::Gateway { .. } => Outcome::Gateway,
            AllocateError::Taken { .. } => Outcome::Taken,
            AllocateError::Duplicate { .. } => Outcome::Duplicate,
            AllocateError::Skipped { .. } => panic!("the model's pools skip nothing"),
        },
        Err(other) => panic!("unexpected error {other}"),
    }
}

fn offsets(family: Family, map: &BTreeMap<String, String>) -> BTreeMap<u8, String> {
    map.iter()
        .map(|(ip, id)| {
            let ip = ip.parse::<IpAddr>().expect("status holds addresses");
            let (f, value) = (Family::of(ip), key(ip));
            assert_eq!(f, family);
            (
                u8::try_from(value - base(family)).expect("inside the block"),
                id.clone(),
            )
        })
        .collect()
}

fn check(family: Family, name: &str, specs: &[RangeSpec], live: &PoolAllocator, model: &Model) {
    let status: PoolStatus = live.status();
    let held = offsets(family, &status.allocated);
    assert_eq!(held, model.held, "held addresses");
    assert_eq!(
        offsets(family, &status.allocated_history),
        model.history,
        "history"
    );

    let holders: BTreeSet<&String> = held.values().collect();
    assert_eq!(holders.len(), held.len(), "an id holds two addresses");
    for at in held.keys() {
        assert!(
            model.usable(*at),
            "held address {at} is outside the ranges or a gateway"
        );
    }
    assert_eq!(live.total(), model.total());
    assert_eq!(live.available(), live.total() - held.len() as u128);
    assert_eq!(
        status.available,
        i64::try_from(live.available()).expect("small pool")
    );
    assert_eq!(
        status.last_allocated,
        model
            .last
            .map(|at| from_key(base(family) + u128::from(at)).to_string())
            .unwrap_or_default()
    );

    let rebuilt = PoolAllocator::from_status(name, specs, &status).expect("rebuilds");
    assert_eq!(
        &rebuilt, live,
        "rebuilt allocator differs from the live one"
    );
}

/// A status kept by patches alone, as a store keeps it ([`crate::patch`]): after every step it must
/// be the status written whole, typed and as stored.
struct Patched {
    status: PoolStatus,
    stored: serde_json::Value,
}

impl Patched {
    fn start(live: &mut PoolAllocator) -> Self {
        live.start_journal();
        let status = live.status();
        Patched {
            stored: serde_json::to_value(&status).expect("serialises"),
            status,
        }
    }

    fn follow(&mut self, live: &mut PoolAllocator) {
        match live.patch_status(&mut self.status) {
            Some(patch) => json_patch::merge(&mut self.stored, &patch),
            // A rebuilt allocator (a restart) journals nothing yet: written whole again.
            None => *self = Self::start(live),
        }
        let whole = live.status();
        assert_eq!(self.status, whole, "the patched status");
        assert_eq!(
            self.stored,
            serde_json::to_value(&whole).expect("serialises"),
            "the stored status, patched"
        );
    }
}

fn run(family: Family, ranges: Vec<MkRange>, ops: Vec<Op>) {
    let name = "prop";
    let mut specs = to_specs(family, &ranges);
    let mut live = PoolAllocator::new(name, &specs).expect("valid ranges");
    let mut model = Model::new(&ranges);
    let mut patched = Patched::start(&mut live);
    check(family, name, &specs, &live, &model);
    for op in ops {
        match op {
            Op::Allocate(n) => {
                let got = outcome(family, live.allocate(&id(n)));
                assert_eq!(got, model.allocate(&id(n)), "allocate {}", id(n));
            }
            Op::Request(n, at) => {
                let ip = from_key(base(family) + u128::from(at));
                let got = outcome(family, live.allocate_ip(&id(n), ip));
                assert_eq!(got, model.request(&id(n), at), "request {ip} for {}", id(n));
            }
            Op::Release(n) => {
                live.release(&id(n));
                model.release(&id(n));
            }
            Op::Resize(next) => {
                let next_specs = to_specs(family, &next);
                let before = live.clone();
                let accepted = live.resize(&next_specs).is_ok();
                assert_eq!(accepted, model.resize(&next), "resize to {next:?}");
                if accepted {
                    specs = next_specs;
                } else {
                    assert_eq!(live, before, "a refused resize changed the pool");
                }
            }
            Op::Manual(at, n, exists) => {
                let ip = from_key(base(family) + u128::from(at));
                let request =
                    ManualRelease::parse(&format!("{ip}: {}", id(n))).expect("valid annotation");
                let got = live.manual_release(&request, exists);
                let holder = model.held.get(&at).cloned();
                let want = match holder {
                    None => ManualReleaseOutcome::NotAllocated,
                    Some(h) if h != id(n) => ManualReleaseOutcome::HeldByOther { holder: h },
                    Some(_) if exists => ManualReleaseOutcome::LoadBalancerExists,
                    Some(_) => {
                        model.release_at(at);
                        ManualReleaseOutcome::Released
                    }
                };
                assert_eq!(got, want);
            }
            Op::Restart => {
                live = PoolAllocator::from_status(name, &specs, &live.status()).expect("rebuilds");
            }
        }
        patched.follow(&mut live);
        check(family, name, &specs, &live, &model);
    }
}

proptest! {
    // Each case runs up to 80 steps, each rebuilding the pool from its status: 64 cases per family
    // keep the whole suite within seconds in a debug build.
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn ipv4_pools_behave_like_the_model((ranges, ops) in mk_case(Family::V4)) {
        run(Family::V4, ranges, ops);
    }

    #[test]
    fn ipv6_pools_at_the_top_of_the_space_behave_like_the_model((ranges, ops) in mk_case(Family::V6)) {
        run(Family::V6, ranges, ops);
    }
}

// --- Pools that skip addresses --------------------------------------------------------------------

/// What a skipping pool may do, on one range across /24 boundaries (`10.0.0.250` to `10.0.2.5` of
/// a /16, or the IPv6 range up to the last address of its /120, whose last address `firstLast`
/// skips), with the skip changing between steps.
#[derive(Debug, Clone)]
enum SkipOp {
    Allocate(u8),
    Request(u8, u16),
    Release(u8),
    Skip(u8),
    Restart,
}

fn mk_skip_ops(span: u16) -> impl Strategy<Value = Vec<SkipOp>> {
    let op = prop_oneof![
        6 => (0..IDS).prop_map(SkipOp::Allocate),
        2 => (0..IDS, 0..span).prop_map(|(id, at)| SkipOp::Request(id, at)),
        3 => (0..IDS).prop_map(SkipOp::Release),
        1 => (0u8..4).prop_map(SkipOp::Skip),
        1 => Just(SkipOp::Restart),
    ];
    proptest::collection::vec(op, 1..80)
}

fn skip_of(n: u8) -> super::skip::Skip {
    let value = ["", "firstLast", "dot0And255", "firstLast,dot0And255"][usize::from(n % 4)];
    super::skip::Skip::parse(value).expect("valid")
}

/// The invariants, address by address: a fresh, remembered or requested address is never one the
/// pool skips; one is found whenever one is free; the status is upstream's (skipped addresses
/// counted); `capacity` and `free` are the walked counts; and a pool rebuilt from its status with
/// the same skip equals the live one.
fn run_skipping(family: Family, ops: Vec<SkipOp>) {
    let (spec, first, span) = match family {
        Family::V4 => (
            RangeSpec {
                subnet: "10.0.0.0/16".into(),
                range_start: "10.0.0.250".into(),
                range_end: "10.0.2.5".into(),
                gateway: String::new(),
            },
            key("10.0.0.250".parse().expect("ip")),
            268u16,
        ),
        Family::V6 => (
            RangeSpec {
                subnet: subnet_text(Family::V6),
                range_start: from_key(base(Family::V6) + 240).to_string(),
                ..RangeSpec::default()
            },
            base(Family::V6) + 240,
            16u16,
        ),
    };
    let specs = [spec];
    let at = |offset: u16| first + u128::from(offset);
    let mut skip = super::skip::Skip::NONE;
    let mut live = PoolAllocator::new("skip", &specs).expect("valid");
    let subnet = live.ranges().ranges()[0].subnet();
    let skipped = |skip: super::skip::Skip, value: u128| skip.skips(&subnet, value);
    let mut patched = Patched::start(&mut live);
    for op in ops {
        let before: BTreeMap<String, String> = live.status().allocated;
        let held_by = |id: &str, value: u128| {
            before.get(&from_key(value).to_string()).map(String::as_str) == Some(id)
        };
        match op {
            SkipOp::Allocate(n) => match live.allocate(&id(n)) {
                Ok(a) => assert!(
                    held_by(&id(n), key(a.ip)) || !skipped(skip, key(a.ip)),
                    "{} handed out {} although the pool skips it ({skip})",
                    id(n),
                    a.ip
                ),
                Err(_) => {
                    let free = (0..span).map(at).any(|v| {
                        !skipped(skip, v) && !before.contains_key(&from_key(v).to_string())
                    });
                    assert!(!free, "exhausted with a free address ({skip})");
                }
            },
            SkipOp::Request(n, offset) => {
                let value = at(offset);
                let got = live.request_ip(&id(n), from_key(value));
                if skipped(skip, value) && !held_by(&id(n), value) {
                    assert!(
                        matches!(
                            got,
                            Err(PoolError::Allocate {
                                source: AllocateError::Skipped { .. },
                                ..
                            })
                        ),
                        "{} got skipped {} ({skip}): {got:?}",
                        id(n),
                        from_key(value)
                    );
                }
            }
            SkipOp::Release(n) => {
                live.release(&id(n));
            }
            SkipOp::Skip(n) => {
                skip = skip_of(n);
                live.set_skip(skip);
                assert_eq!(
                    live.status().allocated,
                    before,
                    "a skip change moved nothing"
                );
            }
            SkipOp::Restart => {
                live =
                    PoolAllocator::from_status("skip", &specs, &live.status()).expect("rebuilds");
                live.set_skip(skip);
            }
        }
        patched.follow(&mut live);
        let status = live.status();
        let held: BTreeSet<u128> = status
            .allocated
            .keys()
            .map(|ip| key(ip.parse().expect("an address")))
            .collect();
        let usable: Vec<u128> = (0..span)
            .map(at)
            .filter(|v| live.ranges().usable_value(*v))
            .collect();
        assert_eq!(
            status.total,
            usable.len() as i64,
            "the status counts as upstream"
        );
        assert_eq!(status.available, (usable.len() - held.len()) as i64);
        let hands_out: Vec<u128> = usable.into_iter().filter(|v| !skipped(skip, *v)).collect();
        assert_eq!(
            live.capacity(),
            hands_out.len() as u128,
            "capacity ({skip})"
        );
        assert_eq!(
            live.free(),
            hands_out.iter().filter(|v| !held.contains(v)).count() as u128,
            "free ({skip})"
        );
        let mut rebuilt = PoolAllocator::from_status("skip", &specs, &status).expect("rebuilds");
        rebuilt.set_skip(skip);
        assert_eq!(rebuilt, live, "rebuilt from the status with the same skip");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn ipv4_pools_never_hand_out_what_they_skip(ops in mk_skip_ops(268)) {
        run_skipping(Family::V4, ops);
    }

    #[test]
    fn ipv6_pools_never_hand_out_what_they_skip(ops in mk_skip_ops(16)) {
        run_skipping(Family::V6, ops);
    }
}
