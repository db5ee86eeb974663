//! The cloud-config accounts this service issued: `GET /v1/harvester/kubeconfigs` (what POST made
//! and nothing anybody else made, bindings, tokens without their values, the guest cluster,
//! steve's paging), and their revocation when Rancher removes their guest cluster (its VMs
//! annotated as being removed, then deleted), which `--keep-accounts-of-removed-clusters` turns
//! off. The `cases` run on every backend through [`support::Backend`]; on Kubernetes the
//! reconcilers run with the chart's RBAC and the API server must refuse them nothing.

#[macro_use]
mod support;

use std::{collections::BTreeMap, sync::Arc};

use axum::{
    body::Body,
    http::{Method, StatusCode},
};
use harvester_cloud::{
    crd::kinds::VirtualMachine,
    lb,
    store::{Api, LabelSelector, ObjectStore, Preconditions},
};
use k8s_openapi::{
    api::{
        core::v1::{Event, Secret, ServiceAccount},
        rbac::v1::{ClusterRoleBinding, RoleBinding},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde_json::{Value, json};
use support::{Backend, EmbeddedBackend, KubeBackend, account, eventually, lb::Reconcilers};

const LIST: &str = "/v1/harvester/kubeconfigs";
const VM_FINALIZER: &str = "wrangler.cattle.io/harvester-lb-vm-controller";
const REVOKED_REASON: &str = "CloudConfigAccountRevoked";

/// The load balancer reconcilers (the guest-cluster cleanup among them) on a store, until dropped;
/// `revoke`: they revoke the cloud-config accounts of a guest cluster Rancher removes.
fn reconcilers(store: Arc<dyn ObjectStore>, revoke: bool) -> Reconcilers {
    Reconcilers::start_with(
        store.clone(),
        lb::Settings {
            concurrency: 16,
            cluster_accounts: revoke.then(|| harvester_cloud::app::cluster_accounts(store)),
            ..support::lb::settings()
        },
    )
}

async fn post<B: Backend>(b: &B, ns: &str, sa: &str) -> String {
    b.post(&account(ns, sa)).await.kubeconfig()
}

async fn list<B: Backend>(b: &B, query: &str) -> Value {
    b.admin(Method::GET, &format!("{LIST}{query}"), None)
        .await
        .expect(StatusCode::OK)
}

fn ids(page: &Value) -> Vec<String> {
    page["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|a| a["id"].as_str().expect("id").to_string())
        .collect()
}

fn find<'a>(page: &'a Value, id: &str) -> &'a Value {
    page["data"]
        .as_array()
        .expect("data")
        .iter()
        .find(|a| a["id"] == id)
        .unwrap_or_else(|| panic!("{id} is not listed: {page}"))
}

fn token_of(kubeconfig: &str) -> String {
    let v: Value = yaml_serde::from_str(kubeconfig).expect("kubeconfig is YAML");
    v["users"][0]["user"]["token"]
        .as_str()
        .expect("token")
        .to_string()
}

fn meta(ns: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.into()),
        ..Default::default()
    }
}

/// A ServiceAccount somebody else made (no managed-by label), with a token Secret shaped like ours.
async fn foreign_account(store: &Arc<dyn ObjectStore>, ns: &str, name: &str) {
    Api::<ServiceAccount>::new(store.clone())
        .create(&ServiceAccount {
            metadata: meta(ns, name),
            ..Default::default()
        })
        .await
        .expect("creates the foreign service account");
    let mut secret_meta = meta(ns, &format!("{name}-token"));
    secret_meta.annotations = Some(BTreeMap::from([(
        "kubernetes.io/service-account.name".to_string(),
        name.to_string(),
    )]));
    Api::<Secret>::new(store.clone())
        .create(&Secret {
            metadata: secret_meta,
            type_: Some("kubernetes.io/service-account-token".into()),
            ..Default::default()
        })
        .await
        .expect("creates the foreign token secret");
}

/// A node VM of guest cluster `cluster`, as Rancher's node driver makes it.
async fn node_vm(store: &Arc<dyn ObjectStore>, ns: &str, name: &str, cluster: &str) {
    let vm: VirtualMachine = serde_json::from_value(
        support::foreign::vm(name)
            .namespace(ns)
            .label("harvesterhci.io/creator", "docker-machine-driver-harvester")
            .label("guestcluster.harvesterhci.io/name", cluster)
            .build(),
    )
    .expect("vm");
    Api::<VirtualMachine>::new(store.clone())
        .create(&vm)
        .await
        .expect("creates the vm");
}

/// Removes a guest cluster's VM as Rancher does: waits for the cleanup finalizer, marks the VM
/// as being removed, deletes it, and waits until it is gone (the cleanup has run then).
async fn remove_as_rancher(store: &Arc<dyn ObjectStore>, ns: &str, name: &str) {
    let vms = Api::<VirtualMachine>::new(store.clone());
    let vm = eventually("the VM to get the cleanup finalizer", async || {
        let vm = vms.get(ns, name).await.expect("reads")?;
        vm.metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == VM_FINALIZER))
            .then_some(vm)
    })
    .await;
    let mut marked = vm;
    marked.metadata.annotations = Some(BTreeMap::from([(
        "harvesterhci.io/removeAllPersistentVolumeClaims".to_string(),
        "true".to_string(),
    )]));
    vms.replace(&marked).await.expect("marks the vm");
    vms.delete(ns, name, &Preconditions::default())
        .await
        .expect("deletes the vm");
    eventually("the VM to go", async || {
        vms.get(ns, name)
            .await
            .expect("reads")
            .is_none()
            .then_some(())
    })
    .await;
}

async fn exists<K: harvester_cloud::store::Object>(
    store: &Arc<dyn ObjectStore>,
    ns: &str,
    name: &str,
) -> bool {
    Api::<K>::new(store.clone())
        .get(ns, name)
        .await
        .expect("reads")
        .is_some()
}

pub mod cases {
    use super::*;

    /// The list holds what POST made, with its bindings and tokens (never a token value), and
    /// nothing somebody else made, even with our names and shapes.
    pub async fn list_shows_what_post_made_and_nothing_else<B: Backend>(b: B) {
        let store = b.store();
        let k1 = post(&b, "gc-test", "gc1").await;
        post(&b, "gc-test", "gc2").await;
        let k3 = post(&b, "ns1", "gc1").await;
        // Somebody else's account, shaped like ours.
        foreign_account(&store, "gc-test", "theirs").await;
        // A ServiceAccount somebody else made, which a POST of its name then used.
        Api::<ServiceAccount>::new(store.clone())
            .create(&ServiceAccount {
                metadata: meta("gc-test", "adopted"),
                ..Default::default()
            })
            .await
            .expect("creates");
        post(&b, "gc-test", "adopted").await;

        let page = list(&b, "").await;
        assert_eq!(page["type"], "collection");
        assert_eq!(page["resourceType"], "harvester.cloud-config-account");
        assert!(page["revision"].is_string(), "{page}");
        assert_eq!(page["pagination"]["limit"], 1000);
        assert!(page.get("continue").is_none(), "{page}");
        assert_eq!(ids(&page), ["gc-test/gc1", "gc-test/gc2", "ns1/gc1"]);
        let a = find(&page, "gc-test/gc1");
        assert_eq!(a["type"], "harvester.cloud-config-account");
        assert_eq!(a["namespace"], "gc-test");
        assert_eq!(a["serviceAccount"], "gc1");
        assert!(
            a["created"].as_str().is_some_and(|c| c.ends_with('Z')),
            "{a}"
        );
        for (kind, name) in [
            ("roleBinding", "gc-test-gc1"),
            ("clusterRoleBinding", "gc-test-gc1"),
        ] {
            assert_eq!(
                a["bindings"][kind],
                json!({"name": name, "exists": true, "ours": true}),
                "{a}"
            );
        }
        let tokens = a["tokens"].as_array().expect("tokens");
        assert_eq!(tokens.len(), 1, "{a}");
        assert_eq!(tokens[0]["secret"], "gc1-token");
        assert_eq!(tokens[0]["current"], true);
        assert_eq!(tokens[0]["kind"], "service-account-token");
        assert!(tokens[0]["created"].is_string());
        // No expiry: it never expires, as Harvester's.
        assert!(tokens[0].get("expiresAt").is_none(), "{a}");
        assert!(a.get("guestCluster").is_none(), "no VMs yet: {a}");
        // Never a token value, nor any secret data.
        let text = b.admin(Method::GET, LIST, None).await.text();
        for token in [token_of(&k1), token_of(&k3)] {
            assert!(!text.contains(&token), "the list carries a token");
        }
        for key in ["\"data\":{", "ca.crt", "\"token\""] {
            assert!(!text.contains(key), "the list carries {key}: {text}");
        }

        // Bindings that are missing or not the account's say so.
        Api::<ClusterRoleBinding>::new(store.clone())
            .delete("", "gc-test-gc2", &Preconditions::default())
            .await
            .expect("deletes");
        let rbs = Api::<RoleBinding>::new(store.clone());
        let mut rb = rbs
            .get("gc-test", "gc-test-gc2")
            .await
            .expect("reads")
            .expect("exists");
        rbs.delete("gc-test", "gc-test-gc2", &Preconditions::default())
            .await
            .expect("deletes");
        rb.metadata = meta("gc-test", "gc-test-gc2");
        rbs.create(&rb).await.expect("recreates without an owner");
        let page = list(&b, "?namespace=gc-test").await;
        assert_eq!(ids(&page), ["gc-test/gc1", "gc-test/gc2"]);
        let a = find(&page, "gc-test/gc2");
        assert_eq!(
            a["bindings"]["clusterRoleBinding"],
            json!({"name": "gc-test-gc2", "exists": false, "ours": false})
        );
        assert_eq!(a["bindings"]["roleBinding"]["exists"], true);
        assert_eq!(a["bindings"]["roleBinding"]["ours"], false);
        assert!(
            a["bindings"]["roleBinding"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("not owned by serviceAccount")),
            "{a}"
        );

        // The guest cluster, once Rancher's node driver made VMs for it in the namespace.
        node_vm(&store, "gc-test", "gc1-pool1-abcde", "gc1").await;
        let page = list(&b, "").await;
        assert_eq!(find(&page, "gc-test/gc1")["guestCluster"], "gc1");
        assert!(find(&page, "gc-test/gc2").get("guestCluster").is_none());
        assert!(find(&page, "ns1/gc1").get("guestCluster").is_none());

        // After a rotation: the new token first and current, the replaced one with its end.
        let rotated = b
            .admin(
                Method::POST,
                "/v1/harvester/kubeconfig/rotate",
                Some(json!({"namespace": "gc-test", "serviceAccountName": "gc1", "gracePeriod": "30m"})),
            )
            .await
            .kubeconfig();
        let page = list(&b, "?namespace=gc-test").await;
        let text = serde_json::to_string(&page).unwrap();
        assert!(
            !text.contains(&token_of(&rotated)),
            "the list carries a token"
        );
        let tokens = find(&page, "gc-test/gc1")["tokens"]
            .as_array()
            .expect("tokens")
            .clone();
        assert_eq!(tokens.len(), 2, "{tokens:?}");
        assert_eq!(tokens[0]["current"], true);
        assert_ne!(tokens[0]["secret"], "gc1-token");
        assert!(tokens[0].get("rotatedAt").is_none(), "{tokens:?}");
        assert_eq!(tokens[1]["secret"], "gc1-token");
        assert_eq!(tokens[1]["current"], false);
        assert!(tokens[1]["rotatedAt"].is_string(), "{tokens:?}");
        assert!(tokens[1]["expiresAt"].is_string(), "{tokens:?}");
    }

    /// steve's paging: `limit` a page, `continue` and `pagination.next` while there are more.
    pub async fn the_list_pages<B: Backend>(b: B) {
        for (ns, sa) in [
            ("gc-test", "a1"),
            ("gc-test", "a2"),
            ("ns1", "a1"),
            ("ns2", "z"),
        ] {
            post(&b, ns, sa).await;
        }
        let mut seen = Vec::new();
        let mut query = "?limit=3".to_string();
        let mut pages = 0;
        loop {
            let page = list(&b, &query).await;
            pages += 1;
            assert_eq!(page["pagination"]["limit"], 3);
            assert!(ids(&page).len() <= 3);
            seen.extend(ids(&page));
            let Some(next) = page["pagination"]["next"].as_str() else {
                assert!(page.get("continue").is_none());
                break;
            };
            let token = page["continue"].as_str().expect("continue");
            assert!(next.contains(token), "{next}");
            query = next.strip_prefix(LIST).expect("next is the list").into();
        }
        assert_eq!(pages, 2);
        assert_eq!(seen, ["gc-test/a1", "gc-test/a2", "ns1/a1", "ns2/z"]);
        // A namespace's accounts page on their own.
        let page = list(&b, "?namespace=gc-test&limit=1").await;
        assert_eq!(ids(&page), ["gc-test/a1"]);
        let next = page["pagination"]["next"].as_str().expect("next");
        assert!(next.contains("namespace=gc-test"), "{next}");
        let rest = list(&b, next.strip_prefix(LIST).unwrap()).await;
        assert_eq!(ids(&rest), ["gc-test/a2"]);

        for query in [
            "?limit=0",
            "?limit=1001",
            "?limit=ten",
            "?namespace=Not_A_Namespace",
            "?continue=not-a-token",
        ] {
            b.admin(Method::GET, &format!("{LIST}{query}"), None)
                .await
                .error(StatusCode::UNPROCESSABLE_ENTITY, "InvalidBodyContent");
        }
        b.call(Method::GET, LIST, None, Body::empty())
            .await
            .error(StatusCode::UNAUTHORIZED, "Unauthorized");
        b.admin(Method::POST, LIST, None)
            .await
            .error(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed");
    }

    /// Rancher removes guest cluster gc1: its account is revoked, with an Event on the VM; another
    /// cluster's account in the namespace, an account named gc1 in another namespace, and a
    /// removed cluster's account that somebody else made all stay.
    pub async fn removed_guest_clusters_accounts_are_revoked<B: Backend>(b: B) {
        let _r = reconcilers(b.service_store(), true);
        let store = b.store();
        post(&b, "gc-test", "gc1").await;
        post(&b, "gc-test", "gc2").await;
        post(&b, "ns1", "gc1").await;
        // Guest cluster gc3's account was made by somebody else.
        foreign_account(&store, "gc-test", "gc3").await;
        node_vm(&store, "gc-test", "gc1-pool1-abcde", "gc1").await;
        node_vm(&store, "gc-test", "gc2-pool1-abcde", "gc2").await;
        node_vm(&store, "gc-test", "gc3-pool1-abcde", "gc3").await;

        remove_as_rancher(&store, "gc-test", "gc3-pool1-abcde").await;
        remove_as_rancher(&store, "gc-test", "gc1-pool1-abcde").await;
        assert!(!exists::<ServiceAccount>(&store, "gc-test", "gc1").await);
        assert!(!exists::<Secret>(&store, "gc-test", "gc1-token").await);
        assert!(!exists::<RoleBinding>(&store, "gc-test", "gc-test-gc1").await);
        assert!(!exists::<ClusterRoleBinding>(&store, "", "gc-test-gc1").await);
        b.get("namespace=gc-test&serviceAccountName=gc1")
            .await
            .error(StatusCode::NOT_FOUND, "NotFound");
        // Everything else stays.
        for (ns, sa) in [("gc-test", "gc2"), ("ns1", "gc1")] {
            b.get(&format!("namespace={ns}&serviceAccountName={sa}"))
                .await
                .kubeconfig();
        }
        assert!(exists::<ServiceAccount>(&store, "gc-test", "gc3").await);
        assert!(exists::<Secret>(&store, "gc-test", "gc3-token").await);
        assert_eq!(
            ids(&list(&b, "").await),
            ["gc-test/gc2", "ns1/gc1"],
            "the list no longer has gc1's account"
        );

        let events = Api::<Event>::new(store.clone());
        let event = eventually("the revocation's Event on the VM", async || {
            events
                .list(Some("gc-test"), &LabelSelector::everything())
                .await
                .expect("lists events")
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some(REVOKED_REASON)
                        && e.involved_object.name.as_deref() == Some("gc1-pool1-abcde")
                })
        })
        .await;
        assert_eq!(
            event.involved_object.kind.as_deref(),
            Some("VirtualMachine")
        );
        assert_eq!(event.type_.as_deref(), Some("Normal"));
        let message = event.message.unwrap_or_default();
        assert!(
            message.contains("gc-test/gc1") && message.contains("serviceaccount gc-test/gc1"),
            "{message}"
        );
        let metrics = harvester_cloud::metrics::encode();
        assert!(
            metrics.lines().any(|l| l
                .starts_with("harvester_cloud_kubeconfig_accounts_cleaned_up_total ")
                && !l.ends_with(" 0")),
            "{metrics}"
        );
    }

    /// `--keep-accounts-of-removed-clusters`: the removed cluster's account stays.
    pub async fn the_flag_keeps_removed_clusters_accounts<B: Backend>(b: B) {
        let _r = reconcilers(b.service_store(), false);
        let store = b.store();
        post(&b, "gc-test", "gc1").await;
        node_vm(&store, "gc-test", "gc1-pool1-abcde", "gc1").await;
        remove_as_rancher(&store, "gc-test", "gc1-pool1-abcde").await;
        b.get("namespace=gc-test&serviceAccountName=gc1")
            .await
            .kubeconfig();
        assert_eq!(ids(&list(&b, "").await), ["gc-test/gc1"]);
    }
}

suite!(
    [embedded => EmbeddedBackend::start(), kube => KubeBackend::start()],
    [
        list_shows_what_post_made_and_nothing_else,
        the_list_pages,
        removed_guest_clusters_accounts_are_revoked,
        the_flag_keeps_removed_clusters_accounts,
    ]
);

/// The flag reaches the reconcilers' settings from the command line and the environment.
#[test]
fn the_flag_parses() {
    use clap::Parser;
    use harvester_cloud::config::{Cli, Command};
    let serve = |args: &[&str]| match Cli::try_parse_from(args).expect("parses").command {
        Command::Serve(s) => s,
        _ => unreachable!(),
    };
    assert!(!serve(&["harvester-cloud", "serve"]).keep_accounts_of_removed_clusters);
    assert!(
        serve(&[
            "harvester-cloud",
            "serve",
            "--keep-accounts-of-removed-clusters"
        ])
        .keep_accounts_of_removed_clusters
    );
}

// --- `harvester-cloud kubeconfig list|revoke`, the binary as an operator runs it -----------------

mod cli {
    use std::{
        io::{BufRead, BufReader},
        path::Path,
        process::{Child, Command, Output, Stdio},
        time::Duration,
    };

    use super::*;

    const BIN: &str = env!("CARGO_BIN_EXE_harvester-cloud");

    /// `serve` (HTTPS with its generated CA) on a free port, killed when dropped.
    struct Server {
        child: Child,
        url: String,
    }

    impl Server {
        fn start(data_dir: &Path) -> Server {
            let mut child = Command::new(BIN)
                .arg("--data-dir")
                .arg(data_dir)
                .args(["--log-format", "json", "serve", "--listen", "127.0.0.1:0"])
                .args(["--metrics-listen", "127.0.0.1:0", "--vip", "10.0.0.1"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn harvester-cloud");
            let stderr = child.stderr.take().expect("stderr");
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
            let mut server = Server {
                child,
                url: String::new(),
            };
            loop {
                let line = rx
                    .recv_timeout(Duration::from_secs(60))
                    .expect("the server logs that it listens");
                let v: Value = serde_json::from_str(&line).unwrap_or_default();
                if v["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("listening"))
                {
                    server.url = v["url"].as_str().expect("url").to_string();
                    return server;
                }
            }
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    fn run(args: &[&str]) -> Output {
        Command::new(BIN).args(args).output().expect("runs")
    }

    #[track_caller]
    fn ok(out: Output) -> String {
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("UTF-8")
    }

    /// list and revoke through a running service over HTTPS, as a table and as JSON.
    #[tokio::test]
    async fn list_and_revoke_against_a_running_service() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let server = Server::start(&data);
        let ca = data.join("tls/ca.crt");
        let token_file = data.join("admin-token");
        let token = std::fs::read_to_string(&token_file).unwrap();
        let http = reqwest::Client::builder()
            .add_root_certificate(
                reqwest::Certificate::from_pem(&std::fs::read(&ca).unwrap()).unwrap(),
            )
            .build()
            .unwrap();
        for (ns, sa) in [("gc-test", "gc1"), ("gc-test", "gc2"), ("ns1", "gc1")] {
            let r = http
                .post(format!("{}/v1/harvester/kubeconfig", server.url))
                .bearer_auth(token.trim())
                .body(account(ns, sa))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
        let target = [
            "--url",
            server.url.as_str(),
            "--token-file",
            token_file.to_str().unwrap(),
            "--ca-file",
            ca.to_str().unwrap(),
        ];
        let with = |args: &[&str]| -> Vec<String> {
            args.iter()
                .chain(target.iter())
                .map(|s| s.to_string())
                .collect()
        };
        let args = with(&["kubeconfig", "list"]);
        let table = ok(run(&args.iter().map(String::as_str).collect::<Vec<_>>()));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4, "{table}");
        assert!(lines[0].starts_with("NAMESPACE"), "{table}");
        for (line, (ns, sa)) in
            lines[1..]
                .iter()
                .zip([("gc-test", "gc1"), ("gc-test", "gc2"), ("ns1", "gc1")])
        {
            let cells: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(&cells[..2], [ns, sa], "{table}");
            assert!(line.contains(" ok ") && line.ends_with("never"), "{table}");
        }

        let args = with(&["kubeconfig", "list", "-n", "gc-test", "-o", "json"]);
        let json: Value = serde_json::from_str(&ok(run(&args
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>())))
        .expect("JSON");
        let names: Vec<&str> = json
            .as_array()
            .expect("an array")
            .iter()
            .map(|a| a["serviceAccount"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["gc1", "gc2"]);
        assert_eq!(json[0]["tokens"][0]["secret"], "gc1-token");

        // rotate: the new kubeconfig printed, the old token kept for its grace (both listed), and
        // as cloud-init at a chosen path.
        let args = with(&["kubeconfig", "rotate", "gc2", "gc-test", "--grace", "30m"]);
        let rotated = ok(run(&args.iter().map(String::as_str).collect::<Vec<_>>()));
        assert!(rotated.starts_with("apiVersion: v1\n"), "{rotated}");
        let got: String = http
            .get(format!(
                "{}/v1/harvester/kubeconfig?namespace=gc-test&serviceAccountName=gc2",
                server.url
            ))
            .bearer_auth(token.trim())
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(got, rotated, "GET hands out the rotated kubeconfig");
        let args = with(&["kubeconfig", "list", "-n", "gc-test", "-o", "json"]);
        let json: Value = serde_json::from_str(&ok(run(&args
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>())))
        .expect("JSON");
        let tokens = json[1]["tokens"].as_array().expect("gc2's tokens");
        assert_eq!(tokens.len(), 2, "{json}");
        assert_eq!(tokens[0]["current"], true);
        assert_eq!(tokens[1]["secret"], "gc2-token");
        assert!(tokens[1]["expiresAt"].is_string(), "{json}");
        let args = with(&[
            "kubeconfig",
            "rotate",
            "gc2",
            "gc-test",
            "--grace",
            "0",
            "-o",
            "cloud-init",
            "--cloud-config-path",
            "/opt/rke2/etc/config-files/cloud-provider-config",
        ]);
        let user_data = ok(run(&args.iter().map(String::as_str).collect::<Vec<_>>()));
        assert!(
            user_data.contains("  path: /opt/rke2/etc/config-files/cloud-provider-config\n")
                && user_data.matches("path: ").count() == 1,
            "{user_data}"
        );
        let args = with(&[
            "kubeconfig",
            "rotate",
            "gc2",
            "gc-test",
            "--cloud-config-path",
            "rel/path",
        ]);
        let out = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("cloudConfigPath"));

        let args = with(&["kubeconfig", "revoke", "gc1", "gc-test", "-o", "json"]);
        let revoked: Value = serde_json::from_str(&ok(run(&args
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>())))
        .expect("JSON");
        assert_eq!(revoked["namespace"], "gc-test");
        assert_eq!(revoked["serviceAccountName"], "gc1");
        let deleted: Vec<&str> = revoked["deleted"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap())
            .collect();
        assert_eq!(
            deleted,
            [
                "clusterrolebinding gc-test-gc1",
                "rolebinding gc-test/gc-test-gc1",
                "secret gc-test/gc1-token",
                "serviceaccount gc-test/gc1"
            ]
        );
        // Again: nothing left to delete, said as a person reads it.
        let args = with(&["kubeconfig", "revoke", "gc1", "gc-test"]);
        let again = ok(run(&args.iter().map(String::as_str).collect::<Vec<_>>()));
        assert_eq!(again, "nothing of account gc-test/gc1 to delete\n");
        let args = with(&["kubeconfig", "list", "-o", "json"]);
        let json: Value = serde_json::from_str(&ok(run(&args
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>())))
        .expect("JSON");
        assert_eq!(json.as_array().unwrap().len(), 2);

        // A wrong token: the service's answer, and a failure exit.
        let wrong = dir.path().join("wrong-token");
        std::fs::write(&wrong, "token-xxxxx:nope\n").unwrap();
        let out = run(&[
            "kubeconfig",
            "list",
            "--url",
            &server.url,
            "--token-file",
            wrong.to_str().unwrap(),
            "--ca-file",
            ca.to_str().unwrap(),
        ]);
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("401"), "{stderr}");
    }

    /// list and revoke in the cluster, with the service's own kubeconfig (the chart's RBAC).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn list_and_revoke_in_the_cluster() {
        let b = KubeBackend::start().await;
        let probes = support::Refusals::refusal_probes(&b);
        post(&b, "gc-test", "gc1").await;
        post(&b, "ns1", "gc1").await;
        foreign_account(&b.store(), "gc-test", "theirs").await;
        let kubeconfig = b.service_kubeconfig();
        let kubeconfig = kubeconfig.to_str().unwrap();
        let table = ok(run(&["kubeconfig", "list", "--kubeconfig", kubeconfig]));
        let rows: Vec<Vec<&str>> = table
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().take(2).collect())
            .collect();
        assert_eq!(rows, [["gc-test", "gc1"], ["ns1", "gc1"]], "{table}");
        let out = ok(run(&[
            "kubeconfig",
            "revoke",
            "gc1",
            "ns1",
            "--kubeconfig",
            kubeconfig,
        ]));
        assert!(out.contains("deleted serviceaccount ns1/gc1"), "{out}");
        // rotate in the cluster: the kubeconfig points where the given server URL says.
        let rotated = ok(run(&[
            "kubeconfig",
            "rotate",
            "gc1",
            "gc-test",
            "--grace",
            "0",
            "--server-url",
            "https://10.9.8.7:6443",
            "--kubeconfig",
            kubeconfig,
        ]));
        assert!(
            rotated.contains("server: https://10.9.8.7:6443\n"),
            "{rotated}"
        );
        let json: Value = serde_json::from_str(&ok(run(&[
            "kubeconfig",
            "list",
            "-o",
            "json",
            "--kubeconfig",
            kubeconfig,
        ])))
        .expect("JSON");
        assert_eq!(json.as_array().unwrap().len(), 1, "{json}");
        assert_eq!(json[0]["namespace"], "gc-test");
        for probe in probes {
            probe.assert_none_refused();
        }
    }
}
