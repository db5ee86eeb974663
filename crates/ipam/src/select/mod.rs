//! Which pool a load balancer takes its address from.
//!
//! The order is upstream's (explicit `spec.ipPool`, strict match, global pool, loose match for guest
//! clusters) with two defects fixed: ties between equally prioritised pools go to the lowest name
//! instead of the cache's iteration order, and the loose match runs before the global fallback so that
//! namespace-only pools made in the UI are not shadowed by a global pool. Pools being deleted are
//! never chosen.
//!
//! Ours: a pool with a service selector ([`crate::labels`], the annotation
//! `loadbalancer.harvesterhci.io/serviceSelector`) serves only load balancers whose labels
//! ([`LbRequest::labels`]) it selects. Upstream's rules run first: among the pools they allow, in
//! their order, the first whose selector selects the labels is chosen; a pool named in
//! `spec.ipPool` must select them too. A selector that does not parse (written past admission)
//! selects nothing.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use super::Family;
use super::labels::{SelectorError, ServiceSelector, labels_text};
use super::skip::{Skip, SkipError};
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
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
    /// Ours: the labels pools' service selectors are matched against: the guest Service's
    /// (annotation `cloudprovider.harvesterhci.io/serviceLabels`), else the LoadBalancer's own.
    pub labels: BTreeMap<String, String>,
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
    pub options: PoolOptions<'a>,
}

/// Ours, not upstream's: the pool's annotations that IPAM reads, as written (empty when absent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolOptions<'a> {
    /// `loadbalancer.harvesterhci.io/skipAddresses` ([`Skip`]).
    pub skip_addresses: &'a str,
    /// `loadbalancer.harvesterhci.io/serviceSelector` ([`ServiceSelector`]).
    pub service_selector: &'a str,
}

impl PoolOptions<'_> {
    pub fn skip(&self) -> Result<Skip, SkipError> {
        Skip::parse(self.skip_addresses)
    }

    /// The pool's service selector; `None` when it has none (it serves every load balancer).
    pub fn service_selector(&self) -> Result<Option<ServiceSelector>, SelectorError> {
        let selector = ServiceSelector::parse(self.service_selector)?;
        Ok((!selector.is_empty()).then_some(selector))
    }
}

/// Whether a pool serves load balancers with some labels: its parsed service selector.
#[derive(Debug, Clone)]
enum Gate {
    All,
    Selector(ServiceSelector),
    /// The annotation does not parse: the pool serves nobody by labels.
    Invalid,
}

impl Gate {
    fn of(pool: &PoolEntry<'_>) -> Self {
        match pool.options.service_selector() {
            Ok(None) => Gate::All,
            Ok(Some(selector)) => Gate::Selector(selector),
            Err(_) => Gate::Invalid,
        }
    }

    fn admits(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Gate::All => true,
            Gate::Selector(selector) => selector.matches(labels),
            Gate::Invalid => false,
        }
    }
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
    /// Ours: pools matched the requirement, but their service selectors do not select the load
    /// balancer's labels; `turned_away` names them and the labels.
    #[error("{}: {turned_away}", no_match(requirement.clone(), *family))]
    NotSelected {
        requirement: Requirement,
        family: Option<Family>,
        turned_away: String,
    },
    /// Ours: the pool named in `spec.ipPool` has a service selector that does not select them.
    #[error(
        "the service selector {selector:?} of IP pool {pool} does not select the load balancer's labels {labels}"
    )]
    ExplicitNotSelected {
        pool: String,
        selector: String,
        labels: String,
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
    Some(match current {
        Some(c) if global_rank(&c, network) >= global_rank(&candidate, network) => c,
        _ => candidate,
    })
}

/// A global pool's rank for [`better_global`]: higher is better, and no two pools tie (names are
/// unique).
fn global_rank<'a>(
    p: &PoolEntry<'a>,
    network: &str,
) -> (bool, bool, u32, std::cmp::Reverse<&'a str>) {
    (
        p.spec.selector.network == network,
        p.spec.families().v4,
        p.spec.selector.priority,
        std::cmp::Reverse(p.name),
    )
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

/// What selection found when no pool could serve: the pools its rules matched but whose
/// selectors turned the load balancer away (`excluded`, by name), or none.
fn refusal(requirement: Requirement, request: &LbRequest, mut excluded: Vec<&str>) -> SelectError {
    if excluded.is_empty() {
        return no_match(requirement, request.family);
    }
    excluded.sort_unstable();
    excluded.dedup();
    SelectError::NotSelected {
        requirement,
        family: request.family,
        turned_away: format!(
            "the service selector of IP pool {} does not select the load balancer's labels {}",
            excluded.join(", "),
            labels_text(&request.labels)
        ),
    }
}

fn explicit<'a>(
    found: Option<&PoolEntry<'a>>,
    name: &str,
    request: &LbRequest,
) -> Result<Selected<'a>, SelectError> {
    let family = request.family;
    match found {
        None => Err(SelectError::UnknownPool { pool: name.into() }),
        Some(p) if p.deleting => Err(SelectError::PoolDeleting { pool: name.into() }),
        Some(p) if !p.spec.families().serves(family) => Err(SelectError::WrongFamily {
            pool: name.into(),
            family: family.unwrap_or(Family::V4),
        }),
        Some(p) if !Gate::of(p).admits(&request.labels) => Err(SelectError::ExplicitNotSelected {
            pool: name.into(),
            selector: p.options.service_selector.into(),
            labels: labels_text(&request.labels),
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
            request,
        );
    }
    let requirement = request.requirement();
    let guest = request.workload_type == WorkloadType::Cluster;
    let (mut strict, mut loose, mut global) = (None, None, None);
    let mut excluded = Vec::new();
    for &pool in pools
        .iter()
        .filter(|p| !p.deleting && p.spec.families().serves(request.family))
    {
        let selector = &pool.spec.selector;
        let slot = if selector.is_global() {
            &mut global
        } else if selector.matches(&requirement) {
            &mut strict
        } else if guest && selector.matches_loosely(&requirement) {
            &mut loose
        } else {
            continue;
        };
        if !Gate::of(&pool).admits(&request.labels) {
            excluded.push(pool.name);
        } else if selector.is_global() {
            *slot = better_global(*slot, pool, &requirement.network);
        } else {
            *slot = better(*slot, pool);
        }
    }
    let chosen = [
        (strict, SelectedBy::Strict),
        (loose, SelectedBy::Loose),
        (global, SelectedBy::Global),
    ]
    .into_iter()
    .find_map(|(pool, by)| pool.map(|p| Selected { pool: p.name, by }));
    chosen.ok_or_else(|| refusal(requirement, request, excluded))
}

/// The pools indexed for repeated selection: by name, and per network in selection order, so a
/// selection only looks at the pools of its network and stops at the first match.
#[derive(Debug, Clone)]
pub struct PoolIndex<'a> {
    by_name: HashMap<&'a str, PoolEntry<'a>>,
    /// The service selector of each pool that has one (every other pool serves every label set).
    gates: HashMap<&'a str, Gate>,
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
            gates: pools
                .iter()
                .filter(|p| !p.options.service_selector.trim().is_empty())
                .map(|p| (p.name, Gate::of(p)))
                .collect(),
            by_network,
            globals,
        }
    }

    /// Whether `pool`'s service selector (if any) selects `labels`.
    fn admits(&self, pool: &str, labels: &BTreeMap<String, String>) -> bool {
        self.gates.get(pool).is_none_or(|gate| gate.admits(labels))
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
        out.sort_by_key(|p| std::cmp::Reverse(global_rank(p, &requirement.network)));
        out
    }

    pub fn select(&self, request: &LbRequest) -> Result<Selected<'a>, SelectError> {
        if !request.ip_pool.is_empty() {
            return explicit(
                self.by_name.get(request.ip_pool.as_str()),
                &request.ip_pool,
                request,
            );
        }
        let requirement = request.requirement();
        let guest = request.workload_type == WorkloadType::Cluster;
        let labels = &request.labels;
        let first = |loose: bool| {
            self.candidates(&requirement, request.family)
                .filter(|p| p.spec.selector.matches_with(&requirement, loose))
                .find(|p| self.admits(p.name, labels))
                .map(|p| p.name)
        };
        let chosen = first(false)
            .map(|pool| (pool, SelectedBy::Strict))
            .or_else(|| {
                guest
                    .then(|| first(true))
                    .flatten()
                    .map(|pool| (pool, SelectedBy::Loose))
            })
            .or_else(|| {
                self.globals
                    .iter()
                    .filter(|(p, f)| f.serves(request.family) && self.admits(p.name, labels))
                    .map(|(p, _)| p)
                    .max_by_key(|p| global_rank(p, &requirement.network))
                    .map(|p| (p.name, SelectedBy::Global))
            });
        match chosen {
            Some((pool, by)) => Ok(Selected { pool, by }),
            None => Err(self.refusal(requirement, request)),
        }
    }

    /// Why no pool serves `request`: the pools upstream's rules match, all turned away by their
    /// service selectors, or none.
    fn refusal(&self, requirement: Requirement, request: &LbRequest) -> SelectError {
        let excluded = self.matching(&requirement, request).collect();
        refusal(requirement, request, excluded)
    }

    /// Every pool upstream's rules allow for `request`, selectors aside, in selection order: the
    /// strict matches, the loose ones (guest clusters), then the global pools. A pool may come
    /// twice (a strict match is a loose one too).
    fn matching<'s>(
        &'s self,
        requirement: &'s Requirement,
        request: &'s LbRequest,
    ) -> impl Iterator<Item = &'a str> + 's {
        let guest = request.workload_type == WorkloadType::Cluster;
        let scoped = move |loose: bool| {
            self.candidates(requirement, request.family)
                .filter(move |p| p.spec.selector.matches_with(requirement, loose))
                .map(|p| p.name)
        };
        scoped(false)
            .chain(guest.then(|| scoped(true)).into_iter().flatten())
            .chain(
                self.globals(requirement, request.family)
                    .into_iter()
                    .map(|p| p.name),
            )
    }

    /// Every pool that could serve `request`, in the order selection prefers them: the explicit pool
    /// alone; else the strict matches, the loose ones (guest clusters), then the global pools, each
    /// only if its service selector selects the load balancer's labels. A requested address is
    /// taken from the first of these whose ranges hold it.
    pub fn eligible(&self, request: &LbRequest) -> Result<Vec<&'a str>, SelectError> {
        if !request.ip_pool.is_empty() {
            return explicit(
                self.by_name.get(request.ip_pool.as_str()),
                &request.ip_pool,
                request,
            )
            .map(|s| vec![s.pool]);
        }
        let requirement = request.requirement();
        let mut out: Vec<&'a str> = Vec::new();
        for name in self.matching(&requirement, request) {
            if !out.contains(&name) && self.admits(name, &request.labels) {
                out.push(name);
            }
        }
        if out.is_empty() {
            return Err(self.refusal(requirement, request));
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
mod tests;
