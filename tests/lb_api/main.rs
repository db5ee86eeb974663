//! IPPools and LoadBalancers through the HTTP API, with the reconcilers running on the backend's
//! store. The `cases` run on every backend through [`support::Backend`] (the reconcilers are started
//! from `Backend::store()`, so they run on whatever store the backend has). The cases live in
//! `cases/`, one module per topic; the reconciles themselves, one outcome at a time, are
//! tests/reconcilers'.

#[path = "../support/mod.rs"]
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
    crd::kinds::{NetworkAttachmentDefinition, VirtualMachine},
    lb,
    store::{Api, LabelSelector, ObjectStore, Preconditions},
};
use k8s_openapi::api::core::v1::{Event, Namespace};
use serde_json::{Value, json};
use support::{
    Backend, EmbeddedBackend, KubeBackend, Reply, call, eventually,
    lb::{
        LBS, POOLS, Reconcilers, WAITING_FOR_KUBE_VIP, allocated, allocation_done, create_pool,
        global, gone, ip_of, mk_pool, pool_of, range, ready, update_pool, write_leak,
    },
    ok,
};
use tokio_util::sync::CancellationToken;

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

async fn pool<B: Backend>(b: &B, name: &str) -> Value {
    ok(get(b, &format!("{POOLS}/{name}")).await, StatusCode::OK)
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

pub mod cases;

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
        sharing_by_key,
        pools_that_skip_addresses,
        pools_by_service_labels,
    ]
);

/// The admission webhooks, as the Kubernetes API server calls them (the embedded store serves
/// none: nothing calls them there, and answering anyone would only tell which pools exist).
mod webhooks;

// --- Leader election: two replicas on one store -------------------------------------------------

mod replicas;

// --- Stored data that does not decode (embedded store: on Kubernetes the CRD's schema keeps it out) --

mod undecodable;

/// A pool's VM network where VM networks exist (the Kubernetes backend): its VLAN ID is read as
/// upstream's mutator reads it, or the pool is refused.
mod kube_networks;
