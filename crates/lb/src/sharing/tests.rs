//! The host-side sharing decision over builder-made LoadBalancers (MetalLB's acceptance cases 2–4 in
//! a group's terms).

use super::*;
use crate::crd::LoadBalancerStatus;

fn mk_lb(
    name: &str,
    created: i64,
    listeners: &[(&str, i32)],
    annotations: &[(&str, &str)],
) -> LoadBalancer {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
        "metadata": {"namespace": "default", "name": name,
            "creationTimestamp": format!("2027-01-01T00:00:{created:02}Z"),
            "annotations": annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()},
        "spec": {"workloadType": "vm", "ipam": "pool",
            "listeners": listeners.iter().map(|(proto, port)| serde_json::json!({
                "name": format!("{}-{port}", proto.to_lowercase()), "protocol": proto, "port": port, "backendPort": port})).collect::<Vec<_>>()},
    }))
    .expect("a load balancer")
}

fn mk_member(name: &str, created: i64, listeners: &[(&str, i32)]) -> LoadBalancer {
    mk_lb(
        name,
        created,
        listeners,
        &[(keys::ANNOTATION_SHARING_KEY, "k")],
    )
}

fn mk_held(holder: &str, ip: &str) -> Held {
    Held {
        holder: format!("default/{holder}"),
        address: AllocatedAddress {
            ip_pool: "pool1".into(),
            ip: ip.into(),
            mask: "255.255.255.0".into(),
            gateway: String::new(),
        },
    }
}

fn with_address(mut lb: LoadBalancer, ip: &str) -> LoadBalancer {
    lb.status = Some(LoadBalancerStatus {
        allocated_address: mk_held("x", ip).address,
        address: ip.into(),
        ..Default::default()
    });
    lb
}

fn anywhere(_: &LoadBalancer) -> Result<Vec<String>, String> {
    Ok(vec!["pool1".into()])
}

#[test]
fn the_key_comes_from_ours_or_an_alias_and_they_must_agree() {
    assert_eq!(sharing_key(&mk_lb("a", 0, &[], &[])), Ok(None));
    for alias in KEY_ANNOTATIONS {
        assert_eq!(
            sharing_key(&mk_lb("a", 0, &[], &[(alias, " k ")])),
            Ok(Some("k".into()))
        );
    }
    assert_eq!(
        sharing_key(&mk_lb(
            "a",
            0,
            &[],
            &[
                (keys::ANNOTATION_SHARING_KEY, "k"),
                (keys::METALLB_SHARING_KEY, "other")
            ]
        )),
        Err("load balancer default/a: the sharing key annotations disagree: loadbalancer.harvesterhci.io/sharing-key is \"k\", metallb.io/allow-shared-ip is \"other\"".into())
    );
}

#[test]
fn the_holder_comes_first_and_a_clash_names_it() {
    let holder = with_address(mk_member("b", 5, &[("TCP", 80)]), "10.0.0.5");
    let older = mk_member("a", 0, &[("TCP", 80), ("UDP", 53)]);
    let udp = mk_member("c", 6, &[("UDP", 80)]);
    let held = mk_held("b", "10.0.0.5");
    let d = decide("k", &[&older, &holder, &udp], Some(&held), anywhere);
    assert_eq!(d.admitted, ["default/b", "default/c"]);
    assert_eq!(
        d.refused["default/a"],
        "load balancer default/a cannot share the address of sharing key \"k\": TCP/80 is held by load balancer default/b"
    );
    // Without the holder, the oldest goes first.
    let d = decide("k", &[&udp, &older], None, anywhere);
    assert_eq!(d.admitted, ["default/a", "default/c"]);
}

#[test]
fn sharers_must_agree_and_may_use_the_address_s_pool() {
    let holder = with_address(mk_member("a", 0, &[("TCP", 80)]), "10.0.0.5");
    let held = mk_held("a", "10.0.0.5");
    let mut cluster = mk_member("cl", 1, &[]);
    cluster.spec.workload_type = "cluster".into();
    let mut pinned = mk_member("pinned", 2, &[("TCP", 81)]);
    pinned.spec.ip_pool = "pool2".into();
    let asking = mk_lb(
        "asking",
        3,
        &[("TCP", 82)],
        &[
            (keys::ANNOTATION_SHARING_KEY, "k"),
            (keys::ANNOTATION_REQUESTED_IP, "10.0.0.9"),
        ],
    );
    let mut dhcp = mk_member("leased", 4, &[("TCP", 83)]);
    dhcp.spec.ipam = "dhcp".into();
    let elsewhere = mk_member("elsewhere", 5, &[("TCP", 84)]);
    let d = decide(
        "k",
        &[&holder, &cluster, &pinned, &asking, &dhcp, &elsewhere],
        Some(&held),
        |lb| {
            if lb.applicant() == "default/elsewhere" {
                Ok(vec!["pool3".into()])
            } else {
                Ok(vec!["pool1".into()])
            }
        },
    );
    assert_eq!(d.admitted, ["default/a"]);
    assert_eq!(
        d.refused["default/cl"],
        "load balancer default/cl cannot share the address of sharing key \"k\": its workload type is \"cluster\", and load balancer default/a's is \"vm\""
    );
    assert_eq!(
        d.refused["default/pinned"],
        "load balancer default/pinned cannot share the address of sharing key \"k\": its IP pool is \"pool2\", and load balancer default/a's is none"
    );
    assert_eq!(
        d.refused["default/asking"],
        "load balancer default/asking cannot share the address of sharing key \"k\": its requested address is 10.0.0.9, and load balancer default/a's is none"
    );
    assert!(d.refused["default/leased"].starts_with(
        "load balancer default/leased cannot share an address by sharing key \"k\": its IPAM mode is dhcp"
    ));
    assert_eq!(
        d.refused["default/elsewhere"],
        "load balancer default/elsewhere cannot share an address by sharing key \"k\": the group's address 10.0.0.5 is in IP pool pool1, which it may not use (eligible: pool3)"
    );
}

#[test]
fn a_hand_over_goes_to_the_first_sharer() {
    // The holder went: among the rest, those sharing the address come first.
    let newer_sharer = with_address(mk_member("s", 9, &[("TCP", 81)]), "10.0.0.5");
    let older_waiting = mk_member("w", 1, &[("TCP", 82)]);
    let held = mk_held("gone", "10.0.0.5");
    let d = decide("k", &[&older_waiting, &newer_sharer], Some(&held), anywhere);
    assert_eq!(d.admitted, ["default/s", "default/w"]);
}
