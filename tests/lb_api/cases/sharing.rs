//! LoadBalancers sharing one pool address by a sharing key: the pool names one holder (upstream's
//! format), the others carry its address; a clash is refused naming the holder; the holder's going
//! hands the address to the next member; the last one's going releases it.

use crate::*;

const KEY: &str = "loadbalancer.harvesterhci.io/sharing-key";

/// A VM load balancer of group `dns` (by `annotation`) with one listener.
fn member(name: &str, protocol: &str, port: i32, annotation: &str) -> Value {
    with_annotations(
        mk_lb(
            "default",
            name,
            json!({"ipam": "pool", "listeners": [
                {"name": "p", "port": port, "protocol": protocol, "backendPort": 8000 + port}]}),
        ),
        &[(annotation, "dns")],
    )
}

async fn delete<B: Backend>(b: &B, name: &str) {
    let path = format!("{LBS}/default/{name}");
    ok(call(b, Method::DELETE, &path, None).await, StatusCode::OK);
    gone(b, &path).await;
}

async fn allocations<B: Backend>(b: &B) -> Value {
    pool(b, "share").await["status"]["allocated"].clone()
}

pub async fn sharing_by_key<B: Backend>(b: B) {
    let _r = Reconcilers::start(b.service_store());
    create_pool(
        &b,
        mk_pool(
            "share",
            range("192.168.120.0/24", "192.168.120.10", "192.168.120.20"),
            global(),
        ),
    )
    .await;
    create_lb(&b, member("dns-tcp", "TCP", 53, KEY)).await;
    let ip = ip_of(&allocated(&b, "default", "dns-tcp").await);
    // TCP/53 and UDP/53 share; so does a third, named by MetalLB's key.
    create_lb(&b, member("dns-udp", "UDP", 53, KEY)).await;
    create_lb(
        &b,
        member("dns-tls", "TCP", 853, "metallb.io/allow-shared-ip"),
    )
    .await;
    for name in ["dns-udp", "dns-tls"] {
        let lb = allocated(&b, "default", name).await;
        assert_eq!(ip_of(&lb), ip);
        assert_eq!(pool_of(&lb), "share");
    }
    let shared = events_about(&b, "dns-udp", "AddressShared").await;
    assert_eq!(
        shared[0].message.as_deref(),
        Some(format!("shares {ip} (IP pool share) with load balancer default/dns-tcp").as_str())
    );
    assert_eq!(
        allocations(&b).await,
        json!({ip.clone(): "default/dns-tcp"}),
        "one owner per address, upstream's format"
    );

    // A clash on protocol and port is refused, naming the holder.
    create_lb(&b, member("dns-again", "TCP", 53, KEY)).await;
    let condition = refused(&b, "default", "dns-again").await;
    assert_eq!(condition["reason"], "SharingRefused");
    assert_eq!(
        condition["message"],
        "load balancer default/dns-again cannot share the address of sharing key \"dns\": TCP/53 is held by load balancer default/dns-tcp"
    );

    // The holder goes: the address is handed to the next member, not released (to a sharer; the
    // refused one may share it by then, as its clash goes with the holder; they were made within a
    // second, so the name decides), and the one it refused is admitted.
    delete(&b, "dns-tcp").await;
    let holder = eventually("the address to be handed over", async || {
        let holder = allocations(&b).await[&ip].as_str()?.to_string();
        (holder != "default/dns-tcp").then_some(holder)
    })
    .await;
    assert!(
        ["default/dns-udp", "default/dns-tls", "default/dns-again"].contains(&holder.as_str()),
        "{holder}"
    );
    let handed = events_about(&b, "dns-tcp", "AddressHandedOver").await;
    assert_eq!(
        handed[0].message.as_deref(),
        Some(
            format!(
                "handed {ip} (IP pool share) over to load balancer {holder}, which shares it by key \"dns\""
            )
            .as_str()
        )
    );
    assert_eq!(ip_of(&allocated(&b, "default", "dns-again").await), ip);
    for name in ["dns-udp", "dns-tls"] {
        assert_eq!(ip_of(&allocated(&b, "default", name).await), ip);
    }

    // The others go, then the holder: the address is released.
    let holder_name = holder.trim_start_matches("default/").to_string();
    for name in ["dns-udp", "dns-tls", "dns-again"]
        .into_iter()
        .filter(|n| *n != holder_name)
    {
        delete(&b, name).await;
    }
    assert_eq!(allocations(&b).await, json!({ip.clone(): holder.clone()}));
    delete(&b, &holder_name).await;
    eventually("the shared address to be released", async || {
        allocations(&b).await.is_null().then_some(())
    })
    .await;
}
