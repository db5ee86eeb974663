//! Guest clusters' Services of type LoadBalancer, end to end, with Harvester's load balancer
//! reconciler running (it allocates the addresses). The `cases` run on two environments through
//! [`GuestEnv`]:
//!
//! - embedded: guest Services over the HTTP API (`/v1/harvester/guestclusters/...`), the guest
//!   reconcilers running on the embedded store as `serve` runs them;
//! - kube: two real control planes, a guest cluster and a Harvester cluster; the `ccm` command's
//!   code path runs with a cloud-config kubeconfig issued by the cloud-config API (POST
//!   /v1/harvester/kubeconfig against the Harvester cluster), so it has exactly the rights of
//!   Harvester's `harvesterhci.io:cloudprovider` role, and in the guest cluster it runs as the
//!   ServiceAccount of `deploy/ccm/harvester-cloud-ccm.yaml` with exactly that manifest's RBAC (the
//!   guest's audit log must show no refusal of it). Two guest clusters sharing a name and a
//!   Harvester namespace take three control planes (`kube_only`).
//!
//! Where the two differ by design the cases say so: the HTTP API refuses synchronously what the
//! reconciler would refuse, where a Kubernetes user learns it from an Event; and the kube
//! environment here registers no webhooks with the Harvester cluster, so findNetwork's VMI lookup
//! is checked on the embedded store here, and on Kubernetes by `tests/kube_webhooks.rs` (the API
//! server calling the service's webhooks).

#[macro_use]
mod support;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use ::kube::api::{DeleteParams, PostParams};
use axum::{
    body::Body,
    http::{Method, StatusCode},
};
use clap::Parser;
use harvester_cloud::{
    config::{Cli, Command},
    controller::leader::AlwaysLeader,
    crd::kinds::{NetworkAttachmentDefinition, VirtualMachine, VirtualMachineInstance},
    guest::{
        self,
        clusters::{ClusterKey, ClusterStore},
        naming::load_balancer_name,
        reconcile,
    },
    lb,
    store::{Api, LabelSelector, ObjectStore, Preconditions},
};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Service};
use serde_json::{Value, json};
use support::{Backend, EmbeddedBackend, KubeBackend, Reply, eventually};
use tokio_util::sync::CancellationToken;

const POOLS: &str = "/v1/harvester/loadbalancer.harvesterhci.io.ippools";
const LBS: &str = "/v1/harvester/loadbalancer.harvesterhci.io.loadbalancers";
/// The Harvester namespace of the guest cluster's cloud-config, and the guest cluster.
const NS: &str = "gc-test";
const CLUSTER: &str = "gc1";
/// The user the ccm of `deploy/ccm` runs as in the guest cluster.
const CCM_USER: &str = "system:serviceaccount:kube-system:harvester-cloud-ccm";

fn init_logging() {
    // `TEST_LOG=harvester_cloud=debug` shows what the reconcilers do.
    let filter = std::env::var("TEST_LOG").unwrap_or_else(|_| "off".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
}

/// A background task stopped by its token (also when dropped).
struct Task {
    stop: CancellationToken,
    handle: Option<tokio::task::JoinHandle<()>>,
}

impl Task {
    fn spawn<F: Future<Output = ()> + Send + 'static>(
        f: impl FnOnce(CancellationToken) -> F,
    ) -> Self {
        let stop = CancellationToken::new();
        let handle = tokio::spawn(f(stop.clone()));
        Task {
            stop,
            handle: Some(handle),
        }
    }

    async fn stop(mut self) {
        self.stop.cancel();
        if let Some(h) = self.handle.take() {
            h.await.expect("stops cleanly");
        }
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Harvester's load balancer reconcilers on a store.
fn lb_reconcilers(store: Arc<dyn ObjectStore>) -> Task {
    Task::spawn(|stop| {
        lb::run(
            store,
            lb::Settings {
                concurrency: 64,
                identity: "test".into(),
                ..lb::Settings::default()
            },
            Arc::new(AlwaysLeader),
            stop,
        )
    })
}

/// A guest cluster and the Harvester it gets its load balancers from.
trait GuestEnv {
    type Harvester: Backend;
    fn harvester(&self) -> &Self::Harvester;
    /// Creates or replaces a Service; `Err(message)` when the API refused it there and then.
    async fn put(&self, svc: Value) -> Result<Value, String>;
    async fn get(&self, ns: &str, name: &str) -> Option<Value>;
    async fn delete(&self, ns: &str, name: &str);
    /// `(reason, message)` of the Events about a Service.
    async fn events(&self, ns: &str, name: &str) -> Vec<(String, String)>;
    async fn set_nad_mapping(&self, mapping: &str);
    /// The guest's NAD mapping ConfigMap, if it exists.
    async fn nad_mapping(&self) -> Option<ConfigMap>;
    async fn delete_nad_mapping(&self);
    /// Deletes a Service behind the reconciler's back (its finalizer stripped), as a crash or a
    /// forced deletion would.
    async fn force_delete(&self, ns: &str, name: &str);
    /// Deletes the whole guest cluster the way this environment does.
    async fn delete_cluster(&mut self);
    /// Whether Harvester's LoadBalancer webhook (findNetwork) sees the guest's LoadBalancers.
    fn harvester_admission(&self) -> bool;
    /// The guest cluster's identity, as its LoadBalancers record it.
    async fn identity(&self) -> String;
}

// --- Embedded: guest Services over HTTP ------------------------------------------------------------

struct EmbeddedEnv {
    b: EmbeddedBackend,
    _lb: Task,
    _guests: Task,
}

fn services_path(ns: &str, name: &str) -> String {
    format!("/v1/harvester/guestclusters/{NS}/{CLUSTER}/services/{ns}/{name}")
}

impl EmbeddedEnv {
    async fn start() -> Self {
        init_logging();
        let b = EmbeddedBackend::start().await;
        let lb = lb_reconcilers(b.service_store());
        let guests = b
            .app
            .service
            .state
            .guests
            .clone()
            .expect("embedded keeps guest clusters");
        let guests = Task::spawn(|stop| {
            guest::clusters::run(
                guests.store().clone(),
                guests.harvester().clone(),
                reconcile::Settings {
                    concurrency: 64,
                    identity: "test".into(),
                    prune_events: true,
                },
                stop,
            )
        });
        EmbeddedEnv {
            b,
            _lb: lb,
            _guests: guests,
        }
    }

    fn cluster_store(&self) -> Arc<dyn ObjectStore> {
        Arc::new(ClusterStore::new(
            self.b.store(),
            ClusterKey::new(NS, CLUSTER).expect("valid"),
        ))
    }
}

impl support::Refusals for EmbeddedEnv {}

impl GuestEnv for EmbeddedEnv {
    type Harvester = EmbeddedBackend;

    fn harvester(&self) -> &EmbeddedBackend {
        &self.b
    }

    async fn put(&self, svc: Value) -> Result<Value, String> {
        let (ns, name) = (
            svc["metadata"]["namespace"]
                .as_str()
                .expect("namespace")
                .to_string(),
            svc["metadata"]["name"].as_str().expect("name").to_string(),
        );
        let r = call(&self.b, Method::PUT, &services_path(&ns, &name), Some(svc)).await;
        match r.status {
            StatusCode::OK | StatusCode::CREATED => Ok(r.json()),
            _ => Err(r.error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent")),
        }
    }

    async fn get(&self, ns: &str, name: &str) -> Option<Value> {
        let r = call(&self.b, Method::GET, &services_path(ns, name), None).await;
        match r.status {
            StatusCode::OK => Some(r.json()),
            StatusCode::NOT_FOUND => None,
            other => panic!("GET service: {other}: {}", r.text()),
        }
    }

    async fn delete(&self, ns: &str, name: &str) {
        let r = call(&self.b, Method::DELETE, &services_path(ns, name), None).await;
        assert!(
            [StatusCode::OK, StatusCode::ACCEPTED].contains(&r.status),
            "{}",
            r.text()
        );
    }

    async fn events(&self, ns: &str, name: &str) -> Vec<(String, String)> {
        event_pairs(
            Api::<Event>::new(self.cluster_store())
                .list(Some(ns), &LabelSelector::everything())
                .await
                .expect("lists events"),
            name,
        )
    }

    async fn set_nad_mapping(&self, mapping: &str) {
        let api = Api::<ConfigMap>::new(self.cluster_store());
        api.create(&nad_mapping(mapping)).await.expect("creates");
    }

    async fn nad_mapping(&self) -> Option<ConfigMap> {
        Api::<ConfigMap>::new(self.cluster_store())
            .get("kube-system", "harvester-nad-mapping")
            .await
            .expect("reads")
    }

    async fn delete_nad_mapping(&self) {
        Api::<ConfigMap>::new(self.cluster_store())
            .delete(
                "kube-system",
                "harvester-nad-mapping",
                &Preconditions::default(),
            )
            .await
            .expect("deletes");
    }

    async fn force_delete(&self, ns: &str, name: &str) {
        // Deleted first, then its finalizer stripped (a terminating object takes no new one, so
        // the reconciler cannot put it back in between), until it is gone.
        let api = Api::<Service>::new(self.cluster_store());
        api.delete(ns, name, &Preconditions::default())
            .await
            .expect("deletes");
        eventually("the Service to be gone", async || {
            let Some(mut svc) = api.get(ns, name).await.expect("reads") else {
                return Some(());
            };
            svc.metadata.finalizers = None;
            let _ = api.replace(&svc).await;
            None
        })
        .await;
    }

    async fn delete_cluster(&mut self) {
        let r = call(
            &self.b,
            Method::DELETE,
            &format!("/v1/harvester/guestclusters/{NS}/{CLUSTER}"),
            None,
        )
        .await;
        let body = ok(r, StatusCode::OK);
        assert_eq!(body["cluster"], CLUSTER);
        assert_eq!(
            body["services"],
            json!(["default/one", "default/three", "default/two"])
        );
    }

    fn harvester_admission(&self) -> bool {
        true
    }

    /// The cluster's key names it alone on the embedded store.
    async fn identity(&self) -> String {
        ClusterKey::new(NS, CLUSTER).expect("valid").identity()
    }
}

// --- Kube: the ccm between two real control planes ---------------------------------------------------

struct KubeEnv {
    b: KubeBackend,
    _lb: Task,
    guest: Arc<support::control_plane::ControlPlane>,
    guest_client: ::kube::Client,
    ccm: Option<Task>,
    dir: tempfile::TempDir,
}

/// The `ccm` command line of a test.
fn ccm_args(dir: &std::path::Path) -> harvester_cloud::config::CcmArgs {
    let cli = Cli::try_parse_from([
        "harvester-cloud".to_string(),
        "ccm".into(),
        "--cloud-config".into(),
        dir.join("cloud-config").display().to_string(),
        "--cluster-name".into(),
        CLUSTER.into(),
        "--kubeconfig".into(),
        dir.join("guest.kubeconfig").display().to_string(),
        "--management-network".into(),
        "mgmt".into(),
        "--metrics-listen".into(),
        "127.0.0.1:0".into(),
    ])
    .expect("valid ccm arguments");
    match cli.command {
        Command::Ccm(args) => args,
        _ => unreachable!(),
    }
}

/// Applies the ServiceAccount and RBAC objects of `deploy/ccm/harvester-cloud-ccm.yaml` to a guest
/// cluster, exactly as written, and returns a kubeconfig of that ServiceAccount.
async fn ccm_guest_kubeconfig(guest: &support::control_plane::ControlPlane) -> String {
    let manifest = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/ccm/harvester-cloud-ccm.yaml"
    ))
    .expect("reads the ccm manifest");
    let rbac_kinds = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    let mut applied = 0;
    for doc in yaml_serde::Deserializer::from_str(&manifest) {
        let obj: ::kube::api::DynamicObject =
            serde::Deserialize::deserialize(doc).expect("a Kubernetes object");
        let types = obj.types.clone().expect("apiVersion and kind");
        if !rbac_kinds.contains(&types.kind.as_str()) {
            continue;
        }
        let (group, version) = types
            .api_version
            .split_once('/')
            .unwrap_or(("", types.api_version.as_str()));
        let gvk = ::kube::api::GroupVersionKind::gvk(group, version, &types.kind);
        let resource = ::kube::api::ApiResource::from_gvk(&gvk);
        let api: ::kube::Api<::kube::api::DynamicObject> = match &obj.metadata.namespace {
            Some(ns) => ::kube::Api::namespaced_with(guest.admin.clone(), ns, &resource),
            None => ::kube::Api::all_with(guest.admin.clone(), &resource),
        };
        api.create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("creates {} from the manifest: {e}", types.kind));
        applied += 1;
    }
    assert_eq!(applied, 5, "the manifest's ServiceAccount and RBAC objects");
    let token = guest
        .service_account_token("kube-system", "harvester-cloud-ccm")
        .await;
    guest.kubeconfig_for_token(&token, "kube-system")
}

impl KubeEnv {
    /// The ccm as `deploy/ccm/harvester-cloud-ccm.yaml` runs it in a guest cluster: as its
    /// ServiceAccount, with exactly the manifest's RBAC objects applied to the guest.
    async fn start() -> Self {
        let mut env = Self::without_ccm().await;
        let kubeconfig = ccm_guest_kubeconfig(&env.guest).await;
        std::fs::write(env.dir.path().join("guest.kubeconfig"), kubeconfig).expect("writes");
        env.start_ccm();
        env
    }

    /// Both clusters and the cloud-config, without a ccm yet (the guest kubeconfig is the
    /// guest's admin).
    async fn without_ccm() -> Self {
        // Two real control planes: the Harvester cluster, and the guest cluster.
        let (harvester, guest) = support::control_plane::ControlPlane::lease_two().await;
        Self::on(harvester, guest).await
    }

    async fn on(
        harvester: support::control_plane::ControlPlane,
        guest: support::control_plane::ControlPlane,
    ) -> Self {
        init_logging();
        // Kubeconfigs issued here point at the Harvester cluster's API server.
        let url = harvester.server.clone();
        let b = KubeBackend::start_on(harvester, &["--server-url", &url]).await;
        let lb = lb_reconcilers(b.service_store());
        let guest_client = guest.admin.clone();
        let dir = tempfile::tempdir().expect("tempdir");
        // The cloud-config, as the cloud-config API issues it for this guest cluster.
        let r = b
            .post(&json!({"namespace": NS, "serviceAccountName": CLUSTER}).to_string())
            .await;
        std::fs::write(dir.path().join("cloud-config"), r.kubeconfig()).expect("writes");
        std::fs::write(
            dir.path().join("guest.kubeconfig"),
            guest.admin_kubeconfig_yaml(),
        )
        .expect("writes");
        KubeEnv {
            b,
            _lb: lb,
            guest: Arc::new(guest),
            guest_client,
            ccm: None,
            dir,
        }
    }

    fn start_ccm(&mut self) {
        let args = ccm_args(self.dir.path());
        self.ccm = Some(Task::spawn(|stop| async move {
            harvester_cloud::cli::ccm::run(&args, stop)
                .await
                .expect("the ccm runs");
        }));
    }

    fn services(&self, ns: &str) -> ::kube::Api<Service> {
        ::kube::Api::namespaced(self.guest_client.clone(), ns)
    }
}

impl support::Refusals for KubeEnv {
    fn refusal_probes(&self) -> Vec<support::control_plane::RefusalProbe> {
        vec![
            self.b.cp.refusal_probe(&[support::kube_env::SERVICE_USER]),
            self.guest.refusal_probe(&[CCM_USER]),
        ]
    }
}

impl GuestEnv for KubeEnv {
    type Harvester = KubeBackend;

    fn harvester(&self) -> &KubeBackend {
        &self.b
    }

    /// As `kubectl apply` would: what the body says replaces, annotations and finalizers others
    /// wrote are kept.
    async fn put(&self, svc: Value) -> Result<Value, String> {
        let want: Service = serde_json::from_value(svc).expect("a Service");
        let ns = want.metadata.namespace.clone().expect("namespace");
        let name = want.metadata.name.clone().expect("name");
        let api = self.services(&ns);
        for _ in 0..10 {
            let written = match api.get_opt(&name).await.expect("reads") {
                None => api.create(&PostParams::default(), &want).await,
                Some(current) => {
                    let mut next = want.clone();
                    next.metadata.resource_version = current.metadata.resource_version.clone();
                    next.metadata.finalizers = current.metadata.finalizers.clone();
                    let mut annotations = current.metadata.annotations.clone().unwrap_or_default();
                    annotations.extend(want.metadata.annotations.clone().unwrap_or_default());
                    next.metadata.annotations = Some(annotations);
                    let mut labels = current.metadata.labels.clone().unwrap_or_default();
                    labels.extend(want.metadata.labels.clone().unwrap_or_default());
                    next.metadata.labels = Some(labels);
                    api.replace(&name, &PostParams::default(), &next).await
                }
            };
            match written {
                Ok(s) => return Ok(serde_json::to_value(s).expect("encodes")),
                // A newer version, or the old Service (being deleted) went between read and write.
                Err(::kube::Error::Api(e)) if e.code == 409 || e.code == 404 => continue,
                Err(e) => panic!("cannot write service {ns}/{name}: {e}"),
            }
        }
        panic!("service {ns}/{name} kept conflicting")
    }

    async fn get(&self, ns: &str, name: &str) -> Option<Value> {
        self.services(ns)
            .get_opt(name)
            .await
            .expect("reads")
            .map(|s| serde_json::to_value(s).expect("encodes"))
    }

    async fn delete(&self, ns: &str, name: &str) {
        self.services(ns)
            .delete(name, &DeleteParams::default())
            .await
            .expect("deletes");
    }

    async fn events(&self, ns: &str, name: &str) -> Vec<(String, String)> {
        let api: ::kube::Api<Event> = ::kube::Api::namespaced(self.guest_client.clone(), ns);
        event_pairs(
            api.list(&Default::default()).await.expect("lists").items,
            name,
        )
    }

    async fn set_nad_mapping(&self, mapping: &str) {
        let api: ::kube::Api<ConfigMap> =
            ::kube::Api::namespaced(self.guest_client.clone(), "kube-system");
        api.create(&PostParams::default(), &nad_mapping(mapping))
            .await
            .expect("creates");
    }

    async fn nad_mapping(&self) -> Option<ConfigMap> {
        let api: ::kube::Api<ConfigMap> =
            ::kube::Api::namespaced(self.guest_client.clone(), "kube-system");
        api.get_opt("harvester-nad-mapping").await.expect("reads")
    }

    async fn delete_nad_mapping(&self) {
        let api: ::kube::Api<ConfigMap> =
            ::kube::Api::namespaced(self.guest_client.clone(), "kube-system");
        api.delete("harvester-nad-mapping", &DeleteParams::default())
            .await
            .expect("deletes");
    }

    async fn force_delete(&self, ns: &str, name: &str) {
        // Deleted first, then its finalizer stripped (a terminating object takes no new one, so
        // the ccm cannot put it back in between), until it is gone.
        let api = self.services(ns);
        api.delete(name, &DeleteParams::default())
            .await
            .expect("deletes");
        eventually("the Service to be gone", async || {
            let Some(mut svc) = api.get_opt(name).await.expect("reads") else {
                return Some(());
            };
            svc.metadata.finalizers = None;
            let _ = api.replace(name, &PostParams::default(), &svc).await;
            None
        })
        .await;
    }

    /// Rancher's way: the guest cluster (and its ccm) goes away, and its VMs, marked by Rancher's
    /// cleanup, are deleted; Harvester's side then deletes the cluster's LoadBalancers.
    async fn delete_cluster(&mut self) {
        if let Some(ccm) = self.ccm.take() {
            ccm.stop().await;
        }
        let vms = Api::<VirtualMachine>::new(self.b.store());
        let vm: VirtualMachine = serde_json::from_value(
            support::foreign::vm(&format!("{CLUSTER}-pool1-abcde"))
                .namespace(NS)
                .label("harvesterhci.io/creator", "docker-machine-driver-harvester")
                .label("guestcluster.harvesterhci.io/name", CLUSTER)
                .build(),
        )
        .expect("vm");
        vms.create(&vm).await.expect("creates the VM");
        let name = format!("{CLUSTER}-pool1-abcde");
        let mut vm = eventually("the VM to get the cleanup finalizer", async || {
            let vm = vms.get(NS, &name).await.expect("reads")?;
            vm.metadata.finalizers.is_some().then_some(vm)
        })
        .await;
        vm.metadata.annotations = Some(
            [(
                "harvesterhci.io/removeAllPersistentVolumeClaims".to_string(),
                "true".to_string(),
            )]
            .into(),
        );
        vms.replace(&vm).await.expect("Rancher marks it");
        vms.delete(NS, &name, &Preconditions::default())
            .await
            .expect("deletes");
    }

    fn harvester_admission(&self) -> bool {
        false
    }

    /// The UID of the guest's `kube-system` Namespace.
    async fn identity(&self) -> String {
        namespace_uid(&self.guest_client).await
    }
}

/// The UID of a cluster's `kube-system` Namespace.
async fn namespace_uid(client: &::kube::Client) -> String {
    let api: ::kube::Api<Namespace> = ::kube::Api::all(client.clone());
    api.get("kube-system")
        .await
        .expect("reads kube-system")
        .metadata
        .uid
        .expect("a uid")
}

// --- Helpers -----------------------------------------------------------------------------------

async fn call<B: Backend>(b: &B, method: Method, path: &str, body: Option<Value>) -> Reply {
    let token = b.admin_token();
    let body = body.map_or_else(Body::empty, |v| Body::from(v.to_string()));
    b.call(method, path, Some(&token), body).await
}

fn ok(r: Reply, status: StatusCode) -> Value {
    assert_eq!(r.status, status, "{}", r.text());
    r.json()
}

fn event_pairs(events: Vec<Event>, name: &str) -> Vec<(String, String)> {
    events
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

fn nad_mapping(mapping: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"namespace": "kube-system", "name": "harvester-nad-mapping"},
        "data": {"interface-nad-mapping": mapping}
    }))
    .expect("configmap")
}

/// A Service of type LoadBalancer with `(protocol, port)`s and annotations.
fn mk_svc(ns: &str, name: &str, ports: &[(&str, i32)], annotations: &[(&str, &str)]) -> Value {
    let annotations: BTreeMap<&str, &str> = annotations.iter().copied().collect();
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": ns, "name": name, "annotations": annotations},
        "spec": {
            "type": "LoadBalancer",
            "ports": ports.iter().enumerate().map(|(i, (proto, port))| json!({"name": format!("p{i}"), "protocol": proto, "port": port})).collect::<Vec<_>>(),
        }
    })
}

/// A Service in `default` sharing the address of `primary` (`<ns>/<name>` or a bare name).
fn secondary(name: &str, ports: &[(&str, i32)], primary: &str) -> Value {
    mk_svc(
        "default",
        name,
        ports,
        &[("cloudprovider.harvesterhci.io/primary-service", primary)],
    )
}

fn annotation<'a>(svc: &'a Value, key: &str) -> Option<&'a str> {
    svc["metadata"]["annotations"][key].as_str()
}

fn ingress(svc: &Value) -> Option<&str> {
    svc["status"]["loadBalancer"]["ingress"][0]["ip"].as_str()
}

/// Waits until the Service has its address (annotation, and ingress for a pool address).
async fn address<E: GuestEnv>(env: &E, ns: &str, name: &str) -> (Value, String) {
    eventually(
        &format!("service {ns}/{name} to get its address"),
        async || {
            let svc = env.get(ns, name).await?;
            let ip = annotation(&svc, "kube-vip.io/loadbalancerIPs")?.to_string();
            (ip == "0.0.0.0" || ingress(&svc) == Some(ip.as_str())).then_some((svc, ip))
        },
    )
    .await
}

/// The LoadBalancer of a Service (by the upstream name of its current UID), if it exists.
async fn lb_of<E: GuestEnv>(env: &E, svc: &Value) -> Option<Value> {
    lb_of_name(env, &lb_name(svc)).await
}

/// A LoadBalancer by name, if it exists.
async fn lb_of_name<E: GuestEnv>(env: &E, name: &str) -> Option<Value> {
    let r = call(
        env.harvester(),
        Method::GET,
        &format!("{LBS}/{NS}/{name}"),
        None,
    )
    .await;
    (r.status == StatusCode::OK).then(|| r.json())
}

fn lb_name(svc: &Value) -> String {
    load_balancer_name(
        CLUSTER,
        svc["metadata"]["namespace"].as_str().expect("namespace"),
        svc["metadata"]["name"].as_str().expect("name"),
        svc["metadata"]["uid"].as_str().expect("uid"),
    )
}

async fn lb_gone<E: GuestEnv>(env: &E, name: &str) {
    eventually(&format!("load balancer {name} to be gone"), async || {
        lb_of_name(env, name).await.is_none().then_some(())
    })
    .await
}

/// A `workloadType: cluster` LoadBalancer made by hand for Service `default/<service>` of this
/// guest cluster's name, recording `maker` (none: as upstream's cloud provider makes it).
async fn hand_made_lb<E: GuestEnv>(
    env: &E,
    name: &str,
    service: &str,
    maker: Option<&str>,
) -> String {
    let mut annotations = json!({"loadbalancer.harvesterhci.io/cluster": CLUSTER});
    if let Some(m) = maker {
        annotations["cloudprovider.harvesterhci.io/clusterID"] = json!(m);
    }
    let lb = json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations,
            "labels": {"cloudprovider.harvesterhci.io/cluster": CLUSTER,
                       "cloudprovider.harvesterhci.io/serviceNamespace": "default",
                       "cloudprovider.harvesterhci.io/serviceName": service}},
        "spec": {"workloadType": "cluster", "ipam": "dhcp"}
    });
    let made = ok(
        call(env.harvester(), Method::POST, LBS, Some(lb)).await,
        StatusCode::CREATED,
    );
    made["metadata"]["uid"].as_str().expect("a uid").to_string()
}

/// The UID of a LoadBalancer that must exist.
async fn lb_uid<E: GuestEnv>(env: &E, name: &str) -> String {
    let lb = lb_of_name(env, name)
        .await
        .unwrap_or_else(|| panic!("load balancer {name} exists"));
    lb["metadata"]["uid"].as_str().expect("a uid").to_string()
}

/// Waits until the guest cluster's garbage collector has looked at every LoadBalancer change made
/// so far: it looks at them in order, so once a left-over made now (recording `maker`) is
/// collected, everything before it was judged too.
async fn collector_caught_up<E: GuestEnv>(env: &E, maker: &str, ghost: &str) {
    hand_made_lb(env, ghost, ghost, Some(maker)).await;
    lb_gone(env, ghost).await;
}

async fn service_gone<E: GuestEnv>(env: &E, ns: &str, name: &str) {
    eventually(&format!("service {ns}/{name} to be gone"), async || {
        env.get(ns, name).await.is_none().then_some(())
    })
    .await
}

async fn event<E: GuestEnv>(env: &E, ns: &str, name: &str, reason: &str, message: &str) {
    eventually(
        &format!("event {reason} {message:?} about {ns}/{name}"),
        async || {
            env.events(ns, name)
                .await
                .iter()
                .any(|(r, m)| r == reason && m == message)
                .then_some(())
        },
    )
    .await
}

/// A refusal: from the API at once where it answers synchronously, else as an Event.
async fn refused<E: GuestEnv>(
    env: &E,
    put: Result<Value, String>,
    ns: &str,
    name: &str,
    message: &str,
) {
    match put {
        Err(m) => assert_eq!(m, message),
        Ok(_) => event(env, ns, name, reconcile::reason::SYNC_FAILED, message).await,
    }
}

async fn create_pool<E: GuestEnv>(env: &E, name: &str, range: (&str, &str, &str), selector: Value) {
    let pool = json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "IPPool",
        "metadata": {"name": name},
        "spec": {"ranges": [{"subnet": range.0, "rangeStart": range.1, "rangeEnd": range.2}], "selector": selector}
    });
    ok(
        call(env.harvester(), Method::POST, POOLS, Some(pool)).await,
        StatusCode::CREATED,
    );
}

fn global() -> Value {
    json!({"scope": [{"project": "*", "namespace": "*", "guestCluster": "*"}]})
}

/// This guest cluster's pool on a VM network.
fn on_network(network: &str) -> Value {
    json!({"network": network, "scope": [{"project": "*", "namespace": NS, "guestCluster": CLUSTER}]})
}

/// Harvester VM networks (NetworkAttachmentDefinitions) in `default`.
async fn create_nads<E: GuestEnv>(env: &E, names: &[&str]) {
    let nads = Api::<NetworkAttachmentDefinition>::new(env.harvester().store());
    for name in names {
        let nad: NetworkAttachmentDefinition = serde_json::from_value(
            support::foreign::nad(name)
                .config(r#"{"cniVersion":"0.3.1","type":"bridge"}"#)
                .build(),
        )
        .expect("nad");
        nads.create(&nad).await.expect("creates");
    }
}

/// The pool's allocations: IP → `namespace/name` of the LoadBalancer.
async fn allocated<E: GuestEnv>(env: &E, pool: &str) -> BTreeMap<String, String> {
    let p = ok(
        call(
            env.harvester(),
            Method::GET,
            &format!("{POOLS}/{pool}"),
            None,
        )
        .await,
        StatusCode::OK,
    );
    serde_json::from_value(p["status"]["allocated"].clone()).unwrap_or_default()
}

/// A Service of type LoadBalancer on port 80 with `spec` fields merged in (`loadBalancerIP`,
/// `ipFamilyPolicy`, `ipFamilies`).
fn svc_asking(name: &str, port: i32, spec: Value) -> Value {
    let mut svc = mk_svc("default", name, &[("TCP", port)], &[]);
    if let (Some(into), Value::Object(fields)) = (svc["spec"].as_object_mut(), spec) {
        into.extend(fields);
    }
    svc
}

/// Every `status.loadBalancer.ingress` address of a Service, in order.
fn ingresses(svc: &Value) -> Vec<String> {
    svc["status"]["loadBalancer"]["ingress"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i["ip"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until a Service's ingress is exactly `want`, in order.
async fn ingress_is<E: GuestEnv>(env: &E, name: &str, want: &[&str]) -> Value {
    eventually(
        &format!("service default/{name} to have {want:?}"),
        async || {
            let svc = env.get("default", name).await?;
            (ingresses(&svc) == want).then_some(svc)
        },
    )
    .await
}

/// Waits for an Event about a Service whose message contains `part`.
async fn event_containing<E: GuestEnv>(env: &E, name: &str, part: &str) -> String {
    eventually(
        &format!("an event about default/{name} with {part:?}"),
        async || {
            env.events("default", name)
                .await
                .into_iter()
                .map(|(_, m)| m)
                .find(|m| m.contains(part))
        },
    )
    .await
}

fn pool_with(name: &str, subnet: &str, start: &str, end: &str) -> Value {
    json!({
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "IPPool",
        "metadata": {"name": name},
        "spec": {"ranges": [{"subnet": subnet, "rangeStart": start, "rangeEnd": end}], "selector": global()}
    })
}

// --- Cases -------------------------------------------------------------------------------------

mod cases {
    use super::*;

    /// A Service asks for an address with `spec.loadBalancerIP` (or a `kube-vip.io/loadbalancerIPs`
    /// of its own): a free one in an eligible pool is given; a held one is refused naming the
    /// holder and nothing else is given; one outside every eligible pool is refused; two Services
    /// racing for one address get it once; a changed request moves the address only onto a free
    /// one.
    pub async fn requested_addresses<E: GuestEnv>(env: E) {
        create_pool(
            &env,
            "req",
            ("10.30.0.0/24", "10.30.0.10", "10.30.0.30"),
            global(),
        )
        .await;
        env.put(svc_asking(
            "asks",
            80,
            json!({"loadBalancerIP": "10.30.0.15"}),
        ))
        .await
        .expect("accepted");
        let (asks, ip) = address(&env, "default", "asks").await;
        assert_eq!(ip, "10.30.0.15");
        let asks_lb = format!("{NS}/{}", lb_name(&asks));
        // The kube-vip annotation of a Service that has no load balancer yet is a request too.
        let mut annotated = mk_svc("default", "annotated", &[("TCP", 81)], &[]);
        annotated["metadata"]["annotations"] = json!({"kube-vip.io/loadbalancerIPs": "10.30.0.20"});
        env.put(annotated).await.expect("accepted");
        assert_eq!(address(&env, "default", "annotated").await.1, "10.30.0.20");

        // Held: refused with the holder named, and nothing else allocated.
        env.put(svc_asking(
            "same",
            82,
            json!({"loadBalancerIP": "10.30.0.15"}),
        ))
        .await
        .expect("accepted");
        let message = event_containing(&env, "same", "is held by").await;
        assert!(
            message.contains(&format!(
                "requested address 10.30.0.15 is held by {asks_lb} in IP pool req"
            )),
            "{message}"
        );
        let same = env.get("default", "same").await.expect("exists");
        let same_lb = lb_of(&env, &same).await.expect("its load balancer");
        assert_eq!(same_lb["status"]["allocatedAddress"]["ip"], Value::Null);
        assert_eq!(
            same_lb["status"]["conditions"][0]["reason"],
            "RequestedAddressTaken"
        );
        let held = allocated(&env, "req").await;
        assert_eq!(held.len(), 2, "nothing else allocated: {held:?}");

        // Outside every eligible pool.
        env.put(svc_asking(
            "outside",
            83,
            json!({"loadBalancerIP": "10.99.0.5"}),
        ))
        .await
        .expect("accepted");
        let message = event_containing(&env, "outside", "is not in any IP pool").await;
        assert!(message.contains("requested address 10.99.0.5"), "{message}");
        assert_eq!(allocated(&env, "req").await.len(), 2);

        // The holder goes: the waiting Service gets the address (the release wakes it).
        env.delete("default", "asks").await;
        let (_, ip) = address(&env, "default", "same").await;
        assert_eq!(ip, "10.30.0.15");

        // Two Services racing for one address: one gets it, the other is refused.
        let (a, b) = tokio::join!(
            env.put(svc_asking(
                "racer-a",
                84,
                json!({"loadBalancerIP": "10.30.0.17"})
            )),
            env.put(svc_asking(
                "racer-b",
                85,
                json!({"loadBalancerIP": "10.30.0.17"})
            )),
        );
        a.expect("accepted");
        b.expect("accepted");
        let (winner, loser) = eventually("one racer to get 10.30.0.17", async || {
            let a = env.get("default", "racer-a").await?;
            let b = env.get("default", "racer-b").await?;
            match (ingress(&a), ingress(&b)) {
                (Some(_), Some(_)) => panic!("both racers got an address: {a} {b}"),
                (Some(ip), None) => Some((ip.to_string(), "racer-b")),
                (None, Some(ip)) => Some((ip.to_string(), "racer-a")),
                (None, None) => None,
            }
        })
        .await;
        assert_eq!(winner, "10.30.0.17");
        event_containing(&env, loser, "requested address 10.30.0.17 is held by").await;
        let held = allocated(&env, "req").await;
        assert_eq!(
            held.keys().filter(|ip| *ip == "10.30.0.17").count(),
            1,
            "{held:?}"
        );

        // A changed request moves the address onto a free one, and the old one is freed.
        let mut moved = env.get("default", "same").await.expect("exists");
        moved["spec"]["loadBalancerIP"] = json!("10.30.0.18");
        env.put(moved).await.expect("accepted");
        ingress_is(&env, "same", &["10.30.0.18"]).await;
        eventually("10.30.0.15 to be free", async || {
            (!allocated(&env, "req").await.contains_key("10.30.0.15")).then_some(())
        })
        .await;
        // Onto a held one it does not move: it keeps its address and says why.
        let mut blocked = env.get("default", "same").await.expect("exists");
        blocked["spec"]["loadBalancerIP"] = json!("10.30.0.17");
        env.put(blocked).await.expect("accepted");
        let message = event_containing(&env, "same", "keeps 10.30.0.18").await;
        assert!(message.contains("10.30.0.17 is held by"), "{message}");
        let same = env.get("default", "same").await.expect("exists");
        assert_eq!(ingresses(&same), ["10.30.0.18"]);
        assert_eq!(
            allocated(&env, "req").await.get("10.30.0.18"),
            Some(&format!("{NS}/{}", lb_name(&same)))
        );

        // A request that is not an address is refused at once where the API answers.
        let put = env
            .put(svc_asking(
                "bad",
                86,
                json!({"loadBalancerIP": "10.30.0.300"}),
            ))
            .await;
        let expected =
            "service default/bad: requested address \"10.30.0.300\" is not an IP address";
        match put {
            Err(m) if m == expected => {}
            // The Kubernetes API server validates spec.loadBalancerIP itself.
            Err(m) => assert!(m.contains("loadBalancerIP"), "{m}"),
            Ok(_) => {
                event(
                    &env,
                    "default",
                    "bad",
                    reconcile::reason::SYNC_FAILED,
                    expected,
                )
                .await
            }
        }
    }

    /// Dual-stack Services get one address per family in `ipFamilies` order (one LoadBalancer per
    /// family); RequireDualStack without an IPv6 pool waits, saying why, while PreferDualStack takes
    /// IPv4 alone; an IPv6 pool gives both the second family; a dual-stack primary's addresses are
    /// not shared; going single-stack releases the second family's address.
    pub async fn dual_stack_services<E: GuestEnv>(env: E) {
        ok(
            call(
                env.harvester(),
                Method::POST,
                POOLS,
                Some(pool_with("v4", "10.40.0.0/24", "10.40.0.10", "10.40.0.20")),
            )
            .await,
            StatusCode::CREATED,
        );
        let dual = |name: &str, port: i32, policy: &str, families: &[&str]| {
            svc_asking(
                name,
                port,
                json!({"ipFamilyPolicy": policy, "ipFamilies": families}),
            )
        };
        env.put(dual("strict", 80, "RequireDualStack", &["IPv4", "IPv6"]))
            .await
            .expect("accepted");
        env.put(dual("prefer", 81, "PreferDualStack", &["IPv4", "IPv6"]))
            .await
            .expect("accepted");
        // PreferDualStack: IPv4 alone for now.
        eventually("prefer to get its IPv4 address alone", async || {
            let svc = env.get("default", "prefer").await?;
            let got = ingresses(&svc);
            (got.len() == 1 && got[0].starts_with("10.40.0.")).then_some(())
        })
        .await;
        // RequireDualStack: nothing, and the Service says why.
        let message = event_containing(&env, "strict", "RequireDualStack").await;
        assert!(
            message.contains("no matched IPPool with IPv6 ranges"),
            "{message}"
        );
        let strict = env.get("default", "strict").await.expect("exists");
        assert!(ingresses(&strict).is_empty(), "{strict}");

        ok(
            call(
                env.harvester(),
                Method::POST,
                POOLS,
                Some(pool_with(
                    "v6",
                    "fd00:40::/64",
                    "fd00:40::10",
                    "fd00:40::20",
                )),
            )
            .await,
            StatusCode::CREATED,
        );
        let strict = eventually("strict to get both families", async || {
            let svc = env.get("default", "strict").await?;
            (ingresses(&svc).len() == 2).then_some(svc)
        })
        .await;
        let both = ingresses(&strict);
        assert!(both[0].starts_with("10.40.0."), "{both:?}");
        assert!(both[1].starts_with("fd00:40::"), "{both:?}");
        assert_eq!(
            annotation(&strict, "kube-vip.io/loadbalancerIPs"),
            Some(both.join(",").as_str())
        );
        eventually("prefer to get its IPv6 address too", async || {
            let svc = env.get("default", "prefer").await?;
            (ingresses(&svc).len() == 2).then_some(())
        })
        .await;
        // IPv6 first when the Service lists it first; a requested address per family.
        env.put(svc_asking(
            "six-first",
            82,
            json!({"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv6", "IPv4"]}),
        ))
        .await
        .expect("accepted");
        let six = eventually("six-first to get both families", async || {
            let svc = env.get("default", "six-first").await?;
            (ingresses(&svc).len() == 2).then_some(svc)
        })
        .await;
        let order = ingresses(&six);
        assert!(order[0].starts_with("fd00:40::"), "{order:?}");
        assert!(order[1].starts_with("10.40.0."), "{order:?}");
        // The first family's LoadBalancer has the upstream name; the second family has its own.
        let owner = |pool: &'static str, ip: String| {
            let env = &env;
            async move {
                let held = allocated(env, pool).await;
                let lb = held.get(&ip).cloned().expect("the address is held");
                lb.split_once('/').expect("ns/name").1.to_string()
            }
        };
        assert_eq!(owner("v6", order[0].clone()).await, lb_name(&six));
        let second = owner("v4", order[1].clone()).await;
        assert_ne!(second, lb_name(&six));
        let second = lb_of_name(&env, &second).await.expect("exists");
        assert_eq!(
            second["metadata"]["annotations"]["loadbalancer.harvesterhci.io/ipFamily"],
            "IPv4"
        );

        // A dual-stack primary is not shared.
        let put = env.put(secondary("rider", &[("UDP", 53)], "strict")).await;
        refused(
            &env,
            put,
            "default",
            "rider",
            "primary service default/strict is dual-stack; sharing its addresses is not supported: give service default/rider its own load balancer",
        )
        .await;

        // Single-stack again: the second family's LoadBalancer goes, and its address with it.
        // Only the policy changes: the API server drops the second family and cluster IP itself.
        let mut single = env.get("default", "six-first").await.expect("exists");
        single["spec"]["ipFamilyPolicy"] = json!("SingleStack");
        env.put(single).await.expect("accepted");
        ingress_is(&env, "six-first", &[order[0].as_str()]).await;
        let v4_of_six = order[1].clone();
        eventually("the IPv4 address of six-first to be released", async || {
            (!allocated(&env, "v4").await.contains_key(&v4_of_six)).then_some(())
        })
        .await;
    }

    /// Pool and DHCP Services get their addresses; the LoadBalancer carries upstream's name (with
    /// the 55-character cut), labels and annotations.
    pub async fn pool_and_dhcp_services_get_addresses<E: GuestEnv>(env: E) {
        create_pool(
            &env,
            "p1",
            ("10.10.0.0/24", "10.10.0.10", "10.10.0.20"),
            global(),
        )
        .await;
        env.put(mk_svc("default", "web", &[("TCP", 80)], &[]))
            .await
            .expect("accepted");
        let (svc, ip) = address(&env, "default", "web").await;
        assert!(ip.starts_with("10.10.0."), "{ip}");
        assert_eq!(ingress(&svc), Some(ip.as_str()));
        let uid = svc["metadata"]["uid"].as_str().expect("uid").to_string();
        let lb = lb_of(&env, &svc)
            .await
            .expect("the load balancer of its UID");
        assert_eq!(
            lb["metadata"]["name"],
            load_balancer_name(CLUSTER, "default", "web", &uid)
        );
        assert_eq!(lb["spec"]["workloadType"], "cluster");
        assert_eq!(lb["spec"]["ipam"], "pool");
        assert_eq!(lb["status"]["allocatedAddress"]["ip"], ip.as_str());
        let labels = &lb["metadata"]["labels"];
        assert_eq!(labels["cloudprovider.harvesterhci.io/cluster"], CLUSTER);
        assert_eq!(
            labels["cloudprovider.harvesterhci.io/serviceNamespace"],
            "default"
        );
        assert_eq!(labels["cloudprovider.harvesterhci.io/serviceName"], "web");
        let annotations = &lb["metadata"]["annotations"];
        assert_eq!(annotations["loadbalancer.harvesterhci.io/cluster"], CLUSTER);
        assert_eq!(
            annotations["cloudprovider.harvesterhci.io/serviceUID"],
            uid.as_str()
        );
        assert_eq!(
            allocated(&env, "p1").await.get(&ip).map(String::as_str),
            Some(format!("{NS}/{}", lb_name(&svc)).as_str())
        );
        event(
            &env,
            "default",
            "web",
            reconcile::reason::ENSURED,
            &format!(
                "Ensured load balancer {NS}/{} with address {ip}",
                lb_name(&svc)
            ),
        )
        .await;

        // The name is cut to 55 characters before its CRC suffix, as upstream cuts it.
        let long = "a-rather-long-service-name-that-overflows-the-base";
        env.put(mk_svc("default", long, &[("TCP", 443)], &[]))
            .await
            .expect("accepted");
        let (svc, _) = address(&env, "default", long).await;
        let lb = lb_of(&env, &svc).await.expect("exists");
        let name = lb["metadata"]["name"].as_str().expect("name");
        assert_eq!(name.len(), 63);
        assert!(name.starts_with(&format!(
            "{CLUSTER}-default-a-rather-long-service-name-that-overf"
        )));

        // DHCP: the guest's kube-vip leases the address; the Service is told 0.0.0.0.
        env.put(mk_svc(
            "default",
            "leased",
            &[("TCP", 80)],
            &[("cloudprovider.harvesterhci.io/ipam", "dhcp")],
        ))
        .await
        .expect("accepted");
        let (svc, ip) = address(&env, "default", "leased").await;
        assert_eq!(ip, "0.0.0.0");
        assert_eq!(ingress(&svc), None, "the lease holder reports the address");
        let lb = lb_of(&env, &svc).await.expect("exists");
        assert_eq!(lb["spec"]["ipam"], "dhcp");
        assert_eq!(lb["status"]["allocatedAddress"]["ip"], "0.0.0.0");
    }

    /// Network resolution: the Service's network annotation goes to the LoadBalancer (and picks the
    /// pool of that network); the NAD mapping gives kube-vip's interface or refuses an unknown
    /// network; without an annotation, the management network (ccm flag) and then Harvester's
    /// findNetwork (a VMI of the guest cluster, by label before the legacy name prefix) decide.
    pub async fn network_resolution_order<E: GuestEnv>(env: E) {
        create_nads(&env, &["vlan10", "vlan20", "mgmt"]).await;
        create_pool(
            &env,
            "p10",
            ("10.20.10.0/24", "10.20.10.10", "10.20.10.20"),
            on_network("default/vlan10"),
        )
        .await;
        create_pool(
            &env,
            "p20",
            ("10.20.20.0/24", "10.20.20.10", "10.20.20.20"),
            on_network("default/vlan20"),
        )
        .await;
        create_pool(
            &env,
            "pmgmt",
            ("10.20.30.0/24", "10.20.30.10", "10.20.30.20"),
            on_network("default/mgmt"),
        )
        .await;
        create_pool(
            &env,
            "pnone",
            ("10.20.40.0/24", "10.20.40.10", "10.20.40.20"),
            on_network(""),
        )
        .await;
        env.set_nad_mapping(r#"{"default/vlan20":"enp2s0"}"#).await;

        // 1. The Service's own network.
        env.put(mk_svc(
            "default",
            "v20",
            &[("TCP", 80)],
            &[("cloudprovider.harvesterhci.io/network", "default/vlan20")],
        ))
        .await
        .expect("accepted");
        let (svc, ip) = address(&env, "default", "v20").await;
        assert!(ip.starts_with("10.20.20."), "{ip}");
        assert_eq!(
            annotation(&svc, "kube-vip.io/serviceInterface"),
            Some("enp2s0")
        );
        let lb = lb_of(&env, &svc).await.expect("exists");
        assert_eq!(
            lb["metadata"]["annotations"]["loadbalancer.harvesterhci.io/network"],
            "default/vlan20"
        );
        assert_eq!(
            lb["metadata"]["annotations"]["cloudprovider.harvesterhci.io/lb-network"],
            "default/vlan20"
        );

        // A network the guest's NAD mapping does not know is refused.
        let put = env
            .put(mk_svc(
                "default",
                "v10",
                &[("TCP", 80)],
                &[("cloudprovider.harvesterhci.io/network", "default/vlan10")],
            ))
            .await;
        refused(
            &env,
            put,
            "default",
            "v10",
            "network default/vlan10 not found in NAD mapping for service default/v10",
        )
        .await;

        // 2./3. No network annotation: Harvester decides.
        if env.harvester_admission() {
            // findNetwork: a VMI labelled with the guest cluster wins over the legacy name prefix.
            let vmis = Api::<VirtualMachineInstance>::new(env.harvester().store());
            for (name, label, network) in [
                (
                    format!("{CLUSTER}-legacy"),
                    ("harvesterhci.io/creator", "docker-machine-driver-harvester"),
                    "default/vlan20",
                ),
                (
                    "node-a".to_string(),
                    ("guestcluster.harvesterhci.io/name", CLUSTER),
                    "default/vlan10",
                ),
            ] {
                // A Multus network with an empty name is skipped
                // (pkg/webhook/loadbalancer/mutator.go, getFirstMultusNetworkNameFromVMI).
                let vmi = support::foreign::vmi(&name)
                    .namespace(NS)
                    .label(label.0, label.1)
                    .pod_network(&[], None)
                    .multus("nic0", "", &[], None)
                    .multus("nic", network, &[], None)
                    .build();
                let vmi: VirtualMachineInstance = serde_json::from_value(vmi).expect("vmi");
                vmis.create(&vmi).await.expect("creates");
            }
            env.put(mk_svc("default", "plain", &[("TCP", 80)], &[]))
                .await
                .expect("accepted");
            let (svc, ip) = address(&env, "default", "plain").await;
            assert!(ip.starts_with("10.20.10."), "the VMI's network: {ip}");
            let lb = lb_of(&env, &svc).await.expect("exists");
            assert_eq!(
                lb["metadata"]["annotations"]["loadbalancer.harvesterhci.io/network"],
                "default/vlan10"
            );
            assert_eq!(
                lb["metadata"]["annotations"]["cloudprovider.harvesterhci.io/lb-network"],
                ""
            );
        } else {
            // The ccm records its management network; no Harvester webhook is registered here to turn
            // it into the LoadBalancer's network, so the pool without a network serves it.
            env.put(mk_svc("default", "plain", &[("TCP", 80)], &[]))
                .await
                .expect("accepted");
            let (svc, ip) = address(&env, "default", "plain").await;
            assert!(ip.starts_with("10.20.40."), "{ip}");
            let lb = lb_of(&env, &svc).await.expect("exists");
            assert_eq!(
                lb["metadata"]["annotations"]["cloudprovider.harvesterhci.io/managementNetwork"],
                "default/mgmt"
            );
            assert_eq!(
                lb["metadata"]["annotations"]["loadbalancer.harvesterhci.io/network"],
                ""
            );
        }
    }

    /// The guest's NAD mapping follows the cluster's running VMIs on Harvester (what every node has
    /// on the same interface; other clusters' and stopped VMIs do not count), and a Service refused
    /// for a network the mapping lacked goes on once the mapping has it.
    pub async fn nad_mapping_follows_the_vmis<E: GuestEnv>(env: E) {
        // The guest cluster is served (on the embedded store, it exists from its first Service).
        env.put(mk_svc(
            "default",
            "first",
            &[("TCP", 80)],
            &[("cloudprovider.harvesterhci.io/ipam", "dhcp")],
        ))
        .await
        .expect("accepted");
        address(&env, "default", "first").await;
        create_nads(&env, &["vlan10", "vlan20"]).await;
        let vmis = support::vmi_api(env.harvester().store());
        // (name, cluster, phase, [(NIC, NAD, guest interface)]), from KubeVirt's Go types.
        let vmi_of = |name: &str, cluster: &str, phase: &str, nics: &[(&str, &str, &str)]| {
            let mut vmi = support::foreign::vmi(name)
                .namespace(NS)
                .label("guestcluster.harvesterhci.io/name", cluster)
                .phase(phase)
                .pod_network(&[], Some("eth0"));
            for (nic, nad, iface) in nics {
                vmi = vmi.multus(nic, nad, &[], Some(iface));
            }
            vmi
        };
        let typed = |vmi: &support::foreign::Vmi| {
            serde_json::from_value::<VirtualMachineInstance>(vmi.build()).expect("vmi")
        };
        let mk_vmi = |name: &str, cluster: &str, phase: &str, nics: &[(&str, &str, &str)]| {
            typed(&vmi_of(name, cluster, phase, nics))
        };
        for vmi in [
            mk_vmi(
                "node-a",
                CLUSTER,
                "Running",
                &[
                    ("nic-1", "default/vlan10", "enp2s0"),
                    ("nic-2", "default/vlan20", "enp3s0"),
                ],
            ),
            mk_vmi(
                "node-b",
                CLUSTER,
                "Running",
                &[
                    ("nic-1", "default/vlan10", "enp2s0"),
                    ("nic-2", "default/vlan20", "enp4s0"),
                ],
            ),
            mk_vmi(
                "node-c",
                CLUSTER,
                "Succeeded",
                &[("nic-1", "default/vlan10", "enp7s0")],
            ),
            mk_vmi(
                "other-node",
                "gc2",
                "Running",
                &[("nic-1", "default/vlan10", "enp9s0")],
            ),
        ] {
            support::create_vmi(env.harvester().store(), &vmi).await;
        }
        // Not counted either (pkg/utils/vmi.go, GetCommonVMINADs; pkg/controller/
        // virtualmachineinstance/controller.go lists by the cluster label alone): a node migrating,
        // and a node-driver VMI named like the cluster's nodes but not labelled.
        let migrating = typed(
            &vmi_of(
                "node-d",
                CLUSTER,
                "Running",
                &[("nic-1", "default/vlan10", "enp8s0")],
            )
            .migrating(),
        );
        vmis.create(&migrating).await.expect("creates");
        let unlabelled = typed(
            &support::foreign::vmi(&format!("{CLUSTER}-pool1-legacy"))
                .namespace(NS)
                .label("harvesterhci.io/creator", "docker-machine-driver-harvester")
                .pod_network(&[], Some("eth0"))
                .multus("nic-1", "default/vlan10", &[], Some("enp7s0")),
        );
        vmis.create(&unlabelled).await.expect("creates");
        let value = async || -> Option<String> {
            env.nad_mapping()
                .await?
                .data?
                .remove("interface-nad-mapping")
        };
        eventually("the NAD mapping of the two running nodes", async || {
            (value().await.as_deref() == Some(r#"{"default/vlan10":"enp2s0"}"#)).then_some(())
        })
        .await;
        let cm = env.nad_mapping().await.expect("exists");
        assert_eq!(
            cm.metadata
                .labels
                .unwrap_or_default()
                .get("app.kubernetes.io/managed-by")
                .map(String::as_str),
            Some("harvester-cloud")
        );

        let dhcp_on = |name: &str, network: &str| {
            mk_svc(
                "default",
                name,
                &[("TCP", 80)],
                &[
                    ("cloudprovider.harvesterhci.io/ipam", "dhcp"),
                    ("cloudprovider.harvesterhci.io/network", network),
                ],
            )
        };
        env.put(dhcp_on("v10", "default/vlan10"))
            .await
            .expect("accepted");
        let (svc, ip) = address(&env, "default", "v10").await;
        assert_eq!(ip, "0.0.0.0");
        assert_eq!(
            annotation(&svc, "kube-vip.io/serviceInterface"),
            Some("enp2s0")
        );

        // vlan20 is on different interfaces of the two nodes: not in the mapping, refused.
        let put = env.put(dhcp_on("v20", "default/vlan20")).await;
        let refused_at_once = put.is_err();
        refused(
            &env,
            put,
            "default",
            "v20",
            "network default/vlan20 not found in NAD mapping for service default/v20",
        )
        .await;

        // node-b's guest renames the NIC: vlan20 is on enp3s0 everywhere now.
        let mut b = vmis
            .get(NS, "node-b")
            .await
            .expect("reads")
            .expect("exists");
        b.rest["status"]["interfaces"][2]["interfaceName"] = json!("enp3s0");
        vmis.replace(&b).await.expect("updates");
        eventually("the NAD mapping to take vlan20", async || {
            (value().await.as_deref()
                == Some(r#"{"default/vlan10":"enp2s0","default/vlan20":"enp3s0"}"#))
            .then_some(())
        })
        .await;
        if refused_at_once {
            env.put(dhcp_on("v20", "default/vlan20"))
                .await
                .expect("accepted now");
        }
        // Kubernetes: the mapping's change wakes the refused Service (without the wake it would
        // wait for its 60 s re-check; not asserted, as timings are not).
        let (svc, _) = address(&env, "default", "v20").await;
        assert_eq!(
            annotation(&svc, "kube-vip.io/serviceInterface"),
            Some("enp3s0")
        );

        // Deleted by someone: written again, at the next pass (the next VMI change here; at the
        // latest after nad::RECHECK otherwise).
        env.delete_nad_mapping().await;
        let mut a = vmis
            .get(NS, "node-a")
            .await
            .expect("reads")
            .expect("exists");
        a.metadata
            .labels
            .get_or_insert_default()
            .insert("touched".into(), "yes".into());
        vmis.replace(&a).await.expect("updates");
        eventually("the NAD mapping to be written again", async || {
            (value().await.as_deref()
                == Some(r#"{"default/vlan10":"enp2s0","default/vlan20":"enp3s0"}"#))
            .then_some(())
        })
        .await;

        // No node counts any more (all stopped, or migrating): the value is emptied, as upstream
        // empties it (pkg/controller/virtualmachineinstance/controller.go, syncNADMappingConfigMap),
        // and a Service naming a network is refused for it.
        for name in ["node-a", "node-b"] {
            let mut v = vmis.get(NS, name).await.expect("reads").expect("exists");
            v.rest["status"]["phase"] = json!("Succeeded");
            vmis.replace(&v).await.expect("updates");
        }
        eventually("the NAD mapping to be emptied", async || {
            (value().await.as_deref() == Some("")).then_some(())
        })
        .await;
        let put = env.put(dhcp_on("v10-late", "default/vlan10")).await;
        refused(
            &env,
            put,
            "default",
            "v10-late",
            "there is no common NAD mapping: kube-system/harvester-nad-mapping is empty",
        )
        .await;
    }

    /// Share IP: by bare name; the same port on another protocol shares; a clash on protocol and
    /// port, a chain and a primary without an address are refused; a primary in use cannot go
    /// until its secondaries have.
    pub async fn share_ip<E: GuestEnv>(env: E) {
        create_pool(
            &env,
            "p1",
            ("10.30.0.0/24", "10.30.0.10", "10.30.0.20"),
            global(),
        )
        .await;
        env.put(mk_svc("default", "dns", &[("TCP", 53)], &[]))
            .await
            .expect("accepted");
        let (dns, ip) = address(&env, "default", "dns").await;
        // pkg/cloud-controller-manager/loadbalancer.go (updatePrimaryServiceLoadBalancerIP): the
        // primary-service label is emptied when set, never added.
        assert_eq!(
            dns["metadata"]["labels"]["cloudprovider.harvesterhci.io/primary-service"],
            Value::Null
        );

        // Same port, other protocol, primary named without its namespace.
        env.put(secondary("dns-udp", &[("UDP", 53)], "dns"))
            .await
            .expect("accepted");
        let (udp, shared) = address(&env, "default", "dns-udp").await;
        assert_eq!(shared, ip);
        assert_eq!(
            udp["metadata"]["labels"]["cloudprovider.harvesterhci.io/primary-service"],
            "default.dns"
        );
        assert!(
            lb_of(&env, &udp).await.is_none(),
            "a secondary has no load balancer of its own"
        );
        env.put(secondary("web", &[("TCP", 80)], "default/dns"))
            .await
            .expect("accepted");
        assert_eq!(address(&env, "default", "web").await.1, ip);

        // Clashes on protocol and port, with the primary or another secondary; the message names
        // the port number only (pkg/cloud-controller-manager/loadbalancer.go, checkPortOverlap).
        let put = env
            .put(secondary("dns-tcp", &[("TCP", 53)], "default/dns"))
            .await;
        refused(&env, put, "default", "dns-tcp", "check port overlap failed, primary service: default/dns, secondary service: default/dns-tcp, error: port 53 has been used in service default/dns").await;
        let put = env
            .put(secondary("web2", &[("TCP", 80)], "default/dns"))
            .await;
        refused(&env, put, "default", "web2", "check port overlap failed, primary service: default/dns, secondary service: default/web2, error: port 80 has been used in service default/web").await;
        // A primary that does not exist: upstream's Service cache error, wrapped
        // (pkg/cloud-controller-manager/loadbalancer.go, getPrimaryService).
        let put = env
            .put(secondary("lost", &[("TCP", 90)], "default/nope"))
            .await;
        refused(
            &env,
            put,
            "default",
            "lost",
            "get service default/nope failed: service \"nope\" not found",
        )
        .await;
        // No chaining.
        let put = env
            .put(secondary("chain", &[("TCP", 8080)], "default/web"))
            .await;
        refused(
            &env,
            put,
            "default",
            "chain",
            "service default/web is not a primary service",
        )
        .await;
        // A primary without an address (DHCP: the lease holder reports it, and nothing does here).
        env.put(mk_svc(
            "default",
            "leased",
            &[("TCP", 80)],
            &[("cloudprovider.harvesterhci.io/ipam", "dhcp")],
        ))
        .await
        .expect("accepted");
        address(&env, "default", "leased").await;
        let put = env
            .put(secondary("leased-sec", &[("TCP", 81)], "default/leased"))
            .await;
        refused(
            &env,
            put,
            "default",
            "leased-sec",
            "primary service default/leased has no ingress IP",
        )
        .await;

        // The primary cannot go while its secondaries use the address.
        let lb = lb_name(&dns);
        env.delete("default", "dns").await;
        event(
            &env,
            "default",
            "dns",
            reconcile::reason::DELETE_FAILED,
            "could not delete load balancer for service default/dns: service default/dns is still used by other services [default/dns-udp default/web]",
        )
        .await;
        let waiting = env.get("default", "dns").await.expect("still there");
        assert!(waiting["metadata"]["deletionTimestamp"].is_string());
        assert!(allocated(&env, "p1").await.contains_key(&ip));
        // Once they are gone, so is the primary, and the address is released.
        env.delete("default", "dns-udp").await;
        env.delete("default", "web").await;
        service_gone(&env, "default", "dns").await;
        lb_gone(&env, &lb).await;
        eventually("the shared address to be released", async || {
            (!allocated(&env, "p1").await.contains_key(&ip)).then_some(())
        })
        .await;
    }

    /// A secondary is checked as upstream's EnsureLoadBalancer checks every Service: against the NAD
    /// mapping first (before its primary is even looked at), then its network against the one its
    /// primary's LoadBalancer was made on.
    pub async fn secondaries_are_checked_like_primaries<E: GuestEnv>(env: E) {
        create_pool(
            &env,
            "p1",
            ("10.32.0.0/24", "10.32.0.10", "10.32.0.20"),
            global(),
        )
        .await;
        env.set_nad_mapping(r#"{"default/vlan10":"enp2s0","default/vlan20":"enp3s0"}"#)
            .await;
        env.put(mk_svc(
            "default",
            "p",
            &[("TCP", 80)],
            &[("cloudprovider.harvesterhci.io/network", "default/vlan10")],
        ))
        .await
        .expect("accepted");
        let (primary, ip) = address(&env, "default", "p").await;
        let on = |name: &str, port: i32, network: &str| {
            let mut s = secondary(name, &[("TCP", port)], "default/p");
            s["metadata"]["annotations"]["cloudprovider.harvesterhci.io/network"] = json!(network);
            s
        };
        // Not in the NAD mapping: refused for that, although its port clashes too
        // (pkg/cloud-controller-manager/loadbalancer.go: resolveNetworkInterface comes first).
        let put = env.put(on("s30", 80, "default/vlan30")).await;
        refused(
            &env,
            put,
            "default",
            "s30",
            "network default/vlan30 not found in NAD mapping for service default/s30",
        )
        .await;
        // In the mapping, but not the network of the primary's load balancer
        // (pkg/cloud-controller-manager/loadbalancer.go, checkNetworkChanged with secondary=true).
        let put = env.put(on("s20", 81, "default/vlan20")).await;
        let message = format!(
            "network annotation of service default/s20 is not same as the load balancer {NS}/{}, service: 'default/vlan20', lb: 'default/vlan10'",
            lb_name(&primary)
        );
        refused(&env, put, "default", "s20", &message).await;
        // Naming none, it gets the primary's (and no interface of its own).
        env.put(secondary("s", &[("TCP", 82)], "default/p"))
            .await
            .expect("accepted");
        let (s, shared) = address(&env, "default", "s").await;
        assert_eq!(shared, ip);
        assert_eq!(
            annotation(&s, "cloudprovider.harvesterhci.io/network"),
            Some("default/vlan10")
        );
        assert_eq!(annotation(&s, "kube-vip.io/serviceInterface"), None);
    }

    /// A secondary made together with its primary gets the address as soon as the primary has it
    /// (on Kubernetes it waits, woken by the primary's change; the HTTP API says to come back).
    pub async fn secondary_made_with_its_primary<E: GuestEnv>(env: E) {
        create_pool(
            &env,
            "p1",
            ("10.31.0.0/24", "10.31.0.10", "10.31.0.20"),
            global(),
        )
        .await;
        env.put(mk_svc("default", "primary", &[("TCP", 80)], &[]))
            .await
            .expect("accepted");
        let secondary = secondary("secondary", &[("TCP", 443)], "primary");
        if let Err(message) = env.put(secondary.clone()).await {
            assert_eq!(message, "primary service default/primary has no ingress IP");
            address(&env, "default", "primary").await;
            env.put(secondary)
                .await
                .expect("accepted once the primary has its address");
        }
        let (_, ip) = address(&env, "default", "primary").await;
        assert_eq!(address(&env, "default", "secondary").await.1, ip);
    }

    /// The network and the IPAM mode of a Service are fixed once its LoadBalancer exists.
    pub async fn network_and_ipam_changes_are_refused<E: GuestEnv>(env: E) {
        create_pool(
            &env,
            "p1",
            ("10.40.0.0/24", "10.40.0.10", "10.40.0.20"),
            global(),
        )
        .await;
        let vlan1 = ("cloudprovider.harvesterhci.io/network", "default/vlan1");
        env.put(mk_svc("default", "svc", &[("TCP", 80)], &[vlan1]))
            .await
            .expect("accepted");
        let (svc, ip) = address(&env, "default", "svc").await;
        let lb = lb_name(&svc);

        let put = env
            .put(mk_svc(
                "default",
                "svc",
                &[("TCP", 80)],
                &[("cloudprovider.harvesterhci.io/network", "default/vlan2")],
            ))
            .await;
        refused(&env, put, "default", "svc", &format!("network annotation of service default/svc is not same as the load balancer {NS}/{lb}, service: 'default/vlan2', lb: 'default/vlan1'")).await;

        let put = env
            .put(mk_svc(
                "default",
                "svc",
                &[("TCP", 80)],
                &[vlan1, ("cloudprovider.harvesterhci.io/ipam", "dhcp")],
            ))
            .await;
        refused(&env, put, "default", "svc", &format!("ipam annotation of service default/svc is not same as the load balancer {NS}/{lb}, service: 'dhcp', lb: 'pool'; the IPAM mode of a load balancer cannot change: create a new service instead")).await;

        // The LoadBalancer kept its network, mode and address.
        let current = lb_of(&env, &svc).await.expect("exists");
        assert_eq!(current["spec"]["ipam"], "pool");
        assert_eq!(
            current["metadata"]["annotations"]["loadbalancer.harvesterhci.io/network"],
            "default/vlan1"
        );
        assert_eq!(current["status"]["allocatedAddress"]["ip"], ip.as_str());
    }

    /// Deleting a Service deletes its LoadBalancer, which releases the address (a Service waiting
    /// on the full pool gets it).
    pub async fn service_deletion_releases<E: GuestEnv>(env: E) {
        create_pool(
            &env,
            "small",
            ("10.50.0.0/24", "10.50.0.10", "10.50.0.11"),
            global(),
        )
        .await;
        for name in ["a", "b"] {
            env.put(mk_svc("default", name, &[("TCP", 80)], &[]))
                .await
                .expect("accepted");
        }
        let (a, a_ip) = address(&env, "default", "a").await;
        address(&env, "default", "b").await;
        env.put(mk_svc("default", "c", &[("TCP", 80)], &[]))
            .await
            .expect("accepted");
        eventually("c to be told it waits for an address", async || {
            env.events("default", "c")
                .await
                .iter()
                .any(|(r, m)| {
                    r == reconcile::reason::SYNC_FAILED
                        && m.starts_with("ip is not allocated, mode: pool, message: ")
                })
                .then_some(())
        })
        .await;
        env.delete("default", "a").await;
        service_gone(&env, "default", "a").await;
        lb_gone(&env, &lb_name(&a)).await;
        event(
            &env,
            "default",
            "a",
            reconcile::reason::DELETED,
            &format!("Deleted load balancer {NS}/{}", lb_name(&a)),
        )
        .await;
        let (_, c_ip) = address(&env, "default", "c").await;
        assert_eq!(
            c_ip, a_ip,
            "the released address serves the waiting service"
        );

        // A Service that is no longer of type LoadBalancer releases its address too.
        let b = env.get("default", "b").await.expect("exists");
        let mut internal = mk_svc("default", "b", &[("TCP", 80)], &[]);
        internal["spec"]["type"] = json!("ClusterIP");
        env.put(internal).await.expect("accepted");
        lb_gone(&env, &lb_name(&b)).await;
        let b = eventually("b to lose its address and finalizer", async || {
            let b = env.get("default", "b").await?;
            (annotation(&b, "kube-vip.io/loadbalancerIPs").is_none()
                && b["metadata"]["finalizers"]
                    .as_array()
                    .is_none_or(|f| f.is_empty()))
            .then_some(b)
        })
        .await;
        assert_eq!(ingress(&b), None);
    }

    /// A Service recreated with a new UID (its deletion missed) gets a new LoadBalancer, and the old
    /// one is garbage-collected instead of leaking its address.
    pub async fn uid_change_does_not_leak<E: GuestEnv>(env: E) {
        create_pool(
            &env,
            "p1",
            ("10.60.0.0/24", "10.60.0.10", "10.60.0.20"),
            global(),
        )
        .await;
        env.put(mk_svc("default", "svc", &[("TCP", 80)], &[]))
            .await
            .expect("accepted");
        let (old, _) = address(&env, "default", "svc").await;
        let old_lb = lb_name(&old);
        env.force_delete("default", "svc").await;
        env.put(mk_svc("default", "svc", &[("TCP", 80)], &[]))
            .await
            .expect("accepted");
        let (new, ip) = address(&env, "default", "svc").await;
        assert_ne!(new["metadata"]["uid"], old["metadata"]["uid"]);
        let new_lb = lb_name(&new);
        assert_ne!(new_lb, old_lb);
        lb_gone(&env, &old_lb).await;
        eventually(
            "only the new load balancer to hold an address",
            async || {
                let held = allocated(&env, "p1").await;
                (held.len() == 1 && held.get(&ip) == Some(&format!("{NS}/{new_lb}"))).then_some(())
            },
        )
        .await;
    }

    /// Deleting a guest cluster deletes its LoadBalancers and frees their addresses; other
    /// clusters' are left alone.
    pub async fn guest_cluster_deletion<E: GuestEnv>(mut env: E) {
        create_pool(
            &env,
            "p1",
            ("10.70.0.0/24", "10.70.0.10", "10.70.0.30"),
            global(),
        )
        .await;
        let mut lbs = Vec::new();
        for name in ["one", "two", "three"] {
            env.put(mk_svc("default", name, &[("TCP", 80)], &[]))
                .await
                .expect("accepted");
            lbs.push(lb_name(&address(&env, "default", name).await.0));
        }
        // Another cluster's load balancer in the same namespace.
        let other = json!({
            "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
            "metadata": {"name": "gc2-lb", "namespace": NS, "labels": {"cloudprovider.harvesterhci.io/cluster": "gc2"}},
            "spec": {"workloadType": "cluster", "ipam": "pool"}
        });
        ok(
            call(env.harvester(), Method::POST, LBS, Some(other)).await,
            StatusCode::CREATED,
        );
        eventually("gc2's load balancer to get an address", async || {
            allocated(&env, "p1")
                .await
                .values()
                .any(|v| v == &format!("{NS}/gc2-lb"))
                .then_some(())
        })
        .await;

        env.delete_cluster().await;
        for lb in &lbs {
            lb_gone(&env, lb).await;
        }
        eventually("the cluster's addresses to be free", async || {
            let held = allocated(&env, "p1").await;
            (held.len() == 1 && held.values().all(|v| v == &format!("{NS}/gc2-lb"))).then_some(())
        })
        .await;
        let r = call(
            env.harvester(),
            Method::GET,
            &format!("{LBS}/{NS}/gc2-lb"),
            None,
        )
        .await;
        assert_eq!(r.status, StatusCode::OK);
    }

    /// LoadBalancers of this cluster's name that it did not make are left alone: one another guest
    /// cluster of the same name made in the same namespace (it records another identity), and one
    /// upstream's cloud provider made for a Service this cluster lacks; one upstream's cloud
    /// provider made for a Service this cluster has (the name made from its UID proves it) is
    /// adopted. Only what this cluster made is collected.
    pub async fn foreign_load_balancers_are_left_alone<E: GuestEnv>(env: E) {
        create_pool(
            &env,
            "p1",
            ("10.75.0.0/24", "10.75.0.10", "10.75.0.30"),
            global(),
        )
        .await;
        let me = env.identity().await;
        env.put(mk_svc("default", "web", &[("TCP", 80)], &[]))
            .await
            .expect("accepted");
        let (web, _) = address(&env, "default", "web").await;
        let web_lb = lb_of(&env, &web).await.expect("exists");
        assert_eq!(
            web_lb["metadata"]["annotations"]["cloudprovider.harvesterhci.io/clusterID"],
            json!(me),
            "the cluster records itself"
        );
        let web_uid = lb_uid(&env, &lb_name(&web)).await;
        // A Service not yet of type LoadBalancer, whose load balancer upstream's cloud provider
        // made (under the name its UID gives, recording no maker).
        let mut legacy = mk_svc("default", "legacy", &[("TCP", 81)], &[]);
        legacy["spec"]["type"] = json!("ClusterIP");
        let legacy = env.put(legacy).await.expect("accepted");
        let legacy_lb = lb_name(&legacy);
        let adoptee = hand_made_lb(&env, &legacy_lb, "legacy", None).await;
        // Another guest cluster's, named for this cluster's web Service; and upstream's for a
        // Service this cluster does not have.
        let foreign = hand_made_lb(
            &env,
            "gc1-default-web-0badf00d",
            "web",
            Some("another-cluster"),
        )
        .await;
        let orphan = hand_made_lb(&env, "gc1-default-gone-0badf00d", "gone", None).await;
        collector_caught_up(&env, &me, "gc1-default-ghost-0badf00d").await;
        assert_eq!(lb_uid(&env, "gc1-default-web-0badf00d").await, foreign);
        assert_eq!(lb_uid(&env, "gc1-default-gone-0badf00d").await, orphan);
        assert_eq!(lb_uid(&env, &lb_name(&web)).await, web_uid);
        assert_eq!(lb_uid(&env, &legacy_lb).await, adoptee);

        // The Service becomes a load balancer: it takes the one upstream made as its own.
        let mut legacy = mk_svc("default", "legacy", &[("TCP", 81)], &[]);
        legacy["metadata"]["annotations"] = json!({"cloudprovider.harvesterhci.io/ipam": "dhcp"});
        env.put(legacy).await.expect("accepted");
        let (legacy, ip) = address(&env, "default", "legacy").await;
        assert_eq!(ip, "0.0.0.0");
        assert_eq!(lb_name(&legacy), legacy_lb);
        let adopted = lb_of(&env, &legacy).await.expect("exists");
        assert_eq!(
            adopted["metadata"]["uid"],
            json!(adoptee),
            "adopted, not made again"
        );
        assert_eq!(
            adopted["metadata"]["annotations"]["cloudprovider.harvesterhci.io/clusterID"],
            json!(me)
        );
        // Its own now: collected once its Service goes behind the reconciler's back.
        env.force_delete("default", "legacy").await;
        lb_gone(&env, &legacy_lb).await;
        collector_caught_up(&env, &me, "gc1-default-ghost2-0badf00d").await;
        assert_eq!(lb_uid(&env, "gc1-default-web-0badf00d").await, foreign);
        assert_eq!(lb_uid(&env, "gc1-default-gone-0badf00d").await, orphan);
    }
}

// --- Embedded only: the HTTP API itself -----------------------------------------------------------

mod embedded_http {
    use super::*;

    /// PUT creates (201, a new UID) or replaces (200); stale versions and other UIDs conflict;
    /// names are checked; the list is a ServiceList; a Service without a load balancer is deleted
    /// at once; an unknown cluster is a 404; every route needs the admin token.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn services_have_kubernetes_semantics() {
        let env = EmbeddedEnv::start().await;
        let b = &env.b;
        let mut svc = mk_svc("default", "internal", &[("TCP", 80)], &[]);
        svc["spec"]["type"] = json!("ClusterIP");
        let path = services_path("default", "internal");
        let created = ok(
            call(b, Method::PUT, &path, Some(svc.clone())).await,
            StatusCode::CREATED,
        );
        assert_eq!(created["apiVersion"], "v1");
        assert_eq!(created["kind"], "Service");
        let uid = created["metadata"]["uid"]
            .as_str()
            .expect("a UID")
            .to_string();
        let rv = created["metadata"]["resourceVersion"].clone();
        svc["metadata"]["labels"] = json!({"app": "x"});
        let replaced = ok(
            call(b, Method::PUT, &path, Some(svc.clone())).await,
            StatusCode::OK,
        );
        assert_eq!(replaced["metadata"]["uid"], uid.as_str());
        assert_eq!(replaced["metadata"]["labels"]["app"], "x");
        let mut stale = svc.clone();
        stale["metadata"]["resourceVersion"] = rv;
        call(b, Method::PUT, &path, Some(stale))
            .await
            .error(StatusCode::CONFLICT, "Conflict");
        let mut other = svc.clone();
        other["metadata"]["uid"] = json!("0a0b0c0d-0000-0000-0000-000000000000");
        call(b, Method::PUT, &path, Some(other))
            .await
            .error(StatusCode::CONFLICT, "Conflict");
        let mut renamed = svc.clone();
        renamed["metadata"]["name"] = json!("other");
        assert_eq!(
            call(b, Method::PUT, &path, Some(renamed))
                .await
                .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent"),
            "the name of the service (other) does not match the name on the URL (internal)"
        );
        let bad = format!("/v1/harvester/guestclusters/{NS}/Bad_Cluster/services/default/x");
        assert!(
            call(b, Method::GET, &bad, None)
                .await
                .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent")
                .starts_with("invalid guest cluster name \"Bad_Cluster\"")
        );
        call(b, Method::GET, &services_path("default", "nope"), None)
            .await
            .error(StatusCode::NOT_FOUND, "NotFound");
        let list = ok(
            call(
                b,
                Method::GET,
                &format!("/v1/harvester/guestclusters/{NS}/{CLUSTER}/services"),
                None,
            )
            .await,
            StatusCode::OK,
        );
        assert_eq!(list["kind"], "ServiceList");
        assert_eq!(list["items"][0]["metadata"]["name"], "internal");
        let empty = ok(
            call(
                b,
                Method::GET,
                &format!("/v1/harvester/guestclusters/{NS}/other/services"),
                None,
            )
            .await,
            StatusCode::OK,
        );
        assert_eq!(empty["items"], json!([]));
        let deleted = ok(call(b, Method::DELETE, &path, None).await, StatusCode::OK);
        assert_eq!(deleted["metadata"]["uid"], uid.as_str());
        call(b, Method::DELETE, &path, None)
            .await
            .error(StatusCode::NOT_FOUND, "NotFound");
        call(
            b,
            Method::DELETE,
            &format!("/v1/harvester/guestclusters/{NS}/{CLUSTER}"),
            None,
        )
        .await
        .error(StatusCode::NOT_FOUND, "NotFound");
        let r = b.call(Method::GET, &path, None, Body::empty()).await;
        r.error(StatusCode::UNAUTHORIZED, "Unauthorized");
    }

    /// A Service of type LoadBalancer deleted over HTTP is marked (202) until its load balancer is
    /// released.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deleting_a_load_balancer_service_waits_for_the_release() {
        let env = EmbeddedEnv::start().await;
        create_pool(
            &env,
            "p1",
            ("10.80.0.0/24", "10.80.0.10", "10.80.0.20"),
            global(),
        )
        .await;
        env.put(mk_svc("default", "web", &[("TCP", 80)], &[]))
            .await
            .expect("accepted");
        let (svc, _) = address(&env, "default", "web").await;
        assert_eq!(svc["metadata"]["finalizers"], json!([reconcile::FINALIZER]));
        let r = call(
            &env.b,
            Method::DELETE,
            &services_path("default", "web"),
            None,
        )
        .await;
        let marked = ok(r, StatusCode::ACCEPTED);
        assert!(marked["metadata"]["deletionTimestamp"].is_string());
        service_gone(&env, "default", "web").await;
        lb_gone(&env, &lb_name(&svc)).await;
    }

    /// A guest cluster's Events over HTTP: what the reconciler said about its Services, oldest
    /// first, as an EventList; the admin token is needed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn events_are_listed() {
        let env = EmbeddedEnv::start().await;
        let events_path = format!("/v1/harvester/guestclusters/{NS}/{CLUSTER}/events");
        let list = ok(
            call(&env.b, Method::GET, &events_path, None).await,
            StatusCode::OK,
        );
        assert_eq!(list["kind"], "EventList");
        assert_eq!(
            list["items"],
            json!([]),
            "a cluster without Services has none"
        );
        create_pool(
            &env,
            "p1",
            ("10.92.0.0/24", "10.92.0.10", "10.92.0.20"),
            global(),
        )
        .await;
        env.put(mk_svc("default", "web", &[("TCP", 80)], &[]))
            .await
            .expect("accepted");
        let (svc, ip) = address(&env, "default", "web").await;
        env.delete("default", "web").await;
        service_gone(&env, "default", "web").await;
        let ensured = format!(
            "Ensured load balancer {NS}/{} with address {ip}",
            lb_name(&svc)
        );
        let items = eventually("both events over HTTP", async || {
            let list = ok(
                call(&env.b, Method::GET, &events_path, None).await,
                StatusCode::OK,
            );
            // Under load the reconciler may first find no pool in its cache (and say so): only
            // these two are asserted.
            let items: Vec<Value> = list["items"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|e| e["reason"] != reconcile::reason::SYNC_FAILED)
                .collect();
            let reasons: Vec<&str> = items.iter().filter_map(|e| e["reason"].as_str()).collect();
            (reasons == [reconcile::reason::ENSURED, reconcile::reason::DELETED]).then_some(items)
        })
        .await;
        let first = &items[0];
        assert_eq!(first["apiVersion"], "v1");
        assert_eq!(first["kind"], "Event");
        assert_eq!(first["type"], "Normal");
        assert_eq!(first["message"], ensured.as_str());
        assert_eq!(first["involvedObject"]["kind"], "Service");
        assert_eq!(first["involvedObject"]["namespace"], "default");
        assert_eq!(first["involvedObject"]["name"], "web");
        assert_eq!(first["involvedObject"]["uid"], svc["metadata"]["uid"]);

        let anonymous = env
            .b
            .call(Method::GET, &events_path, None, Body::empty())
            .await;
        assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
        let bad = call(
            &env.b,
            Method::GET,
            &format!("/v1/harvester/guestclusters/{NS}/Not_A_Name/events"),
            None,
        )
        .await;
        assert_eq!(
            bad.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{}",
            bad.text()
        );
    }

    /// A guest cluster's reconciler runs from its first Service until the cluster has nothing left:
    /// once the cluster is deleted it stops, and nothing of the cluster is written again (its NAD
    /// mapping stays gone when its VMIs change); a new Service starts it again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deleted_cluster_s_reconciler_stops() {
        let env = EmbeddedEnv::start().await;
        let running = || {
            harvester_cloud::metrics::sample(
                &harvester_cloud::metrics::encode(),
                "harvester_cloud_guest_clusters",
            )
            .unwrap_or(0.0)
        };
        let dhcp = |name: &str| {
            mk_svc(
                "default",
                name,
                &[("TCP", 80)],
                &[("cloudprovider.harvesterhci.io/ipam", "dhcp")],
            )
        };
        env.put(dhcp("one")).await.expect("accepted");
        address(&env, "default", "one").await;
        assert_eq!(running(), 1.0);
        let vmis = support::vmi_api(env.b.store());
        let vmi: VirtualMachineInstance = serde_json::from_value(
            support::foreign::vmi("node-a")
                .namespace(NS)
                .label("guestcluster.harvesterhci.io/name", CLUSTER)
                .multus("nic-1", "default/vlan10", &[], Some("enp2s0"))
                .build(),
        )
        .expect("vmi");
        support::create_vmi(env.b.store(), &vmi).await;
        eventually("the NAD mapping", async || env.nad_mapping().await).await;

        let r = call(
            &env.b,
            Method::DELETE,
            &format!("/v1/harvester/guestclusters/{NS}/{CLUSTER}"),
            None,
        )
        .await;
        ok(r, StatusCode::OK);
        eventually("the reconciler to stop", async || {
            (running() == 0.0).then_some(())
        })
        .await;
        assert!(
            env.nad_mapping().await.is_none(),
            "deleted with the cluster"
        );
        let mut vmi = vmis
            .get(NS, "node-a")
            .await
            .expect("reads")
            .expect("exists");
        vmi.rest["status"]["interfaces"][0]["interfaceName"] = json!("enp3s0");
        vmis.replace(&vmi).await.expect("updates");
        // No reconciler of the cluster exists any more to write it (the gauge counts finished ones
        // out only once they have ended).
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(env.nad_mapping().await.is_none(), "not written again");

        env.put(dhcp("two")).await.expect("accepted");
        address(&env, "default", "two").await;
        assert_eq!(running(), 1.0);
        eventually("the NAD mapping of the cluster's new life", async || {
            env.nad_mapping().await
        })
        .await;
    }

    /// The Kubernetes backend keeps no guest clusters: they run `harvester-cloud ccm`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_kubernetes_backend_points_to_the_ccm() {
        let b = KubeBackend::start().await;
        let message = call(&b, Method::GET, &services_path("default", "web"), None)
            .await
            .error(StatusCode::NOT_FOUND, "NotFound");
        assert!(message.contains("harvester-cloud ccm"), "{message}");
    }
}

// --- Kube only: the ccm with Harvester's cloud-provider role ----------------------------------------

mod kube_only {
    use super::*;

    /// A DHCP lease the guest's kube-vip reports cannot be written to the LoadBalancer's status with
    /// Harvester's `harvesterhci.io:cloudprovider` role where the CRD has a status subresource (the
    /// role has no `loadbalancers/status`): the ccm skips it and keeps serving.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_is_not_reported_without_the_status_permission() {
        lease_reported(true).await;
    }

    /// On Harvester's own CRDs (no status subresource) the status is part of the LoadBalancer, which
    /// the role allows: the lease is reported.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_is_reported_on_harvester_s_crds() {
        lease_reported(false).await;
    }

    async fn lease_reported(status_subresource: bool) {
        let env = KubeEnv::start().await;
        support::kube_env::install_lb_crds(&env.b.client, status_subresource).await;
        create_pool(
            &env,
            "p1",
            ("10.90.0.0/24", "10.90.0.10", "10.90.0.20"),
            global(),
        )
        .await;
        env.put(mk_svc(
            "default",
            "leased",
            &[("TCP", 80)],
            &[("cloudprovider.harvesterhci.io/ipam", "dhcp")],
        ))
        .await
        .expect("accepted");
        let (svc, _) = address(&env, "default", "leased").await;
        // kube-vip got a lease and reports it.
        let api = env.services("default");
        let mut current = api.get("leased").await.expect("reads");
        current.status = Some(
            serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "192.168.50.7"}]}}))
                .expect("status"),
        );
        api.replace_status("leased", &PostParams::default(), &current)
            .await
            .expect("kube-vip writes the status");
        if !status_subresource {
            let lb = eventually("the lease reported on the LoadBalancer", async || {
                let lb = lb_of(&env, &svc).await?;
                (lb["status"]["address"] == "192.168.50.7").then_some(lb)
            })
            .await;
            // Its allocation is the pool's business: DHCP has none.
            assert_eq!(lb["spec"]["ipam"], "dhcp");
            return;
        }
        // The ccm tries (as the cloud-config's service account) and is refused.
        let status_path = format!(
            "/apis/loadbalancer.harvesterhci.io/v1beta1/namespaces/{NS}/loadbalancers/{}/status",
            lb_name(&svc)
        );
        // The Harvester API server's audit log has the attempt.
        eventually("the ccm to try to report the lease", async || {
            env.b
                .cp
                .audit()
                .iter()
                .any(|r| {
                    r.verb == "update"
                        && r.uri.split('?').next() == Some(status_path.as_str())
                        && r.user == format!("system:serviceaccount:{NS}:{CLUSTER}")
                })
                .then_some(())
        })
        .await;
        // The ccm goes on serving others.
        env.put(mk_svc("default", "web", &[("TCP", 80)], &[]))
            .await
            .expect("accepted");
        address(&env, "default", "web").await;
        let lb = lb_of(&env, &svc).await.expect("exists");
        assert_eq!(
            lb["status"]["address"],
            Value::Null,
            "not reported without loadbalancers/status"
        );
        let leased = env.get("default", "leased").await.expect("exists");
        assert_eq!(
            annotation(&leased, "kube-vip.io/loadbalancerIPs"),
            Some("0.0.0.0")
        );
        assert_eq!(
            ingress(&leased),
            Some("192.168.50.7"),
            "kube-vip's report stays"
        );
        assert!(
            env.events("default", "leased")
                .await
                .iter()
                .all(|(r, _)| r != reconcile::reason::SYNC_FAILED),
            "not a failure of the service"
        );
    }

    /// Two guest clusters with the same `--cluster-name`, whose cloud-configs put their
    /// LoadBalancers in the same Harvester namespace (two guest control planes, two ccms): each
    /// records its own identity and collects only what it made, so neither deletes the other's,
    /// even for a Service the other lacks or has under the same name with another UID.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_guest_clusters_share_a_name_and_a_namespace() {
        let mut planes = support::control_plane::ControlPlane::lease_many(3).await;
        let guest_b = planes.pop().expect("three");
        let guest_a = planes.pop().expect("three");
        let harvester = planes.pop().expect("three");
        let mut env = KubeEnv::on(harvester, guest_a).await;
        let kubeconfig = ccm_guest_kubeconfig(&env.guest).await;
        std::fs::write(env.dir.path().join("guest.kubeconfig"), kubeconfig).expect("writes");
        env.start_ccm();
        // The second guest cluster: the same cloud-config and cluster name, its own ccm.
        let dir_b = tempfile::tempdir().expect("tempdir");
        std::fs::copy(
            env.dir.path().join("cloud-config"),
            dir_b.path().join("cloud-config"),
        )
        .expect("copies");
        std::fs::write(
            dir_b.path().join("guest.kubeconfig"),
            ccm_guest_kubeconfig(&guest_b).await,
        )
        .expect("writes");
        let args_b = ccm_args(dir_b.path());
        let ccm_b = Task::spawn(|stop| async move {
            harvester_cloud::cli::ccm::run(&args_b, stop)
                .await
                .expect("the ccm runs");
        });
        let mut probes = support::Refusals::refusal_probes(&env);
        probes.push(guest_b.refusal_probe(&[CCM_USER]));
        let (id_a, id_b) = (
            namespace_uid(&env.guest_client).await,
            namespace_uid(&guest_b.admin).await,
        );
        assert_ne!(id_a, id_b);
        create_pool(
            &env,
            "p1",
            ("10.76.0.0/24", "10.76.0.10", "10.76.0.30"),
            global(),
        )
        .await;
        let services_b: ::kube::Api<Service> =
            ::kube::Api::namespaced(guest_b.admin.clone(), "default");
        let put_b = async |name: &str| {
            let svc: Service = serde_json::from_value(mk_svc("default", name, &[("TCP", 80)], &[]))
                .expect("a Service");
            services_b
                .create(&PostParams::default(), &svc)
                .await
                .expect("creates");
        };
        let address_b = async |name: &str| -> Value {
            eventually(
                &format!("B's service {name} to get its address"),
                async || {
                    let svc = services_b.get_opt(name).await.expect("reads")?;
                    let svc = serde_json::to_value(svc).expect("encodes");
                    let ip = annotation(&svc, "kube-vip.io/loadbalancerIPs")?;
                    (ingress(&svc) == Some(ip)).then_some(svc.clone())
                },
            )
            .await
        };
        // A and B both have default/web (other UIDs, so other LoadBalancer names); each also has a
        // Service the other lacks.
        for name in ["web", "only-a"] {
            env.put(mk_svc("default", name, &[("TCP", 80)], &[]))
                .await
                .expect("accepted");
        }
        put_b("web").await;
        put_b("only-b").await;
        let mut lbs = BTreeMap::new();
        for name in ["web", "only-a"] {
            let (svc, _) = address(&env, "default", name).await;
            lbs.insert(format!("a/{name}"), (lb_name(&svc), id_a.clone()));
        }
        for name in ["web", "only-b"] {
            let svc = address_b(name).await;
            lbs.insert(format!("b/{name}"), (lb_name(&svc), id_b.clone()));
        }
        let mut uids = BTreeMap::new();
        for (key, (lb, maker)) in &lbs {
            let found = lb_of_name(&env, lb).await.expect("exists");
            assert_eq!(
                found["metadata"]["annotations"]["cloudprovider.harvesterhci.io/clusterID"],
                json!(maker),
                "{key} records its maker"
            );
            uids.insert(key.clone(), lb_uid(&env, lb).await);
        }
        // Both collectors have judged every LoadBalancer of the other's.
        collector_caught_up(&env, &id_a, "gc1-default-ghost-a-0badf00d").await;
        collector_caught_up(&env, &id_b, "gc1-default-ghost-b-0badf00d").await;
        for (key, (lb, _)) in &lbs {
            assert_eq!(lb_uid(&env, lb).await, uids[key], "{key} is left alone");
        }
        // A's web goes: its LoadBalancer goes, B's web keeps its own.
        env.delete("default", "web").await;
        lb_gone(&env, &lbs["a/web"].0).await;
        services_b
            .delete("only-b", &DeleteParams::default())
            .await
            .expect("deletes");
        lb_gone(&env, &lbs["b/only-b"].0).await;
        collector_caught_up(&env, &id_a, "gc1-default-ghost-a2-0badf00d").await;
        collector_caught_up(&env, &id_b, "gc1-default-ghost-b2-0badf00d").await;
        for key in ["a/only-a", "b/web"] {
            assert_eq!(
                lb_uid(&env, &lbs[key].0).await,
                uids[key],
                "{key} is left alone"
            );
        }
        ccm_b.stop().await;
        for probe in probes {
            probe.assert_none_refused();
        }
    }

    /// The `ccm` binary: warns about the default cluster name, serves (and its metrics say it
    /// leads and reconciles), and on SIGTERM stops cleanly and gives its Lease up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_binary_warns_serves_and_stops_on_sigterm() {
        let env = KubeEnv::without_ccm().await;
        create_pool(
            &env,
            "p1",
            ("10.91.0.0/24", "10.91.0.10", "10.91.0.20"),
            global(),
        )
        .await;
        let log = env.dir.path().join("ccm.log");
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_harvester-cloud"))
            .args([
                "--log-format",
                "json",
                "ccm",
                "--cluster-name",
                "kubernetes",
                "--metrics-listen",
                "127.0.0.1:0",
                "--cloud-config",
            ])
            .arg(env.dir.path().join("cloud-config"))
            .arg("--kubeconfig")
            .arg(env.dir.path().join("guest.kubeconfig"))
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("starts the binary");
        env.put(mk_svc("default", "web", &[("TCP", 80)], &[]))
            .await
            .expect("accepted");
        let (svc, _) = address(&env, "default", "web").await;
        let lb = call(
            env.harvester(),
            Method::GET,
            &format!(
                "{LBS}/{NS}/{}",
                load_balancer_name(
                    "kubernetes",
                    "default",
                    "web",
                    svc["metadata"]["uid"].as_str().expect("uid")
                )
            ),
            None,
        )
        .await;
        assert_eq!(lb.status, StatusCode::OK, "named after --cluster-name");
        let metrics_url = eventually("the ccm to log its metrics address", async || {
            std::fs::read_to_string(&log)
                .ok()?
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|v| v["message"] == "serving metrics")
                .and_then(|v| v["url"].as_str().map(String::from))
        })
        .await;
        let text = reqwest::get(&metrics_url)
            .await
            .expect("scrapes")
            .text()
            .await
            .expect("reads");
        let sample = |name: &str| harvester_cloud::metrics::sample(&text, name);
        assert_eq!(sample("harvester_cloud_leader"), Some(1.0), "{text}");
        assert!(
            sample(
                r#"harvester_cloud_reconcile_duration_seconds_count{controller="guestservice"}"#
            )
            .is_some_and(|n| n >= 1.0),
            "{text}"
        );
        let pid = child.id().to_string();
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        let status = tokio::task::spawn_blocking(move || child.wait())
            .await
            .expect("joins")
            .expect("waits");
        let text = std::fs::read_to_string(&log).expect("reads the log");
        assert!(status.success(), "exit after SIGTERM: {status}\n{text}");
        assert!(
            text.contains(harvester_cloud::cli::ccm::CLUSTER_NAME_WARNING),
            "{text}"
        );
        let leases: ::kube::Api<k8s_openapi::api::coordination::v1::Lease> =
            ::kube::Api::namespaced(env.guest_client.clone(), "kube-system");
        let lease = leases
            .get("harvester-cloud-ccm")
            .await
            .expect("the ccm's Lease");
        assert_eq!(
            lease.spec.and_then(|s| s.holder_identity),
            None,
            "given up on SIGTERM"
        );
    }
}

suite!(
    [embedded => EmbeddedEnv::start(), kube => KubeEnv::start()],
    [
        pool_and_dhcp_services_get_addresses,
        network_resolution_order,
        nad_mapping_follows_the_vmis,
        share_ip,
        secondaries_are_checked_like_primaries,
        secondary_made_with_its_primary,
        network_and_ipam_changes_are_refused,
        service_deletion_releases,
        uid_change_does_not_leak,
        guest_cluster_deletion,
        foreign_load_balancers_are_left_alone,
        requested_addresses,
        dual_stack_services,
    ]
);
