//! The store port's Kubernetes semantics, as one suite every backend must pass: resourceVersion and
//! optimistic concurrency, no-op writes, the status subresource, finalizers, garbage collection of
//! dependents, label selectors, watch with replay, and persistence across a restart.

#[macro_use]
mod support;

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use harvester_cloud::store::{
    ChangeType, Deleted, Kind, LabelSelector, NameRule, ObjectStore, Preconditions, StoreError,
    embedded::{Durability, EmbeddedStore},
    kubernetes::KubeStore,
};
use serde_json::{Value, json};

#[allow(async_fn_in_trait)]
pub trait Harness: Sized {
    fn store(&self) -> Arc<dyn ObjectStore>;
    async fn reopen(self) -> Self;
    /// Whether a watch can resume from a version seen before a restart (an API server keeps its
    /// history; the embedded store starts a new one).
    fn history_survives_restart(&self) -> bool;
}

/// The Kubernetes backend on a real control plane (the store itself as a `system:masters` client:
/// this suite is about the store port's semantics, not the chart's permissions).
pub struct Kube {
    cp: support::control_plane::ControlPlane,
    store: Arc<dyn ObjectStore>,
}

impl Kube {
    async fn start() -> Self {
        let cp = support::control_plane::ControlPlane::lease().await;
        Kube {
            store: Arc::new(KubeStore::new(cp.admin.clone())),
            cp,
        }
    }
}

impl support::Refusals for Kube {}
impl support::Refusals for Embedded {}

impl Harness for Kube {
    fn store(&self) -> Arc<dyn ObjectStore> {
        self.store.clone()
    }
    async fn reopen(self) -> Self {
        let client = support::control_plane::ControlPlane::client_from_kubeconfig(
            &self.cp.admin_kubeconfig_path(),
        )
        .await;
        Kube {
            store: Arc::new(KubeStore::new(client)),
            ..self
        }
    }
    fn history_survives_restart(&self) -> bool {
        true
    }
}

pub struct Embedded {
    dir: tempfile::TempDir,
    store: Arc<EmbeddedStore>,
    durability: Durability,
}

impl Embedded {
    async fn start(durability: Durability) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), durability).await.unwrap();
        Embedded {
            dir,
            store,
            durability,
        }
    }
}

impl Harness for Embedded {
    fn store(&self) -> Arc<dyn ObjectStore> {
        self.store.clone()
    }
    fn history_survives_restart(&self) -> bool {
        false
    }
    async fn reopen(self) -> Self {
        let Embedded {
            dir,
            store,
            durability,
        } = self;
        store.close().await;
        drop(store);
        let store = EmbeddedStore::open(dir.path(), durability).await.unwrap();
        Embedded {
            dir,
            store,
            durability,
        }
    }
}

fn cm_kind() -> Kind {
    Kind::of::<k8s_openapi::api::core::v1::ConfigMap>()
}

/// A namespaced custom kind with a status subresource.
fn widget_kind() -> Kind {
    Kind {
        group: "example.harvesterhci.io".into(),
        version: "v1".into(),
        api_version: "example.harvesterhci.io/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
        namespaced: true,
        status_subresource: true,
        names: NameRule::Subdomain,
    }
}

fn mk_cm(name: &str, data: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "ns1", "labels": {"app": "a", "tier": data}},
        "data": {"k": data}})
}

fn rv(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

fn merge_meta(obj: &mut Value, meta: &Value) {
    for (k, v) in meta.as_object().unwrap() {
        obj["metadata"][k] = v.clone();
    }
}

/// The reason of a refusal, without the framing the API server puts around it
/// (`ConfigMap "x" is invalid: `, `Widget.example.harvesterhci.io "x" is invalid: `), which
/// the embedded store's reason does not carry (its error adds its own).
fn invalid_reason(r: Result<Value, StoreError>) -> String {
    match r {
        Err(StoreError::Invalid { reason, .. }) => match reason.split_once(" is invalid: ") {
            Some((framing, rest))
                if framing.ends_with('"')
                    && framing
                        .split_once(" \"")
                        .is_some_and(|(k, _)| !k.contains(' ')) =>
            {
                rest.to_string()
            }
            _ => reason,
        },
        other => panic!("expected a 422 (Invalid), got {other:?}"),
    }
}

pub mod cases {
    use super::*;

    pub async fn create_get_and_conflicts<H: Harness>(h: H) {
        let s = h.store();
        let k = cm_kind();
        let a = s.create(&k, mk_cm("a", "1")).await.unwrap();
        assert!(a["metadata"]["uid"].as_str().is_some_and(|u| !u.is_empty()));
        assert!(a["metadata"]["creationTimestamp"].is_string());
        assert_eq!(s.get(&k, "ns1", "a").await.unwrap().unwrap(), a);
        assert!(s.get(&k, "ns1", "nope").await.unwrap().is_none());
        assert!(matches!(
            s.create(&k, mk_cm("a", "2")).await,
            Err(StoreError::AlreadyExists { .. })
        ));

        // A write with the current version succeeds and moves the version forward.
        let mut next = a.clone();
        next["data"]["k"] = json!("2");
        let b = s.replace(&k, next).await.unwrap();
        assert!(rv(&b) > rv(&a));
        // A write with the old version is a conflict and changes nothing.
        let mut stale = a.clone();
        stale["data"]["k"] = json!("3");
        assert!(matches!(
            s.replace(&k, stale).await,
            Err(StoreError::Conflict { .. })
        ));
        assert_eq!(
            s.get(&k, "ns1", "a").await.unwrap().unwrap()["data"]["k"],
            "2"
        );
        // uid and creationTimestamp belong to the server.
        let mut forged = b.clone();
        forged["metadata"]["creationTimestamp"] = json!("2000-01-01T00:00:00Z");
        forged["data"]["k"] = json!("4");
        let c = s.replace(&k, forged).await.unwrap();
        assert_eq!(
            c["metadata"]["creationTimestamp"],
            a["metadata"]["creationTimestamp"]
        );
        assert!(matches!(
            s.replace(&k, mk_cm("missing", "1")).await,
            Err(StoreError::NotFound { .. })
        ));
        // Invalid names are refused as the API server refuses them.
        assert!(matches!(
            s.create(&k, mk_cm("Bad_Name", "1")).await,
            Err(StoreError::Invalid { .. })
        ));
    }

    pub async fn noop_writes_change_nothing<H: Harness>(h: H) {
        let s = h.store();
        let k = cm_kind();
        let a = s.create(&k, mk_cm("a", "1")).await.unwrap();
        let list = s
            .list(&k, None, &LabelSelector::everything())
            .await
            .unwrap();
        let mut watch = s.watch(&k, None, &list.resource_version).await.unwrap();
        let same = s.replace(&k, a.clone()).await.unwrap();
        assert_eq!(rv(&same), rv(&a));
        // The next event is the real change below, not the no-op.
        let mut changed = a.clone();
        changed["data"]["k"] = json!("2");
        s.replace(&k, changed).await.unwrap();
        let ev = tokio::time::timeout(Duration::from_secs(5), watch.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(ev.change, ChangeType::Modified);
        assert_eq!(ev.object["data"]["k"], "2");
    }

    pub async fn status_subresource<H: Harness>(h: H) {
        let s = h.store();
        let k = widget_kind();
        let obj = json!({"apiVersion": k.api_version, "kind": k.kind,
            "metadata": {"name": "w", "namespace": "ns1"}, "spec": {"size": 1}, "status": {"ready": true}});
        let w = s.create(&k, obj).await.unwrap();
        assert!(w.get("status").is_none(), "status is ignored on create");
        assert_eq!(w["metadata"]["generation"], 1);
        let mut st = w.clone();
        st["status"] = json!({"ready": true});
        st["spec"] = json!({"size": 99});
        let w2 = s.replace_status(&k, st).await.unwrap();
        assert_eq!(w2["status"]["ready"], true);
        assert_eq!(w2["spec"]["size"], 1, "a status write ignores spec");
        let mut sp = w2.clone();
        sp["spec"] = json!({"size": 2});
        sp["status"] = json!({"ready": false});
        let w3 = s.replace(&k, sp).await.unwrap();
        assert_eq!(w3["spec"]["size"], 2);
        assert_eq!(w3["status"]["ready"], true, "a main write ignores status");
        assert_eq!(
            w3["metadata"]["generation"], 2,
            "spec changes bump generation"
        );
    }

    /// `merge_status`: a merge patch of the status, conditional on the resourceVersion, that
    /// readers, watchers and a restart see as if the status had been written whole (the embedded
    /// backend stores patches beside the object and stores it whole again every so often).
    pub async fn status_merge_patches<H: Harness>(h: H) {
        let s = h.store();
        let k = widget_kind();
        let obj = json!({"apiVersion": k.api_version, "kind": k.kind,
            "metadata": {"name": "m", "namespace": "ns1"}, "spec": {"size": 1}});
        let w = s.create(&k, obj).await.unwrap();
        let v0 = w["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        let missing = s
            .merge_status(&k, "ns1", "nope", &v0, &json!({"n": 1}))
            .await;
        assert!(
            matches!(missing, Err(StoreError::NotFound { .. })),
            "{missing:?}"
        );
        let stale = s
            .merge_status(&k, "ns1", "m", "999999999", &json!({"n": 1}))
            .await;
        assert!(
            matches!(stale, Err(StoreError::Conflict { .. })),
            "{stale:?}"
        );

        let mut watch = s.watch(&k, Some("ns1"), &v0).await.unwrap();
        let v1 = s
            .merge_status(
                &k,
                "ns1",
                "m",
                &v0,
                &json!({"n": 1, "held": {"a": "x", "b": "y"}}),
            )
            .await
            .unwrap();
        assert!(v1.parse::<u64>().unwrap() > v0.parse::<u64>().unwrap());
        let ev = tokio::time::timeout(Duration::from_secs(5), watch.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(
            ev.object["status"],
            json!({"n": 1, "held": {"a": "x", "b": "y"}})
        );
        assert_eq!(
            ev.object["spec"],
            json!({"size": 1}),
            "a status patch leaves spec"
        );
        assert_eq!(ev.object["metadata"]["resourceVersion"], v1.as_str());
        let same = s
            .merge_status(&k, "ns1", "m", &v1, &json!({"n": 1, "held": {"a": "x"}}))
            .await
            .unwrap();
        assert_eq!(same, v1, "a patch that changes nothing writes nothing");
        // `merge_status_planned` tells the writer the version its write has (before the watch
        // delivers it where the backend can): exactly the one returned, and none for a write that
        // changes nothing or fails.
        let told = std::sync::Mutex::new(Vec::new());
        let note = |v: &str| told.lock().unwrap().push(v.to_string());
        let unchanged = s
            .merge_status_planned(&k, "ns1", "m", &v1, &json!({"n": 1}), &note)
            .await
            .unwrap();
        assert_eq!(unchanged, v1);
        let stale = s
            .merge_status_planned(&k, "ns1", "m", "999999999", &json!({"n": 5}), &note)
            .await;
        assert!(
            matches!(stale, Err(StoreError::Conflict { .. })),
            "{stale:?}"
        );
        assert!(told.lock().unwrap().is_empty(), "{told:?}");
        let v1 = s
            .merge_status_planned(&k, "ns1", "m", &v1, &json!({"planned": true}), &note)
            .await
            .unwrap();
        assert_eq!(told.lock().unwrap().as_slice(), std::slice::from_ref(&v1));
        let ev = tokio::time::timeout(Duration::from_secs(5), watch.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(ev.object["metadata"]["resourceVersion"], v1.as_str());
        let v1 = s
            .merge_status(&k, "ns1", "m", &v1, &json!({"planned": null}))
            .await
            .unwrap();

        // Many rounds, removals as null, then a restart: what was patched is what is read.
        let mut version = v1;
        let mut want = json!({"n": 1, "held": {"a": "x", "b": "y"}});
        for i in 0..150 {
            let patch =
                json!({"n": i, "held": {format!("k{i}"): "v", format!("k{}", i.max(1) - 1): null}});
            version = s
                .merge_status(&k, "ns1", "m", &version, &patch)
                .await
                .unwrap();
            json_patch::merge(&mut want, &patch);
        }
        let read = s.get(&k, "ns1", "m").await.unwrap().unwrap();
        assert_eq!(read["status"], want);
        assert_eq!(read["metadata"]["resourceVersion"], version.as_str());
        // The store is opened again only once nothing holds it.
        drop((watch, s));
        let h = h.reopen().await;
        let s = h.store();
        let read = s.get(&k, "ns1", "m").await.unwrap().unwrap();
        assert_eq!(read["status"], want, "patches survive a restart");
        assert_eq!(read["metadata"]["resourceVersion"], version.as_str());

        // A whole write after patches supersedes them, also across a restart; so does a deletion
        // and a new object of the same name.
        let mut whole = read.clone();
        whole["status"] = json!({"n": -1});
        let whole = s.replace_status(&k, whole).await.unwrap();
        let version = whole["metadata"]["resourceVersion"].as_str().unwrap();
        let version = s
            .merge_status(&k, "ns1", "m", version, &json!({"extra": true}))
            .await
            .unwrap();
        drop(s);
        let h = h.reopen().await;
        let s = h.store();
        let read = s.get(&k, "ns1", "m").await.unwrap().unwrap();
        assert_eq!(read["status"], json!({"n": -1, "extra": true}));
        assert_eq!(read["metadata"]["resourceVersion"], version.as_str());
        s.delete(&k, "ns1", "m", &Preconditions::default())
            .await
            .unwrap();
        let obj = json!({"apiVersion": k.api_version, "kind": k.kind,
            "metadata": {"name": "m", "namespace": "ns1"}, "spec": {"size": 2}});
        let again = s.create(&k, obj).await.unwrap();
        drop(s);
        let h = h.reopen().await;
        let read = h.store().get(&k, "ns1", "m").await.unwrap().unwrap();
        assert_eq!(read, again, "nothing of the deleted object's patches");
    }

    pub async fn finalizers_and_preconditions<H: Harness>(h: H) {
        let s = h.store();
        let k = cm_kind();
        let mut obj = mk_cm("f", "1");
        obj["metadata"]["finalizers"] = json!(["example.com/cleanup"]);
        let f = s.create(&k, obj).await.unwrap();
        let wrong = Preconditions {
            uid: Some("other".into()),
            ..Default::default()
        };
        assert!(matches!(
            s.delete(&k, "ns1", "f", &wrong).await,
            Err(StoreError::Conflict { .. })
        ));
        let pending = match s
            .delete(&k, "ns1", "f", &Preconditions::default())
            .await
            .unwrap()
        {
            Deleted::Pending(v) => v,
            Deleted::Gone(_) => panic!("an object with finalizers must wait"),
        };
        assert!(pending["metadata"]["deletionTimestamp"].is_string());
        // No new finalizers while terminating.
        let mut more = pending.clone();
        more["metadata"]["finalizers"] = json!(["example.com/cleanup", "x/y"]);
        assert_eq!(
            invalid_reason(s.replace(&k, more).await),
            "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{\"x/y\"}"
        );
        // Removing the last finalizer completes the deletion.
        let mut done = pending.clone();
        done["metadata"]["finalizers"] = json!([]);
        s.replace(&k, done).await.unwrap();
        assert!(s.get(&k, "ns1", "f").await.unwrap().is_none());
        assert_ne!(f["metadata"]["uid"], json!(null));
        assert!(matches!(
            s.delete(&k, "ns1", "f", &Preconditions::default()).await,
            Err(StoreError::NotFound { .. })
        ));
    }

    pub async fn dependents_are_collected<H: Harness>(h: H) {
        let s = h.store();
        let k = cm_kind();
        let owner = s.create(&k, mk_cm("owner", "1")).await.unwrap();
        let mut dep = mk_cm("dep", "1");
        dep["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap",
            "name": "owner", "uid": owner["metadata"]["uid"]}]);
        s.create(&k, dep).await.unwrap();
        // Owned by another live object, which stays.
        let keeper = s.create(&k, mk_cm("keeper", "1")).await.unwrap();
        let mut other = mk_cm("other", "1");
        other["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap",
            "name": "keeper", "uid": keeper["metadata"]["uid"]}]);
        s.create(&k, other).await.unwrap();
        s.delete(&k, "ns1", "owner", &Preconditions::default())
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while s.get(&k, "ns1", "dep").await.unwrap().is_some() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "dependent was not collected"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(s.get(&k, "ns1", "other").await.unwrap().is_some());
        // A dependent whose only owner never existed is collected too.
        let mut orphan = mk_cm("orphan", "1");
        orphan["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap",
            "name": "x", "uid": "no-such-owner"}]);
        s.create(&k, orphan).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while s.get(&k, "ns1", "orphan").await.unwrap().is_some() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the orphan was not collected"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(s.get(&k, "ns1", "keeper").await.unwrap().is_some());
    }

    pub async fn label_selectors_and_namespaces<H: Harness>(h: H) {
        let s = h.store();
        let k = cm_kind();
        for (name, tier) in [("a", "web"), ("b", "db"), ("c", "web")] {
            s.create(&k, mk_cm(name, tier)).await.unwrap();
        }
        let mut elsewhere = mk_cm("d", "web");
        elsewhere["metadata"]["namespace"] = json!("ns2");
        s.create(&k, elsewhere).await.unwrap();
        let names = |items: Vec<Value>| {
            let mut n: Vec<String> = items
                .iter()
                .map(|v| v["metadata"]["name"].as_str().unwrap().to_string())
                .collect();
            n.sort();
            n
        };
        let sel = LabelSelector::parse("tier=web").unwrap();
        assert_eq!(
            names(s.list(&k, Some("ns1"), &sel).await.unwrap().items),
            ["a", "c"]
        );
        assert_eq!(
            names(s.list(&k, None, &sel).await.unwrap().items),
            ["a", "c", "d"]
        );
        let sel = LabelSelector::parse("tier notin (web),app").unwrap();
        assert_eq!(names(s.list(&k, None, &sel).await.unwrap().items), ["b"]);
        // A list handed over object by object (as watchers list) holds what the list does.
        let sel = LabelSelector::parse("tier=web").unwrap();
        let mut visited = Vec::new();
        let rv = s
            .list_each(&k, None, &sel, &mut |v| visited.push(v))
            .await
            .unwrap();
        assert_eq!(names(visited), ["a", "c", "d"]);
        assert!(!rv.is_empty(), "a resourceVersion");
        // (By label: a control plane writes a ConfigMap of its own into every namespace.)
        let mut visited = Vec::new();
        s.list_each(&k, Some("ns2"), &sel, &mut |v| visited.push(v))
            .await
            .unwrap();
        assert_eq!(names(visited), ["d"]);
    }

    pub async fn watch_replays_and_follows<H: Harness>(h: H) {
        let s = h.store();
        let k = cm_kind();
        let start = s
            .list(&k, None, &LabelSelector::everything())
            .await
            .unwrap()
            .resource_version;
        let a = s.create(&k, mk_cm("a", "1")).await.unwrap();
        let mut a2 = a.clone();
        a2["data"]["k"] = json!("2");
        s.replace(&k, a2).await.unwrap();
        // Replay from before the changes, then live events.
        let mut w = s.watch(&k, Some("ns1"), &start).await.unwrap();
        s.delete(&k, "ns1", "a", &Preconditions::default())
            .await
            .unwrap();
        let mut got = Vec::new();
        for _ in 0..3 {
            let ev = tokio::time::timeout(Duration::from_secs(5), w.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            got.push((ev.change, ev.resource_version));
        }
        assert_eq!(
            got.iter().map(|g| g.0).collect::<Vec<_>>(),
            [ChangeType::Added, ChangeType::Modified, ChangeType::Deleted]
        );
        assert!(
            got.windows(2).all(|w| w[0].1 < w[1].1),
            "versions increase: {got:?}"
        );
        // Other kinds and namespaces are not delivered.
        let mut other = mk_cm("b", "1");
        other["metadata"]["namespace"] = json!("ns2");
        s.create(&k, other).await.unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(200), w.next())
                .await
                .is_err()
        );
    }

    /// A write whose caller goes away (a client hanging up, a timeout) is done whole or not at
    /// all: what the store shows afterwards is what it has stored, and it goes on writing.
    pub async fn abandoned_writes_are_whole_or_absent<H: Harness>(h: H) {
        let k = cm_kind();
        let s = h.store();
        let base = s.create(&k, mk_cm("base", "0")).await.unwrap();
        for i in 0..60u64 {
            let name = format!("w{i}");
            // Dropped at every stage: before the first poll, after a few polls, after a delay.
            let mut create = Box::pin(s.create(&k, mk_cm(&name, "1")));
            for _ in 0..(i % 4) {
                if futures::poll!(create.as_mut()).is_ready() {
                    break;
                }
                tokio::task::yield_now().await;
            }
            drop(create);
            let _ = tokio::time::timeout(
                Duration::from_micros(i * 97 % 3000),
                s.replace(&k, {
                    let mut b = mk_cm("base", &i.to_string());
                    b["metadata"]["resourceVersion"] = Value::Null;
                    b
                }),
            )
            .await;
        }
        // Writes go on, with versions above every earlier one.
        let after = s.create(&k, mk_cm("after", "1")).await.unwrap();
        assert!(rv(&after) > rv(&base));
        // Let requests a backend still had in flight land before comparing.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let everything = LabelSelector::everything();
        let names_and_versions = |items: Vec<Value>| {
            let mut v: Vec<(String, String)> = items
                .iter()
                .map(|o| {
                    (
                        o["metadata"]["name"].as_str().unwrap().to_string(),
                        o["metadata"]["resourceVersion"]
                            .as_str()
                            .unwrap()
                            .to_string(),
                    )
                })
                .collect();
            v.sort();
            v
        };
        let before = names_and_versions(s.list(&k, Some("ns1"), &everything).await.unwrap().items);
        let versions: std::collections::BTreeSet<&String> =
            before.iter().map(|(_, rv)| rv).collect();
        assert_eq!(
            versions.len(),
            before.len(),
            "no version is used twice: {before:?}"
        );
        drop(s);
        let h = h.reopen().await;
        let s = h.store();
        let reopened =
            names_and_versions(s.list(&k, Some("ns1"), &everything).await.unwrap().items);
        assert_eq!(reopened, before, "what was shown is what was stored");
        s.create(&k, mk_cm("after-reopen", "1")).await.unwrap();
    }

    /// Objects created buffered (several for one request, then one sync) are what plain creates
    /// are: read back, seen by watchers, conflicts alike, and on disk once `sync` returns.
    pub async fn buffered_creates_are_durable_once_synced<H: Harness>(h: H) {
        let k = cm_kind();
        let s = h.store();
        let mut made = Vec::new();
        for i in 0..5 {
            made.push(
                s.create_buffered(&k, mk_cm(&format!("b{i}"), "1"))
                    .await
                    .unwrap(),
            );
        }
        let again = s.create_buffered(&k, mk_cm("b0", "2")).await;
        assert!(
            matches!(again, Err(StoreError::AlreadyExists { .. })),
            "{again:?}"
        );
        let mut w = s
            .watch(&k, Some("ns1"), &(rv(&made[0]) - 1).to_string())
            .await
            .unwrap();
        let mut seen = Vec::new();
        while seen.len() < made.len() {
            let ev = tokio::time::timeout(Duration::from_secs(5), w.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            // Only ours (a control plane writes ConfigMaps of its own into namespaces).
            if ev.object["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with('b'))
            {
                seen.push(ev.object["metadata"]["name"].clone());
            }
        }
        let names: Vec<&Value> = made.iter().map(|m| &m["metadata"]["name"]).collect();
        assert_eq!(seen.iter().collect::<Vec<_>>(), names);
        s.sync().await.unwrap();
        assert_eq!(
            s.get(&k, "ns1", "b4").await.unwrap().as_ref(),
            Some(&made[4])
        );
        drop((s, w));
        let h = h.reopen().await;
        let s = h.store();
        for m in &made {
            let name = m["metadata"]["name"].as_str().unwrap();
            assert_eq!(s.get(&k, "ns1", name).await.unwrap().as_ref(), Some(m));
        }
    }

    /// Objects created each (the Event recorder's batches) are answered one by one, in order: a
    /// taken name, one repeated in the batch or an invalid one is refused alone, the others are
    /// stored in order (increasing versions), and there once `sync` returns.
    pub async fn objects_created_each_are_answered_one_by_one<H: Harness>(h: H) {
        let k = cm_kind();
        let s = h.store();
        s.create(&k, mk_cm("e-taken", "1")).await.unwrap();
        let answers = s
            .create_each(
                &k,
                vec![
                    mk_cm("e-a", "1"),
                    mk_cm("e-taken", "2"),
                    mk_cm("E_Invalid", "1"),
                    mk_cm("e-a", "2"),
                    json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"generateName": "e-gen-", "namespace": "ns1"}}),
                    mk_cm("e-b", "1"),
                ],
            )
            .await;
        assert_eq!(answers.len(), 6);
        assert!(
            matches!(&answers[1], Err(StoreError::AlreadyExists { .. })),
            "{:?}",
            answers[1]
        );
        assert!(
            matches!(&answers[2], Err(StoreError::Invalid { .. })),
            "{:?}",
            answers[2]
        );
        assert!(
            matches!(&answers[3], Err(StoreError::AlreadyExists { .. })),
            "repeated in the batch: {:?}",
            answers[3]
        );
        let made: Vec<&Value> = [0, 4, 5]
            .iter()
            .map(|&i| answers[i].as_ref().expect("created"))
            .collect();
        assert!(
            made[1]["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("e-gen-")
        );
        assert!(
            rv(made[0]) < rv(made[1]) && rv(made[1]) < rv(made[2]),
            "stored in order"
        );
        assert_eq!(made[0]["data"]["k"], "1", "the first of the repeated name");
        s.sync().await.unwrap();
        drop(s);
        let h = h.reopen().await;
        let s = h.store();
        for m in made {
            let name = m["metadata"]["name"].as_str().unwrap();
            assert_eq!(s.get(&k, "ns1", name).await.unwrap().as_ref(), Some(m));
        }
    }

    /// An owner and its dependents created together are there all together or not at all (a
    /// backend that cannot answers `None`, and its callers create them one by one).
    pub async fn created_together_or_not_at_all<H: Harness>(h: H) {
        use harvester_cloud::store::Dependents;
        let k = cm_kind();
        let s = h.store();
        s.create(&k, mk_cm("t-taken", "1")).await.unwrap();
        let deps = |names: Vec<&'static str>| -> Dependents {
            Box::new(move |owner: &Value| {
                let uid = owner["metadata"]["uid"].clone();
                assert!(uid.is_string(), "the owner's uid is known: {owner}");
                Ok(names
                    .iter()
                    .map(|n| {
                        let mut c = mk_cm(n, "1");
                        c["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1",
                            "kind": "ConfigMap", "name": "t-owner", "uid": uid}]);
                        (cm_kind(), c)
                    })
                    .collect())
            })
        };
        match s
            .create_together(&k, mk_cm("t-owner", "1"), deps(vec!["t-a", "t-taken"]))
            .await
        {
            Ok(None) => return,
            Err(StoreError::AlreadyExists { .. }) => {}
            other => panic!("a taken name must refuse the whole: {other:?}"),
        }
        for name in ["t-owner", "t-a"] {
            assert_eq!(s.get(&k, "ns1", name).await.unwrap(), None, "{name}");
        }
        let made = s
            .create_together(&k, mk_cm("t-owner", "1"), deps(vec!["t-a", "t-b"]))
            .await
            .unwrap()
            .unwrap();
        let names: Vec<&str> = made
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["t-owner", "t-a", "t-b"]);
        assert!(rv(&made[0]) < rv(&made[1]) && rv(&made[1]) < rv(&made[2]));
        for d in &made[1..] {
            assert_eq!(
                d["metadata"]["ownerReferences"][0]["uid"],
                made[0]["metadata"]["uid"]
            );
        }
        s.sync().await.unwrap();
        drop(s);
        let h = h.reopen().await;
        let s = h.store();
        for m in &made {
            let name = m["metadata"]["name"].as_str().unwrap();
            assert_eq!(s.get(&k, "ns1", name).await.unwrap().as_ref(), Some(m));
        }
    }

    /// Metadata kube-apiserver refuses is refused with its message (apimachinery's
    /// `ValidateObjectMeta`); what it accepts is accepted. On the kube backend the real API server
    /// answers, so the expected messages below are checked against it: both backends pass only if
    /// they say the same.
    pub async fn metadata_is_validated_as_the_api_server_does<H: Harness>(h: H) {
        let s = h.store();
        let k = cm_kind();
        let label_value_msg = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
        let name_part = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
        let long = "x".repeat(64);
        let big = "v".repeat(300 * 1024);
        let refused: Vec<(Value, String)> = vec![
            (
                json!({"labels": {"l": "<b> x"}}),
                format!("metadata.labels: Invalid value: \"<b> x\": {label_value_msg}"),
            ),
            (
                json!({"labels": {"cloudprovider.harvesterhci.io/cluster": "<html>"}}),
                format!("metadata.labels: Invalid value: \"<html>\": {label_value_msg}"),
            ),
            (
                json!({"labels": {"l": long}}),
                format!("metadata.labels: Invalid value: \"{long}\": must be no more than 63 bytes"),
            ),
            (
                json!({"labels": {"a b": "v"}}),
                format!("metadata.labels: Invalid value: \"a b\": {name_part}"),
            ),
            (
                json!({"labels": {"/x": "v"}}),
                "metadata.labels: Invalid value: \"/x\": prefix part must be non-empty".into(),
            ),
            (
                json!({"labels": {"Example.com/x": "v"}}),
                "metadata.labels: Invalid value: \"Example.com/x\": prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".into(),
            ),
            (
                json!({"labels": {"a/b/c": "v"}}),
                "metadata.labels: Invalid value: \"a/b/c\": a valid label key must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".into(),
            ),
            (
                json!({"annotations": {"Bad Key": "v"}}),
                format!("metadata.annotations: Invalid value: \"Bad Key\": {name_part}"),
            ),
            (
                json!({"annotations": {"k": big}}),
                "metadata.annotations: Too long: may not be more than 262144 bytes".into(),
            ),
            (
                // A ConfigMap is a built-in kind: the core group adds its own check of a name
                // without a domain (a custom resource only gets a warning, below).
                json!({"finalizers": ["bad finalizer"]}),
                format!("[metadata.finalizers: Invalid value: \"bad finalizer\": {name_part}, metadata.finalizers[0]: Invalid value: \"bad finalizer\": name is neither a standard finalizer name nor is it fully qualified]"),
            ),
            (
                json!({"finalizers": ["example.com/f", "no-domain"]}),
                "metadata.finalizers[1]: Invalid value: \"no-domain\": name is neither a standard finalizer name nor is it fully qualified".into(),
            ),
            (
                json!({"finalizers": ["orphan", "foregroundDeletion"]}),
                "metadata.finalizers: Invalid value: [\"orphan\",\"foregroundDeletion\"]: finalizer orphan and foregroundDeletion cannot be both set".into(),
            ),
            (
                json!({"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "o"}]}),
                "metadata.ownerReferences.uid: Invalid value: \"\": must not be empty".into(),
            ),
            (
                json!({"ownerReferences": [{"apiVersion": "", "kind": "ConfigMap", "name": "o", "uid": "u"}]}),
                "metadata.ownerReferences.apiVersion: Invalid value: \"\": version must not be empty".into(),
            ),
            (
                json!({"ownerReferences": [{"apiVersion": "v1", "kind": "Event", "name": "<e>", "uid": "u"}]}),
                "metadata.ownerReferences: Invalid value: {\"apiVersion\":\"v1\",\"kind\":\"Event\",\"name\":\"\\u003ce\\u003e\",\"uid\":\"u\"}: /v1, Kind=Event is disallowed from being an owner".into(),
            ),
            (
                json!({"ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "a", "uid": "u1", "controller": true},
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "b", "uid": "u2", "controller": true, "blockOwnerDeletion": false}]}),
                "metadata.ownerReferences: Invalid value: [{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"name\":\"a\",\"uid\":\"u1\",\"controller\":true},{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"name\":\"b\",\"uid\":\"u2\",\"controller\":true,\"blockOwnerDeletion\":false}]: Only one reference can have Controller set to true. Found \"true\" in references for ConfigMap/a and ConfigMap/b".into(),
            ),
        ];
        let refused_count = refused.len();
        for (i, (meta, want)) in refused.into_iter().enumerate() {
            let mut obj = mk_cm(&format!("m{i}"), "1");
            merge_meta(&mut obj, &meta);
            assert_eq!(
                invalid_reason(s.create(&k, obj).await),
                want,
                "create with {meta}"
            );
        }
        // Accepted by the API server, so here too.
        let at_limit = "v".repeat(256 * 1024 - 1);
        let accepted = [
            json!({"labels": {"empty": "", "max": "x".repeat(63), "example.com/Key_1": "v.1"}}),
            json!({"annotations": {"UPPER.Example.COM/Key": "<html> ‹img…>"}}),
            json!({"annotations": {"k": at_limit}}),
            json!({"finalizers": ["kubernetes", "orphan", "example.com/f"]}),
        ];
        for (i, meta) in accepted.into_iter().enumerate() {
            let mut obj = mk_cm(&format!("ok{i}"), "1");
            merge_meta(&mut obj, &meta);
            s.create(&k, obj)
                .await
                .unwrap_or_else(|e| panic!("{meta}: {e}"));
        }
        // An update is judged as a create is.
        let u = s.create(&k, mk_cm("upd", "1")).await.unwrap();
        let mut bad = u.clone();
        bad["metadata"]["labels"]["l"] = json!("<b> x");
        assert_eq!(
            invalid_reason(s.replace(&k, bad).await),
            format!("metadata.labels: Invalid value: \"<b> x\": {label_value_msg}")
        );
        // And a custom resource as a built-in kind.
        let w = widget_kind();
        let obj = json!({"apiVersion": w.api_version, "kind": w.kind,
            "metadata": {"name": "w-bad", "namespace": "ns1", "labels": {"l": "<b> x"}}, "spec": {"size": 1}});
        assert_eq!(
            invalid_reason(s.create(&w, obj).await),
            format!("metadata.labels: Invalid value: \"<b> x\": {label_value_msg}")
        );
        // ...except for a finalizer name without a domain, of which kube-apiserver only warns.
        let obj = json!({"apiVersion": w.api_version, "kind": w.kind,
            "metadata": {"name": "w-ok", "namespace": "ns1", "finalizers": ["no-domain"]}, "spec": {"size": 1}});
        s.create(&w, obj)
            .await
            .expect("a custom resource may have a finalizer without a domain");
        // Nothing refused was stored.
        for i in 0..refused_count {
            assert!(s.get(&k, "ns1", &format!("m{i}")).await.unwrap().is_none());
        }
    }

    pub async fn restart_keeps_objects_and_versions<H: Harness>(h: H) {
        let k = cm_kind();
        let a = h.store().create(&k, mk_cm("a", "1")).await.unwrap();
        let h = h.reopen().await;
        let s = h.store();
        assert_eq!(s.get(&k, "ns1", "a").await.unwrap().unwrap(), a);
        let b = s.create(&k, mk_cm("b", "1")).await.unwrap();
        assert!(rv(&b) > rv(&a), "versions keep increasing across restarts");
        let from_before = s
            .watch(&k, None, &rv(&a).saturating_sub(1).to_string())
            .await;
        if h.history_survives_restart() {
            // The API server still has the history: the watch replays from there.
            let mut w = from_before.unwrap();
            let ev = tokio::time::timeout(Duration::from_secs(5), w.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            assert_eq!(ev.object["metadata"]["name"], "a");
        } else {
            // A new history: a watch from before the restart must relist.
            assert!(matches!(from_before, Err(StoreError::Gone)));
        }
    }
}

// Group commit (fsync shared by concurrent writers) and plain WAL commits must behave the same.
suite!(
    [embedded_full => Embedded::start(Durability::Full), embedded_normal => Embedded::start(Durability::Normal), kube => Kube::start()],
    [
        create_get_and_conflicts,
        noop_writes_change_nothing,
        status_subresource,
        status_merge_patches,
        finalizers_and_preconditions,
        dependents_are_collected,
        label_selectors_and_namespaces,
        watch_replays_and_follows,
        restart_keeps_objects_and_versions,
        abandoned_writes_are_whole_or_absent,
        buffered_creates_are_durable_once_synced,
        objects_created_each_are_answered_one_by_one,
        created_together_or_not_at_all,
        metadata_is_validated_as_the_api_server_does,
    ]
);
