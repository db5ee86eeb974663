//! The prober at scale: 1,000 VM LoadBalancers with three backends each on the embedded store, so
//! 3,000 targets probed once a second (TCP, half-open, as upstream), all by the reconcilers' one
//! prober task. Reports the probe rate and the CPU the whole process spends on it.
//!
//! Setup (not timed): a TCP listener on each of 3,000 loopback addresses (127.1.x.y:9000), a pool,
//! 3,000 VirtualMachineInstances (status through the status subresource) and 1,000 LoadBalancers
//! (each selecting three VMIs, health check every second, thresholds 2/2) written to a fresh store,
//! then the reconcilers, until every EndpointSlice has its three endpoints ready (that time is
//! printed too). Measured: over the next `seconds` (default 20) the probes finished
//! (`harvester_cloud_lb_probes_total`) and the process's CPU time (user + system, from its
//! CPU clock). The listeners do no work: half-open probes never reach `accept`. Loopback
//! is allowed to the prober (`--probe-allow-cidr 127.0.0.0/8`), which refuses it by default.
//!
//! `cargo bench --bench vm_probe` (optionally `-- <load balancers> <seconds>`).

#[path = "support/usage.rs"]
#[allow(dead_code)]
mod usage;

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use harvester_cloud::{
    controller::leader::AlwaysLeader,
    crd::{
        self, HealthCheck, IPPool, Listener, LoadBalancer, LoadBalancerSpec,
        kinds::{VirtualMachineInstance, vmi_kind},
    },
    ipam::{self, PoolSpec, RangeSpec, Selector, Tuple},
    lb, metrics,
    store::{
        Api, LabelSelector, ObjectStore,
        embedded::{Durability, EmbeddedStore},
    },
};
use k8s_openapi::{
    api::discovery::v1::EndpointSlice, apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use tokio_util::sync::CancellationToken;

const BACKENDS_PER_LB: usize = 3;
const PORT: u16 = 9000;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let lbs = args.first().copied().unwrap_or(1_000).max(1);
    let seconds = args.get(1).copied().unwrap_or(20).max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(lbs, seconds as u64));
}

/// The address of backend `k`: 127.1.0.1, 127.1.0.2, … (250 a block).
fn backend(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(
        127,
        1 + (k / 62_500) as u8,
        ((k / 250) % 250) as u8,
        (k % 250 + 1) as u8,
    )
}

fn probes() -> (f64, f64) {
    let text = metrics::encode();
    let get = |result: &str| {
        metrics::sample(
            &text,
            &format!("harvester_cloud_lb_probes_total{{result=\"{result}\"}}"),
        )
        .unwrap_or(0.0)
    };
    (get("success"), get("failure"))
}

async fn seed(store: &Arc<dyn ObjectStore>, lbs: usize) {
    crd::pool_api(store.clone())
        .create(&IPPool {
            metadata: ObjectMeta {
                name: Some("vms".into()),
                ..Default::default()
            },
            spec: PoolSpec {
                ranges: vec![RangeSpec {
                    subnet: "10.0.0.0/16".into(),
                    ..Default::default()
                }],
                selector: Selector {
                    scope: vec![Tuple {
                        project: "*".into(),
                        namespace: "*".into(),
                        guest_cluster: "*".into(),
                    }],
                    ..Default::default()
                },
                ..Default::default()
            }
            .into(),
            status: None,
        })
        .await
        .expect("creates the pool");
    let vmis = Api::<VirtualMachineInstance>::with_kind(store.clone(), vmi_kind());
    let lb_api = crd::lb_api(store.clone());
    let mut tasks = Vec::new();
    for chunk in (0..lbs).collect::<Vec<_>>().chunks(lbs.div_ceil(32).max(1)) {
        let (chunk, vmis, lb_api) = (chunk.to_vec(), vmis.clone(), lb_api.clone());
        tasks.push(tokio::spawn(async move {
            for i in chunk {
                for j in 0..BACKENDS_PER_LB {
                    let k = i * BACKENDS_PER_LB + j;
                    // KubeVirt's shape (kubevirt.io/api/core/v1), status written with the object
                    // as KubeVirt's VMI CRD has no status subresource.
                    let ip = backend(k).to_string();
                    let vmi: VirtualMachineInstance = serde_json::from_value(serde_json::json!({
                        "metadata": {"name": format!("vm{k}"), "namespace": "default",
                                     "labels": {"lb": format!("lb{i}")}},
                        "spec": {"domain": {"devices": {}}},
                        "status": {"phase": "Running",
                            "interfaces": [{"name": "default", "ipAddress": ip, "ipAddresses": [ip]}]}
                    }))
                    .expect("a VMI");
                    vmis.create(&vmi).await.expect("creates a VMI");
                }
                let mut lb = LoadBalancer::new(
                    &format!("lb{i}"),
                    LoadBalancerSpec {
                        ipam: "pool".into(),
                        workload_type: "vm".into(),
                        listeners: vec![Listener {
                            name: "tcp".into(),
                            port: 80,
                            protocol: "TCP".into(),
                            backend_port: i32::from(PORT),
                        }],
                        backend_server_selector: [("lb".to_string(), vec![format!("lb{i}")])]
                            .into(),
                        health_check: Some(HealthCheck {
                            port: u64::from(PORT),
                            success_threshold: 2,
                            failure_threshold: 2,
                            period_seconds: 1,
                            timeout_seconds: 1,
                        }),
                        ..Default::default()
                    },
                );
                lb.metadata.namespace = Some("default".into());
                lb_api.create(&lb).await.expect("creates a load balancer");
            }
        }));
    }
    for t in tasks {
        t.await.expect("seeds");
    }
}

/// Load balancers whose EndpointSlice has all its endpoints, ready.
async fn ready_slices(store: &Arc<dyn ObjectStore>) -> usize {
    let slices = Api::<EndpointSlice>::new(store.clone())
        .list(Some("default"), &LabelSelector::everything())
        .await
        .expect("lists EndpointSlices");
    slices
        .iter()
        .filter(|s| {
            s.endpoints.len() == BACKENDS_PER_LB
                && s.endpoints
                    .iter()
                    .all(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        })
        .count()
}

async fn run(lbs: usize, seconds: u64) {
    let targets = lbs * BACKENDS_PER_LB;
    let mut listeners = Vec::with_capacity(targets);
    for k in 0..targets {
        let addr = SocketAddr::new(IpAddr::V4(backend(k)), PORT);
        listeners.push(
            tokio::net::TcpListener::bind(addr)
                .await
                .unwrap_or_else(|e| {
                    panic!("binds {addr} (ulimit -n must allow {targets} listeners and more): {e}")
                }),
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let embedded = EmbeddedStore::open(dir.path(), Durability::Normal)
        .await
        .expect("opens the store");
    let store: Arc<dyn ObjectStore> = embedded.clone();
    seed(&store, lbs).await;

    let stop = CancellationToken::new();
    let started = Instant::now();
    let reconcilers = tokio::spawn(lb::run(
        store.clone(),
        lb::Settings {
            fill_service_ingress: true,
            // The backends listen on loopback, which the prober refuses unless allowed.
            probe_policy: lb::vm::prober::AddressPolicy::allowing(vec![
                ipam::Cidr::parse("127.0.0.0/8").expect("a CIDR"),
            ]),
            ..lb::Settings::default()
        },
        Arc::new(AlwaysLeader),
        stop.clone(),
    ));
    loop {
        let ready = ready_slices(&store).await;
        if ready == lbs {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "only {ready} of {lbs} load balancers have every endpoint ready after 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let converged = started.elapsed();

    let (ok0, failed0) = probes();
    let cpu0 = usage::own().cpu;
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let (ok1, failed1) = probes();
    let cpu = usage::own().cpu - cpu0;
    let wall = t0.elapsed().as_secs_f64();
    let done = (ok1 - ok0) + (failed1 - failed0);

    println!(
        "vm_probe: {lbs} VM load balancers x {BACKENDS_PER_LB} backends = {targets} targets, each probed every second (TCP half-open)"
    );
    println!(
        "  every endpoint ready {:.1} s after the reconcilers started",
        converged.as_secs_f64()
    );
    println!(
        "  {done:.0} probes in {wall:.1} s: {:.0} probes/s (of {targets}/s due), {:.0} failed",
        done / wall,
        failed1 - failed0
    );
    println!(
        "  CPU (user + system, whole process): {cpu:.2} s in {wall:.1} s = {:.1}% of one core, {:.1} µs per probe",
        100.0 * cpu / wall,
        1e6 * cpu / done.max(1.0)
    );
    stop.cancel();
    let _ = reconcilers.await;
    drop(listeners);
    embedded.close().await;
}
