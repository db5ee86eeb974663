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
//!
//! The cases live in `cases/`, one module per topic; `embedded_http` and `kube_only` hold what
//! runs on one environment only. The guest reconcile itself, one outcome at a time, is
//! tests/reconcilers'.

#[path = "../support/mod.rs"]
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
use support::{
    Backend, EmbeddedBackend, KubeBackend, Task, call, eventually,
    lb::{LBS, POOLS, Reconcilers, create_pool, global, mk_pool, range},
    ok,
};

/// The Harvester namespace of the guest cluster's cloud-config, and the guest cluster.
const NS: &str = "gc-test";
const CLUSTER: &str = "gc1";
/// The user the ccm of `deploy/ccm` runs as in the guest cluster.
const CCM_USER: &str = "system:serviceaccount:kube-system:harvester-cloud-ccm";
/// How long the LoadBalancer of a deleted DHCP Service is kept for its lease record (short, so the
/// cases see it go).
const RETENTION: Duration = Duration::from_secs(4);

/// Harvester's load balancer reconcilers on a store.
fn lb_reconcilers(store: Arc<dyn ObjectStore>) -> Reconcilers {
    Reconcilers::start_with(
        store,
        lb::Settings {
            concurrency: 64,
            ..support::lb::settings()
        },
    )
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
    /// Plays the guest's kube-vip v1.2.3 once it holds a DHCP lease of `ip` on `mac`
    /// (pkg/services/services.go, `updateStatus`): one update of the Service with
    /// `kube-vip.io/vipHost`, `kube-vip.io/hwaddr` and `kube-vip.io/requestedIP`, then its status.
    async fn kube_vip_leases(&self, ns: &str, name: &str, mac: &str, ip: &str);
}

/// What kube-vip v1.2.3 writes on a Service once it holds a lease of `ip` on `mac`.
fn kube_vip_lease(svc: &mut Service, mac: &str, ip: &str) {
    let a = svc.metadata.annotations.get_or_insert_default();
    // ARP mode (Harvester's guest chart: vip_arp "true"): the node announcing the address.
    a.insert("kube-vip.io/vipHost".into(), "guest-cp-1".into());
    a.insert("kube-vip.io/hwaddr".into(), mac.into());
    a.insert("kube-vip.io/requestedIP".into(), ip.into());
}

/// The status kube-vip v1.2.3 writes with a lease of `ip` (the ports of the Service's).
fn kube_vip_status(svc: &mut Service, ip: &str) {
    let ports: Vec<Value> = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .map(|p| {
            p.iter()
                .map(|p| json!({"port": p.port, "protocol": p.protocol}))
                .collect()
        })
        .unwrap_or_default();
    svc.status = Some(
        serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": ip, "ports": ports}]}}))
            .expect("status"),
    );
}

// --- Embedded: guest Services over HTTP ------------------------------------------------------------

struct EmbeddedEnv {
    b: EmbeddedBackend,
    _lb: Reconcilers,
    _guests: Task,
}

fn services_path(ns: &str, name: &str) -> String {
    format!("/v1/harvester/guestclusters/{NS}/{CLUSTER}/services/{ns}/{name}")
}

impl EmbeddedEnv {
    async fn start() -> Self {
        support::init_logging();
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
                    dhcp_record_retention: RETENTION,
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

    async fn kube_vip_leases(&self, ns: &str, name: &str, mac: &str, ip: &str) {
        let api = Api::<Service>::new(self.cluster_store());
        let mut svc = eventually("kube-vip's update to go through", async || {
            let mut svc = api.get(ns, name).await.expect("reads")?;
            kube_vip_lease(&mut svc, mac, ip);
            api.replace(&svc).await.ok()
        })
        .await;
        kube_vip_status(&mut svc, ip);
        api.replace_status(&svc).await.expect("writes the status");
    }
}

// --- Kube: the ccm between two real control planes ---------------------------------------------------

struct KubeEnv {
    b: KubeBackend,
    _lb: Reconcilers,
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
        "--dhcp-record-retention".into(),
        format!("{}s", RETENTION.as_secs()),
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
        support::init_logging();
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

    async fn kube_vip_leases(&self, ns: &str, name: &str, mac: &str, ip: &str) {
        let api = self.services(ns);
        let mut svc = eventually("kube-vip's update to go through", async || {
            let mut svc = api.get(name).await.expect("reads");
            kube_vip_lease(&mut svc, mac, ip);
            api.replace(name, &PostParams::default(), &svc).await.ok()
        })
        .await;
        kube_vip_status(&mut svc, ip);
        api.replace_status(name, &PostParams::default(), &svc)
            .await
            .expect("writes the status");
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

// --- Cases -------------------------------------------------------------------------------------

mod cases;

// --- Embedded only: the HTTP API itself -----------------------------------------------------------

mod embedded_http;

// --- Kube only: the ccm with Harvester's cloud-provider role ----------------------------------------

mod kube_only;

suite!(
    [embedded => EmbeddedEnv::start(), kube => KubeEnv::start()],
    [
        pool_and_dhcp_services_get_addresses,
        network_resolution_order,
        nad_mapping_follows_the_vmis,
        share_ip,
        secondaries_are_checked_like_primaries,
        secondary_made_with_its_primary,
        share_by_key,
        sharing_key_changes,
        network_and_ipam_changes_are_refused,
        service_deletion_releases,
        uid_change_does_not_leak,
        guest_cluster_deletion,
        foreign_load_balancers_are_left_alone,
        requested_addresses,
        dual_stack_services,
        service_labels_choose_the_pool,
        dhcp_leases_survive_recreation,
        dhcp_lease_values_are_checked,
    ]
);
