//! The HTTP API's contract edges, its authentication, and the Events it lists.

use crate::*;

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
