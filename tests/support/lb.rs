//! IPPools and LoadBalancers for the tests that run the load balancer reconcilers: the reconcilers
//! themselves ([`Reconcilers`]), the builders of pools ([`mk_pool`], [`range`], [`global`]), and
//! what the tests read of a LoadBalancer's status through the HTTP API.

use std::{sync::Arc, time::Duration};

use axum::http::{Method, StatusCode};
use harvester_cloud::{controller::leader::AlwaysLeader, lb, store::ObjectStore};
use serde_json::{Value, json};

use super::{Backend, PATIENCE, Reply, Task, call, eventually, ok};

pub const POOLS: &str = "/v1/harvester/loadbalancer.harvesterhci.io.ippools";
pub const LBS: &str = "/v1/harvester/loadbalancer.harvesterhci.io.loadbalancers";

/// Harvester's load balancer reconcilers on a store, until stopped or dropped.
pub struct Reconcilers(Task);

impl Reconcilers {
    /// The reconcilers with [`settings`].
    pub fn start(store: Arc<dyn ObjectStore>) -> Self {
        Self::start_with(store, settings())
    }

    pub fn start_with(store: Arc<dyn ObjectStore>, settings: lb::Settings) -> Self {
        super::init_logging();
        Reconcilers(Task::spawn(|stop| {
            lb::run(store, settings, Arc::new(AlwaysLeader), stop)
        }))
    }

    /// Stops them and waits until they have.
    pub async fn stop(self) {
        self.0.stop().await;
    }
}

/// The tests' settings: 32 load balancers at once, Events from `test`. Change fields with
/// `lb::Settings { fill_service_ingress: true, ..settings() }`.
pub fn settings() -> lb::Settings {
    lb::Settings {
        concurrency: 32,
        identity: "test".into(),
        ..lb::Settings::default()
    }
}

pub fn mk_pool(name: &str, ranges: Value, selector: Value) -> Value {
    json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1",
        "kind": "IPPool",
        "metadata": {"name": name},
        "spec": {"ranges": ranges, "selector": selector}
    })
}

/// The selector of a pool for everybody.
pub fn global() -> Value {
    json!({"scope": [{"project": "*", "namespace": "*", "guestCluster": "*"}]})
}

/// One range, as a pool's `spec.ranges`.
pub fn range(subnet: &str, start: &str, end: &str) -> Value {
    json!([{"subnet": subnet, "rangeStart": start, "rangeEnd": end}])
}

/// Creates an IPPool through the API (a 201, or the test fails with the answer); returns it.
pub async fn create_pool<B: Backend>(b: &B, pool: Value) -> Value {
    ok(
        b.admin(Method::POST, POOLS, Some(pool)).await,
        StatusCode::CREATED,
    )
}

/// A LoadBalancer's Ready condition.
pub fn ready(lb: &Value) -> Option<&Value> {
    lb["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
}

/// The Ready reason of a VM load balancer whose address is allocated and whose Service waits for
/// kube-vip (no kube-vip runs where the reconcilers fill no Service ingress; tests/vm_lb.rs has
/// the rest of a VM load balancer's life).
pub const WAITING_FOR_KUBE_VIP: &str = "WaitingForExternalIP";

/// Whether the load balancer's allocation is done: it has an address and is Ready, or (a VM load
/// balancer) waits for kube-vip to announce it.
pub fn allocation_done(lb: &Value) -> bool {
    let done =
        ready(lb).is_some_and(|c| c["status"] == "True" || c["reason"] == WAITING_FOR_KUBE_VIP);
    done && lb["status"]["allocatedAddress"]["ip"].is_string()
}

/// `status.allocatedAddress.ip` (the test fails without one).
pub fn ip_of(lb: &Value) -> String {
    lb["status"]["allocatedAddress"]["ip"]
        .as_str()
        .expect("allocated ip")
        .to_string()
}

/// `status.allocatedAddress.ipPool` (empty without one).
pub fn pool_of(lb: &Value) -> String {
    lb["status"]["allocatedAddress"]["ipPool"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Waits until the load balancer has an address (and is Ready, or waits for kube-vip).
pub async fn allocated<B: Backend>(b: &B, namespace: &str, name: &str) -> Value {
    let path = format!("{LBS}/{namespace}/{name}");
    eventually(
        &format!("{namespace}/{name} to get an address"),
        async || {
            let lb = b.admin(Method::GET, &path, None).await.json();
            allocation_done(&lb).then_some(lb)
        },
    )
    .await
}

/// Updates pool `name` as `kubectl edit` does: reads it, applies `edit` and PUTs it, reading again
/// on a 409. The pool reconciler writes the pool too (a round, or its status after an allocation),
/// so a version read a moment ago may be stale. Answers the first reply that is not a conflict.
pub async fn update_pool<B: Backend>(b: &B, name: &str, edit: impl Fn(&mut Value)) -> Reply {
    let path = format!("{POOLS}/{name}");
    for _ in 0..10 {
        let mut p = ok(call(b, Method::GET, &path, None).await, StatusCode::OK);
        edit(&mut p);
        let r = call(b, Method::PUT, &path, Some(p)).await;
        if r.status != StatusCode::CONFLICT {
            return r;
        }
    }
    panic!("pool {name} kept changing under the update");
}

/// Waits until a GET of `path` answers 404 (the test fails with the last answer after
/// [`PATIENCE`]).
pub async fn gone<B: Backend>(b: &B, path: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let r = b.admin(Method::GET, path, None).await;
        if r.status == StatusCode::NOT_FOUND {
            return;
        }
        let last = r.text();
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting for {path} to be gone; last seen: {last}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes a leak into pool `pool`'s status, as a hand edit or a lost finalizer leaves one: `ip`
/// held for `holder`, a LoadBalancer that does not exist. The pool task may be writing the status
/// meanwhile (a round, or its Event after it): on a conflict the edit is made again on the pool as
/// it is now, as kubectl would.
pub async fn write_leak(store: Arc<dyn ObjectStore>, pool: &str, ip: &str, holder: &str) {
    let pools = harvester_cloud::crd::pool_api(store);
    for tries in 1.. {
        let mut leaked = pools.get("", pool).await.expect("reads").expect("exists");
        let status = leaked.status.get_or_insert_default();
        status.allocated.insert(ip.into(), holder.into());
        status.available -= 1;
        match pools.replace_status(&leaked).await {
            Ok(_) => return,
            Err(harvester_cloud::store::StoreError::Conflict { .. }) if tries < 10 => continue,
            Err(e) => panic!("writes the leak: {e}"),
        }
    }
}
