//! VM load balancers end to end, on both backends, with real TCP and HTTP listeners as backends.
//!
//! Each case runs by itself in a private network namespace (`support::netns`): the backends
//! listen on documentation addresses (203.0.113.2 and .3) on its `lo`, because kube-apiserver
//! refuses loopback addresses in EndpointSlices; on Kubernetes the case's own control plane runs in
//! there too. The VMIs are built from KubeVirt's Go types (`support::foreign`) and written as
//! KubeVirt writes them, status included (on Kubernetes under KubeVirt's own CRD, which has no
//! status subresource; on the embedded store through the steve-style API), and
//! on Kubernetes the case plays kube-vip: it fills the Service's ingress. On the embedded store the
//! service does that itself.

#![allow(async_fn_in_trait)]

#[macro_use]
mod support;

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU16, AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::http::{Method, StatusCode};
use harvester_cloud::{
    crd::kinds::VirtualMachineInstance,
    lb,
    store::{Api, LabelSelector},
};
use k8s_openapi::api::{
    core::v1::{Event, Service},
    discovery::v1::EndpointSlice,
};
use serde_json::{Value, json};
use support::{
    Backend, EmbeddedBackend, KubeBackend, Refusals, eventually,
    lb::{LBS, POOLS, Reconcilers, create_pool, global, mk_pool, range},
    netns,
};

const VMIS: &str = "/v1/harvester/kubevirt.io.virtualmachineinstances";
const NS: &str = "default";
const DUMMY: &str = "10.52.0.255";

/// The reconcilers' settings: the Services' ingress filled by them (the embedded store, where no
/// kube-vip runs) or by the case (Kubernetes, where the case plays kube-vip).
fn ingress_filled(fill_service_ingress: bool) -> lb::Settings {
    lb::Settings {
        fill_service_ingress,
        ..support::lb::settings()
    }
}

/// The pool the cases' load balancers take their addresses from.
fn vms_pool() -> Value {
    mk_pool(
        "vms",
        range("192.168.100.0/24", "192.168.100.10", "192.168.100.20"),
        global(),
    )
}

/// What the cases need of a backend beyond its HTTP API.
pub trait VmEnv {
    type B: Backend;
    fn b(&self) -> &Self::B;
    /// Whether the case must fill the Services' ingress (no one else does on Kubernetes).
    fn plays_kube_vip(&self) -> bool;
    /// Creates or replaces a VMI, `status` included, as KubeVirt writes it.
    async fn put_vmi(&self, vmi: Value);
    async fn delete_vmi(&self, name: &str);
    async fn service(&self, name: &str) -> Option<Value>;
    async fn slice(&self, name: &str) -> Option<Value>;
}

pub struct Embedded {
    b: EmbeddedBackend,
    _reconcilers: Reconcilers,
}

pub struct Kube {
    b: KubeBackend,
    _reconcilers: Reconcilers,
}

async fn embedded() -> Embedded {
    let b = EmbeddedBackend::start().await;
    let r = Reconcilers::start_with(b.service_store(), ingress_filled(true));
    Embedded { b, _reconcilers: r }
}

async fn kube() -> Kube {
    let b = KubeBackend::start_on(netns::control_plane().await, &[]).await;
    let r = Reconcilers::start_with(b.service_store(), ingress_filled(false));
    Kube { b, _reconcilers: r }
}

impl Refusals for Embedded {}

impl Refusals for Kube {
    fn refusal_probes(&self) -> Vec<support::control_plane::RefusalProbe> {
        self.b.refusal_probes()
    }
}

/// A GET of the embedded API: the object, or `None` on 404.
async fn get_opt<B: Backend>(b: &B, path: &str) -> Option<Value> {
    let r = b.admin(Method::GET, path, None).await;
    (r.status != StatusCode::NOT_FOUND).then(|| r.expect(StatusCode::OK))
}

impl VmEnv for Embedded {
    type B = EmbeddedBackend;
    fn b(&self) -> &EmbeddedBackend {
        &self.b
    }
    fn plays_kube_vip(&self) -> bool {
        false
    }
    async fn put_vmi(&self, vmi: Value) {
        let name = vmi["metadata"]["name"].as_str().expect("named").to_string();
        let path = format!("{VMIS}/{NS}/{name}");
        if get_opt(&self.b, &path).await.is_some() {
            self.b
                .admin(Method::PUT, &path, Some(vmi))
                .await
                .expect(StatusCode::OK);
        } else {
            self.b
                .admin(Method::POST, VMIS, Some(vmi))
                .await
                .expect(StatusCode::CREATED);
        }
    }
    async fn delete_vmi(&self, name: &str) {
        let path = format!("{VMIS}/{NS}/{name}");
        self.b
            .admin(Method::DELETE, &path, None)
            .await
            .expect(StatusCode::OK);
    }
    async fn service(&self, name: &str) -> Option<Value> {
        get_opt(&self.b, &format!("/v1/harvester/services/{NS}/{name}")).await
    }
    async fn slice(&self, name: &str) -> Option<Value> {
        get_opt(
            &self.b,
            &format!("/v1/harvester/discovery.k8s.io.endpointslices/{NS}/{name}"),
        )
        .await
    }
}

impl VmEnv for Kube {
    type B = KubeBackend;
    fn b(&self) -> &KubeBackend {
        &self.b
    }
    fn plays_kube_vip(&self) -> bool {
        true
    }
    async fn put_vmi(&self, vmi: Value) {
        let api = support::vmi_api(self.b.store());
        let mut vmi: VirtualMachineInstance = serde_json::from_value(vmi).expect("a VMI");
        let name = vmi.metadata.name.clone().expect("named");
        match api.get(NS, &name).await.expect("reads the VMI") {
            None => {
                support::create_vmi(self.b.store(), &vmi).await;
            }
            Some(old) => {
                vmi.metadata.resource_version = old.metadata.resource_version;
                api.replace(&vmi).await.expect("replaces the VMI");
            }
        }
    }
    async fn delete_vmi(&self, name: &str) {
        support::vmi_api(self.b.store())
            .delete(NS, name, &Default::default())
            .await
            .expect("deletes the VMI");
    }
    async fn service(&self, name: &str) -> Option<Value> {
        let svc = Api::<Service>::new(self.b.store()).get(NS, name).await;
        svc.expect("reads the Service")
            .map(|s| serde_json::to_value(s).expect("JSON"))
    }
    async fn slice(&self, name: &str) -> Option<Value> {
        let slice = Api::<EndpointSlice>::new(self.b.store())
            .get(NS, name)
            .await;
        slice
            .expect("reads the EndpointSlice")
            .map(|s| serde_json::to_value(s).expect("JSON"))
    }
}

// --- Backends ------------------------------------------------------------------------------------

/// A TCP listener that can be closed and opened again.
struct TcpBackend {
    addr: SocketAddr,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TcpBackend {
    async fn open(addr: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("binds {addr}: {e}"));
        let task = tokio::spawn(async move {
            // The prober's half-open checks never arrive here; anything else is let in and dropped.
            while listener.accept().await.is_ok() {}
        });
        TcpBackend {
            addr,
            task: Some(task),
        }
    }

    /// Closes the listener (probes are refused from now on).
    async fn close(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    async fn reopen(&mut self) {
        *self = Self::open(self.addr).await;
    }
}

/// An HTTP server answering `GET /healthz` with a status the case sets, counting the connections
/// it accepts.
struct HttpBackend {
    status: Arc<AtomicU16>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl HttpBackend {
    async fn start(addr: SocketAddr) -> Self {
        use hyper::{Request, Response, body::Incoming, service::service_fn};
        use hyper_util::rt::{TokioExecutor, TokioIo};
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("binds {addr}: {e}"));
        let status = Arc::new(AtomicU16::new(200));
        let connections = Arc::new(AtomicUsize::new(0));
        let answer = status.clone();
        let counted = connections.clone();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let answer = answer.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let code = if req.uri().path() == "/healthz" {
                            answer.load(Ordering::SeqCst)
                        } else {
                            404
                        };
                        async move {
                            Response::builder()
                                .status(code)
                                .body(http_body_util::Full::new(hyper::body::Bytes::from_static(
                                    b"ok",
                                )))
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        HttpBackend {
            status,
            connections,
            task,
        }
    }

    fn answer(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for HttpBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn at(address: &str, port: u16) -> SocketAddr {
    SocketAddr::new(address.parse().expect("an address"), port)
}

// --- Objects -------------------------------------------------------------------------------------

/// A running VMI on the pod network with address `ip`, built from KubeVirt's Go types.
fn mk_vmi(name: &str, app: &str, ip: &str) -> Value {
    support::foreign::vmi(name)
        .namespace(NS)
        .label("app", app)
        .pod_network(&[ip], Some("eth0"))
        .build()
}

fn mk_lb(name: &str, app: &str, port: i32, annotations: Value) -> Value {
    json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations},
        "spec": {
            "ipam": "pool", "workloadType": "vm",
            "listeners": [{"name": "web", "port": 80, "protocol": "TCP", "backendPort": port}],
            "backendServerSelector": {"app": [app]},
            "healthCheck": {"port": port, "periodSeconds": PERIOD_SECONDS, "timeoutSeconds": 1,
                            "successThreshold": 1, "failureThreshold": FAILURES}
        }
    })
}

const PERIOD_SECONDS: u64 = 1;
const FAILURES: u64 = 2;

async fn create_lb<B: Backend>(b: &B, lb: Value) {
    b.admin(Method::POST, LBS, Some(lb))
        .await
        .expect(StatusCode::CREATED);
}

async fn get_lb<B: Backend>(b: &B, name: &str) -> Option<Value> {
    let r = b
        .admin(Method::GET, &format!("{LBS}/{NS}/{name}"), None)
        .await;
    (r.status == StatusCode::OK).then(|| r.json())
}

fn condition<'a>(lb: &'a Value, kind: &str) -> Option<&'a Value> {
    lb["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

/// The endpoints of a slice as (address, ready), in order.
fn endpoints(slice: &Value) -> Vec<(String, bool)> {
    slice["endpoints"]
        .as_array()
        .map(|eps| {
            eps.iter()
                .map(|e| {
                    (
                        e["addresses"][0].as_str().unwrap_or_default().to_string(),
                        e["conditions"]["ready"] == true,
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn ready(address: &str, ready: bool) -> (String, bool) {
    (address.to_string(), ready)
}

/// Plays kube-vip where none runs on the Service's behalf (Kubernetes): the ingress is the
/// requested address.
async fn announce<E: VmEnv>(env: &E, name: &str) -> String {
    let svc = eventually(&format!("the Service {name}"), async || {
        env.service(name).await
    })
    .await;
    let ip = svc["spec"]["loadBalancerIP"]
        .as_str()
        .expect("loadBalancerIP")
        .to_string();
    if env.plays_kube_vip() {
        let lb = eventually(&format!("{name} waiting for its external IP"), async || {
            let lb = get_lb(env.b(), name).await?;
            let c = condition(&lb, "Ready")?;
            (c["status"] == "False" && c["message"] == "service is waiting for external IP")
                .then_some(lb)
        })
        .await;
        assert_eq!(lb["status"]["address"], Value::Null, "{lb}");
        let api = Api::<Service>::new(env.b().store());
        let mut svc: Service = api
            .get(NS, name)
            .await
            .expect("reads the Service")
            .expect("exists");
        svc.status = Some(
            serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": ip}]}}))
                .expect("status"),
        );
        api.replace_status(&svc).await.expect("writes the ingress");
    }
    ip
}

/// Events about the load balancer `lb` of `reason` whose message mentions `what`.
async fn events<B: Backend>(b: &B, lb: &str, reason: &str, what: &str) -> Vec<Event> {
    Api::<Event>::new(b.store())
        .list(Some(NS), &LabelSelector::everything())
        .await
        .expect("lists events")
        .into_iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(lb)
                && e.reason.as_deref() == Some(reason)
                && e.message.as_deref().is_some_and(|m| m.contains(what))
        })
        .collect()
}

/// Polls until `probe` finds something, failing after `limit` (a bound the case states, with
/// slack; not a performance figure).
async fn within<T>(limit: Duration, what: &str, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting {limit:?} for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// failureThreshold × period, plus slack for a loaded machine.
fn failure_bound() -> Duration {
    Duration::from_secs(FAILURES * PERIOD_SECONDS) + Duration::from_secs(20)
}

pub mod cases {
    use super::*;

    /// The done-when of VM load balancers: address, Service and EndpointSlice; both backends
    /// ready; one whose listener closes goes not ready within failureThreshold × period while the
    /// other stays ready, with an Event naming it; it comes back when the listener reopens; a VMI
    /// that stops matching leaves within seconds; the dummy endpoint when nothing is selected;
    /// deletion removes the Service and the EndpointSlice and releases the address.
    pub async fn tcp_backends_follow_their_listeners<E: VmEnv>(env: E) {
        let b = env.b();
        let (a_ip, b_ip, c_ip) = (netns::BACKENDS[0], netns::BACKENDS[1], netns::BACKENDS[2]);
        let _a = TcpBackend::open(at(a_ip, 8080)).await;
        let mut backend_b = TcpBackend::open(at(b_ip, 8080)).await;
        create_pool(b, vms_pool()).await;
        env.put_vmi(mk_vmi("vm-a", "web", a_ip)).await;
        env.put_vmi(mk_vmi("vm-b", "web", b_ip)).await;
        env.put_vmi(mk_vmi("vm-c", "db", c_ip)).await;
        create_lb(b, mk_lb("web", "web", 8080, json!({}))).await;

        // The Service, as upstream makes it.
        let ip = announce(&env, "web").await;
        let lb = eventually("web Ready with its address and backends", async || {
            let lb = get_lb(b, "web").await?;
            let is_ready = condition(&lb, "Ready")?["status"] == "True";
            (is_ready && lb["status"]["address"] == ip.as_str()).then_some(lb)
        })
        .await;
        assert_eq!(lb["status"]["allocatedAddress"]["ip"], ip.as_str());
        assert_eq!(lb["status"]["backendServers"], json!([a_ip, b_ip]));
        let uid = lb["metadata"]["uid"].as_str().expect("uid");
        let owner = json!([{"apiVersion": "loadbalancer.harvesterhci.io/v1beta1",
                            "kind": "LoadBalancer", "name": "web", "uid": uid}]);
        let svc = env.service("web").await.expect("the Service");
        assert_eq!(svc["metadata"]["ownerReferences"], owner);
        assert_eq!(
            svc["metadata"]["labels"]["loadbalancer.harvesterhci.io/servicelb"],
            "true"
        );
        assert_eq!(svc["spec"]["type"], "LoadBalancer");
        assert_eq!(svc["spec"]["selector"], Value::Null);
        let port = &svc["spec"]["ports"][0];
        assert_eq!(
            (
                &port["name"],
                &port["protocol"],
                &port["port"],
                &port["targetPort"]
            ),
            (&json!("web"), &json!("TCP"), &json!(80), &json!(8080))
        );

        // Both endpoints ready, no dummy.
        let slice = eventually("both endpoints ready", async || {
            let slice = env.slice("web").await?;
            (endpoints(&slice) == [ready(a_ip, true), ready(b_ip, true)]).then_some(slice)
        })
        .await;
        assert_eq!(slice["metadata"]["ownerReferences"], owner);
        assert_eq!(
            slice["metadata"]["labels"]["kubernetes.io/service-name"],
            "web"
        );
        assert_eq!(
            slice["metadata"]["labels"]["loadbalancer.harvesterhci.io/servicelb"],
            "true"
        );
        assert_eq!(slice["addressType"], "IPv4");
        assert_eq!(
            slice["ports"],
            json!([{"name": "web", "protocol": "TCP", "port": 8080}])
        );
        assert_eq!(slice["endpoints"][1]["targetRef"]["name"], "vm-b");
        eventually("BackendsHealthy True", async || {
            let lb = get_lb(b, "web").await?;
            (condition(&lb, "BackendsHealthy")?["status"] == "True").then_some(())
        })
        .await;

        // vm-b's listener closes: not ready within failureThreshold × period; vm-a stays ready.
        backend_b.close().await;
        within(failure_bound(), "vm-b's endpoint not ready", async || {
            let eps = endpoints(&env.slice("web").await?);
            assert!(
                eps.contains(&ready(a_ip, true)),
                "vm-a must stay ready: {eps:?}"
            );
            (eps == [ready(a_ip, true), ready(b_ip, false)]).then_some(())
        })
        .await;
        let down = eventually("an Event naming vm-b", async || {
            let found = events(b, "web", "BackendUnhealthy", "vm-b").await;
            (!found.is_empty()).then_some(found)
        })
        .await;
        let message = down[0].message.clone().unwrap_or_default();
        assert!(message.contains(b_ip), "{message}");
        assert_eq!(down[0].type_.as_deref(), Some("Warning"));
        let lb = eventually("BackendsHealthy False naming vm-b", async || {
            let lb = get_lb(b, "web").await?;
            let c = condition(&lb, "BackendsHealthy")?;
            (c["status"] == "False" && c["message"].as_str()?.contains("vm-b")).then_some(lb)
        })
        .await;
        assert_eq!(condition(&lb, "Ready").expect("Ready")["status"], "True");
        assert!(
            events(b, "web", "BackendUnhealthy", "vm-a")
                .await
                .is_empty()
        );

        // It listens again: ready again.
        let healthy_before = events(b, "web", "BackendHealthy", "vm-b").await.len();
        backend_b.reopen().await;
        eventually("vm-b's endpoint ready again", async || {
            let eps = endpoints(&env.slice("web").await?);
            (eps == [ready(a_ip, true), ready(b_ip, true)]).then_some(())
        })
        .await;
        eventually("an Event of vm-b healthy again", async || {
            (events(b, "web", "BackendHealthy", "vm-b").await.len() > healthy_before).then_some(())
        })
        .await;

        // vm-b stops matching: it leaves within seconds.
        env.put_vmi(mk_vmi("vm-b", "db", b_ip)).await;
        within(
            Duration::from_secs(10),
            "vm-b out of the EndpointSlice",
            async || {
                let eps = endpoints(&env.slice("web").await?);
                (eps == [ready(a_ip, true)]).then_some(())
            },
        )
        .await;
        eventually("backendServers without vm-b", async || {
            let lb = get_lb(b, "web").await?;
            (lb["status"]["backendServers"] == json!([a_ip])).then_some(())
        })
        .await;

        // Nothing selected: not Ready with upstream's message, and the dummy endpoint.
        create_lb(b, mk_lb("none", "nothing", 8080, json!({}))).await;
        announce(&env, "none").await;
        eventually("none refused for want of backends", async || {
            let lb = get_lb(b, "none").await?;
            let c = condition(&lb, "Ready")?;
            (c["message"] == "no running backend servers" && c["status"] == "False").then_some(())
        })
        .await;
        let slice = eventually("the dummy endpoint", async || {
            let slice = env.slice("none").await?;
            (endpoints(&slice) == [ready(DUMMY, true)]).then_some(slice)
        })
        .await;
        assert_eq!(
            slice["endpoints"][0]["targetRef"]["uid"],
            "dummy347-546a-4642-9da6-5608endpoint"
        );

        // Deletion: the Service and the EndpointSlice go, the address is released.
        b.admin(Method::DELETE, &format!("{LBS}/{NS}/web"), None)
            .await
            .expect(StatusCode::OK);
        eventually("web, its Service and EndpointSlice gone", async || {
            let gone = get_lb(b, "web").await.is_none()
                && env.service("web").await.is_none()
                && env.slice("web").await.is_none();
            gone.then_some(())
        })
        .await;
        eventually("the address released", async || {
            let pool = b
                .admin(Method::GET, &format!("{POOLS}/vms"), None)
                .await
                .expect(StatusCode::OK);
            let held = pool["status"]["allocated"][ip.as_str()].clone();
            (held.is_null() && pool["status"]["allocatedHistory"][ip.as_str()] == "default/web")
                .then_some(())
        })
        .await;
    }

    /// An HTTP health check (the annotations): the answer's status decides, and a VMI that goes
    /// leaves the EndpointSlice.
    pub async fn http_probes_read_the_status<E: VmEnv>(env: E) {
        let b = env.b();
        let (a_ip, b_ip) = (netns::BACKENDS[0], netns::BACKENDS[1]);
        let _a = HttpBackend::start(at(a_ip, 8081)).await;
        let backend_b = HttpBackend::start(at(b_ip, 8081)).await;
        create_pool(b, vms_pool()).await;
        env.put_vmi(mk_vmi("api-a", "api", a_ip)).await;
        env.put_vmi(mk_vmi("api-b", "api", b_ip)).await;
        let annotations = json!({
            "loadbalancer.harvesterhci.io/healthCheckHTTPPath": "/healthz",
            "loadbalancer.harvesterhci.io/healthCheckHTTPExpectedStatus": "200-299",
        });
        create_lb(b, mk_lb("api", "api", 8081, annotations)).await;
        announce(&env, "api").await;
        eventually("both endpoints ready", async || {
            let eps = endpoints(&env.slice("api").await?);
            (eps == [ready(a_ip, true), ready(b_ip, true)]).then_some(())
        })
        .await;

        backend_b.answer(503);
        within(failure_bound(), "api-b's endpoint not ready", async || {
            let eps = endpoints(&env.slice("api").await?);
            assert!(
                eps.contains(&ready(a_ip, true)),
                "api-a must stay ready: {eps:?}"
            );
            (eps == [ready(a_ip, true), ready(b_ip, false)]).then_some(())
        })
        .await;
        let down = eventually("an Event naming api-b", async || {
            let found = events(b, "api", "BackendUnhealthy", "api-b").await;
            (!found.is_empty()).then_some(found)
        })
        .await;
        let message = down[0].message.clone().unwrap_or_default();
        assert!(message.contains("HTTP 503, expected 200-299"), "{message}");

        backend_b.answer(204);
        eventually("api-b's endpoint ready again", async || {
            let eps = endpoints(&env.slice("api").await?);
            (eps == [ready(a_ip, true), ready(b_ip, true)]).then_some(())
        })
        .await;

        env.delete_vmi("api-b").await;
        within(
            Duration::from_secs(10),
            "api-b out of the EndpointSlice",
            async || {
                let eps = endpoints(&env.slice("api").await?);
                (eps == [ready(a_ip, true)]).then_some(())
            },
        )
        .await;
    }

    /// Issue 25: a VMI that reports a loopback address, with a listener there, is never connected
    /// to. The condition and an Event say it was refused and why (not what it would have
    /// answered), it is not in the EndpointSlice, and the other backend serves.
    pub async fn loopback_backends_are_refused<E: VmEnv>(env: E) {
        let b = env.b();
        let a_ip = netns::BACKENDS[0];
        let good = HttpBackend::start(at(a_ip, 8082)).await;
        let loopback = HttpBackend::start(at("127.0.0.1", 8082)).await;
        create_pool(b, vms_pool()).await;
        env.put_vmi(mk_vmi("vm-ok", "mixed", a_ip)).await;
        env.put_vmi(mk_vmi("vm-lo", "mixed", "127.0.0.1")).await;
        let annotations = json!({"loadbalancer.harvesterhci.io/healthCheckHTTPPath": "/healthz"});
        create_lb(b, mk_lb("mixed", "mixed", 8082, annotations)).await;
        announce(&env, "mixed").await;

        let refusal = "vm-lo (127.0.0.1): address 127.0.0.1 is loopback; not probed";
        let lb = eventually(
            "BackendsHealthy False naming vm-lo as refused",
            async || {
                let lb = get_lb(b, "mixed").await?;
                let c = condition(&lb, "BackendsHealthy")?;
                (c["status"] == "False"
                    && c["message"] == format!("1/2 healthy; unhealthy: {refusal}"))
                .then_some(lb)
            },
        )
        .await;
        assert_eq!(condition(&lb, "Ready").expect("Ready")["status"], "True");
        assert_eq!(lb["status"]["backendServers"], json!(["127.0.0.1", a_ip]));
        let slice = env.slice("mixed").await.expect("the EndpointSlice");
        assert_eq!(endpoints(&slice), [ready(a_ip, true)]);
        let refused = eventually("an Event naming vm-lo", async || {
            let found = events(b, "mixed", "BackendRefused", "vm-lo").await;
            (!found.is_empty()).then_some(found)
        })
        .await;
        assert_eq!(
            refused[0].message.as_deref(),
            Some(
                "backend server vm-lo (127.0.0.1) is refused: address 127.0.0.1 is loopback; not probed"
            )
        );
        assert_eq!(refused[0].type_.as_deref(), Some("Warning"));

        // vm-ok is probed a few more times meanwhile; the loopback listener never hears of it.
        let seen = good.connections();
        eventually("vm-ok probed three more times", async || {
            (good.connections() >= seen + 3).then_some(())
        })
        .await;
        assert_eq!(
            loopback.connections(),
            0,
            "the prober connected to 127.0.0.1"
        );
        assert!(
            events(b, "mixed", "BackendUnhealthy", "vm-lo")
                .await
                .is_empty()
        );
    }
}

suite!(
    netns,
    [embedded => embedded(), kube => kube()],
    [
        tcp_backends_follow_their_listeners,
        http_probes_read_the_status,
        loopback_backends_are_refused
    ]
);
