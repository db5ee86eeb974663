//! Which pool a load balancer takes its address from.
//!
//! The order is upstream's (explicit `spec.ipPool`, strict match, global pool, loose match for guest
//! clusters) with two defects fixed: ties between equally prioritised pools go to the lowest name
//! instead of the cache's iteration order, and the loose match runs before the global fallback so that
//! namespace-only pools made in the UI are not shadowed by a global pool. Pools being deleted are
//! never chosen.

use std::collections::HashMap;
use std::fmt;

use super::Family;
use super::spec::{ALL, Families, PoolSpec, Selector, Tuple};

/// What the load balancer asks for, from its annotations (`loadbalancer.harvesterhci.io/network`,
/// `…/project`, `…/namespace`, `…/cluster`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Requirement {
    pub network: String,
    pub project: String,
    pub namespace: String,
    pub cluster: String,
}

/// Printed as Go's `%+v` of a `*Requirement`, which is what the upstream error shows.
impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "&{{Network:{} Project:{} Namespace:{} Cluster:{}}}",
            self.network, self.project, self.namespace, self.cluster
        )
    }
}

/// `spec.workloadType`: anything but `cluster` is a VM load balancer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum WorkloadType {
    #[default]
    Vm,
    Cluster,
}

impl WorkloadType {
    pub fn parse(text: &str) -> Self {
        if text == "cluster" {
            WorkloadType::Cluster
        } else {
            WorkloadType::Vm
        }
    }
}

/// The parts of a LoadBalancer that pool selection reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LbRequest {
    /// The LoadBalancer's own namespace.
    pub lb_namespace: String,
    /// `spec.ipPool`; when set, no matching is done.
    pub ip_pool: String,
    pub workload_type: WorkloadType,
    /// Annotation `loadbalancer.harvesterhci.io/network`.
    pub network: String,
    /// Annotation `loadbalancer.harvesterhci.io/project`.
    pub project: String,
    /// Annotation `loadbalancer.harvesterhci.io/namespace`; empty means the LoadBalancer's namespace.
    pub namespace: String,
    /// Annotation `loadbalancer.harvesterhci.io/cluster`.
    pub cluster: String,
    /// The address family asked for (annotation `loadbalancer.harvesterhci.io/ipFamily`, or the
    /// family of the requested address): only pools with ranges of that family are considered.
    /// `None` considers every pool, as upstream does.
    pub family: Option<Family>,
}

impl LbRequest {
    pub fn requirement(&self) -> Requirement {
        Requirement {
            network: self.network.clone(),
            project: self.project.clone(),
            namespace: if self.namespace.is_empty() {
                self.lb_namespace.clone()
            } else {
                self.namespace.clone()
            },
            cluster: self.cluster.clone(),
        }
    }
}

/// A pool as selection sees it.
#[derive(Debug, Clone, Copy)]
pub struct PoolEntry<'a> {
    pub name: &'a str,
    pub spec: &'a PoolSpec,
    /// Has a deletion timestamp: not offered to new load balancers.
    pub deleting: bool,
}

/// How the pool was chosen, for events and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectedBy {
    Explicit,
    Strict,
    Loose,
    Global,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Selected<'a> {
    pub pool: &'a str,
    pub by: SelectedBy,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    #[error("no matched IPPool with requirement {requirement}")]
    NoMatch { requirement: Requirement },
    /// As `NoMatch`, for a request of one family.
    #[error("no matched IPPool with {family} ranges with requirement {requirement}")]
    NoMatchOfFamily {
        requirement: Requirement,
        family: Family,
    },
    #[error("IP pool {pool} has no {family} range")]
    WrongFamily { pool: String, family: Family },
    /// Upstream reports a named pool that does not exist when it looks for its allocator.
    #[error("fail to get allocator {pool}")]
    UnknownPool { pool: String },
    #[error("IP pool {pool} is being deleted")]
    PoolDeleting { pool: String },
}

fn field_matches(pool: &str, wanted: &str, empty_is_any: bool) -> bool {
    pool == ALL || wanted == ALL || pool == wanted || (empty_is_any && pool.is_empty())
}

fn tuple_matches(tuple: &Tuple, requirement: &Requirement, loose: bool) -> bool {
    field_matches(&tuple.project, &requirement.project, loose)
        && field_matches(&tuple.namespace, &requirement.namespace, false)
        && field_matches(&tuple.guest_cluster, &requirement.cluster, loose)
}

impl Selector {
    /// Upstream's matcher: the network must be equal ("" only matches ""), and some scope tuple must
    /// match with `*` on either side as a wildcard.
    pub fn matches(&self, requirement: &Requirement) -> bool {
        self.matches_with(requirement, false)
    }

    /// The loose match for guest clusters: a tuple's empty project or guest cluster is also a wildcard.
    pub fn matches_loosely(&self, requirement: &Requirement) -> bool {
        self.matches_with(requirement, true)
    }

    fn matches_with(&self, requirement: &Requirement, loose: bool) -> bool {
        self.network == requirement.network
            && self
                .scope
                .iter()
                .any(|t| tuple_matches(t, requirement, loose))
    }
}

/// Higher priority first, then the lower name.
fn better<'a>(current: Option<PoolEntry<'a>>, candidate: PoolEntry<'a>) -> Option<PoolEntry<'a>> {
    Some(match current {
        Some(c)
            if (c.spec.selector.priority, std::cmp::Reverse(c.name))
                >= (
                    candidate.spec.selector.priority,
                    std::cmp::Reverse(candidate.name),
                ) =>
        {
            c
        }
        _ => candidate,
    })
}

/// Among global pools (several may exist, one per network and family): the one on the requirement's
/// network first, then one with IPv4 ranges (for a request of no family), then priority and name.
fn better_global<'a>(
    current: Option<PoolEntry<'a>>,
    candidate: PoolEntry<'a>,
    network: &str,
) -> Option<PoolEntry<'a>> {
    let rank = |p: &PoolEntry<'a>| {
        (
            p.spec.selector.network == network,
            p.spec.families().v4,
            p.spec.selector.priority,
            std::cmp::Reverse(p.name),
        )
    };
    Some(match current {
        Some(c) if rank(&c) >= rank(&candidate) => c,
        _ => candidate,
    })
}

fn no_match(requirement: Requirement, family: Option<Family>) -> SelectError {
    match family {
        None => SelectError::NoMatch { requirement },
        Some(family) => SelectError::NoMatchOfFamily {
            requirement,
            family,
        },
    }
}

fn explicit<'a>(
    found: Option<&PoolEntry<'a>>,
    name: &str,
    family: Option<Family>,
) -> Result<Selected<'a>, SelectError> {
    match found {
        None => Err(SelectError::UnknownPool { pool: name.into() }),
        Some(p) if p.deleting => Err(SelectError::PoolDeleting { pool: name.into() }),
        Some(p) if !p.spec.families().serves(family) => Err(SelectError::WrongFamily {
            pool: name.into(),
            family: family.unwrap_or(Family::V4),
        }),
        Some(p) => Ok(Selected {
            pool: p.name,
            by: SelectedBy::Explicit,
        }),
    }
}

/// Chooses the pool for one load balancer in one pass over `pools`. For many selections over the same
/// pools, [`PoolIndex`] avoids the pass.
pub fn select_pool<'a>(
    pools: &[PoolEntry<'a>],
    request: &LbRequest,
) -> Result<Selected<'a>, SelectError> {
    if !request.ip_pool.is_empty() {
        return explicit(
            pools.iter().find(|p| p.name == request.ip_pool),
            &request.ip_pool,
            request.family,
        );
    }
    let requirement = request.requirement();
    let guest = request.workload_type == WorkloadType::Cluster;
    let (mut strict, mut loose, mut global) = (None, None, None);
    for &pool in pools
        .iter()
        .filter(|p| !p.deleting && p.spec.families().serves(request.family))
    {
        let selector = &pool.spec.selector;
        if selector.is_global() {
            global = better_global(global, pool, &requirement.network);
        } else if selector.matches(&requirement) {
            strict = better(strict, pool);
        } else if guest && selector.matches_loosely(&requirement) {
            loose = better(loose, pool);
        }
    }
    let chosen = [
        (strict, SelectedBy::Strict),
        (loose, SelectedBy::Loose),
        (global, SelectedBy::Global),
    ]
    .into_iter()
    .find_map(|(pool, by)| pool.map(|p| Selected { pool: p.name, by }));
    chosen.ok_or_else(|| no_match(requirement, request.family))
}

/// The pools indexed for repeated selection: by name, and per network in selection order, so a
/// selection only looks at the pools of its network and stops at the first match.
#[derive(Debug, Clone)]
pub struct PoolIndex<'a> {
    by_name: HashMap<&'a str, PoolEntry<'a>>,
    /// Non-global, live pools per network, highest priority first, then by name, with the families
    /// of their ranges.
    by_network: HashMap<&'a str, Vec<(PoolEntry<'a>, Families)>>,
    /// Live global pools (one per network and family at most, admission permitting).
    globals: Vec<(PoolEntry<'a>, Families)>,
}

impl<'a> PoolIndex<'a> {
    pub fn new(pools: &[PoolEntry<'a>]) -> Self {
        let mut by_network: HashMap<&'a str, Vec<(PoolEntry<'a>, Families)>> = HashMap::new();
        let mut globals = Vec::new();
        for &pool in pools.iter().filter(|p| !p.deleting) {
            let families = pool.spec.families();
            if pool.spec.selector.is_global() {
                globals.push((pool, families));
            } else {
                by_network
                    .entry(pool.spec.selector.network.as_str())
                    .or_default()
                    .push((pool, families));
            }
        }
        for list in by_network.values_mut() {
            list.sort_by(|(a, _), (b, _)| {
                b.spec
                    .selector
                    .priority
                    .cmp(&a.spec.selector.priority)
                    .then_with(|| a.name.cmp(b.name))
            });
        }
        PoolIndex {
            by_name: pools.iter().map(|p| (p.name, *p)).collect(),
            by_network,
            globals,
        }
    }

    /// The live pools of the requirement's network that serve the family, in selection order.
    fn candidates<'s>(
        &'s self,
        requirement: &Requirement,
        family: Option<Family>,
    ) -> impl Iterator<Item = &'s PoolEntry<'a>> {
        self.by_network
            .get(requirement.network.as_str())
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter(move |(_, f)| f.serves(family))
            .map(|(p, _)| p)
    }

    /// The global pools that serve the family, best first.
    fn globals(&self, requirement: &Requirement, family: Option<Family>) -> Vec<PoolEntry<'a>> {
        let mut out: Vec<PoolEntry<'a>> = self
            .globals
            .iter()
            .filter(|(_, f)| f.serves(family))
            .map(|(p, _)| *p)
            .collect();
        let mut ordered = Vec::with_capacity(out.len());
        while !out.is_empty() {
            let best = out
                .iter()
                .fold(None, |acc, p| better_global(acc, *p, &requirement.network));
            let Some(best) = best else { break };
            out.retain(|p| p.name != best.name);
            ordered.push(best);
        }
        ordered
    }

    pub fn select(&self, request: &LbRequest) -> Result<Selected<'a>, SelectError> {
        if !request.ip_pool.is_empty() {
            return explicit(
                self.by_name.get(request.ip_pool.as_str()),
                &request.ip_pool,
                request.family,
            );
        }
        let requirement = request.requirement();
        let first = |loose: bool| {
            self.candidates(&requirement, request.family)
                .find(|p| p.spec.selector.matches_with(&requirement, loose))
                .map(|p| p.name)
        };
        let chosen = first(false)
            .map(|pool| (pool, SelectedBy::Strict))
            .or_else(|| {
                (request.workload_type == WorkloadType::Cluster)
                    .then(|| first(true))
                    .flatten()
                    .map(|pool| (pool, SelectedBy::Loose))
            })
            .or_else(|| {
                self.globals
                    .iter()
                    .filter(|(_, f)| f.serves(request.family))
                    .fold(None, |acc, (p, _)| {
                        better_global(acc, *p, &requirement.network)
                    })
                    .map(|p| (p.name, SelectedBy::Global))
            });
        match chosen {
            Some((pool, by)) => Ok(Selected { pool, by }),
            None => Err(no_match(requirement, request.family)),
        }
    }

    /// Every pool that could serve `request`, in the order selection prefers them: the explicit pool
    /// alone; else the strict matches, the loose ones (guest clusters), then the global pools. A
    /// requested address is taken from the first of these whose ranges hold it.
    pub fn eligible(&self, request: &LbRequest) -> Result<Vec<&'a str>, SelectError> {
        if !request.ip_pool.is_empty() {
            return explicit(
                self.by_name.get(request.ip_pool.as_str()),
                &request.ip_pool,
                request.family,
            )
            .map(|s| vec![s.pool]);
        }
        let requirement = request.requirement();
        let mut out: Vec<&'a str> = self
            .candidates(&requirement, request.family)
            .filter(|p| p.spec.selector.matches_with(&requirement, false))
            .map(|p| p.name)
            .collect();
        if request.workload_type == WorkloadType::Cluster {
            let loose: Vec<&'a str> = self
                .candidates(&requirement, request.family)
                .filter(|p| p.spec.selector.matches_with(&requirement, true))
                .map(|p| p.name)
                .filter(|name| !out.contains(name))
                .collect();
            out.extend(loose);
        }
        out.extend(
            self.globals(&requirement, request.family)
                .into_iter()
                .map(|p| p.name),
        );
        if out.is_empty() {
            return Err(no_match(requirement, request.family));
        }
        Ok(out)
    }
}

/// What to do about a load balancer's pool before allocating (upstream's stickiness rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolPlan<'a> {
    /// No pool yet: select one and allocate.
    Select,
    /// Keep the pool already in `allocatedAddress.ipPool`; it is never re-selected.
    Keep { pool: &'a str },
    /// `spec.ipPool` now names another pool: release the address to `pool`, clear
    /// `allocatedAddress`, and select again on the next pass.
    Release { pool: &'a str },
}

pub fn plan_pool<'a>(allocated_pool: &'a str, spec_ip_pool: &str) -> PoolPlan<'a> {
    if allocated_pool.is_empty() {
        PoolPlan::Select
    } else if !spec_ip_pool.is_empty() && spec_ip_pool != allocated_pool {
        PoolPlan::Release {
            pool: allocated_pool,
        }
    } else {
        PoolPlan::Keep {
            pool: allocated_pool,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::spec::RangeSpec;

    fn mk_tuple(project: &str, namespace: &str, cluster: &str) -> Tuple {
        Tuple {
            project: project.into(),
            namespace: namespace.into(),
            guest_cluster: cluster.into(),
        }
    }

    fn mk_spec(network: &str, priority: u32, scope: &[Tuple]) -> PoolSpec {
        PoolSpec {
            description: String::new(),
            ranges: vec![RangeSpec {
                subnet: "172.19.110.192/27".into(),
                ..RangeSpec::default()
            }],
            selector: Selector {
                priority,
                network: network.into(),
                scope: scope.to_vec(),
            },
        }
    }

    fn mk_request(network: &str, project: &str, namespace: &str, cluster: &str) -> LbRequest {
        // No LB namespace, so the requirement is exactly what the test names (as upstream's tests).
        LbRequest {
            network: network.into(),
            project: project.into(),
            namespace: namespace.into(),
            cluster: cluster.into(),
            ..LbRequest::default()
        }
    }

    fn mk_guest(network: &str, project: &str, namespace: &str, cluster: &str) -> LbRequest {
        LbRequest {
            workload_type: WorkloadType::Cluster,
            ..mk_request(network, project, namespace, cluster)
        }
    }

    const VLAN10: &str = "default/vlan10";

    struct Fixture {
        default: PoolSpec,
        default_priority: PoolSpec,
        global: PoolSpec,
        no_scope: PoolSpec,
        with_scope: PoolSpec,
    }

    fn mk_fixture() -> Fixture {
        Fixture {
            default: mk_spec(VLAN10, 0, &[mk_tuple(ALL, "default", ALL)]),
            default_priority: mk_spec(VLAN10, 100, &[mk_tuple(ALL, "default", ALL)]),
            global: mk_spec("", 0, &[mk_tuple(ALL, ALL, ALL)]),
            no_scope: mk_spec(VLAN10, 0, &[mk_tuple("", "default", "")]),
            with_scope: mk_spec(VLAN10, 0, &[mk_tuple("project1", "default", "cluster1")]),
        }
    }

    fn mk_entry<'a>(name: &'a str, spec: &'a PoolSpec) -> PoolEntry<'a> {
        PoolEntry {
            name,
            spec,
            deleting: false,
        }
    }

    /// Runs both implementations and insists they agree.
    fn pick(pools: &[PoolEntry<'_>], request: &LbRequest) -> Result<String, String> {
        let linear = select_pool(pools, request);
        let indexed = PoolIndex::new(pools).select(request);
        assert_eq!(
            linear, indexed,
            "linear and indexed selection disagree for {request:?}"
        );
        linear
            .map(|s| s.pool.to_string())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn matrix_with_global_pool() {
        let f = mk_fixture();
        let pools = [
            mk_entry("default", &f.default),
            mk_entry("global", &f.global),
        ];
        assert_eq!(
            pick(&pools, &mk_request(VLAN10, "", "default", "")).as_deref(),
            Ok("default")
        );
        assert_eq!(
            pick(&pools, &mk_request(VLAN10, "", "test", "")).as_deref(),
            Ok("global")
        );
        assert_eq!(
            pick(&pools, &mk_guest(VLAN10, "unknow", "", "cluster1")).as_deref(),
            Ok("global")
        );
    }

    #[test]
    fn matrix_without_global_pool() {
        let f = mk_fixture();
        let pools = [mk_entry("default", &f.default)];
        assert_eq!(
            pick(&pools, &mk_request(VLAN10, "", "default", "")).as_deref(),
            Ok("default")
        );
        assert_eq!(
            pick(&pools, &mk_request(VLAN10, "", "test", "")),
            Err("no matched IPPool with requirement &{Network:default/vlan10 Project: Namespace:test Cluster:}".into())
        );
        assert_eq!(
            pick(&pools, &mk_guest(VLAN10, "unknow", "guest-cluster-1", "cluster1")),
            Err(
                "no matched IPPool with requirement &{Network:default/vlan10 Project:unknow Namespace:guest-cluster-1 Cluster:cluster1}"
                    .into()
            )
        );
    }

    #[test]
    fn matrix_priority_wins() {
        let f = mk_fixture();
        for pools in [
            [
                mk_entry("default", &f.default),
                mk_entry("defaultPriority", &f.default_priority),
            ],
            [
                mk_entry("defaultPriority", &f.default_priority),
                mk_entry("default", &f.default),
            ],
        ] {
            assert_eq!(
                pick(&pools, &mk_request(VLAN10, "", "default", "")).as_deref(),
                Ok("defaultPriority")
            );
        }
    }

    #[test]
    fn matrix_guest_cluster_loose_mode() {
        let f = mk_fixture();
        let pools = [
            mk_entry("vlan-100-with-scope", &f.with_scope),
            mk_entry("vlan-100-no-scope", &f.no_scope),
        ];
        assert_eq!(
            pick(&pools, &mk_guest(VLAN10, "project1", "default", "cluster1")).as_deref(),
            Ok("vlan-100-with-scope")
        );
        assert_eq!(
            pick(&pools, &mk_guest(VLAN10, "unknow", "default", "cluster1")).as_deref(),
            Ok("vlan-100-no-scope")
        );
        assert_eq!(
            pick(&pools, &mk_guest(VLAN10, "", "default", "")).as_deref(),
            Ok("vlan-100-no-scope")
        );
        // VM load balancers never match loosely.
        assert!(pick(&pools, &mk_request(VLAN10, "unknow", "default", "cluster1")).is_err());
    }

    #[test]
    fn loose_match_is_tried_before_the_global_pool() {
        let f = mk_fixture();
        let pools = [
            mk_entry("global", &f.global),
            mk_entry("vlan-100-no-scope", &f.no_scope),
        ];
        let got =
            select_pool(&pools, &mk_guest(VLAN10, "p-abc", "default", "c1")).expect("matches");
        assert_eq!(
            got,
            Selected {
                pool: "vlan-100-no-scope",
                by: SelectedBy::Loose
            }
        );
        // A VM load balancer in the same namespace still falls back to the global pool.
        assert_eq!(
            pick(&pools, &mk_request(VLAN10, "p-abc", "default", "c1")).as_deref(),
            Ok("global")
        );
    }

    #[test]
    fn the_global_pool_serves_any_network() {
        let f = mk_fixture();
        let pools = [mk_entry("global", &f.global)];
        let got = select_pool(&pools, &mk_request("default/other", "", "x", "")).expect("global");
        assert_eq!(got.by, SelectedBy::Global);
    }

    #[test]
    fn ties_go_to_the_lowest_name_whatever_the_order() {
        let f = mk_fixture();
        let twin = f.default.clone();
        for pools in [
            [mk_entry("b-pool", &f.default), mk_entry("a-pool", &twin)],
            [mk_entry("a-pool", &twin), mk_entry("b-pool", &f.default)],
        ] {
            assert_eq!(
                pick(&pools, &mk_request(VLAN10, "", "default", "")).as_deref(),
                Ok("a-pool")
            );
        }
    }

    #[test]
    fn the_namespace_annotation_defaults_to_the_lb_namespace() {
        let f = mk_fixture();
        let pools = [mk_entry("default", &f.default)];
        let request = LbRequest {
            lb_namespace: "default".into(),
            network: VLAN10.into(),
            ..LbRequest::default()
        };
        assert_eq!(request.requirement().namespace, "default");
        assert_eq!(pick(&pools, &request).as_deref(), Ok("default"));
    }

    #[test]
    fn explicit_pool_skips_matching() {
        let f = mk_fixture();
        let mut pools = vec![
            mk_entry("default", &f.default),
            mk_entry("global", &f.global),
        ];
        let mut request = mk_request("nowhere", "", "nobody", "");
        request.ip_pool = "default".into();
        assert_eq!(pick(&pools, &request).as_deref(), Ok("default"));
        request.ip_pool = "missing".into();
        assert_eq!(
            pick(&pools, &request),
            Err("fail to get allocator missing".into())
        );
        pools[0].deleting = true;
        request.ip_pool = "default".into();
        assert_eq!(
            pick(&pools, &request),
            Err("IP pool default is being deleted".into())
        );
    }

    #[test]
    fn deleting_pools_are_never_matched() {
        let f = mk_fixture();
        let mut pools = vec![
            mk_entry("defaultPriority", &f.default_priority),
            mk_entry("default", &f.default),
        ];
        pools[0].deleting = true;
        assert_eq!(
            pick(&pools, &mk_request(VLAN10, "", "default", "")).as_deref(),
            Ok("default")
        );
        let mut global = [mk_entry("global", &f.global)];
        global[0].deleting = true;
        assert!(pick(&global, &mk_request("", "", "x", "")).is_err());
    }

    #[test]
    fn network_must_match_exactly() {
        let f = mk_fixture();
        let pools = [mk_entry("default", &f.default)];
        assert!(pick(&pools, &mk_request("", "", "default", "")).is_err());
        let bare = mk_spec("", 0, &[mk_tuple(ALL, "default", ALL)]);
        let pools = [mk_entry("bare", &bare)];
        assert_eq!(
            pick(&pools, &mk_request("", "", "default", "")).as_deref(),
            Ok("bare")
        );
        assert!(pick(&pools, &mk_request(VLAN10, "", "default", "")).is_err());
    }

    #[test]
    fn a_wildcard_requirement_matches_any_tuple_value() {
        let f = mk_fixture();
        let pools = [mk_entry("vlan-100-with-scope", &f.with_scope)];
        assert_eq!(
            pick(&pools, &mk_request(VLAN10, ALL, "default", ALL)).as_deref(),
            Ok("vlan-100-with-scope")
        );
    }

    #[test]
    fn stickiness_plan() {
        assert_eq!(plan_pool("", ""), PoolPlan::Select);
        assert_eq!(plan_pool("", "p2"), PoolPlan::Select);
        assert_eq!(plan_pool("p1", ""), PoolPlan::Keep { pool: "p1" });
        assert_eq!(plan_pool("p1", "p1"), PoolPlan::Keep { pool: "p1" });
        assert_eq!(plan_pool("p1", "p2"), PoolPlan::Release { pool: "p1" });
    }

    #[test]
    fn workload_type_parsing() {
        assert_eq!(WorkloadType::parse("cluster"), WorkloadType::Cluster);
        assert_eq!(WorkloadType::parse("vm"), WorkloadType::Vm);
        assert_eq!(WorkloadType::parse(""), WorkloadType::Vm);
    }

    fn mk_spec_on(subnet: &str, network: &str, priority: u32, scope: &[Tuple]) -> PoolSpec {
        PoolSpec {
            ranges: vec![RangeSpec {
                subnet: subnet.into(),
                ..RangeSpec::default()
            }],
            ..mk_spec(network, priority, scope)
        }
    }

    #[test]
    fn a_family_considers_only_pools_of_that_family() {
        let v4 = mk_spec_on("10.0.0.0/24", VLAN10, 0, &[mk_tuple(ALL, "default", ALL)]);
        let v6 = mk_spec_on("fd00::/64", VLAN10, 0, &[mk_tuple(ALL, "default", ALL)]);
        let global6 = mk_spec_on("fd01::/64", "", 0, &[mk_tuple(ALL, ALL, ALL)]);
        let pools = [
            mk_entry("v4", &v4),
            mk_entry("v6", &v6),
            mk_entry("global6", &global6),
        ];
        let ask = |family| LbRequest {
            family,
            ..mk_request(VLAN10, "", "default", "")
        };
        assert_eq!(pick(&pools, &ask(Some(Family::V4))).as_deref(), Ok("v4"));
        assert_eq!(pick(&pools, &ask(Some(Family::V6))).as_deref(), Ok("v6"));
        // No family: as upstream, every pool (the strict matches tie on priority: the lower name).
        assert_eq!(pick(&pools, &ask(None)).as_deref(), Ok("v4"));
        let elsewhere = LbRequest {
            family: Some(Family::V4),
            ..mk_request(VLAN10, "", "other", "")
        };
        assert_eq!(
            pick(&pools, &elsewhere),
            Err("no matched IPPool with IPv4 ranges with requirement &{Network:default/vlan10 Project: Namespace:other Cluster:}".into())
        );
        let explicit = LbRequest {
            ip_pool: "v6".into(),
            family: Some(Family::V4),
            ..LbRequest::default()
        };
        assert_eq!(
            pick(&pools, &explicit),
            Err("IP pool v6 has no IPv4 range".into())
        );
        // Every pool that could serve, in selection order: strict, then global.
        let index = PoolIndex::new(&pools);
        assert_eq!(
            index.eligible(&ask(Some(Family::V6))),
            Ok(vec!["v6", "global6"])
        );
        assert_eq!(index.eligible(&ask(None)), Ok(vec!["v4", "v6", "global6"]));
        assert!(index.eligible(&elsewhere).is_err());
    }

    #[test]
    fn global_pools_per_network_and_family() {
        let g4 = mk_spec_on("10.0.0.0/24", "", 0, &[mk_tuple(ALL, ALL, ALL)]);
        let g4_vlan = mk_spec_on("10.1.0.0/24", VLAN10, 0, &[mk_tuple(ALL, ALL, ALL)]);
        let g6 = mk_spec_on("fd00::/64", "", 5, &[mk_tuple(ALL, ALL, ALL)]);
        let pools = [
            mk_entry("g4", &g4),
            mk_entry("g4-vlan", &g4_vlan),
            mk_entry("g6", &g6),
        ];
        // The global pool of the load balancer's network first; with no family, IPv4 first.
        assert_eq!(
            pick(&pools, &mk_request(VLAN10, "", "x", "")).as_deref(),
            Ok("g4-vlan")
        );
        assert_eq!(
            pick(&pools, &mk_request("", "", "x", "")).as_deref(),
            Ok("g4")
        );
        let six = LbRequest {
            family: Some(Family::V6),
            ..mk_request(VLAN10, "", "x", "")
        };
        assert_eq!(pick(&pools, &six).as_deref(), Ok("g6"));
        assert_eq!(
            PoolIndex::new(&pools).eligible(&mk_request(VLAN10, "", "x", "")),
            Ok(vec!["g4-vlan", "g4", "g6"])
        );
    }
}
