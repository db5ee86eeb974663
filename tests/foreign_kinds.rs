//! The kinds we read and do not own, as their upstreams define them: the control planes carry
//! KubeVirt's and Multus's own CRDs (not schemaless stand-ins), so the real API server prunes a
//! field KubeVirt does not have and refuses what KubeVirt's schema refuses; the embedded store's
//! VMI API does the same where load balancers read; and the product reads its backend addresses
//! from VMIs built from KubeVirt's Go types (`support::foreign`).

#[macro_use]
mod support;

use axum::http::{Method, StatusCode};
use harvester_cloud::{crd::kinds::VirtualMachineInstance, lb::vm::endpoints};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api,
    api::{DynamicObject, PostParams},
};
use serde_json::{Value, json};
use support::{Backend, EmbeddedBackend, control_plane::ControlPlane, kube_env};

const VMIS: &str = "/v1/harvester/kubevirt.io.virtualmachineinstances";

/// A running VMI, from KubeVirt's Go types: an IPv6-first pod interface (KubeVirt's `ipAddress`
/// is the first of `ipAddresses`), then a Multus one with an IPv4 address.
fn dual_stack_vmi(name: &str) -> Value {
    support::foreign::vmi(name)
        .label("app", "web")
        .pod_network(&["fd00:10:244::5", "10.244.0.5"], Some("eth0"))
        .multus("nic-1", "default/vlan10", &["192.0.2.7"], Some("enp2s0"))
        .build()
}

/// `vmi` with a field KubeVirt's interface status does not have, as a hand-written fixture had it.
fn with_foreign_field(mut vmi: Value) -> Value {
    vmi["status"]["interfaces"][0]["ip"] = json!("10.244.0.99");
    vmi
}

fn vmi_api(cp: &ControlPlane) -> Api<DynamicObject> {
    Api::namespaced_with(
        cp.admin.clone(),
        "default",
        &kube_env::api_resource(
            "kubevirt.io/v1",
            "VirtualMachineInstance",
            "virtualmachineinstances",
        ),
    )
}

fn typed(v: Value) -> VirtualMachineInstance {
    serde_json::from_value(v).expect("a VMI")
}

/// The address the load balancer takes from `vmi`: KubeVirt's first IPv4 `ipAddress`, which is
/// the Multus interface's here (the pod interface's primary address is IPv6).
fn assert_backend_address(vmi: &VirtualMachineInstance) {
    assert_eq!(
        endpoints::address(vmi),
        Some("192.0.2.7".parse().expect("an address"))
    );
}

#[tokio::test]
async fn kube_control_planes_carry_upstreams_crds() {
    let cp = ControlPlane::lease().await;
    let crds: Api<CustomResourceDefinition> = Api::all(cp.admin.clone());
    for (name, status_subresource) in [
        ("virtualmachines.kubevirt.io", true),
        // KubeVirt writes a VMI's status with the object.
        ("virtualmachineinstances.kubevirt.io", false),
        ("virtualmachineinstancemigrations.kubevirt.io", true),
        ("network-attachment-definitions.k8s.cni.cncf.io", false),
    ] {
        let crd = crds.get(name).await.expect("installed");
        let v1 = crd
            .spec
            .versions
            .iter()
            .find(|v| v.name == "v1")
            .expect("a v1 version");
        let schema = v1
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("a schema");
        assert_ne!(
            schema.x_kubernetes_preserve_unknown_fields,
            Some(true),
            "{name}: not a schemaless stand-in"
        );
        assert!(
            schema
                .properties
                .as_ref()
                .is_some_and(|p| p.contains_key("spec")),
            "{name}: spec described"
        );
        assert_eq!(
            v1.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some(),
            status_subresource,
            "{name}: status subresource"
        );
    }
}

#[tokio::test]
async fn kube_prunes_and_refuses_as_kubevirt_does() {
    let cp = ControlPlane::lease().await;
    let api = vmi_api(&cp);
    let sent = with_foreign_field(dual_stack_vmi("web-1"));
    let created = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(sent).expect("an object"),
        )
        .await
        .expect("creates the VMI");
    let stored = serde_json::to_value(&created).expect("JSON");
    let pod = &stored["status"]["interfaces"][0];
    assert_eq!(pod["ip"], Value::Null, "pruned: {pod}");
    assert_eq!(pod["ipAddress"], "fd00:10:244::5");
    assert_eq!(pod["ipAddresses"], json!(["fd00:10:244::5", "10.244.0.5"]));
    assert_eq!(
        stored["spec"]["networks"][1]["multus"]["networkName"],
        "default/vlan10"
    );
    assert_backend_address(&typed(stored));

    // KubeVirt's schema refuses a wrong type and a VMI without a domain.
    let mut wrong = dual_stack_vmi("web-2");
    wrong["status"]["interfaces"][0]["ipAddresses"] = json!("10.244.0.5");
    let mut no_domain = dual_stack_vmi("web-3");
    no_domain["spec"]
        .as_object_mut()
        .expect("a spec")
        .remove("domain");
    for bad in [wrong, no_domain] {
        let obj: DynamicObject = serde_json::from_value(bad.clone()).expect("an object");
        match api.create(&PostParams::default(), &obj).await {
            Err(kube::Error::Api(s)) => assert_eq!(s.code, 422, "{bad}: {s:?}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn embedded_prunes_and_refuses_as_kubevirt_does() {
    let b = EmbeddedBackend::start().await;
    let sent = with_foreign_field(dual_stack_vmi("web-1"));
    b.admin(Method::POST, VMIS, Some(sent))
        .await
        .expect(StatusCode::CREATED);
    let stored = b
        .admin(Method::GET, &format!("{VMIS}/default/web-1"), None)
        .await
        .expect(StatusCode::OK);
    let pod = &stored["status"]["interfaces"][0];
    assert_eq!(pod["ip"], Value::Null, "pruned: {pod}");
    assert_eq!(pod["ipAddress"], "fd00:10:244::5");
    assert_backend_address(&typed(stored));

    let mut wrong = dual_stack_vmi("web-2");
    wrong["status"]["interfaces"][0]["ipAddresses"] = json!("10.244.0.5");
    let mut no_domain = dual_stack_vmi("web-3");
    no_domain["spec"]
        .as_object_mut()
        .expect("a spec")
        .remove("domain");
    for bad in [wrong, no_domain] {
        let r = b.admin(Method::POST, VMIS, Some(bad.clone())).await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{bad}: {}",
            r.text()
        );
    }
}

/// Rancher's kinds as the Rancher that Harvester pins installs them (tools/rancher-crds):
/// GlobalRoleBinding and APIService with their schemas and a status subresource; Token and the
/// `cluster.cattle.io` kinds as norman's catch-all, schemaless and without one.
#[tokio::test]
async fn kube_control_planes_carry_ranchers_crds() {
    let cp = ControlPlane::lease().await;
    let crds: Api<CustomResourceDefinition> = Api::all(cp.admin.clone());
    for (name, scope, fields, status_subresource) in [
        (
            "globalrolebindings.management.cattle.io",
            "Cluster",
            &["globalRoleName", "userName", "groupPrincipalName"][..],
            true,
        ),
        (
            "apiservices.management.cattle.io",
            "Cluster",
            &["spec", "status"][..],
            true,
        ),
        ("tokens.management.cattle.io", "Cluster", &[][..], false),
        (
            "clusterauthtokens.cluster.cattle.io",
            "Namespaced",
            &[][..],
            false,
        ),
        (
            "clusteruserattributes.cluster.cattle.io",
            "Namespaced",
            &[][..],
            false,
        ),
    ] {
        let crd = crds.get(name).await.expect("installed");
        assert_eq!(crd.spec.scope, scope, "{name}: scope");
        let v3 = crd
            .spec
            .versions
            .iter()
            .find(|v| v.name == "v3")
            .expect("a v3 version");
        let schema = v3
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("a schema");
        let properties = schema.properties.clone().unwrap_or_default();
        for field in fields {
            assert!(properties.contains_key(*field), "{name}: {field} described");
        }
        assert_eq!(
            schema.x_kubernetes_preserve_unknown_fields == Some(true),
            fields.is_empty(),
            "{name}: schemaless exactly when Rancher's is"
        );
        assert_eq!(
            v3.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some(),
            status_subresource,
            "{name}: status subresource"
        );
    }
}

/// A Rancher fixture with a field Rancher's Go type lacks (here `userID`: the type's is `userId`,
/// and Go's JSON decoding alone would take either) never reaches a test's API server.
#[test]
#[should_panic(expected = "unknown field \"userID\"")]
fn a_made_up_rancher_field_is_refused() {
    support::foreign::rancher(json!({
        "apiVersion": "management.cattle.io/v3", "kind": "Token",
        "metadata": {"name": "token-x"}, "userID": "u-1", "token": "t",
    }));
}

#[test]
fn a_rancher_fixture_comes_back_as_ranchers_type_encodes_it() {
    let token = support::foreign::rancher(json!({
        "apiVersion": "management.cattle.io/v3", "kind": "Token",
        "metadata": {"name": "token-x"}, "userId": "u-1", "token": "t", "ttl": 0,
    }));
    // Fields Rancher always writes (no omitempty), and `enabled` left out (a nil pointer: norman's
    // default, true).
    assert_eq!(token["expired"], json!(false));
    assert_eq!(token["authProvider"], json!(""));
    assert_eq!(token["enabled"], Value::Null);
}
