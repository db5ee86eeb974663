//! Unit tests of pool selection.
use super::*;
use crate::spec::RangeSpec;
use std::collections::BTreeMap;

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
        options: PoolOptions::default(),
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
    let got = select_pool(&pools, &mk_guest(VLAN10, "p-abc", "default", "c1")).expect("matches");
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

// --- Pools by Service labels (ours) ---------------------------------------------------------------

fn mk_selective<'a>(name: &'a str, spec: &'a PoolSpec, selector: &'a str) -> PoolEntry<'a> {
    PoolEntry {
        options: PoolOptions {
            service_selector: selector,
            ..PoolOptions::default()
        },
        ..mk_entry(name, spec)
    }
}

fn mk_labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn labelled(request: LbRequest, pairs: &[(&str, &str)]) -> LbRequest {
    LbRequest {
        labels: mk_labels(pairs),
        ..request
    }
}

#[test]
fn a_selective_pool_serves_only_the_labels_it_selects_and_the_others_fall_through() {
    let f = mk_fixture();
    // The same scope: the selective pool needs the higher priority (admission refuses two
    // priority-0 pools of one scope), and the catch-all pool serves the rest.
    let pools = [
        mk_selective(
            "premium",
            &f.default_priority,
            "tier in (premium,gold),!canary",
        ),
        mk_entry("default", &f.default),
    ];
    let request = mk_request(VLAN10, "", "default", "");
    for (labels, want) in [
        (&[("tier", "premium")][..], "premium"),
        (&[("tier", "gold"), ("app", "web")][..], "premium"),
        (&[("tier", "premium"), ("canary", "")][..], "default"),
        (&[("tier", "basic")][..], "default"),
        (&[][..], "default"),
    ] {
        assert_eq!(
            pick(&pools, &labelled(request.clone(), labels)).as_deref(),
            Ok(want),
            "{labels:?}"
        );
    }
    let index = PoolIndex::new(&pools);
    assert_eq!(
        index.eligible(&labelled(request.clone(), &[("tier", "gold")])),
        Ok(vec!["premium", "default"])
    );
    assert_eq!(index.eligible(&request), Ok(vec!["default"]));
}

#[test]
fn scope_rules_come_before_the_selector() {
    let f = mk_fixture();
    // The global pool selects the labels, the strict one does not: the global pool serves, as it
    // would with no strict pool at all; with labels both select, the strict pool wins as upstream.
    let pools = [
        mk_selective("default", &f.default, "app=web"),
        mk_selective("global", &f.global, "app"),
    ];
    let request = mk_request(VLAN10, "", "default", "");
    assert_eq!(
        pick(&pools, &labelled(request.clone(), &[("app", "web")])).as_deref(),
        Ok("default")
    );
    assert_eq!(
        pick(&pools, &labelled(request.clone(), &[("app", "db")])).as_deref(),
        Ok("global")
    );
    // A guest load balancer: the loose match before the global pool, each only if it selects.
    let loose = [
        mk_selective("vlan-100-no-scope", &f.no_scope, "team=a"),
        mk_entry("global", &f.global),
    ];
    let guest = mk_guest(VLAN10, "p-abc", "default", "c1");
    assert_eq!(
        pick(&loose, &labelled(guest.clone(), &[("team", "a")])).as_deref(),
        Ok("vlan-100-no-scope")
    );
    assert_eq!(
        pick(&loose, &labelled(guest, &[("team", "b")])).as_deref(),
        Ok("global")
    );
}

#[test]
fn a_load_balancer_no_pool_selects_is_told_which_pools_turned_it_away() {
    let f = mk_fixture();
    let pools = [
        mk_selective("default", &f.default, "app=web"),
        mk_selective("global", &f.global, "app=web"),
        // Not matched by the scope rules: not named.
        mk_selective("other", &f.with_scope, "app=db"),
    ];
    let request = labelled(mk_request(VLAN10, "", "default", ""), &[("app", "db")]);
    let message = "no matched IPPool with requirement &{Network:default/vlan10 Project: Namespace:default Cluster:}: the service selector of IP pool default, global does not select the load balancer's labels app=db";
    assert_eq!(pick(&pools, &request), Err(message.into()));
    assert_eq!(
        PoolIndex::new(&pools)
            .eligible(&request)
            .map_err(|e| e.to_string()),
        Err(message.into())
    );
    let v4 = LbRequest {
        family: Some(Family::V4),
        labels: BTreeMap::new(),
        ..request
    };
    assert_eq!(
        pick(&pools, &v4),
        Err("no matched IPPool with IPv4 ranges with requirement &{Network:default/vlan10 Project: Namespace:default Cluster:}: the service selector of IP pool default, global does not select the load balancer's labels (none)".into())
    );
    // Nothing matched the scope rules: upstream's message alone.
    assert_eq!(
        pick(&pools, &mk_request(VLAN10, "", "elsewhere", "")),
        Err("no matched IPPool with requirement &{Network:default/vlan10 Project: Namespace:elsewhere Cluster:}: the service selector of IP pool global does not select the load balancer's labels (none)".into())
    );
    assert_eq!(
        pick(&pools[..1], &mk_request(VLAN10, "", "elsewhere", "")),
        Err("no matched IPPool with requirement &{Network:default/vlan10 Project: Namespace:elsewhere Cluster:}".into())
    );
}

#[test]
fn a_pool_named_in_spec_ip_pool_must_select_the_labels_too() {
    let f = mk_fixture();
    let pools = [mk_selective("default", &f.default, "app=web")];
    let explicit = |labels: &[(&str, &str)]| LbRequest {
        ip_pool: "default".into(),
        ..labelled(mk_request("nowhere", "", "nobody", ""), labels)
    };
    assert_eq!(
        pick(&pools, &explicit(&[("app", "web")])).as_deref(),
        Ok("default")
    );
    assert_eq!(
        pick(&pools, &explicit(&[("app", "db"), ("tier", "x")])),
        Err("the service selector \"app=web\" of IP pool default does not select the load balancer's labels app=db,tier=x".into())
    );
    assert!(PoolIndex::new(&pools).eligible(&explicit(&[])).is_err());
}

#[test]
fn an_empty_selector_serves_everybody_and_a_broken_one_nobody() {
    let f = mk_fixture();
    let request = labelled(mk_request(VLAN10, "", "default", ""), &[("app", "web")]);
    let pools = [mk_selective("default", &f.default, "  ")];
    assert_eq!(pick(&pools, &request).as_deref(), Ok("default"));
    assert_eq!(
        pick(&pools, &mk_request(VLAN10, "", "default", "")).as_deref(),
        Ok("default")
    );
    // Written past admission (e.g. while upstream's webhook ran): it selects nothing.
    let pools = [
        mk_selective("broken", &f.default_priority, "app in (web"),
        mk_entry("default", &f.default),
    ];
    assert_eq!(pick(&pools, &request).as_deref(), Ok("default"));
    assert!(pick(&pools[..1], &request).expect_err("nobody").ends_with(
        "the service selector of IP pool broken does not select the load balancer's labels app=web"
    ));
}
