//! How long the reconcilers take to converge 10,000 LoadBalancers over 10 IPPools from a cold start on
//! the embedded backend (durability `full`), and the reconcile rate.
//!
//! Setup (not timed): 10 pools, each scoped to one namespace, and 10,000 LoadBalancers spread over
//! those namespaces, created through admission as the API and the webhooks create them (annotations
//! and the reconciler's finalizer set, no status). The store is then closed. Timed: reopening the store (loading every object), starting
//! the reconcilers, until every LoadBalancer is Ready with an address, every pool's status agrees
//! and no address is held twice; and, timed on to, until every Event the reconcilers recorded is
//! written or dropped (`harvester_cloud_events_queued` at 0), so that sizes compare equal work.
//!
//! `cargo bench --bench lb_converge` (optionally `-- <load balancers> <pools> <concurrency>`).

#[path = "support/usage.rs"]
#[allow(dead_code)]
mod usage;

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use futures::StreamExt;
use harvester_cloud::{
    controller::leader::AlwaysLeader,
    crd::{self, IPPool, LoadBalancer, LoadBalancerSpec},
    ipam::{PoolSpec, RangeSpec as Range, Selector, Tuple},
    lb,
    store::{
        LabelSelector, ObjectStore,
        embedded::{Durability, EmbeddedStore},
    },
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio_util::sync::CancellationToken;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let lbs = args.first().copied().unwrap_or(10_000);
    let pools = args.get(1).copied().unwrap_or(10).max(1);
    let concurrency = args
        .get(2)
        .and_then(|c| u16::try_from(*c).ok())
        .unwrap_or(lb::Settings::default().concurrency);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(lbs, pools, concurrency));
}

async fn seed(dir: &std::path::Path, lbs: usize, pools: usize) {
    let store = EmbeddedStore::open(dir, Durability::Full)
        .await
        .expect("opens");
    // Every writer of a real deployment goes through admission (the HTTP API, or the API server's
    // webhooks), which sets the reconciler's finalizer: seeding past it would bench a first write no
    // user's load balancer needs.
    let dyn_store: Arc<dyn ObjectStore> = Arc::new(lb::admission::admitted(
        store.clone(),
        lb::admission::NetworkCheck::Skip,
    ));
    let pool_api = crd::pool_api(dyn_store.clone());
    for p in 0..pools {
        let pool = IPPool {
            metadata: ObjectMeta {
                name: Some(format!("pool{p}")),
                ..Default::default()
            },
            spec: PoolSpec {
                ranges: vec![Range {
                    subnet: format!("10.{p}.0.0/16"),
                    ..Default::default()
                }],
                selector: Selector {
                    scope: vec![Tuple {
                        project: "*".into(),
                        namespace: format!("ns{p}"),
                        guest_cluster: "*".into(),
                    }],
                    ..Default::default()
                },
                ..Default::default()
            }
            .into(),
            status: None,
        };
        pool_api.create(&pool).await.expect("creates pool");
    }
    let lb_api = crd::lb_api(dyn_store);
    // Many writers at once, so that the store's group commit batches the setup too.
    let chunks: Vec<Vec<usize>> = (0..lbs)
        .collect::<Vec<_>>()
        .chunks(lbs.div_ceil(64).max(1))
        .map(<[usize]>::to_vec)
        .collect();
    let mut tasks = Vec::new();
    for chunk in chunks {
        let lb_api = lb_api.clone();
        tasks.push(tokio::spawn(async move {
            for i in chunk {
                let lb = LoadBalancer {
                    metadata: ObjectMeta {
                        name: Some(format!("lb{i}")),
                        namespace: Some(format!("ns{}", i % pools)),
                        ..Default::default()
                    },
                    spec: LoadBalancerSpec {
                        workload_type: "cluster".into(),
                        ipam: "pool".into(),
                        ..Default::default()
                    },
                    status: None,
                };
                lb_api.create(&lb).await.expect("creates lb");
            }
        }));
    }
    for t in tasks {
        t.await.expect("seeds");
    }
    store.close().await;
}

/// Checks convergence; returns how many load balancers are done.
async fn converged(store: &Arc<dyn ObjectStore>, pools: usize) -> (usize, bool) {
    let mut done = 0;
    let mut total = 0;
    let mut held: HashMap<(String, String), String> = HashMap::new();
    // One namespace at a time: a list of every load balancer at once would be a copy of them all,
    // and the bench's own peak memory, not the reconcilers'.
    for p in 0..pools {
        let (d, t) = converged_in(store, &format!("ns{p}"), &mut held).await;
        done += d;
        total += t;
    }
    if done < total {
        return (done, false);
    }
    let pool_list = store
        .list(&crd::pool_kind(), None, &LabelSelector::everything())
        .await
        .expect("lists");
    let mut in_pools = HashSet::new();
    for v in &pool_list.items {
        let pool: IPPool = serde_json::from_value(v.clone()).expect("decodes");
        let status = pool.status.clone().unwrap_or_default();
        for (ip, id) in &status.allocated {
            in_pools.insert(((pool.name().to_string(), ip.clone()), id.clone()));
        }
    }
    let reported: HashSet<((String, String), String)> = held.into_iter().collect();
    (done, pool_list.items.len() == pools && in_pools == reported)
}

/// The load balancers of `namespace` that are done, and how many there are; records the addresses
/// they report in `held` (panics on one reported twice).
async fn converged_in(
    store: &Arc<dyn ObjectStore>,
    namespace: &str,
    held: &mut HashMap<(String, String), String>,
) -> (usize, usize) {
    let lbs = store
        .list(
            &crd::lb_kind(),
            Some(namespace),
            &LabelSelector::everything(),
        )
        .await
        .expect("lists");
    let mut done = 0;
    for v in &lbs.items {
        let lb: LoadBalancer = serde_json::from_value(v.clone()).expect("decodes");
        let Some(status) = lb.status.as_ref() else {
            continue;
        };
        let ready = status
            .conditions
            .iter()
            .any(|c| c.r#type == "Ready" && c.status == "True");
        if ready && !status.allocated_address.ip.is_empty() {
            done += 1;
            let key = (
                status.allocated_address.ip_pool.clone(),
                status.allocated_address.ip.clone(),
            );
            if let Some(other) = held.insert(key.clone(), lb.applicant()) {
                panic!("{key:?} reported by both {other} and {}", lb.applicant());
            }
        }
    }
    (done, lbs.items.len())
}

async fn run(lbs: usize, pools: usize, concurrency: u16) {
    let dir = tempfile::tempdir().expect("tempdir");
    let setup = Instant::now();
    seed(dir.path(), lbs, pools).await;
    eprintln!(
        "seeded {lbs} load balancers over {pools} pools in {:.1?}",
        setup.elapsed()
    );

    usage::profile_window(true);
    let start = Instant::now();
    let cpu_before = usage::own().cpu;
    let store = EmbeddedStore::open(dir.path(), Durability::Full)
        .await
        .expect("reopens");
    let opened = start.elapsed();
    let dyn_store: Arc<dyn ObjectStore> = store.clone();
    // Progress comes from the change feed (reading all 10,000 objects over and over would compete
    // with the reconcilers for the CPU); the full check runs once everything reports an address.
    // The feed starts at the store's current resourceVersion, with no list: a copy of every
    // object would count in the peak memory measured.
    let listed = dyn_store
        .list(
            &crd::lb_kind(),
            Some("no-such-namespace"),
            &LabelSelector::everything(),
        )
        .await
        .expect("lists")
        .resource_version;
    let mut changes = dyn_store
        .watch(&crd::lb_kind(), None, &listed)
        .await
        .expect("watches");
    let stop = CancellationToken::new();
    let reconcilers = tokio::spawn(lb::run(
        dyn_store.clone(),
        lb::Settings {
            concurrency,
            ..lb::Settings::default()
        },
        Arc::new(AlwaysLeader),
        stop.clone(),
    ));
    let mut done: HashSet<String> = HashSet::new();
    let mut last_report = Instant::now();
    while done.len() < lbs {
        let change = tokio::time::timeout(Duration::from_secs(60), changes.next())
            .await
            .expect("progress within a minute")
            .expect("the feed goes on")
            .expect("no watch error");
        let o = &change.object;
        let ready = o
            .pointer("/status/conditions")
            .and_then(|c| c.as_array())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
        let has_ip = o
            .pointer("/status/allocatedAddress/ip")
            .and_then(|v| v.as_str())
            .is_some_and(|ip| !ip.is_empty());
        if ready && has_ip {
            let (namespace, name) = harvester_cloud::store::object_key(o);
            done.insert(format!("{namespace}/{name}"));
        }
        if last_report.elapsed() > Duration::from_secs(2) {
            eprintln!("  {}/{lbs} after {:.1?}", done.len(), start.elapsed());
            last_report = Instant::now();
        }
    }
    loop {
        let (ready, all) = converged(&dyn_store, pools).await;
        if all {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "did not converge: {ready}/{lbs}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = start.elapsed();
    let cpu = usage::own().cpu - cpu_before;
    // Events are written behind the reconciles (best effort): how many were still queued (read
    // from the gauge: listing them would cost CPU inside the timed part, and their trees memory).
    let backlog = || {
        harvester_cloud::metrics::sample(
            &harvester_cloud::metrics::encode(),
            "harvester_cloud_events_queued",
        )
        .expect("registered")
    };
    let queued_at_convergence = backlog();
    // …and the same work at every size: until the recorder's backlog is written too.
    while backlog() > 0.0 {
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "the Events were not written"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took_all = start.elapsed();
    let cpu_all = usage::own().cpu - cpu_before;
    usage::profile_window(false);
    // Counted one by one: a list of 100,000 Events as trees takes about 600 MiB, which the peak
    // memory measured would count.
    let mut events = 0usize;
    let events_listed = dyn_store
        .list_each(
            &harvester_cloud::store::Kind::of::<k8s_openapi::api::core::v1::Event>(),
            None,
            &LabelSelector::everything(),
            &mut |_| events += 1,
        )
        .await
        .expect("lists");
    // Every store write takes a resourceVersion: how many the convergence and its Events took
    // (before d2799d7 the Events written after the convergence were not counted).
    let writes =
        events_listed.parse::<u64>().expect("a number") - listed.parse::<u64>().expect("a number");
    // …and how many the recorder dropped, its queue full (none are recorded before the reopen).
    let dropped = series_sum(
        &harvester_cloud::metrics::encode(),
        "harvester_cloud_events_dropped_total{",
    );
    stop.cancel();
    reconcilers.await.expect("reconcilers stop");
    store.close().await;
    println!(
        "lb_converge: {lbs} load balancers over {pools} pools converged in {:.2} s from a cold start \
         (store opened in {:.2} s, {concurrency} reconciles at once); {:.0} load balancers/s",
        took.as_secs_f64(),
        opened.as_secs_f64(),
        lbs as f64 / took.as_secs_f64()
    );
    println!(
        "  CPU from the reopen to converged: {cpu:.3} s, {:.3} ms per load balancer",
        1000.0 * cpu / lbs as f64
    );
    println!(
        "  {queued_at_convergence} Events queued when the last load balancer converged; {events} stored when every Event was written ({:.2} s, CPU {cpu_all:.3} s, {:.3} ms per load balancer), {dropped} dropped (queue full)",
        took_all.as_secs_f64(),
        1000.0 * cpu_all / lbs as f64
    );
    // A watcher further behind than the store's history lists its kind again, and its controller
    // then reconciles every object of it once more: the relists show where that happened.
    let metrics = harvester_cloud::metrics::encode();
    let relists: Vec<String> = ["LoadBalancer", "IPPool", "Event"]
        .iter()
        .map(|kind| {
            let n = harvester_cloud::metrics::sample(
                &metrics,
                &format!("harvester_cloud_watch_relists_total{{kind=\"{kind}\"}}"),
            )
            .unwrap_or(0.0);
            format!("{kind} {n}")
        })
        .collect();
    println!("  watches listed again: {}", relists.join(", "));
    let sample = |name: &str| harvester_cloud::metrics::sample(&metrics, name).unwrap_or(0.0);
    let reconciles: Vec<String> = ["loadbalancer", "ippool"]
        .iter()
        .map(|c| {
            format!(
                "{c} {} ({} failed)",
                sample(&format!(
                    "harvester_cloud_reconcile_duration_seconds_count{{controller=\"{c}\"}}"
                )),
                series_sum(
                    &metrics,
                    &format!("harvester_cloud_reconcile_errors_total{{controller=\"{c}\""),
                )
            )
        })
        .collect();
    println!(
        "  reconciles: {}; store writes per load balancer: {:.2}",
        reconciles.join(", "),
        writes as f64 / lbs as f64
    );
}

/// The sum of the values of every series in Prometheus text `metrics` whose line starts with
/// `prefix` (a family's name and the start of its labels).
fn series_sum(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        // Not `sum()`: an empty float sum is -0, printed "-0".
        .fold(0.0, |total, v| total + v)
}
