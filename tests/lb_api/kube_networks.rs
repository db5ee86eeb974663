use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vlan_id_must_read() {
    let b = KubeBackend::start().await;
    let probe = support::Refusals::refusal_probes(&b);
    let nads = Api::<NetworkAttachmentDefinition>::new(b.store());
    for (name, vlan_label, config) in [
        ("label-ten", Some("ten"), "{}"),
        ("label-zeros", Some("007"), "{}"),
        ("config-12", None, r#"{"type":"bridge","vlan":12}"#),
        ("config-text", None, "not json"),
        ("config-string", None, r#"{"vlan":"5"}"#),
    ] {
        let mut nad = support::foreign::nad(name).config(config);
        if let Some(vlan) = vlan_label {
            nad = nad.label("network.harvesterhci.io/vlan-id", vlan);
        }
        let nad: NetworkAttachmentDefinition = serde_json::from_value(nad.build()).expect("nad");
        nads.create(&nad).await.expect("creates");
    }
    let on = |pool: &str, network: &str, subnet: &str| {
        mk_pool(
            pool,
            range(subnet, "", ""),
            json!({"network": format!("default/{network}"), "scope": [{"project": "*", "namespace": pool, "guestCluster": "*"}]}),
        )
    };
    // pkg/utils/vid.go (GetVid): the label through strconv.Atoi, else the config's vlan.
    for (pool, network, subnet, vid) in [
        ("a", "label-zeros", "10.82.1.0/24", "7"),
        ("b", "config-12", "10.82.2.0/24", "12"),
    ] {
        let made = create_pool(&b, on(pool, network, subnet)).await;
        assert_eq!(
            made["metadata"]["labels"]["loadbalancer.harvesterhci.io/vid"],
            vid
        );
    }
    let refuse = async |body: Value| {
        call(&b, Method::POST, POOLS, Some(body))
            .await
            .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent")
    };
    assert_eq!(
        refuse(on("c", "label-ten", "10.82.3.0/24")).await,
        "can't create IP pool c because invalid vlan ten"
    );
    for network in ["config-text", "config-string"] {
        let m = refuse(on("c", network, "10.82.3.0/24")).await;
        assert!(
            m.starts_with(&format!(
                "can't create IP pool c because the config of network-attachment-definition default/{network} does not decode: "
            )),
            "{m}"
        );
    }
    // An update is judged the same way.
    let m = update_pool(&b, "a", |a| {
        a["spec"]["selector"]["network"] = json!("default/label-ten")
    })
    .await
    .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
    assert_eq!(m, "can't update IP pool a because invalid vlan ten");
    for p in probe {
        p.assert_none_refused();
    }
}
