//! Stable DHCP leases, one guest Service reconcile at a time: the MAC address a DHCP Service's
//! kube-vip leases with and the address it leased, recorded on the LoadBalancer and written back
//! onto a Service that lost them or was recreated; an operator's MAC address and host name; what
//! kube-vip could not lease with, refused.
//!
//! The guest's kube-vip is played by writing what kube-vip v1.2.3 (the version Harvester's guest
//! chart pins) writes once it holds a lease (pkg/services/services.go, `updateStatus`): one update
//! of the Service with `kube-vip.io/vipHost` (ARP mode), `kube-vip.io/hwaddr` (Go's
//! `net.HardwareAddr.String()`: lowercase, colons) and `kube-vip.io/requestedIP`, then its status
//! with the leased address and the Service's ports.

use std::time::Duration;

use harvester_cloud::{
    crd::{LoadBalancer, keys},
    guest::{dhcp::generated_mac, naming::load_balancer_name},
};
use k8s_openapi::api::core::v1::Service;
use serde_json::{Value, json};

use crate::world::{CLUSTER, GuestWorld, NS, normal, requeue, typed, warning};

/// A DHCP Service `default/<name>` on TCP 80 with these annotations too.
fn dhcp_svc(name: &str, annotations: &[(&str, &str)]) -> Value {
    let mut all: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    all.insert(keys::SVC_IPAM.into(), json!("dhcp"));
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "default", "name": name, "annotations": all},
        "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "protocol": "TCP", "port": 80}]}
    })
}

fn annotation<'a>(svc: &'a Service, key: &str) -> Option<&'a str> {
    svc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn lb_annotation<'a>(lb: &'a LoadBalancer, key: &str) -> Option<&'a str> {
    lb.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The MAC address a Service of this guest cluster gets when none is named or recorded.
fn generated(w: &GuestWorld, name: &str) -> String {
    generated_mac(&w.cluster.identity, "default", name)
}

/// The name of the LoadBalancer of Service `default/<name>` as stored now.
async fn lb_name_of(w: &GuestWorld, name: &str) -> String {
    let svc = w.svc("default", name).await;
    load_balancer_name(
        CLUSTER,
        "default",
        name,
        svc.metadata.uid.as_deref().expect("a uid"),
    )
}

/// Serves DHCP Service `default/<name>`: its LoadBalancer, Harvester's DHCP mark, the write-back.
/// Returns the LoadBalancer's name.
async fn served(w: &mut GuestWorld, name: &str, annotations: &[(&str, &str)]) -> String {
    w.add(dhcp_svc(name, annotations)).await;
    w.reconcile("default", name).await;
    let lb_name = lb_name_of(w, name).await;
    let lb = w.try_lb(&lb_name).await.expect("the load balancer");
    w.allocate(&lb, keys::DHCP_ADDRESS).await;
    w.reconcile("default", name).await;
    w.events();
    lb_name
}

/// Plays kube-vip v1.2.3 once it holds a lease of `ip` on `mac` (see the module's comment).
async fn kube_vip_leases(w: &GuestWorld, name: &str, mac: &str, ip: &str) {
    w.edit("default", name, |s| {
        let a = s.metadata.annotations.get_or_insert_default();
        a.insert("kube-vip.io/vipHost".into(), "guest-cp-1".into());
        a.insert(keys::KUBE_VIP_HWADDR.into(), mac.into());
        a.insert(keys::KUBE_VIP_REQUESTED_IP.into(), ip.into());
    })
    .await;
    let mut svc = w.svc("default", name).await;
    svc.status = Some(typed(json!({"loadBalancer": {"ingress": [
        {"ip": ip, "ports": [{"port": 80, "protocol": "TCP"}]}
    ]}})));
    w.services()
        .replace_status(&svc)
        .await
        .expect("kube-vip writes the status");
}

/// A DHCP Service that was served and whose kube-vip leased `ip` on the generated MAC address,
/// recorded. Returns the LoadBalancer's name and the MAC address.
async fn leased(w: &mut GuestWorld, name: &str, ip: &str) -> (String, String) {
    let lb_name = served(w, name, &[]).await;
    let mac = generated(w, name);
    kube_vip_leases(w, name, &mac, ip).await;
    w.reconcile("default", name).await;
    w.events();
    (lb_name, mac)
}

#[tokio::test]
async fn a_dhcp_service_leases_with_a_mac_address_made_from_its_name() {
    let mut w = GuestWorld::new().await;
    let lb_name = served(&mut w, "web", &[]).await;

    let mac = generated(&w, "web");
    let first_octet = u8::from_str_radix(&mac[..2], 16).expect("hex");
    assert_eq!(first_octet & 0x03, 0x02, "locally administered unicast");
    let svc = w.svc("default", "web").await;
    // Written with the DHCP mark, so kube-vip makes its interface with it.
    assert_eq!(annotation(&svc, keys::KUBE_VIP_IPS), Some("0.0.0.0"));
    assert_eq!(annotation(&svc, keys::KUBE_VIP_HWADDR), Some(mac.as_str()));
    assert_eq!(annotation(&svc, keys::KUBE_VIP_REQUESTED_IP), None);
    assert_eq!(annotation(&svc, keys::KUBE_VIP_HOSTNAME), None);
    let lb = w.try_lb(&lb_name).await.expect("exists");
    assert_eq!(
        lb_annotation(&lb, keys::ANNOTATION_DHCP_MAC),
        Some(mac.as_str())
    );
    assert_eq!(lb_annotation(&lb, keys::ANNOTATION_DHCP_LEASED_IP), None);
    // Another Service gets another.
    served(&mut w, "api", &[]).await;
    let api = w.svc("default", "api").await;
    assert_ne!(annotation(&api, keys::KUBE_VIP_HWADDR), Some(mac.as_str()));
}

#[tokio::test]
async fn kube_vip_s_lease_is_recorded_on_the_load_balancer() {
    let mut w = GuestWorld::new().await;
    let lb_name = served(&mut w, "web", &[]).await;
    let mac = generated(&w, "web");
    kube_vip_leases(&w, "web", &mac, "192.168.50.7").await;

    w.reconcile("default", "web").await;

    let lb = w.try_lb(&lb_name).await.expect("exists");
    assert_eq!(
        lb_annotation(&lb, keys::ANNOTATION_DHCP_MAC),
        Some(mac.as_str())
    );
    assert_eq!(
        lb_annotation(&lb, keys::ANNOTATION_DHCP_LEASED_IP),
        Some("192.168.50.7")
    );
    assert_eq!(
        lb.status.as_ref().map(|s| s.address.as_str()),
        Some("192.168.50.7")
    );
    // A renewal that moved the lease (kube-vip writes the new address) moves the record.
    kube_vip_leases(&w, "web", &mac, "192.168.50.8").await;
    w.reconcile("default", "web").await;
    let lb = w.try_lb(&lb_name).await.expect("exists");
    assert_eq!(
        lb_annotation(&lb, keys::ANNOTATION_DHCP_LEASED_IP),
        Some("192.168.50.8")
    );
    assert_eq!(w.events(), []);
}

#[tokio::test]
async fn lease_annotations_a_service_lost_are_written_back() {
    let mut w = GuestWorld::new().await;
    let (_, mac) = leased(&mut w, "web", "192.168.50.7").await;

    // Replaced from a manifest that never had kube-vip's annotations (`kubectl replace`, GitOps).
    w.edit("default", "web", |s| {
        let a = s.metadata.annotations.get_or_insert_default();
        a.remove(keys::KUBE_VIP_HWADDR);
        a.remove(keys::KUBE_VIP_REQUESTED_IP);
    })
    .await;
    w.reconcile("default", "web").await;

    let svc = w.svc("default", "web").await;
    assert_eq!(annotation(&svc, keys::KUBE_VIP_HWADDR), Some(mac.as_str()));
    assert_eq!(
        annotation(&svc, keys::KUBE_VIP_REQUESTED_IP),
        Some("192.168.50.7")
    );
    assert_eq!(annotation(&svc, keys::KUBE_VIP_IPS), Some("0.0.0.0"));
}

#[tokio::test]
async fn an_operator_names_the_mac_address_and_the_host_name_up_front() {
    let mut w = GuestWorld::new().await;
    // Pre-bound on the DHCP server: written in any form Go's net.ParseMAC reads.
    let lb_name = served(
        &mut w,
        "web",
        &[
            (keys::KUBE_VIP_HWADDR, "00-00-6C-AB-CD-EF"),
            (keys::KUBE_VIP_HOSTNAME, "web-lb"),
        ],
    )
    .await;

    let lb = w.try_lb(&lb_name).await.expect("exists");
    assert_eq!(
        lb_annotation(&lb, keys::ANNOTATION_DHCP_MAC),
        Some("00:00:6c:ab:cd:ef")
    );
    assert_eq!(
        lb_annotation(&lb, keys::ANNOTATION_DHCP_HOSTNAME),
        Some("web-lb")
    );
    let svc = w.svc("default", "web").await;
    assert_eq!(
        annotation(&svc, keys::KUBE_VIP_HWADDR),
        Some("00-00-6C-AB-CD-EF"),
        "the Service's own value stays as written"
    );
    // An empty host name says "none": the record forgets it, and it is not written back.
    w.edit("default", "web", |s| {
        s.metadata
            .annotations
            .get_or_insert_default()
            .insert(keys::KUBE_VIP_HOSTNAME.into(), String::new());
    })
    .await;
    w.reconcile("default", "web").await;
    let lb = w.try_lb(&lb_name).await.expect("exists");
    assert_eq!(lb_annotation(&lb, keys::ANNOTATION_DHCP_HOSTNAME), None);
    assert_eq!(
        annotation(&w.svc("default", "web").await, keys::KUBE_VIP_HOSTNAME),
        Some("")
    );
}

#[tokio::test]
async fn lease_annotations_kube_vip_could_not_lease_with_are_refused() {
    let mut w = GuestWorld::new().await;
    for (i, (key, value, reason)) in [
        (
            keys::KUBE_VIP_HWADDR,
            "01:00:5e:00:00:01",
            "a multicast MAC address (the low bit of the first octet, 01, is set); the lease needs a unicast address",
        ),
        (
            keys::KUBE_VIP_HWADDR,
            "ff:ff:ff:ff:ff:ff",
            "the broadcast MAC address; the lease needs a unicast address",
        ),
        (
            keys::KUBE_VIP_HWADDR,
            "00:00:00:00:00:00",
            "the all-zero MAC address; the lease needs a unicast address",
        ),
        (
            keys::KUBE_VIP_HWADDR,
            "00:00:6c:12:34",
            "not a MAC address: six hex pairs, as in 02:00:5e:10:00:01 (or 02-00-5E-10-00-01, 0200.5e10.0001)",
        ),
        (
            keys::KUBE_VIP_REQUESTED_IP,
            "10.0.0.1,10.0.0.2",
            "two addresses of one family (10.0.0.1 and 10.0.0.2); a lease has one per family",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("bad{i}");
        w.add(dhcp_svc(&name, &[(key, value)])).await;
        assert_eq!(w.reconcile("default", &name).await, requeue(60));
        assert_eq!(
            w.events(),
            [warning(
                &format!("default/{name}"),
                "SyncLoadBalancerFailed",
                &format!("service default/{name}: annotation {key} is \"{value}\": {reason}")
            )]
        );
    }
    w.add(dhcp_svc("badhost", &[(keys::KUBE_VIP_HOSTNAME, "Web_LB")]))
        .await;
    assert_eq!(w.reconcile("default", "badhost").await, requeue(60));
    let events = w.events();
    assert_eq!(events.len(), 1);
    assert!(
        events[0].message.starts_with(
            "service default/badhost: annotation kube-vip.io/loadbalancerHostname is \"Web_LB\": a lowercase RFC 1123 label"
        ),
        "{events:?}"
    );
    assert!(w.all_lbs().await.is_empty(), "nothing made for them");

    // A served Service that is edited so: refused, its record kept as it was.
    let (lb_name, mac) = leased(&mut w, "web", "192.168.50.7").await;
    w.edit("default", "web", |s| {
        s.metadata
            .annotations
            .get_or_insert_default()
            .insert(keys::KUBE_VIP_HWADDR.into(), "33:33:00:00:00:01".into());
    })
    .await;
    assert_eq!(w.reconcile("default", "web").await, requeue(60));
    assert_eq!(w.events().len(), 1);
    let lb = w.try_lb(&lb_name).await.expect("exists");
    assert_eq!(
        lb_annotation(&lb, keys::ANNOTATION_DHCP_MAC),
        Some(mac.as_str())
    );
}

#[tokio::test]
async fn a_pool_service_has_no_lease_record() {
    let mut w = GuestWorld::new().await;
    w.add(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "default", "name": "web",
            "annotations": {keys::KUBE_VIP_HWADDR: "not a mac"}},
        "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "protocol": "TCP", "port": 80}]}
    }))
    .await;
    assert_eq!(w.reconcile("default", "web").await, requeue(30));
    let lb = w.lb_of("default", "web").await;
    assert_eq!(lb_annotation(&lb, keys::ANNOTATION_DHCP_MAC), None);
    assert_eq!(w.events(), []);
}

#[tokio::test]
async fn a_recreated_service_takes_the_lease_record_of_the_deleted_one() {
    let mut w = GuestWorld::new().await;
    let (old_lb, mac) = leased(&mut w, "web", "192.168.50.7").await;

    w.delete("default", "web").await;
    w.reconcile("default", "web").await;

    assert!(w.try_svc("default", "web").await.is_none());
    let kept = w.try_lb(&old_lb).await.expect("kept for its record");
    assert!(lb_annotation(&kept, keys::ANNOTATION_DHCP_RETAINED_UNTIL).is_some());
    assert_eq!(
        w.events(),
        [normal(
            "default/web",
            "DeletedLoadBalancer",
            &format!(
                "Released load balancer {NS}/{old_lb}; its DHCP lease record is kept for 10m for a service recreated as default/web"
            )
        )]
    );

    // The same manifest again: a new UID, a new LoadBalancer, the same lease.
    w.add(dhcp_svc("web", &[])).await;
    w.reconcile("default", "web").await;
    let new_lb = lb_name_of(&w, "web").await;
    assert_ne!(new_lb, old_lb);
    assert!(w.try_lb(&old_lb).await.is_none(), "taken, so deleted");
    let lb = w.try_lb(&new_lb).await.expect("made");
    assert_eq!(
        lb_annotation(&lb, keys::ANNOTATION_DHCP_MAC),
        Some(mac.as_str())
    );
    assert_eq!(
        lb_annotation(&lb, keys::ANNOTATION_DHCP_LEASED_IP),
        Some("192.168.50.7")
    );
    assert_eq!(
        lb_annotation(&lb, keys::ANNOTATION_DHCP_RETAINED_UNTIL),
        None
    );
    assert_eq!(
        w.events(),
        [normal(
            "default/web",
            "EnsuredLoadBalancer",
            &format!(
                "Took the DHCP lease record of load balancer {NS}/{old_lb} (MAC address {mac}, leased address 192.168.50.7) for load balancer {NS}/{new_lb}"
            )
        )]
    );
    w.allocate(&lb, keys::DHCP_ADDRESS).await;
    w.reconcile("default", "web").await;
    let svc = w.svc("default", "web").await;
    assert_eq!(annotation(&svc, keys::KUBE_VIP_IPS), Some("0.0.0.0"));
    assert_eq!(annotation(&svc, keys::KUBE_VIP_HWADDR), Some(mac.as_str()));
    assert_eq!(
        annotation(&svc, keys::KUBE_VIP_REQUESTED_IP),
        Some("192.168.50.7")
    );
}

#[tokio::test]
async fn a_recreated_service_s_own_mac_address_wins_over_the_record() {
    let mut w = GuestWorld::new().await;
    w.set_record_retention(Duration::from_secs(90));
    let (old_lb, _) = leased(&mut w, "web", "192.168.50.7").await;
    w.delete("default", "web").await;
    w.reconcile("default", "web").await;
    assert!(
        w.events()[0].message.ends_with(
            "its DHCP lease record is kept for 90s for a service recreated as default/web"
        )
    );

    w.add(dhcp_svc(
        "web",
        &[(keys::KUBE_VIP_HWADDR, "02:00:5e:10:00:01")],
    ))
    .await;
    w.reconcile("default", "web").await;

    let lb = w.try_lb(&lb_name_of(&w, "web").await).await.expect("made");
    assert_eq!(
        lb_annotation(&lb, keys::ANNOTATION_DHCP_MAC),
        Some("02:00:5e:10:00:01")
    );
    assert_eq!(
        lb_annotation(&lb, keys::ANNOTATION_DHCP_LEASED_IP),
        Some("192.168.50.7")
    );
    assert!(w.try_lb(&old_lb).await.is_none());
}

#[tokio::test]
async fn a_record_is_not_carried_to_another_network() {
    let mut w = GuestWorld::new().await;
    let (old_lb, mac) = leased(&mut w, "web", "192.168.50.7").await;
    w.delete("default", "web").await;
    w.reconcile("default", "web").await;

    w.add(dhcp_svc("web", &[(keys::SVC_NETWORK, "default/vlan20")]))
        .await;
    w.reconcile("default", "web").await;

    let lb = w.try_lb(&lb_name_of(&w, "web").await).await.expect("made");
    assert_eq!(lb_annotation(&lb, keys::ANNOTATION_DHCP_LEASED_IP), None);
    assert_eq!(
        lb_annotation(&lb, keys::ANNOTATION_DHCP_MAC),
        Some(mac.as_str()),
        "the MAC address made from the name is the same anyway"
    );
    assert!(
        w.try_lb(&old_lb).await.is_some(),
        "kept until its time is up (the collector deletes it then)"
    );
}

#[tokio::test]
async fn with_no_retention_a_leased_service_s_load_balancer_goes_at_once() {
    let mut w = GuestWorld::new().await;
    w.set_record_retention(Duration::ZERO);
    let (lb_name, _) = leased(&mut w, "web", "192.168.50.7").await;

    w.delete("default", "web").await;
    w.reconcile("default", "web").await;

    assert!(w.try_lb(&lb_name).await.is_none());
    assert_eq!(
        w.events(),
        [normal(
            "default/web",
            "DeletedLoadBalancer",
            &format!("Deleted load balancer {NS}/{lb_name}")
        )]
    );
}

#[tokio::test]
async fn a_deleted_dhcp_service_that_never_leased_gives_its_load_balancer_back_at_once() {
    let mut w = GuestWorld::new().await;
    let lb_name = served(&mut w, "web", &[]).await;

    w.delete("default", "web").await;
    w.reconcile("default", "web").await;

    assert!(w.try_svc("default", "web").await.is_none());
    assert!(w.try_lb(&lb_name).await.is_none());
    assert_eq!(
        w.events(),
        [normal(
            "default/web",
            "DeletedLoadBalancer",
            &format!("Deleted load balancer {NS}/{lb_name}")
        )]
    );
}
