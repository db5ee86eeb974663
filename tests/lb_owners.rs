//! Who holds each address of an IPPool (`GET …/ippools/{name}/addresses`), with the reconcilers
//! running on the backend's store: the answer lists every allocated address with its
//! LoadBalancer, and after a randomized churn of LoadBalancers it agrees exactly with the pool's
//! status and with the LoadBalancers' own `status.allocatedAddress`. The `cases` run on every
//! backend (`suite!`).

#[macro_use]
mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use axum::{
    body::Body,
    http::{Method, StatusCode},
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde_json::{Value, json};
use support::{
    Backend, EmbeddedBackend, KubeBackend, call, eventually,
    lb::{
        LBS, POOLS, Reconcilers, allocated, allocation_done, create_pool, global, gone, ip_of,
        mk_pool, range, update_pool, write_leak,
    },
    ok,
};

const CLUSTER: &str = "cloudprovider.harvesterhci.io/cluster";
const SERVICE_NAMESPACE: &str = "cloudprovider.harvesterhci.io/serviceNamespace";
const SERVICE_NAME: &str = "cloudprovider.harvesterhci.io/serviceName";

/// A VM load balancer with one listener (what the validator wants of VM load balancers).
fn mk_vm_lb(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1",
        "kind": "LoadBalancer",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"ipam": "pool",
                 "listeners": [{"name": "http", "port": 80, "protocol": "TCP", "backendPort": 8080}]}
    })
}

/// A guest cluster's load balancer, labelled as the guest cloud provider labels them.
fn mk_guest_lb(namespace: &str, name: &str, cluster: &str, service: (&str, &str)) -> Value {
    json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1",
        "kind": "LoadBalancer",
        "metadata": {"name": name, "namespace": namespace, "labels": {
            CLUSTER: cluster, SERVICE_NAMESPACE: service.0, SERVICE_NAME: service.1}},
        "spec": {"ipam": "pool", "workloadType": "cluster"}
    })
}

fn with_pool(mut lb: Value, pool: &str) -> Value {
    lb["spec"]["ipPool"] = json!(pool);
    lb
}

async fn addresses<B: Backend>(b: &B, pool: &str) -> Value {
    ok(
        call(b, Method::GET, &format!("{POOLS}/{pool}/addresses"), None).await,
        StatusCode::OK,
    )
}

async fn pool_status<B: Backend>(b: &B, pool: &str) -> Value {
    ok(
        call(b, Method::GET, &format!("{POOLS}/{pool}"), None).await,
        StatusCode::OK,
    )["status"]
        .clone()
}

/// The endpoint's answer, with the pool's status and every LoadBalancer as they were when it was
/// computed: read between two identical reads of them (the same resourceVersions), so that a write
/// of a reconciler in between is never taken for a disagreement.
async fn answer_and_state<B: Backend>(
    b: &B,
    pool: &str,
) -> (Value, Value, BTreeMap<String, Value>) {
    let pool_path = format!("{POOLS}/{pool}");
    eventually(
        &format!("a read of {pool} undisturbed by writes"),
        async || {
            let before = ok(call(b, Method::GET, &pool_path, None).await, StatusCode::OK);
            let lbs = all_lbs(b).await;
            let answer = addresses(b, pool).await;
            let after = ok(call(b, Method::GET, &pool_path, None).await, StatusCode::OK);
            let unchanged = before == after && all_lbs(b).await == lbs;
            unchanged.then(|| (answer, after["status"].clone(), lbs))
        },
    )
    .await
}

/// What the endpoint says of an address's allocation time: the `lastTransitionTime` of the
/// LoadBalancer's True `AddressAllocated` condition about this address, else null (the reconciler
/// writes no such condition yet on some versions; the join is what is checked).
fn allocation_time(lb: &Value, ip: &str) -> Value {
    lb["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "AddressAllocated")
        .filter(|c| {
            c["status"] == "True"
                && c["message"]
                    .as_str()
                    .and_then(|m| m.strip_prefix(ip))
                    .is_some_and(|rest| rest.starts_with(' '))
        })
        .map_or(Value::Null, |c| c["lastTransitionTime"].clone())
}

/// The guest cluster and Service the endpoint shows for a LoadBalancer.
fn guest_of(lb: &Value) -> (Value, Value) {
    if lb["spec"]["workloadType"] != "cluster" {
        return (Value::Null, Value::Null);
    }
    let labels = &lb["metadata"]["labels"];
    let service = match (
        labels[SERVICE_NAMESPACE].as_str(),
        labels[SERVICE_NAME].as_str(),
    ) {
        (Some(ns), Some(name)) => json!(format!("{ns}/{name}")),
        _ => Value::Null,
    };
    (labels[CLUSTER].clone(), service)
}

/// The order the endpoint promises: by address, IPv4 before IPv6, then what is no address.
fn assert_sorted(entries: &[Value], what: &str) {
    let keys: Vec<(bool, Option<IpAddr>, String)> = entries
        .iter()
        .map(|e| {
            let ip = e["ip"].as_str().expect("ip").to_string();
            let addr = ip.parse::<IpAddr>().ok();
            (addr.is_none(), addr, ip)
        })
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted, "{what} are not in address order");
}

/// `status.allocated` or `status.allocatedHistory` as the endpoint's `(ip, loadBalancer)` pairs.
fn pairs(map: &Value) -> BTreeMap<String, String> {
    map.as_object()
        .into_iter()
        .flatten()
        .map(|(ip, lb)| (ip.clone(), lb.as_str().expect("holder").to_string()))
        .collect()
}

/// The endpoint's answer agrees exactly with the pool's status and with `lbs` (every LoadBalancer,
/// by `namespace/name`): each allocated entry listed once with its owner, the history as it is, the
/// counters as they are, and each LoadBalancer whose allocation is done listed as its address's
/// owner, joined with its labels and condition.
#[track_caller]
fn assert_agrees(answer: &Value, pool: &str, status: &Value, lbs: &BTreeMap<String, Value>) {
    assert_eq!(
        answer["type"],
        "loadbalancer.harvesterhci.io.ippool.addresses"
    );
    assert_eq!(answer["pool"], pool);
    assert_eq!(answer["total"], status["total"], "total");
    assert_eq!(answer["available"], status["available"], "available");
    let listed = answer["addresses"].as_array().expect("addresses");
    let history = answer["history"].as_array().expect("history");
    assert_sorted(listed, "addresses");
    assert_sorted(history, "history entries");

    let mut by_ip = BTreeMap::new();
    for a in listed {
        let ip = a["ip"].as_str().expect("ip").to_string();
        let holder = a["loadBalancer"]
            .as_str()
            .expect("loadBalancer")
            .to_string();
        assert!(by_ip.insert(ip, holder).is_none(), "{a} listed twice");
    }
    assert_eq!(
        by_ip,
        pairs(&status["allocated"]),
        "addresses vs status.allocated"
    );
    let history: BTreeMap<String, String> = history
        .iter()
        .map(|h| {
            assert_eq!(h.as_object().expect("entry").len(), 2, "{h}");
            let field = |f: &str| h[f].as_str().expect(f).to_string();
            (field("ip"), field("loadBalancer"))
        })
        .collect();
    assert_eq!(
        history.len(),
        answer["history"].as_array().expect("history").len(),
        "a history address listed twice"
    );
    assert_eq!(
        history,
        pairs(&status["allocatedHistory"]),
        "history vs status.allocatedHistory"
    );

    for a in listed {
        let holder = a["loadBalancer"].as_str().expect("holder");
        let ip = a["ip"].as_str().expect("ip");
        match lbs.get(holder) {
            Some(lb) => {
                let (cluster, service) = guest_of(lb);
                assert_eq!(a["exists"], true, "{a}");
                assert_eq!(a["guestCluster"], cluster, "{a}");
                assert_eq!(a["service"], service, "{a}");
                assert_eq!(a["allocated"], allocation_time(lb, ip), "{a}");
            }
            None => {
                let nulls = [&a["guestCluster"], &a["service"], &a["allocated"]];
                assert_eq!(a["exists"], false, "{a}");
                assert!(nulls.iter().all(|v| v.is_null()), "{a}");
            }
        }
    }
    for (id, lb) in lbs {
        if allocation_done(lb) && lb["status"]["allocatedAddress"]["ipPool"] == pool {
            assert_eq!(
                by_ip.get(&ip_of(lb)).map(String::as_str),
                Some(id.as_str()),
                "{id}'s address {} is not listed as its",
                ip_of(lb)
            );
        }
    }
}

/// Every LoadBalancer, by `namespace/name`.
async fn all_lbs<B: Backend>(b: &B) -> BTreeMap<String, Value> {
    ok(call(b, Method::GET, LBS, None).await, StatusCode::OK)["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|lb| (lb["id"].as_str().expect("id").to_string(), lb.clone()))
        .collect()
}

/// The seed of the churn: `CHURN_SEED` to replay one, else from the clock.
fn churn_seed() -> u64 {
    match std::env::var("CHURN_SEED") {
        Ok(seed) => seed.parse().expect("CHURN_SEED is a u64"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos() as u64,
    }
}

pub mod cases {
    use super::*;

    /// Each address with its LoadBalancer: a VM one, a guest one (with its cluster and Service),
    /// one in an IPv6 pool; a deleted one's address in the history; a leak (an address held for
    /// a LoadBalancer that does not exist) listed with `exists: false` until released by hand.
    pub async fn owners_are_listed<B: Backend>(b: B) {
        let _r = Reconcilers::start(b.service_store());
        create_pool(
            &b,
            mk_pool(
                "p4",
                range("10.0.0.0/24", "10.0.0.8", "10.0.0.18"),
                global(),
            ),
        )
        .await;
        // Not global (one global pool only): reached by naming it.
        let v6_scope =
            json!({"scope": [{"project": "p", "namespace": "ns9", "guestCluster": "*"}]});
        create_pool(
            &b,
            mk_pool(
                "p6",
                range("2001:db8::/64", "2001:db8::10", "2001:db8::20"),
                v6_scope,
            ),
        )
        .await;
        let empty = addresses(&b, "p4").await;
        assert_eq!(empty["addresses"], json!([]));
        assert_eq!(empty["history"], json!([]));

        for lb in [
            mk_vm_lb("default", "vm1"),
            mk_vm_lb("default", "vm2"),
            mk_guest_lb("default", "gc1-nginx", "gc1", ("web", "nginx")),
            with_pool(mk_vm_lb("default", "vm6"), "p6"),
        ] {
            ok(
                call(&b, Method::POST, LBS, Some(lb)).await,
                StatusCode::CREATED,
            );
        }
        let mut ips = BTreeMap::new();
        for name in ["vm1", "vm2", "gc1-nginx", "vm6"] {
            ips.insert(name, ip_of(&allocated(&b, "default", name).await));
        }
        let ip = |name: &str| ips[name].clone();

        eventually("p4's status to count three addresses", async || {
            (pool_status(&b, "p4").await["available"] == 8).then_some(())
        })
        .await;
        let (answer, status, lbs) = answer_and_state(&b, "p4").await;
        assert_agrees(&answer, "p4", &status, &lbs);
        let listed = answer["addresses"].as_array().expect("addresses");
        assert_eq!(listed.len(), 3, "{answer}");
        let entry = |name: &str| {
            listed
                .iter()
                .find(|a| a["ip"] == ip(name))
                .unwrap_or_else(|| panic!("{name}'s address is not listed: {answer}"))
                .clone()
        };
        let vm1 = entry("vm1");
        assert_eq!(vm1["loadBalancer"], "default/vm1");
        assert_eq!(vm1["exists"], true);
        assert_eq!(vm1["guestCluster"], Value::Null);
        assert_eq!(vm1["service"], Value::Null);
        let guest = entry("gc1-nginx");
        assert_eq!(guest["loadBalancer"], "default/gc1-nginx");
        assert_eq!(guest["guestCluster"], "gc1");
        assert_eq!(guest["service"], "web/nginx");

        let (v6, status, all) = answer_and_state(&b, "p6").await;
        assert_agrees(&v6, "p6", &status, &all);
        assert_eq!(v6["addresses"].as_array().expect("addresses").len(), 1);
        assert_eq!(v6["addresses"][0]["ip"], ip("vm6"));
        assert_eq!(v6["addresses"][0]["loadBalancer"], "default/vm6");
        assert!(ip("vm6").starts_with("2001:db8::"), "{}", ip("vm6"));

        // A deleted LoadBalancer's address goes to the history, kept for it.
        let vm2_ip = ip("vm2");
        ok(
            call(&b, Method::DELETE, &format!("{LBS}/default/vm2"), None).await,
            StatusCode::OK,
        );
        gone(&b, &format!("{LBS}/default/vm2")).await;
        eventually("vm2's address to be released", async || {
            let a = addresses(&b, "p4").await;
            (a["history"] == json!([{"ip": vm2_ip, "loadBalancer": "default/vm2"}])).then_some(())
        })
        .await;
        let (answer, status, lbs) = answer_and_state(&b, "p4").await;
        assert!(!lbs.contains_key("default/vm2"));
        assert_agrees(&answer, "p4", &status, &lbs);

        // A leak, as a hand edit or a lost finalizer leaves one.
        write_leak(b.store(), "p4", "10.0.0.18", "default/ghost").await;
        let (answer, status, lbs) = answer_and_state(&b, "p4").await;
        let ghost = answer["addresses"]
            .as_array()
            .expect("addresses")
            .iter()
            .find(|a| a["ip"] == "10.0.0.18")
            .unwrap_or_else(|| panic!("the leak is not listed: {answer}"));
        assert_eq!(
            ghost,
            &json!({"ip": "10.0.0.18", "loadBalancer": "default/ghost", "exists": false,
                    "guestCluster": null, "service": null, "allocated": null})
        );
        assert_agrees(&answer, "p4", &status, &lbs);

        // Released as the openapi description says: the pool annotation.
        let release =
            json!({"loadbalancer.harvesterhci.io/manuallyReleaseIP": "10.0.0.18: default/ghost"});
        ok(
            update_pool(&b, "p4", |p| p["metadata"]["annotations"] = release.clone()).await,
            StatusCode::OK,
        );
        eventually("the leak to be released", async || {
            let a = addresses(&b, "p4").await;
            a["addresses"]
                .as_array()
                .expect("addresses")
                .iter()
                .all(|a| a["ip"] != "10.0.0.18")
                .then_some(())
        })
        .await;
        let (answer, status, lbs) = answer_and_state(&b, "p4").await;
        assert!(
            answer["history"]
                .as_array()
                .expect("history")
                .contains(&json!({"ip": "10.0.0.18", "loadBalancer": "default/ghost"})),
            "{answer}"
        );
        assert_agrees(&answer, "p4", &status, &lbs);
    }

    /// LoadBalancers created and deleted at random (VM and guest ones, names reused so that
    /// history entries are given back), then, once everything has settled, the endpoint agrees
    /// exactly with the pool status and the LoadBalancers. The seed is printed; `CHURN_SEED`
    /// replays the same operations (the reconcilers' interleaving is the run's own).
    pub async fn owners_agree_with_the_pool_after_churn<B: Backend>(b: B) {
        let seed = churn_seed();
        eprintln!("churn seed: {seed} (replay the operations with CHURN_SEED={seed})");
        let mut rng = StdRng::seed_from_u64(seed);
        let _r = Reconcilers::start(b.service_store());
        // 14 addresses for at most 10 LoadBalancers: never exhausted. One and two digits in the last
        // octet, so that text order is not address order.
        create_pool(
            &b,
            mk_pool(
                "churn",
                range("10.9.0.0/24", "10.9.0.5", "10.9.0.18"),
                global(),
            ),
        )
        .await;
        let mut live: BTreeSet<String> = BTreeSet::new();
        for step in 0..40 {
            let name = format!("lb{}", rng.random_range(0..10));
            let path = format!("{LBS}/default/{name}");
            if live.remove(&name) {
                ok(call(&b, Method::DELETE, &path, None).await, StatusCode::OK);
            } else {
                let body = if rng.random_bool(0.5) {
                    let cluster = format!("gc{}", rng.random_range(0..3));
                    mk_guest_lb("default", &name, &cluster, ("apps", &format!("svc-{name}")))
                } else {
                    mk_vm_lb("default", &name)
                };
                let mut r = call(&b, Method::POST, LBS, Some(body.clone())).await;
                if r.status == StatusCode::CONFLICT {
                    // Its namesake is still being deleted (its finalizer releases the address).
                    gone(&b, &path).await;
                    r = call(&b, Method::POST, LBS, Some(body)).await;
                }
                ok(r, StatusCode::CREATED);
                live.insert(name.clone());
                // Now and then, let it get its address before going on, so that deletions find
                // both allocated and not yet allocated LoadBalancers.
                if rng.random_bool(0.25) {
                    allocated(&b, "default", &name).await;
                }
            }
            // Read while the reconcilers work: always an answer, in order, each address once.
            if step % 5 == 0 {
                let a = addresses(&b, "churn").await;
                let listed = a["addresses"].as_array().expect("addresses");
                assert_sorted(listed, "addresses");
                let ips: BTreeSet<&str> = listed.iter().filter_map(|a| a["ip"].as_str()).collect();
                assert_eq!(ips.len(), listed.len(), "seed {seed}: {a}");
            }
        }

        let live_ids: BTreeSet<String> = live.iter().map(|n| format!("default/{n}")).collect();
        let (settled, _) = eventually(&format!("the churn to settle (seed {seed})"), async || {
            let lbs = all_lbs(&b).await;
            let settled = lbs.keys().cloned().collect::<BTreeSet<_>>() == live_ids
                && lbs
                    .values()
                    .all(|lb| allocation_done(lb) && lb["metadata"]["deletionTimestamp"].is_null());
            if !settled {
                return None;
            }
            let status = pool_status(&b, "churn").await;
            let held: BTreeMap<String, String> =
                lbs.iter().map(|(id, lb)| (ip_of(lb), id.clone())).collect();
            let counted = status["available"].as_i64()
                == status["total"].as_i64().map(|t| t - held.len() as i64);
            (pairs(&status["allocated"]) == held && counted).then_some((status, lbs))
        })
        .await;
        let (answer, status, lbs) = answer_and_state(&b, "churn").await;
        assert_eq!(
            status["allocated"], settled["allocated"],
            "seed {seed}: the pool changed after it settled"
        );
        assert_eq!(lbs.keys().cloned().collect::<BTreeSet<_>>(), live_ids);
        assert_agrees(&answer, "churn", &status, &lbs);
        assert_eq!(
            answer["addresses"].as_array().expect("addresses").len(),
            live.len(),
            "seed {seed}: {answer}"
        );
        let guests = answer["addresses"]
            .as_array()
            .expect("addresses")
            .iter()
            .filter(|a| a["guestCluster"].is_string())
            .count();
        eprintln!(
            "churn seed {seed} settled: {} addresses ({guests} of guest load balancers), {} in the history",
            live.len(),
            answer["history"].as_array().expect("history").len()
        );
    }

    /// 404 in Rancher's error shape for a pool that does not exist (or a name that names none),
    /// 401 without a token.
    pub async fn unknown_pools_and_callers_are_refused<B: Backend>(b: B) {
        let m = call(&b, Method::GET, &format!("{POOLS}/nope/addresses"), None)
            .await
            .error(StatusCode::NOT_FOUND, "NotFound");
        assert!(m.contains("nope"), "{m}");
        call(&b, Method::GET, &format!("{POOLS}/%FF%FE/addresses"), None)
            .await
            .error(StatusCode::NOT_FOUND, "NotFound");
        for token in [None, Some("token-nobody:nothing")] {
            b.call(
                Method::GET,
                &format!("{POOLS}/nope/addresses"),
                token,
                Body::empty(),
            )
            .await
            .error(StatusCode::UNAUTHORIZED, "Unauthorized");
        }
        call(&b, Method::POST, &format!("{POOLS}/nope/addresses"), None)
            .await
            .error(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed");
        // And a pool that existed is not found once deleted.
        create_pool(
            &b,
            mk_pool(
                "short-lived",
                range("10.8.0.0/24", "10.8.0.10", "10.8.0.20"),
                global(),
            ),
        )
        .await;
        addresses(&b, "short-lived").await;
        ok(
            call(&b, Method::DELETE, &format!("{POOLS}/short-lived"), None).await,
            StatusCode::OK,
        );
        eventually("the pool to be gone", async || {
            let r = call(
                &b,
                Method::GET,
                &format!("{POOLS}/short-lived/addresses"),
                None,
            )
            .await;
            (r.status == StatusCode::NOT_FOUND).then(|| r.error(StatusCode::NOT_FOUND, "NotFound"))
        })
        .await;
    }
}

suite!(
    [embedded => EmbeddedBackend::start(), kube => KubeBackend::start()],
    [
        owners_are_listed,
        owners_agree_with_the_pool_after_churn,
        unknown_pools_and_callers_are_refused,
    ]
);

/// On Kubernetes a user needs `get` on the pool and `list` on LoadBalancers in every namespace: the
/// answer names LoadBalancers of every namespace and tells their labels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_users_need_the_pool_and_every_load_balancer() {
    use support::kube_env::apply;
    let b = KubeBackend::start().await;
    create_pool(
        &b,
        mk_pool(
            "p",
            range("10.7.0.0/24", "10.7.0.10", "10.7.0.20"),
            global(),
        ),
    )
    .await;
    let grant = async |user: &str, rules: Value| {
        let name = format!("{user}-addresses");
        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name}, "rules": rules});
        apply(&b.client, &role, "clusterroles").await;
        let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]});
        apply(&b.client, &binding, "clusterrolebindings").await;
    };
    let pools_rule = json!({"apiGroups": ["loadbalancer.harvesterhci.io"],
        "resources": ["ippools"], "verbs": ["get"]});
    let lbs_rule = json!({"apiGroups": ["loadbalancer.harvesterhci.io"],
        "resources": ["loadbalancers"], "verbs": ["list"]});
    // carol: the pool only; bob: the pool and LoadBalancers; alice: LoadBalancers only.
    grant("carol", json!([pools_rule])).await;
    grant("bob", json!([pools_rule, lbs_rule])).await;
    grant("alice", json!([lbs_rule])).await;
    let path = format!("{POOLS}/p/addresses");
    let as_user = async |user: &str| {
        let token = b.cp.user_token(user);
        b.call(Method::GET, &path, Some(&token), Body::empty())
            .await
    };
    // The API server's RBAC takes new bindings from its informers, and the service keeps a refusal
    // for 2 s: retried until the grants are seen.
    let m = eventually("carol's grant to be seen", async || {
        let m = as_user("carol")
            .await
            .error(StatusCode::FORBIDDEN, "PermissionDenied");
        (!m.contains("\"ippools\"")).then_some(m)
    })
    .await;
    assert!(m.contains("cannot list resource \"loadbalancers\""), "{m}");
    let m = as_user("alice")
        .await
        .error(StatusCode::FORBIDDEN, "PermissionDenied");
    assert!(m.contains("cannot get resource \"ippools\""), "{m}");
    let answer = eventually("bob's grant to be seen", async || {
        let r = as_user("bob").await;
        (r.status != StatusCode::FORBIDDEN).then(|| ok(r, StatusCode::OK))
    })
    .await;
    assert_eq!(answer["pool"], "p");
    assert_eq!(answer["addresses"], json!([]));
}
