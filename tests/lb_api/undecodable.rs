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
