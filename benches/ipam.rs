//! IPAM bench: this crate's allocator and pool selection next to straightforward upstream-style
//! baselines written here, on the four scenarios of issue 4.
//!
//! Baselines:
//! - `upstream`: Harvester's algorithm as the reference describes it, on the status maps it keeps
//!   (IP text -> id): `Get(id)` scans `allocatedHistory` for the id, scans `allocated` for the id (the
//!   duplicate guard), then walks from `lastAllocated` + 1, formatting each candidate and looking it
//!   up; `Release(id)` scans `allocated`. The API round trips (DeepCopy, Update) are left out.
//! - `walk-only`: the same walk with the per-id scans replaced by reverse maps and integer keys, to
//!   show what the address walk alone costs.
//!
//! Run: `cargo bench --bench ipam`.

use std::collections::HashMap;
use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use harvester_cloud::ipam::{
    LbRequest, PoolAllocator, PoolEntry, PoolIndex, PoolSpec, PoolStatus, RangeSpec, Selector,
    Tuple, WorkloadType, select_pool,
};

const SUBNET: &str = "10.0.0.0/16";
/// Hosts of the /16 less the gateway.
const USABLE: usize = 65_533;

fn slash16() -> Vec<RangeSpec> {
    vec![RangeSpec {
        subnet: SUBNET.into(),
        ..RangeSpec::default()
    }]
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("default/{prefix}-{i}")).collect()
}

/// xorshift64*: deterministic and dependency-free.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n as u64) as usize
    }
}

/// The one IPv4 range of the bench: start, end, gateway.
#[derive(Clone, Copy)]
struct Range {
    start: u32,
    end: u32,
    gateway: u32,
}

fn bench_range() -> Range {
    let base = u32::from(Ipv4Addr::new(10, 0, 0, 0));
    Range {
        start: base + 1,
        end: base + 65_534,
        gateway: base + 1,
    }
}

/// CNI's range iterator over one range: from `last` + 1 (or the start), wrapping, `last` tried last,
/// the gateway skipped.
fn walk(range: Range, last: Option<u32>, mut taken: impl FnMut(u32) -> bool) -> Option<u32> {
    let first = match last {
        Some(l) if (range.start..=range.end).contains(&l) => {
            if l == range.end {
                range.start
            } else {
                l + 1
            }
        }
        _ => range.start,
    };
    let mut cur = first;
    loop {
        if cur != range.gateway && !taken(cur) {
            return Some(cur);
        }
        cur = if cur == range.end {
            range.start
        } else {
            cur + 1
        };
        if cur == first {
            return None;
        }
    }
}

/// The upstream algorithm on the status maps.
#[derive(Clone)]
struct Upstream {
    range: Range,
    allocated: HashMap<String, String>,
    history: HashMap<String, String>,
    last: String,
}

impl Upstream {
    fn new() -> Self {
        Upstream {
            range: bench_range(),
            allocated: HashMap::new(),
            history: HashMap::new(),
            last: String::new(),
        }
    }

    fn from_status(status: &PoolStatus) -> Self {
        let range = bench_range();
        let in_range = |ip: &str| {
            ip.parse::<Ipv4Addr>()
                .is_ok_and(|a| (range.start..=range.end).contains(&u32::from(a)))
        };
        Upstream {
            range,
            allocated: status
                .allocated
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            history: status
                .allocated_history
                .iter()
                .filter(|(ip, _)| in_range(ip))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            last: status.last_allocated.clone(),
        }
    }

    fn reserve(&mut self, id: &str, ip: String) -> Option<Ipv4Addr> {
        if self.allocated.contains_key(&ip) {
            return None;
        }
        self.history.remove(&ip);
        self.last = ip.clone();
        let addr = ip.parse().ok();
        self.allocated.insert(ip, id.into());
        addr
    }

    fn get(&mut self, id: &str) -> Option<Ipv4Addr> {
        let remembered = self
            .history
            .iter()
            .find(|(_, v)| v.as_str() == id)
            .map(|(k, _)| k.clone());
        if let Some(ip) = remembered {
            return self.reserve(id, ip);
        }
        let range = self.range;
        let duplicate = self.allocated.iter().any(|(ip, v)| {
            v.as_str() == id
                && ip
                    .parse::<Ipv4Addr>()
                    .is_ok_and(|a| (range.start..=range.end).contains(&u32::from(a)))
        });
        if duplicate {
            return None;
        }
        let last = self.last.parse::<Ipv4Addr>().ok().map(u32::from);
        let allocated = &self.allocated;
        let free = walk(range, last, |cur| {
            allocated.contains_key(&Ipv4Addr::from(cur).to_string())
        })?;
        self.reserve(id, Ipv4Addr::from(free).to_string())
    }

    fn release(&mut self, id: &str) {
        let mine: Vec<String> = self
            .allocated
            .iter()
            .filter(|(_, v)| v.as_str() == id)
            .map(|(k, _)| k.clone())
            .collect();
        for ip in mine {
            if let Some(holder) = self.allocated.remove(&ip) {
                self.history.insert(ip, holder);
            }
        }
    }
}

/// The walk alone: integer keys and reverse maps make the per-id work O(1).
#[derive(Clone)]
struct WalkOnly {
    range: Range,
    allocated: HashMap<u32, String>,
    by_id: HashMap<String, u32>,
    history: HashMap<u32, String>,
    history_by_id: HashMap<String, u32>,
    last: Option<u32>,
}

impl WalkOnly {
    fn new() -> Self {
        WalkOnly {
            range: bench_range(),
            allocated: HashMap::new(),
            by_id: HashMap::new(),
            history: HashMap::new(),
            history_by_id: HashMap::new(),
            last: None,
        }
    }

    fn from_status(status: &PoolStatus) -> Self {
        let mut pool = WalkOnly::new();
        let parse = |ip: &str| ip.parse::<Ipv4Addr>().ok().map(u32::from);
        for (ip, id) in &status.allocated {
            if let Some(a) = parse(ip) {
                pool.allocated.insert(a, id.clone());
                pool.by_id.insert(id.clone(), a);
            }
        }
        for (ip, id) in &status.allocated_history {
            if let Some(a) = parse(ip).filter(|a| (pool.range.start..=pool.range.end).contains(a)) {
                pool.history.insert(a, id.clone());
                pool.history_by_id.insert(id.clone(), a);
            }
        }
        pool.last = parse(&status.last_allocated);
        pool
    }

    fn reserve(&mut self, id: &str, a: u32) -> Option<u32> {
        if let Some(old) = self.history.remove(&a) {
            self.history_by_id.remove(&old);
        }
        self.allocated.insert(a, id.into());
        self.by_id.insert(id.into(), a);
        self.last = Some(a);
        Some(a)
    }

    fn get(&mut self, id: &str) -> Option<u32> {
        if let Some(&a) = self.by_id.get(id) {
            return Some(a);
        }
        if let Some(a) = self.history_by_id.remove(id)
            && !self.allocated.contains_key(&a)
        {
            return self.reserve(id, a);
        }
        let allocated = &self.allocated;
        let free = walk(self.range, self.last, |cur| allocated.contains_key(&cur))?;
        self.reserve(id, free)
    }

    fn release(&mut self, id: &str) {
        if let Some(a) = self.by_id.remove(id)
            && let Some(holder) = self.allocated.remove(&a)
        {
            self.history_by_id.insert(holder.clone(), a);
            self.history.insert(a, holder);
        }
    }
}

fn fill(c: &mut Criterion) {
    let ids = ids("fill", USABLE);
    let mut group = c.benchmark_group("fill_slash16");
    group.sample_size(10).warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("ipam", |b| {
        b.iter_batched(
            || PoolAllocator::new("bench", &slash16()).expect("valid"),
            |mut pool| {
                for id in &ids {
                    black_box(pool.allocate(id).expect("fits"));
                }
                pool
            },
            BatchSize::PerIteration,
        )
    });
    group.bench_function("walk-only", |b| {
        b.iter_batched(
            WalkOnly::new,
            |mut pool| {
                for id in &ids {
                    black_box(pool.get(id).expect("fits"));
                }
                pool
            },
            BatchSize::PerIteration,
        )
    });
    // Quadratic (each Get scans every allocation): one fill takes over a minute, so it only runs
    // when asked for.
    if std::env::var_os("IPAM_BENCH_UPSTREAM_FILL").is_some() {
        group.measurement_time(Duration::from_secs(60));
        group.bench_function("upstream", |b| {
            b.iter_batched(
                Upstream::new,
                |mut pool| {
                    for id in &ids {
                        black_box(pool.get(id).expect("fits"));
                    }
                    pool
                },
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

/// Fills to 99% and churns until the free addresses are spread across the /16, as in a long-lived
/// pool; returns the holders.
fn churn_state<P>(
    pool: &mut P,
    get: fn(&mut P, &str) -> bool,
    release: fn(&mut P, &str),
    rng: &mut Rng,
) -> Vec<String> {
    let target = USABLE * 99 / 100;
    let mut held = ids("held", target);
    for id in &held {
        assert!(get(pool, id), "fill");
    }
    for n in 0..USABLE {
        let gone = held.swap_remove(rng.below(held.len()));
        release(pool, &gone);
        let id = format!("default/warm-{n}");
        assert!(get(pool, &id), "warm-up churn");
        held.push(id);
    }
    held
}

fn churn(c: &mut Criterion) {
    let mut group = c.benchmark_group("churn_slash16_99pct");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    fn step<P>(
        pool: &mut P,
        held: &mut [String],
        rng: &mut Rng,
        n: &mut u64,
        get: fn(&mut P, &str) -> bool,
        release: fn(&mut P, &str),
    ) {
        let slot = rng.below(held.len());
        release(pool, &held[slot]);
        *n += 1;
        held[slot] = format!("default/churn-{n}");
        assert!(get(pool, &held[slot]), "churn");
    }

    {
        let get: fn(&mut PoolAllocator, &str) -> bool = |p, id| p.allocate(id).is_ok();
        let release: fn(&mut PoolAllocator, &str) = |p, id| {
            p.release(id);
        };
        let mut pool = PoolAllocator::new("bench", &slash16()).expect("valid");
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut held = churn_state(&mut pool, get, release, &mut rng);
        let mut n = 0;
        group.bench_function("ipam", |b| {
            b.iter(|| step(&mut pool, &mut held, &mut rng, &mut n, get, release))
        });
    }
    {
        let get: fn(&mut WalkOnly, &str) -> bool = |p, id| p.get(id).is_some();
        let release: fn(&mut WalkOnly, &str) = WalkOnly::release;
        let mut pool = WalkOnly::new();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut held = churn_state(&mut pool, get, release, &mut rng);
        let mut n = 0;
        group.bench_function("walk-only", |b| {
            b.iter(|| step(&mut pool, &mut held, &mut rng, &mut n, get, release))
        });
    }
    {
        let get: fn(&mut Upstream, &str) -> bool = |p, id| p.get(id).is_some();
        let release: fn(&mut Upstream, &str) = Upstream::release;
        // The warm-up churn is built with the walk-only twin (same walk, same choices) and converted,
        // since running it on the quadratic baseline would take minutes.
        let mut twin = WalkOnly::new();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let twin_get: fn(&mut WalkOnly, &str) -> bool = |p, id| p.get(id).is_some();
        let mut held = churn_state(&mut twin, twin_get, WalkOnly::release, &mut rng);
        let mut pool = Upstream::from_status(&walker_status(&twin));
        let mut n = 0;
        group.bench_function("upstream", |b| {
            b.iter(|| step(&mut pool, &mut held, &mut rng, &mut n, get, release))
        });
    }
    group.finish();
}

/// A full /16 where the load balancer created last is deleted and a new one (a new name, so no
/// history) is created: the address freed is right at `lastAllocated`, so a walk has to cross the
/// whole allocated space, wrapping, to find it.
fn churn_full(c: &mut Criterion) {
    let mut group = c.benchmark_group("churn_slash16_full_lifo");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let fill = ids("held", USABLE);

    let mut pool = PoolAllocator::new("bench", &slash16()).expect("valid");
    for id in &fill {
        pool.allocate(id).expect("fits");
    }
    let mut last = fill[USABLE - 1].clone();
    let mut n = 0u64;
    group.bench_function("ipam", |b| {
        b.iter(|| {
            pool.release(&last);
            n += 1;
            last = format!("default/churn-{n}");
            black_box(pool.allocate(&last).expect("the freed address"));
        })
    });

    let mut walker = WalkOnly::new();
    for id in &fill {
        walker.get(id).expect("fits");
    }
    let mut last = fill[USABLE - 1].clone();
    group.bench_function("walk-only", |b| {
        b.iter(|| {
            walker.release(&last);
            n += 1;
            last = format!("default/churn-{n}");
            black_box(walker.get(&last).expect("the freed address"));
        })
    });

    let mut upstream = Upstream::from_status(&walker_status(&walker));
    group.bench_function("upstream", |b| {
        b.iter(|| {
            upstream.release(&last);
            n += 1;
            last = format!("default/churn-{n}");
            black_box(upstream.get(&last).expect("the freed address"));
        })
    });
    group.finish();
}

fn walker_status(walker: &WalkOnly) -> PoolStatus {
    let text = |a: u32| Ipv4Addr::from(a).to_string();
    PoolStatus {
        last_allocated: walker.last.map(text).unwrap_or_default(),
        allocated: walker
            .allocated
            .iter()
            .map(|(a, id)| (text(*a), id.clone()))
            .collect(),
        allocated_history: walker
            .history
            .iter()
            .map(|(a, id)| (text(*a), id.clone()))
            .collect(),
        ..PoolStatus::default()
    }
}

fn rebuild(c: &mut Criterion) {
    // 60,000 holders and 1,000 history entries, as a long-lived /16 would store them.
    let mut pool = PoolAllocator::new("bench", &slash16()).expect("valid");
    for id in ids("lb", 61_000) {
        pool.allocate(&id).expect("fits");
    }
    for id in ids("lb", 1_000) {
        pool.release(&id);
    }
    let status = pool.status();
    assert_eq!(status.allocated.len(), 60_000);

    let mut group = c.benchmark_group("rebuild_60k");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    group.bench_function("ipam", |b| {
        b.iter(|| {
            PoolAllocator::from_status("bench", black_box(&slash16()), black_box(&status))
                .expect("rebuilds")
        })
    });
    group.bench_function("walk-only", |b| {
        b.iter(|| WalkOnly::from_status(black_box(&status)))
    });
    group.bench_function("upstream", |b| {
        b.iter(|| Upstream::from_status(black_box(&status)))
    });
    group.finish();
}

/// 1,000 pools on 50 networks: per network one namespace-only pool (as the UI makes them), one
/// project-wide pool with a priority, and 18 pools for single guest clusters; one global pool.
fn pools() -> Vec<(String, PoolSpec)> {
    let tuple = |p: &str, n: &str, g: &str| Tuple {
        project: p.into(),
        namespace: n.into(),
        guest_cluster: g.into(),
    };
    let mut out = Vec::with_capacity(1_000);
    let mut priority = 0;
    for net in 0..50 {
        let network = format!("default/vlan{net}");
        for k in 0..20u32 {
            let scope = match k {
                0 => vec![tuple("", &format!("ns{net}"), "")],
                1 => vec![tuple(&format!("p-{net}"), "*", "*")],
                _ => vec![tuple(
                    &format!("p-{net}"),
                    &format!("ns{net}"),
                    &format!("c{net}-{k}"),
                )],
            };
            let priority = if k == 1 {
                priority += 1;
                priority
            } else {
                0
            };
            let spec = PoolSpec {
                ranges: vec![RangeSpec {
                    subnet: format!("10.{net}.{k}.0/24"),
                    ..RangeSpec::default()
                }],
                selector: Selector {
                    priority,
                    network: network.clone(),
                    scope,
                },
                ..PoolSpec::default()
            };
            out.push((format!("pool-{net}-{k}"), spec));
        }
    }
    out.pop();
    out.push((
        "global".into(),
        PoolSpec {
            ranges: vec![RangeSpec {
                subnet: "172.16.0.0/16".into(),
                ..RangeSpec::default()
            }],
            selector: Selector {
                scope: vec![tuple("*", "*", "*")],
                ..Selector::default()
            },
            ..PoolSpec::default()
        },
    ));
    out
}

/// A mix: exact guest-cluster hits, project-wide hits, loose namespace-only hits, global fallbacks.
fn requests() -> Vec<LbRequest> {
    (0..100)
        .map(|i| {
            let net = i % 50;
            let guest = |project: String, cluster: String| LbRequest {
                lb_namespace: format!("ns{net}"),
                workload_type: WorkloadType::Cluster,
                network: format!("default/vlan{net}"),
                project,
                cluster,
                ..LbRequest::default()
            };
            match i % 4 {
                0 => guest(format!("p-{net}"), format!("c{net}-{}", 2 + i % 18)),
                1 => guest(format!("p-{net}"), "unknown".into()),
                2 => guest("p-other".into(), "c-other".into()),
                _ => LbRequest {
                    lb_namespace: "elsewhere".into(),
                    network: "default/vlan-none".into(),
                    ..LbRequest::default()
                },
            }
        })
        .collect()
}

/// Upstream's Select, strict with `>=` on priority, the global pool, then loose only without a global
/// pool.
fn upstream_select<'a>(pools: &'a [(String, PoolSpec)], request: &LbRequest) -> Option<&'a str> {
    let requirement = request.requirement();
    let select = |loose: bool| {
        let (mut chosen, mut global, mut priority) = (None, None, 0);
        for (name, spec) in pools {
            if spec.selector.is_global() {
                global = Some(name.as_str());
                continue;
            }
            let matched = if loose {
                spec.selector.matches_loosely(&requirement)
            } else {
                spec.selector.matches(&requirement)
            };
            if matched && spec.selector.priority >= priority {
                chosen = Some(name.as_str());
                priority = spec.selector.priority;
            }
        }
        (chosen, global)
    };
    match select(false) {
        (Some(name), _) => Some(name),
        (None, Some(global)) => Some(global),
        (None, None) if request.workload_type == WorkloadType::Cluster => select(true).0,
        _ => None,
    }
}

fn selection(c: &mut Criterion) {
    let pools = pools();
    let entries: Vec<PoolEntry<'_>> = pools
        .iter()
        .map(|(name, spec)| PoolEntry {
            name,
            spec,
            deleting: false,
            options: Default::default(),
        })
        .collect();
    let index = PoolIndex::new(&entries);
    let requests = requests();

    let mut group = c.benchmark_group("select_1000_pools_x100_requests");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    group.bench_function("ipam-index", |b| {
        b.iter(|| {
            for r in &requests {
                let _ = black_box(index.select(black_box(r)));
            }
        })
    });
    group.bench_function("ipam-linear", |b| {
        b.iter(|| {
            for r in &requests {
                let _ = black_box(select_pool(black_box(&entries), black_box(r)));
            }
        })
    });
    group.bench_function("upstream", |b| {
        b.iter(|| {
            for r in &requests {
                black_box(upstream_select(black_box(&pools), black_box(r)));
            }
        })
    });
    group.finish();
}

criterion_group!(benches, fill, churn, churn_full, rebuild, selection);
criterion_main!(benches);
