//! A Harvester-like cluster on a real control plane: the namespaces the suites use, Harvester's two
//! ClusterRoles, the `vip` ConfigMap, the CRDs a Harvester cluster has (Rancher's tokens and
//! global role bindings, our LoadBalancer and IPPool, KubeVirt's and Multus's kinds as their
//! upstreams generate them), the chart's own ServiceAccount and RBAC for the service, and helpers
//! to make Rancher tokens.
//!
//! [`seed`] applies all of it with server-side apply, so it is idempotent: every lease of a control
//! plane applies it again, restoring what a previous test changed.

use harvester_cloud::auth::{ApiToken, hash};
use k8s_openapi::{
    api::{
        core::v1::{ConfigMap, ServiceAccount},
        rbac::v1::ClusterRole,
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams},
    runtime::wait::{await_condition, conditions},
};
use serde_json::{Value, json};

use super::control_plane::ControlPlane;

/// Every namespace a suite uses.
pub const NAMESPACES: &[&str] = &[
    "default",
    "gc-test",
    "a",
    "a-b",
    "guest-cluster-namespace-with-a-rather-long-name",
    "harvester-system",
    "ns1",
    "ns2",
    "cattle-system",
];

/// The service's own identity on the control plane: the chart's ServiceAccount.
pub const SERVICE_NAMESPACE: &str = "harvester-system";
pub const SERVICE_ACCOUNT: &str = "harvester-cloud";
pub const SERVICE_USER: &str = "system:serviceaccount:harvester-system:harvester-cloud";

const MANAGER: &str = "harvester-cloud-tests";

fn apply_params() -> PatchParams {
    PatchParams::apply(MANAGER).force()
}

pub fn api_resource(api_version: &str, kind: &str, plural: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Applies `obj` (server-side apply, forced: the seed owns what it says).
pub async fn apply(client: &Client, obj: &Value, plural: &str) {
    let api_version = obj["apiVersion"].as_str().expect("apiVersion");
    let kind = obj["kind"].as_str().expect("kind");
    let name = obj["metadata"]["name"].as_str().expect("a name");
    let ar = api_resource(api_version, kind, plural);
    let api: Api<DynamicObject> = match obj["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    api.patch(name, &apply_params(), &Patch::Apply(obj))
        .await
        .unwrap_or_else(|e| panic!("applies {kind} {name}: {e}"));
}

/// The store suite's own example kind (`example.harvesterhci.io` Widget, which nobody else
/// defines): schemaless, with a status subresource.
fn widget_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.harvesterhci.io"},
        "spec": {
            "group": "example.harvesterhci.io",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                "subresources": {"status": {}}
            }]
        }
    })
}

/// Every CRD of the seed: the store suite's Widget, ours (as `deploy/crds` ships them), and the
/// foreign kinds as their upstreams make them (the control plane's `foreign/`, see
/// [`super::foreign`]): KubeVirt's, Multus's, and Rancher's GlobalRoleBinding, APIService, Token,
/// ClusterAuthToken and ClusterUserAttribute (tools/rancher-crds), so the real server prunes and
/// refuses what they would.
fn crds(cp: &ControlPlane) -> Vec<Value> {
    let mut all = vec![widget_crd()];
    all.extend(harvester_cloud::crd::crds().iter().map(crd_value));
    all.extend(super::foreign::crds(&cp.dir.join("foreign")));
    all
}

/// One of the project's CRDs as the object applied to the API server.
fn crd_value(crd: &CustomResourceDefinition) -> Value {
    let mut v = serde_json::to_value(crd).expect("JSON");
    v["apiVersion"] = json!("apiextensions.k8s.io/v1");
    v["kind"] = json!("CustomResourceDefinition");
    v
}

/// The chart's ServiceAccount and RBAC objects, from the rendered manifest.
fn chart_rbac() -> Vec<(Value, &'static str)> {
    manifest_objects("harvester-cloud.yaml", &[])
}

/// The ServiceAccount and RBAC objects (and those of `extra_kinds`, with their plurals) of a
/// rendered manifest under `deploy/manifests/`.
fn manifest_objects(
    file: &str,
    extra_kinds: &[(&str, &'static str)],
) -> Vec<(Value, &'static str)> {
    let path = format!("{}/deploy/manifests/{file}", env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(&path).expect("reads the manifest");
    let mut out = Vec::new();
    for doc in yaml_serde::Deserializer::from_str(&manifest) {
        let v: Value = serde::Deserialize::deserialize(doc).expect("a Kubernetes object");
        let kind = v["kind"].as_str().unwrap_or_default();
        let plural = match kind {
            "ServiceAccount" => "serviceaccounts",
            "ClusterRole" => "clusterroles",
            "ClusterRoleBinding" => "clusterrolebindings",
            "Role" => "roles",
            "RoleBinding" => "rolebindings",
            _ => match extra_kinds.iter().find(|(k, _)| *k == kind) {
                Some((_, plural)) => plural,
                None => continue,
            },
        };
        out.push((v, plural));
    }
    assert_eq!(
        out.len(),
        5 + extra_kinds.len(),
        "the ServiceAccount and RBAC objects of {file} (and {extra_kinds:?})"
    );
    out
}

/// What the chart installs where Rancher runs (`rancherApiService.enabled`): its RBAC, which lets
/// the service keep the APIService, and the APIService itself.
pub async fn rancher_chart(cp: &ControlPlane) {
    for (obj, plural) in manifest_objects(
        "harvester-cloud-rancher.yaml",
        &[("APIService", "apiservices")],
    ) {
        apply(&cp.admin, &obj, plural).await;
    }
}

/// Everything a Harvester cluster has that the service relies on.
pub async fn seed(cp: &ControlPlane) {
    let client = &cp.admin;
    for ns in NAMESPACES {
        let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        apply(client, &obj, "namespaces").await;
    }
    // Harvester's own roles, with the rules its chart ships.
    for (name, rules) in [
        (
            "harvesterhci.io:cloudprovider",
            harvester_cloud::kubeconfig::seed::cloudprovider_rules(),
        ),
        (
            "harvesterhci.io:csi-driver",
            harvester_cloud::kubeconfig::seed::csi_driver_rules(),
        ),
    ] {
        let role = ClusterRole {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            rules: Some(rules),
            ..Default::default()
        };
        let v = serde_json::to_value(&role).expect("JSON");
        apply(client, &v, "clusterroles").await;
    }
    set_vip(client, super::VIP).await;
    let crd_api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds(cp) {
        let name = crd["metadata"]["name"].as_str().expect("named").to_string();
        let digest = &crd["metadata"]["annotations"][super::foreign::DIGEST];
        let installed = match digest {
            Value::String(want) => crd_api
                .get_opt(&name)
                .await
                .unwrap_or_else(|e| panic!("reads {name}: {e}"))
                .and_then(|c| c.metadata.annotations?.remove(super::foreign::DIGEST))
                .is_some_and(|have| &have == want),
            _ => false,
        };
        if !installed {
            apply(client, &crd, "customresourcedefinitions").await;
        }
        tokio::time::timeout(
            super::PATIENCE,
            await_condition(crd_api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .unwrap_or_else(|_| panic!("{name} established in time"))
        .expect("established");
    }
    for (obj, plural) in chart_rbac() {
        apply(client, &obj, plural).await;
    }
    bind_global_role(client, "user-admin", "admin").await;
}

/// Waits until the controller manager has made what it makes in every seeded namespace (its
/// `default` ServiceAccount, the `kube-root-ca.crt` ConfigMap), so a baseline taken after holds it.
pub async fn wait_for_controllers(cp: &ControlPlane) {
    for ns in NAMESPACES {
        let sas: Api<ServiceAccount> = Api::namespaced(cp.admin.clone(), ns);
        let cms: Api<ConfigMap> = Api::namespaced(cp.admin.clone(), ns);
        super::eventually(&format!("the controllers' objects in {ns}"), async || {
            let sa = sas.get_opt("default").await.ok().flatten();
            let cm = cms.get_opt("kube-root-ca.crt").await.ok().flatten();
            (sa.is_some() && cm.is_some()).then_some(())
        })
        .await;
    }
}

/// Sets the VIP in Harvester's `vip` ConfigMap.
pub async fn set_vip(client: &Client, vip: &str) {
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "vip", "namespace": "harvester-system"},
        "data": {"ip": vip}
    });
    apply(client, &cm, "configmaps").await;
}

/// A kubeconfig for the service as the chart runs it: its ServiceAccount's token, nothing more.
pub async fn service_kubeconfig(cp: &ControlPlane) -> String {
    let token = cp
        .service_account_token(SERVICE_NAMESPACE, SERVICE_ACCOUNT)
        .await;
    cp.kubeconfig_for_token(&token, SERVICE_NAMESPACE)
}

fn rancher(kind: &str, plural: &str) -> ApiResource {
    api_resource("management.cattle.io/v3", kind, plural)
}

async fn create(api: &Api<DynamicObject>, obj: Value) {
    let obj: DynamicObject = serde_json::from_value(obj).expect("an object");
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("cannot create {obj:?}: {e}"),
    }
}

/// How a Rancher token is stored.
#[derive(Clone, Debug, Default)]
pub struct TokenOpts {
    /// Store the secret in clear (older Rancher) instead of hashed.
    pub plain: bool,
    pub enabled: Option<bool>,
    pub expired: Option<bool>,
    pub expires_at: Option<String>,
}

/// Creates a Rancher API token for `user` and returns it as a client sends it.
pub async fn rancher_token(client: &Client, user: &str, opts: TokenOpts) -> String {
    let token = ApiToken::generate();
    let mut obj = json!({
        "apiVersion": "management.cattle.io/v3",
        "kind": "Token",
        "metadata": {
            "name": token.name,
            "labels": {"authn.management.cattle.io/token-userId": user},
            "annotations": {},
        },
        "userId": user,
        "authProvider": "local",
        "ttl": 0,
        "token": if opts.plain { token.secret.clone() } else { hash::hash_secret(&token.secret) },
    });
    if !opts.plain {
        obj["metadata"]["annotations"]["authn.management.cattle.io/token-hashed"] =
            Value::from("true");
    }
    if let Some(e) = opts.enabled {
        obj["enabled"] = Value::from(e);
    }
    if let Some(e) = opts.expired {
        obj["expired"] = Value::from(e);
    }
    if let Some(at) = opts.expires_at {
        obj["expiresAt"] = Value::from(at);
    }
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &rancher("Token", "tokens"));
    create(&api, super::foreign::rancher(obj)).await;
    token.expose()
}

/// Binds `user` to Rancher's global role `role` (`admin`, `restricted-admin`, `user`).
pub async fn bind_global_role(client: &Client, user: &str, role: &str) {
    let obj = json!({
        "apiVersion": "management.cattle.io/v3",
        "kind": "GlobalRoleBinding",
        "metadata": {"name": format!("grb-{user}-{role}")},
        "globalRoleName": role,
        "userName": user,
    });
    let api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &rancher("GlobalRoleBinding", "globalrolebindings"),
    );
    create(&api, super::foreign::rancher(obj)).await;
}

/// Applies the shipped IPPool and LoadBalancer CRDs with or without a status subresource (Harvester
/// installs them without; the project's earlier CRDs had one) and waits until discovery serves that
/// shape. The next lease's seed restores the shipped ones.
pub async fn install_lb_crds(client: &Client, status_subresource: bool) {
    use harvester_cloud::store::kubernetes::{KubeStore, StatusShape};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceSubresourceStatus, CustomResourceSubresources,
    };
    let mut crds = harvester_cloud::crd::crds();
    for v in crds.iter_mut().flat_map(|c| c.spec.versions.iter_mut()) {
        v.subresources = Some(CustomResourceSubresources {
            status: status_subresource.then(|| CustomResourceSubresourceStatus(json!({}))),
            ..Default::default()
        });
    }
    for crd in &crds {
        apply(client, &crd_value(crd), "customresourcedefinitions").await;
    }
    let want = if status_subresource {
        StatusShape::Subresource
    } else {
        StatusShape::Field
    };
    for kind in [
        harvester_cloud::crd::pool_kind(),
        harvester_cloud::crd::lb_kind(),
    ] {
        super::eventually(
            &format!("{} served with {want:?}", kind.plural),
            async || {
                let shape = KubeStore::new(client.clone()).require(&kind).await.ok()?;
                (shape == want).then_some(())
            },
        )
        .await;
    }
}
