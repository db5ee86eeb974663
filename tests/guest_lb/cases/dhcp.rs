//! Stable DHCP leases: the MAC address and the leased address the guest's kube-vip reports,
//! recorded on the LoadBalancer and written back onto a Service recreated under the same name; and
//! what kube-vip could not lease with, refused on both sides.

use crate::*;

const HWADDR: &str = "kube-vip.io/hwaddr";
const REQUESTED_IP: &str = "kube-vip.io/requestedIP";
const MAC_RECORD: &str = "cloudprovider.harvesterhci.io/dhcpMACAddress";
const LEASE_RECORD: &str = "cloudprovider.harvesterhci.io/dhcpLeasedIP";
const RETAINED: &str = "cloudprovider.harvesterhci.io/dhcpRetainedUntil";

fn dhcp_web(extra: &[(&str, &str)]) -> Value {
    let mut annotations = vec![("cloudprovider.harvesterhci.io/ipam", "dhcp")];
    annotations.extend_from_slice(extra);
    mk_svc("default", "web", &[("TCP", 80)], &annotations)
}

/// A DHCP Service leases with a MAC address written with its DHCP mark; kube-vip's lease is
/// recorded on the LoadBalancer; deleted and created again from the same manifest, the Service gets
/// the same MAC address and asks for the same address, and the old LoadBalancer goes; deleted for
/// good, its LoadBalancer is kept for the retention, then deleted.
pub async fn dhcp_leases_survive_recreation<E: GuestEnv>(env: E) {
    env.put(dhcp_web(&[])).await.expect("accepted");
    let (svc, _) = address(&env, "default", "web").await;
    let mac = annotation(&svc, HWADDR)
        .expect("a MAC address with the DHCP mark")
        .to_string();
    let first = lb_name(&svc);
    let lb = lb_of(&env, &svc).await.expect("exists");
    assert_eq!(lb["metadata"]["annotations"][MAC_RECORD], mac.as_str());

    env.kube_vip_leases("default", "web", &mac, "192.168.77.7")
        .await;
    eventually("the lease to be recorded", async || {
        let lb = lb_of_name(&env, &first).await?;
        (lb["metadata"]["annotations"][LEASE_RECORD] == "192.168.77.7").then_some(())
    })
    .await;

    env.delete("default", "web").await;
    service_gone(&env, "default", "web").await;
    event(
        &env,
        "default",
        "web",
        reconcile::reason::DELETED,
        &format!(
            "Released load balancer {NS}/{first}; its DHCP lease record is kept for {}s for a service recreated as default/web",
            RETENTION.as_secs()
        ),
    )
    .await;
    let kept = lb_of_name(&env, &first).await.expect("kept");
    assert!(
        kept["metadata"]["annotations"][RETAINED].is_string(),
        "{kept}"
    );

    env.put(dhcp_web(&[])).await.expect("accepted");
    let (again, _) = address(&env, "default", "web").await;
    assert_ne!(again["metadata"]["uid"], svc["metadata"]["uid"]);
    assert_eq!(annotation(&again, HWADDR), Some(mac.as_str()));
    assert_eq!(annotation(&again, REQUESTED_IP), Some("192.168.77.7"));
    let second = lb_name(&again);
    let lb = lb_of_name(&env, &second).await.expect("exists");
    assert_eq!(lb["metadata"]["annotations"][LEASE_RECORD], "192.168.77.7");
    lb_gone(&env, &first).await;

    // Deleted for good: kept for the retention, then collected.
    env.delete("default", "web").await;
    service_gone(&env, "default", "web").await;
    let deleted_at = std::time::Instant::now();
    assert!(lb_of_name(&env, &second).await.is_some(), "kept a while");
    lb_gone(&env, &second).await;
    assert!(
        deleted_at.elapsed() >= RETENTION - Duration::from_secs(1),
        "collected only once its time was up"
    );
}

/// A MAC address kube-vip could not lease with is refused on the guest Service (at once by the
/// embedded API, as an Event in a guest cluster), and Harvester's LoadBalancer admission refuses
/// such a record, and a record on a load balancer that is not DHCP.
pub async fn dhcp_lease_values_are_checked<E: GuestEnv>(env: E) {
    let put = env.put(dhcp_web(&[(HWADDR, "01:00:5e:00:00:01")])).await;
    refused(
        &env,
        put,
        "default",
        "web",
        "service default/web: annotation kube-vip.io/hwaddr is \"01:00:5e:00:00:01\": a multicast MAC address (the low bit of the first octet, 01, is set); the lease needs a unicast address",
    )
    .await;

    let lb = |name: &str, ipam: &str, record: &[(&str, &str)]| {
        let annotations: BTreeMap<&str, &str> = record.iter().copied().collect();
        json!({
            "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
            "metadata": {"name": name, "namespace": NS, "annotations": annotations},
            "spec": {"workloadType": "cluster", "ipam": ipam}
        })
    };
    for (body, message) in [
        (
            lb("zero", "dhcp", &[(MAC_RECORD, "00:00:00:00:00:00")]),
            format!(
                "create loadbalancer {NS}/zero failed: annotation {MAC_RECORD} is \"00:00:00:00:00:00\": the all-zero MAC address; the lease needs a unicast address"
            ),
        ),
        (
            lb("pooled", "pool", &[(MAC_RECORD, "02:00:5e:10:00:01")]),
            format!(
                "create loadbalancer {NS}/pooled failed: annotation {MAC_RECORD} is a DHCP lease record, and spec.ipam is not dhcp"
            ),
        ),
    ] {
        let r = call(env.harvester(), Method::POST, LBS, Some(body)).await;
        assert_eq!(
            r.error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent"),
            message
        );
    }
    let good = lb(
        "good",
        "dhcp",
        &[
            (MAC_RECORD, "02:00:5e:10:00:01"),
            (LEASE_RECORD, "192.168.77.8"),
        ],
    );
    ok(
        call(env.harvester(), Method::POST, LBS, Some(good)).await,
        StatusCode::CREATED,
    );
}
