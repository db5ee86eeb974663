//! The REST resource layer (`http::rest`) serves every kind the same way except where the kinds
//! behaved differently before it existed; these cases pin each such per-kind difference (the
//! wording of a missing object or a conflict, the answer to a path segment that is not UTF-8 or to
//! a namespace of an invalid name, an undecodable stored object in a list, a deletion waiting for
//! finalizers), so that none of them changes by accident. Embedded backend, through the router.

mod support;

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use harvester_cloud::{
    crd::kinds::vmi_kind,
    guest::clusters::{ClusterKey, ClusterStore},
    store::{Kind, ObjectStore},
};
use k8s_openapi::api::core::v1::Service;
use serde_json::{Value, json};
use support::{Backend, EmbeddedBackend, Reply};

const POOLS: &str = "/v1/harvester/loadbalancer.harvesterhci.io.ippools";
const LBS: &str = "/v1/harvester/loadbalancer.harvesterhci.io.loadbalancers";
const VMIS: &str = "/v1/harvester/kubevirt.io.virtualmachineinstances";
const SERVICES: &str = "/v1/harvester/services";
const SLICES: &str = "/v1/harvester/discovery.k8s.io.endpointslices";
const GUEST: &str = "/v1/harvester/guestclusters/gc-rest/c1";

fn vmi(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"domain": {"devices": {}}},
    })
}

fn cluster_ip(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"type": "ClusterIP", "ports": [{"port": 80}]},
    })
}

fn guest_store(b: &EmbeddedBackend) -> Arc<dyn ObjectStore> {
    Arc::new(ClusterStore::new(
        b.store(),
        ClusterKey::new("gc-rest", "c1").expect("valid names"),
    ))
}

async fn admin(b: &EmbeddedBackend, method: Method, uri: &str, body: Option<Value>) -> Reply {
    b.admin(method, uri, body).await
}

/// A namespace of an invalid name: LoadBalancers answer that no such collection exists (404);
/// VMIs, Services and EndpointSlices list it, empty.
#[tokio::test]
async fn a_namespace_of_an_invalid_name() {
    let b = EmbeddedBackend::start().await;
    let message = admin(&b, Method::GET, &format!("{LBS}/Bad_NS"), None)
        .await
        .error(StatusCode::NOT_FOUND, "NotFound");
    assert_eq!(message, format!("no route for {LBS}/Bad_NS"));
    for collection in [VMIS, SERVICES, SLICES] {
        let list = admin(&b, Method::GET, &format!("{collection}/Bad_NS"), None)
            .await
            .expect(StatusCode::OK);
        assert_eq!(list["type"], "collection", "{collection}");
        assert_eq!(list["data"], json!([]), "{collection}");
    }
}

/// A path segment that is not UTF-8 once decoded: IPPools, LoadBalancers and guest Services
/// answer 404 in the error shape; VMIs, Services and EndpointSlices answer axum's plain 400.
#[tokio::test]
async fn a_path_segment_that_is_not_utf8() {
    let b = EmbeddedBackend::start().await;
    for uri in [
        format!("{POOLS}/%FF%FE"),
        format!("{LBS}/%FF%FE"),
        format!("{LBS}/default/%FF%FE"),
        format!("{GUEST}/services/default/%FF%FE"),
        "/v1/harvester/guestclusters/gc-rest/%FF%FE/services".to_string(),
    ] {
        admin(&b, Method::GET, &uri, None)
            .await
            .error(StatusCode::NOT_FOUND, "NotFound");
    }
    for uri in [
        format!("{VMIS}/%FF%FE"),
        format!("{VMIS}/default/%FF%FE"),
        format!("{SERVICES}/%FF%FE"),
        format!("{SERVICES}/default/%FF%FE"),
        format!("{SLICES}/%FF%FE"),
        format!("{SLICES}/default/%FF%FE"),
    ] {
        let r = admin(&b, Method::GET, &uri, None).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{uri}: {}", r.text());
        assert!(
            serde_json::from_slice::<Value>(&r.body).is_err(),
            "{uri}: {}",
            r.text()
        );
    }
}

/// How a missing object is named: by its kind and name on the host, by its namespace, name and
/// guest cluster in a guest cluster.
#[tokio::test]
async fn a_missing_object() {
    let b = EmbeddedBackend::start().await;
    for (uri, message) in [
        (format!("{POOLS}/nope"), "ippool \"nope\" not found"),
        (
            format!("{LBS}/default/nope"),
            "loadbalancer \"nope\" not found",
        ),
        (
            format!("{VMIS}/default/nope"),
            "virtualmachineinstance \"nope\" not found",
        ),
        (
            format!("{SERVICES}/default/nope"),
            "service \"nope\" not found",
        ),
        (
            format!("{SLICES}/default/nope"),
            "endpointslice \"nope\" not found",
        ),
        (
            format!("{GUEST}/services/default/nope"),
            "service default/nope not found in guest cluster gc-rest/c1",
        ),
    ] {
        let got = admin(&b, Method::GET, &uri, None)
            .await
            .error(StatusCode::NOT_FOUND, "NotFound");
        assert_eq!(got, message, "GET {uri}");
        let got = admin(&b, Method::DELETE, &uri, None).await;
        if got.status != StatusCode::METHOD_NOT_ALLOWED {
            assert_eq!(
                got.error(StatusCode::NOT_FOUND, "NotFound"),
                message,
                "DELETE {uri}"
            );
        }
    }
    let got = admin(
        &b,
        Method::PUT,
        &format!("{VMIS}/default/nope"),
        Some(vmi("default", "nope")),
    )
    .await
    .error(StatusCode::NOT_FOUND, "NotFound");
    assert_eq!(got, "virtualmachineinstance \"nope\" not found");
}

/// A conflict: the store's own words on the host (the kind's singular), Kubernetes' words in a
/// guest cluster (the plural resource), and a create of an existing guest Service is a conflict
/// too.
#[tokio::test]
async fn a_conflict() {
    let b = EmbeddedBackend::start().await;
    let made = admin(&b, Method::POST, VMIS, Some(vmi("default", "vm1")))
        .await
        .expect(StatusCode::CREATED);
    assert_eq!(made["id"], "default/vm1");
    assert_eq!(made["type"], "kubevirt.io.virtualmachineinstance");
    let again = admin(&b, Method::POST, VMIS, Some(vmi("default", "vm1")))
        .await
        .error(StatusCode::CONFLICT, "Conflict");
    assert_eq!(again, "virtualmachineinstance \"vm1\" already exists");
    let mut stale = vmi("default", "vm1");
    stale["metadata"]["resourceVersion"] = json!("1");
    let stale = admin(&b, Method::PUT, &format!("{VMIS}/default/vm1"), Some(stale))
        .await
        .error(StatusCode::CONFLICT, "Conflict");
    assert_eq!(
        stale,
        "Operation cannot be fulfilled on virtualmachineinstance \"vm1\": the object has been modified; please apply your changes to the latest version and try again"
    );

    let path = format!("{GUEST}/services/default/web");
    let made = admin(&b, Method::PUT, &path, Some(cluster_ip("default", "web")))
        .await
        .expect(StatusCode::CREATED);
    assert_eq!(made["kind"], "Service");
    let mut stale = cluster_ip("default", "web");
    stale["metadata"]["resourceVersion"] = json!("1");
    let stale = admin(&b, Method::PUT, &path, Some(stale))
        .await
        .error(StatusCode::CONFLICT, "Conflict");
    assert_eq!(
        stale,
        "Operation cannot be fulfilled on services \"web\": the object has been modified; please apply your changes to the latest version and try again"
    );
}

/// A body naming another object than the URL: "the object" on the host, "the service" in a guest
/// cluster; the namespace is compared before the name.
#[tokio::test]
async fn a_body_naming_another_object() {
    let b = EmbeddedBackend::start().await;
    admin(&b, Method::POST, VMIS, Some(vmi("default", "vm1")))
        .await
        .expect(StatusCode::CREATED);
    for (uri, body, message) in [
        (
            format!("{VMIS}/default/vm1"),
            vmi("other", "other"),
            "the namespace of the object (other) does not match the namespace on the URL (default)",
        ),
        (
            format!("{VMIS}/default/vm1"),
            vmi("default", "other"),
            "the name of the object (other) does not match the name on the URL (vm1)",
        ),
        (
            format!("{GUEST}/services/default/web"),
            cluster_ip("other", "other"),
            "the namespace of the service (other) does not match the namespace on the URL (default)",
        ),
    ] {
        let got = admin(&b, Method::PUT, &uri, Some(body))
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        assert_eq!(got, message, "{uri}");
    }
    let got = admin(
        &b,
        Method::POST,
        VMIS,
        Some(json!({"metadata": {"name": "vm2"}, "spec": {"domain": {"devices": {}}}})),
    )
    .await
    .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
    assert_eq!(
        got,
        "virtualmachineinstance vm2: metadata.namespace: Required value"
    );
}

/// An object that waits for its finalizers when deleted: a VMI answers 200 with the object as
/// stored (marked), a guest Service 202.
#[tokio::test]
async fn a_deletion_that_waits_for_finalizers() {
    let b = EmbeddedBackend::start().await;
    let mut held = vmi("default", "held");
    held["metadata"]["finalizers"] = json!(["example.com/hold"]);
    b.store()
        .create(&vmi_kind(), held)
        .await
        .expect("stores the VMI");
    let marked = admin(&b, Method::DELETE, &format!("{VMIS}/default/held"), None)
        .await
        .expect(StatusCode::OK);
    assert_eq!(marked["id"], "default/held");
    assert_eq!(marked["type"], "kubevirt.io.virtualmachineinstance");
    assert!(marked["metadata"]["deletionTimestamp"].is_string());

    let mut svc = cluster_ip("default", "held");
    svc["metadata"]["finalizers"] = json!(["example.com/hold"]);
    guest_store(&b)
        .create(&Kind::of::<Service>(), svc)
        .await
        .expect("stores the Service");
    let marked = admin(
        &b,
        Method::DELETE,
        &format!("{GUEST}/services/default/held"),
        None,
    )
    .await
    .expect(StatusCode::ACCEPTED);
    assert_eq!(marked["kind"], "Service");
    assert_eq!(marked["apiVersion"], "v1");
    assert!(marked["metadata"]["deletionTimestamp"].is_string());
}

/// A stored object that does not decode as its kind: a host collection leaves it out (and GET of
/// it is a 500 naming the object), a guest cluster's list fails whole (500).
#[tokio::test]
async fn a_stored_object_that_does_not_decode() {
    let b = EmbeddedBackend::start().await;
    let broken = |namespace: &str, name: &str| {
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"ports": "not a list"},
        })
    };
    b.store()
        .create(&Kind::of::<Service>(), broken("default", "broken"))
        .await
        .expect("stores the broken Service");
    let list = admin(&b, Method::GET, &format!("{SERVICES}/default"), None)
        .await
        .expect(StatusCode::OK);
    assert_eq!(list["data"], json!([]));
    assert_eq!(
        admin(&b, Method::GET, &format!("{SERVICES}/default/broken"), None)
            .await
            .error(StatusCode::INTERNAL_SERVER_ERROR, "ServerError"),
        "cannot get service broken: internal error, see the server log"
    );

    guest_store(&b)
        .create(&Kind::of::<Service>(), broken("default", "broken"))
        .await
        .expect("stores the broken guest Service");
    for uri in [
        format!("{GUEST}/services"),
        format!("{GUEST}/services/default/broken"),
    ] {
        assert_eq!(
            admin(&b, Method::GET, &uri, None)
                .await
                .error(StatusCode::INTERNAL_SERVER_ERROR, "ServerError"),
            "guest cluster request failed: internal error, see the server log",
            "{uri}"
        );
    }
}
