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
