//! The sharing rules as pure decisions over builder-made Services (MetalLB's acceptance cases 2–4 in
//! a group's terms: same key and no (protocol, port) overlap share; a clash is refused and names the
//! holder; a member may change its ports while they stay free).

use std::collections::BTreeMap;

use super::*;

fn mk_svc(
    name: &str,
    created: i64,
    ports: &[(&str, i32)],
    annotations: &[(&str, &str)],
) -> Service {
    let created = format!("2027-01-01T00:00:{created:02}Z");
    serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "default", "name": name, "uid": format!("uid-{name}"),
            "creationTimestamp": created,
            "annotations": annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()},
        "spec": {"type": "LoadBalancer", "ports": ports.iter().map(|(proto, port)| serde_json::json!({"protocol": proto, "port": port})).collect::<Vec<_>>()},
    }))
    .expect("a service")
}

fn mk_member(name: &str, created: i64, ports: &[(&str, i32)]) -> Service {
    mk_svc(name, created, ports, &[(keys::SVC_SHARING_KEY, "k")])
}

fn mk_key() -> SharingKey {
    SharingKey {
        value: "k".into(),
        annotation: keys::SVC_SHARING_KEY,
    }
}

fn mk_candidates(svcs: &[&Service]) -> Vec<Candidate<'static>> {
    svcs.iter()
        .map(|s| Candidate {
            svc: Box::leak(Box::new((*s).clone())),
            admitted: false,
            secondaries: Vec::new(),
        })
        .collect()
}

fn mk_lb(address: Option<&str>, listeners: &[(&str, &str, i32)]) -> GroupLb {
    GroupLb {
        key: "gc-test/gc1-default-shared-k-12345678".into(),
        network: String::new(),
        address: address.map(|a| a.parse().expect("an address")),
        holders: listeners
            .iter()
            .map(|(owner, proto, port)| (((*proto).to_string(), *port), (*owner).to_string()))
            .collect(),
    }
}

fn refusal(d: &Decision<'_>, name: &str) -> String {
    d.refused
        .get(&format!("default/{name}"))
        .map(ToString::to_string)
        .unwrap_or_else(|| panic!("{name} is not refused: {:?}", d.member_keys()))
}

#[test]
fn the_key_comes_from_ours_or_an_alias_and_they_must_agree() {
    assert_eq!(sharing_key(&mk_svc("a", 0, &[], &[])), Ok(None));
    assert_eq!(
        sharing_key(&mk_svc("a", 0, &[], &[(keys::SVC_SHARING_KEY, "  ")])),
        Ok(None),
        "blank is none"
    );
    for alias in [
        keys::METALLB_SHARING_KEY,
        keys::METALLB_LEGACY_SHARING_KEY,
        keys::CILIUM_SHARING_KEY,
    ] {
        assert_eq!(
            sharing_key(&mk_svc("a", 0, &[], &[(alias, "dns")])),
            Ok(Some(SharingKey {
                value: "dns".into(),
                annotation: alias
            }))
        );
    }
    // The same key under two annotations is one key, read from ours.
    assert_eq!(
        sharing_key(&mk_svc(
            "a",
            0,
            &[],
            &[
                (keys::METALLB_SHARING_KEY, "dns"),
                (keys::SVC_SHARING_KEY, "dns")
            ]
        ))
        .expect("agrees")
        .expect("a key")
        .annotation,
        keys::SVC_SHARING_KEY
    );
    assert_eq!(
        sharing_key(&mk_svc(
            "a",
            0,
            &[],
            &[
                (keys::SVC_SHARING_KEY, "dns"),
                (keys::CILIUM_SHARING_KEY, "web")
            ]
        ))
        .expect_err("disagree")
        .to_string(),
        "service default/a: the sharing key annotations disagree: cloudprovider.harvesterhci.io/sharing-key is \"dns\", lbipam.cilium.io/sharing-key is \"web\""
    );
    assert!(asks_cross_namespace(&mk_svc(
        "a",
        0,
        &[],
        &[(keys::CILIUM_SHARING_CROSS_NAMESPACE, "*")]
    )));
    assert!(!asks_cross_namespace(&mk_svc("a", 0, &[], &[])));
}

#[test]
fn members_without_a_clash_share_and_the_listeners_name_the_holders() {
    let a = mk_member("a", 0, &[("TCP", 53)]);
    let b = mk_member("b", 1, &[("UDP", 53)]);
    let c = mk_member("c", 2, &[("TCP", 80), ("TCP", 443)]);
    let candidates = mk_candidates(&[&c, &b, &a]);
    let d = decide(&mk_key(), &candidates, None);
    assert!(d.refused.is_empty(), "{:?}", d.refused);
    assert_eq!(d.member_keys(), ["default/a", "default/b", "default/c"]);
    let listeners: Vec<(String, String, i32)> = d
        .listeners
        .iter()
        .map(|l| (l.name.clone(), l.protocol.clone(), l.port))
        .collect();
    assert_eq!(
        listeners,
        [
            ("a-tcp-53".to_string(), "TCP".to_string(), 53),
            ("c-tcp-80".into(), "TCP".into(), 80),
            ("c-tcp-443".into(), "TCP".into(), 443),
            ("b-udp-53".into(), "UDP".into(), 53),
        ]
    );
    assert_eq!(d.terms.expect("terms").reference, "default/a");
}

#[test]
fn a_clash_refuses_the_newer_service_and_names_the_holders() {
    let a = mk_member("a", 0, &[("TCP", 80)]);
    let b = mk_member("b", 1, &[("UDP", 53)]);
    let c = mk_member("c", 2, &[("TCP", 80), ("UDP", 53), ("TCP", 8080)]);
    let candidates = mk_candidates(&[&a, &b, &c]);
    let d = decide(&mk_key(), &candidates, None);
    assert_eq!(d.member_keys(), ["default/a", "default/b"]);
    assert_eq!(
        refusal(&d, "c"),
        "service default/c cannot share the address of sharing key \"k\": TCP/80 is held by service default/a; UDP/53 is held by service default/b"
    );
    assert!(matches!(
        d.refused.get("default/c"),
        Some(GuestError::SharingPortsClash { holders, .. }) if holders == &["default/a", "default/b"]
    ));
    assert_eq!(d.listeners.len(), 2, "the refused one holds nothing");
    // Once the holders go, it is admitted.
    let candidates = mk_candidates(&[&c]);
    assert_eq!(
        decide(&mk_key(), &candidates, None).member_keys(),
        ["default/c"]
    );
}

#[test]
fn the_recorded_holder_keeps_its_port_when_an_older_member_moves_onto_it() {
    // a (older) changes its port to b's 443: a is the one refused, b keeps its port.
    let a = mk_member("a", 0, &[("TCP", 443)]);
    let b = mk_member("b", 1, &[("TCP", 443)]);
    let mut candidates = mk_candidates(&[&a, &b]);
    for c in &mut candidates {
        c.admitted = true;
    }
    let lb = mk_lb(Some("10.0.0.5"), &[("a", "TCP", 80), ("b", "TCP", 443)]);
    let d = decide(&mk_key(), &candidates, Some(&lb));
    assert_eq!(d.member_keys(), ["default/b"]);
    assert_eq!(
        refusal(&d, "a"),
        "service default/a cannot share the address of sharing key \"k\": TCP/443 is held by service default/b"
    );
    // A member changing to ports that are free keeps sharing (MetalLB's case 4).
    let a = mk_member("a", 0, &[("TCP", 8443)]);
    let mut candidates = mk_candidates(&[&a, &b]);
    for c in &mut candidates {
        c.admitted = true;
    }
    assert_eq!(
        decide(&mk_key(), &candidates, Some(&lb)).member_keys(),
        ["default/a", "default/b"]
    );
    // A record whose holder no longer exposes the port holds nothing.
    let stale = mk_lb(Some("10.0.0.5"), &[("gone", "TCP", 443)]);
    let b_only = mk_candidates(&[&b]);
    assert_eq!(
        decide(&mk_key(), &b_only, Some(&stale)).member_keys(),
        ["default/b"]
    );
}

#[test]
fn members_that_cannot_share_are_refused_for_themselves() {
    let primary_too = mk_svc(
        "p",
        0,
        &[("TCP", 1)],
        &[
            (keys::METALLB_SHARING_KEY, "k"),
            (keys::SVC_PRIMARY, "default/other"),
        ],
    );
    let dhcp = mk_svc(
        "d",
        1,
        &[("TCP", 2)],
        &[(keys::SVC_SHARING_KEY, "k"), (keys::SVC_IPAM, "dhcp")],
    );
    let mut dual = mk_member("dual", 2, &[("TCP", 3)]);
    dual.spec.as_mut().expect("spec").ip_family_policy = Some("RequireDualStack".into());
    let used = mk_member("used", 3, &[("TCP", 4)]);
    let mut candidates = mk_candidates(&[&primary_too, &dhcp, &dual, &used]);
    candidates[3].secondaries = vec!["default/s".into()];
    let key = SharingKey {
        value: "k".into(),
        annotation: keys::METALLB_SHARING_KEY,
    };
    let d = decide(&key, &candidates, None);
    assert!(d.members.is_empty());
    assert_eq!(
        refusal(&d, "p"),
        "service default/p: annotations cloudprovider.harvesterhci.io/primary-service and metallb.io/allow-shared-ip are both set: a service shares an address either with a primary service or by a sharing key, not both"
    );
    assert!(refusal(&d, "d").starts_with(
        "service default/d cannot share an address by sharing key \"k\": its IPAM mode is dhcp"
    ));
    assert_eq!(
        refusal(&d, "dual"),
        "service default/dual cannot share an address by sharing key \"k\": ipFamilyPolicy is RequireDualStack, and a sharing group has one address"
    );
    assert_eq!(
        refusal(&d, "used"),
        "service default/used cannot share an address by sharing key \"k\": it is the primary service of [default/s], which share its own load balancer's address"
    );
}

#[test]
fn members_must_agree_on_network_address_and_family() {
    let a = mk_svc(
        "a",
        0,
        &[("TCP", 80)],
        &[
            (keys::SVC_SHARING_KEY, "k"),
            (keys::SVC_NETWORK, "default/vlan1"),
        ],
    );
    let b = mk_svc(
        "b",
        1,
        &[("TCP", 81)],
        &[
            (keys::SVC_SHARING_KEY, "k"),
            (keys::SVC_NETWORK, "default/vlan2"),
        ],
    );
    let candidates = mk_candidates(&[&a, &b]);
    let d = decide(&mk_key(), &candidates, None);
    assert_eq!(
        refusal(&d, "b"),
        "service default/b cannot share the address of sharing key \"k\": its network is \"default/vlan2\", and service default/a's is \"default/vlan1\""
    );
    // Against the group's LoadBalancer, whose network is fixed.
    let mut lb = mk_lb(None, &[]);
    lb.network = "default/vlan2".into();
    let d = decide(&mk_key(), &candidates, Some(&lb));
    assert_eq!(
        refusal(&d, "a"),
        "network annotation of service default/a is not same as the load balancer gc-test/gc1-default-shared-k-12345678, service: 'default/vlan1', lb: 'default/vlan2'"
    );
    assert_eq!(d.member_keys(), ["default/b"]);

    let asking = |name: &str, created: i64, ip: &str| {
        let mut s = mk_member(name, created, &[("TCP", 80 + created as i32)]);
        s.spec.as_mut().expect("spec").load_balancer_ip = Some(ip.into());
        s
    };
    let a = asking("a", 0, "10.0.0.5");
    let b = asking("b", 1, "10.0.0.9");
    let c = mk_member("c", 2, &[("TCP", 90)]);
    let candidates = mk_candidates(&[&a, &b, &c]);
    let d = decide(&mk_key(), &candidates, None);
    assert_eq!(
        refusal(&d, "b"),
        "service default/b cannot share the address of sharing key \"k\": its requested address is 10.0.0.9, and service default/a's is 10.0.0.5"
    );
    assert_eq!(d.member_keys(), ["default/a", "default/c"]);
    let terms = d.terms.expect("terms").terms;
    assert_eq!(terms.requested, "10.0.0.5".parse().ok());
    assert!(terms.authoritative);
    // The first member's spec.loadBalancerIP moves the group; a later member's request must be
    // the address the group holds.
    let lb = mk_lb(Some("10.0.0.7"), &[]);
    assert_eq!(
        decide(&mk_key(), &mk_candidates(&[&a, &c]), Some(&lb)).member_keys(),
        ["default/a", "default/c"]
    );
    let e = asking("e", 3, "10.0.0.9");
    let d = decide(&mk_key(), &mk_candidates(&[&c, &e]), Some(&lb));
    assert_eq!(
        refusal(&d, "e"),
        "service default/e cannot share the address of sharing key \"k\": it asks for 10.0.0.9, and the group's load balancer gc-test/gc1-default-shared-k-12345678 holds 10.0.0.7"
    );
    // The same request, first in line, moves the group instead.
    assert_eq!(
        decide(&mk_key(), &mk_candidates(&[&b, &c]), Some(&lb)).member_keys(),
        ["default/b", "default/c"]
    );
    let mut v6 = mk_member("v6", 5, &[("TCP", 99)]);
    v6.spec.as_mut().expect("spec").ip_families = Some(vec!["IPv6".into()]);
    let d = decide(&mk_key(), &mk_candidates(&[&c, &v6]), Some(&lb));
    assert_eq!(
        refusal(&d, "v6"),
        "service default/v6 cannot share the address of sharing key \"k\": it asks for an IPv6 address, and the group's load balancer gc-test/gc1-default-shared-k-12345678 holds 10.0.0.7"
    );
}

#[test]
fn members_under_local_traffic_policy_must_select_the_same_pods() {
    let local = |name: &str, created: i64, app: &str| {
        let mut s = mk_member(name, created, &[("TCP", 80 + created as i32)]);
        let spec = s.spec.as_mut().expect("spec");
        spec.external_traffic_policy = Some("Local".into());
        spec.selector = Some([("app".to_string(), app.to_string())].into());
        s
    };
    let a = local("a", 0, "dns");
    let b = local("b", 1, "dns");
    let c = local("c", 2, "web");
    let d = mk_member("d", 3, &[("TCP", 90)]);
    let d = decide(&mk_key(), &mk_candidates(&[&a, &b, &c, &d]), None);
    assert_eq!(d.member_keys(), ["default/a", "default/b"]);
    assert_eq!(
        refusal(&d, "c"),
        "service default/c cannot share the address of sharing key \"k\": its externalTrafficPolicy is Local, selector {app=web}, and service default/a's is Local, selector {app=dns}"
    );
    assert_eq!(
        refusal(&d, "d"),
        "service default/d cannot share the address of sharing key \"k\": its externalTrafficPolicy is Cluster, and service default/a's is Local, selector {app=dns}"
    );
}

#[test]
fn kube_vips_annotation_is_a_request_only_before_admission() {
    let mut a = mk_member("a", 0, &[("TCP", 80)]);
    a.metadata
        .annotations
        .get_or_insert_default()
        .insert(keys::KUBE_VIP_IPS.into(), "10.0.0.5".into());
    let lb = mk_lb(Some("10.0.0.7"), &[("a", "TCP", 80)]);
    let mut candidates = mk_candidates(&[&a]);
    let d = decide(&mk_key(), &candidates, Some(&lb));
    assert!(matches!(
        d.refused.get("default/a"),
        Some(GuestError::SharingAddressDisagrees { .. })
    ));
    candidates[0].admitted = true;
    let d = decide(&mk_key(), &candidates, Some(&lb));
    assert_eq!(d.member_keys(), ["default/a"]);
    assert_eq!(d.terms.expect("terms").terms.requested, None);
}

#[test]
fn admitted_members_come_before_older_newcomers() {
    let old = mk_member("old", 0, &[("TCP", 80)]);
    let admitted = mk_member("admitted", 5, &[("TCP", 80)]);
    let mut candidates = mk_candidates(&[&old, &admitted]);
    candidates[1].admitted = true;
    let d = decide(&mk_key(), &candidates, None);
    assert_eq!(d.member_keys(), ["default/admitted"]);
    assert!(refusal(&d, "old").ends_with("TCP/80 is held by service default/admitted"));
}

#[test]
fn group_load_balancers_are_told_by_their_record() {
    let ctx = GuestContext {
        cluster: "gc1".into(),
        identity: "guest-a".into(),
        lb_namespace: "gc-test".into(),
        management_network: Some("default/mgmt".into()),
    };
    let a = mk_svc(
        "a",
        0,
        &[("TCP", 80)],
        &[(keys::SVC_SHARING_KEY, "k"), (keys::SVC_PROJECT, "c-1/p-1")],
    );
    let candidates = mk_candidates(&[&a]);
    let d = decide(&mk_key(), &candidates, None);
    let plan = plan(&ctx, &mk_key(), &d, &a).expect("a plan");
    assert_eq!(
        plan.name,
        crate::naming::shared_load_balancer_name("gc1", "default", "k")
    );
    assert_eq!(plan.annotations[keys::ANNOTATION_SHARING_GROUP], "k");
    assert_eq!(plan.annotations[keys::ANNOTATION_PROJECT], "c-1/p-1");
    assert!(!plan.annotations.contains_key(keys::ANNOTATION_SERVICE_UID));
    assert!(!plan.labels.contains_key(keys::LABEL_SERVICE_NAME));
    assert_eq!(plan.labels[keys::LABEL_SERVICE_NAMESPACE], "default");
    let lb = crate::decide::new_lb(&plan);
    assert_eq!(group_of(&ctx, &lb), Some(("default".into(), "k".into())));
    assert_eq!(GroupLb::of(&lb).holders.len(), 1);
    assert_eq!(
        GroupLb::of(&lb).holders.get(&("TCP".to_string(), 80)),
        Some(&"a".to_string())
    );
    let other = GuestContext {
        identity: "guest-b".into(),
        ..ctx.clone()
    };
    assert_eq!(group_of(&other, &lb), None, "another guest cluster's");
}
