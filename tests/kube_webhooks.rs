//! The service's admission webhooks as kube-apiserver calls them: a real control plane with the very
//! webhook configurations the chart ships (`deploy/manifests/harvester-cloud.yaml`, its `service`
//! reference turned into a `url` of the running binary on loopback), and the binary serves them as
//! the chart runs it (`serve --backend kube` with the chart's RBAC, a certificate for
//! `harvester-cloud.harvester-system.svc` and the loopback address). So what a Harvester user does with `kubectl` or
//! any client is admitted, refused or defaulted end to end: upstream's messages for refusals, the
//! mutator's labels and annotations (findNetwork's VMI step included) on what is stored.

#[macro_use]
mod support;

use support::{
    binary::{BIN, Server},
    eventually,
    lb::{global, mk_pool},
};

use std::{path::Path, process::Command};

use base64::Engine;
use kube::{
    Api, Client,
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
        TypeMeta,
    },
};
use serde_json::{Value, json};

const NS: &str = "gc-test";

/// The binary, serving the Kubernetes backend, and the address it listens on.
/// `client_ca`: answer admission reviews only for clients with a certificate it signed.
fn start_service(dir: &Path, client_ca: &Path) -> (Server, std::net::SocketAddr) {
    let mut cmd = Command::new(BIN);
    cmd.arg("--data-dir")
        .arg(dir.join("data"))
        .args(["--log-format", "json", "serve", "--backend", "kube"])
        .arg("--kubeconfig")
        .arg(dir.join("service.kubeconfig"))
        .arg("--tls-cert")
        .arg(dir.join("tls/tls.crt"))
        .arg("--tls-key")
        .arg(dir.join("tls/tls.key"))
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--leader-elect=false"])
        .arg("--webhook-client-ca")
        .arg(client_ca);
    let server = Server::spawn(cmd);
    let addr = server.addr.parse().expect("an address");
    (server, addr)
}

fn api(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).expect("an object")
}

/// The message of a refused write.
fn refusal(result: Result<DynamicObject, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(e)) => (e.code, e.message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Harvester, the service and the shipped webhook configurations.
struct Env {
    client: Client,
    addr: std::net::SocketAddr,
    tls_ca: Vec<u8>,
    cp: support::control_plane::ControlPlane,
    service: Option<Server>,
    _dir: tempfile::TempDir,
}

impl Env {
    async fn start() -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let cp = support::control_plane::ControlPlane::lease().await;
        let client = cp.admin.clone();
        support::kube_env::set_vip(&client, "10.0.0.1").await;
        // The lease's seed makes the namespaces a Harvester cluster has, `gc-test` among them.
        std::fs::write(
            dir.path().join("service.kubeconfig"),
            support::kube_env::service_kubeconfig(&cp).await,
        )
        .expect("writes");

        // A certificate for the Service name the webhook configurations use, as the chart makes.
        std::fs::create_dir_all(dir.path().join("tls")).expect("mkdir");
        let tls = harvester_cloud::certs::ensure_self_signed(
            &dir.path().join("tls"),
            &[
                "harvester-cloud.harvester-system.svc".to_string(),
                "127.0.0.1".to_string(),
            ],
        )
        .expect("a certificate");
        // The control plane presents a client certificate of its CA to webhooks (its
        // WebhookAdmissionConfiguration); the service answers no one else.
        let (service, addr) = start_service(dir.path(), &cp.dir.join("pki/ca.crt"));

        // The shipped configurations, with the CA the chart would put in `caBundle`.
        let manifest = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/deploy/manifests/harvester-cloud.yaml"
        ))
        .expect("reads the manifest");
        let ca_bundle = base64::engine::general_purpose::STANDARD.encode(&tls.ca_pem);
        let mut registered = 0;
        for doc in yaml_serde::Deserializer::from_str(&manifest) {
            let mut obj: DynamicObject = serde::Deserialize::deserialize(doc).expect("an object");
            let TypeMeta { api_version, kind } = obj.types.clone().expect("typed");
            if !kind.ends_with("WebhookConfiguration") {
                continue;
            }
            for webhook in obj.data["webhooks"].as_array_mut().expect("webhooks") {
                // The Service the chart names is not reachable from a control plane without
                // nodes: the same path on the binary's loopback address.
                let service = &webhook["clientConfig"]["service"];
                assert_eq!(service["name"], "harvester-cloud", "{webhook}");
                let path = service["path"].as_str().expect("a path").to_string();
                webhook["clientConfig"] = json!({
                    "url": format!("https://{addr}{path}"),
                    "caBundle": ca_bundle,
                });
            }
            api(&client, &api_version, &kind, None)
                .create(&PostParams::default(), &obj)
                .await
                .unwrap_or_else(|e| panic!("registers the {kind}: {e}"));
            registered += 1;
        }
        assert_eq!(
            registered, 2,
            "the mutating and the validating configuration"
        );
        Env {
            client,
            addr,
            tls_ca: tls.ca_pem.clone(),
            cp,
            service: Some(service),
            _dir: dir,
        }
    }

    fn pools(&self) -> Api<DynamicObject> {
        api(
            &self.client,
            "loadbalancer.harvesterhci.io/v1beta1",
            "IPPool",
            None,
        )
    }

    fn lbs(&self) -> Api<DynamicObject> {
        api(
            &self.client,
            "loadbalancer.harvesterhci.io/v1beta1",
            "LoadBalancer",
            Some(NS),
        )
    }
}

fn pool(name: &str, subnet: &str, selector: Value) -> DynamicObject {
    object(mk_pool(name, json!([{ "subnet": subnet }]), selector))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_the_api_server_are_admitted_by_the_service() {
    let env = Env::start().await;
    let pools = env.pools();

    // The mutator labels a global pool; what is stored carries it.
    let created = pools
        .create(
            &PostParams::default(),
            &pool("global", "10.50.0.0/24", global()),
        )
        .await
        .expect("a valid pool is admitted");
    assert_eq!(
        created
            .metadata
            .labels
            .unwrap_or_default()
            .get("loadbalancer.harvesterhci.io/global-ip-pool")
            .map(String::as_str),
        Some("true")
    );

    // The validator refuses with upstream's message, in kube-apiserver's words; nothing is stored.
    let (code, message) = refusal(
        pools
            .create(
                &PostParams::default(),
                &pool("second", "10.51.0.0/24", global()),
            )
            .await,
    );
    assert_eq!(code, 400);
    assert_eq!(
        message,
        "admission webhook \"validator.loadbalancer.harvester-cloud.io\" denied the request: can't create IP pool second because there is already a global IP pool: global"
    );
    assert!(pools.get_opt("second").await.expect("reads").is_none());

    // pkg/utils/vid.go (GetVid, called by pkg/webhook/ippool/mutator.go): a network that is not
    // `namespace/name` is refused by the mutator, before any lookup (no such NAD exists either).
    let (code, message) = refusal(
        pools
            .create(
                &PostParams::default(),
                &pool(
                    "netless",
                    "10.52.0.0/24",
                    json!({"network": "vlan10", "scope": [{"project": "*", "namespace": "n", "guestCluster": "*"}]}),
                ),
            )
            .await,
    );
    assert_eq!(code, 400);
    assert_eq!(
        message,
        "admission webhook \"mutator.loadbalancer.harvester-cloud.io\" denied the request: can't create IP pool netless because invalid network vlan10"
    );
    assert!(pools.get_opt("netless").await.expect("reads").is_none());

    // findNetwork on a LoadBalancer of a guest cluster without a network: a VMI of the cluster
    // gives it (step 4 of the reference).
    let vmis = api(
        &env.client,
        "kubevirt.io/v1",
        "VirtualMachineInstance",
        Some(NS),
    );
    vmis.create(
        &PostParams::default(),
        &object(
            support::foreign::vmi("node-a")
                .namespace(NS)
                .label("guestcluster.harvesterhci.io/name", "gc1")
                .pod_network(&[], None)
                .multus("nic-1", "default/vlan10", &[], None)
                .build(),
        ),
    )
    .await
    .expect("creates the VMI");
    let lbs = env.lbs();
    let lb = lbs
        .create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
                "metadata": {"name": "gc1-web", "namespace": NS,
                    "annotations": {"loadbalancer.harvesterhci.io/cluster": "gc1"}},
                "spec": {"workloadType": "cluster", "ipam": "pool"}
            })),
        )
        .await
        .expect("admitted");
    let annotations = lb.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations
            .get("loadbalancer.harvesterhci.io/network")
            .map(String::as_str),
        Some("default/vlan10"),
        "{annotations:?}"
    );
    assert_eq!(
        annotations
            .get("loadbalancer.harvesterhci.io/namespace")
            .map(String::as_str),
        Some(NS)
    );

    // An invalid LoadBalancer is refused by the validator.
    let (code, message) = refusal(
        lbs.create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
                "metadata": {"name": "bad", "namespace": NS},
                "spec": {"workloadType": "vm", "ipam": "pool"}
            })),
        )
        .await,
    );
    assert_eq!(code, 400);
    assert_eq!(
        message,
        format!(
            "admission webhook \"validator.loadbalancer.harvester-cloud.io\" denied the request: create loadbalancer {NS}/bad failed: the loadbalancer needs to have at least one listener"
        )
    );

    // Ours: a DHCP lease record kube-vip could not lease with (the guest would write it back for
    // kube-vip) is refused by the validator the embedded store shares.
    let (code, message) = refusal(
        lbs.create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
                "metadata": {"name": "leased", "namespace": NS, "annotations": {
                    "loadbalancer.harvesterhci.io/cluster": "gc1",
                    "cloudprovider.harvesterhci.io/dhcpMACAddress": "01:00:5e:00:00:01"}},
                "spec": {"workloadType": "cluster", "ipam": "dhcp"}
            })),
        )
        .await,
    );
    assert_eq!(code, 400);
    assert_eq!(
        message,
        format!(
            "admission webhook \"validator.loadbalancer.harvester-cloud.io\" denied the request: create loadbalancer {NS}/leased failed: annotation cloudprovider.harvesterhci.io/dhcpMACAddress is \"01:00:5e:00:00:01\": a multicast MAC address (the low bit of the first octet, 01, is set); the lease needs a unicast address"
        )
    );

    // The service's reconciler gives a plain LoadBalancer an address from the global pool; the pool
    // cannot then be deleted.
    lbs.create(
        &PostParams::default(),
        &object(json!({
            "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
            "metadata": {"name": "plain", "namespace": NS},
            "spec": {"workloadType": "vm", "ipam": "pool",
                "listeners": [{"name": "http", "port": 80, "protocol": "TCP", "backendPort": 8080}]}
        })),
    )
    .await
    .expect("admitted");
    eventually("the load balancer's address", async || {
        let lb = lbs.get("plain").await.ok()?;
        let ip = lb.data["status"]["allocatedAddress"]["ip"]
            .as_str()?
            .to_string();
        ip.starts_with("10.50.0.").then_some(ip)
    })
    .await;
    let (code, message) = match pools.delete("global", &DeleteParams::default()).await {
        Err(kube::Error::Api(e)) => (e.code, e.message),
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(code, 400);
    assert_eq!(
        message,
        "admission webhook \"validator.loadbalancer.harvester-cloud.io\" denied the request: can't delete pool before releasing all the allocated IP"
    );
    assert!(pools.get_opt("global").await.expect("reads").is_some());
}

/// The pool and LoadBalancer annotations only this service reads, as a Harvester user writes them
/// (`kubectl apply`): values that do not read are denied by the webhook in its words, valid ones are
/// stored as written, and the reconciler honours them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_annotations_of_ours_are_judged_by_the_webhook() {
    let env = Env::start().await;
    let pools = env.pools();
    let annotated = |name: &str, annotations: Value| {
        let mut p = mk_pool(
            name,
            json!([{"subnet": "10.53.0.0/16", "rangeStart": "10.53.0.254", "rangeEnd": "10.53.1.1"}]),
            global(),
        );
        p["metadata"]["annotations"] = annotations;
        object(p)
    };
    for (annotations, want) in [
        (
            json!({"loadbalancer.harvesterhci.io/skipAddresses": "yes"}),
            "can't create IP pool bad because annotation loadbalancer.harvesterhci.io/skipAddresses \"yes\" names \"yes\", which is not firstLast (each range's subnet's first and last address) or dot0And255 (every IPv4 address ending in .0 or .255); the value is a comma-separated list of those",
        ),
        (
            json!({"loadbalancer.harvesterhci.io/serviceSelector": "tier in (gold"}),
            "can't create IP pool bad because annotation loadbalancer.harvesterhci.io/serviceSelector \"tier in (gold\" is not a label selector: a set is not closed with ')'",
        ),
    ] {
        let (code, message) = refusal(
            pools
                .create(&PostParams::default(), &annotated("bad", annotations))
                .await,
        );
        assert_eq!(code, 400);
        assert_eq!(
            message,
            format!(
                "admission webhook \"validator.loadbalancer.harvester-cloud.io\" denied the request: {want}"
            )
        );
    }
    assert!(pools.get_opt("bad").await.expect("reads").is_none());

    let stored = pools
        .create(
            &PostParams::default(),
            &annotated(
                "edge",
                json!({"loadbalancer.harvesterhci.io/skipAddresses": "dot0And255",
                       "loadbalancer.harvesterhci.io/serviceSelector": "tier=edge"}),
            ),
        )
        .await
        .expect("valid annotations are admitted");
    assert_eq!(
        stored
            .metadata
            .annotations
            .unwrap_or_default()
            .get("loadbalancer.harvesterhci.io/skipAddresses")
            .map(String::as_str),
        Some("dot0And255")
    );

    let lbs = env.lbs();
    let lb = |name: &str, annotations: Value| {
        object(json!({
            "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
            "metadata": {"name": name, "namespace": NS, "annotations": annotations},
            "spec": {"workloadType": "cluster", "ipam": "pool"}
        }))
    };
    let (code, message) = refusal(
        lbs.create(
            &PostParams::default(),
            &lb(
                "bad",
                json!({"cloudprovider.harvesterhci.io/serviceLabels": "tier=edge"}),
            ),
        )
        .await,
    );
    assert_eq!(code, 400);
    assert!(
        message.starts_with(&format!("admission webhook \"validator.loadbalancer.harvester-cloud.io\" denied the request: create loadbalancer {NS}/bad failed: annotation cloudprovider.harvesterhci.io/serviceLabels is not a JSON object of label values: ")),
        "{message}"
    );
    // Two edge Services: the pool passes over 10.53.0.255 and 10.53.1.0.
    for name in ["edge1", "edge2"] {
        lbs.create(
            &PostParams::default(),
            &lb(
                name,
                json!({"cloudprovider.harvesterhci.io/serviceLabels": r#"{"tier":"edge"}"#}),
            ),
        )
        .await
        .expect("admitted");
        eventually(&format!("{name}'s address"), async || {
            let lb = lbs.get(name).await.ok()?;
            lb.data["status"]["allocatedAddress"]["ip"]
                .as_str()
                .map(String::from)
        })
        .await;
    }
    let edge2 = lbs.get("edge2").await.expect("reads");
    assert_eq!(edge2.data["status"]["allocatedAddress"]["ip"], "10.53.1.1");
}

/// The mutator gives a live LoadBalancer the reconciler's finalizer (upstream's own name) when it
/// is created, and back when an update would drop it, so the reconciler's first write to a new one
/// is its status: the service never PUTs a LoadBalancer to add the finalizer. Deleting it still
/// releases the address and the finalizer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_balancers_get_the_reconcilers_finalizer_at_admission() {
    let env = Env::start().await;
    env.pools()
        .create(
            &PostParams::default(),
            &pool("global", "10.54.0.0/24", global()),
        )
        .await
        .expect("a valid pool is admitted");
    let lbs = env.lbs();
    let created = lbs
        .create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
                "metadata": {"name": "web", "namespace": NS, "finalizers": ["example.com/keep"]},
                "spec": {"workloadType": "vm", "ipam": "pool",
                    "listeners": [{"name": "http", "port": 80, "protocol": "TCP", "backendPort": 8080}]}
            })),
        )
        .await
        .expect("admitted");
    assert_eq!(
        created.metadata.finalizers.unwrap_or_default(),
        ["example.com/keep", harvester_cloud::crd::LB_FINALIZER],
        "the object as created carries it"
    );
    eventually("the load balancer's address", async || {
        let lb = lbs.get("web").await.ok()?;
        let ip = lb.data["status"]["allocatedAddress"]["ip"].as_str()?;
        ip.starts_with("10.54.0.").then_some(())
    })
    .await;
    // What the service wrote to it: its status, never the object itself.
    let writes: Vec<(String, String)> = env
        .cp
        .audit()
        .into_iter()
        .filter(|r| {
            r.user == support::kube_env::SERVICE_USER
                && r.resource == "loadbalancers"
                && r.uri.contains("/loadbalancers/web")
                && !matches!(r.verb.as_str(), "get" | "list" | "watch")
        })
        .map(|r| (r.verb, r.uri))
        .collect();
    assert!(!writes.is_empty(), "the status was written");
    assert!(
        writes
            .iter()
            .all(|(verb, uri)| verb == "patch" || uri.contains("/status")),
        "{writes:#?}"
    );

    // A writer's copy without it (a live object): the mutator puts it back.
    let mut lb = lbs.get("web").await.expect("reads");
    lb.metadata.finalizers = None;
    let replaced = lbs
        .replace("web", &PostParams::default(), &lb)
        .await
        .expect("admitted");
    assert_eq!(
        replaced.metadata.finalizers.unwrap_or_default(),
        [harvester_cloud::crd::LB_FINALIZER]
    );

    // Deleted: the reconciler releases the address and takes its finalizer off.
    lbs.delete("web", &DeleteParams::default())
        .await
        .expect("deletes");
    eventually("the load balancer to be gone", async || {
        lbs.get_opt("web")
            .await
            .ok()
            .and_then(|lb| lb.is_none().then_some(()))
    })
    .await;
    eventually("the address back in the pool", async || {
        let pool = env.pools().get("global").await.ok()?;
        let allocated = &pool.data["status"]["allocated"];
        allocated
            .as_object()
            .is_none_or(|held| held.is_empty())
            .then_some(())
    })
    .await;
}

/// Every update of a LoadBalancer passes the mutating webhook (on Harvester's CRDs, which have no
/// status subresource, so do the reconcilers' status writes). Like upstream's mutator, ours lists a
/// guest cluster's VMIs only to discover a network the load balancer does not name: one that names
/// it (as cloud-provider-harvester's do) costs no VMI list on create or on any update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mutator_lists_vmis_only_for_a_network_it_must_discover() {
    use harvester_cloud::crd::keys::{ANNOTATION_CLUSTER, ANNOTATION_NETWORK};
    let env = Env::start().await;
    let lbs = env.lbs();
    let cluster_lb = |name: &str, annotations: Value| {
        object(json!({
            "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
            "metadata": {"name": name, "namespace": NS, "annotations": annotations},
            "spec": {"workloadType": "cluster", "ipam": "pool",
                "listeners": [{"name": "http", "port": 80, "protocol": "TCP", "backendPort": 8080}]}
        }))
    };
    // The service's own reads of a namespace's VMIs (its reconcilers watch them cluster-wide).
    let vmi_lists = || {
        env.cp
            .audit()
            .into_iter()
            .filter(|r| {
                r.user == support::kube_env::SERVICE_USER
                    && r.resource == "virtualmachineinstances"
                    && r.verb == "list"
                    && r.namespace == NS
            })
            .count()
    };
    let before = vmi_lists();
    let named = lbs
        .create(
            &PostParams::default(),
            &cluster_lb(
                "named",
                json!({
                    ANNOTATION_CLUSTER: "gc1",
                    ANNOTATION_NETWORK: "default/vlan1",
                }),
            ),
        )
        .await
        .expect("admitted");
    let annotations = named.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get(ANNOTATION_NETWORK),
        Some(&"default/vlan1".to_string())
    );
    for round in 0..3 {
        let patch = json!({"metadata": {"labels": {"round": round.to_string()}}});
        lbs.patch("named", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("an update is admitted");
    }
    assert_eq!(vmi_lists(), before, "a named network needs no VMI");

    // One to discover: its create lists the guest cluster's VMIs (none here, so no network).
    let discovered = lbs
        .create(
            &PostParams::default(),
            &cluster_lb("discovered", json!({ANNOTATION_CLUSTER: "gc1"})),
        )
        .await
        .expect("admitted");
    assert_eq!(
        discovered
            .metadata
            .annotations
            .unwrap_or_default()
            .get(ANNOTATION_NETWORK),
        Some(&String::new())
    );
    eventually("the discovery's VMI list in the audit log", async || {
        (vmi_lists() > before).then_some(())
    })
    .await;
}

/// With the service down, `failurePolicy: Fail` (as shipped) refuses writes to the two kinds rather
/// than storing them unchecked; other kinds are not affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_service_down_its_kinds_are_refused() {
    let mut env = Env::start().await;
    drop(env.service.take());
    let (code, message) = refusal(
        env.pools()
            .create(
                &PostParams::default(),
                &pool("global", "10.50.0.0/24", global()),
            )
            .await,
    );
    assert_eq!(code, 500);
    assert!(
        message.starts_with("Internal error occurred: failed calling webhook \"mutator.loadbalancer.harvester-cloud.io\": "),
        "{message}"
    );
    let config_maps = api(&env.client, "v1", "ConfigMap", Some(NS));
    config_maps
        .create(
            &PostParams::default(),
            &object(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unrelated", "namespace": NS}})),
        )
        .await
        .expect("other kinds are admitted without the service");
}

/// The webhooks answer the API server only (it presents the client certificate the service was
/// told to require); anyone else asking which pools overlap is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhooks_answer_only_the_api_server() {
    let env = Env::start().await;
    // Through the API server: admitted and mutated (so the webhook answered it).
    let created = env
        .pools()
        .create(
            &PostParams::default(),
            &pool("global", "10.52.0.0/24", global()),
        )
        .await
        .expect("the API server's review is answered");
    assert!(
        created
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key("loadbalancer.harvesterhci.io/global-ip-pool")
    );
    // Directly, without the certificate: refused, and nothing about the pools is said.
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&env.tls_ca).unwrap())
        .build()
        .unwrap();
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u", "kind": {"group": "loadbalancer.harvesterhci.io", "version": "v1beta1", "kind": "IPPool"},
            "operation": "CREATE", "object": pool("probe", "10.52.0.0/24", global())}});
    let r = http
        .post(format!(
            "https://127.0.0.1:{}/v1/webhook/validation",
            env.addr.port()
        ))
        .json(&review)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let text = r.text().await.unwrap();
    assert!(!text.contains("overlap"), "{text}");
}
