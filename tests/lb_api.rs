//! IPPools and LoadBalancers through the HTTP API, with the reconcilers running on the backend's
//! store. The `cases` run on every backend through [`support::Backend`] (the reconcilers are started
//! from `Backend::store()`, so they run on whatever store the backend has).

#[macro_use]
mod support;

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use axum::{
    body::Body,
    http::{Method, StatusCode},
};
use harvester_cloud::{
    controller::leader::AlwaysLeader,
    crd::kinds::{NetworkAttachmentDefinition, VirtualMachine},
    lb,
    store::{Api, LabelSelector, ObjectStore, Preconditions},
};
use k8s_openapi::api::core::v1::{Event, Namespace};
use serde_json::{Value, json};
use support::{Backend, EmbeddedBackend, KubeBackend, PATIENCE, Reply, eventually};
use tokio_util::sync::CancellationToken;

const POOLS: &str = "/v1/harvester/loadbalancer.harvesterhci.io.ippools";
const LBS: &str = "/v1/harvester/loadbalancer.harvesterhci.io.loadbalancers";

/// The reconcilers, running on a backend's store until dropped or stopped.
pub struct Reconcilers {
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Reconcilers {
    pub fn start(store: Arc<dyn ObjectStore>) -> Self {
        // `TEST_LOG=harvester_cloud=trace` shows what the reconcilers do.
        let filter = std::env::var("TEST_LOG").unwrap_or_else(|_| "off".into());
        let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
        let stop = CancellationToken::new();
        let settings = lb::Settings {
            concurrency: 32,
            identity: "test".into(),
            ..lb::Settings::default()
        };
        let task = tokio::spawn(lb::run(
            store,
            settings,
            Arc::new(AlwaysLeader),
            stop.clone(),
        ));
        Reconcilers {
            stop,
            task: Some(task),
        }
    }

    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            task.await.expect("reconcilers stop cleanly");
        }
    }
}

impl Drop for Reconcilers {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn call<B: Backend>(b: &B, method: Method, path: &str, body: Option<Value>) -> Reply {
    let token = b.admin_token();
    let body = body.map_or_else(Body::empty, |v| Body::from(v.to_string()));
    b.call(method, path, Some(&token), body).await
}

fn ok(r: Reply, status: StatusCode) -> Value {
    assert_eq!(r.status, status, "{}", r.text());
    r.json()
}

fn mk_pool(name: &str, ranges: Value, selector: Value) -> Value {
    json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1",
        "kind": "IPPool",
        "metadata": {"name": name},
        "spec": {"ranges": ranges, "selector": selector}
    })
}

fn global() -> Value {
    json!({"scope": [{"project": "*", "namespace": "*", "guestCluster": "*"}]})
}

fn range(subnet: &str, start: &str, end: &str) -> Value {
    json!([{"subnet": subnet, "rangeStart": start, "rangeEnd": end}])
}

async fn create_pool<B: Backend>(b: &B, pool: Value) -> Value {
    ok(
        call(b, Method::POST, POOLS, Some(pool)).await,
        StatusCode::CREATED,
    )
}

/// A VM load balancer with one listener (what the validator wants of VM load balancers).
fn mk_lb(namespace: &str, name: &str, spec: Value) -> Value {
    let mut spec = spec;
    if spec.get("workloadType").and_then(Value::as_str) != Some("cluster")
        && spec.get("listeners").is_none()
    {
        spec["listeners"] =
            json!([{"name": "http", "port": 80, "protocol": "TCP", "backendPort": 8080}]);
    }
    json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1",
        "kind": "LoadBalancer",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec
    })
}

fn with_annotations(mut lb: Value, annotations: &[(&str, &str)]) -> Value {
    let map: BTreeMap<&str, &str> = annotations.iter().copied().collect();
    lb["metadata"]["annotations"] = json!(map);
    lb
}

fn with_labels(mut lb: Value, labels: &[(&str, &str)]) -> Value {
    let map: BTreeMap<&str, &str> = labels.iter().copied().collect();
    lb["metadata"]["labels"] = json!(map);
    lb
}

async fn create_lb<B: Backend>(b: &B, lb: Value) -> Value {
    ok(
        call(b, Method::POST, LBS, Some(lb)).await,
        StatusCode::CREATED,
    )
}

async fn get<B: Backend>(b: &B, path: &str) -> Reply {
    call(b, Method::GET, path, None).await
}

fn ready(lb: &Value) -> Option<&Value> {
    lb["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
}

/// The Ready reason of a VM load balancer whose address is allocated and whose Service waits for
/// kube-vip: these cases' reconcilers fill no Service ingress (tests/vm_lb.rs has the rest of a VM
/// load balancer's life).
const WAITING_FOR_KUBE_VIP: &str = "WaitingForExternalIP";

/// Whether the load balancer's allocation is done: it has an address and is Ready, or (a VM load
/// balancer) waits for kube-vip.
fn allocation_done(lb: &Value) -> bool {
    let done =
        ready(lb).is_some_and(|c| c["status"] == "True" || c["reason"] == WAITING_FOR_KUBE_VIP);
    done && lb["status"]["allocatedAddress"]["ip"].is_string()
}

/// Waits until the load balancer has an address (and is Ready, or waits for kube-vip).
async fn allocated<B: Backend>(b: &B, namespace: &str, name: &str) -> Value {
    let path = format!("{LBS}/{namespace}/{name}");
    eventually(
        &format!("{namespace}/{name} to get an address"),
        async || {
            let lb = get(b, &path).await.json();
            allocation_done(&lb).then_some(lb)
        },
    )
    .await
}

/// Waits until the load balancer's allocation is refused (Ready=False for another reason than
/// waiting for kube-vip), and returns the condition.
async fn refused<B: Backend>(b: &B, namespace: &str, name: &str) -> Value {
    let path = format!("{LBS}/{namespace}/{name}");
    eventually(&format!("{namespace}/{name} to be refused"), async || {
        let lb = get(b, &path).await.json();
        ready(&lb)
            .filter(|c| c["status"] == "False" && c["reason"] != WAITING_FOR_KUBE_VIP)
            .cloned()
    })
    .await
}

async fn gone<B: Backend>(b: &B, path: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let r = get(b, path).await;
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

async fn pool<B: Backend>(b: &B, name: &str) -> Value {
    ok(get(b, &format!("{POOLS}/{name}")).await, StatusCode::OK)
}

fn ip_of(lb: &Value) -> String {
    lb["status"]["allocatedAddress"]["ip"]
        .as_str()
        .expect("allocated ip")
        .to_string()
}

fn pool_of(lb: &Value) -> String {
    lb["status"]["allocatedAddress"]["ipPool"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Events about an object, as the recorder wrote them (it writes in the background).
async fn events_about<B: Backend>(b: &B, name: &str, reason: &str) -> Vec<Event> {
    let api = Api::<Event>::new(b.store());
    eventually(&format!("a {reason} event about {name}"), async || {
        let events: Vec<Event> = api
            .list(None, &LabelSelector::everything())
            .await
            .expect("lists events")
            .into_iter()
            .filter(|e| {
                e.involved_object.name.as_deref() == Some(name)
                    && e.reason.as_deref() == Some(reason)
            })
            .collect();
        (!events.is_empty()).then_some(events)
    })
    .await
}

/// The whole allocation state is consistent: no address held twice, every held address belongs to a
/// live load balancer that reports it, every pool-mode load balancer whose allocation is done holds
/// exactly its reported address, and the counters add up.
async fn assert_consistent<B: Backend>(b: &B) {
    let pools = ok(get(b, POOLS).await, StatusCode::OK);
    let lbs = ok(get(b, LBS).await, StatusCode::OK);
    let lbs: HashMap<String, &Value> = lbs["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|l| (l["id"].as_str().expect("id").to_string(), l))
        .collect();
    let mut holders: HashMap<(String, String), String> = HashMap::new();
    for p in pools["data"].as_array().expect("data") {
        let name = p["id"].as_str().expect("id").to_string();
        let status = &p["status"];
        let allocated = status["allocated"].as_object().cloned().unwrap_or_default();
        assert_eq!(
            status["available"].as_i64().expect("available"),
            status["total"].as_i64().expect("total") - allocated.len() as i64,
            "counters of pool {name}"
        );
        for (ip, holder) in allocated {
            let holder = holder.as_str().expect("holder").to_string();
            let lb = lbs.get(&holder).unwrap_or_else(|| {
                panic!("{ip} of pool {name} is held by {holder}, which does not exist (leak)")
            });
            assert_eq!(
                ip_of(lb),
                ip,
                "{holder} reports another address than pool {name} holds for it"
            );
            assert_eq!(pool_of(lb), name);
            assert!(
                holders.insert((name.clone(), ip.clone()), holder).is_none(),
                "{ip} held twice in {name}"
            );
        }
    }
    for (id, lb) in &lbs {
        let ipam = lb["spec"]["ipam"].as_str().unwrap_or_default();
        if ipam != "dhcp" && allocation_done(lb) && lb["metadata"]["deletionTimestamp"].is_null() {
            let key = (pool_of(lb), ip_of(lb));
            assert_eq!(
                holders.get(&key),
                Some(id),
                "{id}'s address is not held for it"
            );
        }
    }
}

/// Namespaces the cases use; the Kubernetes backend needs them to exist, the embedded one accepts
/// them as ordinary objects. `project` is Rancher's `field.cattle.io/projectId`, which the
/// cluster-type mutator turns into the project annotation.
async fn ensure_namespace<B: Backend>(b: &B, name: &str, project: Option<&str>) {
    let api = Api::<Namespace>::new(b.store());
    let mut ns = api
        .get("", name)
        .await
        .expect("reads namespaces")
        .unwrap_or_else(|| Namespace {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        });
    if let Some(project) = project {
        ns.metadata
            .annotations
            .get_or_insert_default()
            .insert("field.cattle.io/projectId".into(), project.into());
    }
    let done = if ns.metadata.resource_version.is_some() {
        api.replace(&ns).await.map(|_| ())
    } else {
        api.create(&ns).await.map(|_| ())
    };
    done.expect("writes the namespace");
}

/// A VM network (NetworkAttachmentDefinition) on VLAN `vlan`.
async fn ensure_network<B: Backend>(b: &B, namespace: &str, name: &str, vlan: u32) {
    let nad: NetworkAttachmentDefinition = serde_json::from_value(
        support::foreign::nad(name)
            .namespace(namespace)
            .label("network.harvesterhci.io/vlan-id", &vlan.to_string())
            .config(&format!(
                r#"{{"cniVersion":"0.3.1","type":"bridge","vlan":{vlan}}}"#
            ))
            .build(),
    )
    .expect("nad");
    match Api::<NetworkAttachmentDefinition>::new(b.store())
        .create(&nad)
        .await
    {
        Ok(_) => {}
        Err(e) if e.is_already_exists() => {}
        Err(e) => panic!("cannot create network {namespace}/{name}: {e}"),
    }
}

pub mod cases {
    pub use super::replicas::only_the_leader_reconciles_and_the_other_takes_over;
    use super::*;

    pub async fn allocation_end_to_end<B: Backend>(b: B) {
        let r = Reconcilers::start(b.service_store());
        let created = create_pool(
            &b,
            mk_pool(
                "pool1",
                range("192.168.100.0/24", "192.168.100.10", "192.168.100.20"),
                global(),
            ),
        )
        .await;
        assert_eq!(created["id"], "pool1");
        assert_eq!(created["type"], "loadbalancer.harvesterhci.io.ippool");
        assert_eq!(
            created["metadata"]["labels"]["loadbalancer.harvesterhci.io/global-ip-pool"],
            "true"
        );
        assert_eq!(
            created["metadata"]["labels"]["loadbalancer.harvesterhci.io/vid"],
            "0"
        );

        let lb = create_lb(&b, mk_lb("default", "lb1", json!({"ipam": "pool"}))).await;
        assert_eq!(lb["id"], "default/lb1");
        assert_eq!(lb["type"], "loadbalancer.harvesterhci.io.loadbalancer");
        assert_eq!(
            lb["metadata"]["annotations"]["loadbalancer.harvesterhci.io/namespace"],
            "default"
        );

        let lb = allocated(&b, "default", "lb1").await;
        let address = &lb["status"]["allocatedAddress"];
        assert_eq!(address["ipPool"], "pool1");
        assert_eq!(address["ip"], "192.168.100.10");
        assert_eq!(address["mask"], "255.255.255.0");
        assert_eq!(address["gateway"], "192.168.100.1");
        // A VM load balancer's address is its Service's ingress, which kube-vip writes: until then
        // it has none, and says so with upstream's message.
        assert_eq!(lb["status"]["address"], Value::Null);
        let condition = ready(&lb).expect("ready");
        assert_eq!(condition["message"], "service is waiting for external IP");
        assert!(
            lb["metadata"]["finalizers"]
                .as_array()
                .expect("finalizers")
                .contains(&json!("wrangler.cattle.io/harvester-lb-controller"))
        );

        let p = eventually("the pool to be Ready and count", async || {
            let p = pool(&b, "pool1").await;
            (p["status"]["available"] == 10 && ready(&p).is_some_and(|c| c["status"] == "True"))
                .then_some(p)
        })
        .await;
        assert_eq!(p["status"]["total"], 11);
        assert_eq!(p["status"]["lastAllocated"], "192.168.100.10");
        assert_eq!(
            p["status"]["allocated"],
            json!({"192.168.100.10": "default/lb1"})
        );

        // Collections, in steve's shape.
        for (path, type_) in [
            (POOLS.to_string(), "loadbalancer.harvesterhci.io.ippool"),
            (LBS.to_string(), "loadbalancer.harvesterhci.io.loadbalancer"),
            (
                format!("{LBS}/default"),
                "loadbalancer.harvesterhci.io.loadbalancer",
            ),
        ] {
            let c = ok(get(&b, &path).await, StatusCode::OK);
            assert_eq!(c["type"], "collection");
            assert_eq!(c["resourceType"], type_);
            assert_eq!(c["data"].as_array().expect("data").len(), 1, "{path}");
            assert_eq!(c["data"][0]["type"], type_);
        }
        let other = ok(get(&b, &format!("{LBS}/other")).await, StatusCode::OK);
        assert_eq!(other["data"], json!([]));

        let events = events_about(&b, "lb1", "Allocated").await;
        assert_eq!(
            events[0].message.as_deref(),
            Some("allocated 192.168.100.10 from IP pool pool1")
        );
        assert_consistent(&b).await;
        r.stop().await;
    }

    pub async fn selection_matrix<B: Backend>(b: B) {
        let _r = Reconcilers::start(b.service_store());
        let vlan10 = "default/vlan10";
        let vlan20 = "default/vlan20";
        ensure_network(&b, "default", "vlan10", 10).await;
        ensure_network(&b, "default", "vlan20", 20).await;
        ensure_namespace(&b, "test", None).await;
        ensure_namespace(&b, "guest", Some("c-1:p-1")).await;
        ensure_namespace(&b, "guest2", Some("c-1:p-2")).await;
        create_pool(
            &b,
            mk_pool(
                "default",
                range("10.10.0.0/24", "10.10.0.10", "10.10.0.20"),
                json!({"network": vlan10, "scope": [{"project": "*", "namespace": "default", "guestCluster": "*"}]}),
            ),
        )
        .await;
        create_pool(
            &b,
            mk_pool(
                "withscope",
                range("10.20.0.0/24", "10.20.0.10", "10.20.0.20"),
                json!({"network": vlan20, "scope": [{"project": "c-1/p-1", "namespace": "guest", "guestCluster": "cluster1"}]}),
            ),
        )
        .await;
        create_pool(
            &b,
            mk_pool(
                "noscope",
                range("10.21.0.0/24", "10.21.0.10", "10.21.0.20"),
                json!({"network": vlan20, "scope": [{"namespace": "guest2"}]}),
            ),
        )
        .await;
        let net = |n: &str| ("loadbalancer.harvesterhci.io/network", n.to_string());
        let pick =
            async |namespace: &str, name: &str, spec: Value, annotations: Vec<(&str, String)>| {
                let a: Vec<(&str, &str)> =
                    annotations.iter().map(|(k, v)| (*k, v.as_str())).collect();
                create_lb(&b, with_annotations(mk_lb(namespace, name, spec), &a)).await;
                pool_of(&allocated(&b, namespace, name).await)
            };

        // 1. vlan10 in namespace default: "default", then "defaultPriority" once it exists.
        assert_eq!(
            pick("default", "a1", json!({}), vec![net(vlan10)]).await,
            "default"
        );
        create_pool(
            &b,
            mk_pool(
                "defaultpriority",
                range("10.11.0.0/24", "10.11.0.10", "10.11.0.20"),
                json!({"network": vlan10, "priority": 100, "scope": [{"project": "*", "namespace": "default", "guestCluster": "*"}]}),
            ),
        )
        .await;
        assert_eq!(
            pick("default", "a2", json!({}), vec![net(vlan10)]).await,
            "defaultpriority"
        );
        // Stickiness: a1 keeps its pool although a better one exists now.
        assert_eq!(pool_of(&allocated(&b, "default", "a1").await), "default");

        // 2. Namespace test matches nothing: refused, then the global pool once it exists.
        create_lb(
            &b,
            with_annotations(
                mk_lb("test", "b1", json!({})),
                &[("loadbalancer.harvesterhci.io/network", vlan10)],
            ),
        )
        .await;
        let condition = refused(&b, "test", "b1").await;
        assert_eq!(condition["reason"], "NoMatchedIPPool");
        assert_eq!(
            condition["message"],
            "no matched IPPool with requirement &{Network:default/vlan10 Project: Namespace:test Cluster:}"
        );
        events_about(&b, "b1", "NoMatchedIPPool").await;
        create_pool(
            &b,
            mk_pool(
                "global",
                range("10.99.0.0/24", "10.99.0.10", "10.99.0.20"),
                global(),
            ),
        )
        .await;
        // Woken by the new pool, not by a timer.
        assert_eq!(pool_of(&allocated(&b, "test", "b1").await), "global");

        // 3. An exact project, namespace and cluster: the full-scope pool. The project comes from
        //    the namespace's Rancher project (the mutator overwrites what the guest wrote).
        let guest = |project: &str| {
            vec![
                net(vlan20),
                ("loadbalancer.harvesterhci.io/project", project.to_string()),
                (
                    "loadbalancer.harvesterhci.io/cluster",
                    "cluster1".to_string(),
                ),
            ]
        };
        let cluster = json!({"workloadType": "cluster"});
        assert_eq!(
            pick("guest", "c1", cluster.clone(), guest("ignored")).await,
            "withscope"
        );
        let c1 = get(&b, &format!("{LBS}/guest/c1")).await.json();
        assert_eq!(
            c1["metadata"]["annotations"]["loadbalancer.harvesterhci.io/project"],
            "c-1/p-1"
        );
        // 4. Loose mode for guest clusters: a project the pool does not name gives the
        //    namespace-only pool (before the global pool: upstream would pick the global one).
        assert_eq!(
            pick("guest2", "c2", cluster.clone(), guest("ignored")).await,
            "noscope"
        );
        // A VM load balancer does not match loosely: the global pool.
        assert_eq!(
            pick("guest2", "v1", json!({}), guest("unknown")).await,
            "global"
        );
        // An explicit pool wins over matching.
        assert_eq!(
            pick("test", "e1", json!({"ipPool": "noscope"}), vec![]).await,
            "noscope"
        );
        assert_consistent(&b).await;
    }

    pub async fn dhcp<B: Backend>(b: B) {
        let _r = Reconcilers::start(b.service_store());
        create_pool(
            &b,
            mk_pool(
                "pool1",
                range("10.0.0.0/24", "10.0.0.10", "10.0.0.20"),
                global(),
            ),
        )
        .await;
        create_lb(&b, mk_lb("default", "d1", json!({"ipam": "dhcp"}))).await;
        let lb = allocated(&b, "default", "d1").await;
        assert_eq!(lb["status"]["allocatedAddress"], json!({"ip": "0.0.0.0"}));
        // The guest's kube-vip reports the leased address; the controller does not invent one.
        assert!(lb["status"]["address"].is_null());
        let p = pool(&b, "pool1").await;
        assert!(p["status"]["allocated"].is_null(), "{p}");
        // Deleting it releases nothing and completes.
        ok(
            call(&b, Method::DELETE, &format!("{LBS}/default/d1"), None).await,
            StatusCode::OK,
        );
        gone(&b, &format!("{LBS}/default/d1")).await;
    }

    pub async fn exhaustion_then_success_after_delete<B: Backend>(b: B) {
        let _r = Reconcilers::start(b.service_store());
        create_pool(
            &b,
            mk_pool(
                "small",
                range("10.0.0.0/24", "10.0.0.10", "10.0.0.11"),
                global(),
            ),
        )
        .await;
        create_lb(&b, mk_lb("default", "lb1", json!({}))).await;
        let first = ip_of(&allocated(&b, "default", "lb1").await);
        create_lb(&b, mk_lb("default", "lb2", json!({}))).await;
        allocated(&b, "default", "lb2").await;
        create_lb(&b, mk_lb("default", "lb3", json!({}))).await;
        let condition = refused(&b, "default", "lb3").await;
        assert_eq!(condition["reason"], "PoolExhausted");
        assert_eq!(
            condition["message"],
            "fail to get ip from pool small, error: no IP addresses available in range set: 10.0.0.10-10.0.0.11"
        );
        events_about(&b, "lb3", "PoolExhausted").await;
        let p = pool(&b, "small").await;
        assert_eq!(p["status"]["available"], 0);

        ok(
            call(&b, Method::DELETE, &format!("{LBS}/default/lb1"), None).await,
            StatusCode::OK,
        );
        // The waiter is woken by the release (its fallback re-check is a minute away).
        let lb3 = allocated(&b, "default", "lb3").await;
        assert_eq!(ip_of(&lb3), first);
        gone(&b, &format!("{LBS}/default/lb1")).await;
        events_about(&b, "lb1", "Released").await;
        assert_consistent(&b).await;
    }

    pub async fn deletion_releases_to_history_and_recreate_gets_old_address<B: Backend>(b: B) {
        let _r = Reconcilers::start(b.service_store());
        create_pool(
            &b,
            mk_pool(
                "pool1",
                range("10.0.0.0/24", "10.0.0.10", "10.0.0.30"),
                global(),
            ),
        )
        .await;
        // An empty `spec.ipam` is pool IPAM, including the release on deletion.
        create_lb(&b, mk_lb("default", "a", json!({}))).await;
        let a = ip_of(&allocated(&b, "default", "a").await);
        create_lb(&b, mk_lb("default", "b", json!({"ipam": "pool"}))).await;
        let b_ip = ip_of(&allocated(&b, "default", "b").await);
        assert_ne!(a, b_ip);

        ok(
            call(&b, Method::DELETE, &format!("{LBS}/default/a"), None).await,
            StatusCode::OK,
        );
        gone(&b, &format!("{LBS}/default/a")).await;
        let p = pool(&b, "pool1").await;
        assert_eq!(p["status"]["allocatedHistory"][&a], "default/a");
        assert!(p["status"]["allocated"].get(&a).is_none());
        assert_eq!(p["status"]["available"], 20);

        // Another load balancer takes the next address, not the remembered one.
        create_lb(&b, mk_lb("default", "c", json!({}))).await;
        let c = ip_of(&allocated(&b, "default", "c").await);
        assert!(c != a && c != b_ip);
        // The same namespace/name gets its old address back.
        create_lb(&b, mk_lb("default", "a", json!({}))).await;
        assert_eq!(ip_of(&allocated(&b, "default", "a").await), a);
        let p = pool(&b, "pool1").await;
        assert!(p["status"]["allocatedHistory"].get(&a).is_none());
        assert_consistent(&b).await;
    }

    pub async fn pool_change_releases_to_the_old_pool<B: Backend>(b: B) {
        let _r = Reconcilers::start(b.service_store());
        create_pool(
            &b,
            mk_pool(
                "p1",
                range("10.1.0.0/24", "10.1.0.10", "10.1.0.20"),
                json!({}),
            ),
        )
        .await;
        create_pool(
            &b,
            mk_pool(
                "p2",
                range("10.2.0.0/24", "10.2.0.10", "10.2.0.20"),
                json!({}),
            ),
        )
        .await;
        create_lb(&b, mk_lb("default", "lb1", json!({"ipPool": "p1"}))).await;
        let lb = allocated(&b, "default", "lb1").await;
        assert_eq!(pool_of(&lb), "p1");
        let mut changed = lb.clone();
        changed["spec"]["ipPool"] = json!("p2");
        ok(
            call(
                &b,
                Method::PUT,
                &format!("{LBS}/default/lb1"),
                Some(changed),
            )
            .await,
            StatusCode::OK,
        );
        eventually("lb1 to move to p2", async || {
            let lb = get(&b, &format!("{LBS}/default/lb1")).await.json();
            (pool_of(&lb) == "p2").then_some(())
        })
        .await;
        let p1 = pool(&b, "p1").await;
        assert_eq!(p1["status"]["allocatedHistory"]["10.1.0.10"], "default/lb1");
        events_about(&b, "lb1", "Released").await;
        assert_consistent(&b).await;
    }

    pub async fn pool_shrink_refused<B: Backend>(b: B) {
        let _r = Reconcilers::start(b.service_store());
        create_pool(
            &b,
            mk_pool(
                "p",
                range("10.0.0.0/24", "10.0.0.10", "10.0.0.20"),
                global(),
            ),
        )
        .await;
        create_lb(&b, mk_lb("default", "lb1", json!({}))).await;
        allocated(&b, "default", "lb1").await;
        let current = pool(&b, "p").await;
        let mut shrunk = current.clone();
        shrunk["spec"]["ranges"] = range("10.0.0.0/24", "10.0.0.15", "10.0.0.20");
        let m = call(&b, Method::PUT, &format!("{POOLS}/p"), Some(shrunk))
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        assert_eq!(
            m,
            "can't update IP pool p because allocated IP 10.0.0.10 is excluded"
        );
        // Growing is fine, and the reconciler recounts.
        let mut grown = current.clone();
        grown["spec"]["ranges"] = range("10.0.0.0/24", "10.0.0.10", "10.0.0.40");
        ok(
            call(&b, Method::PUT, &format!("{POOLS}/p"), Some(grown)).await,
            StatusCode::OK,
        );
        eventually("the grown pool to be recounted", async || {
            let p = pool(&b, "p").await;
            (p["status"]["total"] == 31 && p["status"]["available"] == 30).then_some(())
        })
        .await;
        // The version read before the update is stale now.
        let m = call(&b, Method::PUT, &format!("{POOLS}/p"), Some(current))
            .await
            .error(StatusCode::CONFLICT, "Conflict");
        assert!(m.contains("the object has been modified"), "{m}");
    }

    pub async fn pool_delete_refused_while_allocated<B: Backend>(b: B) {
        let _r = Reconcilers::start(b.service_store());
        create_pool(
            &b,
            mk_pool(
                "p",
                range("10.0.0.0/24", "10.0.0.10", "10.0.0.20"),
                global(),
            ),
        )
        .await;
        create_lb(&b, mk_lb("default", "lb1", json!({}))).await;
        allocated(&b, "default", "lb1").await;
        let m = call(&b, Method::DELETE, &format!("{POOLS}/p"), None)
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        assert_eq!(m, "can't delete pool before releasing all the allocated IP");
        ok(
            call(&b, Method::DELETE, &format!("{LBS}/default/lb1"), None).await,
            StatusCode::OK,
        );
        gone(&b, &format!("{LBS}/default/lb1")).await;
        eventually("the pool to hold nothing", async || {
            pool(&b, "p").await["status"]["allocated"]
                .is_null()
                .then_some(())
        })
        .await;
        ok(
            call(&b, Method::DELETE, &format!("{POOLS}/p"), None).await,
            StatusCode::OK,
        );
        gone(&b, &format!("{POOLS}/p")).await;
    }

    pub async fn guest_cluster_cleanup<B: Backend>(b: B) {
        let _r = Reconcilers::start(b.service_store());
        create_pool(
            &b,
            mk_pool(
                "p",
                range("10.0.0.0/24", "10.0.0.10", "10.0.0.20"),
                global(),
            ),
        )
        .await;
        let cluster_lb = |name: &str, cluster: &str| {
            with_labels(
                mk_lb("default", name, json!({"workloadType": "cluster"})),
                &[("cloudprovider.harvesterhci.io/cluster", cluster)],
            )
        };
        for (name, cluster) in [("gc1-a", "gc1"), ("gc1-b", "gc1"), ("gc2-a", "gc2")] {
            create_lb(&b, cluster_lb(name, cluster)).await;
            allocated(&b, "default", name).await;
        }
        // A VM load balancer with the same label is never touched.
        create_lb(
            &b,
            with_labels(
                mk_lb("default", "vm-lb", json!({})),
                &[("cloudprovider.harvesterhci.io/cluster", "gc1")],
            ),
        )
        .await;
        allocated(&b, "default", "vm-lb").await;

        // A node of guest cluster gc1, as Rancher's node driver makes it.
        let vms = Api::<VirtualMachine>::new(b.store());
        let vm: VirtualMachine = serde_json::from_value(
            support::foreign::vm("gc1-pool1-abcde")
                .label("harvesterhci.io/creator", "docker-machine-driver-harvester")
                .label("guestcluster.harvesterhci.io/name", "gc1")
                .build(),
        )
        .expect("vm");
        vms.create(&vm).await.expect("creates the vm");
        let vm = eventually("the VM to get the cleanup finalizer", async || {
            let vm = vms
                .get("default", "gc1-pool1-abcde")
                .await
                .expect("reads")?;
            vm.metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| {
                    f.iter()
                        .any(|x| x == "wrangler.cattle.io/harvester-lb-vm-controller")
                })
                .then_some(vm)
        })
        .await;
        // Rancher marks the cluster's VMs for removal, then deletes them.
        let mut marked = vm.clone();
        marked.metadata.annotations = Some(
            [(
                "harvesterhci.io/removeAllPersistentVolumeClaims".to_string(),
                "true".to_string(),
            )]
            .into(),
        );
        vms.replace(&marked).await.expect("annotates");
        let m = call(&b, Method::POST, LBS, Some(cluster_lb("gc1-c", "gc1")))
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        assert_eq!(
            m,
            "create loadbalancer default/gc1-c failed with guest cluster check: the vm default/gc1-pool1-abcde shows guest cluster gc1 is being removed"
        );
        vms.delete("default", "gc1-pool1-abcde", &Preconditions::default())
            .await
            .expect("deletes the vm");
        for name in ["gc1-a", "gc1-b"] {
            gone(&b, &format!("{LBS}/default/{name}")).await;
        }
        eventually("the VM to go", async || {
            vms.get("default", "gc1-pool1-abcde")
                .await
                .expect("reads")
                .is_none()
                .then_some(())
        })
        .await;
        for name in ["gc2-a", "vm-lb"] {
            ok(
                get(&b, &format!("{LBS}/default/{name}")).await,
                StatusCode::OK,
            );
        }
        let p = pool(&b, "p").await;
        assert_eq!(
            p["status"]["allocated"]
                .as_object()
                .expect("allocated")
                .len(),
            2
        );
        assert_consistent(&b).await;
    }

    pub async fn manual_release_annotation<B: Backend>(b: B) {
        let _r = Reconcilers::start(b.service_store());
        create_pool(
            &b,
            mk_pool(
                "p",
                range("10.0.0.0/24", "10.0.0.10", "10.0.0.20"),
                global(),
            ),
        )
        .await;
        create_lb(&b, mk_lb("default", "lb1", json!({}))).await;
        let held = ip_of(&allocated(&b, "default", "lb1").await);
        // A leak, as a hand edit or a lost finalizer leaves one: an address held for a load balancer
        // that does not exist.
        let pools = harvester_cloud::crd::pool_api(b.store());
        let mut leaked = pools.get("", "p").await.expect("reads").expect("exists");
        let status = leaked.status.get_or_insert_default();
        status
            .allocated
            .insert("10.0.0.15".into(), "default/ghost".into());
        status.available -= 1;
        pools
            .replace_status(&leaked)
            .await
            .expect("writes the leak");
        let annotate = async |value: &str| {
            // The pool reconciler may write the pool between our read and our write (it answers
            // the leak written above): a 409 then, and a client reads again, as kubectl does.
            let mut tries = 0;
            loop {
                let mut p = pool(&b, "p").await;
                p["metadata"]["annotations"] =
                    json!({"loadbalancer.harvesterhci.io/manuallyReleaseIP": value});
                let r = call(&b, Method::PUT, &format!("{POOLS}/p"), Some(p)).await;
                tries += 1;
                if r.status == StatusCode::CONFLICT && tries < 10 {
                    continue;
                }
                ok(r, StatusCode::OK);
                break;
            }
            eventually("the annotation to be removed", async || {
                let p = pool(&b, "p").await;
                p["metadata"]["annotations"]
                    .get("loadbalancer.harvesterhci.io/manuallyReleaseIP")
                    .is_none()
                    .then_some(p)
            })
            .await
        };
        // The load balancer still exists: its own address is not released.
        let p = annotate(&format!("{held}: default/lb1")).await;
        assert_eq!(p["status"]["allocated"][&held], "default/lb1");
        // The holder does not match: nothing happens.
        let p = annotate("10.0.0.15: default/other").await;
        assert_eq!(p["status"]["allocated"]["10.0.0.15"], "default/ghost");
        // The holder matches and is gone: released into the history.
        let p = annotate("10.0.0.15: default/ghost").await;
        assert!(p["status"]["allocated"].get("10.0.0.15").is_none(), "{p}");
        assert_eq!(
            p["status"]["allocatedHistory"]["10.0.0.15"],
            "default/ghost"
        );
        assert_consistent(&b).await;
    }

    /// A body's `metadata.deletionTimestamp` is not the store's: it does not make admission treat
    /// the object as being deleted (the store drops the claim and would keep the object unchecked).
    pub async fn a_claimed_deletion_does_not_skip_admission<B: Backend>(b: B) {
        let _r = Reconcilers::start(b.service_store());
        let claimed = json!("2026-01-01T00:00:00Z");
        create_pool(
            &b,
            mk_pool(
                "held",
                range("10.60.0.0/24", "10.60.0.10", "10.60.0.20"),
                global(),
            ),
        )
        .await;
        create_lb(&b, mk_lb("default", "holder", json!({}))).await;
        allocated(&b, "default", "holder").await;
        // A second pool over the same addresses, created plainly, then PUT claiming deletion.
        let mut other = mk_pool(
            "other",
            range("10.61.0.0/24", "10.61.0.10", "10.61.0.20"),
            json!({"scope": [{"project": "p", "namespace": "ns1", "guestCluster": "*"}]}),
        );
        let created = ok(
            call(&b, Method::POST, POOLS, Some(other.clone())).await,
            StatusCode::CREATED,
        );
        other["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"].clone();
        other["metadata"]["deletionTimestamp"] = claimed.clone();
        other["spec"]["ranges"] = range("10.60.0.0/24", "10.60.0.10", "10.60.0.20");
        let m = call(&b, Method::PUT, &format!("{POOLS}/other"), Some(other))
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        assert!(m.contains("overlap"), "{m}");
        assert_eq!(
            pool(&b, "other").await["spec"]["ranges"][0]["subnet"],
            "10.61.0.0/24",
            "nothing of the refused update was stored"
        );
        // A LoadBalancer with duplicate listener names and port 0, claiming deletion.
        let mut lb = ok(
            get(&b, &format!("{LBS}/default/holder")).await,
            StatusCode::OK,
        );
        lb["metadata"]["deletionTimestamp"] = claimed;
        lb["spec"]["listeners"] = json!([
            {"name": "a", "port": 0, "protocol": "TCP", "backendPort": 1},
            {"name": "a", "port": 81, "protocol": "TCP", "backendPort": 2}
        ]);
        call(&b, Method::PUT, &format!("{LBS}/default/holder"), Some(lb))
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        // And a create claiming deletion is judged as a create.
        let mut fresh = mk_lb("default", "fresh", json!({"listeners": []}));
        fresh["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        call(&b, Method::POST, LBS, Some(fresh))
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
    }

    /// The edges of the contract: undecodable path segments and invalid namespaces name nothing
    /// (404 in the error shape), a listener protocol a Service cannot take and a range with no
    /// address to give are refused, and a pool far larger than a cloud-config body is taken.
    pub async fn contract_edges<B: Backend>(b: B) {
        get(&b, &format!("{POOLS}/%FF%FE"))
            .await
            .error(StatusCode::NOT_FOUND, "NotFound");
        get(&b, &format!("{LBS}/Not_A_Namespace"))
            .await
            .error(StatusCode::NOT_FOUND, "NotFound");
        let sctpx = mk_lb(
            "default",
            "sctpx",
            json!({"listeners": [{"name": "a", "port": 80, "protocol": "SCTPX", "backendPort": 80}]}),
        );
        let m = call(&b, Method::POST, LBS, Some(sctpx))
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        assert!(m.contains("protocol \"SCTPX\""), "{m}");
        let m = call(
            &b,
            Method::POST,
            POOLS,
            Some(mk_pool(
                "v6-127",
                json!([{"subnet": "2001:db8::/127"}]),
                global(),
            )),
        )
        .await
        .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        assert!(m.contains("no address to allocate"), "{m}");
        // 2,500 ranges: about 75 KB, past the cloud-config routes' 64 KiB.
        let ranges: Vec<Value> = (0..2500)
            .map(|i| json!({"subnet": format!("10.{}.{}.{}/32", 180 + i / 65536, (i / 256) % 256, i % 256)}))
            .collect();
        let big = mk_pool(
            "many-ranges",
            Value::Array(ranges),
            json!({"scope": [{"project": "p", "namespace": "ns9", "guestCluster": "*"}]}),
        );
        assert!(big.to_string().len() > 64 * 1024);
        ok(
            call(&b, Method::POST, POOLS, Some(big)).await,
            StatusCode::CREATED,
        );
    }

    /// A pool that reaches 90% use gets one PoolNearlyFull Warning, and `ippool_usage_ratio`
    /// follows its allocations.
    pub async fn nearly_full_pools_warn<B: Backend>(b: B) {
        let r = Reconcilers::start(b.service_store());
        ensure_namespace(&b, "crowd", None).await;
        // Ten addresses (.1 is the gateway, outside the range).
        create_pool(
            &b,
            mk_pool(
                "crowded",
                range("192.168.120.0/24", "192.168.120.10", "192.168.120.19"),
                json!({"scope": [{"project": "*", "namespace": "crowd", "guestCluster": "*"}]}),
            ),
        )
        .await;
        for i in 0..9 {
            create_lb(
                &b,
                mk_lb(
                    "crowd",
                    &format!("lb{i}"),
                    json!({"workloadType": "cluster"}),
                ),
            )
            .await;
            allocated(&b, "crowd", &format!("lb{i}")).await;
        }
        let events = events_about(&b, "crowded", "PoolNearlyFull").await;
        assert_eq!(events.len(), 1, "one warning per crossing: {events:?}");
        assert_eq!(events[0].type_.as_deref(), Some("Warning"));
        assert_eq!(
            events[0].message.as_deref(),
            Some("IP pool crowded is 90% used: 9 of 10 addresses allocated, 1 available")
        );
        let key = r#"harvester_cloud_ippool_usage_ratio{pool="crowded"}"#;
        eventually("the usage ratio to be 0.9", async || {
            (harvester_cloud::metrics::sample(&harvester_cloud::metrics::encode(), key)
                == Some(0.9))
            .then_some(())
        })
        .await;
        r.stop().await;
    }

    /// `loadbalancer.harvesterhci.io/requestedIP` and `…/ipFamily`: a free requested address is
    /// given (and its allocation time recorded), a held one is refused naming the holder with
    /// nothing else allocated, one outside every eligible pool is refused, two racing for one
    /// address get it once, the holder's release hands it over; an IPv6 pool serves next to an
    /// IPv4 one (one global pool per network and family), a family asks for it; bad annotations
    /// are refused by admission.
    pub async fn requested_address_and_family<B: Backend>(b: B) {
        let r = Reconcilers::start(b.service_store());
        create_pool(
            &b,
            mk_pool(
                "ask4",
                range("192.168.110.0/24", "192.168.110.10", "192.168.110.20"),
                global(),
            ),
        )
        .await;
        create_pool(
            &b,
            mk_pool(
                "ask6",
                range("fd00:110::/64", "fd00:110::10", "fd00:110::20"),
                global(),
            ),
        )
        .await;
        let asking = |name: &str, annotations: &[(&str, &str)]| {
            with_annotations(
                mk_lb("default", name, json!({"workloadType": "cluster"})),
                annotations,
            )
        };
        const IP: &str = "loadbalancer.harvesterhci.io/requestedIP";
        const FAMILY: &str = "loadbalancer.harvesterhci.io/ipFamily";
        create_lb(&b, asking("want15", &[(IP, "192.168.110.15")])).await;
        let lb = allocated(&b, "default", "want15").await;
        assert_eq!(ip_of(&lb), "192.168.110.15");
        let at = lb["status"]["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .find(|c| c["type"] == "AddressAllocated")
            .expect("the allocation is recorded")
            .clone();
        assert_eq!(at["status"], "True");
        assert_eq!(at["message"], "192.168.110.15 from IP pool ask4");
        assert!(at["lastTransitionTime"].is_string(), "{at}");

        // Held: refused, naming the holder; nothing else allocated.
        create_lb(&b, asking("dup15", &[(IP, "192.168.110.15")])).await;
        let condition = refused(&b, "default", "dup15").await;
        assert_eq!(condition["reason"], "RequestedAddressTaken");
        assert_eq!(
            condition["message"],
            "requested address 192.168.110.15 is held by default/want15 in IP pool ask4"
        );
        assert_eq!(
            pool(&b, "ask4").await["status"]["allocated"],
            json!({"192.168.110.15": "default/want15"})
        );
        // Outside every pool it may use.
        create_lb(&b, asking("outside", &[(IP, "10.0.0.1")])).await;
        let condition = refused(&b, "default", "outside").await;
        assert_eq!(condition["reason"], "RequestedAddressUnavailable");
        assert_eq!(
            condition["message"],
            "requested address 10.0.0.1 is not in any IP pool this load balancer may use (eligible: ask4)"
        );
        // A family: IPv6 from the IPv6 pool; none asked: IPv4 first.
        create_lb(&b, asking("six", &[(FAMILY, "IPv6")])).await;
        assert!(ip_of(&allocated(&b, "default", "six").await).starts_with("fd00:110::"));
        create_lb(&b, asking("any", &[])).await;
        assert!(ip_of(&allocated(&b, "default", "any").await).starts_with("192.168.110."));
        create_lb(&b, asking("six-asked", &[(IP, "fd00:110::1a")])).await;
        assert_eq!(
            ip_of(&allocated(&b, "default", "six-asked").await),
            "fd00:110::1a"
        );

        // Two racing for one address: one gets it.
        let (x, y) = tokio::join!(
            call(
                &b,
                Method::POST,
                LBS,
                Some(asking("race-x", &[(IP, "192.168.110.17")]))
            ),
            call(
                &b,
                Method::POST,
                LBS,
                Some(asking("race-y", &[(IP, "192.168.110.17")]))
            ),
        );
        assert_eq!(x.status, StatusCode::CREATED, "{}", x.text());
        assert_eq!(y.status, StatusCode::CREATED, "{}", y.text());
        let loser = eventually("one racer to be refused", async || {
            for (name, other) in [("race-x", "race-y"), ("race-y", "race-x")] {
                let lb = get(&b, &format!("{LBS}/default/{name}")).await.json();
                let refused = ready(&lb).is_some_and(|c| c["reason"] == "RequestedAddressTaken");
                if refused {
                    return Some((name, other));
                }
            }
            None
        })
        .await;
        let winner = allocated(&b, "default", loser.1).await;
        assert_eq!(ip_of(&winner), "192.168.110.17");
        let lost = get(&b, &format!("{LBS}/default/{}", loser.0)).await.json();
        assert_eq!(lost["status"]["allocatedAddress"]["ip"], Value::Null);

        // The holder goes: the waiting one gets the address.
        ok(
            call(&b, Method::DELETE, &format!("{LBS}/default/want15"), None).await,
            StatusCode::OK,
        );
        let lb = allocated(&b, "default", "dup15").await;
        assert_eq!(ip_of(&lb), "192.168.110.15");
        assert_consistent(&b).await;

        // Admission: what cannot be a request is refused.
        for (annotations, message) in [
            (
                vec![(IP, "nope")],
                "annotation loadbalancer.harvesterhci.io/requestedIP \"nope\" is not an IP address",
            ),
            (
                vec![(FAMILY, "IPv5")],
                "annotation loadbalancer.harvesterhci.io/ipFamily \"IPv5\" is neither IPv4 nor IPv6",
            ),
            (
                vec![(IP, "192.168.110.11"), (FAMILY, "IPv6")],
                "requested address 192.168.110.11 is not an IPv6 address, as annotation loadbalancer.harvesterhci.io/ipFamily asks",
            ),
        ] {
            let refusal = call(&b, Method::POST, LBS, Some(asking("bad", &annotations))).await;
            let text = refusal.error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
            assert_eq!(
                text,
                format!("create loadbalancer default/bad failed: {message}")
            );
        }
        let mut dhcp = asking("bad", &[(IP, "192.168.110.12")]);
        dhcp["spec"]["ipam"] = json!("dhcp");
        let refusal = call(&b, Method::POST, LBS, Some(dhcp)).await;
        assert_eq!(
            refusal.error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent"),
            "create loadbalancer default/bad failed: requested address 192.168.110.12 needs pool IPAM, and spec.ipam is dhcp"
        );
        r.stop().await;
    }

    /// Metadata Kubernetes refuses is refused over HTTP on both backends: 422, with the API
    /// server's message (on the kube backend the API server's own; tests/store_conformance.rs
    /// compares every case).
    pub async fn metadata_is_refused_as_the_api_server_refuses_it<B: Backend>(b: B) {
        let label_msg = "metadata.labels: Invalid value: \"<html>\": a valid label must be an empty string or consist of alphanumeric characters";
        let lb = with_labels(
            mk_lb("default", "html-label", json!({"workloadType": "cluster"})),
            &[("cloudprovider.harvesterhci.io/cluster", "<html>")],
        );
        let message = call(&b, Method::POST, LBS, Some(lb))
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        assert!(message.contains(label_msg), "{message}");
        let mut pool = mk_pool("bad-annotation", range("10.9.0.0/24", "", ""), global());
        pool["metadata"]["annotations"] = json!({"bad key": "v"});
        let message = call(&b, Method::POST, POOLS, Some(pool))
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        assert!(
            message.contains(
                "metadata.annotations: Invalid value: \"bad key\": name part must consist"
            ),
            "{message}"
        );
        // An update is judged too, and nothing of it is kept.
        let mut lb = create_lb(
            &b,
            mk_lb("default", "fine", json!({"workloadType": "cluster"})),
        )
        .await;
        lb["metadata"]["finalizers"] = json!(["bad finalizer"]);
        let message = call(&b, Method::PUT, &format!("{LBS}/default/fine"), Some(lb))
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        assert!(
            message.contains(
                "metadata.finalizers: Invalid value: \"bad finalizer\": name part must consist"
            ),
            "{message}"
        );
        let stored = ok(
            get(&b, &format!("{LBS}/default/fine")).await,
            StatusCode::OK,
        );
        assert!(
            !stored["metadata"]["finalizers"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|f| f == "bad finalizer"),
            "{stored}"
        );
    }

    pub async fn validation_messages<B: Backend>(b: B) {
        let refuse = async |method: Method, path: &str, body: Value| {
            call(&b, method, path, Some(body))
                .await
                .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent")
        };
        // LoadBalancer create.
        let listener = |name: &str, port: i64, protocol: &str, backend: i64| json!({"name": name, "port": port, "protocol": protocol, "backendPort": backend});
        let create_cases = [
            (
                json!({"listeners": []}),
                "failed: the loadbalancer needs to have at least one listener",
            ),
            (
                json!({"listeners": [listener("a", 80, "TCP", 1), listener("a", 81, "TCP", 2)]}),
                "failed: listener has duplicate name a",
            ),
            (
                json!({"listeners": [listener("a", 80, "TCP", 1), listener("b", 80, "TCP", 2)]}),
                "failed: listener b has duplicate port TCP:80 with listener a",
            ),
            (
                json!({"listeners": [listener("a", 80, "TCP", 1), listener("b", 81, "TCP", 1)]}),
                "failed: listener b has duplicate backend port TCP:1 with listener a",
            ),
            (
                json!({"listeners": [listener("a", 65536, "TCP", 1)]}),
                "failed: listener port 65536 must <= 65535",
            ),
            (
                json!({"listeners": [listener("a", 0, "TCP", 1)]}),
                "failed: listener port 0 must >= 1",
            ),
            (
                json!({"listeners": [listener("a", 1, "TCP", 65536)]}),
                "failed: listener backend port 65536 must <= 65535",
            ),
            (
                json!({"listeners": [listener("a", 1, "TCP", 0)]}),
                "failed: listener backend port 0 must >= 1",
            ),
            (
                json!({"listeners": [listener("a", 1, "UDP", 53)], "healthCheck": {"port": 53}}),
                "failed with healthyCheck: healthcheck port 53 can only be a TCP backend port",
            ),
            (
                json!({"listeners": [listener("a", 1, "TCP", 53)], "healthCheck": {"port": 54}}),
                "failed with healthyCheck: healthcheck port 54 is not in listener backend port list",
            ),
            // Ours: the prober's bounds.
            (
                json!({"listeners": [listener("a", 1, "TCP", 53)], "healthCheck": {"port": 53, "periodSeconds": 301}}),
                "failed with healthyCheck: healthcheck PeriodSeconds 301 should <= 300",
            ),
            (
                json!({"listeners": [listener("a", 1, "TCP", 53)], "healthCheck": {"port": 53, "periodSeconds": 1, "timeoutSeconds": 3000000}}),
                "failed with healthyCheck: healthcheck TimeoutSeconds 3000000 should <= PeriodSeconds 1",
            ),
        ];
        for (spec, want) in create_cases {
            let m = refuse(Method::POST, LBS, mk_lb("default", "lb1", spec)).await;
            assert_eq!(m, format!("create loadbalancer default/lb1 {want}"));
        }
        // The thresholds are checked after the mutator filled the defaults, so through the API only
        // an explicit zero... cannot be sent (zero means unset); they pass with defaults.
        let lb = create_lb(
            &b,
            mk_lb(
                "default",
                "hc",
                json!({"listeners": [listener("a", 1, "TCP", 53)], "healthCheck": {"port": 53}}),
            ),
        )
        .await;
        assert_eq!(
            lb["spec"]["healthCheck"],
            json!({"port": 53, "successThreshold": 2, "failureThreshold": 2, "periodSeconds": 1, "timeoutSeconds": 1})
        );
        // pkg/webhook/loadbalancer/validator.go (checkHealthyCheck): any TCP listener on the
        // health-check port passes, even after a UDP one on the same backend port.
        create_lb(
            &b,
            mk_lb(
                "default",
                "hc-udp-first",
                json!({"listeners": [listener("u", 53, "UDP", 53), listener("t", 53, "TCP", 53)], "healthCheck": {"port": 53}}),
            ),
        )
        .await;
        // LoadBalancer update.
        let created = create_lb(&b, mk_lb("default", "upd", json!({"ipam": "pool"}))).await;
        let path = format!("{LBS}/default/upd");
        let mut dhcp = created.clone();
        dhcp["spec"]["ipam"] = json!("dhcp");
        assert_eq!(
            refuse(Method::PUT, &path, dhcp).await,
            "update loadbalancer default/upd failed: can't change the IPAM from pool to dhcp"
        );
        let mut cluster = created.clone();
        cluster["spec"]["workloadType"] = json!("cluster");
        assert_eq!(
            refuse(Method::PUT, &path, cluster).await,
            "update loadbalancer default/upd failed: can't change the WorkloadType from  to cluster"
        );
        let mut no_listener = created.clone();
        no_listener["spec"]["listeners"] = json!([]);
        assert_eq!(
            refuse(Method::PUT, &path, no_listener).await,
            "update loadbalancer default/upd failed: the loadbalancer needs to have at least one listener"
        );
        let mut long_timeout = created.clone();
        long_timeout["spec"]["listeners"] = json!([listener("a", 1, "TCP", 9)]);
        long_timeout["spec"]["healthCheck"] =
            json!({"port": 9, "periodSeconds": 5, "timeoutSeconds": 6});
        assert_eq!(
            refuse(Method::PUT, &path, long_timeout).await,
            "update loadbalancer default/upd failed with healthyCheck: healthcheck TimeoutSeconds 6 should <= PeriodSeconds 5"
        );
        let mut bad_hc = created.clone();
        bad_hc["spec"]["healthCheck"] = json!({"port": 9});
        assert_eq!(
            refuse(Method::PUT, &path, bad_hc).await,
            "update loadbalancer default/upd failed with healthyCheck: healthcheck port 9 is not in listener backend port list"
        );
        // "" <-> pool is allowed.
        let mut empty = created.clone();
        empty["spec"]["ipam"] = json!("");
        ok(
            call(&b, Method::PUT, &path, Some(empty)).await,
            StatusCode::OK,
        );
        // A stale version is a conflict.
        call(&b, Method::PUT, &path, Some(created))
            .await
            .error(StatusCode::CONFLICT, "Conflict");
        // A body whose name is not the URL's.
        let m = refuse(Method::PUT, &path, mk_lb("default", "other", json!({}))).await;
        assert_eq!(
            m,
            "the name of the object (other) does not match the name on the URL (upd)"
        );
        let m = refuse(
            Method::POST,
            LBS,
            json!({"metadata": {"name": "x"}, "spec": {"workloadType": "cluster"}}),
        )
        .await;
        assert_eq!(m, "loadbalancer x: metadata.namespace: Required value");
        let m = refuse(Method::POST, LBS, json!({"metadata": {"name": "x", "namespace": "default"}, "spec": {"listeners": [{"port": "80"}]}})).await;
        assert!(m.starts_with("fail to decode loadbalancer: "), "{m}");
        // The CRD's enums and the object's own apiVersion and kind are checked, as Kubernetes does.
        let m = refuse(
            Method::POST,
            LBS,
            mk_lb("default", "x", json!({"workloadType": "container"})),
        )
        .await;
        assert_eq!(
            m,
            "fail to decode loadbalancer: spec.workloadType: Unsupported value: \"container\": supported values: \"vm\", \"cluster\""
        );
        let mut wrong_kind = mk_lb("default", "x", json!({}));
        wrong_kind["kind"] = json!("IPPool");
        let m = refuse(Method::POST, LBS, wrong_kind).await;
        assert_eq!(
            m,
            "fail to decode loadbalancer: kind must be \"LoadBalancer\", not \"IPPool\""
        );

        // IPPools: the upstream validator's cases.
        let ns_scope =
            |ns: &str| json!({"scope": [{"project": "*", "namespace": ns, "guestCluster": "*"}]});
        create_pool(
            &b,
            mk_pool(
                "global",
                range("10.0.0.0/24", "10.0.0.10", "10.0.0.20"),
                global(),
            ),
        )
        .await;
        create_pool(
            &b,
            mk_pool("prio", range("10.1.0.0/24", "", ""), json!({"priority": 10, "scope": [{"project": "*", "namespace": "a", "guestCluster": "*"}]})),
        )
        .await;
        create_pool(
            &b,
            mk_pool("zero", range("10.2.0.0/24", "", ""), ns_scope("b")),
        )
        .await;
        let pool_cases = [
            (
                mk_pool("p", json!([]), ns_scope("c")),
                "range can't be empty",
            ),
            (
                mk_pool("p", range("10.9.0.0/33", "", ""), ns_scope("c")),
                "invalid CIDR address: 10.9.0.0/33, a valid example is 192.168.1.0/24",
            ),
            (
                mk_pool("p", range("10.9.0.0/24", "10.9.1.1", ""), ns_scope("c")),
                "invalid range start 10.9.1.1: IP 10.9.1.1 is out of subnet 10.9.0.0/24",
            ),
            (
                mk_pool(
                    "p",
                    json!([{"subnet": "10.9.0.0/24", "rangeStart": "10.9.0.1", "rangeEnd": "10.9.0.9"}, {"subnet": "10.9.0.0/24", "rangeStart": "10.9.0.5", "rangeEnd": "10.9.0.20"}]),
                    ns_scope("c"),
                ),
                "there are overlaps between range 10.9.0.1-10.9.0.9 and 10.9.0.5-10.9.0.20",
            ),
            (
                mk_pool(
                    "p",
                    range("10.0.0.0/24", "10.0.0.15", "10.0.0.30"),
                    ns_scope("c"),
                ),
                "the ranges 10.0.0.15-10.0.0.30 overlap with other pools",
            ),
            (
                mk_pool("p", range("10.9.0.0/24", "", ""), global()),
                "there is already a global IP pool: global",
            ),
            (
                mk_pool(
                    "p",
                    range("10.9.0.0/24", "", ""),
                    json!({"scope": [{"project": "*", "namespace": "c", "guestCluster": "*"}, {"project": "x", "namespace": "c", "guestCluster": "y"}]}),
                ),
                "selector {Priority:0 Network: Scope:[{Project:* Namespace:c GuestCluster:*} {Project:x Namespace:c GuestCluster:y}]} is invalid: scope overlaps",
            ),
            (
                mk_pool(
                    "p",
                    range("10.9.0.0/24", "", ""),
                    json!({"priority": 10, "scope": [{"project": "*", "namespace": "c", "guestCluster": "*"}]}),
                ),
                "the priority can't be the same as the pool prio",
            ),
            (
                mk_pool("p", range("10.9.0.0/24", "", ""), ns_scope("b")),
                "scope selector is same as the pool zero with priority 0 Project * Namespace b GuestCluster *, set a different priority or scope",
            ),
        ];
        for (body, want) in pool_cases {
            let m = refuse(Method::POST, POOLS, body).await;
            assert_eq!(m, format!("can't create IP pool p because {want}"));
        }
        // Update messages wrap the same checks.
        let mut zero = pool(&b, "zero").await;
        zero["spec"]["ranges"] = range("10.0.0.0/24", "10.0.0.5", "10.0.0.15");
        let m = refuse(Method::PUT, &format!("{POOLS}/zero"), zero).await;
        assert_eq!(
            m,
            "can't update IP pool zero because the ranges 10.0.0.5-10.0.0.15 overlap with other pools"
        );
        call(&b, Method::GET, &format!("{POOLS}/nope"), None)
            .await
            .error(StatusCode::NOT_FOUND, "NotFound");
        call(
            &b,
            Method::POST,
            POOLS,
            Some(mk_pool(
                "zero",
                range("10.50.0.0/24", "", ""),
                ns_scope("q"),
            )),
        )
        .await
        .error(StatusCode::CONFLICT, "Conflict");
    }

    /// What upstream's IPPool webhooks and range rules accept and refuse, where we used to judge
    /// otherwise: a pool may mix IPv4 and IPv6 ranges (allocated round robin across them, in spec
    /// order); an update may make an allocated address the gateway; a bound naming a /32's only
    /// address, or an IPv6 subnet's last address, is refused; so is a network that is not
    /// `namespace/name`, before any lookup.
    pub async fn upstream_range_and_network_rules<B: Backend>(b: B) {
        let _r = Reconcilers::start(b.service_store());
        let refuse = async |method: Method, path: &str, body: Value| {
            call(&b, method, path, Some(body))
                .await
                .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent")
        };
        // pkg/ipam/allocator.go (MakeRange, parseIP): networkIP and broadcastIP of every subnet.
        for (ranges, want) in [
            (
                range("10.81.0.9/32", "10.81.0.9", ""),
                "invalid range start 10.81.0.9: IP 10.81.0.9 is the network address",
            ),
            (
                range("10.81.0.9/32", "", "10.81.0.9"),
                "invalid range end 10.81.0.9: IP 10.81.0.9 is the network address",
            ),
            (
                range("fd00:81::/120", "fd00:81::10", "fd00:81::ff"),
                "invalid range end fd00:81::ff: IP fd00:81::ff is the broadcast address",
            ),
        ] {
            let m = refuse(Method::POST, POOLS, mk_pool("p", ranges, global())).await;
            assert_eq!(m, format!("can't create IP pool p because {want}"));
        }
        // pkg/utils/vid.go (GetVid): "invalid network" when the network does not split in two.
        for network in ["vlan10", "default/vlan10/x"] {
            let m = refuse(
                Method::POST,
                POOLS,
                mk_pool(
                    "p",
                    range("10.81.0.0/24", "", ""),
                    json!({"network": network, "scope": [{"project": "*", "namespace": "n", "guestCluster": "*"}]}),
                ),
            )
            .await;
            assert_eq!(
                m,
                format!("can't create IP pool p because invalid network {network}")
            );
        }
        // A /32 without bounds is its one address, with no gateway.
        create_pool(
            &b,
            mk_pool(
                "one",
                range("10.81.1.9/32", "", ""),
                json!({"scope": [{"project": "*", "namespace": "one", "guestCluster": "*"}]}),
            ),
        )
        .await;

        // pkg/ipam/rangeset.go: both families in one pool; the CNI range set walks them in order.
        let mixed = json!([
            {"subnet": "10.80.0.0/24", "rangeStart": "10.80.0.10", "rangeEnd": "10.80.0.11"},
            {"subnet": "fd00:80::/120", "rangeStart": "fd00:80::10", "rangeEnd": "fd00:80::11"},
        ]);
        create_pool(&b, mk_pool("mixed", mixed, global())).await;
        eventually("the mixed pool to be counted", async || {
            (pool(&b, "mixed").await["status"]["total"] == 4).then_some(())
        })
        .await;
        let mut got = Vec::new();
        for name in ["lb1", "lb2", "lb3", "lb4"] {
            create_lb(&b, mk_lb("default", name, json!({"ipam": "pool"}))).await;
            got.push(ip_of(&allocated(&b, "default", name).await));
        }
        assert_eq!(
            got,
            ["10.80.0.10", "10.80.0.11", "fd00:80::10", "fd00:80::11"]
        );
        let lb3 = allocated(&b, "default", "lb3").await;
        assert_eq!(
            lb3["status"]["allocatedAddress"]["mask"],
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00"
        );
        assert_eq!(lb3["status"]["allocatedAddress"]["gateway"], "fd00:80::1");

        // pkg/webhook/ippool/validator.go (checkAllocated): the gateway counts as inside the range,
        // so lb1's address may become the gateway; it stays held, and no longer counts.
        let mut current = pool(&b, "mixed").await;
        current["spec"]["ranges"][0]["gateway"] = json!("10.80.0.10");
        ok(
            call(&b, Method::PUT, &format!("{POOLS}/mixed"), Some(current)).await,
            StatusCode::OK,
        );
        eventually("the pool to be recounted", async || {
            let p = pool(&b, "mixed").await;
            (p["status"]["total"] == 3).then_some(())
        })
        .await;
        let p = pool(&b, "mixed").await;
        assert_eq!(p["status"]["allocated"]["10.80.0.10"], "default/lb1");
        // Upstream's pool controller would write total - len(allocated) = -1
        // (pkg/controller/ippool/controller.go); ours counts only addresses it could hand out.
        assert_eq!(p["status"]["available"], 0);
        assert_eq!(ip_of(&allocated(&b, "default", "lb1").await), "10.80.0.10");
        // Shrinking past it is still refused.
        let mut shrunk = pool(&b, "mixed").await;
        shrunk["spec"]["ranges"][0]["rangeStart"] = json!("10.80.0.11");
        assert_eq!(
            refuse(Method::PUT, &format!("{POOLS}/mixed"), shrunk).await,
            "can't update IP pool mixed because allocated IP 10.80.0.10 is excluded"
        );
    }

    pub async fn authentication_is_required<B: Backend>(b: B) {
        for (method, path) in [
            (Method::GET, POOLS.to_string()),
            (Method::POST, POOLS.to_string()),
            (Method::GET, format!("{POOLS}/p")),
            (Method::PUT, format!("{POOLS}/p")),
            (Method::DELETE, format!("{POOLS}/p")),
            (Method::GET, LBS.to_string()),
            (Method::POST, LBS.to_string()),
            (Method::GET, format!("{LBS}/default")),
            (Method::GET, format!("{LBS}/default/x")),
            (Method::PUT, format!("{LBS}/default/x")),
            (Method::DELETE, format!("{LBS}/default/x")),
        ] {
            b.call(method, &path, None, Body::empty())
                .await
                .error(StatusCode::UNAUTHORIZED, "Unauthorized");
        }
    }

    pub async fn restart_resyncs_without_double_assignment<B: Backend>(b: B) {
        let r = Reconcilers::start(b.service_store());
        create_pool(
            &b,
            mk_pool(
                "p",
                range("10.0.0.0/24", "10.0.0.10", "10.0.0.100"),
                global(),
            ),
        )
        .await;
        for i in 0..20 {
            create_lb(&b, mk_lb("default", &format!("lb{i}"), json!({}))).await;
        }
        let mut before = HashMap::new();
        for i in 0..20 {
            let name = format!("lb{i}");
            before.insert(name.clone(), ip_of(&allocated(&b, "default", &name).await));
        }
        r.stop().await;
        // While no reconciler runs: some go, some come (the API works without them).
        for i in 0..5 {
            ok(
                call(&b, Method::DELETE, &format!("{LBS}/default/lb{i}"), None).await,
                StatusCode::OK,
            );
        }
        for i in 20..30 {
            create_lb(&b, mk_lb("default", &format!("lb{i}"), json!({}))).await;
        }
        let b = b.restart().await;
        let _r = Reconcilers::start(b.service_store());
        for i in 0..5 {
            gone(&b, &format!("{LBS}/default/lb{i}")).await;
        }
        for i in 5..30 {
            let name = format!("lb{i}");
            let ip = ip_of(&allocated(&b, "default", &name).await);
            if let Some(old) = before.get(&name) {
                assert_eq!(&ip, old, "{name} kept its address across the restart");
            }
        }
        assert_consistent(&b).await;
    }

    pub async fn webhook_answers_admission_reviews<B: Backend>(b: B) {
        let review = |operation: &str, kind: &str, object: Value, old: Value| {
            json!({
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {
                    "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                    "kind": {"group": "loadbalancer.harvesterhci.io", "version": "v1beta1", "kind": kind},
                    "resource": {"group": "loadbalancer.harvesterhci.io", "version": "v1beta1", "resource": "x"},
                    "name": if object.is_null() { old["metadata"]["name"].clone() } else { object["metadata"]["name"].clone() },
                    "operation": operation,
                    "userInfo": {"username": "admin"},
                    "object": object,
                    "oldObject": old,
                    "dryRun": false
                }
            })
        };
        let post = async |path: &str, body: Value| {
            let r = b
                .call(Method::POST, path, None, Body::from(body.to_string()))
                .await;
            ok(r, StatusCode::OK)["response"].clone()
        };
        let bad = mk_lb("default", "lb1", json!({"listeners": []}));
        let resp = post(
            "/v1/webhook/validation",
            review("CREATE", "LoadBalancer", bad, Value::Null),
        )
        .await;
        assert_eq!(resp["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(resp["allowed"], false);
        assert_eq!(
            resp["status"]["message"],
            "create loadbalancer default/lb1 failed: the loadbalancer needs to have at least one listener"
        );
        let good = mk_lb("default", "lb1", json!({}));
        let resp = post(
            "/v1/webhook/validation",
            review("CREATE", "LoadBalancer", good.clone(), Value::Null),
        )
        .await;
        assert_eq!(resp["allowed"], true);
        let mut dhcp = good.clone();
        dhcp["spec"]["ipam"] = json!("dhcp");
        let resp = post(
            "/v1/webhook/validation",
            review("UPDATE", "LoadBalancer", dhcp, good.clone()),
        )
        .await;
        assert_eq!(
            resp["status"]["message"],
            "update loadbalancer default/lb1 failed: can't change the IPAM from  to dhcp"
        );
        let mut held = mk_pool("p", range("10.0.0.0/24", "", ""), global());
        held["status"] = json!({"total": 253, "available": 252, "lastAllocated": "10.0.0.2", "allocated": {"10.0.0.2": "default/lb1"}});
        let resp = post(
            "/v1/webhook/validation",
            review("DELETE", "IPPool", Value::Null, held),
        )
        .await;
        assert_eq!(
            resp["status"]["message"],
            "can't delete pool before releasing all the allocated IP"
        );
        // The mutating webhook patches labels and annotations.
        let resp = post(
            "/v1/webhook/mutation",
            review(
                "CREATE",
                "IPPool",
                mk_pool("p", range("10.0.0.0/24", "", ""), global()),
                Value::Null,
            ),
        )
        .await;
        assert_eq!(resp["allowed"], true);
        assert_eq!(resp["patchType"], "JSONPatch", "{resp}");
        use base64::Engine;
        let patch = base64::engine::general_purpose::STANDARD
            .decode(resp["patch"].as_str().expect("patch"))
            .expect("base64");
        let patch: Value = serde_json::from_slice(&patch).expect("JSON patch");
        assert_eq!(
            patch,
            json!([{"op": "add", "path": "/metadata/labels", "value": {
                "loadbalancer.harvesterhci.io/global-ip-pool": "true",
                "loadbalancer.harvesterhci.io/vid": "0"}}])
        );
        // Garbage is a 422, not a crash.
        b.call(
            Method::POST,
            "/v1/webhook/validation",
            None,
            Body::from("{"),
        )
        .await
        .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
    }

    /// `GET …/loadbalancers/{namespace}/{name}/events` lists what the reconciler said about that
    /// load balancer alone, and only about this incarnation of it (a deleted namesake's Events
    /// stay in the store but not in the list), oldest first; 404 for one that does not exist.
    pub async fn load_balancer_events_are_listed<B: Backend>(b: B) {
        let _r = Reconcilers::start(b.service_store());
        create_pool(
            &b,
            mk_pool(
                "one",
                range("10.0.0.0/24", "10.0.0.10", "10.0.0.10"),
                global(),
            ),
        )
        .await;
        let events = async |name: &str, reason: &str| {
            let path = format!("{LBS}/default/{name}/events");
            eventually(&format!("a {reason} event listed for {name}"), async || {
                let list = ok(get(&b, &path).await, StatusCode::OK);
                let items = list["items"].as_array().expect("items").clone();
                items
                    .iter()
                    .any(|e| e["reason"] == reason)
                    .then_some((list, items))
            })
            .await
        };
        create_lb(&b, mk_lb("default", "e1", json!({}))).await;
        let old = allocated(&b, "default", "e1").await;
        create_lb(&b, mk_lb("default", "e2", json!({}))).await;
        refused(&b, "default", "e2").await;

        let (list, items) = events("e2", "PoolExhausted").await;
        assert_eq!(list["apiVersion"], "v1");
        assert_eq!(list["kind"], "EventList");
        assert!(list["metadata"]["resourceVersion"].is_string(), "{list}");
        for e in &items {
            assert_eq!(e["kind"], "Event");
            assert_eq!(e["involvedObject"]["kind"], "LoadBalancer");
            assert_eq!(e["involvedObject"]["name"], "e2", "{e}");
            assert_eq!(e["type"], "Warning", "{e}");
        }
        let (_, items) = events("e1", "Allocated").await;
        assert!(items.iter().all(|e| e["involvedObject"]["name"] == "e1"));

        // Deleted and created again: the new e1 (which waits behind e2 for the one address) lists
        // its own Events only, while the old e1's are still stored.
        ok(
            call(&b, Method::DELETE, &format!("{LBS}/default/e1"), None).await,
            StatusCode::OK,
        );
        gone(&b, &format!("{LBS}/default/e1")).await;
        allocated(&b, "default", "e2").await;
        events_about(&b, "e1", "Released").await;
        let new = create_lb(&b, mk_lb("default", "e1", json!({}))).await;
        assert_ne!(new["metadata"]["uid"], old["metadata"]["uid"]);
        let (_, items) = events("e1", "PoolExhausted").await;
        for e in &items {
            assert_eq!(e["involvedObject"]["uid"], new["metadata"]["uid"], "{e}");
        }
        assert!(
            !items
                .iter()
                .any(|e| e["reason"] == "Allocated" || e["reason"] == "Released"),
            "the old e1's Events are not the new one's: {items:?}"
        );
        let stored = events_about(&b, "e1", "Allocated").await;
        assert_eq!(
            stored[0].involved_object.uid.as_deref(),
            old["metadata"]["uid"].as_str()
        );
        // Oldest first.
        let (_, items) = events("e2", "Allocated").await;
        let reasons: Vec<&str> = items.iter().filter_map(|e| e["reason"].as_str()).collect();
        let exhausted = reasons.iter().position(|r| *r == "PoolExhausted");
        let allocated_at = reasons.iter().position(|r| *r == "Allocated");
        assert!(exhausted < allocated_at, "{reasons:?}");

        get(&b, &format!("{LBS}/default/nobody/events"))
            .await
            .error(StatusCode::NOT_FOUND, "NotFound");
    }
}

suite!(
    [embedded => EmbeddedBackend::start(), kube => KubeBackend::start()],
    [
        allocation_end_to_end,
        selection_matrix,
        dhcp,
        exhaustion_then_success_after_delete,
        deletion_releases_to_history_and_recreate_gets_old_address,
        pool_change_releases_to_the_old_pool,
        pool_shrink_refused,
        pool_delete_refused_while_allocated,
        manual_release_annotation,
        guest_cluster_cleanup,
        validation_messages,
        metadata_is_refused_as_the_api_server_refuses_it,
        upstream_range_and_network_rules,
        a_claimed_deletion_does_not_skip_admission,
        contract_edges,
        authentication_is_required,
        restart_resyncs_without_double_assignment,
        only_the_leader_reconciles_and_the_other_takes_over,
        load_balancer_events_are_listed,
        requested_address_and_family,
        nearly_full_pools_warn,
    ]
);

/// The admission webhooks, as the Kubernetes API server calls them (the embedded store serves
/// none: nothing calls them there, and answering anyone would only tell which pools exist).
mod webhooks {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kube_answers_admission_reviews() {
        cases::webhook_answers_admission_reviews(KubeBackend::start().await).await
    }

    /// An UPDATE review carries the object and the old object: a pool with thousands of
    /// allocations is far more than the cloud-config routes' 64 KiB, and is answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kube_answers_reviews_of_large_objects() {
        let b = KubeBackend::start().await;
        let allocated: serde_json::Map<String, Value> = (0..1400)
            .map(|i| {
                (
                    format!("10.90.{}.{}", i / 250, 1 + i % 250),
                    json!(format!("default/lb-with-a-rather-long-name-{i:05}")),
                )
            })
            .collect();
        let mut old = mk_pool("big", json!([{"subnet": "10.90.0.0/16"}]), global());
        old["status"] = json!({"allocated": allocated, "total": 65534, "available": 64134});
        let mut new = old.clone();
        new["metadata"]["labels"] = json!({"edited": "yes"});
        let review = json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "big-review",
                "kind": {"group": "loadbalancer.harvesterhci.io", "version": "v1beta1", "kind": "IPPool"},
                "resource": {"group": "loadbalancer.harvesterhci.io", "version": "v1beta1", "resource": "ippools"},
                "name": "big", "operation": "UPDATE", "userInfo": {"username": "admin"},
                "object": new, "oldObject": old, "dryRun": false
            }
        });
        assert!(review.to_string().len() > 64 * 1024);
        let r = b
            .call(
                Method::POST,
                "/v1/webhook/validation",
                None,
                Body::from(review.to_string()),
            )
            .await;
        let v = ok(r, StatusCode::OK);
        assert_eq!(v["response"]["uid"], "big-review");
    }

    #[tokio::test]
    async fn the_embedded_store_serves_no_webhooks() {
        let b = EmbeddedBackend::start().await;
        for path in ["/v1/webhook/validation", "/v1/webhook/mutation"] {
            let m = b
                .call(Method::POST, path, None, Body::from("{}"))
                .await
                .error(StatusCode::NOT_FOUND, "NotFound");
            assert!(m.contains("no admission webhooks here"), "{m}");
        }
    }
}

// --- Leader election: two replicas on one store -------------------------------------------------

mod replicas {
    use super::*;
    use harvester_cloud::controller::leader::{LeaseElector, LeaseTiming};

    fn replica(
        store: Arc<dyn ObjectStore>,
        identity: &str,
    ) -> (CancellationToken, tokio::task::JoinHandle<()>) {
        let stop = CancellationToken::new();
        let timing = LeaseTiming {
            lease_duration: Duration::from_secs(1),
            renew_deadline: Duration::from_millis(800),
            retry_period: Duration::from_millis(100),
        };
        let elector = LeaseElector::new(
            store.clone(),
            "harvester-system",
            "harvester-cloud-lb",
            identity,
            timing,
        );
        let settings = lb::Settings {
            concurrency: 32,
            identity: identity.into(),
            ..lb::Settings::default()
        };
        let task = tokio::spawn(lb::run(store, settings, Arc::new(elector), stop.clone()));
        (stop, task)
    }

    async fn reporters<B: Backend>(b: &B) -> Vec<String> {
        let mut who: Vec<String> = Api::<Event>::new(b.store())
            .list(None, &LabelSelector::everything())
            .await
            .expect("lists events")
            .into_iter()
            // The API server's own controllers report Events too (its Service IP repair).
            .filter(|e| e.reporting_component.as_deref() == Some("harvester-cloud-lb"))
            .filter_map(|e| e.reporting_instance)
            .collect();
        who.sort();
        who.dedup();
        who
    }

    /// Two replicas on one store: only the Lease holder reconciles; when it dies without releasing
    /// the Lease, the other takes over after the Lease expires, and nothing is assigned twice.
    pub async fn only_the_leader_reconciles_and_the_other_takes_over<B: Backend>(b: B) {
        let (_a_stop, a) = replica(b.service_store(), "replica-a");
        // `a` leads before `b` starts.
        eventually("replica-a to hold the lease", async || {
            let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::new(b.store())
                .get("harvester-system", "harvester-cloud-lb")
                .await
                .expect("reads")?;
            (lease.spec?.holder_identity.as_deref() == Some("replica-a")).then_some(())
        })
        .await;
        let (b_stop, b_task) = replica(b.service_store(), "replica-b");
        create_pool(
            &b,
            mk_pool(
                "p",
                range("10.0.0.0/24", "10.0.0.10", "10.0.0.200"),
                global(),
            ),
        )
        .await;
        for i in 0..20 {
            create_lb(&b, mk_lb("default", &format!("lb{i}"), json!({}))).await;
        }
        for i in 0..20 {
            allocated(&b, "default", &format!("lb{i}")).await;
        }
        for i in 0..20 {
            events_about(&b, &format!("lb{i}"), "Allocated").await;
        }
        assert_eq!(reporters(&b).await, ["replica-a"]);

        // `a` dies: no release, no cleanup.
        a.abort();
        let _ = a.await;
        for i in 20..40 {
            create_lb(&b, mk_lb("default", &format!("lb{i}"), json!({}))).await;
        }
        ok(
            call(&b, Method::DELETE, &format!("{LBS}/default/lb0"), None).await,
            StatusCode::OK,
        );
        for i in 20..40 {
            allocated(&b, "default", &format!("lb{i}")).await;
        }
        gone(&b, &format!("{LBS}/default/lb0")).await;
        events_about(&b, "lb39", "Allocated").await;
        assert_eq!(reporters(&b).await, ["replica-a", "replica-b"]);
        assert_consistent(&b).await;
        b_stop.cancel();
        b_task.await.expect("stops");
    }
}

// --- Stored data that does not decode (embedded store: on Kubernetes the CRD's schema keeps it out) --

mod undecodable {
    use super::*;

    /// One LoadBalancer the store holds but that does not decode as one: the list leaves it out
    /// (and the log says which), and reading it is the server's error, not the client's.
    #[tokio::test]
    async fn a_broken_object_is_left_out_of_lists_and_is_a_500() {
        let b = EmbeddedBackend::start().await;
        create_lb(&b, mk_lb("default", "good", json!({}))).await;
        let broken = json!({
            "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
            "metadata": {"name": "broken", "namespace": "default"},
            "spec": {"listeners": "not a list"}
        });
        b.store()
            .create(&harvester_cloud::crd::lb_kind(), broken)
            .await
            .expect("the raw store keeps anything JSON");
        let list = ok(get(&b, LBS).await, StatusCode::OK);
        let names: Vec<&str> = list["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["good"]);
        get(&b, &format!("{LBS}/default/broken"))
            .await
            .error(StatusCode::INTERNAL_SERVER_ERROR, "ServerError");
    }

    /// A row that is not even JSON does not keep the service from starting: it is logged and
    /// left out, and everything else is served.
    #[tokio::test]
    async fn a_corrupt_row_does_not_stop_the_start() {
        let b = EmbeddedBackend::start().await;
        create_lb(&b, mk_lb("default", "kept", json!({}))).await;
        create_lb(&b, mk_lb("default", "corrupted", json!({}))).await;
        sqlx::query("UPDATE objects SET body = '{not json' WHERE name = 'corrupted'")
            .execute(b.app.store.pool())
            .await
            .unwrap();
        let b = b.restart().await;
        ok(
            get(&b, &format!("{LBS}/default/kept")).await,
            StatusCode::OK,
        );
        get(&b, &format!("{LBS}/default/corrupted"))
            .await
            .error(StatusCode::NOT_FOUND, "NotFound");
    }
}

/// A pool's VM network where VM networks exist (the Kubernetes backend): its VLAN ID is read as
/// upstream's mutator reads it, or the pool is refused.
mod kube_networks {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_vlan_id_must_read() {
        let b = KubeBackend::start().await;
        let probe = support::Refusals::refusal_probes(&b);
        let nads = Api::<NetworkAttachmentDefinition>::new(b.store());
        for (name, vlan_label, config) in [
            ("label-ten", Some("ten"), "{}"),
            ("label-zeros", Some("007"), "{}"),
            ("config-12", None, r#"{"type":"bridge","vlan":12}"#),
            ("config-text", None, "not json"),
            ("config-string", None, r#"{"vlan":"5"}"#),
        ] {
            let mut nad = support::foreign::nad(name).config(config);
            if let Some(vlan) = vlan_label {
                nad = nad.label("network.harvesterhci.io/vlan-id", vlan);
            }
            let nad: NetworkAttachmentDefinition =
                serde_json::from_value(nad.build()).expect("nad");
            nads.create(&nad).await.expect("creates");
        }
        let on = |pool: &str, network: &str, subnet: &str| {
            mk_pool(
                pool,
                range(subnet, "", ""),
                json!({"network": format!("default/{network}"), "scope": [{"project": "*", "namespace": pool, "guestCluster": "*"}]}),
            )
        };
        // pkg/utils/vid.go (GetVid): the label through strconv.Atoi, else the config's vlan.
        for (pool, network, subnet, vid) in [
            ("a", "label-zeros", "10.82.1.0/24", "7"),
            ("b", "config-12", "10.82.2.0/24", "12"),
        ] {
            let made = create_pool(&b, on(pool, network, subnet)).await;
            assert_eq!(
                made["metadata"]["labels"]["loadbalancer.harvesterhci.io/vid"],
                vid
            );
        }
        let refuse = async |body: Value| {
            call(&b, Method::POST, POOLS, Some(body))
                .await
                .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent")
        };
        assert_eq!(
            refuse(on("c", "label-ten", "10.82.3.0/24")).await,
            "can't create IP pool c because invalid vlan ten"
        );
        for network in ["config-text", "config-string"] {
            let m = refuse(on("c", network, "10.82.3.0/24")).await;
            assert!(
                m.starts_with(&format!(
                    "can't create IP pool c because the config of network-attachment-definition default/{network} does not decode: "
                )),
                "{m}"
            );
        }
        // An update is judged the same way.
        let mut a = pool(&b, "a").await;
        a["spec"]["selector"]["network"] = json!("default/label-ten");
        let m = call(&b, Method::PUT, &format!("{POOLS}/a"), Some(a))
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        assert_eq!(m, "can't update IP pool a because invalid vlan ten");
        for p in probe {
            p.assert_none_refused();
        }
    }
}
