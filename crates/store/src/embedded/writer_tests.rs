//! Tests of group commit ([`super::writer`]): writes queued together commit as one transaction,
//! each planned on the ones before it, failing together without a trace, and every acknowledged
//! write survives a crash. A test holds the writer's connection to make the committer wait while
//! writes queue up, so that a batch holds exactly the writes it means.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use serde_json::{Value, json};

use super::{Durability, EmbeddedStore};
use crate::{ChangeType, Kind, LabelSelector, ObjectStore, Preconditions, StoreError};

fn cm_kind() -> Kind {
    Kind::of::<k8s_openapi::api::core::v1::ConfigMap>()
}

/// A kind of our own with a status subresource.
fn widget_kind() -> Kind {
    Kind {
        group: "example.harvesterhci.io".into(),
        version: "v1".into(),
        api_version: "example.harvesterhci.io/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
        namespaced: true,
        status_subresource: true,
        names: crate::NameRule::Subdomain,
    }
}

fn mk_cm(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "ns"}, "data": {"k": name}})
}

fn rv(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("resourceVersion")
}

fn counts(store: &EmbeddedStore) -> (u64, u64) {
    let p = crate::sync::lock(&store.pending);
    (p.transactions, p.writes)
}

fn queued(store: &EmbeddedStore) -> usize {
    crate::sync::lock(&store.pending).queued()
}

/// Starts `write` in a task and waits until it is queued behind the held writer.
async fn queue<T: Send + 'static>(
    store: &Arc<EmbeddedStore>,
    write: impl std::future::Future<Output = T> + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    let before = queued(store);
    let task = tokio::spawn(write);
    for _ in 0..5000 {
        if queued(store) > before {
            return task;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the write was not queued");
}

/// [`queue`] of a create of the ConfigMap `name`.
async fn queue_create(
    store: &Arc<EmbeddedStore>,
    name: &str,
) -> tokio::task::JoinHandle<Result<Value, StoreError>> {
    let (s, object) = (store.clone(), mk_cm(name));
    queue(store, async move { s.create(&cm_kind(), object).await }).await
}

async fn names(store: &EmbeddedStore) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = store
        .list(&cm_kind(), Some("ns"), &LabelSelector::everything())
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| (o["metadata"]["name"].as_str().unwrap().to_string(), rv(o)))
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_queued_together_commit_as_one_transaction_in_version_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), Durability::Full)
        .await
        .unwrap();
    let base = store.read().rv;
    let mut watch = store.watch(&cm_kind(), None, "").await.unwrap();
    let (tx0, w0) = counts(&store);
    let held = store.writer.lock().await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        tasks.push(queue_create(&store, &format!("c{i}")).await);
    }
    // Queued, not committed: nobody reads them yet.
    assert!(names(&store).await.is_empty());
    drop(held);
    for (i, t) in tasks.into_iter().enumerate() {
        let made = t.await.unwrap().unwrap();
        assert_eq!(rv(&made), base + 1 + i as u64, "planned in order");
        // Acknowledged only once on disk.
        assert!(*store.durable.borrow() >= rv(&made));
    }
    assert_eq!(counts(&store), (tx0 + 1, w0 + 20), "one transaction");
    for i in 0..20u64 {
        let c = tokio::time::timeout(Duration::from_secs(5), watch.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(c.resource_version, base + 1 + i, "published in order");
    }
    store.close().await;
    drop(store);
    let store = EmbeddedStore::open(dir.path(), Durability::Full)
        .await
        .unwrap();
    assert_eq!(names(&store).await.len(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_write_of_a_batch_is_planned_on_the_ones_before_it() {
    for durability in [Durability::Full, Durability::Normal] {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), durability).await.unwrap();
        let k = cm_kind();
        let base = store.read().rv;
        let (tx0, _) = counts(&store);
        let held = store.writer.lock().await;
        let created = queue_create(&store, "a").await;
        let again = queue_create(&store, "a").await;
        let s = store.clone();
        let updated = queue(&store, async move {
            let mut a = mk_cm("a");
            a["data"]["k"] = json!("updated");
            s.replace(&cm_kind(), a).await
        })
        .await;
        let s = store.clone();
        let stale = queue(&store, async move {
            let mut a = mk_cm("a");
            a["metadata"]["resourceVersion"] = json!((base + 1).to_string());
            s.replace(&cm_kind(), a).await
        })
        .await;
        let b = queue_create(&store, "b").await;
        let s = store.clone();
        let deleted = queue(&store, async move {
            s.delete(&cm_kind(), "ns", "b", &Preconditions::default())
                .await
        })
        .await;
        // Readers see none of it while it is queued.
        assert_eq!(store.get(&k, "ns", "a").await.unwrap(), None);
        drop(held);
        assert_eq!(rv(&created.await.unwrap().unwrap()), base + 1);
        let again = again.await.unwrap();
        assert!(
            matches!(again, Err(StoreError::AlreadyExists { .. })),
            "{again:?}"
        );
        let updated = updated.await.unwrap().unwrap();
        assert_eq!(rv(&updated), base + 2, "the update saw the create");
        assert_eq!(updated["data"]["k"], "updated");
        let stale = stale.await.unwrap();
        assert!(
            matches!(stale, Err(StoreError::Conflict { .. })),
            "{stale:?}"
        );
        assert_eq!(rv(&b.await.unwrap().unwrap()), base + 3);
        deleted.await.unwrap().unwrap();
        assert_eq!(counts(&store).0, tx0 + 1, "one transaction");
        let a = store.get(&k, "ns", "a").await.unwrap().unwrap();
        assert_eq!(a["data"]["k"], "updated");
        assert_eq!(store.get(&k, "ns", "b").await.unwrap(), None);
        assert_eq!(store.read().rv, base + 4);
        store.close().await;
        drop(store);
        let store = EmbeddedStore::open(dir.path(), durability).await.unwrap();
        assert_eq!(names(&store).await, vec![("a".to_string(), base + 2)]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_transaction_fails_its_writes_and_leaves_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), Durability::Full)
        .await
        .unwrap();
    let k = cm_kind();
    store.create(&k, mk_cm("before")).await.unwrap();
    let base = store.read().rv;
    let mut watch = store.watch(&k, None, "").await.unwrap();
    // The second of three queued writes fails: the transaction holds all three.
    store.inject_write_failures(1, 1);
    let held = store.writer.lock().await;
    let mut tasks = Vec::new();
    for name in ["x1", "x2", "x3"] {
        tasks.push(queue_create(&store, name).await);
    }
    // Planned on x1 (queued): refused as it exists, but answered only once x1 is settled.
    let dup = queue_create(&store, "x1").await;
    drop(held);
    for t in tasks {
        let r = t.await.unwrap();
        assert!(matches!(r, Err(StoreError::Backend(_))), "{r:?}");
    }
    // x1 never existed: "already exists" would have shown it.
    let dup = dup.await.unwrap();
    assert!(matches!(dup, Err(StoreError::Backend(_))), "{dup:?}");
    assert_eq!(names(&store).await, vec![("before".to_string(), base)]);
    assert_eq!(store.read().rv, base, "memory is not ahead of the database");
    // The store goes on, without handing out the failed writes' versions again: a writer may
    // have been told one (`merge_status_planned`) and must not take another's change for its own.
    let next = store.create(&k, mk_cm("x2")).await.unwrap();
    assert_eq!(rv(&next), base + 4);
    let c = tokio::time::timeout(Duration::from_secs(5), watch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        (c.change, c.resource_version),
        (ChangeType::Added, base + 4)
    );
    let shown = names(&store).await;
    store.close().await;
    drop(store);
    let store = EmbeddedStore::open(dir.path(), Durability::Full)
        .await
        .unwrap();
    assert_eq!(
        names(&store).await,
        shown,
        "the database is what memory was"
    );
    assert_eq!(store.read().rv, base + 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_failures_are_counted_in_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), Durability::Full)
        .await
        .unwrap();
    store.inject_write_failures(2, 2);
    let mut outcomes = Vec::new();
    for i in 0..5 {
        outcomes.push(
            store
                .create(&cm_kind(), mk_cm(&format!("n{i}")))
                .await
                .is_ok(),
        );
    }
    assert_eq!(outcomes, [true, true, false, false, true]);
    // A write that changes nothing is not counted.
    store.inject_write_failures(0, 1);
    let n4 = store.get(&cm_kind(), "ns", "n4").await.unwrap().unwrap();
    store.replace(&cm_kind(), n4).await.unwrap();
    assert!(store.create(&cm_kind(), mk_cm("n5")).await.is_err());
    assert!(store.create(&cm_kind(), mk_cm("n5")).await.is_ok());
}

/// Set in the child of [`every_acknowledged_write_survives_a_crash`]: the data directory.
const CRASH_DIR: &str = "HARVESTER_CLOUD_GROUP_COMMIT_CRASH_DIR";

/// The child writes from 32 tasks at once and prints every write it had acknowledged; the
/// parent kills it (SIGKILL) mid-stream, reopens the store, and finds every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_survives_a_crash() {
    if let Ok(dir) = std::env::var(CRASH_DIR) {
        let store = EmbeddedStore::open(std::path::Path::new(&dir), Durability::Full)
            .await
            .unwrap();
        let mut tasks = Vec::new();
        for t in 0..32 {
            let s = store.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0.. {
                    let name = format!("t{t}-{i}");
                    let made = s.create(&cm_kind(), mk_cm(&name)).await.unwrap();
                    println!("acked {name} {}", rv(&made));
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        return;
    }
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "embedded::writer_tests::every_acknowledged_write_survives_a_crash",
            "--nocapture",
        ])
        .env(CRASH_DIR, dir.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut acked = Vec::new();
    for line in lines {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("acked ") {
            let (name, rv) = rest.split_once(' ').unwrap();
            acked.push((name.to_string(), rv.parse::<u64>().unwrap()));
            if acked.len() == 1500 {
                child.kill().unwrap();
            }
        }
    }
    child.wait().unwrap();
    assert!(acked.len() >= 1500, "the child wrote: {}", acked.len());
    let store = EmbeddedStore::open(dir.path(), Durability::Full)
        .await
        .unwrap();
    let stored: std::collections::HashMap<String, u64> = names(&store).await.into_iter().collect();
    for (name, rv) in &acked {
        assert_eq!(stored.get(name), Some(rv), "{name} was acknowledged");
    }
    // Versions stay unique and the store writes on above them.
    let top = stored.values().max().copied().unwrap_or_default();
    assert_eq!(store.read().rv, top);
    let after = store.create(&cm_kind(), mk_cm("after")).await.unwrap();
    assert!(rv(&after) > top);
}

/// Status patches queued together: each sees the version and the status the one before it made,
/// a stale one conflicts, and the store reopened has the status of both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_patches_of_a_batch_build_on_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), Durability::Full)
        .await
        .unwrap();
    let k = widget_kind();
    let made = store
        .create(
            &k,
            json!({"apiVersion": "example.harvesterhci.io/v1", "kind": "Widget",
                "metadata": {"name": "w", "namespace": "ns"}, "spec": {"filler": "x".repeat(4096)}}),
        )
        .await
        .unwrap();
    let r0 = rv(&made);
    let held = store.writer.lock().await;
    let patch = |from: u64, status: Value| {
        let (s, k) = (store.clone(), k.clone());
        async move {
            s.merge_status(&k, "ns", "w", &from.to_string(), &status)
                .await
        }
    };
    let first = queue(&store, patch(r0, json!({"a": "1"}))).await;
    let second = queue(&store, patch(r0 + 1, json!({"b": "2"}))).await;
    let stale = queue(&store, patch(r0, json!({"c": "3"}))).await;
    drop(held);
    assert_eq!(first.await.unwrap().unwrap(), (r0 + 1).to_string());
    assert_eq!(second.await.unwrap().unwrap(), (r0 + 2).to_string());
    let stale = stale.await.unwrap();
    assert!(
        matches!(stale, Err(StoreError::Conflict { .. })),
        "{stale:?}"
    );
    let expect = |w: &Value| {
        assert_eq!(
            (&w["status"]["a"], &w["status"]["b"], &w["status"]["c"]),
            (&json!("1"), &json!("2"), &Value::Null)
        );
        assert_eq!(rv(w), r0 + 2);
    };
    expect(&store.get(&k, "ns", "w").await.unwrap().unwrap());
    assert_eq!(
        store
            .read()
            .patches(made["metadata"]["uid"].as_str().unwrap())
            .count,
        2,
        "both stored as patches"
    );
    store.close().await;
    drop(store);
    let store = EmbeddedStore::open(dir.path(), Durability::Full)
        .await
        .unwrap();
    expect(&store.get(&k, "ns", "w").await.unwrap().unwrap());
}

/// A watch started while changes are being published sees each change once, in order: the
/// history it replays and the live changes it follows neither overlap nor leave a gap. (A change
/// moved into the history but not yet sent to the watchers was once delivered twice: replayed,
/// then sent live.) Each round writes a few objects buffered and watches from before them at
/// once, while the syncer publishes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_started_during_publishing_see_each_change_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), Durability::Full)
        .await
        .unwrap();
    for round in 0..1000 {
        let mut made = Vec::new();
        for i in 0..5 {
            made.push(
                store
                    .create_buffered(&cm_kind(), mk_cm(&format!("r{round}-{i}")))
                    .await
                    .unwrap(),
            );
        }
        let since = rv(&made[0]) - 1;
        let mut w = store
            .watch(&cm_kind(), Some("ns"), &since.to_string())
            .await
            .unwrap();
        let mut seen = Vec::new();
        while seen.len() < made.len() {
            let c = tokio::time::timeout(Duration::from_secs(10), w.next())
                .await
                .expect("the watch follows")
                .unwrap()
                .unwrap();
            seen.push(c.resource_version);
        }
        let want: Vec<u64> = made.iter().map(rv).collect();
        assert_eq!(seen, want, "round {round}");
    }
}

/// The index holds an object written whole as its stored text, not as a tree (which takes several
/// times the memory), before and after a reopen; an object last written by a status patch is a
/// tree. The owners an object names are indexed from its text, so dependents are found (and
/// collected) after a reopen as before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_written_whole_are_held_as_their_text() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), Durability::Full)
        .await
        .unwrap();
    let k = cm_kind();
    let owner = store.create(&k, mk_cm("owner")).await.unwrap();
    let mut dep = mk_cm("dep");
    dep["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap",
        "name": "owner", "uid": owner["metadata"]["uid"]}]);
    let dep = store.create(&k, dep).await.unwrap();
    let widget = widget_kind();
    let w = store
        .create(
            &widget,
            json!({"apiVersion": "example.harvesterhci.io/v1", "kind": "Widget",
                "metadata": {"name": "w", "namespace": "ns"}, "spec": {"filler": "x".repeat(4096)}}),
        )
        .await
        .unwrap();
    store
        .merge_status(&widget, "ns", "w", &rv(&w).to_string(), &json!({"a": "1"}))
        .await
        .unwrap();
    let is_tree = |s: &EmbeddedStore, k: &Kind, name: &str| {
        s.read()
            .held(&k.api_version, &k.kind, "ns", name)
            .map(super::held::Held::is_tree)
    };
    assert_eq!(is_tree(&store, &k, "dep"), Some(false));
    assert_eq!(is_tree(&store, &widget, "w"), Some(true), "status patched");
    assert_eq!(store.get(&k, "ns", "dep").await.unwrap(), Some(dep.clone()));
    store.close().await;
    drop(store);
    let store = EmbeddedStore::open(dir.path(), Durability::Full)
        .await
        .unwrap();
    assert_eq!(is_tree(&store, &k, "dep"), Some(false), "loaded as text");
    assert_eq!(store.get(&k, "ns", "dep").await.unwrap(), Some(dep));
    let owner_uid = owner["metadata"]["uid"].as_str().unwrap();
    let deps = store.read().dependents_of(owner_uid);
    assert_eq!(
        deps.len(),
        1,
        "the owner's dependent, indexed from its text"
    );
    assert_eq!(deps[0].2["metadata"]["name"], "dep");
    store
        .delete(&k, "ns", "owner", &Preconditions::default())
        .await
        .unwrap();
    for _ in 0..500 {
        if store.get(&k, "ns", "dep").await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(store.get(&k, "ns", "dep").await.unwrap(), None, "collected");
    assert!(store.read().dependents_of(owner_uid).is_empty());
}

/// A kind's write counter moves with every write of that kind (creation, replacement, status
/// write, deletion), to the resourceVersion of the write, and with no write of another kind.
#[tokio::test]
async fn a_kind_s_write_counter_moves_with_each_of_its_writes() {
    use std::sync::atomic::Ordering::Acquire;
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), Durability::Full)
        .await
        .unwrap();
    let cms = store.write_counter(&cm_kind()).unwrap();
    let widgets = store.write_counter(&widget_kind()).unwrap();
    assert!(Arc::ptr_eq(&cms, &store.write_counter(&cm_kind()).unwrap()));
    assert_eq!((cms.load(Acquire), widgets.load(Acquire)), (0, 0));

    let made = store.create(&cm_kind(), mk_cm("a")).await.unwrap();
    assert_eq!(cms.load(Acquire), rv(&made));
    let mut changed = made.clone();
    changed["data"]["k"] = json!("b");
    let replaced = store.replace(&cm_kind(), changed).await.unwrap();
    assert_eq!(cms.load(Acquire), rv(&replaced));
    assert_eq!(widgets.load(Acquire), 0, "no widget was written");

    let widget = json!({"apiVersion": "example.harvesterhci.io/v1", "kind": "Widget",
        "metadata": {"name": "w", "namespace": "ns"}, "spec": {}});
    let widget = store.create(&widget_kind(), widget).await.unwrap();
    let at = store
        .merge_status(
            &widget_kind(),
            "ns",
            "w",
            &rv(&widget).to_string(),
            &json!({"phase": "Ready"}),
        )
        .await
        .unwrap();
    assert_eq!(widgets.load(Acquire).to_string(), at, "a status patch");
    assert_eq!(cms.load(Acquire), rv(&replaced), "no ConfigMap was written");

    store
        .delete(&cm_kind(), "ns", "a", &Preconditions::default())
        .await
        .unwrap();
    assert!(cms.load(Acquire) > widgets.load(Acquire), "the deletion");
    assert_eq!(cms.load(Acquire), store.read().rv);
}

/// A status patch's writer is told its version while the write is still queued (so before any
/// watch has it), and a version told to a writer whose write then failed is never another's.
#[tokio::test]
async fn a_patch_s_version_is_told_before_it_is_committed_and_never_reused() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), Durability::Full)
        .await
        .unwrap();
    let widget = widget_kind();
    let w = store
        .create(
            &widget,
            json!({"apiVersion": "example.harvesterhci.io/v1", "kind": "Widget",
                "metadata": {"name": "w", "namespace": "ns"}}),
        )
        .await
        .unwrap();
    let mut watch = store
        .watch(&widget, None, &rv(&w).to_string())
        .await
        .unwrap();
    let told: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let patch = |from: u64, value: &'static str| {
        let (s, told, widget) = (store.clone(), told.clone(), widget.clone());
        async move {
            let note = move |v: &str| told.lock().unwrap().push(v.to_string());
            s.merge_status_planned(
                &widget,
                "ns",
                "w",
                &from.to_string(),
                &json!({"a": value}),
                &note,
            )
            .await
        }
    };
    let held = store.writer.lock().await;
    let first = queue(&store, patch(rv(&w), "1")).await;
    // Queued behind the held writer, so neither committed nor published: told already.
    assert_eq!(*told.lock().unwrap(), [(rv(&w) + 1).to_string()]);
    drop(held);
    assert_eq!(first.await.unwrap().unwrap(), (rv(&w) + 1).to_string());
    let c = tokio::time::timeout(Duration::from_secs(5), watch.next())
        .await
        .expect("the change is published")
        .unwrap()
        .unwrap();
    assert_eq!(c.resource_version, rv(&w) + 1);

    // A told version whose write fails is not handed out again.
    store.inject_write_failures(0, 1);
    assert!(patch(rv(&w) + 1, "2").await.is_err());
    let failed = told.lock().unwrap().last().unwrap().clone();
    assert_eq!(failed, (rv(&w) + 2).to_string());
    let next = store.create(&cm_kind(), mk_cm("after")).await.unwrap();
    assert!(rv(&next) > rv(&w) + 2, "{}", rv(&next));
    // Nothing changed by a patch: nothing told.
    let n = told.lock().unwrap().len();
    assert_eq!(
        patch(rv(&w) + 1, "1").await.unwrap(),
        (rv(&w) + 1).to_string()
    );
    assert_eq!(told.lock().unwrap().len(), n);
}

/// `create_each` plans its objects in order as one write (one transaction, consecutive versions),
/// answers each on its own (a taken name, one repeated in the batch or an invalid one is refused
/// alone), and what it stored survives a reopen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_created_each_are_one_write_answered_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), Durability::Full)
        .await
        .unwrap();
    let k = cm_kind();
    store.create(&k, mk_cm("taken")).await.unwrap();
    let base = store.read().rv;
    let mut watch = store.watch(&k, None, "").await.unwrap();
    let (tx0, w0) = counts(&store);
    let answers = store
        .create_each(
            &k,
            vec![
                mk_cm("a"),
                mk_cm("taken"),
                mk_cm("Not_A_Name"),
                mk_cm("a"),
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"generateName": "gen-", "namespace": "ns"}}),
                mk_cm("b"),
            ],
        )
        .await;
    assert_eq!(answers.len(), 6);
    assert_eq!(rv(answers[0].as_ref().unwrap()), base + 1);
    assert!(
        matches!(&answers[1], Err(StoreError::AlreadyExists { name, .. }) if name == "taken"),
        "{:?}",
        answers[1]
    );
    assert!(
        matches!(&answers[2], Err(StoreError::Invalid { .. })),
        "{:?}",
        answers[2]
    );
    assert!(
        matches!(&answers[3], Err(StoreError::AlreadyExists { name, .. }) if name == "a"),
        "repeated in the batch: {:?}",
        answers[3]
    );
    let generated = answers[4].as_ref().unwrap();
    assert!(
        generated["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("gen-")
    );
    assert_eq!(rv(generated), base + 2);
    assert_eq!(rv(answers[5].as_ref().unwrap()), base + 3);
    assert_eq!(
        counts(&store),
        (tx0 + 1, w0 + 1),
        "one write, one transaction"
    );
    for v in base + 1..=base + 3 {
        let c = tokio::time::timeout(Duration::from_secs(5), watch.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!((c.change, c.resource_version), (ChangeType::Added, v));
    }
    // Answered once stored; durable with the next sync.
    store.sync().await.unwrap();
    let stored = names(&store).await;
    store.close().await;
    drop(store);
    let store = EmbeddedStore::open(dir.path(), Durability::Full)
        .await
        .unwrap();
    assert_eq!(names(&store).await, stored);
    assert_eq!(stored.len(), 4, "taken, a, gen-…, b: {stored:?}");
}

/// A `create_each` whose write fails as a whole (a full disk) answers each object it planned with
/// that failure (wrapped once), even one it refused as taken (planned on writes that may have
/// failed with it, as a single create's refusal is), and one refused before planning (an invalid
/// name) with its own; nothing of it is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_create_each_fails_its_objects_and_leaves_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), Durability::Full)
        .await
        .unwrap();
    let k = cm_kind();
    let taken = store.create(&k, mk_cm("taken")).await.unwrap();
    store.inject_write_failures(0, 1);
    let answers = store
        .create_each(
            &k,
            vec![mk_cm("x"), mk_cm("taken"), mk_cm("y"), mk_cm("Not_A_Name")],
        )
        .await;
    for i in [0, 1, 2] {
        let e = answers[i].as_ref().unwrap_err();
        assert!(matches!(e, StoreError::Backend(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "store backend failed: database or disk is full (injected)"
        );
    }
    assert!(
        matches!(&answers[3], Err(StoreError::Invalid { .. })),
        "{:?}",
        answers[3]
    );
    assert_eq!(names(&store).await, vec![("taken".to_string(), rv(&taken))]);
    // The store goes on.
    let again = store.create_each(&k, vec![mk_cm("x")]).await;
    assert!(again[0].is_ok(), "{:?}", again[0]);
}
